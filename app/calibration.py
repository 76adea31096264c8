"""The answer of POST /v1/calibrate and ``commplan calibrate``: the request's cluster and logs handed to the
domain's calibration procedure (collectives/topology/calibrate.py), a profiler trace to planner/trace_fit.py,
their reports as JSON."""

from __future__ import annotations

import base64
import binascii
from dataclasses import asdict, replace

from collectives.topology.calibrate import Log, calibrate
from planner import SpecError
from planner.compute import check_gpu
from planner.kernels import NESTED_CONSTANTS
from planner.profile_trace import gunzip, load_trace
from planner.trace_fit import compare_collectives, fit_trace

from .convert import cluster_spec
from .errors import nested, relocated
from .inputs import plan_of
from .schemas.calibrate import MAX_ROWS, MAX_TRACE_BYTES, CalibrateRequest
from .schemas.plan import PlanRequest
from .settings import Settings

GZIP_BASE64 = "H4sI"  # base64 of a gzip file's first three bytes (1f 8b 08)
# base64 of a JSON file's first bytes: '{"' -> eyJ, '[{' -> W3s, '{\n' -> ewo, '[\n' -> Wwo, '{ ' -> eyA; no JSON text
# starts so (a letter other than t, f, n opens none), so a trace sent so is named, not called "not JSON"
JSON_BASE64 = ("eyJ", "W3s", "ewo", "Wwo", "eyA")


def calibration_response(body: CalibrateRequest, settings: Settings) -> dict:
    """The nccl-tests part and the trace's; the answer's ``cluster`` carries both parts' fitted constants
    (``calibration``: the NCCL groups and ``kernels``), so that it plans with them as it is."""
    out = logs_response(body, settings) if body.logs else _no_logs(body)
    if body.trace is not None:
        out["trace"] = trace_response(body, settings)
        fitted = out["trace"]["constants"]
        if fitted:  # over the cluster's own: a dtype or attention kernel the trace did not run keeps its given one
            calibration = out["cluster"].setdefault("calibration", {})
            given = calibration.get("kernels", {})
            nested = {k: given.get(k, {}) | fitted.get(k, {}) for k in NESTED_CONSTANTS if k in given or k in fitted}
            calibration["kernels"] = given | fitted | nested
    return out


def _no_logs(body: CalibrateRequest) -> dict:
    cluster = body.cluster.model_dump(exclude_none=True)
    return {
        "cluster": cluster,
        "constants": {},
        "rows": [],
        "median_error_before": None,
        "median_error_after": None,
        "stages": [],
        "runs": [],
        "warnings": [],
    }


def trace_response(body: CalibrateRequest, settings: Settings) -> dict:
    """The trace's kernels by class, the compute constants fitted for the cluster's GPU with every measured
    kernel before and after, and its collectives against the ``compare`` configuration's ledger."""
    gpu = check_gpu(cluster_spec(body.cluster, settings).gpu, "bf16")
    trace = load_trace(trace_data(body.trace))
    if body.trace_steps:
        trace = replace(trace, steps=body.trace_steps, steps_from="request")
    fit = fit_trace(trace, gpu)
    plan = None
    if body.compare is not None:
        request = PlanRequest(
            model=body.compare.model,
            workload=body.compare.workload,
            parallel=body.compare.parallel,
            cluster=body.cluster,
        )
        with nested("compare."):
            plan = plan_of(request, settings)
    collectives, stage, warnings = compare_collectives(trace, plan)
    return {
        "device": trace.device,
        "sms": trace.sms,
        "steps": trace.steps,
        "steps_from": trace.steps_from,
        "rank": trace.rank,
        "world_size": trace.world_size,
        "events": trace.events,
        "record_shapes": trace.record_shapes,
        "kernels": fit.kernels,
        "constants": fit.constants,
        "rows": fit.rows,
        "median_error_before": fit.median_error_before,
        "median_error_after": fit.median_error_after,
        "stage": stage,
        "collectives": collectives,
        "unclassified": fit.unclassified,
        "host": fit.host.as_dict(),
        "warnings": fit.warnings + warnings,
    }


def trace_data(value):
    """The trace as the domain reads it: JSON as given, text as given, base64 of a gzip file as its bytes."""
    if isinstance(value, str) and value.startswith(GZIP_BASE64):
        try:
            raw = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError) as err:
            raise SpecError("trace", f"starts as base64 of a gzip file but is not base64: {err}") from None
        return gunzip(raw, MAX_TRACE_BYTES)
    if isinstance(value, str) and value.startswith(JSON_BASE64):
        raise SpecError(
            "trace",
            f"starts as base64 of a JSON file ({value[:3]!r}): send the JSON itself, its text, or base64 of its gzip "
            "(.json.gz, starting H4sI)",
        )
    return value


def logs_response(body: CalibrateRequest, settings: Settings) -> dict:
    base = cluster_spec(body.cluster, settings)
    if body.network_kind is not None:
        base = replace(base, network=replace(base.network, kind=body.network_kind))
    logs = [Log(log.text, log.nodes, log.ranks, log.op, log.algorithm) for log in body.logs]
    given = body.cluster.calibration
    start = given.model_dump(exclude_none=True, exclude={"kernels"}) if given else None
    with relocated(fields={"calibration": "cluster.calibration"}):
        done = calibrate(base, logs, start, max_rows=MAX_ROWS, max_devices=settings.max_devices)
    result = done.result
    return {
        "cluster": body.cluster.model_dump(exclude_none=True) | {"calibration": _with_kernels(done.constants, given)},
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


def _with_kernels(constants: dict, given) -> dict:
    """The NCCL constants fitted, with the kernel constants the request's cluster already had."""
    if given is None or given.kernels is None:
        return constants
    return constants | {"kernels": given.kernels.model_dump(exclude_none=True)}
