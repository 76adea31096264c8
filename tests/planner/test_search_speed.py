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
from planner.search.space import MEMORY
from planner.search.step_model import StepModel
from planner.spread import job_pace, slowest_part
from planner.step import Overlap, StageStep, critical_path, schedule_of

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
    equal compute.stage_compute on the slowest part (spread.slowest_part) and memory.stage_activation_bytes bit for
    bit, but for the backward's recompute share (``recompute_s``), which the search leaves at 0.0: only the
    timeline draws it, and the step's critical path is the same bit for bit without it."""
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
            # as step.step_time has them: at the slowest of the layout's GPUs' pace (planner/spread.py, spread15)
            k = job_pace(ctx, cluster.spec.gpu)
            exact = [stage_compute(ctx, s, slowest_part(cluster.spec.gpu, k)) for s in range(par.pp)]
            unread = [replace(c, recompute_s=0.0) for c in exact]
            assert sm._stage_compute(par, b, rc) == unread
            sched = schedule_of(ctx)
            assert (rc == "none") == all(c.recompute_s == 0.0 for c in exact)  # a re-run to leave out
            flags = Overlap().resolved(ctx)
            paths = [
                critical_path(ctx, [StageStep(s, c) for s, c in enumerate(cs)], sched, cluster.spec.gpu, flags)
                for cs in (exact, unread)
            ]
            assert paths[0].time_s == paths[1].time_s
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


_GPU = cluster_preset("dgx-h100", 4).gpu


FRAMEWORKS = ["megatron", "torch", "deepspeed"]


def _runs(framework: str, schedule: str) -> bool:
    """Whether the framework runs the pipeline schedule (Flavour.pipeline_schedules; DeepSpeed: 1F1B alone)."""
    from planner import flavours

    runs = flavours.flavour(framework).pipeline_schedules
    return runs is None or schedule in runs


def _layout(draw, st, model) -> ParallelSpec:
    pp = draw(st.sampled_from([1, 2, 4]))
    framework = draw(st.sampled_from(FRAMEWORKS))
    v = draw(st.sampled_from([1, 2])) if pp > 1 and _runs(framework, "interleaved") else 1
    tp = draw(st.sampled_from([1, 2, 4, 8]))
    ep = draw(st.sampled_from([1, 2, 4, 8])) if model.moe else 1
    return ParallelSpec(
        tp=tp,
        pp=pp,
        dp=draw(st.sampled_from([1, 2, 4, 8])),
        cp=draw(st.sampled_from([1, 2])),
        ep=ep,
        expert_tp=draw(st.sampled_from([1, tp])) if model.moe else 1,
        zero_stage=draw(st.sampled_from([0, 1, 2, 3])),
        sequence_parallel=tp > 1 and draw(st.booleans()),
        framework=framework,
        virtual_pipeline_stages=v,
        pipeline_schedule="interleaved" if v > 1 else draw(st.sampled_from(_ones(framework))),
    )


def _ones(framework: str) -> list[str]:
    """The one-chunk schedules the framework runs, of 1F1B and GPipe."""
    return [s for s in ("1f1b", "gpipe") if _runs(framework, s)]


def _drawn(draw, st, models) -> tuple:
    """A drawn model of ``models`` cut to 8 layers, workload (micro-batch size, recompute) and layout."""
    model = replace(MODEL_PRESETS[draw(st.sampled_from(models))], num_layers=8)
    b, rc = draw(st.sampled_from([1, 2])), draw(st.sampled_from(["none", "selective", "full"]))
    work = WorkloadSpec(global_batch_size=64, micro_batch_size=b, activation_recompute=rc)
    return model, work, _layout(draw, st, model)


def _on_valid_pairs(pairs, examples: int, check) -> None:
    """check(a, b, a's schedule, b's schedule) on ``examples`` drawn context pairs, skipping those
    validate_parallel refuses. Derandomized: the examples are the same every run, so the sharing counts the
    tests assert are checked on a fixed draw (a random one gave 9 coincidences where 10 are asked for, once
    in the full suite)."""
    from hypothesis import HealthCheck, given, settings

    from planner.parallel import validate_parallel

    @settings(max_examples=examples, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(pairs())
    def run(pair):
        for ctx in pair:
            try:
                validate_parallel(ctx.par, ctx.model, ctx.work, ctx.par.world_size)
            except Exception:
                return
        a, b = pair
        check(a, b, schedule_of(a), schedule_of(b))

    run()


def test_equal_stage_compute_keys_give_equal_stage_compute():
    """compute.stage_compute_key and memory.stage_activation_key (what the search memoises stage_compute and
    stage_activation_bytes on) name everything those read: two contexts (random layouts, micro-batch sizes
    and recompute of a dense and an MoE model, the second drawn near the first: ZeRO stage, framework and
    dp redrawn) with equal keys give equal StageCompute and activation bytes, stage by stage; and the keys
    do coincide often (the memo is shared)."""
    from hypothesis import strategies as st

    from planner.compute import stage_compute_key
    from planner.memory import stage_activation_key

    shared, acts = [], []

    @st.composite
    def pairs(draw):
        model, work, one = _drawn(draw, st, ["llama3-8b", "mixtral-8x7b", "gpt3-175b"])
        other = replace(
            one,
            zero_stage=draw(st.sampled_from([0, 1, 2, 3])),
            framework=draw(st.sampled_from([f for f in FRAMEWORKS if one.pp == 1 or _runs(f, one.pipeline_schedule)])),
            dp=draw(st.sampled_from([one.dp, 2 * one.dp])),
            expert_tp=one.expert_tp,
        )
        return Context(model, work, one), Context(model, work, other)

    def check(a, b, sa, sb):
        for stage in range(a.par.pp):
            if stage_compute_key(a, stage) == stage_compute_key(b, stage):
                shared.append(a.par != b.par)
                assert stage_compute(a, stage, _GPU) == stage_compute(b, stage, _GPU)
            if stage_activation_key(a, stage, sa) == stage_activation_key(b, stage, sb):
                acts.append(a.par != b.par)
                assert stage_activation_bytes(a, stage, sa) == stage_activation_bytes(b, stage, sb)

    _on_valid_pairs(pairs, 120, check)  # 60 met 9 times once DeepSpeed's layouts were drawn with 1F1B alone
    assert sum(shared) > 10 and sum(acts) > 10  # different layouts met on one key


def test_stage_compute_keys_are_shared_where_compute_reads_nothing_different():
    """The cases the search's speed rests on: ZeRO 1-3 share a key; ZeRO 0 against 1 (the optimizer step
    shards), another micro-batch and another framework (its kernel fusion, kernels.py) do not."""
    from planner.compute import stage_compute_key

    model, work = MODEL_PRESETS["llama3-70b"], WorkloadSpec(global_batch_size=64)
    par = ParallelSpec(tp=8, pp=4, dp=2, zero_stage=1)

    def key(p, w=work, stage=1):
        return stage_compute_key(Context(model, w, p), stage)

    assert key(par) == key(replace(par, zero_stage=3))
    assert key(par) == key(replace(par, zero_stage=2))
    assert key(par) != key(replace(par, zero_stage=0))
    assert key(par) != key(par, replace(work, micro_batch_size=2))
    assert key(par) != key(replace(par, framework="deepspeed", expert_tp=8))  # the flavour's kernels (kernels.py)


def test_equal_chunk_and_activation_keys_give_equal_values_across_stages_and_pipelines():
    """The keys the search memoises step.chunk_shares and memory.stage_activation_bytes on name what those
    read relative to the stage (its chunks' layer kinds, loss, in-flight counts; not the stage's index or its
    layers' global indices): two contexts of one model and workload with different pipelines (pp, v, dp
    redrawn), any stage of one against any stage of the other, give equal shares where (layer_forward_key,
    the stage's forward seconds, chunk_shares_key) are equal and equal activation bytes where
    stage_activation_key is; and such keys do meet across different stages or pipeline depths."""
    from hypothesis import strategies as st

    from planner.compute import layer_forward_key
    from planner.memory import stage_activation_key
    from planner.step import StageStep, chunk_shares, chunk_shares_key

    met_shares, met_acts = [], []

    @st.composite
    def pairs(draw):
        model, work, one = _drawn(draw, st, ["llama3-8b", "mixtral-8x7b", "deepseek-v3"])
        pp = draw(st.sampled_from([2, 4]))
        v = draw(st.sampled_from([1, 2])) if _runs(one.framework, "interleaved") else 1
        other = replace(
            one,
            pp=pp,
            virtual_pipeline_stages=v,
            pipeline_schedule="interleaved" if v > 1 else draw(st.sampled_from(_ones(one.framework))),
            dp=draw(st.sampled_from([one.dp, 2 * one.dp])),
        )
        return Context(model, work, one), Context(model, work, other)

    def share_key(ctx, stage):
        forward = stage_compute(ctx, stage, _GPU).forward.total_s
        # and the pace chunk_shares reads its layers at (planner/spread.py), as the search's shares key has it
        return layer_forward_key(ctx), forward, chunk_shares_key(ctx, stage), job_pace(ctx, _GPU)

    def check(a, b, sa, sb):
        for i in range(a.par.pp):
            for j in range(b.par.pp):
                moved = i != j or a.par.pp != b.par.pp
                if stage_activation_key(a, i, sa) == stage_activation_key(b, j, sb):
                    met_acts.append(moved)
                    assert stage_activation_bytes(a, i, sa) == stage_activation_bytes(b, j, sb)
                key = share_key(a, i)
                if key[2] is not None and key == share_key(b, j):
                    met_shares.append(moved)
                    ca, cb = stage_compute(a, i, _GPU), stage_compute(b, j, _GPU)
                    assert chunk_shares(a, StageStep(i, ca), _GPU) == chunk_shares(b, StageStep(j, cb), _GPU)

    # 160 draws: since the first stage holds the embedding's lookup (compute.embedding_pass) its forward meets no
    # other stage's, and 40 draws met 2 times across stages (80: 8; 80 met none once DeepSpeed's layouts were drawn
    # with 1F1B alone, as its flavour runs: the derandomized draw moved)
    _on_valid_pairs(pairs, 160, check)
    assert sum(met_shares) > 5  # other stages and pipelines met on one key
    # activations meet across stages where the in-flight counts agree: GPipe's stages all hold m micro-batches
    model, work = replace(MODEL_PRESETS["llama3-8b"], num_layers=8), WorkloadSpec(global_batch_size=64)
    a = Context(model, work, ParallelSpec(pp=4, dp=2, pipeline_schedule="gpipe"))
    b = Context(model, work, ParallelSpec(pp=4, dp=2, zero_stage=3, pipeline_schedule="gpipe"))
    key = stage_activation_key(a, 0, schedule_of(a))
    assert key == stage_activation_key(a, 2, schedule_of(a)) == stage_activation_key(b, 1, schedule_of(b))
    assert key != stage_activation_key(a, 3, schedule_of(a))  # the last stage holds the logits
    assert stage_activation_bytes(a, 0, schedule_of(a)) == stage_activation_bytes(b, 1, schedule_of(b))


def test_value_keyed_layer_memos_equal_a_fresh_computation():
    """kernels.layer_kernels (and compute's per-layer memos through kernels.per_layer) are keyed on
    layer_kernels_key, not on the context: two contexts drawn apart in what the kernels should not read (pp,
    virtual stages, schedule, dp when training, ZeRO) and in what they do (tp, cp, SP, framework, micro-batch,
    recompute) give, wherever their keys are equal, the same kernels computed afresh (kernels._layer_kernels,
    not memoised); the memo answers what a fresh computation does; and the keys meet across layouts."""
    from hypothesis import strategies as st

    from planner import kernels
    from planner.kernels import EFFICIENCY, layer_kernels, layer_kernels_key

    met = []

    @st.composite
    def pairs(draw):
        model, work, one = _drawn(draw, st, ["llama3-8b", "mixtral-8x7b", "gpt3-175b"])
        other = _layout(draw, st, model) if draw(st.booleans()) else one  # another layout, or this one moved
        other = replace(
            other,
            pp=draw(st.sampled_from([1, 2, 4])),
            dp=draw(st.sampled_from([1, 2, 4])),
            zero_stage=draw(st.sampled_from([0, 1, 2, 3])),
            virtual_pipeline_stages=1,
            pipeline_schedule=draw(st.sampled_from(["1f1b", "gpipe"])),
            expert_tp=other.expert_tp,
        )
        return Context(model, work, one), Context(model, work, other)

    def check(a, b, _sa, _sb):
        for moe in (False, True) if a.model.moe else (False,):
            fresh = kernels._layer_kernels(b, moe, _GPU, EFFICIENCY)
            assert layer_kernels(b, moe, _GPU) == fresh
            if layer_kernels_key(a) == layer_kernels_key(b):
                met.append(a.par != b.par)
                assert kernels._layer_kernels(a, moe, _GPU, EFFICIENCY) == fresh

    _on_valid_pairs(pairs, 40, check)
    assert sum(met) > 5  # different layouts met on one key


def test_layer_kernels_key_reads_the_degrees_and_not_the_pipeline():
    """The cases the memo's sharing rests on: pp, dp (training), ZeRO and the schedule share a key; tp, cp,
    SP, the framework (its fusion), the micro-batch size and recompute do not."""
    from planner.kernels import layer_kernels_key

    model, work = MODEL_PRESETS["llama3-70b"], WorkloadSpec(global_batch_size=64)
    par = ParallelSpec(tp=4, pp=4, dp=2, zero_stage=1, sequence_parallel=True)

    def key(p, w=work):
        return layer_kernels_key(Context(model, w, p))

    assert key(par) == key(replace(par, pp=8, dp=1, zero_stage=3, virtual_pipeline_stages=2))
    for other in (replace(par, tp=8), replace(par, cp=2), replace(par, sequence_parallel=False),
                  replace(par, framework="torch", expert_tp=4)):  # fmt: skip
        assert key(par) != key(other)
    assert key(par) != key(par, replace(work, micro_batch_size=2))
    assert key(par) != key(par, replace(work, activation_recompute="full"))


def test_per_layer_memos_and_pipeline_chunks_stay_bounded(monkeypatch):
    """The value-keyed memos are bounded: past their limit they are cleared, never grown without end (the
    service runs for days)."""
    from planner import compute, kernels, parallel

    monkeypatch.setattr(kernels, "LAYER_KERNELS_KEPT", 3)
    monkeypatch.setattr(parallel, "CHUNKS_KEPT", 3)
    memos = (kernels._LAYER_KERNELS, compute._LAYER_FORWARD, compute._LAYER_BACKWARD, compute._HEAD, parallel._CHUNKS)
    for memo in memos:
        memo.clear()  # (caches: what other tests left there)
    model = replace(MODEL_PRESETS["llama3-8b"], num_layers=8)
    for b in range(1, 8):
        work = WorkloadSpec(global_batch_size=64, micro_batch_size=b)
        ctx = Context(model, work, ParallelSpec(tp=2, pp=b % 4 + 1, dp=2))
        parallel.pipeline_chunks(replace(ctx.par, pp=b), 8 * b)
        stage_compute(ctx, ctx.par.pp - 1, _GPU)  # forward, backward and head of a layer, by value
        assert all(len(memo) <= 3 for memo in memos), [len(m) for m in memos]
    assert len(kernels._LAYER_KERNELS) > 0 and len(parallel._CHUNKS) > 0


def test_pipeline_chunks_memo_equals_a_fresh_split():
    """parallel.pipeline_chunks is memoised on the fields its split reads (_split_key): layouts that differ
    in tp, cp, dp, ZeRO or framework share an entry equal to their own fresh split; pp, v, the schedule and
    uneven first/last stages do not share."""
    from planner import parallel

    par = ParallelSpec(tp=2, pp=4, dp=2, virtual_pipeline_stages=2, pipeline_schedule="interleaved")
    for other in (replace(par, tp=4, cp=2, dp=8, zero_stage=3), replace(par, framework="torch")):
        assert parallel._split_key(other) == parallel._split_key(par)
        assert parallel.pipeline_chunks(other, 16) == parallel._pipeline_chunks(other, 16, 0)
    uneven = ParallelSpec(pp=4, first_stage_layers=3, last_stage_layers=3)
    for other in (replace(par, pp=2), replace(par, virtual_pipeline_stages=4), replace(par, pipeline_schedule="zbv",
                  virtual_pipeline_stages=1), uneven):  # fmt: skip
        assert parallel._split_key(other) != parallel._split_key(par)
    assert [len(c.layers) for r in parallel.pipeline_chunks(uneven, 14) for c in r] == [3, 4, 4, 3]


def test_stage_activations_are_chunk_parts_times_micro_batches_in_flight():
    """memory.stage_activation_bytes is held_activation_bytes of chunk_activations and
    pipeline.in_flight_chunks (the search memoises the two apart); chunk_activation_key drops the schedule, so
    the 1F1B and interleaved stages of one layout share it while their bytes differ."""
    from planner.memory import chunk_activation_key, chunk_activations, held_activation_bytes
    from planner.pipeline import in_flight_chunks

    model = replace(MODEL_PRESETS["llama3-8b"], num_layers=16)
    work = WorkloadSpec(global_batch_size=64, activation_recompute="selective")
    par = ParallelSpec(tp=2, pp=4, dp=2, virtual_pipeline_stages=2, pipeline_schedule="interleaved")
    ctx = Context(model, work, par)
    sched = schedule_of(ctx)
    for s in range(4):
        parts = chunk_activations(ctx, s)
        assert len(parts.per_chunk) == 2 and (parts.logits > 0) == (s == 3)
        assert held_activation_bytes(parts, in_flight_chunks(sched, s)) == stage_activation_bytes(ctx, s, sched)
    assert chunk_activation_key(ctx, 0) == chunk_activation_key(ctx, 1) != chunk_activation_key(ctx, 3)
    # stage 0 holds more micro-batches in flight than stage 1 under interleaving: same parts, more bytes
    assert stage_activation_bytes(ctx, 0, sched) > stage_activation_bytes(ctx, 1, sched)


def test_layer_kernels_memo_follows_a_flavour_registered_again():
    """The per-layer memo keys the flavour's traits the kernels read, not its name: a flavour registered again
    under the same name with other traits (eager instead of fused kernels) gets its own kernels, not the
    memoised ones of the first registration."""
    from planner import flavours
    from planner.flavours.megatron import FLAVOUR as MEGATRON
    from planner.kernels import layer_kernels

    model, work = replace(MODEL_PRESETS["llama3-8b"], num_layers=8), WorkloadSpec(global_batch_size=64)
    try:
        flavours.register(replace(MEGATRON, name="toy-memo"))
        fused = layer_kernels(Context(model, work, ParallelSpec(tp=2, dp=4, framework="toy-memo")), False, _GPU)
        flavours.register(replace(MEGATRON, name="toy-memo", fused_kernels=False))
        eager = layer_kernels(Context(model, work, ParallelSpec(tp=2, dp=4, framework="toy-memo")), False, _GPU)
    finally:
        flavours.unregister("toy-memo")
    # eager rotary runs 3 kernels per tensor, q and k (kernels.EAGER) where the fused one runs 1 per tensor
    assert [k.count for k in fused.forward if k.name == "rotary"] == [2]
    assert [k.count for k in eager.forward if k.name == "rotary"] == [6]


def test_screen_bounded_by_the_threshold_counts_and_answers_as_timing_would():
    """Layouts whose busiest-rank bound is slower than the chunk's threshold are counted bounded in the screen
    (StepModel.busiest_bounds), and those whose layers' floor is (StepModel.layer_floors, speed11) before their
    memory (bounded_before_memory): the layouts timed and the best layouts equal screening them all and letting
    timing bound them, every layout is counted once; the busiest-rank bound is never above the compute-only
    bound."""
    model = replace(MODEL_PRESETS["llama3-8b"], num_layers=8)
    allowed = {"framework": ["megatron", "torch"], "activation_recompute": ["none", "selective", "full"]}
    cluster, constraints = cluster_preset("dgx-h100", 2), Constraints.of(allowed)
    # top_k above the feasible count: only the threshold bounds, so every layout whose bound is below it is timed
    problem = Problem(model, WorkloadSpec(global_batch_size=64), cluster, constraints, top_k=1000)
    shapes = list(space_of(problem).shapes(Pruned()))
    out_all, all_screened = screen_shapes(problem, shapes)
    bounds = sorted(b for s in all_screened for b in s.bounds.tolist())
    pars = [s.evaluator.parallel(i) for s in all_screened for i in sorted(set(s.variants.tolist()))]
    threshold = bounds[len(bounds) // 4]  # a quarter of the feasible layouts are faster than it
    out_all.merge(time_shapes(problem, all_screened, threshold), problem.keep)
    out, screened = screen_shapes(problem, shapes, threshold)
    assert sum(map(len, screened)) < len(bounds) and out.bounded > 0  # the screen bounded some
    out.merge(time_shapes(problem, screened, threshold), problem.keep)
    assert (out.done, out.evaluated) == (out_all.done, out_all.evaluated)
    assert out.feasible - out.bounded == out_all.feasible - out_all.bounded  # the same layouts timed
    assert out_all.bounded_before_memory == 0 < out.bounded_before_memory
    for o in (out, out_all):
        assert o.evaluated == o.feasible + o.pruned.counts.get(MEMORY, 0) + o.bounded_before_memory
    assert [(t, layout) for t, _, layout in out.best] == [(t, layout) for t, _, layout in out_all.best]
    step_model = StepModel(model, problem.work, cluster_for(problem.cluster))
    grid = tuple((b, rc) for b in (1, 2, 4) for rc in ("none", "selective", "full"))
    assert len(pars) > 10
    for par in pars:
        busiest, bound = step_model.busiest_bounds(par, grid), step_model.lower_bounds(par, grid)
        assert (busiest <= bound).all() and (busiest > 0).all()


def test_schedules_and_busiest_bounds_shared_across_layouts_equal_their_own():
    """speed4: the step model's schedule is shared by layouts alike in schedule, pp, chunks per rank and dp
    (schedule_of reads nothing else), and a grid's busiest-rank bounds are one array shared by layouts alike in
    passes and micro-batch counts: both equal what a fresh step model gives each layout alone, and the schedule
    equals step.schedule_of on the layout's own context."""
    model = replace(MODEL_PRESETS["llama3-8b"], num_layers=16)
    cluster = cluster_for(cluster_preset("dgx-h100", 4))
    work = WorkloadSpec(global_batch_size=256)
    grid = tuple((b, rc) for b in (1, 2, 4) for rc in ("none", "selective", "full"))
    layouts = [
        ParallelSpec(tp=tp, pp=pp, dp=32 // (tp * pp), zero_stage=zero, sequence_parallel=sp, framework=fw, **sched)
        for tp, pp in ((2, 2), (2, 4), (4, 2))
        for zero in (0, 1, 3)
        for sp in (False, True)
        for fw in ("megatron", "torch")
        for sched in ({}, {"pipeline_schedule": "interleaved", "virtual_pipeline_stages": 2})
        if not (fw == "torch" and sched)  # torch's interleaved runs are not needed here
    ]
    shared = StepModel(model, work, cluster)
    for par in layouts:
        alone = StepModel(model, work, cluster)
        assert shared.busiest_bounds(par, grid).tolist() == alone.busiest_bounds(par, grid).tolist()
        for b in (1, 2, 4):
            ctx = Context(model, replace(work, micro_batch_size=b), par)
            assert shared._schedule(shared._variant(par), b) == schedule_of(ctx)
    assert len(shared._scheds) < len(layouts) * 3  # shared: fewer schedules than (layout, b) pairs


@pytest.mark.parametrize("preset", ["llama3-8b", "mixtral-8x7b", "gpt3-175b"])
@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_chunk_activations_read_b_and_cp_through_tokens_per_rank(preset, recompute):
    """memory.chunk_activations reads the micro-batch size and cp only as b·s/cp (memory.activation_tokens):
    (b, cp) pairs with equal tokens per rank share chunk_activation_key and keep the same bytes to the bit,
    with unfused attention's s² scores included; unequal tokens give other keys and other bytes."""
    from planner.memory import activation_tokens, chunk_activation_key, chunk_activations

    model = replace(MODEL_PRESETS[preset], num_layers=8)
    seen: dict = {}
    for kernel in ("flash", "unfused"):
        for b, cp in ((1, 1), (2, 2), (4, 4), (2, 1), (4, 2), (8, 4), (1, 2), (2, 4)):
            work = WorkloadSpec(
                global_batch_size=64, micro_batch_size=b, activation_recompute=recompute, attention_kernel=kernel
            )
            par = ParallelSpec(tp=2, cp=cp, pp=2, dp=8 // cp, sequence_parallel=True, ep=2 if model.moe else 1)
            ctx = Context(model, work, par)
            tokens = activation_tokens(ctx)
            assert tokens == b * (ctx.s // cp)
            for stage in (0, 1):
                key = chunk_activation_key(ctx, stage)
                assert key[2] == tokens
                parts = chunk_activations(ctx, stage)
                found = seen.setdefault((kernel, stage, tokens, key[3:]), parts)
                assert found == parts, (b, cp, stage)  # equal b·s/cp: equal bytes, bit for bit
    for kernel in ("flash", "unfused"):
        for stage in (0, 1):
            # s/2, s, 2s tokens per rank: three keys (cp is not one of their entries), three sizes
            sizes = [p for (k, s, _, _), p in seen.items() if (k, s) == (kernel, stage)]
            assert len(sizes) == 3 and len(set(sizes)) == 3


def test_chunk_activation_key_holds_the_flavour_traits_the_bytes_read():
    """Under an fp8 recipe only a TransformerEngine flavour saves quantized linear inputs (memory.saved_recipe
    reads Flavour.te_fp8_recipes): Megatron and DeepSpeed layouts of equal degrees keep different bytes, so
    their keys differ (they shared one before, and the search's memo gave one the other's bytes)."""
    from planner.memory import chunk_activation_key, chunk_activations

    model = replace(MODEL_PRESETS["llama3-8b"], num_layers=8)
    work = WorkloadSpec(global_batch_size=64, fp8_recipe="tensorwise")
    found = {}
    for framework in ("megatron", "deepspeed"):
        ctx = Context(model, work, ParallelSpec(tp=2, pp=2, dp=2, framework=framework))
        found[framework] = (chunk_activation_key(ctx, 0), chunk_activations(ctx, 0).per_chunk)
    (mkey, mbytes), (dkey, dbytes) = found["megatron"], found["deepspeed"]
    assert mkey != dkey and mkey[:3] == dkey[:3]  # the same model, workload and tokens: the trait differs
    assert mbytes == (2315255808.0,) and dbytes == (2818572288.0,)  # fp8 copies of the inputs vs bf16 ones


@pytest.mark.parametrize("preset", ["llama3-8b", "mixtral-8x7b", "gpt3-175b", "deepseek-v3"])
@pytest.mark.parametrize("framework", ["megatron", "torch", "deepspeed"])
def test_layer_kernels_spliced_on_tokens_per_rank_equal_their_own(preset, framework):
    """kernels.layer_kernels prices a layer's kernels but core attention once per tokens per rank b·s/cp
    (token_kernels_key) and splices each context's own core attention in at its place: for (b, cp) pairs of
    equal tokens, cp_comm p2p (cp ring steps and merges) and all-gather, three recomputes and an fp8 recipe,
    the spliced kernels equal the context's own (kernels._layer_kernels afresh), kernel for kernel and in order,
    so every pass sums bit for bit alike; and the layers of equal tokens share one entry."""
    from planner import kernels
    from planner.compute import pass_time
    from planner.kernels import EFFICIENCY, layer_kernels, token_kernels_key

    model = replace(MODEL_PRESETS[preset], num_layers=4)
    kernels._LAYER_KERNELS.clear()
    kernels._TOKEN_KERNELS.clear()
    spliced = contexts = 0
    for recipe in (None, "delayed"):
        for rc in ("none", "selective", "full"):
            for comm in ("p2p", "allgather"):
                for b, cp in ((1, 1), (2, 2), (4, 4), (2, 1), (4, 2), (1, 2)):
                    work = WorkloadSpec(
                        global_batch_size=64, micro_batch_size=b, activation_recompute=rc, fp8_recipe=recipe
                    )
                    par = ParallelSpec(
                        tp=2, cp=cp, pp=1, dp=8 // cp, sequence_parallel=True, ep=2 if model.moe else 1,
                        framework=framework, cp_comm=comm if cp > 1 else "p2p",
                    )  # fmt: skip
                    ctx = Context(model, work, par)
                    assert token_kernels_key(ctx)[2] == b * (ctx.s // cp)
                    for moe in (False, True) if model.moe else (False,):
                        before = len(kernels._TOKEN_KERNELS)
                        got = layer_kernels(ctx, moe, _GPU)
                        spliced += len(kernels._TOKEN_KERNELS) == before
                        contexts += 1
                        own = kernels._layer_kernels(ctx, moe, _GPU, EFFICIENCY)
                        assert got == own, (recipe, rc, comm, b, cp, moe)
                        assert pass_time(got.forward) == pass_time(own.forward)
                        assert pass_time(got.backward) == pass_time(own.backward)
    assert spliced >= contexts // 2  # (2, 2), (4, 4), (4, 2) and (1, 2) meet a layer of their tokens
