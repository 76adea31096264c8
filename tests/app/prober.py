"""/healthz probers for the load tests, each a process of its own (issue 26 item 4).

A prober that shares a process with the threads sending the heavy requests (the suite's test until issue 26's
round three) measures that process too: its garbage collector, which late in a whole-suite run walks every
object the suite has kept, and the GIL it shares with the sending threads. Run here as a separate process (in
a session of its own), it measures the server. Beside the server it probes a **control**: a process that
answers every request at once with a fixed 200 and does nothing else, probed in the same seconds, so a run
says how much of a slow probe the machine alone costs (a woken process waiting for a busy CPU).

    python tests/app/prober.py probe OUT STOP URL...   # GET URL/healthz in turn every 20 ms until STOP exists
    python tests/app/prober.py control PORT             # the control server on 127.0.0.1:PORT

Only the standard library and httpx are imported, so a prober starts in a fraction of a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import threading
import time
from pathlib import Path

import httpx

INTERVAL_S = 0.02
ANSWER = b'HTTP/1.1 200 OK\r\ncontent-length: 15\r\ncontent-type: application/json\r\n\r\n{"status":"ok"}'


def runq_s() -> float:
    """This thread's run-queue wait so far, in seconds: runnable but not running (Linux
    /proc/self/task/TID/schedstat, field 2 in ns); 0 elsewhere."""
    try:
        with open(f"/proc/self/task/{threading.get_native_id()}/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except OSError:
        return 0.0


def probe(out: str, stop: str, urls: list[str]) -> None:
    """GET each URL's /healthz in turn, then sleep INTERVAL_S, until the file ``stop`` exists; writes
    ``{url: [{"t": wall start, "took": s, "runq": s}, ...]}`` to ``out``. ``out + ".ready"`` appears after the
    first round, so the caller starts its load once probing has begun."""
    records: dict[str, list] = {url: [] for url in urls}
    clients = {url: httpx.Client(base_url=url, timeout=10) for url in urls}  # keep-alive, one connection each
    try:
        while not os.path.exists(stop):
            for url, client in clients.items():
                t, start, queued = time.time(), time.monotonic(), runq_s()
                status = client.get("/healthz").status_code
                took = time.monotonic() - start
                records[url].append({"t": t, "took": took, "runq": runq_s() - queued, "status": status})
            if len(records[urls[0]]) == 1:
                Path(out + ".ready").touch()
            time.sleep(INTERVAL_S)
    finally:
        for client in clients.values():
            client.close()
        Path(out).write_text(json.dumps(records))


def control(port: int) -> None:
    """Answer every HTTP/1.1 request on 127.0.0.1:``port`` at once with a fixed 200; nothing else."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while await reader.readuntil(b"\r\n\r\n"):
                writer.write(ANSWER)

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", port)
        await server.serve_forever()

    asyncio.run(main())


def percentiles(took: list[float]) -> dict[str, float]:
    """p50, p95, p99 and max of probe durations (the p-th is the value at index int(n * p))."""
    ordered = sorted(took)
    n = len(ordered)
    return {"n": n, "p50": ordered[n // 2], "p95": ordered[int(n * 0.95)], "p99": ordered[int(n * 0.99)],
            "max": ordered[-1]}  # fmt: skip


if __name__ == "__main__":
    if sys.argv[1] == "probe":
        probe(sys.argv[2], sys.argv[3], sys.argv[4:])
    elif sys.argv[1] == "control":
        control(int(sys.argv[2]))
    else:
        sys.exit(f"usage: {sys.argv[0]} probe OUT STOP URL... | control PORT")
