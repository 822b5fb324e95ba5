"""What any Python dispatch mode costs a real job: the floor under the walk (issue 14).

    python bench/mode_floor.py                       # the example, --layers 12, on the CPU
    python bench/mode_floor.py -- --layers 24

Runs the bundled example plainly and under an empty TorchDispatchMode (each op handed to
Python and called back, nothing else), with one OpenMP thread, at two step counts, and prints
the CPU time per step of each (the difference of the two runs' user + system time over their
difference in steps: start-up and the first step cancel out). CPU time, not wall time, so that
other jobs on a shared box move the figures less. The walk and the agent come on top of the
mode's cost: docs/runtime.md, "Host cost per kernel", compares them.
"""

import argparse
import os
import resource
import runpy
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[1] / "teraio" / "examples" / "train_gpt.py"
STEPS = (2, 12)


def child_cpu_s(mode: bool, steps: int, model_args: list[str]) -> float:
    """User + system CPU seconds of one run of the example in a child process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    command = [sys.executable, __file__, "--child", "mode" if mode else "plain", "--", "--device", "cpu",
               "--steps", str(steps), "--log-every", "0", *model_args]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, env={**os.environ, "OMP_NUM_THREADS": "1"})
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def run_example(mode: bool, example_args: list[str]) -> None:
    """In the child: the example, under a mode that hands each op to Python and calls it back."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class EmptyMode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    sys.argv = [str(EXAMPLE), *example_args]
    if not mode:
        runpy.run_path(str(EXAMPLE), run_name="__main__")
        return
    with EmptyMode():
        runpy.run_path(str(EXAMPLE), run_name="__main__")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", choices=("plain", "mode"), help=argparse.SUPPRESS)
    parser.add_argument("model_args", nargs="*", help="after --: arguments for the example (default --layers 12)")
    args = parser.parse_args()
    if args.child:
        run_example(args.child == "mode", args.model_args)
        return
    model_args = args.model_args or ["--layers", "12"]
    per_step_ms = {}
    for label, mode in (("plain", False), ("empty dispatch mode", True)):
        few, many = (child_cpu_s(mode, steps, model_args) for steps in STEPS)
        per_step_ms[label] = (many - few) * 1e3 / (STEPS[1] - STEPS[0])
    plain = per_step_ms["plain"]
    for label, ms in per_step_ms.items():
        print(f"{label}: {ms:.1f} ms CPU per step ({ms / plain:.2f}x plain)")


if __name__ == "__main__":
    main()
