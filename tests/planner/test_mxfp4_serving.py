"""MXFP4 weights (GPT-OSS's checkpoints; issue 22): the routed experts only, 0.5 + 1/32 B a weight (E2M1 values two a
byte, one E8M0 scale per 32: vLLM quantization/mxfp4.py Mxfp4MoEMethod.create_weights), their GEMMs weight-only with
bf16 math (vLLM's default Marlin / Triton / FlashInfer MXFP4 x BF16 backends), everything else bf16
(Mxfp4Config.get_quant_method: linear layers UnquantizedLinearMethod)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from collectives.topology import cluster_preset
from planner import MODEL_PRESETS, SpecError
from planner.kernels import EFFICIENCY, gemm_ceiling, gemm_time, layer_kernels
from planner.memory import held_bytes
from planner.params import quantized_numels, stage_params
from planner.serving import Pool, ServeOptions, Traffic, engine, plan_serving
from planner.serving.deployment import _context, _worker

GPT_OSS = MODEL_PRESETS["gpt-oss-120b"]
NODE = cluster_preset("dgx-h100", 1)
# 36 layers x 128 experts x (fc1 2 x 2880 x 2880 and fc2 2880 x 2880, with their 3 x 2880 biases)
EXPERTS = 36 * 128 * 3 * 2880 * (2880 + 1)


def _ctx(dtype: str):
    w = _worker(GPT_OSS, NODE, engine("vllm"), Pool(tp=1), 0)
    return _context(GPT_OSS, ServeOptions(weight_dtype=dtype), "decode", 64, 2000, w.decode_par, w)


def test_mxfp4_weights_by_hand():
    """gpt-oss-120b on one GPU: the experts at 0.53125 B, the other 2,127,557,952 weights (attention, router,
    embedding, output layer, norms, sinks) at 2 B: 60,935,224,320 + 4,255,115,904 = 65,190,340,224 B, against
    233,658,313,344 B in bf16."""
    ctx = _ctx("mxfp4")
    assert sum(quantized_numels(ctx, 0, experts_only=True)) == EXPERTS == 114_701_598_720
    total = sum(p.numel for params in stage_params(ctx, 0) for p in params)
    assert total == 116_829_156_672
    assert held_bytes(ctx, 0).params_bytes == int(EXPERTS * (0.5 + 1 / 32) + (total - EXPERTS) * 2)
    assert held_bytes(ctx, 0).params_bytes == 65_190_340_224
    assert held_bytes(_ctx("bf16"), 0).params_bytes == 2 * total


def test_mxfp4_expert_gemms_read_4_25_bits_and_run_bf16_math():
    """A GEMV-like GEMM (m 1, 8192 x 65536: 285 MB of weights) is bound by its weight bytes, 0.53125 a weight (in
    16-row tiles, Marlin's thread_m_blocks, it pays 16 rows of math, not a 128-row tile's); a prefill-sized one
    (m 8192) by its FLOPs at the bf16 rate and ceiling: the bf16 GEMM's time."""
    gpu, eff = NODE.gpu, EFFICIENCY
    n, k = 65536, 8192
    small = gemm_time((1.0,), n, k, "w4a16_mxfp4", gpu, eff)
    traffic = 1 * k * 2 + k * n * (0.5 + 1 / 32) + 1 * n * 2
    assert small == pytest.approx(traffic / (gpu.hbm_GBps * 1e9 * eff.hbm) + eff.kernel_s, rel=1e-12)
    assert small < gemm_time((1.0,), n, k, "bf16", gpu, eff)
    assert small < 0.3 * gemm_time((1.0,), n, k, "bf16", gpu, eff)
    # (its 16-row tiles fill the SMs a little better than cuBLAS's 128-row ones: within 0.1%)
    big = gemm_time((8192.0,), n, k, "w4a16_mxfp4", gpu, eff)
    assert big == pytest.approx(gemm_time((8192.0,), n, k, "bf16", gpu, eff), rel=1e-3)


def test_a_fitted_bf16_ceiling_is_the_weight_only_gemms_too():
    """The MXFP4 expert GEMMs compute in bf16, so a calibrated bf16 ceiling (a trace fit) is theirs as well; it
    was looked up under "w4a16_mxfp4", which no fit can name, and the table's 0.886 stayed (review)."""
    fitted = replace(EFFICIENCY, gemm_ceilings=(("bf16", 0.5),))
    assert gemm_ceiling(NODE.gpu, "bf16", fitted) == gemm_ceiling(NODE.gpu, "w4a16_mxfp4", fitted) == 0.5
    assert gemm_ceiling(NODE.gpu, "w4a16_mxfp4", EFFICIENCY) == gemm_ceiling(NODE.gpu, "bf16", EFFICIENCY)


def test_the_weight_only_gemm_is_bf16_math_and_the_formats_bytes_from_one_home():
    """ "w4a16_mxfp4 computes bf16" has one home (kernels.math_dtype): its peak, clock, ceiling and activation operand
    are bf16's on every GPU; its weight operand's bytes are workload.WEIGHT_FORMAT_BYTES["mxfp4"] (0.53125), not a
    second literal (review)."""
    from planner.kernels import _WEIGHT_OPERAND_BYTES, EXPERT_GEMM_DTYPE, clock_fraction, dense_peak, operand_bytes
    from planner.workload import WEIGHT_FORMAT_BYTES

    for preset in ("dgx-a100", "dgx-h100", "dgx-b200"):
        gpu = cluster_preset(preset, 1).gpu
        assert dense_peak(gpu, "w4a16_mxfp4") == dense_peak(gpu, "bf16")
        assert clock_fraction(gpu, "w4a16_mxfp4") == clock_fraction(gpu, "bf16")
        assert gemm_ceiling(gpu, "w4a16_mxfp4", EFFICIENCY) == gemm_ceiling(gpu, "bf16", EFFICIENCY)
    assert operand_bytes("w4a16_mxfp4") == operand_bytes("bf16") == 2.0
    assert _WEIGHT_OPERAND_BYTES[EXPERT_GEMM_DTYPE["mxfp4"]] == WEIGHT_FORMAT_BYTES["mxfp4"] == 0.53125


def test_only_the_experts_change_kind():
    """The attention and router GEMMs stay bf16, the experts' run the weight-only kernel, and no quantizing cast is
    charged (the activations stay bf16); the MoE layer's decode step at 64 sequences is faster than bf16's."""
    mx = {k.name: k for k in layer_kernels(_ctx("mxfp4"), True, NODE.gpu).forward}
    bf = {k.name: k for k in layer_kernels(_ctx("bf16"), True, NODE.gpu).forward}
    assert mx["qkv"].dtype == mx["attn_out"].dtype == mx["router"].dtype == "bf16"
    assert mx["experts_fc1"].dtype == mx["experts_fc2"].dtype == "w4a16_mxfp4"
    assert not [name for name in mx if "cast" in name]
    assert mx["qkv"].time_s == bf["qkv"].time_s
    assert mx["experts_fc1"].time_s < 0.6 * bf["experts_fc1"].time_s


def test_mxfp4_refusals():
    """A 422 naming options.weight_dtype: a GPU below compute capability 8.0 (Mxfp4Config.get_min_capability), a
    dense model (the format stores only experts), an engine it is not priced for (TensorRT-LLM)."""
    traffic, pools = Traffic(1000, 1000, concurrency=8), (Pool(tp=1),)
    options = ServeOptions(weight_dtype="mxfp4")
    old = replace(NODE, gpu=replace(NODE.gpu, sm=75, name="sm75"))
    cases = [
        (GPT_OSS, old, "vllm", "compute capability >= 8.0"),
        (MODEL_PRESETS["llama3-8b"], NODE, "vllm", "has no experts"),
        (GPT_OSS, NODE, "trtllm", "not priced for TensorRT-LLM"),
    ]
    for model, cluster, name, words in cases:
        with pytest.raises(SpecError) as err:
            plan_serving(model, cluster, engine(name), traffic, pools, options)
        assert err.value.field == "options.weight_dtype" and words in str(err.value), str(err.value)
    plan = plan_serving(GPT_OSS, NODE, engine("sglang"), traffic, pools, options)
    assert plan.fits
