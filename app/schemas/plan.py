"""Plan request and response schemas (CONTRACT.md). Units: bytes are integers, seconds floats, bandwidth
GB/s = 1e9 bytes/s per direction. Every block may be ``{"preset": NAME, ...overrides}``."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model, model_validator

from planner.model import ROPE_SCALINGS
from planner.pipeline import SCHEDULE_TRAITS
from planner.plan import PricedCall
from planner.presets import BOUNDS
from planner.step import OVERLAP_DEFAULTS

from .base import DeviceId, MessageBytes, Strict, optional_positive, optional_probability
from .cluster import ClusterIn, LinkOut
from .read import SAME, From, reader

# The pipeline schedules a request may name: the registry's (planner/pipeline.py ``register``), read when this
# module is imported, so that a new schedule is one register call and the OpenAPI lists it in the enum
ScheduleName = Literal[tuple(SCHEDULE_TRAITS)]  # type: ignore[valid-type]
RopeScaling = Literal[tuple(ROPE_SCALINGS)]  # type: ignore[valid-type]

# Bounds keep every product the rules form (b·s·h·bytes, parameters x bytes) inside int64 and every
# request cheap; they are far above any real model.
# planner.presets.BOUNDS holds them, so hf_config is read against the same numbers.
Layers = Field(default=None, ge=BOUNDS["num_layers"][0], le=BOUNDS["num_layers"][1])
Width = Field(default=None, ge=BOUNDS["hidden_size"][0], le=BOUNDS["hidden_size"][1])
Heads = Field(default=None, ge=BOUNDS["num_attention_heads"][0], le=BOUNDS["num_attention_heads"][1])
Vocab = Field(default=None, ge=BOUNDS["vocab_size"][0], le=BOUNDS["vocab_size"][1])
Seq = Field(default=None, ge=BOUNDS["seq_length"][0], le=BOUNDS["seq_length"][1])
Degree = Field(default=None, ge=1, le=1 << 17)


class MoEIn(Strict):
    num_experts: int = Field(ge=1, le=1 << 14)
    top_k: int = Field(ge=1, le=1 << 14)
    expert_ffn_hidden_size: int = Field(ge=1, le=1 << 20)
    num_shared_experts: int = Field(default=0, ge=0, le=64)
    shared_expert_ffn_hidden_size: int | None = Field(default=None, ge=1, le=1 << 20)
    first_dense_layers: int = Field(default=0, ge=0, le=2048)
    layer_freq: int = Field(default=1, ge=1, le=2048)
    # tokens per expert are padded or dropped to capacity_factor x the even share (GShard, Switch Transformer
    # section 2.2); below 1 every expert drops tokens by construction, and the ledger's padded rows then count
    # less work than the model FLOPs the MFU divides by (0.01-0.1 answered an MFU of 1.27-1.43, issue 26)
    capacity_factor: float | None = Field(
        default=None, ge=1, le=64, description="null: dropless routing; else at least 1 (Switch: 1.0-2.0)"
    )
    load_balancing: Literal["aux_loss", "seq_aux_loss", "none"] = "aux_loss"
    expert_bias: bool = False
    node_limit: int | None = Field(default=None, ge=1, le=1 << 14, description="max nodes per token (DeepEP)")
    mlp_only_layers: list[int] = Field(
        default_factory=list,
        max_length=BOUNDS["num_layers"][1],
        description="0-based layers that keep a dense MLP (HF Qwen3MoeConfig.mlp_only_layers)",
    )


class MLAIn(Strict):
    q_lora_rank: int = Field(ge=0, le=1 << 16)
    kv_lora_rank: int = Field(ge=1, le=1 << 16)
    qk_nope_head_dim: int = Field(ge=1, le=4096)
    qk_rope_head_dim: int = Field(ge=0, le=4096)
    v_head_dim: int = Field(ge=1, le=4096)


class ModelIn(Strict):
    # what GET /v1/presets/models answers beside the spec's fields, accepted so that a read preset posts back as it
    # is (app/convert.py DERIVED_COUNTS checks the two counts); no page control edits them
    read_back: ClassVar[frozenset[str]] = frozenset(
        {"name", "source", "notes", "published_params", "params_total", "params_active"}
    )
    preset: str | None = Field(default=None, description="a name from GET /v1/presets/models")
    hf_config: dict[str, Any] | None = Field(
        default=None,
        description="a Hugging Face config.json of a decoder-only family (Llama 2-4, Mistral, Mixtral, Qwen2/2.5/3"
        "(-MoE), DeepSeek-V2/V3, Kimi K2, GLM-4.5, GPT-OSS, Phi-3(.5)(-MoE), Gemma 1-3, GPT-2, DBRX; a multimodal "
        "one's text_config); encoder-decoders, SSM / linear-attention hybrids, parallel attention and vision "
        "encoders are a 422 at the key that says so",
    )
    num_layers: int | None = Layers
    hidden_size: int | None = Width
    num_attention_heads: int | None = Heads
    num_kv_heads: int | None = Heads
    head_dim: int | None = Field(default=None, ge=1, le=1 << 14)
    ffn_hidden_size: int | None = Width
    gated_mlp: bool | None = None
    vocab_size: int | None = Vocab
    tied_embeddings: bool | None = None
    seq_length: int | None = Seq
    norm: Literal["rmsnorm", "layernorm"] | None = None
    linear_bias: bool | None = None
    qkv_bias: bool | None = None
    qk_norm: bool | None = None
    learned_position_embeddings: bool | None = None
    moe: MoEIn | None = None
    mla: MLAIn | None = None
    sliding_window: int | None = Field(
        default=None,
        ge=BOUNDS["sliding_window"][0],
        le=BOUNDS["sliding_window"][1],
        description="keys each query attends in sliding layers (GPT-OSS 128, Mistral 4096); null: full attention",
    )
    full_attention_interval: int | None = Field(
        default=None,
        ge=BOUNDS["full_attention_interval"][0],
        le=BOUNDS["full_attention_interval"][1],
        description="layers k, 2k, ... (1-based) attend fully (GPT-OSS 2); null: every layer slides",
    )
    attention_sinks: bool | None = Field(default=None, description="GPT-OSS: one learned sink logit per head")
    rope_scaling: RopeScaling | None = Field(
        default=None,
        description="Hugging Face rope_scaling.rope_type (GPT-OSS, DeepSeek-V3: yarn); Megatron runs a YaRN RoPE as "
        "torch ops, not its fused kernel",
    )
    glu_clamp: float | None = optional_positive(
        1e6,
        "the gated MLP's clamp limit (GPT-OSS swiglu_limit 7.0); Megatron clamps the experts' halves in their own "
        "kernels",
    )
    mtp_layers: int | None = Field(
        default=None,
        ge=BOUNDS["mtp_layers"][0],
        le=BOUNDS["mtp_layers"][1],
        description="DeepSeek-V3 multi-token-prediction modules on the last stage (HF num_nextn_predict_layers)",
    )
    attention_dropout: float | None = optional_probability(
        "dropout probability on the attention probabilities in training (Megatron --attention-dropout; HF "
        "attention_dropout); 0 draws nothing; null: 0.1 for GPT-style models (biases or learned positions), else 0"
    )
    hidden_dropout: float | None = optional_probability(
        "dropout probability on each block's output and the embedding in training (Megatron --hidden-dropout; HF "
        "hidden_dropout / resid_pdrop); 0 launches nothing; null: as attention_dropout's rule"
    )
    # What GET /v1/presets/models answers beside the fields, so that a preset read there posts back as it is: the
    # descriptive ones are kept (the plan's model says them), the derived counts are checked against the fields
    name: str | None = Field(default=None, max_length=200, description="a label for the model")
    source: str | None = Field(default=None, max_length=4000, description="where the model's figures come from")
    notes: list[Annotated[str, Field(max_length=4000)]] | None = Field(default=None, max_length=64)
    published_params: float | None = Field(
        default=None, ge=0, le=1e16, description="the parameter count its authors publish (read back from a preset)"
    )
    params_total: int | None = Field(
        default=None, ge=0, description="derived, not an input: given, it must equal the count the fields give"
    )
    params_active: int | None = Field(
        default=None, ge=0, description="derived, not an input: given, it must equal the count the fields give"
    )


UserbuffersMethod = Literal["pipeline", "ring_exchange"] | None


def _userbuffers_method(linear: str, cfg: str):
    """WorkloadIn's userbuffers_<gemm>_fprop field (planner WorkloadSpec.userbuffers_proj_fprop)."""
    text = (
        f"the method TransformerEngine's userbuffers run {linear}'s forward GEMM and reduce-scatter with under "
        "options.overlap.tp_comm_overlap (Megatron): pipeline (the default, TE's: 4 column blocks) or ring_exchange "
        f"(tp row chunks), as the run's ub config sets it (Megatron-Bridge TransformerLayerTPOverlapCfg {cfg})"
    )
    return Field(default=None, description=text)


class WorkloadIn(Strict):
    preset: str | None = Field(default=None, description="a name from GET /v1/presets/workloads")
    kind: Literal["training", "inference"] | None = None
    micro_batch_size: int | None = Field(default=None, ge=1, le=1 << 16)
    global_batch_size: int | None = Field(default=None, ge=1, le=1 << 24)
    activation_recompute: Literal["none", "selective", "full"] | None = Field(
        default=None, description="Megatron --recompute-granularity: none, selective (recompute_modules) or full"
    )
    recompute_method: Literal["uniform", "block"] | None = Field(
        default=None, description="Megatron --recompute-method (full): uniform groups or the first layers (block)"
    )
    recompute_num_layers: int | None = Field(
        default=None, ge=1, le=BOUNDS["num_layers"][1], description="Megatron --recompute-num-layers (full)"
    )
    recompute_modules: (
        Annotated[
            list[Literal["core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts"]],
            Field(max_length=7),
        ]
        | None
    ) = Field(default=None, description='Megatron --recompute-modules (selective); default ["core_attn"]')
    cpu_offloading_num_layers: int | None = Field(
        default=None,
        ge=0,
        le=BOUNDS["num_layers"][1],
        description="Megatron --cpu-offloading-num-layers: layers whose activations go to host memory over PCIe "
        "(pp 1, no recompute)",
    )
    selective_ac_option: str | None = Field(
        default=None,
        max_length=8,
        description='torchtitan activation_checkpoint.selective_ac_option (selective, framework torch): "op" '
        '(every second mm re-run) or "N" (every N-th block checkpointed)',
    )
    phase: Literal["prefill", "decode"] | None = None
    batch_size: int | None = Field(default=None, ge=1, le=1 << 20, description="sequences over all replicas")
    context_length: int | None = Seq
    seq_length: int | None = Field(
        default=None, ge=1, le=1 << 22, description="training sequence; wins over the model's"
    )
    attention_mask_in_dataloader: bool | None = Field(
        default=None,
        description="Megatron --create-attention-mask-in-dataloader (default true): mask broadcast over TP",
    )
    attention_kernel: Literal["flash", "flash2", "flash3", "cudnn", "unfused"] | None = Field(
        default=None,
        description="core attention: flash (default: the framework's fused kernel for the GPU), flash2, flash3 "
        "(Hopper only), cudnn, or unfused (Megatron-LM 2021-22: scores in HBM)",
    )
    cuda_graphs: bool | None = Field(default=None, description="CUDA graphs capture the step (default off)")
    grad_accumulation_fusion: bool | None = Field(
        default=None,
        description="Megatron --gradient-accumulation-fusion: weight gradients accumulate inside their GEMM "
        "(default: the framework's; false: a kernel per weight per micro-batch adds it to its buffer, as "
        "Megatron-LM of 2021 ran)",
    )
    cross_entropy_fusion: bool | None = Field(
        default=None,
        description="Megatron --cross-entropy-loss-fusion: the loss as one fused kernel (default: the framework's; "
        "Megatron: off, vocab_parallel_cross_entropy's fp32 torch ops)",
    )
    torch_compile: bool | None = Field(
        default=None, description="torch.compile fuses the elementwise kernels (default off; Megatron/TE fuse anyway)"
    )
    loss_parallel: bool | None = Field(
        default=None,
        description="torch's loss parallelism (framework torch; torchtitan's default with tp > 1, off with "
        "--training.disable_loss_parallel): the logits stay sharded over TP and the loss runs vocab-parallel with "
        "3 fp32 all-reduces (default: the framework's; torch off, the logits all-gathered)",
    )
    optimizer_implementation: Literal["fused", "foreach"] | None = Field(
        default=None,
        description="torch.optim.AdamW's implementation (framework torch; torchtitan optimizer.implementation, "
        "--optimizer.fused before 2025): fused (the default, 28 B a local parameter) or foreach (80 B), each "
        "after torchtitan's gradient clipping (12 B)",
    )
    norm_kernel: Literal["fused", "ops", "apex"] | None = Field(
        default=None,
        description='RMSNorm as one kernel each way ("fused", the default) or, in an eager framework (torch, '
        'deepspeed, without torch.compile), as its op chain ("ops": torchtitan\'s RMSNorm of norm_type "rmsnorm" '
        'up to 2025, 36 B an element in 8 kernels forward, 92 B in 16 backward); "apex": Megatron-LM\'s '
        "MixedFusedLayerNorm before its persistent kernel (the SC'21 code, 6985e58; NVIDIA/apex PR #1037's A100 "
        "times: 1.40x the persistent kernel forward, 2.03x backward in 3 kernels). Default: the framework's "
        "(megatron-lm-2021: the persistent kernel for the hidden sizes of persist_ln_hidden_sizes, else apex)",
    )
    fused_grouped_mlp: bool | None = Field(
        default=None,
        description="TransformerEngine's fused MXFP8 grouped MLP for the routed experts (Megatron "
        "--use-transformer-engine-op-fuser, NVTE_CUTEDSL_FUSED_GROUPED_MLP=1): one grouped kernel per expert GEMM "
        "with SwiGLU and the quantize in its epilogue, counts on the device (default false: per-expert GEMMs)",
    )
    cuda_graph_scope: Annotated[list[Literal["moe_router", "moe_preprocess"]], Field(max_length=2)] | None = Field(
        default=None,
        description="Megatron-Core's TransformerEngine CUDA graphs of part of each MoE layer (--cuda-graph-impl "
        "transformer_engine --cuda-graph-scope): moe_router (pre-MLP norm, router, shared experts) and "
        "moe_preprocess (the dispatcher's preprocess; needs moe_router): one graph replay a layer and micro-batch "
        "each way instead of their launches (default none)",
    )
    scale_swizzle: Literal["quantize", "gemm"] | None = Field(
        default=None,
        description="where TransformerEngine swizzles MXFP8 / NVFP4 block scales for cuBLAS: quantize (the default: "
        "the quantizers write them GEMM-ready, TE 2.18 of the Megatron-Bridge 26.08 stack) or gemm (two swizzle "
        "kernels at every low-precision GEMM call, TE 2.9 of the 25.11 stack); no effect on other recipes",
    )
    userbuffers_proj_fprop: UserbuffersMethod = _userbuffers_method("linear_proj", "proj_fprop")
    userbuffers_fc2_fprop: UserbuffersMethod = _userbuffers_method("linear_fc2", "fc2_fprop")
    param_dtype: Literal["fp32", "bf16", "fp16", "fp8", "nvfp4"] | None = Field(
        default=None,
        description="the weights' dtype; nvfp4 (inference only, with fp8_recipe nvfp4): a block-scaled checkpoint, "
        "0.5625 B per linear weight (E2M1 + one E4M3 scale per 16), embedding and norms in the activation dtype",
    )
    activation_dtype: Literal["fp32", "bf16", "fp16", "fp8"] | None = None
    grad_reduce_dtype: Literal["fp32", "bf16", "fp16"] | None = None
    moe_dispatch_dtype: Literal["fp32", "bf16", "fp16", "fp8"] | None = None
    kv_dtype: Literal["fp32", "bf16", "fp16", "fp8"] | None = Field(
        default=None, description="inference: the KV cache's dtype (vLLM --kv-cache-dtype); null: activation dtype"
    )
    fp8_recipe: Literal["delayed", "tensorwise", "blockwise", "mxfp8", "nvfp4", "rowwise"] | None = Field(
        default=None,
        description="low-precision GEMMs (TransformerEngine recipes; mxfp8 and nvfp4 need Blackwell; rowwise is "
        "torchao's Float8LinearRecipeName.ROWWISE, framework torch, compute capability >= 8.9); null: none",
    )
    fp8_param_gather: bool | None = Field(
        default=None,
        description="Megatron --fp8-param-gather: fp8 primary weights, the parameter all-gather in fp8; framework "
        "torch: FSDP2's float8 all-gather (torchao enable_fsdp_float8_all_gather; zero_stage 2/3, tensorwise)",
    )
    fp8_precompute_scale: bool | None = Field(
        default=None,
        description="torchtitan float8.precompute_float8_dynamic_scale_for_fsdp (framework torch, with "
        "fp8_param_gather): one all-reduce of every float8 weight's amax per step instead of one per weight per "
        "all-gather (default false)",
    )
    fp8_dot_product_attention: bool | None = Field(
        default=None,
        description="Megatron --fp8-dot-product-attention (recipes delayed, tensorwise, mxfp8): TransformerEngine's "
        "attention in fp8; under context parallelism its ring sends K and V in fp8 (delayed, tensorwise) and "
        "exchanges dK, dV by one fp8 all-to-all; the attention runs on cuDNN's FP8 kernel at its FP8 rate with "
        "TE's casts around it (default false)",
    )
    fp8_dpa_backward: bool | None = Field(
        default=None,
        description="TransformerEngine NVTE_FP8_DPA_BWD: with fp8_dot_product_attention, the attention's backward in "
        "fp8 too (default true); false runs the backward in bf16 (training, needs fp8_dot_product_attention)",
    )
    activation_func_fp8_input_store: bool | None = Field(
        default=None,
        description="Megatron --activation-func-fp8-input-store: the SwiGLU input saved for backward in fp8 "
        "(DeepSeek-V3 report §3.3.2); SwiGLU models, Megatron, training",
    )
    document_lengths: (
        Annotated[list[Annotated[int, Field(ge=1, le=1 << 24)]], Field(min_length=1, max_length=65536)] | None
    ) = Field(
        default=None,
        description="packed documents (training): the lengths of the documents each sequence packs, summing to the "
        "sequence; attention runs causal within each document (Megatron THD packing, cu_seqlens), its work and MFU "
        "count sum(L²) as Megatron-LM's num_floating_point_operations does; with cp each a multiple of 2·cp",
    )
    document_packing: Literal["dp_balanced"] | None = Field(
        default=None,
        description="how documents fill the micro-batches (training): null, every sequence packs document_lengths; "
        "'dp_balanced', Megatron's packing scheduler (data_schedule.py DpBalancedScheduler): document_lengths are the "
        "corpus's lengths, each at most the sequence, packed in order into sequences, and the step waits for the "
        "slowest micro-batch in the pipeline and across data-parallel ranks",
    )


class ParallelIn(Strict):
    preset: str | None = Field(default=None, description="a name from GET /v1/presets/parallel")
    tp: int | None = Degree
    pp: int | None = Degree
    dp: int | None = Field(default=None, ge=1, le=1 << 17, description="omitted: devices / (tp·cp·pp)")
    cp: int | None = Degree
    ep: int | None = Degree
    expert_tp: int | None = Degree
    zero_stage: int | None = Field(default=None, ge=0, le=3)
    sequence_parallel: bool | None = None
    virtual_pipeline_stages: int | None = Field(default=None, ge=1, le=256)
    pipeline_schedule: ScheduleName | None = Field(
        default=None,
        description="1f1b (default), interleaved, gpipe; zero-bubble zb-h1 and zbv (Qi et al. 2024); dualpipe and "
        "dualpipev (DeepSeek-V3 §3.2.1)",
    )
    hybrid_shard_size: int | None = Degree
    dp_bucket_bytes: int | None = Field(default=None, ge=1, le=1 << 40)
    order: str | None = Field(default=None, max_length=64, description='default "tp-cp-ep-dp-pp", fastest first')
    framework: str | None = Field(
        default=None,
        max_length=64,
        description="a registered training flavour (planner/flavours/): megatron (default), torch, deepspeed, "
        "megatron-lm-2021 (Megatron-LM of 2021-22: pipeline scatter/gather, unfused bias kernels; not searched); "
        "another name is a 422 on parallel.framework",
    )
    cp_comm: Literal["p2p", "all_gather", "a2a"] | None = None
    cp_rotate_method: Literal["allgather", "alltoall"] | None = Field(
        default=None,
        description="framework torch: context_parallel's set_rotate_method, how ring attention moves K/V (allgather: "
        "one all-gather per attention call, the default; alltoall: cp-1 sends to the next rank); the K/V gradients "
        "always rotate by sends",
    )
    cp_load_balance: bool | None = Field(
        default=None,
        description="framework torch: context_parallel's load balancing (_cp_options.enable_load_balance, default "
        "on: each rank holds chunks r and 2cp-1-r); off, the last rank's causal attention is (2cp-1)/cp of the "
        "balanced work",
    )
    ep_dispatch: (
        Literal[
            "alltoall", "allgather", "deepep", "deepep_ll", "hybridep", "agrs", "dp_gather", "agrs_quant", "replicated"
        ]
        | None
    ) = Field(
        default=None,
        description="Megatron --moe-token-dispatcher-type: alltoall (default here), allgather, deepep (flex "
        "with --moe-enable-deepep) or hybridep (flex with --moe-flex-dispatcher-backend hybridep: DeepEP's legs "
        "over NVLink domains, bf16 only); deepep_ll: DeepEP's low-latency kernels (inference decoding only); agrs, "
        "dp_gather, agrs_quant, replicated: the serving engines' exchanges (inference only, docs/serving.md)",
    )
    zero_config: dict[str, bool | Annotated[float, Field(ge=0, le=float(1 << 50))] | None] | None = Field(
        default=None,
        max_length=32,
        description="DeepSpeed zero_optimization names: in elements reduce_bucket_size, allgather_bucket_size, "
        "stage3_prefetch_bucket_size, stage3_param_persistence_threshold, stage3_max_reuse_distance, "
        "stage3_max_live_parameters, sub_group_size; ZeRO++ zero_hpz_partition_size (ranks), "
        "zero_quantized_weights, zero_quantized_gradients (booleans); overlap_comm (boolean or null), "
        "contiguous_gradients (boolean); DeepSpeed's defaults (docs/frameworks.md)",
    )
    first_stage_layers: int | None = Layers
    last_stage_layers: int | None = Layers
    # pipeline layouts (issue 21): docs/frameworks.md, Pipeline layouts
    pipeline_layout: (
        Annotated[str, Field(min_length=1, max_length=4096)]
        | Annotated[
            list[Annotated[list[Annotated[str, Field(max_length=16)]], Field(max_length=4096)]],
            Field(min_length=1, max_length=4096),
        ]
        | None
    ) = Field(
        default=None,
        description='Megatron --pipeline-model-parallel-layout: "E|(t|)*126,L" (E embedding, t decoder layer, '
        "m MTP layer, L loss; | between the pp*v virtual stages, which go to rank k % pp) or a list of lists",
    )
    account_for_embedding_in_pipeline_split: bool | None = Field(
        default=None, description="Megatron --account-for-embedding-in-pipeline-split: the embedding counts as a layer"
    )
    account_for_loss_in_pipeline_split: bool | None = Field(
        default=None, description="Megatron --account-for-loss-in-pipeline-split: the loss counts as a layer"
    )
    pipeline_split_points: (
        Annotated[list[Annotated[int, Field(ge=1, le=BOUNDS["num_layers"][1])]], Field(min_length=1, max_length=4096)]
        | None
    ) = Field(
        default=None,
        description="torch.distributed.pipelining / torchtitan pipeline_parallel_split_points as layer indices: "
        "the first layer of stages 1, 2, ...",
    )
    ddp: DDPIn | None = Field(
        default=None, description="torch DistributedDataParallel switches (framework torch, zero_stage 0)"
    )


class DDPIn(Strict):
    """torch DistributedDataParallel's switches by PyTorch's names (torch 2.13 defaults); docs/frameworks.md."""

    find_unused_parameters: bool = Field(
        default=False, description="buckets never rebuilt; an int32 all-reduce of the used-parameter map per step"
    )
    static_graph: bool = Field(default=False, description="buckets rebuilt one step later (steady from step 2)")
    gradient_as_bucket_view: bool = Field(default=False, description="accepted; changes no call")
    bucket_cap_mb: float | None = Field(
        default=None, gt=0, le=1 << 20, description="null: 25 MiB with a 1 MiB first bucket (DDP's default)"
    )


# What each of the planner's overlap switches is (planner/step.py OVERLAP_DEFAULTS: the one list of them), and its
# default in parentheses; tests/app/test_overlap_switches.py checks the lists agree.
OVERLAP_SWITCHES = {
    "overlap_grad_reduce": "Megatron --overlap-grad-reduce (off)",
    "overlap_param_gather": "Megatron --overlap-param-gather (off)",
    "fsdp_prefetch": "FSDP2 / DeepSpeed ZeRO-3 prefetch (on)",
    "cp_ring_overlap": "ring-attention KV exchange behind attention (on)",
    "tp_comm_overlap": "Megatron --tp-comm-overlap (off)",
    "overlap_p2p": "pipeline sends overlapped (Megatron: interleaved only)",
    "overlap_moe_expert_parallel_comm": "Megatron --overlap-moe-expert-parallel-comm: EP all-to-all behind another "
    "micro-batch's compute (off)",
    "moe_shared_expert_overlap": "Megatron --moe-shared-expert-overlap: shared experts behind the all-to-all (off)",
}
OverlapIn = create_model(
    "OverlapIn",
    __base__=Strict,
    __doc__="Framework overlap switches for the step time; null = the framework's default (docs/step-time.md).",
    **{name: (bool | None, Field(default=None, description=OVERLAP_SWITCHES[name])) for name in OVERLAP_DEFAULTS},
)


class OptionsIn(Strict):
    algorithm: str = Field(
        default="auto", max_length=64, description="auto, or an algorithm name used wherever it applies"
    )
    candidates: Literal["library", "all"] = Field(
        default="library", description="library: what NCCL/HCCL would pick from"
    )
    contention: Literal["neighbourhood", "full"] = "neighbourhood"
    links_per_call: int = Field(default=5, ge=1, le=64, description="busiest links reported per call")
    device_map: list[DeviceId] | None = Field(
        default=None, max_length=1 << 17, description="rank r runs on device device_map[r]; default: rank = device"
    )
    pricing: Literal["auto", "library", "schedule"] = Field(
        default="auto",
        description="library: NCCL's cost model (default on NVIDIA clusters); schedule: step-by-step pricing of "
        "the named schedule (default elsewhere)",
    )
    nccl_algo: str = Field(default="auto", max_length=32, description="pin like NCCL_ALGO: Ring, Tree, NVLS, ...")
    nccl_proto: str = Field(default="auto", max_length=16, description="pin like NCCL_PROTO: LL, LL128, Simple")
    overlap: OverlapIn = Field(default_factory=OverlapIn)
    timeline: bool = Field(default=True, description="include the step timeline in the response")


class PlanRequest(Strict):
    model: ModelIn
    workload: WorkloadIn = Field(default_factory=WorkloadIn)
    parallel: ParallelIn = Field(default_factory=ParallelIn)
    cluster: ClusterIn
    options: OptionsIn = Field(default_factory=OptionsIn)

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "model": {"preset": "llama3-70b"},
                    "workload": {"kind": "training", "micro_batch_size": 1, "global_batch_size": 1024},
                    "parallel": {"tp": 8, "pp": 4, "dp": 16, "zero_stage": 1, "sequence_parallel": True},
                    "cluster": {"preset": "dgx-h100", "num_nodes": 64},
                }
            ]
        },
    )


# ---- response ----------------------------------------------------------------------------------------
# Read straight from the planner's dataclasses (app/serialize.py, app/schemas/read.py): a field is the
# attribute of its name unless ``From`` says where it lives, so each wire key is written once, here.


class Out(BaseModel):
    model_config = ConfigDict(from_attributes=True)


def _bottleneck(pc: PricedCall) -> str:
    return pc.price.bottleneck.get("kind", "none")


def _bottleneck_link(pc: PricedCall) -> str:
    return pc.links[0]["label"] if pc.links else ""


def _group_dims(pc: PricedCall) -> list[str]:
    group = pc.call.group
    # "pp_twin": the group spans both copies of the stage (DualPipe's ranks s and pp - 1 - s: Group.mirror)
    return [group.pairs] if group.pairs else list(group.dims) + (["pp_twin"] if group.mirror else [])


class PlacementOut(Out):
    span: Annotated[Literal["intra_node", "inter_node"], From("price.span")]
    nodes_per_group: Annotated[int, From("price.nodes_per_group")]
    bottleneck: Annotated[str, From(derive=_bottleneck)] = Field(
        description="kind of the busiest link: nvlink, pcie, nic, leaf_uplink, ..."
    )
    bottleneck_link: Annotated[str, From(derive=_bottleneck_link)]
    busbw_GBps: Annotated[float, From("price.busbw_GBps")]
    algbw_GBps: Annotated[float, From("price.algbw_GBps")]
    steps: Annotated[int, From("price.steps")]
    group_ranks: list[int] = Field(description="the global ranks of the first group, in schedule order")
    group_devices: list[int] = Field(description="the devices those ranks run on")
    links: list[LinkOut] = Field(description="the busiest links while this call runs on every group")
    protocol: Annotated[str, From("price.protocol")] = Field(
        default="", description="library pricing: NCCL protocol (LL, LL128, Simple)"
    )
    nccl_algorithm: Annotated[str, From("price.nccl_algorithm")] = Field(
        default="", description="library pricing: NCCL algorithm (Ring, Tree, NVLS, ...)"
    )
    channels: Annotated[int, From("channels")] = Field(
        default=0,
        description="CTAs (one SM each) the call's kernel holds while it runs: NCCL's channels for its collectives "
        "under library pricing and for every send/recv and all-to-all NCCL runs (its p2p channels), the kernel's "
        "own SMs for DeepEP / HybridEP; 0: none known (schedule pricing, non-NVIDIA fabrics)",
    )


class CallOut(Out):
    # read from a planner.plan.PricedCall (its call, its price, group 0 and the busiest links)
    name: Annotated[str, From("call.name")]
    parallelism: Annotated[Literal["tp", "cp", "pp", "dp", "ep", "edp", "embedding"], From("call.parallelism")]
    op: Annotated[str, From("call.op")]
    phase: Annotated[Literal["forward", "backward", "optimizer"], From("call.phase")]
    stages: Annotated[list[int], From("call.stages")]
    group_size: int
    num_groups: int
    message_bytes: Annotated[int, From("call.message_bytes")] = Field(
        description="nccl-tests convention; sendrecv: what one rank sends"
    )
    calls_per_iteration: Annotated[int, From("call.calls_per_iteration")] = Field(
        description="per rank of each listed stage"
    )
    algorithm: Annotated[str, From("price.algorithm")] = Field(description="the executable schedule (verify proves it)")
    protocol: Annotated[str, From("price.protocol")] = Field(
        default="", description="library pricing: NCCL protocol; empty under schedule pricing"
    )
    nccl_algorithm: Annotated[str, From("price.nccl_algorithm")] = Field(
        default="", description="library pricing: NCCL algorithm"
    )
    bytes_sent_per_rank: Annotated[int, From("price.bytes_sent_per_rank")] = Field(description="one call, busiest rank")
    bytes_received_per_rank: Annotated[int, From("price.bytes_received_per_rank")]
    time_s: Annotated[float, From("price.time_s")] = Field(description="one call")
    dtype: Annotated[str, From("call.dtype")]
    group_dims: Annotated[list[str], From(derive=_group_dims)]
    expert_grid: Annotated[bool, From("call.group.expert")]
    source: Annotated[str, From("call.source")]
    placement: Annotated[PlacementOut, From(SAME)]

    @model_validator(mode="before")
    @classmethod
    def _priced_call(cls, data):
        return reader(cls)(data) if isinstance(data, PricedCall) else data


class Amounts(Out):
    message_bytes: int
    bytes_sent: int
    time_s: float


class StageTotals(Amounts):
    stage: int


class TotalsOut(Out):
    time_s: float = Field(description="the busiest stage's communication time, calls serialised")
    busiest_stage: int
    per_stage: list[StageTotals]
    by_parallelism: dict[str, Amounts] = Field(description="each parallelism's share on the busiest stage")


class TimelineEvent(Out):
    stage: int
    stream: str = Field(
        description="compute, recompute (the part of a backward that re-runs the forward, inside its block), "
        "tp, cp, ep, dp, pcie"
    )
    name: str = Field(description="forward, backward, 1f1b (aggregated steady state), optimizer, grad_reduce, ...")
    microbatch: int = Field(description="the (first) micro-batch of the block; -1 for per-iteration work")
    microbatches: int = Field(description="micro-batches the block holds (1 unless aggregated; 0: per iteration)")
    start_s: float
    end_s: float
    overlapped: bool = Field(
        default=False, description="communication of a pass hidden behind its compute (false: exposed, on the path)"
    )
    direction: int | None = Field(
        default=None,
        description="DualPipe: the direction the block's micro-batch runs (0 from rank 0, 1 from rank pp - 1)",
    )


class StepSummaryOut(Out):
    time_s: float = Field(description="one iteration (training step, prefill pass or decode step), critical path")
    compute_s: float = Field(description="compute on the critical stage")
    exposed_comm_s: float = Field(description="communication not hidden behind compute on the critical stage")
    bubble_s: float = Field(description="pipeline idle time on the critical stage")
    mfu: float = Field(description="model FLOPs (6N + 12·L·H·Q·T per token, PaLM / Llama 3) / (time x peak)")
    tokens_per_s: float
    critical_stage: int
    spread_s: float = Field(
        default=0.0,
        description="the part of compute_s the slowest GPU adds over the median part (cluster.gpu.variability; "
        "planner/spread.py): sigma x E[max of N normals] of the GPU-bound time, N the plan's GPUs",
    )


class StepOut(StepSummaryOut):
    timeline: list[TimelineEvent] = Field(description="aggregated beyond 256 compute blocks (docs/step-time.md)")


class StageMemoryOut(Out):
    stage: int
    param_count: int = Field(description="parameters one rank of the stage holds before ZeRO sharding")
    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    activations_bytes: int
    buffers_bytes: int
    peak_bytes: int


class MemoryOut(Out):
    capacity_bytes: int
    fits: bool
    per_stage: list[StageMemoryOut]


class AssumptionOut(Out):
    field: str = Field(description="the request field, dotted (options.overlap.tp_comm_overlap)")
    value: str = Field(description="as resolved for this plan, given or not")
    source: str = Field(description="who decides the value when the request leaves it out")


class PlanOut(Out):
    world_size: int
    num_microbatches: int
    params_total: int
    cluster: ClusterIn
    calls: list[CallOut]
    totals: TotalsOut
    step: StepOut | None = Field(default=None, description="null when the cluster has no GPU spec")
    memory: MemoryOut | None = None
    warnings: list[str]
    assumptions: list[AssumptionOut] = Field(
        default_factory=list, description="every setting the plan was made under, with its source (docs/page.md)"
    )


# ?summary=true (schedulers): the plan without `calls`, `assumptions` and the step's timeline: the same keys, in
# the same order, as PlanOut otherwise (tests/app/test_summary.py checks it field by field)
SUMMARY_LEAVES_OUT = ("calls", "assumptions")
PlanSummaryOut = create_model(
    "PlanSummaryOut",
    __base__=Out,
    **{
        name: (StepSummaryOut | None, field) if name == "step" else (field.annotation, field)
        for name, field in PlanOut.model_fields.items()
        if name not in SUMMARY_LEAVES_OUT
    },
)


class BatchRequest(Strict):
    free_text = frozenset({"requests"})  # each is validated as a PlanRequest, with the rule on its strings
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "requests": [
                        {"model": {"preset": "llama3-8b"}, "parallel": {"tp": 8}, "cluster": {"preset": "dgx-h100"}},
                        {"model": {"preset": "llama3-8b"}, "parallel": {"tp": 16}, "cluster": {"preset": "dgx-h100"}},
                    ]
                }
            ]
        }
    )
    # Any, not dict: a null, array, string or number among them is that item's error, not the batch's
    # (README: one bad request never fails the others); the OpenAPI says so rather than promise objects only
    requests: list[Any] = Field(
        description="plan requests, each an object as for POST /v1/plan; an item that is not an object is answered "
        "in its place by an error item (422, naming requests[i])",
        max_length=100_000,
    )


class ErrorOut(Out):
    status: int
    detail: list[dict[str, Any]]


class BatchItem(Out):
    ok: bool
    plan: PlanOut | None = None

    error: ErrorOut | None = None


BatchSummaryItem = create_model("BatchSummaryItem", __base__=BatchItem, plan=(PlanSummaryOut | None, None))


class BatchOut(Out):
    results: list[BatchItem | BatchSummaryItem] = Field(description="with ?summary=true: BatchSummaryItem")


class ExploreRequest(Strict):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "request": {
                        "model": {"preset": "llama3-70b"},
                        "parallel": {"tp": 8, "pp": 4, "zero_stage": 1},
                        "cluster": {"preset": "dgx-h100", "num_nodes": 16},
                    },
                    "call": "dp.grads",
                }
            ]
        },
    )
    request: PlanRequest
    call: str = Field(max_length=128, description="a call name from the plan, e.g. dp.grads")
    stage: int | None = Field(default=None, ge=0, le=1 << 17, description="which stage's row (default: the first)")
    sizes: list[MessageBytes] | None = Field(
        default=None, min_length=1, max_length=24, description="message bytes to price"
    )


class SeriesOut(Out):
    algorithm: str
    time_s: list[float | None]
    busbw_GBps: list[float | None]
    note: str
    pricer: Literal["library", "schedule"] = Field(
        default="schedule",
        description="library: NCCL's cost model (auto picks among these under library pricing); schedule: the "
        "textbook schedule priced step by step on the graph",
    )


class ExploreOut(Out):
    call: str
    op: str
    stages: list[int]
    group_size: int
    groups_priced: int = Field(description="the groups the price is computed on, all at once (contention)")
    num_groups: int = Field(description="the call's groups; those not priced are alike by the cluster's symmetry")
    message_bytes: int
    sizes: list[int]
    series: list[SeriesOut]
    auto: list[str] = Field(description="the algorithm auto picks at each size")
