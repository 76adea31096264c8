"""Whole-plan benchmarks (issues 4, 9, 11): ledger, placement, pricing with contention, totals, step time and
memory; target p50 <= 10 ms for the Llama-3 405B / 16,384-GPU plan as a running service sees it (DESIGN.md §11).

The price cache is emptied before every round so each round prices every call. What depends only on the specs
stays warm as it does in the running service: clusters (``cluster_for``), schedules, per-(model, layout)
parameter lists, per-layout placements and their neighbourhoods on the cluster, per-stage compute. No plan,
ledger or response is cached. ``test_step_and_memory`` times the pure functions the layout search calls
(planner.step_time / planner.memory) on a priced plan; ``test_serialise`` the app's JSON answer
(app/serialize.py) of an already built plan.
"""

import json

import pytest

import planner.plan as plan_module
from app.serialize import plan_json
from collectives.topology import cluster_preset
from planner import Context, ParallelSpec, WorkloadSpec, build_plan, memory, model_preset, step_time

CASES = {
    # Llama 3 paper §3.3: 126 layers over 16 stages, one layer fewer on the first and the last
    "llama3-405b-16k-tp8-pp16-dp128": (
        "llama3-405b",
        2048,
        ParallelSpec(
            tp=8, pp=16, dp=128, zero_stage=1, sequence_parallel=True, first_stage_layers=7, last_stage_layers=7
        ),
        WorkloadSpec(micro_batch_size=1, global_batch_size=2048),
    ),
    # DeepSeek-V3 report §3.2: PP16, EP64 over 2,048 H800s (61 layers: 3 + 14 x 4 + 2)
    "deepseek-v3-2k-pp16-ep64": (
        "deepseek-v3",
        256,
        ParallelSpec(pp=16, dp=128, ep=64, zero_stage=1, first_stage_layers=3, last_stage_layers=2),
        WorkloadSpec(micro_batch_size=1, global_batch_size=15360),
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_plan(benchmark, case):
    model, nodes, par, work = CASES[case]
    spec, cluster = model_preset(model), cluster_preset("dgx-h100", nodes)
    build_plan(spec, work, par, cluster)  # warm the cluster and schedule caches

    def run():
        plan_module._PRICES.clear()
        return plan_json(build_plan(spec, work, par, cluster))

    result = json.loads(benchmark(run))
    assert result["world_size"] == nodes * 8
    assert result["step"]["time_s"] > 0 and result["memory"]["per_stage"]


@pytest.mark.parametrize("case", sorted(CASES))
def test_step_and_memory(benchmark, case):
    model, nodes, par, work = CASES[case]
    spec, cluster = model_preset(model), cluster_preset("dgx-h100", nodes)
    plan = build_plan(spec, work, par, cluster)
    ctx = Context(spec, work, par)

    def run():
        return step_time(ctx, plan.calls, cluster.gpu, with_timeline=False), memory(ctx, cluster.gpu, plan.calls)

    step, mem = benchmark(run)
    assert step.time_s == plan.step.time_s and mem.fits == plan.memory.fits


@pytest.mark.parametrize("case", sorted(CASES))
def test_serialise(benchmark, case):
    model, nodes, par, work = CASES[case]
    plan = build_plan(model_preset(model), work, par, cluster_preset("dgx-h100", nodes))
    body = json.loads(benchmark(plan_json, plan))
    assert body["world_size"] == plan.world_size and len(body["calls"]) == len(plan.calls)
    assert body["totals"]["time_s"] == plan.totals.time_s and body["step"]["time_s"] == plan.step.time_s
