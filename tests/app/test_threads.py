"""app/threads.py: work on a thread of its own, started without waiting for the thread to run."""

import asyncio
import contextvars
import threading
import time
from types import SimpleNamespace

import pytest

from app.threads import in_thread

WHO = contextvars.ContextVar("who", default="nobody")


def test_value_exception_and_context_as_to_thread_gives_them():
    async def main():
        WHO.set("caller")
        ident = await in_thread(threading.get_ident)
        assert ident != threading.get_ident()
        assert await in_thread(lambda a, b: a * b, 6, 7) == 42
        assert await in_thread(WHO.get) == "caller"  # the caller's context, copied
        with pytest.raises(ZeroDivisionError):
            await in_thread(lambda: 1 / 0)

    asyncio.run(main())


def test_the_loop_runs_on_while_the_work_waits():
    # the future is pending while the work is held (the loop keeps polling meanwhile) and settles once it ends
    gate = threading.Lock()
    started = threading.Event()

    def work():
        started.set()
        with gate:
            return "done"

    async def main():
        with gate:
            future = in_thread(work)
            assert not future.done()
            t0 = time.perf_counter()
            while not started.is_set():
                await asyncio.sleep(0.001)
            assert not future.done() and time.perf_counter() - t0 < 5
        assert await asyncio.wait_for(future, 5) == "done"

    asyncio.run(main())


def test_a_cancelled_waiter_leaves_the_thread_to_finish_quietly():
    release = threading.Event()

    async def main():
        future = in_thread(release.wait, 5)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(future, 0.01)  # cancels the future
        assert future.cancelled()
        release.set()
        await asyncio.sleep(0.05)  # the thread's settle finds the future done and leaves it

    asyncio.run(main())


# ---- the compute gate (issue 26 item 4) -----------------------------------------------------------------------


def test_the_gate_runs_at_most_its_tokens_threads_at_once_in_order():
    import anyio

    running, most, order, lock = [0], [0], [], threading.Lock()

    def work(i):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
            order.append(i)
        time.sleep(0.03)  # holds no GIL: without the gate all six would run at once
        with lock:
            running[0] -= 1
        return i * i

    async def main():
        gate = anyio.CapacityLimiter(2)
        futures = [in_thread(work, i, gate=gate) for i in range(6)]
        assert await asyncio.gather(*futures) == [i * i for i in range(6)]
        await asyncio.sleep(0)  # the last settle has run: every token is back
        assert gate.borrowed_tokens == 0
        return order

    asyncio.run(main())
    assert most[0] == 2
    assert [sorted(order[:2]), sorted(order[2:4]), sorted(order[4:])] == [[0, 1], [2, 3], [4, 5]]  # first come first


def test_a_future_cancelled_at_the_gate_never_starts_its_thread():
    import anyio

    release, ran = threading.Event(), []

    async def main():
        gate = anyio.CapacityLimiter(1)
        first = in_thread(release.wait, 5, gate=gate)
        second = in_thread(ran.append, "second", gate=gate)
        third = in_thread(lambda: "third", gate=gate)
        await asyncio.sleep(0.05)
        assert gate.borrowed_tokens == 1 and not second.done()
        second.cancel()  # leaves the queue
        release.set()
        assert await first is True
        assert await asyncio.wait_for(third, 5) == "third"  # the queue moved on past the withdrawn one
        await asyncio.sleep(0.05)
        assert gate.borrowed_tokens == 0

    asyncio.run(main())
    assert ran == []


def test_a_thread_keeps_its_token_until_it_ends_even_when_its_waiter_is_cancelled():
    import anyio

    release = threading.Event()

    async def main():
        gate = anyio.CapacityLimiter(1)
        future = in_thread(release.wait, 5, gate=gate)
        await asyncio.sleep(0.05)
        future.cancel()  # nobody waits for it any more, but its thread still runs
        await asyncio.sleep(0.05)
        assert gate.borrowed_tokens == 1
        release.set()
        for _ in range(100):
            await asyncio.sleep(0.01)
            if gate.borrowed_tokens == 0:
                break
        assert gate.borrowed_tokens == 0

    asyncio.run(main())


class _Request:
    """What app.limits.run_value reads of a request: the app's settings and state, and the client's presence."""

    def __init__(self, gone: bool = False, **settings):
        from app.settings import Settings

        self.app = SimpleNamespace(state=SimpleNamespace(settings=Settings(**settings)))
        self.gone = gone

    async def is_disconnected(self) -> bool:
        return self.gone


@pytest.mark.parametrize("gone", [False, True], ids=["deadline", "disconnected"])
def test_work_waiting_at_the_gate_stops_at_its_deadline_or_disconnect_without_ever_starting(gone):
    """app.limits.run_value in thread mode: a request queued behind the only compute thread is answered at its
    own deadline (503 deadline) or as soon as its client is gone, and its work never runs."""
    from app.limits import run_value
    from app.threads import gate
    from planner.deadline import DeadlineExceeded

    request, ran = _Request(gone, compute_threads=1, deadline_s=0.3), []

    async def main():
        gate(request.app).acquire_on_behalf_of_nowait("another request")  # the only thread computes elsewhere
        start = time.monotonic()
        with pytest.raises(DeadlineExceeded) as err:
            await run_value(request, lambda: ran.append(1))
        took = time.monotonic() - start
        assert gate(request.app).borrowed_tokens == 1  # only the other request's
        return err.value.reason, took

    reason, took = asyncio.run(main())
    assert ran == []
    assert reason == ("disconnected" if gone else "deadline")
    assert took < 0.2 if gone else 0.3 <= took < 2.0


def test_run_value_computes_once_the_gate_opens():
    from app.limits import run_value
    from app.threads import gate

    request = _Request(compute_threads=1, deadline_s=10)

    async def main():
        gate(request.app).acquire_on_behalf_of_nowait("another request")
        asyncio.get_running_loop().call_later(0.2, gate(request.app).release_on_behalf_of, "another request")
        start = time.monotonic()
        value = await run_value(request, threading.get_ident)
        return value, time.monotonic() - start

    ident, took = asyncio.run(main())
    assert ident != threading.get_ident() and 0.2 <= took < 5
