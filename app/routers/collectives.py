"""POST /v1/collectives/price, /verify, /schedule; GET /v1/collectives/algorithms, /nccl-versions, /cluster-choices."""

from __future__ import annotations

from dataclasses import asdict, fields

import numpy as np
from fastapi import APIRouter

import collectives as coll
from collectives.steps import schedule_view
from collectives.topology import ClusterSpec, check_concurrent_groups, price_call
from collectives.topology.spec import CPU_VENDORS, NCCL_VERSIONS, NETWORK_KINDS
from planner import SpecError
from planner.estimate import price_estimate
from planner.plan import cluster_for

from ..body import OffLoopBody
from ..convert import cluster_spec
from ..errors import BAD_INPUT, relocated
from ..limits import check_router, refuse
from ..schemas.collectives import (
    AlgorithmOut,
    ClusterChoicesOut,
    NcclVersionsOut,
    PriceOut,
    PriceRequest,
    ScheduleOut,
    ScheduleRequest,
    VerifyOut,
    VerifyRequest,
)
from ..schemas.read import reader
from ._bounded import bounded_post

router = APIRouter(prefix="/v1/collectives", tags=["collectives"], route_class=OffLoopBody)
# a CollectiveError's field, as named in the request body of these endpoints
PRICE_FIELDS = {"count": "message_bytes", "num_ranks": "ranks"}


def _listing(path: str, model, summary: str, description: str):
    """A GET of a fixed list the library holds (what a request may name)."""
    return router.get(path, response_model=model, summary=summary, description=description)


@_listing(
    "/algorithms",
    list[AlgorithmOut],
    "Which algorithms exist for which op",
    "Each (algorithm, op) with its alpha-beta closed form and source.",
)
def algorithms() -> list[dict]:
    return coll.catalogue()


@_listing(
    "/nccl-versions",
    NcclVersionsOut,
    "The NCCL versions cluster.nccl_version takes",
    "Every NCCL version whose tuning model prices a cluster, and the default.",
)
def nccl_versions() -> dict:
    default = next(f.default for f in fields(ClusterSpec) if f.name == "nccl_version")
    return {"versions": list(NCCL_VERSIONS), "default": default}


@_listing(
    "/cluster-choices",
    ClusterChoicesOut,
    "The values cluster.network.kind and cluster.cpu_vendor take",
    "The planner's own lists (the page's selects read them): anything else is a 422.",
)
def cluster_choices() -> dict:
    return {"network_kinds": list(NETWORK_KINDS), "cpu_vendors": list(CPU_VENDORS)}


def _price(body: PriceRequest, settings) -> dict:
    spec = cluster_spec(body.cluster, settings)
    placement = _placement(body, settings.max_price_transfers)
    check_router(spec, settings.max_router_pairs)
    cluster, op, (groups, n) = cluster_for(spec), coll.Op(body.op), placement.shape
    est = price_estimate(op, groups, n, cluster, body.algorithm, body.candidates, body.pricing, placement)
    refuse(est, settings.max_work, "")
    with relocated(fields=PRICE_FIELDS):
        p = price_call(
            op,
            body.message_bytes,
            placement,
            cluster,
            body.algorithm,
            which=body.candidates,
            pricing=body.pricing,
            nccl_algo=body.nccl_algo,
            nccl_proto=body.nccl_proto,
        )
    return reader(PriceOut)(p)


def _placement(body: PriceRequest, limit: int) -> np.ndarray:
    if body.ranks is None and body.group_size is None:
        raise SpecError("ranks", "give ranks (global device ids) or group_size")
    if body.ranks is not None and body.group_size is not None:  # group_size was ignored before (hostile11)
        raise SpecError(
            "group_size",
            f"give ranks or group_size, not both; got {len(body.ranks)} ranks and group_size {body.group_size}",
        )
    first = body.ranks if body.ranks is not None else list(range(body.group_size))
    groups = [first, *(body.concurrent_groups or [])]
    with relocated(fields=PRICE_FIELDS):  # disjoint groups, sendrecv pairs exempt: one home in collectives
        check_concurrent_groups(groups, coll.Op(body.op))
    odd = next((i for i, g in enumerate(groups) if len(g) != len(first)), None)
    if odd is not None:
        raise SpecError(
            "concurrent_groups",
            f"every group must have {len(first)} ranks like the first; group {odd} has {len(groups[odd])}",
        )
    if len(groups) * len(first) > limit:
        raise SpecError(
            "concurrent_groups",
            f"{len(groups)} groups x {len(first)} ranks exceed {limit} (COMMPLAN_MAX_PRICE_TRANSFERS)",
        )
    if body.op == "sendrecv" and len(first) != 2:
        raise SpecError("ranks", f"sendrecv is between 2 ranks, got {len(first)}")
    return np.array(groups, dtype=np.int64)


bounded_post(
    router,
    "/price",
    PriceRequest,
    PriceOut,
    _price,
    name="price",
    summary="Price one collective call on a cluster",
    description="All listed groups run the call at the same moment and share links. message_bytes follows "
    "nccl-tests; bandwidth in GB/s = 1e9 B/s.",
)


def _verify(body: VerifyRequest, limit: int) -> dict:
    if body.num_ranks * max(body.count, 1) > limit:
        raise SpecError(
            "count",
            f"num_ranks x count = {body.num_ranks} x {body.count} = {body.num_ranks * body.count} "
            f"elements; at most {limit} (COMMPLAN_MAX_VERIFY_ELEMENTS)",
        )
    if body.num_ranks > 1024:
        raise SpecError("num_ranks", f"at most 1024 ranks are executed here, got {body.num_ranks}")
    result = coll.verify(
        body.op,
        body.algorithm,
        body.num_ranks,
        body.count,
        body.dtype,
        body.seed,
        body.reduction,
        body.root,
        body.local_size,
    )
    return result.__dict__


bounded_post(
    router,
    "/verify",
    VerifyRequest,
    VerifyOut,
    lambda body, settings: _verify(body, settings.max_verify_elements),
    name="verify",
    summary="Run an algorithm's schedule on random data",
    description="Executes the same schedule that is priced on numpy buffers and compares the result with "
    "the primitive's reference, and the bytes moved with the closed form.",
)


@router.post(
    "/schedule",
    responses=BAD_INPUT,
    response_model=ScheduleOut,
    summary="The steps of an algorithm on a small group",
    description="Every transfer of every step, and after each step which ranks' data each slot holds "
    "(executed with rank r contributing 2^r).",
)
def schedule(body: ScheduleRequest) -> dict:
    sched = coll.build_schedule(
        body.op, body.algorithm, body.num_ranks, body.count, 4, root=body.root, local_size=body.local_size
    )
    with relocated():  # the step view's own limit, a SpecError as it always was
        view = schedule_view(sched)
    return {
        "op": sched.op.value,
        "algorithm": sched.algorithm,
        "num_ranks": sched.num_ranks,
        "num_virtual": sched.num_virtual,
        "slot_bytes": sched.slot_bytes.tolist(),
        "initial": view.initial,
        "steps": [asdict(step) for step in view.steps],
        "wire_steps": sched.num_steps,
    }
