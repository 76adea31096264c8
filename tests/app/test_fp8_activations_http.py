"""workload.activation_func_fp8_input_store and the fp8 recipes' saved activations over HTTP (issue 21, fp8mem):
Megatron --activation-func-fp8-input-store keeps each SwiGLU input as float8_e4m3fn (1 B instead of 2;
megatron/core/fusions/fused_bias_swiglu.py), for SwiGLU only (transformer_config.py), and TE's linears save
their quantized inputs under a recipe (planner/memory.py activation_parts)."""

import copy

LLAMA = {
    "model": {"preset": "llama3-8b"},
    "workload": {
        "kind": "training", "micro_batch_size": 1, "global_batch_size": 64, "seq_length": 8192,
        "activation_recompute": "selective",
    },
    "parallel": {"tp": 1, "pp": 1, "dp": 8},
    "cluster": {"preset": "dgx-h100", "num_nodes": 1},
}  # fmt: skip
TOK, H, FFN, KV, LAYERS = 8192, 4096, 14336, 1024, 32


def activations(api, **work) -> int:
    body = copy.deepcopy(LLAMA)
    body["workload"] |= work
    r = api.post("/v1/plan", json=body)
    assert r.status_code == 200, r.text
    return r.json()["memory"]["per_stage"][0]["activations_bytes"]


def test_fp8_input_store_halves_the_swiglu_input(api):
    """pp 1: one micro-batch of 32 layers in flight; each layer's SwiGLU input (2 x 14,336 per token) drops
    from 2 B to 1 B per element."""
    bf16 = activations(api)
    stored = activations(api, activation_func_fp8_input_store=True)
    assert bf16 - stored == LAYERS * TOK * 2 * FFN == 7_516_192_768


def test_blockwise_recipe_saves_the_linear_inputs_in_fp8(api):
    """Blockwise: the QKV, fc1 and fc2 inputs (4,096 + 4,096 + 14,336 per token) saved at 1 + 4/128 B instead
    of 2 B; linear_proj's input stays bf16 (Megatron save_original_input)."""
    bf16 = activations(api)
    fp8 = activations(api, fp8_recipe="blockwise")
    assert bf16 - fp8 == LAYERS * TOK * (H + H + FFN) * (2 - 1.03125) == 5_721_030_656


def test_fp8_input_store_refusals(api):
    gelu = copy.deepcopy(LLAMA)
    gelu["model"] = {"preset": "gpt3-175b", "num_layers": 8}
    gelu["workload"]["activation_func_fp8_input_store"] = True
    r = api.post("/v1/plan", json=gelu)
    assert r.status_code == 422, r.text
    assert "activation_func_fp8_input_store" in r.text and "SwiGLU" in r.text
    torch = copy.deepcopy(LLAMA)
    torch["parallel"]["framework"] = "torch"
    torch["workload"]["activation_func_fp8_input_store"] = True
    r = api.post("/v1/plan", json=torch)
    assert r.status_code == 422 and "framework is 'torch'" in r.text, r.text
    serving = {**copy.deepcopy(LLAMA), "workload": {"kind": "inference", "activation_func_fp8_input_store": True}}
    r = api.post("/v1/plan", json=serving)
    assert r.status_code == 422 and "activation_func_fp8_input_store" in r.text, r.text
