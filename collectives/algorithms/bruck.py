"""Bruck's algorithms (Bruck et al. 1997; Thakur, Rabenseifner & Gropp 2005 §4.1, §4.6).

AllGather: after step k rank r holds the blocks r .. r+2^(k+1)-1 (mod n); at step k it receives from
r + 2^k the min(2^k, n - 2^k) blocks that one holds: ceil(log2 n) steps for any n, (n-1)/n M each way.
Blocks keep their global slot index, so the final local rotation of the textbook version is not needed.

AllToAll: rank r first rotates its send blocks so position i holds the block for r+i; at step k it sends
every position whose bit k is set to r + 2^k (the receiver keeps the position); finally position i holds
the block from r-i and is copied to its place. ceil(log2 n) steps, each sending about M/2: the
latency-optimal all-to-all for small blocks, at log2(n)/2 x the bytes of pairwise exchange.
"""

from __future__ import annotations

import numpy as np

from .. import layouts
from ..primitives import Op
from ..schedule import Schedule, Step, Transfers
from ._base import Cost, Request, ceil_log2, register, schedule_of, share


def _cost_allgather(req: Request) -> Cost:
    n, m = req.num_ranks, req.message_bytes
    return Cost(ceil_log2(n), share(m, n - 1, n), share(m, n - 1, n))


@register(
    "bruck",
    Op.ALLGATHER,
    cost=_cost_allgather,
    formula="⌈log2 n⌉·α + (n-1)/n·M·β",
    source="Bruck et al. 1997; Thakur, Rabenseifner & Gropp 2005 §4.1",
)
def bruck_allgather(req: Request) -> Schedule:
    n = req.num_ranks
    layout = layouts.blocked(Op.ALLGATHER, req.count, n)

    def steps():
        r = np.arange(n)[:, None]
        for k in range(ceil_log2(n)):
            dist = 1 << k
            blocks = (r + dist + np.arange(min(dist, n - dist))[None, :]) % n
            src = np.broadcast_to((r + dist) % n, blocks.shape)
            yield Step.of(Transfers.of(src, np.broadcast_to(r, blocks.shape), blocks, blocks, False))

    return schedule_of(req, "bruck", layout, steps)


def _cost_alltoall(req: Request) -> Cost:
    n, block = req.num_ranks, req.message_bytes // max(req.num_ranks, 1)
    positions = np.arange(n)
    moved = sum(int(((positions >> k) & 1).sum()) for k in range(ceil_log2(n))) * block
    return Cost(ceil_log2(n), moved, moved)


@register(
    "bruck",
    Op.ALLTOALL,
    cost=_cost_alltoall,
    formula="⌈log2 n⌉·α + ⌈log2 n⌉/2·M·β (n a power of two)",
    source="Bruck et al. 1997; Thakur, Rabenseifner & Gropp 2005 §4.6",
)
def bruck_alltoall(req: Request) -> Schedule:
    n = req.num_ranks
    work = 2 * n  # slots 2n .. 3n-1 hold the rotated buffer
    layout = layouts.alltoall(req.count, n, extra_slots=n)
    r = np.arange(n)[:, None]
    i = np.arange(n)[None, :]
    rank = np.broadcast_to(r, (n, n))

    def steps():
        yield Step.of(Transfers.of(rank, rank, (r + i) % n, work + i, False))
        for k in range(ceil_log2(n)):
            pos = np.nonzero((np.arange(n) >> k) & 1)[0][None, :]
            src = np.broadcast_to(r, (n, pos.shape[1]))
            yield Step.of(Transfers.of(src, (src + (1 << k)) % n, work + pos, work + pos, False))
        yield Step.of(Transfers.of(rank, rank, work + i, n + (r - i) % n, False))

    return schedule_of(req, "bruck", layout, steps)
