"""POST /v1/serve: one serving deployment's TTFT, TPOT, throughput, KV cache and KV transfer (CONTRACT v1.2)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from planner.serving import plan_serving

from ..convert import serve_inputs
from ..errors import BAD_INPUT
from ..limits import run_bounded
from ..schemas.serve import ServeOut, ServeRequest
from ..serialize import serve_json

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
