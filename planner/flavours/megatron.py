"""Megatron-Core (Megatron-LM d98e8a6 / core_r0.13): the project's default flavour. Each trait names where
Megatron decides it."""

from __future__ import annotations

from .base import ZERO_PAPER, Flavour, Zero

M = "Megatron-LM d98e8a6 "


def _overlap_bucket_elements(par, grad_bytes: int) -> int:
    # megatron/core/distributed/distributed_data_parallel.py: with overlap_grad_reduce the buckets hold
    # max(40M, 1M x dp) elements (dp here is the gradient-reduction group, dp x cp)
    return max(40_000_000, 1_000_000 * par.dp * par.cp)


FLAVOUR = Flavour(
    name="megatron",
    display="Megatron",
    # TransformerEngine prefers cuDNN fused attention on sm90+ and FlashAttention-2 on sm80
    # (transformer_engine/pytorch/attention get_attention_backend)
    flash_attention_by_sm=((80, "flash2"), (90, "cudnn"), (100, "cudnn")),
    # learned attention sinks (TEDotProductAttention passes config.softmax_type, extensions/transformer_engine.py at
    # 92c8482e6d l. 1000-1005; GPT-OSS's provider sets "learnable", Megatron-Bridge 5776a6d90b gpt_oss_provider.py):
    # TE v2.9 get_attention_backend (dot_product_attention/utils.py l. 686-727, "Filter: Softmax type") disables
    # FlashAttention for any softmax_type but "vanilla" and keeps FusedAttention and UnfusedDotProductAttention;
    # FusedAttention's F16_arbitrary_seqlen backend takes the learnable softmax from cuDNN 9.13.1 on sm80 and later
    # (common/fused_attn/fused_attn.cpp at v2.9, nvte_get_fused_attn_backend: "9.13.1+: vanilla, off-by-one,
    # learnable"), and the NeMo 25.11 container has TE 2.9 with cuDNN 9.13.1.26 (Megatron-Bridge 5776a6d90b
    # docs/releases/software-versions.md). So "flash" on sm80 is cuDNN for a model with sinks, and flash2 / flash3
    # never run one
    sink_attention_kernels=("cudnn", "unfused"),
    version=M.strip(),
    # --moe-grouped-gemm: TE GroupedLinear -> general_grouped_gemm -> nvte_multi_stream_cublas_gemm, one cuBLAS
    # GEMM per local expert on compute stream i % 4 (TransformerEngine transformer_engine/common/gemm/
    # cublaslt_gemm.cu multi_stream_cublas_gemm; num_compute_streams = 4, common/util/multi_stream.h), its m_splits
    # a host list of each expert's rows (token_dispatcher.py tokens_per_expert .to("cpu") + sync)
    expert_gemm_streams=4,
    # the dispatcher's count sync, whatever runs the experts (TEGroupedMLP's host m_splits or the fused grouped MLP):
    # token_dispatcher.py at 92c8482e6d (and d98e8a6) MoEAlltoAllTokenDispatcher.preprocess sets cuda_sync_point
    # "before_ep_alltoall" for dropless routing over ep x etp > 1 (the all-to-all's split sizes must be host lists)
    # and "before_finish" on one rank; drop-and-pad returns before any; MoEAllGatherTokenDispatcher's
    # dispatch_postprocess calls tokens_per_expert .cpu()
    dispatch_count_sync=True,
    # the optimizer step's own passes and the per-iteration zeroing of the local gradient buffer (training.py
    # train_step: model_chunk.zero_grad_buffer(); planner/kernels.py MEGATRON_CORE_OPTIMIZER)
    core_optimizer_passes=True,
    # --tp-comm-overlap runs TransformerEngine's userbuffers with initialize_ub's defaults (TE v2.9 pytorch/module/
    # base.py get_default_config: num_sm = 1 if method == "ring_exchange" else 16, use_ce = True): the all-gathers of
    # the ring exchange (qkv_fprop, fc1_fprop, proj_dgrad, fc2_dgrad; CommOverlapP2P) move by copy engine (no SM);
    # the bulk all-gathers (qkv_dgrad, fc1_dgrad: the SP input re-gathered for wgrad, step.BULK_GATHER_SUFFIX) and
    # the pipelined and bulk reduce-scatters run CommOverlap's SM kernels on 16 SMs
    tp_overlap_sms=(("allgather", 0), ("allgather.bulk", 16), ("reducescatter", 16)),
    # TEGroupedMLP pads each expert's rows for its fp8 GEMMs (core_v0.15.0 moe/experts.py Fp8Padding, Fp8Unpadding)
    fp8_expert_padding=True,
    # MoEAlltoAllTokenDispatcher.preprocess and _maybe_dtoh_and_synchronize (Megatron-LM 92c8482e6d, the submodule of
    # Megatron-Bridge 5776a6d90b, token_dispatcher.py): dropless over ep x etp > 1 ranks, routing_map.sum(dim=0),
    # .long(), input_splits' reshape().sum(axis=1), the gathered counts' [:, :, local].contiguous(), .sum(axis=2),
    # output_splits_tp's .sum(axis=1), .sum(dim=(0, 1)): 7 kernels (the all-gather itself is the ledger's
    # ep.token_counts), then 4 device-to-host copies (tokens_per_expert, input_splits, output_splits,
    # output_splits_tp; a fifth, num_global_tokens_per_local_expert, only without --moe-permute-fusion, which
    # Megatron-Bridge 5776a6d90b's Qwen3-MoE, GPT-OSS and DeepSeek-V3 providers and recipes set): 11; on one rank
    # the sum, .long() and the counts' copy: 3; drop-and-pad builds its counts on the host and runs one torch.full
    # on the device: 1
    dispatch_preprocess_launches=(11, 3, 1),
    # of which the copies to the host (_maybe_dtoh_and_synchronize at cuda_dtoh_point; none with drop-and-pad):
    # cba6b0ed0f token_dispatcher.py l. 870-900
    dispatch_count_copies=(4, 1, 0),
    # token_dispatcher.py (92c8482e6d) MoEAlltoAllTokenDispatcher.token_dispatch: global_probs = all_to_all(ep_group,
    # permuted_probs, output_splits, input_splits) after the rows' all_to_all; the probs carry a gradient (they scale
    # the experts' output in the unpermute), so the backward sends it back (tensor_parallel/mappings.py _AllToAll)
    dispatch_probs_alltoall=True,
    # megatron/training/arguments.py (d98e8a6 l. 1628; 92c8482, the 25.11 container's, l. 1043): "if
    # args.position_embedding_type != 'rope': args.apply_rope_fusion = False" (Megatron-Bridge 25.11 5776a6d90b
    # gpt_provider.py validate_rope_fusion_compatibility, the same); GPT-OSS's YaRN is position_embedding_type 'yarn'
    # (gpt_oss_provider.py), so its RoPE runs as rope_utils._apply_rotary_pos_emb_bshd's torch ops
    unfused_rope_scalings=frozenset({"yarn"}),
    # megatron/core/fusions/fused_bias_geglu.py weighted_bias_quick_geglu_impl (92c8482 and d98e8a6 l. 424-429):
    # with activation_func_clamp_value, torch.cat((x_glu.clamp(max=v), x_linear.clamp(-v, v))) before the fused
    # quick-GeGLU (the TE op fuser path, use_transformer_engine_op_fuser, is off by default)
    eager_glu_clamp=True,
    # experts.py TEGroupedMLP.bias_act_func (92c8482e6d): with bias_activation_fusion (Megatron-Bridge's GPT-OSS,
    # DeepSeek providers and its Qwen3 perf configs set it) the activation is weighted_bias_swiglu_impl /
    # weighted_bias_quick_geglu_impl(..., permuted_probs): the probs' gradient is a reduction of its own
    weighted_act_grad=True,
    # megatron/core/transformer/moe/experts.py TEGroupedMLP (92c8482; d98e8a6 with moe_single_grouped_bias False,
    # its default): linear_fc2 skip_bias_add=True, then _apply_bias; its __init__ asserts "bias_dropout_fusion is not
    # supported in TEGroupedMLP when add_bias_linear=True" (gpt_oss_provider.py: bias_dropout_fusion False)
    expert_bias_loop=True,
    hf_modules=False,  # fused linear_qkv and linear_fc1; vocabulary padded to 128 x tp (--make-vocab-size-divisible-by)
    fused_column_dgrad=True,
    sp_wgrad_regather=True,
    vocab_parallel_loss=True,  # megatron/core/tensor_parallel/cross_entropy.py
    embedding_allreduce_with_positions=True,  # LanguageModelEmbedding: all-reduce, then scatter_to_sequence_parallel
    tp_broadcasts_batch=True,  # megatron/core/utils.py get_batch_on_this_tp_rank
    norm_grad_reduction="finalize",  # finalize_model_grads.py _allreduce_non_tensor_model_parallel_grads
    tp_source="Megatron-LM SC'21 §3; " + M + "megatron/core/tensor_parallel/mappings.py",
    sp_source="Korthikanti et al. 2022 §4.2.2; megatron/core/tensor_parallel/layers.py (input re-gathered for wgrad)",
    embedding_source="megatron/core/tensor_parallel/layers.py VocabParallelEmbedding",
    pp_source="megatron/core/pipeline_parallel/schedules.py, p2p_communication.py",
    tied_embedding_allreduce=True,  # finalize_model_grads.py _allreduce_word_embedding_grads
    mtp_standalone_shapes=True,  # p2p_communication.py _communicate_shapes
    zero=Zero.PAPER,
    dp_sources={
        0: "megatron/core/distributed/distributed_data_parallel.py",
        1: "megatron/core/optimizer/distrib_optimizer.py",
        2: "DeepSpeed ZeRO stage 2 semantics; " + ZERO_PAPER,
        3: "DeepSpeed ZeRO stage 3 / Megatron-FSDP semantics; " + ZERO_PAPER,
    },
    bucket_cap_bytes=None,  # without --overlap-grad-reduce one bucket per buffer
    bucket_pad_lcm_128=True,  # param_and_grad_buffer.py pads ZeRO-1 buckets to lcm(dp, 128)
    optimizer_step_reductions=True,  # clip_grads.py get_grad_norm_fp32, optimizer.py found-inf
    reports_loss=True,  # pretrain_gpt.py loss_func
    # megatron/training/arguments.py: --bf16 turns on accumulate_allreduce_grads_in_fp32
    grad_reduce_dtype="fp32",
    # megatron/training/arguments.py:587 "if args.expert_tensor_parallel_size is None:
    # args.expert_tensor_parallel_size = args.tensor_model_parallel_size"
    expert_tp_default_is_tp=True,
    moe_tp_ep_needs_sp=True,  # arguments.py: "sequence parallel must be used with MoE when tp > 1 and ep > 1"
    router_reductions=True,  # megatron/core/transformer/moe/router.py, finalize_model_grads.py
    te_fp8_recipes=True,  # TransformerEngine fp8_autocast recipes, --fp8-param-gather
    # --cuda-graph-impl transformer_engine --cuda-graph-scope moe_router moe_preprocess (Megatron-LM cba6b0ed0f, the
    # Megatron-Bridge 25.11 submodule: transformer_config.py l. 1596-1625, transformer_layer.py l. 790-797)
    te_graph_scopes=("moe_router", "moe_preprocess"),
    userbuffers=True,  # --tp-comm-overlap: TE userbuffers (extensions/transformer_engine.py TELinear)
    # TransformerEngine v2.9 module/linear.py l. 175-207, layernorm_linear.py l. 234-268: the input quantized, then
    # distributed.py gather_along_first_dim(..., quantizer) under every recipe; base.py grad_output_preprocess
    # l. 1160-1192 the grad output likewise
    quantized_tp_gathers=True,
    quantized_grad_output_gather=True,
    token_counts_alltoall=False,  # token_dispatcher.py preprocess all-gathers the counts over expert-TP x EP
    overlap_zero_stages=frozenset(),  # DistributedDataParallelConfig overlap_grad_reduce / overlap_param_gather False
    prefetches_units=False,
    overlap_p2p_schedules=frozenset({"interleaved"}),  # --overlap-p2p-communication (interleaved only)
    # schedules.py d98e8a6 l. 1900-1940 (Megatron-LM 6985e58 the same): without overlap_p2p_comm the interleaved
    # steady state runs, after each chunk's forward and backward, one send_forward_backward_recv_forward_backward
    # (the output to the next rank and the input gradient to the previous one, batch_isend_irecv)
    two_way_exchange_schedules=frozenset({"interleaved"}),
    overlap_bucket_elements=_overlap_bucket_elements,
)
