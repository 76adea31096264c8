"""What a layer saves for backward under the fp8/fp4 recipes (planner/memory.py activation_parts), hand-checked
byte by byte for DeepSeek-V3's MoE layer and a dense Llama layer.

Sources: TransformerEngine 2.x (2.20.0.dev0) module/linear.py saves its quantized input with the column-wise data
only (1 B per element and, for blockwise, one fp32 scale per 1x128 tile: 1 + 4/128 = 1.03125 B); Megatron-Core
attention.py sets save_original_input on linear_proj (not under delayed scaling), and on linear_qkv / the
shared experts' fc1 with layernorm recompute and on the experts' fc2 with moe_act recompute; Megatron
--activation-func-fp8-input-store keeps the SwiGLU input as float8_e4m3fn (fused_bias_swiglu.py)."""

import pytest

from planner import ParallelSpec, WorkloadSpec, model_preset
from planner._errors import SpecError
from planner.context import Context
from planner.memory import freed_activations, layer_activations
from planner.recipes import RECIPES, check_act_fp8_store

DSV3 = model_preset("deepseek-v3")
TOK, H = 4096, 7168  # one 4,096-token micro-batch, DeepSeek-V3 hidden size
LIN = 1 + 4 / 128  # blockwise: E4M3 byte plus an fp32 scale per 128 elements


def ctx(model=DSV3, framework="megatron", **work):
    base = {"micro_batch_size": 1, "global_batch_size": 8, "seq_length": TOK, "activation_recompute": "selective"}
    return Context(model, WorkloadSpec(**(base | work)), ParallelSpec(dp=8, framework=framework))


def kept(c, moe, modules):
    acts, freed = layer_activations(c, moe), freed_activations(c, moe, frozenset(modules))
    return acts.split - freed.split + acts.replicated - freed.replicated  # tp 1, flash: no scores


def test_recipe_saved_input_widths():
    assert RECIPES["blockwise"].saved_input_bytes == 1.03125
    assert RECIPES["mxfp8"].saved_input_bytes == 1 + 1 / 32  # E8M0 byte per 32 elements
    assert RECIPES["delayed"].saved_input_bytes == RECIPES["tensorwise"].saved_input_bytes == 1.0
    assert RECIPES["nvfp4"].saved_input_bytes == 0.5 + 1 / 16  # E2M1 half byte, E4M3 scale per 16
    assert not RECIPES["delayed"].saves_original_input and RECIPES["blockwise"].saves_original_input


# DeepSeek-V3 MoE layer, recompute of the norms and the MLA up-projections (the report's §3.2.3), tp 1:
# linear_proj's input (128 heads x 128 v) in bf16, the two norms' inputs, the fp32 router logits (256 experts),
# then per routed copy (top 8) the expert input (7,168), the SwiGLU input (2 x 2,048) and fc2's input (2,048),
# and the shared expert's SwiGLU input (2 x 2,048) and fc2 input (2,048)
PROJ, NORMS, ROUTER = TOK * 128 * 128 * 2, 2 * TOK * H * 2, TOK * 256 * 4
BF16_MOE = PROJ + NORMS + ROUTER + TOK * 8 * (H + 2 * 2048 + 2048) * 2 + TOK * 3 * 2048 * 2


def test_deepseek_moe_layer_bf16():
    assert kept(ctx(), True, ["layernorm", "mla_up_proj"]) == BF16_MOE == 1_178_599_424


def test_deepseek_moe_layer_blockwise():
    # the expert input, fc2's input and the shared fc2's input become 1.03125-byte copies: 877,920,256 B
    fp8 = PROJ + NORMS + ROUTER + TOK * 8 * (H * LIN + 2 * 2048 * 2 + 2048 * LIN) + TOK * (2 * 2048 * 2 + 2048 * LIN)
    assert fp8 == 877_920_256
    assert kept(ctx(fp8_recipe="blockwise"), True, ["layernorm", "mla_up_proj"]) == fp8
    # the report's §3.3.2 on top: the SwiGLU input in fp8 and its output recomputed (moe_act: fc2's copy goes)
    store = ctx(fp8_recipe="blockwise", activation_func_fp8_input_store=True)
    less = PROJ + NORMS + ROUTER + TOK * 8 * (H * LIN + 2 * 2048) + TOK * (2 * 2048 + 2048 * LIN)
    assert kept(store, True, ["layernorm", "mla_up_proj", "moe_act"]) == less == 657_719_296


def test_layernorm_recompute_under_fp8():
    """Without layernorm recompute, linear_q_down_proj and linear_kv_down_proj each save a quantized copy of the
    norm output (2 x 1.03125 B per element), and the router the bf16 pre-MLP norm output plus the shared experts'
    fc1 its copy; with it, Megatron's save_original_input frees all of them, except under delayed scaling."""
    c = ctx(fp8_recipe="blockwise")
    norm_outputs = TOK * H * (2 * LIN) + TOK * H * (2 + LIN)
    assert kept(c, True, ["mla_up_proj"]) - kept(c, True, ["layernorm", "mla_up_proj"]) == norm_outputs
    d = ctx(fp8_recipe="delayed")  # TE keeps the quantized copies; only the router's bf16 input goes
    assert kept(d, True, ["mla_up_proj"]) - kept(d, True, ["layernorm", "mla_up_proj"]) == TOK * H * 2
    # delayed against tensorwise (both 1 B per element): linear_proj's 1-byte copy beside the attention's bf16
    # output, and the two down-projections' and the shared fc1's copies of the norm outputs stay
    modules = ["layernorm", "mla_up_proj"]
    assert kept(d, True, modules) - kept(ctx(fp8_recipe="tensorwise"), True, modules) == TOK * 128 * 128 + TOK * H * 3
    # and moe_act recompute frees fc2's copy only where TE saves the original input
    assert kept(d, True, modules) - kept(d, True, [*modules, "moe_act"]) == 0
    assert kept(c, True, modules) - kept(c, True, [*modules, "moe_act"]) == TOK * 8 * 2048 * LIN


def test_dense_llama_layer_blockwise_and_torch():
    llama = model_preset("llama3-8b")  # h 4096, 32 heads, 8 KV heads, ffn 14336, SwiGLU
    h, ffn, kv = 4096, 14336, 1024
    bf16 = TOK * (h + (h + 2 * kv) + h + h + 2 * ffn + ffn + 2 * h) * 2
    assert kept(ctx(llama), False, []) == bf16
    fp8 = TOK * ((h + 2 * kv + h + 2 * ffn + 2 * h) * 2 + (h + h + ffn) * LIN)
    assert kept(ctx(llama, fp8_recipe="blockwise"), False, []) == fp8
    # TE recipes are Megatron's here: torch keeps the bf16 inputs
    assert kept(ctx(llama, framework="torch", fp8_recipe="blockwise"), False, []) == bf16


def test_fp8_input_store_rules():
    gelu = model_preset("gpt3-175b")  # GeLU MLP, not gated
    assert not gelu.gated_mlp
    c = ctx(gelu, activation_func_fp8_input_store=True)
    with pytest.raises(SpecError) as err:
        check_act_fp8_store(c.work, c.par, c.model)
    assert err.value.field == "workload.activation_func_fp8_input_store" and "SwiGLU" in str(err.value)
    t = ctx(framework="torch", activation_func_fp8_input_store=True)
    with pytest.raises(SpecError, match="framework is 'torch'"):
        check_act_fp8_store(t.work, t.par, t.model)
