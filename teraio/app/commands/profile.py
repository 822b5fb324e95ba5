"""teraio profile."""

import click
from rich.console import Console

from teraio.app.commands.options import SIZE, no_stray_option
from teraio_profile.profile import Cap, profile

console = Console(highlight=False)


@click.command("profile", context_settings={"allow_interspersed_args": False, "ignore_unknown_options": True})
@click.option("-o", "--output", "trace_out", default="trace.msgpack", show_default=True,
              help="Trace file; each rank of a multi-process job writes NAME.rankN.msgpack.")
@click.option("--warmup", default=1, show_default=True, help="Iterations to skip at least; recording waits until two iterations in a row ran the same ops.")
@click.option("--iterations", default=2, show_default=True,
              help="Iterations profiled; kernel times are their median.")
@click.option("--run-to-completion", is_flag=True, help="Keep training after the trace is written.")
@click.option("--device", type=click.Choice(["auto", "cuda", "cpu"]), default="auto", show_default=True,
              help="Which device's tensors to trace.")
@click.option("--steps-per-iteration", type=click.IntRange(min=0), default=0, show_default=True,
              help="Optimizer steps per iteration (e.g. 2 for a loop that steps two optimizers); 0 finds the cycle.")
@click.option("--step-timeout", "step_timeout_s", type=click.IntRange(min=0), default=300, show_default=True,
              help="Seconds after the job's first op to wait for an optimizer step before stopping it; 0 = no limit.")
@click.option("--gpu-mem", "gpu_mem_bytes", type=SIZE, default="0",
              help="Profile a job that does not fit: cap device memory to this size, evicting tensors on demand "
                   "(0 = run uncapped).")
@click.option("--host-mem", "host_mem_bytes", type=SIZE, default=None,
              help="With --gpu-mem: host pool for evicted tensors, per process "
                   "[default: half the memory available, shared by this machine's processes].")
@click.option("--ssd-dir", "ssd_dirs", multiple=True,
              help="With --gpu-mem: folder for swap files once the pool is full; repeat per SSD (default: the temp folder).")
@click.option("--io-backend", type=click.Choice(["auto", "kvikio", "posix"]), default="auto", show_default=True,
              help="With --gpu-mem: swap file I/O.")
@click.option("--no-clean-copies", "clean_copies", is_flag=True, flag_value=False, default=True,
              help="With --gpu-mem: copy every evicted storage out, even one no op wrote since its last copy "
                   "(for jobs that write tensors outside PyTorch's ops), as `teraio run --no-clean-copies`.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED, required=True)
def command(trace_out, warmup, iterations, run_to_completion, device, steps_per_iteration, step_timeout_s,
            gpu_mem_bytes, host_mem_bytes, ssd_dirs, io_backend, clean_copies, command):
    """Run a training script and record one steady-state iteration.

    \b
    An iteration ends at an optimizer.step(), or at every Nth step of a loop that
    repeats every N steps (two optimizers: N = 2; found unless --steps-per-iteration).
    After the warm-up (and once two iterations in a row ran the same ops) ITERATIONS
    more are profiled, the trace is written and the script is ended (unless
    --run-to-completion).
    \b
    Examples:
      teraio profile train.py --lr 3e-4
      teraio profile -o llama.msgpack --warmup 2 --iterations 3 -- torchrun --nproc-per-node 2 train.py
      teraio profile --gpu-mem 24GiB --host-mem 64GiB --ssd-dir /nvme0/tio -- python train.py
    \b
    With --gpu-mem the job runs within the cap, its idle tensors evicted to host
    memory and swap files as they are needed; the trace still records what the
    job needs uncapped (sizes, lifetimes, memory), and kernel times without the
    waits for data. Plan it as any trace.
    """
    from teraio.app.commands.inspect import print_trace_summary  # rich view shared with inspect

    no_stray_option(click.get_current_context(), command)
    cap = Cap(gpu_mem_bytes, host_mem_bytes, list(ssd_dirs), io_backend, clean_copies)
    paths = profile(list(command), trace_out, warmup, iterations, run_to_completion, device,
                    steps_per_iteration, step_timeout_s, cap)
    for path in paths:
        print_trace_summary(path, console)
