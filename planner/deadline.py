"""A per-request deadline the domain code can check cooperatively: ``planner.deadline.check()``.

The service runs each request's work under :func:`bounded` (in a worker thread); long loops in the planner
and the pricing engine call :func:`check` once per iteration (a context-variable read and a clock read,
about 100 ns), which raises :class:`DeadlineExceeded` once the request's time is up or its client has gone.
Outside :func:`bounded` (the CLI, tests, library use) ``check`` does nothing.

The service does not rely on the checks alone: it also raises the same exception asynchronously in the
worker thread (app/limits.py), which stops pure-Python loops at the next bytecode; the checks make the
stop prompt inside long numpy-driven loops too and let the code clean up where it chooses.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field


class DeadlineExceeded(Exception):
    """The request ran past its deadline or its client disconnected; ``reason`` says which."""

    def __init__(self, reason: str = "deadline"):
        super().__init__(reason)
        self.reason = reason


@dataclass
class Deadline:
    """``seconds`` of work from ``start`` (time.monotonic); ``cancel()`` stops it early (client gone)."""

    seconds: float
    start: float = field(default_factory=time.monotonic)
    _cancelled: threading.Event = field(default_factory=threading.Event)
    reason: str = ""

    @property
    def expires(self) -> float:
        return self.start + self.seconds

    def cancel(self, reason: str = "disconnected") -> None:
        self.reason = reason
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def expired(self) -> bool:
        return self.cancelled or time.monotonic() > self.expires

    def check(self) -> None:
        if self._cancelled.is_set():
            raise DeadlineExceeded(self.reason or "cancelled")
        if time.monotonic() > self.expires:
            self.reason = "deadline"
            raise DeadlineExceeded("deadline")


_CURRENT: ContextVar[Deadline | None] = ContextVar("commplan_deadline", default=None)


def current() -> Deadline | None:
    return _CURRENT.get()


def check() -> None:
    """Raise DeadlineExceeded if the current request's time is up or it was cancelled; else nothing."""
    deadline = _CURRENT.get()
    if deadline is not None:
        deadline.check()


@contextmanager
def bounded(deadline: Deadline) -> Iterator[Deadline]:
    """Run the body with ``deadline`` current (in this thread's context)."""
    token = _CURRENT.set(deadline)
    try:
        yield deadline
    finally:
        _CURRENT.reset(token)


__all__ = ["Deadline", "DeadlineExceeded", "bounded", "check", "current"]
