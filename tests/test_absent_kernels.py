"""Iterations that lack one of the trace's kernels (tests/clients/padded_batches.py pads its
batch as torchvision's detection transform does, `pad[i, :n].copy_(x)`, and PyTorch makes no
slice op for a full-width sample): they left the plan at that kernel, 17 of 30 iterations of a
Faster R-CNN in a user's trial. The plan goes on from the next kernel (Note [Ops the trace
lacks] in teraio_run/agent.py)."""

from test_clients import planned_json_like_plain


def test_an_iteration_without_a_whole_width_slice_stays_on_plan(tmp_path):
    proc, report, budget = planned_json_like_plain(tmp_path, "padded_batches.py")
    full_width = [row for row in report.per_iteration if row.iteration % 3 == 2]
    assert full_width and all(row.kernels_absent == 1 and row.followed_plan for row in full_width)
    assert report.plan_pauses == 0 and all(row.followed_plan for row in report.per_iteration[1:])
    assert report.peak_device_bytes <= report.budget_bytes == budget
    assert "of its kernels were absent" in " ".join(proc.stderr.split())


def test_batches_whose_longest_row_moves_stay_on_plan(tmp_path):
    """TRL's collator pads rows so (tests/clients/collated_rows.py): an iteration lacks the
    traced slice at its own longest row and runs one, a view, where the trace's longest row
    was. 1 of 12 iterations of an SFTTrainer run followed its plan; a view is stepped over."""
    proc, report, budget = planned_json_like_plain(tmp_path, "collated_rows.py")
    assert report.plan_pauses == 0 and all(row.followed_plan for row in report.per_iteration[1:])
    moved = [row for row in report.per_iteration[1:] if row.kernels_absent]
    assert moved and all(row.ops_stepped_over == row.kernels_absent == 1 for row in moved), report.per_iteration
    assert report.peak_device_bytes <= report.budget_bytes == budget
