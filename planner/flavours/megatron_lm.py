"""Megatron-LM before Megatron-Core (2021-22): the code the A100 runs of Narayanan et al. 2021 (SC'21, commit 6985e58)
and Korthikanti et al. 2022 (55ba1f7b96) ran. Megatron-Core's traits (megatron.py) except where that code differs;
a request names it (``parallel.framework: "megatron-lm-2021"``) to plan a run of its time, and the search never
proposes it (``searched``)."""

from __future__ import annotations

from dataclasses import replace

from .megatron import FLAVOUR as CORE

FLAVOUR = replace(
    CORE,
    name="megatron-lm-2021",
    display="Megatron-LM 2021-22",
    version="Megatron-LM 6985e58 (2021-04) / 55ba1f7b96 (2022-05)",
    searched=False,
    # megatron/p2p_communication.py at 6985e58: --no-scatter-gather-tensors-in-pipeline is store_false, so each TP
    # rank sends mpu.split_tensor_into_1d_equal_chunks (1/t of the tensor) and the receiver rebuilds it with
    # gather_split_1d_tensor (torch.distributed.all_gather over the TP group, megatron/mpu/random.py); 55ba1f7b96
    # keeps it when sequence parallelism is off. Narayanan et al. 2021 §4.1 (Fig. 9).
    pp_scatter_gather=True,
    # neither TransformerEngine nor --cuda-graph-scope exists at 6985e58 or 55ba1f7b96 (arguments.py has no CUDA graph
    # argument): no TE graphs of an MoE layer's router or preprocess
    te_graph_scopes=(),
    # mpu/layers.py ColumnParallelLinear (skip_bias_add False for query_key_value): F.linear on the 3-D [s, b, h]
    # input, which PyTorch 1.8's at::linear runs as matmul then output.add_(bias) (addmm only for 2-D input);
    # 55ba1f7b96 LinearWithGradAccumulationAndAsyncAllreduce: ``output = output + bias``, backward
    # ``grad_bias = grad_output.sum(dim=0)``; the fc1, dense and fc2 biases go into bias_gelu / bias_dropout_add,
    # whose bias gradients autograd reduces over the tokens
    local_linear_biases=True,
    # megatron/optimizer/optimizer.py Float16OptimizerWithFloat16Params.step at 6985e58 (and 55ba1f7b96): the main
    # gradients' fp32 copy, unscale and inf check (fp16), the l2 norm for --clip-grad, apex FusedAdam, the fp32 master
    # copied back into the 16-bit parameters (planner/kernels.py MEGATRON_LM_OPTIMIZER)
    float16_optimizer_passes=True,
    # pretrain_gpt.py get_batch at 6985e58 / 55ba1f7b96 on every stage: mpu.broadcast_data(["text"], ...) (the sizes,
    # then b x (s + 1) int64), the masks and position ids built on each rank (rules/tensor.py _packed_batch)
    tp_batch_packed=True,
    # megatron/model/fused_layer_norm.py at 55ba1f7b96: MixedFusedLayerNorm runs apex's FastLayerNormFN for these
    # hidden sizes (persist_ln_hidden_sizes; --no-persist-layer-norm store_true; arguments.py turns the persistent
    # kernel off below PyTorch 1.11) and its own older kernels (fused_mix_prec_layer_norm_cuda) otherwise; 6985e58
    # has only the older ones, which a run of that code states as workload.norm_kernel "apex" (kernels.APEX_LAYER_NORM)
    persist_layer_norm_sizes=frozenset(
        {1024, 1536, 2048, 2304, 3072, 3840, 4096, 5120, 6144, 8192, 10240, 12288, 12800, 15360, 16384, 18432}
        | {20480, 24576, 25600, 30720, 32768, 40960, 49152, 65536}
    ),
    pp_source="megatron/p2p_communication.py, schedules.py at 6985e58 (scatter/gather: Narayanan et al. 2021 §4.1)",
    # no --tp-comm-overlap: `git grep "tp_comm_overlap\|userbuffers"` finds nothing at 6985e58 nor at 55ba1f7b96
    # (review r14d #4); TransformerEngine's userbuffers came with Megatron-Core (megatron.py), so neither they nor
    # the workload.userbuffers_* methods apply (parallel._framework_switches)
    userbuffers=False,
    no_tp_comm_overlap="Megatron-LM 6985e58 (2021-04) and 55ba1f7b96 (2022-05) have no --tp-comm-overlap (arguments.py "
    "at either: no tp_comm_overlap, no userbuffers; TransformerEngine's userbuffers came with Megatron-Core)",
)
