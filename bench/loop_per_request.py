"""How long one request holds the event loop, request by request (issue 26 item 4, round five).

The app runs in this process (its lifespan included: warm-up and the start-up objects frozen out of the garbage
collector, app/main.py) behind httpx's ASGI transport; a 1 ms asyncio timer records how late each tick comes and
how much CPU the loop's thread used meanwhile (``time.thread_time``) and how long it waited for a CPU (its
run-queue wait, tests/app/prober.py ``runq_s``), and ``gc.callbacks`` every collection over
10 ms. Each request is sent alone, twice, and its worst tick is printed with the loop's own CPU and run-queue
wait in it: what is left of the lateness is the loop waiting for the GIL (a collection, a long C call in a work
thread, or a holder the OS is not running). docs/hardening.md "Round five" quotes it.

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
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import app.body
from app.main import create_app, lifespan
from tests.app.prober import runq_s
from tests.app.test_load import CALIBRATE_AT_LIMIT, HEAVY, SEARCH, SMALL

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


async def measure(client: httpx.AsyncClient, path: str, raw: bytes) -> dict:
    ticks: list[tuple[float, float, float]] = []
    pauses: list[float] = []
    started: dict = {}

    def on_gc(phase, info):
        if phase == "start":
            started["t"] = time.monotonic()
        elif time.monotonic() - started["t"] > 0.01:
            pauses.append(round((time.monotonic() - started["t"]) * 1e3, 1))

    async def tick():
        prev, cpu, runq = time.monotonic(), time.thread_time(), runq_s()
        while True:
            await asyncio.sleep(TICK_S)
            now, ncpu, nrunq = time.monotonic(), time.thread_time(), runq_s()
            ticks.append((now - prev - TICK_S, ncpu - cpu, nrunq - runq))
            prev, cpu, runq = now, ncpu, nrunq

    ticker = asyncio.ensure_future(tick())
    await asyncio.sleep(0.02)
    gc.callbacks.append(on_gc)
    start, cpu = time.monotonic(), time.process_time()
    response = await client.post(path, content=raw, headers={"content-type": "application/json"})
    took, cpu = time.monotonic() - start, time.process_time() - cpu
    await asyncio.sleep(0.02)  # the tick after a blocked stretch records it
    gc.callbacks.remove(on_gc)
    ticker.cancel()
    late, loop_cpu, loop_runq = max(ticks)
    return {"status": response.status_code, "answer_kB": len(response.content) // 1000, "wall_ms": took * 1e3,
            "cpu_ms": cpu * 1e3, "worst_tick_ms": late * 1e3, "its_loop_cpu_ms": loop_cpu * 1e3,
            "its_runq_ms": loop_runq * 1e3, "gc_over_10ms": pauses}  # fmt: skip


async def main(args) -> None:
    api = create_app()
    if args.on_loop:
        app.body.OFF_LOOP_BYTES = 1 << 40
    async with lifespan(api):
        if args.no_freeze:
            gc.unfreeze()
        transport = httpx.ASGITransport(app=api)
        async with httpx.AsyncClient(transport=transport, base_url="http://bench", timeout=300) as client:
            for name, (path, body) in CASES.items():
                raw = json.dumps(body).encode()
                for _ in range(args.repeat):
                    r = await measure(client, path, raw)
                    print(f"{name:34s} {len(raw) / 1e6:5.2f} MB  {r['status']}  {r['wall_ms']:6.0f} ms "
                          f"(CPU {r['cpu_ms']:5.0f})  worst tick {r['worst_tick_ms']:5.0f} ms late: loop CPU "
                          f"{r['its_loop_cpu_ms']:5.1f} ms, waiting for a CPU {r['its_runq_ms']:5.1f} ms; "
                          f"collections >10 ms {r['gc_over_10ms']}")  # fmt: skip
    print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--on-loop", action="store_true", help="FastAPI decodes and validates every body on the loop")
    ap.add_argument("--no-freeze", action="store_true", help="unfreeze the start-up objects after the lifespan")
    ap.add_argument("--repeat", type=int, default=2)
    asyncio.run(main(ap.parse_args()))
