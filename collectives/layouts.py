"""Slot layouts of each primitive: where the send buffer goes in and where the result is read out."""

from __future__ import annotations

import numpy as np

from .primitives import Op, block_sizes
from .schedule import Layout


def chunked(op: Op, count: int, num_chunks: int, root: int = 0) -> Layout:
    """allreduce / broadcast / reduce: the whole buffer lives on every rank, cut into ``num_chunks``."""
    sizes = block_sizes(count, num_chunks)
    every = np.arange(num_chunks)
    only_root_in = op is Op.BROADCAST
    only_root_out = op is Op.REDUCE
    return Layout(
        sizes,
        input_slots=lambda r: None if only_root_in and r != root else every,
        output_slots=lambda r: None if only_root_out and r != root else every,
    )


def blocked(op: Op, count: int, n: int, root: int = 0) -> Layout:
    """reducescatter / allgather / gather / scatter: slot r is the block that belongs to rank r."""
    sizes = block_sizes(count, n)
    every = np.arange(n)

    def own(r: int) -> np.ndarray:
        return np.array([r])

    if op is Op.REDUCESCATTER:
        return Layout(sizes, lambda r: every, own)
    if op is Op.ALLGATHER:
        return Layout(sizes, own, lambda r: every)
    if op is Op.GATHER:
        return Layout(sizes, own, lambda r: every if r == root else None)
    if op is Op.SCATTER:
        return Layout(sizes, lambda r: every if r == root else None, own)
    raise ValueError(f"blocked layout is not for {op}")


def alltoall(count: int, n: int, extra_slots: int = 0) -> Layout:
    """Slots 0..n-1: the send blocks by destination; n..2n-1: the received blocks by source; then
    ``extra_slots`` of work space (Bruck's rotated buffer, a hierarchical staging area)."""
    block = count // n
    sizes = np.full(2 * n + extra_slots, block, dtype=np.int64)
    send = np.arange(n)
    return Layout(sizes, lambda r: send, lambda r: send + n)


def sendrecv(count: int) -> Layout:
    one = np.array([0])
    return Layout(np.array([count], dtype=np.int64), lambda r: one if r == 0 else None, lambda r: one)
