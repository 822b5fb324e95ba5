"""Reads of a moved tensor's bytes that no ATen op the walk sees (Note [Raw reads] in
teraio/raw_access.py): a real training job under a plan that moves its optimizer state out
reads that state through each path after some steps (tests/clients/raw_reads.py) and must see
the plain run's values bit for bit, with nothing raising. One planned and one plain run serve
every path's test."""

import importlib.util
import json

import pytest

from teraio.formats.plan import save_plan
from teraio.formats.report import load_report
from teraio.formats.trace import live_bytes_per_kernel, load_trace
from cli_helpers import PYTHON, ok, teraio
from runtime_helpers import every_period_plan
from test_clients import CLIENTS, run_planned, run_plain

KERNELS_PER_ITERATION_LIMIT = 1000   # the job runs 142 ops a step; per-byte storage reads walked ran 133k


def _client_reads() -> list[str]:
    spec = importlib.util.spec_from_file_location("raw_reads_client", CLIENTS / "raw_reads.py")
    client = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(client)
    return list(client.READS)


READ_PATHS = _client_reads()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The job profiled, planned at half its peak (every idle period moves), run under the plan
    and plainly: (planned output, plain output, run report)."""
    work = tmp_path_factory.mktemp("raw_reads")
    ok(teraio("profile", "-o", work / "t.msgpack", "--", PYTHON, CLIENTS / "raw_reads.py",
              "--out", work / "profiled.json", cwd=work))
    trace = load_trace(work / "t.msgpack")
    save_plan(every_period_plan(trace, int(live_bytes_per_kernel(trace).max()) // 2), work / "plan.json")
    run_planned(work, work / "plan.json", "raw_reads.py", "--out", work / "planned.json")
    run_plain(work, "raw_reads.py", "--out", work / "plain.json")
    planned, plain = (json.loads((work / name).read_text()) for name in ("planned.json", "plain.json"))
    return planned, plain, load_report(work / "run.json")


@pytest.mark.parametrize("path", READ_PATHS)
def test_a_read_outside_ops_of_moved_state_sees_the_plain_runs_values(runs, path):
    planned, plain, _ = runs
    assert path not in planned["errors"], planned["errors"][path]
    assert planned["out_before"][path] > 0   # the read met state with no device memory
    assert planned["read"][path] == plain["read"][path]


def test_training_stays_exact_around_the_reads(runs):
    planned, plain, report = runs
    assert not plain["errors"]
    assert planned["losses"] == plain["losses"]
    assert sum(report.offloaded_bytes.values()) > 0


def test_storage_element_reads_run_outside_the_walk(runs):
    """A storage's tolist, bytes() and repr ran four walked ops per byte (~25x slower than
    plain, every op checked against the trace): they run with the modes off now."""
    _, _, report = runs
    assert max(row.kernels for row in report.per_iteration) < KERNELS_PER_ITERATION_LIMIT
