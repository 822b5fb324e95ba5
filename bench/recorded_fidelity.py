"""Predicted against measured from recorded GPU results, without a GPU (issue 16).

    python bench/recorded_fidelity.py traces/h200-3b-fp32-writes.msgpack \\
        bench/results/2026-12-01-allocator-3b/headroom_aa86907.jsonl --calibrate-from 0

A bench result line (bench/run_baseline.py) keeps the run report's body but not its header:
this rebuilds the report of line --calibrate-from for the trace its plan came from, calibrates
with it (`teraio plan --calibrate`), then plans every line's configuration again with and
without those figures (the plan options are the ones each run recorded, so the calibrated
plans keep the recorded host and link rates, host time alone measured; --measured-rates takes
the run's rates too) and prints the
predicted iteration against the measured median step, and the plan the run ran (made again
without the figures) replayed with them: the calibrated planner may choose other actions. The lines must be runs of plans made
from TRACE; the planner's code is this checkout's, not the recorded commit's.
"""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from teraio import __version__
from teraio.formats.common import Producer
from teraio.formats.plan import load_plan
from teraio.formats.report import ReportHeader, RunReport, save_report
from teraio.formats.trace import load_trace
from teraio_plan.simulator import simulate


def report_of(line: dict, trace) -> RunReport:
    header = ReportHeader(producer=Producer(teraio=__version__), command=[], rank=0, world_size=1,
                          device="cuda:0", plan=line["config"]["system_config"]["plan"],
                          plan_op_digest=trace.header.op_digest)
    body = {key: value for key, value in line["metrics"]["teraio"].items() if key in RunReport.model_fields}
    return RunReport(header=header, **body)


def plan_args(system_config: dict, link_gbps: float = 0.0) -> list[str]:
    """The options of the recorded plan (its inputs), as `teraio plan` takes them; with link_gbps,
    one link of that rate for both directions together instead of the recorded rates."""
    c = system_config
    host_gbps, pcie_gbps, link_total_gbps = (link_gbps,) * 3 if link_gbps else (
        c["host_gbps"], c["pcie_gbps"], c.get("link_total_gbps", 0.0))
    args = ["--gpu-mem", c["budget_bytes"], "--ssds", c["num_ssds"], "--host-mem", c["host_mem_bytes"],
            "--host-gbps", host_gbps, "--pcie-gbps", pcie_gbps, "--link-total-gbps", link_total_gbps,
            "--headroom", c["headroom_bytes"]]
    if not c.get("recompute", True):
        args.append("--no-recompute")
    return [str(a) for a in args]


def calibrating_args(system_config: dict) -> list[str]:
    """plan_args without the recorded host and link rates, so that the calibrating run's
    measured ones are taken (a rate given on the command line wins, Note [Calibration])."""
    args = plan_args(system_config)
    rates = {"--host-gbps", "--pcie-gbps"}
    return [a for i, a in enumerate(args) if a not in rates and (i == 0 or args[i - 1] not in rates)]


def predicted_ms(trace_path: Path, args: list[str], out: Path) -> float:
    subprocess.run([sys.executable, "-m", "teraio", "plan", str(trace_path), *args, "-o", str(out)],
                   check=True, capture_output=True)
    return load_plan(out).header.prediction.iteration_ms


def fidelity_rows(trace_path: Path, results_path: Path, calibrate_from: int = 0,
                  link_gbps: float = 0.0, measured_rates: bool = False) -> list[dict]:
    """One row per recorded teraio run: label, measured, predicted and calibrated ms (with
    link_gbps, every plan made for one link of that rate for both directions together; with
    measured_rates, the calibrated plans take the run's host and link rates, not the recorded)."""
    trace = load_trace(trace_path)
    lines = [json.loads(text) for text in results_path.read_text().splitlines() if text.strip()]
    lines = [line for line in lines if line.get("metrics", {}).get("teraio")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        report_path = Path(tmp) / "report.json"
        save_report(report_of(lines[calibrate_from], trace), report_path)
        for i, line in enumerate(lines):
            config = line["config"]["system_config"]
            options = plan_args(config, link_gbps)
            plan, calibrated_plan, ran_plan = (Path(tmp) / f"{name}{i}.json" for name in ("plan", "cal", "ran"))
            rows.append({"label": line["label"], "calibrating": i == calibrate_from,
                         "measured_ms": line["metrics"]["step_ms_median"],
                         "predicted_ms": predicted_ms(trace_path, options, plan),
                         "calibrated_ms": predicted_ms(trace_path, [*(calibrating_args(config) if measured_rates
                                                                      else options), "--calibrate", str(report_path)],
                                                       calibrated_plan),
                         # the plan the run ran (made with the recorded options) under the measured figures:
                         # the calibrated planner may choose other actions than the run's plan has
                         "ran_plan_calibrated_ms": _ran_plan_ms(trace, trace_path, plan_args(config), ran_plan,
                                                                load_plan(calibrated_plan).header.inputs)})
    return rows


def _ran_plan_ms(trace, trace_path: Path, options: list[str], out: Path, inputs) -> float:
    predicted_ms(trace_path, options, out)
    return simulate(trace, load_plan(out), inputs).iteration_ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", type=Path)
    parser.add_argument("results", type=Path)
    parser.add_argument("--calibrate-from", type=int, default=0, help="the line whose report calibrates")
    parser.add_argument("--link-gbps", type=float, default=0.0, help="plan for one link of this rate for both "
                        "directions together (--host-gbps, --pcie-gbps and --link-total-gbps), not the recorded rates")
    parser.add_argument("--measured-rates", action="store_true", help="the calibrated plans take the host and link "
                        "rates the calibrating run measured, not the recorded plans' --host-gbps and --pcie-gbps")
    args = parser.parse_args()
    if args.measured_rates and args.link_gbps:
        parser.error("--measured-rates takes the run's rates, --link-gbps gives one: choose one")
    table = Table("run", "measured ms", "predicted ms", "error", "calibrated ms", "error",
                  "the run's plan, calibrated", "error", title_justify="left")
    for row in fidelity_rows(args.trace, args.results, args.calibrate_from, args.link_gbps, args.measured_rates):
        measured = row["measured_ms"]
        table.add_row(row["label"] + (" (calibrating)" if row["calibrating"] else ""), f"{measured:,.1f}",
                      f"{row['predicted_ms']:,.1f}", f"{row['predicted_ms'] / measured - 1:+.1%}",
                      f"{row['calibrated_ms']:,.1f}", f"{row['calibrated_ms'] / measured - 1:+.1%}",
                      f"{row['ran_plan_calibrated_ms']:,.1f}", f"{row['ran_plan_calibrated_ms'] / measured - 1:+.1%}")
    Console().print(table)


if __name__ == "__main__":
    main()
