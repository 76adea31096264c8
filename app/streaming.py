"""NDJSON progress streams as POST /v1/search streams (CONTRACT.md): ``{"type": "progress", ...}`` lines while the
work runs, then one ``{"type": "result", ...}`` line, or ``{"type": "error", "status", "detail"}`` should the work
fail midway (everything refusable is refused before the first byte, as a plain 422). Used by POST
/v1/serve/search?stream=true.

The work runs under the request's deadline (COMMPLAN_DEADLINE_S), in a worker thread or, with
COMMPLAN_WORK_IN_PROCESS=1, in a process forked for it (app/runner.py); a client that disconnects stops it (the
domain's cooperative ``planner.deadline.check()`` in a thread, a kill in a process).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Callable

from fastapi import Request

from collectives import CollectiveError
from planner import SpecError
from planner.deadline import Deadline, DeadlineExceeded, bounded
from planner.search import Cancelled

from . import runner
from .errors import error_detail
from .threads import gate, in_thread

log = logging.getLogger("commplan")
POLL_S = 0.2


def line(data: dict) -> str:
    """One NDJSON line (compact, UTF-8, no NaN), newline included."""
    return json.dumps(data, ensure_ascii=False, allow_nan=False, separators=(",", ":")) + "\n"


def _guarded(work: Callable[[Callable[[str], None]], str]) -> Callable[[Callable[[str], None]], str]:
    def run(send: Callable[[str], None]) -> str:
        try:
            return work(send)
        except (SpecError, CollectiveError) as err:
            return line({"type": "error", "status": 422, "detail": error_detail(err)})

    return run


def _too_slow(settings) -> str:
    msg = f"the work ran past {settings.deadline_s:g} s (COMMPLAN_DEADLINE_S) and was stopped"
    return line({"type": "error", "status": 503, "detail": [{"loc": [], "msg": msg, "type": "deadline"}]})


async def ndjson(
    request: Request, work: Callable[[Callable[[str], None]], str], release: Callable[[], None]
) -> AsyncIterator[str]:
    """The lines of ``work(send)``: each ``send(line)`` is a progress line, the return value the last line.
    ``release`` (the work slot) is called once the stream ends, however it ends."""
    settings = request.app.state.settings
    deadline = Deadline(settings.deadline_s)
    work = _guarded(work)
    try:
        if settings.work_in_process:
            frames = runner.frames(work, deadline, request.is_disconnected, True)
            async with contextlib.aclosing(frames) as lines:
                async for _, text in lines:
                    yield text
        else:
            async for text in _threaded(request, work, deadline):
                yield text
    except Cancelled:
        log.info("%s (stream) cancelled: the client disconnected", request.url.path)
    except DeadlineExceeded:
        yield _too_slow(settings)
    finally:
        release()


async def _threaded(request: Request, work, deadline: Deadline) -> AsyncIterator[str]:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()

    def send(text: str) -> None:
        loop.call_soon_threadsafe(queue.put_nowait, text)

    def main() -> str:
        with bounded(deadline):
            return work(send)

    task = in_thread(main, gate=gate(request.app))
    try:
        while True:
            try:
                yield await asyncio.wait_for(queue.get(), timeout=POLL_S)
                continue
            except TimeoutError:
                pass
            if await request.is_disconnected():
                deadline.cancel("disconnected")
                raise Cancelled()
            if deadline.expired() and not task.done():
                deadline.cancel("deadline")  # the work's next planner.deadline.check() raises
                raise DeadlineExceeded("deadline")  # answered now, also for work still at the compute gate
            if task.done() and queue.empty():
                break
        yield task.result()
    finally:
        if not task.done():
            deadline.cancel("disconnected")
            task.cancel()  # still at the compute gate: it leaves the queue (a running thread stops at its next check)


__all__ = ["line", "ndjson"]
