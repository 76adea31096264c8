"""Collective primitives: names, numpy reference semantics, and the nccl-tests conventions.

Message size (``count`` elements) follows nccl-tests ``doc/PERFORMANCE.md``: the size of the buffer the
user hands to the collective, measured as

- allreduce, broadcast, reduce, sendrecv: the buffer;
- allgather, gather: the *gathered output* (n x per-rank input);
- reducescatter, scatter: the *full input* (n x per-rank output);
- alltoall: the whole per-rank send buffer (n blocks, one per peer).

Bus bandwidth = algorithm bandwidth x :func:`busbw_factor` (nccl-tests): a number comparable across ops and
group sizes with the link speed.

Uneven splits: where the message is cut into n per-rank blocks (allgather, reducescatter, gather, scatter)
and ``count`` is not a multiple of n, block r holds ``np.array_split`` piece r (the first ``count % n``
blocks one element longer), i.e. the ``*v`` variants of MPI. alltoall needs equal blocks (Bruck's rotation
and NCCL's all2all both assume them) and says so.
"""

from __future__ import annotations

from enum import StrEnum

import numpy as np

from ._errors import CollectiveError


class Op(StrEnum):
    ALLREDUCE = "allreduce"
    REDUCESCATTER = "reducescatter"
    ALLGATHER = "allgather"
    ALLTOALL = "alltoall"
    BROADCAST = "broadcast"
    REDUCE = "reduce"
    GATHER = "gather"
    SCATTER = "scatter"
    SENDRECV = "sendrecv"


class Reduction(StrEnum):
    SUM = "sum"
    MAX = "max"
    MIN = "min"
    AVG = "avg"


SUPPORTED_DTYPES = ("float16", "float32", "float64", "int8", "uint8", "int32", "int64")

# The numpy ufunc that combines two partial results; AVG sums and divides once at the end (ncclAvg).
REDUCE_UFUNC = {
    Reduction.SUM: np.add,
    Reduction.AVG: np.add,
    Reduction.MAX: np.maximum,
    Reduction.MIN: np.minimum,
}


def parse_op(op: str | Op) -> Op:
    try:
        return Op(op)
    except ValueError:
        raise CollectiveError("op", f"unknown op {op!r}; known: {', '.join(o.value for o in Op)}") from None


def parse_reduction(reduction: str | Reduction) -> Reduction:
    try:
        return Reduction(reduction)
    except ValueError:
        known = ", ".join(r.value for r in Reduction)
        raise CollectiveError("reduction", f"unknown reduction {reduction!r}; known: {known}") from None


def parse_dtype(dtype: str | np.dtype) -> np.dtype:
    name = np.dtype(dtype).name if isinstance(dtype, np.dtype) else str(dtype)
    if name not in SUPPORTED_DTYPES:
        raise CollectiveError("dtype", f"unsupported dtype {name!r}; supported: {', '.join(SUPPORTED_DTYPES)}")
    return np.dtype(name)


def check_reduction_dtype(reduction: Reduction, dtype: np.dtype) -> None:
    if reduction is Reduction.AVG and dtype.kind != "f":
        raise CollectiveError("reduction", f"'avg' needs a floating dtype, got {dtype.name}")


def busbw_factor(op: Op, n: int) -> float:
    """nccl-tests bus-bandwidth factor: busbw = algbw x factor (doc/PERFORMANCE.md)."""
    if op is Op.ALLREDUCE:
        return 2 * (n - 1) / n
    if op in (Op.ALLGATHER, Op.REDUCESCATTER, Op.ALLTOALL, Op.GATHER, Op.SCATTER):
        return (n - 1) / n
    return 1.0


def block_sizes(count: int, n: int) -> np.ndarray:
    """Element counts of the n blocks of a ``count``-element message (np.array_split rule)."""
    q, rem = divmod(count, n)
    sizes = np.full(n, q, dtype=np.int64)
    sizes[:rem] += 1
    return sizes


def check_count(op: Op, count: int, n: int) -> None:
    if n < 1:
        raise CollectiveError("num_ranks", f"num_ranks must be >= 1, got {n}")
    if count < 0:
        raise CollectiveError("count", f"count must be >= 0, got {count}")
    if op is Op.ALLTOALL and count % n:
        raise CollectiveError("count", f"alltoall needs equal blocks: count {count} is not a multiple of num_ranks {n}")
    if op is Op.SENDRECV and n != 2:
        raise CollectiveError("num_ranks", f"sendrecv is between 2 ranks, got {n}")


def reference(op: Op, inputs: list[np.ndarray], reduction: Reduction = Reduction.SUM, root: int = 0):
    """What the primitive must produce, computed directly with numpy.

    ``inputs[r]`` is rank r's send buffer in the per-rank shape the primitive takes (allgather/gather: its
    block; everything else: ``count`` elements). Returns one array per rank, ``None`` where the primitive
    leaves that rank's output undefined (non-roots of reduce and gather).
    """
    n = len(inputs)
    if op in (Op.ALLREDUCE, Op.REDUCE, Op.REDUCESCATTER):
        total = _reduce_all(inputs, reduction)
        if op is Op.ALLREDUCE:
            return [total.copy() for _ in range(n)]
        if op is Op.REDUCE:
            return [total if r == root else None for r in range(n)]
        return np.array_split(total, n)
    if op is Op.ALLGATHER:
        gathered = np.concatenate(inputs)
        return [gathered.copy() for _ in range(n)]
    if op is Op.GATHER:
        return [np.concatenate(inputs) if r == root else None for r in range(n)]
    if op is Op.BROADCAST:
        return [inputs[root].copy() for _ in range(n)]
    if op is Op.SCATTER:
        return [block.copy() for block in np.array_split(inputs[root], n)]
    if op is Op.ALLTOALL:
        blocks = [np.array_split(x, n) for x in inputs]
        return [np.concatenate([blocks[src][dst] for src in range(n)]) for dst in range(n)]
    if op is Op.SENDRECV:
        # rank 0 sends its buffer to rank 1 (nccl-tests sendrecv pairs every rank with its neighbour).
        return [inputs[0].copy(), inputs[0].copy()]
    raise CollectiveError("op", f"no reference semantics for {op}")


def _reduce_all(inputs: list[np.ndarray], reduction: Reduction) -> np.ndarray:
    stacked = np.stack(inputs)
    if reduction is Reduction.SUM:
        return stacked.sum(axis=0, dtype=stacked.dtype)
    if reduction is Reduction.AVG:
        return (stacked.sum(axis=0, dtype=stacked.dtype) / len(inputs)).astype(stacked.dtype)
    if reduction is Reduction.MAX:
        return stacked.max(axis=0)
    return stacked.min(axis=0)
