"""Single-step algorithms: point-to-point send/recv, and linear gather and scatter at the root.

Send/Recv: rank 0 sends M to rank 1 (nccl-tests' sendrecv pairs each rank with a neighbour; one pair is
the unit). Gather: every rank sends its block to the root at once; Scatter: the root sends each rank its
block at once (MPI's linear algorithms; NCCL builds both from grouped send/recv).
"""

from __future__ import annotations

import numpy as np

from .. import layouts
from ..primitives import Op, block_sizes
from ..schedule import Schedule, Step, Transfers
from ._base import Cost, Request, register


def _cost_sendrecv(req: Request) -> Cost:
    return Cost(1, req.message_bytes, req.message_bytes)


@register("direct", Op.SENDRECV, cost=_cost_sendrecv, formula="α + M·β", source="NCCL ncclSend/ncclRecv")
def direct_sendrecv(req: Request) -> Schedule:
    layout = layouts.sendrecv(req.count)
    return Schedule(req.op, "direct", 2, req.count, req.itemsize, layout,
                    lambda: iter([Step.of(Transfers.of(0, 1, 0, 0, False))]))


def _others_bytes(req: Request) -> tuple[int, int]:
    sizes = block_sizes(req.count, req.num_ranks) * req.itemsize
    root_share = int(sizes[req.root])
    largest = int(np.delete(sizes, req.root).max(initial=0))
    return req.message_bytes - root_share, largest


def _cost_gather(req: Request) -> Cost:
    at_root, largest = _others_bytes(req)
    return Cost(int(req.num_ranks > 1), largest, at_root)


def _cost_scatter(req: Request) -> Cost:
    at_root, largest = _others_bytes(req)
    return Cost(int(req.num_ranks > 1), at_root, largest)


def _others(req: Request) -> np.ndarray:
    return np.delete(np.arange(req.num_ranks), req.root)


@register("direct", Op.GATHER, cost=_cost_gather, formula="α + (n-1)/n·M·β at the root",
          source="MPI linear gather; NCCL grouped send/recv")
def direct_gather(req: Request) -> Schedule:
    layout = layouts.blocked(Op.GATHER, req.count, req.num_ranks, req.root)
    others = _others(req)
    return Schedule(req.op, "direct", req.num_ranks, req.count, req.itemsize, layout,
                    lambda: iter([Step.of(Transfers.of(others, req.root, others, others, False))]), root=req.root)


@register("direct", Op.SCATTER, cost=_cost_scatter, formula="α + (n-1)/n·M·β at the root",
          source="MPI linear scatter; NCCL grouped send/recv")
def direct_scatter(req: Request) -> Schedule:
    layout = layouts.blocked(Op.SCATTER, req.count, req.num_ranks, req.root)
    others = _others(req)
    return Schedule(req.op, "direct", req.num_ranks, req.count, req.itemsize, layout,
                    lambda: iter([Step.of(Transfers.of(req.root, others, others, others, False))]), root=req.root)
