"""TransformerEngine's grouped linear and the host, launch by launch from the source (moe11; docs/step-time.md
"TransformerEngine's grouped GEMM and the host (moe11)").

The 25.11 NeMo container runs TransformerEngine v2.9 (70f536662a) under Megatron-Core core_v0.15.0 / 92c8482e6d:
- grouped_linear.py ``_GroupedLinear``: forward ``tex.split_quantize`` of the input (fp8), one ``general_grouped_gemm``;
  backward ``split_quantize`` of the output gradient, one grouped call for dgrad and one for wgrad;
- csrc/extensions/gemm.cpp ``te_general_grouped_gemm`` -> common/gemm/cublaslt_gemm.cu ``nvte_multi_tensor_gemm``: the
  CUTLASS grouped kernel only on sm90 with ``NVTE_USE_CUTLASS_GROUPED_GEMM`` (default false; the Megatron-Bridge 25.11
  perf scripts never set it) and bf16 operands; otherwise ``multi_stream_cublas_gemm``, one ``nvte_cublas_gemm_v2`` per
  expert over the compute streams, on Hopper and Blackwell alike;
- csrc/extensions/cast.cpp ``multi_tensor_quantize_impl``: one fused launch for delayed scaling only, else each split's
  own quantize; csrc/quantizer.cpp ``Float8CurrentScalingQuantizer::quantize_impl``: ``nvte_compute_amax_with_config``
  (common/recipe/current_scaling.cu ``launch_amax_kernel``: ``zero_amax_kernel<<<1, 1>>>`` then ``amax_kernel``),
  ``nvte_compute_scale_from_amax`` (one kernel), ``nvte_quantize_v2`` (one kernel): four launches a tensor.
"""

from __future__ import annotations

import pytest

from bench import step_validation
from collectives.topology.gpu import GPUS
from planner import ParallelSpec, WorkloadSpec, model_preset
from planner.compute import layer_pass
from planner.context import Context
from planner.kernels import EFFICIENCY, gpu_seconds, host_launches, layer_kernels
from planner.recipes import RECIPES

H100 = GPUS["h100-sxm5-80gb"]
B200 = GPUS["b200-180gb"]
QWEN3 = model_preset("qwen3-30b-a3b")  # 128 experts, top-8: 16 local experts at ep 8
LOCAL = 16
DATA = step_validation.load()
CASES = {c["name"]: c for c in DATA["cases"]}


def qwen3(recipe: str | None, **work) -> Context:
    fields = dict(micro_batch_size=2, global_batch_size=64, seq_length=4096)
    fields |= {"activation_dtype": "fp8", "fp8_recipe": recipe} if recipe else {}
    return Context(QWEN3, WorkloadSpec(**(fields | work)), ParallelSpec(dp=8, ep=8))


def counts(kernels) -> dict[str, int]:
    out: dict[str, int] = {}
    for k in kernels:
        out[k.name] = out.get(k.name, 0) + k.count
    return out


@pytest.mark.parametrize("recipe", [None, "tensorwise", "delayed", "mxfp8"])
@pytest.mark.parametrize("gpu", [H100, B200], ids=["sm90", "sm100"])
def test_one_cublas_launch_per_local_expert_on_hopper_and_blackwell(recipe, gpu):
    """nvte_multi_tensor_gemm at v2.9: the per-expert cuBLAS loop on every GPU the rows ran (the CUTLASS path needs
    sm90, bf16 and an environment switch no 25.11 recipe sets): fc1 and fc2 forward, dgrad and wgrad, 16 launches each
    at ep 8, whatever the GPU generation and recipe (MXFP8 needs sm100)."""
    if recipe == "mxfp8" and gpu is H100:
        pytest.skip("MXFP8 is Blackwell's")
    lk = layer_kernels(qwen3(recipe), True, gpu)
    fwd, bwd = counts(lk.forward), counts(lk.backward)
    assert fwd["experts_fc1"] == fwd["experts_fc2"] == LOCAL
    assert [bwd[f"experts_fc{i}.{g}"] for i in (1, 2) for g in ("dgrad", "wgrad")] == [LOCAL] * 4


def test_the_gpu_generation_changes_no_launch_count():
    """The same layer on H100 and B200 lists the same launches kernel by kernel (bf16 and current scaling): TE v2.9 has
    no Blackwell-only grouped kernel, and the planner keys nothing of the loop on the GPU."""
    for recipe in (None, "tensorwise"):
        h, b = layer_kernels(qwen3(recipe), True, H100), layer_kernels(qwen3(recipe), True, B200)
        assert counts(h.forward) == counts(b.forward) and counts(h.backward) == counts(b.backward)


@pytest.mark.parametrize(("recipe", "per_tensor", "fused"), [("tensorwise", 4, False), ("delayed", 1, True),
                                                             ("mxfp8", 1, False), ("blockwise", 1, False)])  # fmt: skip
def test_quantize_launches_per_tensor_are_the_sources(recipe, per_tensor, fused):
    """Launches a TE quantizer makes per tensor at v2.9 (module docstring): current scaling four, the others one; the
    splits fused into one launch for delayed scaling only."""
    r = RECIPES[recipe]
    assert (r.quantize_launches, r.fused_split_quantize) == (per_tensor, fused)


@pytest.mark.parametrize(("recipe", "gpu", "dense", "splits"), [("tensorwise", H100, (7, 12), 2 * LOCAL * 4),
                                                                ("delayed", H100, (2, 2), 2),
                                                                ("mxfp8", B200, (2, 3), 2 * LOCAL)])  # fmt: skip
def test_the_experts_inputs_are_quantized_split_by_split(recipe, gpu, dense, splits):
    """fc1's and fc2's inputs (and in the backward their output gradients) are 16 splits each: current scaling 2 x 16
    x 4 = 128 launches a pass (97 before moe11 read the amax's zeroing kernel), MXFP8 32, delayed scaling one fused
    launch a GEMM; beside them the dense linears' own (moe11b, kernels.dense_quantize_launches): forward the norm-fed
    qkv (current scaling 3, delayed 1 for its transpose, MXFP8 1) and linear_proj's input, backward their two output
    gradients and, but for delayed scaling, linear_proj's saved original input once more."""
    lk = layer_kernels(qwen3(recipe), True, gpu)
    casts = counts(lk.forward)["fp8_cast"], counts(lk.backward)["fp8_cast.bwd"]
    assert casts == (dense[0] + splits, dense[1] + splits)


def test_the_h100_fp8_cs_rows_layer_is_its_launches_at_the_hosts_cost():
    """The 25.11 Qwen3-30B-A3B FP8-CS 16 H100 row's layer (micro-batch 1 as its recipe sets it since outliers15,
    4,096 tokens; the count is the table's micro-batch 2's too): 210 launches forward, 241
    backward (moe11b's dense quantizes; 204 and 230 before, 172 and 198 at three launches a quantize); the forward
    syncs for the experts' counts and is host-bound: its span is at least its launches at host_launch_s (38.2 us),
    above its GPU time."""
    spec, work, par, _, _ = step_validation.case_inputs(CASES["Megatron-Bridge Qwen3-30B-A3B FP8-CS, 16 H100"], DATA)
    ctx = Context(spec, work, par)
    lk = layer_kernels(ctx, True, H100)
    fwd = sum(k.count for k in lk.forward)
    assert (fwd, sum(k.count for k in lk.backward)) == (210, 241)
    gpu = sum(gpu_seconds(k) for k in lk.forward)
    host = fwd * EFFICIENCY.host_launch_s
    assert host > gpu
    assert layer_pass(ctx, lk, EFFICIENCY).total_s >= host


def test_the_b200_gpt_oss_rows_layers_are_gpu_bound_at_the_hosts_cost():
    """The 25.11 GPT-OSS-120B BF16 64 B200 row (DP64, micro-batch 4: 16,384 tokens; EP64 as its recipe sets it since
    outliers15, 2 local experts): its layer launches 73 kernels forward and 75 backward, at 38.2 us a launch 2.8 and
    2.9 ms of host against 6.5 and 13.2 ms of GPU: the host does not bind it (at the table's EP8, 16 local experts: 129
    and 187 launches, 4.9 and 7.1 ms of host against 6.8 and 13.7 ms, GPU-bound too).
    Its attention runs cuDNN's fused kernel on sm100 as on sm90 (TE v2.9 get_attention_backend keeps FusedAttention
    for the learnable sinks and the (128, 0) window from cuDNN 9.13.1; it drops it on Blackwell only for deterministic
    training, which the Bridge's perf scripts do not ask for)."""
    spec, work, par, cluster, _ = step_validation.case_inputs(CASES["Megatron-Bridge GPT-OSS-120B BF16, 64 B200"], DATA)
    ctx = Context(spec, work, par)
    lk = layer_kernels(ctx, True, cluster.gpu)
    for kernels, launches in ((lk.forward, 73), (lk.backward, 75)):
        assert sum(k.count for k in kernels) == launches
        assert launches * EFFICIENCY.host_launch_s < sum(gpu_seconds(k) for k in kernels)
    assert "cudnn_fwd" in counts(lk.forward) and "cudnn_bwd" in counts(lk.backward)
    attention = [[k.name for k in g.forward if k.kind == "attention"] for g in (lk, layer_kernels(ctx, True, H100))]
    assert attention[0] == attention[1]


def test_one_host_cost_a_launch_bounds_both_fine_grained_qwen3_rows_alike():
    """The same TE code path (per-expert cuBLAS and quantize loops in C++) on two Qwen3-30B-A3B rows: the whole
    measured step over the layer micro-batches a rank runs, over the layer's host launches (kernels.host_launches: a
    TE graph's kernels are its replay), is the most host time a launch could take. H100 FP8-CS (24 layers x 64
    micro-batches a rank at its recipe's micro-batch 1, 451 launches a layer): 35.9 us; B200 MXFP8 (48 layers x 64
    micro-batches; 99 + 142 host launches under its recipe's router and preprocess graph, mend15c): 38.1 us, against
    Megatron-Core's measured 38.2 us. The bound is the planner's own launch count over the measured step: it does not
    tell the H100 row's micro-batch (docs/step-time.md "Review r15b's findings (mend15c)")."""
    bound = {}
    for name, gpu in (("Qwen3-30B-A3B FP8-CS, 16 H100", H100), ("Qwen3-30B-A3B MXFP8, 8 B200", B200)):
        case = CASES[f"Megatron-Bridge {name}"]
        spec, work, par, _, _ = step_validation.case_inputs(case, DATA)
        ctx = Context(spec, work, par)
        lk = layer_kernels(ctx, True, gpu)
        launches = sum(host_launches(k) for k in lk.forward + lk.backward)
        layer_micro_batches = spec.num_layers // par.pp * ctx.micro_batches
        bound[name] = step_validation.measured_time(case, DATA) / layer_micro_batches / launches
    assert [round(b * 1e6, 1) for b in bound.values()] == [35.9, 38.1]
