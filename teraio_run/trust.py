"""Where an iteration the plan has not learned yet stands against the trace, by chunk digests.

Note [Following before learning]
Learning needs a whole matching iteration, so the iteration that teaches the plan ran
unplanned, with on-demand evictions where the plan would have moved tensors ahead of use
(the LoRA case on the H200: its second iteration 2.2 s with 2,154 evictions, a planned one
1.5 s with none). Plans since chunk digests exist carry one digest per run of CHUNK_KERNELS
kernels of the traced iteration (TraceRef.chunk_digests), so an iteration not learned yet
follows the plan from its first kernel and checks each run as it ends: a run unlike the
trace's, an op past its end or an early end leave the plan (not counted as a pause: nothing
was learned to depart from), and the iteration looks for the trace's start again (below).
Up to 63 kernels' actions are taken before their run is checked; none can corrupt training
(every op's inputs are made resident first) and the budget keeper holds the cap whatever was
moved. The inputs such an iteration meets are indexed by name as they come, since its
parameters were made before the walk began. Sizes (Note [When the plan is followed] in
teraio_run/agent.py) are checked when the iteration is learned, at its end, not sooner:
mid-iteration the walk's records include storages freed since the boundary (a gradient's,
renamed by a reused address), and a check there refused plans of the right job
(tests/clients/checkpointed_blocks.py). So a plan for a model of another width is followed on
trust for that one iteration, moving the wrong bytes: exact, and within the cap by the
keeper. A plan found foreign (a guard trip, or sizes) is not followed on trust again. Older
plans (no chunk digests) keep the learning-only behaviour.

Finding the trace's start. The walk counts a job's first iteration from its first op, so
that iteration holds the job's setup too: building the model (its initializers), a data
pipeline, anything before the first step. Its kernel k is then not the trace's kernel k and
its first run never matched: the first iteration, the longest (optimizer state made, nothing
moved yet: 4.7 s with 1,797 evictions on the H100, a planned one 2.0 s), ran unplanned. So an
iteration that left the plan looks at each op for the trace's second run ending there (the
digest of its last CHUNK_KERNELS signatures: a few microseconds an op, only until found and
only before the plan is learned). The second, not the first: an iteration ends at the
optimizer step's hook, so the trace's first ops are the tail of the previous step (its
profiler range closing, a scheduler's or a logger's scalar read), which a first iteration
lacks. Found, the plan's kernel 0 is CHUNK_KERNELS ops before that run (`start`; negative if
the iteration lacks the trace's first ops) and the plan is followed from the next op; the
actions of the kernels before are not taken late (a tensor they would have moved stays, and
the keeper evicts if the cap needs it). The walk's names count ops from the iteration's start
(teraio/walk.py occurrences), so top-level tensors of ops that setup ran too are known by other
names in that iteration: their entries find no tensor or the wrong one, which costs movement,
not exactness. Such an iteration never teaches the plan (it lacks the step's tail, or holds
setup ops, so its digest is not the trace's) and is not counted on plan, even if followed from
its start to its end: the report's row shows its planned offloads.
"""

from teraio.formats.trace import CHUNK_KERNELS, signature_digest

DIGEST_CHARS = 16   # one chunk's digest in TraceRef.chunk_digests


class ChunkCheck:
    """The checks of an iteration not learned yet against the plan's chunk digests (Note
    [Following before learning]); `signatures` holds the iteration's, from its own first op,
    and `start` is its op that is the plan's kernel 0."""

    def __init__(self, chunks: str, num_kernels: int):
        self.chunks = chunks
        self.num_kernels = num_kernels
        # the run looked for: the second, since the first holds the previous step's tail
        self.sought = 1 if len(chunks) > DIGEST_CHARS else 0
        self.sought_from = self.sought * CHUNK_KERNELS
        self.sought_len = min(CHUNK_KERNELS, num_kernels - self.sought_from)
        self.sought_digest = chunks[DIGEST_CHARS * self.sought:DIGEST_CHARS * (self.sought + 1)]

    def run_unlike(self, signatures: list[int], start: int, k: int) -> bool:
        """Whether the run of the plan's kernels that ends at its kernel k differs from the
        trace's; False while a run is still going."""
        if k >= self.num_kernels:
            return True
        if (k + 1) % CHUNK_KERNELS and k + 1 != self.num_kernels:
            return False
        lo = k - k % CHUNK_KERNELS
        at = DIGEST_CHARS * (lo // CHUNK_KERNELS)
        ran = signatures[start + lo:start + k + 1]
        return signature_digest(ran) != self.chunks[at:at + DIGEST_CHARS]

    def start_found(self, signatures: list[int]) -> int | None:
        """Where the plan's kernel 0 is in the iteration, if its last ops are the run sought
        (negative where the iteration lacks the trace's first ops)."""
        lo = len(signatures) - self.sought_len
        if lo < 0 or signature_digest(signatures[lo:]) != self.sought_digest:
            return None
        return lo - self.sought_from
