"""POST /v1/plan/export/{format}: the plan of a request as a file other tools read (docs/exports.md)."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from planner import SpecError
from planner.exports import aicb_omitted, chakra_omitted, quote, simai_omitted

from ..body import OffLoopBody
from ..errors import BAD_INPUT
from ..inputs import plan_of
from ..limits import run_bounded, run_value
from ..schemas.plan import PlanRequest
from ..serialize import export_bytes, plan_json

router = APIRouter(prefix="/v1/plan/export", tags=["plan"], route_class=OffLoopBody)


class Format(StrEnum):
    JSON = "json"
    CSV = "csv"
    NCCL_TESTS = "nccl-tests"
    SIMAI = "simai"
    AICB = "aicb"
    TRACE = "trace"
    CHAKRA = "chakra"


class Launcher(StrEnum):
    MPIRUN = "mpirun"
    SRUN = "srun"


MEDIA = {
    Format.JSON: ("application/json", "json"),
    Format.CSV: ("text/csv; charset=utf-8", "csv"),
    Format.NCCL_TESTS: ("text/x-shellscript; charset=utf-8", "sh"),
    Format.SIMAI: ("text/plain; charset=utf-8", "txt"),
    Format.AICB: ("text/csv; charset=utf-8", "csv"),
    Format.TRACE: ("application/json", "json"),
    Format.CHAKRA: ("application/octet-stream", "et"),
}
OMITTED = {Format.SIMAI: simai_omitted, Format.AICB: aicb_omitted, Format.CHAKRA: chakra_omitted}
# one rank of one stage: the name says which (Chakra: ASTRA-sim reads <prefix>.<rank>.et)
PER_STAGE = {Format.SIMAI: "workload.txt", Format.AICB: "workload.csv", Format.CHAKRA: "0.et"}


@router.post(
    "/{fmt}",
    responses={
        **BAD_INPUT,
        200: {
            "content": {
                "application/json": {},
                "text/csv": {},
                "text/x-shellscript": {},
                "text/plain": {},
                "application/octet-stream": {},
            }
        },
    },
    summary="Export a plan",
    description="`json`: the full plan (as POST /v1/plan). `csv`: one row per call with every stage and the group "
    "count, units in the header. `nccl-tests`: a shell script with one nccl-tests command line per distinct "
    "command, commented with the calls it measures (`launcher` mpirun or srun). `simai`: the workload text "
    "SimAI's simulators read (SimAI_analytical, SimAI_simulator) for one rank of pipeline stage `stage`. "
    "`aicb`: AICB's workload CSV for that rank. For both, calls the format cannot express are named in the "
    "`X-Commplan-Omitted` header. `trace`: the step timeline as Chrome trace-event JSON (Perfetto, "
    "chrome://tracing): one process per stage, one thread per stream, the calls with bytes and links in args. "
    "`chakra`: the Chakra execution trace (protobuf, ASTRA-sim's input) of one rank of stage `stage`.",
    response_class=Response,
)
async def export(
    fmt: Format,
    body: PlanRequest,
    request: Request,
    stage: Annotated[int, Query(ge=0, le=1 << 17, description="pipeline stage of the simai/aicb rank")] = 0,
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
        omitted = OMITTED[fmt](plan, stage) if fmt in OMITTED else []
        return export_bytes(plan, fmt.value, stage, launcher.value), omitted

    try:
        text, omitted = await run_value(request, work)
    except SpecError as err:  # the planner names its argument; here it is the query parameter
        if err.field != "stage":
            raise
        raise SpecError("query.stage", err.rule) from None
    if fmt in PER_STAGE:
        name = quote(f"commplan-{fmt.value}-stage{stage}-{PER_STAGE[fmt]}", "filename")
        headers["Content-Disposition"] = f'attachment; filename="{name}"'
        if omitted:
            headers["X-Commplan-Omitted"] = ",".join(sorted(set(omitted)))
    return Response(text, media_type=media, headers=headers)
