"""Memory model (planner/memory.py) against the published formulas: Korthikanti et al. 2022 Table 2, Megatron's
theoretical_memory_usage.py (18 B/param, 6 + 12/dp), the ZeRO paper (16 B/param, / N_d by stage)."""

import pytest

from app.serialize import plan_dict
from collectives.topology import cluster_preset
from planner import ModelSpec, ParallelSpec, WorkloadSpec, build_plan, model_preset
from planner.compute import kv_cache_bytes_per_layer
from planner.context import Context
from planner.memory import (
    WORKSPACE_BYTES,
    chunk_activations,
    head_chunk_bytes,
    head_input_bytes,
    layer_activations,
    stage_activation_bytes,
    stage_memory,
)
from planner.params import stage_params, total
from planner.pipeline import Schedule, in_flight

# GPT with Korthikanti's assumptions: MHA, 4h GeLU MLP, LayerNorm, dropout (learned positions = GPT-style)
GPT = ModelSpec(
    24, 2048, 16, 8192, 51200, 2048, gated_mlp=False, norm="layernorm", linear_bias=True,
    learned_position_embeddings=True,
)  # fmt: skip
S, B, H, A = 2048, 2, 2048, 16


def ctx(model=GPT, tp=1, sp=False, recompute="none", pp=1, dp=1, zero=0, framework="megatron", **kw):
    work = WorkloadSpec(micro_batch_size=B, global_batch_size=B * dp * 16, activation_recompute=recompute)
    return Context(
        model,
        work,
        ParallelSpec(tp=tp, pp=pp, dp=dp, zero_stage=zero, sequence_parallel=sp, framework=framework, **kw),
    )


@pytest.mark.parametrize("t", [1, 2, 4, 8])
def test_korthikanti_table2_per_layer(t):
    sbh = S * B * H
    acts = layer_activations(ctx(tp=t), moe=False)
    # no parallelism / tensor parallel: sbh(10 + 24/t + 5as/(ht))
    assert acts.per_rank(t, sp=False, flash=False) == pytest.approx(sbh * (10 + 24 / t + 5 * A * S / (H * t)))
    # tensor + sequence parallel: sbh/t (34 + 5as/h)
    assert acts.per_rank(t, sp=True, flash=False) == pytest.approx(sbh / t * (34 + 5 * A * S / H))
    # selective recompute (or flash attention) drops the s² term: sbh(10 + 24/t), with SP 34 sbh/t
    assert acts.per_rank(t, sp=False, flash=True) == pytest.approx(sbh * (10 + 24 / t))
    assert acts.per_rank(t, sp=True, flash=True) == pytest.approx(34 * sbh / t)


def test_megatron_theoretical_memory_term_for_any_ffn():
    """Megatron theoretical_memory_usage.py compute_activation_memory: sbh(18 + 4·ffn/h)/t per layer with SP and
    selective recompute (MHA, GeLU MLP, dropout), for an ffn that is not 4h."""
    model = ModelSpec(4, 4096, 32, 11008, 32000, 4096, gated_mlp=False, linear_bias=True)
    acts = layer_activations(ctx(model, tp=4, sp=True), moe=False).per_rank(4, sp=True, flash=True)
    sbh = 4096 * B * 4096
    assert acts == pytest.approx(sbh * (18 + 4 * 11008 / 4096) / 4, rel=1e-12)


def test_gated_dropout_free_layer_generalises_the_tally():
    """Llama-style (SwiGLU, no dropout, MHA here): 16·sbh + 6·ffn·sb bytes per layer with SP (stored: Q, K, V,
    projection input, QKV and MLP inputs, two norm inputs; gate and up outputs and their product)."""
    model = ModelSpec(4, 4096, 32, 11008, 32000, 4096)
    acts = layer_activations(ctx(model, tp=4, sp=True), moe=False).per_rank(4, sp=True, flash=True)
    assert acts == pytest.approx((16 * 4096 * B * 4096 + 6 * 11008 * 4096 * B) / 4, rel=1e-12)


def test_full_recompute_keeps_layer_inputs():
    c = ctx(tp=4, sp=True, recompute="full")
    sched = Schedule("1f1b", 1, 16)
    one_layer = layer_activations(c, False).per_rank(4, True, True)
    expect = GPT.num_layers * 2 * S * B * H / 4 + one_layer + 4 * B * S * GPT.padded_vocab(4) // 4
    expect += 2 * 2 * S * B * H / 4  # the final norm's and the output layer's saved inputs (head_chunk_bytes)
    assert stage_activation_bytes(c, 0, sched) == pytest.approx(expect, rel=1e-9)


def test_final_norm_and_output_layer_inputs_on_the_loss_stage_by_hand():
    """Megatron-LM d98e8a6: the final norm saves its input and the output layer (ColumnParallelLinear,
    LinearWithGradAccumulationAndAsyncCommunication.forward) saves ``input`` before its SP all-gather: two
    [s, b, h] bf16 rows, each the sequence shard under SP, on the loss's stage only (the output layer's with
    the logits); none when not training. PyTorch's DTensor head gathers first and saves the gathered input
    (sp_wgrad_regather False)."""
    row = 2 * S * B * H  # one [s, b, h] bf16 activation, 16,777,216 B
    sched = Schedule("1f1b", 2, 16)
    logits = 4 * B * S * GPT.padded_vocab(4) // 4

    def added(framework: str, stage: int) -> float:
        c = ctx(tp=4, sp=True, pp=2, framework=framework)
        layers = layer_activations(c, False).per_rank(4, True, True) * len(c.stage_layers[stage])
        return stage_activation_bytes(c, stage, sched) - in_flight(sched, stage) * layers - logits * (stage == 1)

    assert added("megatron", 1) == 2 * row // 4 == 8_388_608  # norm input and head input, both sharded
    assert added("megatron", 0) == 0  # the first stage has no head
    # the head keeps the gathered input; its loss runs over the gathered logits (no loss parallelism: the whole
    # vocabulary on every rank, kernels.loss_vocab), 4 B each, where Megatron's runs over the rank's V/t
    gathered_logits = 4 * B * S * GPT.vocab_size - logits
    assert added("torch", 1) - gathered_logits == row // 4 + row == 20_971_520
    c = ctx(tp=4, sp=True, pp=2)
    assert chunk_activations(c, 1).logits == logits + row // 4  # the head's input goes with the logits
    infer = Context(GPT, WorkloadSpec(kind="inference", micro_batch_size=B, seq_length=S), ParallelSpec(tp=4))
    assert head_chunk_bytes(infer, infer.chunks[0][0]) == head_input_bytes(infer) == 0.0


def test_in_flight_microbatches_per_schedule():
    p, m, v = 8, 64, 4
    one = Schedule("1f1b", p, m)
    assert [in_flight(one, s) for s in range(p)] == [p - s for s in range(p)]
    assert in_flight(Schedule("1f1b", p, 3), 0) == 3
    assert in_flight(Schedule("gpipe", p, m), p - 1) == m
    inter = Schedule("interleaved", p, m, v)
    # Megatron's interleaved_schedule_memory_penalty: stage 0 holds p·(1 + (p-1)/(p·v)) micro-batches of its layers
    assert in_flight(inter, 0) == pytest.approx(p * (1 + (p - 1) / (p * v)))


@pytest.mark.parametrize("dp", [1, 8])
def test_megatron_bytes_per_parameter(dp):
    """18 B/param; 6 + 12/dp with the distributed optimizer (theoretical_memory_usage.py)."""
    model = model_preset("llama3-8b")
    plain = stage_memory(ctx(model, dp=dp, zero=0), 0, Schedule("1f1b", 1, 16))
    n = plain.param_count
    assert plain.params_bytes + plain.grads_bytes + plain.optimizer_bytes == pytest.approx(18 * n, abs=3)
    dist = stage_memory(ctx(model, dp=dp, zero=1), 0, Schedule("1f1b", 1, 16))
    assert dist.params_bytes + dist.grads_bytes + dist.optimizer_bytes == pytest.approx((6 + 12 / dp) * n, abs=3)


@pytest.mark.parametrize(("zero", "per_param"), [(0, 16), (1, 4 + 12 / 8), (2, 2 + 14 / 8), (3, 16 / 8)])
def test_zero_paper_bytes_per_parameter(zero, per_param):
    """ZeRO §3.1 / Figure 1: mixed-precision Adam, K = 12: 2 + 2 + K, sharded over N_d = 8 by stage."""
    model = model_preset("llama3-8b")
    mem = stage_memory(ctx(model, dp=8, zero=zero, framework="deepspeed"), 0, Schedule("1f1b", 1, 16))
    states = mem.params_bytes + mem.grads_bytes + mem.optimizer_bytes
    assert states == pytest.approx(per_param * mem.param_count, rel=1e-6)
    if zero == 3:  # the gathered layer being used and the prefetched one
        assert mem.buffers_bytes > WORKSPACE_BYTES


def test_param_count_is_the_ranks_unsharded_share():
    c = ctx(model_preset("llama3-70b"), tp=8, pp=4, dp=2, zero=3)
    dense, expert = stage_params(c, 1)
    assert stage_memory(c, 1, Schedule("1f1b", 4, 16)).param_count == total(dense) + total(expert)


def test_decode_holds_the_kv_cache():
    model = model_preset("llama3-70b")
    work = WorkloadSpec("inference", phase="decode", batch_size=16, context_length=8192)
    c = Context(model, work, ParallelSpec(tp=8))
    per_layer = 2 * 16 * 8192 * model.kv_heads * model.head_size // 8 * 2
    assert kv_cache_bytes_per_layer(c) == per_layer
    mem = stage_memory(c, 0, Schedule("1f1b", 1, 1))
    assert mem.activations_bytes >= per_layer * model.num_layers
    assert mem.grads_bytes == mem.optimizer_bytes == 0


def test_plan_warns_naming_the_stage_and_the_component():
    """Issue 11: Llama-3 70B on one 8-GPU node came back with no warning at all."""
    plan = build_plan(
        model_preset("llama3-70b"),
        WorkloadSpec(micro_batch_size=1, global_batch_size=64),
        ParallelSpec(tp=8, zero_stage=1, sequence_parallel=True),
        cluster_preset("dgx-h100", 1),
    )
    assert plan.memory is not None and not plan.memory.fits
    assert any("stage 0 does not fit" in w and "optimizer" in w for w in plan.warnings)
    out = plan_dict(plan)["memory"]
    row = out["per_stage"][0]
    assert row["peak_bytes"] == sum(row[k] for k in row if k.endswith("_bytes") and k != "peak_bytes")
    assert out["capacity_bytes"] == cluster_preset("dgx-h100").gpu.hbm_bytes


def test_405b_on_16k_gpus_fits():
    plan = build_plan(
        model_preset("llama3-405b"),
        WorkloadSpec(micro_batch_size=1, global_batch_size=2048),
        ParallelSpec(
            tp=8, pp=16, dp=128, zero_stage=1, sequence_parallel=True, first_stage_layers=7, last_stage_layers=7
        ),
        cluster_preset("dgx-h100", 2048),
    )
    assert plan.memory.fits
    first = plan.memory.per_stage[0]
    assert first.activations_bytes > plan.memory.per_stage[-2].activations_bytes  # stage 0 holds p micro-batches


def test_warning_lists_the_stages_that_break_once():
    """Issue 11: Llama-3 70B TP1 PP16 ZeRO-1 on 512 GPUs at seq 8192 was ranked first and does not fit."""
    plan = build_plan(
        model_preset("llama3-70b"),
        WorkloadSpec(micro_batch_size=1, global_batch_size=1024),
        ParallelSpec(tp=1, pp=16, dp=32, zero_stage=1),
        cluster_preset("dgx-h100", 64),
    )
    memory = [w for w in plan.warnings if "do not fit" in w]
    assert len(memory) == 1 and memory[0].startswith("stages 0-10 do not fit (11 of 16): stage 0 needs")
    assert "largest part: activations" in memory[0]


def test_unfused_attention_keeps_the_score_tensors():
    """Korthikanti et al. 2022 Table 2: without flash attention a layer keeps 5·a·s²·b bytes of scores (softmax
    output, dropout mask and output), /t; selective recompute drops them; full recompute keeps them for the one
    layer it re-runs at a time."""
    from dataclasses import replace

    gpt = replace(GPT, linear_bias=True, learned_position_embeddings=True)  # GPT-3: dropout, as Table 2
    one_layer = 5 * gpt.num_attention_heads * gpt.seq_length**2 * B / 2
    sched = Schedule("1f1b", 1, 16)  # one micro-batch in flight
    for recompute, layers in (("none", gpt.num_layers), ("selective", 0), ("full", 1)):
        flash = ctx(gpt, tp=2, recompute=recompute)
        unfused = Context(gpt, replace(flash.work, attention_kernel="unfused"), flash.par)
        diff = stage_activation_bytes(unfused, 0, sched) - stage_activation_bytes(flash, 0, sched)
        assert diff == pytest.approx(layers * one_layer)
