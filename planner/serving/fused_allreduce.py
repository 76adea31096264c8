"""The serving engines' own tensor-parallel all-reduces, priced as the kernels the engines pick (issue 22;
docs/serving.md, "The engines' all-reduce kernels"). One home for the three engines, each a policy object that is
an engine trait (engines.py ``tp_allreduce``): TensorRT-LLM's fused all-reduce + residual add + RMSNorm
(``FusedAllReduce``, with the kernels it absorbs taken out of the layer's compute) and vLLM's and SGLang's custom
all-reduce with vLLM's torch symmetric-memory path (``CustomAllReduce``). The kernels move their bytes as below and
are priced on the cluster graph by the same function (``_price``).

TensorRT-LLM:

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

vLLM (``CudaCommunicator.all_reduce``, vllm/distributed/device_communicators/cuda_communicator.py at 089eca13b071;
custom_all_reduce.py and all_reduce_utils.py at 00d618aab604; symm_mem.py at 00859a52088e; envs.py
``VLLM_ALLREDUCE_USE_SYMM_MEM`` default 1) tries, for every all-reduce of the TP group (only a group named "tp" gets
the custom all-reduce):

1. the custom all-reduce (``CustomAllreduce.should_custom_ar``): enabled for world sizes 2, 4, 6, 8 inside one node
   (``in_the_same_node_as``), fully NVLink-connected above 2 GPUs; a message of a multiple of 16 bytes under
   ``max_size``: 8 MiB (``8192 * 1024``), or, where the symmetric-memory communicator is up, the smaller of that and
   ``CUSTOM_ALL_REDUCE_MAX_SIZES[capability][tp]`` (SM 9.0: 64 MiB, 32 MiB, 512 KiB, 256 KiB for tp 2, 4, 6, 8;
   SM 10.0: 2, 2, 1, 1 MiB). The kernel (csrc/custom_all_reduce.cuh ``allreduce``): ``cross_device_reduce_1stage``
   (one-shot) at tp 2, and at tp <= 4 under 512 KiB or tp <= 8 under 256 KiB; ``cross_device_reduce_2stage``
   (two-shot) otherwise;
2. torch symmetric memory (``SymmMemCommunicator.should_use_symm_mem``): bf16, a multiple of 4 bytes, at most
   ``SYMM_MEM_ALL_REDUCE_MAX_SIZES[capability][tp]`` (SM 9.0: 64, 32, 64, 64 MiB; SM 10.0: 8, 32, 128, 128 MiB);
   up only where the GPUs have NVLink multicast (``handle.multicast_ptr``: NVSwitch NVLS; the cluster's
   ``in_network_reduction``) and the capability has a table. ``multimem_all_reduce_`` (the switch reduces and
   multicasts, NVLS) at the ``_WORLD_SIZES_MULTIMEM`` (SM 9.0: 4, 6, 8; SM 10.0: 6, 8), ``two_shot_all_reduce_``
   otherwise;
3. pynccl: NCCL's price, the row as the plan has it.

SGLang (``GroupCoordinator.all_reduce`` / ``_resolve_outplace_all_reduce_method``,
python/sglang/srt/distributed/parallel_state.py at 0005973a84f7; custom_all_reduce.py at 004e6561cb8a): the custom
all-reduce first, under the same rules with ``_MAX_CAR_SIZE`` 8 MiB on CUDA and no symmetric-memory cap, the same
kernel choice (sgl-kernel/csrc/allreduce/custom_all_reduce.cuh at 0bb5d5e9fdb0); torch symmetric memory, mscclpp
and the FlashInfer fusion are off by default (``--enable-torch-symm-mem``, ``--enable-mscclpp``,
``--enable-flashinfer-allreduce-fusion``), so NCCL otherwise. Neither engine fuses the residual add and norm into
these kernels on NVIDIA GPUs by default: the layer keeps its kernels.

How the kernels move bytes, priced on the cluster graph by the schedule pricer (collectives "direct" and
"in_network" schedules, the same links, capacities and constants as every other call):

- one-shot (TensorRT-LLM's Lamport kernel; vLLM's 1-stage kernel, which reads every peer's buffer instead of
  writing into it: the same bytes cross the same links): every rank's whole block output (M bytes) reaches every
  peer, each reduces the tp copies locally: (tp - 1) x M bytes out of each rank in one step, the wire traffic of
  a one-step all-gather of tp x M bytes;
- two-shot: reduce-scatter then all-gather over all peers at once: 2 (tp - 1) / tp x M bytes in two steps
  (collectives' "direct" all-reduce);
- multimem (NVLS): each rank's M up to the switch, which reduces and multicasts M back (collectives'
  "in_network" all-reduce).

Eager prefill copies the input into the registered buffer first (vLLM: "<= 1% of overall latency"): not charged.
Multimem pays the in-network schedule's bandwidth (NVLS's 0.60 port efficiency) but one kernel launch's set-up (the
schedule pricer's 6.8 us, as the custom kernels), not NCCL's 20 us NVLS multicast set-up: torch registers its
symmetric buffer once. An assumption: no published torch symm-mem latency was at hand.

Latency: the schedule pricer's own constants (collectives/topology/calibration.py: NCCL's baseLat for one kernel
launch and set-up, 6.8 us, plus 1.8 us per step and the NVLink path latency); no TensorRT-LLM kernel measurement
was at hand to set them apart. Not modelled: the MNNVL strategy (multi-node NVLink, picked only when asked for),
and the fused add + norm kernel ``fallbackRunSubsequentOps`` may use after NCCL (charged as the planner's two
kernels); vLLM's custom all-reduce over two PCIe GPUs (P2P without NVLink: NCCL here); vLLM's NCCL symmetric-memory
path (``VLLM_USE_NCCL_SYMM_MEM``, off by default); ROCm's quick all-reduce.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from collectives import Op
from collectives.topology import ClusterSpec
from collectives.topology.calibration import DEFAULT as SCHEDULE_CONSTANTS

from ..context import Context
from ..kernels import layer_kernels
from ..ledger import Call
from ..parallel import ParallelSpec
from ..plan import Options, Plan, PricedCall, price_calls
from ..rules.engine_step import BLOCK_OUTPUTS, fused
from ..spread import paced_gpu
from ..workload import DTYPE_BYTES

ONESHOT, TWOSHOT, NCCL = "oneshot", "twoshot", "nccl"
# torch symm_mem multimem_all_reduce_ (the NVSwitch reduces and multicasts, NVLS) and two_shot_all_reduce_
MULTIMEM, SYMM_TWOSHOT = "multimem", "symm_twoshot"
KiB, MiB = 1024, 1024 * 1024
# AllReduceFusionOp: the all-reduce + residual + RMSNorm, and the same with the norm's output quantized to fp8 (what
# TensorRT-LLM's Llama runs when its linears are per-tensor FP8: modeling_llama.py post/pre_mlp_fusion_op)
NORM, NORM_QUANT_FP8 = "RESIDUAL_RMS_NORM", "RESIDUAL_RMS_NORM_QUANT_FP8"
# AllReduceFusionOp::NONE: the plain all-reduce of TensorRT-LLM's AllReduce op (AllReduceParams' default fusion_op),
# what Linear's own all_reduce runs (a row-parallel linear whose layer does not fuse) and the vocab-parallel
# embedding's (_torch/modules/embedding.py Embedding.forward: ``output = self.all_reduce(output)``, the AllReduce
# that Linear.__init__ builds with the model's allreduce_strategy, AUTO by default)
NONE = "NONE"
_CODES = {4: ONESHOT, 5: TWOSHOT, 0: NCCL}

# customAllReduceUtils.h at 005b299bd309, AllReduceBestStrategyTableSM90 / SM100, the Fusion=RESIDUAL_RMS_NORM and
# RESIDUAL_RMS_NORM_QUANT_FP8 slices, verbatim but for the encoding: per (op, sm, tp), one "/"-separated row per
# hidden size 128, 256, ..., 8192, one digit per token count 1, 2, 4, ..., 16384 (4 ONESHOT, 5 TWOSHOT, 0 NCCL), the
# trailing NCCL entries left out. The Fusion=NONE slices (fusion index 0) from the same tables as stored in the
# search index's copy of the file (TensorRT-LLM b78a54611b6f; its RESIDUAL_RMS_NORM and _QUANT_FP8 slices equal
# the ones here digit for digit)
_ENCODED = {
    (NONE, 90, 2): "444445555544/4444445444444/4454455545444/444454544444/444445555445/45454444444/4455444444",
    (NONE, 90, 4): "444454454544/44444555554/444454555445/444445545455/44444445455/4445555455/444445455",
    (NONE, 90, 8): "44444444444/444444444455/4444444445555/444444444555/44444445555/4444445555/444445555",
    (NONE, 100, 2): "444444445444/444454444444/44454444444444/4445444444444/444444444444/44444444444/4454444444",
    (NONE, 100, 4): "444444444444/444444444444/444444444444/444444444444/44444444445/4444444445/444444445",
    (NONE, 100, 8): "444444444444/444444444444/44444444444/444444444455/44444444455/4444444455/444444455",
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
    planner/kernels.py gives them). An engine trait (engines.py ``tp_allreduce``)."""

    source: str
    # per fused block output: the residual add, and the norm that follows it (the attention block's output feeds
    # the pre-MLP norm, the MLP block's the next layer's input norm)
    absorbed: tuple[tuple[str, str], ...] = (("attn.out_proj", "pre_mlp_norm"), ("mlp.down_proj", "input_norm"))

    # the model's blocks fuse only above this hidden size (modeling_llama.py LlamaDecoderLayer: enable_fusion &=
    # hidden_size > 4096, "Disable fusion for small models due to accuracy issues"; read in two stored versions)
    min_hidden: int = 4097
    label: str = "trtllm"  # the priced rows' algorithm prefix
    # the TP all-reduces (rules/tensor.py names without "tp.") that run TensorRT-LLM's AllReduce op unfused
    unfused: tuple[str, ...] = ("embedding",)
    unfused_source: str = (
        "TensorRT-LLM 06d0733f4936 tensorrt_llm/_torch/modules/embedding.py Embedding.forward self.all_reduce "
        "(AllReduceFusionOp::NONE, strategy AUTO: allreduceOp.cpp selectImplementation)"
    )
    # a block output of a model at or below 4,096 hidden: the row-parallel linear's own all-reduce
    plain_source: str = (
        "TensorRT-LLM _torch/modules/linear.py Linear.all_reduce (AllReduceFusionOp::NONE, strategy AUTO; "
        "modeling_llama.py: enable_fusion &= hidden_size > 4096)"
    )

    def algorithm(self, kind: str) -> str:
        return f"{self.label}_{kind}"

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

    def fusion_op(self, ctx: Context, call: Call) -> str:
        """The AllReduceFusionOp TensorRT-LLM issues ``call`` with; "" where the call is not one of its AllReduce
        op's: a block output fuses the residual add and the next norm (quantized to fp8 for per-tensor FP8 linears,
        ModelOpt FP8: is_fp8_quant; block-scaled FP8 does not) in a model above ``min_hidden``, and runs plain
        (NONE) below it, as the vocab-parallel embedding's all-reduce always does (``unfused``)."""
        if call.parallelism != "tp" or call.op != Op.ALLREDUCE or ctx.par.tp < 2:
            return ""
        block = _block(call)
        if block in self.unfused:
            return NONE
        if block not in BLOCK_OUTPUTS:
            return ""
        if ctx.model.hidden_size < self.min_hidden:
            return NONE  # no fusion: Linear's own AllReduce, then the layer's add and norm kernels
        work = ctx.work
        return NORM_QUANT_FP8 if work.param_dtype == "fp8" and work.fp8_recipe in ("tensorwise", "delayed") else NORM

    def choose(self, ctx: Context, call: Call, cluster: ClusterSpec) -> str:
        """The kernel TensorRT-LLM runs for ``call``; "" where the call is not one of its AllReduce op's."""
        op = self.fusion_op(ctx, call)
        if not op:
            return ""
        itemsize = DTYPE_BYTES.get(call.dtype, 2)
        hidden = ctx.model.hidden_size
        tokens = call.message_bytes // (hidden * itemsize)
        sm = cluster.gpu.sm if cluster.gpu is not None else 0  # 0: not an NVIDIA GPU; the SM 90 table
        return self.strategy(tokens, hidden, ctx.par.tp, call.message_bytes, sm, nvlink_peers(ctx.par, cluster), op)

    def absorbs(self, ctx: Context, call: Call) -> bool:
        """Whether the kernel that runs ``call`` also runs the residual add and the next norm (a fused op)."""
        return self.fusion_op(ctx, call) in (NORM, NORM_QUANT_FP8)

    def relabel(self, ctx: Context, call: Call, kind: str) -> Call:
        if self.absorbs(ctx, call):
            return fused(call, f"{self.source}; strategy {kind.upper()}")
        where = self.unfused_source if _block(call) in self.unfused else self.plain_source
        return replace(call, source=f"{where}; strategy {kind.upper()}")


def _capability(sm: int) -> str:
    """vLLM's device-capability key ("9.0", "10.0") of the planner's SM number (compute capability x 10)."""
    return f"{sm // 10}.{sm % 10}"


def _table(rows) -> dict[str, dict[int, int]]:
    return {cap: dict(sizes) for cap, sizes in rows}


# vllm/distributed/device_communicators/all_reduce_utils.py at 00d618aab604, as (capability, ((tp, bytes), ...)):
# the custom all-reduce's cap where the symmetric-memory communicator is up, and that communicator's own cap
VLLM_CUSTOM_AR_MAX_WITH_SYMM = (
    ("9.0", ((2, 64 * MiB), (4, 32 * MiB), (6, MiB // 2), (8, MiB // 4))),
    ("10.0", ((2, 2 * MiB), (4, 2 * MiB), (6, 1 * MiB), (8, 1 * MiB))),
    ("10.3", ((2, 4 * MiB), (4, 4 * MiB), (6, 8 * MiB), (8, 4 * MiB))),
)
VLLM_SYMM_MEM_MAX = (
    ("9.0", ((2, 64 * MiB), (4, 32 * MiB), (6, 64 * MiB), (8, 64 * MiB))),
    ("10.0", ((2, 8 * MiB), (4, 32 * MiB), (6, 128 * MiB), (8, 128 * MiB))),
    ("10.3", ((2, 4 * MiB), (4, 32 * MiB), (6, 32 * MiB), (8, 64 * MiB))),
)
# symm_mem.py at 00859a52088e SymmMemCommunicator._WORLD_SIZES_MULTIMEM
VLLM_MULTIMEM_WORLD_SIZES = (("9.0", (4, 6, 8)), ("10.0", (6, 8)), ("10.3", (6, 8)))


@dataclass(frozen=True)
class CustomAllReduce:
    """vLLM's and SGLang's own all-reduce for the TP group (module docstring): the custom one-shot / two-shot kernel
    under a size cap, then (vLLM) torch symmetric memory, then NCCL. Every TP all-reduce takes it, not only the
    block outputs; no kernel of the layer is absorbed. An engine trait (engines.py ``tp_allreduce``)."""

    source: str
    label: str  # the priced rows' algorithm prefix ("vllm", "sglang")
    max_bytes: int = 8192 * 1024  # CustomAllreduce max_size (vLLM) / _MAX_CAR_SIZE (SGLang on CUDA)
    world_sizes: tuple[int, ...] = (2, 4, 6, 8)  # CustomAllreduce._SUPPORTED_WORLD_SIZES
    # where torch symmetric memory is on by default (vLLM): the custom all-reduce's cap then, the symmetric
    # memory's own cap and the world sizes it runs multimem at, per capability (tuples: the trait is hashed)
    custom_max_with_symm: tuple = ()
    symm_mem_max: tuple = ()
    multimem_world_sizes: tuple = ()
    symm_source: str = ""
    absorbed: tuple[tuple[str, str], ...] = ()

    def strategy(self, nbytes: int, tp: int, sm: int, peers: bool, multicast: bool, dtype: str = "bf16") -> str:
        """The kernel for an all-reduce of ``nbytes`` over ``tp`` GPUs of capability ``sm`` (x 10): ``peers``
        whether they are one node's fully NVLink-connected GPUs, ``multicast`` whether that NVLink has multicast."""
        cap = _capability(sm)
        symm = _table(self.symm_mem_max).get(cap, {})
        symm_up = multicast and peers and tp in symm  # SymmMemCommunicator: a table entry and multicast_ptr
        max_size = self.max_bytes
        if symm_up and tp in _table(self.custom_max_with_symm).get(cap, {}):
            max_size = min(_table(self.custom_max_with_symm)[cap][tp], max_size)
        if peers and tp in self.world_sizes and nbytes % 16 == 0 and nbytes < max_size:
            one = tp == 2 or (tp <= 4 and nbytes < 512 * KiB) or (tp <= 8 and nbytes < 256 * KiB)
            return ONESHOT if one else TWOSHOT
        if symm_up and dtype == "bf16" and nbytes % 4 == 0 and nbytes <= symm[tp]:
            return MULTIMEM if tp in dict(self.multimem_world_sizes).get(cap, ()) else SYMM_TWOSHOT
        return NCCL

    def choose(self, ctx: Context, call: Call, cluster: ClusterSpec) -> str:
        """The kernel the engine runs for ``call``; "" where the call is not a TP all-reduce."""
        par = ctx.par
        if call.parallelism != "tp" or call.op != Op.ALLREDUCE or par.tp < 2 or cluster.gpu is None:
            return ""
        peers = nvlink_peers(par, cluster) and (par.tp == 2 or cluster.intra.fabric in ("switch", "full_mesh"))
        multicast = cluster.intra.in_network_reduction and cluster.intra.fabric == "switch"
        return self.strategy(call.message_bytes, par.tp, cluster.gpu.sm, peers, multicast, call.dtype)

    def algorithm(self, kind: str) -> str:
        if kind in (MULTIMEM, SYMM_TWOSHOT):
            return f"{self.label}_symm_mem_{kind.removeprefix('symm_')}"
        return f"{self.label}_custom_{kind}"

    def absorbs(self, ctx: Context, call: Call) -> bool:
        return False  # the layer keeps its add and norm kernels

    def relabel(self, ctx: Context, call: Call, kind: str) -> Call:
        where = self.symm_source if kind in (MULTIMEM, SYMM_TWOSHOT) else self.source
        return replace(call, source=f"{where}; {kind.upper()}")


def nvlink_peers(par: ParallelSpec, cluster: ClusterSpec) -> bool:
    """Whether every TP group of the worker lies in one NVLink domain (a node of the cluster; TP is the innermost
    dimension of the rank grid, so groups align with nodes when tp divides devices_per_node)."""
    intra = cluster.intra
    return (intra.link_name == "nvlink" and intra.fabric != "none" and par.tp <= cluster.devices_per_node
            and cluster.devices_per_node % par.tp == 0)  # fmt: skip


def _block(call: Call) -> str:
    return call.name.removeprefix("tp.").removeprefix("mtp.")


def _price(row: PricedCall, kind: str, algorithm: str, par: ParallelSpec, cluster: ClusterSpec) -> PricedCall:
    """The row priced as the kernel ``kind`` on the same groups (collectives' direct and in-network schedules)."""
    call, tp, m = row.call, par.tp, row.call.message_bytes
    wire = replace(call, op=Op.ALLGATHER, message_bytes=tp * m) if kind == ONESHOT else call
    schedule = "in_network" if kind == MULTIMEM else "direct"
    # the row's stages are one class of placements already (plan._price_by_stage): one row back
    priced = price_calls([wire], par, cluster, Options(algorithm=schedule, pricing="schedule"))
    p = priced[0].price
    if kind == MULTIMEM:
        # the in-network schedule's set-up latency is NCCL's NVLS floor (multicast set-up per call); torch's multimem
        # kernel runs on a buffer registered once, so it pays one kernel's launch like the custom kernels
        p = replace(p, time_s=p.time_s - SCHEDULE_CONSTANTS.base_latency("in_network")
                    + SCHEDULE_CONSTANTS.base_latency("direct"))  # fmt: skip
    algbw = m / p.time_s / 1e9 if p.time_s else 0.0
    price = replace(p, algorithm=algorithm, algbw_GBps=algbw, busbw_GBps=algbw * 2 * (tp - 1) / tp)
    return replace(row, price=price, links=priced[0].links)


AllReducePolicy = FusedAllReduce | CustomAllReduce


def engine_allreduce_step(plan: Plan, policy: AllReducePolicy, ctx: Context, cluster: ClusterSpec) -> Plan:
    """``plan`` (one prefill pass or decode step) with its TP all-reduces as the engine runs them: every row the
    policy takes carries the engine's op as its source; where the engine picks one of its own kernels the row is
    priced as that kernel and, for a fused kernel, the residual add and norm it absorbs leave the stage's compute
    (their times are planner/kernels.py's own kernels of the layer); where it picks NCCL the row and the kernels
    stay."""
    rows, stages = [], list(plan.step.stages) if plan.step else []
    comm = [0.0] * len(stages)
    absorbed = [0.0] * len(stages)
    norms = dict(policy.absorbed)
    kernels: dict[str, float] = {}
    for row in plan.calls:
        kind = policy.choose(ctx, row.call, cluster)
        if not kind:
            rows.append(row)
            continue
        absorbs = policy.absorbs(ctx, row.call)
        call = policy.relabel(ctx, row.call, kind)
        if kind == NCCL:
            rows.append(replace(row, call=call))
            continue
        new = _price(replace(row, call=call), kind, policy.algorithm(kind), ctx.par, cluster)
        rows.append(new)
        if not stages:  # no step to change (a cluster without a GPU spec): the rows alone
            continue
        norm = norms.get(_block(call)) if absorbs else None
        if norm and not kernels:
            # on the part the step's kernels were timed on (the slowest GPU, planner/spread.py), so no time is left
            # behind; HBM-bound, the pace does not move them, so StepTime.spread_s keeps its value
            kernels = {k.name: k.time_s for k in layer_kernels(ctx, False, paced_gpu(ctx, cluster.gpu)).forward}
        saved = kernels.get("residual_add", 0.0) + kernels.get(norm, 0.0) if norm else 0.0
        # L fused MLP outputs apply L norms: the next L - 1 layers' input norms and the model's final norm, which
        # the planner charges as an input norm (kernels.final_norm_kernels, the same kernel over the same rows)
        _charge(call, new.price.time_s - row.price.time_s, saved, comm, absorbed)
    if plan.step is None or not (any(comm) or any(absorbed)):
        return replace(plan, calls=rows)
    return replace(plan, calls=rows, step=_shifted(plan.step, comm, absorbed))


def _charge(call, extra_s: float, saved_s: float, comm: list[float], absorbed: list[float]) -> int:
    """Adds one row's extra TP time and the compute its fusion absorbs to each stage it runs on (per call of the
    iteration); returns the last such stage (-1: none)."""
    last = -1
    for s in call.stages:
        if s < len(comm):
            comm[s] += call.calls_per_iteration * extra_s
            absorbed[s] += call.calls_per_iteration * saved_s
            last = max(last, s)
    return last


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


__all__ = [
    "MULTIMEM",
    "NCCL",
    "NONE",
    "NORM",
    "NORM_QUANT_FP8",
    "ONESHOT",
    "SYMM_TWOSHOT",
    "TABLE",
    "TWOSHOT",
    "AllReducePolicy",
    "CustomAllReduce",
    "FusedAllReduce",
    "engine_allreduce_step",
    "nvlink_peers",
    "workspace_bytes",
]
