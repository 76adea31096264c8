"""The answer of POST /v1/calibrate and ``commplan calibrate``: the request's cluster and logs handed to the
domain's calibration procedure (collectives/topology/calibrate.py), its report as JSON."""

from __future__ import annotations

from dataclasses import asdict, replace

from collectives.topology.calibrate import Log, calibrate

from .convert import cluster_spec
from .errors import relocated
from .schemas.calibrate import MAX_ROWS, CalibrateRequest
from .settings import Settings


def calibration_response(body: CalibrateRequest, settings: Settings) -> dict:
    base = cluster_spec(body.cluster, settings)
    if body.network_kind is not None:
        base = replace(base, network=replace(base.network, kind=body.network_kind))
    logs = [Log(log.text, log.nodes, log.ranks, log.op, log.algorithm) for log in body.logs]
    given = body.cluster.calibration
    start = given.model_dump(exclude_none=True) if given else None
    with relocated(fields={"calibration": "cluster.calibration"}):
        done = calibrate(base, logs, start, max_rows=MAX_ROWS, max_devices=settings.max_devices)
    result = done.result
    return {
        "cluster": body.cluster.model_dump(exclude_none=True) | {"calibration": done.constants},
        "constants": done.constants,
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
            for r, (log, line) in zip(result.rows, done.sources, strict=True)
        ],
        "median_error_before": result.median_error_before,
        "median_error_after": result.median_error_after,
        "stages": result.stages,
        "runs": [asdict(run) | {"devices": list(run.devices)} for run in done.runs],
        "warnings": done.warnings,
    }
