"""GPT-OSS by mechanism (issue 20, gptoss; docs/step-time.md "GPT-OSS, by mechanism"): fused attention at head dim
64 at the H200's measured d-64 / d-128 rate, and what Megatron-Core runs unfused for it (YaRN RoPE, the GLU clamp,
the per-expert fc2 bias, the attention's bias-dropout-add), each kernel's bytes and launches worked by hand from
the framework's source. The learned attention sinks need nothing: the 25.11 container's cuDNN runs them fused."""

import json
from dataclasses import replace
from pathlib import Path
from statistics import median

import pytest

from collectives.topology.gpu import GPUS
from planner import ParallelSpec, SpecError, WorkloadSpec, model_preset
from planner.compute import layer_forward, recompute_modules_forward
from planner.context import Context
from planner.kernels import (
    EFFICIENCY,
    GLU_CLAMP,
    HEAD_DIM_K,
    ROPE_FREQS,
    STRIDED_BYTES_PER_SM_CYCLE,
    UNFUSED_ROPE,
    expert_rows,
    flash_attention_s,
    fused_dropout_s,
    head_dim_rate,
    layer_kernels,
    memory_kernel,
)
from planner.model import validate_model

H100 = GPUS["h100-sxm5-80gb"]
OSS = model_preset("gpt-oss-120b")
H200_DIR = Path(__file__).resolve().parents[1] / "reference" / "kernels" / "h200"


def ctx(model=OSS, framework="megatron", ep=8, dispatch="alltoall", **work):
    work = {"micro_batch_size": 4, "global_batch_size": 512} | work
    par = ParallelSpec(dp=8, ep=ep, ep_dispatch=dispatch, framework=framework)
    return Context(model, WorkloadSpec(**work), par)


def by_name(kernels):
    return {k.name: k for k in kernels}


# ---- head dim 64 ------------------------------------------------------------------------------------------


def _measured_d64_ratios(kernel: str) -> tuple[float, float]:
    """Median d-64 / d-128 rate of the H200's causal SDPA pairs at equal FLOPs and sequence (h16 x d64 against
    h8 x d128, runs 1 and 2): the forward's and the backward's."""
    fwd, bwd = [], []
    for run in ("run1", "run2"):
        rows = json.loads((H200_DIR / f"{run}.json").read_text())["sections"]["attention"]["rows"]
        by = {(r[0].split(".")[0], r[1], r[2], r[4]): r for r in rows}
        for r in rows:
            if r[7] == 64 and r[2] and r[1] == kernel:
                ref = by["h8", kernel, True, r[4]]
                assert ref[8] == r[8]  # the same FLOPs
                fwd.append(ref[9] / r[9])
                bwd.append(ref[10] / r[10])
    assert len(fwd) == 12
    return median(fwd), median(bwd)


@pytest.mark.parametrize("kernel", ["cudnn", "flash2"])
def test_head_dim_64_runs_at_the_measured_rate(kernel):
    """rate(64)/rate(128) = 1/(1 + k) is the H200's median pair ratio (cuDNN 0.767 / 0.818, FA2 0.974 / 0.907)."""
    measured = _measured_d64_ratios(kernel)
    model = head_dim_rate(kernel, 64)
    assert model == pytest.approx(measured, abs=0.002)
    assert 1 / (1 + HEAD_DIM_K[kernel][0]) == model[0]


def test_head_dim_rate_closed_form():
    """1 / (1 + k (128/d - 1)): d 96 pays a third of d 64's extra share; d >= 128 and other kernels none."""
    k_f, k_b = HEAD_DIM_K["cudnn"]
    assert head_dim_rate("cudnn", 96) == pytest.approx((1 / (1 + k_f / 3), 1 / (1 + k_b / 3)))
    assert head_dim_rate("cudnn", 128) == head_dim_rate("cudnn", 192) == (1.0, 1.0)
    assert head_dim_rate("flash3", 64) == (1.0, 1.0)
    # the kernel time: the d-128 time over the rate, launches apart
    flops, s = 1e12, 4096.0
    f128, b128 = flash_attention_s(flops, s, "cudnn", H100)
    f64, b64 = flash_attention_s(flops, s, "cudnn", H100, head_dim=64)
    r_f, r_b = head_dim_rate("cudnn", 64)
    launch = EFFICIENCY.kernel_s
    assert f64 - launch == pytest.approx((f128 - launch) / r_f)
    assert b64 - 3 * launch == pytest.approx((b128 - 3 * launch) / r_b)


def test_gpt_oss_attention_takes_its_head_dim_and_its_sinks_change_no_kernel():
    """The layer's cuDNN kernels at d 64's rate. The learned sinks add no kernel: TransformerEngine 2.9
    (fused_attn.cpp: learnable softmax with cuDNN >= 9.13.1) in the 25.11 container (TE 2.9, cuDNN 9.13.1.26,
    Megatron-Bridge docs/releases/software-versions.md at 5776a6d90b) runs them inside cuDNN's SDPA."""
    lk = by_name(layer_kernels(ctx(), True, H100).forward)
    no_sinks = by_name(layer_kernels(ctx(replace(OSS, attention_sinks=False)), True, H100).forward)
    assert lk["cudnn_fwd"] == no_sinks["cudnn_fwd"]
    d128 = replace(OSS, head_dim=128, num_attention_heads=32, num_kv_heads=4)  # the same q width and FLOPs
    ref = by_name(layer_kernels(ctx(d128), True, H100).forward)["cudnn_fwd"]
    assert ref.flops == lk["cudnn_fwd"].flops
    launch = EFFICIENCY.kernel_s
    # less the dropout's draws (none since bias10: GPT-OSS trains with attention_dropout 0, Megatron-Bridge's
    # GPTOSSProvider; FUSED_DROPOUT_SM_CYCLES) per score, and d 128 has half d 64's scores for the same FLOPs
    ref_t, oss_t = (k.time_s - launch - fused_dropout_s(ctx(), "cudnn", k.flops / (4 * d), H100)[0]
                    for k, d in ((ref, 128), (lk["cudnn_fwd"], 64)))  # fmt: skip
    assert ref_t / oss_t == pytest.approx(head_dim_rate("cudnn", 64)[0])


def test_mla_attention_rate_takes_its_qk_and_v_dims_not_hidden_over_heads():
    """DeepSeek-V3's MLA without a head_dim (a config that names none): hidden / heads is 7168 / 128 = 56, but
    its kernel runs qk 192 (128 nope + 64 rope) and
    v 128: per score 2·192 + 2·128 matmul FLOPs amortise one exponential, the mean 160 >= 128, so the d-128
    rate (no head-dim penalty); a d-56 rate would slow the cuDNN forward by 1 + k·(128/56 - 1) ~ 1.39."""
    v3 = replace(model_preset("deepseek-v3"), head_dim=None)
    c = Context(replace(v3, num_layers=4, moe=None), WorkloadSpec(micro_batch_size=1, global_batch_size=8),
                ParallelSpec(dp=8))  # fmt: skip
    assert v3.head_size == 56
    fwd = by_name(layer_kernels(c, False, H100).forward)["cudnn_fwd"]
    s = 4096
    assert fwd.flops == pytest.approx(2 * s * (s + 1) / 2 * 128 * (192 + 128))
    f128, _ = flash_attention_s(fwd.flops, s, "cudnn", H100)
    assert fwd.time_s == pytest.approx(f128, rel=1e-12)
    assert fwd.shape[-1] == 192


# ---- what Megatron runs unfused ---------------------------------------------------------------------------


def test_yarn_rope_runs_as_torch_ops_under_megatron():
    """Megatron fuses RoPE for position_embedding_type 'rope' only: YaRN's runs as 6 torch ops per tensor (24 B
    per element of q and k forward, 34 B in 9 kernels backward) and builds its cos/sin each call (44 B per
    element of the s x d frequencies, 6 kernels, for q and for k)."""
    c = ctx()
    T, q_k = 4 * 4096, (64 + 8) * 64  # rotary runs over q and k: 64 query heads, 8 kv heads of 64
    lk = layer_kernels(c, True, H100)
    fwd, bwd = by_name(lk.forward), by_name(lk.backward)
    (f_b, f_n), (b_b, b_n) = UNFUSED_ROPE
    assert (fwd["rotary"].bytes, fwd["rotary"].count) == (f_b * T * q_k, 2 * f_n)
    assert (bwd["rotary.bwd"].bytes, bwd["rotary.bwd"].count) == (b_b * T * q_k, 2 * b_n)
    freqs = (2 * ROPE_FREQS[0] * 4096 * 64, 2 * ROPE_FREQS[1])  # the q call's and the k call's
    assert (fwd["rotary_freqs"].bytes, fwd["rotary_freqs"].count) == freqs == (2 * 44 * 4096 * 64, 12)
    assert (2 * f_n, 2 * b_n, 2 * ROPE_FREQS[1]) == (12, 18, 12)  # q and k, each as its torch ops
    assert "rotary_freqs.bwd" not in bwd
    # plain RoPE, or another framework: the fused (or the flavour's own eager) kernel as before
    plain = by_name(layer_kernels(ctx(replace(OSS, rope_scaling=None)), True, H100).forward)
    assert (plain["rotary"].bytes, plain["rotary"].count) == (4 * T * q_k, 2) and "rotary_freqs" not in plain
    torch = by_name(layer_kernels(ctx(framework="torch"), True, H100).forward)
    assert torch["rotary"].bytes == 20 * T * q_k and "rotary_freqs" not in torch


def test_the_glu_clamp_is_three_kernels_and_moe_act_recompute_runs_it_again():
    """Megatron clamps the two halves and concatenates them before the fused quick-GeGLU: 16 B per element of the
    R x f activation output in 3 kernels, 30 B in 9 backward (clamp_backward's compares, mask and where);
    recompute_modules moe_act re-runs it."""
    c = ctx()
    rows, local = expert_rows(c)
    R, f = rows * local, 2880
    lk = layer_kernels(c, True, H100)
    fwd, bwd = by_name(lk.forward), by_name(lk.backward)
    (cf, cn), (cb, cbn) = GLU_CLAMP
    assert (cf, cn, cb, cbn) == (4 + 4 + 8, 3, (3 + 5) + (3 + 3 + 3 + 5) + 8, 2 + 1 + 4 + 1 + 1)
    assert (fwd["expert_act_clamp"].bytes, fwd["expert_act_clamp"].count) == (cf * R * f, cn)
    assert (bwd["expert_act_clamp.bwd"].bytes, bwd["expert_act_clamp.bwd"].count) == (cb * R * f, cbn)
    # the two clamps' 8 B read and write a strided half: at 5.55 B an SM-cycle x 132 SMs x 1,980 MHz = 1.45 TB/s,
    # below the H100's copy rate 3,350 GB/s x 0.877 (round eight)
    plain = memory_kernel("c", cf * R * f, H100, EFFICIENCY, 3, 1e-5).time_s
    issue = STRIDED_BYTES_PER_SM_CYCLE * 132 * 1980e6
    extra = 8 * R * f * (1 / issue - 1 / (H100.hbm_GBps * 1e9 * EFFICIENCY.hbm))
    assert fwd["expert_act_clamp"].time_s == pytest.approx(plain + extra, rel=1e-12)
    layer = layer_forward(c, True, H100)[0]
    redo = recompute_modules_forward(c, lk, layer, H100, EFFICIENCY, frozenset({"moe_act"}), True)
    unclamped = ctx(replace(OSS, glu_clamp=None))
    lk0 = layer_kernels(unclamped, True, H100)
    redo0 = recompute_modules_forward(
        unclamped, lk0, layer_forward(unclamped, True, H100)[0], H100, EFFICIENCY, frozenset({"moe_act"}), True
    )
    assert redo.total_s - redo0.total_s == pytest.approx(fwd["expert_act_clamp"].time_s)
    assert "expert_act_clamp" not in by_name(lk0.forward)
    assert "expert_act_clamp" not in by_name(layer_kernels(ctx(framework="torch"), True, H100).forward)


@pytest.mark.parametrize(
    ("dispatch", "fwd_b", "fwd_n", "bwd_b", "bwd_n"),
    [
        ("alltoall", 12, 2 * 16 + 1, 16, 4 * 16 + 1),  # bf16 probs: b*p 2, add 6, cat 4; grads 2 x 6 + split's cat 4
        ("hybridep", 28, 2 * 16 + 2, 40, 5 * 16 + 2),  # fp32 probs: 4, 10, 8 and the cast 6; 6 + 6 + 24 + 4
    ],
)
def test_the_expert_fc2_bias_is_a_loop_over_the_local_experts(dispatch, fwd_b, fwd_n, bwd_b, bwd_n):
    """TEGroupedMLP._apply_bias: per local expert t + b * p, then one cat; 16 local experts at EP 8."""
    c = ctx(dispatch=dispatch)
    rows, local = expert_rows(c)
    assert local == 16
    lk = layer_kernels(c, True, H100)
    fwd, bwd = by_name(lk.forward), by_name(lk.backward)
    R, h = rows * local, 2880
    assert (fwd["expert_bias"].bytes, fwd["expert_bias"].count) == (pytest.approx(fwd_b * R * h), fwd_n)
    assert (bwd["expert_bias.bwd"].bytes, bwd["expert_bias.bwd"].count) == (pytest.approx(bwd_b * R * h), bwd_n)


def test_no_bias_loop_under_cuda_graphs_without_biases_or_outside_megatron():
    for c in (ctx(cuda_graphs=True), ctx(replace(OSS, linear_bias=False)), ctx(framework="torch")):
        assert "expert_bias" not in by_name(layer_kernels(c, True, H100).forward)


def test_the_attention_bias_dropout_add_is_unfused_for_a_biased_moe():
    """TEGroupedMLP forbids bias_dropout_fusion with add_bias_linear: x + bias before the residual add (4 B per
    element of h), and its bias gradient, a sum over the tokens (2 B); a bias-free MoE fuses it as before."""
    T, h = 4 * 4096, 2880
    lk = layer_kernels(ctx(), True, H100)
    assert by_name(lk.forward)["attn_bias_add"].bytes == 4 * T * h
    assert by_name(lk.backward)["attn_bias_add.bwd"].bytes == 2 * T * h
    assert "attn_bias_add" not in by_name(layer_kernels(ctx(replace(OSS, linear_bias=False)), True, H100).forward)


def test_a_dense_model_is_untouched():
    """Llama 3 (plain RoPE, no biases, no clamp): the same kernels as before these rules (none of their names)."""
    names = {k.name for k in layer_kernels(ctx(model_preset("llama3-8b"), ep=1), False, H100).forward}
    assert not names & {"rotary_freqs", "expert_act_clamp", "expert_bias", "attn_bias_add", "mlp_bias_add"}


# ---- the model fields -------------------------------------------------------------------------------------


def test_gpt_oss_preset_and_config_json_carry_yarn_and_the_clamp():
    from planner.presets import from_hf_config

    hf_dir = Path(__file__).resolve().parents[1] / "reference" / "hf_configs"
    hf = json.loads((hf_dir / "gpt-oss-120b.json").read_text())
    imported = from_hf_config(hf)
    assert (imported.rope_scaling, imported.glu_clamp) == (OSS.rope_scaling, OSS.glu_clamp) == ("yarn", 7.0)
    assert from_hf_config(hf | {"rope_scaling": None, "swiglu_limit": None}).rope_scaling is None


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        ({"glu_clamp": 7.0, "gated_mlp": False}, "model.glu_clamp", "gated_mlp"),
        ({"glu_clamp": -1.0}, "model.glu_clamp", "-1.0"),
        ({"rope_scaling": "ntk"}, "model.rope_scaling", "yarn"),
    ],
)
def test_bad_fields_name_themselves(change, field, words):
    with pytest.raises(SpecError) as e:
        validate_model(replace(OSS, **change))
    assert e.value.field == field and words in str(e.value)


def test_the_fused_grouped_mlp_clamps_and_adds_the_bias_inside():
    """TE's fused grouped MLP (workload.fused_grouped_mlp, the 26.08 recipes' op fuser): ScaledClampedQGeGLU clamps in
    its activation and fc2's bias is scaled by the probs in the GEMM (Megatron-LM d98e8a6 experts.py
    _make_fused_ops): neither the clamp's kernels nor the per-expert bias loop; the bias-dropout-add stays unfused
    (TEGroupedMLP's assert holds either way)."""
    b200 = GPUS["b200-180gb"]
    mx = {"activation_dtype": "fp8", "fp8_recipe": "mxfp8"}
    per_expert = by_name(layer_kernels(ctx(**mx), True, b200).forward)
    fused = by_name(layer_kernels(ctx(**mx, fused_grouped_mlp=True), True, b200).forward)
    assert {"expert_act_clamp", "expert_bias", "attn_bias_add"} <= set(per_expert)
    assert not {"expert_act_clamp", "expert_bias"} & set(fused) and "attn_bias_add" in fused


# ---- which attention backend runs the sinks (TE 2.9 get_attention_backend) ----------------------------------

A100 = GPUS["a100-sxm4-80gb"]
B200 = GPUS["b200-180gb"]


@pytest.mark.parametrize(
    ("gpu", "sinks", "expected"),
    [(A100, True, "cudnn"), (A100, False, "flash2"), (H100, True, "cudnn"), (B200, True, "cudnn")],
)
def test_flash_runs_cudnn_for_learned_sinks_under_megatron(gpu, sinks, expected):
    """TE 2.9 drops FlashAttention for softmax_type 'learnable' and cuDNN >= 9.13.1 runs it fused on sm80 and later:
    "flash" is cuDNN for GPT-OSS on the A100 as well (FlashAttention-2 without sinks); the H100 and B200 already
    prefer cuDNN. Priced as such: the A100 layer's attention is cudnn_fwd, at cuDNN's sm80 ceiling."""
    from planner.kernels import attention_kernel

    c = ctx(replace(OSS, attention_sinks=sinks))
    assert attention_kernel(c, gpu) == expected
    names = {k.name for k in layer_kernels(c, True, gpu).forward}
    assert f"{expected}_fwd" in names


def test_torch_has_no_sink_rule():
    """The rule is the Megatron flavour's data (sink_attention_kernels); torch and DeepSpeed were not read for it."""
    from planner.flavours import flavour
    from planner.kernels import attention_kernel

    assert flavour("megatron").sink_attention_kernels == ("cudnn", "unfused")
    assert flavour("torch").sink_attention_kernels == flavour("deepspeed").sink_attention_kernels == ()
    assert attention_kernel(ctx(framework="torch"), A100) == "flash2"


@pytest.mark.parametrize(("kernel", "gpu"), [("flash2", A100), ("flash2", H100), ("flash3", H100)])
def test_flash_attention_with_sinks_is_a_spec_error(kernel, gpu):
    from planner.kernels import check_kernel_options

    with pytest.raises(SpecError) as e:
        check_kernel_options(ctx(attention_kernel=kernel), gpu)
    assert e.value.field == "workload.attention_kernel"
    assert "learnable" in str(e.value) and "flash, cudnn, unfused" in str(e.value)
    check_kernel_options(ctx(replace(OSS, attention_sinks=False), attention_kernel=kernel), gpu)  # no sinks: fine


def test_unfused_attention_adds_the_sink_column_by_hand():
    """Unfused attention with sinks (TE 2.9 UnfusedDotProductAttention: torch.cat of the sink column, the slice's
    backward): b·(a/t) = 4 x 64 = 256 score matrices of 4,096 x 4,096 bf16 scores, 4.29e9 scores a layer. Forward the
    cat reads and writes each score: 2 x 2 B = 4 B, 17.18 GB in 1 kernel; backward zeros, copy (3 x 2 B) and the sink
    gradient's read of 256 x 4,096 rows: 25.77 GB + 2.1 MB in 3 kernels. Without sinks neither kernel is there."""
    c = ctx(attention_kernel="unfused")
    scores = 4 * 64 * 4096 * 4096
    lk = layer_kernels(c, True, H100)
    fwd, bwd = by_name(lk.forward)["softmax_sink"], by_name(lk.backward)["softmax_sink.bwd"]
    assert (fwd.bytes, fwd.count) == (4 * scores, 1)
    assert (bwd.bytes, bwd.count) == (6 * scores + 2 * 4 * 64 * 4096, 3)
    assert fwd.time_s == pytest.approx(memory_kernel("x", 4 * scores, H100, EFFICIENCY, 1).time_s)
    plain = layer_kernels(ctx(replace(OSS, attention_sinks=False), attention_kernel="unfused"), True, H100)
    assert "softmax_sink" not in by_name(plain.forward) and "softmax_sink.bwd" not in by_name(plain.backward)


# ---- a windowed layer's cost, checked on the H200 (tests/reference/kernels/h200/swa_cudnn.json) -----------------

H200 = GPUS["h200-sxm-141gb"]
SWA = json.loads((H200_DIR / "swa_cudnn.json").read_text())["rows"]


def _attention_times(model, b, s):
    from planner.kernels import attention_kernels

    c = ctx(replace(model, seq_length=s), micro_batch_size=b, global_batch_size=8 * b)
    fwd, bwd = attention_kernels(c, H200, EFFICIENCY, 0.0)
    # less the dropout's draws (FUSED_DROPOUT_SM_CYCLES, per score: d 64, FLOPs / (4 x 64) scores)
    drop_f, drop_b = fused_dropout_s(c, "cudnn", sum(k.flops for k in fwd) / 256, H200)
    return sum(k.time_s - k.count * EFFICIENCY.kernel_s for k in fwd) - drop_f, sum(
        k.time_s - k.count * EFFICIENCY.kernel_s for k in bwd
    ) - drop_b


@pytest.mark.parametrize(("b", "s", "rule"), [(4, 4096, 0.300), (1, 8192, 0.167), (4, 1024, 0.742)])
def test_a_windowed_layer_costs_its_band_of_tiles_as_cuDNN_measured(b, s, rule):
    """A 128-token window against a full causal layer on one rank, forward and backward: the rule's ratio is
    (keys_w + 128 + 512) / (keys_full x (s + 1,024) / s) (FLASH_TILE, s0/2), e.g. (126.02 + 640) / 2,560.6 = 0.299 at
    4k; the H200's cuDNN 9.19 gave 0.294 / 0.329 (forward / backward) at 4k, 0.165 / 0.190 at 8k, 0.795 / 0.759 at 1k.
    The rule is within 15% of every measured ratio (the farthest: 8k backward, 0.166 against 0.190, 12%; before it:
    0.45, 0.25, 1.05, up to 51% off)."""
    full = _attention_times(replace(OSS, sliding_window=None, full_attention_interval=None), b, s)
    windowed = _attention_times(replace(OSS, full_attention_interval=None), b, s)
    ratio = windowed[0] / full[0]
    assert ratio == pytest.approx(windowed[1] / full[1], rel=1e-9)  # one shape term for both passes
    assert ratio == pytest.approx(rule, abs=0.002)
    rows = {(r["b"], r["s"], r["window"] is not None): r for r in SWA}
    m_full, m_win = rows[b, s, False], rows[b, s, True]
    fwd = m_win["fwd_s"] / m_full["fwd_s"]
    bwd = (m_win["fwd_bwd_s"] - m_win["fwd_s"]) / (m_full["fwd_bwd_s"] - m_full["fwd_s"])
    assert ratio == pytest.approx(fwd, rel=0.15) and ratio == pytest.approx(bwd, rel=0.15)


# ---- the GLU clamp's strided kernels, the weighted activation's backward (reference/kernels/h200/glu_act.json) ----

GLU_ACT = json.loads((H200_DIR / "glu_act.json").read_text())["geglu"]


def _measured_us(*names) -> float:
    """Per step: the summed device time of the profiled kernels whose name holds any of ``names`` (10 steps)."""
    return sum(n * us for key, n, us in GLU_ACT["kernels"] if any(name in key for name in names)) / 10


H100_GLU_ACT = json.loads((H200_DIR.parent / "h100" / "glu_act.json").read_text())["geglu"]


@pytest.mark.parametrize("data", [GLU_ACT, H100_GLU_ACT], ids=["h200", "h100"])
def test_the_strided_rate_is_what_the_clamp_kernels_ran_at_on_both_gpus(data):
    """STRIDED_BYTES_PER_SM_CYCLE from each profile by hand: the clamps (2 a step, 4 B an element each), the compares
    (3, 3 B) and the where's (2, 5 B) over 65,536 x 2,880 elements, 27 B an element in all, per SM-cycle of 132 SMs
    at 1,980 MHz: 5.64 (H200) and 5.47 (H100), within 2% of the constant, while their copies differ by 1.39x (4.07
    against 2.92 TB/s): an issue rate, not a share of the HBM."""
    from planner.kernels import GLU_CLAMP_STRIDED

    elements = data["R"] * data["f"]
    strided_us = (
        sum(
            n * us
            for key, n, us in data["kernels"]
            if any(name in key for name in ("launch_clamp_scalar", "compare_scalar_kernel", "where_kernel_impl"))
        )
        / 10
    )
    assert sum(GLU_CLAMP_STRIDED) == 8 + 19 == 2 * 4 + 3 * 3 + 2 * 5
    per_cycle = 27 * elements / (strided_us * 1e-6) / (132 * 1980e6)
    assert per_cycle == pytest.approx(STRIDED_BYTES_PER_SM_CYCLE, rel=0.02)
    assert (8 * GLU_ACT["R"] * GLU_ACT["f"] / GLU_ACT["copy_us"]) / (8 * elements / data["copy_us"]) in (
        pytest.approx(1.0),
        pytest.approx(4.067 / 2.92, rel=0.01),
    )


def test_the_clamp_and_the_weighted_activation_against_the_h200():
    """At the profiled shape the clamp's forward (two strided clamps and the cat) and backward (compares, the
    logical_and, where's, the halves' cat) are within 6% of the H200's kernels; the compiled activation's forward
    within 6%; its backward is the source's two kernels, 16 B an element (10 B the input gradient, 6 B the probs'
    gradient sum), and runs 35% slower than that on the H200 (its cat-writing kernel at 0.57 of a copy: not
    modelled, a lower bound)."""
    from planner.kernels import FUSED, efficiency, routed_expert_kernels

    rows, f = GLU_ACT["R"], GLU_ACT["f"]
    fw, bw = routed_expert_kernels(
        rows, rows, 1, 2880, f, True, "bf16", 2, FUSED, H200, efficiency(H200, None), glu_clamp=True, weighted_act=True
    )
    k = by_name(fw + bw)
    cat_us = _measured_us("CatArrayBatchedCopy") / 2  # one in the forward, one (the chunk's backward) after it
    fwd_us = _measured_us("launch_clamp_scalar") + cat_us
    bwd_us = _measured_us("compare_scalar_kernel", "logical_and", "where_kernel_impl", "FillFunctor") + cat_us
    assert k["expert_act_clamp"].time_s * 1e6 == pytest.approx(fwd_us, rel=0.06)
    assert k["expert_act_clamp.bwd"].time_s * 1e6 == pytest.approx(bwd_us, rel=0.06)
    act_fwd_us = _measured_us("triton_poi_fused_add_mul_sigmoid")
    assert k["expert_activation"].time_s * 1e6 == pytest.approx(act_fwd_us, rel=0.06)
    act_bwd = k["expert_activation.bwd"]
    assert (act_bwd.bytes, act_bwd.count) == (16 * rows * f, 2)
    measured = _measured_us("triton_poi_fused_add_cat", "triton_red_fused")
    assert act_bwd.time_s * 1e6 == pytest.approx(measured / 1.536, rel=0.03)
    plain = by_name(routed_expert_kernels(rows, rows, 1, 2880, f, True, "bf16", 2, FUSED, H200, EFFICIENCY)[1])
    assert (plain["expert_activation.bwd"].bytes, plain["expert_activation.bwd"].count) == (12 * rows * f, 1)


def test_megatron_runs_the_weighted_activation_and_torch_does_not():
    from planner.flavours import flavour

    assert flavour("megatron").weighted_act_grad and not flavour("torch").weighted_act_grad
    mega = by_name(layer_kernels(ctx(), True, H100).backward)["expert_activation.bwd"]
    torch_ = by_name(layer_kernels(ctx(framework="torch"), True, H100).backward)["expert_activation.bwd"]
    # Megatron: the fused backward's 12 B + the probs' sum 4 B, 2 kernels; torch eager: its own chain (EAGER's 10 B
    # forward, twice backward), no probs inside
    assert mega.count == 2 and torch_.bytes / mega.bytes == pytest.approx(20 / 16)


def test_a_floored_kernels_strided_bytes_add_to_its_gpu_time_not_to_the_floor():
    """kernels._strided on a kernel the host floor already raised: max(GPU time + extra, floor), never floor +
    extra (review r8c). A 1 us GPU kernel under a 30 us floor with 10 KB strided on the H100: still 30 us."""
    from planner.kernels import EFFICIENCY, Kernel, _floored, _strided

    gpu = GPUS["h100-sxm5-80gb"]
    k = _floored(Kernel("clamp", "memory", 1e-6, bytes=10_000), 30e-6)
    assert k.time_s == 30e-6 and k.gpu_s == 1e-6
    out = _strided(k, 10_000, gpu, EFFICIENCY, 30e-6)
    assert out.time_s == 30e-6 and 1e-6 < out.gpu_s < 30e-6
    big = _strided(k, 1e9, gpu, EFFICIENCY, 30e-6)  # past the floor: the GPU's own time, unfloored
    assert big.time_s > 30e-6 and big.gpu_s in (None, big.time_s)
