"""What a serving engine's own kernels fuse, or move in another dtype, where the training frameworks' layer (the
planner's default kernel list, planner/kernels.py) runs them apart: a traits object the serving planner sets on an
inference workload from the engine (planner/serving/engines.py ``EngineTraits.kernels``, WorkloadSpec.engine_kernels;
not an API field) and planner/kernels.py reads. Each field is the source that says the engine runs it so; None: the
default kernels (DESIGN.md, "variation is data": no engine name is compared anywhere).
"""

from __future__ import annotations

from dataclasses import dataclass

# SGLang's contiguous DeepGEMM experts behind DeepEP's normal fp8 dispatch (dsv3s15): the received fp8 rows and their
# 1x128 fp32 scales are scattered into per-expert order by ep_scatter and the down projection's bf16 output gathered
# back by ep_gather, both Triton kernels copied from lightllm (python/sglang/srt/layers/moe/ep_moe/kernels.py at
# 006f9b3a8f77 ``_fwd_kernel_ep_scatter_1`` / ``_fwd_kernel_ep_scatter_2`` / ``_fwd_kernel_ep_gather``; run by
# layers/moe/ep_moe/layer.py at 3f02617653b8 DeepEPMoE.forward_deepgemm_contiguous). Bytes as the kernels move them,
# per received token (``recv_x``: the tokens DeepEP delivered to this rank, each once) and per routed copy R (the
# rows the grouped GEMM runs):
# - ep_scatter_2 reads each received row once, h fp8 bytes and h / 128 fp32 scales (EP_SCATTER_ROW_BYTES), and its
#   top-k expert ids (int64: DeepEP's topk_idx, EP_TOPK_ID_BYTES each); per local copy it writes the row and its scales
#   again and the copy's output_index (``torch.empty_like(topk_idx)``, int64);
# - ep_scatter_1 writes m_indices, one int32 per row (EP_M_INDEX_BYTES);
# - tma_align_input_scale transposes fc1's and, after fc2's quantize, fc2's activation scales to DeepGEMM's
#   column-major layout (read and write each fp32 scale): 2 x 4 / 128 B per element of the R x h and R x f inputs;
# - ep_gather reads each copy's bf16 output row once, per received token its k ids, fp32 weights and indices
#   (EP_GATHER_INDEX_BYTES x k), and writes the token's bf16 sum once.
# vLLM's DeepGemmExperts behind DeepEP's high-throughput kernels runs the same two kernels
# (vllm/model_executor/layers/fused_moe/deep_gemm_utils.py at 6138c395948d deepgemm_moe_permute: ``ep_scatter(aq,
# aq_scale, ...)``, deepgemm_unpermute_and_reduce: ``ep_gather``; its inv_perm is int32, 4 B of a 7,392 B row less:
# not told apart).
SGLANG_EP_SCATTER = (
    "sglang 006f9b3a8f77 python/sglang/srt/layers/moe/ep_moe/kernels.py ep_scatter / ep_gather (from lightllm), run by "
    "layers/moe/ep_moe/layer.py at 3f02617653b8 DeepEPMoE.forward_deepgemm_contiguous"
)
VLLM_EP_SCATTER = (
    "vllm 6138c395948d vllm/model_executor/layers/fused_moe/deep_gemm_utils.py deepgemm_moe_permute (ep_scatter of the "
    "fp8 rows and scales) / deepgemm_unpermute_and_reduce (ep_gather)"
)
FP8_BLOCK = 128  # DeepEP's and DeepGEMM's 1x128 activation blocks, one fp32 scale each
EP_SCATTER_ROW_BYTES = 1 + 4 / FP8_BLOCK  # per element of a received or scattered row: e4m3 and its share of a scale
EP_TOPK_ID_BYTES = 8  # int64 topk_idx (DeepEP's recv_topk_idx), read per received token and top-k slot
EP_OUTPUT_INDEX_BYTES = 8  # output_index = torch.empty_like(topk_idx): int64, one per routed copy
EP_M_INDEX_BYTES = 4  # m_indices: int32, one per routed copy
TMA_ALIGN_BYTES = 2 * 4 / FP8_BLOCK  # per element of a quantized GEMM input: its fp32 scale read and written again
EP_GATHER_INDEX_BYTES = 8 + 4 + 8  # per received token and top-k slot: the id (int64), the weight (fp32), the index
EP_SCATTER_LAUNCHES = 4  # ep_scatter_1, ep_scatter_2, and the two tma_align_input_scale transposes (fc1's, fc2's)
EP_GATHER_LAUNCHES = 1

# The masked (low-latency) experts on DeepEP's low-latency layout ([local experts, max tokens x ranks, h], what
# ``low_latency_dispatch`` returns and ``low_latency_combine`` takes): no permute or unpermute runs, and the down
# projection's input is quantized by the activation kernel itself, one pass that reads fc1's bf16 gate and up halves
# and writes fp8 with a fp32 scale per 128 (MASKED_ACT_QUANT_BYTES per element of the R x f output):
# - SGLang layers/moe/ep_moe/layer.py at 3f02617653b8 DeepEPMoE.forward_deepgemm_masked: m_grouped_gemm_fp8_fp8_bf16_
#   nt_masked, ``silu_and_mul_masked_post_quant_fwd`` (kernels.py at 006f9b3a8f77 _silu_and_mul_post_quant_kernel:
#   loads gate and up, ``output_q`` e4m3 and ``output_s`` fp32 per BLOCK_N = quant_group_size 128), the second masked
#   GEMM; the combine takes its output as laid out;
# - vLLM vllm/model_executor/layers/fused_moe/batched_deep_gemm_moe.py at 28eecbab828b BatchedDeepGemmExperts.apply:
#   fp8_m_grouped_gemm_nt_masked, ``persistent_masked_m_silu_mul_quant``, fp8_m_grouped_gemm_nt_masked.
# TensorRT-LLM's low-latency path dispatches bf16 rows of a block-fp8 checkpoint (EngineTraits.bf16_dispatches) into
# its own fused MoE: not read here, not set.
SGLANG_MASKED = (
    "sglang 3f02617653b8 python/sglang/srt/layers/moe/ep_moe/layer.py DeepEPMoE.forward_deepgemm_masked "
    "(silu_and_mul_masked_post_quant_fwd, kernels.py at 006f9b3a8f77)"
)
VLLM_MASKED = (
    "vllm 28eecbab828b vllm/model_executor/layers/fused_moe/batched_deep_gemm_moe.py BatchedDeepGemmExperts.apply "
    "(persistent_masked_m_silu_mul_quant between the two masked GEMMs)"
)
MASKED_ACT_QUANT_BYTES = 2 * 2 + EP_SCATTER_ROW_BYTES  # read gate and up (bf16), write e4m3 and its scale share

# MLA's two down projections (q_a_proj, n = q_lora_rank, and kv_a_proj_with_mqa, n = kv_lora_rank + qk_rope_head_dim)
# as one GEMM over the same input, n = their sum (DeepSeek-V3: 1,536 + 512 + 64 = 2,112), the input read and quantized
# once:
# - SGLang python/sglang/srt/models/deepseek_v2.py at 00114aef19bb (and 3e4a39ee7330) DeepseekV2AttentionMLA:
#   ``fused_qkv_a_proj_with_mqa = ReplicatedLinear(hidden_size, q_lora_rank + kv_lora_rank + qk_rope_head_dim)``,
#   split after (forward_normal_prepare, forward_absorb_prepare);
# - vLLM vllm/model_executor/models/deepseek_v2.py at 002d6073aa03: ``fused_qkv_a_proj =
#   DeepSeekV2FusedQkvAProjLinear(..., [q_lora_rank, kv_lora_rank + qk_rope_head_dim])`` (a MergedColumnParallelLinear
#   with disable_tp);
# - TensorRT-LLM tensorrt_llm/_torch/modules/attention.py at 00547a25ac61 MLA.__init__: ``kv_a_proj_with_mqa =
#   Linear(hidden_size, q_lora_rank + kv_lora_rank + qk_rope_head_dim)`` when q_lora_rank is set.
# Training keeps two (Megatron-Core MLASelfAttention's linear_q_down_proj and linear_kv_down_proj; its fused
# linear_qkv_down_proj is --mla-down-proj-fusion, default False, Megatron-LM 8fd390d1fb transformer_config.py).
SGLANG_FUSED_QKV_A = "sglang 00114aef19bb python/sglang/srt/models/deepseek_v2.py fused_qkv_a_proj_with_mqa"
VLLM_FUSED_QKV_A = "vllm 002d6073aa03 vllm/model_executor/models/deepseek_v2.py fused_qkv_a_proj"
TRTLLM_FUSED_QKV_A = (
    "TensorRT-LLM 00547a25ac61 tensorrt_llm/_torch/modules/attention.py MLA.kv_a_proj_with_mqa "
    "(q_lora_rank + kv_lora_rank + qk_rope_head_dim)"
)


@dataclass(frozen=True)
class EngineKernels:
    """What the engine's kernels do apart from the planner's default layer, each the source that says so (None: the
    default). Read by planner/kernels.py for inference passes only."""

    # MLA's q_a and kv_a projections as one GEMM, its input quantized once (_attention_projections)
    fused_mla_down_proj: str | None = None
    # after a DeepEP normal dispatch of fp8 rows (QUANTIZED_BEFORE_DISPATCH "sender"), the contiguous experts'
    # permute is ep_scatter of the fp8 rows and their unpermute ep_gather (ep_scatter_bytes, ep_gather_bytes)
    fp8_ep_scatter: str | None = None
    # on DeepEP's low-latency layout the experts run masked (no permute, no unpermute) and the activation quantizes
    # the down projection's input in the same kernel (MASKED_ACT_QUANT_BYTES)
    masked_act_quant: str | None = None


def ep_scatter_bytes(received: float, rows: float, h: int, f: float, top_k: int) -> float:
    """HBM bytes of SGLang's ep_scatter and the two scale transposes for one MoE layer on one rank (SGLANG_EP_SCATTER):
    ``received`` tokens from DeepEP, ``rows`` routed copies over the local experts, hidden size ``h``, expert width
    ``f`` (the down projection's input), ``top_k`` ids a token."""
    rows_bytes = EP_SCATTER_ROW_BYTES * h * (received + rows)
    index = EP_TOPK_ID_BYTES * top_k * received + (EP_OUTPUT_INDEX_BYTES + EP_M_INDEX_BYTES) * rows
    return rows_bytes + index + TMA_ALIGN_BYTES * rows * (h + f)


def ep_gather_bytes(received: float, rows: float, h: int, top_k: int, x: int = 2) -> float:
    """HBM bytes of ep_gather for one MoE layer on one rank: read every copy's ``x``-byte output row once, write each
    received token's weighted sum once, with its ``top_k`` ids, weights and indices (EP_GATHER_INDEX_BYTES)."""
    return x * h * (rows + received) + EP_GATHER_INDEX_BYTES * top_k * received


__all__ = [
    "EP_GATHER_LAUNCHES",
    "EP_SCATTER_LAUNCHES",
    "EP_SCATTER_ROW_BYTES",
    "MASKED_ACT_QUANT_BYTES",
    "SGLANG_EP_SCATTER",
    "SGLANG_FUSED_QKV_A",
    "SGLANG_MASKED",
    "TRTLLM_FUSED_QKV_A",
    "VLLM_EP_SCATTER",
    "VLLM_FUSED_QKV_A",
    "VLLM_MASKED",
    "EngineKernels",
    "ep_gather_bytes",
    "ep_scatter_bytes",
]
