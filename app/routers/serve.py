"""POST /v1/serve: one serving deployment's TTFT, TPOT, throughput, KV cache and KV transfer (CONTRACT v1.2)."""

from __future__ import annotations

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response, StreamingResponse

from planner.serving import plan_serving
from planner.serving.calibrate import calibrate_serving
from planner.serving.launch import EXPORTS
from planner.serving.search import search_serving

from ..body import OffLoopBody
from ..convert import serve_calibrate_inputs, serve_inputs, serve_search_inputs
from ..errors import BAD_INPUT
from ..limits import acquire_slot, run_bounded
from ..schemas.serve import (
    ServeCalibrateOut,
    ServeCalibrateRequest,
    ServeExportFormat,
    ServeOut,
    ServeRequest,
    ServeSearchOut,
    ServeSearchRequest,
)
from ..serialize import serve_calibration_json, serve_json, serve_search_dict, serve_search_json
from ..streaming import line, ndjson
from ..threads import in_thread
from ._bounded import bounded_post
from .search import NDJSON, STREAMED, wants_stream

router = APIRouter(prefix="/v1/serve", tags=["serve"], route_class=OffLoopBody)


bounded_post(
    router,
    "",
    ServeRequest,
    ServeOut,
    lambda body, settings: serve_json(plan_serving(*serve_inputs(body, settings))),
    encoded=True,
    name="serve",
    summary="Plan one serving deployment",
    description="TTFT, TPOT, tokens/s (per GPU and per user), the KV cache's capacity, each pool's per-step calls "
    "priced on the cluster, and the KV transfer of disaggregated serving. A deployment that misses an SLA is an "
    "answer with its numbers; one that cannot be built is a 422 naming the field and the rule.",
)


@router.post(
    "/search",
    responses=STREAMED,
    response_model=ServeSearchOut,
    summary="The best serving deployments under an SLA",
    description="Every engine and mode asked for, each pool's layout and the prefill:decode split, ranked by output "
    "tokens/s per GPU among the deployments that meet the TTFT/TPOT limits, with the Pareto front of tokens/s per "
    "GPU against tokens/s per user and why the winner wins. Bounded up front (COMMPLAN_MAX_SERVE_CANDIDATES). "
    "`?stream=true` or `Accept: application/x-ndjson` streams progress as /v1/search does: lines "
    '`{"type": "progress", "done", "total", "evaluated", "feasible", "elapsed_s", "best"}` then '
    '`{"type": "result", ...}`.',
)
async def serve_search(body: ServeSearchRequest, request: Request, stream: bool = False) -> Response:
    settings = request.app.state.settings
    if wants_stream(request, stream):
        args, base, count = await in_thread(serve_search_inputs, body, settings)  # refusals before a byte
        release = await acquire_slot(request)

        def work(send) -> str:
            def progress(state: dict) -> None:
                send(line({"type": "progress", **state}))

            result = search_serving(**args, progress=progress)
            return line({"type": "result", **serve_search_dict(result, base, count)})

        return StreamingResponse(ndjson(request, work, release), media_type=NDJSON)

    def work() -> bytes:
        args, base, count = serve_search_inputs(body, settings)
        return serve_search_json(search_serving(**args), base, count)

    return await run_bounded(request, work)


def _calibrated(body: ServeCalibrateRequest, settings) -> bytes:
    (model, cluster, traits, pools, options), runs = serve_calibrate_inputs(body, settings)
    result = calibrate_serving(model, cluster, traits, pools, options, runs)
    return serve_calibration_json(result, body.options.model_dump(exclude_unset=True))


bounded_post(
    router,
    "/calibrate",
    ServeCalibrateRequest,
    ServeCalibrateOut,
    _calibrated,
    encoded=True,
    name="calibrate",
    summary="Fit the serving step times to your own benchmark runs",
    description="Your `vllm bench serve` / `python -m sglang.bench_serving` outputs of this deployment: each run's "
    "traffic and measured mean TTFT, TPOT and output tokens/s, the planner's prediction before and after, and the "
    "two constants fitted (prefill_time_scale, decode_time_scale), with the options to post to /v1/serve.",
)


@router.post(
    "/export",
    responses=BAD_INPUT | {200: {"content": {f.media_type: {} for f in EXPORTS.values()}}},
    summary="The deployment as its engine's launch commands or a Dynamo manifest",
    description="`format=launch` (default): a POSIX shell script, one line per worker with the engine's own flags "
    "(vllm serve, python -m sglang.launch_server, trtllm-serve), every argument quoted, and a disaggregated "
    "deployment's router. `format=dynamo`: a DynamoGraphDeployment (vLLM, SGLang). `model_path` is what the engine "
    "loads (a Hugging Face repository or a local path); it may not hold control characters.",
)
async def export(
    body: ServeRequest,
    request: Request,
    model_path: str = Query(default="", max_length=256, pattern=r"^[^\x00-\x1f\x7f]*$"),
    format: ServeExportFormat = "launch",
) -> Response:
    settings = request.app.state.settings
    export = EXPORTS[format]

    def work() -> bytes:
        model, cluster, traits, _, pools, options = serve_inputs(body, settings)
        return export.write(model, cluster, traits, pools, options, model_path).encode()

    response = await run_bounded(request, work)
    return Response(
        response.body,
        media_type=export.media_type,
        headers={"content-disposition": f'attachment; filename="serve-{body.engine}{export.suffix}"'},
    )
