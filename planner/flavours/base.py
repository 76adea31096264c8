"""What a framework flavour is: a frozen traits object holding every choice the traffic rules, the parameter
lists, the step time and the validity checks read. The rules read traits, never a flavour's name; adding a
flavour is one module that builds a ``Flavour`` and registers it (planner/flavours/__init__.py).

``kind`` leaves room for serving engines (vLLM, SGLang, TensorRT-LLM): a serving flavour is a ``Flavour`` of
kind "serving" with the inference traits it needs; the training search enumerates kind "training" only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

ZERO_PAPER = "Rajbhandari et al. 2020 (ZeRO) §5"


class Zero(Enum):
    """How a flavour shards and reduces data-parallel state (rules/data.py, rules/deepspeed.py)."""

    # ZeRO-1 = Megatron's distributed optimizer (reduce-scatter + all-gather per iteration), ZeRO-2 the paper's
    # per-micro-batch reduce-scatter, ZeRO-3 per-unit gathers (Megatron-FSDP / DeepSpeed semantics)
    PAPER = "paper"
    # PyTorch FSDP2: ZeRO-2 and ZeRO-3 are fully_shard per block (reshard_after_forward False / True)
    FSDP2 = "fsdp2"
    # DeepSpeed's own ZeRO: all-reduced IPG buckets at stage 1/2, the parameter coordinator at stage 3
    DEEPSPEED = "deepspeed"


@dataclass(frozen=True)
class Flavour:
    name: str
    kind: str = "training"  # "training" | "serving"
    # the training search enumerates it (planner/parallel.py FRAMEWORKS); False: a framework a request names, as a
    # run of its time ran it (megatron-lm-2021), never a layout the search proposes
    searched: bool = True
    version: str = ""  # the framework version the traits were read from
    display: str = ""  # the name in messages ("Megatron", "PyTorch", "DeepSpeed")
    # ---- parameters (planner/params.py) ------------------------------------------------------------------
    # separate q, k, v and gate, up modules, unpadded vocabulary (a Hugging Face model); False: Megatron's fused
    # QKV and fc1, vocabulary padded to a multiple of 128 x tp
    hf_modules: bool = False
    # tp past num_kv_heads replicates each KV head on tp / num_kv_heads ranks (the serving engines:
    # serving/engines.py EngineTraits.kv_head_replication); False: tp must divide num_kv_heads. Every training
    # framework here splits KV heads only: Megatron-Core transformer/attention.py (d98e8a64ddf3)
    # num_query_groups_per_partition = divide(num_query_groups, world_size), which asserts; torchtitan
    # models/common/attention.py (b5bcd76c66d0) shards wk/wv colwise and views the local K, V as (-1, head_dim), so a
    # rank needs whole heads; DeepSpeed trains its TP through Megatron or AutoTP (module_inject/tp_shard.py
    # get_shard_size at edaa72212672 splits the heads over ranks, never copies one). parallel.kv_heads_rule
    kv_head_replication: bool = False
    # ---- tensor parallelism (rules/tensor.py) ------------------------------------------------------------
    # backward all-reduces one input gradient per column-parallel linear as the module has it: fused (Megatron:
    # 1 for QKV, 1 for fc1) or one per separate linear (DTensor: q, k, v; gate, up)
    fused_column_dgrad: bool = True
    # sequence parallelism re-gathers the column-parallel input for the weight gradient (Megatron
    # LinearWithGradAccumulationAndAsyncCommunication.backward); DTensor keeps it
    sp_wgrad_regather: bool = True
    # the LM head keeps the logits sharded and runs the vocab-parallel cross-entropy (3 fp32 all-reduces);
    # False: the logits are all-gathered and the loss is local
    vocab_parallel_loss: bool = True
    # with learned position embeddings and SP the embedding all-reduces, then scatters locally (Megatron)
    # the workload may switch the vocab-parallel loss (workload.loss_parallel: torchtitan's
    # training.disable_loss_parallel); False: the flavour's vocab_parallel_loss is the only way it runs
    loss_parallel_switch: bool = False
    # where the vocab-parallel loss's 3 fp32 all-reduces come from ("" = Megatron's cross_entropy.py)
    loss_parallel_source: str = ""
    embedding_allreduce_with_positions: bool = True
    # the embedding's output transposed [b, s, h] -> [s, b, h] and, under SP, its scattered output cloned
    # (Megatron LanguageModelEmbedding; clone_scatter_output_in_embedding); False: torch models keep [b, s, h]
    # (planner/kernels.py _embedding_lookup)
    embedding_transposes: bool = True
    # rank 0 of each TP group loads the batch and broadcasts it (Megatron get_batch_on_this_tp_rank)
    tp_broadcasts_batch: bool = True
    # Megatron-LM before Megatron-Core: every stage broadcasts the packed "text" tokens (and their sizes) once per model
    # chunk and micro-batch, the masks built locally (rules/tensor.py _packed_batch); False: Megatron-Core's
    # get_batch_on_this_tp_rank, each tensor to the stages that read it
    tp_batch_packed: bool = False
    # SP leaves TP-replicated weights' gradients partial: "finalize" = one all-reduce per stage and iteration
    # (Megatron finalize_model_grads), "on_read" = DTensor reduces each when AdamW reads it (FSDP2: per
    # micro-batch in its post-backward)
    norm_grad_reduction: str = "finalize"
    tp_source: str = ""
    sp_source: str = ""
    embedding_source: str = ""
    # ---- pipeline (rules/pipeline.py) --------------------------------------------------------------------
    pp_source: str = ""
    # tied input/output embeddings on different stages: their gradients all-reduced between the ends
    tied_embedding_allreduce: bool = True
    # its p2p exchanges each tensor's 3-int64 shape first when the layout's MTP is not on the last rank
    # (Megatron p2p_communication.py _communicate: config.mtp_standalone -> _communicate_shapes)
    mtp_standalone_shapes: bool = False
    # without sequence parallelism each TP rank sends 1/t of the boundary tensor and the receiver all-gathers it over
    # TP (Megatron-LM's --scatter-gather-tensors-in-pipeline, on by default until Megatron-Core dropped it;
    # Narayanan et al. 2021 §4.1): rules/pipeline.py GATHER_CALLS
    pp_scatter_gather: bool = False
    # the sender keeps only its 1/t partition of each output it sent under scatter/gather and all-gathers it over TP
    # again before that micro-batch's backward (DeepSpeed's PipelineEngine: rules/pipeline.py ``pp.gather_output``)
    pp_regathers_output: bool = False
    # each boundary transfer is a blocking instruction of its own, never batched with the opposite one (DeepSpeed's
    # TrainSchedule: RecvActivation, SendGrad, SendActivation, RecvGrad): four one-way transfers on a steady-state
    # micro-batch's path where 1F1B batches them into two exchanges (step.py unbatched_wait; pipeline.steady_wait)
    pp_unbatched_transfers: bool = False
    # ---- data parallelism (rules/data.py) ----------------------------------------------------------------
    zero: Zero = Zero.PAPER
    dp_sources: dict[int, str] = field(default_factory=dict)  # by ZeRO stage
    # default gradient-bucket cap in bytes (DDP bucket_cap_mb); None: one bucket per buffer
    bucket_cap_bytes: int | None = None
    # ZeRO-1+ buckets padded to a multiple of lcm(dp, 128) elements (Megatron param_and_grad_buffer.py)
    bucket_pad_lcm_128: bool = False
    # the optimizer step's 1-element reductions (grad norm, found-inf) of Megatron's optimizer
    optimizer_step_reductions: bool = False
    # the loss and token count all-reduced over dp x cp each micro-batch for reporting (Megatron loss_func)
    reports_loss: bool = False
    # the gradient reduction dtype when the workload does not say; None: the parameter dtype
    grad_reduce_dtype: str | None = None
    # DistributedDataParallel's Reducer at ZeRO-0: its switches (ParallelSpec.ddp) are accepted, its initial and
    # rebuilt bucket layouts and first bucket apply (rules/data.py)
    ddp_switches: bool = False
    # DeepSpeed's ZeRO++ (hpZ, qwZ, qgZ in ParallelSpec.zero_config) at ZeRO-3 (rules/deepspeed.py)
    zero_plus_plus: bool = False
    # ---- MoE (rules/expert.py, parallel.py) --------------------------------------------------------------
    expert_tp_default_is_tp: bool = False
    moe_tp_ep_needs_sp: bool = False  # tp > 1 and ep > 1 require sequence parallelism (Megatron)
    router_reductions: bool = False  # the router's token-count / expert-bias all-reduces (Megatron)
    token_counts_alltoall: bool = False  # per-expert counts by all_to_all over EP (torchtitan); else all-gather
    # torchtitan's selective activation checkpointing (workload.selective_ac_option) applies (parallel.py)
    torchtitan_selective_ac: bool = False
    # ---- kernels (planner/kernels.py) ----
    # memory-bound kernels fused as TransformerEngine / Megatron-Core fuse them (True), or PyTorch eager's chains
    fused_kernels: bool = True
    # Megatron-LM's own linears (before TransformerEngine): the QKV bias is an add of its own after the GEMM and
    # each linear's bias gradient a reduction over the tokens (kernels.LOCAL_BIAS_BYTES); TE adds the bias in the
    # GEMM's epilogue and computes its gradient in the dgrad GEMM's
    local_linear_biases: bool = False
    # what "flash" attention means per GPU generation (compute capability // 10 x 10); missing: FlashAttention-2
    flash_attention_by_sm: tuple[tuple[int, str], ...] = ()
    # the core-attention kernels that run a learned softmax offset (attention sinks, ModelSpec.attention_sinks) at
    # the framework's pin, first the one "flash" resolves to when flash_attention_by_sm's kernel has none; a model
    # with sinks asking for another kernel is a SpecError (kernels.check_kernel_options). () : not read, no rule
    sink_attention_kernels: tuple[str, ...] = ()
    # weight gradients accumulate inside their GEMM (Megatron --gradient-accumulation-fusion, on by default since
    # Megatron-LM 2022 / Megatron-Core: the wgrad GEMM adds into main_grad); False: a separate add per weight per
    # micro-batch (workload.grad_accumulation_fusion overrides)
    grad_accumulation_fusion: bool = True
    # how the routed experts' GEMMs launch: 0, one grouped kernel over the local experts (torch._grouped_mm,
    # serving engines' fused MoE); n > 0, one cuBLAS GEMM per local expert spread over n CUDA streams, which needs
    # each expert's rows on the host (planner/kernels.py routed_expert_kernels; the sync that brings them is the
    # dispatcher's: dispatch_count_sync)
    expert_gemm_streams: int = 0
    # the training dispatcher moves the experts' token counts to the host every dropless MoE forward and the host
    # waits for them, however the experts then run (Megatron's alltoall dispatcher: cuda_sync_point
    # "before_ep_alltoall" over ep x etp > 1, "before_finish" on one rank; its allgather dispatcher's .cpu():
    # megatron.py); planner/kernels.py COUNT_SYNC, host_sync
    dispatch_count_sync: bool = False
    # ... only over ep > 1 (torchtitan: its AllToAllTokenDispatcher's blocking copy of the output splits,
    # token_dispatcher.py _sync_token_count_exchange; at ep 1 the LocalTokenDispatcher keeps the counts on the
    # device); False: also on one rank (Megatron's "before_finish")
    count_sync_needs_ep: bool = False
    # ... after the dispatcher's local token reorder (the permute), with a blocking copy that waits for the whole
    # stream (torchtitan: AllToAllTokenDispatcher.dispatch runs _local_reorder, the count all-to-all, then
    # _sync_token_count_exchange's .to("cpu", non_blocking=False)); False: before it (Megatron's)
    count_sync_after_permute: bool = False
    # the host's seconds per launch of the framework's own layer code in a synced MoE layer (planner/host.py's
    # queue), on the x86 reference host (planner/kernels.py HOST_CPUS); 0: Efficiency.host_launch_s (Megatron-Core's
    # measured layer). A calibrated cluster.calibration.kernels.host_launch_s replaces either (kernels.queue_launch_s)
    host_launch_s: float = 0.0
    # the MoE combine's score multiply as its own eager kernels, bytes and launches per element of the routed rows
    # (R x h): (forward bytes, forward kernels, backward bytes, backward kernels); () when the scores are applied
    # inside the unpermute (Megatron's probs; torch.compile fuses it, planner/kernels.py). torchtitan's: torch.py
    moe_score_combine: tuple[float, int, float, int] = ()
    # the routed experts' rows padded to the fp8 GEMMs' alignment around the expert MLP under an fp8 recipe, with
    # dropless routing (Megatron TEGroupedMLP's Fp8Padding / Fp8Unpadding: planner/kernels.py FP8_EXPERT_PADDING)
    fp8_expert_padding: bool = False
    # the alltoall dispatcher's preprocess on the GPU before its count sync, launches per MoE layer forward:
    # (dropless over more than one expert-TP x EP rank, dropless on one, drop-and-pad); () none listed
    # (planner/kernels.py dispatch_preprocess; Megatron's: megatron.py)
    dispatch_preprocess_launches: tuple[int, int, int] = ()
    # of those, the device-to-host copies of the counts (the same three cases): a TE graph of the preprocess leaves
    # them outside, at the all-to-all (planner/kernels.py te_graphed; Megatron's: megatron.py)
    dispatch_count_copies: tuple[int, int, int] = ()
    # the alltoall dispatcher sends each routed row's probability in an all-to-all of its own beside the rows, and
    # its gradient back in the backward (rules/expert.py _probs; Megatron's: megatron.py); False: the rows only
    dispatch_probs_alltoall: bool = False
    # the loss as one fused kernel (Megatron --cross-entropy-loss-fusion, store_true: off by default since it came,
    # 7b4a6d76c9 of 2024-06-14) or Megatron's vocab_parallel_cross_entropy as its torch ops; flavours that run eager
    # (fused_kernels False) take the eager loss whatever this says (planner/compute.py head_kernels)
    fused_cross_entropy: bool = False
    # ops a fusing framework still runs as separate torch ops (planner/kernels.py; gptoss): RoPE scalings
    # (ModelSpec.rope_scaling) whose rotary is not the fused RoPE kernel (Megatron: apply_rope_fusion only for
    # position_embedding_type 'rope', and YaRN is its own type)
    unfused_rope_scalings: frozenset[str] = frozenset()
    # the GLU clamp (ModelSpec.glu_clamp) of the experts as its own ops before the fused activation (Megatron:
    # two clamps and a cat, fused_bias_geglu.weighted_bias_quick_geglu_impl); False: inside the activation kernel
    eager_glu_clamp: bool = False
    # the routed experts' gated activation takes the router probs and its backward sums their gradient in a kernel of
    # its own (Megatron's weighted_bias_swiglu / quick-GeGLU: kernels.WEIGHTED_ACT_GRAD)
    weighted_act_grad: bool = False
    # a biased MoE's (ModelSpec.linear_bias) expert fc2 bias added per local expert after the grouped GEMM, scaled by
    # the router probs (Megatron TEGroupedMLP._apply_bias: split, t + b * p per expert, cat), and, as TEGroupedMLP
    # forbids bias_dropout_fusion with biases, every layer's bias-dropout-add unfused; False: in the GEMM epilogue
    expert_bias_loop: bool = False
    # ---- FP8 (rules/fp8.py, recipes.py) ----------------------------------------------------------------
    # TransformerEngine's FP8/FP4 recipes: amax reductions, --fp8-param-gather (Megatron + TE)
    te_fp8_recipes: bool = False
    # the --cuda-graph-scope values of Megatron-Core's TransformerEngine graphs of part of an MoE layer that this
    # framework runs (workload.cuda_graph_scope, kernels.TE_GRAPH_KERNELS); (): none (parallel.check_graph_scope)
    te_graph_scopes: tuple[str, ...] = ()
    # torchao.float8 (Float8Linear): its torchao-only recipes (rowwise, recipes.Recipe.library) and FSDP2's float8
    # all-gather (workload.fp8_param_gather as enable_fsdp_float8_all_gather, rules/data.py)
    torchao_float8: bool = False
    # TransformerEngine quantizes a column-parallel linear's input before its sequence-parallel all-gather under every
    # recipe (Context.gather_recipe; a torchao flavour instead gathers fp8 under float8 TP, recipes.check_float8_tp);
    # and a row-parallel linear's grad output before its backward all-gather too. False: bf16 gathers
    quantized_tp_gathers: bool = False
    quantized_grad_output_gather: bool = False
    # ---- context parallelism (rules/context_parallel.py) ---------------------------------------------------
    # torch.distributed.tensor.experimental context_parallel's ring attention: the rotate methods it offers
    # (parallel.cp_rotate_method), the default first; () : TransformerEngine's cp_comm_type (parallel.cp_comm)
    cp_rotate_methods: tuple[str, ...] = ()
    # the optimizer step is torch.optim's AdamW (fused or foreach: workload.optimizer_implementation) after
    # torchtitan's gradient clipping (planner/kernels.py optimizer_bytes); False: a fused Adam (apex / TE)
    torch_optimizer: bool = False
    # Megatron-LM's Float16OptimizerWithFloat16Params before the distributed optimizer (2021-22): the fp32 copy of the
    # gradients, the unscale under fp16, the norm and the copy back into the 16-bit parameters as passes of their own
    # beside apex's FusedAdam (planner/kernels.py MEGATRON_LM_OPTIMIZER); False: one fused Adam (ADAM_BYTES)
    float16_optimizer_passes: bool = False
    # Megatron-Core's optimizer step (MixedPrecisionOptimizer / DistributedOptimizer) as the passes it runs: the
    # gradient norm for clipping, Adam, the fp32 master's copy back into the 16-bit parameter (kernels.py
    # MEGATRON_CORE_OPTIMIZER), and the zeroing of the whole local gradient buffer every iteration, not only the
    # optimizer's shard (kernels.grad_buffer_bytes); False: one fused Adam over the shard (ADAM_BYTES)
    core_optimizer_passes: bool = False
    # ---- step time (planner/step.py) ---------------------------------------------------------------------
    # ZeRO stages at which gradient reduction and parameter gathers overlap compute by default
    overlap_zero_stages: frozenset[int] = frozenset()
    # per-unit ZeRO-2/3 traffic hides behind compute by implicit prefetch (FSDP2); else overlap_grad_reduce rules
    prefetches_units: bool = False
    # FSDP2's per-unit copies run on the compute stream (planner/step.py fsdp_unit_copies): each all-gather's
    # copy-out into the unsharded parameters and each reduce-scatter's copy-in of the unsharded gradients
    fsdp_unit_copies: bool = False
    # the sequence-parallel TP collectives gather and scatter on the sequence dim (DTensor Shard(1) of [b, s, h])
    # through functional collectives that move along dim 0 only, so a copy on the compute stream reorders each
    # (planner/step.py _sp_layout_copies, kernels.sp_layout_copy_kernels)
    sp_layout_copies: bool = False
    # under torch.compile a fully re-run layer re-runs only what its backward needs: a dense layer's output
    # linear (fc2) and what follows it (its TP reduce-scatter or all-reduce, the residual add) are not re-run
    # (kernels.full_rerun); False: the whole forward again (Megatron's CheckpointFunction)
    recompute_stops_at_last_save: bool = False
    # tp_comm_overlap is a compiler pass that fuses a reduce-scatter only when its input is one matmul's output
    # (torch async TP, torch/_inductor/fx_passes/micro_pipeline_tp.py fuse_matmul_reduce_scatter): the
    # column-parallel input gradient summed over separate linears (q, k, v; gate, up) stays exposed (step.py)
    async_tp_single_matmul: bool = False
    # tp_comm_overlap is a compiler pass, so the framework refuses it without torch.compile: the refusal's source
    # ("" : no such rule; step.Overlap.resolved raises it on options.overlap.tp_comm_overlap)
    async_tp_needs_compile: str = ""
    # tp_comm_overlap is TransformerEngine's userbuffers (Megatron --tp-comm-overlap): only the TE linears named
    # qkv, proj, fc1, fc2 overlap their TP collectives; the others fall back to NCCL (rules/tensor.py
    # userbuffers_rows, check_userbuffers)
    userbuffers: bool = False
    # the framework has no TP communication overlap at all: options.overlap.tp_comm_overlap true is a 422 with this
    # source ("": it has one, userbuffers or a compiler pass; step._check_tp_overlap)
    no_tp_comm_overlap: str = ""
    # SMs the framework's own TP overlap holds per collective while it hides behind the GEMMs (planner/contention.py),
    # ((op, SMs), ...); (): the NCCL calls' channels (the pricer's)
    tp_overlap_sms: tuple[tuple[str, int], ...] = ()
    # the pipeline schedules the framework runs; None: every registered one (planner/parallel.py _choices refuses
    # the others by name)
    pipeline_schedules: frozenset[str] | None = None
    # the highest ZeRO stage the framework runs beside pipeline parallelism (pp > 1); None: any
    pp_max_zero_stage: int | None = None
    # pipeline schedules whose sends overlap compute by default (Megatron --overlap-p2p-communication)
    overlap_p2p_schedules: frozenset[str] = frozenset()
    # pipeline schedules whose steady state, when its sends do not overlap, exchanges both ways at once once per
    # chunk forward + backward (Megatron's interleaved: send_forward_backward_recv_forward_backward; step.py
    # two_way_s); the others run two one-way exchanges a micro-batch
    two_way_exchange_schedules: frozenset[str] = frozenset()
    # the hidden sizes whose norms run apex's persistent LayerNorm in Megatron-LM's MixedFusedLayerNorm (the others run
    # its older kernels: planner/kernels.py APEX_LAYER_NORM, apex_norm); None: the flavour's norms are its own fused
    # kernel (TransformerEngine, torch) unless workload.norm_kernel says otherwise
    persist_layer_norm_sizes: frozenset[int] | None = None
    # elements per gradient bucket once overlap is on: (ParallelSpec, gradient element bytes) -> elements
    overlap_bucket_elements: Callable = field(default=lambda par, grad_bytes: 1 << 62, compare=False)

    def overlaps(self, par) -> bool:
        """The default of overlap_grad_reduce / overlap_param_gather for this layout: a flavour that reads
        DeepSpeed's overlap_comm takes it when given."""
        if self.zero is Zero.DEEPSPEED and par.zero_config.overlap_comm is not None:
            return par.zero_config.overlap_comm
        return par.zero_stage in self.overlap_zero_stages

    def expert_tp(self, par) -> int:
        """Expert TP when the layout does not give it."""
        return par.tp if self.expert_tp_default_is_tp else 1
