"""Everything that keeps one request from taking the service down (docs/hardening.md):

- :class:`BodyLimit` refuses bodies over ``max_body_bytes`` (413), bodies that trickle in slower than
  ``body_timeout_s`` (408), and numbers JSON does not have (NaN, Infinity, 1e309: 422) before any parsing;
- :class:`GuardedH11` is uvicorn's HTTP/1.1 protocol with a header deadline (a slow-loris connection that
  never finishes its request line and headers is closed after ``header_timeout_s``);
- ``*_work`` estimate a request's cost from its shape before any work, and :func:`refuse` answers 422
  naming the estimate and the budget;
- :func:`run_bounded` runs the work in a worker thread under a deadline, with a bounded number of requests
  computing at once, stops it when the client disconnects, and serialises the answer off the event loop.

Work units. One unit is about 15 ns of this machine's pricing engine (numpy 2.4, CPython 3.11, one core);
the weights were measured per algorithm on one group of n = 256 .. 8,192 ranks (docs/hardening.md):

- building and evaluating a call's library schedules: 130 n log2 n (double binary tree: 93 ms at n = 4,096);
- routing every priced group: 4 g n log2 n (numpy over all transfers of a step class);
- in-network all-gather / reduce-scatter (NVLS / SHARP, when the cluster reduces in the network): 15 n^2
  (its layout keeps n blocks per rank: 2.4 s at n = 4,096);
- ``candidates: all``: 70 n^2 + g n^2 (direct allreduce ~640 ns per n^2, halving-doubling ~160 ns);
- direct (or pinned pairwise / Bruck) all-to-all: 60 n^2 + g n^2 (n(n-1) transfers per group);
- placing a call: g n (numpy arrays over the whole world, and the answer's rank lists);
- building a network's routing: the network plug-in's ``work`` (collectives/topology/networks/); router
  networks (torus, dragonfly, hypercube) are routed by a breadth-first search from each router: num_nodes^2
  router visits, x4 for dragonfly and hypercube (torus 256 routers ~1 s, hypercube 256 ~1.4 s, dragonfly
  256 ~2.4 s, 512 routers 6-12 s), against their own budget.

``max_work`` = 2^27 units is about 2 s and at most a few hundred MiB.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import logging
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import anyio
import numpy as np
from fastapi import Request
from fastapi.responses import Response
from uvicorn.protocols.http.h11_impl import H11Protocol

from collectives.topology import cluster_for, neighbourhood
from collectives.topology.networks import network_type
from planner import ModelSpec, Options, ParallelSpec, SpecError, WorkloadSpec
from planner.context import Context
from planner.deadline import Deadline, DeadlineExceeded, bounded
from planner.explore import QUADRATIC_LIMIT
from planner.layout import RankLayout
from planner.model import validate_model
from planner.parallel import validate_parallel
from planner.rules import ledger
from planner.workload import validate_workload

from .settings import Settings

log = logging.getLogger("commplan")

# Every bound is far above real jobs and keeps byte counts inside int64 (numpy's) with room for sums:
MAX_MESSAGE = 1 << 46  # bytes of one call, as the price endpoint's message_bytes (app/schemas/base.py)
MAX_PARAMS = 1 << 50  # parameters of a model (1.1e15; GPT-3 is 1.75e11), x 16 bytes of optimizer state fits
QUADRATIC = {"direct", "pairwise", "bruck"}  # n(n-1) transfers per group (explore.py's QUADRATIC)
# weights of the work model, in ~15 ns units (module docstring: what each was measured on)
SCHEDULE_WEIGHT = 130  # x n log2 n
ROUTE_WEIGHT = 4  # x groups x n log2 n
BLOCKED_WEIGHT = 15  # x n^2: in-network all-gather / reduce-scatter
ALLTOALL_WEIGHT = 60  # x n^2: direct and hierarchical all-to-all (0.17 s at n = 1,024, 6 s and 1 GB at 2,048)
ALL_WEIGHT = 70  # x n^2: every algorithm (direct allreduce, halving-doubling, ...)
HALVING_WEIGHT = 60  # x n^2: what `all` still costs once the quadratic ones are left out (explorer)


# ---- estimates -------------------------------------------------------------------------------------------


@dataclass
class Estimate:
    """Work units of a request, and the largest contributor (named in a refusal)."""

    units: int = 0
    biggest: str = ""
    biggest_units: int = 0
    parts: list[str] = field(default_factory=list)

    def add(self, units: int, what: str) -> None:
        self.units += int(units)
        if units > self.biggest_units:
            self.biggest, self.biggest_units = what, int(units)


def _log2(n: int) -> int:
    return max(int(n - 1).bit_length(), 1)


def call_work(
    op: str,
    n: int,
    groups_priced: int,
    candidates: str = "library",
    algorithm: str = "auto",
    sizes: int = 1,
    in_network: bool = False,
) -> int:
    """Work units to price one call of ``op`` on ``groups_priced`` groups of ``n`` ranks (module docstring).
    ``sizes``: how many message sizes (the explorer prices each, and leaves the quadratic algorithms out
    above planner.explore.QUADRATIC_LIMIT); ``in_network``: the cluster can reduce in its switches."""
    if n <= 1:
        return 0
    g, log = groups_priced, _log2(n)
    units = SCHEDULE_WEIGHT * n * log + ROUTE_WEIGHT * g * n * log
    if in_network and op in ("allgather", "reducescatter") and algorithm in ("auto", "in_network"):
        units += BLOCKED_WEIGHT * n * n
    quadratic_ok = sizes == 1 or n * n * g <= QUADRATIC_LIMIT
    if candidates == "all" and algorithm == "auto":
        units += (ALL_WEIGHT + g) * n * n if quadratic_ok else HALVING_WEIGHT * n * n
    elif op == "alltoall" and (algorithm == "auto" or algorithm in QUADRATIC):
        units += (ALLTOALL_WEIGHT + g) * n * n
    return units * sizes


def router_work(cluster) -> int:
    """Work of building the network's routing: the network plug-in's own estimate (networks/, ``work``;
    a torus / dragonfly / hypercube: a breadth-first search per router)."""
    return network_type(cluster.network.topology).work(cluster)


def check_router(cluster, limit: int) -> None:
    network = network_type(cluster.network.topology)
    if network.work(cluster) > limit:
        raise SpecError(
            "cluster.num_nodes",
            f"{network.work_rule(cluster)}, over the budget of {limit:,} (COMMPLAN_MAX_ROUTER_PAIRS: a torus of "
            f"{int(limit**0.5):,} routers)",
        )


def groups_priced(placement: np.ndarray, cluster, exact: bool) -> int:
    """How many of a call's groups are priced: all of them for exact contention, else those the symmetry
    shortcut keeps (collectives.topology.neighbourhood: every group on a network without a unit of symmetry,
    those touching group 0's units on one with). ``cluster`` is the spec; its Cluster is the one the plan
    itself builds (cached), after check_router has bounded what building it costs."""
    if exact or len(placement) == 1:
        return len(placement)
    return len(neighbourhood(placement, cluster_for(cluster)))


def plan_calls(model: ModelSpec, work: WorkloadSpec, par: ParallelSpec, cluster, options: Options):
    """(call, placement on devices) for every call of the plan, validated as build_plan validates."""
    validate_model(model)
    validate_workload(work)
    validate_parallel(par, model, work, cluster.num_devices)
    params = model.total_params()
    if params > MAX_PARAMS:
        raise SpecError("model", f"{params:,} parameters; at most {MAX_PARAMS:,} (2^50) are planned here")
    layout = RankLayout(par)
    for call in ledger(Context(model, work, par)):
        if call.message_bytes > MAX_MESSAGE:
            raise SpecError(
                "workload",
                f"call {call.name} would move {call.message_bytes:,} bytes per call, over {MAX_MESSAGE:,} "
                "(2^46, 64 TiB: the largest message priced; products of batch, sequence, width and experts "
                "past it overflow 64-bit byte counts)",
            )
        ranks = layout.placement(call.group, call.stages)
        if options.device_map is not None and len(options.device_map) == cluster.num_devices:
            ranks = np.asarray(options.device_map)[ranks]
        yield call, ranks


def plan_work(
    model, work, par, cluster, options: Options, call: str | None = None, stage: int | None = None, sizes: int = 1
) -> Estimate:
    """The estimate of planning (``call`` None), or of exploring the first call named ``call`` (on
    ``stage``) at ``sizes`` message sizes with every algorithm, as planner.explore does."""
    est = Estimate()
    exact = call is None and (options.contention == "full" or options.device_map is not None)
    in_network = cluster.intra.in_network_reduction or cluster.network.in_network_reduction
    which = "all" if call is not None else options.candidates
    for c, placement in plan_calls(model, work, par, cluster, options):
        if call is not None and (c.name != call or (stage is not None and stage not in c.stages)):
            continue
        n, g = placement.shape[1], groups_priced(placement, cluster, exact)
        # placing and describing every group (numpy over all ranks, then the answer's rank lists) ~ g·n
        units = call_work(c.op.value, n, g, which, options.algorithm, sizes, in_network) + placement.size
        est.add(units, f"{c.name} ({c.op.value} on {g} groups of {n} ranks)")
        if call is not None:
            break
    return est


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
    """Run ``work`` (returns the JSON body) in a thread of its own: at most ``work_slots`` at once, waiting
    at most ``queue_s`` for a slot; stopped at ``deadline_s`` or as soon as the client disconnects."""
    settings = request.app.state.settings
    release = await acquire_slot(request)
    try:
        deadline = Deadline(settings.deadline_s)
        box = await _supervise(request, deadline, work)
    finally:
        release()
    error = box.get("error")
    if isinstance(error, DeadlineExceeded) or (error is None and "body" not in box):
        raise DeadlineExceeded(deadline.reason or "deadline")
    if error is not None:
        raise error
    return Response(box["body"], media_type="application/json")


async def _supervise(request: Request, deadline: Deadline, work: Callable[[], bytes]) -> dict:
    """Start the worker thread and watch it every 20 ms: stop it when the deadline passes or the client
    has gone (a cooperative flag for planner.deadline.check(), and an exception raised in the thread)."""
    loop = asyncio.get_running_loop()
    finished = loop.create_future()
    box: dict = {}
    lock = threading.Lock()

    def main() -> None:
        try:
            with lock:
                box["running"] = True
            try:
                with bounded(deadline):
                    box["body"] = work()
            except BaseException as err:  # handed to the event loop
                box["error"] = err
            finally:
                with lock:
                    box["running"] = False
                loop.call_soon_threadsafe(_settle, finished)
        except BaseException:  # a stop that landed after the work ended: nothing left to stop
            loop.call_soon_threadsafe(_settle, finished)

    thread = threading.Thread(target=main, name="commplan-work", daemon=True)
    thread.start()
    stopped = False
    while not finished.done():
        await asyncio.wait([finished], timeout=0.02)
        if finished.done() or stopped:
            continue
        if await request.is_disconnected():
            deadline.cancel("disconnected")
        elif deadline.expired():
            deadline.cancel("deadline")
        if deadline.cancelled:
            stopped = True
            with lock:
                if box.get("running"):
                    _raise_in(thread.ident, _Stop)
    return box


def _settle(future) -> None:
    if not future.done():
        future.set_result(None)


def encode(payload, model=None) -> bytes:
    """JSON bytes of ``payload`` validated against the response ``model`` (as FastAPI would), off the loop."""
    if model is not None:
        return model.model_validate(payload).model_dump_json().encode()
    return json.dumps(payload, allow_nan=False, separators=(",", ":")).encode()


# ---- the body: size, time, numbers ------------------------------------------------------------------------

# A cheap pre-filter: only a body with one of these can hold a non-finite number (NaN, Infinity, or a
# literal that overflows a double: an exponent of 3+ digits, or 309+ integer digits with a fraction).
_SUSPECT = re.compile(rb"NaN|Infinity|[eE][+-]?\d{3,}|\d{309,}")


class _NonFinite(ValueError):
    pass


def _constant(name: str):
    raise _NonFinite(name)


def _float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise _NonFinite(text if len(text) <= 32 else text[:29] + "...")
    return value


def non_finite(body: bytes) -> str | None:
    """The first number in ``body`` that JSON (RFC 8259) does not have or a double cannot hold, else None."""
    if not _SUSPECT.search(body):
        return None
    try:
        json.loads(body, parse_constant=_constant, parse_float=_float)
    except _NonFinite as err:
        return str(err)
    except (ValueError, RecursionError):  # not JSON at all: FastAPI answers that itself
        return None
    return None


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
        bad = non_finite(body) if body else None
        if bad is not None:
            msg = f"{bad} is not a JSON number (RFC 8259 has no NaN or Infinity; a double overflows above 1.8e308)"
            return await self._refuse(send, 422, _error(422, ["body"], msg, "json_invalid"))
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return await self.app(scope, replay, send)

    def _too_large(self) -> bytes:
        msg = f"request body exceeds {self.max_bytes} bytes (COMMPLAN_MAX_BODY_BYTES)"
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
    "call_work",
    "check_router",
    "encode",
    "non_finite",
    "plan_work",
    "refuse",
    "router_work",
    "run_bounded",
]
