"""A serving engine's own per-step calls outside the model's layers (inference only), each from the engine's
source; the serving planner (planner/serving/deployment.py) lists and prices them with a worker's step.

- vLLM's DP synchronisation (vllm/v1/worker/dp_utils.py ``_run_ar``, called once per step by
  ``coordinate_batch_across_dp`` from the GPU model runner; vLLM main at 00746147f8cf): every data-parallel rank
  fills its column of a ``(4, dp_size)`` int32 tensor (its tokens unpadded and padded, whether it micro-batches,
  its CUDA-graph mode) and the DP group all-reduces it, ``dist.all_reduce(tensor, group=get_dp_group()
  .device_group)``: NCCL on the GPUs, or gloo on the CPU with ``disable_nccl_for_dp_synchronization``. The
  answer is read on the host (``.item()``) before the forward, so the step waits for it: on the critical path.
  16 x dp bytes; a group per tensor-parallel rank and pipeline stage (the DP dimension of the worker's grid).
  Skipped at dp 1 (``coordinate_batch_across_dp`` returns early).
- TensorRT-LLM's fused all-reduce (cpp/tensorrt_llm/thop/allreduceOp.cpp at 01e2c3612da7,
  ``AllReduceFusionOp::RESIDUAL_RMS_NORM``): the all-reduce that ends an attention or MLP block is one
  ``ar_fusion::allreduce_fusion_op`` kernel (kernels/communicationKernels/allReduceFusionKernels.cu: one-shot
  ``LamportComm`` or two-shot ``SyncComm`` over NVLink) that also adds the residual and applies the next RMSNorm,
  returning both. The bytes are the block output's, tokens x hidden x 2, as rules/tensor.py's rows carry them:
  ``fused`` relabels those rows with this source. Which kernel runs (one-shot, two-shot or NCCL, by TensorRT-LLM's
  strategy table), its price and the residual add and norm it takes out of the layer's compute are
  planner/serving/fused_allreduce.py's.
"""

from __future__ import annotations

from dataclasses import replace

from collectives import Op

from ..layout import Group
from ..ledger import Call
from ..parallel import ParallelSpec

VLLM_DP_SYNC = (
    "vllm 00746147f8cf vllm/v1/worker/dp_utils.py _run_ar: all_reduce of a (4, dp_size) int32 tensor over the DP "
    "group (coordinate_batch_across_dp, once per step)"
)
DP_SYNC_ROWS = 4  # tokens unpadded, tokens padded, micro-batching, CUDA-graph mode
TRTLLM_AR_FUSION = (
    "TensorRT-LLM 01e2c3612da7 cpp/tensorrt_llm/thop/allreduceOp.cpp AllReduceFusionOp::RESIDUAL_RMS_NORM "
    "(allReduceFusionKernels.cu allreduce_fusion_op, one-shot Lamport / two-shot): all-reduce + residual add + "
    "RMSNorm in one kernel"
)
# the rows (rules/tensor.py, without the "tp." and an MTP module's "mtp.") whose all-reduce ends a block
BLOCK_OUTPUTS = ("attn.out_proj", "mlp.down_proj")


def dp_sync(par: ParallelSpec, rows: int, source: str) -> Call | None:
    """The per-step all-reduce of ``rows`` int32 values per DP rank over the DP group, or None at dp 1."""
    if par.dp == 1 or not rows:
        return None
    return Call(
        name="dp.step_sync",
        op=Op.ALLREDUCE,
        phase="forward",
        message_bytes=rows * 4 * par.dp,
        calls_per_iteration=1,
        group=Group(("dp",)),
        source=source,
        dtype="int32",
        parallelism="dp",
        stages=tuple(range(par.pp)),
    )


def fused(call: Call, source: str) -> Call:
    """``call`` as an engine issues it when its all-reduce of a block's output is fused with the residual add and
    the next norm (``source``: the engine's op); any other call unchanged."""
    block = call.name.removeprefix("tp.").removeprefix("mtp.")
    if not source or call.parallelism != "tp" or call.op != Op.ALLREDUCE or block not in BLOCK_OUTPUTS:
        return call
    return replace(call, source=source)
