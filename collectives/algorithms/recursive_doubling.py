"""Recursive doubling (Thakur, Rabenseifner & Gropp 2005 §4.1, §4.4).

AllReduce: at step k every rank exchanges its whole (partially reduced) buffer with rank r xor 2^k and
reduces: log2(n) steps of M each way. A non-power-of-two n is folded first (MPICH's approach): with p the
largest power of two <= n, each of the n-p extra ranks p+j sends its buffer to rank j, the p ranks run
recursive doubling, and rank j sends the result back: log2(p) + 2 steps.

AllGather: at step k rank r exchanges the 2^k blocks it holds with r xor 2^k: log2(n) steps,
(n-1)/n M each way; power-of-two n only (the non-power-of-two variant is Bruck's, see bruck.py).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import numpy as np

from .. import layouts
from ..primitives import Op
from ..schedule import Schedule, Step, Transfers
from ._base import Cost, Request, floor_pow2, need_pow2, register, schedule_of, share


def fold_in(n: int, slots, reduce: bool = True) -> Step:
    """Extra ranks p..n-1 hand their slots to ranks 0..n-p-1 (the non-power-of-two pre-step)."""
    p = floor_pow2(n)
    extra = np.arange(p, n)
    src, slot = np.meshgrid(extra, slots, indexing="ij")
    return Step.of(Transfers.of(src, src - p, slot, slot, reduce))


def fold_out(n: int, slots) -> Step:
    """Ranks 0..n-p-1 return the finished slots to the extra ranks (the non-power-of-two post-step)."""
    p = floor_pow2(n)
    extra = np.arange(p, n)
    dst, slot = np.meshgrid(extra, slots, indexing="ij")
    return Step.of(Transfers.of(dst - p, dst, slot, slot, False))


def folded(n: int, slots, inner):
    """MPICH's non-power-of-two treatment around ``inner``, the steps among the p = floor_pow2(n) ranks: the extra
    ranks fold their ``slots`` in before and get the result back after."""
    p = floor_pow2(n)
    if n > p:
        yield fold_in(n, slots)
    yield from inner
    if n > p:
        yield fold_out(n, slots)


def block_exchange(owner: np.ndarray, p: int, mask: int, halving: bool, reduce: bool) -> Step:
    """One exchange among ranks 0..p-1 at distance ``mask`` over blocks with the given virtual owners.

    Halving: rank r holds blocks whose owner agrees with r above bit 2*mask and sends those the partner
    keeps. Doubling: rank r holds blocks whose owner agrees with r from bit ``mask`` up and sends them all.
    """
    r = np.arange(p)[:, None]
    partner = r ^ mask
    if halving:
        moving = (owner[None, :] & ~(2 * mask - 1)) == (r & ~(2 * mask - 1))
        moving &= (owner[None, :] & mask) == (partner & mask)
    else:
        moving = (owner[None, :] & ~(mask - 1)) == (r & ~(mask - 1))
    rows, blocks = np.nonzero(moving)
    return Step.of(Transfers.of(rows, rows ^ mask, blocks, blocks, reduce))


def recursive_doubling(owner: np.ndarray, p: int):
    """Recursive doubling over blocks among ranks 0..p-1 (distances 1, 2, ..., p/2): at distance d rank r sends
    its partner r xor d every block it holds, those whose ``owner`` agrees with r from bit d up. The allgather
    of recursive doubling (``owner``: block b is rank b's) and the second half of Rabenseifner's allreduce
    (halving_doubling.py; Thakur, Rabenseifner & Gropp 2005 §4.4)."""
    for j in range(p.bit_length() - 1):
        yield block_exchange(owner, p, 1 << j, halving=False, reduce=False)


def exchange_and_reduce(peers: np.ndarray) -> Step:
    """Every rank r swaps its whole (single-slot) buffer with peers[r] and reduces: one step of recursive
    doubling, and of Swing with its own peers."""
    return Step.of(Transfers.of(np.arange(len(peers)), peers, 0, 0, True))


def exchange_allreduce_cost(req: Request) -> Cost:
    """log2(p) exchanges of the whole M (p = floor_pow2(n)), and the fold's two steps of M when n > p."""
    n, m = req.num_ranks, req.message_bytes
    p = floor_pow2(n)
    rounds = p.bit_length() - 1 + (1 if n > p else 0)
    return Cost(p.bit_length() - 1 + (2 if n > p else 0), rounds * m, rounds * m)


def exchange_allreduce(req: Request, algorithm: str, peers: Callable[[int, int], np.ndarray]) -> Schedule:
    """The latency-optimal allreduce of recursive doubling and of Swing: at step s of log2(p) every rank r < p
    swaps its whole buffer with ``peers(p, s)[r]`` and reduces; the n - p extra ranks fold in first and get the
    result back after (:func:`folded`)."""
    n = req.num_ranks
    p = floor_pow2(n)
    layout = layouts.chunked(Op.ALLREDUCE, req.count, 1)

    def steps():
        return folded(n, [0], (exchange_and_reduce(peers(p, s)) for s in range(p.bit_length() - 1)))

    return schedule_of(req, algorithm, layout, steps)


def register_exchange_allreduce(
    algorithm: str, peers: Callable[[int, int], np.ndarray], *, formula: str, source: str, check=None
) -> Callable[[Request], Schedule]:
    """Register an allreduce of the exchange family (recursive doubling, Swing): :func:`exchange_allreduce` over
    ``peers`` and its one closed form (:func:`exchange_allreduce_cost`); the name is given once, here."""
    build = partial(exchange_allreduce, algorithm=algorithm, peers=peers)
    return register(algorithm, Op.ALLREDUCE, cost=exchange_allreduce_cost, formula=formula, source=source, check=check)(
        build
    )


def doubling_peers(p: int, step: int) -> np.ndarray:
    return np.arange(p) ^ (1 << step)


recursive_doubling_allreduce = register_exchange_allreduce(
    "recursive_doubling",
    doubling_peers,
    formula="log2(n)·α + log2(n)·M·β (+2 fold steps of M when n is not a power of two)",
    source="Thakur, Rabenseifner & Gropp 2005 §4.4; MPICH allreduce",
)


def _cost_allgather(req: Request) -> Cost:
    n, m = req.num_ranks, req.message_bytes
    return Cost(n.bit_length() - 1, share(m, n - 1, n), share(m, n - 1, n))


@register(
    "recursive_doubling",
    Op.ALLGATHER,
    cost=_cost_allgather,
    check=need_pow2,
    formula="log2(n)·α + (n-1)/n·M·β",
    source="Thakur, Rabenseifner & Gropp 2005 §4.1",
)
def recursive_doubling_allgather(req: Request) -> Schedule:
    n = req.num_ranks
    layout = layouts.blocked(Op.ALLGATHER, req.count, n)
    steps = partial(recursive_doubling, np.arange(n), n)
    return schedule_of(req, "recursive_doubling", layout, steps)
