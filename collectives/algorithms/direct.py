"""Single-step algorithms: point-to-point send/recv, and linear gather and scatter at the root.

Send/Recv: rank 0 sends M to rank 1 (nccl-tests' sendrecv pairs each rank with a neighbour; one pair is
the unit). Gather: every rank sends its block to the root at once; Scatter: the root sends each rank its
block at once (MPI's linear algorithms; NCCL builds both from grouped send/recv).
"""

from __future__ import annotations

from functools import partial

import numpy as np

from .. import layouts
from ..primitives import Op, block_sizes
from ..schedule import Schedule, Step, StepClass, Transfers
from ._base import Cost, Request, register, schedule_of


def _cost_sendrecv(req: Request) -> Cost:
    return Cost(1, req.message_bytes, req.message_bytes)


@register("direct", Op.SENDRECV, cost=_cost_sendrecv, formula="α + M·β", source="NCCL ncclSend/ncclRecv")
def direct_sendrecv(req: Request) -> Schedule:
    layout = layouts.sendrecv(req.count)
    return schedule_of(req, "direct", layout, lambda: iter([Step.of(Transfers.of(0, 1, 0, 0, False))]))


def _others_bytes(req: Request) -> tuple[int, int]:
    sizes = block_sizes(req.count, req.num_ranks) * req.itemsize
    root_share = int(sizes[req.root])
    largest = int(np.delete(sizes, req.root).max(initial=0))
    return req.message_bytes - root_share, largest


def _cost_linear(to_root: bool):
    """One step; the root receives (gather) or sends (scatter) every other block, the others their own."""

    def cost(req: Request) -> Cost:
        at_root, largest = _others_bytes(req)
        sent, received = (largest, at_root) if to_root else (at_root, largest)
        return Cost(int(req.num_ranks > 1), sent, received)

    return cost


def _others(req: Request) -> np.ndarray:
    return np.delete(np.arange(req.num_ranks), req.root)


def _linear(req: Request, to_root: bool) -> Schedule:
    """Every other rank's block moves to the root (gather) or from it (scatter) in one step."""
    layout = layouts.blocked(req.op, req.count, req.num_ranks, req.root)
    others = _others(req)
    src, dst = (others, req.root) if to_root else (req.root, others)
    step = Step.of(Transfers.of(src, dst, others, others, False))
    return schedule_of(req, "direct", layout, lambda: iter([step]), root=req.root)


for _op, _to_root, _what in ((Op.GATHER, True, "gather"), (Op.SCATTER, False, "scatter")):
    register(
        "direct",
        _op,
        cost=_cost_linear(_to_root),
        formula="α + (n-1)/n·M·β at the root",
        source=f"MPI linear {_what}; NCCL grouped send/recv",
    )(partial(_linear, to_root=_to_root))


# Direct ("mesh") reduce-scatter / all-gather / allreduce: every rank talks to every other rank in one
# step, using all n-1 links of a full mesh at once (Huawei HCCL's mesh algorithm; TensorRT-LLM's
# one-shot/two-shot allreduce on NVSwitch). Same bytes as the ring, 1 or 2 steps.


def _cost_mesh(passes: int):
    def cost(req: Request) -> Cost:
        n, m = req.num_ranks, req.message_bytes
        moved = passes * (m * (n - 1) // n)
        return Cost(passes * int(n > 1), moved, moved)

    return cost


def _scatter_reduce(n: int) -> Transfers:
    src, dst = np.nonzero(~np.eye(n, dtype=bool))
    return Transfers.of(src, dst, dst, dst, True)


def _all_gather(n: int) -> Transfers:
    src, dst = np.nonzero(~np.eye(n, dtype=bool))
    return Transfers.of(src, dst, src, src, False)


def _mesh(req: Request, layout, parts) -> Schedule:
    n = req.num_ranks

    def steps():
        if n > 1:
            for make in parts:
                yield Step.of(make(n))

    def classes(slot_bytes: np.ndarray) -> list[StepClass]:
        """Every step is all pairs (i -> j carries slot j to reduce, or slot i to gather): one all-pairs
        class in O(n), as compress() would merge them, without listing n(n-1) transfers."""
        if n < 2:
            return []
        out, into = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
        for make in parts:
            if make is _scatter_reduce:
                into = into + slot_bytes[:n]
            else:
                out = out + slot_bytes[:n]
        return [StepClass.every_pair(len(parts), out, into)]

    return schedule_of(req, "direct", layout, steps, classes)


_MESH_SOURCE = "HCCL mesh algorithm on full-mesh NPU boards; TensorRT-LLM two-shot allreduce"


@register(
    "direct",
    Op.REDUCESCATTER,
    cost=_cost_mesh(1),
    formula="α + (n-1)/n·M·β over n-1 links at once",
    source=_MESH_SOURCE,
)
def direct_reducescatter(req: Request) -> Schedule:
    return _mesh(req, layouts.blocked(Op.REDUCESCATTER, req.count, req.num_ranks), [_scatter_reduce])


@register(
    "direct", Op.ALLGATHER, cost=_cost_mesh(1), formula="α + (n-1)/n·M·β over n-1 links at once", source=_MESH_SOURCE
)
def direct_allgather(req: Request) -> Schedule:
    return _mesh(req, layouts.blocked(Op.ALLGATHER, req.count, req.num_ranks), [_all_gather])


@register(
    "direct", Op.ALLREDUCE, cost=_cost_mesh(2), formula="2·α + 2(n-1)/n·M·β over n-1 links at once", source=_MESH_SOURCE
)
def direct_allreduce(req: Request) -> Schedule:
    layout = layouts.chunked(Op.ALLREDUCE, req.count, req.num_ranks)
    return _mesh(req, layout, [_scatter_reduce, _all_gather])
