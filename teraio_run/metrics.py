"""Per-iteration metrics of a run: one row per iteration for the report (where time and traffic
went, and whether the plan was followed: what tells a plan problem from a runtime one)."""

import time

import torch


class IterationLog:
    """Reads the engine's and the walk's running totals at each iteration end and keeps the
    differences; the agent counts its own plan actions into `counts` meanwhile."""

    def __init__(self, engine, walk, keeper):
        self.engine = engine
        self.walk = walk
        self.keeper = keeper
        self.iteration_s: list[float] = []
        self.rows: list[dict] = []
        self.counts = {"planned_offloads": 0, "plan_ids_missing": 0, "replay_fallbacks": 0}  # this iteration's
        self._t_iter = time.perf_counter()
        self._last_totals: dict = {}

    def end_iteration(self, iteration: int, num_kernels: int, followed_plan: bool, paused_at: int) -> None:
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
