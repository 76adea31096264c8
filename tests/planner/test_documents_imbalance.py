"""Document imbalance across micro-batches (issue 21, fp8a9; planner/documents.py): with workload.document_packing
"dp_balanced" the documents (drawn from workload.document_lengths) are packed next-fit into sequences as Megatron-LM
d98e8a6 data_schedule.py DpBalancedScheduler packs them, and the step waits for the slowest micro-batch: the
schedule's own order over the micro-batches' times (planner/pipeline_jitter.py, docwait10) and the slowest of the dp
replicas, sigma·(mean + sd·E[max of dp]); with pp 1 sigma·sqrt(m)·E[max of dp]."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from collectives.topology import cluster_preset
from planner import ParallelSpec, SpecError, WorkloadSpec, build_plan, model_preset
from planner.context import Context
from planner.documents import PackMoments, document_wait_s, expected_max, micro_batch_sigma, pack_moments
from planner.pipeline import Schedule
from planner.pipeline_jitter import jitter
from planner.step import schedule_of


def test_pack_moments_by_hand():
    """Lengths 1 and 2, equally likely, packs of 2 tokens. A pack opened by a 1: a second 1 fits (T 2, W 1 + 1 = 2,
    then any document opens the next: 1/4 each), a 2 does not (T 1, W 1, the 2 opens the next: 1/2); opened by a 2:
    T 2, W 3, the next uniform. First documents: P(1 -> 1) = 1/4, P(2 -> 1) = 1/2, stationary pi = (2/5, 3/5).
    E[T] = 0.4·1.5 + 0.6·2 = 1.8, E[W] = 0.4·1.5 + 0.6·3 = 2.4, E[T²] = 0.4·2.5 + 0.6·4 = 3.4 (Var 0.16),
    E[W²] = 0.4·2.5 + 0.6·9 = 6.4 (Var 0.64), E[TW] = 0.4·2.5 + 0.6·6 = 4.6 (Cov 0.28)."""
    got = pack_moments(((1, 1), (2, 1)), 2)
    want = (1.8, 2.4, 0.16, 0.64, 0.28)
    assert (got.tokens, got.pairs, got.var_tokens, got.var_pairs, got.cov) == pytest.approx(want, abs=1e-12)


def test_documents_that_fill_every_pack_alike_have_no_variance():
    """Every document 2,048 tokens in 8,192-token packs: four a pack, W = 4 x 2,048·2,049/2, no spread."""
    got = pack_moments(((2048, 1),), 8192)
    assert (got.tokens, got.pairs) == (8192, 4 * 2048 * 2049 / 2)
    assert got.var_tokens == pytest.approx(0, abs=1e-6) and got.var_pairs == pytest.approx(0, abs=1e-3)


def test_expected_max_of_normals():
    """E[max of 2] = 1/sqrt(pi), of 3 = 3/(2 sqrt(pi)) (closed forms); of 1, 0."""
    assert expected_max(1) == 0.0
    assert expected_max(2) == pytest.approx(1 / math.sqrt(math.pi), abs=1e-12)
    assert expected_max(3) == pytest.approx(1.5 / math.sqrt(math.pi), abs=1e-12)


def test_micro_batch_sigma_by_hand():
    """The pack of test_pack_moments_by_hand priced at s = 2 tokens (E[T] 1.8): a = 3 / 2 a token, c = 1·1.8 /
    (2·2.4) = 0.375 a pair, Var = 1.5²·0.16 + 0.375²·0.64 + 2·1.5·0.375·0.28 = 0.36 + 0.09 + 0.315 = 0.765 (the
    review's finding 2: scaling by E[T], E[W] gave 0.944); two packs a micro-batch halve the variance."""
    m = PackMoments(1.8, 2.4, 0.16, 0.64, 0.28)
    assert micro_batch_sigma(m, 1, 2, 3.0, 1.0) == pytest.approx(math.sqrt(0.765), rel=1e-12)
    assert micro_batch_sigma(m, 2, 2, 3.0, 1.0) == pytest.approx(math.sqrt(0.765 / 2), rel=1e-12)


def test_packs_are_priced_at_the_sequence_not_their_mean():
    """Full packs (every document 2,048 in 8,192-token packs, so E[T] = s) keep the old and new scaling equal;
    {4096, 2048, 2048} at 8,192 packs E[T] < s tokens, and sigma is (E[T]/s) of the scaling by the means."""
    m = pack_moments(WorkloadSpec(document_lengths=DOCS).document_histogram, 8192)
    assert m.tokens < 8192
    a, c = 3.0 / m.tokens, 1.0 / m.pairs  # the scaling by the pack's means, which the review found
    by_means = math.sqrt(a * a * m.var_tokens + c * c * m.var_pairs + 2 * a * c * m.cov)
    assert micro_batch_sigma(m, 1, 8192, 3.0, 1.0) == pytest.approx(by_means * m.tokens / 8192, rel=1e-12)


def test_the_histogram_is_counted_once_per_spec():
    """WorkloadSpec.document_histogram: (length, count) by length, the same object on every read (pack_moments'
    key hashes the distinct lengths, not the corpus)."""
    w = WorkloadSpec(document_lengths=(2048, 4096, 2048, 1024))
    assert w.document_histogram == ((1024, 1), (2048, 2), (4096, 1))
    assert w.document_histogram is w.document_histogram
    assert WorkloadSpec().document_histogram is None
    assert w == WorkloadSpec(document_lengths=(2048, 4096, 2048, 1024))  # the cache is no field


LLAMA = model_preset("llama3-8b")
DOCS = (4096, 2048, 2048)


def _plan(packing, pp=4, dp=2, schedule="1f1b", v=1):
    w = WorkloadSpec(micro_batch_size=1, global_batch_size=32, seq_length=8192, document_lengths=DOCS,
                     document_packing=packing)  # fmt: skip
    par = ParallelSpec(tp=1, pp=pp, dp=dp, pipeline_schedule=schedule, virtual_pipeline_stages=v)
    return Context(LLAMA, w, par), build_plan(LLAMA, w, par, cluster_preset("dgx-h100", 1)).step


def _stage(step):
    """The busiest stage's passes (forward, backward), its token work and its core attention, as step.py reads them."""
    comp = max((st.compute for st in step.stages), key=lambda c: c.forward.total_s + c.backward.total_s)
    attn = comp.forward.attention_s + comp.backward.attention_s
    host = comp.forward.host_s + comp.backward.host_s
    return (
        (comp.forward.total_s, comp.backward.total_s),
        comp.forward.total_s + comp.backward.total_s - attn - host,
        attn,
    )


@pytest.mark.parametrize(
    ("pp", "dp", "schedule", "v"), [(4, 2, "1f1b", 1), (1, 8, "1f1b", 1), (8, 1, "1f1b", 1), (4, 2, "interleaved", 2)]
)
def test_the_step_waits_for_the_slowest_micro_batch(pp, dp, schedule, v):
    """The step grows by sigma·(mean + sd·E[max of dp]) of the schedule's order over the busiest stage's mean
    micro-batch, all else equal: pp 1 the replicas' sigma·sqrt(m)·E[max of dp] alone, dp 1 the order's mean alone."""
    _, fixed = _plan(None, pp, dp, schedule, v)
    ctx, packed = _plan("dp_balanced", pp, dp, schedule, v)
    (f, b), lin, attn = _stage(packed)
    sigma = micro_batch_sigma(pack_moments(ctx.work.document_histogram, 8192), 1, 8192, lin, attn)
    m = ctx.micro_batches
    got = jitter(Schedule(schedule, pp, m, v), f / (f + b), sigma / (f + b))
    want = sigma * (got.mean + got.sd * expected_max(dp))
    if pp == 1:
        assert want == pytest.approx(sigma * math.sqrt(m) * expected_max(dp), rel=1e-12)
    assert want > 0
    assert document_wait_s(ctx, schedule_of(ctx), (f, b), lin, attn) == pytest.approx(want, rel=1e-12)
    assert packed.time_s - fixed.time_s == pytest.approx(want, rel=1e-9)
    assert packed.compute_s == fixed.compute_s


def test_1f1b_waits_twice_the_flow_shop_and_interleaved_less():
    """Llama3-8B, pp 8, dp 1 (m 32), rho about 0.11: 1F1B's order waits 2.7 times the flow shop's (p - 1)·sigma·E[max
    of m] (its steady state has no slack), the interleaved order (v 2) 0.44 of it (docs/step-time.md's table: 2.7x
    and 0.45x at p 8, m 32, rho 0.1)."""
    for schedule, v, low, high in (("1f1b", 1, 2.4, 3.0), ("interleaved", 2, 0.3, 0.55)):
        _, fixed = _plan(None, 8, 1, schedule, v)
        ctx, packed = _plan("dp_balanced", 8, 1, schedule, v)
        _, lin, attn = _stage(packed)
        sigma = micro_batch_sigma(pack_moments(ctx.work.document_histogram, 8192), 1, 8192, lin, attn)
        flow = 7 * sigma * expected_max(ctx.micro_batches)
        assert low < (packed.time_s - fixed.time_s) / flow < high, schedule


def test_gpipe_keeps_the_flow_shop():
    """GPipe (the flow shop exactly, tests/planner/test_pipeline_jitter.py): sigma·((p - 1)·E[max of m] + sqrt(m)·E[max
    of dp]), the form before docwait10."""
    _, fixed = _plan(None, 4, 2, "gpipe")
    ctx, packed = _plan("dp_balanced", 4, 2, "gpipe")
    (f, b), lin, attn = _stage(packed)
    sigma = micro_batch_sigma(pack_moments(ctx.work.document_histogram, 8192), 1, 8192, lin, attn)
    m = ctx.micro_batches
    want = 3 * sigma * expected_max(m) + sigma * math.sqrt(m) * expected_max(2)
    assert document_wait_s(ctx, schedule_of(ctx), (f, b), lin, attn) == pytest.approx(want, rel=1e-12)
    assert packed.time_s - fixed.time_s == pytest.approx(want, rel=1e-9)


@pytest.mark.parametrize(("schedule", "v"), [("zb-h1", 1), ("zbv", 2), ("dualpipev", 2)])
def test_zero_bubble_orders_wait_by_their_own_order(schedule, v):
    """ZB-H1, ZBV and DualPipeV (sched11): sigma·(mean + sd·E[max of dp]) of the schedule's own order, the weight
    gradient the busiest stage's forward GEMM time (its share omega: step.stage_passes' W), not the flow shop's."""
    _, fixed = _plan(None, 4, 2, schedule, v)
    ctx, packed = _plan("dp_balanced", 4, 2, schedule, v)
    (f, b), lin, attn = _stage(packed)
    comp = max((st.compute for st in packed.stages), key=lambda c: c.forward.total_s + c.backward.total_s)
    weight = comp.forward.gemm_s
    sigma = micro_batch_sigma(pack_moments(ctx.work.document_histogram, 8192), 1, 8192, lin, attn)
    m = ctx.micro_batches
    got = jitter(Schedule(schedule, 4, m, v), f / (f + b), sigma / (f + b), weight / (f + b))
    want = sigma * (got.mean + got.sd * expected_max(2))
    flow = 3 * sigma * expected_max(m) + sigma * math.sqrt(m) * expected_max(2)
    assert 0 < weight < f and abs(want - flow) > 0.05 * flow
    assert document_wait_s(ctx, schedule_of(ctx), (f, b), lin, attn, weight) == pytest.approx(want, rel=1e-12)
    assert packed.time_s - fixed.time_s == pytest.approx(want, rel=1e-9)


def test_refusals_name_the_field():
    with pytest.raises(SpecError) as e:
        pack_moments(((4096, 1), (16384, 1)), 8192)
    assert e.value.field == "workload.document_lengths" and "16384 tokens does not fit" in str(e.value)
    with pytest.raises(SpecError) as e:
        pack_moments(tuple((n, 1) for n in range(1, 2000)), 131072)
    assert e.value.field == "workload.document_lengths" and "coarser histogram" in str(e.value)


def test_the_host_wait_is_not_token_work():
    """Qwen3-30B-A3B in FP8 (tensorwise) with EP 8: the GPU waits for the host about 0.09 s a pass (the count sync's
    queue, planner/host.py), which does not grow with a pack's tokens: the wait prices the token work only, the
    stage's passes less attention and host_s (the review's finding 3)."""
    model = model_preset("qwen3-30b-a3b")
    docs = (2048, 1024, 512, 512)
    w = WorkloadSpec(micro_batch_size=1, global_batch_size=64, seq_length=4096, activation_dtype="fp8",
                     fp8_recipe="tensorwise", document_lengths=docs, document_packing="dp_balanced")  # fmt: skip
    par = ParallelSpec(tp=1, pp=2, dp=8, ep=8)
    cluster = cluster_preset("dgx-h100", 2)
    packed = build_plan(model, w, par, cluster).step
    fixed = build_plan(model, replace(w, document_packing=None), par, cluster).step
    comp = max((st.compute for st in packed.stages), key=lambda c: c.forward.total_s + c.backward.total_s)
    host = comp.forward.host_s + comp.backward.host_s
    attn = comp.forward.attention_s + comp.backward.attention_s
    assert host > 0.3 * (comp.forward.total_s + comp.backward.total_s)
    lin = comp.forward.total_s + comp.backward.total_s - attn - host
    ctx = Context(model, w, par)
    wait = document_wait_s(ctx, schedule_of(ctx), (comp.forward.total_s, comp.backward.total_s), lin, attn)
    assert packed.time_s - fixed.time_s == pytest.approx(wait, rel=1e-9)
