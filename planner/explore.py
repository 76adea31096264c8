"""Time against message size for every algorithm on one call's groups: the algorithm explorer.

The call is placed exactly as in the plan (its groups, all running at once), then priced with each
algorithm at each size; ``auto`` is what the selector picks at that size, so the crossovers show.
Algorithms whose schedules grow as n^2 transfers (direct and pairwise exchange, Bruck's all-to-all) are
left out above QUADRATIC_LIMIT transfers per step class, and say so.

Under library pricing (NCCL's model, the default on NVIDIA clusters) the series are NCCL's algorithm x
protocol pairs (``NVLS/Simple``, ``Ring/LL``, ...) on the same groups, contention included, followed by the
schedules priced step by step; ``auto`` is then the pair NCCL's tuner picks at each size.
"""

from __future__ import annotations

from collectives import CollectiveError, Op
from collectives.topology import ClusterSpec, candidates, price_call
from collectives.topology.library import NCCL_NAMES, choose
from collectives.topology.library.model import candidates as nccl_candidates
from collectives.topology.library.pricer import features_of, shape_of
from collectives.topology.select import resolve_pricing

from ._errors import SpecError
from .context import Context
from .layout import RankLayout
from .model import ModelSpec, validate_model
from .parallel import ParallelSpec, validate_parallel
from .plan import Options, canonical, cluster_for, neighbourhood
from .rules import ledger
from .workload import WorkloadSpec, validate_workload

QUADRATIC = {"direct", "pairwise", "bruck"}
QUADRATIC_LIMIT = 1 << 20
DEFAULT_SIZES = [1 << k for k in range(10, 33, 2)]  # 1 KiB .. 4 GiB


def explore(
    model: ModelSpec,
    work: WorkloadSpec,
    par: ParallelSpec,
    cluster_spec: ClusterSpec,
    call_name: str,
    stage: int | None = None,
    sizes: list[int] | None = None,
    options: Options | None = None,
) -> dict:
    options = options or Options()
    validate_model(model)
    validate_workload(work)
    cluster = cluster_for(cluster_spec)
    validate_parallel(par, model, work, cluster.num_devices)
    ctx = Context(model, work, par)
    call = _find(ledger(ctx), call_name, stage)
    placement = RankLayout(par).placement(call.group, list(call.stages))
    priced_on, _ = canonical(neighbourhood(placement, cluster), cluster)
    n, groups = priced_on.shape[1], priced_on.shape[0]
    sizes = sorted(set(sizes or DEFAULT_SIZES) | {call.message_bytes})
    if call.op is Op.ALLTOALL:
        sizes = sorted({max(n, s - s % n) for s in sizes})
    library = resolve_pricing(options.pricing, cluster, call.op) == "library"
    series = _library_series(call.op, sizes, priced_on, cluster) if library else []
    for algorithm in candidates(call.op, cluster, "all"):
        if algorithm in QUADRATIC and n * n * groups > QUADRATIC_LIMIT:
            series.append(
                {
                    "algorithm": algorithm,
                    "time_s": [None] * len(sizes),
                    "busbw_GBps": [None] * len(sizes),
                    "note": f"{n} ranks x {groups} groups: n^2 schedule too large to price here",
                }
            )
            continue
        series.append(_series(call.op, algorithm, sizes, priced_on, cluster))
    if library:
        picks = [choose(call.op, s, cluster, priced_on[0], _calibration(cluster)) for s in sizes]
        auto = [f"{NCCL_NAMES[c.algorithm]}/{c.protocol}" for c in picks]
    else:
        auto = [price_call(call.op, s, priced_on, cluster, "auto", which=options.candidates).algorithm for s in sizes]
    return {
        "call": call.name,
        "op": call.op.value,
        "stages": list(call.stages),
        "group_size": n,
        "groups_priced": groups,
        "message_bytes": call.message_bytes,
        "sizes": sizes,
        "series": series,
        "auto": auto,
    }


def _series(op, algorithm, sizes, placement, cluster) -> dict:
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
    return {"algorithm": algorithm, "time_s": times, "busbw_GBps": busbw, "note": note}


def _library_series(op, sizes, placement, cluster) -> list[dict]:
    """One series per (algorithm, protocol) NCCL enables for these groups, priced as the plan prices them."""
    from collectives.topology.library.model import Features

    del Features
    pairs = [
        (c.algorithm, c.protocol)
        for c in nccl_candidates(op, shape_of(cluster, placement[0]), features_of(cluster), _calibration(cluster))
    ]
    out = []
    for algo, proto in pairs:
        prices = [
            price_call(op, s, placement, cluster, pricing="library", nccl_algo=algo, nccl_proto=proto) for s in sizes
        ]
        out.append(
            {
                "algorithm": f"{NCCL_NAMES[algo]}/{proto}",
                "time_s": [p.time_s for p in prices],
                "busbw_GBps": [p.busbw_GBps for p in prices],
                "note": f"NCCL model, {prices[0].channels} channels; runs as the {prices[0].algorithm} schedule",
            }
        )
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
