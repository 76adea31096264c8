"""Work off the event loop on a thread of its own, started without blocking the loop.

``asyncio.to_thread`` hands the call to the loop's thread pool, whose ``threading.Thread.start()`` waits until
the new thread has run: it must take the GIL first, behind every thread computing, and the event loop (every
/healthz, every other request) waits with it, up to 0.2 s seen under eight heavy plans (app/limits.py
``_supervise`` starts its worker the same way, issue 26). :func:`in_thread` starts the thread with
``_thread.start_new_thread``, which returns at once, and hands back a future the loop settles when the call ends.
"""

from __future__ import annotations

import _thread
import asyncio
import contextlib
import contextvars
from collections.abc import Callable


def in_thread(fn: Callable, *args) -> asyncio.Future:
    """``fn(*args)`` on a new thread (in a copy of the caller's context, as ``asyncio.to_thread`` runs it): a
    future of its value or its exception, settled on the running loop; awaiting it is ``await to_thread``."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()
    context = contextvars.copy_context()

    def main() -> None:
        try:
            outcome = (future.set_result, context.run(fn, *args))
        except BaseException as err:  # handed to the event loop, as to_thread's future carries it
            outcome = (future.set_exception, err)
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody is waiting
            loop.call_soon_threadsafe(_settle, future, *outcome)

    _thread.start_new_thread(main, ())
    return future


def _settle(future: asyncio.Future, settle: Callable, value) -> None:
    if not future.done():  # a cancelled waiter leaves a cancelled future
        settle(value)


__all__ = ["in_thread"]
