"""The search's options beyond tp/cp/pp/dp (issue 21): pipeline schedules (zb-h1, zbv, dualpipe(v)), uneven
first/last stages with virtual stages, Megatron's recompute method and layers, and the MoE token dispatcher.
Each is enumerated by planner/search/space.py and evaluated by the planner's own functions: the screen
gives build_plan's step time and memory peaks on every new option."""

from __future__ import annotations

from dataclasses import replace

import pytest

from collectives.topology import cluster_preset
from planner import MODEL_PRESETS, SpecError, WorkloadSpec, build_plan
from planner.memory import comm_buffers
from planner.search import Constraints, Problem
from planner.search.evaluate import ShapeEvaluator
from planner.search.space import Recompute, Shape, Space, Variant, recompute_fields

SCHEDULES = ["1f1b", "interleaved", "zb-h1", "zbv", "dualpipe", "dualpipev"]


def model_of(layers: int, preset: str = "llama3-8b"):
    return replace(MODEL_PRESETS[preset], seq_length=2048, num_layers=layers)


def space(layers: int, devices: int = 8, preset: str = "llama3-8b", **allowed) -> Space:
    uneven = allowed.pop("uneven_stages", False)
    return Space(
        model_of(layers, preset),
        WorkloadSpec(global_batch_size=64),
        devices,
        Constraints.of(allowed, uneven_stages=uneven),
    )


def test_default_space_is_unchanged():
    """Without the new constraints the space is today's: 1f1b and interleaved (v with pp·v dividing the
    layers), the Llama 3 uneven form at v = 1 only, one dispatcher, three recompute strings."""
    s = space(20)
    assert s.pipelines(4) == [(1, "1f1b"), (5, "interleaved")]
    assert s.end_layers(4, 1) is None and s.end_layers(4, 2) is None
    assert space(126).end_layers(16, 1) == 7  # 7 + 14 x 8 + 7 (Llama 3 405B)
    assert s.recomputes == ["none", "selective", "full"] and s.dispatches == ["alltoall"]


def test_schedules_get_their_virtual_stages():
    """zb-h1 runs one chunk per rank, the V schedules two (zbv, dualpipe, dualpipev: parallel.py
    V_SCHEDULES); interleaved with uneven_stages adds v = 2 at 20 layers on 4 stages: 4 + 6 + 6 + 4, each
    stage's layers divisible by its 2 chunks (Megatron get_transformer_layer_offset)."""
    s = space(20, pipeline_schedule=SCHEDULES, uneven_stages=True)
    assert s.pipelines(4) == [
        (1, "1f1b"), (1, "zb-h1"), (2, "dualpipe"), (2, "dualpipev"), (2, "interleaved"), (2, "zbv"),
        (5, "interleaved"),
    ]  # fmt: skip
    assert s.end_layers(4, 2) == 4 and s.end_layers(4, 5) is None
    # 126 layers on 8 stages, 2 chunks per rank: middle stages 16, ends (126 - 6·16) / 2 = 15, not even:
    # middle 18 leaves 9, odd; none splits with the first and last stage smaller, so none is listed
    assert space(126, uneven_stages=True).end_layers(8, 2) is None
    assert space(60, uneven_stages=True).end_layers(8, 2) == 6  # 6 + 6 x 8 + 6 (60 does not split over 16 chunks)


def test_recompute_choices():
    s = space(
        20, recompute_method=["uniform", "block"], recompute_num_layers=[1, 3], activation_recompute=["none", "full"]
    )
    assert s.recomputes == ["none"] + [Recompute("full", m, n) for m in ("block", "uniform") for n in (1, 3)]
    assert recompute_fields("none") == {
        "activation_recompute": "none",
        "recompute_method": None,
        "recompute_num_layers": None,
    }
    assert recompute_fields("full") == {"activation_recompute": "full"}  # the workload's own method stays
    with pytest.raises(SpecError, match="recompute_num_layers 21 > num_layers 20"):
        space(20, recompute_num_layers=21)
    with pytest.raises(SpecError, match="'deepep_ll' is not one of"):
        space(20, ep_dispatch="deepep_ll")


def screen_vs_plan(model, cluster, work, shape, cases):
    """Each (variant, b, recompute choice): the screen's step time and memory peaks against build_plan on the
    same layout (prices interpolated between grid points: rounding only). Also test_search_layouts3.py's."""
    ev = ShapeEvaluator(Problem(model, work, cluster), shape)
    for variant, b, rc in cases:
        assert ev.space.check(variant, b) is None, (variant, b)
        par = variant.parallel()
        parts = ev.calls(variant, b, rc)
        rows = [r for part in parts for r in part.rows]
        screen = ev.step_model.step_time(par, b, rc, parts)
        plan = build_plan(model, replace(work, micro_batch_size=b, **recompute_fields(rc)), par, cluster)
        assert screen == pytest.approx(plan.step.time_s, rel=1e-6), (variant, b, rc)
        assert ev.step_model.lower_bound(par, b, rc) <= plan.step.time_s * (1 + 1e-12)
        peaks = ev.step_model._static_bytes(par) + ev.step_model._activation_bytes(par, b, rc)
        for stage, size in comm_buffers(rows).items():
            peaks[stage] += size
        assert peaks.tolist() == [s.peak_bytes for s in plan.memory.per_stage], (variant, b, rc)


def _screen_vs_plan(model, cluster, work, shape, cases):
    """screen_vs_plan with each variant given by its (virtual stages, schedule, end stages, dispatch)."""
    variants = [
        (Variant(shape, v, schedule, 1, shape.tp > 1, "megatron", ends, dispatch), b, rc)
        for (v, schedule, ends, dispatch), b, rc in cases
    ]
    screen_vs_plan(model, cluster, work, shape, variants)


BLOCK2, UNIFORM2 = Recompute("full", "block", 2), Recompute("full", "uniform", 2)


def test_screen_equals_build_plan_on_the_new_schedules_and_recompute():
    """20 layers on tp 2 x pp 4 (one DGX H100), 16 micro-batches: zb-h1, zbv, dualpipe, dualpipev (two
    chunks per rank; 20 layers over 8 chunks only as 4 + 6 + 6 + 4) and interleaved 4 + 6 + 6 + 4, under
    no recompute, selective, and full with block 2 / uniform 2."""
    work = WorkloadSpec(global_batch_size=16)
    cases = [
        ((1, "zb-h1", None, "alltoall"), 1, "none"),
        ((1, "zb-h1", None, "alltoall"), 1, BLOCK2),
        ((2, "zbv", 4, "alltoall"), 1, UNIFORM2),
        ((2, "dualpipev", 4, "alltoall"), 1, "selective"),
        ((2, "dualpipe", 4, "alltoall"), 1, BLOCK2),
        ((2, "interleaved", 4, "alltoall"), 1, "none"),
        ((2, "interleaved", 4, "alltoall"), 1, BLOCK2),
        ((1, "1f1b", None, "alltoall"), 1, BLOCK2),
    ]
    _screen_vs_plan(model_of(20), cluster_preset("dgx-h100", 1), work, Shape(2, 1, 4, 1), cases)


def test_screen_equals_build_plan_on_the_token_dispatchers():
    """Mixtral 8x7B cut to 4 layers, ep 8 on 16 H100 (pp 2): Megatron's alltoall and allgather dispatchers
    and DeepEP (its NVLink and RDMA legs split by node: rules/deepep.py)."""
    model = replace(MODEL_PRESETS["mixtral-8x7b"], seq_length=2048, num_layers=4)
    work = WorkloadSpec(global_batch_size=16)
    cases = [((1, "1f1b", None, d), 1, rc) for d in ("alltoall", "allgather", "deepep") for rc in ("none", BLOCK2)]
    _screen_vs_plan(model, cluster_preset("dgx-h100", 2), work, Shape(1, 1, 2, 8, 8, 1), cases)
