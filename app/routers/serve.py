"""POST /v1/serve: one serving deployment's TTFT, TPOT, throughput, KV cache and KV transfer (CONTRACT v1.2)."""

from __future__ import annotations

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from planner import SpecError
from planner.serving import plan_serving
from planner.serving.launch import launch_script
from planner.serving.search import SLA, candidates, search_serving

from ..convert import cluster_spec, model_spec, serve_inputs, serve_options
from ..errors import BAD_INPUT
from ..limits import run_bounded
from ..schemas.serve import ServeOut, ServeRequest, ServeSearchOut, ServeSearchRequest
from ..serialize import serve_json, serve_search_json

router = APIRouter(prefix="/v1/serve", tags=["serve"])


@router.post(
    "",
    responses=BAD_INPUT,
    response_model=ServeOut,
    summary="Plan one serving deployment",
    description="TTFT, TPOT, tokens/s (per GPU and per user), the KV cache's capacity, each pool's per-step calls "
    "priced on the cluster, and the KV transfer of disaggregated serving. A deployment that misses an SLA is an "
    "answer with its numbers; one that cannot be built is a 422 naming the field and the rule.",
)
async def serve(body: ServeRequest, request: Request) -> Response:
    settings = request.app.state.settings
    return await run_bounded(request, lambda: serve_json(plan_serving(*serve_inputs(body, settings))))


@router.post(
    "/search",
    responses=BAD_INPUT,
    response_model=ServeSearchOut,
    summary="The best serving deployments under an SLA",
    description="Every engine and mode asked for, each pool's layout and the prefill:decode split, ranked by output "
    "tokens/s per GPU among the deployments that meet the TTFT/TPOT limits, with the Pareto front of tokens/s per "
    "GPU against tokens/s per user and why the winner wins. Bounded up front (COMMPLAN_MAX_SERVE_CANDIDATES).",
)
async def serve_search(body: ServeSearchRequest, request: Request) -> Response:
    settings = request.app.state.settings

    def work() -> bytes:
        from planner.serving import Traffic, validate_traffic

        cluster = cluster_spec(body.cluster, settings)
        model = model_spec(body.model)
        traffic = Traffic(**body.traffic.model_dump())
        engines, modes = tuple(dict.fromkeys(body.engines)), tuple(dict.fromkeys(body.modes))
        validate_traffic(traffic)
        count = len(candidates(model, cluster, traffic, engines, modes))
        if count > settings.max_serve_candidates:
            raise SpecError(
                "cluster",
                f"{count:,} deployments to plan, above the limit of {settings.max_serve_candidates:,} "
                f"(COMMPLAN_MAX_SERVE_CANDIDATES); narrow engines or modes, or a smaller cluster",
            )
        result = search_serving(
            model, cluster, traffic, engines, modes, SLA(**body.sla.model_dump()), serve_options(body.options),
            body.top_k,
        )  # fmt: skip
        base = body.model_dump(include={"model", "cluster", "options"}, exclude_unset=True)
        return serve_search_json(result, base, count)

    return await run_bounded(request, work)


@router.post(
    "/export",
    responses=BAD_INPUT | {200: {"content": {"text/x-shellscript": {}}}},
    summary="The deployment as its engine's launch commands",
    description="A POSIX shell script: one line per worker with the engine's own flags (vllm serve, "
    "python -m sglang.launch_server, trtllm-serve), every argument quoted. `model_path` is what the engine loads "
    "(a Hugging Face repository or a local path); it may not hold control characters.",
)
async def export(
    body: ServeRequest,
    request: Request,
    model_path: str = Query(default="", max_length=256, pattern=r"^[^\x00-\x1f\x7f]*$"),
) -> Response:
    settings = request.app.state.settings

    def work() -> bytes:
        model, cluster, traits, _, pools, options = serve_inputs(body, settings)
        return launch_script(model, cluster, traits, pools, options, model_path).encode()

    response = await run_bounded(request, work)
    return Response(
        response.body,
        media_type="text/x-shellscript",
        headers={"content-disposition": f'attachment; filename="serve-{body.engine}.sh"'},
    )
