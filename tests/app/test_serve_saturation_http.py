"""Over HTTP (mend13c): a request rate above what a deployment serves answers ``saturated: true`` with the served
rate (its capacity) as request_rate and throughput, ttft_s null, no NaN or infinity; below it ``saturated: false``
and the asked rate. The SLA search's answer says the GPUs of each Pareto point and the fewest and the most GPUs of
the deployments it listed, and counts the smaller sizes against COMMPLAN_MAX_SERVE_CANDIDATES."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings
from collectives.topology import cluster_preset
from planner import MODEL_PRESETS
from planner.serving import Traffic
from planner.serving.search import SLA, candidates

ROOT = Path(__file__).resolve().parents[2]
SERVE = json.loads((ROOT / "examples/serve-llama3-70b.json").read_text())
SEARCH = json.loads((ROOT / "examples/serve-search-llama3-70b.json").read_text())


def _at(api, rate: float) -> dict:
    body = SERVE | {"traffic": {"input_tokens": 1000, "output_tokens": 200, "request_rate": rate}}
    r = api.post("/v1/serve", json=body)
    assert r.status_code == 200, r.text
    json.loads(r.text, parse_constant=lambda c: pytest.fail(f"{c} in the answer"))  # no NaN / Infinity
    return r.json()


def test_a_saturated_rate_answers_what_it_serves(api):
    capacity = _at(api, 1000.0)["request_rate"]
    assert 0 < capacity < 1000.0
    over = _at(api, 2 * capacity)
    assert over["saturated"] is True and over["ttft_s"] is None
    assert over["request_rate"] == pytest.approx(capacity, rel=1e-12)
    t = over["throughput"]
    assert t["output_tokens_per_s"] == pytest.approx(capacity * 200, rel=1e-12)
    assert t["input_tokens_per_s"] == pytest.approx(capacity * 1000, rel=1e-12)
    assert t["output_tokens_per_s_per_gpu"] == pytest.approx(capacity * 200 / over["gpus"], rel=1e-12)
    assert over["pools"][0]["batch"] == over["kv_cache"]["max_concurrency"]
    assert over["bottleneck"] in ("prefill", "decode")
    below = _at(api, capacity / 2)
    assert below["saturated"] is False and below["request_rate"] == capacity / 2 and below["ttft_s"] > 0
    closed = api.post("/v1/serve", json=SERVE).json()
    assert closed["saturated"] is False  # a concurrency: a closed loop's queue is bounded


def test_the_search_counts_and_says_its_sizes():
    """The example search (Llama-3 70B on 2 nodes, vLLM and SGLang): its deployments on 8 GPUs are listed after the
    16-GPU ones; under a limit that holds only the 16-GPU ones, those alone (as before round 13)."""
    model, cluster = MODEL_PRESETS["llama3-70b"], cluster_preset("dgx-h100", 2)
    traffic, sla = Traffic(2000, 200, concurrency=128), SLA(3.0, 0.06)
    every = candidates(model, cluster, traffic, ("vllm", "sglang"), ("aggregated", "disaggregated"), sla, 2000)
    whole = candidates(model, cluster, traffic, ("vllm", "sglang"), ("aggregated", "disaggregated"), sla, 1)
    assert len(whole) < len(every)
    answer = TestClient(create_app()).post("/v1/serve/search", json=SEARCH).json()
    assert answer["candidates"] == len(every)
    assert answer["deployment_gpus"] == {
        "fewest": min(sum(p.gpus for p in pools) for _, _, pools in every),
        "most": 16,
    }
    assert answer["deployment_gpus"]["fewest"] <= 8
    for point in answer["pareto"]:
        pools = point["request"]["deployment"]["pools"]
        assert point["gpus"] == sum(p["workers"] * p.get("tp", 1) * p.get("pp", 1) * p.get("dp", 1) for p in pools)
    for hit in answer["results"]:
        assert hit["answer"]["saturated"] is False
    tight = TestClient(create_app(Settings(max_serve_candidates=len(whole)))).post("/v1/serve/search", json=SEARCH)
    assert tight.status_code == 200 and tight.json()["candidates"] == len(whole)
    assert tight.json()["deployment_gpus"]["most"] == 16
    assert tight.json()["deployment_gpus"]["fewest"] > answer["deployment_gpus"]["fewest"]
