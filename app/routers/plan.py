"""POST /v1/plan, /v1/plan/batch and /v1/plan/explore.

Each runs in a worker thread under the request's deadline (app/limits.run_bounded), after its work is
estimated and checked against the budget; the JSON answer is built in that thread too."""

from __future__ import annotations

import json
import logging
import time
from contextlib import contextmanager
from typing import NamedTuple

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response
from pydantic import ValidationError

from collectives import CollectiveError
from planner import SpecError
from planner.deadline import check as check_deadline
from planner.deadline import current as current_deadline
from planner.estimate import BatchWork
from planner.explore import DEFAULT_SIZES, explore
from planner.invariants import InvariantError

from ..body import OffLoopBody
from ..errors import BAD_INPUT, detail, error_detail, nested, relocated, validation_detail
from ..inputs import bounded_inputs, plan_of
from ..limits import encode, refuse, run_bounded
from ..schemas.plan import (
    BatchItem,
    BatchOut,
    BatchRequest,
    ExploreOut,
    ExploreRequest,
    PlanOut,
    PlanRequest,
    PlanSummaryOut,
)
from ..serialize import exploration_json, plan_item_json, plan_json

_log = logging.getLogger("commplan")
router = APIRouter(prefix="/v1/plan", tags=["plan"], route_class=OffLoopBody)
SUMMARY = Query(False, description="true: totals, step (without its timeline), memory, cluster and warnings; no calls")


@router.post(
    "",
    responses=BAD_INPUT,
    response_model=PlanOut | PlanSummaryOut,
    summary="Plan one configuration",
    description="Every primitive call of one iteration with its group, bytes, count, algorithm, placement "
    "and time. Bytes are integers (nccl-tests message convention), seconds floats, bandwidth "
    "GB/s = 1e9 B/s per direction; counts are per rank per iteration. `?summary=true`: the same answer "
    "without `calls` and the step's `timeline` (PlanSummaryOut; 1.7-6.4 KB instead of 31-293 KB, docs/CONTRACT.md).",
)
async def plan(body: PlanRequest, request: Request, summary: bool = SUMMARY) -> Response:
    settings = request.app.state.settings
    return await run_bounded(request, lambda: plan_json(plan_of(body, settings, summary=summary), summary))


@router.post(
    "/batch",
    responses=BAD_INPUT,
    response_model=BatchOut,
    summary="Plan many configurations",
    description="Results in request order; one bad request never fails the others. The batch is bounded by "
    "its total estimated work (COMMPLAN_MAX_BATCH_WORK) and its answer's size (COMMPLAN_MAX_RESPONSE_BYTES). "
    "`?summary=true`: each plan without `calls` and the step's `timeline`, as for POST /v1/plan.",
)
async def batch(body: BatchRequest, request: Request, summary: bool = SUMMARY) -> Response:
    settings = request.app.state.settings
    if len(body.requests) > settings.max_batch:
        raise SpecError(
            "requests", f"{len(body.requests)} requests; at most {settings.max_batch} per batch (COMMPLAN_MAX_BATCH)"
        )
    return await run_bounded(request, lambda: _batch(body.requests, settings, summary))


def _batch(items: list, settings, summary: bool = False) -> bytes:
    """Estimate every item first, refuse the batch if the total is over budget (planner.estimate.BatchWork: a price
    or contention pass the service memoises is charged to the first item that needs it), then plan them in order,
    stopping if the answer grows past its cap. Identical items (the same canonical JSON) are estimated and
    planned once: the plan is a pure function of the request, so each copy's answer is the first's bytes
    (1,000 identical small plans: docs/CONTRACT.md); the cache is the batch's own and ends with it."""
    total, seen, keys = BatchWork(), {}, []
    for i, item in enumerate(items):
        check_deadline()
        if not isinstance(item, dict):  # its error names its own index: not shared with a copy
            keys.append(_not_an_object(item, i))
            continue
        key = json.dumps(item, sort_keys=True, default=str)
        if key not in seen:
            seen[key] = _estimate(item, settings, summary)
        outcome = seen[key]
        if isinstance(outcome, _Checked):
            work = outcome.bounded[1]
            total.add(work, f"requests.{i} ({work.biggest})")
            refuse(total.total, settings.max_batch_work, "requests", "COMMPLAN_MAX_BATCH_WORK")
        keys.append(key)
    parts, size, answered = [], 0, {}
    clock = _Clock(current_deadline())
    for i, key in enumerate(keys):
        check_deadline()
        if isinstance(key, str) and key not in answered:
            outcome = seen[key]
            if not isinstance(outcome, _Checked):
                answered[key] = outcome
            elif clock.short(i):  # what is planned comes back; the rest is named, to be sent again
                answered[key] = _late(clock.stopped_at, len(items), clock.seconds)
            else:
                with clock.timing():
                    answered[key] = _one(outcome, settings, summary)
        part = answered[key] if isinstance(key, str) else key
        size += len(part) + 1
        if size > settings.max_response_bytes:
            raise SpecError(
                "requests",
                f"the answer passed {settings.max_response_bytes:,} bytes at request {i} of {len(items)} "
                "(COMMPLAN_MAX_RESPONSE_BYTES); send fewer or smaller plans per batch",
            )
        parts.append(part)
    return b'{"results":[' + b",".join(parts) + b"]}"


class _Clock:
    """The batch's own watch on its deadline: it stops starting plans while twice the slowest plan so far (and
    at least 0.5 s) is all the time left, so the plans done come back in time instead of the whole batch
    becoming one 503 (a 1,000-plan batch on a loaded machine: user5's pass, docs/CONTRACT.md)."""

    MARGIN_S = 0.5

    def __init__(self, deadline):
        self.deadline, self.slowest, self.stopped_at = deadline, 0.0, None
        self.seconds = deadline.seconds if deadline is not None else 0.0

    def short(self, i: int) -> bool:
        """Whether request i should not be started; the first such i is kept (``stopped_at``): from it on, no
        plan is started."""
        left = self.deadline.expires - time.monotonic() if self.deadline is not None else float("inf")
        if self.stopped_at is None and left < max(2 * self.slowest, self.MARGIN_S):
            self.stopped_at = i
        return self.stopped_at is not None

    @contextmanager
    def timing(self):
        start = time.monotonic()
        try:
            yield
        finally:
            self.slowest = max(self.slowest, time.monotonic() - start)


def _late(first: int, n: int, seconds: float) -> bytes:
    """The item of a request the batch had no time left to plan (it stopped at requests[first]): a 503 of its own,
    naming the deadline and where to resend from."""
    message = (
        f"not planned: the batch's deadline of {seconds:g} s (COMMPLAN_DEADLINE_S) was near at request {first} of "
        f"{n}; the items before it are answered; send it and the rest again"
    )
    item = {"ok": False, "error": {"status": 503, "detail": detail("requests", message, "deadline")}}
    return encode(item, BatchItem)


def _not_an_object(item, i: int) -> bytes:
    """The error item of requests[i] when it is JSON null, an array, a string, a boolean or a number."""
    kind = (
        "null" if item is None else {list: "an array", str: "a string", bool: "a boolean"}.get(type(item), "a number")
    )
    return _failed(detail("", f"requests[{i}] is {kind}; each request is an object, as for POST /v1/plan", "dict_type"))


class _Checked(NamedTuple):
    """A batch item validated (once: _one plans this request, it does not validate the item again) and estimated."""

    request: PlanRequest
    bounded: tuple  # bounded_inputs': (the planner inputs, their estimate)


def _estimate(item: dict, settings, summary: bool = False) -> _Checked | bytes:
    """The item validated with its planner inputs and estimate, or its error item when it is invalid or over the
    single-plan budget; ``summary``: without the step's timeline (app.inputs.bounded_inputs)."""
    try:
        request = PlanRequest.model_validate(item)
        return _Checked(request, bounded_inputs(request, settings, summary=summary))
    except ValidationError as err:
        return _failed(validation_detail(err, ("body",)))
    except (SpecError, CollectiveError) as err:
        return _failed(error_detail(err))
    except RecursionError:
        return _failed(detail("requests", "request nested too deeply", "value_error"))


def _one(checked: _Checked, settings, summary: bool = False) -> bytes:
    try:
        plan = plan_of(checked.request, settings, checked.bounded)
    except (SpecError, CollectiveError) as err:
        return _failed(error_detail(err))
    except InvariantError as err:  # a bug: logged, and a 500 of this item's own; the batch's other items answer
        _log.exception("invariant broken in a batch item")
        message = f"internal error (logged): the plan broke its own invariant {err.where}: {err.rule}"
        return encode({"ok": False, "error": {"status": 500, "detail": detail("", message, "internal")}}, BatchItem)
    return plan_item_json(plan, summary)


def _failed(errors: list[dict]) -> bytes:
    return encode({"ok": False, "error": {"status": 422, "detail": errors}}, BatchItem)


@router.post(
    "/explore",
    responses=BAD_INPUT,
    response_model=ExploreOut,
    summary="Time vs message size for every algorithm on one call's groups",
    description="Places the named call as the plan does (every group at once) and prices each algorithm at each "
    "size (1 KiB to 4 GiB by default, plus the call's own size); auto shows the selector's pick per size.",
)
async def explore_call(body: ExploreRequest, request: Request) -> Response:
    settings = request.app.state.settings

    def work() -> bytes:
        sizes = [s for s in (body.sizes or []) if s >= 0] or None
        count = len(sizes or DEFAULT_SIZES) + 1
        with nested("request."):  # the plan request is the body's `request` block
            inputs, _ = bounded_inputs(body.request, settings, call=body.call, stage=body.stage, sizes=count)
            with relocated("options."):  # as for the plan
                exploration = explore(*inputs[:4], body.call, body.stage, sizes, inputs[4])
        return exploration_json(exploration)

    return await run_bounded(request, work)
