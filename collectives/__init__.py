"""Collective primitives, algorithms as executable schedules, and their pricing on cluster topologies.

Public surface::

    Op, Reduction                     the primitives (primitives.py)
    build_schedule(op, algorithm, ...) a Schedule: ordered steps of transfers (schedule.py)
    execute(schedule, inputs)          run it on numpy buffers (executor.py)
    verify(op, algorithm, ...)         run on random data, compare with reference and closed form
    catalogue()                        which algorithms exist for which op, with their closed forms
"""

from ._errors import CollectiveError
from .algorithms import Cost, Request, allreduce_lower_bound, implementations, lookup, validate
from .executor import Execution, execute
from .primitives import (
    Op,
    Reduction,
    block_sizes,
    busbw_factor,
    parse_dtype,
    parse_op,
    reference,
)
from .schedule import Schedule, Step, StepClass, Transfers
from .verify import Verification, verify, verify_inputs


def build_schedule(
    op, algorithm: str, num_ranks: int, count: int, itemsize: int = 4, *, root: int = 0, local_size: int = 1
) -> Schedule:
    """The schedule of ``algorithm`` for ``op`` over ``num_ranks`` ranks and a ``count``-element message."""
    req = Request(parse_op(op), num_ranks, count, itemsize, root, local_size)
    impl = lookup(algorithm, req.op)
    validate(impl, req)
    return impl.build(req)


def closed_form(op, algorithm: str, num_ranks: int, message_bytes: int, *, local_size: int = 1) -> Cost:
    """Steps and the busiest rank's bytes sent/received, from the algorithm's formula (1-byte elements)."""
    req = Request(parse_op(op), num_ranks, message_bytes, 1, 0, local_size)
    impl = lookup(algorithm, req.op)
    validate(impl, req)
    return impl.cost(req)


def catalogue() -> list[dict]:
    """Every (algorithm, op) with its alpha-beta formula and source, sorted by op then algorithm."""
    rows = [
        {"algorithm": i.algorithm, "op": i.op.value, "formula": i.formula, "source": i.source}
        for i in implementations()
    ]
    return sorted(rows, key=lambda r: (r["op"], r["algorithm"]))


__all__ = [
    "CollectiveError",
    "Cost",
    "Execution",
    "Op",
    "Reduction",
    "Request",
    "Schedule",
    "Step",
    "StepClass",
    "Transfers",
    "Verification",
    "allreduce_lower_bound",
    "block_sizes",
    "build_schedule",
    "busbw_factor",
    "catalogue",
    "closed_form",
    "execute",
    "parse_dtype",
    "parse_op",
    "reference",
    "verify",
    "verify_inputs",
]
