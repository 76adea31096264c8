"""TransformerEngine's quantize launches for the dense linears and its MXFP8 / NVFP4 scale swizzles, from the source
(moe11b; docs/step-time.md "Quantize launches, swizzles and combined 1F1B (moe11b)").

TE v2.9 (70f536662a, the Megatron-Bridge 25.11 container) under Megatron-Core 92c8482e6d:
- csrc/extensions/normalization.cpp rmsnorm_fwd: a LayerNormLinear's norm output is quantized FULLY_FUSED for delayed
  scaling (plus rmsnorm_api.cpp's nvte_transpose for the columnwise copy: 1), FUSED_NORM_AMAX_FP8 for current scaling
  (amax.zero_(), compute_scale_from_amax, nvte_quantize_v2: 3), else UNFUSED (the quantizer's own launches);
- module/linear.py: the input quantized in the forward; base.py grad_output_preprocess: the output gradient in the
  backward; with save_original_input (Megatron attention.py, linear_proj, any recipe but delayed) the saved bf16
  input once more in the backward;
- csrc/extensions/gemm.cpp l. 237-240 and 488-491: two scale swizzles a GEMM call under MXFP8 / NVFP4; TE v2.18
  (e7c550c5f, the 26.08 stack) quantizes them GEMM-ready (optimize_for_gemm).
"""

from __future__ import annotations

import pytest

from collectives.topology.gpu import GPUS
from planner import ParallelSpec, WorkloadSpec, model_preset
from planner._errors import SpecError
from planner.context import Context
from planner.kernels import EFFICIENCY, layer_kernels
from planner.recipes import RECIPES
from planner.workload import validate_workload

H100, B200 = GPUS["h100-sxm5-80gb"], GPUS["b200-180gb"]
QWEN3, LLAMA, DSV3 = model_preset("qwen3-30b-a3b"), model_preset("llama3-8b"), model_preset("deepseek-v3")


def ctx(model, recipe, par=None, **work):
    fields = dict(micro_batch_size=1, global_batch_size=64, seq_length=4096, activation_dtype="fp8")
    fields |= {"fp8_recipe": recipe} if recipe else {}
    return Context(model, WorkloadSpec(**(fields | work)), par or ParallelSpec(dp=8, ep=8 if model.moe else 1))


def count(kernels, name) -> int:
    return sum(k.count for k in kernels if k.name == name)


def test_the_recipes_launch_counts_are_te_2_9s():
    """Per tensor (quantizer.cpp), for a norm's output (normalization.cpp), per GEMM call's swizzles (gemm.cpp)."""
    te = {n: r for n, r in RECIPES.items() if r.library == "te"}
    assert {n: r.quantize_launches for n, r in te.items()} == {
        "delayed": 1, "tensorwise": 4, "blockwise": 1, "mxfp8": 1, "nvfp4": 3}  # fmt: skip
    assert {n: r.norm_quantize_launches for n, r in te.items()} == {
        "delayed": 1, "tensorwise": 3, "blockwise": 1, "mxfp8": 1, "nvfp4": 3}  # fmt: skip
    assert {n: r.gemm_swizzle_launches for n, r in te.items()} == {
        "delayed": 0, "tensorwise": 0, "blockwise": 0, "mxfp8": 2, "nvfp4": 2}  # fmt: skip


# a dense GQA layer's four linears: qkv and fc1 norm-fed (LayerNormLinear), linear_proj and fc2 plain;
# (forward, backward) = (2 norm + 2 quantize, 4 quantize + linear_proj's original input unless delayed)
DENSE = {"delayed": (4, 4), "tensorwise": (14, 20), "blockwise": (4, 5), "mxfp8": (4, 5), "nvfp4": (12, 15)}


@pytest.mark.parametrize("recipe", list(DENSE))
def test_a_dense_layers_quantizes_per_recipe(recipe):
    gpu = H100 if RECIPES[recipe].min_sm < 100 else B200
    lk = layer_kernels(ctx(LLAMA, recipe), False, gpu)
    assert (count(lk.forward, "fp8_cast"), count(lk.backward, "fp8_cast.bwd")) == DENSE[recipe]
    cast = next(k for k in lk.forward if k.name == "fp8_cast")
    assert cast.time_s >= cast.count * EFFICIENCY.cpu_op_s  # each launch at least a host dispatch (no CUDA graphs)


def test_mla_norm_fed_up_projections_and_shared_experts():
    """DeepSeek-V3 (Megatron's MLA spec with qk_layernorm: linear_q_up_proj and linear_kv_up_proj are LayerNormLinear),
    current scaling, ep 64 (4 local experts): dense layer forward q_down 4 + q_up 3 + kv_down 4 + kv_up 3 + linear_proj
    4 + fc1 3 + fc2 4 = 25, backward 7 output gradients x 4 + linear_proj's input 4 = 32; the MoE layer's shared
    experts' fc1 / fc2 plain linears (the pre-MLP norm is a TENorm of its own) 26 + 2 x 4 splits x 4 = 58 forward, 32 +
    32 = 64 backward."""
    c = ctx(DSV3, "tensorwise", ParallelSpec(dp=64, ep=64))
    dense, moe = layer_kernels(c, False, H100), layer_kernels(c, True, H100)
    assert (count(dense.forward, "fp8_cast"), count(dense.backward, "fp8_cast.bwd")) == (25, 32)
    assert (count(moe.forward, "fp8_cast"), count(moe.backward, "fp8_cast.bwd")) == (58, 64)


def test_inference_and_torchao_keep_one_cast_kernel():
    serve = Context(LLAMA, WorkloadSpec(kind="inference", batch_size=8, activation_dtype="fp8"), ParallelSpec())
    assert count(layer_kernels(serve, False, H100).forward, "fp8_cast") == 1
    titan = ctx(LLAMA, "tensorwise", ParallelSpec(dp=8, framework="torch"))
    assert count(layer_kernels(titan, False, H100).forward, "fp8_cast") == 1


def test_the_swizzles_follow_the_te_line():
    """MXFP8 Qwen3-30B-A3B MoE layer, four low-precision GEMM calls a forward (qkv, linear_proj, the experts' fc1 and
    fc2 as one grouped call each; the router is bf16): TE v2.9 ("gemm") 2 x 4 = 8 swizzles forward, 16 backward (dgrad
    and wgrad calls), each a memory-bound kernel's fixed cost at least; TE v2.18 ("quantize", the default) none; no
    recipe but the block-scaled ones swizzles."""
    lazy = layer_kernels(ctx(QWEN3, "mxfp8", scale_swizzle="gemm"), True, B200)
    assert (count(lazy.forward, "scale_swizzle"), count(lazy.backward, "scale_swizzle.bwd")) == (8, 16)
    swizzle = next(k for k in lazy.forward if k.name == "scale_swizzle")
    assert swizzle.time_s >= 8 * EFFICIENCY.kernel_s
    # one E8M0 byte a 32-element block of each operand, read and written
    gemms = [k for k in lazy.forward if k.kind == "gemm" and k.name != "router"]
    elements = sum((g.shape[0] + g.shape[1]) * g.shape[2] * g.shape[3] for g in gemms)
    assert swizzle.bytes == pytest.approx(2 * elements / 32)
    ready = layer_kernels(ctx(QWEN3, "mxfp8"), True, B200)
    assert not any(k.name.startswith("scale_swizzle") for k in ready.forward + ready.backward)
    cs = layer_kernels(ctx(QWEN3, "tensorwise", scale_swizzle="gemm"), True, H100)
    assert not any(k.name.startswith("scale_swizzle") for k in cs.forward + cs.backward)


def test_an_unknown_swizzle_place_is_refused_at_its_field():
    with pytest.raises(SpecError) as e:
        validate_workload(WorkloadSpec(scale_swizzle="cublas"))
    assert e.value.field == "workload.scale_swizzle" and "cublas" in str(e.value)
