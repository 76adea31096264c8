"""DualPipe's own layout (dualpipe13, review r12a #3): the model in pp stages held twice, rank r running stage r for
direction 0 and stage pp - 1 - r for direction 1 (deepseek-ai/DualPipe 3da1bbe examples/example_dualpipe.py:
``local_full_modules = nn.Sequential(full_modules[rank], full_modules[pp_size - 1 - rank])``), one home
(planner/pipeline.py StageMap MIRRORED) read by the layout, the order's op cells, the step's passes and memory."""

from __future__ import annotations

from dataclasses import replace

import pytest

from collectives.topology import cluster_preset
from planner import Options, ParallelSpec, SpecError, WorkloadSpec, build_plan, model_preset
from planner import pipeline_jitter as pj
from planner.context import Context
from planner.parallel import pipeline_chunks, rank_of
from planner.pipeline import MIRRORED, Schedule, StagePass, bubble_s, pipeline_time, schedule_traits

from .test_pipeline_orders import event_makespan


def _mirror_passes(stage0: tuple[float, float, float], stage1: tuple[float, float, float]) -> list[StagePass]:
    """p = 2 as step.stage_passes gives them: each rank's pass a micro-batch's mean over its two stages, its fill the
    forward of the stage direction 0 runs (rank r: stage r), its drain the backward of the stage direction 1 runs
    (stage 1 - r); W in each stage's backward share."""
    (a0, b0, w0), (a1, b1, w1) = stage0, stage1
    return [
        StagePass.of_pass(a0 + a1, b0 + b1, a0, b1, w0 + w1, 2),
        StagePass.of_pass(a0 + a1, b0 + b1, a1, b0, w0 + w1, 2),
    ]


@pytest.mark.parametrize(("ends", "m"), [((0.1, 0.3), 4), ((0.25, 0.0), 4), ((0.0, 0.4), 4), ((0.1, 0.3), 8)])
def test_two_ranks_with_the_ends_on_either_stage_run_without_a_bubble(ends, m):
    """p 2, equal layers (a stage's forward 1, backward 2, W the forward's GEMMs, 1), the embedding adding e to stage 0
    and the head, loss and MTP h to stage 1 (forward and W; twice that backward). By hand
    (dualpipe.py step() at p 2, m 4: rank 0 runs F0(0) F1(2) F0(1) B1(2) | B0(0) after the pair's wait, F1(3)
    B0(0) B1(3) I0(1) W(1); rank 1 the mirror, micro-batches 2/3 for 0/1): every input is sent before its op is due,
    so neither rank idles and the order ends at the work of one rank, m / 2 (S0 + S1), S the stage's F + B, whatever
    the ends cost. Laid out as DualPipeV's V (before dualpipe13) rank 0 ran e + h on every op and rank 1 none: the
    makespan was at least m (S + e + h) for S the equal stage; now it is m (S + (e + h) / 2). The closed form's
    bubble 0 (ranks equal) and the order agree; a table read by the stage's index (chunk = stage // p, the V's rule)
    would run every op of rank 0 at stage 0's times and miss it."""
    e, h = ends
    stage0, stage1 = (1.0 + e, 2.0 + 2 * e, 1.0 + e), (1.0 + h, 2.0 + 2 * h, 1.0 + h)
    passes = _mirror_passes(stage0, stage1)
    sched = Schedule("dualpipe", 2, m, 2)
    work = m / 2 * (sum(stage0[:2]) + sum(stage1[:2]))
    assert pj.order_span(passes, sched) == pytest.approx(work, abs=1e-12)
    assert pipeline_time(passes, sched).time_s == pytest.approx(work, abs=1e-12)
    assert bubble_s(passes, sched) == pytest.approx(0.0, abs=1e-12)
    before = m * (3.0 + 3 * (e + h))  # the V: rank 0's every op the whole pass with both ends
    assert work == pytest.approx(m * (3.0 + 1.5 * (e + h)), abs=1e-12) and (e + h == 0 or work < before)
    # the independent dictionary event simulation (tests/planner/test_pipeline_orders.py) at each direction's stage
    first = [x.fill_s / (2 * x.forward_s) for x in passes]
    ranks = [(x.forward_s, x.backward_s, x.weight_s) for x in passes]
    assert event_makespan("dualpipe", 2, m, [1.0] * m, 0.0, 0.0, None, ranks, first) == pytest.approx(work, abs=1e-12)


def test_four_ranks_run_each_stage_on_its_own_rank_and_direction():
    """p 4, m 8, equal middle stages (forward 1, backward 2, W 1) and the ends on stages 0 (embedding e) and 3 (head
    h): the order's makespan is the event simulation's with rank r's direction-0 ops at stage r's times and its
    direction-1 ops at stage 3 - r's (to 1e-12), ranks 0 and 3 mirror images (the slowest: 3 + 1.5 (e + h) a
    micro-batch), and the whole is the slowest rank's m / 2 (S_0 + S_3) plus no more than the equal stages' bubble
    (here none: the middle ranks' slack absorbs the ends' fill), below the V layout's m (3 + 3 (e + h)), rank 0
    running e + h on every op."""
    e, h = 0.2, 0.5
    stages = [(1.0 + e, 2.0 + 2 * e, 1.0 + e), (1.0, 2.0, 1.0), (1.0, 2.0, 1.0), (1.0 + h, 2.0 + 2 * h, 1.0 + h)]
    passes = []
    for r in range(4):
        (a0, b0, w0), (a1, b1, w1) = stages[r], stages[3 - r]
        passes.append(StagePass.of_pass(a0 + a1, b0 + b1, a0, b1, w0 + w1, 2))
    sched = Schedule("dualpipe", 4, 8, 2)
    first = [x.fill_s / (2 * x.forward_s) for x in passes]
    ranks = [(x.forward_s, x.backward_s, x.weight_s) for x in passes]
    span = pj.order_span(passes, sched)
    assert span == pytest.approx(event_makespan("dualpipe", 4, 8, [1.0] * 8, 0.0, 0.0, None, ranks, first), abs=1e-12)
    equal = [StagePass(1.0, 2.0, weight_s=1.0, copies=2)] * 4
    slowest = 8 * passes[0].total_s  # ranks 0 and 3: 3 + 1.5 (e + h)
    assert passes[0].total_s == passes[3].total_s == pytest.approx(3.0 + 1.5 * (e + h))
    assert slowest - 1e-12 <= span <= slowest + bubble_s(equal, sched) and bubble_s(equal, sched) > 0
    assert span < 8 * (3.0 + 3 * (e + h))  # below rank 0 running both ends on every op


def test_the_stage_map_lays_each_stage_on_its_rank_and_its_mirror():
    """Llama 3 8B cut to 8 layers, pp 4: DualPipe's rank r holds stage r (chunk 0) and stage 3 - r (chunk 1), two
    layers each, the second copy's layers the same as the first's; ranks 0 and 3 each hold one embedding and one
    output layer (the loss). DualPipeV (the V of 8 chunks, one layer each) keeps both ends on rank 0."""
    model = model_preset("llama3-8b")
    par = ParallelSpec(pp=4, pipeline_schedule="dualpipe")
    assert par.schedule.stage_map is MIRRORED and par.chunks_per_rank == 2
    chunks = pipeline_chunks(par, 8)
    for r, (c0, c1) in enumerate(chunks):
        assert c0.layers == (2 * r, 2 * r + 1) and c1.layers == (2 * (3 - r), 2 * (3 - r) + 1)
        assert (c0.embedding, c1.embedding, c0.loss, c1.loss) == (r == 0, r == 3, r == 3, r == 0)
        assert rank_of(par, c0.index) == rank_of(par, c1.index) == r
    v = pipeline_chunks(ParallelSpec(pp=4, pipeline_schedule="dualpipev"), 8)
    assert [(any(c.embedding for c in r), any(c.loss for c in r)) for r in v] == [(True, True)] + [(False, False)] * 3
    work = WorkloadSpec(micro_batch_size=1, global_batch_size=16, seq_length=4096)
    ctx = Context(model, work, par)
    assert (ctx.passes, ctx.micro_batches) == (8, 16)  # a pass over both stages: one each way
    assert [ctx.is_first(r) for r in range(4)] == [ctx.is_last(r) for r in range(4)] == [True, False, False, True]
    assert schedule_traits("dualpipe").passes(16) == 8 and schedule_traits("dualpipev").passes(16) == 16


def test_the_layout_row_names_one_copy_and_plans_back_to_the_same_chunks():
    """The plan's Assumptions row writes the resolved split as a layout: for DualPipe one copy's pp stages (the second
    copy repeats them), which planned as ``pipeline_layout`` gives the same chunks; a 2·pp-stage layout (a V's) is
    refused naming the rule."""
    model = model_preset("llama3-8b")
    work = WorkloadSpec(micro_batch_size=1, global_batch_size=16, seq_length=4096)
    par = ParallelSpec(tp=2, pp=4, dp=1, pipeline_schedule="dualpipe", first_stage_layers=6, last_stage_layers=10)
    plan = build_plan(model, work, par, cluster_preset("dgx-h100", 1), Options(timeline=False))
    (row,) = [a.value for a in plan.assumptions if a.field == "parallel.pipeline_layout"]
    assert row == "Et*6|t*8|t*8|t*10L"
    again = replace(par, first_stage_layers=None, last_stage_layers=None, pipeline_layout=row)
    assert pipeline_chunks(again, 32) == pipeline_chunks(par, 32)
    v = ParallelSpec(tp=2, pp=4, dp=1, pipeline_schedule="dualpipe", pipeline_layout="Et*3|" + "t*4|" * 6 + "t")
    with pytest.raises(SpecError, match=r"the layout names one copy's 4 stages, got 8 \(a V of 8 chunks is dualpipev"):
        build_plan(model, work, v, cluster_preset("dgx-h100", 1), Options(timeline=False))


def test_the_ends_calls_split_over_ranks_0_and_pp_minus_1():
    """The embedding's and the output layer's TP calls run on ranks 0 and pp - 1, m / 2 times each (a micro-batch of
    each direction runs one of them), m in all, as DualPipeV's run m times on rank 0; the pipeline sends are each
    micro-batch once across each boundary (m / 2 a direction; dualpipe.py num_chunks // 2), half of DualPipeV's,
    whose micro-batches cross each boundary down and back up (as before dualpipe13: 8 of 16)."""
    model = model_preset("llama3-8b")
    work = WorkloadSpec(micro_batch_size=1, global_batch_size=16, seq_length=4096)
    calls = {}
    for kind in ("dualpipe", "dualpipev"):
        par = ParallelSpec(tp=2, pp=4, dp=1, pipeline_schedule=kind, sequence_parallel=True)
        plan = build_plan(model, work, par, cluster_preset("dgx-h100", 1), Options(timeline=False))
        calls[kind] = {(pc.call.name, pc.call.stages): pc.call.calls_per_iteration for pc in plan.calls}
    dual, v = calls["dualpipe"], calls["dualpipev"]
    for name in ("tp.embedding", "tp.lm_head.input"):
        assert dual[name, (0, 3)] == 8 and v[name, (0,)] == 16
    sends = {k: n for k, n in dual.items() if k[0].startswith("pp.")}
    assert sends and sends == {k: n // 2 for k, n in v.items() if k[0].startswith("pp.")}


def _ledger_by_rank(model, work, par) -> dict[str, tuple[int, int, bool]]:
    """Per call name, (calls, calls x message bytes) summed over the pipeline ranks, and whether it is a per-step call
    (the optimizer phase's, the data-parallel gradient reduction)."""
    from planner.rules import ledger

    out: dict[str, tuple[int, int, bool]] = {}
    for call in ledger(Context(model, work, par)):
        n, b, _ = out.get(call.name, (0, 0, False))
        times = len(call.stages) * call.calls_per_iteration
        step = call.phase == "optimizer" or call.name.split(".")[0] in ("dp", "edp")
        out[call.name] = (n + times, b + times * call.message_bytes, step)
    return out


@pytest.mark.parametrize(
    ("preset", "extra"),
    [("mixtral-8x7b", {"tp": 2, "ep": 4, "dp": 4}), ("deepseek-v3", {"tp": 2, "cp": 2, "ep": 4, "dp": 2})],
)
def test_the_ledger_counts_every_micro_batch_call_as_1f1b_does(preset, extra):
    """mend13a (review r13a #5, #7): a DualPipe rank runs m / 2 passes over its two stages, one micro-batch each way;
    summed over the pipeline ranks every per-micro-batch call (TP, CP, EP, the embedding's, the head's, the loss's,
    the MTP's, the sends and the batch broadcasts, the attention mask among them: Megatron's get_batch_on_this_tp_rank
    broadcasts it for each micro-batch a rank runs at an end, m on each of ranks 0 and pp - 1 under both schedules)
    issues as many calls of as many bytes as 1F1B's of the same model (8 layers, pp 4, m 32); the per-step calls (the
    DP reduction, the optimizer's) carry both of a rank's stages, twice 1F1B's bytes over the ranks (a scalar such as
    the gradient norm's the same). Left to the two
    copies' gradient sum (dualpipe13b): the MTP's shared-embedding reduction, which 1F1B runs between its first and
    last rank and DualPipe's ranks 0 and pp - 1 each hold both ends of."""
    model = replace(model_preset(preset), num_layers=8)
    work = WorkloadSpec(micro_batch_size=1, global_batch_size=32 * extra["dp"], seq_length=4096)
    one = _ledger_by_rank(model, work, ParallelSpec(pp=4, pipeline_schedule="1f1b", **extra))
    dual = _ledger_by_rank(model, work, ParallelSpec(pp=4, pipeline_schedule="dualpipe", **extra))
    assert one["tp.data.attention_mask"] == (2 * 32, 2 * 32 * 4096 * 4096, False)  # m on rank 0, m on rank 3
    assert sum(not step for *_, step in one.values()) > 20
    assert dual["dp.grads"][1] == 2 * one["dp.grads"][1]  # both stages' gradients on every rank
    for name, (calls, nbytes, step) in one.items():
        if name == "embedding.tied_grads":
            continue
        if step:  # a rank's two stages' bytes (its gradients) or one scalar as before (the gradient norm's)
            assert dual[name][1] in (nbytes, 2 * nbytes), name
        else:
            assert dual[name] == (calls, nbytes, False), name


@pytest.mark.parametrize(("p", "m"), [(2, 4), (4, 8), (4, 20), (8, 16), (8, 32), (16, 64)])
def test_activations_in_flight_are_the_orders_peak(p, m):
    """mend13a (review r13a #1): counting DualPipe's own order (pipeline._order_dual, dualpipe.py 3da1bbe step(): a
    forward adds a micro-batch of its chunk, a full or input-gradient backward frees one), rank r holds at its peak
    pp - r micro-batches of stage r and r + 1 of stage pp - 1 - r, each chunk's own peak at the total's: what
    in_flight_chunks says, in the rank's chunk order; PP + 1 in all (the DualPipe README)."""
    import numpy as np

    from planner.pipeline import OP_B, OP_F, OP_F_LATE, OP_I, _order_dual, in_flight, in_flight_chunks

    sched = Schedule("dualpipe", p, m, 2)
    for r in range(p):
        kind, _, stage = _order_dual(sched, r)
        chunk = MIRRORED.op_chunk(np.full(len(stage), r), stage, p)
        step = np.isin(kind, (OP_F, OP_F_LATE)).astype(int) - np.isin(kind, (OP_B, OP_I)).astype(int)
        held = [np.cumsum(step * (chunk == c)) for c in (0, 1)]
        peak = int(np.argmax(held[0] + held[1]))
        assert (held[0][peak], held[1][peak]) == (held[0].max(), held[1].max()) == (p - r, r + 1)
        assert in_flight_chunks(sched, r) == (p - r, r + 1)
        assert sum(in_flight_chunks(sched, r)) == 2 * in_flight(sched, r) == p + 1
