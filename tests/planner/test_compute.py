"""Compute model (planner/compute.py): FLOPs against closed forms and parameter counts, times against the roofline."""

from dataclasses import replace

import pytest

from collectives.topology.gpu import GPUS, GPUSpec
from planner import ModelSpec, MoESpec, ParallelSpec, SpecError, WorkloadSpec, model_preset
from planner.compute import (
    EFFICIENCY,
    FLASH_BWD,
    attention_efficiency,
    check_gpu,
    gemm_s,
    layer_forward,
    model_flops_per_token,
    stage_compute,
)
from planner.context import Context

H100 = GPUS["h100-sxm5-80gb"]
A100 = GPUS["a100-sxm4-80gb"]
GPT = ModelSpec(24, 2048, 16, 8192, 51200, 2048, gated_mlp=False, norm="layernorm")


def ctx(model=GPT, tp=1, cp=1, pp=1, sp=False, recompute="none", b=1, **par):
    return Context(
        model,
        WorkloadSpec(micro_batch_size=b, global_batch_size=b * 8, activation_recompute=recompute),
        ParallelSpec(tp=tp, cp=cp, pp=pp, dp=1, sequence_parallel=sp, **par),
    )


def test_dense_layer_flops_are_twice_tokens_times_matmul_params_plus_causal_attention():
    """A layer's forward = 2·T·(matmul parameters) + causal attention 2·b·s²·h (half of 4·b·s²·h)."""
    for model in (GPT, model_preset("llama3-8b"), model_preset("llama3-70b")):
        c = ctx(model)
        matmul = model.attention_params() + model.mlp_params(model.ffn_hidden_size)
        s, hq = model.seq_length, model.num_attention_heads * model.head_size
        fwd, _ = layer_forward(c, False, H100)
        assert fwd.flops == pytest.approx(2 * s * matmul + 2 * s * s * hq, rel=1e-12)


def test_tensor_and_context_parallel_split_the_flops_exactly():
    model = model_preset("llama3-70b")
    whole = layer_forward(ctx(model), False, H100)[0].flops
    assert layer_forward(ctx(model, tp=8), False, H100)[0].flops * 8 == pytest.approx(whole)
    assert layer_forward(ctx(model, tp=8, cp=4), False, H100)[0].flops * 32 == pytest.approx(whole)


def test_moe_layer_runs_top_k_experts_per_token():
    """Router 2·T·h·E + attention + shared experts + k routed experts, independent of ep (uniform routing)."""
    moe = MoESpec(num_experts=8, top_k=2, expert_ffn_hidden_size=1024, num_shared_experts=1)
    model = replace(GPT, gated_mlp=True, moe=moe)
    s, h = model.seq_length, model.hidden_size
    expect = 2 * s * (model.attention_params() + h * 8 + model.mlp_params(1024) + 2 * model.expert_params())
    expect += 2 * s * s * h
    for ep in (1, 2, 8):
        c = Context(model, WorkloadSpec(global_batch_size=8), ParallelSpec(dp=8, ep=ep))
        assert layer_forward(c, True, H100)[0].flops == pytest.approx(expect, rel=1e-12)


def test_backward_is_twice_forward_and_recompute_adds_forward_work():
    none = stage_compute(ctx(pp=2), 0, A100)  # stage 0 of 2: layers only (the LM head is not recomputed)
    fwd, bwd = none.forward, none.backward
    assert bwd.gemm_s == pytest.approx(2 * fwd.gemm_s)
    assert bwd.elementwise_s == pytest.approx(2 * fwd.elementwise_s)
    a_fwd, a_bwd = attention_efficiency(A100)
    assert bwd.attention_s == pytest.approx(FLASH_BWD * fwd.attention_s * a_fwd / a_bwd)
    full = stage_compute(ctx(pp=2, recompute="full"), 0, A100).backward
    assert full.total_s == pytest.approx(bwd.total_s + fwd.total_s)
    selective = stage_compute(ctx(pp=2, recompute="selective"), 0, A100).backward
    assert selective.total_s - bwd.total_s == pytest.approx(none.attention_fwd_s)


def test_gemm_roofline_compute_bound_and_memory_bound():
    peak, hbm = H100.peak("bf16"), H100.hbm_GBps * 1e9
    m = n = k = 8192
    big = gemm_s(m, n, k, 2, peak, hbm)
    rate = peak * EFFICIENCY.gemm * k / (k + EFFICIENCY.gemm_k0)
    assert big == pytest.approx(2 * m * n * k / rate + EFFICIENCY.kernel_s)
    # decode: one token row against a weight matrix reads the weights: memory-bound
    thin = gemm_s(1, 8192, 8192, 2, peak, hbm)
    assert thin == pytest.approx((8192 + 8192 * 8192 + 8192) * 2 / (hbm * EFFICIENCY.hbm) + EFFICIENCY.kernel_s)
    assert gemm_s(0, 10, 10, 2, peak, hbm) == 0.0


def test_efficiency_constants_are_fractions():
    for value in (EFFICIENCY.gemm, EFFICIENCY.attention_fwd, EFFICIENCY.attention_bwd, EFFICIENCY.hbm):
        assert 0.2 < value < 1.0
    assert attention_efficiency(A100) != attention_efficiency(H100)  # per-generation FA measurements


def test_model_flops_follow_palm_and_llama3():
    """6N + 12·L·H·Q·T per token; N excludes the input embedding (no matmul), includes the LM head."""
    model = model_preset("llama3-405b")
    c = Context(model, WorkloadSpec(global_batch_size=8), ParallelSpec(dp=8))
    n = model.total_params() - model.vocab_size * model.hidden_size
    attn = 12 * model.num_layers * model.num_attention_heads * model.head_size * model.seq_length
    assert model_flops_per_token(c) == pytest.approx(6 * n + attn, rel=1e-12)
    assert 6 * n == pytest.approx(6 * 404e9, rel=0.01)  # Llama 3 paper: 405B parameters


def test_gpu_without_a_needed_figure_is_named():
    with pytest.raises(SpecError) as err:
        check_gpu(GPUSpec("x", {"bf16": 100.0}, hbm_bytes=1 << 30, hbm_GBps=0.0), "bf16")
    assert err.value.field == "cluster.gpu.hbm_GBps"
    with pytest.raises(SpecError) as err:
        check_gpu(GPUSpec("x", {"fp32": 10.0}, hbm_bytes=1 << 30, hbm_GBps=100.0), "bf16")
    assert err.value.field == "cluster.gpu.peak_tflops.bf16"
    with pytest.raises(SpecError) as err:
        check_gpu(None, "bf16")
    assert err.value.field == "cluster.gpu"


# ---- unfused attention (Megatron-LM 2021-2022) and fp8 (TransformerEngine) ----------------------------------


def work(**kw):
    return WorkloadSpec(micro_batch_size=2, global_batch_size=16, **kw)


def test_unfused_attention_is_two_batched_gemms_and_the_memory_bound_softmax_and_dropout():
    """Per head: QK^T (s x d @ d x s) and PV (s x s @ s x d) over the whole square; 9 bytes per score forward
    (softmax 4, dropout 5) and 11 backward (6 + 5) for GPT with dropout, the softmax alone without dropout."""
    from planner.compute import unfused_attention

    gpt = replace(GPT, linear_bias=True, learned_position_embeddings=True)  # GPT-2/3: dropout 0.1
    hbm = A100.hbm_GBps * 1e9 * EFFICIENCY.hbm
    s, d = gpt.seq_length, gpt.head_size
    for tp in (1, 4):
        c = Context(gpt, work(attention_kernel="unfused"), ParallelSpec(tp=tp, dp=1))
        heads = 2 * gpt.num_attention_heads / tp
        peak = A100.peak("bf16")
        hbm_peak = A100.hbm_GBps * 1e9
        gemms = heads * (gemm_s(s, s, d, 2, peak, hbm_peak) + gemm_s(s, d, s, 2, peak, hbm_peak))
        fwd, bwd = unfused_attention(c, A100)
        assert fwd == pytest.approx(gemms + heads * s * s * 9 / hbm)
        assert bwd == pytest.approx(2 * gemms + heads * s * s * 11 / hbm)
        _, attn = layer_forward(c, False, A100)
        assert attn == pytest.approx(fwd)
    llama = model_preset("llama3-8b")  # no dropout: the softmax alone
    c = Context(llama, work(attention_kernel="unfused"), ParallelSpec(dp=1))
    fwd, bwd = unfused_attention(c, H100)
    hbm_h = H100.hbm_GBps * 1e9 * EFFICIENCY.hbm
    scores = 2 * llama.num_attention_heads * llama.seq_length**2
    peak_h = H100.peak("bf16") * 0.9
    L, dh = llama.seq_length, llama.head_size
    gemms = (
        2
        * llama.num_attention_heads
        * (gemm_s(L, L, dh, 2, peak_h, H100.hbm_GBps * 1e9) + gemm_s(L, dh, L, 2, peak_h, H100.hbm_GBps * 1e9))
    )
    assert fwd == pytest.approx(gemms + scores * 4 / hbm_h)
    assert bwd == pytest.approx(2 * gemms + scores * 6 / hbm_h)


def test_unfused_attention_is_slower_than_flash_and_selective_recompute_reruns_it():
    flash = stage_compute(Context(GPT, work(activation_recompute="selective"), ParallelSpec(dp=1)), 0, A100)
    unfused_ctx = Context(GPT, work(activation_recompute="selective", attention_kernel="unfused"), ParallelSpec(dp=1))
    unfused = stage_compute(unfused_ctx, 0, A100)
    assert unfused.forward.attention_s > 2 * flash.forward.attention_s
    assert unfused.forward.gemm_s == flash.forward.gemm_s  # the linear layers do not change
    from planner.compute import unfused_attention

    fwd, bwd = unfused_attention(unfused_ctx, A100)
    assert unfused.backward.attention_s == pytest.approx(GPT.num_layers * (bwd + fwd))


def test_fp8_runs_the_linear_gemms_at_175x_bf16_and_keeps_attention_and_head_in_bf16():
    """cuBLAS 12.9 blog: fp8 GEMMs reach 1.75x bf16 on Hopper; TE keeps attention (fp8 DPA off), the tensors
    between kernels and Megatron-Core's output layer in bf16; each GEMM's input and weight are cast (4 B each)."""
    from planner.compute import FP8_CAST_BYTES, FP8_GEMM_SPEEDUP, _gemm_shapes, _head, gemm_peak

    model = model_preset("llama3-8b")
    bf16 = Context(model, work(), ParallelSpec(tp=2, dp=1, sequence_parallel=True))
    fp8 = Context(model, work(activation_dtype="fp8"), ParallelSpec(tp=2, dp=1, sequence_parallel=True))
    assert FP8_GEMM_SPEEDUP == 1.75
    assert gemm_peak(fp8, H100) == pytest.approx(989.4e12 * 1.75 * 0.9)
    assert gemm_peak(fp8, H100, "bf16") == gemm_peak(bf16, H100)
    f8, a8 = layer_forward(fp8, False, H100)
    f16, a16 = layer_forward(bf16, False, H100)
    assert a8 == a16 and f8.elementwise_s == f16.elementwise_s
    assert f16.fp8_cast_s == 0
    elements = sum(m * k + k * n for m, n, k in _gemm_shapes(fp8, False))
    assert f8.fp8_cast_s == pytest.approx(elements * FP8_CAST_BYTES / (H100.hbm_GBps * 1e9 * EFFICIENCY.hbm))
    assert 1.2 < f16.gemm_s / f8.gemm_s <= 1.75  # thin shapes gain less (their operand traffic halves, not the rate)
    assert _head(fp8, H100, EFFICIENCY) == _head(bf16, H100, EFFICIENCY)
    from planner.compute import unfused_attention

    unfused = {
        dt: Context(model, work(activation_dtype=dt, attention_kernel="unfused"), bf16.par) for dt in ("fp8", "bf16")
    }
    assert unfused_attention(unfused["fp8"], H100) == unfused_attention(unfused["bf16"], H100)


def test_unknown_attention_kernel_is_named():
    from planner.workload import validate_workload

    with pytest.raises(SpecError, match=r"workload\.attention_kernel"):
        validate_workload(work(attention_kernel="xformers"))
