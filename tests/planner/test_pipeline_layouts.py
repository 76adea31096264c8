"""Pipeline layouts as Megatron-Core and torch.distributed.pipelining write them, zero-bubble and DualPipe
schedules (issue 21 items 1, 2, 4): the chunks, the p2p per chunk boundary, the bubble and the memory."""

import itertools
from dataclasses import replace

import pytest

from collectives.topology import cluster_preset
from planner import Options, ParallelSpec, SpecError, WorkloadSpec, build_plan
from planner.context import Context
from planner.parallel import LAYER_CHARS, format_layout, parse_layout, pipeline_chunks, validate_parallel
from planner.pipeline import Schedule, StagePass, in_flight, in_flight_chunks, pipeline_time, timeline
from planner.presets import MODEL_PRESETS, model_preset

META_405B = "E|(t|)*126,L"  # Dubey et al. 2024 §3.3.2: PP16, v = 8, embedding and loss each a chunk


def meta_405b(**par):
    values = dict(tp=8, pp=16, dp=128, zero_stage=1, sequence_parallel=True, pipeline_schedule="interleaved")
    return build_plan(
        model_preset("llama3-405b"),
        WorkloadSpec(micro_batch_size=1, global_batch_size=2048),
        ParallelSpec(**(values | par)),
        cluster_preset("dgx-h100", 2048),
        Options(),
    )


# ---- the layout ------------------------------------------------------------------------------------------


def test_megatron_layout_strings_unroll_as_megatron_does():
    # pipeline_parallel_layer_layout.py's own example: "Ettt|(tt|)*29,m|L" -> [[E,t,t,t]] + [[t,t]]*29 + [[m],[L]]
    stages = parse_layout("Et*3|(tt|)*29,m|L")
    assert stages == (("E", "t", "t", "t"), *[("t", "t")] * 29, ("m",), ("L",))
    assert parse_layout([["embedding", "decoder"], ["decoder", "loss"]]) == (("E", "t"), ("t", "L"))


ROUND_TRIPS = [  # (model preset, parallel): even splits, interleaved, V-shaped, uneven first/last, a layout, MTP
    *((name, dict(pp=2 if m.num_layers % 2 == 0 else 1)) for name, m in MODEL_PRESETS.items()),
    ("llama3-405b", dict(pp=16, pipeline_schedule="interleaved", pipeline_layout=META_405B)),
    ("llama3-70b", dict(pp=4, pipeline_schedule="interleaved", virtual_pipeline_stages=5)),
    ("llama3-70b", dict(pp=4, first_stage_layers=17, last_stage_layers=19)),
    ("llama3-70b", dict(pp=4, pipeline_schedule="zbv")),
    ("deepseek-v3", dict(pp=8, pipeline_schedule="interleaved", pipeline_layout="Et*3|(tt|)*29,m|L")),
    ("llama3-8b", dict(pp=2, pipeline_layout="Et*15|t*17L")),
]


@pytest.mark.parametrize(("preset", "par"), ROUND_TRIPS)
def test_format_layout_is_parse_layouts_inverse(preset, par):
    """The Assumptions row writes the resolved split (format_layout) and parse_layout reads the same chunks back:
    each chunk's characters in Megatron's order, from LAYER_CHARS (one home for the syntax), runs folded."""
    model = MODEL_PRESETS[preset]
    spec = ParallelSpec(**par)
    chunks = sorted((c for rank in pipeline_chunks(spec, model.num_layers, model.mtp_layers) for c in rank),
                    key=lambda c: c.index)  # fmt: skip
    char = {name: c for c, name in LAYER_CHARS.items()}
    want = tuple(
        (char["embedding"],) * c.embedding + (char["decoder"],) * len(c.layers) + (char["mtp"],) * c.mtp
        + (char["loss"],) * c.loss
        for c in chunks
    )  # fmt: skip
    text = format_layout(chunks)
    assert parse_layout(text) == want, text
    assert sum(len(c.layers) for c in chunks) == model.num_layers and len(want) == len(chunks)


def test_meta_405b_layout_three_ways():
    """126 layers over PP16 with v = 8: 128 one-slot chunks, rank 0's first holds only the embedding and
    rank 15's last only the output layer and loss (Llama 3 §3.3.2)."""
    layout = ParallelSpec(pp=16, pipeline_schedule="interleaved", pipeline_layout=META_405B)
    chunks = pipeline_chunks(layout, 126)
    assert layout.chunks_per_rank == 8
    assert chunks[0][0].embedding and chunks[0][0].layers == ()
    assert chunks[15][-1].loss and chunks[15][-1].layers == ()
    assert [len(c.layers) for c in chunks[0]] == [0] + [1] * 7
    assert [len(c.layers) for c in chunks[7]] == [1] * 8
    assert chunks[1][0].layers == (0,) and chunks[0][1].layers == (15,)  # virtual stage 16 = rank 0's chunk 1
    accounted = ParallelSpec(
        pp=16,
        pipeline_schedule="interleaved",
        virtual_pipeline_stages=8,
        account_for_embedding_in_pipeline_split=True,
        account_for_loss_in_pipeline_split=True,
    )
    assert pipeline_chunks(accounted, 126) == chunks
    listed = replace(layout, pipeline_layout=(("E",), *[("t",)] * 126, ("L",)))
    assert pipeline_chunks(listed, 126) == chunks


@pytest.mark.parametrize(("pp", "v"), [(8, 8), (16, 4)])
def test_other_published_405b_layouts_are_accepted(pp, v):
    """PP8 VP8 and PP16 VP4 of 126 layers were 'not divisible': 126 + embedding + loss = 128 slots."""
    par = ParallelSpec(
        tp=8,
        pp=pp,
        dp=16384 // (8 * pp),
        pipeline_schedule="interleaved",
        virtual_pipeline_stages=v,
        account_for_embedding_in_pipeline_split=True,
        account_for_loss_in_pipeline_split=True,
    )
    work = WorkloadSpec(micro_batch_size=1, global_batch_size=16384 // (8 * pp) * pp)
    validate_parallel(par, model_preset("llama3-405b"), work, 16384)
    counts = [len(c.layers) for chunks in pipeline_chunks(par, 126) for c in chunks]
    assert sum(counts) == 126 and sorted(set(counts)) == [128 // (pp * v) - 1, 128 // (pp * v)]


def test_deepseek_v3_61_layers_with_virtual_stages():
    """61 layers cannot split evenly into 16 chunks (PP4 VP4): an explicit layout can."""
    model = model_preset("deepseek-v3")
    par = ParallelSpec(pp=4, pipeline_schedule="interleaved", virtual_pipeline_stages=4)
    with pytest.raises(SpecError, match="num_layers 61 is not divisible by pp\\*virtual_pipeline_stages = 4\\*4 = 16"):
        pipeline_chunks(par, 61)
    par = replace(par, pipeline_layout="Et*3|(t*4|)*14,t*2mL")  # the MTP module with the loss
    chunks = pipeline_chunks(par, 61, 1)
    assert [len(c.layers) for c in chunks[0]] == [3, 4, 4, 4]
    assert [len(c.layers) for c in chunks[3]] == [4, 4, 4, 2] and chunks[3][-1].mtp == 1
    ctx = Context(model, WorkloadSpec(), par)
    # 58 MoE layers (the first 3 dense ones on rank 0's first chunk) and, training, the MTP block (an MoE
    # layer, index 61) on the last chunk
    assert sum(ctx.moe_layers(s) for s in range(4)) == 59 and ctx.stage_layers[3][-1] == 61
    assert ctx.moe_layers(0) == 12 and ctx.dense_layers(0) == 3


def test_first_and_last_stage_layers_with_virtual_stages():
    """Megatron splits each stage's layers evenly over its v chunks (get_transformer_layer_offset)."""
    par = ParallelSpec(
        pp=4, pipeline_schedule="interleaved", virtual_pipeline_stages=2, first_stage_layers=6, last_stage_layers=6
    )
    chunks = pipeline_chunks(par, 32)
    assert [[len(c.layers) for c in r] for r in chunks] == [[3, 3], [5, 5], [5, 5], [3, 3]]
    assert chunks[0][1].layers == (16, 17, 18)  # virtual stage 4 starts after 3 + 5 + 5 + 3
    with pytest.raises(SpecError, match="first stage: 7 must be divisible by the 2 chunks per rank"):
        pipeline_chunks(replace(par, first_stage_layers=7, last_stage_layers=5), 32)


def test_torch_split_points():
    par = ParallelSpec(pp=4, framework="torch", pipeline_split_points=(7, 16, 25))
    chunks = pipeline_chunks(par, 32)
    assert [c[0].layers for c in chunks] == [
        tuple(range(0, 7)),
        tuple(range(7, 16)),
        tuple(range(16, 25)),
        tuple(range(25, 32)),
    ]
    with pytest.raises(SpecError, match=r"split points \[7, 7, 25\] must rise strictly inside 1..31"):
        pipeline_chunks(replace(par, pipeline_split_points=(7, 7, 25)), 32)


def test_v_schedules_fold_the_model():
    """ZBV and DualPipeV: rank r holds virtual stages r and 2p - 1 - r; the loss sits on rank 0."""
    ctx = Context(model_preset("llama3-8b"), WorkloadSpec(), ParallelSpec(pp=4, pipeline_schedule="zbv"))
    assert [c.index for c in ctx.chunks[0]] == [0, 7] and [c.index for c in ctx.chunks[3]] == [3, 4]
    assert ctx.stage_layers[0] == [0, 1, 2, 3, 28, 29, 30, 31]
    assert ctx.is_first(0) and ctx.is_last(0) and not ctx.is_last(3)


@pytest.mark.parametrize(
    ("par", "field", "words"),
    [
        (
            dict(pipeline_layout="E|(t|)*125,|L"),
            "parallel.pipeline_layout",
            "hold 125 decoder layers (t) but the model has 126",
        ),
        (dict(pipeline_layout="E|(t|)*126"), "parallel.pipeline_layout", "the loss (L) last, once each; got 1 E, 0 L"),
        (
            dict(pipeline_layout="E|(t|)*126,L|"),
            "parallel.pipeline_layout",
            "129 virtual stages do not divide over pp 16",
        ),
        (dict(pipeline_layout="E|(t|)*125,tm|L"), "parallel.pipeline_layout", "the model has 0"),
        (dict(pipeline_layout="E|(x|)*126,L"), "parallel.pipeline_layout", "has 'x'"),
        (dict(pipeline_layout="E|(t|)*99999999,L"), "parallel.pipeline_layout", "unrolls to more than"),
        (
            dict(pipeline_schedule="1f1b", pipeline_layout=META_405B),
            "parallel.pipeline_layout",
            "set pipeline_schedule to interleaved",
        ),
        (
            dict(virtual_pipeline_stages=4, pipeline_layout=META_405B),
            "parallel.virtual_pipeline_stages",
            "the layout has 8 chunks per rank",
        ),
    ],
)
def test_layouts_that_do_not_cover_the_layers(par, field, words):
    base = dict(tp=8, pp=16, dp=128, pipeline_schedule="interleaved")
    with pytest.raises(SpecError) as err:
        validate_parallel(
            ParallelSpec(**(base | par)), model_preset("llama3-405b"), WorkloadSpec(global_batch_size=2048), 16384
        )
    assert err.value.field == field and words in err.value.rule


@pytest.mark.parametrize(
    ("pp", "gbs", "field", "words"),
    [
        (3, 96, "parallel.pp", "DualPipe needs an even pp (dualpipe.py: assert num_ranks % 2 == 0), got pp 3"),
        (4, 6 * 4, "workload.global_batch_size", "needs an even number of micro-batches >= 2*pp = 8 (dualpipe.py"),
    ],
)
def test_dualpipe_needs_even_pp_and_enough_micro_batches(pp, gbs, field, words):
    par = ParallelSpec(pp=pp, dp=4, pipeline_schedule="dualpipe")
    with pytest.raises(SpecError) as err:
        validate_parallel(par, model_preset("llama3-8b"), WorkloadSpec(global_batch_size=gbs), 4 * pp)
    assert err.value.field == field and words in err.value.rule


# ---- the ledger: p2p per chunk boundary ------------------------------------------------------------------


def test_p2p_per_chunk_boundary_in_an_uneven_interleaved_layout():
    """Hand-checked: Llama-3 8B (h 4096, s 8192), b 1, bf16, no TP: every boundary carries 1·8192·4096·2 =
    67,108,864 bytes. PP2 with v = 3 and uneven chunks "Et|t*7|t*6|t*6|t*5|t*7L": rank 0 holds virtual
    stages 0, 2, 4 and sends forward from each (3 per micro-batch) and backward from 2 and 4 (2); rank 1
    holds 1, 3, 5 and sends forward from 1 and 3 (5 is the last: 2) and backward from all three (3)."""
    par = ParallelSpec(pp=2, dp=4, pipeline_schedule="interleaved", pipeline_layout="Et|t*7|t*6|t*6|t*5|t*7L")
    plan = build_plan(
        model_preset("llama3-8b"),
        WorkloadSpec(micro_batch_size=1, global_batch_size=32),  # m = 32 / 4 = 8
        par,
        cluster_preset("dgx-h100", 1),
        Options(),
    )
    pp = [pc.call for pc in plan.calls if pc.call.parallelism == "pp"]
    assert {c.message_bytes for c in pp} == {67_108_864}
    sent = {(c.name, c.stages): c.calls_per_iteration for c in pp}
    assert sent == {
        ("pp.activation", (0,)): 3 * 8,
        ("pp.activation", (1,)): 2 * 8,
        ("pp.activation_grad", (0,)): 2 * 8,
        ("pp.activation_grad", (1,)): 3 * 8,
    }
    groups = {(c.name, c.stages): c.group.pairs for c in pp}
    assert groups[("pp.activation", (0,))] == "pp+1" and groups[("pp.activation_grad", (0,))] == "pp-1"


def test_v_and_dualpipe_boundaries():
    """ZBV: the V's turn on the last rank is local; DualPipe sends each micro-batch once per rank, half of
    them each way (dualpipe.py: num_chunks // 2 per direction)."""
    work = WorkloadSpec(micro_batch_size=1, global_batch_size=16)
    cluster = cluster_preset("dgx-h100", 1)
    model = model_preset("llama3-8b")

    def sends(schedule):
        plan = build_plan(model, work, ParallelSpec(pp=4, dp=2, pipeline_schedule=schedule), cluster, Options())
        out: dict = {}
        for pc in plan.calls:
            c = pc.call
            if c.name == "pp.activation":
                for stage in c.stages:  # rows of equal price merge their stages
                    out.setdefault(stage, {})[c.group.pairs] = c.calls_per_iteration
        return out

    m = 8
    assert sends("zbv") == {0: {"pp+1": m}, 1: {"pp+1": m, "pp-1": m}, 2: {"pp+1": m, "pp-1": m}, 3: {"pp-1": m}}
    assert sends("dualpipe") == {
        0: {"pp+1": m // 2},
        1: {"pp+1": m // 2, "pp-1": m // 2},
        2: {"pp+1": m // 2, "pp-1": m // 2},
        3: {"pp-1": m // 2},
    }


def test_no_tied_embedding_all_reduce_when_one_rank_holds_both_ends():
    model = replace(model_preset("llama3-8b"), tied_embeddings=True)
    work = WorkloadSpec(micro_batch_size=1, global_batch_size=16)
    cluster = cluster_preset("dgx-h100", 1)
    names = {
        s: {
            pc.call.name for pc in build_plan(model, work, ParallelSpec(pp=4, dp=2, pipeline_schedule=s), cluster).calls
        }
        for s in ("1f1b", "zbv")
    }
    assert "embedding.tied_grads" in names["1f1b"] and "embedding.tied_grads" not in names["zbv"]


# ---- the schedules in closed form --------------------------------------------------------------------------

P, M, F, B, W = 8, 32, 1.0, 2.0, 1.0  # B the full backward (input and weight gradients), W its weight part


@pytest.mark.parametrize(
    ("kind", "bubble"),
    [
        ("1f1b", (P - 1) * (F + B)),  # Narayanan et al. SC'21
        ("zb-h1", (P - 1) * (F + B - 2 * W)),  # DualPipe README table, ZB1P; Qi et al. 2024 §3.1
        ("dualpipe", (P / 2 - 1) * ((F + B) + B - 3 * W)),  # DualPipe README table, F&B = F + B (its order's at thirds)
        ("dualpipev", (P - 1) * ((F + B) + B - 3 * W) / 2),  # DualPipe on 2·pp half-size stages
        # T_F = T_B = T_W (B the input gradient alone): the sail-sg README table's zero bubble is not what torch's
        # ScheduleZBVZeroBubble order reaches: its last rank waits p - 1 chunk forwards (sched11, bubble11)
        ("zbv", (P - 1) * F / 2),
    ],
)
def test_schedule_bubbles(kind, bubble):
    chunks = 2 if kind in ("zbv", "dualpipev", "dualpipe") else 1
    t = pipeline_time([StagePass(F, B, weight_s=W)] * P, Schedule(kind, P, M, chunks))
    assert t.time_s == pytest.approx(M * (F + B) + bubble)
    events = timeline([StagePass(F, B, weight_s=W)] * P, Schedule(kind, P, M, chunks))
    assert max(e["end_s"] for e in events) <= t.time_s + 1e-9
    for s in range(P):
        mine = sorted((e for e in events if e["stage"] == s), key=lambda e: e["start_s"])
        assert all(b["start_s"] >= a["end_s"] - 1e-9 for a, b in itertools.pairwise(mine))


def test_uneven_chunks_set_the_fill_and_drain():
    """An embedding-only first chunk fills for free; the bubble is the real chunks', not 1/v of the stage."""
    p, m, v = 4, 8, 2
    even = [StagePass(2.0, 4.0)] * p
    passes = [StagePass(2.0, 4.0, fill_s=0.0, drain_s=2.0)] + [StagePass(2.0, 4.0, fill_s=1.0, drain_s=2.0)] * (p - 1)
    sched = Schedule("interleaved", p, m, v)
    assert pipeline_time(even, sched).time_s == pytest.approx(m * 6 + (p - 1) * 6 / v)
    # the slowest rank is rank 0 (the first of the equals): the others add fill + drain = 3 each
    assert pipeline_time(passes, sched).time_s == pytest.approx(m * 6 + (p - 1) * 3.0)


def test_chunks_in_flight_follow_megatrons_order():
    """Interleaved p 4, v 2, m 8, stage 0: warm-up (4-0-1)·2 + (2-1)·4 = 10, so 11 chunk forwards are in
    flight, forward k running chunk (k // 4) % 2: chunk 0 seven times, chunk 1 four times."""
    sched = Schedule("interleaved", 4, 8, 2)
    assert in_flight_chunks(sched, 0) == (7.0, 4.0)
    assert sum(in_flight_chunks(sched, 0)) / 2 == in_flight(sched, 0)
    assert in_flight(Schedule("zb-h1", 4, 8), 0) == 4  # 1F1B's
    # PP + 1 stages' activations: 2.5 of the rank's two whole stages, each chunk a stage holding 2.5 (dualpipe13)
    assert (
        in_flight(Schedule("dualpipe", 4, 8, 2), 1) == 2.5
        and sum(in_flight_chunks(Schedule("dualpipe", 4, 8, 2), 1)) == 5
    )
    assert in_flight(Schedule("dualpipev", 4, 8, 2), 1) == 4.5  # 2·PP + 1 half-stages


# ---- Llama 3 405B as Meta ran it ---------------------------------------------------------------------------


def test_meta_405b_runs_interleaved_and_uneven():
    """TP8 CP1 PP16 DP128 on 16,384 H100s, 16M-token batches, interleaved with the embedding and the loss as
    chunks. Dubey et al. 2024 Table 4 reports 38-43% BF16 MFU (41% for this row); this model gives 46.5%
    (its kernels run a little faster than Meta's did), and the 1F1B layout without interleaving 27.6%."""
    plan = meta_405b(pipeline_layout=META_405B)
    assert 0.40 <= plan.step.mfu <= 0.50
    one_f_one_b = meta_405b(pipeline_schedule="1f1b", first_stage_layers=7, last_stage_layers=7)
    assert one_f_one_b.step.mfu < 0.30
    # the memory follows the chunks: rank 15 holds m = 16 micro-batches of its seven 1-layer chunks (its
    # loss-only chunk holds no layer activations, only the final norm's input, one [s, b, h] row / tp 8 for
    # the one micro-batch in flight there: pipeline.in_flight_chunks; the output layer's input, another, goes
    # with the logits); rank 1 all 16 of its eight (warm-up 2·14 + 7·16 + 1 = 141 chunk forwards, capped at
    # m·v = 128: with m = p Megatron runs every forward first)
    acts = {s.stage: s.activations_bytes for s in plan.memory.per_stage}
    ctx = Context(model_preset("llama3-405b"), WorkloadSpec(micro_batch_size=1, global_batch_size=2048), ParallelSpec())
    logits = 4 * 8192 * (ctx.model.padded_vocab(8) // 8)
    head = 2 * 8192 * 16384 * 2 // 8
    assert (acts[15] - logits - head) / 112 == pytest.approx(acts[1] / 128, rel=1e-6)
