"""Low-precision training recipes (``workload.fp8_recipe``): what each quantizes, at which granularity, what
it stores and what it communicates. TransformerEngine 2.x names (transformer_engine/common/recipe/__init__.py;
Megatron-Core --fp8-recipe delayed | tensorwise | blockwise | mxfp8, --fp4-recipe nvfp4):

- ``delayed``: DelayedScaling, per-tensor fp32 scale from an amax history; HYBRID format (E4M3 forward,
  E5M2 gradients: Megatron --fp8-format hybrid). The amax of every fp8 tensor of the transformer block is
  all-reduced (MAX) once per forward and once per backward of each micro-batch, over the amax-reduction
  group (TE quantization.py FP8GlobalStateManager.reduce_and_update_fp8_tensors at autocast exit; Megatron
  wraps the whole block in one autocast for delayed scaling only: transformer_block.py
  use_outer_fp8_context; the group is get_amax_reduction_group(with_context_parallel=True), the
  TP x CP x DP ranks, megatron/core/fp8_utils.py get_fp8_context).
- ``tensorwise``: Float8CurrentScaling, per-tensor scale from the tensor's own amax (an extra read).
- ``blockwise``: Float8BlockScaling, DeepSeek-V3 §3.3.2: activations in 1x128 tiles, weights in 128x128
  blocks, fp32 scales, E4M3 throughout. TE: compute capability >= 9.0 (and CUDA >= 12.9).
- ``mxfp8``: MXFP8BlockScaling (OCP MX v1.0): 1x32 blocks, one E8M0 (1-byte) scale each, rowwise and
  columnwise copies. TE: compute capability >= 10.0 (Blackwell).
- ``nvfp4``: NVFP4BlockScaling: E2M1 (half a byte) in 1x16 blocks with an E4M3 scale each plus one fp32
  per-tensor scale; weights in 16x16 blocks. TE: compute capability >= 10.0.
- ``rowwise`` (torchao, not TE; torchtitan ``--float8.recipe_name rowwise``): torchao/float8/config.py
  (pytorch/ao 36027d82, 2026-08) ``Float8LinearRecipeName.ROWWISE``: input, weight and grad_output scaled
  AXISWISE (one fp32 scale per row along the GEMM's contraction dim), E4M3 throughout, scales floored to a power of
  two. float8_linear.py casts every operand once per GEMM along that GEMM's contraction dim (the input along k for
  fprop, again along m for wgrad from the saved bf16 input): each operand is read twice and written twice (one
  fp8 copy per orientation), the scales (4 B per row of >= 1,024 elements, < 0.4% of the bytes) not counted. The
  forward GEMM (gemm_config_output: use_fast_accum=True) is torch._scaled_mm's rowwise CUTLASS kernel
  (aten/src/ATen/native/cuda/RowwiseScaledMM.cu); the backward GEMMs (use_fast_accum=False) take the cuBLAS
  tensorwise kernel and multiply the output by the two scale vectors after it (float8_ops.py
  addmm_float8_unwrapped: "The rowwise CUTLASS-based kernel is so slow without fast-accum that we'd rather use the
  tensorwise cuBLAS-based kernel and do the scaling manually afterwards"; pytorch/ao issue 2184: one extra kernel
  per GEMM): planner/kernels.py ROWWISE_*. torch._scaled_mm takes rowwise scales from sm89 (Ada: CUTLASS's
  sm89 kernel; Hopper: the sm90 TMA kernel); torchao's docs list it for H100 and B200 (docs/source/workflows/
  index.md). Its FSDP2 float8 all-gather is tensorwise only (config.py __post_init__: "enable_fsdp_float8_all_gather
  only supports tensorwise scaling granularity").

The GPU support rules are TE's (transformer_engine/pytorch/quantization.py _compute_fp8_support: >= 8.9;
_compute_fp8_block_scaling_support: >= 9.0; _compute_mxfp8_support, _compute_nvfp4_support: >= 10.0).
The compute rate of each recipe belongs to planner/compute.py, which reads ``Recipe.gemm_dtype``.

``fp8_param_gather`` (Megatron --fp8-param-gather) keeps the TE linear weights as fp8 (or fp4) primary weights:
the distributed optimizer's parameter all-gather then moves ``param_bytes`` per element in its own buffer
(megatron/core/distributed/param_and_grad_buffer.py groups buffers by parameter dtype: uint8 for fp8), and
the optimizer step casts the master shard with one MAX all-reduce of the amaxes over the DP group
(TE transformer_engine/pytorch/tensor/utils.py cast_master_weights_to_fp8: one fp32 per weight for
delayed/tensorwise, one per 128x128 block for blockwise, one per 1x32 block rowwise and columnwise for
mxfp8; cast_master_weights_to_nvfp4: one per 16x16 block plus one per weight).
"""

from __future__ import annotations

from dataclasses import dataclass

from ._errors import SpecError, shown

TE = "TransformerEngine 2.x "


@dataclass(frozen=True)
class Recipe:
    name: str
    gemm_dtype: str  # fp8 | fp4: the tensor-core dtype of the linear layers' GEMMs (compute.py reads it)
    formats: str  # element formats, forward / backward
    gemms: tuple[str, ...]  # which GEMMs of a linear layer run low-precision (fprop, dgrad, wgrad)
    activation_block: int  # elements per scale along a row of activations; 0: one scale per tensor
    weight_block: tuple[int, int]  # weight scale block (rows, cols); (0, 0): one scale per tensor
    scale_bytes: int  # bytes of one block scale (fp32 4, E8M0 / E4M3 1)
    element_bytes: float  # bytes of one quantized element
    min_sm: int  # compute capability x 10 TE requires
    source: str
    # fp32 amaxes cast_master_weights_to_fp8 all-reduces per weight: one per weight, and per weight block
    amax_per_weight: int = 1
    amax_per_block: int = 0
    # the GEMM-table key of the kernels branch's planner/kernels.py (FP8_RECIPES: fp8, fp8_block, mxfp8, nvfp4),
    # so that its GEMM model can read the recipe from here when the branches meet
    kernel_dtype: str = "fp8"
    # scaling: DelayedScaling's scales come from an amax history, every fp8 tensor's amax all-reduced per pass over
    # the amax-reduction group (rules/fp8.py); current scaling quantizers take the tensor's own amax, reduced
    # over TP under SP (TE module/linear.py _customize_quantizers_float8_current_scaling / _nvfp4)
    amax_history: bool = False
    tp_amax: bool = False
    cast_read_bytes: int = 2  # bf16 input bytes read per quantized element: Float8CurrentScalingQuantizer reads twice
    # kernel launches TE makes to quantize one tensor (TransformerEngine v2.9 pytorch/csrc/quantizer.cpp):
    # Float8Quantizer (delayed), Float8BlockQuantizer and MXFP8Quantizer one nvte_quantize_v2 each;
    # Float8CurrentScalingQuantizer::quantize_impl four: nvte_compute_amax_with_config is two kernels
    # (common/recipe/current_scaling.cu launch_amax_kernel: ``zero_amax_kernel<<<1, 1>>>`` then ``amax_kernel``; a
    # cudaMemsetAsync up to v2.7, a kernel since v2.8, commit 3f5b47549 "NVFP4 recipe (#2177)"; moe11), then
    # nvte_compute_scale_from_amax (``compute_scale_from_amax_kernel<<<1, 1>>>``) and nvte_quantize_v2;
    # NVFP4Quantizer::quantize_impl three (the amax, the rowwise quantize, the columnwise RHT cast; not re-read here)
    quantize_launches: int = 1
    # launches that quantize a LayerNormLinear's norm output (Megatron-Core's TE spec fuses the input norm into
    # linear_qkv, the pre-MLP norm into a dense linear_fc1, MLA's q/kv norms into linear_q_up_proj / linear_kv_up_proj:
    # Megatron-LM 92c8482e6d models/gpt/gpt_layer_specs.py column_parallel_layer_norm_linear), beside the norm kernel
    # itself.
    # TransformerEngine v2.9 csrc/extensions/normalization.cpp rmsnorm_fwd (NVTE_NORM_FWD_USE_CUDNN unset, as the
    # Megatron-Bridge perf scripts leave it): Float8Quantizer (delayed) FULLY_FUSED, the norm writes fp8 and, for the
    # columnwise copy, common/normalization/rmsnorm/rmsnorm_api.cpp l. 96-103 runs one nvte_transpose: 1;
    # Float8CurrentScalingQuantizer FUSED_NORM_AMAX_FP8: create_unquantized_tensor_with_amax's ``amax.zero_()`` (a fill
    # kernel; quantizer.cpp l. 392-395), the norm writing its amax, then quantize_with_amax = compute_scale_from_amax +
    # nvte_quantize_v2 (quantizer.cpp l. 497-548): 3; MXFP8 (no cuDNN), Float8BlockQuantizer and NVFP4 with its
    # default RHT (recipe/__init__.py NVFP4BlockScaling: random_hadamard_transform on fprop inputs) UNFUSED: the norm in
    # bf16, then the quantizer's own launches (quantize_launches)
    norm_quantize_launches: int = 1
    # the bytes of that quantize the norm's fusion saves, per element (the same normalization.cpp paths): FULLY_FUSED
    # (delayed) the norm writes the fp8 rowwise data itself, so the quantize's bf16 read (2 B) and rowwise write are
    # gone and the columnwise copy is nvte_transpose of the fp8 data (rmsnorm_api.cpp l. 96-103; TE v1.8 3ec998e96c
    # module/layernorm_linear.py l. 126-137 ``ln_out_dtype = torch.uint8``, the backward's ``tex.fp8_transpose(
    # ln_out_total)`` l. 584: the same bytes); FUSED_NORM_AMAX_FP8 (current scaling) the norm takes the amax, so the
    # quantize reads its input once (2 B of cast_read_bytes' 4); UNFUSED (MXFP8, blockwise, NVFP4 with RHT) nothing
    norm_fused_read_bytes: int = 0
    norm_writes_quantized: bool = False
    # kernel launches one low-precision GEMM call makes to swizzle its two operands' block scales into cuBLAS's layout
    # when the quantizer wrote them unswizzled: TE v2.9 csrc/extensions/gemm.cpp l. 237-240 (general_gemm:
    # swizzle_scaling_factors of A and of B, csrc/util.cpp: MXFP8_1D and NVFP4_1D scaling only) and l. 488-491
    # (te_general_grouped_gemm: one multi_tensor_swizzle_scaling_factors of the A list and one of the B list). The TE
    # line of the Megatron-Bridge 26.08 stack (uv.lock at 4ab94dfad pins e7c550c5f, v2.18) sets ``optimize_for_gemm``
    # on the modules' input, grad-output and weight quantizers (module/linear.py l. 2016-2024, 2165; grouped_linear.py
    # l. 318, 822), whose output carries with_gemm_swizzled_scales, and swizzle.cpp swizzle_scales_for_gemm skips such a
    # tensor (l. 64): no launch. Which applies is workload.scale_swizzle (kernels.scale_swizzles)
    gemm_swizzle_launches: int = 0
    # a grouped linear's per-expert inputs quantized by one fused launch: only delayed scaling has the fused
    # multi-tensor kernel (csrc/extensions/cast.cpp multi_tensor_quantize_impl: nvte_multi_cast_transpose "Currently
    # only have fused kernel for FP8 delayed scaling"); the others quantize each split on its own (split_quantize)
    fused_split_quantize: bool = False
    # TE's fused grouped MLP kernels exist for this recipe (ForwardGroupedMLP_CuTeGEMMSwiGLU_MXFP8 /
    # BackwardGroupedMLP_CuTeGEMMDSwiGLU_MXFP8, TE PR 2769: MXFP8 only; planner/kernels.py FUSED_GROUPED_MLP)
    fused_grouped_mlp: bool = False
    # the library whose recipe this is: "te" (TransformerEngine; a framework reads them through
    # Flavour.te_fp8_recipes, and the torch flavour's tensorwise is torchao's equivalent) or "torchao" (torchao.float8
    # only: a flavour with Flavour.torchao_float8)
    library: str = "te"
    # the backward GEMMs' kernel when it is not the forward's (kernel_dtype), with a rescale of each output by the
    # scale vectors after it (torchao rowwise: the cuBLAS tensorwise kernel, float8_ops.py addmm_float8_unwrapped)
    backward_kernel_dtype: str = ""
    # torchao's float8 all-gathers take this recipe: FSDP2's (Float8LinearConfig.enable_fsdp_float8_all_gather,
    # tensorwise weights only: torchao/float8/config.py __post_init__) and torchtitan's float8 TP (Float8ColwiseParallel
    # all-gathering fp8 activations: parallelize.py enable_float8_tensorwise_tp = float8 and not rowwise)
    float8_all_gather: bool = False
    # TransformerEngine's all-gather of an input already quantized falls back to bf16 too when the shard cannot be
    # quantized (Float8BlockQuantizer: distributed.py _start_all_gather_fp8_blockwise tests is_quantizable whatever the
    # input; MXFP8 and NVFP4 only for a high-precision input: gather_fallback)
    requantizes_quantized_gather: bool = False
    # Megatron --fp8-dot-product-attention hands this recipe fp8_dpa (Megatron-LM d98e8a6 fp8_utils.py get_fp8_recipe:
    # Float8CurrentScaling and MXFP8BlockScaling take fp8_dpa=config.fp8_dot_product_attention, TEDelayedScaling
    # through extensions/transformer_engine.py l. 3350; Float8BlockScaling does not), and whether TE's attention then
    # holds K and V as fp8 data (context_parallel.py: ``if not fp8_recipe.mxfp8(): q, k, v = [x._data ...]``; MXFP8
    # attention keeps them in the nominal dtype)
    fp8_dpa: bool = False
    dpa_quantized_kv: bool = False
    # TE's fused FP8 attention writes its output, and in an FP8 backward dQ, dK, dV, as fp8 data (TransformerEngine
    # d0067d0da csrc/extensions/attention.cpp fused_attn_bwd: "FP8DS: ... dQ/dK/dV.dtype = torch.uint8", "FP8CS/MXFP8:
    # ... dQ/dK/dV.dtype = torch.float16/torch.bfloat16"; backends.py FusedAttnFunc.forward ``out_``: Float8Tensor
    # under DelayedScaling, torch.Tensor under Float8CurrentScaling and MXFP8BlockScaling): so only then does TE
    # dequantize them for a bf16 caller (kernels.fp8_attention_casts) and the FP8 backward read the output saved as fp8
    # data (``fp8_tensors = (q_fp8, k_fp8, v_fp8, out_fp8)``; current scaling, NVTE_DPA_FP8CS_O_in_F16 default 1, and
    # MXFP8 save the bf16 output)
    dpa_fp8_output: bool = False

    def gathers_unquantized(self, rows: int, width: int, *, quantized_input: bool) -> bool:
        """Whether TransformerEngine all-gathers a shard of ``rows`` x ``width`` in bf16 instead of quantized: a block
        recipe whose quantizer cannot quantize the shard (``is_quantizable``: the last dimension and the product of
        the others multiples of the block: Float8BlockQuantizer 128, MXFP8Quantizer 32, NVFP4Quantizer 16; TE
        tensor/float8_blockwise_tensor.py, mxfp8_tensor.py, nvfp4_tensor.py) gathers the bf16 shard and quantizes
        the gathered tensor (distributed.py _start_all_gather_fp8_blockwise, _all_gather_mxfp8, _all_gather_nvfp4:
        "Cannot quantize input tensor. Performing all-gather in high precision.", TE 5fd5c35 #2637, v2.14 on; checked
        at d0067d0da). MXFP8 and NVFP4 fall back only for an input not yet quantized (``quantized_input`` False: a
        row-parallel linear's grad output, base.py grad_output_preprocess); a column-parallel input, quantized
        before its gather (linear.py ``inputmat = input_quantizer(inputmat)``, layernorm_linear.py's quantized norm),
        and the saved quantized input of the wgrad re-gather stay quantized. Per-tensor recipes never fall back.
        Not version-gated: no TE version is recorded; v2.9 (the 25.11 container) behaves otherwise for these shapes
        (docs/frameworks.md "Assumption, not gated")."""
        block = self.activation_block
        if not block or (rows % block == 0 and width % block == 0):
            return False
        return not quantized_input or self.requantizes_quantized_gather

    def weight_scales(self, numel: int) -> int:
        """Block scales of a weight of ``numel`` elements (per-tensor recipes: 1)."""
        rows, cols = self.weight_block
        return 1 if not rows else -(-numel // (rows * cols))

    def master_cast_amaxes(self, numel: int) -> int:
        """fp32 amaxes the optimizer step all-reduces (MAX, over DP) to cast one weight's master shard
        (TE tensor/utils.py: delayed and current scaling one per weight; blockwise one per 128x128 block;
        mxfp8 one per 1x32 block rowwise and columnwise; nvfp4 one per 16x16 block and one per weight)."""
        blocks = self.weight_scales(numel) if self.weight_block[0] else 0
        return self.amax_per_weight + self.amax_per_block * blocks

    @property
    def cast_bytes_per_element(self) -> float:
        """HBM bytes TE moves to quantize one bf16 element for a GEMM operand: read it (2 B; current scaling
        reads it twice, once for the amax: Float8CurrentScalingQuantizer), write the rowwise and the
        columnwise copy, and their block scales (one per block in each direction). For compute.py's cast
        time (the kernels' model decides whether to use it)."""
        scales = 2 * self.scale_bytes / self.activation_block if self.activation_block else 0.0
        return self.cast_read_bytes + 2 * self.element_bytes + scales

    @property
    def saved_input_bytes(self) -> float:
        """Bytes per element of the copy of its input a TE linear saves for its wgrad GEMM under this recipe: the
        quantized data in one direction only (TE 2.x module/linear.py: ``inputmat.update_usage(rowwise_usage=False,
        columnwise_usage=True)``, rowwise instead when the input is all-gathered; layernorm_linear.py ln_out;
        grouped_linear.py) with its block scales; a per-tensor recipe's one scale per tensor is not counted."""
        return self.element_bytes + (self.scale_bytes / self.activation_block if self.activation_block else 0.0)

    @property
    def saves_original_input(self) -> bool:
        """Whether TE honours ``save_original_input`` (the module saves its bf16 input, not a quantized copy):
        not with DelayedScaling (TE grouped_linear.py: "DelayedScaling recipe is not supported with
        save_original_input"; Megatron attention.py sets it on linear_proj only for fp8_recipe != 'delayed')."""
        return not self.amax_history

    def weight_copy_bytes(self, numel: int) -> int:
        """The quantized copies TE keeps of a bf16 weight between micro-batches (the is_first_microbatch cache):
        the rowwise data and the columnwise (transposed) data for the dgrad/wgrad GEMMs, with their scales."""
        data = 2 * numel * self.element_bytes
        return int(data + 2 * self.weight_scales(numel) * self.scale_bytes)


RECIPES: dict[str, Recipe] = {
    "delayed": Recipe(
        "delayed", "fp8", "E4M3 / E5M2 (HYBRID)", ("fprop", "dgrad", "wgrad"), 0, (0, 0), 4, 1.0, 89,
        TE + "recipe.DelayedScaling; Megatron --fp8-recipe delayed (default) --fp8-format hybrid", amax_history=True,
        norm_fused_read_bytes=2, norm_writes_quantized=True, fused_split_quantize=True, fp8_dpa=True,
        dpa_quantized_kv=True, dpa_fp8_output=True,
    ),
    "tensorwise": Recipe(
        "tensorwise", "fp8", "E4M3 / E5M2 (HYBRID)", ("fprop", "dgrad", "wgrad"), 0, (0, 0), 4, 1.0, 89,
        TE + "recipe.Float8CurrentScaling; Megatron --fp8-recipe tensorwise; torchao Float8LinearRecipeName."
        "TENSORWISE (torchtitan --float8.recipe_name tensorwise, the default)", tp_amax=True, cast_read_bytes=4,
        quantize_launches=4, norm_quantize_launches=3, norm_fused_read_bytes=2, float8_all_gather=True, fp8_dpa=True,
        dpa_quantized_kv=True,
    ),
    "blockwise": Recipe(
        "blockwise", "fp8", "E4M3 / E4M3", ("fprop", "dgrad", "wgrad"), 128, (128, 128), 4, 1.0, 90,
        TE + "recipe.Float8BlockScaling; DeepSeek-V3 report §3.3.2 (1x128 activation tiles, 128x128 weight blocks)",
        0, 1, "fp8_block", requantizes_quantized_gather=True,
    ),
    "mxfp8": Recipe(
        "mxfp8", "fp8", "E4M3 / E4M3", ("fprop", "dgrad", "wgrad"), 32, (1, 32), 1, 1.0, 100,
        TE + "recipe.MXFP8BlockScaling; OCP Microscaling Formats (MX) v1.0: 32-element blocks, E8M0 scales",
        0, 2, "mxfp8", fused_grouped_mlp=True, fp8_dpa=True, gemm_swizzle_launches=2,
    ),
    "nvfp4": Recipe(
        "nvfp4", "fp4", "E2M1 / E2M1", ("fprop", "dgrad", "wgrad"), 16, (16, 16), 1, 0.5, 100,
        TE + "recipe.NVFP4BlockScaling: 16-element blocks, E4M3 scales and an fp32 per-tensor scale",
        1, 1, "nvfp4", tp_amax=True, quantize_launches=3, norm_quantize_launches=3, gemm_swizzle_launches=2,
    ),
    "rowwise": Recipe(
        "rowwise", "fp8", "E4M3 / E4M3", ("fprop", "dgrad", "wgrad"), 0, (0, 0), 4, 1.0, 89,
        "torchao/float8/config.py (pytorch/ao 36027d82) Float8LinearRecipeName.ROWWISE: AXISWISE scales, E4M3, "
        "round_scales_to_power_of_2; torchtitan --float8.recipe_name rowwise",
        0, 0, "fp8_rowwise", cast_read_bytes=4, library="torchao", backward_kernel_dtype="fp8",
    ),
}  # fmt: skip
LIBRARIES = {"te": "TransformerEngine", "torchao": "torchao.float8 / torch._scaled_mm"}

# Parameters TE does not quantize: embeddings, the output layer, norms, routers, sinks (params.py names)
FULL_PRECISION_SUFFIXES = ("norm", "norms", "router", "sinks", "word", "position", "output_layer")


def recipe_of(name: str | None) -> Recipe | None:
    return RECIPES[name] if name else None


def quantized(param_name: str) -> bool:
    """Whether a parameter (params.py name) is a TE linear weight the recipe quantizes."""
    return not param_name.rsplit(".", 1)[-1].endswith(FULL_PRECISION_SUFFIXES)


def validate_recipe(fp8_recipe: str | None, fp8_param_gather: bool) -> None:
    if fp8_recipe is not None and fp8_recipe not in RECIPES:
        raise SpecError("workload.fp8_recipe", f"must be one of {', '.join(RECIPES)} or null, got {fp8_recipe!r}")
    if fp8_param_gather and fp8_recipe is None:
        raise SpecError(
            "workload.fp8_param_gather",
            "fp8_param_gather (Megatron --fp8-param-gather) needs an fp8_recipe: the weights must be fp8 to be "
            "gathered in fp8; got fp8_recipe null",
        )


def check_recipe_gpu(
    fp8_recipe: str | None, gpu, field: str = "workload.fp8_recipe", subject: str = "", hint: str = ""
) -> None:
    """A recipe the GPU's tensor cores lack is refused (TE raises at the first autocast), and an nvfp4 recipe on a
    GPU given without an fp4 peak (nothing to price its GEMMs at). The one home of the rule:
    a training recipe (``workload.fp8_recipe``) and serving's block-scaled weights (options.weight_dtype nvfp4:
    deployment.check_weight_format) name their own ``field``, ``subject`` and ``hint``."""
    recipe = recipe_of(fp8_recipe)
    if recipe is None or gpu is None:
        return
    sm = getattr(gpu, "sm", 0)
    if sm < recipe.min_sm:
        have = f"compute capability {sm / 10:.1f}" if sm else "no NVIDIA compute capability (sm 0)"
        raise SpecError(
            field,
            f"{subject or recipe.name + ' needs'} compute capability >= {recipe.min_sm / 10:.1f} "
            f"({LIBRARIES[recipe.library]}), but GPU {gpu.name!r} has {have}{hint}",
        )
    if recipe.kernel_dtype == "nvfp4" and not getattr(gpu, "peak_tflops", {}).get("fp4"):
        # its GEMMs run at the fp4 peak (kernels.dense_peak): a GPU given without one cannot price them
        raise SpecError(
            field,
            f"{subject or recipe.name + ' needs'} the GPU's dense fp4 peak (cluster.gpu.peak_tflops.fp4), "
            f"but GPU {gpu.name!r} has none{hint}",
        )


def float8_gathered(ctx) -> bool:
    """torchao's FSDP2 float8 all-gather is on (a torchao flavour with workload.fp8_param_gather, zero_stage 2/3:
    check_fsdp_float8_all_gather): the one home of the test rules/data.py, memory.py and kernels.py read."""
    return ctx.training and ctx.work.fp8_param_gather and ctx.flavour.torchao_float8


def gathered_param_bytes(ctx, p, expert: bool) -> int:
    """Bytes of parameter ``p`` (params.Param) while ZeRO-3 / FSDP holds it gathered: its Float8Linear weights at 1 B
    under torchao's FSDP2 float8 all-gather (float8_gathered; the routed experts' grouped weights are not
    Float8Linear weights: ``expert``), else the parameter dtype. The one rule rules/data.py's gathers and memory.py's
    gathered unit read."""
    low = float8_gathered(ctx) and not expert and quantized(p.name)
    return p.numel * (1 if low else ctx.param_bytes)


def check_recipe_framework(work, par) -> None:
    """A torchao-only recipe (rowwise) needs a framework that runs torchao.float8 (Flavour.torchao_float8)."""
    recipe = work.recipe
    if recipe is not None and recipe.library == "torchao" and not par.flavour.torchao_float8:
        raise SpecError(
            "workload.fp8_recipe",
            f"{recipe.name!r} is torchao.float8's recipe (torchtitan --float8.recipe_name {recipe.name}), which "
            f"framework {par.framework!r} does not run; its recipes are TransformerEngine's: "
            f"{', '.join(n for n, r in RECIPES.items() if r.library == 'te')}",
        )
    check_float8_tp(work, par)
    check_fp8_dpa(work, par)


def check_fp8_dpa(work, par) -> None:
    """--fp8-dot-product-attention is Megatron's (TransformerEngine's fp8 attention), for the recipes Megatron hands
    fp8_dpa (Recipe.fp8_dpa: delayed, tensorwise, mxfp8)."""
    if not work.fp8_dot_product_attention:
        if not work.fp8_dpa_backward:
            raise SpecError(
                "workload.fp8_dpa_backward",
                "is TransformerEngine's NVTE_FP8_DPA_BWD, the backward of an fp8 attention: it needs "
                f"workload.fp8_dot_product_attention true, got {shown(work.fp8_dot_product_attention)}",
            )
        return
    field = "workload.fp8_dot_product_attention"
    if not par.flavour.te_fp8_recipes:
        raise SpecError(field, f"is Megatron's --fp8-dot-product-attention (TransformerEngine); framework is "
                               f"{par.framework!r}")  # fmt: skip
    recipe = work.recipe
    if recipe is None or not recipe.fp8_dpa:
        ok = ", ".join(n for n, r in RECIPES.items() if r.fp8_dpa)
        raise SpecError(
            field,
            f"Megatron passes fp8_dpa to the {ok} recipes only (Megatron-LM d98e8a6 fp8_utils.py get_fp8_recipe), got "
            f"fp8_recipe {work.fp8_recipe!r}",
        )


def dpa_recipe(ctx) -> Recipe | None:
    """The recipe TE's dot-product attention runs in fp8 with (workload.fp8_dot_product_attention, training), else
    None: the one test rules/context_parallel.py reads."""
    work = ctx.work
    return work.recipe if ctx.training and work.fp8_dot_product_attention else None


def check_float8_tp(work, par) -> None:
    """Under torchtitan (a torchao flavour), activation_dtype fp8 with tp > 1 is float8 tensor parallelism (the TP
    all-gathers in fp8), which torchtitan enables for tensorwise recipes only: "For rowwise recipes, we use regular TP
    and all-gather happens in high precision" (torchtitan models/llama3/infra/parallelize.py
    enable_float8_tensorwise_tp)."""
    recipe = work.recipe
    if recipe is None or not par.flavour.torchao_float8 or work.activation_dtype != "fp8" or par.tp == 1:
        return
    if not recipe.float8_all_gather:
        raise SpecError(
            "workload.activation_dtype",
            f"fp8 activations with tp {par.tp} are torchtitan's float8 tensor parallelism, tensorwise only; "
            f"fp8_recipe {recipe.name!r} runs regular TP, all-gathered in high precision: use activation_dtype bf16",
        )


def check_param_gather(work, par) -> None:
    """--fp8-param-gather is Megatron's (TE primary weights) with its distributed optimizer (zero_stage 1) in training;
    under a torchao flavour it is FSDP2's float8 all-gather (check_fsdp_float8_all_gather)."""
    if not work.fp8_param_gather:
        if work.fp8_precompute_scale:
            raise SpecError(
                "workload.fp8_precompute_scale",
                "torchao's precompute_float8_dynamic_scale_for_fsdp computes the scales of the float8 all-gather: "
                f"it needs fp8_param_gather (enable_fsdp_float8_all_gather), got {shown(work.fp8_param_gather)}",
            )
        return
    if par.flavour.torchao_float8:
        check_fsdp_float8_all_gather(work, par)
        return
    if work.fp8_precompute_scale:
        raise SpecError(
            "workload.fp8_precompute_scale",
            f"is torchao's precompute_float8_dynamic_scale_for_fsdp (FSDP2); framework is {par.framework!r}",
        )
    if not par.flavour.te_fp8_recipes:
        raise SpecError(
            "workload.fp8_param_gather",
            f"is Megatron's --fp8-param-gather (TransformerEngine primary weights); framework is {par.framework!r}",
        )
    if work.training and par.zero_stage != 1:
        raise SpecError("workload.fp8_param_gather", _param_gather_refusal(par.zero_stage))


# Megatron-LM d98e8a64dd megatron/training/arguments.py validate_args l. 1095-1097, whole: ``assert
# args.use_distributed_optimizer or args.use_torch_fsdp2 or args.use_megatron_fsdp or not torch.is_grad_enabled(),
# "--fp8-param-gather only supported with distributed optimizer, torch fsdp2, megatron fsdp, or inference mode"``
# (033d8b0de5 l. 316-318, where the flag came in, allowed the distributed optimizer only). Review r14d #5.
MEGATRON_PARAM_GATHER_RULE = (
    "Megatron-LM d98e8a64dd training/arguments.py: '--fp8-param-gather only supported with distributed optimizer, "
    "torch fsdp2, megatron fsdp, or inference mode'"
)


def _param_gather_refusal(zero_stage: int) -> str:
    """Why a Megatron training plan refuses fp8_param_gather at ``zero_stage`` (not 1): Megatron's own rule without
    optimizer sharding; with FSDP (zero_stage 2 or 3) Megatron allows it and the limit is this planner's, which prices
    the fp8 weights' update only as the distributed optimizer's cast of its master shard
    (kernels.step_weight_cast_bytes), not Megatron FSDP's."""
    if zero_stage == 0:
        return (
            "needs Megatron's distributed optimizer (parallel.zero_stage 1) or FSDP, got zero_stage 0 "
            f"({MEGATRON_PARAM_GATHER_RULE})"
        )
    return (
        f"at parallel.zero_stage {zero_stage} (Megatron FSDP) Megatron allows it ({MEGATRON_PARAM_GATHER_RULE}), but "
        "this planner does not model Megatron FSDP's fp8 parameter gather: it prices --fp8-param-gather with the "
        "distributed optimizer only, parallel.zero_stage 1"
    )


def check_fsdp_float8_all_gather(work, par) -> None:
    """torchao's enable_fsdp_float8_all_gather: FSDP2 (fully_shard: zero_stage 2 or 3) and a tensorwise recipe
    (torchao/float8/config.py __post_init__ asserts tensorwise weights)."""
    recipe = work.recipe
    if not recipe.float8_all_gather:
        ok = ", ".join(n for n, r in RECIPES.items() if r.float8_all_gather)
        raise SpecError(
            "workload.fp8_param_gather",
            f"torchao's FSDP2 float8 all-gather (enable_fsdp_float8_all_gather) supports tensorwise scaling only "
            f"(torchao/float8/config.py), got fp8_recipe {recipe.name!r}; use {ok}",
        )
    if par.zero_stage < 2:
        raise SpecError(
            "workload.fp8_param_gather",
            f"is FSDP2's float8 all-gather (torchao enable_fsdp_float8_all_gather): needs fully_shard, zero_stage 2 "
            f"or 3, got zero_stage {par.zero_stage}",
        )


def check_act_fp8_store(work, par, model) -> None:
    """--activation-func-fp8-input-store is Megatron's, for SwiGLU only (transformer_config.py: "Storing activation
    input in FP8 is supported only for SwiGLU")."""
    if not work.activation_func_fp8_input_store:
        return
    if not par.flavour.te_fp8_recipes:
        raise SpecError(
            "workload.activation_func_fp8_input_store",
            f"is Megatron's --activation-func-fp8-input-store; framework is {par.framework!r}",
        )
    if not model.gated_mlp:
        raise SpecError(
            "workload.activation_func_fp8_input_store",
            "Megatron stores the activation input in fp8 only for SwiGLU (transformer_config.py); the model's MLP "
            "is not gated (gated_mlp false)",
        )
