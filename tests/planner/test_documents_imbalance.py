"""Document imbalance across micro-batches (issue 21, fp8a9; planner/documents.py): with workload.document_packing
"dp_balanced" the documents (drawn from workload.document_lengths) are packed next-fit into sequences as Megatron-LM
d98e8a6 data_schedule.py DpBalancedScheduler packs them, and the step waits for the slowest micro-batch: the
pipeline (p - 1)·sigma·E[max of m], the data-parallel ranks sigma·sqrt(m)·E[max of dp]."""

from __future__ import annotations

import math

import pytest

from collectives.topology import cluster_preset
from planner import ParallelSpec, SpecError, WorkloadSpec, build_plan, model_preset
from planner.context import Context
from planner.documents import PackMoments, document_wait_s, expected_max, micro_batch_sigma, pack_moments


def test_pack_moments_by_hand():
    """Lengths 1 and 2, equally likely, packs of 2 tokens. A pack opened by a 1: a second 1 fits (T 2, W 1 + 1 = 2,
    then any document opens the next: 1/4 each), a 2 does not (T 1, W 1, the 2 opens the next: 1/2); opened by a 2:
    T 2, W 3, the next uniform. First documents: P(1 -> 1) = 1/4, P(2 -> 1) = 1/2, stationary pi = (2/5, 3/5).
    E[T] = 0.4·1.5 + 0.6·2 = 1.8, E[W] = 0.4·1.5 + 0.6·3 = 2.4, E[T²] = 0.4·2.5 + 0.6·4 = 3.4 (Var 0.16),
    E[W²] = 0.4·2.5 + 0.6·9 = 6.4 (Var 0.64), E[TW] = 0.4·2.5 + 0.6·6 = 4.6 (Cov 0.28)."""
    got = pack_moments((1, 2), 2)
    want = (1.8, 2.4, 0.16, 0.64, 0.28)
    assert (got.tokens, got.pairs, got.var_tokens, got.var_pairs, got.cov) == pytest.approx(want, abs=1e-12)


def test_documents_that_fill_every_pack_alike_have_no_variance():
    """Every document 2,048 tokens in 8,192-token packs: four a pack, W = 4 x 2,048·2,049/2, no spread."""
    got = pack_moments((2048,), 8192)
    assert (got.tokens, got.pairs) == (8192, 4 * 2048 * 2049 / 2)
    assert got.var_tokens == pytest.approx(0, abs=1e-6) and got.var_pairs == pytest.approx(0, abs=1e-3)


def test_expected_max_of_normals():
    """E[max of 2] = 1/sqrt(pi), of 3 = 3/(2 sqrt(pi)) (closed forms); of 1, 0."""
    assert expected_max(1) == 0.0
    assert expected_max(2) == pytest.approx(1 / math.sqrt(math.pi), abs=1e-12)
    assert expected_max(3) == pytest.approx(1.5 / math.sqrt(math.pi), abs=1e-12)


def test_micro_batch_sigma_by_hand():
    """t = a·T + c·W with a = 3 / 1.8, c = 1 / 2.4: Var = a²·0.16 + c²·0.64 + 2ac·0.28; two packs a micro-batch
    halve the variance."""
    m = PackMoments(1.8, 2.4, 0.16, 0.64, 0.28)
    a, c = 3 / 1.8, 1 / 2.4
    var = a * a * 0.16 + c * c * 0.64 + 2 * a * c * 0.28
    assert micro_batch_sigma(m, 1, 3.0, 1.0) == pytest.approx(math.sqrt(var))
    assert micro_batch_sigma(m, 2, 3.0, 1.0) == pytest.approx(math.sqrt(var / 2))


LLAMA = model_preset("llama3-8b")
DOCS = (4096, 2048, 2048)


def _plan(packing, pp=4, dp=2):
    w = WorkloadSpec(micro_batch_size=1, global_batch_size=32, seq_length=8192, document_lengths=DOCS,
                     document_packing=packing)  # fmt: skip
    par = ParallelSpec(tp=1, pp=pp, dp=dp)
    return Context(LLAMA, w, par), build_plan(LLAMA, w, par, cluster_preset("dgx-h100", 1)).step


@pytest.mark.parametrize(("pp", "dp"), [(4, 2), (1, 8), (8, 1)])
def test_the_step_waits_for_the_slowest_micro_batch(pp, dp):
    """The step grows by (p - 1)·sigma·E[max of m] + sigma·sqrt(m)·E[max of dp] over the busiest stage's mean
    micro-batch, all else equal: pp 1 the ranks' term alone, dp 1 the bubble's alone."""
    _, fixed = _plan(None, pp, dp)
    ctx, packed = _plan("dp_balanced", pp, dp)
    comp = max((st.compute for st in packed.stages), key=lambda c: c.forward.total_s + c.backward.total_s)
    attn = comp.forward.attention_s + comp.backward.attention_s
    lin = comp.forward.total_s + comp.backward.total_s - attn
    sigma = micro_batch_sigma(pack_moments(DOCS, 8192), 1, lin, attn)
    m = ctx.micro_batches
    want = (pp - 1) * sigma * expected_max(m) + sigma * math.sqrt(m) * expected_max(dp)
    assert want > 0
    assert document_wait_s(ctx, lin, attn) == pytest.approx(want)
    assert packed.time_s - fixed.time_s == pytest.approx(want, rel=1e-9)
    assert packed.compute_s == fixed.compute_s


def test_refusals_name_the_field():
    with pytest.raises(SpecError) as e:
        pack_moments((4096, 16384), 8192)
    assert e.value.field == "workload.document_lengths" and "16384 tokens does not fit" in str(e.value)
    with pytest.raises(SpecError) as e:
        pack_moments(tuple(range(1, 2000)), 131072)
    assert e.value.field == "workload.document_lengths" and "coarser histogram" in str(e.value)
