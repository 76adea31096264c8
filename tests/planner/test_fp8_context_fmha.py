"""TensorRT-LLM's FP8 context FMHA in serving (serve14, mend14a; planner/serving/engines.py TRTLLM_FP8_CONTEXT_FMHA,
planner/kernels.py CONTEXT_FMHA_FP8): with fp8 or nvfp4 linears TensorRT-LLM's context (prefill) attention runs FP8
(the quantized o_proj's output scale: attentionOp.cpp's ``is_fp8_out || is_fp4_out``), at the rate of its own fitted
(ceiling, s0) against the bf16 kernel's, both fitted by bench/kernel_fit.py fmha_fit on aiconfigurator's TensorRT-LLM
tables (tests/reference/kernels/aiconfigurator_attention_fp8.json), with no TransformerEngine casts around it; not on
MLA (its context tables are bf16 only). Llama 3.3 70B, TP1, one B200: the prefill pass of 4 x 2,048 tokens (the
engine's 8,192-token budget) that the NVFP4 validation rows plan."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from statistics import median

import pytest

from collectives.topology import cluster_preset
from planner import MODEL_PRESETS, SpecError
from planner.kernels import (
    ATTENTION_CEILING,
    CONTEXT_FMHA_FP8,
    EFFICIENCY,
    attention_kernels,
    context_fmha_fp8_speedup,
    dense_peak,
    engine_fp8_attention,
)
from planner.serving import Pool, ServeOptions, Traffic, engine, plan_serving
from planner.serving.deployment import _context, _step, _worker
from planner.serving.engines import FP8_FMHA_WEIGHTS, TRTLLM_FP8_CONTEXT_FMHA, TRTLLM_KV_DEFAULT_RULE

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import kernel_fit

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
    here); the linears whose o_proj takes an output scale are fp8 and nvfp4."""
    assert engine("trtllm").fp8_context_attention == TRTLLM_FP8_CONTEXT_FMHA
    assert "attentionOp.cpp" in TRTLLM_FP8_CONTEXT_FMHA and "trtllm.py" in TRTLLM_FP8_CONTEXT_FMHA
    assert engine("vllm").fp8_context_attention is None and engine("sglang").fp8_context_attention is None
    assert FP8_FMHA_WEIGHTS == ("fp8", "nvfp4")


@pytest.mark.parametrize(("system", "gen"), [("h100_sxm", 90), ("b200_sxm", 100)])
def test_the_fit_is_recomputed_from_the_kept_tables(system, gen):
    """CONTEXT_FMHA_FP8 is what bench/kernel_fit.py fmha_fit gives on the kept aiconfigurator rows (85 shapes a GPU),
    the bf16 and the FP8 kernel by the one fit: ceilings to 3 places, s0 exactly."""
    (c16, s16), (c8, s8) = CONTEXT_FMHA_FP8[("cudnn", gen)]
    bf16 = kernel_fit.fmha_fit(kernel_fit.fmha_points(False))[system]
    fp8 = kernel_fit.fmha_fit(kernel_fit.fmha_points(True))[system]
    assert (round(bf16[0], 3), bf16[1]) == (c16, s16) and (round(fp8[0], 3), fp8[1]) == (c8, s8)


@pytest.mark.parametrize(("system", "gen"), [("h100_sxm", 90), ("b200_sxm", 100)])
def test_the_speedup_follows_the_measured_ratio_by_prompt_length(system, gen):
    """The model's FP8 / bf16 rate at each prompt length against the median measured bf16 / fp8 latency of the kept
    shapes at that length (1,024 to 16,384): within 4% at every length, and it grows with the prompt as the tables do
    (the flat 1.244 / 1.208 of serve14 was 8-10% off at both ends: review r14a, 3)."""
    gpu = cluster_preset("dgx-h100" if gen == 90 else "dgx-b200", 1).gpu
    rows = [p for p in kernel_fit.fmha_points(True) if p[0] == system]
    bf = {(b, i, h): t for s_, _, b, i, h, t in kernel_fit.fmha_points(False) if s_ == system}
    model = []
    for isl in sorted({p[3] for p in rows}):
        measured = median(bf[(b, i, h)] / t for _, _, b, i, h, t in rows if i == isl)
        model.append(context_fmha_fp8_speedup("cudnn", gpu, isl))
        assert model[-1] == pytest.approx(measured, rel=0.04), isl
    assert model == sorted(model) and model[-1] / model[0] > 1.08


def test_the_fp8_fmha_closed_form():
    """4 sequences x 2,048 queries x 1,024.5 mean causal keys x 64 heads x (2 x 128 + 2 x 128) FLOPs =
    275,012,124,672; at B200's dense bf16 peak x the FMHA ceiling 0.42 x the FP8 kernel's rate over the bf16 one at
    2,048 keys, c8 (s + s0_16) / (c16 (s + s0_8)), x s / (s + s0), plus one launch. Against the bf16 kernel of the same
    pass (bf16 linears): (t - launch) x that rate exactly, the same FLOPs, dtype fp8."""
    ctx, f8 = core()
    _, f16 = core(ServeOptions(weight_dtype="bf16", kv_dtype="bf16"))
    k8, k16 = f8["cudnn_fwd"], f16["cudnn_fwd"]
    assert engine_fp8_attention(ctx) and ctx.work.fp8_context_attention
    assert k8.flops == k16.flops == 4 * 2048 * 1024.5 * 64 * 512 == 275_012_124_672
    (c16, s16), (c8, s8) = CONTEXT_FMHA_FP8[("cudnn", 100)]
    up = c8 * (2048 + s16) / (c16 * (2048 + s8))
    shape = 2048 / (2048 + EFFICIENCY.attention_s0)
    by_hand = k8.flops / (dense_peak(B200.gpu, "bf16") * ATTENTION_CEILING[("cudnn", 100)][0] * up * shape) + KS
    assert k8.time_s == pytest.approx(by_hand, rel=1e-12)
    assert (k8.time_s - KS) * up == pytest.approx(k16.time_s - KS, rel=1e-12)
    assert (k8.dtype, k16.dtype) == ("fp8", "bf16")


def test_not_on_mla():
    """DeepSeek-V3 under TensorRT-LLM, fp8 weights and an FP8 KV cache on a DGX H100 TP8: its MLA context attention
    stays bf16 (aiconfigurator's context_mla_perf tables hold bf16 MLA only; review r14a, 2)."""
    v3, h100 = MODEL_PRESETS["deepseek-v3"], cluster_preset("dgx-h100", 1)
    w = _worker(v3, h100, engine("trtllm"), Pool(tp=8), 0)
    ctx = _context(v3, ServeOptions(weight_dtype="fp8", kv_dtype="fp8"), "prefill", 1, 4096, w.par, w)
    fwd, _ = attention_kernels(ctx, h100.gpu, EFFICIENCY, 0.0)
    assert ctx.work.fp8_context_attention and not engine_fp8_attention(ctx)
    assert all(k.dtype == "bf16" for k in fwd if k.kind == "attention")


@pytest.mark.parametrize(
    ("weights", "recipe"),
    [("fp8", "tensorwise"), ("fp8", "delayed"), ("fp8", "blockwise"), ("fp8", "mxfp8"), ("nvfp4", "blockwise"),
     ("bf16", "blockwise")],
)  # fmt: skip
def test_the_kv_default_is_the_16_bit_cache_whatever_the_recipe(weights, recipe):
    """TensorRT-LLM's KvCacheConfig.dtype "auto" follows the checkpoint's kv_cache_quant_algo, else the model's dtype
    (llm_args.py; model_loader.py validate_and_set_kv_cache_quant returns at once with "auto"); trtllm-bench's
    _KV_CACHE_MAP is not the engine's (review r14c, 1). With no checkpoint the plan keeps the 16-bit cache for every
    weight format and recipe (no recipe-keyed rule left: review r14c, 2), the same plan as kv_dtype "bf16" named,
    and says the rule in kv_cache.dtype_default; vLLM states none."""
    trt, vllm = engine("trtllm"), engine("vllm")
    traffic = Traffic(input_tokens=2048, output_tokens=128, concurrency=8)
    options = ServeOptions(weight_dtype=weights, fp8_recipe=recipe)
    plan = plan_serving(LLAMA, B200, trt, traffic, (Pool(tp=1),), options)
    assert plan.kv_cache.dtype == "bf16"
    assert plan.kv_cache.dtype_default == f"bf16 planned; {TRTLLM_KV_DEFAULT_RULE}"
    assert all(w in TRTLLM_KV_DEFAULT_RULE for w in ("kv_cache_quant_algo", "validate_and_set_kv_cache_quant"))
    named = plan_serving(LLAMA, B200, trt, traffic, (Pool(tp=1),), replace(options, kv_dtype="bf16"))
    assert named.kv_cache.dtype_default == "" and named.kv_cache == replace(plan.kv_cache, dtype_default="")
    assert (named.ttft_s, named.tpot_s) == (plan.ttft_s, plan.tpot_s)
    # Llama 3.3 70B: 80 layers x 8 KV heads x 128 x 2 (K, V) x 2 B = 327,680 B a token
    assert plan.kv_cache.bytes_per_token == 80 * 8 * 128 * 2 * 2
    other = plan_serving(LLAMA, B200, vllm, traffic, (Pool(tp=1),), options)
    assert other.kv_cache.dtype == "bf16" and other.kv_cache.dtype_default == ""


def test_an_fp8_kv_cache_only_where_named():
    """A checkpoint that declares kv_cache_quant_algo FP8 is asked for with kv_dtype "fp8": half the bytes a token,
    at least twice the requests; no FP8 default for MLA either (DeepSeek-V3 NVFP4 on a DGX B200: its 16-bit latent
    cache, 61 layers x (512 + 64) x 2 B)."""
    trt = engine("trtllm")
    traffic = Traffic(input_tokens=2048, output_tokens=128, concurrency=8)
    auto = plan_serving(LLAMA, B200, trt, traffic, (Pool(tp=1),), ServeOptions(weight_dtype="nvfp4"))
    fp8 = plan_serving(LLAMA, B200, trt, traffic, (Pool(tp=1),), NVFP4)
    assert fp8.kv_cache.dtype == "fp8" and fp8.kv_cache.dtype_default == ""
    assert 2 * fp8.kv_cache.bytes_per_token == auto.kv_cache.bytes_per_token
    assert fp8.kv_cache.max_concurrency >= 2 * auto.kv_cache.max_concurrency
    v3 = plan_serving(MODEL_PRESETS["deepseek-v3"], B200, trt, Traffic(8192, 16, concurrency=1), (Pool(tp=8),),
                      ServeOptions(weight_dtype="nvfp4"))  # fmt: skip
    assert v3.kv_cache.dtype == "bf16" and v3.kv_cache.bytes_per_token == 61 * (512 + 64) * 2


def test_bf16_weights_with_an_fp8_kv_cache_are_refused_by_tensorrt_llm():
    """TrtllmAttention.forward raises 'paged context FMHA cannot be used without FP8 attention' beside unquantized
    linears: a 422 on options.kv_dtype; vLLM runs it."""
    traffic = Traffic(input_tokens=2048, output_tokens=128, concurrency=8)
    options = ServeOptions(weight_dtype="bf16", kv_dtype="fp8")
    with pytest.raises(SpecError) as err:
        plan_serving(LLAMA, B200, engine("trtllm"), traffic, (Pool(tp=1),), options)
    assert err.value.field == "options.kv_dtype" and "FP8 attention" in str(err.value)
    assert plan_serving(LLAMA, B200, engine("vllm"), traffic, (Pool(tp=1),), options).kv_cache.dtype == "fp8"


def test_no_te_casts_and_only_where_the_engine_runs_it():
    """The engine's QKV preprocessing writes Q, K, V in FP8: none of TE's fp8_attn.* casts. FP8 with a bf16 KV cache
    too (the quantized o_proj's output scale takes the FP8 path; review r14a, 4); bf16 context attention with bf16
    linears, under vLLM, and in a decode step (which reads the KV cache by its bytes)."""
    _, f8 = core()
    assert list(f8) == ["cudnn_fwd"]
    ctx, f = core(ServeOptions(weight_dtype="nvfp4", kv_dtype="bf16"))
    assert ctx.work.fp8_context_attention and f["cudnn_fwd"].dtype == "fp8"
    assert f["cudnn_fwd"].time_s == f8["cudnn_fwd"].time_s
    for options, name in ((ServeOptions(weight_dtype="bf16", kv_dtype="bf16"), "trtllm"), (NVFP4, "vllm")):
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
    _, f16 = core(NVFP4, "vllm")
    assert slow - fast == pytest.approx(80 * (f16["cudnn_fwd"].time_s - f8["cudnn_fwd"].time_s), rel=1e-6)
