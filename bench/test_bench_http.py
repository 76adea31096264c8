"""HTTP benchmarks against the real service (uvicorn on loopback), issue 5 targets:
- POST /v1/plan for a 1,024-GPU cluster: p50 round trip under 100 ms. Every round is a different
  configuration, so no round is answered from the price cache of an earlier one.
- POST /v1/plan/batch with 1,000 small plans: under 10 s.
"""

import itertools
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def base_url():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "serve", "--port", str(port)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(150):
        try:
            httpx.get(f"{url}/healthz", timeout=1)
            break
        except httpx.TransportError:
            time.sleep(0.2)
    yield url
    proc.terminate()
    proc.wait(timeout=10)


def configs_1024():
    """Distinct Llama-3 70B layouts on 128 DGX H100 nodes (1,024 GPUs)."""
    for tp, pp, mb, zero in itertools.product((8, 4, 2), (4, 8, 2, 1), (1, 2), (1, 0, 3)):
        dp = 1024 // (tp * pp)
        yield {
            "model": {"preset": "llama3-70b"},
            "cluster": {"preset": "dgx-h100", "num_nodes": 128},
            "workload": {"micro_batch_size": mb, "global_batch_size": mb * dp * 8},
            "parallel": {"tp": tp, "pp": pp, "dp": dp, "zero_stage": zero, "sequence_parallel": tp > 1},
        }


def test_plan_round_trip_1024_gpus(benchmark, base_url):
    configs = configs_1024()
    with httpx.Client(base_url=base_url, timeout=60) as client:

        def setup():
            return (next(configs),), {}

        def post(body):
            r = client.post("/v1/plan", json=body)
            assert r.status_code == 200, r.text

        benchmark.pedantic(post, setup=setup, rounds=60, iterations=1)


def small_plans(n=1000):
    """Llama-3 8B on 1 to 8 DGX H100 nodes in every layout: n distinct small plans."""
    combos = itertools.product((1, 2, 4, 8), (1, 2, 4), (1, 2), (0, 1, 2, 3), (1, 2, 4), (1, 2, 4, 8, 16))
    fitting = ((tp, pp, cp, zero, mb, nodes) for tp, pp, cp, zero, mb, nodes in combos if tp * pp * cp <= nodes * 8)
    for tp, pp, cp, zero, mb, nodes in itertools.islice(fitting, n):
        yield small_plan(nodes, tp, pp, cp, zero, mb)


def small_plan(nodes, tp, pp, cp, zero, mb) -> dict:
    """One Llama-3 8B plan on ``nodes`` DGX H100 nodes, data parallel over the rest, 4 micro-batches a rank
    (bench/plan_throughput.py's small plans too)."""
    dp = nodes * 8 // (tp * pp * cp)
    return {
        "model": {"preset": "llama3-8b"},
        "cluster": {"preset": "dgx-h100", "num_nodes": nodes},
        "workload": {"micro_batch_size": mb, "global_batch_size": mb * dp * 4},
        "parallel": {"tp": tp, "pp": pp, "cp": cp, "dp": dp, "zero_stage": zero, "sequence_parallel": tp > 1},
    }


def test_batch_of_1000_small_plans(benchmark, base_url):
    body = {"requests": list(small_plans())}
    assert len(body["requests"]) == 1000
    with httpx.Client(base_url=base_url, timeout=120) as client:

        def post():
            r = client.post("/v1/plan/batch", json=body)
            assert r.status_code == 200
            assert all(x["ok"] for x in r.json()["results"])

        benchmark.pedantic(post, rounds=3, iterations=1)
