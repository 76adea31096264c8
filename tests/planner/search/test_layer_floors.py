"""The search's cheapest compute bound (StepModel.layer_floors, compute.stage_layers_s: m times the slowest stage's
decoder layers alone plus the slowest optimizer step), asked before the memory screen once a k-th best is known
(docs/search.md, speed11): it must never be above the busiest-rank bound (hence the step time), and a search that
asks it must answer the same layouts, counting the layouts it skips as ``bounded_before_memory``."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest

from collectives.topology import cluster_preset
from planner import MODEL_PRESETS, WorkloadSpec, build_plan
from planner.compute import stage_layers_s, stage_pass_compute
from planner.context import Context
from planner.search import Constraints, Problem, search
from planner.search.evaluate import ShapeEvaluator, batch_rule
from planner.search.space import MEMORY, Shape
from planner.search.step_model import StepModel

RECOMPUTES = ("none", "selective", "full")
# (model, workload, cluster, shape (tp, cp, pp, dp), constraints): dense with uneven end stages and interleaving
# (Llama 3 8B, 32 layers), an MoE model (Mixtral), an MTP model with a shorter first stage (DeepSeek-V3, 61 layers:
# 13 + 3 x 16 on pp 4)
CASES = [
    ("llama3-8b", WorkloadSpec(global_batch_size=64), ("dgx-h100", 4), Shape(2, 1, 4, 4), {}),
    ("llama3-8b", WorkloadSpec(global_batch_size=64), ("dgx-h100", 4), Shape(4, 2, 2, 2), {}),
    ("mixtral-8x7b", WorkloadSpec(global_batch_size=64), ("dgx-h100", 4), Shape(2, 1, 2, 8, 8), {}),
    (
        "deepseek-v3",
        WorkloadSpec(global_batch_size=256),
        ("dgx-h100", 64),
        Shape(4, 1, 4, 32, 32),
        {"first_stage_layers": [13]},
    ),
]


def _grid(ev: ShapeEvaluator, index: int):
    variant = ev.variants[index]
    if ev.space.check(variant, 1) is not None:
        return ()
    bs = [b for b in ev.space.micro_batches(ev.shape.dp) if batch_rule(ev.space, variant, b) is None]
    return tuple((b, rc) for b, rc in itertools.product(bs[:3], RECOMPUTES))


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[3]}")
def test_floor_is_below_the_busiest_bound_and_the_step_time(case):
    """layer_floors <= busiest_bounds <= lower_bounds on every valid variant, b and recompute of the shape, and
    <= build_plan's step time on a sample; the floor is positive and within 25 % of the busiest bound somewhere
    (it bounds something)."""
    name, work, (preset, nodes), shape, allowed = case
    model = MODEL_PRESETS[name]
    cluster = cluster_preset(preset, nodes)
    ev = ShapeEvaluator(Problem(model, work, cluster, Constraints.of(allowed)), shape)
    sm = ev.step_model
    checked = planned = tight = 0
    for index in range(len(ev.variants)):
        grid = _grid(ev, index)
        if not grid:
            continue
        par = ev.parallel(index)
        floors, busiest = sm.layer_floors(par, grid), sm.busiest_bounds(par, grid)
        lower = sm.lower_bounds(par, grid)
        assert np.all(floors <= busiest) and np.all(busiest <= lower * (1 + 1e-12))
        assert np.all(floors > 0) or sm._variant(par).paired
        tight += int(np.any(floors > 0.75 * busiest))
        checked += len(grid)
        if index % 7 == 0:  # build_plan on a sample (it takes ~0.1 s a layout)
            b, rc = grid[index % len(grid)]
            plan = build_plan(model, replace(work, micro_batch_size=b, activation_recompute=rc), par, cluster)
            assert floors[grid.index((b, rc))] <= plan.step.time_s
            planned += 1
    assert checked >= 30 and planned >= 2 and tight >= 1


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[3]}")
def test_stage_layers_are_within_the_stage_pass(case):
    """compute.stage_layers_s of every stage <= stage_pass_compute's forward + backward (the terms it leaves out are
    non-negative), with MTP blocks (DeepSeek-V3's last stage) and the uneven end stages; and it is the whole pass's
    layers: above half of it on a stage of several layers."""
    name, work, (preset, nodes), shape, allowed = case
    model, cluster = MODEL_PRESETS[name], cluster_preset(preset, nodes)
    ev = ShapeEvaluator(Problem(model, work, cluster, Constraints.of(allowed)), shape)
    gpu = cluster.gpu
    for index in range(0, len(ev.variants), 5):
        for b, rc in _grid(ev, index)[:3]:
            ctx = Context(model, replace(work, micro_batch_size=b, activation_recompute=rc), ev.parallel(index))
            for s in range(ctx.par.pp):
                fwd, bwd, _ = stage_pass_compute(ctx, s, gpu)
                layers = stage_layers_s(ctx, s, gpu)
                assert 0.5 * (fwd.total_s + bwd.total_s) < layers <= (fwd.total_s + bwd.total_s) * (1 + 1e-12)


def _problem(constraints: dict) -> Problem:
    return Problem(
        MODEL_PRESETS["llama3-8b"], WorkloadSpec(global_batch_size=64), cluster_preset("dgx-h100", 4),
        Constraints.of(constraints, memory_headroom=0.05), 5,
    )  # fmt: skip


def test_a_search_with_the_floor_answers_as_one_without(monkeypatch):
    """The same results, to the bit, with and without the floor screen; every layout accounted for (evaluated =
    feasible + memory + bounded_before_memory) and some skipped before their memory."""
    problem = _problem({"tp": [1, 2], "framework": "megatron"})
    with_floor = search(problem, workers=1)
    # the screen asks floors_within (layer_floors <= threshold): without the floor every pair is within it
    monkeypatch.setattr(StepModel, "floors_within", lambda self, par, grid, threshold: [True] * len(grid))
    without = search(problem, workers=1)
    a, b = with_floor.outcome, without.outcome
    assert [(r.layout, r.time_s) for r in with_floor.results] == [(r.layout, r.time_s) for r in without.results]
    assert len(with_floor.results) == 5
    assert b.bounded_before_memory == 0 < a.bounded_before_memory
    assert a.evaluated == b.evaluated
    for out in (a, b):
        assert out.evaluated == out.feasible + out.pruned.counts.get(MEMORY, 0) + out.bounded_before_memory
    assert a.feasible + a.pruned.counts.get(MEMORY, 0) < b.feasible + b.pruned.counts.get(MEMORY, 0)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[3]}")
def test_floors_within_answers_as_the_floors_and_skips_the_optimizer_step_below_them(case):
    """StepModel.floors_within (speed11b) == layer_floors <= threshold at thresholds on, between and around the
    floors of every valid variant; below every pair's layers it answers all False without computing the layout's
    optimizer steps and pass keys (_keys), which a fresh evaluator shows: its _Variant keeps compute_id None."""
    name, work, (preset, nodes), shape, allowed = case
    problem = Problem(MODEL_PRESETS[name], work, cluster_preset(preset, nodes), Constraints.of(allowed))
    ev, fresh = ShapeEvaluator(problem, shape), ShapeEvaluator(problem, shape)
    compared = skipped = 0
    for index in range(len(ev.variants)):
        grid = _grid(ev, index)
        if not grid:
            continue
        par = ev.parallel(index)
        floors = ev.step_model.layer_floors(par, grid)
        cuts = sorted({*floors.tolist(), 0.0})
        cuts += [c * (1 - 1e-12) for c in cuts] + [c * (1 + 1e-12) for c in cuts] + [np.inf]
        for cut in cuts:
            assert ev.step_model.floors_within(par, grid, cut) == (floors <= cut).tolist()
            compared += 1
        if floors.min() > 0:
            v = fresh.step_model._variant(fresh.parallel(index))
            below = float(fresh.step_model._layers_floor(v, grid).min()) / 2  # under every pair's layers alone
            assert fresh.step_model.floors_within(fresh.parallel(index), grid, below) == [False] * len(grid)
            assert fresh.step_model._variant(fresh.parallel(index)).compute_id is None
            skipped += 1
    assert compared >= 30 and (skipped >= 1 or name == "mixtral-8x7b")
