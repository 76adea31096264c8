"""The serving engines' own MoE token exchanges with data-parallel attention (inference only): each attention-DP
rank holds its own requests' tokens; before the experts every rank gathers the tokens of the whole group and after
them the expert outputs are reduced back to the rank that owns each token. Which collectives carry that, and with
which payload, is the engine's choice (``parallel.ep_dispatch``):

- ``"agrs"``, vLLM's default ``--all2all-backend allgather_reducescatter``
  (vllm/distributed/device_communicators/all2all.py ``AgRsAll2AllManager.dispatch_router_logits`` / ``combine``,
  called from vllm/model_executor/layers/fused_moe/runner/moe_runner.py ``_maybe_dispatch``, vLLM main at
  001430048e81): one ``all_gatherv`` over the DP group of the hidden states **and the router logits** (E values per
  token, the gate's output dtype: the model dtype unless the config asks for fp32 routers), then one
  ``reduce_scatterv`` of the expert output. The two gathered tensors go in one NCCL group: one row.
- ``"dp_gather"``, SGLang's DP attention without ``--moe-a2a-backend``
  (python/sglang/srt/layers/dp_attention.py ``DpPaddingMode.get_dp_padding_mode``, ``_dp_gather``,
  ``dp_reduce_scatter_tensor``; python/sglang/srt/layers/communicator.py; SGLang main at 00161092eb7c): the gather
  is either ``all_gather_into_tensor`` of every rank's tokens padded to the longest (MAX_LEN) or an all-reduce of a
  zero buffer of the summed length into which each rank wrote its rows (SUM_LEN). Extend (prefill) batches over
  more than one rank take SUM_LEN; otherwise the mode that moves fewer bytes, MAX_LEN when
  ``sum_len * 2 >= max_len * dp`` (always, with the equal batches a planned step has; CUDA graphs capture MAX_LEN).
  After the experts MAX_LEN reduce-scatters, SUM_LEN all-reduces and keeps its slice (dp_scatter). With attention TP
  > 1 the gather is preceded by a reduce-scatter over attention TP and the scatter followed by an all-gather over
  it (``_dp_gather_via_all_gather``, ``dp_reduce_scatter_tensor``). Dense layers are taken as SGLang's
  ``--moe-dense-tp-size 1`` runs them (DeepSeek's large-EP recipe): local, no gather.
- ``"agrs_quant"``, TensorRT-LLM's ``AllGatherReduceScatter``
  (tensorrt_llm/_torch/modules/fused_moe/communication/allgather_reducescatter.py at 0f39b2d75a75): post-quant
  dispatch, one ``allgather`` of [quantised hidden states, their scale factors, top-k slot ids int32, top-k
  weights fp32]; combine one ``reducescatter`` of the output in the activation dtype. The factory
  (communication_factory.py at 03c36d6222ad) forces it when MoE TP > 1 or the experts do not divide over EP,
  and falls back to it when no all-to-all is available.
- ``"replicated"``: attention is tensor-parallel (one DP rank), so every EP rank already holds every token; no
  MoE collective is issued and the expert output is summed by the layer's TP all-reduce (rules/tensor.py). vLLM
  (FusedMoEParallelConfig: all2all kernels only with dp > 1), TensorRT-LLM (the factory returns None without
  attention DP) and SGLang (no DP gather without DP attention) all do this.

Messages follow nccl-tests (DESIGN.md §3): an all-gather's message is the gathered output, a reduce-scatter's the
full input; each is ``dp x tokens_local`` rows.
"""

from __future__ import annotations

from collectives import Op

from ..context import Context
from ..layout import Group
from ..ledger import Call

GATHER_DISPATCHES = ("agrs", "dp_gather", "agrs_quant", "replicated")
# the exchanges after which each rank's expert output is still a partial sum over attention TP (its experts' share
# of every token, or its slice of every expert's FFN): the layer's TP all-reduce of T x h sums it, as a dense MLP's
# row-parallel output (rules/tensor.py counts the MoE layer as a TP MLP block, one all-reduce with the shared
# experts' output when there are any). vLLM MoERunner._maybe_reduce_final_output (fused_moe/runner/moe_runner.py at
# 01cb30845063: tensor_model_parallel_all_reduce when the MoE's tp_size > 1 or ep_size > 1, after the agrs combine
# over DP); SGLang and TensorRT-LLM with tensor-parallel attention alike (MixtralMoE / DeepseekV2MoE forward: the
# all-reduce of the experts' output when tp_size > 1). dp_gather and agrs_quant reduce-scatter over the worker's
# tp x dp ranks, which completes the sum
TP_SUMMED = ("agrs", "replicated")
# the exchanges whose combine reduce-scatters over the worker's tp x dp ranks with attention DP (dp > 1): the MoE
# layer's whole output, its shared experts' partial sums over attention TP included, is summed there, so the layer
# issues no TP all-reduce of its own (review r14d #7). TensorRT-LLM Deepseekv3MoE (tensorrt_llm/_torch/models/
# modeling_deepseekv3.py at a43cf9e363d5): the shared experts a GatedMLP with reduce_output=False and the layer's
# AllReduce built only "if not self.use_dp and self.mapping.tp_size > 1"; SGLang DeepseekV2MoE.forward_normal adds
# the shared output to the experts' and skips tensor_model_parallel_all_reduce when its communicator reduce-scatters
# (use_reduce_scatter under DP attention; python/sglang/srt/models/deepseek_v2.py, layers/communicator.py, as r14d
# read them)
WORKER_REDUCED = ("dp_gather", "agrs_quant")
VLLM_AGRS = (
    "vllm 001430048e81 vllm/distributed/device_communicators/all2all.py AgRsAll2AllManager (dispatch_router_logits, "
    "combine); fused_moe/runner/moe_runner.py _maybe_dispatch"
)
SGLANG_DP = "sglang 00161092eb7c python/sglang/srt/layers/dp_attention.py "
TRTLLM_AGRS = (
    "TensorRT-LLM 0f39b2d75a75 tensorrt_llm/_torch/modules/fused_moe/communication/allgather_reducescatter.py "
    "AllGatherReduceScatter"
)
FP8_TILE = 128  # 1x128 activation tiles, one fp32 scale each (DeepSeek-V3 report §3.3; DeepGEMM, TRT-LLM fp8 block)
DP = Group(("dp",))
TP = Group(("tp",))
WORKER = Group(("tp", "dp"))


def calls(ctx: Context, layers: int) -> list[Call]:
    """The forward calls of ``layers`` MoE layers under the gather dispatchers (inference only)."""
    par = ctx.par
    if par.ep_dispatch == "replicated" or par.dp == 1:
        return []
    t, h, x, moe = ctx.tokens_local, ctx.model.hidden_size, ctx.x, ctx.model.moe
    rows = par.dp * t  # the gathered buffer: every attention rank's tokens
    if par.ep_dispatch == "agrs":
        per_token = h * x + moe.num_experts * x  # hidden + router logits
        return [
            _call(ctx, "ep.agrs.gather", Op.ALLGATHER, rows * per_token, layers, DP, VLLM_AGRS + " (hidden + logits)"),
            _call(ctx, "ep.agrs.combine", Op.REDUCESCATTER, rows * h * x, layers, DP, VLLM_AGRS),
        ]
    if par.ep_dispatch == "agrs_quant":
        per_token = _quantised_row(ctx) + moe.top_k * (4 + 4)  # + top-k slot ids int32 and weights fp32
        return [
            _call(ctx, "ep.agrs.gather", Op.ALLGATHER, rows * per_token, layers, WORKER, TRTLLM_AGRS + " dispatch"),
            _call(ctx, "ep.agrs.combine", Op.REDUCESCATTER, rows * h * x, layers, WORKER, TRTLLM_AGRS + " combine"),
        ]
    return _sglang(ctx, layers, rows * h * x)


def _sglang(ctx: Context, layers: int, buffer: int) -> list[Call]:
    tp = ctx.par.tp
    local = ctx.tokens_local * ctx.model.hidden_size * ctx.x
    if max_len_mode(ctx):
        out = []
        if tp > 1:
            out.append(_call(ctx, "ep.dp_gather.attn_tp_scatter", Op.REDUCESCATTER, local, layers, TP,
                             SGLANG_DP + "_dp_gather_via_all_gather (attention TP)"))  # fmt: skip
        out += [
            _call(ctx, "ep.dp_gather.max_len", Op.ALLGATHER, buffer, layers, WORKER,
                  SGLANG_DP + "_dp_gather_via_all_gather (MAX_LEN)"),
            _call(ctx, "ep.dp_scatter.max_len", Op.REDUCESCATTER, buffer, layers, WORKER,
                  SGLANG_DP + "dp_reduce_scatter_tensor (MAX_LEN)"),
        ]  # fmt: skip
        if tp > 1:
            out.append(_call(ctx, "ep.dp_scatter.attn_tp_gather", Op.ALLGATHER, local, layers, TP,
                             SGLANG_DP + "dp_reduce_scatter_tensor (attention TP)"))  # fmt: skip
        return out
    return [
        _call(ctx, "ep.dp_gather.sum_len", Op.ALLREDUCE, buffer, layers, WORKER,
              SGLANG_DP + "_dp_gather_via_all_reduce (SUM_LEN)"),
        _call(ctx, "ep.dp_scatter.sum_len", Op.ALLREDUCE, buffer, layers, WORKER,
              SGLANG_DP + "dp_scatter after the TP all-reduce (SUM_LEN; layers/communicator.py)"),
    ]  # fmt: skip


def max_len_mode(ctx: Context) -> bool:
    """SGLang's DpPaddingMode for the step: extend batches over several ranks take SUM_LEN; otherwise MAX_LEN when
    ``sum_len * 2 >= max_len * dp`` (equal batches: sum_len = dp * max_len, so always)."""
    if ctx.work.phase != "decode" and ctx.par.dp > 1:
        return False
    max_len = ctx.tokens_local
    return max_len * ctx.par.dp * 2 >= max_len * ctx.par.dp


def _quantised_row(ctx: Context) -> int:
    """One token's dispatched hidden state: fp8 with one fp32 scale per 1x128 tile when the dispatch is fp8, else
    the activation dtype."""
    h = ctx.model.hidden_size
    if ctx.work.moe_dispatch_dtype == "fp8":
        return h + -(-h // FP8_TILE) * 4
    return h * ctx.dispatch_bytes


def _call(ctx: Context, name: str, op: Op, message: int, count: int, group: Group, source: str) -> Call:
    return Call(
        name=name,
        op=op,
        phase="forward",
        message_bytes=message,
        calls_per_iteration=count,
        group=group,
        source=source,
        dtype=ctx.work.activation_dtype,
        parallelism="ep",
    )
