"""user14's reproduction over HTTP: POST /v1/serve Mixtral 8x7B on vLLM, one TP2 worker on a DGX H100, 1,000/200
tokens at 64, said `fits: false`, 94.5 GB a GPU (every expert whole on each GPU) while POST /v1/plan of the same
layout holds 23.35B parameters (46.7 GB). The engines split each expert over TP without EP (docs/serving.md
"Experts over tensor-parallel ranks (mend14b)"): the serving pool holds /v1/plan's weights."""

from __future__ import annotations

import pytest

SERVE = {
    "model": {"preset": "mixtral-8x7b"},
    "cluster": {"preset": "dgx-h100"},
    "engine": "vllm",
    "traffic": {"input_tokens": 1000, "output_tokens": 200, "concurrency": 64},
    "deployment": {"pools": [{"role": "both", "workers": 1, "tp": 2}]},
}
PLAN = {
    "model": {"preset": "mixtral-8x7b"},
    "cluster": {"preset": "dgx-h100"},
    "workload": {"kind": "inference", "phase": "decode", "batch_size": 64, "context_length": 1100},
    "parallel": {"tp": 2},
}


@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
def test_mixtral_tp2_fits_with_the_plans_weights(api, engine):
    plan = api.post("/v1/plan", json=PLAN)
    assert plan.status_code == 200, plan.text
    (stage,) = plan.json()["memory"]["per_stage"]
    assert stage["params_bytes"] == 46_704_107_520  # 23,352,053,760 parameters in bf16 (test_serving_expert_tp)
    r = api.post("/v1/serve", json={**SERVE, "engine": engine})
    assert r.status_code == 200, r.text
    d = r.json()
    (pool,) = d["pools"]
    assert d["fits"] is True and pool["fits"] is True
    # the weights plus an 8,192-token prefill pass's activations and buffers: 52.4 GB, no longer 94.5 GB
    assert stage["params_bytes"] < pool["memory_peak_bytes"] < stage["params_bytes"] + 8e9
    # the experts' outputs summed by the layer's TP all-reduce, one a layer as the attention's
    counts = {c["name"]: c["calls_per_iteration"] for c in pool["calls"] if c["op"] == "allreduce"}
    assert counts["tp.mlp.down_proj"] == counts["tp.attn.out_proj"] == 32


def test_vllm_partial_ep_is_refused_naming_the_rule(api):
    body = {**SERVE, "deployment": {"pools": [{"role": "both", "workers": 1, "tp": 4, "ep": 2}]}}
    r = api.post("/v1/serve", json=body)
    assert r.status_code == 422, r.text
    (err,) = r.json()["detail"]
    assert err["loc"][-1] == "ep" and "ep 1 or 4" in err["msg"] and "--enable-expert-parallel" in err["msg"]
