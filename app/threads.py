"""Work off the event loop on a thread of its own, started without blocking the loop, at most a few at once.

``asyncio.to_thread`` hands the call to the loop's thread pool, whose ``threading.Thread.start()`` waits until
the new thread has run: it must take the GIL first, behind every thread computing, and the event loop (every
/healthz, every other request) waits with it, up to 0.2 s seen under eight heavy plans (app/limits.py
``_supervise`` starts its worker the same way, issue 26). :func:`in_thread` starts the thread with
``_thread.start_new_thread``, which returns at once, and hands back a future the loop settles when the call ends.

**The gate** (issue 26 item 4). The planner is pure Python: a thread computing holds the GIL, and the event loop
must take it back each time it wakes (an accepted connection, a read, a write, a timer). CPython hands the GIL
over on request after the switch interval (Python/ceval_gil.c ``take_gil``: a waiter asks the holder to drop it
after ``sys.getswitchinterval()``), but to whichever waiter the OS wakes first, so with k threads computing the
loop waits up to about k intervals each time, dozens of times per request: with nine heavy requests in their
threads /healthz had a p99 of 0.34-0.55 s on an idle 2-core machine. :func:`gate` bounds the threads computing
at once (``COMMPLAN_COMPUTE_THREADS``, default min(CPU count, 2)): a request whose thread cannot start yet waits
on the event loop, where it holds nothing, still under its deadline and its client's disconnect. More threads
would not compute more (one holds the GIL at a time; numpy's kernels release it, which a second thread uses).
"""

from __future__ import annotations

import _thread
import asyncio
import contextvars
from collections.abc import Callable

import anyio


def gate(app) -> anyio.CapacityLimiter:
    """The app's gate on requests computing at once (FIFO), made on first use: ``settings.compute_threads`` threads,
    or in process mode ``settings.worker_processes`` processes (app/runner.py)."""
    state = app.state
    if getattr(state, "compute_gate", None) is None:
        settings = state.settings
        size = settings.worker_processes if settings.work_in_process else settings.compute_threads
        state.compute_gate = anyio.CapacityLimiter(size)
    return state.compute_gate


def in_thread(fn: Callable, *args, gate: anyio.CapacityLimiter | None = None) -> asyncio.Future:
    """``fn(*args)`` on a new thread (in a copy of the caller's context, as ``asyncio.to_thread`` runs it): a
    future of its value or its exception, settled on the running loop; awaiting it is ``await to_thread``.

    With ``gate``, the thread starts once it holds one of the gate's tokens and gives it back when it ends (not
    when the future is cancelled: a thread still running keeps its token). Cancelling the future while it waits
    for a token withdraws it from the queue; the thread then never starts."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()
    context = contextvars.copy_context()
    token = object()

    def main() -> None:
        try:
            outcome = (future.set_result, context.run(fn, *args))
        except BaseException as err:  # handed to the event loop, as to_thread's future carries it
            outcome = (future.set_exception, err)
        while True:  # the future is settled and the token returned, whatever lands here
            try:
                loop.call_soon_threadsafe(_settle, future, *outcome, token, gate)
                return
            except RuntimeError:  # the loop closed meanwhile: nobody is waiting
                return
            except BaseException:  # a stop raised in this thread (app/limits.py) just too late
                continue

    if gate is None:
        _thread.start_new_thread(main, ())
        return future

    async def start() -> None:
        await gate.acquire_on_behalf_of(token)
        if future.done():  # cancelled as the token came
            gate.release_on_behalf_of(token)
            return
        _thread.start_new_thread(main, ())

    starting = asyncio.ensure_future(start())
    future.add_done_callback(lambda _: starting.cancel())  # a no-op once the thread has started
    return future


def _settle(future: asyncio.Future, settle: Callable, value, token: object, gate) -> None:
    if gate is not None:
        gate.release_on_behalf_of(token)
    if not future.done():  # a cancelled waiter leaves a cancelled future
        settle(value)


__all__ = ["gate", "in_thread"]
