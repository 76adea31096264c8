"""The search's shared memos give exactly what they stand for (docs/search.md, How it is fast): the
data-parallel template shared by the cp values of a (tp, pp), per-stage compute and activations shared
across shapes, curves shared across shapes and arrays, and the screen's evaluator reused for timing."""

from __future__ import annotations

import pickle
from dataclasses import replace

import pytest

from collectives import Op
from collectives.topology import cluster_for, cluster_preset
from planner import MODEL_PRESETS, ParallelSpec, WorkloadSpec
from planner.compute import stage_compute
from planner.context import Context
from planner.layout import Group, RankLayout
from planner.memory import stage_activation_bytes
from planner.plan import Options
from planner.rules.data import calls as data_calls
from planner.search import Constraints, Problem, Pruned, templates
from planner.search.evaluate import data_template, screen_shapes, space_of, time_shapes
from planner.search.prices import Pricer, shared_curves
from planner.search.step_model import StepModel
from planner.step import schedule_of

DEVICES = 256


def _fields(call) -> tuple:
    """What the search reads of a template's call (step_model.RowCall) and where it is placed (group)."""
    return (call.name, call.parallelism, call.op, call.phase, tuple(call.stages), call.group)


@pytest.mark.parametrize("preset", ["llama3-70b", "mixtral-8x7b"])
@pytest.mark.parametrize("framework", ["megatron", "torch", "deepspeed"])
def test_data_template_shared_by_every_cp_equals_its_own(preset, framework):
    """The data-parallel rule reads cp and dp only as cp x dp: the template built on the first cp serves
    every cp of the (tp, pp), call for call and byte for byte as built on the shape's own layout."""
    model = MODEL_PRESETS[preset]
    work = WorkloadSpec(global_batch_size=1024)
    tp, pp = 2, 4
    ep = 2 if model.moe else 1
    checked = 0
    for zero in (0, 1, 2, 3):
        first = None
        for cp in (1, 2, 4, 8):
            par = ParallelSpec(
                tp=tp, cp=cp, pp=pp, dp=DEVICES // (tp * pp * cp), ep=ep, zero_stage=zero, framework=framework
            )
            shared = data_template(model, work, par)
            first = shared if first is None else first
            assert shared is first  # one template for the four shapes
            try:
                own = templates.build(templates.DATA_RULES, model, work, par)
            except templates.NotLinear:
                own = None
            if own is None:
                assert shared is None
                continue
            assert [_fields(c) for c in shared.calls] == [_fields(c) for c in own.calls]
            for name in ("bytes1", "count1", "per_b", "per_m"):
                assert getattr(shared, name).tolist() == getattr(own, name).tolist()
            assert shared.calls, "a data-parallel template with no call would test nothing"
            checked += 1
    assert checked >= 8


def test_data_rule_reads_cp_and_dp_only_as_their_product():
    """The premise of the shared template, on the rule itself (the ledger the plan builds), at the same
    micro-batch count (a template fixes it: templates.py builds at global batch b x m x dp)."""
    model = MODEL_PRESETS["llama3-70b"]
    for framework, zero in (("megatron", 1), ("torch", 3), ("deepspeed", 3), ("deepspeed", 2)):
        ledgers = []
        for cp in (1, 4):
            par = ParallelSpec(tp=4, cp=cp, pp=2, dp=32 // cp, zero_stage=zero, framework=framework)
            work = WorkloadSpec(global_batch_size=16 * par.dp, micro_batch_size=1)
            ledgers.append(
                [(*_fields(c), c.message_bytes, c.calls_per_iteration) for c in data_calls(Context(model, work, par))]
            )
        assert ledgers[0] == ledgers[1]
        assert ledgers[0]


def test_stage_parts_shared_across_shapes_equal_compute_and_memory():
    """Per-stage compute and activations memoised across shapes (different pp, dp, uneven ends, schedules)
    equal compute.stage_compute and memory.stage_activation_bytes bit for bit."""
    model = MODEL_PRESETS["llama3-405b"]
    cluster = cluster_for(cluster_preset("dgx-h100", 32))
    work = WorkloadSpec(global_batch_size=512)
    layouts = [
        ParallelSpec(tp=8, cp=2, pp=2, dp=8, sequence_parallel=True),
        ParallelSpec(tp=8, cp=2, pp=16, dp=1, sequence_parallel=True, first_stage_layers=7, last_stage_layers=7),
        ParallelSpec(tp=8, cp=1, pp=2, dp=16, virtual_pipeline_stages=3, pipeline_schedule="interleaved"),
        ParallelSpec(tp=4, cp=2, pp=4, dp=8, zero_stage=1, framework="torch"),
    ]
    for par in layouts:
        sm = StepModel(model, work, cluster)  # a fresh model per shape, as the search builds them
        for b, rc in ((1, "none"), (2, "selective"), (1, "full")):
            ctx = Context(model, replace(work, micro_batch_size=b, activation_recompute=rc), par)
            exact = [stage_compute(ctx, s, cluster.spec.gpu) for s in range(par.pp)]
            assert sm._stage_compute(par, b, rc) == exact
            sched = schedule_of(ctx)
            acts = [stage_activation_bytes(ctx, s, sched) for s in range(par.pp)]
            assert sm._activation_bytes(par, b, rc).tolist() == acts


def test_curves_shared_by_array_and_across_shapes():
    """A curve is found by the placement array's identity and by its reduced placement across pricers;
    both are the curve the reduction gives, pricing alike."""
    cluster = cluster_for(cluster_preset("dgx-h100", 16))
    options = Options()
    curves = shared_curves(cluster, options)
    one = RankLayout(ParallelSpec(tp=8, cp=2, pp=2, dp=4))
    two = RankLayout(ParallelSpec(tp=8, cp=1, pp=2, dp=8))  # its cp x dp groups sit where the first's do
    group = Group(("cp", "dp"))
    a, b = Pricer(cluster, options, curves), Pricer(cluster, options, curves)
    placement = one.placement(group, (0,))
    curve = a.curve(Op.ALLREDUCE, placement)
    assert a.curve(Op.ALLREDUCE, placement) is curve
    fresh = Pricer(cluster, options)._reduced_curve(Op.ALLREDUCE, placement)
    for size in (4096, 3 << 20, 1 << 30):
        assert curve.time(size) == fresh.time(size)
    assert b.curve(Op.ALLREDUCE, two.placement(group, (0,))) is curve


def test_screen_then_time_in_process_equals_a_fresh_evaluator():
    """Timing a shape with the evaluator that screened it (its memos) gives what a fresh one gives (the
    Screened sent to another process carries no evaluator)."""
    model = replace(MODEL_PRESETS["llama3-8b"], num_layers=8)
    allowed = {"framework": ["megatron", "deepspeed"], "activation_recompute": ["none", "full"]}
    problem = Problem(model, WorkloadSpec(global_batch_size=64), cluster_preset("dgx-h100", 2), Constraints.of(allowed))
    shapes = list(space_of(problem).shapes(Pruned()))
    out, screened = screen_shapes(problem, shapes)
    sent = pickle.loads(pickle.dumps(screened))
    assert all(s.evaluator is not None for s in screened) and all(s.evaluator is None for s in sent)
    here, there = time_shapes(problem, screened), time_shapes(problem, sent)
    assert (here.evaluated, here.feasible, here.bounded) == (there.evaluated, there.feasible, there.bounded)
    assert [(t, layout) for t, _, layout in here.best] == [(t, layout) for t, _, layout in there.best]
    assert here.best and out.feasible > here.bounded
