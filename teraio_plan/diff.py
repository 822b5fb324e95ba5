"""What changed between two plans, for code review."""

from dataclasses import dataclass, field

from teraio.formats.plan import Plan, PlanEntry

# Timing and tier fields a reviewer cares about when the same idle period is planned again.
COMPARED_FIELDS = ("tier", "nbytes", "offload_by", "prefetch_at", "needed_by", "wraps", "clean", "produced_at")


def entry_key(entry: PlanEntry) -> tuple[str, int]:
    """An entry is one idle period of one tensor, and (tensor, offload_after) names that period.

    offload_after is the tensor's last use before the period: a fact of the trace, not of the
    planner's inputs. So between two plans of the same trace (say, 2 SSDs against 4) the same
    key means the same period, and a change of tier, offload_by or prefetch_at shows as one
    changed row instead of one removed and one added. Keying by tensor alone would merge the
    several periods of one tensor; keying by all fields would make every retiming a remove+add.
    """
    return entry.tensor, entry.offload_after


@dataclass
class EntryChange:
    key: tuple[str, int]
    old: PlanEntry
    new: PlanEntry
    fields: list[str]


@dataclass
class PlanDiff:
    same_trace: bool
    added: list[PlanEntry] = field(default_factory=list)
    removed: list[PlanEntry] = field(default_factory=list)
    changed: list[EntryChange] = field(default_factory=list)
    inputs: dict[str, tuple] = field(default_factory=dict)       # name -> (old, new)
    prediction: dict[str, tuple] = field(default_factory=dict)   # name -> (old, new)

    @property
    def unchanged(self) -> bool:
        return not (self.added or self.removed or self.changed or self.inputs or self.prediction)

    def to_json(self) -> dict:
        def dump(e: PlanEntry) -> dict:
            return e.model_dump(mode="json")
        return {
            "same_trace": self.same_trace,
            "added": [dump(e) for e in self.added],
            "removed": [dump(e) for e in self.removed],
            "changed": [{"tensor": c.key[0], "offload_after": c.key[1], "fields": c.fields,
                         "old": dump(c.old), "new": dump(c.new)} for c in self.changed],
            "inputs": {k: list(v) for k, v in self.inputs.items()},
            "prediction": {k: list(v) for k, v in self.prediction.items()},
        }


def _changed_values(old: dict, new: dict) -> dict[str, tuple]:
    return {k: (old.get(k), new.get(k)) for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)}


def diff_plans(a: Plan, b: Plan) -> PlanDiff:
    """Entries added, removed and changed from plan a to plan b, and header changes."""
    old = {entry_key(e): e for e in a.entries}
    new = {entry_key(e): e for e in b.entries}
    result = PlanDiff(same_trace=a.header.trace == b.header.trace)
    result.removed = [old[k] for k in sorted(old.keys() - new.keys(), key=_order)]
    result.added = [new[k] for k in sorted(new.keys() - old.keys(), key=_order)]
    for k in sorted(old.keys() & new.keys(), key=_order):
        fields = [f for f in COMPARED_FIELDS if getattr(old[k], f) != getattr(new[k], f)]
        if fields:
            result.changed.append(EntryChange(k, old[k], new[k], fields))
    result.inputs = _changed_values(a.header.inputs.model_dump(), b.header.inputs.model_dump())
    result.prediction = _changed_values(a.header.prediction.model_dump(), b.header.prediction.model_dump())
    return result


def _order(key: tuple[str, int]) -> tuple[int, str]:
    return key[1], key[0]
