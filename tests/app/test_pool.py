"""app/runner.py's pool of long-lived worker processes (issue 26 items 3 and 4, round six): the work crosses by
value, a worker serves request after request with its caches, retires on its request count, its memory growth or
its children, is killed at the deadline, and work that does not pickle is forked for."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import threading
import time

import anyio
import httpx
import pytest

from app import runner
from app.schemas.plan import PlanRequest
from app.settings import Settings
from planner import SpecError
from planner.deadline import Deadline, DeadlineExceeded
from tests.app.test_load import SMALL, serving

SEEN: list[int] = []  # grows in the worker that runs the work, never in this process
KEPT: list[bytes] = []


async def _never() -> bool:
    return False


@pytest.fixture
def pool_of():
    """``pool_of(**settings)``: the runner configured as a server with those settings would be; restored after."""
    before = runner.LIMITS

    def configure(**settings) -> None:
        runner.configure(Settings(work_in_process=1, **settings))

    yield configure
    runner.pool().close()
    runner.LIMITS = before


def _runs(*works, seconds: float = 30.0, gate=None) -> list:
    async def main() -> list:
        return [await runner.run(w, Deadline(seconds), _never, gate) for w in works]

    return asyncio.run(main())


def _count() -> tuple[int, int]:
    SEEN.append(1)
    return os.getpid(), len(SEEN)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split()[2] != "Z"


def test_a_closure_crosses_by_value():
    """A router's lambda over a validated body, a nested function, a default and a module function: pickled with
    its code and cells, it computes in another process what it computes here; a lock does not pickle."""
    body = PlanRequest.model_validate(SMALL)
    scale = 3

    def nested(x: int, *, plus: int = 1) -> int:
        return x * scale + plus

    work = lambda: (body.parallel.tp, nested(2), nested(2, plus=5), os.path.basename("/a/b"))  # noqa: E731
    payload = runner.dumps_work(work)
    assert payload is not None and runner._call(payload) == work() == (8, 7, 11, "b")
    lock = threading.Lock()
    assert runner.dumps_work(lambda: lock.locked()) is None
    assert runner.dumps_work(_count) is not None  # a module function: by name


def test_a_worker_serves_request_after_request_and_retires_after_its_count(pool_of):
    """worker_requests=3: one process answers three requests, its module state carried from one to the next (as
    a cache is), then retires; the fourth is a new worker's first. Nothing is computed in this process."""
    pool_of(worker_requests=3)
    forked, retired = runner.STATS.forked, runner.STATS.retired
    answers = _runs(*[_count] * 4)
    pids = [pid for pid, _ in answers]
    assert [n for _, n in answers] == [1, 2, 3, 1], answers
    assert pids[0] == pids[1] == pids[2] != pids[3] and os.getpid() not in pids
    assert SEEN == []
    assert runner.STATS.retired == retired + 1 and runner.STATS.forked == forked + 2
    time.sleep(0.5)
    assert not _alive(pids[0])  # the retired worker was reaped


def _hold(mib: int) -> int:
    block = bytearray(mib << 20)
    for i in range(0, len(block), 4096):
        block[i] = 1
    KEPT.append(bytes(block))  # kept, as a cache that grew would be
    return os.getpid()


def test_a_worker_retires_once_its_memory_has_grown(pool_of):
    """worker_growth_mib=64: a request that leaves 100 MiB in its worker retires it (its memory goes back to the
    system with it); one that leaves 10 MiB does not."""
    pool_of(worker_growth_mib=64)
    before = runner.rss_bytes()
    small, small_again, big, after = _runs(lambda: _hold(10), lambda: _hold(10), lambda: _hold(100), os.getpid)
    assert small == small_again == big != after
    assert runner.rss_bytes() - before < 50 << 20


def test_a_worker_is_killed_at_the_deadline_and_replaced(pool_of):
    pool_of()
    (first,) = _runs(os.getpid)
    killed = runner.STATS.killed
    with pytest.raises(DeadlineExceeded):
        _runs(lambda: time.sleep(60), seconds=0.5)
    assert runner.STATS.killed == killed + 1
    (second,) = _runs(os.getpid)
    assert second != first  # the worker asleep past its deadline was the idle one: killed, and a new one forked
    time.sleep(0.5)
    assert not _alive(first)


def test_errors_come_back_and_the_worker_stays(pool_of):
    pool_of()

    def spec():
        raise SpecError("cluster.num_nodes", "too many: 9 > 8")

    async def main():
        first = await runner.run(os.getpid, Deadline(30), _never)
        with pytest.raises(SpecError) as err:
            await runner.run(spec, Deadline(30), _never)
        assert (err.value.field, err.value.rule) == ("cluster.num_nodes", "too many: 9 > 8")
        return first, await runner.run(os.getpid, Deadline(30), _never)

    first, second = asyncio.run(main())
    assert first == second


def test_work_that_does_not_pickle_is_forked_for(pool_of):
    pool_of()
    lock = threading.Lock()
    forked, pooled = runner.STATS.forked, runner.STATS.pooled
    ((pid, locked),) = _runs(lambda: (os.getpid(), lock.locked()))
    assert pid != os.getpid() and locked is False
    assert runner.STATS.forked == forked + 1 and runner.STATS.pooled == pooled


def _leave_a_child() -> int:
    child = os.fork()
    if child == 0:
        time.sleep(60)
        os._exit(0)
    return child


def test_a_worker_that_forked_retires_with_its_children(pool_of):
    """A search forks its own worker pool inside the request's worker: that worker retires once it answers, and
    its process group, the children included, is killed."""
    pool_of()
    child, pid = _runs(_leave_a_child, os.getpid)
    time.sleep(0.5)
    assert not _alive(child)
    assert pid != os.getpid()


def test_the_gate_holds_a_request_on_the_loop_under_its_deadline(pool_of):
    """With one token held by a long request, a second waits at the gate, computing nothing, and is stopped at its
    deadline without ever reaching a worker."""
    pool_of()

    async def main():
        gate = anyio.CapacityLimiter(1)
        slow = asyncio.ensure_future(runner.run(lambda: time.sleep(3) or os.getpid(), Deadline(30), _never, gate))
        await asyncio.sleep(0.3)
        pooled = runner.STATS.pooled
        start = time.monotonic()
        with pytest.raises(DeadlineExceeded):
            await runner.run(os.getpid, Deadline(0.5), _never, gate)
        waited = time.monotonic() - start
        assert runner.STATS.pooled == pooled  # it never ran
        await slow
        return waited, gate.borrowed_tokens

    waited, borrowed = asyncio.run(main())
    assert 0.4 < waited < 2.5 and borrowed == 0


def test_the_settings_refuse_what_cannot_be():
    for bad in ({"work_in_process": 3}, {"worker_processes": 0}, {"worker_requests": 0}, {"worker_growth_mib": 0}):
        with pytest.raises(ValueError, match="COMMPLAN_WORK"):
            Settings(**bad)


def _descendants(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(x) for x in f.read().split()]


@pytest.mark.parametrize("workers", [1, 3])
def test_a_server_forks_its_workers_at_start_up_and_answers_from_them(workers):
    """`commplan serve` on Linux: COMMPLAN_WORKER_PROCESSES workers are forked before it listens; plans answer
    over HTTP from them, byte for byte what a server computing in threads answers; stopping the server stops
    them."""
    answers = {}
    for mode in (1, 0):
        with serving(worker_processes=workers, work_in_process=mode) as (base, pid):
            children = _descendants(pid)
            assert len(children) == (workers if mode else 0), children
            with httpx.Client(base_url=base, timeout=60) as http:
                answers[mode] = [http.post("/v1/plan", json=SMALL).content for _ in range(3)]
            assert _descendants(pid) == children  # the same workers served them
        time.sleep(0.5)
        assert not [c for c in children if _alive(c)]
    assert answers[1] == answers[0]


def test_a_killed_idle_worker_is_replaced(pool_of):
    pool_of()
    (first,) = _runs(os.getpid)

    async def main():
        (worker,) = runner.pool().idle
        os.kill(worker.pid, signal.SIGKILL)
        await asyncio.sleep(0.3)  # the loop sees its pipe close
        return await runner.run(os.getpid, Deadline(30), _never)

    # a fresh loop closes the old pool; within one loop a dead idle worker is dropped, not handed work
    async def same_loop():
        await runner.pool().start(1)
        return await main()

    second = asyncio.run(same_loop())
    assert second not in (first, os.getpid())


def _tcp_sockets(pid: int) -> set[str]:
    """The inodes of the TCP sockets ``pid`` holds (its descriptors' ``socket:[inode]`` found in /proc/net/tcp*)."""
    held = {os.readlink(f"/proc/{pid}/fd/{fd}")[8:-1] for fd in os.listdir(f"/proc/{pid}/fd")}
    tcp = set()
    for table in ("tcp", "tcp6"):
        with open(f"/proc/{pid}/net/{table}") as f:
            tcp |= {line.split()[9] for line in list(f)[1:]}
    return held & tcp


def _idle_connection(base: str) -> socket.socket:
    """A kept-alive connection to ``base`` after one answered GET, as a browser keeps one in its pool."""
    host, port = base.removeprefix("http://").split(":")
    conn = socket.create_connection((host, int(port)))
    conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    conn.settimeout(10)
    answer = b""
    while not answer.endswith(b'{"status":"ok"}'):  # headers and body may come in two reads
        answer += conn.recv(65536)
    assert answer.startswith(b"HTTP/1.1 200")
    return conn


def test_a_worker_forked_while_a_connection_idles_does_not_keep_it_open():
    """The CI flake of round 9 (test_page.py's calibrate reload): a pool worker forked while a browser's kept-alive
    connection idled inherited its socket, so the server's keep-alive close sent no FIN; Chromium reused the
    connection after the reload and its GETs of /v1/presets/* waited on a socket nobody read (20 s, the test's
    limit). Here the worker forked at start-up retires after its second request, the third forks its replacement
    with the connection open; the server's close (keep-alive 1 s) must reach the client. Before the fix the
    connection stayed open 8 s and a request on it was never answered."""
    with serving(worker_processes=1, worker_requests=2, keep_alive_s=1) as (base, pid):
        with httpx.Client(base_url=base, timeout=60) as http:
            for _ in range(2):
                assert http.post("/v1/plan", json=SMALL).status_code == 200
            # the worker that answered twice; it may already have exited and been reaped on a fast machine
            retiring = set(_descendants(pid))
            idle = _idle_connection(base)
            assert http.post("/v1/plan", json=SMALL).status_code == 200  # forks the replacement
            # the retiring worker may still be listed (exiting, not yet reaped) on a loaded machine
            deadline = time.monotonic() + 20
            while len(others := [k for k in _descendants(pid) if k not in retiring]) != 1 and (
                time.monotonic() < deadline
            ):
                time.sleep(0.05)
            (replacement,) = others
        assert not _tcp_sockets(replacement)  # neither the listening socket nor a client's connection
        start = time.monotonic()
        assert idle.recv(100) == b""  # the server's close: end of stream, within the keep-alive and a margin
        assert time.monotonic() - start < 9
        idle.close()


def test_release_sockets_leaves_pipes_and_unix_pairs():
    """In a forked child the TCP sockets become /dev/null; pipes and AF_UNIX pairs (a search pool's channels) stay
    usable, and the parent's socket is untouched."""
    listener = socket.create_server(("127.0.0.1", 0))
    pair = socket.socketpair()
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report what it sees through the pipe, then leave without running pytest's handlers
        try:
            released = runner.release_sockets()
            gone = os.readlink(f"/proc/self/fd/{listener.fileno()}") == os.devnull
            pair[1].sendall(b"pair ok")
            os.write(write_fd, f"{released} {gone}".encode())
        finally:
            os._exit(0)
    os.close(write_fd)
    report = os.read(read_fd, 100).decode()
    os.waitpid(pid, 0)
    assert pair[0].recv(10) == b"pair ok"
    released, gone = report.split()
    # the listening socket is /dev/null in the child: by this call, or already by the at-fork hook when an earlier
    # test of the session ran the app's lifespan in this process (release_sockets_on_fork; then this call finds none)
    assert gone == "True" and int(released) >= 0
    assert listener.getsockname()[1] > 0  # still the parent's listening socket
    for s in (listener, *pair):
        s.close()
    os.close(read_fd)
