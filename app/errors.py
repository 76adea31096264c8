"""Bad input is a 422 in FastAPI's shape, naming the field and the rule; nothing becomes a 500.

Every error body is built here, and always encodes: strings are made valid UTF-8 (a lone surrogate such
as "\\ud800" in a key is written as the text \\ud800), numbers JSON lacks are written as text, and the
offending input is not echoed back whole (FastAPI's default ``input`` field is dropped): a schema rule's message
says the value it got instead, short (``got``: a number or a short string as sent, a long string, a list or an
object by its size).
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache, lru_cache

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException

from collectives import CollectiveError
from planner import SpecError
from planner._errors import got  # the value a rule refused, as a message says it (one home)
from planner.deadline import DeadlineExceeded
from planner.search import Cancelled

from .limits import Busy

log = logging.getLogger("commplan")
CLIENT_CLOSED = 499  # nginx's "client closed request": the status an access log shows for a cancelled search


def safe(value):
    """``value`` with every string valid UTF-8 and every float finite or text: always JSON-encodable."""
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, bool) or value is None or isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, dict):
        return {safe(str(k)): safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [safe(v) for v in value]
    return safe(str(value))


# a field named from the query string or the path (``query.stage``) is placed there, not in the body
PLACES = ("query", "path")


def detail(field: str, message: str, kind: str) -> list[dict]:
    parts = [part for part in field.split(".") if part]
    loc = parts if parts and parts[0] in PLACES else ["body", *parts]
    return [{"loc": loc, "msg": safe(message), "type": kind}]


def error_detail(err: Exception) -> list[dict]:
    """The 422 detail of a SpecError, or of a CollectiveError no route placed in the request (``relocated``)."""
    if isinstance(err, SpecError):
        return detail(err.field, err.rule, "value_error.spec")
    if isinstance(err, CollectiveError):
        return detail(err.field, err.rule, "value_error.collective")
    raise TypeError(err)


# An error per wrong item: 131,072 strings in `devices` (655 kB) were a 12 MB answer and 3.6 s of the event
# loop, most of it here; the first few name the rule, the count says the rest.
MAX_LISTED_ERRORS = 50


# pydantic's messages that already state what they got (a validator's own "got ..."; a list's length rule counts
# the items), or concern the key, not the value (a missing field's input is the whole enclosing object; an unknown
# field is wrong by its name; FastAPI's unreadable JSON has an empty object as its input, not the text)
STATES_ITS_INPUT = frozenset(
    {"value_error", "assertion_error", "missing", "extra_forbidden", "too_many_errors", "too_short", "too_long"}
    | {"json_invalid"}
)


def stated(e: dict) -> str:
    """pydantic's message with the value it refused (its ``input``), unless the message states it already. JSON that
    does not decode says the decoder's reason and where (it read "JSON decode error" alone, at loc ["body", 485]);
    a missing body says so (it read "Field required" at loc ["body"])."""
    if e["type"] == "json_invalid" and isinstance(e.get("ctx"), dict) and len(e["loc"]) == 2:
        return f"{e['msg']}: {e['ctx'].get('error')} at character {e['loc'][1]:,} of the body"
    if e["type"] == "missing" and tuple(e["loc"]) == ("body",):
        return f"{e['msg']}: the body is empty; this endpoint takes a JSON object (its schema and examples: /docs)"
    msg = re.sub(r" or instance of [A-Za-z]+", " (a JSON object)", e["msg"])  # not the schema's class name
    if e["type"] in STATES_ITS_INPUT or "input" not in e:
        return msg
    return f"{msg}, got {got(e['input'])}"


# pydantic names the member of a union each error came from inside its loc: a model by its class name
# (["cluster", "gpu", "GPUIn", "peak_tflops", "bf16"]), another by its core schema's tag ("str", "constrained-int",
# "list[constrained-int]", "literal['none','full']", "function-after[...]"); and it lists every member's error, so
# a GPU object with one bad number was also "cluster.gpu.str: Input should be a valid string" (round 13, hostile13)
_CORE_TAG = re.compile(r"(str|int|float|bool|bytes|none|constrained-[a-z]+|[a-z][a-z-]*\[.*\])\Z", re.S)


@cache
def _model_names() -> frozenset[str]:
    """The request schemas' class names (app/schemas), as pydantic tags a union's model member."""
    found, todo = set(), [BaseModel]
    while todo:
        for sub in todo.pop().__subclasses__():
            todo.append(sub)
            if sub.__module__.startswith("app."):
                found.add(sub.__name__)
    return frozenset(found)


@lru_cache(maxsize=4096)
def _is_tag(part: str) -> bool:
    return _CORE_TAG.match(part) is not None or part in _model_names()


def _tag_at(loc) -> int | None:
    for i, part in enumerate(loc):
        if type(part) is str and _is_tag(part):
            return i
    return None


def untagged(errors: list[dict]) -> list[dict]:
    """Pydantic's errors with the union members out of every loc, so that loc is the request's field: of a union's
    members, those that took the value's shape (their errors lie deeper: the GPU object's field) or refused only its
    value (an integer over its bound, not a list) speak; where every member refused the value's type, one error at
    the field names each shape ("Input should be a valid string or a valid dictionary (a JSON object)")."""
    if not any(_tag_at(e["loc"]) is not None for e in errors):  # no union among them (131,072 errors: 0.1 s)
        return errors
    return [e for _, e in _untag(list(enumerate(errors)))]


def _untag(errors: list[tuple[int, dict]]) -> list[tuple[int, dict]]:
    kept, unions = [], {}
    for order, e in errors:
        k = _tag_at(e["loc"])
        if k is None:
            kept.append((order, e))
        else:
            unions.setdefault(tuple(e["loc"][:k]), {}).setdefault(e["loc"][k], []).append((order, e))
    for prefix, members in unions.items():  # each pass takes one tag out: a member may hold a deeper union
        kept += _untag(_resolved(prefix, members))
    return sorted(kept, key=lambda pair: pair[0])


def _resolved(prefix: tuple, members: dict[str, list]) -> list[tuple[int, dict]]:
    n = len(prefix)
    deeper = [m for m in members.values() if any(len(e["loc"]) > n + 1 for _, e in m)]
    valued = [m for m in members.values() if any(not e["type"].endswith("_type") for _, e in m)]
    if deeper or valued:
        return [(order, e | {"loc": (*prefix, *e["loc"][n + 1 :])}) for m in deeper or valued for order, e in m]
    firsts = [m[0] for m in members.values()]
    shapes = dict.fromkeys(e["msg"].removeprefix("Input should be ") for _, e in firsts)
    order, first = firsts[0]
    return [(order, first | {"loc": prefix, "msg": "Input should be " + " or ".join(shapes)})]


def validation_detail(err: ValidationError | RequestValidationError, root: tuple = ()) -> list[dict]:
    """Pydantic's errors as loc / msg / type only, made encodable (``root`` prefixes loc), each union's members
    resolved (``untagged``); at most MAX_LISTED_ERRORS of them, then one entry counting the others."""
    errors = untagged(err.errors(include_url=False) if isinstance(err, ValidationError) else err.errors())
    listed = [
        {"loc": safe([*root, *e["loc"]]), "msg": safe(stated(e)), "type": safe(e["type"])}
        for e in errors[:MAX_LISTED_ERRORS]
    ]
    if len(errors) > MAX_LISTED_ERRORS:
        more = len(errors) - MAX_LISTED_ERRORS
        msg = f"{more:,} more errors not listed ({len(errors):,} in all; the first {MAX_LISTED_ERRORS} are above)"
        listed.append({"loc": ["body"], "msg": msg, "type": "too_many_errors"})
    return listed


def relocate(err: CollectiveError, where: str = "", fields: dict[str, str] | None = None) -> SpecError:
    """The one place a collectives field becomes a request field: ``fields`` renames it (the price endpoint's
    ``count`` is its ``message_bytes``); ``where`` places it, under that block when it ends with a dot
    (``options.``), else as that field itself (``cluster.preset``: the whole preset is at fault)."""
    name = (fields or {}).get(err.field, err.field)
    return SpecError(where + name if where.endswith(".") or not where else where, err.rule)


@contextmanager
def relocated(where: str = "", fields: dict[str, str] | None = None) -> Iterator[None]:
    """Inside, a CollectiveError is raised again as the SpecError naming the request's field (``relocate``)."""
    try:
        yield
    except CollectiveError as err:
        raise relocate(err, where, fields) from None


PLAN_BLOCKS = ("model", "workload", "parallel", "cluster", "options")  # a plan request's blocks


@contextmanager
def nested(block: str) -> Iterator[None]:
    """Inside, the plan request sits under ``block`` of the body (explore's ``request.``): an error naming one
    of the plan's blocks names it there; other fields (the explorer's own ``call``) stay where they are."""
    try:
        yield
    except SpecError as err:
        if err.field.split(".")[0] not in PLAN_BLOCKS:
            raise
        raise SpecError(block + err.field, err.rule) from None


class ErrorList(BaseModel):
    """FastAPI's error shape: one entry per problem, loc the path of the field in the body."""

    detail: list[dict]


BAD_INPUT = {
    413: {"model": ErrorList, "description": "Body over COMMPLAN_MAX_BODY_BYTES"},
    422: {"model": ErrorList, "description": "Invalid input, or work over a budget: msg names the rule and numbers"},
    503: {"model": ErrorList, "description": "Busy (Retry-After) or past the deadline COMMPLAN_DEADLINE_S"},
}


def _unavailable(msg: str, kind: str, retry: bool) -> JSONResponse:
    headers = {"Retry-After": "1"} if retry else None
    return JSONResponse(status_code=503, content={"detail": [{"loc": [], "msg": msg, "type": kind}]}, headers=headers)


def install(app: FastAPI) -> None:
    @app.exception_handler(HTTPException)
    async def unreadable_body(request: Request, err: HTTPException):
        # FastAPI answers a body it cannot decode with a bare 400; bad input is a 422 here, always.
        if err.status_code == 400:
            return JSONResponse(
                status_code=422,
                content={
                    "detail": detail(
                        "", "the body could not be read as JSON (not UTF-8, or nested too deeply)", "json_invalid"
                    )[:1]
                },
            )
        return await http_exception_handler(request, err)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, err: RequestValidationError):
        return JSONResponse(status_code=422, content={"detail": validation_detail(err)})

    @app.exception_handler(SpecError)
    async def spec_error(_: Request, err: SpecError):
        return JSONResponse(status_code=422, content={"detail": error_detail(err)})

    @app.exception_handler(CollectiveError)
    async def collective_error(_: Request, err: CollectiveError):
        return JSONResponse(status_code=422, content={"detail": error_detail(err)})

    @app.exception_handler(DeadlineExceeded)
    async def too_slow(request: Request, err: DeadlineExceeded):
        limit = request.app.state.settings.deadline_s
        return _unavailable(f"the work ran past {limit:g} s (COMMPLAN_DEADLINE_S) and was stopped", "deadline", False)

    @app.exception_handler(Busy)
    async def busy(request: Request, _: Busy):
        s = request.app.state.settings
        msg = f"all {s.work_slots} work slots stayed busy for {s.queue_s:g} s (COMMPLAN_WORK_SLOTS); retry"
        return _unavailable(msg, "busy", True)

    @app.exception_handler(Cancelled)
    async def cancelled(request: Request, _: Cancelled):
        # the client went away and its work was stopped: nobody reads this answer; it is logged as what it is
        log.info("%s %s cancelled: the client disconnected", request.method, request.url.path)
        return Response(status_code=CLIENT_CLOSED)

    @app.exception_handler(RecursionError)
    async def too_deep(_: Request, err: RecursionError):
        return JSONResponse(status_code=422, content={"detail": detail("", "the body is nested too deeply", "json")})


class SafetyNet:
    """Outermost ASGI middleware: an exception no handler took becomes a logged 500 JSON answer here, so the
    connection stays open (Starlette's ServerErrorMiddleware re-raises, and uvicorn then closes the
    keep-alive connection, failing the next request a client sends on it)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def watch(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, watch)
        except Exception:
            log.exception("unhandled error on %s %s", scope.get("method"), scope.get("path"))
            if started:
                raise
            body = json.dumps({"detail": [{"loc": [], "msg": "internal error (logged)", "type": "internal"}]})
            await send(
                {
                    "type": "http.response.start",
                    "status": 500,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))],
                }
            )
            await send({"type": "http.response.body", "body": body.encode()})
