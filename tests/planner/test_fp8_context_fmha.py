"""TensorRT-LLM's FP8 context FMHA in serving (serve14; planner/serving/engines.py TRTLLM_FP8_CONTEXT_FMHA,
planner/kernels.py CONTEXT_FMHA_FP8_SPEEDUP): with an FP8 KV cache and fp8 or nvfp4 linears TensorRT-LLM's context
(prefill) attention runs FP8 (trtllm.py: "paged context FMHA cannot be used without FP8 attention"; attentionOp.cpp's
``hasFp8KvCache() && use_paged_context_fmha``), at the FP8 / bf16 speedup aiconfigurator measured on TensorRT-LLM's
own FMHA (1.244 Hopper, 1.208 Blackwell), with no TransformerEngine casts around it. Llama 3.3 70B, TP1, one B200:
the prefill pass of 4 x 2,048 tokens (the engine's 8,192-token budget) that the NVFP4 validation rows plan."""

from __future__ import annotations

from dataclasses import replace

import pytest

from collectives.topology import cluster_preset
from planner import MODEL_PRESETS
from planner.kernels import (
    ATTENTION_CEILING,
    CONTEXT_FMHA_FP8_SPEEDUP,
    EFFICIENCY,
    attention_kernels,
    dense_peak,
    engine_fp8_attention,
)
from planner.serving import Pool, ServeOptions, engine
from planner.serving.deployment import _context, _step, _worker
from planner.serving.engines import FP8_FMHA_WEIGHTS, TRTLLM_FP8_CONTEXT_FMHA

LLAMA = MODEL_PRESETS["llama3-70b"]
B200 = cluster_preset("dgx-b200", 1)
NVFP4 = ServeOptions(weight_dtype="nvfp4", kv_dtype="fp8")
KS = EFFICIENCY.kernel_s


def core(options=NVFP4, name="trtllm", phase="prefill", batch=4, context=2048):
    w = _worker(LLAMA, B200, engine(name), Pool(tp=1), 0)
    ctx = _context(LLAMA, options, phase, batch, context, w.decode_par if phase == "decode" else w.par, w)
    fwd, _ = attention_kernels(ctx, B200.gpu, EFFICIENCY, 0.0)
    return ctx, {k.name: k for k in fwd}


def test_the_sourced_settings():
    """TensorRT-LLM carries the trait with its source; vLLM and SGLang do not (their FP8-KV prefill is not modelled
    here); the linears TensorRT-LLM's check counts as quantized are fp8 and nvfp4; the measured speedups."""
    assert engine("trtllm").fp8_context_attention == TRTLLM_FP8_CONTEXT_FMHA
    assert "attentionOp.cpp" in TRTLLM_FP8_CONTEXT_FMHA and "trtllm.py" in TRTLLM_FP8_CONTEXT_FMHA
    assert engine("vllm").fp8_context_attention is None and engine("sglang").fp8_context_attention is None
    assert FP8_FMHA_WEIGHTS == ("fp8", "nvfp4")
    assert CONTEXT_FMHA_FP8_SPEEDUP == {("cudnn", 90): (1.244, 1.0), ("cudnn", 100): (1.208, 1.0)}


def test_the_fp8_fmha_closed_form():
    """4 sequences x 2,048 queries x 1,024.5 mean causal keys x 64 heads x (2 x 128 + 2 x 128) FLOPs =
    275,012,124,672; at B200's dense bf16 peak x the FMHA ceiling 0.42 x 1.208 x s / (s + s0), plus one launch.
    Against the bf16 kernel of the same pass: (t - launch) x 1.208 exactly, the same FLOPs, dtype fp8."""
    ctx, f8 = core()
    _, f16 = core(ServeOptions(weight_dtype="nvfp4", kv_dtype="bf16"))
    k8, k16 = f8["cudnn_fwd"], f16["cudnn_fwd"]
    assert engine_fp8_attention(ctx) and ctx.work.fp8_context_attention
    assert k8.flops == k16.flops == 4 * 2048 * 1024.5 * 64 * 512 == 275_012_124_672
    shape = 2048 / (2048 + EFFICIENCY.attention_s0)
    by_hand = k8.flops / (dense_peak(B200.gpu, "bf16") * ATTENTION_CEILING[("cudnn", 100)][0] * 1.208 * shape) + KS
    assert k8.time_s == pytest.approx(by_hand, rel=1e-12)
    assert (k8.time_s - KS) * 1.208 == pytest.approx(k16.time_s - KS, rel=1e-12)
    assert (k8.dtype, k16.dtype) == ("fp8", "bf16")


def test_no_te_casts_and_only_where_the_engine_runs_it():
    """The engine's QKV preprocessing writes Q, K, V in FP8: none of TE's fp8_attn.* casts. bf16 context attention
    with a bf16 KV cache, bf16 linears, under vLLM, and in a decode step (which reads the KV cache by its bytes)."""
    _, f8 = core()
    assert list(f8) == ["cudnn_fwd"]
    for options, name in ((ServeOptions(weight_dtype="nvfp4", kv_dtype="bf16"), "trtllm"),
                          (ServeOptions(weight_dtype="bf16", kv_dtype="fp8"), "trtllm"),
                          (NVFP4, "vllm")):  # fmt: skip
        ctx, f = core(options, name)
        assert not ctx.work.fp8_context_attention and f["cudnn_fwd"].dtype == "bf16"
    ctx, f = core(phase="decode", batch=338, context=2112)
    assert ctx.work.fp8_context_attention is False and list(f) == ["decode_attention"]


def test_the_prefill_pass_moves_by_its_attention_only():
    """The whole 80-layer pass: faster by exactly 80 x the attention kernel's difference (nothing else changes)."""
    w = _worker(LLAMA, B200, engine("trtllm"), Pool(tp=1), 0)
    fast = _step(LLAMA, w, NVFP4, "prefill", 4, 2048).step.time_s
    slow = _step(LLAMA, replace(w, fp8_fmha=False), NVFP4, "prefill", 4, 2048).step.time_s
    _, f8 = core()
    _, f16 = core(ServeOptions(weight_dtype="nvfp4", kv_dtype="bf16"))
    assert slow - fast == pytest.approx(80 * (f16["cudnn_fwd"].time_s - f8["cudnn_fwd"].time_s), rel=1e-6)
