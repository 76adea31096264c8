"""The ledger: every primitive call one rank issues in one iteration."""

from __future__ import annotations

from dataclasses import dataclass, replace

from collectives import Op

from .layout import Group


@dataclass(frozen=True)
class Call:
    """One kind of call: ``calls_per_iteration`` times per rank of each of ``stages``.

    ``message_bytes`` follows nccl-tests (DESIGN.md §3); for ``sendrecv`` it is what one rank sends.
    ``source`` names where in the framework (or which paper) the call comes from.
    """

    name: str
    parallelism: str
    op: Op
    phase: str
    message_bytes: int
    calls_per_iteration: int
    group: Group
    source: str
    stages: tuple[int, ...] = ()
    dtype: str = ""

    def at(self, stage: int) -> Call:
        return replace(self, stages=(stage,))

    def signature(self) -> tuple:
        return (
            self.name,
            self.parallelism,
            self.op,
            self.phase,
            self.message_bytes,
            self.calls_per_iteration,
            self.group,
            self.dtype,
        )


def recomputed(call: Call, what: str = "activation recompute") -> Call:
    """The same call issued again in backward because the forward is re-run."""
    return Call(
        call.name + ".recompute",
        call.parallelism,
        call.op,
        "backward",
        call.message_bytes,
        call.calls_per_iteration,
        call.group,
        f"{call.source}; {what}",
        call.stages,
        call.dtype,
    )


def merge_stages(calls: list[Call]) -> list[Call]:
    """Calls identical but for their stage become one row listing every stage, in first-seen order."""
    rows: dict[tuple, Call] = {}
    for call in calls:
        if call.calls_per_iteration <= 0:
            continue
        key = call.signature()
        if key in rows:
            rows[key] = replace(rows[key], stages=tuple(sorted(set(rows[key].stages) | set(call.stages))))
        else:
            rows[key] = call
    return list(rows.values())
