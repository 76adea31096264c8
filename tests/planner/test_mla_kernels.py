"""DeepSeek-V3's MLA kernels (issue 20, dsv3; docs/step-time.md "DeepSeek-V3 (dsv3)"): Megatron-Core's fused MLA
RoPE kernels' bytes worked by hand from megatron/core/fusions/fused_mla_yarn_rope_apply.py at 92c8482e6d, what the
``mla_up_proj`` checkpoint re-runs, and core attention at head dims 192/128 against cuDNN's own published SDPA
measurements (tests/reference/kernels/cudnn_frontend_sdpa.json)."""

import json
from pathlib import Path
from statistics import median

import pytest

from collectives.topology.gpu import GPUS
from planner import ParallelSpec, WorkloadSpec, model_preset
from planner.compute import layer_forward, recompute_modules_forward
from planner.context import Context
from planner.kernels import (
    EFFICIENCY,
    MLA_ROPE_KERNELS,
    causal_keys,
    core_attention_flops,
    flash_attention_s,
    head_dim_rate,
    layer_kernels,
    memory_kernel,
    mla_rope_bytes,
)

B200 = GPUS["b200-180gb"]
DSV3 = model_preset("deepseek-v3")
GB200 = GPUS["gb200-186gb"]
SDPA_FILE = Path(__file__).resolve().parents[1] / "reference" / "kernels" / "cudnn_frontend_sdpa.json"
SDPA = json.loads(SDPA_FILE.read_text())


def ctx(tp=1, framework="megatron", **work):
    work = {"micro_batch_size": 1, "global_batch_size": 2048, "seq_length": 4096} | work
    par = ParallelSpec(dp=16, ep=8, tp=tp, sequence_parallel=tp > 1, framework=framework)
    return Context(DSV3, WorkloadSpec(**work), par)


def by_name(kernels):
    return {k.name: k for k in kernels}


# ---- the fused RoPE kernels -------------------------------------------------------------------------------


def test_mla_rope_bytes_by_hand():
    # n 128 heads, nope 128, rope 64, v 128, bf16. Forward: q's rope slice read and written in place (2·128·64·2);
    # kv: read kv_up's output 128·256 and k_pe 64, write key 128·192 and value 128·128, 2 B each.
    (q_f, kv_f), (q_b, kv_b) = mla_rope_bytes(DSV3.mla, 128, 2)
    assert q_f == 2 * 128 * 64 * 2 == 32_768
    assert kv_f == (128 * 256 + 64 + 128 * 192 + 128 * 128) * 2 == 147_584
    # backward (rotary_bwd_kv_kernel): dq's rope slice in place; dk read once - its per-head load covers only the
    # nope part (dk_in_off over k_dim = 128), the head-block-0 program reads the rope slices (64) of every head -
    # so dk 192 a head; dv (128) read, d_kv (256) written, d_k_pe (64) written
    assert q_b == 32_768
    assert kv_b == (128 * 128 + 128 * 64 + 128 * 128 + 128 * 256 + 64) * 2 == 147_584
    assert q_b + kv_b == q_f + kv_f == 180_352
    # tp 8: 16 heads a rank; k_pe stays whole on every rank
    (q8, kv8), _ = mla_rope_bytes(DSV3.mla, 16, 2)
    assert (q8, kv8) == (2 * 16 * 64 * 2, (16 * 256 + 64 + 16 * 192 + 16 * 128) * 2)


def test_training_layer_runs_the_fused_mla_rope_kernels():
    c = ctx()
    lk = layer_kernels(c, True, B200)
    fwd, bwd = by_name(lk.forward), by_name(lk.backward)
    assert "rotary" not in fwd and "rotary.bwd" not in bwd
    tokens = 4096
    assert fwd["mla_rope"].bytes == tokens * 180_352
    assert bwd["mla_rope.bwd"].bytes == tokens * 180_352
    assert fwd["mla_rope"].count == bwd["mla_rope.bwd"].count == MLA_ROPE_KERNELS == 2
    # at the achievable HBM bandwidth plus two launches
    assert fwd["mla_rope"].time_s == pytest.approx(memory_kernel("x", tokens * 180_352, B200, EFFICIENCY, 2).time_s)
    # after the up-projections, before core attention
    names = [k.name for k in lk.forward]
    assert names.index("kv_up") < names.index("mla_rope") < names.index(lk.attention[0].name)


def test_fp8_recipe_keeps_the_rope_in_bf16():
    # the up-projections' outputs are bf16 under TE's fp8 recipes: the rope kernels move 2-byte elements
    c = ctx(activation_dtype="fp8", fp8_recipe="mxfp8")
    assert by_name(layer_kernels(c, True, B200).forward)["mla_rope"].bytes == 4096 * 180_352


def test_torch_compile_keeps_the_generic_rotary():
    # fused_mla_yarn_rope_apply is Megatron-Core's; a compiled torch run fuses, but does not run those kernels
    eager = layer_kernels(ctx(framework="torch"), True, B200)
    compiled = layer_kernels(ctx(framework="torch", torch_compile=True), True, B200)
    for lk in (eager, compiled):
        names = {k.name for k in lk.forward}
        assert "rotary" in names and "mla_rope" not in names
    tokens = 4096
    rope = tokens * 128 * 64 + tokens * 64  # q's rope slices and the shared k_pe
    assert by_name(compiled.forward)["rotary"].bytes == pytest.approx(4 * rope)


def test_inference_keeps_the_generic_rotary():
    c = Context(DSV3, WorkloadSpec(kind="inference", batch_size=1, context_length=4096), ParallelSpec(tp=8))
    names = {k.name for k in layer_kernels(c, True, B200).forward}
    assert "rotary" in names and "mla_rope" not in names


def test_mla_up_proj_recompute_reruns_the_rope_and_the_latent_norms():
    c = ctx(activation_recompute="selective", recompute_modules=("mla_up_proj",))
    lk = layer_kernels(c, True, B200)
    layer, _ = layer_forward(c, True, B200)
    redo = recompute_modules_forward(c, lk, layer, B200, EFFICIENCY, frozenset({"mla_up_proj"}), True)
    fwd = by_name(lk.forward)
    memory = fwd["mla_rope"].time_s + fwd["q_norm"].time_s + fwd["kv_norm"].time_s
    assert redo.elementwise_s == pytest.approx(memory)
    # the up-projections' GEMMs at their parameter share of the layer's GEMM FLOPs (unchanged here): within 1% of
    # the q_up and kv_up kernels' own FLOPs
    assert redo.flops == pytest.approx(fwd["q_up"].flops + fwd["kv_up"].flops, rel=0.01)


# ---- core attention at head dims 192 / 128 -----------------------------------------------------------------


def _rows(name):
    cols = SDPA["columns"]
    return [dict(zip(cols, r, strict=True)) for r in SDPA["sets"][name]["rows"]]


def test_cudnn_benchmark_counts_flops_as_the_planner():
    # the published TFLOP/s x time is core_attention_flops over the causal mean keys, to 0.5%
    for name in SDPA["sets"]:
        for r in _rows(name):
            if r["q_seqlen"] < 2048:
                continue
            keys = causal_keys(r["kv_seqlen"], None)
            f = core_attention_flops(1, r["q_seqlen"], keys, r["num_q_heads"], r["head_dim_qk"], r["head_dim_vo"])
            assert f == pytest.approx(r["fwd_tflops"] * 1e12 * r["fwd_ms"] * 1e-3, rel=0.005)


def test_mla_head_dims_run_at_the_d128_rate():
    # cuDNN 9.18.1 on GB200, same sequences, causal: MLA's 128 heads at 192/128 against Llama 3.1's 64 x d128 at
    # equal sequence: the TFLOP/s ratio is 1.02 forward, 0.98 backward (medians over 2k-32k) - the planner's
    # head_dim_rate at (192 + 128) / 2 = 160 is its d-128 rate (d >= 128), which the measurement bears out.
    dsv3 = {r["q_seqlen"]: r for r in _rows("gb200_cudnn_9.18.1_dsv3")}
    llama = {r["q_seqlen"]: r for r in _rows("gb200_cudnn_9.18.1_llama3.1")}
    fwd = median(dsv3[s]["fwd_tflops"] / llama[s]["fwd_tflops"] for s in dsv3)
    bwd = median(dsv3[s]["bwd_tflops"] / llama[s]["bwd_tflops"] for s in dsv3)
    assert fwd == pytest.approx(1.03, abs=0.02)
    assert bwd == pytest.approx(0.95, abs=0.04)
    assert head_dim_rate("cudnn", 160) == head_dim_rate("cudnn", 128) == (1.0, 1.0)
    # so the planner's MLA and d-128 attention times keep the measured ratio of their FLOPs' times, within 10%
    for s in dsv3:
        model = []
        for r in (dsv3[s], llama[s]):
            qk, v = r["head_dim_qk"], r["head_dim_vo"]
            flops = core_attention_flops(1, s, causal_keys(s, None), r["num_q_heads"], qk, v)
            model.append(flash_attention_s(flops, s, "cudnn", GB200, EFFICIENCY, 1, (qk + v) / 2))
        measured = dsv3[s]["fwd_ms"] / llama[s]["fwd_ms"]
        assert model[0][0] / model[1][0] == pytest.approx(measured, rel=0.10)
