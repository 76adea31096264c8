"""Binomial trees (Thakur, Rabenseifner & Gropp 2005 §4.2 broadcast, §4.5 reduce).

Positions are taken relative to the root, v = (r - root) mod n. Broadcast: at step k every v < 2^k that
has the data sends all of it to v + 2^k: ceil(log2 n) steps, the root sends M per step. Reduce runs the same
tree backwards (children with the larger distance first), the root receives M per step. AllReduce =
reduce to position 0 + broadcast from it: 2 ceil(log2 n) steps.
"""

from __future__ import annotations

from functools import partial

import numpy as np

from .. import layouts
from ..primitives import Op
from ..schedule import Schedule, Step, Transfers
from ._base import Cost, Request, ceil_log2, register, schedule_of


def broadcast_steps(n: int, root: int):
    for k in range(ceil_log2(n)):
        v = np.arange(min(1 << k, n - (1 << k)))
        yield Step.of(Transfers.of((v + root) % n, (v + (1 << k) + root) % n, 0, 0, False))


def reduce_steps(n: int, root: int):
    for k in reversed(range(ceil_log2(n))):
        v = np.arange(1 << k, min(1 << (k + 1), n))
        yield Step.of(Transfers.of((v + root) % n, (v - (1 << k) + root) % n, 0, 0, True))


def _rooted(req: Request, steps_fn) -> Schedule:
    layout = layouts.chunked(req.op, req.count, 1, req.root)
    n = req.num_ranks
    return schedule_of(req, "binomial_tree", layout, lambda: steps_fn(n, req.root), root=req.root)


def _cost_broadcast(req: Request) -> Cost:
    depth = ceil_log2(req.num_ranks)
    return Cost(depth, depth * req.message_bytes, req.message_bytes if depth else 0)


def _cost_reduce(req: Request) -> Cost:
    depth = ceil_log2(req.num_ranks)
    return Cost(depth, req.message_bytes if depth else 0, depth * req.message_bytes)


def _cost_allreduce(req: Request) -> Cost:
    depth = ceil_log2(req.num_ranks)
    return Cost(2 * depth, depth * req.message_bytes, depth * req.message_bytes)


# the rooted trees: op -> its steps, the closed form
_ROOTED = (
    (Op.BROADCAST, broadcast_steps, _cost_broadcast, "⌈log2 n⌉·(α + M·β)", "Thakur, Rabenseifner & Gropp 2005 §4.2"),
    (Op.REDUCE, reduce_steps, _cost_reduce, "⌈log2 n⌉·(α + M·β + M·γ)", "Thakur, Rabenseifner & Gropp 2005 §4.5"),
)
for _op, _steps, _cost, _formula, _source in _ROOTED:
    register("binomial_tree", _op, cost=_cost, formula=_formula, source=_source)(partial(_rooted, steps_fn=_steps))


@register(
    "binomial_tree",
    Op.ALLREDUCE,
    cost=_cost_allreduce,
    formula="2⌈log2 n⌉·(α + M·β)",
    source="reduce + broadcast on a binomial tree; Thakur, Rabenseifner & Gropp 2005",
)
def binomial_allreduce(req: Request) -> Schedule:
    n = req.num_ranks

    def steps():
        yield from reduce_steps(n, 0)
        yield from broadcast_steps(n, 0)

    layout = layouts.chunked(Op.ALLREDUCE, req.count, 1)
    return schedule_of(req, "binomial_tree", layout, steps)
