"""Compute model (planner/compute.py): FLOPs against closed forms and parameter counts (the kernel model itself:
tests/planner/test_kernels.py)."""

import math
from dataclasses import replace

import pytest

from collectives.topology.gpu import GPUS, GPUSpec
from planner import ModelSpec, MoESpec, ParallelSpec, SpecError, WorkloadSpec, model_preset
from planner.compute import (
    FLASH_BWD,
    check_gpu,
    embedding_pass,
    layer_attention_flops,
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
    """A layer's forward = 2·T·(matmul parameters) + causal attention 2·b·s·(s + 1)·h: each query i sees i + 1
    keys, (s + 1)/2 on average (kernels.causal_keys)."""
    for model in (GPT, model_preset("llama3-8b"), model_preset("llama3-70b")):
        c = ctx(model)
        matmul = model.attention_params() + model.mlp_params(model.ffn_hidden_size)
        s, hq = model.seq_length, model.num_attention_heads * model.head_size
        fwd, _ = layer_forward(c, False, H100)
        assert fwd.flops == pytest.approx(2 * s * matmul + 2 * s * (s + 1) * hq, rel=1e-12)


def test_tensor_and_context_parallel_split_the_flops_exactly():
    model = model_preset("llama3-70b")
    whole = layer_forward(ctx(model), False, H100)[0].flops
    assert layer_forward(ctx(model, tp=8), False, H100)[0].flops * 8 == pytest.approx(whole)
    assert layer_forward(ctx(model, tp=8, cp=4), False, H100)[0].flops * 32 == pytest.approx(whole)


def test_moe_layer_runs_top_k_experts_per_token():
    """Router 2·T·h·E + attention + shared experts + k routed experts; with ep ranks the busiest rank runs
    R + sqrt(2·ln(ep)·R) expert rows for a mean R, plus its hottest expert's measured excess, 0.52 x an expert's
    mean under the auxiliary loss (kernels.expert_rows, ROUTING_MAXVIO)."""
    moe = MoESpec(num_experts=8, top_k=2, expert_ffn_hidden_size=1024, num_shared_experts=1)
    model = replace(GPT, gated_mlp=True, moe=moe)
    s, h = model.seq_length, model.hidden_size
    base = 2 * s * (model.attention_params() + h * 8 + model.mlp_params(1024)) + 2 * s * (s + 1) * h
    routed = 2 * s * 2 * model.expert_params()
    for ep in (1, 2, 8):
        c = Context(model, WorkloadSpec(global_batch_size=8), ParallelSpec(dp=8, ep=ep))
        rank_mean = s * 2  # copies landing on one EP rank: ep ranks' tokens x k over E / (E/ep) experts
        expert_mean = rank_mean / (8 // ep)
        busiest = rank_mean + math.sqrt(2 * math.log(ep) * rank_mean) + 0.52 * expert_mean if ep > 1 else rank_mean
        expect = base + routed * busiest / rank_mean
        assert layer_forward(c, True, H100)[0].flops == pytest.approx(expect, rel=1e-9)


def test_backward_kernels_and_recompute():
    none = stage_compute(ctx(pp=2), 0, A100)  # stage 0 of 2: layers and the embedding (the LM head is not here)
    fwd, bwd = none.forward, none.backward
    assert bwd.flops == pytest.approx(2 * fwd.flops + (FLASH_BWD - 2) * layer_attention_flops(ctx()) * 12)
    assert 1.8 < bwd.gemm_s / fwd.gemm_s < 2.3  # data and weight gradients, each its own shape
    full = stage_compute(ctx(pp=2, recompute="full"), 0, A100).backward
    embed = embedding_pass(ctx(pp=2), A100)[0].total_s  # the lookup runs before the layers' checkpoints
    assert embed > 0
    assert full.total_s == pytest.approx(bwd.total_s + fwd.total_s - embed)
    selective = stage_compute(ctx(pp=2, recompute="selective"), 0, A100).backward
    assert selective.total_s - bwd.total_s == pytest.approx(none.attention_fwd_s)


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


def test_the_final_norm_runs_on_the_stage_that_holds_it():
    """Megatron-Core's final_layernorm (transformer_block.py, post_process) / torchtitan's model.norm: one norm over
    the rank's tokens x h (the sequence shard under SP), priced as a layer's input norm, forward and backward, on
    the loss's stage only (memory.holds_final_norm); Llama 3 8B, tp 2 with SP, pp 2, one 8,192-token sequence."""
    from planner.kernels import EFFICIENCY, final_norm_kernels, layer_kernels

    gpu = GPUS["h100-sxm5-80gb"]
    ctx = Context(
        model_preset("llama3-8b"),
        WorkloadSpec(micro_batch_size=1, global_batch_size=8),
        ParallelSpec(tp=2, pp=2, dp=2, sequence_parallel=True),
    )
    fwd, bwd = final_norm_kernels(ctx, gpu, EFFICIENCY)
    lk = layer_kernels(ctx, False, gpu)
    (norm,), (norm_b,) = fwd, bwd
    (inp,) = [k for k in lk.forward if k.name == "input_norm"]
    (inp_b,) = [k for k in lk.backward if k.name == "input_norm.bwd"]
    assert norm.bytes == inp.bytes and norm.time_s == inp.time_s and norm_b.bytes == inp_b.bytes
    assert inp.bytes == 4 * 8192 // 2 * 4096  # fused RMSNorm: read 2 and write 2 B an element, 4,096 rows
    import planner.compute as compute

    with_norm = [compute.stage_pass_compute(ctx, s, gpu) for s in (0, 1)]
    bare = Context(ctx.model, ctx.work, ctx.par)  # its stage roles without the final norm (Context.stage_roles)
    bare.__dict__["stage_roles"] = tuple((*roles[:5], False) for roles in ctx.stage_roles)
    without = [compute._stage_pass_compute(bare, s, gpu, compute.efficiency(gpu, None)) for s in (0, 1)]
    assert with_norm[0] == without[0]  # the first stage has no final norm
    assert with_norm[1][0].total_s - without[1][0].total_s == pytest.approx(norm.time_s, rel=1e-12)
    assert with_norm[1][1].total_s - without[1][1].total_s == pytest.approx(norm_b.time_s, rel=1e-12)
