"""TeraIO: train PyTorch models bigger than the GPU by planned tensor offloading.

Three layers, imports pointing down only ("Layers" in docs/runtime.md, tests/test_layers.py):
- app, teraio.app: the `teraio` command (cli, commands), the demo and the bootstrap that
  starts a stage's agent in the job; it imports the stages.
- stages: teraio_profile, teraio_plan and teraio_run; they hand each other files (trace, plan).
- base, this package outside teraio.app: the file formats (the only contract between stages),
  the op walk that profile and run share (teraio.walk), units, errors, settings, and the
  launcher, guards and views more than one stage uses. It imports no stage and no app, and no
  torch eagerly (the walk and the guards import it when they are imported themselves).
"""

__version__ = "0.1.0"


def resident():
    """Inside `with teraio.resident():` every tensor TeraIO moved out of device memory is back
    and none leaves: for code that reads tensor memory through raw pointers. Outside
    `teraio run` it does nothing. (teraio/raw_access.py says which savers are covered already.)"""
    from teraio.raw_access import resident as hold

    return hold()
