"""Per-iteration metrics of a run: one row per iteration for the report (where time and traffic
went, and whether the plan was followed: what tells a plan problem from a runtime one)."""

import sys
import time
from collections import Counter
from typing import NamedTuple

import torch


class Refusal(NamedTuple):
    """Note [Refused plan actions]: why the runtime keeps a storage the plan moves."""

    why: str     # the sentence the warning and the report's first_refusal give
    label: str   # the same in a few words, for a list of what held memory (the over-budget warning)


# BudgetKeeper.refusal's reasons (teraio_run/budget.py)
REFUSALS = {
    "pinned": Refusal("its memory was handed out through a raw pointer (Tensor.numpy, DLPack) or is read raw "
                      "by the framework, so it never moves again", "read through a raw pointer"),
    "unwritten": Refusal("it was allocated without a write (torch.empty) and no op has taken it yet: its bytes "
                         "may be filled outside ATen", "allocated, not yet written"),
    "collective": Refusal("a collective still uses it", "in a collective"),
    "kind": Refusal("the walk could not name it and did not see an op make it (another thread's or made "
                    "outside ATen), or a process group is up: such storages never move (Note [Storages the "
                    "job made] in teraio/walk.py)", "unnamed and not made by an op"),
    "ddp_gradient": Refusal("gradients stay on the device under DistributedDataParallel", "DDP gradients"),
    "not_resizable": Refusal("its memory belongs to whoever made it, not to PyTorch's allocator "
                             "(torch.from_numpy's array, torch.frombuffer's buffer or a DLPack producer, which may "
                             "still read or write it), so it cannot be freed; to let it move, give the job its own "
                             "copy (tensor.clone())", "memory not the allocator's"),
    "shared": Refusal("it is in shared memory (a batch from a DataLoader worker on the CPU, Module.share_memory(), "
                      "a tensor sent to another process), which other processes may map: it cannot be freed",
                      "in shared memory"),
}


class IterationLog:
    """Reads the engine's and the walk's running totals at each iteration end and keeps the
    differences; the agent counts its own plan actions into `counts` meanwhile.

    Note [Refused plan actions]
    A plan offload the runtime cannot do (BudgetKeeper.refusal: the storage is pinned for a
    raw read, still in a collective, of a kind that never moves, allocated without a write
    and not yet taken by an op, or a gradient under DDP) is skipped: the storage stays on the
    device and training stays exact, but the plan's memory saving is lost and the budget
    keeper may have to evict instead. No refusal is silent: each is counted in its
    iteration's row (`refused_actions`) and by reason for the run, and the first one is said
    on stderr, naming the tensor and the cause."""

    def __init__(self, engine, walk, keeper):
        self.engine = engine
        self.walk = walk
        self.keeper = keeper
        self.iteration_s: list[float] = []
        self.rows: list[dict] = []
        self.counts = {"planned_offloads": 0, "plan_ids_missing": 0, "replay_fallbacks": 0,
                       "refused_actions": 0, "ops_stepped_over": 0, "kernels_absent": 0}  # this iteration's
        self.refused_by_reason: Counter = Counter()   # the run's (Note [Refused plan actions])
        self.first_refusal = ""
        self.first_missing = ""   # the first plan action that found no tensor of its name
        self.steps_without_backward = 0   # Note [Steps that train nothing]
        self._trains = False              # a gradient has been accumulated in the job
        self._t_iter = time.perf_counter()
        self._last_totals: dict = {}

    def missing(self, entry, action: str) -> None:
        """A plan action whose tensor the run has not met (the summary names the first)."""
        self.counts["plan_ids_missing"] += 1
        if not self.first_missing:
            self.first_missing = (f"iteration {self.walk.iteration}, the {action} of {entry.tensor} ({entry.name}, "
                                  f"{entry.kind})")

    def refuse(self, entry, reason: str) -> None:
        """A plan offload the runtime did not do (Note [Refused plan actions])."""
        self.counts["refused_actions"] += 1
        self.refused_by_reason[reason] += 1
        if not self.first_refusal:
            self.first_refusal = (f"iteration {self.walk.iteration}, the offload of {entry.tensor} after kernel "
                                  f"{entry.offload_after}: {REFUSALS[reason].why}")
            print(f"teraio: warning: the plan's offload of {entry.tensor} ({entry.kind}) was refused: "
                  f"{REFUSALS[reason].why}; it stays on the device (training stays exact) and the report counts "
                  "such refusals (refused_actions)", file=sys.stderr)

    def end_iteration(self, iteration: int, num_kernels: int, followed_plan: bool, paused_at: int) -> None:
        if not self._trained():
            self.steps_without_backward += 1   # Note [Steps that train nothing]
            return
        now = time.perf_counter()
        self.iteration_s.append(now - self._t_iter)
        self._t_iter = now
        totals = self._totals()
        row = {key: value - self._last_totals.get(key, 0) for key, value in totals.items()}
        row.update(self.counts, iteration=iteration, followed_plan=followed_plan, kernels=num_kernels,
                   paused_at_kernel=paused_at, ms=self.iteration_s[-1] * 1e3,
                   host_pool_peak_bytes=self._host_pool_peak(),
                   resident_peak_bytes=self.keeper.take_iteration_peak())
        self.rows.append(row)
        self._last_totals = totals
        self.counts = dict.fromkeys(self.counts, 0)

    def _trained(self) -> bool:
        """Note [Steps that train nothing]
        The walk ends an iteration at an optimizer step, but not every step trains: a checkpoint
        writer may step the optimizer once with zero gradients to create its state
        (torch.distributed.checkpoint's get_optimizer_state_dict does for a stateless optimizer
        whose gradients were set to None), so a job that trains 8 steps and then saves ended 9
        iterations and its report said so. A stretch ending at a step is an iteration row only
        if a gradient was accumulated in it (the walk's backward_ran), once the job has trained
        at all: a job in which no gradient accumulation hook fires (a custom loop calling
        teraio_step, gradients from torch.func) keeps a row per step ended, as before.
        A step that trained nothing is counted apart (steps_without_backward); its ops and
        traffic go into the next iteration's row, or into none after the last one, like the
        tail of a job that ends without a step (its final save or evaluation), which is no
        iteration either. The walk's own numbering is untouched: it lines profile and run up
        (Note [Iteration boundary] in teraio/walk.py)."""
        trained, self.walk.backward_ran = self.walk.backward_ran, False
        self._trains = self._trains or trained
        return trained or not self._trains

    def _totals(self) -> dict:
        stats, engine, host_s = self.engine.stats, self.engine, self.walk.host_s
        return {"evictions": stats.evictions, "oom_retries": stats.oom_retries,
                "stall_ms": sum(stats.stall_ms.values()),
                "offloaded_bytes": sum(stats.offloaded_bytes.values()),
                "replay_released_bytes": stats.offloaded_bytes["recompute"],
                "other_tier_bytes": stats.other_tier_bytes,
                "copy_busy_ms": sum(engine.meter.busy_s.values()) * 1e3,
                "walk_ms": host_s["walk"] * 1e3, "op_launch_ms": host_s["ops"] * 1e3,
                "between_ops_ms": host_s["between"] * 1e3,
                "replays": stats.replays, "replay_ms": stats.replay_ms, "copies_issued": stats.copies_issued,
                "copy_issue_ms": stats.copy_issue_ms, "restore_alloc_ms": stats.restore_alloc_ms,
                **self._allocator_counts()}

    def _allocator_counts(self) -> dict:
        """The CUDA caching allocator's slow paths: a sync of every stream (it frees cached
        blocks to stay under the cap, and the host waits for the device to drain) and an
        allocation retried after such a free."""
        if not self.engine.cuda:
            return {}
        stats = torch.cuda.memory_stats()
        return {"allocator_syncs": stats.get("num_sync_all_streams", 0),
                "alloc_retries": stats.get("num_alloc_retries", 0)}

    def _host_pool_peak(self) -> int:
        """The most the host pool held during this iteration (then the count starts over)."""
        host = self.engine.tiers["host"]
        return 0 if host is None else host.take_peak_bytes()
