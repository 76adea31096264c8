"""Time against message size for every algorithm on one call's groups: the algorithm explorer.

The call is placed exactly as in the plan (its groups, all running at once), then priced with each
algorithm at each size; ``auto`` is what the selector picks at that size, so the crossovers show.
Schedules that grow as n^2 transfers (pairwise exchange and Bruck's all-to-all) are left out above
QUADRATIC_LIMIT transfers per step class, and say so.

Under library pricing (NCCL's model, the default on NVIDIA clusters) the series are NCCL's algorithm x
protocol pairs (``NVLS/Simple``, ``Ring/LL``, ...) on the same groups, contention included, followed by the
schedules priced step by step; ``auto`` is then the pair NCCL's tuner picks at each size.
"""

from __future__ import annotations

from dataclasses import dataclass

from collectives import CollectiveError, Op
from collectives.topology import ClusterSpec, candidates, price_call
from collectives.topology.library import NCCL_NAMES, choose
from collectives.topology.library.model import candidates as nccl_candidates
from collectives.topology.library.pricer import features_of, shape_of
from collectives.topology.select import resolve_pricing

from ._errors import SpecError
from .model import ModelSpec
from .parallel import ParallelSpec
from .plan import Options, placement_priced, setup
from .rules import ledger
from .workload import WorkloadSpec

# (algorithm, op) whose schedules materialise n(n-1) transfers per group: pairwise exchange and Bruck's
# all-to-all. The direct (mesh) collectives and the direct and hierarchical all-to-alls are all-pairs step
# classes priced in O(n) (collectives/topology/pricing.py route_all_pairs).
# One home: the cost estimate (planner/estimate.py) charges these n^2.
QUADRATIC = {(name, Op.ALLTOALL) for name in ("pairwise", "bruck")}
QUADRATIC_LIMIT = 1 << 20
DEFAULT_SIZES = [1 << k for k in range(10, 33, 2)]  # 1 KiB .. 4 GiB


@dataclass(frozen=True)
class Series:
    """One algorithm's time and bus bandwidth at each size; None where it cannot run (``note`` says why)."""

    algorithm: str
    time_s: list[float | None]
    busbw_GBps: list[float | None]
    note: str = ""
    # who priced it: "library" (NCCL's cost model: what NCCL would run, and what auto picks from under library
    # pricing) or "schedule" (the textbook schedule priced step by step on the graph)
    pricer: str = "schedule"


@dataclass(frozen=True)
class Exploration:
    """One call of a plan priced at many sizes with every algorithm, on the groups the plan prices it on."""

    call: str
    op: Op
    stages: tuple[int, ...]
    group_size: int
    groups_priced: int  # the groups the price is computed on (group 0's neighbourhood, or every group)
    num_groups: int  # the call's groups; those not priced are alike by the cluster's symmetry
    message_bytes: int
    sizes: list[int]
    series: list[Series]
    auto: list[str]  # what the selector (or NCCL's tuner, under library pricing) picks at each size


def explore(
    model: ModelSpec,
    work: WorkloadSpec,
    par: ParallelSpec,
    cluster_spec: ClusterSpec,
    call_name: str,
    stage: int | None = None,
    sizes: list[int] | None = None,
    options: Options | None = None,
) -> Exploration:
    options = options or Options()
    ctx, layout, cluster = setup(model, work, par, cluster_spec, options)
    call = _find(ledger(ctx), call_name, stage)
    priced_on = placement_priced(call, layout, cluster, options)
    n, groups = priced_on.shape[1], priced_on.shape[0]
    sizes = sorted(set(sizes or DEFAULT_SIZES) | {call.message_bytes})
    if call.op is Op.ALLTOALL:
        sizes = sorted({max(n, s - s % n) for s in sizes})
    library = resolve_pricing(options.pricing, cluster, call.op) == "library"
    series = _library_series(call.op, sizes, priced_on, cluster) if library else []
    for algorithm in candidates(call.op, cluster, "all"):
        if (algorithm, call.op) in QUADRATIC and n * n * groups > QUADRATIC_LIMIT:
            nothing = [None] * len(sizes)
            note = f"{n} ranks x {groups} groups: n^2 schedule too large to price here"
            series.append(Series(algorithm, nothing, nothing, note))
            continue
        series.append(_series(call.op, algorithm, sizes, priced_on, cluster))
    if library:
        picks = [choose(call.op, s, cluster, priced_on[0], _calibration(cluster)) for s in sizes]
        auto = [f"{NCCL_NAMES[c.algorithm]}/{c.protocol}" for c in picks]
    else:
        auto = [price_call(call.op, s, priced_on, cluster, "auto", which=options.candidates).algorithm for s in sizes]
    num_groups = layout.placement(call.group, call.stages).shape[0]
    return Exploration(call.name, call.op, call.stages, n, groups, num_groups, call.message_bytes, sizes, series, auto)


def _series(op, algorithm, sizes, placement, cluster) -> Series:
    times, busbw, note = [], [], ""
    for size in sizes:
        try:
            p = price_call(op, size, placement, cluster, algorithm)
        except CollectiveError as err:
            times.append(None)
            busbw.append(None)
            note = err.rule
            continue
        times.append(p.time_s)
        busbw.append(p.busbw_GBps)
    return Series(algorithm, times, busbw, note)


def _library_series(op, sizes, placement, cluster) -> list[Series]:
    """One series per (algorithm, protocol) NCCL enables for these groups, priced as the plan prices them."""
    pairs = [
        (c.algorithm, c.protocol)
        for c in nccl_candidates(op, shape_of(cluster, placement[0]), features_of(cluster), _calibration(cluster))
    ]
    out = []
    for algo, proto in pairs:
        prices = [
            price_call(op, s, placement, cluster, pricing="library", nccl_algo=algo, nccl_proto=proto) for s in sizes
        ]
        channels = f"{prices[0].channels} channel{'s' if prices[0].channels != 1 else ''}"
        note = f"NCCL model, {channels}; runs as the {prices[0].algorithm} schedule"
        times, busbw = [p.time_s for p in prices], [p.busbw_GBps for p in prices]
        out.append(Series(f"{NCCL_NAMES[algo]}/{proto}", times, busbw, note, pricer="library"))
    return out


def _calibration(cluster):
    from collectives.topology.library import DEFAULT_LIBRARY, LibraryCalibration

    cal = cluster.spec.calibration
    return cal if isinstance(cal, LibraryCalibration) else DEFAULT_LIBRARY


def _find(calls, name: str, stage: int | None):
    for call in calls:
        if call.name == name and (stage is None or stage in call.stages):
            return call
    names = sorted({c.name for c in calls})
    where = f" on stage {stage}" if stage is not None else ""
    raise SpecError("call", f"no call {name!r}{where} in this plan; calls: {', '.join(names)}")


__all__ = ["DEFAULT_SIZES", "QUADRATIC", "QUADRATIC_LIMIT", "Exploration", "Series", "explore"]
