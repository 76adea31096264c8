"""Everything that keeps one request from taking the service down (docs/hardening.md):

- :class:`BodyLimit` refuses bodies over ``max_body_bytes`` (413), bodies that trickle in slower than
  ``body_timeout_s`` (408), and numbers JSON does not have (NaN, Infinity, 1e309: 422) before any parsing;
- :class:`GuardedH11` is uvicorn's HTTP/1.1 protocol with a header deadline (a slow-loris connection that
  never finishes its request line and headers is closed after ``header_timeout_s``);
- the work a request asks for is estimated by planner/estimate.py from the plan's own set-up;
  :func:`check_router` and :func:`refuse` answer 422 naming the estimate and the budget (setting);
- :func:`run_bounded` runs the work in a worker thread under a deadline, with a bounded number of requests
  computing at once, stops it when the client disconnects, and serialises the answer off the event loop.

``max_work`` = 2^27 units is about 2 s and at most a few hundred MiB (planner/estimate.py: what a unit is).
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import logging
import sys
import threading
from collections.abc import Callable

import anyio
from fastapi import Request
from fastapi.responses import Response
from uvicorn.protocols.http.h11_impl import H11Protocol

from collectives.topology.networks import network_type
from planner import SpecError
from planner.deadline import Deadline, DeadlineExceeded, bounded
from planner.estimate import Estimate
from planner.search import Cancelled
from planner.words import human_bytes

from . import runner
from .settings import Settings
from .threads import gate, in_thread

log = logging.getLogger("commplan")


# ---- the budget ----------------------------------------------------------------------------------------


def check_router(cluster, limit: int) -> None:
    """422 when building the network's routing (its plug-in's ``work``, planner.estimate.network_work) is
    over ``limit``: a torus / dragonfly / hypercube is routed by a search from every router."""
    network = network_type(cluster.network.topology)
    if network.work(cluster) > limit:
        raise SpecError(
            "cluster.num_nodes",
            f"{network.work_rule(cluster)}, over the budget of {limit:,} (COMMPLAN_MAX_ROUTER_PAIRS: a torus of "
            f"{int(limit**0.5):,} routers)",
        )


def refuse(est: Estimate, limit: int, where: str, setting: str = "COMMPLAN_MAX_WORK") -> None:
    """422 when ``est`` is over ``limit``: the estimate, the biggest part and the budget."""
    if est.units > limit:
        raise SpecError(
            where,
            f"estimated work {est.units:,} units is over this service's budget of {limit:,} ({setting}); "
            f"the largest part: {est.biggest}, {est.biggest_units:,} units (docs/hardening.md says how work "
            "is estimated: fewer ranks per group, contention 'neighbourhood' or candidates 'library' cost less)",
        )


# ---- running work: a bounded number at once, a deadline, cancellation on disconnect ---------------------


class Busy(Exception):
    """No work slot came free within ``queue_s``: a 503 with Retry-After."""


def _raise_in(thread_id: int, exc: type[BaseException]) -> None:
    """Raise ``exc`` in another Python thread at its next bytecode (CPython's PyThreadState_SetAsyncExc)."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), ctypes.py_object(exc))


class _Stop(DeadlineExceeded):
    """Raised asynchronously in the worker; carries no arguments (the API takes a class)."""


def limiter(request: Request) -> anyio.CapacityLimiter:
    state = request.app.state
    if getattr(state, "work_limiter", None) is None:
        state.work_limiter = anyio.CapacityLimiter(state.settings.work_slots)
    return state.work_limiter


async def acquire_slot(request: Request) -> Callable[[], None]:
    """One of the ``work_slots``, waiting at most ``queue_s`` (else Busy, a 503). Returns its release, which
    any task may call once (a streamed answer releases from the task that streams it)."""
    slots, borrower = limiter(request), object()
    with anyio.move_on_after(request.app.state.settings.queue_s) as waited:
        await slots.acquire_on_behalf_of(borrower)
    if waited.cancelled_caught:
        raise Busy()
    return lambda: slots.release_on_behalf_of(borrower)


async def run_bounded(request: Request, work: Callable[[], bytes]) -> Response:
    """Run ``work`` (returns the JSON body) off the event loop (:func:`run_value`) and answer its bytes."""
    return Response(await run_value(request, work), media_type="application/json")


async def run_value(request: Request, work: Callable[[], object]) -> object:
    """``work()``'s value, computed off the event loop: at most ``work_slots`` at once, waiting at most
    ``queue_s`` for a slot; stopped at ``deadline_s`` or as soon as the client disconnects. In a process
    forked for it (app/runner.py; COMMPLAN_WORK_IN_PROCESS=1), else (the default) in a worker thread."""
    settings = request.app.state.settings
    release = await acquire_slot(request)
    try:
        deadline = Deadline(settings.deadline_s)
        if settings.work_in_process:
            try:
                return await runner.run(work, deadline, request.is_disconnected, gate(request.app))
            except Cancelled:
                raise DeadlineExceeded("disconnected") from None
        box = await _supervise(request, deadline, work)
    finally:
        release()
    error = box.get("error")
    # a stop raised while C code ran Python (pydantic's serializer) comes back wrapped in that code's error
    stopped = deadline.cancelled and error is not None
    if isinstance(error, DeadlineExceeded) or stopped or (error is None and "body" not in box):
        raise DeadlineExceeded(deadline.reason or "deadline")
    if error is not None:
        raise error
    return box["body"]


async def _supervise(request: Request, deadline: Deadline, work: Callable[[], bytes]) -> dict:
    """Start the worker thread once the compute gate lets it (app/threads.py) and watch it every 20 ms: stop it
    when the deadline passes or the client has gone (a cooperative flag for planner.deadline.check(), and an
    exception raised in the thread; a request still waiting at the gate leaves the queue)."""
    box: dict = {}
    lock = threading.Lock()

    def main() -> None:
        with lock:
            box["running"], box["ident"] = True, threading.get_ident()
        try:
            with bounded(deadline):
                box["body"] = work()
        except BaseException as err:  # handed to the event loop
            box["error"] = err
        finally:
            with lock:
                box["running"] = False

    # a stop that lands after the work ended (between the finally's lines) is the thread's exception, which the
    # future carries and nobody reads: box then holds the body or the error
    finished = in_thread(main, gate=gate(request.app))
    stopped = False
    while not finished.done():
        await asyncio.wait([finished], timeout=0.02)
        if not (finished.done() or stopped):
            stopped = await _stop_if_due(request, deadline, box, lock, finished)
    if not finished.cancelled():
        finished.exception()  # read: a stop that landed after the work ended is not logged as never retrieved
    return box


async def _stop_if_due(request: Request, deadline: Deadline, box: dict, lock: threading.Lock, finished) -> bool:
    """Cancel ``deadline`` when the client has gone or its time is up, then stop the work: an exception raised in
    its running thread, or the future cancelled while it still waits at the gate. True once stopped."""
    if await request.is_disconnected():
        deadline.cancel("disconnected")
    elif deadline.expired():
        deadline.cancel("deadline")
    if not deadline.cancelled:
        return False
    with lock:
        if box.get("running"):
            _raise_in(box["ident"], _Stop)
        elif "ident" not in box:  # still at the gate: it never starts (or stops at its first check)
            finished.cancel()
    return True


def encode(payload, model=None) -> bytes:
    """JSON bytes of ``payload`` validated against the response ``model`` (as FastAPI would), off the loop."""
    if model is not None:
        return model.model_validate(payload).model_dump_json().encode()
    return json.dumps(payload, allow_nan=False, separators=(",", ":")).encode()


# ---- the body: size, time, numbers ------------------------------------------------------------------------

# A cheap pre-filter, run on the event loop for every body: only a body with one of these can hold a non-finite
# number (NaN, Infinity, or a literal that overflows a double: an exponent of 3+ digits, or 309+ integer digits
# with a fraction). Substring searches over the body with every digit written 0 and E written e: the regular
# expression rb"NaN|Infinity|[eE][+-]?\d{3,}|\d{309,}" it replaces (the same answer on every body) took 12.8 ms
# of CPU on a calibrate at its row limit (199 kB of log text), held the loop that long, and this takes 1.2 ms.
_FOLD = bytes.maketrans(b"0123456789E", b"0000000000e")
_FOLDED_SUSPECTS = (b"e000", b"e+000", b"e-000", b"0" * 309)


def _suspect(body: bytes) -> bool:
    if b"NaN" in body or b"Infinity" in body:
        return True
    folded = body.translate(_FOLD)
    return any(s in folded for s in _FOLDED_SUSPECTS)


class _NonFinite(ValueError):
    pass


class _Long:
    """An integer literal longer than Python converts: kept as its digit count so that its field can be named."""

    def __init__(self, digits: int):
        self.digits = digits


def _constant(name: str):
    raise _NonFinite(name)


def _float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise _NonFinite(text if len(text) <= 32 else text[:29] + "...")
    return value


def _int(text: str) -> int | _Long:
    # CPython 3.11+ converts at most sys.get_int_max_str_digits() (4,300 by default) digits to an int (CVE-2020-10735):
    # json.loads raises a bare ValueError past it, which FastAPI answered as a body that is not JSON (hostile15)
    digits, limit = len(text.lstrip("-")), sys.get_int_max_str_digits()
    return _Long(digits) if 0 < limit < digits else int(text)


def _long_at(value, loc: list) -> tuple[list, int] | None:
    """Where the first _Long of a decoded body is, and its digits."""
    if isinstance(value, _Long):
        return loc, value.digits
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        found = _long_at(item, [*loc, key])
        if found is not None:
            return found
    return None


def _unreadable(body: bytes) -> _NonFinite | tuple[list, int] | None:
    """The first non-finite literal, or where the first integer too long to convert is; None if neither."""
    if not _suspect(body):
        return None
    # a Python call per integer, and the walk, only where one may be too long: 800,000 integers (12.6 MB) cost 0.14 s
    # more to decode and 0.1 s to walk; the fold to tell costs 15 ms of that body (measured, load 10)
    limit = sys.get_int_max_str_digits()
    ints = _int if limit > 0 and b"0" * (limit + 1) in body.translate(_FOLD) else None
    try:
        value = json.loads(body, parse_constant=_constant, parse_float=_float, parse_int=ints)
        return _long_at(value, ["body"]) if ints else None
    except _NonFinite as err:
        return err
    except (ValueError, RecursionError):  # not JSON at all: FastAPI answers that itself
        return None


def unreadable_number(body: bytes) -> tuple[list, str] | None:
    """(where, why) for the first number in ``body`` JSON does not have (NaN, Infinity), a double cannot hold
    (1e309) or Python does not convert (an integer of more than 4,300 digits), else None: the service's 422 and
    the CLI's exit 2 (app/cli.py, app/search_cli.py) say the same."""
    bad = _unreadable(body)
    if bad is None:
        return None
    if isinstance(bad, _NonFinite):
        why = "RFC 8259 has no NaN or Infinity; a double overflows above 1.8e308"
        return ["body"], f"{bad} is not a JSON number ({why})"
    return _too_long(*bad)


def _too_long(loc: list, digits: int) -> tuple[list, str]:
    limit = sys.get_int_max_str_digits()
    return loc, f"an integer of {digits:,} digits, longer than the {limit:,} Python converts (sys.int_info)"


def unreadable_yaml(text: str) -> tuple[list, str] | None:
    """(where, why) for the first integer in YAML ``text`` longer than Python converts, else None: PyYAML's int
    constructor raises Python's bare ValueError past sys.get_int_max_str_digits, where JSON's path names the field
    (unreadable_number; review r15c #5). Read again with a SafeLoader whose ints past the limit are kept as _Long."""
    import yaml  # pyyaml: only needed for YAML specs

    class Loader(yaml.SafeLoader):
        def construct_yaml_int(self, node):
            digits = len(node.value.replace("_", "").lstrip("+-"))
            if node.value.lstrip("+-")[:1].isdigit() and 0 < sys.get_int_max_str_digits() < digits:
                return _Long(digits)
            return super().construct_yaml_int(node)

    Loader.add_constructor("tag:yaml.org,2002:int", Loader.construct_yaml_int)
    try:
        found = _long_at(yaml.load(text, Loader=Loader), ["body"])
    except (yaml.YAMLError, ValueError, RecursionError):
        return None
    return None if found is None else _too_long(*found)


def non_finite_rule(body: bytes) -> str | None:
    """Why ``body`` is refused (``unreadable_number``), else None."""
    bad = unreadable_number(body)
    return None if bad is None else bad[1]


def non_finite(body: bytes) -> str | None:
    """The first number in ``body`` that JSON (RFC 8259) does not have or a double cannot hold, else None."""
    bad = _unreadable(body)
    return str(bad) if isinstance(bad, _NonFinite) else None


def _error(status: int, loc: list, msg: str, kind: str) -> bytes:
    return json.dumps({"detail": [{"loc": loc, "msg": msg, "type": kind}]}).encode()


class BodyLimit:
    """Pure ASGI: buffers at most ``max_bytes`` of the body (Content-Length checked first), within
    ``timeout_s``, refuses non-finite numbers, then replays the body to the app."""

    def __init__(self, app, max_bytes: int, timeout_s: float = 10.0):
        self.app, self.max_bytes, self.timeout_s = app, max_bytes, timeout_s

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            return await self._refuse(send, 413, self._too_large())
        chunks, size, more = [], 0, True
        with anyio.move_on_after(self.timeout_s) as reading:
            while more:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return None
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > self.max_bytes:
                    return await self._refuse(send, 413, self._too_large())
                chunks.append(chunk)
                more = message.get("more_body", False)
        if reading.cancelled_caught:
            msg = f"the body did not arrive within {self.timeout_s:g} s (COMMPLAN_BODY_TIMEOUT_S)"
            return await self._refuse(send, 408, _error(408, ["body"], msg, "timeout"))
        body = b"".join(chunks)
        bad = unreadable_number(body) if body else None
        if bad is not None:
            return await self._refuse(send, 422, _error(422, *bad, "json_invalid"))
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return await self.app(scope, replay, send)

    def _too_large(self) -> bytes:
        # in the page's units beside the exact count (a pasted 9 MB log read "exceeds 8388608 bytes")
        msg = f"request body exceeds {self.max_bytes:,} bytes ({human_bytes(self.max_bytes)}; COMMPLAN_MAX_BODY_BYTES)"
        return _error(413, ["body"], msg, "value_error.too_large")

    async def _refuse(self, send, status: int, payload: bytes):
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
        if status == 408:
            headers.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": payload})


# ---- the connection: a deadline for the request line and headers ----------------------------------------


class GuardedH11(H11Protocol):
    """uvicorn's h11 protocol, plus: between requests (and from the connection's start) the next request's
    line and headers must arrive within ``header_timeout`` seconds, however slowly they trickle in
    (uvicorn's keep-alive timer is reset by every byte, so alone it does not stop a slow loris)."""

    header_timeout = Settings.from_env().header_timeout_s  # read here: worker processes re-import this module

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._arm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm()

    def _arm(self) -> None:
        timer = getattr(self, "_header_timer", None)
        if timer is not None:
            timer.cancel()
        self._header_timer = self.loop.call_later(self.header_timeout, self._header_deadline)

    def _header_deadline(self) -> None:
        waiting = self.cycle is None or self.cycle.response_complete
        if waiting and not self.transport.is_closing():
            self.transport.close()

    def connection_lost(self, exc) -> None:
        timer = getattr(self, "_header_timer", None)
        if timer is not None:
            timer.cancel()
        super().connection_lost(exc)


__all__ = [
    "BodyLimit",
    "Busy",
    "Estimate",
    "GuardedH11",
    "check_router",
    "encode",
    "non_finite",
    "refuse",
    "run_bounded",
]
