"""The routed experts' fc1 input behind DeepEP's fp8 dispatch (kernels.QUANTIZED_BEFORE_DISPATCH, docs/serving.md
"DeepSeek-V3 prefill, round 14 (dsv3p14)"): SGLang and vLLM quantize it once per token on the sending rank before
the normal kernels' dispatch (DeepEP dispatches fp8 only with 1x128 block scales), and the low-latency dispatch
kernel casts inside itself; the cast kernel of an inference pass then holds the rank's own tokens, not the routed
copies. Closed forms on the LMSYS DeepSeek-V3 pools (bench/serving_validation.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from collectives.topology import cluster_preset
from planner import MODEL_PRESETS
from planner.kernels import _cast_gemms, cast_input_elements, input_quantize_bytes, layer_kernels
from planner.serving import Pool, ServeOptions, engine
from planner.serving.deployment import _context, _worker, with_redundant_experts

OPTIONS = ServeOptions(weight_dtype="fp8", redundant_experts=32)
MODEL = with_redundant_experts(MODEL_PRESETS["deepseek-v3"], 32)
CLUSTER = cluster_preset("dgx-h100", 12)


def moe_layer(pool: Pool, phase: str, per_rank: int, context: int):
    w = _worker(MODEL, CLUSTER, engine("sglang"), pool, 0)
    par = w.decode_par if phase == "decode" else w.par
    ctx = _context(MODEL, OPTIONS, phase, per_rank * pool.dp, context, par, w)
    return ctx, list(layer_kernels(ctx, True, CLUSTER.gpu).forward)


def test_normal_kernels_quantize_the_senders_tokens():
    """Prefill, EP32, 8 prompts of 2,000 per rank: fc1's input cast is 16,000 x 7,168 elements (the routed copies
    are 9 experts x 14,390 rows), at 3.03125 B each with every other GEMM input's."""
    pool = Pool("prefill", dp=32, ep=32, attention_dp=True, ep_dispatch="deepep", max_batch_tokens=16384)
    ctx, fwd = moe_layer(pool, "prefill", 8, 2000)
    gemms = _cast_gemms(ctx, fwd)
    fc1 = next(g for g in gemms if g.name == "experts_fc1")
    assert fc1.shape[3] == 9 and fc1.shape[0] * fc1.shape[3] > 8 * 16_000  # the copies the GEMM runs
    assert cast_input_elements(ctx, fc1) == 16_000 * 7168
    others = sum(g.shape[0] * g.shape[2] * g.shape[3] for g in gemms if g is not fc1)
    cast = next(k for k in fwd if k.name == "fp8_cast")
    assert input_quantize_bytes("blockwise") == 3.03125
    assert cast.bytes == pytest.approx((others + 16_000 * 7168) * 3.03125, rel=1e-12)
    # 5.654e9 when every copy was cast; 3.1879e9 before dsv3s15 fused MLA's q_a and kv_a projections (SGLang's
    # fused_qkv_a_proj_with_mqa: their shared 16,000 x 7,168 input quantized once, 0.3476e9 less)
    assert cast.bytes == pytest.approx(3.1879e9 - 16_000 * 7168 * 3.03125, rel=1e-4)


def test_low_latency_dispatch_casts_inside_its_kernel():
    """Decode, EP72 low-latency: no fc1 input in the cast kernel; fc2's input (the activation's output) is quantized
    by SGLang's masked activation kernel since dsv3s15 (silu_and_mul_masked_post_quant_fwd: engine_kernels.py
    SGLANG_MASKED), so it is not among the cast GEMMs either; under the planner's default kernels it is."""
    pool = Pool("decode", dp=72, ep=72, attention_dp=True, ep_dispatch="deepep")
    ctx, fwd = moe_layer(pool, "decode", 256, 2100)
    assert ctx.par.ep_dispatch == "deepep_ll"
    gemms = {g.name: g for g in _cast_gemms(ctx, fwd)}
    assert cast_input_elements(ctx, gemms["experts_fc1"]) == 0.0
    assert "experts_fc2" not in gemms
    bare = replace(ctx, work=replace(ctx.work, engine_kernels=None))
    fc2 = {g.name: g for g in _cast_gemms(bare, list(layer_kernels(bare, True, CLUSTER.gpu).forward))}["experts_fc2"]
    assert cast_input_elements(bare, fc2) == fc2.shape[0] * fc2.shape[2] * fc2.shape[3] > 0


def test_without_an_fp8_deepep_dispatch_every_copy_is_cast():
    """The all-to-all dispatcher (bf16 or fp8 bytes, no DeepEP block layout): the copies, as before."""
    pool = Pool("prefill", dp=32, ep=32, attention_dp=True, ep_dispatch="alltoall", max_batch_tokens=16384)
    ctx, fwd = moe_layer(pool, "prefill", 8, 2000)
    fc1 = next(g for g in _cast_gemms(ctx, fwd) if g.name == "experts_fc1")
    assert cast_input_elements(ctx, fc1) == fc1.shape[0] * fc1.shape[2] * fc1.shape[3]


def test_trtllm_deepep_dispatches_bf16_and_casts_every_copy():
    """TensorRT-LLM's DeepEP (EngineTraits.bf16_dispatches: communication/deep_ep.py post-quant dispatch for nvfp4
    only): the same prefill pool dispatches 2 B rows and fc1's cast holds every routed copy (9 x 14,390 rows x
    7,168 a rank, against SGLang's 16,000 x 7,168 sender tokens and 1 B rows)."""
    pool = Pool("prefill", dp=32, ep=32, attention_dp=True, ep_dispatch="deepep", max_batch_tokens=16384)
    sglang_ctx, _ = moe_layer(pool, "prefill", 8, 2000)
    w = _worker(MODEL, CLUSTER, engine("trtllm"), pool, 0)
    ctx = _context(MODEL, OPTIONS, "prefill", 8 * pool.dp, 2000, w.par, w)
    fc1 = next(
        g for g in _cast_gemms(ctx, list(layer_kernels(ctx, True, CLUSTER.gpu).forward)) if g.name == "experts_fc1"
    )
    assert (ctx.dispatch_bytes, sglang_ctx.dispatch_bytes) == (2, 1)
    copies = fc1.shape[0] * fc1.shape[2] * fc1.shape[3]
    assert cast_input_elements(ctx, fc1) == copies == pytest.approx(928_333_535.6, rel=1e-9)
    assert copies > 8 * cast_input_elements(sglang_ctx, fc1) / 1.01  # 8.1x the sender's 114,688,000
