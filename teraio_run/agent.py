"""The runtime inside each training process: follows the plan op by op, safely.

Note [When the plan is followed]
Plan actions are keyed by kernel index, which only means something while the live op stream
is the profiled one, so a guard checks every op against the trace's kernel at its index.
- Learning: the plan carries the trace's op digest (and structure digest, below), not its
  per-kernel signatures. The first
  iteration whose digest and length match the plan's (iteration 1 of a job with AdamW, whose
  first step creates state) gives them: sha256 equality means it ran the traced ops, so its
  signatures are the trace's. Until then the job runs unplanned, or, with a plan that carries
  chunk digests, follows it on trust (Note [Following before learning] in teraio_run/trust.py).
- Following: every iteration after that starts on the plan, and each op's signature is
  compared with the learned one at its index (an integer compare). A difference that is a
  few ops making scalars, or one kernel the iteration lacks, is stepped over (Note [Ops the
  trace lacks]); at any other, or an op past the trace's end, the plan pauses for the rest of
  that iteration: nothing more is offloaded by it, what it moved out comes back on use. Ops after the last step,
  evaluation passes, logging and saving therefore run unplanned; the report counts these
  pauses (plan_pauses) apart from guard trips (the profiled iteration never matched: a plan
  made for another job).
- Resuming: at the next iteration start the plan is armed again; the offloads of periods that
  wrap around the boundary, skipped while paused, are caught up then.
- Shapes that vary: when the plan carries the trace's structure digest (traces written since
  it exists), the signatures learned and compared are structural (teraio/walk.py
  op_structure: op name, outputs' count, dtypes and ranks, sizes aside), so an iteration
  with another sequence length or a short last batch follows the plan: the same tensors
  leave after the same kernels and come back before the same ones, only their sizes differ.
  The profiler kept the largest iteration of the job's structure (Note [Shapes that vary] in
  teraio_profile/recorder.py), so smaller ones hold less than the plan allowed for; a larger
  one is kept within the cap by the budget keeper, as any unplanned stretch is. Another
  structure (a different layer count, another control-flow path) still pauses the plan, and
  the refusal below compares structures. A plan without the digest (older plans) keeps
  exact matching: op name and output shapes.
- Sizes: a structure digest (or an op digest, which sees shapes only in the ops' outputs)
  matches a model of another width too: the same layers, the same ops. Its parameters,
  gradients and optimizer state have other sizes than the entries that name them, and
  following those entries moves the wrong bytes at the wrong times. So when an iteration
  would teach the plan, the sizes of the tensors its fixed-size entries name (SIZED_KINDS:
  no batch or sequence length changes them, unlike activations') are compared with the
  entries' nbytes, once: if one differs the plan is refused for the rest of the run, said in
  one line naming it (a guard trip; --strict stops the job), and the job runs unplanned.
  Nothing is added to the per-op path.
- Gradients of a step with a closure: the walk names a storage by owner (`<param>.grad`) once
  an optimizer step's hook meets it alive in a later iteration than it was born in; one born
  in the running iteration keeps its birth name, the name the runtime meets it by at its
  birth op. A plain loop frees its gradients (zero_grad, set_to_none) before the next step
  begins, so the trace names them by birth too. `optimizer.step(closure)` whose closure calls
  zero_grad (LBFGS, Lightning's automatic optimization) frees them only inside the next step,
  after its pre-hook has named them by owner: the profiler writes the trace after that, so
  the plan's gradient entries say `<param>.grad` for a storage that the run, in the iteration
  of the entries, knows only by its birth name. Every one of them found no tensor (4-8 plan
  ids missing per iteration in a user's trial, said as if the job had replaced tensors). So
  at each iteration end the agent looks at the gradients alive: one whose owner name the
  plan uses and whose birth name it does not, of the size the plan says, gives an alias, and
  a storage born under that birth name in a later iteration is found under the owner name
  too (the guard keeps the op stream the traced one, so the birth name is the same op's
  output). A dict lookup per new storage, only in jobs that have such aliases.
Unplanned stretches stay within budget by on-demand eviction of the least recently used
tensors (teraio_run/budget.py). Neither path can corrupt training: every op's inputs are made resident first
(ensure_resident). Reads that bypass ATen (safetensors, numpy, DLPack) go through
`resident()` and `pin_for_raw_read()` (teraio/raw_access.py).
"""

import sys
from contextlib import contextmanager

import torch
from torch.utils._python_dispatch import _disable_current_modes

from teraio.errors import PlanMismatchError, stop_job
from teraio.formats.plan import Plan
from teraio.formats.trace import Kind, signature_digest
from teraio.units import format_bytes
from teraio.walk import OpWalk, WalkListener, makes_uninitialized, op_structure, written_arguments
from teraio_run.budget import BudgetKeeper
from teraio_run.engine import MigrationEngine
from teraio_run.metrics import IterationLog
from teraio_run.saving import save_from_tiers
from teraio_run.trust import ChunkCheck

# Note [When the plan is followed], Sizes: kinds whose size is the model's, whatever the batch
SIZED_KINDS = frozenset({Kind.parameter.name, Kind.gradient.name, Kind.optimizer_state.name})
_SLICE = torch.ops.aten.slice.Tensor   # Note [Ops the trace lacks]: the one view stepped over
MAX_STEPPED_OVER = 16   # ops unlike the trace's an iteration steps over, at most (Note [Ops the trace lacks])


class RunAgent(WalkListener):
    def __init__(self, plan: Plan, engine: MigrationEngine, device_type: str, budget_bytes: int,
                 strict: bool = False):
        self.plan = plan
        self.strict = strict
        self.engine = engine
        self.cuda = device_type == "cuda"
        self.budget_bytes = budget_bytes
        self.walk = OpWalk(self, device_type, plan.header.trace.steps_per_iteration)
        self.keeper = BudgetKeeper(engine, self.walk, budget_bytes, self.cuda)
        # Note [When the plan is followed]: the digest the guard learns from, and its signatures
        self.digest = plan.header.trace.structure_digest or plan.header.trace.op_digest
        if plan.header.trace.structure_digest:
            self.walk.signature_of = op_structure
        # the GPU capped and holding the copy streams (the bootstrap picked it from LOCAL_RANK)
        self.device_index = torch.cuda.current_device() if self.cuda else None
        self.offloads_after, self.prefetches_at = _index_actions(plan)
        # Note [Replay] in teraio_run/replay.py: the calls to keep, by the kernel that makes them;
        # without clean copies the walk may miss writes, and replays move to the host pool
        self.replay = engine.tiers["recompute"] if engine.keep_clean else None
        self.replays_made_at = _index_replays(plan) if self.replay is not None else {}
        if self.replay is None and any(entry.tier == "recompute" for entry in plan.entries):
            print("teraio: warning: with --no-clean-copies the plan's recompute entries move to the host pool "
                  "instead (a replay needs every write seen); plan with --no-recompute to plan for that",
                  file=sys.stderr)
        self.num_kernels = plan.header.trace.num_kernels
        # Note [Following before learning] in teraio_run/trust.py: the trace's runs of signatures
        chunks = plan.header.trace.chunk_digests
        self.chunks = ChunkCheck(chunks, self.num_kernels) if chunks else None
        self.following = self.chunks is not None
        self.searching = False   # for the trace's start, after leaving the plan unlearned
        self.start = 0           # this iteration's op that is the plan's kernel 0
        self.expected: list[int] | None = None   # the trace's signature per kernel, once learned
        self.paused_at = -1                      # kernel where this iteration left the plan
        self.by_id = {}
        # Note [When the plan is followed], Gradients of a step with a closure
        self.plan_ids = frozenset(entry.tensor for entry in plan.entries)
        self.born_as: dict[str, str] = {}   # a gradient's birth name -> the plan's owner name for it
        self.signatures: list[int] = []          # this iteration's, until `expected` is learned
        self.iterations_on_plan = 0
        self.guard_trips = 0
        self.guard_reason = ""
        self.planned_nbytes = _sized_entries(plan)   # tensor id -> (name, nbytes in the trace)
        self.sizes_differ = False                    # refused for good: Note [When the plan is followed], Sizes
        self.plan_pauses = 0
        self.pause_reason = ""   # the first one, for the report
        self.stepped_over = 0    # ops unlike the trace's this iteration stepped over (Note [Ops the trace lacks])
        self.off_plan = False    # the last op was one of them
        self.log = IterationLog(engine, self.walk, self.keeper)

    @property
    def device_name(self) -> str:
        return f"cuda:{self.device_index}" if self.cuda else self.walk.device_type

    # ----- per op ---------------------------------------------------------------------------
    def before_op(self, k, func, inputs):
        if self.replay is not None and self.replay.dependents and written_arguments(func):
            self._replay_before_write(inputs)
        if self.following and not self.off_plan and k - self.start in self.prefetches_at:  # first: a replay planned here is no late prefetch
            self._start_prefetches(k - self.start)
        self.keeper.restore_inputs(inputs, "late_prefetch" if self.following else "unplanned")

    def _replay_before_write(self, inputs) -> None:
        """An op that writes in place may write an input of a released storage: replay those
        first (Note [Replay]); all its inputs count, the written ones are a subset."""
        for record in self.replay.released_depending_on([r.key for r in inputs]):
            self.keeper.restore_inputs([record], "replay_before_write")

    def _start_prefetches(self, k: int) -> None:
        with self.engine.compute_mark:  # Note [One compute-stream event per group of copies] in tiers.py
            for entry in self.prefetches_at.get(k, ()):
                self._prefetch(entry)

    def _prefetch(self, entry) -> None:
        record = self.by_id.get(entry.tensor)
        if record is None:
            # before the plan is learned, a tensor not met yet is one never moved
            if self.expected is not None:
                self.log.missing(entry, "prefetch")
            return
        # counted after this op, and sent back if it passes the budget there (Note
        # [Prefetches within the budget] in teraio_run/budget.py)
        self.keeper.grew = True
        try:
            self.engine.prefetch(record)
        except torch.OutOfMemoryError:
            self.engine.stats.skipped += 1  # no room yet: it comes back when an op needs it

    def after_op(self, k, func, inputs, new, signature):
        if self.expected is None:
            self.signatures.append(signature)
        by_id, born_as = self.by_id, self.born_as
        for record in new:
            by_id[record.id] = record
            if born_as and (alias := born_as.get(record.id)) is not None:
                by_id[alias] = record   # Note [When the plan is followed], Gradients of a step with a closure
        if new and makes_uninitialized(func):
            self.keeper.hold_unwritten(new)  # before the plan's offloads after this op
        if self.searching:
            self._search(inputs)
        elif self.following:
            k -= self.start
            if self.expected is None:
                self._follow_unlearned(k, inputs)
            elif k >= self.num_kernels or signature != self.expected[k]:
                k = self._realign(k, func, signature, new)
            else:
                self.off_plan = False
            if self.following:
                if k in self.replays_made_at:
                    self._capture(func, inputs, new, self.replays_made_at[k])
                if k in self.offloads_after and not self.keeper.holds:
                    self._offload_planned(k)
        self.keeper.after_op(inputs, new)

    def _follow_unlearned(self, k: int, inputs) -> None:
        """Note [Following before learning]: the inputs first met become known by name, and
        a run of kernels that ends here is checked against the plan's digest of it."""
        self._index(inputs)
        if self.chunks.run_unlike(self.signatures, self.start, k):
            self._leave_unlearned()

    def _leave_unlearned(self) -> None:
        """This iteration is not the traced one from here: it runs unplanned, as it would have
        without the plan's chunk digests (no pause: the plan was not learned yet), and looks
        for the trace's start again."""
        self.following, self.searching = False, True
        if self.replay is not None:
            self.replay.drop_pending()

    def _search(self, inputs) -> None:
        """Note [Following before learning], Finding the trace's start: the plan is followed
        from the next op if the run sought ended here."""
        self._index(inputs)
        start = self.chunks.start_found(self.signatures)
        if start is not None:
            self.start, self.searching, self.following = start, False, True

    def _index(self, inputs) -> None:
        by_id = self.by_id
        for record in inputs:
            by_id[record.id] = record

    def _offload_planned(self, k: int) -> None:
        with self.engine.compute_mark:  # Note [One compute-stream event per group of copies] in tiers.py
            for entry in self.offloads_after[k]:
                self._offload(entry)

    def _offload(self, entry) -> None:
        record = self.by_id.get(entry.tensor)
        if record is None:
            if self.expected is not None:   # an iteration on trust may not be the traced one
                self.log.missing(entry, "offload")
        elif (refused := self.keeper.refusal(record, Kind[entry.kind])) is not None:
            self.log.refuse(entry, refused)  # Note [Refused plan actions] in teraio_run/metrics.py
        elif self.engine.offload(record, self._tier(entry, record)):
            self.log.counts["planned_offloads"] += 1

    def _capture(self, func, inputs, new, replays_of: dict[str, int]) -> None:
        """Keep the call of an op whose output the plan replays later (Note [Replay])."""
        args, kwargs, out_tensors = self.walk.last_call
        for record in new:
            if record.id in replays_of:
                self.replay.capture(record, func, args, kwargs, out_tensors, inputs, replays_of[record.id])

    def _tier(self, entry, record) -> str:
        """The entry's tier; the host pool for a replay that cannot make the same bytes any more
        (an input written since, no call captured) or when replays are off."""
        if entry.tier != "recompute" or (self.replay is not None and self.replay.ready(record)):
            return entry.tier
        self.log.counts["replay_fallbacks"] += 1
        return "host"

    def relieve_memory(self, inputs, attempt: int = 0) -> bool:
        return self.keeper.relieve_memory(inputs, attempt)

    # ----- iteration boundary ---------------------------------------------------------------
    def on_iteration_end(self, iteration, num_kernels):
        if self.following and num_kernels - self.start < self.num_kernels:  # every op matched, but it ended early
            self._pause(num_kernels, None) if self.expected is not None else self._leave_unlearned()
        if self.expected is None:
            self._learn(iteration, num_kernels)
        # one followed on trust counts once it has taught the plan (Note [Following before learning])
        completed = self.following and self.expected is not None
        self.log.end_iteration(iteration, num_kernels, completed, self.paused_at)
        if iteration == 0:
            self._check_device()
        if completed:
            self.iterations_on_plan += 1
        # Note [When the plan is followed]: every iteration starts on the plan once it is known;
        # Note [Following before learning]: before that too, unless the plan proved foreign
        self.following = self.expected is not None or (
            self.chunks is not None and not self.sizes_differ and not self.guard_trips)
        self.paused_at, self.start, self.searching = -1, 0, False
        self.stepped_over, self.off_plan = 0, False
        if self.replay is not None:
            self.replay.drop_pending()
        with _disable_current_modes():
            self._tidy()
            if self.following and not completed:
                self._catch_up_wraps()

    def _learn(self, iteration: int, num_kernels: int) -> None:
        """The first iteration that ran the traced ops, on tensors of the traced sizes, gives
        the per-kernel signatures."""
        signatures, self.signatures = self.signatures, []
        if self.sizes_differ:
            return
        digest = signature_digest(signatures)
        if digest == self.digest and num_kernels == self.num_kernels:
            if (reason := self._sizes_unlike_plan()) is None:
                self.expected = signatures
            else:
                self._refuse_sizes(reason)
        elif iteration == self.plan.header.trace.steady_from_iteration:
            self._refuse(digest, num_kernels)

    def _sizes_unlike_plan(self) -> str | None:
        """Why this job's tensors are not those the plan's entries were made for (Note [When
        the plan is followed], Sizes), or None. A tensor the walk has not met is skipped: a
        missing one is counted as it is due (plan_ids_missing)."""
        live_nbytes: dict[str, set[int]] = {}
        for record in self.walk.records.values():
            if record.id in self.planned_nbytes:
                live_nbytes.setdefault(record.id, set()).add(record.nbytes)
        differ = [(name, min(live), planned) for tensor_id, (name, planned) in self.planned_nbytes.items()
                  if (live := live_nbytes.get(tensor_id)) and planned not in live]
        if not differ:
            return None
        name, here, there = max(differ, key=lambda d: d[2])   # the largest says most about the model
        here_s, there_s = format_bytes(here), format_bytes(there)
        if here_s == there_s:  # the sizes differ below the rounding
            here_s, there_s = f"{here} bytes", f"{there} bytes"
        return (f"the plan was made for tensors of other sizes: {name} is {here_s} here, {there_s} in the "
                f"plan's trace ({len(differ)} of the {len(live_nbytes)} weights, gradients and optimizer states "
                "it moves differ); profile this job again and plan its trace")

    def _refuse_sizes(self, reason: str) -> None:
        """A plan for another model of the same ops: never followed, one line (a guard trip)."""
        self.sizes_differ = True
        self.guard_trips, self.guard_reason = self.guard_trips + 1, reason   # in the report written at exit
        if self.strict:
            stop_job(PlanMismatchError(reason))
        print(f"teraio: warning: {reason}; the plan is not followed (training stays exact, and the budget is "
              "kept by on-demand eviction)", file=sys.stderr)

    def _catch_up_wraps(self) -> None:
        """The plan is about to be followed after an unplanned iteration, which skipped the
        offloads of periods that wrap around the boundary (weights and optimizer state idle
        until the next iteration): do them now, or the first planned iteration starts with
        all of them on the device and has to evict."""
        for entries in self.offloads_after.values():
            for entry in entries:
                # only those whose prefetch falls in the coming iteration
                in_next = entry.wraps and entry.prefetch_at < entry.offload_after
                record = self.by_id.get(entry.tensor) if in_next else None
                if record is None:
                    continue
                if (refused := self.keeper.refusal(record, Kind[entry.kind])) is not None:
                    self.log.refuse(entry, refused)
                else:
                    self.engine.offload(record, entry.tier)

    def _tidy(self) -> None:
        self.keeper.forget(self.walk.forget_expired())
        self.by_id = {r.id: r for r in self.walk.records.values()}
        self._learn_gradient_aliases()

    def _learn_gradient_aliases(self) -> None:
        """Note [When the plan is followed], Gradients of a step with a closure: the gradients
        alive at this boundary that the plan names by owner and the run by birth."""
        plan_ids, planned = self.plan_ids, self.planned_nbytes
        for record in self.walk.records.values():
            if (record.kind == Kind.gradient and record.id != record.name and record.name in plan_ids
                    and record.id not in plan_ids and planned.get(record.name, (None, -1))[1] == record.nbytes):
                self.born_as[record.id] = record.name

    def _refuse(self, digest: str, num_kernels: int) -> None:
        """The iteration that was profiled does not match: the plan was made for another job."""
        ref = self.plan.header.trace
        which = "op structure" if ref.structure_digest else "op digest"
        reason = (f"this job's iterations ({which} {digest}, {num_kernels} kernels) do not match the plan's "
                  f"trace ({self.digest}, {ref.num_kernels} kernels): re-profile and re-plan this job")
        if self.strict:
            self.guard_trips, self.guard_reason = self.guard_trips + 1, reason   # in the report written at exit
            stop_job(PlanMismatchError(reason))
        self._trip(reason)

    def never_learned(self) -> str | None:
        """At the job's end: why the plan was never followed, where no iteration ran the traced
        ops and nothing said so yet (None otherwise).

        The guard refuses a plan at the job's iteration of the trace's index
        (steady_from_iteration) only, since earlier ones may rightly differ (setup, an
        optimizer's first step making its state). A job that ends before that index, with a
        plan of its own or of another job, was never told: a 3-step job under the plan of
        another model exited 0 under --strict, its summary calling its iterations "the job's
        first". So the end says it, once, as a guard trip (the report's guard_reason), and
        --strict fails the job after its report is written (teraio_run/report.py, finish). A plan
        that moves nothing is not one to follow: nothing is said."""
        if self.expected is not None or self.guard_trips or not self.log.rows or not self.plan.entries:
            return None
        ref = self.plan.header.trace
        kernels = sorted({row["kernels"] for row in self.log.rows})
        shown = ", ".join(f"{n:,}" for n in kernels[:4]) + (", ..." if len(kernels) > 4 else "")
        reason = (f"no iteration of this job ran the plan's traced ops: the plan was profiled at iteration "
                  f"{ref.steady_from_iteration} ({ref.num_kernels:,} kernels) and this job ran "
                  f"{len(self.log.rows)} iteration(s) of {shown} kernels, so it was never followed; if this is the "
                  f"job profiled, run it for more than {ref.steady_from_iteration} iterations, if another (or its ops "
                  "follow its data), re-profile and re-plan it")
        self.guard_trips, self.guard_reason = 1, reason
        return reason

    def _check_device(self) -> None:
        """A job that computes on another GPU than the one set up would run uncapped, its
        copies ordered on its compute stream and timed on an idle one."""
        if not self.cuda or torch.cuda.current_device() == self.device_index:
            return
        reason = (f"the job computes on cuda:{torch.cuda.current_device()} but teraio capped and set up copies "
                  f"on cuda:{self.device_index}: run one process per GPU with LOCAL_RANK naming its GPU, "
                  "or give each process its GPU alone with CUDA_VISIBLE_DEVICES")
        if self.strict:
            stop_job(PlanMismatchError(reason))
        print(f"teraio: warning: {reason}", file=sys.stderr)

    def _realign(self, k: int, func, signature: int, new) -> int:
        """This op is not the plan's kernel k: the kernel it is (k + 1 where the iteration lacks
        kernel k), or -1 where it is none of the plan's.

        Note [Ops the trace lacks]
        A loop that logs every few steps runs ops there that the traced iteration did not (a
        log line's loss.item(), the Hugging Face Trainer's mean of its running loss), and they
        come right after the step: the next iteration's first op differed from the trace's, and
        the whole iteration ran unplanned (a fifth of a Trainer's iterations with
        logging_steps=5). Such ops make scalars or nothing: an op unlike the plan's kernel k
        whose outputs hold at most one element each is stepped over. It is no kernel of the
        plan's (the iteration's op that is the plan's kernel 0 moves one on), no action is taken
        after it, and the next op is compared with kernel k again; the plan is back once one
        matches. The prefetches before kernel k were started before the op was known (what
        kernel k needs; starting them again is a no-op) and are not started again while the
        plan is off. An op that makes a larger tensor (an evaluation's forward, a save's detach
        of each weight, another branch), or more than MAX_STEPPED_OVER ops in an iteration,
        pause the plan for the rest of the iteration as before, at the first op unlike the
        trace's: a stretch of such ops could match the trace's kernels by chance and move
        tensors the iteration does not need. Every op is still made exact by its inputs being
        resident first, and the keeper holds the cap. The iteration's row counts the ops
        stepped over (ops_stepped_over).
        The other way round, an iteration may lack one of the trace's kernels: PyTorch makes no
        slice for an index that spans a whole dimension, so torchvision's detection transform,
        padding each image into its batch with `pad[:c, :h, :w].copy_(img)`, ran one op fewer
        for an image already at the padded size, and 17 of 30 iterations of a Faster R-CNN left
        the plan there. So an op unlike kernel k that is the trace's kernel k + 1 is taken for
        it: kernel k is absent, its offloads are done now, and the plan goes on from k + 1
        (counted in kernels_absent, and against MAX_STEPPED_OVER with the ops stepped over).
        Both at once: TRL's collator pads each row into its batch with `out[i][:len(t)] = t`, so
        the traced iteration lacks the slice where its longest row sat, and an iteration whose
        longest row sits elsewhere runs one there (a view of the batch) and lacks one at its
        own longest: 1 of 12 iterations of an SFTTrainer run followed its plan. So a slice, the
        op PyTorch leaves out at a whole dimension, is stepped over like a scalar's where it
        makes no storage and writes none (a view: it allocates and moves nothing). Other views
        still pause the plan: a save's detach of each weight is one, and stepping over a save's
        ops let the plan match the trace's kernels among them (tests/test_gpu.py's torch.save test
        found a storage back that the plan had out; fb9126f)."""
        if k + 1 < self.num_kernels and signature == self.expected[k + 1] and self.stepped_over < MAX_STEPPED_OVER:
            self.stepped_over += 1
            self.start -= 1
            self.off_plan = False
            self.log.counts["kernels_absent"] += 1
            if k in self.offloads_after and not self.keeper.holds:  # what kernel k would have let go
                self._offload_planned(k)
            return k + 1
        self._step_over(k, func, new)
        return -1

    def _step_over(self, k: int, func, new) -> None:
        """An op of none of the plan's kernels: stepped over, or the plan pauses (Note [Ops the
        trace lacks])."""
        self.stepped_over += 1
        a_slice = func is _SLICE and not new and not self.walk.op_written
        if self.stepped_over > MAX_STEPPED_OVER or not (a_slice or _makes_scalars(self.walk.last_call[2])):
            self._pause(k, func)
            return
        self.start += 1
        self.off_plan = True
        self.log.counts["ops_stepped_over"] += 1

    def _pause(self, k: int, func) -> None:
        """Stop following the plan for the rest of this iteration (Note [When the plan is followed])."""
        self.following = False
        self.paused_at = k
        self.plan_pauses += 1
        if self.replay is not None:
            self.replay.drop_pending()  # no offload comes for them now: their inputs may go
        if not self.pause_reason:
            where = f"iteration {self.walk.iteration}, kernel {k} of {self.num_kernels}"
            if func is None:
                self.pause_reason = f"{where}: the iteration ended early"
            elif k >= self.num_kernels:
                self.pause_reason = f"{where}: {func} runs past the traced iteration"
            else:
                self.pause_reason = f"{where}: {func} is not the traced op"

    def _trip(self, reason: str) -> None:
        """The profiled iteration did not match: the plan waits for one that does."""
        self.guard_trips += 1
        if not self.guard_reason:
            self.guard_reason = reason
            print(f"teraio: warning: {reason}; the plan is paused until an iteration matches again "
                  "(training stays correct)", file=sys.stderr)

    def resident(self):
        """`teraio.resident()`: every tensor on the device until the block ends (BudgetKeeper.resident)."""
        return self.keeper.resident()

    @contextmanager
    def save_from_tiers(self):
        """torch.save: moved tensors read from their tiers, nothing leaving while it runs
        (Note [Saving from the tiers] in teraio_run/saving.py)."""
        with self.keeper.holding(), save_from_tiers(self.engine, self.walk.records, self.keeper.bring_back) as reads:
            yield reads

    def pin_for_raw_read(self, tensor) -> None:
        self.keeper.pin_for_raw_read(tensor)

    def held_for_copy(self, storage):
        """A storage's clone or cpu copy (teraio/raw_access.py): BudgetKeeper.held_for_copy."""
        return self.keeper.held_for_copy(storage)


def _makes_scalars(out_tensors) -> bool:
    """Whether an op's outputs hold at most one element each (Note [Ops the trace lacks])."""
    return all(t.numel() <= 1 for t in out_tensors)


def _sized_entries(plan: Plan) -> dict[str, tuple[str, int]]:
    """Tensor id -> (name, nbytes) of the entries whose size no batch changes (SIZED_KINDS),
    in the plan's order: what the size check compares, once."""
    sized: dict[str, tuple[str, int]] = {}
    for entry in plan.entries:
        if entry.kind in SIZED_KINDS:
            sized.setdefault(entry.tensor, (entry.name, entry.nbytes))
    return sized


def _index_replays(plan: Plan) -> dict[int, dict[str, int]]:
    """By the kernel that makes them: tensor id -> how many recompute entries replay it."""
    made_at: dict[int, dict[str, int]] = {}
    for entry in plan.entries:
        if entry.tier == "recompute":
            replays = made_at.setdefault(entry.produced_at, {})
            replays[entry.tensor] = replays.get(entry.tensor, 0) + 1
    return made_at


def _index_actions(plan: Plan):
    """Plan entries by the kernel of each action: offload after, prefetch before."""
    offloads, prefetches = {}, {}
    for entry in plan.entries:
        offloads.setdefault(entry.offload_after, []).append(entry)
        prefetches.setdefault(entry.prefetch_at, []).append(entry)
    return offloads, prefetches
