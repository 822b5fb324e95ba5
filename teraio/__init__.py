"""TeraIO: train PyTorch models bigger than the GPU by planned tensor offloading.

The package `teraio` holds what every stage shares and that imports no torch: the file
formats (the only contract between stages), errors, units and the CLI. The stages live in
teraio_profile, teraio_plan and teraio_run; the op walk that profile and run share lives in
teraio.walk (which does import torch, so nothing here imports it eagerly).
"""

__version__ = "0.1.0"


def resident():
    """Inside `with teraio.resident():` every tensor TeraIO moved out of device memory is back
    and none leaves: for code that reads tensor memory through raw pointers. Outside
    `teraio run` it does nothing. (teraio/raw_access.py says which savers are covered already.)"""
    from teraio.raw_access import resident as hold

    return hold()
