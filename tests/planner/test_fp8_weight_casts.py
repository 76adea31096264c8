"""FP8 casts as TransformerEngine runs them (fp8audit14, issue 20; docs/step-time.md "FP8 kernels as TransformerEngine
runs them (fp8audit14)"): a TE linear quantizes its weight once a step (Megatron-Core's is_first_microbatch, TE's
cached workspace), its input each forward and its output gradient each backward; with fp8 primary weights the
optimizer casts the master shard; on Blackwell the per-tensor quantizers write no transpose."""

from __future__ import annotations

from dataclasses import replace

import pytest

from bench import step_validation
from collectives.topology.gpu import GPUS
from planner import ParallelSpec, WorkloadSpec, model_preset
from planner.compute import optimizer_s
from planner.context import Context
from planner.kernels import (
    EFFICIENCY,
    FP8_TRANSPOSE_BYTES,
    cast_bytes_per_element,
    cast_s,
    layer_kernels,
    master_cast_bytes,
    non_tn_fp8,
    norm_fed_cast_bytes,
    step_weight_cast_bytes,
)
from planner.params import quantized_numels
from planner.recipes import recipe_of

H100, B200, GB200, A100 = (GPUS[n] for n in ("h100-sxm5-80gb", "b200-180gb", "gb200-186gb", "a100-sxm4-80gb"))
DATA = step_validation.load()
CASES = {c["name"]: c for c in DATA["cases"]}


def nemo_gpt3_175b() -> Context:
    """The NeMo 24.07 GPT3-175B FP8 row (128 H100, TP4 PP8 VP6, MBS 1, seq 2048): delayed scaling, no recipe given."""
    spec, work, par, _, _ = step_validation.case_inputs(CASES["NeMo GPT3-175B FP8, 128 H100"], DATA)
    return Context(spec, work, par)


def by_name(kernels) -> dict:
    return {k.name: k for k in kernels}


def llama8b(recipe: str | None = "tensorwise", framework: str = "megatron", **work) -> Context:
    fields = dict(micro_batch_size=2, global_batch_size=128, seq_length=8192, activation_dtype="fp8")
    fields |= {"fp8_recipe": recipe} if recipe else {}
    par = ParallelSpec(dp=8, zero_stage=1, framework=framework)
    return Context(model_preset("llama3-8b"), WorkloadSpec(**(fields | work)), par)


def test_a_layer_casts_its_inputs_forward_and_its_output_gradients_backward_not_its_weights():
    """GPT3-175B, T = 2,048 tokens, h 12,288, tp 4, delayed scaling (4 B an element: read bf16 2, write the fp8 copy
    and its transpose, TE v1.8 fp8_cast_transpose_fused): forward the inputs of linear_proj (h/t) and fc2 (4h/t) at 4 B
    and the LayerNormLinears' qkv and fc1 inputs (h each) at the 2 B of the fp8 norm output's transpose (the norm
    writes fp8 itself: norm_fed_cast_bytes): T·h·(4 + 20/t) B; backward the output gradients of qkv (3h/t),
    linear_proj (h), fc1 (4h/t) and fc2 (h): T·h·(2 + 7/t) elements at 4 B; none of the 12h²/t weight elements (5.4x
    the forward's activations here), which TE casts once a step. Before fp8audit14 both passes charged activations and
    weights at 4 B: 2,139 MB a pass."""
    ctx = nemo_gpt3_175b()
    lk = layer_kernels(ctx, False, H100)
    fwd, bwd = by_name(lk.forward)["fp8_cast"], by_name(lk.backward)["fp8_cast.bwd"]
    T, h, t = 2048, 12288, 4
    assert cast_bytes_per_element(ctx, H100) == 4 and norm_fed_cast_bytes(ctx, H100) == 2
    assert fwd.bytes == pytest.approx(T * h * (4 + 20 / t))  # 226 MB
    assert bwd.bytes == pytest.approx(4 * T * h * (2 + 7 / t))  # 377 MB
    assert fwd.bytes + bwd.bytes < 0.18 * 2 * 2139.1e6


def test_the_weights_are_cast_once_a_step_in_the_optimizer_steps_time():
    """The rank's 12 layers of GPT3-175B at tp 4: 12 x 12h²/t weight elements (and the linears' biases, < 0.1%), each
    cast with its transpose once a step (4 B an element, 21.7 GB); optimizer_s holds their time at the cast rate."""
    ctx = nemo_gpt3_175b()
    numels = sum(quantized_numels(ctx, 0))
    assert numels == pytest.approx(12 * 12 * 12288**2 / 4, rel=1e-3)
    assert step_weight_cast_bytes(ctx, 0, H100) == 4 * numels
    bf16 = Context(ctx.model, replace(ctx.work, activation_dtype="bf16"), ctx.par)
    assert step_weight_cast_bytes(bf16, 0, H100) == 0
    extra = optimizer_s(ctx, 0, H100) - optimizer_s(bf16, 0, H100)
    assert extra == pytest.approx(cast_s(4 * numels, H100, EFFICIENCY))


def test_fp8_primary_weights_cast_the_master_shard_and_transpose_on_hopper_only():
    """--fp8-param-gather under the distributed optimizer (TE v2.9 cast_master_weights_to_fp8, current scaling):
    11 B an element of the 1/dp master shard (fp32 -> bf16 6, amax 2, cast 3) and, on a TN-only GPU (Hopper), the
    gathered weight's transpose, 2 B an element; Blackwell's fp8 GEMMs take the weight as it is."""
    assert (master_cast_bytes(recipe_of("tensorwise")), FP8_TRANSPOSE_BYTES) == (11, 2)
    # delayed scaling's update_quantized writes the amax as it casts: no amax pass (r14b #9, mend14c)
    assert master_cast_bytes(recipe_of("delayed")) == 9
    delayed = llama8b("delayed", fp8_param_gather=True)
    assert step_weight_cast_bytes(delayed, 0, B200) == pytest.approx(sum(quantized_numels(delayed, 0)) / 8 * 9)
    ctx = llama8b(fp8_param_gather=True)
    numels = sum(quantized_numels(ctx, 0))
    assert step_weight_cast_bytes(ctx, 0, H100) == pytest.approx(numels / 8 * 11 + numels * 2)
    assert step_weight_cast_bytes(ctx, 0, B200) == pytest.approx(numels / 8 * 11)
    # without fp8 primary weights: the first micro-batch's cast, read twice (current scaling) and one copy on B200
    assert step_weight_cast_bytes(llama8b(), 0, H100) == 6 * numels
    assert step_weight_cast_bytes(llama8b(), 0, B200) == 5 * numels


def test_blackwell_per_tensor_quantizers_write_no_transpose():
    """TE v2.9 quantizer.cpp: ``with_transpose = columnwise_usage && !nvte_is_non_tn_fp8_gemm_supported()`` for the
    per-tensor quantizers; compute capability 10.x (B200, GB200) takes non-TN fp8 GEMMs, 9.0 does not. Current scaling
    6 -> 5 B an element, delayed (fp8 without a recipe) 4 -> 3; MXFP8 keeps its columnwise copy."""
    assert [non_tn_fp8(g) for g in (H100, B200, GB200)] == [False, True, True]
    assert [cast_bytes_per_element(llama8b(), g) for g in (H100, B200)] == [6, 5]
    assert [cast_bytes_per_element(llama8b(None), g) for g in (H100, B200)] == [4, 3]
    mx = llama8b("mxfp8")
    assert cast_bytes_per_element(mx, B200) == cast_bytes_per_element(mx) == pytest.approx(2 + 2 + 2 / 32)
    # torchao's Float8Linear (torchtitan) is not TE's quantizer: unchanged
    assert cast_bytes_per_element(llama8b(framework="torch"), B200) == 6


def test_torchao_and_inference_keep_casting_weights_every_pass():
    """torchao's Float8Linear casts its weight in every forward and backward (no is_first_microbatch cache): its
    layer's passes hold the weights' bytes and its step none; an inference pass casts its activations only."""
    ctx = llama8b(framework="torch")
    lk = layer_kernels(ctx, False, H100)
    fwd, bwd = by_name(lk.forward)["fp8_cast"], by_name(lk.backward)["fp8_cast.bwd"]
    gemms = [k.shape for k in lk.forward if k.kind == "gemm"]
    assert fwd.bytes == bwd.bytes == pytest.approx(sum((m * k + k * n) * g for m, n, k, g in gemms) * 6)
    assert step_weight_cast_bytes(ctx, 0, H100) == 0
    serve = Context(model_preset("llama3-8b"), WorkloadSpec(kind="inference", batch_size=8, activation_dtype="fp8"),
                    ParallelSpec())  # fmt: skip
    assert step_weight_cast_bytes(serve, 0, H100) == 0


def test_a_layernorm_linears_quantize_is_partly_the_norms():
    """TE v2.9 csrc/extensions/normalization.cpp: delayed scaling FULLY_FUSED (the norm writes fp8, the columnwise copy
    an nvte_transpose of it: 2 B on Hopper, none on Blackwell), current scaling FUSED_NORM_AMAX_FP8 (the amax from the
    norm, the quantize reads once: 6 -> 4 B on Hopper, 5 -> 3 on Blackwell), MXFP8 UNFUSED (its whole cast)."""
    assert [norm_fed_cast_bytes(llama8b(None), g) for g in (H100, B200)] == [2, 0]
    assert [norm_fed_cast_bytes(llama8b("delayed"), g) for g in (H100, B200)] == [2, 0]
    assert [norm_fed_cast_bytes(llama8b(), g) for g in (H100, B200)] == [4, 3]
    mx = llama8b("mxfp8")
    assert norm_fed_cast_bytes(mx, B200) == cast_bytes_per_element(mx, B200)
    # Llama-3 8B at T = 16,384 under current scaling on H100: qkv and fc1 inputs (h each) at 4 B, linear_proj's (h) and
    # fc2's (14,336) at 6 B
    fwd = by_name(layer_kernels(llama8b(), False, H100).forward)["fp8_cast"]
    T, h, f = 16384, 4096, 14336
    assert fwd.bytes == pytest.approx(T * (2 * h * 4 + (h + f) * 6))
