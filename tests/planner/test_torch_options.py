"""The torch options of issue 21 (torchopt), each hand-checked against its source:

- torchao's float8 rowwise recipe (torchao/float8/config.py Float8LinearRecipeName.ROWWISE): forward GEMMs on
  torch._scaled_mm's rowwise kernel, backward GEMMs on the tensorwise kernel with a rescale of their output
  (float8_ops.py addmm_float8_unwrapped); compute capability >= 8.9; torch only;
- FSDP2's float8 all-gather (torchao enable_fsdp_float8_all_gather, fsdp_utils.py): each unit's Float8Linear
  weights gathered at 1 B per element, an fp32 amax all-reduce per weight per gather, or one all-reduce of all the
  amaxes per step with precompute_float8_dynamic_scale_for_fsdp;
- torch's context_parallel ring attention (_context_parallel/_attention.py): K/V all-gathered once per attention
  call (allgather) or rotated by c-1 sends (alltoall); the fp32 K/V gradients rotated c times either way.

Llama-3 8B per layer: q and o 4096 x 4096 = 16,777,216; k and v 4096 x 1024 = 4,194,304; gate, up, down
4096 x 14,336 = 58,720,256: 218,103,808 linear elements in 7 Float8Linear weights, plus 2 x 4,096 norm elements."""

from __future__ import annotations

from dataclasses import replace

import pytest

from collectives.topology import cluster_preset
from planner import ParallelSpec, SpecError, WorkloadSpec, build_plan, model_preset
from planner.context import Context
from planner.kernels import EFFICIENCY, GEMM_CEILING, ROWWISE_RESCALE_BYTES, gemm_ceiling, layer_kernels
from planner.recipes import RECIPES

LLAMA8B = model_preset("llama3-8b")
LINEAR = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336  # 218,103,808
NORMS = 2 * 4096
H100 = cluster_preset("dgx-h100", 1)


def _calls(par: ParallelSpec, cluster=H100, model=LLAMA8B, **work) -> dict[str, list]:
    plan = build_plan(model, WorkloadSpec(micro_batch_size=1, global_batch_size=8, **work), par, cluster)
    out: dict[str, list] = {}
    for priced in plan.calls:
        out.setdefault(priced.call.name, []).append(priced.call)
    return out


def _torch(**kw) -> ParallelSpec:
    return ParallelSpec(framework="torch", **({"dp": 8, "zero_stage": 3} | kw))


# ---- float8 rowwise ---------------------------------------------------------------------------------------


def test_rowwise_recipe_is_torchaos_data():
    r = RECIPES["rowwise"]
    assert (r.library, r.kernel_dtype, r.backward_kernel_dtype, r.min_sm) == ("torchao", "fp8_rowwise", "fp8", 89)
    assert r.cast_bytes_per_element == 4 + 2 * 1.0  # each operand read twice, one fp8 copy per orientation
    assert not r.float8_all_gather and RECIPES["tensorwise"].float8_all_gather
    # 0.95 of the tensorwise ceiling (pytorch issue 147971: "within 90-100% of tensor-wise efficiency")
    gpu = H100.gpu
    assert gemm_ceiling(gpu, "fp8_rowwise", EFFICIENCY) == round(GEMM_CEILING[(90, "fp8")] * 0.95, 3) == 0.802


def test_rowwise_ceiling_follows_a_refitted_tensorwise_one():
    """A trace that refits gemm_ceiling.fp8 moves rowwise with it (0.95 of it, never faster than tensorwise); a fit
    that names fp8_rowwise wins."""
    gpu = H100.gpu
    fitted = replace(EFFICIENCY, gemm_ceilings=(("fp8", 0.9),))
    assert gemm_ceiling(gpu, "fp8_rowwise", fitted) == round(0.9 * 0.95, 3) < gemm_ceiling(gpu, "fp8", fitted)
    named = replace(EFFICIENCY, gemm_ceilings=(("fp8", 0.9), ("fp8_rowwise", 0.7)))
    assert gemm_ceiling(gpu, "fp8_rowwise", named) == 0.7


def test_rowwise_forward_gemms_are_rowwise_and_backward_tensorwise_with_a_rescale():
    par = _torch()
    gpu = H100.gpu
    ctx = Context(LLAMA8B, WorkloadSpec(micro_batch_size=1, global_batch_size=8, fp8_recipe="rowwise"), par)
    lk = layer_kernels(ctx, False, gpu)
    fwd = {k.name: k for k in lk.forward if k.kind == "gemm"}
    bwd = {k.name: k for k in lk.backward}
    assert {k.dtype for k in fwd.values()} == {"fp8_rowwise"}
    assert {k.dtype for k in lk.backward if k.kind == "gemm"} == {"fp8"}
    T = 8192  # one sequence of 8,192 tokens, tp 1
    # fc1 (gate and up as one GEMM of n = 2 x 14,336): dgrad's output T x 4,096, wgrad's 4,096 x 28,672
    assert bwd["fc1.dgrad.rescale"].bytes == ROWWISE_RESCALE_BYTES * T * 4096
    assert bwd["fc1.wgrad.rescale"].bytes == ROWWISE_RESCALE_BYTES * 4096 * 2 * 14336
    tensorwise = layer_kernels(replace(ctx, work=replace(ctx.work, fp8_recipe="tensorwise")), False, gpu)
    assert not any(k.name.endswith(".rescale") for k in tensorwise.backward)
    assert sum(k.time_s for k in lk.forward if k.kind == "gemm") > sum(
        k.time_s for k in tensorwise.forward if k.kind == "gemm"
    )


def test_rowwise_is_refused_where_torch_scaled_mm_lacks_it_and_outside_torch():
    a100 = cluster_preset("dgx-a100", 1)
    with pytest.raises(SpecError) as err:
        _calls(_torch(), a100, fp8_recipe="rowwise")
    assert err.value.field == "workload.fp8_recipe"
    assert "compute capability >= 8.9 (torchao.float8 / torch._scaled_mm)" in str(err.value)
    assert "has compute capability 8.0" in str(err.value)
    with pytest.raises(SpecError) as err:
        _calls(ParallelSpec(dp=8), fp8_recipe="rowwise")
    assert err.value.field == "workload.fp8_recipe" and "framework 'megatron' does not run" in str(err.value)


def test_rowwise_runs_regular_tp_so_fp8_activations_with_tp_are_refused():
    """torchtitan parallelize.py: enable_float8_tensorwise_tp = float8 and not rowwise (bf16 TP all-gathers)."""
    with pytest.raises(SpecError) as err:
        _calls(_torch(dp=4, tp=2, sequence_parallel=True), fp8_recipe="rowwise", activation_dtype="fp8")
    assert err.value.field == "workload.activation_dtype" and "tensorwise only" in str(err.value)
    fp8_tp = _calls(_torch(dp=4, tp=2, sequence_parallel=True), fp8_recipe="tensorwise", activation_dtype="fp8")
    bf16_tp = _calls(_torch(dp=4, tp=2, sequence_parallel=True), fp8_recipe="rowwise")
    tp_bytes = lambda out: sum(c.message_bytes for cs in out.values() for c in cs if c.parallelism == "tp")  # noqa: E731
    assert tp_bytes(bf16_tp) > tp_bytes(fp8_tp)  # the rowwise run's TP all-gathers stay in bf16


# ---- FSDP2 float8 all-gather ------------------------------------------------------------------------------


def test_float8_all_gather_bytes_per_unit_and_an_amax_per_weight_per_gather():
    out = _calls(_torch(), fp8_recipe="tensorwise", fp8_param_gather=True)
    m = 1  # global batch 8 over dp 8
    (layers,) = [c for c in out["dp.params"] if c.calls_per_iteration == 32 * m]
    assert layers.message_bytes == LINEAR * 1 + NORMS * 2 == 218_120_192  # was 436,224,000 in bf16
    (root,) = [c for c in out["dp.params"] if c.calls_per_iteration == m]
    assert root.message_bytes == (2 * 128256 * 4096 + 4096) * 2  # embedding, head, final norm: bf16
    assert out["dp.params.bwd"][0].message_bytes == 218_120_192
    for name in ("dp.params.amax", "dp.params.bwd.amax"):
        (amax,) = out[name]
        assert (amax.message_bytes, amax.calls_per_iteration, amax.op.value) == (4, 7 * 32 * m, "allreduce")
    assert "dp.fp8_scales" not in out


def test_precomputed_scales_are_one_all_reduce_per_mesh_dimension_per_step():
    out = _calls(_torch(dp=4, tp=2), fp8_recipe="tensorwise", fp8_param_gather=True, fp8_precompute_scale=True)
    assert not any(name.endswith(".amax") for name in out)
    (dp,), (tp,) = out["dp.fp8_scales"], out["tp.fp8_scales"]
    assert dp.message_bytes == tp.message_bytes == 4 * 7 * 32 and dp.calls_per_iteration == 1
    assert dp.phase == "optimizer"
    # tp 2: each unit's linear weights are halved, the norms are not
    (layer,) = [c for c in out["dp.params"] if c.calls_per_iteration == 32 * 2]  # 2 micro-batches over dp 4
    assert layer.message_bytes == LINEAR // 2 + NORMS * 2


def test_a_gathered_unit_holds_its_float8_weights_at_one_byte():
    """The two units in flight (memory.ZERO3_UNITS_IN_FLIGHT) hold their linear weights in float8: a model whose
    largest unit is a layer (vocabulary 1,024): h 1,024, 8 heads of 128, ffn 4,096 gated: 4 x 1,024^2 + 3 x 1,024
    x 4,096 = 16,777,216 linear elements, 2 B -> 1 B each."""
    from planner import ModelSpec
    from planner.memory import held_bytes

    small = ModelSpec(4, 1024, 8, 4096, 1024, 1024, num_kv_heads=8)
    work = WorkloadSpec(micro_batch_size=1, global_batch_size=8, fp8_recipe="tensorwise")
    bf16 = held_bytes(Context(small, work, _torch()), 0)
    fp8 = held_bytes(Context(small, replace(work, fp8_param_gather=True), _torch()), 0)
    assert bf16.buffers_bytes - fp8.buffers_bytes == 2 * (4 * 1024**2 + 3 * 1024 * 4096)


def test_torchao_keeps_no_float8_weight_copies_between_micro_batches():
    """TE caches each weight's fp8 copies (is_first_microbatch); torchao's Float8Linear casts per use: the torch
    flavour's weights do not grow with a recipe (here ZeRO-1, where TE's copies would be counted)."""
    from planner.memory import held_bytes

    work = WorkloadSpec(micro_batch_size=1, global_batch_size=8)
    par = _torch(zero_stage=1)
    plain = held_bytes(Context(LLAMA8B, work, par), 0)
    for recipe in ("tensorwise", "rowwise"):
        assert held_bytes(Context(LLAMA8B, replace(work, fp8_recipe=recipe), par), 0) == plain
    megatron = ParallelSpec(dp=8, zero_stage=1)
    te = held_bytes(Context(LLAMA8B, replace(work, fp8_recipe="tensorwise"), megatron), 0).params_bytes
    assert te > held_bytes(Context(LLAMA8B, work, megatron), 0).params_bytes


@pytest.mark.parametrize(
    ("par", "work", "field", "words"),
    [
        (_torch(), {"fp8_recipe": "rowwise", "fp8_param_gather": True}, "workload.fp8_param_gather",
         "supports tensorwise scaling only"),
        (_torch(zero_stage=1), {"fp8_recipe": "tensorwise", "fp8_param_gather": True}, "workload.fp8_param_gather",
         "zero_stage 2 or 3, got zero_stage 1"),
        (_torch(), {"fp8_recipe": "tensorwise", "fp8_precompute_scale": True}, "workload.fp8_precompute_scale",
         "needs fp8_param_gather"),
        (ParallelSpec(dp=8, zero_stage=1), {"fp8_recipe": "tensorwise", "fp8_param_gather": True,
         "fp8_precompute_scale": True}, "workload.fp8_precompute_scale", "framework is 'megatron'"),
    ],
)  # fmt: skip
def test_float8_all_gather_refusals_name_the_field_and_the_rule(par, work, field, words):
    with pytest.raises(SpecError) as err:
        _calls(par, **work)
    assert err.value.field == field and words in str(err.value)


# ---- torch context parallel ---------------------------------------------------------------------------------


def test_torch_ring_attention_bytes_per_call_by_rotate_method():
    # s/c = 4,096 tokens, 8 KV heads x 128 in bf16: K = V = 8,388,608 B, the buffer K + V 16,777,216 B
    kv, layers = 2 * 4096 * 8 * 128 * 2, 32 * 2  # 32 layers x 2 micro-batches (global 8 over dp 4)
    gather = _calls(_torch(dp=4, cp=2))
    (f,), (b,), (d,) = gather["cp.ring.kv_gather"], gather["cp.ring.kv.bwd_gather"], gather["cp.ring.dkv"]
    assert (f.op.value, f.message_bytes, f.calls_per_iteration) == ("allgather", 2 * kv, layers)
    assert (b.op.value, b.message_bytes, b.calls_per_iteration) == ("allgather", 2 * kv, layers)
    # dK, dV in fp32 (convert_to_f32), sent c = 2 times per attention call
    assert (d.op.value, d.message_bytes, d.calls_per_iteration) == ("sendrecv", 2 * kv, 2 * layers)
    rotate = _calls(_torch(dp=2, cp=4, cp_rotate_method="alltoall"))
    kv4, layers4 = 2 * 2048 * 8 * 128 * 2, 32 * 4  # s/c = 2,048; 4 micro-batches over dp 2
    (f,), (b,), (d,) = rotate["cp.ring.kv"], rotate["cp.ring.kv.bwd"], rotate["cp.ring.dkv"]
    assert (f.op.value, f.message_bytes, f.calls_per_iteration) == ("sendrecv", kv4, 3 * layers4)
    assert (b.message_bytes, b.calls_per_iteration) == (kv4, 3 * layers4)
    assert (d.message_bytes, d.calls_per_iteration) == (2 * kv4, 4 * layers4)


def test_cp_options_are_refused_under_the_other_frameworks_implementation():
    with pytest.raises(SpecError) as err:
        _calls(ParallelSpec(dp=4, cp=2, cp_rotate_method="alltoall"))
    assert err.value.field == "parallel.cp_rotate_method" and "framework 'megatron' takes cp_comm" in str(err.value)
    with pytest.raises(SpecError) as err:
        _calls(_torch(dp=4, cp=2, cp_comm="a2a"))
    assert err.value.field == "parallel.cp_comm" and "cp_rotate_method (allgather, alltoall)" in str(err.value)


def test_without_load_balancing_a_sliding_window_model_is_skewed_too():
    """Llama 3 8B with a 4,096-key window on every other layer (full on layers 2, 4, ...), s 8,192, cp 4 without load
    balancing: rank 3's queries 6,145 .. 8,192 attend min(j, 4,096) = 4,096 keys in a window layer (every one past
    the window) and 8,192 - 1,024 + 1/2 in a full one; balanced, causal_keys over the whole sequence. cp_load_balance
    false was ignored for windowed models (attended_keys' window branch used the balanced mean)."""
    from planner.kernels import attended_keys, causal_keys, cp_rank_causal_keys

    model = replace(LLAMA8B, sliding_window=4096, full_attention_interval=2)
    work = WorkloadSpec(micro_batch_size=1, global_batch_size=8)
    s, c = 8192, 4
    skewed = Context(model, work, _torch(dp=2, cp=c, cp_load_balance=False))
    balanced = Context(model, work, _torch(dp=2, cp=c))
    assert attended_keys(skewed) == pytest.approx((4096 + (s - s / (2 * c) + 0.5)) / 2)
    assert attended_keys(balanced) == pytest.approx((causal_keys(s, 4096) + causal_keys(s, None)) / 2)
    # a window reaching into the rank's queries: s 8, cp 2 (queries 5..8), w 6: (5 + 6 + 6 + 6) / 4
    tiny = Context(replace(model, seq_length=8), replace(work, seq_length=8), _torch(dp=2, cp=2, cp_load_balance=False))
    assert cp_rank_causal_keys(tiny, 6) == 23 / 4 and cp_rank_causal_keys(tiny, 3) == 3.0
    assert cp_rank_causal_keys(tiny, None) == 8 - 8 / 4 + 0.5


def test_without_load_balancing_the_last_cp_rank_attends_most():
    """_is_causal_behavior without enable_load_balance: rank c-1 computes its own causal block and c-1 full ones;
    its queries (the last s/c) attend s - s/(2c) + 1/2 keys on average against (s + 1)/2 balanced."""
    from planner.kernels import attention_flops

    work = WorkloadSpec(micro_batch_size=1, global_batch_size=8)
    s, c = 8192, 4
    balanced = attention_flops(Context(LLAMA8B, work, _torch(dp=2, cp=c)))
    skewed = attention_flops(Context(LLAMA8B, work, _torch(dp=2, cp=c, cp_load_balance=False)))
    assert skewed / balanced == pytest.approx((s - s / (2 * c) + 0.5) / ((s + 1) / 2))  # about (2c-1)/c = 1.75
    assert (
        build_plan(LLAMA8B, work, _torch(dp=2, cp=c, cp_load_balance=False), H100).step.time_s
        > build_plan(LLAMA8B, work, _torch(dp=2, cp=c), H100).step.time_s
    )
    with pytest.raises(SpecError) as err:
        _calls(ParallelSpec(dp=4, cp=2, cp_load_balance=False))
    assert err.value.field == "parallel.cp_load_balance" and "framework 'megatron'" in str(err.value)


def test_without_load_balancing_the_sequence_needs_only_cp_shards():
    """Load balancing splits the sequence in 2 x cp chunks (head-tail); without it in cp contiguous shards."""
    par = _torch(dp=4, cp=2)
    with pytest.raises(SpecError) as err:
        _calls(par, seq_length=8194)
    assert err.value.field == "parallel.cp" and "not divisible by 2*cp = 4" in str(err.value)
    assert _calls(replace(par, cp_load_balance=False), seq_length=8194)["cp.ring.kv_gather"]


def test_gathered_float8_weights_are_not_cast_again_in_the_layer():
    """With the float8 all-gather the layer's GEMMs take the gathered float8 weights: the per-pass casts drop the
    weights' k x n elements (6 B each under tensorwise: read twice, two copies), forward and backward."""
    work = WorkloadSpec(micro_batch_size=1, global_batch_size=8, fp8_recipe="tensorwise")
    casts = {}
    for gather in (False, True):
        lk = layer_kernels(Context(LLAMA8B, replace(work, fp8_param_gather=gather), _torch()), False, H100.gpu)
        casts[gather] = [k.bytes for k in (*lk.forward, *lk.backward) if k.kind == "cast"]
    assert [a - b for a, b in zip(casts[False], casts[True], strict=True)] == [6 * LINEAR, 6 * LINEAR]


def test_gathered_float8_weights_leave_the_routed_experts_cast():
    """The FSDP2 float8 all-gather covers Float8Linear weights only (rules/data.py _float8_buffer: the routed
    experts' grouped weights are gathered in bf16): on a Mixtral 8x7B MoE layer (ep 8, one local expert) the gather
    drops the casts of the attention's q, k, v, o weights (2 x 4,096² + 2 x 4,096 x 1,024, 6 B each) and keeps the
    experts' fc1 (4,096 x 28,672) and fc2 (14,336 x 4,096) weight casts."""
    mixtral = model_preset("mixtral-8x7b")
    work = WorkloadSpec(micro_batch_size=1, global_batch_size=8, fp8_recipe="tensorwise", seq_length=4096)
    casts = {}
    for gather in (False, True):
        ctx = Context(mixtral, replace(work, fp8_param_gather=gather), _torch(ep=8))
        lk = layer_kernels(ctx, True, H100.gpu)
        casts[gather] = [k.bytes for k in (*lk.forward, *lk.backward) if k.kind == "cast"]
    attention = 2 * 4096 * 4096 + 2 * 4096 * 1024
    assert [a - b for a, b in zip(casts[False], casts[True], strict=True)] == [6 * attention, 6 * attention]


def test_layer_kernels_memo_keys_the_torchao_trait():
    """_fp8_casts reads Flavour.torchao_float8 (recipes.float8_gathered): a flavour registered again without it
    casts its weights again, not the memoised kernels of the first registration (kernels.layer_kernels_key)."""
    from planner import flavours
    from planner.flavours.torch import FLAVOUR as TORCH

    work = WorkloadSpec(micro_batch_size=1, global_batch_size=8, fp8_recipe="tensorwise", fp8_param_gather=True)
    casts = []
    try:
        for torchao in (True, False):
            flavours.register(replace(TORCH, name="toy-torchao", torchao_float8=torchao))
            par = ParallelSpec(framework="toy-torchao", dp=8, zero_stage=3)
            lk = layer_kernels(Context(LLAMA8B, work, par), False, H100.gpu)
            casts.append([k.bytes for k in lk.forward if k.kind == "cast"])
    finally:
        flavours.unregister("toy-torchao")
    assert [b - a for a, b in zip(*casts, strict=True)] == [6 * LINEAR]
