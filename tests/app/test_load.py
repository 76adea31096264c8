"""A bounded loopback load test against the real server: 32 clients for ~20 s (COMMPLAN_LOAD_S) mixing good,
bad and over-budget requests, plus a prober on /healthz. Zero transport errors, every answer its expected
status, and /healthz prompt while the heavy requests run. Prints the latency percentiles
(docs/hardening.md quotes a run)."""

from __future__ import annotations

import os
import random
import threading
import time

import httpx
import pytest

DURATION = float(os.environ.get("COMMPLAN_LOAD_S", "20"))
CLIENTS = 32
SMALL = {"model": {"preset": "llama3-8b"}, "parallel": {"tp": 8}, "cluster": {"preset": "dgx-h100"}}
LARGE = {
    "model": {"preset": "llama3-70b"},
    "workload": {"micro_batch_size": 1, "global_batch_size": 1024},
    "parallel": {"tp": 8, "pp": 4, "zero_stage": 1},
    "cluster": {"preset": "dgx-h100", "num_nodes": 256},
}
TORUS = LARGE | {"cluster": {"preset": "tpu-torus", "num_nodes": 131072}}
# (method, path, body or raw text, expected status)
MIX = [
    ("GET", "/healthz", None, 200),
    ("HEAD", "/healthz", None, 200),
    ("POST", "/v1/plan", SMALL, 200),
    ("POST", "/v1/plan", LARGE, 200),
    ("POST", "/v1/plan", SMALL | {"parallel": {"tp": True}}, 422),
    ("POST", "/v1/plan", '{"model": {"preset": "llama3-8b", "seq_length": NaN}, "cluster": {}}', 422),
    ("POST", "/v1/plan", '{"model": {"preset": "\\ud800"}, "cluster": {"preset": "dgx-h100"}}', 422),
    ("POST", "/v1/plan", TORUS, 422),
    ("POST", "/v1/plan/batch", {"requests": [SMALL, SMALL], "x": 1}, 422),
    ("POST", "/v1/plan/batch", {"requests": [SMALL, LARGE]}, 200),
    (
        "POST",
        "/v1/collectives/price",
        {
            "op": "allreduce",
            "message_bytes": 1 << 30,
            "cluster": {"preset": "dgx-h100", "num_nodes": 16},
            "group_size": 128,
        },
        200,
    ),
    (
        "POST",
        "/v1/collectives/price",
        {"op": "allreduce", "message_bytes": 8, "cluster": {"preset": "dgx-h100"}, "ranks": [0, 2**64]},
        422,
    ),
    ("GET", "/v1/presets/models", None, 200),
]


def _request(client: httpx.Client, method: str, path: str, body):
    if body is None:
        return client.request(method, path)
    if isinstance(body, str):
        return client.post(
            path, content=body.encode("utf-8", "surrogatepass"), headers={"content-type": "application/json"}
        )
    return client.post(path, json=body)


@pytest.mark.slow
def test_mixed_load_keeps_every_connection_and_healthz_prompt(server):
    latencies: list[float] = []
    health: list[float] = []
    failures: list[str] = []
    lock = threading.Lock()
    stop = time.monotonic() + DURATION

    def client(seed: int) -> None:
        rng = random.Random(seed)
        with httpx.Client(base_url=server, timeout=30) as http:  # keep-alive: one connection per client
            while time.monotonic() < stop:
                method, path, body, expected = rng.choice(MIX)
                start = time.monotonic()
                try:
                    response = _request(http, method, path, body)
                except httpx.TransportError as err:
                    with lock:
                        failures.append(f"{method} {path}: {type(err).__name__}")
                    continue
                took = time.monotonic() - start
                with lock:
                    latencies.append(took)
                    if response.status_code != expected:
                        failures.append(f"{method} {path}: {response.status_code} {response.text[:120]}")

    def prober() -> None:
        with httpx.Client(base_url=server, timeout=10) as http:
            while time.monotonic() < stop:
                start = time.monotonic()
                try:
                    ok = http.get("/healthz").status_code == 200
                except httpx.TransportError as err:
                    ok = False
                    failures.append(f"healthz: {type(err).__name__}")
                health.append(time.monotonic() - start)
                if not ok:
                    failures.append("healthz not 200")
                time.sleep(0.1)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
    threads.append(threading.Thread(target=prober))
    for t in threads:
        t.start()
    for t in threads:
        t.join(DURATION + 60)
    assert not failures, failures[:10]
    latencies.sort()
    health.sort()
    p50, p99 = latencies[len(latencies) // 2], latencies[int(len(latencies) * 0.99)]
    h99 = health[int(len(health) * 0.99)]
    print(
        f"\n{len(latencies)} requests from {CLIENTS} clients in {DURATION:g} s: p50 {p50 * 1e3:.0f} ms, "
        f"p99 {p99 * 1e3:.0f} ms, max {latencies[-1] * 1e3:.0f} ms; /healthz p99 {h99 * 1e3:.0f} ms, "
        f"max {health[-1] * 1e3:.0f} ms"
    )
    assert len(latencies) > CLIENTS
    assert h99 < 1.0, f"/healthz p99 {h99:.2f} s while the heavy requests ran"
