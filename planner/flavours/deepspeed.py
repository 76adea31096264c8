"""DeepSpeed 0.19 (read at 0.19.6 commit edaa722; recorded runs 0.19.8): its own ZeRO (rules/deepspeed.py) around
a Hugging-Face-style model; tensor and pipeline parallelism as Megatron-DeepSpeed runs them (Megatron's
mappings)."""

from __future__ import annotations

from .base import Flavour, Zero
from .megatron import FLAVOUR as MEGATRON

REDUCE_BUCKET_SIZE = 500_000_000  # deepspeed/runtime/zero/config.py reduce_bucket_size default (elements)


def _overlap_bucket_elements(par, grad_bytes: int) -> int:
    return par.zero_config.reduce_bucket_size if hasattr(par, "zero_config") else REDUCE_BUCKET_SIZE


FLAVOUR = Flavour(
    name="deepspeed",
    display="DeepSpeed",
    fused_kernels=False,  # the model's own PyTorch modules run eager (planner/kernels.py EAGER)
    version="DeepSpeed 0.19.6",
    hf_modules=True,  # DeepSpeed wraps the HF-style modules of the user's model
    # TP, SP and PP follow Megatron-DeepSpeed (Megatron's mappings)
    fused_column_dgrad=MEGATRON.fused_column_dgrad,
    sp_wgrad_regather=MEGATRON.sp_wgrad_regather,
    vocab_parallel_loss=MEGATRON.vocab_parallel_loss,
    embedding_allreduce_with_positions=MEGATRON.embedding_allreduce_with_positions,
    tp_broadcasts_batch=MEGATRON.tp_broadcasts_batch,
    norm_grad_reduction=MEGATRON.norm_grad_reduction,
    tp_source=MEGATRON.tp_source,
    sp_source=MEGATRON.sp_source,
    embedding_source=MEGATRON.embedding_source,
    tied_embedding_allreduce=True,
    zero=Zero.DEEPSPEED,
    dp_sources={},  # rules/deepspeed.py names its own sources
    bucket_cap_bytes=None,
    optimizer_step_reductions=False,  # rules/deepspeed.py _step_checks
    reports_loss=False,
    grad_reduce_dtype=None,  # communication_data_type defaults to the model dtype
    expert_tp_default_is_tp=False,  # DeepSpeed-MoE
    moe_tp_ep_needs_sp=False,
    router_reductions=False,
    token_counts_alltoall=False,
    zero_plus_plus=True,  # zero_config: zero_hpz_partition_size, zero_quantized_weights/gradients, overlap_comm
    overlap_zero_stages=frozenset({3}),  # DeepSpeedZeroConfig.overlap_comm: None -> True for stage 3 only
    prefetches_units=False,  # per-micro-batch ZeRO-2/3 traffic follows overlap_comm
    overlap_p2p_schedules=frozenset(),
    # DeepSpeed's PipelineEngine (deepspeed/runtime/pipe/engine.py at edaa722, the same at cd7967d6b of 2021-10):
    # is_pipe_partitioned = is_model_parallel and pipeline['pipe_partitioned'] (runtime/config.py default True), so
    # each TP rank sends its 1/t PartitionedTensor of the stage's output and the receiver all-gathers it
    # (_exec_forward_pass: part_input.full()), the input gradient likewise (grad_partitioned, default True:
    # _exec_backward_pass part_grad.full()); the sender re-gathers its own output before the backward
    # (part_output.full()); and schedule.py TrainSchedule issues every transfer as a blocking instruction of its own
    pp_source="DeepSpeed edaa722 deepspeed/runtime/pipe/engine.py, schedule.py TrainSchedule, p2p.py",
    pp_scatter_gather=True,
    # PipelineEngine.train_batch runs schedule.TrainSchedule (1F1B: deepspeed/runtime/pipe/schedule.py at edaa722,
    # "A schedule for training a batch using hybrid parallelism ... 1F1B"); DeepSpeed has no interleaved, zero-bubble
    # or DualPipe schedule
    pipeline_schedules=frozenset({"1f1b"}),
    # PipelineEngine.__init__: assert self.zero_optimization_stage() < ZeroStageEnum.gradients, "ZeRO-2 and ZeRO-3 are
    # incompatible with pipeline parallelism" (deepspeed/runtime/pipe/engine.py at edaa722)
    pp_max_zero_stage=1,
    pp_regathers_output=True,
    pp_unbatched_transfers=True,
    overlap_bucket_elements=_overlap_bucket_elements,
)
