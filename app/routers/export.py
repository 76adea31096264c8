"""POST /v1/plan/export/{format}: the plan of a request as a file other tools read (docs/exports.md)."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from planner import SpecError
from planner.exports import aicb_omitted, quote, render

from ..errors import BAD_INPUT
from ..inputs import plan_of
from ..limits import run_bounded, run_value
from ..schemas.plan import PlanRequest
from ..serialize import plan_json

router = APIRouter(prefix="/v1/plan/export", tags=["plan"])


class Format(StrEnum):
    JSON = "json"
    CSV = "csv"
    NCCL_TESTS = "nccl-tests"
    SIMAI = "simai"


class Launcher(StrEnum):
    MPIRUN = "mpirun"
    SRUN = "srun"


MEDIA = {
    Format.JSON: ("application/json", "json"),
    Format.CSV: ("text/csv; charset=utf-8", "csv"),
    Format.NCCL_TESTS: ("text/x-shellscript; charset=utf-8", "sh"),
    Format.SIMAI: ("text/csv; charset=utf-8", "csv"),
}


@router.post(
    "/{fmt}",
    responses={**BAD_INPUT, 200: {"content": {"application/json": {}, "text/csv": {}, "text/x-shellscript": {}}}},
    summary="Export a plan",
    description="`json`: the full plan (as POST /v1/plan). `csv`: one row per call with every stage and the group "
    "count, units in the header. `nccl-tests`: a shell script with, per call, the nccl-tests command line that "
    "measures it on the cluster (`launcher` mpirun or srun). `simai`: AICB's workload CSV for one rank of "
    "pipeline stage `stage`, which SimAI replays; calls AICB cannot express are named in the "
    "`X-Commplan-Omitted` header.",
    response_class=Response,
)
async def export(
    fmt: Format,
    body: PlanRequest,
    request: Request,
    stage: Annotated[int, Query(ge=0, le=1 << 17, description="pipeline stage of the simai rank")] = 0,
    launcher: Annotated[Launcher, Query(description="nccl-tests launcher")] = Launcher.MPIRUN,
) -> Response:
    # Planning runs in a worker thread under the request's deadline, like POST /v1/plan (app/limits.py).
    settings = request.app.state.settings
    media, ext = MEDIA[fmt]
    headers = {"Content-Disposition": f'attachment; filename="{quote(f"commplan-plan.{ext}", "filename")}"'}
    if fmt is Format.JSON:  # exactly what POST /v1/plan answers, blocks added there included
        answer = await run_bounded(request, lambda: plan_json(plan_of(body, settings)))
        return Response(answer.body, media_type=media, headers=headers)

    def work() -> tuple[bytes, list[str]]:  # computed in another process: the omitted calls come back with it
        plan = plan_of(body, settings)
        omitted = aicb_omitted(plan, stage) if fmt is Format.SIMAI else []
        return render(plan, fmt.value, stage, launcher.value).encode(), omitted

    try:
        text, omitted = await run_value(request, work)
    except SpecError as err:  # the planner names its argument; here it is the query parameter
        if err.field != "stage":
            raise
        raise SpecError("query.stage", err.rule) from None
    if fmt is Format.SIMAI:
        name = quote(f"commplan-stage{stage}-workload.csv", "filename")
        headers["Content-Disposition"] = f'attachment; filename="{name}"'
        if omitted:
            headers["X-Commplan-Omitted"] = ",".join(sorted(set(omitted)))
    return Response(text, media_type=media, headers=headers)
