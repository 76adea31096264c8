"""Search: enumeration completeness against brute force through build_plan (the /v1/plan code), templates
equal to the ledger, published layouts found or beaten, counts that add up."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from collectives.topology import cluster_preset
from planner import MODEL_PRESETS, ParallelSpec, SpecError, WorkloadSpec, build_plan, flavours
from planner.context import Context
from planner.memory import comm_buffers
from planner.rules import ledger
from planner.search import Constraints, Problem, search, templates
from planner.search.engine import fits, step_time

SMALL = dict(framework=("megatron",), zero_stage=(0, 1), activation_recompute=("none", "full"))


def brute_force(model, work, cluster, allowed):
    """Every layout /v1/plan accepts, planned one by one: (step time, layout key) of those that fit."""
    devices = cluster.num_nodes * cluster.devices_per_node
    out = []
    for tp, cp, pp in itertools.product((1, 2, 4, 8), repeat=3):
        if devices % (tp * cp * pp):
            continue
        dp = devices // (tp * cp * pp)
        pipes = [(1, "1f1b")] + [(v, "interleaved") for v in (2, 4, 8, 16, 32) if pp > 1]
        for (v, sched), sp, zero, b, rc in itertools.product(
            pipes,
            (False, True) if tp > 1 else (False,),
            allowed["zero_stage"],
            (1, 2, 4, 8, 16),
            allowed["activation_recompute"],
        ):
            par = ParallelSpec(
                tp=tp,
                pp=pp,
                dp=dp,
                cp=cp,
                zero_stage=zero,
                sequence_parallel=sp,
                virtual_pipeline_stages=v,
                pipeline_schedule=sched,
            )
            w = replace(work, micro_batch_size=b, activation_recompute=rc)
            try:
                plan = build_plan(model, w, par, cluster)
            except SpecError:
                continue
            if fits(plan, 0.0):
                out.append((step_time(plan), (tp, cp, pp, v, sched, sp, zero, b, rc)))
    return sorted(out)


def key(r):
    p = r.layout.parallel
    return (
        p.tp,
        p.cp,
        p.pp,
        p.virtual_pipeline_stages,
        p.pipeline_schedule,
        p.sequence_parallel,
        p.zero_stage,
        r.layout.micro_batch_size,
        r.layout.activation_recompute,
    )


@pytest.mark.slow
def test_search_equals_brute_force_through_plan():
    model = replace(MODEL_PRESETS["llama3-8b"], seq_length=2048, num_layers=8)
    work = WorkloadSpec(global_batch_size=16)
    cluster = cluster_preset("dgx-h100", 1)
    expected = brute_force(model, work, cluster, SMALL)
    assert expected, "the brute force found no feasible layout"
    result = search(Problem(model, work, cluster, Constraints.of(SMALL), top_k=10), workers=1)
    assert result.outcome.feasible == len(expected)
    got = [(r.time_s, key(r)) for r in result.results]
    assert [t for t, _ in got] == pytest.approx([t for t, _ in expected[:10]], rel=1e-12)
    assert got[0][1] == expected[0][1] or got[0][0] == pytest.approx(expected[0][0], rel=1e-12)
    # the screen agrees with the plan to rounding: the top-k is the plan's own ranking
    out = result.outcome
    assert result.space_size == out.evaluated + out.pruned.total - out.pruned.counts.get("memory", 0)


@pytest.mark.parametrize(
    "preset, par, rc",
    [
        ("gpt3-175b", ParallelSpec(tp=8, pp=8, dp=16, zero_stage=1, sequence_parallel=True), "full"),
        # FSDP2 without a pipeline (inside one its gathers follow the warm-up: templates refuse it, see
        # tests/planner/test_framework_switches.py)
        ("llama3-70b", ParallelSpec(tp=4, pp=1, dp=2, cp=2, zero_stage=3, framework="torch"), "selective"),
        ("mixtral-8x7b", ParallelSpec(tp=2, pp=2, dp=8, ep=8, sequence_parallel=True, zero_stage=2), "none"),
        (
            "llama3-8b",
            ParallelSpec(
                tp=2,
                pp=4,
                dp=4,
                virtual_pipeline_stages=2,
                pipeline_schedule="interleaved",
                framework="deepspeed",
                zero_stage=1,
            ),
            "full",
        ),
    ],
)
def test_templates_equal_the_ledger(preset, par, rc):
    model = MODEL_PRESETS[preset]
    for b in (1, 2, 4):
        work = WorkloadSpec(micro_batch_size=b, global_batch_size=b * par.dp * 8, activation_recompute=rc)
        m = 8
        act = templates.build(templates.ACTIVATION_RULES, model, work, replace(par, zero_stage=0))
        data = templates.build(
            templates.DATA_RULES,
            model,
            replace(work, activation_recompute="none"),
            replace(par, sequence_parallel=False),
        )
        built = []
        for tpl in (act, data):
            for call, msg, cnt in zip(tpl.calls, tpl.messages(b).tolist(), tpl.counts(m).tolist(), strict=True):
                built.append((call.name, call.stages, call.op, msg, cnt))
        exact = [
            (c.name, c.stages, c.op, c.message_bytes, c.calls_per_iteration) for c in ledger(Context(model, work, par))
        ]
        assert sorted(built, key=str) == sorted(exact, key=str)


def test_empty_space_after_constraints_is_refused_with_the_product_rule():
    """A tp that divides no device count leaves no layout to walk (counts12: the world_size rule refuses them up
    front, outside the space): the search is refused with the rule and the numbers, not answered empty."""
    model = MODEL_PRESETS["gpt3-175b"]
    problem = Problem(
        model,
        WorkloadSpec(global_batch_size=1536),
        cluster_preset("dgx-a100", 128),
        Constraints.of({"tp": 3, "framework": "megatron"}),
    )
    with pytest.raises(SpecError) as err:
        search(problem, workers=1)
    assert err.value.field == "constraints"
    assert "tp [3], cp [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]" in err.value.rule
    assert "(tp*cp*pp is at least 3, which must divide the devices)" in err.value.rule


def test_space_over_the_limit_is_refused_with_size_and_limit():
    """GPT-3 175B on 1,024 A100: 945,528 runnable layouts, 1,334,124 before DeepSpeed's rules beside pp refuse
    388,596 (the 1f1b schedule only, ZeRO <= 1: planner/flavours/deepspeed.py)."""
    problem = Problem(MODEL_PRESETS["gpt3-175b"], WorkloadSpec(global_batch_size=1536), cluster_preset("dgx-a100", 128))
    with pytest.raises(SpecError) as err:
        search(problem, max_layouts=1000)
    assert err.value.rule.startswith(
        "the space holds 945,528 runnable layouts (1,334,124 before the rules that refuse layouts up front: a "
        "framework's pipeline schedules and ZeRO stages beside pp, tp*cp*pp dividing the devices, max_dp_group), "
        "above the limit of 1,000 (COMMPLAN_MAX_SEARCH_LAYOUTS)"
    )


def _published(preset, work, cluster, par, allowed):
    model = MODEL_PRESETS[preset]
    plan = build_plan(model, work, par, cluster)
    assert plan.memory.fits, plan.warnings
    result = search(Problem(model, replace(work, micro_batch_size=1), cluster, Constraints.of(allowed), top_k=3))
    assert result.results
    best = result.results[0]
    assert best.time_s <= step_time(plan) * (1 + 1e-12)
    assert best.plan.memory.fits
    return step_time(plan), best


@pytest.mark.slow
def test_megatron_gpt3_layout_fits_and_is_found_or_beaten():
    """Narayanan et al. SC'21 Table 1: GPT-3 175B, t8 p8, 1,024 A100, batch 1536 (full recompute)."""
    work = WorkloadSpec(micro_batch_size=1, global_batch_size=1536, activation_recompute="full")
    par = ParallelSpec(tp=8, pp=8, dp=16, zero_stage=1, sequence_parallel=True)
    allowed = {"framework": "megatron", "tp": 8, "pp": 8, "cp": 1, "zero_stage": 1, "micro_batch_size": [1, 2]}
    _published("gpt3-175b", work, cluster_preset("dgx-a100", 128), par, allowed)


@pytest.mark.slow
def test_llama3_405b_layout_fits_and_is_found_or_beaten():
    """The Llama 3 Herd of Models (2024) Table 4: TP8 CP1 PP16 DP128 on 16,384 H100, batch 2048 x 8192."""
    work = WorkloadSpec(micro_batch_size=1, global_batch_size=2048, activation_recompute="none")
    par = ParallelSpec(
        tp=8, pp=16, dp=128, zero_stage=1, sequence_parallel=True, first_stage_layers=7, last_stage_layers=7
    )
    allowed = {
        "framework": "megatron",
        "tp": 8,
        "pp": 16,
        "cp": 1,
        "zero_stage": 1,
        "micro_batch_size": 1,
        "virtual_pipeline_stages": 1,
    }
    _published("llama3-405b", work, cluster_preset("dgx-h100", 2048), par, allowed)


@pytest.mark.parametrize(
    "preset, nodes, shape, variants",
    [
        ("llama3-8b", 2, (2, 2, 2), [("megatron", 1, True), ("torch", 3, False), ("deepspeed", 1, False)]),
        ("mixtral-8x7b", 4, (2, 1, 4), [("megatron", 1, True), ("torch", 0, True)]),
        ("gpt3-175b", 16, (8, 1, 8), [("megatron", 1, True), ("megatron", 0, False)]),
    ],
)
def test_screen_equals_build_plan(preset, nodes, shape, variants):
    """The search's screen (templates, price curves, the planner's functions memoised) gives build_plan's
    step time and memory peaks, and its bound never exceeds the step time."""
    from planner.search.evaluate import ShapeEvaluator
    from planner.search.space import Shape, Variant

    model, cluster = MODEL_PRESETS[preset], cluster_preset("dgx-h100", nodes)
    tp, cp, pp = shape
    dp = nodes * 8 // (tp * cp * pp)
    work = WorkloadSpec(global_batch_size=dp * 8)
    ep = 2 if model.moe else 1
    ev = ShapeEvaluator(Problem(model, work, cluster), Shape(tp, cp, pp, dp, ep, 1))
    checked = 0
    for framework, zero, sp in variants:
        variant = Variant(ev.shape, 1, "1f1b", zero, sp, framework)
        par = variant.parallel()
        for b, rc in ((1, "none"), (2, "selective"), (1, "full")):
            parts = ev.calls(variant, b, rc)
            rows = [r for part in parts for r in part.rows]
            screen = ev.step_model.step_time(par, b, rc, parts)
            plan = build_plan(model, replace(work, micro_batch_size=b, activation_recompute=rc), par, cluster)
            assert screen == pytest.approx(plan.step.time_s, rel=1e-6)  # prices interpolated: rounding only
            assert ev.step_model.lower_bound(par, b, rc) <= plan.step.time_s
            peaks = ev.step_model._static_bytes(par) + ev.step_model._activation_bytes(par, b, rc)
            for stage, size in comm_buffers(rows).items():
                peaks[stage] += size
            assert peaks.tolist() == [s.peak_bytes for s in plan.memory.per_stage]
            checked += 1
    assert checked == 3 * len(variants)


def test_cancel_stops_the_search_and_progress_counts_up():
    model = replace(MODEL_PRESETS["llama3-8b"], seq_length=2048, num_layers=8)
    problem = Problem(model, WorkloadSpec(global_batch_size=16), cluster_preset("dgx-h100", 1), Constraints.of(SMALL))
    from planner.search import Cancelled

    with pytest.raises(Cancelled):
        search(problem, cancelled=lambda: True, workers=1)
    seen = []
    result = search(problem, progress=seen.append, workers=1)
    done = [s["done"] for s in seen]
    assert done == sorted(done) and done[0] == 0 and done[-1] == result.space_size
    assert seen[-1]["best"]["step_time_s"] == pytest.approx(result.results[0].time_s, rel=1e-9)


@pytest.mark.parametrize(
    "preset, nodes, shape, pipeline",
    [
        ("gpt3-175b", 8, (8, 1, 8), (1, "1f1b")),
        ("gpt3-175b", 8, (4, 2, 4), (3, "interleaved")),
        ("llama3-8b", 2, (2, 2, 2), (2, "interleaved")),
    ],
)
def test_screen_over_a_variant_equals_the_layout_by_layout_screen(preset, nodes, shape, pipeline):
    """fits_many and lower_bounds (array operations over a variant's (b, recompute) pairs) answer what fits
    and lower_bound answer one layout at a time, and the bound is below build_plan's step time."""
    from planner.search.evaluate import ShapeEvaluator
    from planner.search.space import Shape, Variant

    model, cluster = MODEL_PRESETS[preset], cluster_preset("dgx-h100", nodes)
    tp, cp, pp = shape
    dp = nodes * 8 // (tp * cp * pp)
    work = WorkloadSpec(global_batch_size=dp * 32)
    ev = ShapeEvaluator(Problem(model, work, cluster), Shape(tp, cp, pp, dp))
    model_ = ev.step_model
    seen = set()
    for framework, zero in (("megatron", 1), ("torch", 3), ("deepspeed", 1)):  # DeepSpeed: ZeRO <= 1 beside pp
        runs = flavours.flavour(framework).pipeline_schedules
        if runs is not None and pipeline[1] not in runs:
            continue  # DeepSpeed runs only 1F1B (its flavour's pipeline_schedules): the rules refuse the variant
        par = Variant(ev.shape, *pipeline, zero, True, framework).parallel()
        grid = tuple((b, rc) for b in (1, 4, 16, 32) for rc in ("none", "selective", "full"))
        fits_each = [model_.fits(par, b, rc) for b, rc in grid]
        assert model_.fits_many(par, grid).tolist() == fits_each
        seen.update(fits_each)
        bounds = model_.lower_bounds(par, grid).tolist()
        assert bounds == pytest.approx([model_.lower_bound(par, b, rc) for b, rc in grid], rel=1e-12)
        for (b, rc), bound in list(zip(grid, bounds, strict=True))[::5]:
            if (work.global_batch_size // (b * dp)) % pp and pipeline[1] == "interleaved":
                continue  # not a valid layout (the interleaved schedule's micro-batch rule)
            plan = build_plan(model, replace(work, micro_batch_size=b, activation_recompute=rc), par, cluster)
            assert bound <= plan.step.time_s
    assert seen == {True, False}  # layouts that fit and layouts that do not


@pytest.mark.parametrize(
    "preset, nodes, shapes",
    [
        ("gpt3-175b", 8, [(8, 1, 8), (4, 2, 4), (2, 1, 2), (1, 4, 1)]),
        ("llama3-8b", 2, [(2, 2, 2), (1, 1, 4), (4, 1, 1)]),
        ("mixtral-8x7b", 4, [(2, 1, 4)]),
    ],
)
def test_refined_bound_is_below_the_step_time_and_tighter_where_dp_is_exposed(preset, nodes, shapes):
    """The bound from the data-parallel calls (refined_bound) never exceeds the step time, over every
    pipeline, framework, ZeRO stage, SP, micro-batch size and recompute of several shapes (build_plan's on
    a sample, the screen's, equal to it to 1e-6, on the rest); it is at least the compute-only bound, and
    above it wherever Megatron exposes its gradient all-reduce; the compute bound plus data_floor (the
    cheap first test) lies between the two."""
    from planner.search.evaluate import ShapeEvaluator, batch_rule
    from planner.search.space import Shape

    model, cluster = MODEL_PRESETS[preset], cluster_preset("dgx-h100", nodes)
    work = WorkloadSpec(global_batch_size=nodes * 8 * 8)
    checked = tighter = planned = floors = 0
    for tp, cp, pp in shapes:
        dp = nodes * 8 // (tp * cp * pp)
        ep = 2 if model.moe else 1
        ev = ShapeEvaluator(Problem(model, work, cluster), Shape(tp, cp, pp, dp, ep, 1))
        for index, variant in enumerate(ev.variants):
            if ev.space.check(variant, 1) is not None:
                continue
            if ev.template(templates.DATA_RULES, variant, "none") is None:
                continue  # refused (FSDP2 inside a pipeline): no bound, timed from its exact ledger
            par = ev.parallel(index)
            for b, rc in itertools.product((1, 2, 4), ("none", "selective", "full")):
                if batch_rule(ev.space, variant, b) is not None:
                    continue
                bound = ev.refined_bound(index, b, rc)
                step = ev.step_model.step_time(par, b, rc, ev.calls(variant, b, rc))
                floor = ev.step_model.lower_bound(par, b, rc) + ev.data_floor(index, b)
                assert ev.step_model.lower_bound(par, b, rc) <= floor <= bound * (1 + 1e-12) <= step * (1 + 1e-9)
                if checked % 97 == 0:
                    w = replace(work, micro_batch_size=b, activation_recompute=rc)
                    assert bound <= build_plan(model, w, par, cluster).step.time_s * (1 + 1e-9)
                    planned += 1
                checked += 1
                if par.framework == "megatron" and par.dp * par.cp > 1 and variant.zero_stage < 2:
                    tighter += bound > ev.step_model.lower_bound(par, b, rc) * (1 + 1e-9)
                    floors += floor > ev.step_model.lower_bound(par, b, rc) * (1 + 1e-9)
    assert checked > 200 and planned > 2 and tighter > 20 and floors > 20


def test_parameter_lists_shared_across_dp_cp_zero_and_sp_are_the_layouts_own():
    """params.stage_params keys its cache on the layout without dp, cp, ZeRO stage and SP: the lists it
    answers equal those built for the full layout (dense and MoE, every framework, uneven ends)."""
    from planner.params import _stage_params, stage_params

    cases = [
        ("gpt3-175b", dict(tp=8, pp=8, dp=4, cp=2, zero_stage=1, sequence_parallel=True)),
        ("llama3-405b", dict(tp=4, pp=16, dp=8, cp=4, zero_stage=3, first_stage_layers=7, last_stage_layers=7)),
        ("mixtral-8x7b", dict(tp=2, pp=4, dp=4, ep=4, expert_tp=1, zero_stage=2, framework="torch")),
        ("llama3-8b", dict(tp=2, pp=2, dp=2, cp=2, virtual_pipeline_stages=4, pipeline_schedule="interleaved")),
        ("llama3-8b", dict(tp=1, pp=4, dp=16, zero_stage=3, framework="deepspeed")),
    ]
    for preset, fields in cases:
        ctx = Context(MODEL_PRESETS[preset], WorkloadSpec(), ParallelSpec(**fields))
        for stage in range(ctx.par.pp):
            assert stage_params(ctx, stage) == _stage_params(ctx, stage)


def test_group_size_limit_follows_the_pricer():
    """Unset, max_dp_group prunes nothing where NCCL's closed-form model prices the data-parallel collectives
    (NVIDIA clusters) and keeps MAX_DP_GROUP where the step-by-step schedule pricer builds them."""
    from collectives.topology import cluster_for, cluster_preset
    from planner.search.evaluate import default_dp_group
    from planner.search.space import MAX_DP_GROUP

    h100 = cluster_for(cluster_preset("dgx-h100", 2048))
    assert default_dp_group(h100) == 16384
    assert default_dp_group(cluster_for(cluster_preset("tpu-torus", 512))) == MAX_DP_GROUP == 2048
    assert default_dp_group(cluster_for(cluster_preset("npu-mesh-8", 512))) == MAX_DP_GROUP


def test_screen_equals_build_plan_under_candidates_all():
    """``candidates: all`` prices every call by schedule (Options.pricer), so build_plan's sends, CP ring and
    pipeline exchanges hold no NCCL CTAs; the screen's curves must charge none either (prices.Curve.time used
    the raw ``pricing`` 'auto' and charged NCCL's p2p CTAs: review r8a finding 1)."""
    from planner.plan import Options
    from planner.search.evaluate import ShapeEvaluator
    from planner.search.space import Shape, Variant

    model, cluster = MODEL_PRESETS["llama3-8b"], cluster_preset("dgx-h100", 2)
    work, options = WorkloadSpec(global_batch_size=16), Options(candidates="all")
    ev = ShapeEvaluator(Problem(model, work, cluster, options=options), Shape(2, 2, 2, 2, 1, 1))
    variant = Variant(ev.shape, 1, "1f1b", 1, True, "megatron")
    par = variant.parallel()
    parts = ev.calls(variant, 1, "none")
    sends = [r for part in parts for r in part.rows if r.call.op.value in ("sendrecv", "alltoall")]
    assert sends and all(r.price.channels == 0 for r in sends)  # no NCCL channels under schedule pricing
    screen = ev.step_model.step_time(par, 1, "none", parts)
    plan = build_plan(model, replace(work, micro_batch_size=1), par, cluster, options)
    assert screen == pytest.approx(plan.step.time_s, rel=1e-6)


def test_constraints_that_leave_no_layout_are_refused_with_the_rule():
    """Each degree divides the 8 devices, their product 512 does not: the search (the CLI's, Python callers')
    refuses at constraints with the degrees, as the HTTP route does before its first byte (Space.checked_size)."""
    model = replace(MODEL_PRESETS["llama3-8b"], num_layers=8)
    constraints = Constraints.of({"tp": 8, "pp": 8, "cp": 8})
    problem = Problem(model, WorkloadSpec(global_batch_size=64), cluster_preset("dgx-h100", 1), constraints)
    with pytest.raises(SpecError) as err:
        search(problem, workers=1)
    assert err.value.field == "constraints"
    assert "tp [8], cp [8], pp [8] (tp*cp*pp is at least 512, which must divide the devices)" in str(err.value)


def test_an_interleaved_only_search_at_pp_1_names_the_schedule_rule():
    """The product divides the devices; what leaves nothing is the schedule: the refusal names it (r11b)."""
    model = replace(MODEL_PRESETS["llama3-8b"], num_layers=8)
    constraints = Constraints.of({"pipeline_schedule": "interleaved", "pp": 1})
    problem = Problem(model, WorkloadSpec(global_batch_size=64), cluster_preset("dgx-h100", 1), constraints)
    with pytest.raises(SpecError) as err:
        search(problem, workers=1)
    assert str(err.value).endswith(
        "leave no layout on the 8 devices: no pipeline schedule, virtual stages or stage split the constraints allow "
        "(interleaved) runs at pp [1] (an interleaved or V schedule needs pp >= 2)"
    )
