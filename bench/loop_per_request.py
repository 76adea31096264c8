"""How long one request holds the event loop, request by request (issue 26 item 4, round five).

The app runs in this process under uvicorn on a loopback port, on a thread of its own (its lifespan included:
warm-up and the start-up objects frozen out of the garbage collector, app/main.py); the requests come from the
main thread over HTTP (through httpx's in-process ASGI transport instead, whose client shares the server's loop,
the same calibrate showed ticks 0.35-1 s late that a real server did not). A 1 ms asyncio timer on the server's
loop records how late each tick comes, how much CPU the loop's thread used meanwhile (``time.thread_time``) and
how long it waited for a CPU (its run-queue wait, tests/app/prober.py ``runq_s``); ``gc.callbacks`` every
collection over 10 ms. Each request is sent alone, twice, and its worst tick is printed with the loop's own CPU
and run-queue wait in it: what is left of the lateness is the loop waiting for the GIL (a collection, a long C
call in a work thread, or a holder the OS is not running). docs/hardening.md "Round five" quotes it.

    PYTHONPATH=$PWD python bench/loop_per_request.py              # as served
    PYTHONPATH=$PWD python bench/loop_per_request.py --on-loop    # FastAPI reads every body on the loop
    PYTHONPATH=$PWD python bench/loop_per_request.py --no-freeze  # the collector walks the start-up objects too
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import sys
import threading
import time
from pathlib import Path

import httpx
import uvicorn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import app.body
from app.limits import GuardedH11
from app.main import create_app
from tests.app.prober import runq_s
from tests.app.test_load import CALIBRATE_AT_LIMIT, HEAVY, SEARCH, SMALL
from tests.conftest import free_port

TICK_S = 0.001
CASES = {
    "plan: Llama-3 70B on 2,048 H100": ("/v1/plan", HEAVY),
    "calibrate at its 1,000-row limit": ("/v1/calibrate", CALIBRATE_AT_LIMIT),
    "batch of 2,000 small plans": ("/v1/plan/batch", {"requests": [SMALL] * 2000}),
    "search, top_k 1,000": ("/v1/search", SEARCH | {"top_k": 1000}),
    "300,000 unknown keys (422)": ("/v1/plan", SMALL | {f"k{i}": i for i in range(300_000)}),
    "131,072 device names (422)": (
        "/v1/plan",
        SMALL | {"cluster": {"preset": "dgx-h100", "devices": [f"gpu{i}" for i in range(131_072)]}},
    ),
}


class Loop:
    """The instrument on the server's event loop: a 1 ms timer's ticks (how late, the loop thread's CPU and
    run-queue wait in each) and every collection over 10 ms, from ``start()`` to ``stop()``."""

    def __init__(self):
        self.ticks: list[tuple[float, float, float]] = []
        self.pauses: list[float] = []
        self.recording = False
        self._gc_start = 0.0

    async def tick(self) -> None:
        prev, cpu, runq = time.monotonic(), time.thread_time(), runq_s()
        while True:
            await asyncio.sleep(TICK_S)
            now, ncpu, nrunq = time.monotonic(), time.thread_time(), runq_s()
            if self.recording:
                self.ticks.append((now - prev - TICK_S, ncpu - cpu, nrunq - runq))
            prev, cpu, runq = now, ncpu, nrunq

    def on_gc(self, phase, info) -> None:
        if phase == "start":
            self._gc_start = time.monotonic()
        elif self.recording and time.monotonic() - self._gc_start > 0.01:
            self.pauses.append(round((time.monotonic() - self._gc_start) * 1e3, 1))


def serve(api, port: int, loop: Loop, no_freeze: bool) -> None:
    """uvicorn on 127.0.0.1:``port`` in this thread, as ``commplan serve`` runs it (GuardedH11, no access log),
    with the instrument on its loop."""

    async def main() -> None:
        config = uvicorn.Config(api, host="127.0.0.1", port=port, http=GuardedH11, access_log=False,
                                log_level="warning")  # fmt: skip
        server = uvicorn.Server(config)
        ticker = asyncio.ensure_future(loop.tick())
        serving = asyncio.ensure_future(server.serve())
        while not server.started:
            await asyncio.sleep(0.01)
        if no_freeze:
            gc.unfreeze()
        await serving
        ticker.cancel()

    asyncio.run(main())


def main(args) -> None:
    if args.on_loop:
        app.body.OFF_LOOP_BYTES = 1 << 40
    loop, port = Loop(), free_port()
    gc.callbacks.append(loop.on_gc)
    threading.Thread(target=serve, args=(create_app(), port, loop, args.no_freeze), daemon=True).start()
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=300, transport=httpx.HTTPTransport(retries=9)) as c:
        while True:
            try:
                c.get("/healthz")
                break
            except httpx.TransportError:
                time.sleep(0.05)
        for name, (path, body) in CASES.items():
            if args.only and args.only not in name:
                continue
            raw = json.dumps(body).encode()
            for _ in range(args.repeat):
                loop.ticks, loop.pauses = [], []
                time.sleep(0.02)
                loop.recording = True
                start, cpu = time.monotonic(), time.process_time()
                response = c.post(path, content=raw, headers={"content-type": "application/json"})
                took, cpu = time.monotonic() - start, time.process_time() - cpu
                time.sleep(0.02)  # the tick after a blocked stretch records it
                loop.recording = False
                late, loop_cpu, runq = max(loop.ticks)
                print(f"{name:34s} {len(raw) / 1e6:5.2f} MB  {response.status_code}  {took * 1e3:6.0f} ms "
                      f"(CPU {cpu * 1e3:5.0f})  worst tick {late * 1e3:5.0f} ms late: loop CPU {loop_cpu * 1e3:5.1f} "
                      f"ms, waiting for a CPU {runq * 1e3:5.1f} ms; collections >10 ms {loop.pauses}")  # fmt: skip
    print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--on-loop", action="store_true", help="FastAPI decodes and validates every body on the loop")
    ap.add_argument("--no-freeze", action="store_true", help="unfreeze the start-up objects after the lifespan")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--only", help="only the requests whose name holds this")
    main(ap.parse_args())
