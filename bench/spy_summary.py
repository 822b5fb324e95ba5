"""Where the training thread's time goes, from py-spy's collapsed stacks (issue 14).

`bench/run_baseline.py --py-spy STACKS` samples the job with py-spy (waits included); this
reads STACKS and prints where the measured steps' time went, as shares of the samples the
job's thread took inside them (a frame of run_baseline.py's `step`: the steps' wall time,
waits included): per function, inclusive (it or anything it called) and self (innermost).
On CUDA the backward runs in autograd's own thread while the job's thread waits in
`_engine_run_backward`; that thread's samples with Python frames (the walk, hooks) are added
too, so a function's share says how much of the steps' time it took, the two threads' shares
may add past 100%. Unlike cProfile, sampling does not slow each call.

    python bench/spy_summary.py STACKS [--top 40] [--match teraio]
"""

import argparse
import re
from collections import Counter

LINE = re.compile(r" \(([^():]*?)(?::\d+)?\)$")


def frame_name(frame: str) -> str:
    """'func (path/to/file.py:123)' -> 'func (file.py)': one row per function, not per line."""
    match = LINE.search(frame)
    if match is None:
        return frame
    return f"{frame[:match.start()]} ({match.group(1).rsplit('/', 1)[-1]})"


AUTOGRAD_THREAD_WORK = "OpWalk.__torch_dispatch__ (walk.py)"


def read_stacks(path: str):
    """(stack of function names, samples) per line of py-spy's raw output."""
    for line in open(path):
        stack, _, count = line.rstrip("\n").rpartition(" ")
        frames = [f for f in stack.split(";") if not f.startswith(("process ", "thread "))]
        yield [frame_name(f) for f in frames], int(count)


def summarize(path: str, inside: str):
    """(samples of the job's thread inside the steps, inclusive and self counts per function)."""
    inclusive, own = Counter(), Counter()
    total = 0
    for frames, count in read_stacks(path):
        in_step = any(f.endswith(inside) for f in frames)
        if not in_step and AUTOGRAD_THREAD_WORK not in frames:
            continue
        total += count if in_step else 0
        own[frames[-1]] += count
        for name in set(frames):
            inclusive[name] += count
    return total, inclusive, own


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("stacks", help="py-spy's raw (collapsed) output")
    p.add_argument("--inside", default=".step (run_baseline.py)", help="the frame of one measured step")
    p.add_argument("--top", type=int, default=40)
    p.add_argument("--match", default="", help="inclusive table: only names containing this")
    args = p.parse_args()
    total, inclusive, own = summarize(args.stacks, args.inside)
    if not total:
        raise SystemExit(f"spy_summary: no sample under {args.inside!r} in {args.stacks}")
    print(f"{total} samples under {args.inside}")
    print("\ninclusive %  function")
    for name, count in inclusive.most_common():
        if args.match in name:
            print(f"{100 * count / total:10.1f}  {name}")
            args.top -= 1
            if args.top == 0:
                break
    print("\nself %  function")
    for name, count in own.most_common(40):
        print(f"{100 * count / total:6.1f}  {name}")


if __name__ == "__main__":
    main()
