"""TransformerEngine's userbuffers run each GEMM they overlap as chunks (bias14; kernels.userbuffers_split,
step._split_gemms). TE v1.8 (3ec998e96c) pytorch/csrc/comm_gemm_overlap.h and v2.9 (70f536662a)
common/comm_gemm_overlap/comm_gemm_overlap.cpp: the ring-exchange all-gathers (qkv_fprop, fc1_fprop, proj_dgrad,
fc2_dgrad) run one te_gemm per TP rank's shard of the rows, the pipelined reduce-scatters (proj_fprop, fc2_fprop)
num_splits = 4 te_gemms of a quarter of the output columns each, over min(_NUM_MAX_UB_STREAMS = 3, chunks) compute
streams; the bulk overlaps one whole GEMM. The chunks time as streamed_gemm_time's waves (TE's multi-stream GEMMs'
one home): a wave of concurrent GEMMs is one grouped GEMM over their rows."""

from __future__ import annotations

from dataclasses import replace

import pytest

from collectives.topology import cluster_preset
from planner import Options, Overlap, ParallelSpec, WorkloadSpec, build_plan, model_preset
from planner.context import Context
from planner.kernels import (
    EFFICIENCY,
    USERBUFFERS_PIPELINE_GEMMS,
    USERBUFFERS_PIPELINE_SPLITS,
    USERBUFFERS_RING_GEMMS,
    USERBUFFERS_STREAMS,
    gemm_time,
    layer_kernels,
    userbuffers_chunks_s,
    userbuffers_split,
)
from planner.spread import paced_gpu

GPU = cluster_preset("dgx-h100", 1).gpu
LLAMA = model_preset("llama3-70b")
WORK = WorkloadSpec(micro_batch_size=1, global_batch_size=16, seq_length=4096)
PAR = ParallelSpec(tp=8, dp=2, zero_stage=1, sequence_parallel=True)


def test_the_source_counts():
    """initialize_ub's default methods and counts (TE v1.8 / v2.9 pytorch/module/base.py)."""
    assert USERBUFFERS_RING_GEMMS == ("qkv", "fc1", "attn_out.dgrad", "fc2.dgrad")
    assert USERBUFFERS_PIPELINE_GEMMS == ("attn_out", "fc2")
    assert (USERBUFFERS_PIPELINE_SPLITS, USERBUFFERS_STREAMS) == (4, 3)


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_a_ring_exchange_gemm(tp):
    """tp shards of m rows over min(3, tp) streams: waves of 3 concurrent GEMMs (one grouped GEMM each), the rest
    in a last wave; less the whole GEMM. tp 2: one wave of 2; tp 4: 3 + 1; tp 8: 3 + 3 + 2."""
    m, n, k = 8192.0, 1280.0, 8192.0
    waves = {2: (2,), 4: (3, 1), 8: (3, 3, 2)}[tp]
    chunks = sum(gemm_time((m / tp,) * w, n, k, "bf16", GPU, EFFICIENCY) for w in waves)
    whole = gemm_time((m,), n, k, "bf16", GPU, EFFICIENCY)
    got = userbuffers_chunks_s(m, n, k, "bf16", tp, True, GPU, EFFICIENCY)
    assert got == pytest.approx(chunks - whole, rel=1e-12)
    if tp == 2:  # one wave of two 4,096-row shards: the whole GEMM's 128-row tiles, one fixed cost: nothing more
        assert got == 0.0
    else:  # a second wave pays its own fixed cost and fill
        assert got > 0


def test_a_pipelined_gemm():
    """4 column blocks of n/4 over 3 streams: a wave of 3 and one of 1."""
    m, n, k = 8192.0, 8192.0, 3584.0
    chunks = gemm_time((m,) * 3, n / 4, k, "fp8", GPU, EFFICIENCY) + gemm_time((m,), n / 4, k, "fp8", GPU, EFFICIENCY)
    got = userbuffers_chunks_s(m, n, k, "fp8", 4, False, GPU, EFFICIENCY)
    assert got == pytest.approx(chunks - gemm_time((m,), n, k, "fp8", GPU, EFFICIENCY), rel=1e-12)


def test_the_layer():
    """Llama-3 70B, tp 8, one layer and micro-batch: the forward's qkv and fc1 (tp row shards) and attn_out and fc2
    (4 column blocks); the backward's attn_out and fc2 data gradients ((m x n)(n x k): output k wide, reduced over
    n) in tp row shards; the bulk GEMMs (qkv, fc1 dgrad, every wgrad) add nothing."""
    ctx = Context(LLAMA, WORK, PAR)
    lk = layer_kernels(ctx, False, GPU)
    shapes = {k.name: k for k in (*lk.forward, *lk.backward) if k.kind == "gemm"}

    def chunked(name, chunks, by_rows):
        m, n, kk, _ = shapes[name].shape
        if name.endswith(".dgrad"):
            n, kk = kk, n
        return userbuffers_chunks_s(m, n, kk, shapes[name].dtype, chunks, by_rows, GPU, EFFICIENCY)

    fwd = chunked("qkv", 8, True) + chunked("fc1", 8, True) + chunked("attn_out", 4, False) + chunked("fc2", 4, False)
    bwd = chunked("attn_out.dgrad", 8, True) + chunked("fc2.dgrad", 8, True)
    f, mem, b = userbuffers_split(ctx, False, GPU)
    assert (f, mem, b) == pytest.approx((fwd, 0.0, bwd), rel=1e-12)
    # 8,192 x 8,192 x 1,024 attn_out in 4 blocks of 2,048 columns, 4,096-token shards of 8 ... all slower in pieces
    assert f > 0 and b > 0
    assert userbuffers_split(Context(LLAMA, WORK, replace(PAR, tp=1, sequence_parallel=False)), False, GPU) == (
        0.0,
        0.0,
        0.0,
    )


def test_the_step_carries_it():
    """With --tp-comm-overlap, every layer's passes carry the chunks' extra GEMM time: the stage's forward GEMMs grow
    by layers x the forward's extra, its backward's by layers x the backward's (no recompute here). The chunks time on
    the part that sets the 16 GPUs' pace (spread15/mend15f: spread.paced_gpu), as the step times them."""
    cluster = cluster_preset("dgx-h100", 2)
    off = build_plan(LLAMA, WORK, PAR, cluster).step.stages[0].compute
    on = build_plan(LLAMA, WORK, PAR, cluster, Options(overlap=Overlap(tp_comm_overlap=True))).step.stages[0].compute
    ctx = Context(LLAMA, WORK, PAR)
    f, _, b = userbuffers_split(ctx, False, paced_gpu(ctx, cluster.gpu))
    layers = LLAMA.num_layers
    assert on.forward.gemm_s - off.forward.gemm_s == pytest.approx(layers * f, rel=1e-9)
    assert on.backward.gemm_s - off.backward.gemm_s == pytest.approx(layers * b, rel=1e-9)
