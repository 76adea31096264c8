"""Two-level hierarchical collectives: rings inside each node, rings across nodes on each rail.

The group's positions are ``node * g + local`` with g = ``local_size`` ranks per node and N = n / g nodes.
Slot ``b * g + i`` is the block (allreduce: the chunk) owned by local rank i of node b.

- AllReduce (Jia et al. 2018, "2D ring"; NCCL's CollNet / Horovod hierarchical): intra-node ring
  reduce-scatter, so local rank i holds the node's sum of the chunks {b*g+i}; inter-node ring allreduce
  over the N ranks with local index i (one rail each) on those M/g bytes; intra-node ring all-gather.
  2(g-1) + 2(N-1) steps; intra 2(g-1)/g M and inter 2(N-1)/(N g) M per rank: the inter-node bytes per
  rank drop by g while all g rails work in parallel.
- ReduceScatter: intra-node then inter-node reduce-scatter; AllGather: inter-node then intra-node
  all-gather. (g-1) + (N-1) steps.
- AllToAll: local rank i first hands local rank j every block bound for local index j of any node
  (an intra-node all-to-all of (g-1)/g M), then rank (a, j) sends node b's share straight to (b, j) over
  its own rail ((N-1)/N M): NCCL's PXN pattern. 2 steps.
"""

from __future__ import annotations

import numpy as np

from .. import layouts
from ..primitives import Op
from ..schedule import Schedule, Step, StepClass, Transfers
from ._base import Cost, Request, register, schedule_of, share
from .ring import ring_pass_class, ring_pass_steps


def _check(req: Request) -> str | None:
    g = req.local_size
    if g < 1 or req.num_ranks % g:
        return f"local_size {g} must divide the group's {req.num_ranks} ranks"
    return None


def _grid(req: Request):
    """Intra-node rings (N x g) and inter-node rings (g x N) with the chunk slots each member passes."""
    g = req.local_size
    nodes = req.num_ranks // g
    pos = np.arange(req.num_ranks).reshape(nodes, g)
    # intra: ring = node b, member i passes the chunk made of slots {b' * g + i for every node b'}
    intra_chunks = np.broadcast_to(pos.T[None, :, :], (nodes, g, nodes))
    # inter: ring = local index i, member b passes slot b * g + i
    inter_members = pos.T
    inter_chunks = inter_members[:, :, None]
    return pos, intra_chunks, inter_members, inter_chunks


def _phases(req: Request, plan: list[tuple[str, bool]]):
    pos, intra_chunks, inter_members, inter_chunks = _grid(req)
    rings = {"intra": (pos, intra_chunks), "inter": (inter_members, inter_chunks)}

    def steps():
        for level, reduce in plan:
            members, chunks = rings[level]
            yield from ring_pass_steps(members, chunks, reduce)

    nodes, g = pos.shape

    def classes(slot_bytes: np.ndarray):
        # slot b * g + i: an intra ring's member i passes the sum over nodes of its column, an inter ring's
        # member b its own slot; summed in O(n), not through the N x g x N chunk index (16 GiB at 131,072)
        grid = slot_bytes[: nodes * g].reshape(nodes, g)
        chunk_bytes_of = {"intra": np.broadcast_to(grid.sum(axis=0), (nodes, g)), "inter": grid.T}
        out = []
        for level, reduce in plan:
            members = rings[level][0]
            chunk_bytes = chunk_bytes_of[level]
            label = f"{level} {'reduce-scatter' if reduce else 'all-gather'}"
            out.append(ring_pass_class(members, chunk_bytes, reduce, label))
        return out

    return steps, classes


def _hierarchical(req: Request, layout, plan) -> Schedule:
    steps, classes = _phases(req, plan)
    return schedule_of(req, "hierarchical", layout, steps, classes)


def _levels(req: Request) -> tuple[int, int]:
    return req.local_size, req.num_ranks // req.local_size


def _cost_allreduce(req: Request) -> Cost:
    g, nodes = _levels(req)
    m = req.message_bytes
    moved = share(m, 2 * (g - 1), g) + share(m, 2 * (nodes - 1), nodes * g)
    return Cost(2 * (g - 1) + 2 * (nodes - 1), moved, moved)


def _cost_one_pass(req: Request) -> Cost:
    g, nodes = _levels(req)
    m = req.message_bytes
    moved = share(m, g - 1, g) + share(m, nodes - 1, nodes * g)
    return Cost((g - 1) + (nodes - 1), moved, moved)


def _cost_one_pass_gather(req: Request) -> Cost:
    g, nodes = _levels(req)
    m = req.message_bytes
    moved = share(m, nodes - 1, nodes * g) + share(m, g - 1, g)
    return Cost((g - 1) + (nodes - 1), moved, moved)


_SOURCE = "Jia et al. 2018 (2D/hierarchical ring); NCCL CollNet; Horovod hierarchical allreduce"


# op: the layout, the ring passes (level, reduce?) in order, the closed form
_PASSES = (
    (Op.ALLREDUCE, layouts.chunked, [("intra", True), ("inter", True), ("inter", False), ("intra", False)],
     _cost_allreduce, "2(g-1)·α_intra + 2(g-1)/g·M·β_intra + 2(N-1)·α_inter + 2(N-1)/(N·g)·M·β_inter"),
    (Op.REDUCESCATTER, layouts.blocked, [("intra", True), ("inter", True)],
     _cost_one_pass, "(g-1)·α_intra + (g-1)/g·M·β_intra + (N-1)·α_inter + (N-1)/(N·g)·M·β_inter"),
    (Op.ALLGATHER, layouts.blocked, [("inter", False), ("intra", False)],
     _cost_one_pass_gather, "(N-1)·α_inter + (N-1)/(N·g)·M·β_inter + (g-1)·α_intra + (g-1)/g·M·β_intra"),
)  # fmt: skip


def _passes(op: Op, layout, plan: list[tuple[str, bool]]):
    def build(req: Request) -> Schedule:
        return _hierarchical(req, layout(op, req.count, req.num_ranks), plan)

    return build


for _op, _layout, _plan, _cost, _formula in _PASSES:
    register("hierarchical", _op, cost=_cost, check=_check, source=_SOURCE, formula=_formula)(
        _passes(_op, _layout, _plan)
    )


def _cost_alltoall(req: Request) -> Cost:
    g, nodes = _levels(req)
    m = req.message_bytes
    moved = share(m, g - 1, g) + share(m, nodes - 1, nodes)
    return Cost(int(g > 1) + int(nodes > 1), moved, moved)


@register(
    "hierarchical",
    Op.ALLTOALL,
    cost=_cost_alltoall,
    check=_check,
    formula="α_intra + (g-1)/g·M·β_intra + α_inter + (N-1)/N·M·β_inter",
    source="NCCL PXN (2.12): gather per rail inside the node, then one send per remote node",
)
def hierarchical_alltoall(req: Request) -> Schedule:
    n, g = req.num_ranks, req.local_size
    nodes = n // g
    # staging slot on (a, j) for the block from local rank i of node a bound for node b: 2n + i * N + b
    stage = 2 * n
    layout = layouts.alltoall(req.count, n, extra_slots=n)

    def steps():
        grid = (np.arange(k) for k in (nodes, g, nodes, g))
        a, i, b, j = (x.ravel() for x in np.meshgrid(*grid, indexing="ij"))
        src, dst = a * g + i, b * g + j  # the block from src bound for dst, at every (a, i, b, j)
        via = a * g + j  # the rank on src's node with dst's local index
        staged = stage + i * nodes + b
        yield Step.of(Transfers.of(src, via, dst, staged, False))
        yield Step.of(Transfers.of(via, dst, staged, n + src, False))

    def classes(slot_bytes: np.ndarray) -> list[StepClass]:
        """Two all-pairs classes, in O(n) (schedule.py): inside each node, (a, i) -> (a, j) carries the
        blocks bound for local index j of every node; along each rail, (a, j) -> (b, j) the staged blocks
        of node a's ranks bound for (b, j). The block's bytes depend on the receiver only."""
        rank, none = np.arange(n), np.zeros(n, dtype=np.int64)
        send = slot_bytes[:n].reshape(nodes, g)  # send block of every rank, by destination (node, local)
        staged = slot_bytes[stage : stage + n].reshape(g, nodes)  # staging slot i * N + b
        out = []
        if g > 1:  # bytes into (a, j): the blocks bound for local index j, on every node
            into = np.broadcast_to(send.sum(axis=0), (nodes, g)).ravel()
            out.append(StepClass.every_pair(1, none, into, rank // g, "intra-node gather per rail"))
        if nodes > 1:  # bytes into (b, j): the staged blocks bound for node b, from every local index
            into = np.broadcast_to(staged.sum(axis=0)[:, None], (nodes, g)).ravel()
            out.append(StepClass.every_pair(1, none, into, rank % g, "one send per remote node"))
        return out

    return schedule_of(req, "hierarchical", layout, steps, classes)
