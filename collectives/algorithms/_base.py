"""The algorithm registry: every (algorithm, op) pair with its schedule builder and its closed form."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from .._errors import CollectiveError
from ..primitives import Op, check_count
from ..schedule import Layout, Schedule


@dataclass(frozen=True)
class Request:
    """What a builder needs: the primitive, the group, the message.

    ``count`` is the message in elements (nccl-tests convention, see primitives). ``local_size`` is the
    number of consecutive group positions that share a node: hierarchical algorithms split on it.
    """

    op: Op
    num_ranks: int
    count: int
    itemsize: int = 4
    root: int = 0
    local_size: int = 1

    @property
    def message_bytes(self) -> int:
        return self.count * self.itemsize


@dataclass(frozen=True)
class Cost:
    """Closed-form cost: steps (alpha terms) and the busiest rank's bytes sent and received (beta terms)."""

    steps: int
    bytes_sent: int
    bytes_received: int

    def time(self, alpha_s: float, beta_s_per_byte: float) -> float:
        """The alpha-beta time (Hockney; Thakur, Rabenseifner & Gropp 2005): a latency per step plus the
        busiest rank's bytes at the link's inverse bandwidth. Reduction compute (gamma) is not charged."""
        return self.steps * alpha_s + max(self.bytes_sent, self.bytes_received) * beta_s_per_byte


def schedule_of(req: Request, algorithm: str, layout: Layout, make_steps, make_classes=None, **kw) -> Schedule:
    """``req``'s schedule under ``algorithm``: the request's op, group size, count and itemsize, as every builder
    hands them on (``kw``: Schedule's ``num_virtual``, ``root``)."""
    return Schedule(req.op, algorithm, req.num_ranks, req.count, req.itemsize, layout, make_steps, make_classes, **kw)


def allreduce_lower_bound(num_ranks: int, message_bytes: int) -> int:
    """No allreduce sends less than 2(n-1)/n x M per rank (Patarasuk & Yuan 2009)."""
    return 2 * (num_ranks - 1) * message_bytes // num_ranks


@dataclass(frozen=True)
class Implementation:
    algorithm: str
    op: Op
    build: Callable[[Request], Schedule]
    cost: Callable[[Request], Cost]
    formula: str
    source: str
    check: Callable[[Request], str | None] = lambda r: None


_REGISTRY: dict[tuple[str, Op], Implementation] = {}


def register(algorithm: str, op: Op, *, cost, formula: str, source: str, check=None):
    """Register ``build`` (the decorated function) as ``algorithm`` for ``op``, with its closed-form ``cost``,
    the alpha-beta ``formula`` and its ``source``; ``check`` says why a request cannot run (None: it can).
    A pair registers once."""

    def wrap(build: Callable[[Request], Schedule]):
        if (algorithm, op) in _REGISTRY:
            raise CollectiveError("algorithm", f"{algorithm} {op.value} is registered already")
        _REGISTRY[(algorithm, op)] = Implementation(
            algorithm, op, build, cost, formula, source, check or (lambda r: None)
        )
        return build

    return wrap


def unregister(algorithm: str, op: Op) -> None:
    """Remove a registered pair (tests that register a toy algorithm)."""
    _REGISTRY.pop((algorithm, op), None)


def implementations() -> list[Implementation]:
    return list(_REGISTRY.values())


def lookup(algorithm: str, op: Op) -> Implementation:
    impl = _REGISTRY.get((algorithm, op))
    if impl is None:
        names = sorted({a for a, _ in _REGISTRY})
        if algorithm not in names:
            raise CollectiveError("algorithm", f"unknown algorithm {algorithm!r}; known: {', '.join(names)}")
        ops = sorted(o.value for a, o in _REGISTRY if a == algorithm)
        raise CollectiveError("algorithm", f"{algorithm} does not implement {op.value}; it implements {', '.join(ops)}")
    return impl


def validate(impl: Implementation, req: Request) -> None:
    check_count(req.op, req.count, req.num_ranks)
    if req.itemsize < 1:
        raise CollectiveError("itemsize", f"itemsize must be >= 1, got {req.itemsize}")
    if not 0 <= req.root < req.num_ranks:
        raise CollectiveError("root", f"root {req.root} is not a rank of a {req.num_ranks}-rank group")
    reason = impl.check(req)
    if reason:
        raise CollectiveError("num_ranks", f"{impl.algorithm} {req.op.value}: {reason}")


# Small shared arithmetic -------------------------------------------------------------------------------


def ceil_log2(n: int) -> int:
    return (n - 1).bit_length()


def floor_pow2(n: int) -> int:
    return 1 << (n.bit_length() - 1)


def is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def need_pow2(req: Request) -> str | None:
    return None if is_pow2(req.num_ranks) else f"needs a power-of-two number of ranks, got {req.num_ranks}"


def share(total: int, num: int, den: int) -> int:
    """total * num / den rounded down: the exact bytes when the message divides evenly."""
    return total * num // den if den else 0


# Pipelined algorithms cut the message into chunks of about this size (NCCL's tree/broadcast chunking is
# of this order); at most MAX_PIPELINE_CHUNKS so that executing the schedule stays cheap.
PIPELINE_CHUNK_BYTES = 512 * 1024
MAX_PIPELINE_CHUNKS = 64


def pipeline_chunks(message_bytes: int) -> int:
    return max(1, min(MAX_PIPELINE_CHUNKS, math.ceil(message_bytes / PIPELINE_CHUNK_BYTES)))
