"""A plan with overlap_moe_expert_parallel_comm on FP8 over HTTP (issue 20, round 9: qwen9): Megatron's combined 1F1B
runs each MoE layer's backward and the next micro-batch's forward as one pair through the host's queue
(compute.combined_pair; tests/planner/test_host_combined.py has its closed forms). Over HTTP the step's compute is
the pure functions': each micro-batch's stage passes plus the pair's change of their host waits
(compute.combined_pair_delta), and the switch off leaves the per-pass rule."""

import copy

import pytest

from app.convert import plan_inputs
from app.schemas.plan import PlanRequest
from app.settings import Settings
from planner import Context
from planner.compute import combined_pair, combined_pair_delta, layer_pass, stage_compute
from planner.kernels import EFFICIENCY, layer_kernels
from planner.spread import paced_gpu

# Qwen3-30B-A3B with FP8 current scaling (TransformerEngine's tensorwise) as the 25.11 H100 row runs a micro-batch:
# 2 x 4,096 tokens, ep 8 (16 local experts), on one DGX H100
QWEN3_FP8_CS = {
    "model": {"preset": "qwen3-30b-a3b"},
    "workload": {
        "kind": "training",
        "micro_batch_size": 2,
        "global_batch_size": 64,
        "seq_length": 4096,
        "activation_dtype": "fp8",
        "fp8_recipe": "tensorwise",
    },
    "parallel": {"dp": 8, "ep": 8},
    "cluster": {"preset": "dgx-h100", "num_nodes": 1},
    "options": {"timeline": False, "overlap": {"overlap_moe_expert_parallel_comm": True}},
}


def ok(response) -> dict:
    assert response.status_code == 200, response.text
    return response.json()


def test_the_combined_1f1b_plan_is_the_pure_functions_pair(api):
    """48 MoE layers a micro-batch, 4 micro-batches a rank: the step's compute is 4 x (forward + backward + the pair's
    change of the host waits, 48 x (17.228 - 17.384) ms against the per-pass rule) + the optimizer step, the EP
    all-to-alls' slowdown absorbed by the host waits; each layer pair is host-bound at 451 launches x 38.2 us (TE's
    current scaling: four launches a quantized tensor, moe11; the dense linears' quantizes, moe11b: 434 before). The
    per-pass rule's 17.362 ms was 17.345 before sus12: its backward, partly the GPU's own time, has its GEMMs and
    attention at the H100's 0.825 (was 0.852); the host-bound pair does not move."""
    answer = ok(api.post("/v1/plan", json=QWEN3_FP8_CS))
    model, work, par, cluster, _ = plan_inputs(PlanRequest.model_validate(QWEN3_FP8_CS), Settings())
    ctx = Context(model, work, par)
    # the step is timed on the slowest of the plan's 8 GPUs (planner/spread.py paced_gpu; spread15/mend15f)
    gpu = paced_gpu(ctx, cluster.gpu)
    comp = stage_compute(ctx, 0, gpu)
    df, db = combined_pair_delta(ctx, 0, gpu)
    m = ctx.micro_batches
    assert m == 4 and ctx.moe_layers(0) == 48
    expected = m * (comp.forward.total_s + comp.backward.total_s + df.host_s + db.host_s) + comp.optimizer_s
    assert answer["step"]["compute_s"] == pytest.approx(expected, rel=1e-12)
    lk = layer_kernels(ctx, True, gpu)
    f, b = combined_pair(ctx, lk, EFFICIENCY)
    per_pass = layer_pass(ctx, lk, EFFICIENCY).total_s + layer_pass(ctx, lk, EFFICIENCY, backward=True).total_s
    assert df.host_s + db.host_s == pytest.approx(48 * (f.total_s + b.total_s - per_pass))
    # the per-pass rule 17.362 -> 17.384 ms on the paced part (spread15/mend15f: its backward, partly the GPU's own
    # time, runs at the slowest of 8 GPUs' clock, / 1.0211); the host-bound pair does not move
    assert (round((f.total_s + b.total_s) * 1e3, 3), round(per_pass * 1e3, 3)) == (17.228, 17.384)


def test_without_the_switch_the_layers_keep_the_per_pass_rule(api):
    body = copy.deepcopy(QWEN3_FP8_CS)
    body["options"]["overlap"] = {"overlap_moe_expert_parallel_comm": False}
    answer = ok(api.post("/v1/plan", json=body))
    combined = ok(api.post("/v1/plan", json=QWEN3_FP8_CS))
    model, work, par, cluster, _ = plan_inputs(PlanRequest.model_validate(body), Settings())
    ctx = Context(model, work, par)
    comp = stage_compute(ctx, 0, cluster.gpu)
    # the per-pass passes, plus what the EP all-to-alls' SMs slow beyond the forward's host wait (the backward
    # runs free): at least the passes, and the pair's plan below it
    assert answer["step"]["compute_s"] >= ctx.micro_batches * (comp.forward.total_s + comp.backward.total_s)
    assert combined["step"]["compute_s"] < answer["step"]["compute_s"]
