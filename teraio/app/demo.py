"""`teraio demo`: the whole pipeline on the bundled example, with the twin-run check.

Profile the example, plan it for half of its traced peak memory (SSD first, a small host
pool as overflow), run it under the plan, run it plainly, and compare the losses bit for bit.

Note [One thread per op in the demo]
The example's ops are small; PyTorch splits each over every core's OpenMP thread anyway, and
where another process holds a core (a 2-core laptop or CI box) every op waits at the threads'
barrier for a time slice. With the other core busy, two demos in a row predicted 479 and 674 ms
an iteration and measured 64 and 326 ms (the profile's kernel times are what the prediction is
made of); with one thread, 21.1 and 22.4 ms predicted, 48 and 67 measured, each demo in half the
time. So the demo runs its three jobs (profile, planned, plain: the twins alike) with
OMP_NUM_THREADS=1 unless the caller has set it.
"""

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from teraio.errors import ScriptError
from teraio.formats.plan import load_plan, save_plan
from teraio.formats.report import load_report
from teraio.formats.trace import live_bytes_per_kernel, load_trace

BUDGET_SHARE = 0.5      # plan for half the traced peak: every kind of tensor has to move
HOST_POOL_SHARE = 0.25  # host tier as overflow, a quarter of the peak


@dataclass
class DemoResult:
    workdir: Path
    trace: Path
    plan: Path
    report: Path
    losses_plain: list
    losses_planned: list
    predicted_ms: float            # the plan's prediction, with default rates
    calibrated_ms: float | None    # the same plan replayed with what the run measured (None: no iteration on plan)
    measured_ms: float             # the run's median iteration on plan

    @property
    def identical(self) -> bool:
        return self.losses_plain == self.losses_planned


def example_script() -> Path:
    from teraio.examples import train_gpt

    return Path(train_gpt.__file__)


def run_demo(workdir: Path, example_args: list[str], progress=lambda msg: None) -> DemoResult:
    from teraio_plan.make import make_plan, planner_inputs
    from teraio_profile.profile import profile
    from teraio_run.run import run

    workdir.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("OMP_NUM_THREADS", "1")   # Note [One thread per op in the demo]
    script = str(example_script())
    example_args = ["--device", "cpu", *example_args]  # the demo is the CPU pipeline, GPU or not
    paths = {name: workdir / name for name in ("trace.msgpack", "plan.json", "run.json",
                                                 "losses_plain.json", "losses_planned.json")}
    progress("profiling the example")
    profile([script, *example_args], paths["trace.msgpack"], warmup=1, iterations=2, device="cpu")
    progress("planning for half of its peak memory")
    trace = load_trace(paths["trace.msgpack"])
    peak = int(live_bytes_per_kernel(trace).max()) + trace.header.untracked_bytes
    inputs = planner_inputs(trace, gpu_mem_bytes=int(peak * BUDGET_SHARE), num_ssds=1,
                            host_mem_bytes=int(peak * HOST_POOL_SHARE))
    save_plan(make_plan(trace, inputs), paths["plan.json"])
    progress("training under the plan")
    code = run([script, *example_args, "--losses-out", str(paths["losses_planned.json"])],
               str(paths["plan.json"]), [str(workdir / "swap")], str(paths["run.json"]), 0, "posix", True, "cpu")
    if code != 0:
        raise ScriptError(f"the example exited with code {code} under the plan; see the error above")
    progress("training plainly, for the twin-run check")
    _plain_run(script, example_args, paths["losses_plain.json"])
    return DemoResult(workdir, paths["trace.msgpack"], paths["plan.json"], paths["run.json"],
                      json.loads(paths["losses_plain.json"].read_text()),
                      json.loads(paths["losses_planned.json"].read_text()),
                      *_predictions(trace, inputs, paths["plan.json"], paths["run.json"]))


def _predictions(trace, inputs, plan_path: Path, report_path: Path) -> tuple[float, float, float]:
    """The plan's prediction, the same plan replayed with the rates and host time the run
    measured (what `teraio plan --calibrate` plans with: Note [Calibration]), and the run."""
    from teraio_plan.calibrate import calibrated
    from teraio_plan.simulator import simulate

    plan, report = load_plan(plan_path), load_report(report_path)
    replayed_ms = None
    if report.iterations_on_plan:  # too few steps (`teraio demo -- --steps 2`) leave nothing to calibrate
        replayed_ms = simulate(trace, plan, calibrated(inputs, trace, report_path, given=set())).iteration_ms
    return plan.header.prediction.iteration_ms, replayed_ms, report.measured_iteration_ms


def _plain_run(script: str, example_args: list[str], losses_out: Path) -> None:
    done = subprocess.run([sys.executable, script, *example_args, "--losses-out", str(losses_out)],
                          stdout=subprocess.DEVNULL)
    if done.returncode != 0:
        raise ScriptError(f"the plain run of the example exited with code {done.returncode}")
