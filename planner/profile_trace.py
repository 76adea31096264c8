"""A torch.profiler trace read as the kernels the planner models: classified, with their shapes where recorded.

The input is the Chrome-trace JSON ``torch.profiler`` exports (``prof.export_chrome_trace`` or the
``tensorboard_trace_handler`` file): ``{"traceEvents": [...], "deviceProperties": [...], "distributedInfo": ...}``
(PyTorch's Kineto writer, pytorch/kineto ``libkineto/src/output_json.cpp``). The events read here:

- ``ph: "X", cat: "kernel"``: a GPU kernel, ``ts``/``dur`` in microseconds, ``args.correlation`` naming the
  launch on the host thread that issued it: ``cat: "cuda_runtime"`` (``cudaLaunchKernel``) or ``cat:
  "cuda_driver"`` (``cuLaunchKernelEx``: cuBLAS 12.8+'s nvjet GEMMs and cuDNN's kernels on PyTorch 2.11, the H200
  trace in tests/reference/kernels/h200); ``cat: "gpu_memcpy"`` / ``"gpu_memset"``: copies and memsets the GPU ran
  (class ``copy``);
- ``cat: "cpu_op"``: the aten operator running on a host thread, with ``args["Input Dims"]`` and
  ``args["Input type"]`` when the profiler ran with ``record_shapes=True``. A kernel belongs to the innermost
  operator whose interval holds its launch on the same thread (HTA's and TensorBoard's rule; ``External id``
  links the same pair in newer traces, but older ones reuse the correlation id there);
- NCCL kernels: since PyTorch 2.1 Kineto copies the ``record_param_comms`` operator's metadata onto the kernel:
  ``"Collective name"``, ``"dtype"``, ``"In msg nelems"``, ``"Out msg nelems"``, ``"Group size"``
  (output_json.cpp ``kCollectiveName``...); older traces have the kernel name alone (counts and times only);
- the host's launch calls (``cudaLaunchKernel``, ``cudaLaunchKernelExC``, ``cuLaunchKernel(Ex)``: ``LAUNCH_CALL``) with
  their kernel's start on the GPU, and the calls that wait for the GPU (``WAIT_CALL``): ``Trace.launches``, from
  which planner/trace_fit.py reads the host's time per launch;
- ``cat: "user_annotation"`` named ``ProfilerStep#N``: one per profiled step (``prof.step()`` under
  ``torch.profiler.schedule``). A trace without them (a ``with profile(...)`` block around a loop) holds as many
  steps as its kernel sequence repeats (``repeats``), or one.

Kernel classes go by name (``KERNEL_CLASSES``), then by the operator that launched them (``OP_CLASSES``: cuDNN's
attention helper kernels, ``_grouped_mm``'s CUTLASS kernel); what neither names is ``other``, counted and reported
by name (trace_fit.unclassified). GEMM shapes (M, N, K, groups) by the aten operator's input dims
(``GEMM_OPERANDS``, ``aten::_grouped_mm`` by ``grouped_shape``), attention shapes by ``ATTENTION_OPS``. Nothing here
knows HTTP; the fit and the ledger comparison are ``planner/trace_fit.py``.
"""

from __future__ import annotations

import bisect
import json
import math
import re
import sys
import zlib
from dataclasses import dataclass
from functools import lru_cache

from collectives.primitives import Op

from ._errors import SpecError, got
from .words import human_bytes

MAX_EVENTS = 2_000_000  # a few steps of a large model: ~0.2-1M events (HTA's test traces: 2k-300k)
MAX_BYTES = 1 << 30  # a gzipped trace unpacks to at most this

# Kernel classes by name, first match wins (the names as CUDA, cuBLAS, CUTLASS, cuDNN, NCCL/RCCL, ROCm's libraries
# and the attention libraries print them in a trace):
# - nccl: ncclKernel_<Op>_<Algo>_<Proto>_<Red>_<type> (NCCL <= 2.18), ncclDevKernel_<Op>... (2.19+: src/device/
#   generate.py; ncclDevKernel_Generic runs any op: the op comes from Kineto's "Collective name"); the symmetric-
#   memory kernels NCCL runs on buffers registered symmetric (torch's NCCL symmetric memory, Megatron's nccl_ub),
#   ncclSymDevKernel_<Op>_<algo>[_<red>_<type>] (NCCL 2.27, src/device/symmetric/generate.py:
#   ncclSymDevKernel_AllReduce_RSxLD_AGxST_sum_bf16(ncclSymDevArgs)) and ncclSymkDevKernel_<Op>_... (2.28:
#   ncclSymkDevKernel_ReduceScatter_LL_sum_f32(ncclSymkDevWorkArgs4K)), the op after the prefix as before; RCCL,
#   ROCm's port, keeps NCCL's names;
# - memory, first: Inductor's pointwise and reduction kernels, triton_<poi|red|per>_fused_<ops>_<n> (torch/_inductor/
#   codegen/triton.py define_kernel, below under gemm), memory-bound whatever ops they fuse: a conv's bias add
#   (triton_poi_fused_convolution_relu_0) is no convolution;
# - attention: FlashAttention (flash_fwd_kernel, flash::...), cuDNN/TRT fused attention (fmha, sdpa), PyTorch's
#   memory-efficient kernel (fmha_cutlassF/B, mem_efficient), ROCm's CK/aiter fmha;
# - conv: cuDNN's and MIOpen's convolutions, which the planner does not model (a transformer has none): cuDNN's
#   precompiled engines <arch>_<s|h|i>cudnn_* (volta_scudnn_128x64_relu_medium_nn_v1, cudnn_infer_ampere_scudnn_...),
#   implicit/explicit_convolve_sgemm, its dgrad/wgrad engines (dgrad_engine, dgrad2d_alg*, wgrad_alg0_engine),
#   Winograd and FFT convolutions (fft2d_r2c_32x32...), the xmma fprop/dgrad/wgrad implicit GEMMs
#   (sm80_xmma_fprop_implicit_gemm_...), cask_cudnn's helpers and cuDNN's bundled CUTLASS (namespaces
#   cutlass_cudnn_infer/_train: its fprop/dgrad/wgrad engines); CUTLASS's (cutlass::conv::kernel::...), PyTorch's
#   depthwise ones (conv_depthwise2d_*), MIOpen's (MIOpenConv*, MIOpenGroupConv*, miopenSp3AsmConv*, naive_conv_*;
#   its other kernels, src/kernels/MIOpenBatchNorm*.cl, MIOpenPooling*.cl, MIOpenSoftmax.cl, gcnAsmBN*, are memory,
#   below). Before gemm: their
#   names say gemm but no aten GEMM launched them (aten::cudnn_convolution, aten::convolution);
# - gemm: cuBLAS (ampere_sgemm_*, sm90_xmma_gemm_*, nvjet_* since cuBLAS 12.8, gemv*, splitKreduce: the split-K
#   reduction cuBLAS adds to one GEMM), CUTLASS (cutlass::Kernel, cutlass_80_tensorop_*gemm), DeepGEMM; ROCm's
#   Tensile kernels (rocBLAS and hipBLASLt: Cijk_Ailk_Bljk_..., Tensile's contraction naming C[ijk] = A[ilk] B[jlk],
#   the MI250 trace in tests/reference/traces); Inductor's Triton templates (triton_tem_<fused ops>_<n>: Inductor
#   names a kernel triton_ + the first 3 letters of its category, poi(ntwise), red(uction), per(sistent_reduction),
#   tem(plate), for(each): torch/_inductor/codegen/triton.py define_kernel; a template is a matmul (mm, addmm, bmm)
#   unless it names attention (flex attention, above) or a convolution (conv, above)); not fbgemm_gpu's embedding and
#   permute kernels (a library name, no GEMM);
# - memory: PyTorch's elementwise/reduce/copy kernels, norms, softmax, Triton (Inductor's fused pointwise), the
#   optimizer's multi_tensor_apply; cuDNN's ops library (namespace cudnn::ops: tensor transforms nchwToNhwc, pooling,
#   softmax, activations; cuDNN 8 API reference, "cudnn_ops_infer"), its layout transforms under any namespace (cuDNN
#   7 named them nchwToNhwcKernel at the top level: Kineto's 2021 ResNet-50 sample) and its batch norms
#   (cudnn::bn_fw_*, bn_bw_*);
#   then any other kernel of PyTorch's own (namespace at::native, aten/src/ATen/native/cuda: pooling, dropout,
#   embedding, losses), which do no matrix product: aten sends those to cuBLAS, cuDNN or CUTLASS; and the legacy
#   THCUNN kernels of PyTorch <= 1.10 (aten/src/THCUNN: cunn_ClassNLLCriterion_*, cunn_SoftMaxForward...); and
#   Transformer Engine's own kernels (namespace transformer_engine: cast, transpose, normalization, activation,
#   softmax, RoPE, MoE permutation; its GEMMs run cuBLASLt, transformer_engine/common/gemm/cublaslt_gemm.cu, and its
#   fused attention cuDNN's, both named above); and MIOpen's kernels that are no convolution (batch norm, pooling,
#   softmax, LRN, activations, tensor ops: MIOpen* and the assembly batch norms miopenGcnAsmBN*);
# - other: the rest (fbgemm_gpu's embedding kernels, DeepEP, a sleep...).
KERNEL_CLASSES = (
    ("nccl", re.compile(r"^(?:void )?nccl(?:Symk?)?(?:Dev)?Kernel_", re.I)),
    ("memory", re.compile(r"^triton_(?:poi|red|per)_")),
    ("attention", re.compile(r"flash|fmha|sdpa|attention|mem_eff", re.I)),
    (
        "conv",
        re.compile(
            r"[shi]cudnn_|convolve_[sh]gemm|dgrad_engine|dgrad2d|wgrad_alg|xmma_(?:fprop|dgrad|wgrad)|winograd|fft\dd_"
            r"|cask_cudnn|cutlass_cudnn|conv::kernel|conv_depthwise|conv[23]d|convolution|miopen\w*conv|naive_conv",
            re.I,
        ),
    ),
    ("gemm", re.compile(r"(?<!fb)gemm|gemv|cutlass|xmma|nvjet|cublas|splitKreduce|wgmma|^Cijk_|^triton_tem_", re.I)),
    ("memory", re.compile(r"elementwise|reduce_kernel|copy|norm|softmax|triton|multi_tensor_apply|fill|cat", re.I)),
    # the data-movement kernels of routing and indexing (bytes, no FLOPs): CUB's radix sort and scan, gathers and
    # scatters, index_put's indexing_backward_kernel, top-k, histograms (bincount), and the norms' weight-gradient
    # reduction (GammaBetaBackward): the MoE layer's router and dispatch in the H200 trace
    ("memory", re.compile(r"gather|scatter|index|radix|sort|scan|topk|histogram|gammabeta|arange", re.I)),
    ("memory", re.compile(r"cudnn::ops::|nchwToNhwc|nhwcToNchw|cudnn::bn_[fb]w|\bat::native::|^(?:void )?cunn_")),
    ("memory", re.compile(r"^MIOpen|^miopenGcnAsmBN")),
    ("memory", re.compile(r"\btransformer_engine::")),
)
# Kernels whose own name says nothing (cuDNN's SDPA backward helpers compute_dot_do_o and convert_dq_to_16bits;
# torch._grouped_mm's prepare_grouped_gemm_data) take the class of the aten operator that launched them.
OP_CLASSES = (
    ("attention", re.compile(r"^aten::_(?:scaled_dot_product_)?(?:cudnn|flash|efficient)_attention")),
    ("gemm", re.compile(r"^aten::_(?:scaled_)?grouped_mm$")),
    ("conv", re.compile(r"^aten::(?:cudnn_|miopen_|mkldnn_|_slow_|_)?conv(?:olution|_depthwise|\dd)")),
)
# A kernel named as a GEMM that a convolution operator launched is the convolution's: cuDNN's FFT convolutions run
# complex GEMMs (ampere_gcgemm_*) and split-K reductions, PyTorch's slow convolution im2col + a cuBLAS GEMM
# (_kernels).
# The fused attention operators that launch the kernels, from their aten schemas (native_functions.yaml, PyTorch
# 2.11): op -> (the planner's kernel name (kernels.ATTENTION_CEILING), backward, index of the query in the
# operands, query layout, index of is_causal among the arguments (the trace's "Concrete Inputs")).
# _cudnn_attention_forward(query, key, value, attn_bias, cum_seq_q, cum_seq_k, max_q, max_k, compute_log_sumexp,
# dropout_p, is_causal, ...) takes (B, H, S, D) as SDPA does; _cudnn_attention_backward(grad_out, query, key,
# value, out, logsumexp, philox_seed, philox_offset, attn_bias, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p,
# is_causal, ...); _flash_attention_forward(query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p,
# is_causal, ...) and _flash_attention_backward(grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k,
# max_q, max_k, dropout_p, is_causal, ...) take (B, S, H, D): SDPA transposes before calling them
# (aten/src/ATen/native/transformers/cuda/attention.cu).
ATTENTION_OPS = {
    "aten::_cudnn_attention_forward": ("cudnn", False, 0, "bhsd", 10),
    "aten::_cudnn_attention_backward": ("cudnn", True, 1, "bhsd", 14),
    "aten::_flash_attention_forward": ("flash2", False, 0, "bshd", 8),
    "aten::_flash_attention_backward": ("flash2", True, 1, "bshd", 11),
}
NCCL_OPS = {
    "AllReduce": Op.ALLREDUCE,
    "AllGather": Op.ALLGATHER,
    "ReduceScatter": Op.REDUCESCATTER,
    "Broadcast": Op.BROADCAST,
    "Reduce": Op.REDUCE,
    "SendRecv": Op.SENDRECV,
    "AllToAll": Op.ALLTOALL,
}
_NCCL_NAME = re.compile(r"nccl(?:Symk?)?(?:Dev)?Kernel_([A-Za-z]+)")
# c10d's collective names (record_param_comms "Collective name": ProcessGroupNCCL.cpp) -> op, first match wins:
# all_to_all(v)/alltoall_base is the ncclSend/ncclRecv group NCCL runs as SendRecv kernels
COLLECTIVE_NAMES = (
    ("all_to_all", Op.ALLTOALL),
    ("alltoall", Op.ALLTOALL),
    ("reduce_scatter", Op.REDUCESCATTER),
    ("allgather", Op.ALLGATHER),
    ("all_gather", Op.ALLGATHER),
    ("allreduce", Op.ALLREDUCE),
    ("all_reduce", Op.ALLREDUCE),
    ("broadcast", Op.BROADCAST),
    ("send", Op.SENDRECV),
    ("recv", Op.SENDRECV),
    ("reduce", Op.REDUCE),
)
# c10::toString(ScalarType) -> bytes (the "dtype" of a collective; "Input type" of an operator says "float",
# "c10::BFloat16"...: the same names, lower case, with or without the namespace)
DTYPE_BYTES = {
    "float": 4, "double": 8, "half": 2, "bfloat16": 2, "int": 4, "long": 8, "short": 2, "byte": 1, "char": 1,
    "bool": 1, "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1,
}  # fmt: skip
# aten GEMM operators and where their operands sit in "Input Dims" (the aten schemas, native_functions.yaml):
# mm(self[M,K], mat2[K,N]); addmm(bias, mat1[M,K], mat2[K,N]); bmm(self[B,M,K], mat2[B,K,N]); baddbmm(bias,
# batch1, batch2); linear(input[..., K], weight[N, K], bias); matmul(a[..., K], b[K, N]) reduces to mm.
GEMM_OPERANDS = {
    "aten::mm": (0, 1, False),
    "aten::addmm": (1, 2, False),
    "aten::bmm": (0, 1, False),
    "aten::baddbmm": (1, 2, False),
    "aten::matmul": (0, 1, False),
    "aten::linear": (0, 1, True),  # weight is (N, K)
    "aten::_scaled_mm": (0, 1, False),
}
# Elementwise aten operators whose single kernel's HBM bytes are its tensors' (inputs read, the broadcast output
# written): the points the HBM fraction and the per-kernel cost are fitted on.
ELEMENTWISE_OPS = frozenset(
    "aten::" + name
    for name in (
        "add",
        "add_",
        "mul",
        "mul_",
        "sub",
        "sub_",
        "div",
        "div_",
        "neg",
        "exp",
        "relu",
        "relu_",
        "gelu",
        "silu",
        "sigmoid",
        "tanh",
        "threshold_backward",
        "gelu_backward",
        "silu_backward",
        "sigmoid_backward",
        "copy_",
        "fill_",
        "zero_",
        "clamp",
        "where",
        "pow",
        "sqrt",
        "rsqrt",
        "addcmul_",
        "addcdiv_",
        "lerp_",
    )
)
WRITE_ONLY_SELF = frozenset(("aten::copy_", "aten::fill_", "aten::zero_"))  # self is written, not read
# The host calls that launch one kernel (CUDA runtime API and driver API names as CUPTI reports them, with the
# versioned or per-thread-stream suffixes some builds print: cudaLaunchKernel_v7000, cudaLaunchKernel_ptsz). A
# CUDA graph's launch (cudaGraphLaunch) is one call for many kernels, and a memset or copy is no kernel launch:
# neither is one (their host time falls in the gaps between launches, as in bench/measure_megatron_moe.py's count).
LAUNCH_CALL = re.compile(
    r"^cu(?:da)?Launch(?:Cooperative)?Kernel(?:ExC?)?(?:_v\d+)?(?:_ptsz)?$"
    # ROCm's HIP runtime (hip_runtime_api.h, ROCm 6.2; Kineto's roctracer reports them under cuda_runtime):
    # hipLaunchKernel for PyTorch's kernels, hipExtModuleLaunchKernel for Tensile's GEMMs (the MI250 trace)
    r"|^hip(?:Ext)?(?:Module)?Launch(?:Cooperative)?Kernel(?:GGL)?$"
)
# The host calls that may wait for the GPU: the synchronisations, and the copies (a device-to-host copy into
# pageable memory returns when the copy is done: CUDA Runtime API, "API synchronization behavior"); a trace does
# not say which copies waited, so each is taken as one. HIP's calls of the same names (hipDeviceSynchronize,
# hipMemcpyWithStream) likewise.
WAIT_CALL = re.compile(r"^(?:cu(?:da)?|hip)(?:(?:Stream|Event|Device|Ctx)Synchronize|Memcpy(?!.*Peer))")


@dataclass(frozen=True)
class TraceKernel:
    """One GPU kernel of the trace: its class, time, and what the host operator around its launch says."""

    name: str
    kind: str  # gemm | attention | conv | nccl | memory | copy | other
    dur_s: float
    op_index: int = -1  # the innermost host operator (TraceOp) around its launch; -1: none found
    collective: str = ""  # nccl: the Op value
    message_bytes: int | None = None  # nccl: nccl-tests' message size, when the trace records the nelems
    group_size: int | None = None


@dataclass(frozen=True)
class TraceOp:
    """A host operator that launched kernels: its name and recorded input dims, types and scalar arguments
    (record_shapes: "Input Dims", "Input type", "Concrete Inputs")."""

    name: str
    dims: tuple = ()
    types: tuple = ()
    concrete: tuple = ()


@dataclass(frozen=True)
class HostLaunch:
    """One kernel launch call (LAUNCH_CALL) on a host thread, and when its kernel started on the GPU; seconds on
    the trace's clock (Kineto puts the host's and the GPU's events on one)."""

    thread: tuple  # (pid, tid) of the launching thread
    start_s: float  # the call's start
    end_s: float  # the call's return
    kernel_start_s: float  # its kernel's start on the GPU
    after_wait: bool  # a call of this thread that may wait for the GPU (WAIT_CALL) since its previous launch


@dataclass(frozen=True)
class Trace:
    kernels: tuple[TraceKernel, ...]
    ops: tuple[TraceOp, ...]
    device: str  # deviceProperties[0].name, "" when absent
    sms: int  # deviceProperties numSms, 0 when absent
    compute_capability: int  # major*10 + minor, 0 when absent
    steps: int  # ProfilerStep annotations, else how often the kernel sequence repeats (1 when it does not)
    rank: int | None
    world_size: int | None
    events: int
    record_shapes: bool  # any operator carries Input Dims
    steps_from: str = "ProfilerStep"  # ProfilerStep | repeats | none (one step assumed)
    launches: tuple[HostLaunch, ...] = ()  # the kernel launches, by their calls' start


def _first_class(table, text: str) -> str:
    """The kind of the first (kind, pattern) row of ``table`` whose pattern is found in ``text``, else "other"."""
    return next((kind for kind, pattern in table if pattern.search(text)), "other")


@lru_cache(maxsize=8192)
def kernel_class(name: str) -> str:
    """A kernel's class by its name (memoised: a trace repeats a few hundred names)."""
    return _first_class(KERNEL_CLASSES, name)


@lru_cache(maxsize=1024)
def op_class(op: str) -> str:
    """The class of a kernel whose name says nothing, by the operator that launched it (OP_CLASSES)."""
    return _first_class(OP_CLASSES, op)


def collective_of(name: str, args: dict) -> str:
    """The op of an NCCL kernel: from Kineto's "Collective name" when present, else from the kernel's name."""
    given = str(args.get("Collective name") or "").lower()
    for key, op in COLLECTIVE_NAMES:
        if key in given:
            return op.value
    found = _NCCL_NAME.search(name)
    if found and found.group(1) in NCCL_OPS:
        return NCCL_OPS[found.group(1)].value
    return "unknown"


def dtype_bytes(name: str) -> int | None:
    return DTYPE_BYTES.get(str(name).lower().removeprefix("c10::").strip('"'))


def message_bytes(op: str, args: dict) -> int | None:
    """nccl-tests' message size (DESIGN.md §3) from the kernel's recorded element counts and dtype: the input
    for allreduce, reducescatter, alltoall, broadcast, reduce; the gathered output for allgather; sendrecv the
    larger (a send records its input, a recv its output)."""
    size = dtype_bytes(args.get("dtype", ""))
    n_in, n_out = _count(args.get("In msg nelems")), _count(args.get("Out msg nelems"))
    if size is None or (n_in is None and n_out is None):
        return None
    if op == Op.ALLGATHER.value:
        n = n_out if n_out is not None else None
    elif op == Op.SENDRECV.value:
        n = max(x for x in (n_in, n_out) if x is not None)
    else:
        n = n_in if n_in is not None else n_out
    return None if n is None else n * size


def _count(value) -> int | None:
    try:
        n = int(value)
    except (TypeError, ValueError):
        return None
    return n if n >= 0 else None


# torch.distributed's rank and world size are C ints (c10d Backend.hpp / ProcessGroup.hpp `const int rank_; const
# int size_;`, torch 2.x): a world past 2^31 - 1 is no trace torch wrote
MAX_WORLD = 2**31 - 1
# an NCCL kernel's element counts are tensors' numel, int64_t (torch 2.x ProcessGroupNCCL.cpp RECORD_PARAM_COMMS_DATA
# ``inputTensor.numel()`` into ParamCommsDebugInfo's ``int64_t inMessageNelems_`` / ``outMessageNelems_``, which
# Kineto writes as "In msg nelems" / "Out msg nelems"; "Group size" its ``int worldSize_``, c10d's int)
MAX_NELEMS = 2**63 - 1
NCCL_COUNT_ARGS = {"Group size": (1, MAX_WORLD), "In msg nelems": (0, MAX_NELEMS), "Out msg nelems": (0, MAX_NELEMS)}


def _check_nccl_counts(i: int, args: dict) -> None:
    """A GPU kernel's recorded NCCL counts, where given as numbers, inside NCCL_COUNT_ARGS' ranges: a 422 naming the
    event otherwise (a 401-digit "In msg nelems" overflowed the bandwidth's float, a group of 0 or 10^30 was
    answered back: r14b). A count that is not a number is left unread, as message_bytes leaves it."""
    for key, (low, high) in NCCL_COUNT_ARGS.items():
        value = args.get(key)
        if type(value) in (int, float) and not low <= value <= high:
            raise SpecError(
                f"trace.traceEvents[{i}].args",
                f"{key!r} is a {'group size' if low else 'tensor numel'} of {low} to {high:,} (torch's "
                f"ParamCommsDebugInfo), got {got(value)}",
            )


def _distributed(info) -> tuple[int | None, int | None]:
    """The trace's rank and world size (torch.profiler's distributedInfo, from torch.distributed: integers, 0 <=
    rank < world_size), each None where absent. They place the trace on a pipeline stage (trace_fit.trace_stage);
    a rank of 5 in a world of 2, or a rank of 1.5, placed it silently (clamped, truncated) before hostile11: now a
    422 naming them."""
    if not isinstance(info, dict):
        return None, None
    rank, world = info.get("rank"), info.get("world_size")
    given = f"got rank {got(rank)}, world_size {got(world)}"
    if any(v is not None and type(v) is not int for v in (rank, world)):
        raise SpecError("trace.distributedInfo", f"rank and world_size are integers, {given}")
    if (rank is not None and rank < 0) or (world is not None and world < 1):
        raise SpecError("trace.distributedInfo", f"needs rank >= 0 and world_size >= 1, {given}")
    if world is not None and world > MAX_WORLD:  # a 401-digit world_size was answered back as it was (hostile13)
        raise SpecError("trace.distributedInfo", f"world_size is at most {MAX_WORLD:,} (c10d's int), {given}")
    if rank is not None and world is not None and rank >= world:
        raise SpecError("trace.distributedInfo", f"rank {rank} is not below world_size {world}")
    return rank, world


# ---- parsing ------------------------------------------------------------------------------------------------

_SURROGATE = re.compile("[\ud800-\udfff]")


def _text(value, where: str) -> str:
    """A name the answer may show (a kernel's or an operator's, the device's): Unicode text. JSON's "\\ud800"
    escape gives a lone surrogate, which no UTF-8 answer can hold (it was a 500 when the name was answered among the
    unclassified kernels; round 13, hostile13); torch.profiler writes UTF-8, so it is a 422 naming the event."""
    text = str(value)
    if not text.isascii() and (m := _SURROGATE.search(text)):
        raise SpecError(where, f"a lone surrogate (U+{ord(m.group()):04X} at character {m.start() + 1}) is not text")
    return text


def load_trace(data, max_events: int = MAX_EVENTS, max_bytes: int = MAX_BYTES) -> Trace:
    """The trace of ``data`` (the parsed JSON, its text, or the bytes of the file, gzipped or not). A malformed
    or truncated trace is a SpecError naming what is wrong (field ``trace``)."""
    if isinstance(data, bytes) and data[:2] == b"\x1f\x8b":
        data = gunzip(data, max_bytes)
    if isinstance(data, (str, bytes)):
        text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
        try:
            data = json.loads(text)
        except RecursionError:
            raise SpecError("trace", "JSON nested deeper than Python's parser goes: not a profiler trace") from None
        except json.JSONDecodeError as err:
            end = " (the text ends there: a truncated file?)" if err.pos >= len(text.rstrip()) - 1 else ""
            raise SpecError(
                "trace", f"not JSON: {err.msg} at line {err.lineno:,} column {err.colno:,} of {len(text):,} chars{end}"
            ) from None
        except ValueError:  # CPython's int_max_str_digits (4,300 by default): no profiler writes such a number
            digits = f"{sys.get_int_max_str_digits():,}"
            raise SpecError("trace", f"a number of more than {digits} digits: not a profiler trace") from None
    if isinstance(data, list):  # the Chrome trace's array form
        data = {"traceEvents": data}
    if not isinstance(data, dict):
        raise SpecError("trace", f"a Chrome trace is an object with traceEvents or an array; got {type(data).__name__}")
    events = data.get("traceEvents")
    if not isinstance(events, list):
        keys = ", ".join(str(k)[:40] for k in list(data)[:6]) + (", ..." if len(data) > 6 else "")
        other = keys and "traceEvents" not in data  # a PyTorch execution trace (nodes), a Chakra graph (workload_graph)
        held = f"; the object's keys are {keys}: an execution trace or a Chakra graph is not one" if other else ""
        raise SpecError(
            "trace.traceEvents", f"missing or not a list: torch.profiler's export_chrome_trace writes one{held}"
        )
    if len(events) > max_events:
        raise SpecError("trace.traceEvents", f"{len(events):,} events is more than the limit of {max_events:,}")
    return _read(data, events)


def gunzip(data: bytes, max_bytes: int = MAX_BYTES) -> bytes:
    """A gzip file's content, at most ``max_bytes`` of it (a small file may unpack to a great deal)."""
    unpack = zlib.decompressobj(wbits=31)
    try:
        out = unpack.decompress(data, max_bytes + 1)
    except zlib.error as err:
        raise SpecError("trace", f"not a readable gzip file: {err}") from None
    if len(out) > max_bytes:
        raise SpecError(
            "trace", f"the gzipped trace unpacks to more than {max_bytes:,} bytes ({human_bytes(max_bytes)}, the limit)"
        )
    if not unpack.eof:
        raise SpecError("trace", f"the gzip stream ends early after {len(data):,} bytes (a truncated file?)")
    return out


def _read(data: dict, events: list) -> Trace:
    kernels, ops, launches, steps, calls = _scan(events)
    if not any(cat == "kernel" for *_, cat in kernels):
        raise SpecError("trace", _no_kernels(events, len(ops)))
    kernels.sort(key=lambda k: k[1])  # by start on the GPU (Kineto writes them by stream and buffer)
    table, out = _kernels(kernels, ops, _enclosing_ops(ops, launches))
    count, steps_from = len(steps), "ProfilerStep"
    if not count:
        count = repeats([k.name for k in out if k.kind != "copy"])
        steps_from = "repeats" if count > 1 else "none"
    props = data.get("deviceProperties")
    first = props[0] if isinstance(props, list) and props and isinstance(props[0], dict) else {}
    rank, world_size = _distributed(data.get("distributedInfo"))
    return Trace(
        kernels=tuple(out),
        ops=tuple(table),
        device=_text(first.get("name", ""), "trace.deviceProperties[0].name"),
        sms=_count(first.get("numSms")) or 0,
        compute_capability=(_count(first.get("computeMajor")) or 0) * 10 + (_count(first.get("computeMinor")) or 0),
        steps=max(1, count),
        rank=rank,
        world_size=world_size,
        events=len(events),
        record_shapes=any("Input Dims" in a for *_, a in ops),
        steps_from=steps_from,
        launches=host_launches(calls, kernels),
    )


def _no_kernels(events: list, cpu: int) -> str:
    """Why a trace without GPU kernels is refused: its counts, and the categories it holds instead (an MTIA or
    other device's activities are named, not taken for a CPU-only run)."""
    seen: dict[str, int] = {}
    for e in events:
        cat = e.get("cat")
        if e.get("ph") == "X" and type(cat) is str and category(cat) is None and cat.lower() != "trace":
            seen[cat] = seen.get(cat, 0) + 1
    what = f"{cpu:,} CPU operators and no GPU activity: a CPU-only run, or" if cpu else "no GPU activity:"
    found = ", ".join(f"{c} ({n:,})" for c, n in sorted(seen.items(), key=lambda kv: -kv[1])[:3])
    held = f"; its other activities are {found}, which are not CUDA or ROCm kernels" if found else ""
    return (
        f"no GPU kernel events (ph 'X', cat 'kernel') among {len(events):,} events ({what} profiled without "
        f"CUDA{held}): profile with activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]"
    )


def repeats(names: list[str]) -> int:
    """How many times the whole sequence is one block repeated back to back (the steps of a profile without
    ProfilerStep annotations: the same layer trained n times launches the same kernels n times); 1 when it is
    not."""
    n = len(names)
    for times in range(n, 1, -1):  # the most repeats first: a step of a repeated block is the smallest one
        if n % times == 0:
            size = n // times
            if all(names[i] == names[i % size] for i in range(size, n)):
                return times
    return 1


# The categories read, by the name Kineto writes today (libkineto/src/ActivityType.cpp) and the one it wrote before
# (PyTorch 1.8-1.9: "Operator", "Runtime", "Kernel", "Memcpy", "Memset"; also the roctracer output of Kineto
# e624b51d, 2021), as TensorBoard's profiler plugin maps them, lower-cased (kineto tb_plugin/torch_tb_profiler/
# profiler/trace.py EventTypeMap): Kineto's own ResNet-50 samples (tb_plugin/samples, 2020-21) and HTA's
# inference_rank_1 trace are in the old names.
CATEGORIES = {
    "kernel": "kernel",
    "gpu_memcpy": "gpu_memcpy",
    "memcpy": "gpu_memcpy",
    "gpu_memset": "gpu_memset",
    "memset": "gpu_memset",
    "cpu_op": "cpu_op",
    "operator": "cpu_op",
    "cuda_runtime": "cuda_runtime",
    "runtime": "cuda_runtime",
    "cuda_driver": "cuda_driver",
    "user_annotation": "user_annotation",
}
_GPU = ("kernel", "gpu_memcpy", "gpu_memset")
PROFILER_STEP = "ProfilerStep#"  # torch.profiler's step annotation (a user_annotation; an "Operator" before 1.10)


def category(cat) -> str | None:
    """The category an event is read as (CATEGORIES), None for one not read."""
    if type(cat) is not str:
        return None
    return CATEGORIES.get(cat) or CATEGORIES.get(cat.lower())


def _scan(events: list) -> tuple[list, list, dict, set, list]:
    """One pass over the events: GPU activities (name, ts, dur, args, cat), host operators (pid, tid, start, end,
    name, args), launches by correlation id (pid, tid, ts), the ProfilerStep names, and the runtime and driver
    calls that launch a kernel or may wait (call_kind, pid, tid, ts, dur, correlation)."""
    kernels, ops, launches, steps, calls = [], [], {}, set(), []
    for i, e, cat, ts, dur, args in complete_events(events):
        if cat in _GPU:
            if cat == "kernel":
                _check_nccl_counts(i, args)
            kernels.append((_text(e.get("name", ""), f"trace.traceEvents[{i}].name"), ts, dur, args, cat))
        elif cat in ("cpu_op", "user_annotation") and str(e.get("name", "")).startswith(PROFILER_STEP):
            steps.add(str(e["name"]))
        elif cat == "cpu_op":
            name = _text(e.get("name", ""), f"trace.traceEvents[{i}].name")
            ops.append((_id(e.get("pid")), _id(e.get("tid")), ts, ts + dur, name, args))
        elif cat in ("cuda_runtime", "cuda_driver"):
            if "correlation" in args:
                launches[_id(args["correlation"])] = (_id(e.get("pid")), _id(e.get("tid")), ts)
            kind = call_kind(str(e.get("name", "")))
            if kind:
                calls.append((kind, _id(e.get("pid")), _id(e.get("tid")), ts, dur, _id(args.get("correlation"))))
    return kernels, ops, launches, steps, calls


def complete_events(events: list):
    """(index, event, category, ts, dur, args) of each complete event of a category read (CATEGORIES): a 'X'
    event, or a 'B' event closed by the 'E' of its thread (the Chrome trace format's duration events, which nest
    per thread; the 'E' may carry only ph, ts, pid and tid, its args are merged into the 'B's: "Trace Event Format",
    Duration Events). A 422 for an event that is not an object, one without numeric ts and dur, an 'E' that closes
    nothing or a 'B' left open."""
    open_: dict[tuple, list[tuple[int, dict, str | None]]] = {}
    for i, e in enumerate(events):
        if type(e) is not dict:
            raise SpecError(f"trace.traceEvents[{i}]", f"an event is an object; got {type(e).__name__}")
        ph = e.get("ph")
        if ph == "X":
            cat = category(e.get("cat"))
            if cat is not None:
                ts, dur = _times(i, e.get("ts"), e.get("dur"))
                args = e.get("args")
                yield i, e, cat, ts, dur, args if type(args) is dict else {}
        elif ph in ("B", "E"):
            thread = (_id(e.get("pid")), _id(e.get("tid")))
            if ph == "B":
                open_.setdefault(thread, []).append((i, e, category(e.get("cat"))))
                continue
            if not open_.get(thread):
                raise SpecError(f"trace.traceEvents[{i}]", f"an 'E' event with no open 'B' on its thread {thread}")
            j, begin, cat = open_[thread].pop()
            if cat is not None:
                ts, dur = _times(j, begin.get("ts"), _end(i, e.get("ts")) - _end(j, begin.get("ts")))
                args = begin.get("args") if type(begin.get("args")) is dict else {}
                yield j, begin, cat, ts, dur, args | (e["args"] if type(e.get("args")) is dict else {})
    left = [j for stack in open_.values() for j, *_ in stack]
    if left:
        raise SpecError(
            f"trace.traceEvents[{min(left)}]",
            f"{len(left)} 'B' events are never closed by an 'E' on their thread (a trace cut short?)",
        )


def _end(i: int, ts) -> float:
    """A 'B' or 'E' event's timestamp, which must be a number (a 422 naming it otherwise)."""
    if type(ts) not in (int, float) or not abs(ts) < 1e18:
        raise SpecError(f"trace.traceEvents[{i}]", f"a 'B' or 'E' event needs a numeric ts; got {got(ts)}")
    return ts


def _times(i: int, ts, dur) -> tuple[float, float]:
    """A complete event's ts and dur, checked: numbers, dur >= 0 (an 'E' before its 'B' gives a negative one)."""
    if type(ts) not in (int, float) or type(dur) not in (int, float) or not (0 <= dur < 1e18 and abs(ts) < 1e18):
        raise SpecError(
            f"trace.traceEvents[{i}]",
            f"a complete ('X') event needs numeric ts and dur >= 0; got {got(ts)}, {got(dur)}",
        )
    return ts, dur


@lru_cache(maxsize=1024)
def call_kind(name: str) -> str:
    """A runtime or driver call: "launch" (LAUNCH_CALL), "wait" (WAIT_CALL) or "" (memoised: a trace repeats a few
    dozen names)."""
    return "launch" if LAUNCH_CALL.match(name) else "wait" if WAIT_CALL.match(name) else ""


def host_launches(calls: list, kernels: list) -> tuple[HostLaunch, ...]:
    """Each launch call (LAUNCH_CALL) whose kernel the trace holds, with that kernel's start, and whether its
    thread made a call that may wait (WAIT_CALL) since its previous launch; by the calls' start."""
    started = {}
    for _name, ts, _dur, args, cat in kernels:
        corr = _id(args.get("correlation"))
        if cat == "kernel" and corr is not None and corr not in started:
            started[corr] = ts
    out, waited = [], {}
    calls = sorted(calls, key=lambda c: c[3])
    origin = calls[0][3] if calls else 0.0  # seconds from the first call: an epoch's microseconds keep their digits
    for kind, pid, tid, ts, dur, corr in calls:
        thread = (pid, tid)
        if kind == "wait":
            waited[thread] = True
        elif corr in started:
            at, kernel = (ts - origin) * 1e-6, (started[corr] - origin) * 1e-6
            out.append(HostLaunch(thread, at, at + dur * 1e-6, kernel, waited.get(thread, False)))
            waited[thread] = False
    return tuple(out)


def _kernels(kernels: list, ops: list, enclosing: dict) -> tuple[list[TraceOp], list[TraceKernel]]:
    """The kernels classified, each pointing at its launching operator (one TraceOp per operator instance)."""
    table, index, out = [], {}, []
    for name, _ts, dur, args, cat in kernels:
        op_i = -1
        found = enclosing.get(_id(args.get("correlation")))
        if found is not None:
            op_i = index.get(found)
            if op_i is None:
                *_, op_name, op_args = ops[found]
                op_i = index[found] = len(table)
                dims, types = _tuple(op_args.get("Input Dims")), _tuple(op_args.get("Input type"))
                concrete = _tuple(op_args.get("Concrete Inputs"))
                table.append(
                    TraceOp(
                        str(op_name),
                        dims if type(dims) is tuple else (),
                        types if type(types) is tuple else (),
                        concrete if type(concrete) is tuple else (),
                    )
                )
        kind = "copy" if cat != "kernel" else kernel_class(name)
        if kind == "other" and op_i >= 0:
            kind = op_class(table[op_i].name)
        elif kind == "gemm" and op_i >= 0 and op_class(table[op_i].name) == "conv":
            kind = "conv"
        if kind == "nccl":
            op = collective_of(name, args)
            group = _count(args.get("Group size"))
            out.append(TraceKernel(name, kind, dur * 1e-6, op_i, op, message_bytes(op, args), group))
        else:
            out.append(TraceKernel(name, kind, dur * 1e-6, op_i))
    return table, out


def _id(v):
    """An id as a dict key: Kineto writes numbers (pid, tid, correlation) or names; anything else by its text."""
    return v if v is None or type(v) in (int, float, str) else repr(v)[:64]


def _tuple(v, depth: int = 0):
    """Lists as tuples (hashable, as a TraceOp's dims are); deeper than any tensor list nests: None."""
    if isinstance(v, list):
        return tuple(_tuple(x, depth + 1) for x in v) if depth < 4 else None
    return v


def _enclosing_ops(ops: list, launches: dict) -> dict:
    """correlation id -> index into ``ops`` of the innermost operator whose interval holds the launch, on the
    launching thread. Per thread the operators nest (a RecordFunction stack), so the innermost is the latest
    started one that is still open: a sweep with a stack."""
    by_thread: dict[tuple, list[int]] = {}
    for i, (pid, tid, *_rest) in enumerate(ops):
        by_thread.setdefault((pid, tid), []).append(i)
    calls: dict[tuple, list[tuple[float, object]]] = {}
    for corr, (pid, tid, ts) in launches.items():
        calls.setdefault((pid, tid), []).append((ts, corr))
    found = {}
    for thread, launched in calls.items():
        indices = sorted(by_thread.get(thread, ()), key=lambda i: (ops[i][2], -ops[i][3]))
        starts = [ops[i][2] for i in indices]
        launched.sort(key=lambda p: p[0])
        stack: list[int] = []
        j = 0
        for ts, corr in launched:
            upto = bisect.bisect_right(starts, ts)
            while j < upto:
                i = indices[j]
                while stack and ops[stack[-1]][3] < ops[i][2]:
                    stack.pop()
                stack.append(i)
                j += 1
            while stack and ops[stack[-1]][3] < ts:
                stack.pop()
            if stack:
                found[corr] = stack[-1]
    return found


# ---- shapes -------------------------------------------------------------------------------------------------


def gemm_shape(op: TraceOp) -> tuple[int, int, int, int] | None:
    """(M, N, K, groups) of a GEMM operator from its recorded input dims (GEMM_OPERANDS), None when they are
    missing or not a matrix product."""
    where = GEMM_OPERANDS.get(op.name)
    if where is None or len(op.dims) <= max(where[:2]):
        return None
    a, b = op.dims[where[0]], op.dims[where[1]]
    if not (isinstance(a, tuple) and isinstance(b, tuple)) or len(a) < 2 or len(b) < 2:
        return None
    if not all(isinstance(x, int) and x > 0 for x in a + b):
        return None
    if where[2]:  # linear: weight (N, K)
        if len(b) != 2 or a[-1] != b[1]:
            return None
        return math.prod(a[:-1]), b[0], a[-1], 1
    if a[-1] != b[-2]:
        return None
    if len(b) == 2:  # (..., M, K) @ (K, N): the leading dims fold into M
        return math.prod(a[:-1]), b[1], a[-1], 1
    if len(a) == len(b) == 3 and a[0] == b[0]:  # batched: one GEMM per batch
        return a[1], b[2], a[2], a[0]
    return None


GROUPED_OPS = frozenset(("aten::_grouped_mm",))


def grouped_shape(op: TraceOp) -> tuple[int, int, int, int, bool] | None:
    """(M, N, K, groups, ragged K) of ``torch._grouped_mm(mat_a, mat_b, offs)`` from its recorded dims (aten
    schema ``_grouped_mm(Tensor self, Tensor mat2, Tensor? offs=None, Tensor? bias=None, ScalarType? out_dtype=None)``,
    aten/src/ATen/native/cuda/GroupMM.cu): 2D (R, K) x 3D (G, K, N) with offs over R: G groups of R / G rows on
    average (the forward and the data gradient); 2D (M, R) x 2D (R, N) with offs over R: G (M x N) outputs, each
    reducing its own R / G rows (the weight gradient: ragged K); 3D x 3D: a batch. The rows per group are not
    recorded (offs is a tensor): the mean, which kernels.group_rows spreads as the planner does."""
    if op.name not in GROUPED_OPS or len(op.dims) < 2:
        return None
    a, b = op.dims[0], op.dims[1]
    offs = op.dims[2] if len(op.dims) > 2 and isinstance(op.dims[2], tuple) else ()
    if not (isinstance(a, tuple) and isinstance(b, tuple)) or not all(isinstance(x, int) and x > 0 for x in a + b):
        return None
    if len(a) == 2 and len(b) == 3 and a[1] == b[1] and len(offs) == 1 and offs[0] == b[0]:
        return max(1, a[0] // b[0]), b[2], a[1], b[0], False
    if len(a) == 2 and len(b) == 2 and a[1] == b[0] and len(offs) == 1 and offs[0] > 0:
        return a[0], b[1], max(1, a[1] // offs[0]), offs[0], True
    if len(a) == len(b) == 3 and a[0] == b[0] and a[2] == b[1]:
        return a[1], b[2], a[2], a[0], False
    return None


def attention_shape(op: TraceOp) -> tuple[str, bool, int, int, int, int, int, bool] | None:
    """(kernel, backward, batch, query heads, query length, key length, head dim, causal) of a fused attention
    operator from its recorded dims and arguments (ATTENTION_OPS), None for another operator or missing dims."""
    q, k = _attention_tensor(op, 0), _attention_tensor(op, 1)
    if q is None or k is None:
        return None
    kernel, backward, _, layout, causal_at = ATTENTION_OPS[op.name]
    b, heads, s_q = (q[0], q[1], q[2]) if layout == "bhsd" else (q[0], q[2], q[1])
    s_kv = k[2] if layout == "bhsd" else k[1]
    causal = len(op.concrete) > causal_at and str(op.concrete[causal_at]).strip().lower() == "true"
    return kernel, backward, b, heads, s_q, s_kv, q[3], causal


def value_head_dim(op: TraceOp) -> int | None:
    """The value tensor's head dim of a fused attention operator (its last dim in either layout), which differs
    from the query's under MLA (DeepSeek-V3: 192 and 128); None without recorded dims."""
    v = _attention_tensor(op, 2)
    return None if v is None else v[3]


def _attention_tensor(op: TraceOp, which: int) -> tuple[int, int, int, int] | None:
    """The recorded 4-d shape of a fused attention operator's query (0), key (1) or value (2), in ATTENTION_OPS's
    order from its query's index; None for another operator, or a missing or malformed shape."""
    found = ATTENTION_OPS.get(op.name)
    if found is None or len(op.dims) <= found[2] + which:
        return None
    t = op.dims[found[2] + which]
    ok = isinstance(t, tuple) and len(t) == 4 and all(isinstance(x, int) and x > 0 for x in t)
    return t if ok else None


def gemm_dtype(op: TraceOp, kernel_names: list[str]) -> str | None:
    """The GEMM-table dtype: bf16/fp16 from the operands' type; fp32 operands run as tf32 on the tensor cores
    when the kernel is a tensor-op kernel (CUTLASS ``tensorop_s1688gemm``, cuBLAS ``*tf32*``/``xmma``; PyTorch's
    allow_tf32), else as SIMT fp32 (``sgemm``)."""
    first = GEMM_OPERANDS.get(op.name, (0,))[0]  # _grouped_mm: mat_a first
    t = str(op.types[first] if len(op.types) > first else "").lower()
    if "bfloat16" in t:
        return "bf16"
    if "half" in t:
        return "fp16"
    if "float8" in t:
        return "fp8"
    if t == "float":
        tensor = any(re.search(r"tensorop|tf32|xmma|s1688|nvjet", n, re.I) for n in kernel_names)
        return "tf32" if tensor else "fp32"
    return None


def elementwise_bytes(op: TraceOp) -> int | None:
    """HBM bytes of one elementwise operator's kernel: every tensor input read, the output (the largest input's
    shape, the broadcast result) written in the first input's dtype; None without dims and types."""
    if op.name not in ELEMENTWISE_OPS or not op.dims or len(op.types) != len(op.dims):
        return None
    total, largest, first = 0, 0, None
    for i, (dims, t) in enumerate(zip(op.dims, op.types, strict=True)):
        size = dtype_bytes(t)
        if not isinstance(dims, tuple) or not dims or size is None:  # a scalar or an untyped input
            continue
        if not all(isinstance(x, int) and x >= 0 for x in dims):
            return None
        n = math.prod(dims)
        if i or op.name not in WRITE_ONLY_SELF:
            total += n * size
        largest = max(largest, n)
        first = first or size
    if not first or not largest:
        return None
    return total + largest * first


__all__ = [
    "KERNEL_CLASSES",
    "LAUNCH_CALL",
    "MAX_EVENTS",
    "WAIT_CALL",
    "HostLaunch",
    "Trace",
    "TraceKernel",
    "TraceOp",
    "attention_shape",
    "collective_of",
    "elementwise_bytes",
    "gemm_dtype",
    "gemm_shape",
    "grouped_shape",
    "host_launches",
    "kernel_class",
    "load_trace",
    "message_bytes",
    "op_class",
    "repeats",
    "value_head_dim",
]
