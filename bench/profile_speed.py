"""How fast `teraio profile` is on a job with many thin layers (many kernels, many live tensors).

    python bench/profile_speed.py                      # the example, 100 layers of width 16, CPU
    python bench/profile_speed.py --layers 800 --device cuda

Runs the bundled example with tiny dimensions and many layers plainly, then under
`teraio profile --warmup 1 --iterations 1`, and prints the wall and CPU seconds of each and
the microseconds per kernel walked (kernels per iteration times the iterations the profiled
job ran before it was ended). CPU seconds are the job's and the CLI's own (getrusage of the
children), steadier than wall time on a shared machine. docs/profiler.md records the numbers.
"""

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from teraio.formats.trace import load_trace  # noqa: E402

EXAMPLE = ROOT / "teraio" / "examples" / "train_gpt.py"
STEPS = 6   # enough for a warm-up, two alike to settle, and the recorded one


def timed(cmd: list[str], cwd: str) -> tuple[float, float]:
    """Wall and CPU seconds of a command and everything it waited for."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    wall_s = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return wall_s, cpu_s


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=100)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--skip-plain", action="store_true", help="do not time the job without the profiler")
    args = p.parse_args()
    job = [sys.executable, str(EXAMPLE), "--device", args.device, "--layers", str(args.layers),
           "--dim", str(args.dim), "--heads", "2", "--ffn", str(2 * args.dim), "--vocab", "64", "--seq", "8",
           "--batch", "1", "--steps", str(STEPS), "--log-every", "0"]
    if args.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))  # this checkout
    with tempfile.TemporaryDirectory() as tmp:
        trace_path = Path(tmp) / "trace.msgpack"
        prof_wall, prof_cpu = timed([sys.executable, "-m", "teraio", "profile", "-o", str(trace_path),
                                     "--warmup", "1", "--iterations", "1", "--", *job], tmp)
        header = load_trace(trace_path).header
        walked = header.num_kernels * (header.warmup_iterations + header.profiled_iterations)
        print(f"{args.layers} layers, {header.num_kernels} kernels per iteration, {walked} walked "
              f"({header.warmup_iterations} warm-up + {header.profiled_iterations} recorded iterations)")
        print(f"profile: {prof_wall:.1f} s wall, {prof_cpu:.1f} s CPU: "
              f"{prof_wall / walked * 1e6:.0f} us per kernel wall, {prof_cpu / walked * 1e6:.0f} us CPU")
        if not args.skip_plain:
            plain_wall, plain_cpu = timed(job, tmp)
            ran = header.num_kernels * STEPS
            print(f"plain:   {plain_wall:.1f} s wall, {plain_cpu:.1f} s CPU for {STEPS} iterations: "
                  f"{plain_wall / ran * 1e6:.0f} us per kernel wall, {plain_cpu / ran * 1e6:.0f} us CPU")


if __name__ == "__main__":
    main()
