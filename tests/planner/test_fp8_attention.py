"""FP8 attention's kernel rate (issue 21, fp8a9; planner/kernels.py ATTENTION_FP8_SPEEDUP, fp8_attention_casts):
Megatron --fp8-dot-product-attention runs TransformerEngine's cuDNN fused attention in FP8, the forward at
FlashAttention-3's measured cuDNN FP8/bf16 ratio (Fig. 7 over Fig. 5, head dim 128: 1.54), the backward too unless
NVTE_FP8_DPA_BWD=0 (workload.fp8_dpa_backward) at cuDNN 9's headline 1.5, with TE's casts around it. Llama3-8B at
s 8,192, tp 1, one micro-batch, delayed scaling on an H100 SXM."""

from __future__ import annotations

from dataclasses import replace

import pytest

from collectives.topology.gpu import GPUS
from planner import ParallelSpec, SpecError, WorkloadSpec, model_preset
from planner.context import Context
from planner.kernels import (
    ATTENTION_FP8_SPEEDUP,
    EFFICIENCY,
    FP8_DPA_KERNEL,
    FP8_DPA_QKV_TENSORS,
    attention_kernel,
    attention_kernels,
    hbm_s,
)
from planner.recipes import check_fp8_dpa

H100, B200 = GPUS["h100-sxm5-80gb"], GPUS["b200-180gb"]
LLAMA = model_preset("llama3-8b")
WORK = WorkloadSpec(micro_batch_size=1, global_batch_size=8, seq_length=8192, activation_dtype="fp8",
                    fp8_recipe="delayed")  # fmt: skip
PAR = ParallelSpec(tp=1, pp=1, dp=8)
KS = EFFICIENCY.kernel_s
S = 8192
QKV = S * (32 * 128 + 2 * 8 * 128)  # q, k, v elements of one sequence: 32 query heads, 8 KV heads, head dim 128
OUT = S * 32 * 128


def kernels(gpu=H100, **work):
    ctx = Context(LLAMA, replace(WORK, **work), PAR)
    fwd, bwd = attention_kernels(ctx, gpu, EFFICIENCY, 0.0)
    return {k.name: k for k in fwd}, {k.name: k for k in bwd}


def test_the_cudnn_kernels_run_at_the_fp8_speedup():
    """The forward's rate x 1.54 and the backward's x 1.5 of the bf16 cuDNN kernel: time less the fixed launch cost
    divides by the speedup exactly; same FLOPs, dtype fp8."""
    f16, b16 = kernels()
    f8, b8 = kernels(fp8_dot_product_attention=True)
    assert ATTENTION_FP8_SPEEDUP[("cudnn", 90)] == (1.54, 1.5)
    assert (f8["cudnn_fwd"].time_s - KS) * 1.54 == pytest.approx(f16["cudnn_fwd"].time_s - KS, rel=1e-12)
    assert (b8["cudnn_bwd"].time_s - 3 * KS) * 1.5 == pytest.approx(b16["cudnn_bwd"].time_s - 3 * KS, rel=1e-12)
    assert (f8["cudnn_fwd"].dtype, b8["cudnn_bwd"].dtype) == ("fp8", "fp8")
    assert f8["cudnn_fwd"].flops == f16["cudnn_fwd"].flops


def test_the_casts_by_hand():
    """Delayed scaling: Q, K, V (50,331,648 elements) concatenated (4 B each: 201,326,592 B) and quantized (read 2,
    write 1: 150,994,944 B), the output (33,554,432 elements) dequantized (read 1, write 2: 100,663,296 B); backward,
    dO quantized (100,663,296 B) and dQ, dK, dV dequantized (150,994,944 B)."""
    f8, b8 = kernels(fp8_dot_product_attention=True)
    want_f = {"fp8_attn.qkv_cat": 4 * QKV, "fp8_attn.qkv_quantize": 3 * QKV, "fp8_attn.out_dequantize": 3 * OUT}
    want_b = {"fp8_attn.dout_quantize": 3 * OUT, "fp8_attn.dqkv_dequantize": 3 * QKV}
    assert {n: k.bytes for n, k in f8.items() if k.kind == "memory"} == want_f
    assert {n: k.bytes for n, k in b8.items() if k.kind == "memory"} == want_b
    assert want_f["fp8_attn.qkv_cat"] == 201_326_592 and want_b["fp8_attn.dout_quantize"] == 100_663_296
    cat = f8["fp8_attn.qkv_cat"]
    assert cat.time_s == pytest.approx(hbm_s(201_326_592, H100, EFFICIENCY) + KS)


def test_current_scaling_reads_its_input_twice():
    """tensorwise (Float8CurrentScalingQuantizer) reads the bf16 input twice, once for the amax: 5 B a quantized
    element, in its 4 launches (the amax zeroed, the amax, the scale, the cast: TE current_scaling.cu since v2.8)."""
    f8, b8 = kernels(fp8_dot_product_attention=True, fp8_recipe="tensorwise")
    assert f8["fp8_attn.qkv_quantize"].bytes == 5 * QKV and f8["fp8_attn.qkv_quantize"].count == 4
    assert b8["fp8_attn.dout_quantize"].bytes == 5 * OUT


@pytest.mark.parametrize(("recipe", "gpu"), [("tensorwise", H100), ("mxfp8", B200)])
def test_current_scaling_and_mxfp8_kernels_write_bf16(recipe, gpu):
    """TE d0067d0da attention.cpp fused_attn_bwd: "FP8CS/MXFP8: ... dQ/dK/dV.dtype = torch.bfloat16" (only delayed
    scaling's Float8Quantizer writes uint8), and FusedAttnFunc.forward's out_ is a torch.Tensor under current scaling
    and MXFP8: no output dequantize and no dQ, dK, dV dequantize (docwait10; before, one launch of 3 B an element
    each, 100,663,296 B and 150,994,944 B here); dO is still quantized (MXFP8: read 2, write 1 + 1/32 of scales)."""
    f8, b8 = kernels(gpu, fp8_dot_product_attention=True, fp8_recipe=recipe)
    assert "fp8_attn.out_dequantize" not in f8 and "fp8_attn.qkv_quantize" in f8
    assert [n for n, k in b8.items() if k.kind == "memory"] == ["fp8_attn.dout_quantize"]
    if recipe == "mxfp8":
        assert b8["fp8_attn.dout_quantize"].bytes == OUT * (2 + 1 + 1 / 32)


def test_a_bf16_backward_is_the_plain_backward():
    """NVTE_FP8_DPA_BWD=0: the forward in FP8 with its casts, the backward the bf16 kernel unchanged, no cast."""
    _, b16 = kernels()
    f8, b8 = kernels(fp8_dot_product_attention=True, fp8_dpa_backward=False)
    assert list(b8) == ["cudnn_bwd"] and b8["cudnn_bwd"] == b16["cudnn_bwd"]
    assert f8["cudnn_fwd"].dtype == "fp8" and "fp8_attn.qkv_quantize" in f8


def test_te_runs_cudnn_whatever_kernel_was_asked():
    """get_attention_backend disables FlashAttention-2 for FP8 attention and FlashAttention-3 for FP8 training."""
    for asked in ("flash", "flash2", "flash3"):
        ctx = Context(LLAMA, replace(WORK, attention_kernel=asked, fp8_dot_product_attention=True), PAR)
        assert attention_kernel(ctx, H100) == FP8_DPA_KERNEL == "cudnn"
    plain = Context(LLAMA, replace(WORK, attention_kernel="flash2"), PAR)
    assert attention_kernel(plain, H100) == "flash2"


def test_blackwell_has_no_published_fp8_rate():
    """No FP8 attention measurement on B200: the bf16 rate (an upper bound), the casts still charged."""
    f16, _ = kernels(B200, fp8_recipe="mxfp8")
    f8, _ = kernels(B200, fp8_recipe="mxfp8", fp8_dot_product_attention=True)
    assert f8["cudnn_fwd"].time_s == f16["cudnn_fwd"].time_s
    assert "fp8_attn.qkv_cat" not in f8  # MXFP8 quantizes q, k, v in place (combine_and_quantize's fast path)
    assert f8["fp8_attn.qkv_quantize"].bytes == QKV * (2 + 1 + 1 / 32)


def test_fp8_dpa_backward_without_fp8_attention_is_refused():
    with pytest.raises(SpecError) as e:
        check_fp8_dpa(replace(WORK, fp8_dpa_backward=False), PAR)
    assert e.value.field == "workload.fp8_dpa_backward"


@pytest.mark.parametrize(
    ("recipe", "backward", "qkv", "out"),
    [
        ("delayed", True, QKV * 1, OUT * 1),  # fp8_tensors = (q_fp8, k_fp8, v_fp8, out_fp8)
        ("tensorwise", True, QKV * 1, OUT * 2),  # NVTE_DPA_FP8CS_O_in_F16=1: the bf16 output
        ("delayed", False, QKV * 2, OUT * 2),  # a bf16 backward saves the bf16 q, k, v and output
    ],
)
def test_the_saved_attention_tensors(recipe, backward, qkv, out):
    """bf16 activations under the recipe: Q, K, V (50,331,648 elements) and the output (33,554,432) saved for the
    attention's backward at 2 B, or as fp8 data (1 B) when the backward runs in FP8 (FusedAttnFunc fp8_tensors)."""
    from planner.memory import activation_parts

    work = replace(WORK, activation_dtype="bf16", fp8_recipe=recipe, fp8_dot_product_attention=True,
                   fp8_dpa_backward=backward)  # fmt: skip
    parts = activation_parts(Context(LLAMA, work, PAR), False)
    assert (parts["qkv"][1], parts["proj_in"][1]) == (qkv, out)
    plain = activation_parts(Context(LLAMA, replace(work, fp8_dot_product_attention=False), PAR), False)
    assert (plain["qkv"][1], plain["proj_in"][1]) == (QKV * 2, OUT * 2)


def test_mxfp8_quantizes_q_k_v_in_three_calls():
    """Under MXFP8 there is no cat and Q, K, V are quantized each by its own call (FP8_DPA_QKV_TENSORS, review r9a
    finding 8): three launches of MXFP8's one, the bytes unchanged; the output gradient one tensor, one launch."""
    f8, b8 = kernels(B200, fp8_recipe="mxfp8", fp8_dot_product_attention=True)
    assert FP8_DPA_QKV_TENSORS == 3
    assert f8["fp8_attn.qkv_quantize"].count == 3 and b8["fp8_attn.dout_quantize"].count == 1
    assert f8["fp8_attn.qkv_quantize"].time_s == pytest.approx(hbm_s(QKV * (2 + 1 + 1 / 32), B200, EFFICIENCY) + 3 * KS)


def test_the_cat_takes_the_host_floor_like_every_cast():
    """The cat is a launch like the quantize beside it: at a host floor above its GPU time it takes the floor
    (review r9a finding 8: it was priced at its GPU time alone)."""
    ctx = Context(LLAMA, replace(WORK, fp8_dot_product_attention=True), PAR)
    floor = 1.0  # a second a launch: above any cast's GPU time
    fwd, _ = attention_kernels(ctx, H100, EFFICIENCY, floor)
    f8 = {k.name: k for k in fwd}
    assert f8["fp8_attn.qkv_cat"].time_s == f8["fp8_attn.qkv_quantize"].time_s == floor
    assert f8["fp8_attn.qkv_cat"].gpu_s == pytest.approx(hbm_s(4 * QKV, H100, EFFICIENCY) + KS)
