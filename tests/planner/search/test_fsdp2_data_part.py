"""FSDP2 inside a pipeline (torch ZeRO-2/3 with pp > 1): its data-parallel calls are not linear in the micro-batch
count m (the gathers follow the schedule's warm-up), so the linear template refuses; the search then prices the
rule's own ledger at each m (templates.at_count, shared by the shapes of one cp x dp) beside the activation
template, instead of the whole exact ledger per layout, and bounds those layouts with it (docs/search.md, ninth
round speed10)."""

from __future__ import annotations

import itertools
from dataclasses import replace

from collectives.topology import cluster_preset
from planner import MODEL_PRESETS, ParallelSpec, WorkloadSpec, build_plan
from planner.context import Context
from planner.ledger import merge_stages
from planner.rules import data
from planner.search import Problem, templates
from planner.search.evaluate import ShapeEvaluator, batch_rule
from planner.search.space import Shape

MODEL = MODEL_PRESETS["llama3-8b"]
CLUSTER = cluster_preset("dgx-h100", 4)  # 32 GPUs
WORK = WorkloadSpec(global_batch_size=64)


def _key(call) -> tuple:
    return (
        call.name,
        call.op,
        call.phase,
        tuple(call.stages),
        call.group,
        call.message_bytes,
        call.calls_per_iteration,
    )


def _fsdp2_pipelined(ev: ShapeEvaluator):
    for index, variant in enumerate(ev.variants):
        par = ev.parallel(index)
        if ev.space.check(variant, 1) is None and data.fsdp2_pipelined(Context(MODEL, WORK, par)):
            yield index, variant, par


def test_the_data_part_at_m_is_the_rules_own_ledger_at_every_b():
    """The priced data part of an FSDP2-in-a-pipeline layout holds the data-parallel rule's calls of that layout
    (built on the layout's own context at its b), call for call, at every micro-batch size; the linear template
    still refuses (so without m the template is None, as before)."""
    ev = ShapeEvaluator(Problem(MODEL, WORK, CLUSTER), Shape(2, 1, 4, 4))
    checked = 0
    for index, variant, par in _fsdp2_pipelined(ev):
        assert ev.template(templates.DATA_RULES, variant, "none") is None
        for b in (1, 2, 4):
            if batch_rule(ev.space, variant, b) is not None:
                continue
            m = WORK.global_batch_size // (b * par.dp)
            own = merge_stages(data.calls(Context(MODEL, replace(WORK, micro_batch_size=b), par)))
            part = ev._data_part(index, b)
            assert _rows_equal(part.rows, own) and part.rows
            assert ev.template(templates.DATA_RULES, variant, "none", m).calls == own
            checked += 1
    assert checked >= 6


def _rows_equal(rows, calls) -> bool:
    """Rows split a call by stage class (placements differ): the same calls with the same counts and bytes."""
    got = sorted((r.call.name, r.call.phase, s, r.call.message_bytes, r.call.calls_per_iteration)
                 for r in rows for s in r.call.stages)  # fmt: skip
    want = sorted((c.name, c.phase, s, c.message_bytes, c.calls_per_iteration) for c in calls for s in c.stages)
    return got == want


def test_shapes_of_one_cp_x_dp_share_the_ledger_at_m():
    """(cp 1, dp 4) at b = 2 and (cp 2, dp 2) at b = 4 both run m = 8: one ledger, equal to each layout's own."""
    first = ShapeEvaluator(Problem(MODEL, WORK, CLUSTER), Shape(2, 1, 4, 4))
    second = ShapeEvaluator(Problem(MODEL, WORK, CLUSTER), Shape(2, 2, 4, 2))
    shared = 0
    for (_, va, pa), (_, vb, pb) in zip(_fsdp2_pipelined(first), _fsdp2_pipelined(second), strict=True):
        a = first.template(templates.DATA_RULES, va, "none", 8)
        b = second.template(templates.DATA_RULES, vb, "none", 8)
        assert a is b
        for par, mb in ((pa, 2), (pb, 4)):
            own = merge_stages(data.calls(Context(MODEL, replace(WORK, micro_batch_size=mb), par)))
            assert [_key(c) for c in a.calls] == [_key(c) for c in own]
        shared += 1
    assert shared >= 2


def test_bounds_hold_and_the_screen_equals_build_plan():
    """With the data part priced, FSDP2-in-a-pipeline layouts get the data-parallel bounds: compute bound <=
    compute bound + data floor <= refined bound <= the screen's step time, which equals build_plan's to 1e-6;
    and the refined bound is above the compute bound somewhere (it bounds something)."""
    ev = ShapeEvaluator(Problem(MODEL, WORK, CLUSTER), Shape(2, 1, 4, 4))
    sm = ev.step_model
    checked = tighter = 0
    for index, variant, par in _fsdp2_pipelined(ev):
        for b, rc in itertools.product((1, 2, 4), ("none", "selective", "full")):
            if batch_rule(ev.space, variant, b) is not None:
                continue
            low = sm.lower_bound(par, b, rc)
            floor = low + ev.data_floor(index, b)
            bound = ev.refined_bound(index, b, rc)
            step = sm.step_time(par, b, rc, ev.calls(variant, b, rc))
            assert low <= floor <= bound * (1 + 1e-12) <= step * (1 + 1e-9)
            plan = build_plan(MODEL, replace(WORK, micro_batch_size=b, activation_recompute=rc), par, CLUSTER)
            assert abs(step - plan.step.time_s) <= 1e-6 * plan.step.time_s
            tighter += bound > low * (1 + 1e-9)
            checked += 1
    assert checked >= 12 and tighter >= 1


def test_fsdp2_pipelined_layouts_exist_in_the_shape():
    """The cases above are not empty: torch ZeRO-2 and ZeRO-3 with pp 4."""
    ev = ShapeEvaluator(Problem(MODEL, WORK, CLUSTER), Shape(2, 1, 4, 4))
    zeros = {par.zero_stage for _, _, par in _fsdp2_pipelined(ev)}
    assert zeros == {2, 3}
    assert all(par.framework == "torch" and isinstance(par, ParallelSpec) for _, _, par in _fsdp2_pipelined(ev))


def test_torch_sp_under_fsdp2_screens_as_build_plan():
    """The tensor rule reads the ZeRO stage (FSDP2's post-backward reduces the SP norm gradients per micro-batch:
    rules/tensor.py zero_read), so the activation template is built at ``templates.activation_zero``, not at 0:
    every torch SP layout at ZeRO-0..3, pp 1 and 4, screens to build_plan's step time (the template at ZeRO-0
    read the optimizer's three reads per weight instead: up to 0.1% off)."""
    checked = 0
    for shape in (Shape(2, 1, 1, 16), Shape(2, 1, 4, 4)):
        ev = ShapeEvaluator(Problem(MODEL, WORK, CLUSTER), shape)
        for index, variant in enumerate(ev.variants):
            par = ev.parallel(index)
            if ev.space.check(variant, 1) is not None or par.framework != "torch" or not par.sequence_parallel:
                continue
            if par.virtual_pipeline_stages > 2:
                continue
            for b in (1, 2):
                step = ev.step_model.step_time(par, b, "none", ev.calls(variant, b, "none"))
                plan = build_plan(MODEL, replace(WORK, micro_batch_size=b), par, CLUSTER).step.time_s
                assert abs(step - plan) <= 1e-9 * plan
                checked += 1
    assert checked >= 24
    torch_sp = [ParallelSpec(tp=2, dp=16, zero_stage=z, sequence_parallel=True, framework="torch") for z in range(4)]
    assert [templates.activation_zero(p) for p in torch_sp] == [0, 0, 2, 2]
    megatron = [ParallelSpec(tp=2, dp=16, zero_stage=z, sequence_parallel=True) for z in range(4)]
    no_sp = [ParallelSpec(tp=2, dp=16, zero_stage=z, framework="torch") for z in range(4)]
    assert [templates.activation_zero(p) for p in megatron + no_sp] == [0] * 8  # one template for every ZeRO stage
