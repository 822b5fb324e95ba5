"""A job that saves its state mid-run and loads it back in the same process
(tests/clients/reload_midrun.py: torch.save / torch.load / load_state_dict, or accelerate's
save_state / load_state). The iteration that saves and the one that loads meet ops the trace
never ran at their start (torch.save's detach, torch.load's lift_fresh): the plan steps over
them, or pauses where they are many (Note [Ops the trace lacks] in teraio_run/agent.py); every
later one runs the traced ops on the loaded tensors and follows the plan again, every planned
offload finding its tensor, and the losses are the plain run's bit for bit. A user's trial
(accelerate, load_state one step before the data ran out) read "never resumed" into this.
"""

import json

import pytest

from test_clients import profile_and_plan, run_plain, run_planned

SAVE_AT, LOAD_AT, STEPS = 2, 4, 10


@pytest.mark.parametrize("mode", [(), ("--accelerate",)], ids=["torch", "accelerate"])
def test_the_plan_is_followed_again_after_a_job_loads_its_state(tmp_path, mode):
    args = ("--steps", STEPS, "--save-at", SAVE_AT, "--load-at", LOAD_AT, *mode)
    plain = tmp_path / "plain"
    plain.mkdir()
    run_plain(plain, "reload_midrun.py", *args)
    plan = profile_and_plan(tmp_path, "reload_midrun.py", *args)
    _, report = run_planned(tmp_path, plan, "reload_midrun.py", *args)
    assert json.loads((tmp_path / "losses.json").read_text()) == json.loads((plain / "losses.json").read_text())
    rows = {row.iteration: row for row in report.per_iteration}
    assert len(rows) == STEPS and report.guard_trips == 0
    # the save's ops and the load's open the iterations after the steps that make them
    assert all(rows[i].ops_stepped_over > 0 or rows[i].paused_at_kernel >= 0 for i in (SAVE_AT + 1, LOAD_AT + 1))
    # accelerate's DataLoader fetches a batch ahead: the last micro-batch of the run finds the
    # data at its end, without the fetch ops the trace has there, and pauses the last iteration
    last = STEPS - 1 if mode else STEPS
    after_load = [rows[i] for i in range(LOAD_AT + 2, last)]
    assert after_load and all(row.followed_plan for row in after_load)
    assert all(row.planned_offloads > 0 and row.plan_ids_missing == 0 for row in after_load)
    assert report.peak_device_bytes <= report.budget_bytes
