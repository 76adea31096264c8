"""Ring algorithms (Patarasuk & Yuan 2009; NCCL's ring; Thakur, Rabenseifner & Gropp 2005 §4).

ReduceScatter: n-1 steps; at step t member i sends chunk (i-t-1) mod n to member i+1, which reduces it, so
member i ends holding chunk i complete. AllGather: n-1 steps; member i forwards chunk (i-t) mod n.
AllReduce = ReduceScatter + AllGather: 2(n-1) steps, 2(n-1)/n M per rank each way, which is the bandwidth
lower bound (Patarasuk & Yuan). Broadcast: a pipelined chain from the root in K chunks, K + n - 2 steps.

The helpers take *many rings at once* (``members`` of shape rings x m, ``chunks`` of shape rings x m x k
slots) so the hierarchical algorithms run their per-node and per-rail rings with the same code.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from .. import layouts
from ..primitives import Op
from ..schedule import Schedule, Step, StepClass, Transfers
from ._base import Cost, Request, pipeline_chunks, register, schedule_of, share


def ring_pass_steps(members: np.ndarray, chunks: np.ndarray, reduce: bool) -> Iterator[Step]:
    """m-1 steps of a ring reduce-scatter (``reduce``) or all-gather over every ring in ``members``."""
    m = members.shape[1]
    shift = 1 if reduce else 0
    nxt = np.roll(members, -1, axis=1)
    i = np.arange(m)
    for t in range(m - 1):
        sent = (i - t - shift) % m
        slots = chunks[:, sent, :]  # rings x m x k
        src = np.broadcast_to(members[:, :, None], slots.shape)
        dst = np.broadcast_to(nxt[:, :, None], slots.shape)
        yield Step.of(Transfers.of(src, dst, slots, slots, reduce))


def ring_pass_class(members: np.ndarray, chunk_bytes: np.ndarray, reduce: bool, label: str) -> StepClass:
    """The m-1 steps of :func:`ring_pass_steps` as one class: member i sends every chunk but one —
    its own (i) in a reduce-scatter, its successor's (i+1) in an all-gather."""
    m = members.shape[1]
    kept = chunk_bytes if reduce else np.roll(chunk_bytes, -1, axis=1)
    nbytes = chunk_bytes.sum(axis=1, keepdims=True) - kept
    return StepClass(m - 1, members.ravel(), np.roll(members, -1, axis=1).ravel(), nbytes.ravel(), label)


def _flat(req: Request) -> tuple[np.ndarray, np.ndarray]:
    """One ring over all n positions whose chunk i is slot i."""
    n = req.num_ranks
    return np.arange(n)[None, :], np.arange(n)[None, :, None]


def _ring_schedule(req: Request, layout, phases: list[bool]) -> Schedule:
    members, chunks = _flat(req)

    def steps():
        for reduce in phases:
            yield from ring_pass_steps(members, chunks, reduce)

    def classes(slot_bytes: np.ndarray) -> list[StepClass]:
        return [
            ring_pass_class(members, slot_bytes[None, :], reduce, "reduce-scatter" if reduce else "all-gather")
            for reduce in phases
        ]

    return schedule_of(req, "ring", layout, steps, classes)


def _cost_allreduce(req: Request) -> Cost:
    n, m = req.num_ranks, req.message_bytes
    return Cost(2 * (n - 1), share(m, 2 * (n - 1), n), share(m, 2 * (n - 1), n))


def _cost_one_pass(req: Request) -> Cost:
    n, m = req.num_ranks, req.message_bytes
    return Cost(n - 1, share(m, n - 1, n), share(m, n - 1, n))


_ONE_PASS, _THAKUR = "(n-1)·α + (n-1)/n·M·β", "Thakur, Rabenseifner & Gropp 2005; NCCL ring"
# op: the layout, the passes round the ring (True: reduce-scatter, False: all-gather), the closed form
_PASSES = (
    (Op.ALLREDUCE, layouts.chunked, [True, False], _cost_allreduce, "2(n-1)·α + 2(n-1)/n·M·β",
     "Patarasuk & Yuan 2009; NCCL ring"),
    (Op.REDUCESCATTER, layouts.blocked, [True], _cost_one_pass, _ONE_PASS, _THAKUR),
    (Op.ALLGATHER, layouts.blocked, [False], _cost_one_pass, _ONE_PASS, _THAKUR),
)  # fmt: skip


def _passes(op: Op, layout, phases: list[bool]):
    def build(req: Request) -> Schedule:
        return _ring_schedule(req, layout(op, req.count, req.num_ranks), phases)

    return build


for _op, _layout, _phases, _cost, _formula, _source in _PASSES:
    register("ring", _op, cost=_cost, formula=_formula, source=_source)(_passes(_op, _layout, _phases))


def _cost_broadcast(req: Request) -> Cost:
    n, m = req.num_ranks, req.message_bytes
    if n == 1:
        return Cost(0, 0, 0)
    return Cost(pipeline_chunks(m) + n - 2, m, m)


@register(
    "ring",
    Op.BROADCAST,
    cost=_cost_broadcast,
    formula="(K+n-2)·(α + M/K·β), K pipeline chunks",
    source="pipelined chain broadcast, NCCL ring broadcast; Thakur et al. 2005",
)
def ring_broadcast(req: Request) -> Schedule:
    n = req.num_ranks
    num_chunks = pipeline_chunks(req.message_bytes)
    layout = layouts.chunked(Op.BROADCAST, req.count, num_chunks, req.root)
    chain = (req.root + np.arange(n)) % n

    def steps():
        if n == 1:
            return
        for s in range(num_chunks + n - 2):
            # chain member j forwards chunk s-j to member j+1 once it has it
            j = np.arange(n - 1)
            chunk = s - j
            live = (chunk >= 0) & (chunk < num_chunks)
            yield Step.of(Transfers.of(chain[j[live]], chain[j[live] + 1], chunk[live], chunk[live], False))

    return schedule_of(req, "ring", layout, steps, root=req.root)
