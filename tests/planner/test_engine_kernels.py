"""The serving engines' own kernels (planner/engine_kernels.py, docs/serving.md "DeepSeek-V3 prefill, round 15
(dsv3s15)"): MLA's fused q_a / kv_a projection, SGLang's ep_scatter / ep_gather behind DeepEP's normal fp8 dispatch,
the masked low-latency experts. Closed forms on the LMSYS DeepSeek-V3 pools (bench/serving_validation.py) from the
kernels' sources, and the trait per engine."""

from __future__ import annotations

from dataclasses import replace

import pytest

from collectives.topology import cluster_preset
from planner import MODEL_PRESETS
from planner._errors import SpecError
from planner.engine_kernels import (
    EP_SCATTER_ROW_BYTES,
    MASKED_ACT_QUANT_BYTES,
    ep_gather_bytes,
    ep_scatter_bytes,
)
from planner.kernels import (
    _cast_gemms,
    cast_input_elements,
    deepep_received_tokens,
    engine_expert_memory,
    layer_kernels,
    masked_act_quant,
    mla_down_proj_n,
    quantized_dispatch,
)
from planner.parallel import validate_parallel
from planner.rules.deepep import distinct, legs
from planner.rules.expert import dispatch_row_bytes
from planner.serving import Pool, ServeOptions, engine
from planner.serving.deployment import _context, _worker, with_redundant_experts
from planner.workload import validate_workload

OPTIONS = ServeOptions(weight_dtype="fp8", redundant_experts=32)
MODEL = with_redundant_experts(MODEL_PRESETS["deepseek-v3"], 32)
CLUSTER = cluster_preset("dgx-h100", 12)
PREFILL = Pool("prefill", dp=32, ep=32, attention_dp=True, ep_dispatch="deepep", max_batch_tokens=16384)
DECODE = Pool("decode", dp=72, ep=72, attention_dp=True, ep_dispatch="deepep")


def layer(name: str, pool: Pool, phase: str, per_rank: int, context: int, moe: bool = True, kernels: bool = True):
    w = _worker(MODEL, CLUSTER, engine(name), pool, 0)
    par = w.decode_par if phase == "decode" else w.par
    ctx = _context(MODEL, OPTIONS, phase, per_rank * pool.dp, context, par, w)
    if not kernels:  # the planner's default layer (the training frameworks' kernels)
        ctx = replace(ctx, work=replace(ctx.work, engine_kernels=None))
    return ctx, {k.name: k for k in layer_kernels(ctx, moe, CLUSTER.gpu).forward}


def test_the_trait_per_engine():
    """Each engine's kernels from its own source: all three fuse MLA's down projections; SGLang and vLLM scatter the
    fp8 rows (ep_scatter) and run the masked low-latency experts with the fused activation quantize; TensorRT-LLM
    dispatches bf16 rows into its own fused MoE (neither set)."""
    sglang, vllm, trtllm = (engine(n).kernels for n in ("sglang", "vllm", "trtllm"))
    assert "fused_qkv_a_proj_with_mqa" in sglang.fused_mla_down_proj
    assert "fused_qkv_a_proj" in vllm.fused_mla_down_proj
    assert "kv_a_proj_with_mqa" in trtllm.fused_mla_down_proj
    assert "ep_scatter" in sglang.fp8_ep_scatter and "ep_scatter" in vllm.fp8_ep_scatter
    assert "silu_and_mul_masked_post_quant_fwd" in sglang.masked_act_quant
    assert "persistent_masked_m_silu_mul_quant" in vllm.masked_act_quant
    assert trtllm.fp8_ep_scatter is None and trtllm.masked_act_quant is None
    assert engine("trtllm").bf16_dispatches == ("deepep", "deepep_ll")


def test_fused_down_projection_is_one_gemm_of_2112():
    """SGLang's prefill layer: one GEMM 16,000 x 2,112 x 7,168 (q_lora_rank 1,536 + kv_lora_rank 512 + rope 64) where
    the default layer runs 1,536 and 576; its input quantized once, 16,000 x 7,168 elements at 3.03125 B less."""
    _, fused = layer("sglang", PREFILL, "prefill", 8, 2000, moe=False)
    _, split = layer("sglang", PREFILL, "prefill", 8, 2000, moe=False, kernels=False)
    assert mla_down_proj_n(MODEL.mla) == 2112
    assert fused["qkv_down"].shape == (16_000, 2112, 7168, 1)
    assert "q_down" not in fused and "kv_down" not in fused
    assert (split["q_down"].shape[1], split["kv_down"].shape[1]) == (1536, 576) and "qkv_down" not in split
    assert split["fp8_cast"].bytes - fused["fp8_cast"].bytes == pytest.approx(16_000 * 7168 * 3.03125, rel=1e-12)
    assert fused["qkv_down"].flops == pytest.approx(split["q_down"].flops + split["kv_down"].flops, rel=1e-12)
    # one launch and one wave for both: shorter than the two it replaces
    assert fused["qkv_down"].time_s < split["q_down"].time_s + split["kv_down"].time_s


def test_ep_scatter_moves_fp8_rows():
    """SGLang's prefill MoE layer at EP32 (9 local experts, 129,511 routed copies): the received tokens carry
    k / D = 8 / 7.395 copies each, D the distinct ranks a token reaches under DeepSeek's 4-node limit on 4 nodes of
    8 (rules/deepep.py destinations: 3.6 nodes x distinct(8, 8 / 3.6) ranks; mend15b, review r15a #3: it was
    distinct(32, 8) = 7.178 with no node limit, 3.0% apart from the legs' count); ep_scatter reads each received row
    once and writes each copy, 7,392 B a row (7,168 e4m3 + 56 fp32 scales), with the int64 ids and indices and the
    two scale transposes; ep_gather reads each copy's bf16 output and writes each received token's sum (2 B x 7,168
    a row). The ratios to the default layer moved with D (0.910 -> 0.922, 1.697 -> 1.721 at 7.178 -> 7.395)."""
    ctx, k = layer("sglang", PREFILL, "prefill", 8, 2000)
    fc1 = k["experts_fc1"]
    rows = fc1.shape[0] * fc1.shape[3]
    assert rows == pytest.approx(129_510.8, rel=1e-5)
    received = deepep_received_tokens(ctx, rows)
    nodes = 4 * (1 - (3 / 4) ** 8)
    ranks = nodes * 8 * (1 - (7 / 8) ** (8 / nodes))
    assert ranks == pytest.approx(7.395, abs=1e-3)
    assert received == pytest.approx(rows * ranks / 8, rel=1e-12)
    assert EP_SCATTER_ROW_BYTES * 7168 == 7392
    h, f = 7168, 2048
    scatter = 7392 * (received + rows) + 8 * 8 * received + 12 * rows + rows * (h + f) / 16
    assert ep_scatter_bytes(received, rows, h, f, 8) == pytest.approx(scatter, rel=1e-12)
    assert k["permute"].bytes == pytest.approx(scatter, rel=1e-12) and k["permute"].count == 4
    gather = 2 * h * (rows + received) + 20 * 8 * received
    assert ep_gather_bytes(received, rows, h, 8) == pytest.approx(gather, rel=1e-12)
    assert k["unpermute"].bytes == pytest.approx(gather, rel=1e-12) and k["unpermute"].count == 1
    # against the default layer's bf16 permute of the rank's own 16,000 tokens: the scatter moves less, the gather more
    _, default = layer("sglang", PREFILL, "prefill", 8, 2000, kernels=False)
    assert default["permute"].bytes == pytest.approx(2 * h * (16_000 + rows) + 16 * rows, rel=1e-12)
    assert k["permute"].bytes / default["permute"].bytes == pytest.approx(0.922, abs=0.001)
    assert k["unpermute"].bytes / default["unpermute"].bytes == pytest.approx(1.721, abs=0.001)


def test_received_tokens_are_the_legs_rows():
    """One home (review r15a #3): the tokens a rank receives are the (token, destination rank) pairs DeepEP's legs
    move over NVLink, per routed copy: at EP32 on 4 nodes and EP72 on 9 the two agree (3.0% apart before)."""
    for pool, phase, per_rank in ((PREFILL, "prefill", 8), (DECODE, "prefill", 8)):
        ctx, _ = layer("sglang", pool, phase, per_rank, 2000)
        tokens = 1_000_000
        dispatch, _ = legs(ctx, tokens, 1, 1)
        nvlink = sum(m for leg, _, m in dispatch if leg == "nvlink")
        k = ctx.model.moe.top_k
        assert deepep_received_tokens(ctx, k * 1000.0) == pytest.approx(1000.0 * nvlink / tokens, rel=1e-5)


def test_received_tokens_follow_uniform_routing():
    """One EP rank receives every token once: distinct(ep, k) ranks a token under uniform routing, so at ep 1 a
    received token carries all k copies (its own tokens) and at large ep nearly one each."""
    ctx, _ = layer("sglang", PREFILL, "prefill", 8, 2000)
    assert distinct(32, 8) == pytest.approx(32 * (1 - (31 / 32) ** 8), rel=1e-12) == pytest.approx(7.1776, abs=1e-4)
    one = replace(ctx, par=replace(ctx.par, ep=1, dp=1))
    assert deepep_received_tokens(one, 8_000) == 1_000


def test_masked_low_latency_experts():
    """SGLang's decode at EP72 (deepep_ll): the experts read DeepEP's low-latency layout, no permute or unpermute;
    SiLU-and-mul writes fc2's fp8 input with its 1x128 scales, 4 + 1 + 4/128 B an element of the R x 2,048 output,
    and no cast kernel quantizes it again (fc2 not among the cast GEMMs)."""
    ctx, k = layer("sglang", DECODE, "decode", 256, 2100)
    assert ctx.par.ep_dispatch == "deepep_ll"
    assert "permute" not in k and "unpermute" not in k
    fc2 = k["experts_fc2"]
    rows = fc2.shape[0] * fc2.shape[3]
    assert MASKED_ACT_QUANT_BYTES == 5.03125
    assert k["expert_activation"].bytes == pytest.approx(5.03125 * rows * 2048, rel=1e-12)
    assert "experts_fc2" not in {g.name for g in _cast_gemms(ctx, list(k.values()))}
    _, default = layer("sglang", DECODE, "decode", 256, 2100, kernels=False)
    assert default["expert_activation"].bytes == pytest.approx(6 * rows * 2048, rel=1e-12)
    assert "permute" in default and "unpermute" in default


def test_trtllm_low_latency_dispatches_bf16():
    """TensorRT-LLM's decode on DeepEP's low-latency kernels: 2 B rows (use_fp8=False), fc1 quantizing every received
    copy, its own permute kept (no masked SGLang path), fc2's input cast kept."""
    ctx, k = layer("trtllm", DECODE, "decode", 256, 2100)
    assert ctx.par.ep_dispatch == "deepep_ll" and ctx.dispatch_bytes == 2
    assert "permute" in k and "unpermute" in k
    gemms = {g.name for g in _cast_gemms(ctx, list(k.values()))}
    assert {"experts_fc1", "experts_fc2"} <= gemms


def test_training_keeps_two_down_projections():
    """No engine kernels on a training workload: Megatron-Core's linear_q_down_proj and linear_kv_down_proj (its
    --mla-down-proj-fusion defaults off)."""
    ctx, _ = layer("sglang", PREFILL, "prefill", 8, 2000, moe=False)
    train = replace(ctx, work=replace(ctx.work, kind="training", micro_batch_size=1, global_batch_size=32))
    names = {k.name for k in layer_kernels(train, False, CLUSTER.gpu).forward}
    assert {"q_down", "kv_down"} <= names and "qkv_down" not in names


B200 = cluster_preset("dgx-b200", 4)
FP4 = ServeOptions(weight_dtype="nvfp4")


def fp4_context(name: str, pool: Pool, phase: str, per_rank: int, context: int):
    model = MODEL_PRESETS["deepseek-v3"]
    w = _worker(model, B200, engine(name), pool, 0)
    par = w.decode_par if phase == "decode" else w.par
    return _context(model, FP4, phase, per_rank * pool.dp, context, par, w)


@pytest.mark.parametrize(("pool", "phase", "per_rank"), [(PREFILL, "prefill", 8), (DECODE, "decode", 256)])
def test_trtllm_post_quant_nvfp4_dispatch(pool, phase, per_rank):
    """TensorRT-LLM with an NVFP4 checkpoint on DeepEP (normal and low-latency): NVFP4 rows, h / 2 packed E2M1 bytes
    and h / 16 E4M3 scales = 4,032 B of a 7,168-wide token (deep_ep_low_latency.py's assertions), quantized by the
    sender (fc1's cast: the rank's own tokens); SGLang moves bf16 rows (14,336 B) and quantizes every copy."""
    pool = replace(pool, dp=32, ep=32)
    ctx = fp4_context("trtllm", pool, phase, per_rank, 2000)
    assert ctx.work.moe_dispatch_dtype == "nvfp4" and dispatch_row_bytes(ctx) == 7168 // 2 + 7168 // 16 == 4032
    fc1 = next(g for g in _cast_gemms(ctx, list(layer_kernels(ctx, True, B200.gpu).forward)) if g.name == "experts_fc1")
    tokens = per_rank * (2000 if phase == "prefill" else 1)
    assert cast_input_elements(ctx, fc1) == tokens * 7168
    sglang = fp4_context("sglang", pool, phase, per_rank, 2000)
    assert sglang.work.moe_dispatch_dtype is None and dispatch_row_bytes(sglang) == 14_336


def test_post_quant_dispatch_rules():
    """An NVFP4 dispatch is a serving engine's post-quant dispatch of NVFP4 weights on DeepEP's kernels: a training
    workload or fp8 weights with it, or another dispatcher, is a 422 at workload.moe_dispatch_dtype."""
    ctx = fp4_context("trtllm", PREFILL, "prefill", 8, 2000)
    with pytest.raises(SpecError, match="inference with param_dtype 'nvfp4' only"):
        validate_workload(replace(ctx.work, param_dtype="fp8"))
    validate_workload(ctx.work)
    par = replace(ctx.par, ep_dispatch="alltoall")
    with pytest.raises(SpecError, match="runs on DeepEP's kernels") as err:
        validate_parallel(par, ctx.model, ctx.work, par.world_size)
    assert err.value.field == "workload.moe_dispatch_dtype"


def test_fp8_ep_scatter_rows_only_for_fp8_rows():
    """Review r15a #4: an NVFP4 post-quant dispatch's rows arrive from the sender too, and an engine with
    fp8_ep_scatter (SGLang's kernels, given TensorRT-LLM's NVFP4 DeepEP rows) priced them as ep_scatter's 7,392 B
    fp8 rows; the trait reads fp8 rows only, and the masked condition has one home (masked_act_quant)."""
    ctx = fp4_context("trtllm", PREFILL, "prefill", 8, 2000)
    ctx = replace(ctx, work=replace(ctx.work, engine_kernels=engine("sglang").kernels))
    assert quantized_dispatch(ctx) == "sender" and ctx.work.moe_dispatch_dtype == "nvfp4"
    assert engine_expert_memory(ctx, 1000.0, 2048, 2) == ()
    fp8, _ = layer("sglang", PREFILL, "prefill", 8, 2000)
    assert [name for name, _ in engine_expert_memory(fp8, 1000.0, 2048, 2)] == ["permute", "unpermute"]
    decode, _ = layer("sglang", DECODE, "decode", 256, 2100)
    assert masked_act_quant(decode)
    assert [name for name, _ in engine_expert_memory(decode, 1000.0, 2048, 2)][-1] == "expert_activation"
    dense_act = replace(decode, model=replace(decode.model, gated_mlp=False))
    assert not masked_act_quant(dense_act) and engine_expert_memory(dense_act, 1000.0, 2048, 2) == ()
