"""Plans per second and plan latency of a real `commplan serve` (thread mode) under concurrent clients, and
/healthz while they run: the cost side of the compute gate (app/threads.py, issue 26 item 4).

    PYTHONPATH=$PWD python bench/plan_throughput.py [--root TREE] [--env COMMPLAN_COMPUTE_THREADS=9 ...]
    /usr/bin/time -v python bench/plan_throughput.py ...   # CPU seconds of the server and the clients

``--root`` serves another checkout (e.g. ``git archive main``), so a before and an after run the same driver.
Three phases, each on distinct plans (no answer comes from the price cache of an earlier request):
  - ``alone``: one client, 60 small plans one after another (Llama-3 8B on 1-16 DGX H100 nodes): the latency a
    plan costs with nothing else running;
  - ``small``: 8 clients, 30 small plans each: plans/s;
  - ``mixed``: 6 clients sending small plans while 2 send heavy ones (Llama-3 70B on 2,048 H100s, ~0.5 s of
    CPU each), for a fixed number of each: plans/s, and the small plans' latency behind the heavy ones.
A prober thread GETs /healthz every 20 ms throughout (in this process: its figures include this process's
clients competing for the GIL, so they are an upper bound; tests/app/test_load.py probes from a process of
its own). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
from test_bench_http import small_plan  # bench/: one builder of the small plans' bodies

ROOT = Path(__file__).resolve().parents[1]
HEAVY = {
    "model": {"preset": "llama3-70b"},
    "workload": {"micro_batch_size": 1, "global_batch_size": 1024},
    "parallel": {"tp": 8, "pp": 4, "zero_stage": 1},
    "cluster": {"preset": "dgx-h100", "num_nodes": 256},
}


def small_plans():
    """Distinct Llama-3 8B layouts on 1-16 DGX H100 nodes (bench/test_bench_http.small_plans' grid, wider)."""
    combos = itertools.product((1, 2, 4, 8, 16), (1, 2, 4, 8), (1, 2, 4), (1, 2), (0, 1, 2, 3), (1, 2, 4))
    for nodes, tp, pp, cp, zero, mb in combos:
        if tp * pp * cp <= nodes * 8:
            yield small_plan(nodes, tp, pp, cp, zero, mb)


def heavy_plans():
    """Llama-3 70B on 2,048 H100s, a different global batch each (the prices of its calls are shared)."""
    for k in itertools.count(1):
        yield HEAVY | {"workload": {"micro_batch_size": 1, "global_batch_size": 1024 * k}}


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(len(xs) * q))] * 1e3, 1) if xs else float("nan")


def summary(took: list[float]) -> dict:
    return {"n": len(took), "p50_ms": pct(took, 0.5), "p95_ms": pct(took, 0.95), "p99_ms": pct(took, 0.99),
            "max_ms": pct(took, 1.0)}  # fmt: skip


def phase(base: str, lanes: list[list[dict]]) -> dict:
    """Each lane a client sending its bodies one after another; all at once. Plans/s over the phase."""
    took: list[list[float]] = [[] for _ in lanes]
    bad: list[str] = []

    def client(i: int) -> None:
        with httpx.Client(base_url=base, timeout=300) as http:
            for body in lanes[i]:
                t = time.monotonic()
                r = http.post("/v1/plan", json=body)
                took[i].append(time.monotonic() - t)
                if r.status_code != 200:
                    bad.append(f"{r.status_code} {r.text[:200]}")

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(lanes))]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - start
    assert not bad, bad[:3]
    n = sum(map(len, lanes))
    return {"plans": n, "wall_s": round(wall, 2), "plans_per_s": round(n / wall, 1), "lanes": took}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=str(ROOT), help="the checkout to serve")
    ap.add_argument("--env", nargs="*", default=[], help="NAME=VALUE for the server")
    ap.add_argument("--port", type=int, help="the server's port (default: a free one)")
    ap.add_argument("--out", help="also append the JSON line to this file (a whole-process timer may drop stdout)")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from tests.conftest import free_port

    port = args.port or free_port()
    env = dict(os.environ, PYTHONPATH=args.root, COMMPLAN_DEADLINE_S="300", COMMPLAN_QUEUE_S="300",
               COMMPLAN_WORK_SLOTS="16", **dict(e.split("=", 1) for e in args.env))  # fmt: skip
    cmd = [sys.executable, "-m", "app.cli", "serve", "--host", "127.0.0.1", "--port", str(port)]
    server = subprocess.Popen(cmd, cwd=args.root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    health: list[float] = []
    stop = threading.Event()

    def prober() -> None:
        with httpx.Client(base_url=base, timeout=30) as http:
            while not stop.is_set():
                t = time.monotonic()
                http.get("/healthz")
                health.append(time.monotonic() - t)
                time.sleep(0.02)

    try:
        with httpx.Client(transport=httpx.HTTPTransport(retries=9)) as c:
            assert c.get(base + "/healthz", timeout=10).status_code == 200
        small = small_plans()
        with httpx.Client(base_url=base, timeout=60) as http:  # warm: presets, first plan
            assert http.post("/v1/plan", json=next(small)).status_code == 200
            assert http.post("/v1/plan", json=HEAVY).status_code == 200
        probe = threading.Thread(target=prober)
        probe.start()
        alone = phase(base, [list(itertools.islice(small, 60))])
        burst = phase(base, [list(itertools.islice(small, 30)) for _ in range(8)])
        heavy = heavy_plans()
        mixed = phase(base, [list(itertools.islice(small, 30)) for _ in range(6)]
                      + [list(itertools.islice(heavy, 4)) for _ in range(2)])  # fmt: skip
        stop.set()
        probe.join()
    finally:
        server.terminate()
        server.wait(15)  # reaped here: its CPU seconds count in this process's children (a paired timing tool's cpu)
    out = {
        "root": args.root, "env": args.env, "load": round(os.getloadavg()[0], 1),
        "alone": {**summary(alone.pop("lanes")[0]), **alone},
        "small": {**summary([x for lane in burst.pop("lanes") for x in lane]), **burst},
        "mixed": {"small": summary([x for lane in mixed["lanes"][:6] for x in lane]),
                  "heavy": summary([x for lane in mixed.pop("lanes")[6:] for x in lane]), **mixed},
        "healthz": summary(health),
    }  # fmt: skip
    print(json.dumps(out))
    if args.out:
        with open(args.out, "a") as f:
            f.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    main()
