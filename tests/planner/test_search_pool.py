"""The search's worker pool: a dropped pool (a cancelled or broken search) leaves no worker computing, even when
the parent runs a server whose SIGTERM handler only flags (uvicorn's, which forked workers inherit)."""

import os
import signal
import time

from planner.search import engine


def _spin(seconds: float) -> int:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass
    return os.getpid()


def test_a_dropped_pool_stops_its_busy_workers_at_once():
    previous = signal.signal(signal.SIGTERM, lambda *_: None)  # a server's handler that only flags
    try:
        pool = engine._pool(2)
        for _ in range(2):
            pool.submit(_spin, 20.0)
        deadline = time.monotonic() + 10
        while len(pool._processes) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)  # both workers busy
        workers = list(pool._processes.values())
        start = time.monotonic()
        engine._drop_pool(2)
        for proc in workers:
            proc.join(5)
        assert [proc.exitcode for proc in workers] == [-signal.SIGKILL] * 2
        assert time.monotonic() - start < 5  # not the 20 s they were asked to spin
    finally:
        signal.signal(signal.SIGTERM, previous)
