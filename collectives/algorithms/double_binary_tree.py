"""NCCL's double binary tree AllReduce (Sanders, Speck & Träff 2009; NCCL 2.4, ``src/graph/trees.cc``).

Tree A is NCCL's ``ncclGetBtree``: the parent of r > 0 is ``(r ^ b) | (b << 1)`` with b the lowest set bit of
r, or ``r ^ b`` when that is out of range; the root is 0. Tree B is tree A mirrored (r -> n-1-r) when n is
even and shifted by one (r -> r+1) when n is odd, so that the leaves of one tree are the inner nodes of
the other. Each tree reduces and broadcasts one half of the buffer, pipelined in K chunks: a node of height
h sends chunk j to its parent at step j + h, and a node at depth d sends chunk j to its children at step
j + H + d (H: the tree's height). Steps: K + 2H - 1; every rank sends and receives about M in all, and no
link carries more than M/2 per tree, which is why the tree gets close to ring bandwidth at log latency.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from .. import layouts
from ..primitives import Op, block_sizes
from ..schedule import Schedule, Step, StepClass, Transfers
from ._base import Cost, Request, pipeline_chunks, register, schedule_of


def btree_parents(n: int) -> np.ndarray:
    """NCCL ncclGetBtree parent of every rank (-1 for the root 0)."""
    r = np.arange(n)
    low = r & -r
    up = (r ^ low) | (low << 1)
    up = np.where(up >= n, r ^ low, up)
    up[0] = -1
    return up


@lru_cache(maxsize=256)
def dtree_parents(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Parents in NCCL's two trees (ncclGetDtree)."""
    first = btree_parents(n)
    r = np.arange(n)
    if n % 2:
        shifted = first[(r - 1) % n]
        second = np.where(shifted < 0, -1, (shifted + 1) % n)
    else:
        mirrored = first[n - 1 - r]
        second = np.where(mirrored < 0, -1, n - 1 - mirrored)
    return first, second


def heights_and_depths(parent: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return _shape(parent.tobytes())


@lru_cache(maxsize=512)
def _shape(parent_bytes: bytes) -> tuple[np.ndarray, np.ndarray]:
    parent = np.frombuffer(parent_bytes, dtype=np.int64)
    n = len(parent)
    # numpy over the levels (a tree of n ranks has O(log n) of them): pointer-jump every rank up one level
    # at a time for its depth, then settle heights from the deepest level up
    depth = np.zeros(n, dtype=np.int64)
    up = parent.copy()
    live = up >= 0
    while live.any():
        depth[live] += 1
        up[live] = parent[up[live]]
        live = up >= 0
    height = np.zeros(n, dtype=np.int64)
    for d in range(int(depth.max(initial=0)), 0, -1):
        v = np.flatnonzero(depth == d)
        np.maximum.at(height, parent[v], height[v] + 1)
    return height, depth


def _tree_steps(parent: np.ndarray, first_slot: int, num_chunks: int) -> list[list[Transfers]]:
    height, depth = heights_and_depths(parent)
    top = int(height.max(initial=0))
    child = np.nonzero(parent >= 0)[0]
    per_step: list[list[Transfers]] = [[] for _ in range(num_chunks + 2 * top - 1)] if top else []
    for s in range(len(per_step)):
        up_chunk = s - height[child]
        live = (up_chunk >= 0) & (up_chunk < num_chunks)
        c = child[live]
        per_step[s].append(Transfers.of(c, parent[c], up_chunk[live] + first_slot, up_chunk[live] + first_slot, True))
        down_chunk = s - top - depth[parent[child]]
        live = (down_chunk >= 0) & (down_chunk < num_chunks)
        c = child[live]
        slot = down_chunk[live] + first_slot
        per_step[s].append(Transfers.of(parent[c], c, slot, slot, False))
    return per_step


@lru_cache(maxsize=256)
def tree_profile(n: int) -> tuple[tuple[tuple[int, int], ...], tuple[int, int]]:
    """What the cost reads of the two trees of ``n`` ranks: the distinct (edges in tree A, edges in tree B)
    of a rank (its children plus its parent, if any), and each tree's height. A function of n alone
    (``dtree_parents``), kept per n: the cost of a 16,384-rank call no longer walks 16,384 ranks twice."""
    edges, heights = [], []
    for parent in dtree_parents(n):
        edges.append(np.bincount(parent[parent >= 0], minlength=n) + (parent >= 0))
        heights.append(int(heights_and_depths(parent)[0].max()))
    pairs = np.unique(np.stack(edges, axis=1), axis=0)
    return tuple((int(a), int(b)) for a, b in pairs), (heights[0], heights[1])


def _cost(req: Request) -> Cost:
    n = req.num_ranks
    if n == 1:
        return Cost(0, 0, 0)
    k = pipeline_chunks(req.message_bytes)
    sizes = block_sizes(req.count, 2 * k) * req.itemsize
    first, second = int(sizes[:k].sum()), int(sizes[k:].sum())
    pairs, heights = tree_profile(n)
    # a rank moves its tree-A half over each of its tree-A edges and its tree-B half over each tree-B edge;
    # each tree edge carries the half once up and once down, so every rank sends what it receives
    moved = max(a * first + b * second for a, b in pairs)
    return Cost(k + 2 * max(heights) - 1, moved, moved)


@register(
    "double_binary_tree",
    Op.ALLREDUCE,
    cost=_cost,
    formula="(K + 2·⌈log2 n⌉)·(α + M/(2K)·β), K pipeline chunks; ≈ M per rank each way",
    source="Sanders, Speck & Träff 2009; NCCL src/graph/trees.cc",
)
def double_binary_tree_allreduce(req: Request) -> Schedule:
    n = req.num_ranks
    k = pipeline_chunks(req.message_bytes)
    layout = layouts.chunked(Op.ALLREDUCE, req.count, 2 * k)

    def steps():
        if n == 1:
            return
        trees = [_tree_steps(parent, first, k) for parent, first in zip(dtree_parents(n), (0, k), strict=True)]
        for s in range(max(len(t) for t in trees)):
            yield Step.of(*(x for t in trees if s < len(t) for x in t[s]))

    return schedule_of(req, "double_binary_tree", layout, steps, lambda slot_bytes: _pipelined_class(n, k, slot_bytes))


def _pipelined_class(n: int, k: int, slot_bytes: np.ndarray) -> list[StepClass]:
    """The whole pipeline as one class (see schedule.merge): every tree edge carries its tree's half once
    up and once down."""
    if n == 1:
        return []
    srcs, dsts, sizes, steps = [], [], [], 0
    for parent, half in zip(dtree_parents(n), (slot_bytes[:k].sum(), slot_bytes[k:].sum()), strict=True):
        child = np.nonzero(parent >= 0)[0]
        srcs += [child, parent[child]]
        dsts += [parent[child], child]
        sizes.append(np.full(2 * len(child), half, dtype=np.int64))
        steps = max(steps, k + 2 * int(heights_and_depths(parent)[0].max()) - 1)
    return [StepClass(steps, np.concatenate(srcs), np.concatenate(dsts), np.concatenate(sizes), "pipelined trees")]
