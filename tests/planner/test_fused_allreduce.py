"""TensorRT-LLM's fused all-reduce + residual + RMSNorm (planner/serving/fused_allreduce.py): its strategy choice
against allreduceOp.cpp and customAllReduceUtils.h, the one-shot and two-shot kernels' bytes, and the absorbed
kernels leaving the step, by hand."""

from __future__ import annotations

import pytest

from collectives.topology import cluster_preset
from planner import MODEL_PRESETS
from planner.kernels import layer_kernels
from planner.serving import Pool, ServeOptions, engine
from planner.serving.deployment import _context, _step, _worker
from planner.serving.fused_allreduce import (
    NCCL,
    NORM_QUANT_FP8,
    ONESHOT,
    TABLE,
    TWOSHOT,
    FusedAllReduce,
    workspace_bytes,
)

AR = FusedAllReduce("test")
LLAMA70B = MODEL_PRESETS["llama3-70b"]
NODE = cluster_preset("dgx-h100", 1)


@pytest.mark.parametrize(("tokens", "hidden", "tp", "sm", "expected"), [
    (16, 8192, 8, 90, ONESHOT),  # SM90 TP8 hidden 8192: ONESHOT up to 32 tokens ...
    (32, 8192, 8, 90, ONESHOT),
    (33, 8192, 8, 90, ONESHOT),  # floor(log2(33)) = 5: the 32-token entry
    (64, 8192, 8, 90, NCCL),  # ... then NCCL (0)
    (128, 8192, 8, 100, ONESHOT),  # SM100's table keeps ONESHOT to 128 tokens there
    (256, 8192, 8, 100, TWOSHOT),
    (512, 4096, 4, 90, TWOSHOT),  # SM90 TP4 hidden 4096, 512 tokens: 5
    (16, 4096, 2, 90, TWOSHOT),  # SM90 TP2 hidden 4096, 16 tokens: 5
    (512, 8192, 2, 90, ONESHOT),
    (16, 16384, 8, 90, NCCL),  # hidden 16384 is outside the table: NCCL_SYMMETRIC
    (16, 8192, 16, 90, NCCL),  # tp 16 is outside the table
])  # fmt: skip
def test_strategy_is_tensorrt_llms_table(tokens, hidden, tp, sm, expected):
    assert AR.strategy(tokens, hidden, tp, tokens * hidden * 2, sm, True) == expected


def test_the_table_is_the_sources_shape():
    """customAllReduceUtils.h: per fusion op and SM, 3 TP sizes x 7 hidden sizes (128 .. 8192) x 15 token counts
    (1 .. 16384); the FP8-quantizing op's own slice differs (SM90 TP2 hidden 8192, 4 tokens: TWOSHOT)."""
    for op in TABLE.values():
        for sm in (90, 100):
            assert sorted(op[sm]) == [2, 4, 8]
            assert all(len(rows) == 7 and all(len(r) == 15 and set(r) <= {0, 4, 5} for r in rows)
                       for rows in op[sm].values())  # fmt: skip
    assert AR.strategy(4, 8192, 2, 4 * 8192 * 2, 90, True) == ONESHOT
    assert AR.strategy(4, 8192, 2, 4 * 8192 * 2, 90, True, NORM_QUANT_FP8) == TWOSHOT


def test_workspace_and_nvlink_send_it_to_nccl():
    """selectImplementation: a message over the workspace (16e6 bytes at tp <= 2, 8e6 above) or a TP group without
    NVLink P2P (across nodes) is NCCL whatever the table says."""
    assert workspace_bytes(2) == 16_000_000 and workspace_bytes(8) == 8_000_000
    assert AR.strategy(16, 8192, 8, 8_000_001, 90, True) == NCCL
    assert AR.strategy(16, 8192, 8, 8_000_000, 90, True) == ONESHOT
    assert AR.strategy(16, 8192, 8, 16 * 8192 * 2, 90, False) == NCCL
    # 1,024 tokens at TP2 hidden 8192: 16,777,216 bytes > 16e6 (the table's entry would be NCCL too)
    assert AR.strategy(1024, 8192, 2, 1024 * 8192 * 2, 90, True) == NCCL


def _rows(name: str, tp: int, batch: int, cluster=NODE):
    w = _worker(LLAMA70B, cluster, engine(name), Pool(tp=tp), 0)
    plan = _step(LLAMA70B, w, ServeOptions(), "decode", batch, 1000)
    return plan, {pc.call.name: pc for pc in plan.calls}, w


def test_one_shot_moves_tp_minus_one_copies_and_absorbs_the_kernels():
    """Llama-3 70B TP8 decode of 16 sequences: M = 16 x 8192 x 2 = 262,144 bytes per block output; one-shot sends
    every peer the whole M: 7 M = 1,835,008 bytes out of each rank, one step. vLLM's step is the same plan with
    NCCL's rows and all the layer's kernels; TensorRT-LLM's differs by exactly the rows' price change and the
    absorbed kernels: 80 layers x (2 residual adds + the pre-MLP norm) + 79 input norms (80 fused MLP outputs
    apply 79 input norms and the final norm, which the planner does not charge)."""
    trt, trt_rows, w = _rows("trtllm", 8, 16)
    vllm, vllm_rows, _ = _rows("vllm", 8, 16)
    delta = 0.0
    for block in ("tp.attn.out_proj", "tp.mlp.down_proj"):
        row = trt_rows[block]
        assert row.call.message_bytes == 16 * 8192 * 2 == 262_144
        assert row.price.algorithm == "trtllm_oneshot" and row.price.steps == 1
        assert row.price.bytes_sent_per_rank == 7 * 262_144 == 1_835_008
        assert "strategy ONESHOT" in row.call.source
        assert row.price.time_s < vllm_rows[block].price.time_s
        delta += 80 * (row.price.time_s - vllm_rows[block].price.time_s)
    ctx = _context(LLAMA70B, ServeOptions(), "decode", 16, 1000, w.decode_par, w)
    k = {kn.name: kn.time_s for kn in layer_kernels(ctx, False, NODE.gpu).forward}
    absorbed = 80 * (2 * k["residual_add"] + k["pre_mlp_norm"]) + 79 * k["input_norm"]
    assert absorbed > 0
    assert trt.step.compute_s == pytest.approx(vllm.step.compute_s - absorbed, rel=1e-12)
    assert trt.step.time_s == pytest.approx(vllm.step.time_s + delta - absorbed, rel=1e-12)
    assert trt.step.stages[0].exposed_by_stream[("tp", "forward")] == pytest.approx(
        vllm.step.stages[0].exposed_by_stream[("tp", "forward")] + delta, rel=1e-12
    )


def test_two_shot_is_a_reduce_scatter_and_an_all_gather_over_nvlink():
    """Llama-3 70B TP4 on H100 (SM90, hidden 8192): the table's TWOSHOT at 256 tokens; 2 x (4 - 1) / 4 x M bytes out
    of each rank in two steps (M = 256 x 8192 x 2 = 4,194,304, under the 8e6 workspace)."""
    _, rows, _ = _rows("trtllm", 4, 256)
    row = rows["tp.mlp.down_proj"]
    m = 256 * 8192 * 2
    assert row.call.message_bytes == m
    assert row.price.algorithm == "trtllm_twoshot" and row.price.steps == 2
    assert row.price.bytes_sent_per_rank == 2 * 3 * (m // 4)


def test_small_llamas_do_not_fuse():
    """modeling_llama.py: enable_fusion &= hidden_size > 4096. Llama-3 8B (hidden 4096) on TP2 keeps the plain
    all-reduce and its add and norm kernels: the same step as vLLM's."""
    llama8b = MODEL_PRESETS["llama3-8b"]
    steps = []
    for name in ("trtllm", "vllm"):
        w = _worker(llama8b, NODE, engine(name), Pool(tp=2), 0)
        steps.append(_step(llama8b, w, ServeOptions(), "decode", 16, 1000))
    trt, vllm = steps
    assert trt.step.time_s == vllm.step.time_s
    row = {pc.call.name: pc for pc in trt.calls}["tp.mlp.down_proj"]
    assert "AllReduceFusionOp" not in row.call.source and not row.price.algorithm.startswith("trtllm")


def test_nccl_strategy_keeps_the_plan():
    """At 64 sequences on TP8 (hidden 8192) TensorRT-LLM runs NCCL and then the add and norm: same step as vLLM's."""
    trt, trt_rows, _ = _rows("trtllm", 8, 64)
    vllm, _, _ = _rows("vllm", 8, 64)
    assert "strategy NCCL" in trt_rows["tp.attn.out_proj"].call.source
    assert trt.step.time_s == vllm.step.time_s and trt.step.compute_s == vllm.step.compute_s


def test_nvlink_peers_only_inside_one_nvlink_domain():
    """allreduceOp.cpp: a TP group across nodes has no P2P (mIsP2PSupported = false): NCCL. TP8 on one DGX H100
    shares its NVSwitch; TP16 over two nodes does not."""
    from planner import ParallelSpec
    from planner.serving.fused_allreduce import nvlink_peers

    assert nvlink_peers(ParallelSpec(tp=8), NODE)
    assert nvlink_peers(ParallelSpec(tp=4, dp=2), NODE)
    assert not nvlink_peers(ParallelSpec(tp=16), cluster_preset("dgx-h100", 2))
