"""Recursive halving-doubling, Rabenseifner's algorithm (Thakur, Rabenseifner & Gropp 2005 §4.4, §4.3).

ReduceScatter by recursive halving: at the step with distance d = p/2, p/4, ..., 1 rank r sends to r xor d
the half of its current block range that r xor d keeps, and reduces the half it keeps: log2(p) steps,
(p-1)/p M each way. AllReduce = that ReduceScatter + AllGather by recursive doubling (distances 1 .. p/2):
2 log2(p) steps, 2(p-1)/p M each way, the same bandwidth term as the ring with far fewer latency terms.

Non-power-of-two n (MPICH's treatment): p = largest power of two <= n; the n-p extra ranks p+j first hand
their whole buffer to rank j (reduce), and rank j stands for both. For allreduce the p ranks share the
buffer in p chunks and rank j returns the result to p+j at the end. For reduce-scatter the n blocks stay
the unit: block b belongs to virtual rank ``b if b < p else b - p``, halving splits by virtual rank, and
rank j finally sends block p+j to rank p+j. Extra steps: 2; extra bytes: M in, M (or a block) out.
"""

from __future__ import annotations

from functools import partial

import numpy as np

from .. import layouts
from ..primitives import Op, block_sizes
from ..schedule import Schedule, Step, Transfers
from ._base import Cost, Request, floor_pow2, register, schedule_of
from .recursive_doubling import block_exchange, fold_in, fold_out, recursive_doubling


def _masks_down(p: int) -> list[int]:
    return [1 << j for j in reversed(range(p.bit_length() - 1))]


def _held_bytes(sizes: np.ndarray, owner: np.ndarray, j: int, ranks: np.ndarray) -> np.ndarray:
    """Bytes of the blocks whose owner agrees with each of ``ranks`` from bit j up."""
    return np.where((owner[None, :] >> j) == (ranks[:, None] >> j), sizes[None, :], 0).sum(axis=1)


def _halving(owner: np.ndarray, p: int):
    """The recursive-halving reduce-scatter among ranks 0..p-1: distances p/2, ..., 1."""
    for mask in _masks_down(p):
        yield block_exchange(owner, p, mask, halving=True, reduce=True)


def _fold_steps(n: int, p: int) -> int:
    """The extra ranks' hand-in and hand-back (MPICH's non-power-of-two treatment)."""
    return 2 if n > p else 0


def _kept_bytes(sizes: np.ndarray, owner: np.ndarray, p: int) -> np.ndarray:
    """What each rank keeps after every halving step (= holds before every doubling step), summed."""
    ranks = np.arange(p)
    return sum((_held_bytes(sizes, owner, j, ranks) for j in range(p.bit_length() - 1)), np.zeros(p, np.int64))


def _owner(n: int, doubling: bool) -> np.ndarray:
    """The blocks' virtual owners among ranks 0..p-1. Allreduce (``doubling``) cuts the buffer in p chunks, chunk
    v rank v's; reduce-scatter keeps the n blocks, block b rank b's and an extra rank's block p + j rank j's."""
    p = floor_pow2(n)
    b = np.arange(p if doubling else n)
    return np.where(b < p, b, b - p)


def _rabenseifner(req: Request, layout, doubling: bool) -> Schedule:
    """The steps both ops share (Thakur, Rabenseifner & Gropp 2005 §4.3-4.4, MPICH's non-power-of-two treatment):
    the extra ranks p..n-1 hand every slot in, recursive halving over the blocks' virtual owners among ranks
    0..p-1, recursive doubling back when ``doubling`` (allreduce), and each extra rank gets back what it stands
    for: the whole result (allreduce), or its own block p + j (reduce-scatter)."""
    n = req.num_ranks
    p = floor_pow2(n)
    owner = _owner(n, doubling)
    slots = np.arange(len(owner))

    def steps():
        if n > p:
            yield fold_in(n, slots)
        yield from _halving(owner, p)
        if doubling:
            yield from recursive_doubling(owner, p)
        if n > p and doubling:  # rank j hands the whole result back to rank p + j
            yield fold_out(n, owner)
        elif n > p:  # rank j sends block p + j to rank p + j
            extra = np.arange(p, n)
            yield Step.of(Transfers.of(extra - p, extra, extra, extra, False))

    return schedule_of(req, "halving_doubling", layout, steps)


def _cost(req: Request, doubling: bool) -> Cost:
    """The busiest rank's bytes under :func:`_rabenseifner`. Halving: a rank sends all but the blocks it ends up
    owning and receives what it keeps at each step; doubling (allreduce) sends what it kept and receives what its
    partner r xor 2^j holds. A rank an extra rank folded into receives M more and sends back M (allreduce) or the
    extra rank's block (reduce-scatter); the extra rank sends M and receives that."""
    n, m = req.num_ranks, req.message_bytes
    p = floor_pow2(n)
    owner = _owner(n, doubling)
    sizes = block_sizes(req.count, len(owner)) * req.itemsize
    ranks = np.arange(p)
    owned = np.where(owner[None, :] == ranks[:, None], sizes[None, :], 0).sum(axis=1)
    kept = _kept_bytes(sizes, owner, p)
    has_extra = ranks < n - p  # the ranks an extra rank folded into
    returned = m if doubling else np.where(has_extra, sizes[np.minimum(ranks + p, n - 1)], 0)
    sent = (m - owned) + has_extra * returned
    received = kept + has_extra * m
    if doubling:
        # in the doubling phase rank r sends what it kept and receives what its partner r ^ 2^j holds
        sent = sent + kept
        received = received + sum(
            (_held_bytes(sizes, owner, j, ranks ^ (1 << j)) for j in range(p.bit_length() - 1)), np.zeros(p, np.int64)
        )
    extra_sent = m if n > p else 0
    extra_received = extra_sent if doubling else int(sizes[p:].max(initial=0))
    steps = (2 if doubling else 1) * (p.bit_length() - 1) + _fold_steps(n, p)
    return Cost(steps, int(max(sent.max(), extra_sent)), int(max(received.max(), extra_received)))


_cost_allreduce = partial(_cost, doubling=True)
_cost_reducescatter = partial(_cost, doubling=False)


@register(
    "halving_doubling",
    Op.ALLREDUCE,
    cost=_cost_allreduce,
    formula="2·log2(p)·α + 2(p-1)/p·M·β (p = n a power of two; else +2 steps and +M)",
    source="Rabenseifner 2004; Thakur, Rabenseifner & Gropp 2005 §4.4",
)
def halving_doubling_allreduce(req: Request) -> Schedule:
    n = req.num_ranks
    p = floor_pow2(n)
    return _rabenseifner(req, layouts.chunked(req.op, req.count, p), doubling=True)


@register(
    "halving_doubling",
    Op.REDUCESCATTER,
    cost=_cost_reducescatter,
    formula="log2(p)·α + (p-1)/p·M·β (p = n a power of two; else +2 steps and +M)",
    source="Thakur, Rabenseifner & Gropp 2005 §4.3 (recursive halving); MPICH reduce_scatter",
)
def halving_doubling_reducescatter(req: Request) -> Schedule:
    n = req.num_ranks
    return _rabenseifner(req, layouts.blocked(req.op, req.count, n), doubling=False)
