"""Heavy work off the event loop's process: each request's work runs in a process forked for it (issue 26
items 3 and 4).

Why a process, not a thread: the planner is mostly pure Python, and a thread computing holds the GIL for
5 ms switch intervals against the event loop; with eight of them /healthz waited 0.5-1.1 s (p99) and a
calibrate at its row limit held it at 0.6-0.8 s. Why a fork per request, not a pool: the work is a closure
over the validated request (nothing to pickle on the way in), its result is bytes, and when the child exits
every byte it allocated goes back to the system (a 2,048-NPU plan used to keep 602 MiB of a 1.24 GiB peak in
the server for good); the child inherits the parent's warm caches at no cost (copy on write).

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
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pickle
import signal
import struct
import sys
import traceback
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

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

    forked: int = 0
    killed: int = 0
    failed: int = 0


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


def _child(fd: int, work: Callable, deadline: Deadline, progress: bool) -> None:
    """In the forked child: run ``work`` under the deadline and send its frames; never returns."""
    code = 0
    try:
        # its own group: one SIGKILL stops it and every worker it forks. Not a session of its own (os.setsid): under
        # CONFIG_SCHED_AUTOGROUP each child would then take a whole session's share of the CPUs, not a niced share
        # of the server's; three paired runs (bench/healthz_stalls.py, load 10-14) gave /healthz p99 99-126 ms
        # that way against 65-89 ms this way (docs/hardening.md)
        os.setpgid(0, 0)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not uvicorn's flag-only handler
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
        os.nice(NICE)  # the event loop's process wins the CPU whenever it has something to do
        try:
            with bounded(deadline):
                value = work(lambda item: _write(fd, ("progress", item))) if progress else work()
            _write(fd, ("ok", value))
        except BaseException as err:  # sent back and raised in the parent
            _write(fd, ("error", _portable(err)))
    except BaseException:  # the pipe closed under it (the parent stopped waiting): nothing to tell
        code = 1
    finally:
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


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


async def _next_size(reader: asyncio.StreamReader, deadline: Deadline, gone: Callable[[], object]) -> int:
    """The next frame's length, watching the deadline and the client every POLL_S while the child works."""
    header = asyncio.ensure_future(reader.readexactly(HEADER.size))
    try:
        while not header.done():
            await asyncio.wait({header}, timeout=POLL_S)
            if header.done():
                break
            if deadline.expired():
                deadline.cancel("deadline")
                raise DeadlineExceeded("deadline")
            if await gone():
                deadline.cancel("disconnected")
                raise Cancelled()
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


async def run(work: Callable[[], object], deadline: Deadline, gone: Callable[[], object]) -> object:
    """``work()``'s value, computed in a child process (``frames``)."""
    async with contextlib.aclosing(frames(work, deadline, gone)) as answers:
        async for kind, value in answers:
            if kind == "ok":
                return value
    raise ChildFailed("no answer")  # pragma: no cover - frames always ends with ok or raises


def rss_bytes(pid: int | str = "self") -> int:
    """Resident set size of a process (Linux /proc), in bytes; 0 where /proc is not there."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


__all__ = ["STATS", "ChildFailed", "frames", "rss_bytes", "run"]
