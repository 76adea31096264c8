"""The KV cache's dtype where the request names none, and the fp8-KV rule in the SLA search (mend14d; review r14c,
1 and 3). TensorRT-LLM's KvCacheConfig.dtype "auto" follows the checkpoint's kv_cache_quant_algo, else the model's
dtype (planner/serving/engines.py TRTLLM_KV_DEFAULT_RULE): with no checkpoint the plan keeps the 16-bit cache and
says so; /v1/serve/search refuses what /v1/serve refuses with deployment.check_fp8_kv's own 422."""

import copy

SERVE = {
    "model": {"preset": "llama3-70b"},
    "cluster": {"preset": "dgx-h100", "num_nodes": 1},
    "engine": "trtllm",
    "traffic": {"input_tokens": 2048, "output_tokens": 128, "concurrency": 8},
    "deployment": {"pools": [{"role": "both", "tp": 8}]},
    "options": {"weight_dtype": "fp8", "fp8_recipe": "delayed"},
}


def test_serve_says_the_16_bit_cache_and_the_engines_rule(api):
    """fp8 weights, no kv_dtype: kv_cache.dtype bf16, dtype_default "bf16 planned; ..." naming kv_cache_quant_algo,
    the same capacity as kv_dtype "bf16" named; kv_dtype "fp8" named: half the bytes a token, no default said."""
    auto = api.post("/v1/serve", json=SERVE)
    assert auto.status_code == 200, auto.text
    kv = auto.json()["kv_cache"]
    assert kv["dtype"] == "bf16" and kv["dtype_default"].startswith("bf16 planned; TensorRT-LLM's KvCacheConfig")
    assert "kv_cache_quant_algo" in kv["dtype_default"] and "_KV_CACHE_MAP" not in kv["dtype_default"]
    named = api.post("/v1/serve", json=SERVE | {"options": SERVE["options"] | {"kv_dtype": "bf16"}}).json()["kv_cache"]
    assert named == kv | {"dtype_default": ""}
    fp8 = api.post("/v1/serve", json=SERVE | {"options": SERVE["options"] | {"kv_dtype": "fp8"}}).json()["kv_cache"]
    assert (fp8["dtype"], fp8["dtype_default"]) == ("fp8", "")
    assert 2 * fp8["bytes_per_token"] == kv["bytes_per_token"] == 80 * 8 * 128 * 2 * 2


def test_search_refuses_an_fp8_kv_cache_beside_bf16_linears_as_serve_does(api):
    """TensorRT-LLM alone, bf16 weights, kv_dtype fp8: /v1/serve/search gives /v1/serve's 422 on options.kv_dtype
    (it answered 200 with every deployment rejected), the same rule in the same words."""
    options = {"weight_dtype": "bf16", "kv_dtype": "fp8"}
    serve = api.post("/v1/serve", json=SERVE | {"options": options})
    assert serve.status_code == 422, serve.text
    search = {k: copy.deepcopy(SERVE[k]) for k in ("model", "cluster", "traffic")} | {"options": options}
    search |= {"engines": ["trtllm"], "modes": ["aggregated"], "sla": {"ttft_s": 5, "tpot_s": 0.2}}
    r = api.post("/v1/serve/search", json=search)
    assert r.status_code == 422, r.text
    err = r.json()["detail"][0]
    assert err["loc"][1:3] == ["options", "kv_dtype"], err
    assert err["msg"].split(": ", 1)[-1] == serve.json()["detail"][0]["msg"].split(": ", 1)[-1], (err, serve.text)
    assert "got bf16 weights" in err["msg"]
