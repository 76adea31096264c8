"""Attention dropout in the fused kernel over HTTP (docs/step-time.md "Attention dropout (drop9)"): a GPT-style
plan (GPT-3 175B's layers: biases and learned positions, so Megatron's attention dropout 0.1) on an H200 is slower
than the same plan without the fused kernel's dropout by exactly m x layers x the kernel's extra forward and
backward seconds, scores x FUSED_DROPOUT_SM_CYCLES / (132 SMs x 1,980 MHz)."""

import pytest

from app.convert import plan_inputs
from app.schemas.plan import PlanRequest
from app.settings import Settings
from planner import Context, compute, kernels
from planner.kernels import FUSED_DROPOUT_SM_CYCLES, efficiency
from planner.spread import job_pace, paced_gpu

BODY = {
    "model": {"preset": "gpt3-175b", "num_layers": 2},
    "workload": {"kind": "training", "micro_batch_size": 1, "global_batch_size": 2, "attention_kernel": "cudnn"},
    "parallel": {"tp": 8, "pp": 1, "dp": 1},
    "cluster": {"preset": "dgx-h200", "num_nodes": 1},
    "options": {"timeline": False},
}


def test_a_gpt_plan_pays_the_fused_kernels_dropout_per_layer(api, monkeypatch):
    r = api.post("/v1/plan", json=BODY)
    assert r.status_code == 200, r.text
    with_dropout = r.json()["step"]["compute_s"]
    model, work, par, cluster, _ = plan_inputs(PlanRequest.model_validate(BODY), Settings())
    ctx = Context(model, work, par)
    # the step is timed on the slowest of the plan's 8 GPUs (planner/spread.py, spread15/mend15f): the part at clock
    # / k, k = 1 + 1.48% x E[max of 8 normals] = 1.0211, which also runs the dropout's SM cycles k times slower
    gpu, k = paced_gpu(ctx, cluster.gpu), job_pace(ctx, cluster.gpu)
    eff = efficiency(gpu, None)
    # the same plan without the kernel's dropout: the pure function with the table emptied (its memos bypassed)
    monkeypatch.setattr(kernels, "FUSED_DROPOUT_SM_CYCLES", {})
    for module in (kernels, compute):  # the value-keyed memos (kernels.memo_by) called through
        monkeypatch.setattr(module, "memo_by", lambda memo, key, kept, fn, *args: fn(*args))
    free = compute._stage_compute.__wrapped__(ctx, 0, gpu, eff, False)  # not paired (a dense model)
    without = 2 * (free.forward.total_s + free.backward.total_s) + free.optimizer_s
    scores = 12 * 2048 * (2048 + 1) / 2  # 96 heads / tp 8, 2,048 queries, their mean attended keys (causal)
    cf, cb = FUSED_DROPOUT_SM_CYCLES["cudnn"]
    per_layer = scores * (cf + cb) / (132 * 1980e6)  # 53.0 us a layer, forward and backward
    assert with_dropout - without == pytest.approx(2 * 2 * per_layer * k, rel=1e-6)  # m 2 x 2 layers
    assert 52.8e-6 < per_layer < 53.2e-6
