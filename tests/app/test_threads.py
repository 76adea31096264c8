"""app/threads.py: work on a thread of its own, started without waiting for the thread to run."""

import asyncio
import contextvars
import threading
import time

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
