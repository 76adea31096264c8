"""Time against message size for every algorithm on one call's groups: the algorithm explorer.

The call is placed exactly as in the plan (its groups, all running at once), then priced with each
algorithm at each size; ``auto`` is what the selector picks at that size, so the crossovers show.
Algorithms whose schedules grow as n^2 transfers (direct and pairwise exchange, Bruck's all-to-all) are
left out above QUADRATIC_LIMIT transfers per step class, and say so.
"""

from __future__ import annotations

from collectives import CollectiveError, Op
from collectives.topology import ClusterSpec, candidates, price_call

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
    series = []
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


def _find(calls, name: str, stage: int | None):
    for call in calls:
        if call.name == name and (stage is None or stage in call.stages):
            return call
    names = sorted({c.name for c in calls})
    where = f" on stage {stage}" if stage is not None else ""
    raise SpecError("call", f"no call {name!r}{where} in this plan; calls: {', '.join(names)}")
