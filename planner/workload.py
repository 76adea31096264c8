"""What one iteration is: a training step, or one inference prefill pass or decode step."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from functools import lru_cache

from collectives._hashing import frozen_hash, kept_property

from ._errors import SpecError, at_least_one, one_of
from .engine_kernels import EngineKernels
from .model import ModelSpec
from .recipes import Recipe, recipe_of, validate_recipe

DTYPE_BYTES = {"fp32": 4, "float32": 4, "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2, "fp8": 1}
# Block-scaled checkpoint formats an inference engine loads its linear weights in (inference ``param_dtype`` only):
# bytes per weight element with its block scales, a fraction (the totals that multiply it round the product, once:
# memory.held_bytes). NVFP4: TensorRT-LLM tensorrt_llm/_torch/modules/linear.py (at 00bbf71e7964)
# NVFP4LinearMethod.create_weights holds a linear's weight as [out, in // 2] float4_e2m1x2 (two E2M1 values a
# byte), its weight_scale as one E4M3 byte per 16 inputs (scaling_vector_size 16; rows padded to 128 and scale
# columns to 4, nothing for the models' multiples of 128 x 64) and weight_scale_2, one fp32 per tensor (left out:
# 4 B a tensor): 0.5 + 1/16 = 0.5625 B. Its GEMMs run as the recipe of the same name (planner/recipes.py "nvfp4",
# Recipe.kernel_dtype). Only the transformer blocks' linear weights are stored so (nvidia/Llama-3.1-405B-Instruct-FP4
# model card, ModelOpt: "Only the weights and activations of the linear operators within transformers blocks are
# quantized"): the embedding, output layer and norms stay in the activation dtype (memory.held_bytes).
# MXFP4 (GPT-OSS's checkpoints): vLLM vllm/model_executor/layers/quantization/mxfp4.py (at 007d50058a06)
# Mxfp4MoEMethod.create_weights holds each expert weight as uint8 [.., in // 2] (two E2M1 values a byte) and its
# weight_scale as one uint8 (E8M0) per ``mxfp4_block`` 32 inputs: 0.5 + 1/32 = 0.53125 B (the bf16 biases, at most
# 0.1% of GPT-OSS's expert weights, counted at that rate too). Only the MoE experts are stored so: Mxfp4Config.
# get_quant_method gives every LinearBase UnquantizedLinearMethod ("MXFP4 linear layer is not implemented") and
# skips attention (SGLang's python/sglang/srt/layers/quantization/mxfp4.py the same): EXPERT_WEIGHT_FORMATS.
WEIGHT_FORMAT_BYTES = {"nvfp4": 0.5 + 1 / 16, "mxfp4": 0.5 + 1 / 32}
# the low-precision recipe (planner/recipes.py) each format's GEMMs run as; None: no recipe, the GEMMs in bf16 with
# the weights dequantized in the kernel (MXFP4: vLLM's default backends, Marlin / Triton on Hopper and FlashInfer's
# MXFP4 x BF16 on Blackwell, mxfp4.py get_mxfp4_backend; planner/kernels.py EXPERT_GEMM_DTYPE)
WEIGHT_FORMAT_RECIPE: dict[str, str | None] = {"nvfp4": "nvfp4", "mxfp4": None}
# formats that store only the routed experts' weights (the rest of the model in the activation dtype)
EXPERT_WEIGHT_FORMATS = ("mxfp4",)
# Block-scaled formats a MoE dispatch moves its rows in (``moe_dispatch_dtype``, set by planner/serving, not an API
# value), bytes per element with the scales: TensorRT-LLM's post-quant DeepEP dispatch of an NVFP4 checkpoint
# (_torch/modules/fused_moe/communication/deep_ep_low_latency.py at f72b25a65f89, nvfp4 branch: hidden_states uint8
# [tokens, h // 2] and hidden_states_sf uint8 [tokens, h // 16] into low_latency_dispatch_fp4; deep_ep.py at
# c12e67bb66fe the same pair, the scales viewed as fp32, into the normal dispatch): 0.5 + 1/16 B
DISPATCH_FORMATS = {"nvfp4": 0.5 + 1 / 16}


def weight_bytes(dtype: str) -> float:
    """Bytes of one stored weight element: a plain dtype's, or a block-scaled format's with its scales."""
    return DTYPE_BYTES[dtype] if dtype in DTYPE_BYTES else WEIGHT_FORMAT_BYTES[dtype]


RECOMPUTE = ("none", "selective", "full")
# Core-attention kernels: "flash" (the framework's default fused kernel for the GPU: planner/kernels.py
# the flavour's flash_attention_by_sm), "flash2" (FlashAttention-2), "flash3" (FlashAttention-3, Hopper only), "cudnn"
# (TransformerEngine / cuDNN fused attention) or "unfused" (Megatron-LM before FlashAttention, 2021-2022: QK^T and
# PV as batched GEMMs around FusedScaleMaskSoftmax and dropout, the s x s scores written to HBM).
ATTENTION_KERNELS = ("flash", "flash2", "flash3", "cudnn", "unfused")


@dataclass(frozen=True)
class WorkloadSpec:
    __hash__ = frozen_hash  # computed once (collectives/_hashing.py): the planner's memos key on the spec

    kind: str = "training"  # training | inference
    # training
    micro_batch_size: int = 1
    global_batch_size: int = 1
    activation_recompute: str = "none"  # none | selective (core attention) | full (whole layer)
    seq_length: int | None = None  # CONTRACT v1.1: the training sequence; wins over the model's seq_length
    # Megatron --create-attention-mask-in-dataloader (default on: Megatron-LM d98e8a6 arguments.py:3332
    # store_false): the b x 1 x s x s bool mask is built by the loader and broadcast over TP with the batch
    attention_mask_in_dataloader: bool = True
    attention_kernel: str = "flash"  # ATTENTION_KERNELS
    # Kernel launch and fusion: None = the framework's default (Megatron-Core, torchtitan and DeepSpeed: no CUDA
    # graphs, no torch.compile; Megatron's TransformerEngine fuses its elementwise kernels anyway)
    cuda_graphs: bool | None = None
    torch_compile: bool | None = None
    # Megatron --gradient-accumulation-fusion (the weight-gradient GEMM accumulates into main_grad): None = the
    # framework's default (its flavour's grad_accumulation_fusion); False = Megatron-LM before the fusion (2021):
    # every micro-batch adds each weight gradient into its buffer in a kernel of its own (planner/kernels.py)
    grad_accumulation_fusion: bool | None = None
    # Megatron --cross-entropy-loss-fusion: None = the framework's default (Megatron: off, the loss as torch ops)
    cross_entropy_fusion: bool | None = None
    # torchtitan's loss parallelism (training.disable_loss_parallel, store_true: on whenever tp > 1; torchtitan
    # 9dec370 parallelize_llama.py: the output projection keeps the logits Shard(-1) and F.cross_entropy runs under
    # torch.distributed.tensor.parallel.loss_parallel): None = the framework's default (its flavour's
    # vocab_parallel_loss: torch off, the logits gathered as plain DTensor TP does; Megatron always on)
    loss_parallel: bool | None = None
    # how an eager framework runs its RMSNorm (planner/kernels.py RMSNORM_OPS): "ops" = the op chain of
    # torchtitan's RMSNorm (norm_type "rmsnorm" up to 2025: x.float(), pow, mean, + eps, rsqrt, mul, type_as, * weight,
    # and autograd's backward of each); "fused" = one kernel each way (F.rms_norm on CUDA, TE, Inductor); None = the
    # framework's (fused); "apex" = Megatron-LM's MixedFusedLayerNorm before its persistent kernel (Megatron-LM
    # 6985e58, planner/kernels.py APEX_LAYER_NORM)
    norm_kernel: str | None = None
    # torch.optim.AdamW's implementation (torchtitan optimizer.implementation; 9dec370: foreach unless
    # --optimizer.fused): "fused" | "foreach"; None = "fused" (planner/kernels.py TORCH_ADAMW_BYTES)
    optimizer_implementation: str | None = None
    # TransformerEngine's fused grouped MLP for the routed experts (Megatron-Core --use-transformer-engine-op-fuser
    # with NVTE_CUTEDSL_FUSED_GROUPED_MLP=1, the Megatron-Bridge 26.08 MXFP8 recipes): planner/kernels.py
    # FUSED_GROUPED_MLP. False: TEGroupedMLP's per-expert GEMMs (Megatron's default)
    fused_grouped_mlp: bool = False
    # Megatron-Core's per-layer TransformerEngine CUDA graphs of part of an MoE layer (--cuda-graph-impl
    # transformer_engine --cuda-graph-scope; the Megatron-Bridge 25.11 Qwen3-30B and DeepSeek-V3 GB200 recipes:
    # ["moe_router", "moe_preprocess"]): CUDA_GRAPH_SCOPES, planner/kernels.py graphed_groups. () = none; the whole
    # step captured is cuda_graphs
    cuda_graph_scope: tuple[str, ...] = ()
    # where TransformerEngine swizzles MXFP8 / NVFP4 block scales into cuBLAS's layout (Recipe.gemm_swizzle_launches):
    # "quantize" = the quantizer writes them swizzled (optimize_for_gemm: the TE v2.18 line of the Megatron-Bridge
    # 26.08 stack, the newest published one, hence the default); "gemm" = two swizzle launches at every low-precision
    # GEMM call (TE v2.9, the 25.11 stack). No other recipe has block scales to swizzle
    scale_swizzle: str = "quantize"
    # the method TransformerEngine's userbuffers run linear_proj's and linear_fc2's forward reduce-scatter GEMMs with
    # under Megatron --tp-comm-overlap (kernels.userbuffers_split): the run's ub config (Megatron-Bridge
    # comm_overlap.py TransformerLayerTPOverlapCfg proj_fprop / fc2_fprop), "pipeline" being initialize_ub's default
    # (TE v1.8 / v2.9 pytorch/module/base.py) and "ring_exchange" split_overlap_rs_p2p's tp row chunks
    # (None: not given, "pipeline"; given under a framework without userbuffers, a 422: parallel._framework_switches)
    userbuffers_proj_fprop: str | None = None
    userbuffers_fc2_fprop: str | None = None
    # inference
    phase: str = "prefill"  # prefill | decode
    batch_size: int = 1  # sequences across all data-parallel replicas
    context_length: int | None = None  # prompt length (prefill) or KV length (decode); default seq_length
    # dtypes
    param_dtype: str = "bf16"
    activation_dtype: str = "bf16"
    grad_reduce_dtype: str | None = None  # None: the framework's default (megatron fp32, others = params)
    moe_dispatch_dtype: str | None = None  # None: activation dtype; "fp8" for DeepSeek-style dispatch
    kv_dtype: str | None = None  # inference: the KV cache's dtype (vLLM --kv-cache-dtype); None: activation dtype
    # low-precision training (planner/recipes.py): delayed | tensorwise | blockwise | mxfp8 | nvfp4; None: the
    # GEMMs run in the activation dtype. fp8_param_gather: Megatron --fp8-param-gather (fp8 primary weights,
    # the distributed optimizer's parameter all-gather in fp8)
    fp8_recipe: str | None = None
    # under a torchao flavour (Flavour.torchao_float8) fp8_param_gather is FSDP2's float8 all-gather (torchtitan
    # float8.enable_fsdp_float8_all_gather), and fp8_precompute_scale torchtitan's
    # float8.precompute_float8_dynamic_scale_for_fsdp (one amax all-reduce per step instead of one per gather)
    fp8_param_gather: bool = False
    fp8_precompute_scale: bool = False
    # Megatron --fp8-dot-product-attention: TransformerEngine's core attention in fp8 (recipes.check_fp8_dpa); its
    # context-parallel exchanges then carry fp8 K/V (rules/context_parallel.py) and the attention kernels run at
    # cuDNN's FP8 rate with TE's casts (kernels.ATTENTION_FP8_SPEEDUP, fp8_attention_casts)
    fp8_dot_product_attention: bool = False
    # TE's NVTE_FP8_DPA_BWD (default 1): the FP8 attention's backward in FP8 too; False, forward only (the backward
    # reads the saved bf16 q, k, v and runs the bf16 kernel). Only with fp8_dot_product_attention
    # (recipes.check_fp8_dpa)
    fp8_dpa_backward: bool = True
    # inference: the serving engine's context (prefill) attention runs its FP8 FMHA, Q, K and V quantized by its own
    # fused QKV preprocessing (no separate casts), at kernels.context_fmha_fp8_speedup; set by planner/serving from
    # EngineTraits.fp8_context_attention (TensorRT-LLM with quantized linears), not an API field
    fp8_context_attention: bool = False
    # inference: what the serving engine's own kernels fuse or move in another dtype (planner/engine_kernels.py: MLA's
    # fused down projection, ep_scatter's fp8 rows, the masked experts' activation quantize); set by planner/serving
    # from EngineTraits.kernels, not an API field. None: the planner's default kernels
    engine_kernels: EngineKernels | None = None
    # Megatron --activation-func-fp8-input-store: the SwiGLU input saved for backward as float8_e4m3fn
    # (megatron/core/fusions/fused_bias_swiglu.py; transformer_config.py: SwiGLU only); DeepSeek-V3 report §3.3.2
    activation_func_fp8_input_store: bool = False
    # ---- recompute as configured (issue 21; planner/recompute.py): activation_recompute is Megatron's
    # --recompute-granularity (none | selective | full) ----
    recompute_method: str | None = None  # --recompute-method uniform | block (full only; None: uniform, 1 layer)
    recompute_num_layers: int | None = None  # --recompute-num-layers: layers per group (uniform) or per chunk (block)
    recompute_modules: tuple[str, ...] | None = None  # --recompute-modules (selective); None: ("core_attn",)
    # torchtitan activation_checkpoint.selective_ac_option (selective, torch flavour): "op" (per-op: save the
    # compute ops' outputs but every second mm) or "N" (every N-th layer fully checkpointed)
    selective_ac_option: str | None = None
    # Megatron --cpu-offloading --cpu-offloading-num-layers N (TransformerEngine's activation offload): the
    # activations of N layers go to host memory over PCIe in the forward and come back in the backward
    cpu_offloading_num_layers: int = 0
    # packed documents (intra-document attention): the lengths of the documents each training sequence packs, in
    # order, summing to the sequence (Megatron's packed THD batches: cu_seqlens, causal attention within each
    # document; planner/kernels.py document_keys). None: one document a sequence
    document_lengths: tuple[int, ...] | None = None
    # how the documents fill the micro-batches: None, every sequence packs document_lengths (no imbalance);
    # "dp_balanced", Megatron's packing scheduler (data_schedule.py DpBalancedScheduler): document_lengths is the
    # corpus's distribution, documents packed next-fit into sequences; the step waits for the slowest micro-batch
    # (planner/documents.py)
    document_packing: str | None = None

    @kept_property  # beside the spec, not in its __dict__ (collectives/_hashing.py)
    def document_histogram(self) -> tuple[tuple[int, int], ...] | None:
        """document_lengths as (length, count) pairs, by length: counted once per spec (a corpus of 200k lengths
        is one pass here, not one per layout; planner/documents.py pack_moments is keyed by it)."""
        return None if self.document_lengths is None else _histogram(self.document_lengths)

    @property
    def training(self) -> bool:
        return self.kind == "training"

    @property
    def recipe(self) -> Recipe | None:
        return recipe_of(self.fp8_recipe)


@lru_cache(maxsize=4)
def _histogram(lengths: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    """A corpus's (length, count) pairs, by length, memoised by the corpus's value: a spec that comes unpickled to a
    search worker (planner/search/engine.py hands each job its problem) holds its kept values no more, and finds
    here the count made for an equal corpus (200,000 lengths: ~35 ms to count, ~2 ms to hash and compare)."""
    return tuple(sorted(Counter(lengths).items()))


def _known_dtype(name: str, value: str) -> bool:
    """A dtype field's value: a plain dtype; a checkpoint format for param_dtype; a post-quant format for the MoE
    dispatch (DISPATCH_FORMATS)."""
    formats = {"param_dtype": WEIGHT_FORMAT_BYTES, "moe_dispatch_dtype": DISPATCH_FORMATS}.get(name, {})
    return value in DTYPE_BYTES or value in formats


def _check_dispatch_format(w: WorkloadSpec) -> None:
    """A post-quant dispatch format (DISPATCH_FORMATS) is a serving engine's dispatch of weights in that format: an
    inference workload whose param_dtype is the same, else a 422 naming both."""
    given = w.moe_dispatch_dtype
    if given in DISPATCH_FORMATS and (w.training or w.param_dtype != given):
        raise SpecError(
            "workload.moe_dispatch_dtype",
            f"a {given} dispatch is a serving engine's post-quant dispatch of {given} weights (DISPATCH_FORMATS): "
            f"inference with param_dtype {given!r} only; got {w.kind} with param_dtype {w.param_dtype!r}",
        )


def validate_workload(w: WorkloadSpec) -> None:
    if w.kind not in ("training", "inference"):
        raise SpecError("workload.kind", f"must be 'training' or 'inference', got {w.kind!r}")
    if w.param_dtype in WEIGHT_FORMAT_BYTES:
        _weight_format(w)
    for name in ("param_dtype", "activation_dtype", "grad_reduce_dtype", "moe_dispatch_dtype", "kv_dtype"):
        value = getattr(w, name)
        if value is not None and not _known_dtype(name, value):
            raise SpecError(f"workload.{name}", f"unknown dtype {value!r}; known: {', '.join(DTYPE_BYTES)}")
    _check_dispatch_format(w)
    validate_recipe(w.fp8_recipe, w.fp8_param_gather)
    one_of("workload.attention_kernel", w.attention_kernel, ATTENTION_KERNELS)
    if w.norm_kernel is not None:
        one_of("workload.norm_kernel", w.norm_kernel, NORM_KERNELS)
    if w.optimizer_implementation is not None:
        one_of("workload.optimizer_implementation", w.optimizer_implementation, OPTIMIZER_IMPLEMENTATIONS)
    one_of("workload.scale_swizzle", w.scale_swizzle, SCALE_SWIZZLES)
    for name in USERBUFFERS_FIELDS:
        if getattr(w, name) is not None:
            one_of(f"workload.{name}", getattr(w, name), USERBUFFERS_RS_METHODS)
    if w.training:
        _training_workload(w)
    else:
        _inference_workload(w)


def _weight_format(w: WorkloadSpec) -> None:
    """A block-scaled weight format is a checkpoint an inference engine serves, its GEMMs the recipe's."""
    if w.training:
        raise SpecError(
            "workload.param_dtype",
            f"{w.param_dtype} is a block-scaled inference checkpoint format ({WEIGHT_FORMAT_BYTES[w.param_dtype]} B "
            f"per weight); training keeps bf16/fp32 weights and runs {w.param_dtype} GEMMs with fp8_recipe "
            f"{w.param_dtype!r}",
        )
    recipe = WEIGHT_FORMAT_RECIPE[w.param_dtype]
    if w.fp8_recipe != recipe:
        runs = f"as the {recipe!r} recipe" if recipe else "in bf16 with the weights dequantized (fp8_recipe null)"
        raise SpecError("workload.fp8_recipe", f"{w.param_dtype} weights run their GEMMs {runs}; got {w.fp8_recipe!r}")


DOCUMENT_PACKING = ("dp_balanced",)  # Megatron-LM d98e8a6 data_schedule.py PackingSchedulerEnum


def _training_workload(w: WorkloadSpec) -> None:
    at_least_one("workload.micro_batch_size", w.micro_batch_size)
    at_least_one("workload.global_batch_size", w.global_batch_size)
    if w.seq_length is not None:
        at_least_one("workload.seq_length", w.seq_length)
    one_of("workload.activation_recompute", w.activation_recompute, RECOMPUTE)
    _recompute_options(w)
    if w.cuda_graph_scope:
        _cuda_graph_scope(w)
    if w.cpu_offloading_num_layers < 0:
        raise SpecError("workload.cpu_offloading_num_layers", f"must be >= 0, got {w.cpu_offloading_num_layers}")
    if w.document_lengths is not None:
        short = [n for n in w.document_lengths if n < 1]
        if not w.document_lengths or short:
            raise SpecError(
                "workload.document_lengths", f"needs one or more lengths >= 1, got {list(w.document_lengths)}"
            )
    if w.document_packing is not None:
        one_of("workload.document_packing", w.document_packing, DOCUMENT_PACKING)
        if w.document_lengths is None:
            raise SpecError(
                "workload.document_packing",
                "packs documents of workload.document_lengths (the corpus's lengths), which is not given",
            )


def _inference_workload(w: WorkloadSpec) -> None:
    if w.phase not in ("prefill", "decode"):
        raise SpecError("workload.phase", f"must be 'prefill' or 'decode', got {w.phase!r}")
    at_least_one("workload.batch_size", w.batch_size)
    if w.context_length is not None:
        at_least_one("workload.context_length", w.context_length)


NORM_KERNELS = ("fused", "ops", "apex")
OPTIMIZER_IMPLEMENTATIONS = ("fused", "foreach")
SCALE_SWIZZLES = ("quantize", "gemm")  # WorkloadSpec.scale_swizzle
USERBUFFERS_FIELDS = ("userbuffers_proj_fprop", "userbuffers_fc2_fprop")  # WorkloadSpec's, None: "pipeline"
USERBUFFERS_RS_METHODS = ("pipeline", "ring_exchange")  # WorkloadSpec.userbuffers_proj_fprop / userbuffers_fc2_fprop
RECOMPUTE_METHODS = ("uniform", "block")
# Megatron-Core --recompute-modules (megatron/core/transformer/transformer_config.py recompute_modules)
RECOMPUTE_MODULES = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts")


# the --cuda-graph-scope values the planner prices (Megatron-LM cba6b0ed0f, the Megatron-Bridge 25.11 submodule,
# transformer_config.py l. 1596-1625 takes attn, mlp, moe, moe_router, moe_preprocess, mamba): "moe_router" captures
# an MoE layer's pre-MLP norm and router (transformer_layer.py _get_submodules_under_cudagraphs l. 790: [
# pre_mlp_layernorm, mlp.router]), "moe_preprocess" the alltoall dispatcher's preprocess with it (moe_layer.py l.
# 296-306: the graph returns at MoECudaGraphPartialCaptureSignal after self.preprocess)
CUDA_GRAPH_SCOPES = ("moe_router", "moe_preprocess")
# recompute modules Megatron refuses beside a moe_router graph (transformer_config.py l. 1668-1674)
GRAPHED_ROUTER_NO_RECOMPUTE = ("moe", "shared_experts")


def _cuda_graph_scope(w: WorkloadSpec) -> None:
    """Megatron's TransformerConfig rules for a partial TE graph (transformer_config.py l. 1596-1674), on the scopes
    the planner prices (CUDA_GRAPH_SCOPES); the model's MoE is kernels.check_cuda_graph_scope's."""
    field = "workload.cuda_graph_scope"
    for scope in w.cuda_graph_scope:
        one_of(field, scope, CUDA_GRAPH_SCOPES)
    twice = sorted({s for s in w.cuda_graph_scope if w.cuda_graph_scope.count(s) > 1})
    if twice:  # one graph per scope: a repeated value would read as another graph (and another cache key)
        raise SpecError(field, f"lists {twice[0]!r} {w.cuda_graph_scope.count(twice[0])} times; list each scope once")
    if "moe_preprocess" in w.cuda_graph_scope and "moe_router" not in w.cuda_graph_scope:
        raise SpecError(field, "moe_preprocess is captured only with moe_router (Megatron transformer_config.py)")
    if w.cuda_graphs:
        raise SpecError(field, "is part of a layer in TE graphs; cuda_graphs true already captures the whole step")
    if w.activation_recompute == "full":
        # transformer_config.py cba6b0ed0f l. 1645-1649: ValueError("Full-layer CUDA graphs not supported with
        # activation recomputation."); arguments.py l. 1255-1257: assert args.recompute_granularity != 'full'
        raise SpecError(field, "Megatron runs no CUDA graphs with full activation recompute (activation_recompute)")
    if w.cpu_offloading_num_layers > 0:
        # transformer_config.py cba6b0ed0f l. 1572-1573: ValueError("CUDA graphs not supported with CPU offloading.")
        raise SpecError(
            field,
            f"Megatron runs no CUDA graphs with CPU offloading (cpu_offloading_num_layers "
            f"{w.cpu_offloading_num_layers})",
        )
    clash = [m for m in w.recompute_modules or () if m in GRAPHED_ROUTER_NO_RECOMPUTE]
    if clash and w.activation_recompute == "selective":
        raise SpecError(field, f"a moe_router CUDA graph does not run with {clash[0]!r} recompute (Megatron)")


def _recompute_options(w: WorkloadSpec) -> None:
    """Megatron's TransformerConfig rules: method and layer count go with full recompute, modules with
    selective (transformer_config.py __post_init__)."""
    if w.recompute_method is not None:
        one_of("workload.recompute_method", w.recompute_method, RECOMPUTE_METHODS)
        _goes_with("workload.recompute_method", "full", w)
    if w.recompute_num_layers is not None:
        _goes_with("workload.recompute_num_layers", "full", w)
        at_least_one("workload.recompute_num_layers", w.recompute_num_layers)
    if w.selective_ac_option is not None:
        _selective_ac_option(w)
    if w.recompute_modules is not None:
        _goes_with("workload.recompute_modules", "selective", w)
        bad = [m for m in w.recompute_modules if m not in RECOMPUTE_MODULES]
        if bad:
            raise SpecError(
                "workload.recompute_modules", f"unknown module {bad[0]!r}; known: {', '.join(RECOMPUTE_MODULES)}"
            )


def _goes_with(field: str, recompute: str, w: WorkloadSpec) -> None:
    if w.activation_recompute != recompute:
        raise SpecError(field, f"goes with activation_recompute {recompute!r}, got {w.activation_recompute!r}")


def _selective_ac_option(w: WorkloadSpec) -> None:
    """torchtitan's selective_ac_option: "op", or a layer frequency, under its mode selective."""
    opt = w.selective_ac_option
    if not (opt == "op" or (opt.isdigit() and int(opt) >= 1)):
        raise SpecError(
            "workload.selective_ac_option",
            f"must be 'op' or a positive int representing layer frequency (torchtitan), got {opt!r}",
        )
    if w.activation_recompute != "selective" or w.recompute_modules is not None:
        raise SpecError(
            "workload.selective_ac_option",
            "goes with activation_recompute 'selective' and no recompute_modules (torchtitan's mode selective); got "
            f"activation_recompute {w.activation_recompute!r}, recompute_modules "
            f"{'null' if w.recompute_modules is None else list(w.recompute_modules)}",
        )


DEFAULT_RECOMPUTE_MODULES = ("core_attn",)  # Megatron-Core's recompute_modules default


def selective_modules(work: WorkloadSpec) -> tuple[str, ...]:
    """The modules selective recompute re-runs; none unless activation_recompute is selective (torchtitan's
    per-layer option: none here, planner/recompute.py checkpoints whole layers; per-op: "op")."""
    if work.activation_recompute != "selective":
        return ()
    if work.selective_ac_option is not None:
        return ("op",) if work.selective_ac_option == "op" else ()
    return work.recompute_modules if work.recompute_modules is not None else DEFAULT_RECOMPUTE_MODULES


def check_recompute_modules(work: WorkloadSpec, model: ModelSpec) -> None:
    """A recompute module the model does not have is bad input, named with what the model has."""
    mods = set(selective_modules(work)) - {"op"}
    moe = model.moe
    if work.selective_ac_option == "op" and moe is not None:
        raise SpecError(
            "workload.selective_ac_option",
            "per-op selective checkpointing is modelled for dense layers (torchtitan's mm save list); "
            f"the model has {moe.num_experts} experts",
        )
    dense_layers = model.num_layers - model.num_moe_layers if moe else model.num_layers
    lacks = {
        "moe_act": moe is None,
        "moe": moe is None,
        "shared_experts": moe is None or not moe.shared_ffn,
        "mla_up_proj": model.mla is None,
        "mlp": dense_layers == 0,
    }
    for name in sorted(mods):
        if lacks.get(name):
            what = {
                "moe_act": "no MoE layers (model.moe is null)",
                "moe": "no MoE layers (model.moe is null)",
                "shared_experts": "no shared experts",
                "mla_up_proj": "no multi-head latent attention (model.mla is null)",
                "mlp": f"no dense MLP: all {model.num_layers} layers are MoE",
            }[name]
            raise SpecError("workload.recompute_modules", f"recompute module {name!r}: the model has {what}")
    off = work.cpu_offloading_num_layers
    if off and not 0 < off < model.num_layers:
        raise SpecError(
            "workload.cpu_offloading_num_layers",
            f"CPU offloading can be done only for layers less than {model.num_layers}, got {off} "
            "(megatron/core/transformer/transformer_config.py)",
        )
    if off and work.activation_recompute != "none":
        raise SpecError(
            "workload.cpu_offloading_num_layers",
            "CPU offloading does not work when activation recomputation is enabled (transformer_config.py); "
            f"activation_recompute is {work.activation_recompute!r}",
        )
    n = work.recompute_num_layers
    if model.mtp_layers and work.activation_recompute == "full" and work.recompute_method != "block" and (n or 1) != 1:
        raise SpecError(
            "workload.recompute_num_layers",
            f"full recompute by the uniform method of a model with {model.mtp_layers} MTP layers needs "
            f"recompute_num_layers 1, got {n} (Megatron-LM multi_token_prediction.py _checkpointed_forward: "
            '"recompute_num_layers must be 1 for MTP recompute")',
        )
    if work.activation_recompute == "full" and n is not None and n > model.num_layers:
        raise SpecError(
            "workload.recompute_num_layers",
            f"recompute_num_layers {work.recompute_num_layers} > num_layers {model.num_layers}",
        )
