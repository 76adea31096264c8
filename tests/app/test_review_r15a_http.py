"""Review r15a's findings on mend15 + dsv3s15 (mend15b), over HTTP where the finding is a route's answer: each
failed before its fix."""

from __future__ import annotations

import pytest

from .test_contract_holes15_http import _with_pool

ONE_NODE = {"preset": "dgx-h100", "num_nodes": 1}


def _on_one_node(engine: str, model: str, **pool) -> dict:
    return _with_pool(engine, model, **pool) | {"cluster": ONE_NODE}


@pytest.mark.parametrize(
    ("engine", "model", "pool", "nodes", "field"),
    [
        ("sglang", "mixtral-8x7b", {"tp": 2, "dp": 4, "ep": 8}, 1, "attention_dp"),
        ("sglang", "llama3-8b", {"tp": 8, "dp": 2}, 2, "dp"),
        ("trtllm", "llama3-8b", {"tp": 2, "dp": 4}, 1, "attention_dp"),
    ],
)
def test_plain_dp_rules_answer_alike_on_serve_and_export(api, engine, model, pool, nodes, field):
    """Review r15a #1: /v1/serve priced these three pools (200, no warning) that the export refused; the SGLang MoE
    one at a TPOT 37% under the layout SGLang runs. One rule now (pool_rules.check_plain_dp), one 422."""
    body = _with_pool(engine, model, **pool) | {"cluster": {"preset": "dgx-h100", "num_nodes": nodes}}
    serve = api.post("/v1/serve", json=body)
    export = api.post("/v1/serve/export", params={"model_path": "m"}, json=body)
    assert serve.status_code == export.status_code == 422, (serve.text, export.text)
    assert serve.json()["detail"] == export.json()["detail"]
    (err,) = serve.json()["detail"]
    assert err["loc"] == ["body", "deployment", "pools", "0", field], err


def test_the_sglang_moe_refusal_hints_a_layout_that_plans(api):
    """The hint kept ep 8 ("4 workers of tp 2, pp 1, dp 1"): followed, a 422 at pools.0.ep. It now names ep 2,
    gcd(ep, tp), and that layout plans and exports."""
    (err,) = api.post("/v1/serve", json=_on_one_node("sglang", "mixtral-8x7b", tp=2, dp=4, ep=8)).json()["detail"]
    assert "serve the replicas as workers (4 workers of tp 2, pp 1, dp 1, ep 2)" in err["msg"], err
    hinted = _on_one_node("sglang", "mixtral-8x7b", workers=4, tp=2, ep=2)
    assert api.post("/v1/serve", json=hinted).status_code == 200
    assert api.post("/v1/serve/export", params={"model_path": "m"}, json=hinted).status_code == 200


def test_the_search_counts_plain_dp_refusals_nowhere_since_it_lists_none(api):
    """The search lists no plain-DP pool (worker_layouts: dp only with attention_dp), so its winners export: the
    best SGLang deployment of Mixtral on one node exports with 200."""
    body = {k: _on_one_node("sglang", "mixtral-8x7b", tp=8)[k] for k in ("model", "cluster", "traffic")}
    body |= {"engines": ["sglang"], "modes": ["aggregated"], "sla": {"ttft_s": 5.0, "tpot_s": 0.1}, "top_k": 3}
    d = api.post("/v1/serve/search", json=body).json()
    assert d["results"] and not any("attention_dp" in why for why in d["rejected"])
    for x in d["results"]:
        assert api.post("/v1/serve/export", params={"model_path": "m"}, json=x["request"]).status_code == 200


def test_trtllm_deepep_without_attention_dp_is_a_422(api):
    """Review r15a #6: TensorRT-LLM's communication factory returns no strategy without attention DP, so a DeepEP
    pool of tp 8 ep 8 ran no all-to-all; /v1/serve answered 200 with the asked dispatcher silently dropped."""
    body = _on_one_node("trtllm", "deepseek-v3", tp=8, ep=8, ep_dispatch="deepep") | {
        "options": {"weight_dtype": "fp8"}
    }
    r = api.post("/v1/serve", json=body)
    assert r.status_code == 422, r.text
    (err,) = r.json()["detail"]
    assert err["loc"][-1] == "ep_dispatch" and "mapping.dp_size == 1: return None" in err["msg"], err
    assert "dp 1 without attention_dp" in err["msg"]


def _deepseek_shaped(hidden: int) -> dict:
    return {
        "num_layers": 61, "hidden_size": hidden, "num_attention_heads": 128, "num_kv_heads": 128, "head_dim": 128,
        "ffn_hidden_size": 18432, "vocab_size": 129280, "gated_mlp": True, "seq_length": 4096,
        "moe": {"num_experts": 256, "top_k": 8, "expert_ffn_hidden_size": 2048, "num_shared_experts": 1,
                "first_dense_layers": 3},
        "mla": {"q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
                "v_head_dim": 128},
    }  # fmt: skip


@pytest.mark.parametrize("dispatch", ["deepep", "deepep_ll"])
def test_trtllm_nvfp4_post_quant_needs_hidden_a_multiple_of_32(api, dispatch):
    """Review r15a #5: TensorRT-LLM asserts hidden_size % 32 == 0 before its NVFP4 post-quant all-to-all; h 7,208
    (7,208 % 32 = 8) was priced as ceil(h x 0.5625) rows, a 200. 7,200 (a multiple of 32) still plans."""
    pool = {"role": "both", "dp": 32, "ep": 32, "attention_dp": True, "ep_dispatch": dispatch}
    body = _with_pool("trtllm", "deepseek-v3") | {
        "cluster": {"preset": "dgx-b200", "num_nodes": 4}, "options": {"weight_dtype": "nvfp4"},
        "model": _deepseek_shaped(7208),
    }  # fmt: skip
    body["deployment"]["pools"][0] = pool
    r = api.post("/v1/serve", json=body)
    assert r.status_code == 422, r.text
    (err,) = r.json()["detail"]
    assert err["loc"][-1] == "ep_dispatch", err
    assert "hidden_size % 32 == 0" in err["msg"] and "hidden_size 7,208 leaves 8" in err["msg"], err
    assert api.post("/v1/serve", json=body | {"model": _deepseek_shaped(7200)}).status_code == 200
