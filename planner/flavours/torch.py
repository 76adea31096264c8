"""PyTorch 2.13: DDP (ZeRO-0), FSDP2 fully_shard (ZeRO-2: reshard_after_forward=False, ZeRO-3: True),
DTensor tensor parallelism with torchtitan's Megatron-style plan, torch.distributed.pipelining. Matched call by
call against tests/reference/pytorch."""

from __future__ import annotations

from .base import ZERO_PAPER, Flavour, Zero

DTENSOR = "torch.distributed.tensor.parallel (ColwiseParallel/RowwiseParallel); reference/pytorch/tp2*.json"
DDP_BUCKET_BYTES = 25 * 2**20  # torch/nn/parallel/distributed.py DistributedDataParallel(bucket_cap_mb=25)


def _overlap_bucket_elements(par, grad_bytes: int) -> int:
    mb = par.ddp.bucket_cap_mb
    return (int(mb * 2**20) if mb is not None else DDP_BUCKET_BYTES) // grad_bytes


FLAVOUR = Flavour(
    name="torch",
    display="PyTorch",
    version="PyTorch 2.13",
    hf_modules=True,  # q, k, v and gate, up as separate nn.Linear; the vocabulary is not padded
    fused_kernels=False,  # eager unless torch.compile (planner/kernels.py EAGER)
    fused_column_dgrad=False,  # ColwiseParallel on q, k, v (and gate, up): one all-reduce each in backward
    sp_wgrad_regather=False,
    vocab_parallel_loss=False,  # the LM head gathers the logits (loss_parallel off: tests/reference/pytorch/tp2*.json)
    # torchtitan turns loss_parallel on whenever tp > 1 unless --training.disable_loss_parallel (torchtitan 9dec370
    # train.py: enable_loss_parallel=not job_config.training.disable_loss_parallel; parallelize_llama.py "output":
    # ColwiseParallel(output_layouts=Shard(-1) if loss_parallel else Replicate())): workload.loss_parallel
    loss_parallel_switch=True,
    loss_parallel_source=(
        "torch/distributed/tensor/parallel/loss.py (pytorch 02eef6b8) _log_softmax: amax and sum-exp all_reduce, "
        "_nll_loss_forward: _MaskPartial all_reduce of the target logit (fp32, b·s values each)"
    ),
    embedding_allreduce_with_positions=False,
    embedding_transposes=False,  # torchtitan's Transformer: h = self.tok_embeddings(tokens), [b, s, h] throughout
    tp_broadcasts_batch=False,  # every rank loads its batch
    norm_grad_reduction="on_read",  # Partial gradients: reference/pytorch/tp2_sp.json
    tp_source=DTENSOR,
    sp_source=DTENSOR,
    embedding_source=DTENSOR,
    pp_source="torch.distributed.pipelining; reference/pytorch/pp2_1f1b.json",
    tied_embedding_allreduce=False,
    zero=Zero.FSDP2,
    dp_sources={
        0: "torch DistributedDataParallel (Reducer buckets)",
        1: ZERO_PAPER,
        2: "FSDP2 reshard_after_forward=False",
        3: "FSDP2 fully_shard",
    },
    bucket_cap_bytes=DDP_BUCKET_BYTES,
    bucket_pad_lcm_128=False,
    ddp_switches=True,
    torchtitan_selective_ac=True,  # torchtitan activation_checkpoint.selective_ac_option
    # torchtitan's MoE combine (b5bcd76c6, 2026-08-21, torchtitan/models/common/token_dispatcher.py
    # LocalTokenDispatcher.combine, and AllToAllTokenDispatcher's after its unpermute): zeros_like(x), then
    # (routed_output.to(float32) * scores).to(bf16) before deterministic_scatter_add: per element of the R x h
    # routed rows, .to(float32) reads 2 B and writes 4, the multiply reads 4 and writes 4, .to(bf16) reads 4 and
    # writes 2: 20 B in 3 kernels (the zeros_like's T x h write is the kernel model's). Backward by autograd's
    # formulas (derivatives.yaml): .to(bf16)'s grad cast up (6 B), mul's grad x scores (8 B) and the scores' grad
    # (grad x the saved fp32 rows, 12 B, summed over h, 4 B), .to(float32)'s grad cast down (6 B): 36 B in 5 kernels
    moe_score_combine=(20.0, 3, 36.0, 5),
    optimizer_step_reductions=False,
    torch_optimizer=True,  # torch.optim.AdamW and torchtitan's clip_grad_norm_ (planner/kernels.py optimizer_bytes)
    reports_loss=False,
    grad_reduce_dtype=None,  # DDP/FSDP2 reduce in the parameter dtype unless a MixedPrecisionPolicy says otherwise
    expert_tp_default_is_tp=False,  # torchtitan expert_tensor_parallel_degree = 1
    moe_tp_ep_needs_sp=False,
    router_reductions=False,  # torchtitan computes its balance loss locally
    token_counts_alltoall=True,  # torchtitan/distributed/expert_parallel.py ExpertParallel._token_dispatch
    # torchtitan's dispatcher syncs the host for its all-to-all splits over ep > 1 (b5bcd76c6
    # torchtitan/models/common/token_dispatcher.py AllToAllTokenDispatcher._sync_token_count_exchange, l. 301-305:
    # output_splits .to("cpu", non_blocking=False), "NOTE: this would incur a device-to-host sync"); at ep 1 the
    # LocalTokenDispatcher does not (planner/kernels.py COUNT_SYNC, host_sync)
    dispatch_count_sync=True,
    count_sync_needs_ep=True,
    count_sync_after_permute=True,  # dispatch: _local_reorder, the count all-to-all, then the blocking copy
    # eager PyTorch's own host time per launch in a synced MoE layer: the median gap between host-bound launches of
    # this project's eager MoE layer trace (tests/reference/kernels/h200/trace_qwen3_235b.ep1.s2048.json.gz, PyTorch
    # 2.11 eager, the H200 machine's Xeon VM: planner/trace_fit.py host_launch, 71 gaps, 26.1 us; read with the
    # profiler on, as calib8 reads every trace), not Megatron-Core's 38.2 us
    host_launch_s=26.1e-6,
    overlap_zero_stages=frozenset({0, 1, 2, 3}),  # DDP autograd hooks, FSDP2 prefetch
    prefetches_units=True,  # FSDP2 implicit forward and backward prefetch
    # torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py (pytorch 010ae4a8; the same split since FSDP2's
    # 2024 releases): foreach_all_gather_copy_out waits for the all-gather on the current (compute) stream and runs
    # split_with_sizes_copy there; foreach_reduce runs foreach_reduce_scatter_copy_in (chunk_cat, which also casts
    # to the reduce dtype) before it switches to the reduce-scatter stream
    fsdp_unit_copies=True,
    # DTensor's Shard(1) <-> Replicate redistributes (torchtitan's SequenceParallel / PrepareModuleInput /
    # Rowwise output_layouts=Shard(1) on [b, s, h]) call funcol.all_gather_tensor(gather_dim=1) and
    # reduce_scatter_tensor(scatter_dim=1) (torch/distributed/_functional_collectives.py, the same since 2023
    # through pytorch 38410cf9 of the 2025-06 runs): NCCL gathers and scatters along dim 0, so the gathered output
    # is re-laid by torch.cat(torch.chunk(res, group_size, dim=0), dim=gather_dim) and the reduce-scatter input
    # by torch.cat(torch.chunk(self, group_size, dim=scatter_dim)) (kernels.sp_layout_copy_kernels)
    sp_layout_copies=True,
    # torchtitan compiles each checkpointed block (parallelize_llama.py: apply_ac, then apply_compile): the
    # checkpoint becomes a tagged region whose nodes the min-cut partitioner puts on the backward's side
    # (torch/_functorch/partitioners.py must_recompute: MUST_RECOMPUTE and PREFER_RECOMPUTE) and extracts only
    # those the backward needs: nothing needs fc2's output, so fc2, its reduce-scatter and the residual add are not
    # re-run. Eager, torchtitan passes early_stop=False since 25413d224 (2025-08; recorded in
    # tests/reference/pytorch/sac_op_tp2.json): the whole block re-runs (before it, torch's default early stop
    # ended the re-run at the last pack, fc2's inputs: the 2024-12 and 2025-06 runs compiled, so it does not arise)
    recompute_stops_at_last_save=True,
    # async TP (torchtitan enable_async_tensor_parallel, entered as tp_comm_overlap): Inductor's micro-pipeline
    # TP pass (torch/_inductor/fx_passes/micro_pipeline_tp.py, pytorch 00122fb1) fuses all_gather -> matmul(s) and
    # "reduce_scatter_tensor(A @ B)" only: rs_input must be an aten.mm (or its reshape) with one user. The
    # backward reduce-scatter of the q/k/v (gate/up) input gradient takes the sum of three (two) matmuls: unfused
    async_tp_single_matmul=True,
    # ... which torchtitan refuses without torch.compile of the model: "Async TP requires --training.compile"
    # (torchtitan/parallelisms/parallelize_llama.py, 2024, the 2024-12 runs' code) and "Async TP requires 'model' in
    # --compile.components." (torchtitan/config/configs.py CompileConfig.__post_init__, 2025-26)
    async_tp_needs_compile=(
        "torchtitan raises 'Async TP requires torch.compile' (parallelize.py; config/configs.py: \"Async TP requires "
        "'model' in --compile.components\")"
    ),
    # ... and its fused ops move the shards with copy_ of the peers' symmetric-memory buffers (torch/distributed/
    # _symmetric_memory/__init__.py _pipelined_multi_all_gather_and_consume copy_shard, _pipelined_produce_and_all2all:
    # contiguous same-dtype device copies, which torch issues as cudaMemcpyAsync, i.e. the copy engines): no SMs
    # beside the GEMMs they hide behind (planner/contention.py), only their HBM bytes
    tp_overlap_sms=(("allgather", 0), ("reducescatter", 0)),
    overlap_p2p_schedules=frozenset(),
    overlap_bucket_elements=_overlap_bucket_elements,
    torchao_float8=True,  # torchtitan's float8 converter (torchao.float8 convert_to_float8_training)
    # torch/distributed/tensor/experimental/_context_parallel/_attention.py (pytorch 010ae4a8) _RotateMethod:
    # _cp_options.rotate_method defaults to ALL_GATHER; set_rotate_method("alltoall") picks ALL_TO_ALL
    cp_rotate_methods=("allgather", "alltoall"),
)
