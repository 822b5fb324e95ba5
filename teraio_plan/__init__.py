"""teraio_plan: the planner stage. Trace in, plan out; never imports torch or kvikio.

    make_plan(trace, inputs) -> Plan          the greedy lifetime-aware plan (planner.py)
    simulate(trace, plan) -> SimResult        event-driven replay (simulator.py)
    sweep(trace, inputs) -> [SweepPoint]      the roofline over migration bandwidth
    diff_plans(a, b) -> PlanDiff              what changed between two plans
"""

from teraio_plan.diff import PlanDiff, diff_plans
from teraio_plan.make import PlanOutcome, check_budget, make_plan, make_plan_outcome, planner_inputs
from teraio_plan.simulator import SimResult, simulate
from teraio_plan.sweep import SWEEP_GBPS, SweepPoint, sweep

__all__ = [
    "PlanDiff", "PlanOutcome", "SWEEP_GBPS", "SimResult", "SweepPoint", "check_budget", "diff_plans",
    "make_plan", "make_plan_outcome", "planner_inputs", "simulate", "sweep",
]
