"""All-to-all by pairwise exchange and by direct sends (Thakur, Rabenseifner & Gropp 2005 §4.6; NCCL).

Pairwise exchange: n-1 steps; at step k rank r sends its block for r+k and receives the block of r-k, one
peer at a time (MPICH's long-message algorithm). Direct: every rank posts all n-1 sends at once, as NCCL's
``ncclGroupStart`` loop of ncclSend/ncclRecv does: one step in which the network sorts out contention.
Both move (n-1)/n M each way; the own block is a local copy. The direct one is priced as one all-pairs
step class in O(n) (schedule.py), without listing its n(n-1) transfers.
"""

from __future__ import annotations

import numpy as np

from .. import layouts
from ..primitives import Op
from ..schedule import Schedule, Step, StepClass, Transfers
from ._base import Cost, Request, register, schedule_of, share


def _own_block_copy(n: int) -> Transfers:
    r = np.arange(n)
    return Transfers.of(r, r, r, n + r, False)


def _cost_pairwise(req: Request) -> Cost:
    n, m = req.num_ranks, req.message_bytes
    return Cost(n - 1, share(m, n - 1, n), share(m, n - 1, n))


def _cost_direct(req: Request) -> Cost:
    n, m = req.num_ranks, req.message_bytes
    return Cost(1 if n > 1 else 0, share(m, n - 1, n), share(m, n - 1, n))


@register(
    "pairwise",
    Op.ALLTOALL,
    cost=_cost_pairwise,
    formula="(n-1)·α + (n-1)/n·M·β",
    source="Thakur, Rabenseifner & Gropp 2005 §4.6 (pairwise exchange)",
)
def pairwise_alltoall(req: Request) -> Schedule:
    n = req.num_ranks
    r = np.arange(n)

    def steps():
        yield Step.of(_own_block_copy(n))
        for k in range(1, n):
            peer = (r + k) % n
            yield Step.of(Transfers.of(r, peer, peer, n + r, False))

    return schedule_of(req, "pairwise", layouts.alltoall(req.count, n), steps)


@register(
    "direct",
    Op.ALLTOALL,
    cost=_cost_direct,
    formula="α + (n-1)/n·M·β (all peers at once)",
    source="NCCL all-to-all as grouped ncclSend/ncclRecv",
)
def direct_alltoall(req: Request) -> Schedule:
    n = req.num_ranks

    def steps():
        src, dst = np.nonzero(~np.eye(n, dtype=bool))
        yield Step.of(_own_block_copy(n), Transfers.of(src, dst, dst, n + src, False))

    def classes(slot_bytes: np.ndarray) -> list[StepClass]:
        """One all-pairs class (i -> j carries send block j), in O(n): the own block is a local copy."""
        if n < 2:
            return []
        return [StepClass.every_pair(1, np.zeros(n, dtype=np.int64), slot_bytes[:n])]

    layout = layouts.alltoall(req.count, n)
    return schedule_of(req, "direct", layout, steps, classes)
