"""teraio run."""

import sys

import click

from teraio.app.commands.options import SIZE, no_stray_option
from teraio_run.run import run


@click.command("run", context_settings={"allow_interspersed_args": False, "ignore_unknown_options": True})
@click.option("--plan", "plan_path", required=True, type=click.Path(dir_okay=False),
              help="Plan from `teraio plan`; per-rank plans are found as NAME.rankN.json.")
@click.option("--ssd-dir", "ssd_dirs", multiple=True,
              help="Folder on an SSD for swap files; repeat once per SSD (default: the temp folder).")
@click.option("--report", default="", help="Write the run report (JSON) here; NAME.rankN.json per rank (NAME.teraio.json if the job writes this file itself).")
@click.option("--gpu-mem", "gpu_mem_bytes", type=SIZE, default="0",
              help="Cap device memory (CUDA) to this size; default: the plan's budget.")
@click.option("--io-backend", type=click.Choice(["auto", "kvikio", "posix"]), default="auto", show_default=True,
              help="SSD I/O: KvikIO (GDS or compat) where CUDA exists, else POSIX.")
@click.option("--strict", is_flag=True, help="Fail the job, instead of training on without the agent or the plan, if the agent cannot start, "
                   "the plan belongs to another job, the job ends without ever following its plan (after its report), "
                   "the job computes on another GPU than the one set up, or it runs torch.compile'd code.")
@click.option("--no-clean-copies", "clean_copies", is_flag=True, flag_value=False, default=True,
              help="Copy every storage out each time it leaves, even one no op wrote since its last copy: for "
                   "jobs that write tensors outside PyTorch's ops (C++ extensions given raw pointers).")
@click.option("--device", type=click.Choice(["auto", "cuda", "cpu"]), default="auto", show_default=True)
@click.argument("command", nargs=-1, type=click.UNPROCESSED, required=True)
def command(plan_path, ssd_dirs, report, gpu_mem_bytes, io_backend, strict, clean_copies, device, command):
    """Run a training command with the plan executed underneath it.

    \b
    The command after -- runs untouched; every process it starts (each torchrun
    rank) loads the runtime, which follows its plan and writes a report at exit.
    A rank works on cuda:LOCAL_RANK (torchrun's one process per GPU) when several
    GPUs are visible, else on the current GPU.
    \b
    Examples:
      teraio run --plan plan.json -- python train.py --lr 3e-4
      teraio run --plan plan.json --ssd-dir /nvme0/tio --ssd-dir /nvme1/tio --report run.json \\
          -- torchrun --nproc-per-node 2 train.py
    """
    no_stray_option(click.get_current_context(), command)
    sys.exit(run(list(command), plan_path, list(ssd_dirs), report, gpu_mem_bytes, io_backend, strict, device,
                 clean_copies=clean_copies))
