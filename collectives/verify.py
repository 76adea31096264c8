"""Build a schedule, run it on random data, and compare with the reference and the closed form."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .algorithms import Request, lookup, validate
from .executor import execute
from .primitives import (
    Op,
    block_sizes,
    check_reduction_dtype,
    parse_dtype,
    parse_op,
    parse_reduction,
    reference,
)


@dataclass
class Verification:
    ok: bool
    max_abs_error: float
    tolerance: float
    steps: int
    expected_steps: int
    bytes_sent_per_rank: int
    bytes_received_per_rank: int
    expected_bytes_sent_per_rank: int
    expected_bytes_received_per_rank: int
    bytes_sent: list[int]
    bytes_received: list[int]


def input_sizes(op: Op, n: int, count: int) -> np.ndarray:
    """Elements of each rank's send buffer: its block for allgather/gather, ``count`` otherwise."""
    return block_sizes(count, n) if op in (Op.ALLGATHER, Op.GATHER) else np.full(n, count)


def verify_inputs(op, n: int, count: int) -> list[np.ndarray]:
    """Zero-filled send buffers of the right sizes (callers fill them)."""
    return [np.zeros(int(s)) for s in input_sizes(parse_op(op), n, count)]


def random_inputs(op: Op, n: int, count: int, dtype: np.dtype, seed: int) -> list[np.ndarray]:
    """Each rank's send buffer, random: normal floats, or integers in [-100, 100]."""
    rng = np.random.default_rng(seed)
    sizes = input_sizes(op, n, count)
    if dtype.kind == "f":
        return [rng.standard_normal(int(s)).astype(dtype) for s in sizes]
    info = np.iinfo(dtype)
    low, high = max(info.min, -100), min(info.max, 100)
    return [rng.integers(low, high, int(s), endpoint=True).astype(dtype) for s in sizes]


def verify(
    op,
    algorithm: str,
    num_ranks: int,
    count: int,
    dtype="float32",
    seed: int = 0,
    reduction="sum",
    root: int = 0,
    local_size: int = 1,
) -> Verification:
    op, dtype, reduction = parse_op(op), parse_dtype(dtype), parse_reduction(reduction)
    check_reduction_dtype(reduction, dtype)
    req = Request(op, num_ranks, count, dtype.itemsize, root, local_size)
    impl = lookup(algorithm, op)
    validate(impl, req)
    schedule = impl.build(req)
    inputs = random_inputs(op, num_ranks, count, dtype, seed)
    expected = reference(op, inputs, reduction, root)
    run = execute(schedule, inputs, reduction)
    error, tolerance = _compare(run.outputs, expected, inputs, dtype)
    closed = impl.cost(req)
    return Verification(
        ok=error <= tolerance,
        max_abs_error=error,
        tolerance=tolerance,
        steps=run.steps,
        expected_steps=closed.steps,
        bytes_sent_per_rank=int(run.bytes_sent.max(initial=0)),
        bytes_received_per_rank=int(run.bytes_received.max(initial=0)),
        expected_bytes_sent_per_rank=closed.bytes_sent,
        expected_bytes_received_per_rank=closed.bytes_received,
        bytes_sent=run.bytes_sent.tolist(),
        bytes_received=run.bytes_received.tolist(),
    )


def _compare(outputs, expected, inputs, dtype) -> tuple[float, float]:
    """Largest absolute difference, and what float rounding allows: summation order differs by algorithm,
    so the bound is a few ulps of the sum of magnitudes per reduction level (exact for integers)."""
    error = 0.0
    for got, want in zip(outputs, expected, strict=True):
        if want is None:
            continue
        if got is None or got.shape != want.shape:
            return float("inf"), 0.0
        if want.size:
            error = max(error, float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64)))))
    if dtype.kind != "f":
        return error, 0.0
    magnitude = sum(float(np.abs(x.astype(np.float64)).max(initial=0.0)) for x in inputs)
    return error, 4 * len(inputs) * float(np.finfo(dtype).eps) * max(magnitude, 1.0)
