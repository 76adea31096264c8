"""MXFP4 weights over HTTP (issue 22, serve6): options.weight_dtype "mxfp4" on /v1/serve and /v1/serve/search.
GPT-OSS ships its MoE experts in MXFP4 (E2M1 + one E8M0 scale per 32: 0.53125 B a weight); vLLM and SGLang load
only the experts so (their Mxfp4Config), everything else bf16."""

import copy

SERVE = {
    "model": {"preset": "gpt-oss-120b"},
    "cluster": {"preset": "dgx-h100", "num_nodes": 1},
    "engine": "vllm",
    "traffic": {"input_tokens": 1000, "output_tokens": 1000, "concurrency": 64},
    "deployment": {"pools": [{"role": "both", "tp": 1}]},
    "options": {"weight_dtype": "mxfp4"},
}


def test_gpt_oss_fits_one_h100_in_mxfp4(api):
    """65.19 GB of weights (tests/planner/test_mxfp4_serving.py by hand) on one 80 GB H100: it fits, with a KV cache;
    the same model in bf16 (233.7 GB) does not."""
    r = api.post("/v1/serve", json=SERVE)
    assert r.status_code == 200, r.text
    d = r.json()
    assert d["fits"] and d["kv_cache"]["capacity_tokens"] > 100_000 and d["tpot_s"] > 0
    assert d["kv_cache"]["bytes_per_token"] == 36 * 8 * 64 * 2 * 2  # bf16 KV: 36 layers, 8 KV heads of 64
    bf16 = api.post("/v1/serve", json=SERVE | {"options": {"weight_dtype": "bf16"}})
    assert bf16.status_code == 200 and not bf16.json()["fits"]
    sglang = api.post("/v1/serve", json=SERVE | {"engine": "sglang"})
    assert sglang.status_code == 200 and sglang.json()["fits"]


def test_mxfp4_refused_where_not_priced(api):
    """A 422 at options.weight_dtype naming the rule: TensorRT-LLM (its MXFP4 path is not modelled), a dense model
    (the format stores only experts), and a search whose engines all lack it."""
    for body, words in (
        (SERVE | {"engine": "trtllm"}, "not priced for TensorRT-LLM"),
        (SERVE | {"model": {"preset": "llama3-8b"}}, "has no experts"),
    ):
        r = api.post("/v1/serve", json=body)
        assert r.status_code == 422, r.text
        err = r.json()["detail"][0]
        assert err["loc"][1:3] == ["options", "weight_dtype"] and words in err["msg"], err
    search = {k: copy.deepcopy(SERVE[k]) for k in ("model", "cluster", "traffic", "options")}
    search |= {"engines": ["trtllm"], "modes": ["aggregated"], "sla": {"ttft_s": 5, "tpot_s": 0.1}}
    r = api.post("/v1/serve/search", json=search)
    assert r.status_code == 422, r.text
    err = r.json()["detail"][0]
    # /v1/serve's own words since mend15 (one rule, deployment.ENGINE_OPTION_RULES; was "none of the engines")
    assert err["loc"][1:3] == ["options", "weight_dtype"] and "not priced for TensorRT-LLM" in err["msg"], err
    r = api.post("/v1/serve", json=SERVE | {"options": {"weight_dtype": "mxfp6"}})
    assert r.status_code == 422 and "weight_dtype" in r.text
