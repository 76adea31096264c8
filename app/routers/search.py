"""POST /v1/search: the fastest layouts that fit, as one JSON body or streamed as NDJSON progress lines.

The search runs in a worker thread (and, when long, on worker processes); the request task polls the
client and a disconnect cancels the search. Everything that can be refused is refused before the first
byte (bad input, a space over the size limit), so a stream only ever ends in a result or, should the
planner fail midway, an error line.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import threading

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from collectives import CollectiveError
from planner import SpecError
from planner.deadline import Deadline
from planner.search import Cancelled, Problem, SearchResult, search, space_of

from .. import runner
from ..body import OffLoopBody
from ..errors import BAD_INPUT, error_detail, relocated
from ..inputs import problem_of
from ..limits import acquire_slot
from ..schemas.search import SearchOut, SearchRequest
from ..serialize import progress_line, search_dict
from ..threads import gate, in_thread

router = APIRouter(prefix="/v1/search", tags=["search"], route_class=OffLoopBody)
log = logging.getLogger("commplan")
NDJSON = "application/x-ndjson"
# the answers of a route that can stream: its JSON body, or NDJSON progress lines (/v1/search, /v1/serve/search)
STREAMED = BAD_INPUT | {200: {"content": {NDJSON: {}}, "description": "with ?stream=true: NDJSON progress"}}
POLL_S = 0.2


def max_layouts(settings) -> int:
    """COMMPLAN_MAX_SEARCH_LAYOUTS, read with the other settings (app/settings.py)."""
    return settings.max_search_layouts


def check_size(problem: Problem, limit: int) -> int:
    """Before the first byte: the space's size rules (planner/search/space.py ``Space.checked_size``)."""
    return space_of(problem).checked_size(limit)


def wants_stream(request: Request, stream: bool) -> bool:
    return stream or NDJSON in request.headers.get("accept", "")


@router.post(
    "",
    responses=STREAMED,
    response_model=SearchOut,
    summary="Find the fastest layouts that fit",
    description="Enumerates every valid layout (tp, cp, pp, virtual stages, dp, ep, expert tp, ZeRO stage, "
    "sequence parallelism, micro-batch size, recompute, framework) under the constraints, drops what does not "
    "fit, ranks by step time. `?stream=true` or `Accept: application/x-ndjson` streams progress lines "
    '`{"type": "progress", "done", "total", "evaluated", "feasible", "best"}` then `{"type": "result", ...}`.',
)
async def search_layouts(body: SearchRequest, request: Request, stream: bool = False):
    settings = request.app.state.settings
    problem = problem_of(body, settings)
    await in_thread(check_size, problem, max_layouts(settings))
    cancel = threading.Event()
    # A search keeps every core busy with worker processes: it holds one of the service's work slots
    # (app/limits.py) like any heavy request, so concurrent searches queue instead of multiplying the pools.
    release = await acquire_slot(request)
    if settings.work_in_process:  # the search and its answer's encoding in a process of their own (app/runner.py)
        if wants_stream(request, stream):
            return StreamingResponse(_stream_forked(problem, request, settings, release), media_type=NDJSON)
        try:
            limit = max_layouts(settings)
            answer = await runner.run(lambda: _encoded(problem, limit), unbounded(), request.is_disconnected)
            return Response(answer, media_type="application/json")
        finally:
            release()
    if wants_stream(request, stream):
        return StreamingResponse(_stream(problem, request, cancel, settings, release), media_type=NDJSON)
    # the answer is encoded in the thread too: a top_k of 1,000 is a 13 MB body, whose encoding on the event
    # loop held /healthz for 0.85 s (issue 26)
    task = in_thread(_encoded, problem, max_layouts(settings), cancel, gate=gate(request.app))
    try:
        while not task.done():
            await asyncio.wait({task}, timeout=POLL_S)
            if not task.done() and await request.is_disconnected():
                cancel.set()
        return Response(task.result(), media_type="application/json")
    finally:
        cancel.set()
        task.cancel()  # a no-op once its thread has run; else it leaves the compute gate's queue
        if not wants_stream(request, stream):
            release()


def unbounded() -> Deadline:  # a search has no deadline of its own (its size bounds it)
    return Deadline(math.inf)


def _line(data: dict) -> str:
    """One JSON text as Starlette's JSONResponse writes it (compact, UTF-8, no NaN)."""
    return json.dumps(data, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def _body(result: SearchResult) -> str:
    """``_line(search_dict(result))``, encoded a result at a time: the C encoder holds the GIL for a whole
    call, and one call over a top_k of 1,000 (18 MB) held it, and so /healthz, for a second or more."""
    data = search_dict(result)
    head = _line({**data, "results": []})
    assert head.endswith('"results":[]}')  # results is the last key (search_dict)
    return head[:-3] + "[" + ",".join(_line(item) for item in data["results"]) + "]}"


def _encoded(problem: Problem, limit: int, cancel: threading.Event | None = None) -> bytes:
    """Off the event loop (a worker thread, or the search's own process): the search and its JSON body."""
    return _body(_run(problem, cancel or threading.Event(), None, limit)).encode()


async def _stream_forked(problem: Problem, request: Request, settings, release):
    """The NDJSON lines, each encoded in the search's process; a disconnect kills it (and its workers)."""
    limit = max_layouts(settings)

    def work(send) -> str:
        def progress(state: dict) -> None:
            send(json.dumps({"type": "progress", **progress_line(state)}) + "\n")

        try:
            return _result_line(_run(problem, threading.Event(), progress, limit))
        except (SpecError, CollectiveError) as err:
            return json.dumps({"type": "error", "status": 422, "detail": error_detail(err)}) + "\n"

    try:
        async with contextlib.aclosing(runner.frames(work, unbounded(), request.is_disconnected, True)) as lines:
            async for _, line in lines:
                yield line
    except Cancelled:
        log.info("POST /v1/search (stream) cancelled: the client disconnected")
    finally:
        release()


def _run(problem: Problem, cancel: threading.Event, progress, limit: int) -> SearchResult:
    with relocated("cluster."):  # a cluster the search's pricing cannot run on
        return search(problem, progress=progress, cancelled=cancel.is_set, max_layouts=limit)


def _result_line(result: SearchResult) -> str:
    """The stream's last line, encoded off the event loop (a worker thread or the search's process: megabytes)."""
    return '{"type":"result",' + _body(result)[1:] + "\n"


async def _stream(problem: Problem, request: Request, cancel: threading.Event, settings, release):
    loop = asyncio.get_running_loop()
    lines: asyncio.Queue = asyncio.Queue()

    def progress(state: dict) -> None:
        loop.call_soon_threadsafe(lines.put_nowait, {"type": "progress", **progress_line(state)})

    task = in_thread(_run, problem, cancel, progress, max_layouts(settings), gate=gate(request.app))
    try:
        while True:
            try:
                line = await asyncio.wait_for(lines.get(), timeout=POLL_S)
                yield json.dumps(line) + "\n"
                continue
            except TimeoutError:
                pass
            if await request.is_disconnected():
                cancel.set()
                return
            if task.done() and lines.empty():
                break
        try:
            yield await in_thread(lambda: _result_line(task.result()), gate=gate(request.app))
        except (SpecError, CollectiveError) as err:
            yield json.dumps({"type": "error", "status": 422, "detail": error_detail(err)}) + "\n"
        except Cancelled:
            return
    finally:
        cancel.set()  # the client went away (the generator is closed) or the search ended: stop the workers
        task.cancel()  # still at the compute gate: it leaves the queue (a no-op once its thread has run)
        release()


__all__ = ["router"]
