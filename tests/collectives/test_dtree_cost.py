"""The double binary tree's closed-form cost from its per-n profile (``tree_profile``) equals the cost
walked rank by rank over both trees, at every group size up to 300 and at the large ones a plan asks for."""

from __future__ import annotations

import numpy as np
import pytest

from collectives.algorithms import Request
from collectives.algorithms._base import pipeline_chunks
from collectives.algorithms.double_binary_tree import _cost, dtree_parents, heights_and_depths, tree_profile
from collectives.primitives import Op, block_sizes


def walked(n: int, count: int, itemsize: int) -> tuple[int, int]:
    """(steps, bytes sent by the busiest rank), every rank of both trees walked."""
    k = pipeline_chunks(count * itemsize)
    sizes = block_sizes(count, 2 * k) * itemsize
    halves = (int(sizes[:k].sum()), int(sizes[k:].sum()))
    moved, steps = np.zeros(n, dtype=np.int64), 0
    for parent, half in zip(dtree_parents(n), halves, strict=True):
        moved += (np.bincount(parent[parent >= 0], minlength=n) + (parent >= 0)) * half
        steps = max(steps, k + 2 * int(heights_and_depths(parent)[0].max()) - 1)
    return steps, int(moved.max())


@pytest.mark.parametrize("n", [*range(2, 301), 1000, 1023, 1024, 4096, 16384, 16385])
def test_profile_cost_equals_the_walk(n):
    for count, itemsize in ((1, 4), (2, 4), (1000, 2), (3 * 2**20 + 7, 4)):
        cost = _cost(Request(Op.ALLREDUCE, n, count, itemsize, 0, 1))
        steps, moved = walked(n, count, itemsize)
        assert (cost.steps, cost.bytes_sent, cost.bytes_received) == (steps, moved, moved)


def test_profile_pairs():
    pairs, heights = tree_profile(16384)
    assert all(a + b <= 4 for a, b in pairs)  # a rank inner in one tree is a leaf of the other: 3 + 1 at most
    assert max(heights) == 14  # log2(16384)
