"""In-network reduction: the switch adds (NVLink SHARP / NVLS on NVSwitch; SHARP on InfiniBand switches).

The switch is an extra buffer holder (position n). AllReduce: every rank sends its M to the switch, which
reduces and multicasts M back: 2 steps, M each way per rank, whatever n (NCCL NVLS; Graham et al. 2016,
SHARP). ReduceScatter: M up, the switch sends rank r only block r. AllGather: block r up, M down.
Pricing places the holder at the lowest switch that every rank of the group reaches and that can
reduce; where none can, the algorithm is not available for that placement.
"""

from __future__ import annotations

import numpy as np

from .. import layouts
from ..primitives import Op, block_sizes
from ..schedule import Schedule, Step, Transfers, compress, merge
from ._base import Cost, Request, register, schedule_of

_SOURCE = "NCCL NVLS (2.17+); Graham et al. 2016 (SHARP)"


def _to_switch(n: int, slots, reduce: bool) -> Step:
    """Rank 0 seeds the switch buffer, the others reduce into it (one step: all arrive together)."""
    ranks, slot = np.meshgrid(np.arange(n), slots, indexing="ij")
    first, rest = ranks[:1], ranks[1:]
    return Step.of(
        Transfers.of(first, n, slot[:1], slot[:1], False),
        Transfers.of(rest, n, slot[1:], slot[1:], reduce),
    )


def _schedule(req: Request, layout, body) -> Schedule:
    """The steps ``body(n)`` yields (none on one rank). Up and down use opposite link directions and the switch
    streams them (NVLS pipelines its chunks), so for pricing both steps form one class: two latency terms, one
    bandwidth term."""
    n = req.num_ranks

    def steps():
        if n > 1:
            yield from body(n)

    def classes(slot_bytes):
        return merge(compress(steps(), slot_bytes), "pipelined up and down")

    return schedule_of(req, "in_network", layout, steps, classes, num_virtual=1)


def _cost_allreduce(req: Request) -> Cost:
    m = req.message_bytes
    return Cost(2, m, m) if req.num_ranks > 1 else Cost(0, 0, 0)


@register(
    "in_network",
    Op.ALLREDUCE,
    cost=_cost_allreduce,
    formula="2·α + M·β (switch reduces and multicasts)",
    source=_SOURCE,
)
def in_network_allreduce(req: Request) -> Schedule:
    return _schedule(req, layouts.chunked(Op.ALLREDUCE, req.count, 1), _allreduce_steps)


def _allreduce_steps(n: int):
    yield _to_switch(n, [0], True)
    yield Step.of(Transfers.of(n, np.arange(n), 0, 0, False))


def _cost_one_way(whole_up: bool):
    """Two steps; one way carries the whole message, the other the largest block (reduce-scatter: M up, the
    block down; all-gather: the block up, M down)."""

    def cost(req: Request) -> Cost:
        if req.num_ranks == 1:
            return Cost(0, 0, 0)
        largest = int(block_sizes(req.count, req.num_ranks).max()) * req.itemsize
        return Cost(2, req.message_bytes, largest) if whole_up else Cost(2, largest, req.message_bytes)

    return cost


@register("in_network", Op.REDUCESCATTER, cost=_cost_one_way(True), formula="2·α + M·β up, M/n·β down", source=_SOURCE)
def in_network_reducescatter(req: Request) -> Schedule:
    return _schedule(req, layouts.blocked(Op.REDUCESCATTER, req.count, req.num_ranks), _reducescatter_steps)


def _reducescatter_steps(n: int):
    yield _to_switch(n, np.arange(n), True)
    r = np.arange(n)
    yield Step.of(Transfers.of(n, r, r, r, False))


@register(
    "in_network",
    Op.ALLGATHER,
    cost=_cost_one_way(False),
    formula="2·α + M/n·β up, M·β down (multicast)",
    source=_SOURCE,
)
def in_network_allgather(req: Request) -> Schedule:
    return _schedule(req, layouts.blocked(Op.ALLGATHER, req.count, req.num_ranks), _allgather_steps)


def _allgather_steps(n: int):
    r = np.arange(n)
    yield Step.of(Transfers.of(r, n, r, r, False))
    dst, slot = np.meshgrid(r, r, indexing="ij")
    yield Step.of(Transfers.of(n, dst, slot, slot, False))
