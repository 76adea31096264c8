"""Packed documents (workload.document_lengths; issue 21 item 5, mtp8): attention causal within each document, as
Megatron's packed THD batches run it (cu_seqlens) and as Megatron-LM d98e8a6 training.py
num_floating_point_operations counts it (sum of L_i² for the core attention). Closed forms on Llama3-8B at s 8,192
packing documents of 4,096, 2,048 and 2,048 tokens."""

from __future__ import annotations

from dataclasses import replace

import pytest

from planner import ParallelSpec, SpecError, WorkloadSpec, model_preset
from planner.compute import model_flops_per_token
from planner.context import Context
from planner.kernels import attention_flops, causal_keys, document_keys, flops_keys
from planner.parallel import validate_parallel

LLAMA = model_preset("llama3-8b")
DOCS = (4096, 2048, 2048)


def ctx(docs=DOCS, cp=1, **par) -> Context:
    work = WorkloadSpec(micro_batch_size=1, global_batch_size=8, seq_length=8192, document_lengths=docs)
    return Context(LLAMA, work, ParallelSpec(tp=1, pp=1, dp=8 // cp, cp=cp, **par))


def test_mean_keys_per_query_by_hand():
    """sum_i L_i (L_i + 1)/2 / s = (4,096 x 4,097 / 2 + 2 x 2,048 x 2,049 / 2) / 8,192 = 12,587,008 / 8,192 = 1,536.5
    keys a query, against (8,192 + 1)/2 = 4,096.5 for one document; a window of 1,024 clips each document alike."""
    counted = WorkloadSpec(document_lengths=DOCS).document_histogram  # ((2048, 2), (4096, 1))
    assert document_keys(counted, None) == 12_587_008 / 8192 == 1536.5
    assert causal_keys(8192, None) == 4096.5
    w = 1024
    per_doc = [(w * (w + 1) / 2 + (n - w) * w) for n in DOCS]  # causal_keys(n, w) x n
    assert document_keys(counted, w) == pytest.approx(sum(per_doc) / 8192)


def test_attention_work_and_model_flops_follow_the_documents():
    """The core attention's forward FLOPs scale by 1,536.5 / 4,096.5; MFU's attention term counts sum(L_i²)/s =
    (4,096² + 2 x 2,048²) / 8,192 = 3,072 keys a token instead of 8,192 (12·L·H·Q·T: 12 x 32 x 32 x 128 x 5,120 =
    80,530,636,800 FLOPs a token fewer), the linear layers' 6N unchanged."""
    one, packed = ctx(docs=None), ctx()
    assert attention_flops(packed) / attention_flops(one) == pytest.approx(1536.5 / 4096.5, rel=1e-12)
    assert flops_keys(one) == 8192 and flops_keys(packed) == 3072
    assert model_flops_per_token(one) - model_flops_per_token(packed) == pytest.approx(12 * 32 * 32 * 128 * 5120)
    # a single document of the whole sequence is the plain causal sequence
    whole = ctx(docs=(8192,))
    assert attention_flops(whole) == attention_flops(one) and flops_keys(whole) == 8192


def test_cp_ranks_split_each_document_so_every_rank_does_the_same():
    """TE splits each packed document in 2·cp chunks (rank r: chunks r and 2cp-1-r): every rank's queries average the
    documents' keys, so a rank's attention is 1/cp of the whole."""
    assert attention_flops(ctx(cp=2)) == pytest.approx(attention_flops(ctx()) / 2, rel=1e-12)


@pytest.mark.parametrize(
    ("docs", "cp", "par", "words"),
    [
        ((4096, 2048), 1, {}, "the 2 documents hold 6144 tokens but the sequence is 8192"),
        ((4096, 2046, 2050), 2, {}, "2 documents (first 2046) are not multiples of 2*cp = 4"),
        (DOCS, 2, {"framework": "torch", "cp_load_balance": False}, "framework 'torch' and cp 2 are not modelled"),
        ((8192, 0), 1, {}, "lengths >= 1"),
    ],
)
def test_refusals_name_the_field_and_the_numbers(docs, cp, par, words):
    c = ctx(docs=docs, cp=cp, **par)
    with pytest.raises(SpecError) as e:
        from planner.workload import validate_workload

        validate_workload(c.work)
        validate_parallel(c.par, c.model, c.work, 8)
    assert e.value.field == "workload.document_lengths" and words in str(e.value), str(e.value)


def test_an_mtp_model_counts_its_mtp_attention_with_the_documents():
    """MTP layers join the layers in the count (num_floating_point_operations), so their attention term follows the
    documents too: (32 + 1) x 12 x 32 x 128 x (8,192 - 3,072) fewer FLOPs a token."""
    work = WorkloadSpec(micro_batch_size=1, global_batch_size=8, seq_length=8192)
    par = ParallelSpec(tp=1, pp=1, dp=8)
    mtp = replace(LLAMA, mtp_layers=1)
    plain = Context(mtp, work, par)
    packed = Context(mtp, replace(work, document_lengths=DOCS), par)
    diff = model_flops_per_token(plain) - model_flops_per_token(packed)
    assert diff == pytest.approx(33 * 12 * 32 * 128 * 5120)
