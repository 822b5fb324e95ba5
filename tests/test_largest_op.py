"""Note [The largest op of the profile] in teraio_profile/recorder.py: a job whose depth follows
its data (tests/clients/data_depth.py: 2 of 6 layers most batches, all 6 every third) is traced
by a shallow iteration, whose largest kernel needs far less than the deep iteration's foreach
optimizer step. The profile keeps the largest op of every iteration it watched, `teraio inspect`
shows it, `teraio plan` refuses a budget below it in one line, and a plan at it runs the job
within the budget, bit for bit like the plain run. Before, the plan was made and the run went
over its budget in every deep iteration.
"""

import json

import msgpack
import pytest

from plan_helpers import GiB, T, make_trace
from teraio.errors import PlanError
from teraio.formats.trace import LargestOp, load_trace, save_trace, trace_to_file
from teraio_plan import make_plan, planner_inputs
from teraio_plan.memory import kernel_need_bytes
from cli_helpers import PYTHON, ROOT, ok, one_line_error, teraio
from test_clients import CLIENTS, run_plain, run_planned


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    work = tmp_path_factory.mktemp("depth")
    ok(teraio("profile", "-o", work / "t.msgpack", "--", PYTHON, CLIENTS / "data_depth.py", cwd=work))
    run_plain(work, "data_depth.py", "--out", "plain.json")
    return work, load_trace(work / "t.msgpack")


def test_the_trace_keeps_the_deep_iterations_largest_op(profiled):
    work, trace = profiled
    largest, (need, _) = trace.header.largest_op, kernel_need_bytes(trace, 0)
    assert largest is not None and not largest.traced_structure
    assert largest.op.startswith("_foreach_") and largest.iteration % 3 == 2   # a deep one
    assert largest.nbytes > need   # the traced (shallow) iteration's floor
    assert largest.iteration < largest.watched_iterations
    stats = json.loads(ok(teraio("inspect", work / "t.msgpack", "--json", cwd=work)).stdout)
    assert stats["largest_op"] == largest.model_dump() and stats["kernel_need_bytes"] == need
    shown = " ".join(ok(teraio("inspect", work / "t.msgpack", cwd=work)).stdout.split())
    assert f"iteration {largest.iteration} (other ops than the recorded iteration's) needs more" in shown
    assert f"({largest.nbytes} bytes) of its own tensors" in shown


def test_a_budget_below_the_deep_op_is_refused_in_one_line(profiled, tmp_path):
    work, trace = profiled
    largest, (need, _) = trace.header.largest_op, kernel_need_bytes(trace, 0)
    budget = (need + largest.nbytes) // 2
    proc = teraio("plan", work / "t.msgpack", "--gpu-mem", budget, "--host-mem", "1MiB", "-o", tmp_path / "p.json",
                  cwd=tmp_path)
    line = one_line_error(proc, PlanError.exit_code)
    assert "Traceback" not in proc.stderr and not (tmp_path / "p.json").exists()
    assert f"iteration {largest.iteration} of the profiled job" in line and largest.op in line
    assert f"give --gpu-mem of at least {largest.nbytes}" in line and f"alone needs {need}" in line


def test_a_plan_at_the_deep_op_runs_within_budget_bit_for_bit(profiled, tmp_path):
    work, trace = profiled
    budget = trace.header.largest_op.nbytes
    ok(teraio("plan", work / "t.msgpack", "--gpu-mem", budget, "--host-mem", "1MiB", "-o", tmp_path / "p.json",
              cwd=tmp_path))
    _, report = run_planned(tmp_path, tmp_path / "p.json", "data_depth.py", "--out", tmp_path / "planned.json")
    assert report.budget_bytes == budget and report.peak_device_bytes <= report.budget_bytes
    assert report.iterations_on_plan >= 3 and report.plan_pauses >= 2   # the deep iterations ran unplanned
    assert json.loads((tmp_path / "planned.json").read_text()) == json.loads((work / "plain.json").read_text())


def test_the_headroom_adds_to_the_largest_op():
    trace = make_trace([10.0] * 4, [T("w", GiB, [0, 3])])
    largest = LargestOp(nbytes=2 * GiB, iteration=5, kernel=7, op="_foreach_add_", traced_structure=True,
                        watched_iterations=8)
    trace.header = trace.header.model_copy(update={"largest_op": largest})
    make_plan(trace, planner_inputs(trace, gpu_mem_bytes=2 * GiB))
    with pytest.raises(PlanError, match=r"iteration 5 .*larger sizes.*_foreach_add_ \(its kernel 7\).*at least "
                                        + str(2 * GiB + 1)):
        make_plan(trace, planner_inputs(trace, gpu_mem_bytes=2 * GiB, headroom_bytes=1))


def test_traces_from_before_the_field_load_and_stay_without_it(tmp_path):
    trace = load_trace(ROOT / "traces" / "cpu-tiny.msgpack")
    assert trace.header.largest_op is None
    save_trace(trace_to_file(trace), tmp_path / "again.msgpack")
    assert "largest_op" not in msgpack.unpackb((tmp_path / "again.msgpack").read_bytes())["header"]
    largest = LargestOp(nbytes=1, iteration=0, kernel=0, op="add", traced_structure=True, watched_iterations=1)
    trace.header = trace.header.model_copy(update={"largest_op": largest})
    save_trace(trace_to_file(trace), tmp_path / "new.msgpack")
    assert load_trace(tmp_path / "new.msgpack").header.largest_op == largest
