"""An inference GEMM's input quantize inside its measured ceiling (serve14; planner/kernels.py QUANTIZE_TIMED_IN_GEMM,
quantize_timed_in_gemm): aiconfigurator's GEMM rows time TensorRT-LLM's ``Linear.forward`` of a bf16 input
(collector/trtllm/collect_gemm.py run_gemm), which quantizes that input in the timed call, so the nvfp4 and
block-scaled fp8 ceilings fitted on them hold the quantize and an inference pass adds no cast for those GEMMs. Hopper's
per-tensor fp8 ceiling (this project's torch._scaled_mm, the GEMM alone), a trace's fitted ceiling and a training
pass keep theirs."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest

from collectives.topology import cluster_preset
from planner import MODEL_PRESETS, ParallelSpec, WorkloadSpec
from planner.context import Context
from planner.kernels import (
    CAST_HBM,
    EFFICIENCY,
    QUANTIZE_TIMED_IN_GEMM,
    cast_bytes_per_element,
    layer_kernels,
    quantize_timed_in_gemm,
)
from planner.serving import Pool, ServeOptions, engine
from planner.serving.deployment import _context, _worker

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import kernel_fit

LLAMA = MODEL_PRESETS["llama3-70b"]


def prefill_layer(cluster: str, tp: int, options: ServeOptions, eff=None):
    nodes = cluster_preset(cluster, 1)
    w = _worker(LLAMA, nodes, engine("trtllm"), Pool(tp=tp), 0)
    ctx = _context(LLAMA, options, "prefill", 4, 2048, w.par, w)
    lk = layer_kernels(ctx, False, nodes.gpu, eff)
    return ctx, nodes.gpu, {k.name: k for k in lk.forward}


def test_the_classes():
    """The classes whose ceiling was fitted on aiconfigurator's Linear timings, read off the kept tables
    (tests/reference/kernels/aiconfigurator_gemm.json) and the fit's own map: every quantized class of the B200
    table and the Blackwell classes fitted on one of them (bench/kernel_fit.py FITTED_ON: per-tensor fp8 and MXFP8
    take block-scaled fp8's ceiling), and the H100 table's quantized classes but per-tensor fp8, whose Hopper ceiling
    is this project's torch._scaled_mm tables (GEMM_CEILING's note); no bf16 (its GEMMs take no quantize)."""
    tables = {entry["gpu"]: set(entry["dtypes"]) for entry in kernel_fit.load()["systems"].values()}
    blackwell = {(100, d) for d, on in kernel_fit.FITTED_ON.items() if d != "bf16" and on in tables["b200-180gb"]}
    hopper = {(90, d) for d in tables["h100-sxm5-80gb"] - {"bf16", "fp8"}}
    assert blackwell | hopper == QUANTIZE_TIMED_IN_GEMM


def test_nvfp4_prefill_on_a_b200_has_no_cast_kernel():
    """Llama 3.3 70B TP1, 4 x 2,048 tokens: the four nvfp4 GEMMs are each inside the rule, and the layer lists no
    fp8_cast (it was 268 us of the layer's 5.5 ms before serve14)."""
    ctx, gpu, fwd = prefill_layer("dgx-b200", 1, ServeOptions(weight_dtype="nvfp4", kv_dtype="fp8"))
    gemms = [k for k in fwd.values() if k.kind == "gemm"]
    assert [g.name for g in gemms] == ["qkv", "attn_out", "fc1", "fc2"]
    assert all(quantize_timed_in_gemm(ctx, g, gpu, EFFICIENCY) for g in gemms)
    assert "fp8_cast" not in fwd


def test_per_tensor_fp8_on_hopper_keeps_its_cast_by_hand():
    """The dense TensorRT-LLM FP8 rows' GEMMs (tensorwise, an H100 TP2): the cast of every GEMM input, 8,192 tokens
    x (8,192 + 4,096 + 8,192 + 14,336) elements (qkv, attn_out, fc1, fc2 inputs per rank) at the recipe's bytes per
    element, at CAST_HBM of the H100's bandwidth."""
    options = ServeOptions(weight_dtype="fp8", kv_dtype="fp8", fp8_recipe="tensorwise")
    ctx, gpu, fwd = prefill_layer("dgx-h100", 2, options)
    elements = 8192 * (8192 + 4096 + 8192 + 14336)
    nbytes = elements * cast_bytes_per_element(ctx)
    assert fwd["fp8_cast"].bytes == pytest.approx(nbytes, rel=1e-12)
    assert fwd["fp8_cast"].time_s == pytest.approx(nbytes / (gpu.hbm_GBps * 1e9 * CAST_HBM), rel=1e-12)


def test_block_fp8_on_hopper_and_a_fitted_ceiling():
    """Block-scaled fp8 on an H100 (aiconfigurator's Linear timings: TensorRT-LLM's own fp8_quantize_1x128 and
    fp8_block_scaling_gemm on SM90, collector/trtllm/collect_gemm.py; DeepGEMM is SM100/103 only): no cast. The same
    B200 nvfp4 layer with a trace's fitted nvfp4 ceiling (the GEMM kernel alone): its cast is back."""
    _, _, fwd = prefill_layer("dgx-h100", 2, ServeOptions(weight_dtype="fp8", kv_dtype="fp8"))
    assert "fp8_cast" not in fwd
    fitted = replace(EFFICIENCY, gemm_ceilings=(("nvfp4", 0.415),))
    _, _, fwd = prefill_layer("dgx-b200", 1, ServeOptions(weight_dtype="nvfp4", kv_dtype="fp8"), fitted)
    assert fwd["fp8_cast"].bytes > 0


def test_training_keeps_its_casts():
    """A training pass under the nvfp4 recipe on a B200: its casts stay (TE writes more than the one copy)."""
    gpu = cluster_preset("dgx-b200", 1).gpu
    work = WorkloadSpec(micro_batch_size=1, global_batch_size=8, seq_length=4096, fp8_recipe="nvfp4")
    ctx = Context(MODEL_PRESETS["llama3-8b"], work, ParallelSpec(tp=1, pp=1, dp=8))
    names = [k.name for k in layer_kernels(ctx, False, gpu).forward]
    assert "fp8_cast" in names
