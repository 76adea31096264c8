"""POST /v1/plan/export/{format}: the plan of a request as a file other tools read (docs/exports.md)."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from planner import SpecError
from planner.exports import PLAN_EXPORTS, quote

from ..body import OffLoopBody
from ..errors import BAD_INPUT
from ..inputs import plan_of
from ..limits import run_bounded, run_value
from ..schemas.plan import PlanRequest
from ..serialize import export_bytes, plan_json

router = APIRouter(prefix="/v1/plan/export", tags=["plan"], route_class=OffLoopBody)


# the path's values: the registry's formats (planner/exports.py PLAN_EXPORTS)
Format = StrEnum("Format", {name.upper().replace("-", "_"): name for name in PLAN_EXPORTS})


class Launcher(StrEnum):
    MPIRUN = "mpirun"
    SRUN = "srun"


@router.post(
    "/{fmt}",
    responses={
        **BAD_INPUT,
        200: {"content": {export.media_type.split(";")[0]: {} for export in PLAN_EXPORTS.values()}},
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
    export = PLAN_EXPORTS[fmt.value]
    media, file = export.media_type, quote(f"commplan-plan.{export.extension}", "filename")
    headers = {"Content-Disposition": f'attachment; filename="{file}"'}
    if export.body == "plan":  # the plan itself: exactly what POST /v1/plan answers, blocks added there included
        answer = await run_bounded(request, lambda: plan_json(plan_of(body, settings)))
        return Response(answer.body, media_type=media, headers=headers)

    def work() -> tuple[bytes, list[str]]:  # computed in another process: the omitted calls come back with it
        plan = plan_of(body, settings)
        omitted = export.omitted(plan, stage) if export.omitted else []
        return export_bytes(plan, fmt.value, stage, launcher.value), omitted

    try:
        text, omitted = await run_value(request, work)
    except SpecError as err:  # the planner names its argument; here it is the query parameter
        if err.field != "stage":
            raise
        raise SpecError("query.stage", err.rule) from None
    if export.per_stage:
        name = quote(f"commplan-{fmt.value}-stage{stage}-{export.per_stage}", "filename")
        headers["Content-Disposition"] = f'attachment; filename="{name}"'
        if omitted:
            headers["X-Commplan-Omitted"] = ",".join(sorted(set(omitted)))
    return Response(text, media_type=media, headers=headers)
