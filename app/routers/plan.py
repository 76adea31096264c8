"""POST /v1/plan and /v1/plan/batch."""

from __future__ import annotations

from fastapi import APIRouter, Request
from pydantic import ValidationError

from collectives import CollectiveError
from planner import SpecError, build_plan
from planner.explore import explore

from ..convert import plan_inputs
from ..errors import BAD_INPUT, detail, error_detail
from ..schemas.plan import BatchOut, BatchRequest, ExploreOut, ExploreRequest, PlanOut, PlanRequest

router = APIRouter(prefix="/v1/plan", tags=["plan"])


def run_plan(request: PlanRequest, settings) -> dict:
    model, work, par, cluster, opts = plan_inputs(request, settings)
    try:
        return build_plan(model, work, par, cluster, opts).to_dict()
    except CollectiveError as err:  # an algorithm pinned in options that cannot run somewhere
        raise SpecError(f"options.{err.field}", err.rule) from None


@router.post(
    "",
    responses=BAD_INPUT,
    response_model=PlanOut,
    summary="Plan one configuration",
    description="Every primitive call of one iteration with its group, bytes, count, algorithm, placement "
    "and time. Bytes are integers (nccl-tests message convention), seconds floats, bandwidth "
    "GB/s = 1e9 B/s per direction; counts are per rank per iteration.",
)
def plan(body: PlanRequest, request: Request) -> dict:
    return run_plan(body, request.app.state.settings)


@router.post(
    "/batch",
    responses=BAD_INPUT,
    response_model=BatchOut,
    summary="Plan many configurations",
    description="Results in request order; one bad request never fails the others.",
)
def batch(body: BatchRequest, request: Request) -> dict:
    settings = request.app.state.settings
    if len(body.requests) > settings.max_batch:
        raise SpecError(
            "requests", f"{len(body.requests)} requests; at most {settings.max_batch} per batch (COMMPLAN_MAX_BATCH)"
        )
    return {"results": [_one(item, settings) for item in body.requests]}


def _one(item: dict, settings) -> dict:
    try:
        return {"ok": True, "plan": run_plan(PlanRequest.model_validate(item), settings)}
    except ValidationError as err:
        return {
            "ok": False,
            "error": {
                "status": 422,
                "detail": [
                    {"loc": ["body", *e["loc"]], "msg": e["msg"], "type": e["type"]}
                    for e in err.errors(include_url=False)
                ],
            },
        }
    except (SpecError, CollectiveError) as err:
        return {"ok": False, "error": {"status": 422, "detail": error_detail(err)}}
    except RecursionError:
        return {
            "ok": False,
            "error": {"status": 422, "detail": detail("requests", "request nested too deeply", "value_error")},
        }


@router.post(
    "/explore",
    responses=BAD_INPUT,
    response_model=ExploreOut,
    summary="Time vs message size for every algorithm on one call's groups",
    description="Places the named call as the plan does (every group at once) and prices each algorithm at each "
    "size (1 KiB to 4 GiB by default, plus the call's own size); auto shows the selector's pick per size.",
)
def explore_call(body: ExploreRequest, request: Request) -> dict:
    model, work, par, cluster, opts = plan_inputs(body.request, request.app.state.settings)
    sizes = [s for s in (body.sizes or []) if s >= 0] or None
    return explore(model, work, par, cluster, body.call, body.stage, sizes, opts)
