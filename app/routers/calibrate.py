"""POST /v1/calibrate: fit the few global pricing constants to the user's own nccl-tests logs."""

from __future__ import annotations

import re
from dataclasses import replace

from fastapi import APIRouter, Request
from fastapi.responses import Response

from collectives.topology.fit import BOUNDS, Constants, Observation, fit, placement_for
from collectives.topology.library import normalise_algo
from collectives.topology.nccl_tests import parse
from collectives.topology.spec import NCCL_VERSIONS, nccl_minor, validate_cluster
from planner import SpecError

from ..convert import cluster_spec
from ..errors import BAD_INPUT, relocated
from ..limits import encode, run_bounded
from ..schemas.calibrate import MAX_ROWS, CalibrateOut, CalibrateRequest
from ..settings import Settings

router = APIRouter(prefix="/v1", tags=["calibration"])


@router.post(
    "/calibrate",
    responses=BAD_INPUT,
    response_model=CalibrateOut,
    summary="Fit the pricing constants to nccl-tests logs",
    description="Each log is nccl-tests output as printed (all_reduce_perf, all_gather_perf, reduce_scatter_perf, "
    "alltoall_perf, broadcast_perf, reduce_perf, sendrecv_perf; NCCL_DEBUG=INFO lines may be mixed in) with the "
    "number of nodes it ran on. Fits link efficiencies on rows >= 256 MiB, latency scales and the network's per-hop "
    f"latency on rows <= 64 KiB; at most {MAX_ROWS} rows in all. A malformed log is a 422 naming the line.",
)
async def calibrate(body: CalibrateRequest, request: Request) -> Response:
    # A fit at the row limit takes seconds: like every heavy endpoint it runs in a worker thread under the
    # request's deadline, among the bounded work slots, and stops when the client goes away.
    settings = request.app.state.settings
    return await run_bounded(request, lambda: encode(run(body, settings), CalibrateOut))


def run(body: CalibrateRequest, settings: Settings) -> dict:
    """The response of POST /v1/calibrate (the CLI prints the same)."""
    base = cluster_spec(body.cluster, settings)
    if body.network_kind is not None:
        base = replace(base, network=replace(base.network, kind=body.network_kind))
    observations, where, runs, total = [], [], [], 0
    for i, log in enumerate(body.logs):
        prefix = f"logs.{i}."
        with relocated(prefix):
            parsed = parse(log.text, log.op, log.ranks, "text", MAX_ROWS)
        total += sum(len(r.rows) for r in parsed)
        if total > MAX_ROWS:
            raise SpecError(
                f"{prefix}text", f"logs 0..{i} hold {total} table rows; at most {MAX_ROWS} in all (the limit)"
            )
        for r in parsed:
            if r.ranks < 2:
                raise SpecError(
                    f"{prefix}text",
                    f"line {r.first_line}: a run of 1 rank moves no data (a binary built without MPI=1 runs every "
                    "process alone, each printing its own 1-rank table); give ranks if the log is complete",
                )
            nodes = log.nodes or len(r.hosts)
            if not nodes:
                raise SpecError(f"{prefix}nodes", f"line {r.first_line}: the log names no hosts; give nodes")
            if len(r.hosts) > nodes:
                raise SpecError(f"{prefix}nodes", f"{nodes} given but the rank lines name {len(r.hosts)} hosts")
            spec = replace(base, num_nodes=nodes)  # the log's node count on the request's cluster
            if r.nccl_version and nccl_minor(r.nccl_version) in NCCL_VERSIONS:  # the run's own NCCL's model
                spec = replace(spec, nccl_version=nccl_minor(r.nccl_version))
            devices = nodes * spec.devices_per_node
            if devices > settings.max_devices:
                raise SpecError(f"{prefix}nodes", f"{nodes} nodes x {spec.devices_per_node} = {devices} devices; "
                                f"this service prices at most {settings.max_devices}")  # fmt: skip
            with relocated(f"{prefix}nodes"):  # a torus sized for other counts
                validate_cluster(spec)
            with relocated(prefix):
                placement_for(r.ranks, spec)
            nccl_algo = log.algorithm or r.nccl_algo or "auto"
            with relocated(f"{prefix}algorithm"):
                normalise_algo(nccl_algo)
            runs.append(
                {
                    "log": i,
                    "op": r.op.value,
                    "ranks": r.ranks,
                    "nodes": nodes,
                    "rows": len(r.rows),
                    "nccl_version": r.nccl_version,
                    "priced_as_nccl": spec.nccl_version,
                    "nccl_algo": r.nccl_algo,
                    "devices": list(r.devices),
                }
            )
            for row in r.rows:
                if row.size_bytes == 0:
                    continue
                observations.append(
                    Observation(
                        r.op,
                        row.size_bytes,
                        r.ranks,
                        spec,
                        r.busbw_GBps(row),
                        nccl_algo,
                        f"logs[{i}] line {row.line}",
                    )
                )
                where.append((i, row.line))
    given = body.cluster.calibration
    with relocated("cluster.calibration"):
        start = Constants.from_dict(given.model_dump(exclude_none=True) if given else {})
    with relocated("logs"):
        result = fit(observations, start)
    constants = {group: values for group, values in result.constants.to_dict().items() if values}
    cluster = body.cluster.model_dump(exclude_none=True) | {"calibration": constants}
    return {
        "cluster": cluster,
        "constants": constants,
        "rows": [
            {
                "op": r.observation.op.value,
                "size_bytes": r.observation.size_bytes,
                "nodes": r.observation.nodes,
                "ranks": r.observation.ranks,
                "measured_busbw_GBps": r.observation.measured_busbw_GBps,
                "before_GBps": r.before_GBps,
                "after_GBps": r.after_GBps,
                "fitted": r.fitted,
                "log": log,
                "line": line,
            }
            for r, (log, line) in zip(result.rows, _kept(observations, where, result.rows), strict=True)
        ],
        "median_error_before": result.median_error_before,
        "median_error_after": result.median_error_after,
        "stages": result.stages,
        "runs": runs,
        "warnings": [*_other_gpu(runs, base.gpu), *_at_bounds(constants)],
    }


def _gpu_models(name: str) -> set[str]:
    """The model names in a GPU's name: 'A100 SXM4 80GB' -> {A100}; 'NVIDIA GB200' -> {GB200}; form factors
    (SXM4, PCIe, NVL72), memory (80GB, HBM3) name no model."""
    words = re.split(r"[\s_-]+", name.upper())
    return {w for w in words if re.fullmatch(r"[A-Z]+\d+[A-Z]?", w) and not w.endswith("GB")
            and not w.startswith(("SXM", "PCIE", "NVL", "HBM"))}  # fmt: skip


def _other_gpu(runs: list[dict], gpu) -> list[str]:
    """A log run on another GPU than the cluster's: its constants would price the cluster wrongly, silently
    (an A100 log on dgx-h100 drove efficiency.nic to its floor)."""
    models = _gpu_models(gpu.name) if gpu is not None else set()
    if not models:
        return []  # a GPU whose name says no model: nothing to compare
    warned = {}
    for run in runs:
        others = [d for d in run["devices"] if not models & _gpu_models(d)]
        if others and run["log"] not in warned:
            warned[run["log"]] = (
                f"logs.{run['log']}: ran on {', '.join(others)}, but the cluster's GPU is {gpu.name}: constants "
                "fitted on one GPU price another wrongly; calibrate the cluster the log ran on"
            )
    return list(warned.values())


def _at_bounds(constants: dict) -> list[str]:
    """A fitted constant at an end of its range (collectives/topology/fit.py BOUNDS): the logs ask for more than
    the constant can give, so the cluster is likely not the one they ran on (GPU, NICs, network kind, nodes).
    A plugin latency of zero is InfiniBand's own value, not a bound hit."""
    out = []
    for group, values in constants.items():
        low, high = BOUNDS[group]
        for name, value in values.items():
            if value >= high * (1 - 1e-9) or (low > 0 and value <= low * (1 + 1e-9)):
                out.append(
                    f"cluster.calibration.{group}.{name} = {value:g} sits at the end of its range [{low:g}, {high:g}]: "
                    "the logs do not fit this cluster; check its GPU, NICs, network kind and the node count"
                )
    return out


def _kept(observations, where, rows):
    """Where each fitted row came from (fit drops rows without bandwidth, so match by identity)."""
    index = {id(o): w for o, w in zip(observations, where, strict=True)}
    return [index[id(r.observation)] for r in rows]
