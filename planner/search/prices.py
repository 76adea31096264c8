"""Prices of calls for many layouts at once: a (placement, algorithm) is priced a few times, not per layout.

Under NCCL's model (library pricing, the default on NVIDIA clusters) a call is priced exactly through the
plan's own ``_price_op``, memoised per (placement, message). Under the step-by-step schedule pricer
(collectives/topology/pricing.py) the time of one call is

    base latency + sum over step classes of [repeat x (overhead + path latency) + max_link bytes / rate]

and every class's bytes are the message's chunks, so for a fixed algorithm and placement the time is
linear in the message size M (up to one element of rounding per chunk, and up to the pipelining step of
the double binary tree, whose chunk count is ceil(M / 512 KiB) up to 64: collectives/algorithms/_base.py).
A :class:`Curve` therefore prices each candidate algorithm exactly at the two powers of two that bracket
M (from 64 MiB up: at 64 and 128 MiB; memoised, so a few sizes per placement serve every layout) and
interpolates linearly; the
library's choice (``auto``) is the cheapest candidate at M, as in ``price_call``. At a power of two the
curve equals ``price_call`` exactly; between them the error is the rounding above (tests/planner/
test_search.py checks the agreement with /v1/plan).

Placements are reduced the way ``planner.plan`` prices them (neighbourhood of group 0, moved to leaf unit
0), so the same memo serves every stage and every replica that the plan itself would price alike.
"""

from __future__ import annotations

import numpy as np

from collectives import CollectiveError, Op
from collectives.topology import DEFAULT_CALIBRATION, Cluster, candidates
from collectives.topology.select import _evaluate_one, local_size, nccl_p2p_ctas, resolve_pricing

from ..plan import Options, canonical, neighbourhood

# From 64 MiB up every algorithm's schedule has a fixed structure (the double binary tree's pipelining
# saturates at 64 chunks of 512 KiB = 32 MiB: collectives/algorithms/_base.py), so its time is one line in M:
# priced at 64 and 128 MiB, extrapolated. Groups of thousands of ranks then cost two schedule builds per
# algorithm, shared by every shape with the same group size.
LINEAR_FROM = 1 << 26


class Curve:
    """Time of one call of ``op`` on the groups of ``placement`` against message bytes."""

    def __init__(self, op: Op, placement: np.ndarray, cluster: Cluster, options: Options):
        self.op, self.placement, self.cluster, self.options = op, placement, cluster, options
        self.local = local_size(cluster, placement)
        self.algorithms = list(candidates(op, cluster, options.candidates))
        self._exact: dict[tuple[str, int], float | None] = {}
        self._memo: dict[int, float] = {}
        self._held: dict[int, tuple[int, int, int]] = {}  # NCCL's channels and the bytes sent, received (detail)
        self._where: tuple[str, dict] | None = None  # the groups' span and busiest link (where)
        # NCCL's model (the plan's default on NVIDIA clusters) switches algorithm, protocol and channel count
        # with the size, so it is not one line between powers of two; it is cheap (memoised per communicator
        # in collectives/topology/library), so those calls are priced exactly, as the plan prices them.
        self.library = resolve_pricing(options.pricer, cluster, op) == "library"  # as planner.plan._price_op

    def _at(self, algorithm: str, size: int) -> float | None:
        key = (algorithm, size)
        if key not in self._exact:
            try:
                ev = _evaluate_one(
                    algorithm, self.op, size, self.placement, self.cluster, self.local, DEFAULT_CALIBRATION, auto=True
                )
                self._exact[key] = ev.time_s
            except CollectiveError:  # this algorithm cannot run here (as price_call skips it)
                self._exact[key] = None
        return self._exact[key]

    def _interpolated(self, algorithm: str, message: int) -> float | None:
        if message <= 1:
            return self._at(algorithm, max(message, 0))
        lo = 1 << (message.bit_length() - 1)
        if lo >= LINEAR_FROM:  # one straight line through two anchors for every large message
            lo = LINEAR_FROM
        if lo == message:
            return self._at(algorithm, lo)
        t_lo, t_hi = self._at(algorithm, lo), self._at(algorithm, 2 * lo)
        if t_lo is None or t_hi is None:
            return self._at(algorithm, message)
        return t_lo + (t_hi - t_lo) * (message - lo) / lo

    def time(self, message: int) -> float:
        message = int(message)
        cached = self._memo.get(message)
        if cached is not None:
            return cached
        if self.library or self.op is Op.ALLTOALL or self.options.algorithm != "auto":
            # NCCL's model (above); all-to-all chunks must divide the group (sizes are then not powers of two);
            # a pinned algorithm is rare in a search: price these exactly, memoised per size
            from ..plan import _price_op

            price = _price_op(self.op, message, self.placement, self.cluster, self.options)
            best = price.time_s
            if price.channels:
                self._held[message] = (price.channels, price.bytes_sent_per_rank, price.bytes_received_per_rank)
        else:
            times = [t for a in self.algorithms if (t := self._interpolated(a, message)) is not None]
            if not times:
                n = self.placement.shape[-1]
                raise CollectiveError("algorithm", f"no algorithm can run {self.op.value} on {n} ranks here")
            best = min(times)
            ctas = nccl_p2p_ctas(self.op, message, self.placement, self.cluster, self.options.pricer)
            if ctas:  # what the plan's price of this send/recv says NCCL holds (price_call): it moves M each way
                self._held[message] = (ctas, message, message)
        self._memo[message] = best
        return best

    def where(self) -> tuple[str, dict]:
        """(span, busiest link) of the groups as the plan's price gives them (collectives pricing.on_nvlink_switch
        reads them): properties of the placement, read off one price at LINEAR_FROM bytes, once."""
        if self._where is None:
            from ..plan import _price_op

            price = _price_op(self.op, LINEAR_FROM, self.placement, self.cluster, self.options)
            self._where = (price.span, price.bottleneck)
        return self._where

    def detail(self, message: int) -> tuple[int, int, int]:
        """What the plan's price of the same call says its kernel holds (step.stream_totals, planner/contention.py):
        NCCL's channels and the bytes a rank sends and receives, where NCCL's model priced it (after ``time``);
        (0, 0, 0) otherwise, as the plan's schedule-priced calls hold none."""
        return self._held.get(int(message), (0, 0, 0))


CURVES_KEPT = 4096  # curves shared between the shapes of a process (a few prices each)
_SHARED: dict = {}


def shared_curves(cluster: Cluster, options: Options) -> dict:
    """The curves of every shape searched on ``cluster`` with ``options`` in this process. A curve is a
    function of its op and reduced placement alone (the key below), so shapes whose groups reduce alike
    (every cp of one (tp, pp) has the same cp x dp gradient groups, every shape of one tp the same tensor
    groups) price a message once."""
    key = (id(cluster), options)
    found = _SHARED.get(key)
    if found is None:
        if len(_SHARED) > 8:
            _SHARED.clear()
        found = _SHARED[key] = (cluster, {})  # holding the cluster keeps its id from being reused
    curves = found[1]
    if len(curves) > CURVES_KEPT:
        curves.clear()
    return curves


class Pricer:
    """Curves of one rank layout on one cluster, keyed as planner.plan keys its price cache."""

    def __init__(self, cluster: Cluster, options: Options | None = None, curves: dict | None = None):
        self.cluster, self.options = cluster, options or Options()
        self._curves: dict[tuple, Curve] = {} if curves is None else curves  # shared_curves: across shapes
        self._by_array: dict[tuple, tuple[np.ndarray, Curve]] = {}

    def curve(self, op: Op, placement: np.ndarray) -> Curve:
        """The curve of ``op`` on ``placement``. Placements come from the rank layout's memo (read-only
        arrays, the same object for the same group and stages), so the reduction below (neighbourhood and
        canonical move: most of the pricing time in a search) is done once per array, not per template."""
        key = (op, id(placement))
        found = self._by_array.get(key)
        if found is None:
            # holding the array keeps its id from being reused
            found = self._by_array[key] = (placement, self._reduced_curve(op, placement))
        return found[1]

    def _reduced_curve(self, op: Op, placement: np.ndarray) -> Curve:
        priced_on, _ = canonical(neighbourhood(placement, self.cluster), self.cluster)
        key = (op, priced_on.shape, priced_on.tobytes())
        found = self._curves.get(key)
        if found is None:
            found = self._curves[key] = Curve(op, priced_on, self.cluster, self.options)
        return found


__all__ = ["Curve", "Pricer", "shared_curves"]
