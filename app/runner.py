"""Heavy work off the event loop's process: each request's work runs in a long-lived worker process of a pool
(``COMMPLAN_WORK_IN_PROCESS=1``, `commplan serve`'s default on Linux; section "long-lived workers" below), or, where
the work does not pickle or with ``COMMPLAN_WORK_IN_PROCESS=2``, in a process forked for it (issue 26 items 3 and 4).

Why a process, not a thread: the planner is mostly pure Python, and a thread computing holds the GIL against the
event loop: a thread the OS preempts while holding it holds the loop with it (43-55 ms waits measured at load
5-8), and a full collection in it holds the GIL for its whole pass (246-279 ms of CPU while a top_k 1,000 search
encodes its answer); with eight heavy plans in threads /healthz waited 0.5-1.1 s (p99, the issue). A fork per
request hands the child the validated request without pickling, and when the child exits every byte it
allocated goes back to the system (a 2,048-NPU plan used to keep 602 MiB of a 1.24 GiB peak in the server for
good), but costs 40-100 ms a request and every cache it warms; the pool keeps the caches and bounds the memory
by retiring its workers (docs/hardening.md "Round six").

Protocol: the child writes frames to a pipe, each ``8-byte length + pickle``: ``("progress", obj)`` any number
of times (a streamed search), then one ``("ok", value)`` or ``("error", portable exception)``, and exits with
``os._exit`` (no atexit handler, no finaliser of the parent's objects runs in it). The parent reads the
frames on the event loop (``connect_read_pipe``). Stopping is a SIGKILL to the child's process group (it is
its own group leader, so the worker processes a search forks die with it) at the deadline or when the
client goes away; the deadline is also checked cooperatively inside the child (``planner.deadline``).

Forking a process with threads copies only the forking thread: a lock another thread held at that moment
stays locked in the child. CPython re-initialises its own (import lock, logging's handler locks) and glibc
its malloc arenas; the parent's other threads are the event loop's helpers, which the work does not share.
Should a child still hang, the deadline kills it like any other.

A forked process also inherits every file descriptor, the server's TCP sockets among them: its listening socket and
each client's connection. While any process holds a copy, the server's own close of a connection (keep-alive
timeout, header deadline) sends no FIN: the client keeps the connection in its pool as open and idle, reuses it, and
its request reaches a socket that nobody reads (CI flake of round 9: Chromium's GETs after a page reload waited on
two connections a pool worker had inherited, idle 20 s past the 5 s keep-alive). :func:`release_sockets` points
those descriptors at /dev/null in every process forked from the server (``os.register_at_fork``: the pool's workers,
a forked request, a search's own worker pool).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib
import io
import logging
import marshal
import os
import pickle
import signal
import socket
import stat
import struct
import sys
import traceback
import types
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import anyio

from collectives import CollectiveError
from planner import SpecError
from planner.deadline import Deadline, DeadlineExceeded, bounded
from planner.invariants import InvariantError
from planner.search import Cancelled

log = logging.getLogger("commplan")

HEADER = struct.Struct("!Q")
NICE = 5  # heavy work runs at a lower priority than the process answering /healthz
POLL_S = 0.02  # how often the parent looks at the deadline and the client while a child works

# exceptions whose __init__ takes other arguments than their args: rebuilt from these attributes
PORTABLE = {
    SpecError: ("field", "rule"),
    CollectiveError: ("field", "rule"),
    InvariantError: ("where", "rule"),
    DeadlineExceeded: ("reason",),
}


class ChildFailed(RuntimeError):
    """The child died without an answer, or raised something that could not be sent back (its traceback)."""


@dataclass
class Stats:
    """What the runner did in this process, for docs/hardening.md and the tests."""

    forked: int = 0  # processes forked: one per request in fork mode, one per worker in the pool
    killed: int = 0
    failed: int = 0
    pooled: int = 0  # requests a long-lived worker computed
    retired: int = 0  # workers that ended after their last request (its count, its memory, or its children)


STATS = Stats()
REAPING: set[asyncio.Future] = set()  # the reapers still waiting for a child's exit (kept from the collector)


def _portable(err: BaseException) -> tuple:
    for cls, attrs in PORTABLE.items():
        if isinstance(err, cls):
            return ("rebuild", type(err), tuple(getattr(err, a) for a in attrs))
    try:
        data = pickle.dumps(err)
        pickle.loads(data)
        return ("pickled", data)
    except Exception:  # an exception that does not survive pickling: its traceback, as a 500
        return ("text", "".join(traceback.format_exception(err)))


def _rebuilt(portable: tuple) -> BaseException:
    kind = portable[0]
    if kind == "rebuild":
        return portable[1](*portable[2])
    if kind == "pickled":
        return pickle.loads(portable[1])
    return ChildFailed(f"the work failed in its process:\n{portable[1]}")


def _write(fd: int, message: tuple) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    view = memoryview(HEADER.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view) :]


def _detach() -> None:
    """In a forked child, first: a process group of its own, default signals, a lower priority."""
    # its own group: one SIGKILL stops it and every worker it forks. Not a session of its own (os.setsid): under
    # CONFIG_SCHED_AUTOGROUP each child would then take a whole session's share of the CPUs, not a niced share
    # of the server's; three paired runs (bench/healthz_stalls.py, load 10-14) gave /healthz p99 99-126 ms
    # that way against 65-89 ms this way (docs/hardening.md)
    os.setpgid(0, 0)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not uvicorn's flag-only handler
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    os.nice(NICE)  # the event loop's process wins the CPU whenever it has something to do


def _exit(code: int) -> None:
    with contextlib.suppress(BaseException):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


def _answer(work: Callable[[], object], deadline: Deadline) -> tuple:
    """``("ok", work())`` under ``deadline``, or ``("error", portable exception)``."""
    try:
        with bounded(deadline):
            return ("ok", work())
    except BaseException as err:  # sent back and raised in the parent
        return ("error", _portable(err))


def _child(fd: int, work: Callable, deadline: Deadline, progress: bool) -> None:
    """In the forked child: run ``work`` under the deadline and send its frames; never returns."""
    code = 0
    try:
        _detach()
        if progress:
            _write(fd, _answer(lambda: work(lambda item: _write(fd, ("progress", item))), deadline))
        else:
            _write(fd, _answer(work, deadline))
    except BaseException:  # the pipe closed under it (the parent stopped waiting): nothing to tell
        code = 1
    finally:
        _exit(code)


def release_sockets() -> int:
    """In a process just forked: every inherited TCP socket (the server's listening socket, its clients'
    connections) made /dev/null, so that the server's close of a connection is the connection's end (the module's
    docstring); returns how many. dup2 rather than close: the descriptor's number stays taken, so a copied socket
    object the child finalises closes /dev/null, never a file the child opened since. Sockets of other families
    (a search pool's pipes and socket pairs, AF_UNIX) are left alone."""
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:  # no /proc: nothing to do it with
        return 0
    null, released = -1, 0
    for fd in fds:
        if fd <= 2:
            continue
        try:
            if not stat.S_ISSOCK(os.fstat(fd).st_mode):
                continue
            probe = socket.socket(fileno=fd)  # reads the family of the socket behind fd
        except OSError:  # closed meanwhile (the listing's own descriptor)
            continue
        family = probe.family
        probe.detach()  # the object lets go of fd without closing it
        if family not in (socket.AF_INET, socket.AF_INET6):
            continue
        if null < 0:
            null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, fd)
        released += 1
    if null >= 0:
        os.close(null)
    return released


_RELEASING = False


def release_sockets_on_fork() -> None:
    """Runs :func:`release_sockets` in every process this one forks from now on (once per process: a hook cannot be
    removed; the server's lifespan calls it before it forks its pool)."""
    global _RELEASING
    if not _RELEASING and hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=release_sockets)
        _RELEASING = True


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)  # had it not yet made its group


async def _reap(pid: int) -> None:
    """Collect the child's exit status without blocking the loop (it exits right after its last frame)."""
    for _ in range(500):
        try:
            done, _status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return
        if done:
            return
        await asyncio.sleep(0.005)
    _kill(pid)
    with contextlib.suppress(ChildProcessError):
        await asyncio.to_thread(os.waitpid, pid, 0)


async def _watching(future: asyncio.Future, deadline: Deadline, gone: Callable[[], object]) -> None:
    """Wait for ``future``, checking the deadline and the client every POLL_S; a 503 or a cancel past either."""
    while not future.done():
        await asyncio.wait({future}, timeout=POLL_S)
        if future.done():
            return
        if deadline.expired():
            deadline.cancel("deadline")
            raise DeadlineExceeded("deadline")
        if await gone():
            deadline.cancel("disconnected")
            raise Cancelled()


async def _next_size(reader: asyncio.StreamReader, deadline: Deadline, gone: Callable[[], object]) -> int:
    """The next frame's length, watching the deadline and the client every POLL_S while the child works."""
    header = asyncio.ensure_future(reader.readexactly(HEADER.size))
    try:
        await _watching(header, deadline, gone)
        try:
            return struct.unpack("!Q", header.result())[0]
        except asyncio.IncompleteReadError:
            STATS.failed += 1
            raise ChildFailed("the work's process ended without an answer (killed, or out of memory)") from None
    finally:
        if not header.done():
            header.cancel()


async def frames(
    work: Callable, deadline: Deadline, gone: Callable[[], object], progress: bool = False
) -> AsyncIterator[tuple]:
    """Fork a child for ``work`` and yield its frames as they arrive: ``("progress", item)`` (with
    ``progress``, ``work`` takes a callback), then ``("ok", value)``. An error frame is raised here. The
    child is killed (its whole group) when ``deadline`` expires, when ``await gone()`` is true (the client
    disconnected: raises Cancelled), or when the caller stops iterating."""
    loop = asyncio.get_running_loop()
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        os.close(read_fd)
        _child(write_fd, work, deadline, progress)
    os.close(write_fd)
    STATS.forked += 1
    reader = asyncio.StreamReader(limit=1 << 20)
    transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(read_fd, "rb", buffering=0)
    )
    finished = False
    try:
        while True:
            size = await _next_size(reader, deadline, gone)
            kind, value = pickle.loads(await reader.readexactly(size))
            if kind == "progress":
                yield kind, value
                continue
            finished = True
            if kind == "error":
                raise _rebuilt(value)
            yield kind, value
            return
    finally:
        transport.close()
        STATS.killed += not finished
        # the whole group, even after an answer: a search's pool workers outlive their parent's os._exit
        # otherwise (orphans blocked on their task queue). The child is a zombie at worst until reaped, so its
        # id, the group's, cannot have been reused.
        _kill(pid)
        # reaped in the background: a process with the server's address space takes some 30 ms to exit,
        # which the answer need not wait for
        reaping = asyncio.ensure_future(_reap(pid))
        REAPING.add(reaping)
        reaping.add_done_callback(REAPING.discard)


async def run(
    work: Callable[[], object],
    deadline: Deadline,
    gone: Callable[[], object],
    gate: anyio.CapacityLimiter | None = None,
) -> object:
    """``work()``'s value, computed in a pool worker where it pickles (below), else in a process forked for it
    (``frames``); with ``gate``, once one of its tokens is free (waiting on the loop, under the deadline)."""
    release = await _enter(gate, deadline, gone) if gate is not None else None
    try:
        payload = dumps_work(work) if LIMITS.pooled else None
        if payload is not None:
            return await _pooled(payload, deadline, gone)
        async with contextlib.aclosing(frames(work, deadline, gone)) as answers:
            async for kind, value in answers:
                if kind == "ok":
                    return value
        raise ChildFailed("no answer")  # pragma: no cover - frames always ends with ok or raises
    finally:
        if release is not None:
            release()


async def _enter(gate: anyio.CapacityLimiter, deadline: Deadline, gone: Callable[[], object]) -> Callable[[], None]:
    """One of ``gate``'s tokens, watching the deadline and the client every POLL_S while waiting; its release."""
    token = object()
    waiting = asyncio.ensure_future(gate.acquire_on_behalf_of(token))
    try:
        await _watching(waiting, deadline, gone)
        waiting.result()
    finally:
        if not waiting.done():
            waiting.cancel()
            with contextlib.suppress(BaseException):
                await waiting  # withdrawn from the queue, or the token came as it was cancelled: given back below
            if waiting.done() and not waiting.cancelled() and waiting.exception() is None:
                gate.release_on_behalf_of(token)
    return lambda: gate.release_on_behalf_of(token)


# ---- long-lived workers: the work sent by value (COMMPLAN_WORK_IN_PROCESS=1, the server's default on Linux) -------
#
# A fork per request costs the fork and the child's start (40-100 ms a request on this project's loaded machine)
# and every cache a request warms dies with its process. A pool worker is forked once, from the warm server, and
# computes request after request; the server sends it each request's work by value: the closure a router hands
# to app.limits.run_value (a lambda over the validated body and the settings) pickled with its code (marshal) and
# what it closes over. Work that does not pickle (a lock, a class defined in a function) is forked for, as before.
# A worker retires once it has served ``Limits.requests`` requests, once its resident size has grown
# ``Limits.growth_bytes`` since it was forked (its memory goes back with it), or once it has child processes (a
# search's worker pool, which a retiring worker's group kill takes with it); at the deadline or when the client
# goes away it is killed, as a forked request is.


@dataclass(frozen=True)
class Limits:
    """When a pool worker retires (settings ``worker_requests``, ``worker_growth_mib``)."""

    pooled: bool = True  # COMMPLAN_WORK_IN_PROCESS=1: the pool; 2: a fork per request
    requests: int = 1000
    growth_bytes: int = 300 << 20


LIMITS = Limits()


def configure(settings) -> None:
    """Takes the pool's limits from the service's settings (the lifespan, before any request)."""
    global LIMITS
    LIMITS = Limits(settings.work_in_process == 1, settings.worker_requests, settings.worker_growth_mib << 20)


def _function(code: bytes, module: str, name: str, qualname: str, defaults, kwdefaults, cells: tuple):
    fn = types.FunctionType(
        marshal.loads(code), vars(importlib.import_module(module)), name, defaults,
        tuple(types.CellType(cell) for cell in cells) or None,
    )  # fmt: skip
    fn.__qualname__, fn.__kwdefaults__ = qualname, kwdefaults
    return fn


class _WorkPickler(pickle.Pickler):
    """pickle, plus the functions it cannot name (a router's lambda, a ``work`` defined in an endpoint): by value,
    as their code (marshal: the worker runs the same interpreter), their module (its globals, in the worker) and
    their cells' contents, each pickled the same way."""

    def reducer_override(self, obj):
        if type(obj) is not types.FunctionType or "<" not in obj.__qualname__:
            return NotImplemented  # everything else as pickle does it: module functions and classes by name
        cells = tuple(cell.cell_contents for cell in obj.__closure__ or ())  # an empty cell: ValueError
        return _function, (marshal.dumps(obj.__code__), obj.__module__, obj.__name__, obj.__qualname__,
                           obj.__defaults__, obj.__kwdefaults__, cells)  # fmt: skip


def dumps_work(work: Callable) -> bytes | None:
    """``work`` pickled with all it closes over, or None where something in it does not pickle."""
    buffer = io.BytesIO()
    try:
        _WorkPickler(buffer, pickle.HIGHEST_PROTOCOL).dump(work)
    except Exception:  # PicklingError, TypeError (a lock), ValueError (an empty cell), RecursionError
        return None
    return buffer.getvalue()


def _has_children() -> bool:
    """Whether this process has a child process (running, or exited and not yet waited for)."""
    try:
        os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:
        return False
    return True


def _call(payload: bytes) -> object:
    return pickle.loads(payload)()  # unpickled under the deadline: a failure is the request's error, not the worker's


def _serve_jobs(jobs_fd: int, answers_fd: int) -> None:
    """In a pool worker: read a job, compute it, answer ``(kind, value, retiring)``; until the parent closes the
    jobs pipe or the worker retires. Never returns."""
    code = 0
    try:
        _detach()
        born, served = rss_bytes(), 0
        with os.fdopen(jobs_fd, "rb") as jobs:
            while True:
                header = jobs.read(HEADER.size)
                if len(header) < HEADER.size:  # the server closed its end
                    break
                seconds, start, payload = pickle.loads(jobs.read(HEADER.unpack(header)[0]))
                answer = _answer(functools.partial(_call, payload), Deadline(seconds, start))
                served += 1
                retire = served >= LIMITS.requests or rss_bytes() - born > LIMITS.growth_bytes or _has_children()
                try:
                    _write(answers_fd, (*answer, retire))
                except (pickle.PicklingError, TypeError, AttributeError) as err:  # a value that does not pickle
                    _write(answers_fd, ("error", _portable(ChildFailed(f"the answer does not pickle: {err}")), True))
                    break
                if retire:
                    break
    except BaseException:  # the pipe closed under it (the server stopped, or killed it): nothing to tell
        code = 1
    finally:
        _exit(code)


@dataclass
class _Worker:
    pid: int
    jobs: asyncio.WriteTransport
    answers: asyncio.ReadTransport
    reader: asyncio.StreamReader
    fds: tuple[int, int]  # the server's ends of its pipes (closed in every later worker)


class Pool:
    """This process's workers: forked on demand (at most one per request computing at once: the work slots bound
    them), kept while they stay fit."""

    def __init__(self) -> None:
        self.idle: list[_Worker] = []
        self.workers: dict[int, _Worker] = {}
        self.loop: asyncio.AbstractEventLoop | None = None

    async def take(self) -> _Worker:
        """An idle worker that is still alive, else a new one."""
        if self.loop is not asyncio.get_running_loop():  # its pipes are another loop's (asyncio.run, one by one)
            self.close()
            self.loop = asyncio.get_running_loop()
        while self.idle:
            worker = self.idle.pop()
            if not worker.reader.at_eof():
                return worker
            self.drop(worker)  # it died idle (killed from outside, out of memory)
        return await self._fork()

    async def start(self, count: int) -> None:
        """Forks ``count`` idle workers now (the server's start-up, before it listens): a fork holds the event loop
        for 4-8 ms of CPU (15-45 ms on a loaded machine), better paid before the first request than during it."""
        if self.loop is not asyncio.get_running_loop():
            self.close()
            self.loop = asyncio.get_running_loop()
        while len(self.workers) < count:
            self.idle.append(await self._fork())

    async def _fork(self) -> _Worker:
        loop = asyncio.get_running_loop()
        jobs_r, jobs_w = os.pipe()
        answers_r, answers_w = os.pipe()
        inherited = [fd for worker in self.workers.values() for fd in worker.fds]
        pid = os.fork()
        if pid == 0:  # the worker
            os.close(jobs_w)
            os.close(answers_r)
            for fd in inherited:  # its siblings' pipes: theirs and the server's only
                with contextlib.suppress(OSError):
                    os.close(fd)
            _serve_jobs(jobs_r, answers_w)
        os.close(jobs_r)
        os.close(answers_w)
        STATS.forked += 1
        reader = asyncio.StreamReader(limit=1 << 20)
        answers, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(answers_r, "rb", buffering=0)
        )
        jobs, _ = await loop.connect_write_pipe(asyncio.Protocol, os.fdopen(jobs_w, "wb", buffering=0))
        worker = self.workers[pid] = _Worker(pid, jobs, answers, reader, (answers_r, jobs_w))
        return worker

    def drop(self, worker: _Worker) -> None:
        """Ends ``worker`` (its whole group: a search's pool goes with it) and reaps it in the background."""
        self.workers.pop(worker.pid, None)
        worker.jobs.close()
        worker.answers.close()
        _kill(worker.pid)
        reaping = asyncio.ensure_future(_reap(worker.pid))
        REAPING.add(reaping)
        reaping.add_done_callback(REAPING.discard)

    def close(self) -> list[int]:
        """Kills every worker and waits for them (the server's shutdown); their ids."""
        pids = list(self.workers)
        for pid in pids:
            _kill(pid)
        for pid in pids:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        self.workers.clear()
        self.idle.clear()
        return pids


_POOLS: dict[int, Pool] = {}


def pool() -> Pool:
    """This process's pool (each uvicorn worker process has its own)."""
    return _POOLS.setdefault(os.getpid(), Pool())


async def _pooled(payload: bytes, deadline: Deadline, gone: Callable[[], object]) -> object:
    workers = pool()
    worker = await workers.take()
    job = pickle.dumps((deadline.seconds, deadline.start, payload), protocol=pickle.HIGHEST_PROTOCOL)
    worker.jobs.write(HEADER.pack(len(job)) + job)
    answered = keep = False
    try:
        size = await _next_size(worker.reader, deadline, gone)
        kind, value, retiring = pickle.loads(await worker.reader.readexactly(size))
        answered, keep = True, not retiring
        STATS.pooled += 1
        STATS.retired += retiring
    finally:
        if keep:
            workers.idle.append(worker)
        else:  # retiring, or stopped (deadline, client gone, cancelled), or dead
            STATS.killed += not answered
            workers.drop(worker)
    if kind == "error":
        raise _rebuilt(value)
    return value


def pss_bytes(pid: int | str = "self") -> int:
    """Proportional set size (Linux /proc/PID/smaps_rollup): resident bytes, each page shared by k processes
    counted 1/k. A forked worker shares the server's pages, so the RSS of a server and its workers summed would
    count those pages once per process; their PSS summed counts each once. 0 where it cannot be read."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            return next(int(line.split()[1]) << 10 for line in f if line.startswith("Pss:"))
    except (OSError, StopIteration):
        return 0


def rss_bytes(pid: int | str = "self") -> int:
    """Resident set size of a process (Linux /proc), in bytes; 0 where /proc is not there."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


__all__ = [
    "LIMITS",
    "STATS",
    "ChildFailed",
    "Pool",
    "configure",
    "dumps_work",
    "frames",
    "pool",
    "pss_bytes",
    "release_sockets",
    "release_sockets_on_fork",
    "rss_bytes",
    "run",
]
