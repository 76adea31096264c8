"""TensorRT-LLM's fused all-reduce + residual add + RMSNorm, priced as its kernels and with the kernels it absorbs
taken out of the layer's compute (issue 22; docs/serving.md, "TensorRT-LLM's fused all-reduce").

What TensorRT-LLM runs for the all-reduce that ends an attention or MLP block (``AllReduceFusionOp::
RESIDUAL_RMS_NORM``, strategy ``AUTO``), read at the versions named:

- ``AllreduceOp::selectImplementation`` (cpp/tensorrt_llm/thop/allreduceOp.cpp at 01e2c3612da7): NCCL when the
  message (tokens x hidden x the activation's bytes) exceeds the workspace, or when the TP group has no P2P over
  NVLink (a group across nodes: ``mIsP2PSupported = false``); otherwise ``selectStrategyLookUpTable``;
- ``getMaxRequiredWorkspaceSize`` (cpp/tensorrt_llm/common/customAllReduceUtils.h at 005b299bd309): 16,000,000
  bytes for tp <= 2, 8,000,000 above;
- ``selectStrategyLookUpTable`` (same file): a table measured by NVIDIA per (SM 90 for every pre-Blackwell GPU, or
  100; tp 2, 4, 8; the fusion op; hidden 128 .. 8192 by powers of two; tokens 1 .. 16384 by powers of two, both
  indices the floor of log2) of ONESHOT (4), TWOSHOT (5) or NCCL (0); outside the table (tp 16, hidden 16384)
  ``NCCL_SYMMETRIC``. ``RESIDUAL_RMS_NORM``'s slice is ``TABLE`` below, verbatim;
- ONESHOT and TWOSHOT run ``ar_fusion::allreduce_fusion_op`` (kernels/communicationKernels/
  allReduceFusionKernels.cu): one kernel that all-reduces, adds the residual and applies the next RMSNorm.
  NCCL and NCCL_SYMMETRIC run ``ncclAllReduce`` and then ``fallbackRunSubsequentOps`` (the residual add and the
  norm as their own kernels): the row stays NCCL's price and the layer keeps its kernels.

How the two kernels move bytes over NVLink, priced on the cluster graph by the schedule pricer
(collectives "direct" schedules, the same links, capacities and constants as every other call):

- one-shot (Lamport): every rank writes its whole block output (M bytes) into every peer's buffer and reduces
  the tp copies locally: (tp - 1) x M bytes out of each rank in one step, the wire traffic of a one-step
  all-gather of tp x M bytes;
- two-shot: reduce-scatter then all-gather over all peers at once: 2 (tp - 1) / tp x M bytes in two steps
  (collectives' "direct" all-reduce).

Latency: the schedule pricer's own constants (collectives/topology/calibration.py: NCCL's baseLat for one kernel
launch and set-up, 6.8 us, plus 1.8 us per step and the NVLink path latency); no TensorRT-LLM kernel measurement
was at hand to set them apart. Not modelled: the MNNVL strategy (multi-node NVLink, picked only when asked for),
and the fused add + norm kernel ``fallbackRunSubsequentOps`` may use after NCCL (charged as the planner's two
kernels).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from collectives import Op
from collectives.topology import ClusterSpec

from ..context import Context
from ..kernels import layer_kernels
from ..ledger import Call
from ..parallel import ParallelSpec
from ..plan import Options, Plan, PricedCall, price_calls
from ..rules.engine_step import BLOCK_OUTPUTS, fused
from ..workload import DTYPE_BYTES

ONESHOT, TWOSHOT, NCCL = "oneshot", "twoshot", "nccl"
# AllReduceFusionOp: the all-reduce + residual + RMSNorm, and the same with the norm's output quantized to fp8 (what
# TensorRT-LLM's Llama runs when its linears are per-tensor FP8: modeling_llama.py post/pre_mlp_fusion_op)
NORM, NORM_QUANT_FP8 = "RESIDUAL_RMS_NORM", "RESIDUAL_RMS_NORM_QUANT_FP8"
_CODES = {4: ONESHOT, 5: TWOSHOT, 0: NCCL}

# customAllReduceUtils.h at 005b299bd309, AllReduceBestStrategyTableSM90 / SM100, the Fusion=RESIDUAL_RMS_NORM and
# RESIDUAL_RMS_NORM_QUANT_FP8 slices, verbatim but for the encoding: per (op, sm, tp), one "/"-separated row per
# hidden size 128, 256, ..., 8192, one digit per token count 1, 2, 4, ..., 16384 (4 ONESHOT, 5 TWOSHOT, 0 NCCL), the
# trailing NCCL entries left out
_ENCODED = {
    (NORM, 90, 2): "444444444444/4444444444444/444455554444/444445545444/444544444444/44445444444/4444444444",
    (NORM, 90, 4): "444444444444/44444444444/444444544445/444444444455/44444444455/4444444445/444444445",
    (NORM, 90, 8): "44444444444/44444444445/444444444455/444444444555/44444444055/4444444/444444",
    (NORM, 100, 2): "444454444444/444444444444/4444544454444/4444444444444/444444444444/44444444444/4444444444",
    (NORM, 100, 4): "444444444444/444444444444/444444444444/444444444445/44444444445/4444444445/444444444",
    (NORM, 100, 8): "444444444444/444444444444/44444444444/444444444455/44444444445/4444444445/444444445",
    (
        NORM_QUANT_FP8,
        90,
        2,
    ): "444445554444/4445445445444/4444555554444/4445555454444/444554445444/44544444444/4454444444",
    (NORM_QUANT_FP8, 90, 4): "444444444444/444445545444/444445455445/444444444455/44444444455/4444444445/444444445",
    (NORM_QUANT_FP8, 90, 8): "44444444444/444444444455/4444444444555/444444444555/44444444455/4444444055/444444005",
    (
        NORM_QUANT_FP8,
        100,
        2,
    ): "444454554444/444444544444/4444544444444/4444455444444/444444444444/44444444444/4444444444",
    (NORM_QUANT_FP8, 100, 4): "444444444444/444444444444/444444444444/444444444445/44444444445/4444444445/444444444",
    (NORM_QUANT_FP8, 100, 8): "444444444444/444444444444/4444444444455/444444444455/44444444445/4444444445/444444445",
}
TOKEN_COUNTS = 15  # 1 .. 16384


def _decoded(rows: str) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(int(c) for c in row.ljust(TOKEN_COUNTS, "0")) for row in rows.split("/"))


# [op][sm][tp] -> one row per hidden size, one entry per token count
TABLE: dict[str, dict[int, dict[int, tuple[tuple[int, ...], ...]]]] = {}
for (_op, _sm, _tp), _rows in _ENCODED.items():
    TABLE.setdefault(_op, {}).setdefault(_sm, {})[_tp] = _decoded(_rows)


def workspace_bytes(tp: int) -> int:
    """getMaxRequiredWorkspaceSize (customAllReduceUtils.h at 005b299bd309), without the deterministic mode."""
    return 16_000_000 if tp <= 2 else 8_000_000


@dataclass(frozen=True)
class FusedAllReduce:
    """An engine's all-reduce of a block's output fused with the residual add and the next norm: how it chooses
    its kernel (``strategy``) and which of the layer's kernels the fused kernel absorbs (by the names
    planner/kernels.py gives them). An engine trait (engines.py ``tp_allreduce_fusion``)."""

    source: str
    # per fused block output: the residual add, and the norm that follows it (the attention block's output feeds
    # the pre-MLP norm, the MLP block's the next layer's input norm)
    absorbed: tuple[tuple[str, str], ...] = (("attn.out_proj", "pre_mlp_norm"), ("mlp.down_proj", "input_norm"))

    # the model's blocks fuse only above this hidden size (modeling_llama.py LlamaDecoderLayer: enable_fusion &=
    # hidden_size > 4096, "Disable fusion for small models due to accuracy issues"; read in two stored versions)
    min_hidden: int = 4097

    def strategy(
        self, tokens: int, hidden: int, tp: int, nbytes: int, sm: int, nvlink_peers: bool, op: str = NORM
    ) -> str:
        """AllreduceOp::selectImplementation with strategy AUTO (allreduceOp.cpp at 01e2c3612da7) for ``op``:
        ``nbytes`` the message, ``nvlink_peers`` whether the TP group shares one NVLink domain."""
        if nbytes > workspace_bytes(tp) or not nvlink_peers:
            return NCCL
        rows = TABLE[op][100 if sm >= 100 else 90].get(tp)
        h, t = int(math.log2(hidden)) - 7, int(math.log2(max(1, tokens)))
        if rows is None or not 0 <= h < len(rows) or t >= len(rows[h]):
            return NCCL  # NCCL_SYMMETRIC: ncclAllReduce, then the fallback kernels
        return _CODES[rows[h][t]]


def nvlink_peers(par: ParallelSpec, cluster: ClusterSpec) -> bool:
    """Whether every TP group of the worker lies in one NVLink domain (a node of the cluster; TP is the innermost
    dimension of the rank grid, so groups align with nodes when tp divides devices_per_node)."""
    intra = cluster.intra
    return (intra.link_name == "nvlink" and intra.fabric != "none" and par.tp <= cluster.devices_per_node
            and cluster.devices_per_node % par.tp == 0)  # fmt: skip


def _block(call: Call) -> str:
    return call.name.removeprefix("tp.").removeprefix("mtp.")


def _kernel(fusion: FusedAllReduce, ctx: Context, row: PricedCall, cluster: ClusterSpec) -> str:
    call, par = row.call, ctx.par
    if call.parallelism != "tp" or call.op != Op.ALLREDUCE or _block(call) not in BLOCK_OUTPUTS or par.tp < 2:
        return ""
    itemsize = DTYPE_BYTES.get(call.dtype, 2)
    hidden = ctx.model.hidden_size
    if hidden < fusion.min_hidden:
        return ""  # no fusion: the model's plain all-reduce, then its add and norm
    tokens = call.message_bytes // (hidden * itemsize)
    sm = cluster.gpu.sm if cluster.gpu is not None else 0  # 0: not an NVIDIA GPU; the SM 90 table
    # per-tensor FP8 linears take the norm's output in fp8 (ModelOpt FP8: is_fp8_quant); block-scaled FP8 does not
    work = ctx.work
    op = NORM_QUANT_FP8 if work.param_dtype == "fp8" and work.fp8_recipe in ("tensorwise", "delayed") else NORM
    return fusion.strategy(tokens, hidden, par.tp, call.message_bytes, sm, nvlink_peers(par, cluster), op)


def _price(row: PricedCall, kind: str, par: ParallelSpec, cluster: ClusterSpec) -> PricedCall:
    """The row priced as the kernel ``kind`` on the same groups (collectives' direct schedules)."""
    call, tp, m = row.call, par.tp, row.call.message_bytes
    wire = replace(call, op=Op.ALLGATHER, message_bytes=tp * m) if kind == ONESHOT else call
    # the row's stages are one class of placements already (plan._price_by_stage): one row back
    priced = price_calls([wire], par, cluster, Options(algorithm="direct", pricing="schedule"))
    p = priced[0].price
    algbw = m / p.time_s / 1e9 if p.time_s else 0.0
    price = replace(p, algorithm=f"trtllm_{kind}", algbw_GBps=algbw, busbw_GBps=algbw * 2 * (tp - 1) / tp)
    return replace(row, price=price, links=priced[0].links)


def fused_step(plan: Plan, fusion: FusedAllReduce, ctx: Context, cluster: ClusterSpec) -> Plan:
    """``plan`` (one prefill pass or decode step) as the engine runs its block all-reduces: every row that ends a
    block carries the engine's op as its source; where the engine picks its one-shot or two-shot kernel the row
    is priced as that kernel and the residual add and norm it absorbs leave the stage's compute (their times are
    planner/kernels.py's own kernels of the layer); where it picks NCCL the row and the kernels stay."""
    rows, stages = [], list(plan.step.stages) if plan.step else []
    comm = [0.0] * len(stages)
    absorbed = [0.0] * len(stages)
    norms = dict(fusion.absorbed)
    kernels: dict[str, float] = {}
    last_norm = -1  # the last stage whose MLP output is fused: its last layer's fusion applies the final norm
    for row in plan.calls:
        kind = _kernel(fusion, ctx, row, cluster)
        if not kind:
            rows.append(row)
            continue
        call = fused(row.call, f"{fusion.source}; strategy {kind.upper()}")
        if kind == NCCL:
            rows.append(replace(row, call=call))
            continue
        new = _price(replace(row, call=call), kind, ctx.par, cluster)
        rows.append(new)
        if not stages:  # no step to change (a cluster without a GPU spec): the rows alone
            continue
        if not kernels:
            kernels = {k.name: k.time_s for k in layer_kernels(ctx, False, cluster.gpu).forward}
        saved = kernels.get("residual_add", 0.0) + kernels.get(norms[_block(call)], 0.0)
        for s in call.stages:
            if s < len(stages):
                comm[s] += call.calls_per_iteration * (new.price.time_s - row.price.time_s)
                absorbed[s] += call.calls_per_iteration * saved
                if norms[_block(call)] == "input_norm":
                    last_norm = max(last_norm, s)
    if plan.step is None or not (any(comm) or any(absorbed)):
        return replace(plan, calls=rows)
    if last_norm >= 0:
        # L fused MLP outputs apply L norms: the next L - 1 layers' input norms and the model's final norm, which
        # the planner does not charge (compute.head_kernels); the first layer's input norm still runs on its own
        absorbed[last_norm] -= kernels.get("input_norm", 0.0)
    return replace(plan, calls=rows, step=_shifted(plan.step, comm, absorbed))


def _shifted(step, comm: list[float], absorbed: list[float]):
    """The step with each stage's exposed TP time moved by ``comm`` and its elementwise compute less ``absorbed``
    (an inference pass runs its stages one after another: step._inference)."""
    stages = []
    for st, dc, da in zip(step.stages, comm, absorbed, strict=True):
        fwd = st.compute.forward
        compute = replace(st.compute, forward=replace(fwd, elementwise_s=max(0.0, fwd.elementwise_s - da)))
        key = ("tp", "forward")
        exposed = {**st.exposed_by_stream, key: st.exposed_by_stream.get(key, 0.0) + dc}
        stages.append(replace(st, compute=compute, fwd_comm_s=st.fwd_comm_s + dc, exposed_by_stream=exposed))
    time_s = step.time_s + sum(comm) - sum(absorbed)
    keep = step.time_s / time_s
    return replace(step, time_s=time_s, compute_s=step.compute_s - sum(absorbed),
                   exposed_comm_s=step.exposed_comm_s + sum(comm), stages=stages, mfu=step.mfu * keep,
                   tokens_per_s=step.tokens_per_s * keep)  # fmt: skip


__all__ = ["NCCL", "ONESHOT", "TABLE", "TWOSHOT", "FusedAllReduce", "fused_step", "nvlink_peers", "workspace_bytes"]
