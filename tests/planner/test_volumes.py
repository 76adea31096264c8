"""Closed-form communication volumes from the papers, computed through the whole planner (ring pinned)."""

from dataclasses import replace

import pytest

from app.serialize import plan_dict
from collectives.topology import cluster_preset
from planner import ModelSpec, MoESpec, Options, ParallelSpec, WorkloadSpec, build_plan, model_preset
from planner.context import Context
from planner.params import stage_params, total

RING = Options(algorithm="ring")
SMALL = ModelSpec(4, 1024, 8, 4096, 32000, 1024, num_kv_heads=8)


def sent(plan: dict, prefix: str, stage: int = 0) -> int:
    """Bytes one rank of ``stage`` sends per iteration in the calls whose name starts with ``prefix``."""
    return sum(
        c["calls_per_iteration"] * c["bytes_sent_per_rank"]
        for c in plan["calls"]
        if c["name"].startswith(prefix) and stage in c["stages"]
    )


def plan_on_h100(model: ModelSpec, work: WorkloadSpec, par: ParallelSpec, nodes: int | None = None, *options) -> dict:
    """The plan's JSON on ``nodes`` DGX H100 nodes (the preset's default when None)."""
    return plan_dict(build_plan(model, work, par, cluster_preset("dgx-h100", nodes), *options))


def call(plan: dict, name: str) -> dict:
    """The plan's call named ``name``."""
    return next(c for c in plan["calls"] if c["name"] == name)


def zero_sent(plan: dict) -> int:
    """The gradient and parameter traffic (not the step's 1-element norm reductions)."""
    return sent(plan, "dp.grads") + sent(plan, "dp.params")


def zero_plan(stage: int, micro_batches: int = 1, dp: int = 8) -> tuple[dict, int]:
    work = WorkloadSpec(micro_batch_size=1, global_batch_size=dp * micro_batches, grad_reduce_dtype="bf16")
    # the paper's ZeRO (Megatron flavour: reduce-scatter + all-gather); real DeepSpeed differs (test_deepspeed.py)
    par = ParallelSpec(dp=dp, zero_stage=stage, framework="megatron")
    psi = total(stage_params(Context(SMALL, work, par), 0)[0])
    return plan_on_h100(SMALL, work, par, dp // 8, RING), psi


@pytest.mark.parametrize(("stage", "psis"), [(0, 2), (1, 2), (2, 2), (3, 3)])
def test_zero_paper_volumes_one_micro_batch(stage, psis):
    """ZeRO §5: 2Ψ per rank for DP, ZeRO-1 and ZeRO-2, 3Ψ for ZeRO-3 (ring: x (n-1)/n)."""
    plan, psi = zero_plan(stage)
    n, bytes_per = 8, 2
    # Megatron pads the bucket to lcm(dp, 128) elements: well under 1e-5 of Ψ
    assert zero_sent(plan) == pytest.approx(psis * psi * bytes_per * (n - 1) / n, rel=1e-5)


def test_zero_volumes_scale_with_micro_batches():
    m, n = 4, 8
    for stage, per_iteration in ((0, 2), (1, 2), (2, m + 1), (3, 3 * m)):
        plan, psi = zero_plan(stage, m)
        assert zero_sent(plan) == pytest.approx(per_iteration * psi * 2 * (n - 1) / n, rel=1e-5), stage


def _tp_plan(sp: bool, t: int = 8, m: int = 2):
    model = model_preset("llama3-70b")
    work = WorkloadSpec(micro_batch_size=1, global_batch_size=m)
    par = ParallelSpec(tp=t, pp=1, dp=1, sequence_parallel=sp)
    return plan_on_h100(model, work, par, t // 8, RING), model


def test_megatron_sc21_tp_volume():
    """SC'21 §3: 8·b·s·h·(t-1)/t elements per rank per layer per micro-batch, 16·b·s·h·(t-1)/t bytes."""
    plan, model = _tp_plan(sp=False)
    b, s, h, t, layers, m = 1, model.seq_length, model.hidden_size, 8, model.num_layers, 2
    per_layer = (sent(plan, "tp.attn.") + sent(plan, "tp.mlp.")) / (layers * m)
    assert per_layer == pytest.approx(16 * b * s * h * (t - 1) / t, rel=1e-9)


def test_sequence_parallel_adds_the_wgrad_regather():
    """Korthikanti et al.: SP moves the same bytes as TP (AG + RS = AR); Megatron's backward re-gathers the
    column-parallel inputs for the weight gradient: 10 instead of 8 units of A(t-1)/t per layer."""
    plain, _ = _tp_plan(sp=False)
    seq, _ = _tp_plan(sp=True)
    ratio = (sent(seq, "tp.attn.") + sent(seq, "tp.mlp.")) / (sent(plain, "tp.attn.") + sent(plain, "tp.mlp."))
    assert ratio == pytest.approx(10 / 8, rel=1e-9)


def test_full_recompute_repeats_forward_tp():
    model = model_preset("llama3-8b")
    par = ParallelSpec(tp=8)
    base = plan_on_h100(model, WorkloadSpec(), par, None, RING)
    full = plan_on_h100(model, WorkloadSpec(activation_recompute="full"), par, None, RING)
    assert sent(full, "tp.attn.") + sent(full, "tp.mlp.") == pytest.approx(
        1.5 * (sent(base, "tp.attn.") + sent(base, "tp.mlp."))
    )


def test_interleaved_pipeline_counts():
    model = model_preset("llama3-8b")
    work = WorkloadSpec(micro_batch_size=1, global_batch_size=8)
    par = ParallelSpec(tp=8, pp=4, pipeline_schedule="interleaved", virtual_pipeline_stages=2, sequence_parallel=True)
    plan = plan_on_h100(model, work, par, 4)
    rows = {(c["name"], tuple(c["stages"])): c for c in plan["calls"] if c["parallelism"] == "pp"}
    assert rows[("pp.activation", (0, 1, 2))]["calls_per_iteration"] == 16  # v*m
    assert rows[("pp.activation", (3,))]["calls_per_iteration"] == 8  # (v-1)*m, the last chunk ends in the loss
    assert rows[("pp.activation_grad", (1, 2, 3))]["calls_per_iteration"] == 16
    assert rows[("pp.activation_grad", (0,))]["calls_per_iteration"] == 8
    assert rows[("pp.activation", (0, 1, 2))]["message_bytes"] == 1 * 8192 * 4096 * 2 // 8  # A / t with SP


def test_tied_embeddings_allreduce_between_first_and_last_stage():
    model = model_preset("gpt3-175b")
    par = ParallelSpec(tp=8, pp=8, dp=1, sequence_parallel=True)
    plan = plan_on_h100(model, WorkloadSpec(global_batch_size=8), par, 8)
    tied = [c for c in plan["calls"] if c["name"] == "embedding.tied_grads"]
    assert tied and tied[0]["stages"] == [0, 7] and tied[0]["group_size"] == 2
    assert tied[0]["message_bytes"] == 51200 // 8 * 12288 * 4  # padded vocab / t x h, fp32 main grads


def test_expert_dispatch_volume():
    """Per MoE layer and micro-batch: T·k·h·x per rank each way, (e-1)/e of it leaving the rank."""
    model = model_preset("mixtral-8x7b")
    work = WorkloadSpec(micro_batch_size=1, global_batch_size=8)
    par = ParallelSpec(dp=8, ep=8)
    plan = plan_on_h100(model, work, par)
    dispatch = call(plan, "ep.dispatch")
    tokens, k, h, x = 4096, 2, 4096, 2
    assert dispatch["message_bytes"] == tokens * k * h * x
    assert dispatch["bytes_sent_per_rank"] == dispatch["message_bytes"] * 7 // 8
    assert dispatch["calls_per_iteration"] == 32  # 32 MoE layers x 1 micro-batch
    capped = replace(model, moe=MoESpec(8, 2, 14336, capacity_factor=1.25))
    plan = plan_on_h100(capped, work, par)
    assert call(plan, "ep.dispatch")["message_bytes"] == tokens * k * h * x * 5 // 4
    assert not any(c["name"] == "ep.token_counts" for c in plan["calls"])  # capacity: no count exchange


def test_ring_attention_volume_and_recompute():
    model = model_preset("llama3-8b")
    par = ParallelSpec(tp=2, cp=4)
    work = WorkloadSpec(micro_batch_size=1, global_batch_size=1)
    plan = plan_on_h100(model, work, par)
    kv = call(plan, "cp.attn.kv")
    assert kv["message_bytes"] == 2 * 1 * (8192 // 4) * (8 // 2) * 128 * 2
    assert kv["calls_per_iteration"] == 3 * 32
    selective = plan_on_h100(model, WorkloadSpec(activation_recompute="selective"), par)
    assert any(c["name"] == "cp.attn.kv.recompute" for c in selective["calls"])


def test_decode_has_forward_only_and_no_data_parallel_traffic():
    model = model_preset("llama3-70b")
    work = WorkloadSpec(kind="inference", phase="decode", batch_size=64)
    plan = plan_on_h100(model, work, ParallelSpec(tp=8, dp=8), 8)
    assert {c["phase"] for c in plan["calls"]} == {"forward"}
    assert not any(c["parallelism"] == "dp" for c in plan["calls"])
    out_proj = call(plan, "tp.attn.out_proj")
    assert out_proj["message_bytes"] == 8 * 1 * 8192 * 2  # 64 sequences / 8 replicas, one token each
    assert out_proj["calls_per_iteration"] == 80


def test_totals_follow_the_contract():
    par = ParallelSpec(tp=8, pp=4, dp=2, zero_stage=1, sequence_parallel=True)
    plan = plan_on_h100(model_preset("llama3-70b"), WorkloadSpec(global_batch_size=64), par, 8)
    for row in plan["totals"]["per_stage"]:
        listed = [c for c in plan["calls"] if row["stage"] in c["stages"]]
        assert row["message_bytes"] == sum(c["calls_per_iteration"] * c["message_bytes"] for c in listed)
        assert row["bytes_sent"] == sum(c["calls_per_iteration"] * c["bytes_sent_per_rank"] for c in listed)
        assert row["time_s"] == pytest.approx(sum(c["calls_per_iteration"] * c["time_s"] for c in listed))
    assert plan["totals"]["time_s"] == max(r["time_s"] for r in plan["totals"]["per_stage"])
