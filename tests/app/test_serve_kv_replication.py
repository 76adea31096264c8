"""KV heads replicated past TP over HTTP (docs/serving.md, "KV heads replicated past TP (kvrep10)"): /v1/serve and
/v1/serve/search run Qwen3-30B-A3B (4 KV heads) at TP 8 as the engines do, a tp that neither divides nor is a
multiple of the KV heads is a 422 naming both, and the KV transfer says the bytes its copies add (wire_bytes)."""

from __future__ import annotations

import json

from app.cli import main

QWEN3 = {
    "model": {"preset": "qwen3-30b-a3b"},
    "cluster": {"preset": "dgx-h100", "num_nodes": 1},
    "engine": "sglang",
    "traffic": {"input_tokens": 2000, "output_tokens": 200, "concurrency": 32},
    "deployment": {"pools": [{"role": "both", "workers": 1, "tp": 8, "ep": 8}]},
}
DISAGG = {"role": "prefill", "workers": 1, "tp": 8, "ep": 8}, {"role": "decode", "workers": 1, "tp": 4, "ep": 4}


def test_qwen3_at_tp8_is_served(api):
    r = api.post("/v1/serve", json=QWEN3)
    assert r.status_code == 200, r.text
    d = r.json()
    assert d["fits"] and d["pools"][0]["gpus"] == 8
    assert d["kv_cache"]["bytes_per_token"] == 48 * 2 * 4 * 128 * 2  # the model's; each rank keeps 1 of the 4 heads
    # one head per rank: 0.9 x 80 GB less ~7.6 GB of weights per rank, over 48 x 2 x 1 x 128 x 2 = 24,576 B per token
    assert 2.4e6 < d["kv_cache"]["capacity_tokens"] < 2.95e6


def test_disaggregated_copies_are_on_the_wire(api):
    body = QWEN3 | {"cluster": {"preset": "dgx-h100", "num_nodes": 2}, "deployment": {"pools": list(DISAGG)}}
    sglang = api.post("/v1/serve", json=body)
    assert sglang.status_code == 200, sglang.text
    kv = sglang.json()["kv_transfer"]
    # SGLang sends every prefill copy of a head: 8 ranks x 1 head, twice the request's 2,000 x 98,304 B
    assert kv["bytes_per_request"] == 2000 * 98_304 and kv["wire_bytes"] == 2 * kv["bytes_per_request"]
    assert kv["senders"] == 8
    trt = api.post("/v1/serve", json=body | {"engine": "trtllm"}).json()["kv_transfer"]
    assert trt["wire_bytes"] == trt["bytes_per_request"] and trt["senders"] == 4  # one copy per head
    vllm = api.post("/v1/serve", json=body | {"engine": "vllm"})
    assert vllm.status_code == 422, vllm.text
    err = vllm.json()["detail"][0]
    assert err["loc"][1:5] == ["deployment", "pools", "0", "tp"]
    assert "prefill tp 8 and decode tp 4 over 4 KV heads" in err["msg"] and "NixlConnector" in err["msg"]


def test_tp_not_a_multiple_of_the_kv_heads_is_a_422(api):
    toy = {"preset": "llama3-8b", "num_attention_heads": 24, "num_kv_heads": 3, "hidden_size": 3072}
    r = api.post("/v1/serve", json=QWEN3 | {"model": toy, "deployment": {"pools": [{"tp": 8}]}})
    assert r.status_code == 422, r.text
    err = r.json()["detail"][0]
    assert err["loc"][1:5] == ["deployment", "pools", "0", "tp"]
    assert "tp 8" in err["msg"] and "num_kv_heads 3" in err["msg"]


def test_the_sla_search_evaluates_tp8(api):
    body = {k: QWEN3[k] for k in ("model", "cluster", "traffic")} | {
        "engines": ["vllm"],
        "modes": ["aggregated"],
        "sla": {"ttft_s": 30.0, "tpot_s": 1.0},
    }
    r = api.post("/v1/serve/search", json=body)
    assert r.status_code == 200, r.text
    d = r.json()
    assert not any("num_kv_heads" in why for why in d["rejected"]), d["rejected"]
    tp8 = [p for p in d["pareto"] + d["results"] if p["request"]["deployment"]["pools"][0]["tp"] == 8]
    assert tp8, d["pareto"]


def test_the_cli_serves_qwen3_at_tp8_and_refuses_alike(tmp_path, capsys):
    """`commplan serve-plan FILE` answers what POST /v1/serve answers: one replicated head per rank at TP 8, and
    vLLM's connector rule as the CLI's field: rule line (exit 2)."""
    path = tmp_path / "qwen3.json"
    path.write_text(json.dumps(QWEN3))
    assert main(["serve-plan", str(path), "--format", "json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["pools"][0]["gpus"] == 8 and d["kv_cache"]["bytes_per_token"] == 48 * 2 * 4 * 128 * 2
    assert 2.4e6 < d["kv_cache"]["capacity_tokens"] < 2.95e6
    body = QWEN3 | {"engine": "vllm", "cluster": {"preset": "dgx-h100", "num_nodes": 2}}
    path.write_text(json.dumps(body | {"deployment": {"pools": list(DISAGG)}}))
    assert main(["serve-plan", str(path)]) == 2
    err = capsys.readouterr().err
    assert "deployment.pools.0.tp" in err and "prefill tp 8 and decode tp 4 over 4 KV heads" in err, err
