"""One quantize per GEMM (bwcast14; planner/kernels.py TIMED_QUANTIZE, timed_quantize_s, input_quantize_bytes;
bench/kernel_fit.py gemm_alone_s, quantize_free_ceiling). aiconfigurator's block-fp8 and nvfp4 GEMM rows time
TensorRT-LLM's ``Linear.forward`` of a bf16 input (collector/trtllm/collect_gemm.py run_gemm), which quantizes that
input inside the timed call; the ceilings are fitted on the rows less that quantize, at the planner's own cast price,
so they mean the GEMM alone and every pass charges the quantize it runs once: TE's casts in training, the engine's
one rowwise quantize in inference (serve14 skipped the inference cast instead, and training counted it twice)."""

from __future__ import annotations

import pytest

from bench import kernel_fit
from collectives.topology import cluster_preset
from collectives.topology.gpu import GPUS
from planner import MODEL_PRESETS, ParallelSpec, WorkloadSpec
from planner.context import Context
from planner.kernels import (
    CAST_HBM,
    EFFICIENCY,
    GEMM_CEILING,
    TIMED_QUANTIZE,
    cast_bytes_per_element,
    gemm_time,
    input_quantize_bytes,
    layer_kernels,
    tabled_ceiling,
    timed_quantize_s,
)
from planner.serving import Pool, ServeOptions, engine
from planner.serving.deployment import _context, _worker

LLAMA = MODEL_PRESETS["llama3-70b"]
B200, H100 = GPUS["b200-180gb"], GPUS["h100-sxm5-80gb"]


def prefill_layer(cluster: str, tp: int, options: ServeOptions):
    nodes = cluster_preset(cluster, 1)
    w = _worker(LLAMA, nodes, engine("trtllm"), Pool(tp=tp), 0)
    ctx = _context(LLAMA, options, "prefill", 4, 2048, w.par, w)
    lk = layer_kernels(ctx, False, nodes.gpu)
    return ctx, nodes.gpu, {k.name: k for k in lk.forward}


def test_the_classes_whose_rows_hold_a_quantize():
    """Hopper block fp8 (fp8_quantize_1x128 + fp8_block_scaling_gemm), Blackwell block fp8 (fp8_swap_ab_gemm:
    per_token_quant_and_transform + DeepGEMM) and nvfp4 (fp4_quantize + nvfp4_gemm), each with the recipe whose
    rowwise quantize it is. Not bf16 (F.linear alone) and not per-tensor fp8 (no ceiling is fitted on those rows)."""
    assert TIMED_QUANTIZE == {(90, "fp8_block"): "blockwise", (100, "fp8_block"): "blockwise", (100, "nvfp4"): "nvfp4"}
    for dtype in ("bf16", "fp8"):
        assert timed_quantize_s(B200, dtype, 8192, 8192, EFFICIENCY) == 0.0
        assert timed_quantize_s(H100, dtype, 8192, 8192, EFFICIENCY) == 0.0


def test_one_table_row_less_its_quantize_in_closed_form():
    """b200_sxm nvfp4 at m = n = k = 8,192, 0.28456 ms as timed: the input's quantize reads 2 B, writes 0.5 B and an
    E4M3 scale per 16 elements (2.5625 B an element) at CAST_HBM (0.636) of the B200's 8,000 GB/s: 67,108,864 x 2.5625
    B / 5,088 GB/s = 33.80 us, so the GEMM alone took 250.76 us. Hopper block fp8 at the same shape (0.98471 ms):
    3.03125 B an element (fp32 scale per 128) at 0.636 x 3,350 GB/s: 95.48 us."""
    elements = 8192 * 8192
    quantize = elements * (2 + 0.5 + 1 / 16) / (8000e9 * CAST_HBM)
    assert quantize == pytest.approx(33.80e-6, abs=1e-8)
    assert timed_quantize_s(B200, "nvfp4", 8192, 8192, EFFICIENCY) == pytest.approx(quantize, rel=1e-12)
    assert kernel_fit.gemm_alone_s(B200, "nvfp4", 8192, 8192, 0.28456e-3) == pytest.approx(0.28456e-3 - quantize)
    hopper = elements * (2 + 1 + 4 / 128) / (3350e9 * CAST_HBM)
    assert hopper == pytest.approx(95.48e-6, abs=1e-8)
    assert timed_quantize_s(H100, "fp8_block", 8192, 8192, EFFICIENCY) == pytest.approx(hopper, rel=1e-12)
    alone = {tuple(p[3:6]): p[6] for p in kernel_fit.rows(kernel_fit.load()) if p[:3:2] == ("b200_sxm", "nvfp4")}
    assert alone[8192, 8192, 8192] == pytest.approx(0.28456e-3 - quantize, rel=1e-12)


def test_the_ceilings_are_the_gemm_alone():
    """Each TIMED_QUANTIZE ceiling is the one quantize_free_ceiling refits on the rows less their quantize (the bias of
    the ceiling fitted on the rows as timed kept on the compute-bound shapes): Hopper fp8_block 0.629 -> 0.728,
    Blackwell fp8_block 0.635 -> 0.721 (per-tensor fp8 and MXFP8 take it), nvfp4 0.415 -> 0.484. The B200's part
    of it by hand: its median predicted / measured over the compute-bound rows is the same at 0.721 on the rows less
    their quantize as at 0.635 on the rows as timed (within 0.5%)."""
    assert kernel_fit.quantize_free_ceiling("h100_sxm", "fp8_block") == GEMM_CEILING[90, "fp8_block"] == 0.728
    assert kernel_fit.quantize_free_ceiling("b200_sxm", "fp8_block") == GEMM_CEILING[100, "fp8_block"] == 0.721
    assert kernel_fit.quantize_free_ceiling("b200_sxm", "nvfp4") == GEMM_CEILING[100, "nvfp4"] == 0.484
    assert GEMM_CEILING[100, "fp8"] == GEMM_CEILING[100, "mxfp8"] == GEMM_CEILING[100, "fp8_block"]
    assert GEMM_CEILING[90, "fp8"] == 0.844  # this project's torch._scaled_mm: the GEMM alone, not refitted
    entry = kernel_fit.load()["systems"]["b200_sxm"]
    alone = list(
        kernel_fit.rows({"systems": {"b200_sxm": entry | {"dtypes": {"fp8_block": entry["dtypes"]["fp8_block"]}}}})
    )
    timed = [(*p[:6], p[6] + timed_quantize_s(B200, "fp8_block", p[3], p[5], EFFICIENCY)) for p in alone]
    bound = kernel_fit.COMPUTE_BOUND
    before = kernel_fit._class_scale(timed, "fp8_block", 0.635, bound)
    assert kernel_fit._class_scale(alone, "fp8_block", 0.721, bound) == pytest.approx(before, rel=5e-3)
    assert kernel_fit._class_scale(alone, "fp8_block", 0.635, bound) > 1.1 * before  # the old ceiling: 10%+ slow


def test_inference_charges_the_engines_one_rowwise_quantize():
    """Llama 3.3 70B TP1 on a B200, 4 x 2,048 tokens, nvfp4 weights (stored quantized: no weight cast): one fp8_cast
    of the four GEMM inputs, 8,192 tokens x (8,192 + 8,192 + 8,192 + 28,672) elements at 2.5625 B (the bytes the
    fit took out of the tables), at CAST_HBM; each GEMM at the GEMM-alone ceiling 0.484."""
    _, gpu, fwd = prefill_layer("dgx-b200", 1, ServeOptions(weight_dtype="nvfp4", kv_dtype="fp8"))
    assert input_quantize_bytes("nvfp4") == 2.5625
    nbytes = 8192 * (8192 * 3 + 28672) * 2.5625
    assert fwd["fp8_cast"].bytes == pytest.approx(nbytes, rel=1e-12)
    assert fwd["fp8_cast"].time_s == pytest.approx(nbytes / (gpu.hbm_GBps * 1e9 * CAST_HBM), rel=1e-12)
    qkv = fwd["qkv"]
    m, n, k, _ = qkv.shape
    assert tabled_ceiling(gpu, "nvfp4") == 0.484
    assert qkv.time_s == pytest.approx(gemm_time((m,), n, k, "nvfp4", gpu, EFFICIENCY), rel=1e-12)


def test_inference_per_tensor_fp8_on_hopper_one_copy():
    """The dense TensorRT-LLM FP8 rows (tensorwise, H100 TP2): FP8QDQLinearMethod's static_quantize_e4m3_per_tensor
    reads the bf16 input once and writes one fp8 copy, 3 B an element (TE's training cast with its amax read and
    transpose, cast_bytes_per_element, is 6 B): 8,192 tokens x (8,192 + 4,096 + 8,192 + 14,336) elements."""
    options = ServeOptions(weight_dtype="fp8", kv_dtype="fp8", fp8_recipe="tensorwise")
    ctx, _, fwd = prefill_layer("dgx-h100", 2, options)
    assert cast_bytes_per_element(ctx) == 6
    nbytes = 8192 * (8192 + 4096 + 8192 + 14336) * 3
    assert fwd["fp8_cast"].bytes == pytest.approx(nbytes, rel=1e-12)


def test_training_charges_tes_casts_beside_the_gemm_alone():
    """A training pass under MXFP8 on a B200 (Llama 3 8B, T 4,096, TP1; weights cast once a step, te_weight_cache):
    the forward casts each GEMM input once at TE's bytes (read 2, the rowwise and columnwise copies 2, E8M0 scales
    per 32 both ways 2/32: 4.0625 B; MXFP8's norm does not fuse the quantize), 4,096 x (3 x 4,096 + 14,336) elements,
    and each GEMM runs at the GEMM-alone ceiling 0.721, which holds no quantize."""
    work = WorkloadSpec(micro_batch_size=1, global_batch_size=8, seq_length=4096, fp8_recipe="mxfp8")
    ctx = Context(MODEL_PRESETS["llama3-8b"], work, ParallelSpec(tp=1, pp=1, dp=8))
    fwd = {k.name: k for k in layer_kernels(ctx, False, B200).forward}
    assert cast_bytes_per_element(ctx, B200) == 4.0625
    assert fwd["fp8_cast"].bytes == pytest.approx(4096 * (3 * 4096 + 14336) * 4.0625, rel=1e-12)
    assert tabled_ceiling(B200, "mxfp8") == 0.721
    m, n, k, _ = fwd["fc1"].shape
    assert fwd["fc1"].time_s == pytest.approx(gemm_time((m,), n, k, "mxfp8", B200, EFFICIENCY), rel=1e-12)
