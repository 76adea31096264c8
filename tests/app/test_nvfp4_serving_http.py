"""NVFP4 weights over HTTP (issue 22, fp4serve): options.weight_dtype "nvfp4" on /v1/serve and workload.param_dtype
"nvfp4" on /v1/plan. An NVFP4 linear weight is 0.5625 B (TensorRT-LLM NVFP4LinearMethod: two E2M1 values a byte,
one E4M3 scale per 16); the embedding, the output layer and the norms stay bf16 (ModelOpt's checkpoints)."""

import copy

import pytest

# Llama 3.3 70B: per layer qkv 8192 x 10240, o 8192 x 8192, gate/up/down 3 x 8192 x 28672; 80 layers
LINEAR = 80 * (8192 * 10240 + 8192 * 8192 + 3 * 8192 * 28672)
REST = 2 * 128_256 * 8192 + 8192 * (2 * 80 + 1)  # embedding, output layer, 161 RMSNorm weights
NVFP4_WEIGHTS = int(LINEAR * (0.5 + 1 / 16) + REST * 2)  # = 42,709,041,152 B on one GPU
FP8_WEIGHTS = LINEAR + REST

SERVE = {
    "model": {"preset": "llama3-70b"},
    "cluster": {"preset": "dgx-b200", "num_nodes": 1},
    "engine": "trtllm",
    "traffic": {"input_tokens": 1000, "output_tokens": 1000, "concurrency": 3000},
    "deployment": {"pools": [{"role": "both", "tp": 1}]},
    "options": {"weight_dtype": "nvfp4", "kv_dtype": "fp8"},
}


def test_nvfp4_weights_leave_the_kv_cache_their_bytes(api):
    """TensorRT-LLM's KV cache is 0.9 of what the weights and the largest pass leave free (engines.py): against fp8
    weights the nvfp4 checkpoint frees (70.55e9 - 42.71e9) B, 0.9 of which hold 163,840 B tokens (fp8 KV, 80
    layers x 8 heads x 128 x 2)."""
    assert NVFP4_WEIGHTS == 42_709_041_152 and FP8_WEIGHTS == 70_553_706_496
    r = api.post("/v1/serve", json=SERVE)
    assert r.status_code == 200, r.text
    fp8 = api.post("/v1/serve", json=SERVE | {"options": {"weight_dtype": "fp8", "kv_dtype": "fp8"}})
    assert fp8.status_code == 200, fp8.text
    kv, kv8 = r.json()["kv_cache"], fp8.json()["kv_cache"]
    assert kv["bytes_per_token"] == kv8["bytes_per_token"] == 163_840
    gained = kv["capacity_tokens"] - kv8["capacity_tokens"]
    assert gained == pytest.approx(0.9 * (FP8_WEIGHTS - NVFP4_WEIGHTS) / 163_840, abs=2)
    # and the decode step reads 0.5 B weights and runs fp4 GEMMs: faster per token than fp8 at its larger batch
    assert r.json()["tpot_s"] < fp8.json()["tpot_s"] * kv["max_concurrency"] / kv8["max_concurrency"]


@pytest.mark.parametrize(
    ("cluster", "words"),
    [("dgx-h100", "compute capability >= 10.0"), ("dgx-a100", "compute capability >= 10.0")],
)
def test_nvfp4_without_fp4_tensor_cores_is_422(api, cluster, words):
    body = SERVE | {"cluster": {"preset": cluster, "num_nodes": 1}}
    r = api.post("/v1/serve", json=body)
    assert r.status_code == 422, r.text
    err = r.json()["detail"][0]
    assert err["loc"][1:3] == ["options", "weight_dtype"], err
    assert words in err["msg"] and "nvfp4" in err["msg"]


def test_nvfp4_is_a_weight_format_not_a_kv_dtype(api):
    body = copy.deepcopy(SERVE)
    body["options"]["kv_dtype"] = "nvfp4"
    r = api.post("/v1/serve", json=body)
    assert r.status_code == 422 and "kv_dtype" in r.text, r.text


PLAN = {
    "model": {"preset": "llama3-70b"},
    "workload": {"kind": "inference", "phase": "decode", "batch_size": 512, "context_length": 2048,
                 "param_dtype": "nvfp4", "fp8_recipe": "nvfp4", "kv_dtype": "fp8"},
    "parallel": {"tp": 1, "pp": 1, "dp": 8},
    "cluster": {"preset": "dgx-b200", "num_nodes": 1},
}  # fmt: skip


def test_plan_inference_with_nvfp4_weights(api):
    r = api.post("/v1/plan", json=PLAN)
    assert r.status_code == 200, r.text
    assert r.json()["memory"]["per_stage"][0]["params_bytes"] == NVFP4_WEIGHTS


@pytest.mark.parametrize(
    ("work", "field", "words"),
    [
        (
            {
                "kind": "training",
                "micro_batch_size": 1,
                "global_batch_size": 8,
                "param_dtype": "nvfp4",
                "fp8_recipe": "nvfp4",
            },
            "param_dtype",
            "inference checkpoint format",
        ),
        ({"fp8_recipe": None}, "fp8_recipe", "GEMMs as the 'nvfp4' recipe"),
        ({"fp8_recipe": "blockwise"}, "fp8_recipe", "GEMMs as the 'nvfp4' recipe"),
    ],
)
def test_plan_nvfp4_refusals(api, work, field, words):
    body = copy.deepcopy(PLAN)
    body["workload"] = work if work.get("kind") == "training" else body["workload"] | work
    r = api.post("/v1/plan", json=body)
    assert r.status_code == 422, r.text
    err = r.json()["detail"][0]
    assert err["loc"][-1] == field and words in err["msg"], err


SEARCH = {
    "model": {"preset": "llama3-70b"},
    "cluster": {"preset": "dgx-b200", "num_nodes": 1},
    "engines": ["trtllm"],
    "modes": ["aggregated"],
    "traffic": {"input_tokens": 1000, "output_tokens": 1000, "concurrency": 256},
    "sla": {"ttft_s": 10.0, "tpot_s": 0.1},
    "options": {"weight_dtype": "nvfp4", "kv_dtype": "fp8"},
}


def test_serve_search_with_nvfp4_weights(api):
    """The SLA search plans every deployment with the nvfp4 checkpoint; on Hopper it is one 422 up front (every
    deployment would refuse it), not an answer whose deployments were all rejected."""
    r = api.post("/v1/serve/search", json=SEARCH)
    assert r.status_code == 200, r.text
    best = r.json()["results"][0]
    assert best["request"]["options"]["weight_dtype"] == "nvfp4"
    again = api.post("/v1/serve", json=best["request"])
    assert again.status_code == 200 and again.json()["tpot_s"] == pytest.approx(best["answer"]["tpot_s"])
    hopper = api.post("/v1/serve/search", json=SEARCH | {"cluster": {"preset": "dgx-h100", "num_nodes": 1}})
    assert hopper.status_code == 422, hopper.text
    assert hopper.json()["detail"][0]["loc"][1:3] == ["options", "weight_dtype"]


# a Blackwell given by its fields without an fp4 peak (sm 100: the compute-capability rule passes)
NO_FP4 = {"name": "b200-no-fp4", "peak_tflops": {"bf16": 2250.0, "fp8": 4500.0}, "hbm_bytes": 180 << 30,
          "hbm_GBps": 8000.0, "sm": 100}  # fmt: skip


def _no_fp4_error(r) -> dict:
    assert r.status_code == 422, r.text
    (err,) = r.json()["detail"]
    assert err["loc"][-2:] == ["options", "weight_dtype"], err
    assert "nvfp4 weights need the GPU's dense fp4 peak" in err["msg"] and "'b200-no-fp4' has none" in err["msg"]
    return err


def test_nvfp4_weights_on_a_gpu_without_an_fp4_peak_is_422_on_serve_and_serve_search(api):
    """recipes.check_recipe_gpu is the one home of nvfp4's GPU rules (compute capability and the fp4 peak): the
    search's up-front check_weight_format refuses it once (it answered "no deployment fits" when only the
    kernel model knew the peak rule), and /v1/serve at the same field."""
    cluster = {"preset": "dgx-b200", "num_nodes": 1, "gpu": NO_FP4}
    _no_fp4_error(api.post("/v1/serve", json=SERVE | {"cluster": cluster}))
    search = {"model": SERVE["model"], "cluster": cluster, "engines": ["trtllm"], "options": SERVE["options"],
              "traffic": {"input_tokens": 1000, "output_tokens": 1000, "concurrency": 64}}  # fmt: skip
    _no_fp4_error(api.post("/v1/serve/search", json=search))
    # training's nvfp4 recipe on the same GPU: the same rule at workload.fp8_recipe
    plan = {"model": {"preset": "llama3-8b"}, "cluster": cluster, "parallel": {"tp": 1, "pp": 1, "dp": 8},
            "workload": {"micro_batch_size": 1, "global_batch_size": 8, "fp8_recipe": "nvfp4"}}  # fmt: skip
    r = api.post("/v1/plan", json=plan)
    assert r.status_code == 422, r.text
    (err,) = r.json()["detail"]
    assert err["loc"][-2:] == ["workload", "fp8_recipe"] and "dense fp4 peak" in err["msg"], err
