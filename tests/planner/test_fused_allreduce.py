"""TensorRT-LLM's fused all-reduce + residual + RMSNorm (planner/serving/fused_allreduce.py): its strategy choice
against allreduceOp.cpp and customAllReduceUtils.h, the one-shot and two-shot kernels' bytes, and the absorbed
kernels leaving the step, by hand."""

from __future__ import annotations

from dataclasses import replace

import pytest

from collectives.topology import cluster_preset
from planner import MODEL_PRESETS
from planner.kernels import layer_kernels
from planner.serving import Pool, ServeOptions, engine
from planner.serving.deployment import _context, _step, _worker
from planner.serving.fused_allreduce import (
    MULTIMEM,
    NCCL,
    NONE,
    NORM,
    NORM_QUANT_FP8,
    ONESHOT,
    SYMM_TWOSHOT,
    TABLE,
    TWOSHOT,
    FusedAllReduce,
    workspace_bytes,
)

AR = FusedAllReduce("test")
LLAMA70B = MODEL_PRESETS["llama3-70b"]
NODE = cluster_preset("dgx-h100", 1)
# TensorRT-LLM without its own all-reduce: every TP all-reduce NCCL's, the layer's kernels all there
NCCL_ONLY = replace(engine("trtllm"), tp_allreduce=None)


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
    w = _worker(LLAMA70B, cluster, NCCL_ONLY if name == "nccl" else engine(name), Pool(tp=tp), 0)
    plan = _step(LLAMA70B, w, ServeOptions(), "decode", batch, 1000)
    return plan, {pc.call.name: pc for pc in plan.calls}, w


def test_one_shot_moves_tp_minus_one_copies_and_absorbs_the_kernels():
    """Llama-3 70B TP8 decode of 16 sequences: M = 16 x 8192 x 2 = 262,144 bytes per block output; one-shot sends
    every peer the whole M: 7 M = 1,835,008 bytes out of each rank, one step. Against the same plan with NCCL's rows
    and all the layer's kernels, TensorRT-LLM's differs by exactly the rows' price change and the
    absorbed kernels: 80 layers x (2 residual adds + the pre-MLP norm) + 80 norms (80 fused MLP outputs apply 79
    input norms and the final norm, which the planner charges as an input norm: kernels.final_norm_kernels)."""
    trt, trt_rows, w = _rows("trtllm", 8, 16)
    vllm, vllm_rows, _ = _rows("nccl", 8, 16)
    delta = 0.0
    for block in ("tp.attn.out_proj", "tp.mlp.down_proj"):
        row = trt_rows[block]
        assert row.call.message_bytes == 16 * 8192 * 2 == 262_144
        assert row.price.algorithm == "trtllm_oneshot" and row.price.steps == 1
        assert row.price.bytes_sent_per_rank == 7 * 262_144 == 1_835_008
        assert "strategy ONESHOT" in row.call.source
        assert row.price.time_s < vllm_rows[block].price.time_s
        delta += 80 * (row.price.time_s - vllm_rows[block].price.time_s)
    # the vocab-parallel embedding's all-reduce (once a step) runs the same op unfused: the Fusion=NONE slice's
    # ONESHOT at 16 tokens, hidden 8192, TP8 on SM90; the same bytes as a block output, the same one-shot price
    emb = trt_rows["tp.embedding"]
    assert emb.price.algorithm == "trtllm_oneshot" and "embedding.py" in emb.call.source
    assert emb.price.time_s == trt_rows["tp.attn.out_proj"].price.time_s
    delta += emb.price.time_s - vllm_rows["tp.embedding"].price.time_s
    ctx = _context(LLAMA70B, ServeOptions(), "decode", 16, 1000, w.decode_par, w)
    k = {kn.name: kn.time_s for kn in layer_kernels(ctx, False, NODE.gpu).forward}
    absorbed = 80 * (2 * k["residual_add"] + k["pre_mlp_norm"]) + 80 * k["input_norm"]
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
    """modeling_llama.py: enable_fusion &= hidden_size > 4096. Llama-3 8B (hidden 4096) on TP2 keeps its add and
    norm kernels (the same compute as NCCL's), but its block outputs still go through TensorRT-LLM's AllReduce op,
    the row-parallel Linear's own (AllReduceFusionOp::NONE, strategy AUTO: ops.py AllReduce.forward ->
    allreduceOp.cpp): the Fusion=NONE slice at hidden 4096, TP2, 16 tokens on SM90 is ONESHOT. The step differs from
    NCCL's by exactly the rows' price change."""
    llama8b = MODEL_PRESETS["llama3-8b"]
    steps = []
    for traits in (engine("trtllm"), NCCL_ONLY):
        w = _worker(llama8b, NODE, traits, Pool(tp=2), 0)
        steps.append(_step(llama8b, w, ServeOptions(), "decode", 16, 1000))
    trt, vllm = steps
    assert AR.strategy(16, 4096, 2, 16 * 4096 * 2, 90, True, NONE) == ONESHOT
    assert trt.step.compute_s == vllm.step.compute_s
    rows = {pc.call.name: pc for pc in trt.calls}
    nccl = {pc.call.name: pc for pc in vllm.calls}
    delta = 0.0
    for name in ("tp.attn.out_proj", "tp.mlp.down_proj", "tp.embedding"):
        row = rows[name]
        assert "AllReduceFusionOp::NONE" in row.call.source and row.price.algorithm == "trtllm_oneshot"
        assert row.price.time_s < nccl[name].price.time_s
        delta += row.call.calls_per_iteration * (row.price.time_s - nccl[name].price.time_s)
    assert rows["tp.mlp.down_proj"].call.calls_per_iteration == 32
    assert trt.step.time_s == pytest.approx(vllm.step.time_s + delta, rel=1e-12)


def test_embedding_all_reduce_reads_the_unfused_table():
    """The Fusion=NONE slice (customAllReduceUtils.h) differs from RESIDUAL_RMS_NORM's: at hidden 8192 on TP2 SM90
    the plain all-reduce runs TWOSHOT at 4 tokens where the fused one runs ONESHOT; past 2,048 tokens both are
    NCCL; the workspace and NVLink rules hold for it as for the fused op."""
    assert AR.strategy(4, 8192, 2, 4 * 8192 * 2, 90, True, NONE) == TWOSHOT
    assert AR.strategy(4, 8192, 2, 4 * 8192 * 2, 90, True, NORM) == ONESHOT
    assert AR.strategy(8, 8192, 8, 8 * 8192 * 2, 100, True, NONE) == ONESHOT
    assert AR.strategy(4096, 1024, 8, 4096 * 1024 * 2, 90, True, NONE) == NCCL
    assert AR.strategy(1, 8192, 8, 8 * 8192 * 2, 90, False, NONE) == NCCL


def test_nccl_strategy_keeps_the_plan():
    """At 64 sequences on TP8 (hidden 8192) TensorRT-LLM runs NCCL and then the add and norm for the block outputs:
    same compute as NCCL's plan; only the embedding's plain all-reduce moves (Fusion=NONE: TWOSHOT there)."""
    trt, trt_rows, _ = _rows("trtllm", 8, 64)
    vllm, vllm_rows, _ = _rows("nccl", 8, 64)
    assert "strategy NCCL" in trt_rows["tp.attn.out_proj"].call.source
    assert trt_rows["tp.attn.out_proj"].price == vllm_rows["tp.attn.out_proj"].price
    emb = trt_rows["tp.embedding"]
    assert emb.price.algorithm == "trtllm_twoshot"
    delta = emb.price.time_s - vllm_rows["tp.embedding"].price.time_s
    assert trt.step.time_s == pytest.approx(vllm.step.time_s + delta, rel=1e-12)
    assert trt.step.compute_s == vllm.step.compute_s


def test_nvlink_peers_only_inside_one_nvlink_domain():
    """allreduceOp.cpp: a TP group across nodes has no P2P (mIsP2PSupported = false): NCCL. TP8 on one DGX H100
    shares its NVSwitch; TP16 over two nodes does not."""
    from planner import ParallelSpec
    from planner.serving.fused_allreduce import nvlink_peers

    assert nvlink_peers(ParallelSpec(tp=8), NODE)
    assert nvlink_peers(ParallelSpec(tp=4, dp=2), NODE)
    assert not nvlink_peers(ParallelSpec(tp=16), cluster_preset("dgx-h100", 2))


# ---- vLLM's and SGLang's custom all-reduce (CustomAllReduce) ---------------------------------------------------

VLLM_AR, SGLANG_AR = engine("vllm").tp_allreduce, engine("sglang").tp_allreduce
KIB, MIB = 1024, 1024 * 1024


@pytest.mark.parametrize(("nbytes", "tp", "sm", "multicast", "expected"), [
    # H100 (SM 9.0) with NVLS multicast: vLLM's symmetric memory is up, so the custom all-reduce stops at
    # CUSTOM_ALL_REDUCE_MAX_SIZES["9.0"][8] = 256 KiB (strictly below: should_custom_ar inp_size < max_size), where
    # the kernel is 1-stage (tp <= 8 under 256 KiB); symm mem multimem (tp 8 in _WORLD_SIZES_MULTIMEM["9.0"]) to
    # 64 MiB; pynccl above
    (256 * KIB - 16, 8, 90, True, ONESHOT),
    (256 * KIB, 8, 90, True, MULTIMEM),
    (64 * MIB, 8, 90, True, MULTIMEM),
    (64 * MIB + 16, 8, 90, True, NCCL),
    # tp 4: the custom cap is min(32 MiB, 8 MiB); 1-stage under 512 KiB, 2-stage to 8 MiB; multimem to 32 MiB
    (512 * KIB - 16, 4, 90, True, ONESHOT),
    (512 * KIB, 4, 90, True, TWOSHOT),
    (8 * MIB - 16, 4, 90, True, TWOSHOT),
    (8 * MIB, 4, 90, True, MULTIMEM),
    (32 * MIB + 16, 4, 90, True, NCCL),
    # tp 2: always 1-stage; past the 8 MiB buffer, symm mem's two-shot (2 is not a multimem size on SM 9.0)
    (8 * MIB - 16, 2, 90, True, ONESHOT),
    (8 * MIB, 2, 90, True, SYMM_TWOSHOT),
    # tp 6: custom cap 512 KiB; 1-stage under 256 KiB (tp <= 8 rule), 2-stage to 512 KiB
    (300 * KIB, 6, 90, True, TWOSHOT),
    # no multicast (the symmetric-memory communicator stays down): the custom all-reduce runs to 8 MiB
    (1 * MIB, 8, 90, False, TWOSHOT),
    (8 * MIB, 8, 90, False, NCCL),
    # B200 (SM 10.0): custom cap 1 MiB at tp 8; multimem at 6 and 8, two-shot at 4
    (1 * MIB - 16, 8, 100, True, TWOSHOT),
    (1 * MIB, 8, 100, True, MULTIMEM),
    (2 * MIB, 4, 100, True, SYMM_TWOSHOT),
    # Ampere (SM 8.0): no table, so no symmetric memory, the custom all-reduce to 8 MiB
    (4 * MIB, 8, 80, True, TWOSHOT),
    # a message that is not a multiple of 16 bytes, and tp 16 (not a supported world size)
    (1000 * 8 + 8, 8, 90, False, NCCL),
    (16 * KIB, 16, 90, False, NCCL),
])  # fmt: skip
def test_vllm_picks_its_all_reduce_as_cuda_communicator_does(nbytes, tp, sm, multicast, expected):
    assert VLLM_AR.strategy(nbytes, tp, sm, True, multicast) == expected


def test_vllm_symmetric_memory_takes_bf16_only_and_no_peers_is_nccl():
    """SymmMemCommunicator.should_use_symm_mem: inp.dtype must be its bf16; a TP group that is not one node's
    fully connected NVLink (across nodes: in_the_same_node_as) has neither the custom kernel nor symmetric memory."""
    assert VLLM_AR.strategy(MIB, 8, 90, True, True, "fp32") == NCCL
    assert VLLM_AR.strategy(16 * KIB, 8, 90, False, True) == NCCL


@pytest.mark.parametrize(("nbytes", "tp", "expected"), [
    (256 * KIB - 16, 8, ONESHOT),  # sgl-kernel custom_all_reduce.cuh: the same 1-stage rule as vLLM's
    (256 * KIB, 8, TWOSHOT),
    (8 * MIB - 16, 8, TWOSHOT),  # _MAX_CAR_SIZE 8 MiB on CUDA, no symmetric-memory cap
    (8 * MIB, 8, NCCL),  # --enable-torch-symm-mem is off by default: NCCL
    (4 * MIB, 2, ONESHOT),
])  # fmt: skip
def test_sglang_picks_its_custom_all_reduce_then_nccl(nbytes, tp, expected):
    assert SGLANG_AR.strategy(nbytes, tp, 90, True, True) == expected


def test_vllm_decode_step_prices_every_tp_all_reduce_as_its_kernel():
    """Llama-3 70B TP8 decode of 8 sequences on one DGX H100: 8 x 8192 x 2 = 131,072 bytes per all-reduce, under
    256 KiB: the 1-stage custom kernel for the 80 + 80 block outputs and the embedding's all-reduce alike (vLLM gives
    every TP all-reduce the custom all-reduce, tensor_model_parallel_all_reduce), 7 M out of each rank in one step;
    no layer kernel leaves the step, so the step moves by exactly the rows' price change."""
    nccl, nccl_rows, _ = _rows("nccl", 8, 8)
    vllm, rows, _ = _rows("vllm", 8, 8)
    delta = 0.0
    for name in ("tp.attn.out_proj", "tp.mlp.down_proj", "tp.embedding"):
        row = rows[name]
        assert row.call.message_bytes == 8 * 8192 * 2 == 131_072
        assert row.price.algorithm == "vllm_custom_oneshot" and row.price.steps == 1
        assert row.price.bytes_sent_per_rank == 7 * 131_072
        assert "custom_all_reduce.py" in row.call.source and row.call.source.endswith("ONESHOT")
        assert row.price.time_s < nccl_rows[name].price.time_s
        delta += row.call.calls_per_iteration * (row.price.time_s - nccl_rows[name].price.time_s)
    assert vllm.step.compute_s == nccl.step.compute_s
    assert vllm.step.time_s == pytest.approx(nccl.step.time_s + delta, rel=1e-12)


def test_vllm_multimem_is_the_switch_reducing_at_a_kernel_launch():
    """64 sequences (1 MiB per all-reduce, over the 256 KiB custom cap): torch symm_mem multimem_all_reduce_ on the
    NVSwitch, M up and M down per rank in the in-network schedule, with one kernel launch's set-up (6.8 us) instead of
    NCCL's 20 us NVLS floor: exactly 13.2 us less than the same schedule priced as NCCL's."""
    from planner.plan import Options, price_calls

    _, rows, w = _rows("vllm", 8, 64)
    row = rows["tp.mlp.down_proj"]
    assert row.price.algorithm == "vllm_symm_mem_multimem"
    assert row.price.bytes_sent_per_rank == row.price.bytes_received_per_rank == 1 * MIB
    base = replace(row.call, source="")
    nvls = price_calls([base], w.par, w.cluster, Options(algorithm="in_network", pricing="schedule"))[0].price
    assert row.price.time_s == pytest.approx(nvls.time_s - 20.0e-6 + 6.8e-6, rel=1e-12)
    assert "symm_mem.py" in row.call.source


def test_custom_all_reduce_stays_inside_one_node():
    """TP8 over two nodes of four H100: CustomAllreduce is disabled ("this process group spans across nodes") and so
    is the symmetric memory (no NVLink multicast across nodes): every row is NCCL's, labelled so."""
    two = replace(cluster_preset("dgx-h100", 2), devices_per_node=4, nics_per_node=4)
    w = _worker(LLAMA70B, two, engine("vllm"), Pool(tp=8), 0)
    nccl_w = _worker(LLAMA70B, two, NCCL_ONLY, Pool(tp=8), 0)
    plan = _step(LLAMA70B, w, ServeOptions(), "decode", 8, 1000)
    nccl = _step(LLAMA70B, nccl_w, ServeOptions(), "decode", 8, 1000)
    assert plan.step.time_s == nccl.step.time_s
    row = {pc.call.name: pc for pc in plan.calls}["tp.mlp.down_proj"]
    assert row.call.source.endswith("NCCL") and not row.price.algorithm.startswith("vllm")
