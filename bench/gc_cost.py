"""Time the Python garbage collector takes in a job, plainly and under a plan (issue 14).

    python bench/gc_cost.py                      # CPU: the example, 12 layers, 8 steps

Profiles the example and plans it at half its traced peak (as bench/host_cost.py), then runs it
plainly and under `teraio run`, each time through a wrapper that times every collection
(gc.callbacks) and prints, at the end, the collections' total and full (generation 2) time
over the whole run and per optimizer step. Note [Imports out of the collector] in
teraio/app/bootstrap/__init__.py keeps the figures.
"""

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from host_cost import half_peak_plan, job_command, run_checked, teraio  # noqa: E402

WRAPPER = '''
import atexit, gc, json, runpy, sys, time
spent = {"ms": 0.0, "full_ms": 0.0, "collections": 0}
steps, started = [], [0.0]
def timed(phase, info):
    if phase == "start":
        started[0] = time.perf_counter()
        return
    ms = (time.perf_counter() - started[0]) * 1e3
    spent["ms"] += ms
    spent["collections"] += 1
    spent["full_ms"] += ms if info["generation"] == 2 else 0.0
gc.callbacks.append(timed)
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook
register_optimizer_step_post_hook(lambda *_: steps.append(dict(spent)))
atexit.register(lambda: print("GC " + json.dumps({"run": spent, "steps": steps}), file=sys.stderr))
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
'''


def gc_figures(stderr: str) -> dict:
    line = next(line for line in stderr.splitlines() if line.startswith("GC "))
    found = json.loads(line[3:])
    steps = found["steps"]
    per_step = [{key: round(b[key] - a[key], 1) for key in ("ms", "full_ms")} for a, b in zip(steps, steps[1:])]
    return {"run_ms": round(found["run"]["ms"]), "run_full_ms": round(found["run"]["full_ms"]),
            "collections": found["run"]["collections"], "per_step_after_the_first": per_step}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=8)
    args = p.parse_args()
    args.device, args.preset, args.model_args = "cpu", "tiny", ["--layers", "12"]
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        (tmp / "gc_wrapper.py").write_text(WRAPPER)
        job = job_command(args)
        plan_path, _ = half_peak_plan(job, args, tmp)
        wrapped = [sys.executable, str(tmp / "gc_wrapper.py"), *job[1:]]
        results = {}
        for name, cmd in (("plain", wrapped), ("planned", teraio("run", "--plan", plan_path, "--", *wrapped))):
            results[name] = gc_figures(run_checked(cmd, tmp, stderr=True))
    for name, r in results.items():
        print(f"{name}: {r['collections']} collections, {r['run_ms']} ms ({r['run_full_ms']} ms full) over the run; "
              f"per step: {[s['ms'] for s in r['per_step_after_the_first']]} ms")


if __name__ == "__main__":
    main()
