"""A layer as the kernels it launches: GEMMs by shape, attention as its kernel, memory-bound kernels by bytes.

``layer_kernels(ctx, moe, gpu)`` lists, for one layer, one micro-batch and one rank, the forward, the backward
and what recompute runs again, each kernel a ``Kernel`` with its class, shape or bytes, FLOPs and seconds.
compute.py sums them into PassTime; the page and serving can show the list as it is.

A kernel's time is its own bound plus a fixed cost (``Efficiency``):

- GEMM (m x k) @ (k x n), one or a group (experts): FLOPs at the dense peak of its dtype x the measured ceiling
  of the GPU generation for that dtype (``GEMM_CEILING``; a part with a measured table of its own, GPUSpec.gemm_table,
  carries its own: ``tabled_ceiling``) x tile quantization (rows and columns padded to the
  generation's CTA tile, ``GEMM_TILE``) x SM fill (tiles / (tiles + fill·SMs)) x main-loop amortisation
  k / (k + k0); or its operand bytes at the achievable HBM bandwidth, whichever is slower; + ``gemm_fixed_s``.
  The ceilings, fill, k0 and the fixed cost are fitted on measured cuBLASLt/DeepGEMM tables (bench/kernel_fit.py,
  tests/reference/kernels/aiconfigurator_gemm.json), not on training runs.
- attention: FLOPs (causal half, GQA-independent, sliding windows clipped) at the dense bf16 peak x the
  kernel's ceiling (``ATTENTION_CEILING``: FlashAttention-2/3, cuDNN) x s_kv / (s_kv + s0); unfused attention as
  its batched GEMMs and the softmax/dropout bytes;
- memory-bound kernels (norms, rotary, activation, residual adds, MoE permute, router, casts): bytes at
  hbm_GBps x ``hbm`` + ``kernel_s``. Which kernels exist and their bytes depend on fusion (``FUSION``): Megatron-
  Core with TransformerEngine fuses them (or torch.compile does), PyTorch eager runs each op as its own kernel.
- without CUDA graphs each kernel costs at least the host's dispatch (``cpu_op_s``): a small kernel is
  launch-bound.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import lru_cache
from statistics import NormalDist

from collectives._hashing import frozen_hash
from collectives.topology.gpu import GPUSpec, nested_constants

from ._errors import SpecError, shown
from .context import Context
from .engine_kernels import (
    EP_GATHER_LAUNCHES,
    EP_SCATTER_LAUNCHES,
    MASKED_ACT_QUANT_BYTES,
    ep_gather_bytes,
    ep_scatter_bytes,
)
from .recipes import check_recipe_gpu, dpa_recipe, float8_gathered, recipe_of
from .workload import DISPATCH_FORMATS, WEIGHT_FORMAT_BYTES


@dataclass(frozen=True)
class Efficiency:
    """The global constants of the kernel model (fitted on kernel tables where marked; docs/step-time.md)."""

    # the dataclass's hash, computed once (collectives/_hashing.py): every per-layer and stage-pass memo keys on it
    # (~2.3 us a hash of its fields, several look-ups per stage pass)
    __hash__ = frozen_hash

    gemm: float  # fallback GEMM ceiling for a GPU generation without a measured one (GEMM_CEILING)
    attention_fwd: float  # fallback attention ceilings (ATTENTION_CEILING has the measured ones)
    attention_bwd: float
    hbm: float  # achieved / peak HBM bandwidth for streaming kernels
    kernel_s: float  # fixed cost of a memory-bound or attention kernel (launch, ramp, tail), seconds
    gemm_k0: float = 0.0  # main-loop amortisation: a GEMM runs at ceiling·k/(k + k0)
    gemm_fill: float = 0.0  # SM fill: tiles / (tiles + fill·SMs)
    gemm_fixed_s: float = 0.0  # fixed cost of one GEMM (prologue, epilogue, launch), seconds
    attention_s0: float = 0.0  # attention rate grows as s_kv / (s_kv + s0)
    cpu_op_s: float = 0.0  # host dispatch per kernel without CUDA graphs: a kernel takes at least this
    # the host's time per launch in a layer whose forward syncs (planner/host.py's queue, compute.layer_pass):
    # a framework's layer code between its launches (0: cpu_op_s); what a user's own trace or a measurement gives
    host_launch_s: float = 0.0
    # host_launch_s is the user's own (cluster.calibration.kernels or a trace fit): it replaces a flavour's own
    # (Flavour.host_launch_s) as it is; False: the default, Megatron-Core's measurement (kernels.queue_launch_s)
    host_launch_given: bool = False
    # the node's host CPU's time per eager op against the x86 reference (HOST_CPUS per_op; host_efficiency scales
    # cpu_op_s by it, queue_launch_s a flavour's own host_launch_s; Efficiency.host_launch_s stays as measured)
    host_per_op: float = 1.0
    moe_skew: float = 0.0  # systematic routing skew beyond the multinomial spread (0: none; a trace refits it)
    # measured GEMM ceilings of one GPU by dtype, before GEMM_CEILING: what a profiler trace fits for its GPU
    # (planner/trace_fit.py); () = the tables' ceilings
    gemm_ceilings: tuple[tuple[str, float], ...] = ()
    # the same for fused attention, by "<kernel>_fwd" / "<kernel>_bwd" (ATTENTION_CEILING_KEYS), before
    # ATTENTION_CEILING
    attention_ceilings: tuple[tuple[str, float], ...] = ()
    # the tensor clock a profiler trace ran its GEMMs and attention at, as a fraction of the datasheet clock
    # (DATASHEET_CLOCK_MHZ) at the cluster's power limit: replaces SUSTAINED_CLOCK x the power-limit scale in
    # clock_fraction; 0 = those
    clock: float = 0.0


EFFICIENCY = Efficiency(
    # Generations without a measured GEMM table (GEMM_CEILING): large bf16 cuBLAS GEMMs at ~80-85% of the dense
    # peak (NVIDIA Deep Learning Performance guide, "Matrix Multiplication Background").
    gemm=0.83,
    # FlashAttention-2 (Dao 2023) on H100 SXM5: up to 335 TFLOP/s forward + backward (§4.1, Fig. 7).
    attention_fwd=0.38,
    attention_bwd=0.32,
    # Copies of >= 128 MiB on this project's H200 (tests/reference/kernels/h200/run1.json and run2.json
    # ``memory_bound``, bench/h200_tables.py fit): 4.21 TB/s median of 4.8 datasheet (STREAM-like copies reach
    # ~85-90% on A100/H100 too: NVIDIA nvbandwidth / BabelStream results).
    hbm=0.877,
    # CUDA kernel launch + ramp + tail of a short kernel: a few us (CUDA C++ Best Practices Guide, launch overhead).
    # The H200's tiny kernels replayed from a CUDA graph take 1.05-2.4 us (runs 1-2 ``launch`` graph column, copies
    # of <= 1 MiB: median 1.3 us), but the memory-bound kernels of a real eager step fit 4 us (the committed HTA
    # trace on A100, planner/trace_fit.py), and at 1.3 us their median error grows from 47.7% to 56.6%: kept.
    kernel_s=5e-6,
    # Fitted together on the 1,568 measured GEMMs of tests/reference/kernels/aiconfigurator_gemm.json (A100, H100,
    # B200; bf16, fp8, fp8 block-scaled, nvfp4) by least squares in log time (bench/kernel_fit.py): k0 = 128,
    # fill = 0.1, fixed 8 us: median |error| 9.2% over all, 4-6% for bf16 on A100 and H100.
    gemm_k0=128.0,
    gemm_fill=0.1,
    gemm_fixed_s=8e-6,
    # aiconfigurator's measured context-attention tables (H100, B200, A100; head dim 128, bf16): the achieved
    # fraction grows with the sequence as s / (s + s0); s0 = 1,024 fits best (rms log error 0.13 over 255 shapes,
    # against 0.18 at 512 and 0.14 at 2,048; bench/kernel_fit.py).
    attention_s0=1024.0,
    # PyTorch eager dispatch: ~10 us of host time per op (He, "Making Deep Learning Go Brrrr From First
    # Principles", 2022, overhead section); on the H200 machine's host 6.0-16.8 us per tiny op, median 10.1 us
    # (runs 1-2 ``launch`` eager column). CUDA graphs replay the launches without it (PyTorch CUDA graphs docs).
    cpu_op_s=1e-5,
    # Megatron-Core's own MoE layer (0.19.2, local spec: no TransformerEngine), bf16 eager forward + backward on this
    # project's H200 (tests/reference/kernels/h200/megatron_moe_h200.json, bench/measure_megatron_moe.py): host time
    # per kernel launch, the median of the 47 MoE rows whose GPU was busy under half their wall time (the host's
    # own work: at most 3.1% of it waiting in syncs): 38.2 us (27.8-50.9; 3.7 aten ops a launch); the one global host
    # constant, fitted on that measurement, never on a run. Where a layer's forward syncs (compute.layer_pass)
    host_launch_s=38.2e-6,
)


@dataclass(frozen=True)
class HostCPU:
    """The CPU that launches a node's kernels (the cluster's ``cpu_vendor``, GPUSpec.host_cpu) as the host costs
    read it: ``per_op`` = its host seconds per eager PyTorch op against the x86 hosts the constants were measured
    on. It scales eager PyTorch's host time only (host_efficiency, queue_launch_s); a CUDA-graph replay launches no op
    from Python (kernels.cuda_graphs: no floor, no host queue), so it does not move there."""

    name: str
    per_op: float
    source: str


# Grace against a Xeon, per op: TransformerEngine issue 2053 ("[PyTorch] High CPU overhead on Grace systems",
# NVIDIA/TransformerEngine, opened 2025-08-11 by Marks101): CPU time per torch.nn.Linear forward (BF16, hidden 2,048,
# 8,192 tokens; the same script on each system) 13.48 us on an H100 DGX (Intel Xeon Platinum 8480C), 37.08 us on GB200
# and 33.17 us on GH200 (Grace): 2.75x and 2.46x; te.Linear 99.66 / 90.53 us on GB200 / GH200, 2.7x torch's on the same
# host. Both Grace systems carry the same CPU (72 Neoverse V2 cores): their mean over the Xeon, 35.125 / 13.48 =
# 2.61. No published per-op comparison of AMD EPYC against Xeon was found: taken as the x86 hosts' (1.0).
HOST_CPUS = {
    "intel": HostCPU("x86 (Intel Xeon)", 1.0, "the hosts cpu_op_s and host_launch_s were measured on (this project's "
                     "H200 machine's Xeon VM; He 2022): the reference, 1.0"),
    "amd": HostCPU("x86 (AMD EPYC)", 1.0, "no published per-op comparison with a Xeon: the x86 reference, 1.0"),
    "arm": HostCPU("NVIDIA Grace (Arm Neoverse V2)", round((37.08 + 33.17) / 2 / 13.48, 2),
                   "TransformerEngine issue 2053: torch.nn.Linear forward's CPU time 37.08 us (GB200) and 33.17 us "
                   "(GH200) against 13.48 us on an H100 DGX's Xeon Platinum 8480C: 2.75x and 2.46x, mean 2.61x"),
}  # fmt: skip


@lru_cache(maxsize=8)
def host_efficiency(host_cpu: str) -> Efficiency:
    """EFFICIENCY on a node whose host is ``host_cpu`` (HOST_CPUS): eager PyTorch's dispatch per kernel
    (``cpu_op_s``) at ``per_op`` times the x86 reference, and ``host_per_op`` for a flavour's own eager cost per
    launch (queue_launch_s). ``host_launch_s`` stays as measured: Megatron-Core's local layer on a Xeon VM, applied to
    TransformerEngine's kernel list, whose Grace/Xeon ratio the source does not give (scaled, the two eager GB200 MoE
    rows went to +74.5% / +20.9%: docs/step-time.md "Host CPUs and torchtitan's sync (grace9)")."""
    f = HOST_CPUS[host_cpu].per_op
    if f == 1.0:
        return EFFICIENCY
    return replace(EFFICIENCY, cpu_op_s=EFFICIENCY.cpu_op_s * f, host_per_op=f)


# The constants a user's profiler trace fits for its GPU (planner/trace_fit.py; POST /v1/calibrate ``trace`` returns
# them as ``constants``), which a request hands back as ``cluster.calibration.kernels`` (the GPU carries them:
# GPUSpec.kernel_constants): name -> (lowest, highest). A GEMM ceiling is per GEMM dtype (``gemm_ceiling.bf16``), a
# fraction of the dense peak the fit clips to the same range; a fixed cost is at most 1 ms (a kernel's whole launch,
# ramp and tail is a few us: CUDA C++ Best Practices Guide); the HBM fraction is of the datasheet bandwidth.
KERNEL_CONSTANTS = {
    "gemm_ceiling": (0.05, 1.0),
    "gemm_fixed_s": (0.0, 1e-3),
    "hbm": (0.05, 1.0),
    "kernel_s": (0.0, 1e-3),
    # the tensor clock as a fraction of the datasheet clock: an H100/H200 boosts to 1,980 / 1,830 = 1.082
    # (nvidia-smi clocks.max.sm); an A100 holds 1,410 of 1,410; 0.2 is below any power limit's clock
    "clock": (0.2, 1.2),
    "attention_ceiling": (0.05, 1.0),
    # the host's time per launch in a synced layer's queue (Efficiency.host_launch_s): up to 1 ms
    "host_launch_s": (0.0, 1e-3),
}
# GEMM dtypes a ceiling may be given for: what a trace's GEMMs run as (profile_trace.gemm_dtype) and the recipes'
# kernel dtypes (planner/recipes.py Recipe.kernel_dtype).
GEMM_DTYPES = ("bf16", "fp16", "fp32", "tf32", "fp8", "fp8_block", "mxfp8", "nvfp4", "fp8_rowwise")
# Fused attention kernels a ceiling may be given for (ATTENTION_CEILING's kernels), forward and backward.
ATTENTION_CEILING_KEYS = tuple(f"{k}_{d}" for k in ("flash2", "flash3", "cudnn") for d in ("fwd", "bwd"))
NESTED_CONSTANTS = {
    "gemm_ceiling": ("GEMM dtype", GEMM_DTYPES),
    "attention_ceiling": ("kernel", ATTENTION_CEILING_KEYS),
}


def kernel_constants(values: Mapping, field: str = "cluster.calibration.kernels") -> tuple[tuple[str, float], ...]:
    """The fitted constants as GPUSpec.kernel_constants, checked: known names (KERNEL_CONSTANTS), GEMM dtypes
    (GEMM_DTYPES) and each value inside its range; a SpecError names the field, the rule and the number."""
    out = []
    for name, value in values.items():
        if name not in KERNEL_CONSTANTS:
            raise SpecError(f"{field}.{name}", f"unknown kernel constant; known: {', '.join(KERNEL_CONSTANTS)}")
        if name in NESTED_CONSTANTS:
            what, known = NESTED_CONSTANTS[name]
            if not isinstance(value, Mapping):
                got = shown(value)[:40]
                raise SpecError(f"{field}.{name}", f'a ceiling per {what}, e.g. {{"{known[0]}": 0.8}}, got {got}')
            for key in value:
                if key not in known:
                    raise SpecError(f"{field}.{name}.{key}", f"unknown {what}; known: {', '.join(known)}")
            pairs = [(f"{name}.{key}", v, f"{field}.{name}.{key}") for key, v in value.items()]
        else:
            pairs = [(name, value, f"{field}.{name}")]
        low, high = KERNEL_CONSTANTS[name]
        for key, v, where in pairs:
            if isinstance(v, bool) or not isinstance(v, int | float) or not low <= v <= high:
                raise SpecError(where, f"{v!r} is outside {low:g} .. {high:g} (planner/kernels.py KERNEL_CONSTANTS)")
            out.append((key, float(v)))
    return tuple(sorted(out))


@lru_cache(maxsize=256)
def gpu_efficiency(gpu: GPUSpec) -> Efficiency:
    """The kernel model's constants for ``gpu``: EFFICIENCY on its node's host (host_efficiency of
    ``gpu.host_cpu``) with what a trace fitted for it (kernel_constants): a calibrated ``host_launch_s`` was read on
    the user's own host and replaces the default and a flavour's own as it is (``host_launch_given``)."""
    base = host_efficiency(gpu.host_cpu)
    if not gpu.kernel_constants:
        return base
    given = nested_constants(gpu.kernel_constants)
    ceilings = tuple(sorted(given.pop("gemm_ceiling", {}).items()))
    attention = tuple(sorted(given.pop("attention_ceiling", {}).items()))
    given = given | ({"host_launch_given": True} if "host_launch_s" in given else {})
    return replace(base, gemm_ceilings=ceilings, attention_ceilings=attention, **given)


def efficiency(gpu: GPUSpec, eff: Efficiency | None) -> Efficiency:
    """``eff`` when a caller gives one (a fit's candidates), else the GPU's own (gpu_efficiency)."""
    return eff if eff is not None else gpu_efficiency(gpu)


# Measured ceiling of a large GEMM as a fraction of the datasheet dense peak of its dtype, by (compute capability
# generation, GEMM dtype): fitted per class with the global k0, fill and fixed cost above (bench/kernel_fit.py) on
# aiconfigurator's tables (TensorRT-LLM torch flow: cuBLASLt; DeepGEMM for block-scaled fp8 on B200), which were
# measured at the default power limit. MXFP8 on Blackwell (1x32 blocks, hardware scales) takes block-scaled fp8's.
# Hopper bf16 from this project's H200 tables instead, as a fraction of the datasheet peak scaled to the SM clock
# each row logged (tests/reference/kernels/h200/run2.json ``gemm_bf16``: 432 fwd, dgrad and wgrad torch.mm GEMMs;
# bench/h200_tables.py fit): 0.886 (aiconfigurator's H100 table, clock not recorded, read at the datasheet clock:
# 0.844, what 0.886 gives at 1,743 MHz). Hopper fp8 likewise: 0.844 (the 216 tensorwise torch._scaled_mm of
# ``gemm_fp8``, torch 2.11, CUDA 13). Block-scaled fp8 (DeepGEMM) was not measured on the H200: aiconfigurator's,
# refitted with fp8 at FP8_CLOCK of the bf16 clock (bench/kernel_fit.py burst: its fp8 rows at FP8_CLOCK of the
# datasheet clock), 0.596 / 0.947 = 0.629 (0.596 / 0.892 = 0.668 under the logged clocks' ratio until sus12; the
# table's rows predicted the same either way). aiconfigurator's 196 H100 per-tensor fp8 GEMMs, read at the datasheet
# clock and FP8_CLOCK, come out 30% faster than measured (27% at 0.892): their clock is not recorded.
# Blackwell per-tensor fp8 (TransformerEngine's delayed and current scaling) takes block-scaled fp8's ceiling, not
# aiconfigurator's b200_sxm per-tensor table's (0.525, bimodal: small n slow): the same tensor-core MMA with one scale
# per tensor, applied in the epilogue, does less per tile than MXFP8's scale per 32 elements, and the one published
# pair that compares them in training says so: Megatron-Bridge 25.11 Llama3 8B (docs/performance-summary.md at
# 5776a6d90b, same recipe and layout) runs FP8-CS 3.7% faster than FP8-MX on DGX-B200 (30,624 vs 29,521 tokens/s/GPU)
# and 5.8% on GB200 (31,508 vs 29,789), where 0.525 made it 12-18% slower. The Hopper precedent: aiconfigurator's
# H100 per-tensor table is 25-32% slower than the H200's measured cuBLAS ceiling (above). Not refitted on a run: the
# ceiling is mxfp8's, fitted on aiconfigurator's block-scaled table.
# The block-scaled fp8 and nvfp4 ceilings mean the GEMM alone (bwcast14): aiconfigurator's rows of those classes also
# quantize the bf16 input (TIMED_QUANTIZE), so bench/kernel_fit.py quantize_free_ceiling refits them on the rows less
# that quantize at the planner's cast price (timed_quantize_s), keeping the median bias the ceilings fitted on the rows
# as timed had on their compute-bound shapes (kernel_fit.AS_TIMED: Hopper fp8_block 0.629, Blackwell fp8_block 0.635,
# nvfp4 0.415). The quantize is 9-11% of a compute-bound row in median; with the fixed cost and fill kept the ceilings
# rise 13-17%.
GEMM_CEILING = {
    (80, "bf16"): 0.860,
    (90, "bf16"): 0.886,
    (90, "fp8"): 0.844,
    (90, "fp8_block"): 0.728,  # 0.629 on the rows as timed
    (100, "bf16"): 0.733,
    (100, "fp8"): 0.721,  # = mxfp8's (comment above); aiconfigurator's per-tensor table alone, as timed: 0.525
    (100, "fp8_block"): 0.721,  # 0.635 on the rows as timed
    (100, "mxfp8"): 0.721,
    (100, "nvfp4"): 0.484,  # 0.415 on the rows as timed
}
# torch._scaled_mm with rowwise scales (torchao's rowwise recipe's forward GEMM, fast accumulation: PyTorch's CUTLASS
# kernel, aten/src/ATen/native/cuda/RowwiseScaledMM.cu) against the cuBLAS tensorwise kernel on H100: "Most shapes
# are within 90-100% of tensor-wise efficiency, but there's a long tail going down to 50%" (pytorch/pytorch issue
# 147971, 2025-02-26, fast_accum=True, after PR 134781's tile heuristics). Not measured here and not fitted: the
# middle of the stated band, 0.95 of the tensorwise ceiling, an assumption until a trace of rowwise GEMMs refits
# ``gemm_ceiling.fp8_rowwise``. Blackwell likewise (no published rowwise-vs-tensorwise figure found).
ROWWISE_VS_TENSORWISE = 0.95
# GEMM dtypes whose ceiling is another's times a ratio, read when gemm_ceiling is asked (not copied at import): a
# refitted ``gemm_ceiling.fp8`` moves rowwise with it, a fit that names ``gemm_ceiling.fp8_rowwise`` wins.
DERIVED_CEILING = {"fp8_rowwise": ("fp8", ROWWISE_VS_TENSORWISE)}
# The rowwise recipe's backward GEMMs run cuBLAS's tensorwise kernel and scale the output afterwards (torchao
# float8_ops.py addmm_float8_unwrapped: ``output *= post_inverse_scale``, the outer product of the two scale
# vectors): one elementwise kernel per dgrad and wgrad GEMM (pytorch/ao issue 2184: "at least one extra triton
# kernel per GEMM"), reading and writing the bf16 output: 4 B per output element.
ROWWISE_RESCALE_BYTES = 4
# Tensor-core clock sustained through a training step, as a fraction of the clock the datasheet peak is quoted at
# (DATASHEET_CLOCK_MHZ below), by generation; a part measured itself carries its own (GPUSpec.sustained_clock, read
# before this by clock_fraction, the one reader). Ampere has no entry (1.0: the A100 SXM4's GEMMs at the clock of its
# GEMM_CEILING table, which aiconfigurator measured at the default 400 W on random data: its cuBLAS 8192^3, 262.5 TF/s,
# sits 1.7% from Horace He's power-limited 258 TF/s, tests/planner/test_a100_clock.py). No published A100 SXM4 clock
# through a training step was found (docs/step-time.md "The A100 rows (a100r13)"). A check on the runs, not a source:
# bench/a100_clock_check.py finds no clock common to them (Korthikanti et al.'s 175B-530B meet their times at 0.98-1.00,
# the SC'21 rows at 0.77-0.91, falling with the unfused attention's share). Hopper, BY
# THROUGHPUT: the clock at which this model (gemm_time, layer_kernels, pass_time) times a Llama-3-8B eager layer
# trained back to back for 30 s at 700 W as measured (tests/reference/kernels/<gpu>/<run>.json ``layer_sustained``;
# bench/h200_power.py effective_clocks prints it, tests/planner/test_h200_power.py recomputes it): the H100 SXM5
# (h100/run1) 1,510 MHz / 1,830 = 0.825, the H200 1,461 = 0.798 (its preset's own, collectives/topology/gpu.py).
# Not the clock nvidia-smi logged (H100 1,605, H200 1,560 MHz = 0.852, this entry until sus12): under the 0x4 power
# cap the logged / NVML clock is not the tensor clock to ~10% (the same sustained GEMMs run 0.923 of peak per logged
# MHz on the H100, 0.837 on the H200; docs/step-time.md clock12). Assumed, not measured: the other Hopper parts (H800:
# the H100's SMs and 700 W; GH200, H100 NVL, H20) take the H100's pair as the generation's. Blackwell (B200 1,965 MHz
# boost, 1,000 W): 0.90 as before (no datasheet clock or measured clock here) until a trace at scale refits it. The
# power-limit scale (GPUSpec.clock_scale) multiplies this; a trace-fitted clock (Efficiency.clock) replaces both.
SUSTAINED_CLOCK = {90: 0.825, 100: 0.90}
# fp8 tensor work draws more power per clock than bf16, so under the same cap it holds a lower clock, applied to the
# GEMMs whose peak is the fp8 one (dense_peak). By throughput, as above: the clocks at which gemm_time times the
# 8192^3 GEMMs run back to back for 15-20 s as measured (``sustained``; bench/h200_power.py effective_clocks): H100
# fp8 1,383 / bf16 1,461 MHz = 0.947 (the generation's, the same assumption for the other Hopper parts), H200 1,367 /
# 1,411 = 0.969 (its preset's). The logged clocks' ratio (H200 1,298 / 1,455 = 0.892, this entry until sus12; H100
# 1,245 / 1,365 = 0.912) is not used, for the reason above.
FP8_CLOCK = {90: 0.947}
# The SM clock the datasheet's dense tensor peak is quoted at, MHz: peak = SMs x dense FLOP per clock per SM x clock.
# A100 SXM4: 108 x 2,048 x 1,410 MHz = 312 TF bf16 (A100 whitepaper, boost clock 1,410 MHz); H100 SXM5 (and H200,
# GH200, H800: the same SMs): 132 x 4,096 x 1,830 MHz = 989.4 TF (H100 whitepaper Table 3, max boost clock for
# tensor-core work 1,830 MHz; nvidia-smi's clocks.max.sm, 1,980 MHz, is the non-tensor boost).
DATASHEET_CLOCK_MHZ = {80: 1410, 90: 1830}
# The SM clock a memory-bound kernel runs at, MHz: nvidia-smi's clocks.max.sm, the non-tensor boost named above (A100
# SXM4 1,410, the datasheet's boost; H100 SXM5 / H200 1,980, the H200 run's logged clock). Blackwell: not measured
# here, so its dropout draws are not priced (dropout_rng_s 0). The power-limit scale (GPUSpec.clock_scale) lowers it.
SM_CLOCK_MHZ = {80: 1410, 90: 1980}

# CTA tile (rows, columns) cuBLAS picks for large GEMMs: Ampere 128x128 (ampere_bf16_s16816gemm_..._128x128),
# Hopper and Blackwell 128x256 (sm90_xmma_gemm_..._tilesize128x256x64; Blackwell's 256x256 2-SM tile is 128x256
# per SM). The table's m, n are multiples of 128, so the fit cannot tell the tiles apart: they are the kernels'.
GEMM_TILE = {80: (128, 128), 90: (128, 256), 100: (128, 256)}
# torch._grouped_mm's main-loop amortisation length: PyTorch's GroupMM.cu (aten/src/ATen/native/cuda, the
# H200's torch 2.9) runs CUTLASS 3's ptr-array grouped GEMM on sm90 (KernelPtrArrayTmaWarpSpecializedCooperative,
# 128x256x64 tiles; Pingpong 64x128x128 when a group's mean m or n <= 128), which re-points its TMA descriptors at
# every group's operands and does not overlap a tile's epilogue with the next tile's main loop: a longer fixed
# part per tile than cuBLAS's gemm_k0. Fitted on the fit set's 48 _grouped_mm rows (tests/reference/kernels/h200/
# run2.json ``grouped``: fc1, fc2, dgrad and ragged-K wgrad; bench/h200_tables.py --fit-grouped-k0), nothing
# held out: see docs/step-time.md "The MoE layers read from a profiler trace".
GROUPED_GEMM_K0 = 320.0
# Split-K: where a GEMM's output tiles leave SMs idle (decode's m 1-256 against a narrow n), cuBLASLt's heuristics
# split the K loop over the idle SMs (split-K, or CUTLASS 3's stream-K scheduler on sm90), in chunks of at least
# SPLIT_K_MIN: fitted on the H200's 192 decode GEMMs (tests/reference/kernels/h200/run2.json ``gemm_bf16`` decode
# and decode_graph, m 1-256; bench/h200_tables.py): 512, 1,024 and 2,048 give the same median error (9.7% eager,
# 8.4% CUDA graph, against 16% and 31% without a split).
SPLIT_K_MIN = 1024

# Low-precision recipes (workload.fp8_recipe, planner/recipes.py) name their GEMM-table key (Recipe.kernel_dtype):
# per-tensor scaling (delayed, tensorwise) "fp8", DeepSeek-V3's 1x128/128x128 blocks "fp8_block", "mxfp8", "nvfp4".
# activation_dtype fp8 without a recipe is TE's default, delayed per-tensor scaling.
_PEAK_DTYPE = {"fp8": "fp8", "fp8_block": "fp8", "mxfp8": "fp8", "nvfp4": "fp4", "fp8_rowwise": "fp8"}
# Weight-only formats: the GEMM's weight operand read in the stored format, dequantized to bf16 in the kernel, the
# math on the bf16 tensor cores at bf16's ceiling (an assumption: no measured Marlin / Triton MXFP4 MoE table at
# hand). MXFP4 experts (workload.EXPERT_WEIGHT_FORMATS): vLLM's default backends (quantization/mxfp4.py at
# 007d50058a06 get_mxfp4_backend: Triton's matmul_ogs or Marlin on Hopper, FlashInfer's SM100_FI_MXFP4_BF16 on
# Blackwell; the MXFP8-activation paths are opt-in env flags) all take bf16 activations (mxfp4_w4a16_moe_quant_config).
# The one home of "a weight-only GEMM computes in bf16": its math dtype (peak, clock, ceiling, activation operand).
_WEIGHT_ONLY_MATH = {"w4a16_mxfp4": "bf16"}
EXPERT_GEMM_DTYPE = {"mxfp4": "w4a16_mxfp4"}
# the (k x n) weight operand's stored bytes: the format's own (E2M1 + one E8M0 scale per 32: WEIGHT_FORMAT_BYTES)
_WEIGHT_OPERAND_BYTES = {gemm: WEIGHT_FORMAT_BYTES[fmt] for fmt, gemm in EXPERT_GEMM_DTYPE.items()}
# A weight-only kernel tiles the batch in 16-row blocks (Marlin: vLLM csrc/quantization/gptq_marlin/gptq_marlin.cu,
# ``thread_m_blocks``: "number of 16x16 blocks in the m dimension (batchsize) of the threadblock", 1-4), so a
# decode batch of a few rows pays 16 rows of math, not a 128-row tile's: its GEMVs stay bound by the weight bytes
WEIGHT_ONLY_TILE_M = 16

# Attention kernels: (forward, backward) ceiling as a fraction of the dense bf16 peak, before the shape term
# s_kv/(s_kv + s0), by kernel and generation:
# - flash2 on Hopper: this project's H200 tables (tests/reference/kernels/h200/run2.json ``attention``: torch
#   SDPA's FlashAttention-2, causal, head dim 128, 1k-32k, 12 shapes; at the SM clock each row logged, with the
#   global s0; bench/h200_tables.py fit): 0.353 forward, 0.307 backward;
# - cudnn on H100 and B200: fitted (forward, with the global s0 = 1,024) on aiconfigurator's measured causal
#   context-attention tables (TensorRT-LLM's warp-specialised FMHA, bf16, head dim 128: 85 shapes per GPU,
#   tests/reference/kernels/aiconfigurator_attention.json; bench/kernel_fit.py): 0.55 and 0.42; TransformerEngine's
#   cuDNN fused attention is the same class of kernel. Backward at FlashAttention-3's backward/forward ratio (0.76,
#   Shah et al. 2024 Fig. 5-6: ~450-500 vs ~610-640 TF/s at 8-16k). The H200's cuDNN 9.19 (torch SDPA) at its
#   logged clocks fits 0.705 forward and 0.576 backward (bench/h200_tables.py fit), 28% and 37% above: not adopted,
#   since the published attention-heavy runs (2024 stacks) come out too fast with it (Llama 3 405B CP16 at 131k:
#   MFU 50% against 38%, tests/app/test_published_layouts.py; the Megatron-Core 1.7-16B H100 runs 2-4 points
#   more), and the planner has no cuDNN version to tell a 2024 stack from cuDNN 9.19;
# - flash3 on H100: FlashAttention-3's own figures (bf16, causal, head dim 128, 8-16k) over s/(s + s0) ~ 0.9;
# - flash2 on A100: FlashAttention-2 (Dao 2023) Fig. 4-6, causal, head dim 128: ~0.6 forward, ~0.5 backward
#   (aiconfigurator's A100 table, TensorRT-LLM's older sm80 FMHA, runs 18% slower than this);
# - flash2 on Blackwell: FA2's sm80 mma.sync code reaches no more TF/s than on H100 (FlashAttention-2 §4.1
#   Fig. 7, 335 TF/s forward + backward on H100: 0.42·989 / 2,250);
# - cudnn on A100: cuDNN's fused attention on sm80 is FlashAttention-2's algorithm (cuDNN 8.9 release notes).
ATTENTION_CEILING = {
    ("flash2", 80): (0.66, 0.55),
    ("flash2", 90): (0.353, 0.307),
    ("flash2", 100): (0.19, 0.16),
    ("flash3", 90): (0.70, 0.53),
    ("cudnn", 80): (0.66, 0.55),
    ("cudnn", 90): (0.55, 0.42),
    ("cudnn", 100): (0.42, 0.32),
}
# Head dimension (gptoss): a fused attention kernel's rate at head dim d < 128 against its d-128 rate (the ceilings
# above are d 128). Per attention score a kernel does 4·d matmul FLOPs (QKᵀ and PV) and one exponential on the
# multi-function unit, which is far slower than the tensor cores (FlashAttention-3, Shah et al. 2024 §3.1: H100 SXM5
# 989 TFLOPS of FP16 matmul against 3.9 TFLOPS of special functions), so a smaller head spends a larger share of its
# time on the softmax: rate(d) / rate(128) = 1 / (1 + k·(128/d - 1)), and d >= 128 at the d-128 ceiling. k per kernel
# and pass (forward, backward) from this project's H200 (tests/reference/kernels/h200 run1.json and run2.json
# ``attention``: h16 x d64 against h8 x d128 at equal FLOPs and sequence, causal, 1k-32k keys, 12 pairs each; torch
# SDPA on cuDNN 9.19 and FlashAttention-2): median d-64 / d-128 rate cuDNN 0.767 forward, 0.818 backward (k = 1/rate
# - 1); FlashAttention-2 0.974, 0.907 (its d-128 kernel is already below the softmax bound). Blackwell's cuDNN takes
# Hopper's k: its tensor cores doubled per SM and its exponential unit did not (FlashAttention-4, Zadouri et al. 2026,
# abstract: "exponential" bottleneck), so the Hopper share is a lower bound there. FlashAttention-3 has no d-64
# measurement here: none.
HEAD_DIM_K = {"cudnn": (0.303, 0.222), "flash2": (0.027, 0.103)}
HEAD_DIM_REF = 128
# FP8 attention (workload.fp8_dot_product_attention: Megatron --fp8-dot-product-attention, TE's fp8_dpa). TE then
# runs cuDNN's fused attention whatever kernel was asked for: get_attention_backend ("Filter: Execution type")
# disables FlashAttention-2 for FP8 attention and FlashAttention-3 for FP8 training (its FP8 path is forward-only),
# FP8_DPA_KERNEL. The FP8 kernel's rate as its speedup over the same kernel in bf16, (forward, backward), applied
# to that kernel's bf16 ceiling (ATTENTION_CEILING) by the one attention model (flash_attention_s):
# - cuDNN on H100, forward: FlashAttention-3 (Shah et al. 2024) Fig. 7 (FP8 forward, H100 SXM5, head dim 128) over
#   Fig. 5 (bf16 forward, same shapes, not causal): cuDNN 886/617, 864/609, 971/600, 1,005/595 TF/s at 2k, 4k, 8k,
#   16k = 1.44, 1.42, 1.62, 1.69, mean 1.54 (FlashAttention-3's own FP8 kernel: 733/625 .. 1,008/648, 1.17-1.56);
# - cuDNN on H100, backward: FlashAttention-3 has no FP8 backward; NVIDIA's "Accelerating Transformers with NVIDIA
#   cuDNN 9" (2024) gives cuDNN SDPA "up to 2x" the best PyTorch eager in bf16 and "up to 3x" in FP8 (H200): 1.5,
#   a headline, not a per-shape table (the weakest figure here);
# - no published FP8 attention measurement on Blackwell or A100 (no FP8 tensor cores there: a recipe is a 422,
#   recipes.check_recipe_gpu): no row, the bf16 rate (an upper bound on the time), the casts below still charged.
FP8_DPA_KERNEL = "cudnn"
ATTENTION_FP8_SPEEDUP = {("cudnn", 90): (1.54, 1.5)}
# A serving engine's FP8 context (prefill) FMHA (workload.fp8_context_attention: TensorRT-LLM with quantized linears,
# serving/engines.py TRTLLM_FP8_CONTEXT_FMHA), forward only, against the same engine's bf16 kernel. "cudnn" is the
# kernel class whose Hopper and Blackwell ceilings (ATTENTION_CEILING, 0.55 / 0.42) were fitted on TensorRT-LLM's FMHA
# (aiconfigurator's context-attention tables). Each of the two kernels has its own (forward ceiling, s0), fitted per
# generation by one procedure (bench/kernel_fit.py fmha_fit: the s0 of least rms log error, then the ceiling at the
# median) on the same shapes of aiconfigurator 095f58a51c4c systems/data/{h100_sxm,b200_sxm}/attention/trtllm/
# 1.3.0rc20/context_attention_perf.parquet (tests/reference/kernels/aiconfigurator_attention_fp8.json: 85 shapes a GPU,
# causal, head dim 128, no window, isl 1,024-16,384, batch x heads >= 64; attn_dtype fp8 + kv_cache_dtype fp8, the
# collector's use_fp8_context_fmha, against bf16 + bf16): ((bf16 ceiling, s0), (fp8 ceiling, s0)). The FP8 kernel's
# rate over the bf16 one at s keys, c8 (s + s0_16) / (c16 (s + s0_8)) (context_fmha_fp8_speedup), grows with the
# prompt as the measured ratio does (H100 1.15 at 1,024 to 1.40 at 16,384; B200 1.18 to 1.28: review r14a, 3), and
# scales the model's bf16 ceiling at that s (mend14a; it replaces serve14's flat 1.244 / 1.208, the pooled medians).
# Not measured: head dims other than 128, windowed layers, MLA (aiconfigurator's MLA context tables are bf16 only:
# no FP8 MLA kernel, engine_fp8_attention), fp8 attention over a bf16 KV cache (no such rows: the fp8 + fp8 fit).
CONTEXT_FMHA_FP8 = {
    ("cudnn", 90): ((0.589, 1408.0), (0.853, 2048.0)),
    ("cudnn", 100): ((0.581, 2560.0), (0.761, 2944.0)),
}
# The casts TE's FusedAttnFunc adds around an FP8 attention whose inputs and output are bf16 (TransformerEngine
# d0067d0da attention/dot_product_attention/backends.py FusedAttnFunc, utils.py combine_and_quantize): forward,
# Q, K and V concatenated (torch.cat of the three, separate sbhd layouts as Megatron passes them: read 2, write 2)
# and quantized as one tensor (the recipe's cast bytes: read, write 1; its quantize launches; MXFP8 quantizes each
# in place, no cat), the output dequantized (out_.dequantize(): read 1, write 2) where the kernel wrote it as fp8
# (delayed scaling only: Recipe.dpa_fp8_output); backward in FP8 (NVTE_FP8_DPA_BWD, default 1:
# workload.fp8_dpa_backward), the output gradient quantized (dO_quantizer; MXFP8: mxfp8_quantize_fast_path) and dQ,
# dK, dV dequantized (combine_and_dequantize: read 1, write 2) where the kernel wrote them as fp8 (delayed scaling
# only, the same trait). A bf16 backward reads the saved bf16 q, k, v.
FP8_DPA_CAT_BYTES = 4
FP8_DPA_DEQUANTIZE_BYTES = 3
# the quantizer calls of Q, K, V under MXFP8, one a tensor (no cat): TE's own MXFP8 reference quantizes
# ``[quantizer(x) for x in [q, k, v]]`` (tests/pytorch attention _UnfusedDPAQuantizationEmulator, the MXFP8 branch
# beside combine_and_quantize's); each call takes the recipe's quantize launches. The output and dQ, dK, dV come out
# of the MXFP8 (and current-scaling) kernel in bf16, with no dequantize (Recipe.dpa_fp8_output; docwait10)
FP8_DPA_QKV_TENSORS = 3


def head_dim_rate(kernel: str, d: float) -> tuple[float, float]:
    """(forward, backward) rate of ``kernel`` at head dim ``d`` as a fraction of its d-128 ceiling (HEAD_DIM_K)."""
    k_f, k_b = HEAD_DIM_K.get(kernel, (0.0, 0.0))
    extra = max(0.0, HEAD_DIM_REF / d - 1.0) if d else 0.0
    return 1.0 / (1.0 + k_f * extra), 1.0 / (1.0 + k_b * extra)


FLASH3_GENERATIONS = (90,)  # FlashAttention-3 is Hopper-only (wgmma/TMA; flash-attention hopper/ README)
FLASH_BWD = 2.5  # FlashAttention-2 §3.1.2: backward = 5 matmuls of the 2 the forward does
FLASH_BWD_KERNELS = 3  # backward preprocess (dO·O), the main kernel, and dQ's conversion (flash_bwd_launch_template)

# Unfused core attention (Megatron-LM 2021-2022 CoreAttention): bytes per score moved by the softmax and dropout
# kernels between the two batched GEMMs (2-byte scores; dropout mask 1 byte); (forward, backward).
# The softmax of a causal GPT is Megatron's fused scaled_upper_triang_masked_softmax (megatron/model/fused_softmax.py
# at 6985e58, the SC'21 code, and at the 2022 code: used for fp16/bf16 scores with s_k <= 2048, AttnMaskType.causal).
# Its kernels (megatron/fused_kernels/scaled_upper_triang_masked_softmax.h at 6985e58) load only the row's unmasked
# elements (``element_index < local_seq``, local_seq = row + 1: half the square on average) and store the whole row
# (zeros above the diagonal): forward read 2 x 1/2 + write 2 = 3 B a score; backward read the gradient and the output
# (2 + 2) x 1/2 + write 2 = 4 B. torch.nn.Dropout after it (PyTorch's fused_dropout: read 2, write 2 and a 1-byte
# mask; backward masked_scale: read the gradient and the mask, write 2) sees the whole square: 5 and 5 B.
UNFUSED_SOFTMAX_BYTES = (3, 4)
# That kernel runs only where fused_softmax.py at 6985e58 (FusedScaleMaskSoftmax.forward) allows it: 16-bit scores,
# ``key_seq_len > 16 and key_seq_len <= 2048 and query_seq_len % 4 == 0 and attn_batch_size % 4 == 0`` (b·np
# score matrices) and a causal square (sq == sk). Otherwise forward_torch_softmax runs torch ops over the whole
# square, with the default --apply-query-key-layer-scaling (arguments.py: --no-query-key-layer-scaling is store_false;
# transformer.py then sets attention_softmax_in_fp32 and scale = layer_number): input.float() (read 2, write 4),
# input * scale (4, 4), utils.py attention_mask_func's masked_fill_ (read 4 and the 1-byte mask, write 4), Softmax
# (4, 4), probs.bfloat16() (4, 2): 37 B a score in 5 kernels; backward the casts' (2, 4) and (4, 2), Softmax's (read
# the gradient and the output 4 + 4, write 4), masked_fill's (4 + 1, 4), the scale's (4, 4): 41 B in 5. fp32 scores
# skip the two casts: (25, 29) B in 3. (55ba1f7b96, 2022, widened the bound to s_k <= 4096 with a batch-per-block
# rule: not modelled, the 2021 bound is kept.)
UNFUSED_SOFTMAX_FUSED_MAX_KEYS = 2048
UNFUSED_SOFTMAX_TORCH = {2: ((37, 5), (41, 5)), 4: ((25, 3), (29, 3))}  # score bytes: ((fwd B, kernels), (bwd ...))
UNFUSED_DROPOUT_BYTES = (5, 5)
# That dropout draws its mask with Philox: PyTorch's fused_dropout_kernel_vec (aten/src/ATen/native/cuda/Dropout.cu,
# the same kernel in PyTorch 1.8 of the SC'21 container nvcr.io pytorch:20.12 and in 2.11) seeds a Philox4x32-10 state
# per thread (curand_init) and draws curand_uniform4 per 4 elements: ten rounds of 32-bit multiplies, xors and adds
# per 4 elements, work for the SM's integer pipes rather than the HBM. Measured on this project's H200
# (tests/reference/kernels/h200/dropout_bmm.json; torch 2.11, fp16, p 0.1, CUDA events over back-to-back launches at
# 1,980 MHz): the forward over 2^30 elements takes 1.717 ms, 3.13 TB/s of its 5 B an element where a copy of the same
# tensor reaches 4.28 TB/s and the backward (masked_scale, no RNG, 5 B) 4.38 TB/s: issue-bound at 1.717e-3 x 1.98e9
# x 132 / 2^30 = 0.42 SM-cycles an element (0.42 at 2^28 too): the Hopper value, and the one for generations with
# no measurement of their own (DROPOUT_RNG_SM_CYCLES_BY_GEN). The forward takes the longer of its bytes and its draws
# (dropout_rng_s); the backward has no RNG. (The PyTorch 1.8-era kernel, THC headers and a uint8 mask, draws the same
# way: curand_init per thread, curand_uniform4 per 4 elements.)
DROPOUT_RNG_SM_CYCLES = 0.42
# The A100 draws at its own rate, FITTED ON KERNEL TABLES ONLY: FlashAttention (Dao et al. 2022, arXiv 2205.14135)
# Appendix E.6 times standard attention on an A100 40GB (batch 16, 8 heads, head dim 64, fp16) with and without
# dropout 0.1 (tests/reference/kernels/a100/flashattention_tables.json). What dropout adds, Table 15 less Table 18
# (forward) for its PyTorch and Megatron rows at s 512, 1,024, 2,048: 0.14/0.14, 0.53/0.55, 2.24/2.28 ms over 16 x 8 x
# s^2 scores; least squares through the origin (less one launch each, bench/a100_attention_check.py
# fitted_draw_cycles) x 108 SMs x 1,410 MHz: 0.64 SM-cycles a score. Held out: PyTorch at s 4,096 (25.34 - 16.47 =
# 8.87 ms, 0.63) and with masking (Table 9 less Table 12: 0.15, 0.61, 2.25 ms). Not its bytes: the same 5 B a score
# run backward (masked_scale, no RNG; Table 16 less Table 19: 1.95/1.94 ms at s 2,048, 7.80 at 4,096) stream at
# 0.88-0.89 of the 40GB part's 1,555 GB/s, the model's 0.877; the forward's 5 B would take 3.67 ps a score at that
# rate and it takes 4.2. So on the 80GB A100 of the published runs (2,039 GB/s, the same SMs and clock) the forward
# is set by its draws, 1.5x its bytes. Why sm80 spends 1.5x Hopper's cycles is not known here: the CUDA C++
# Programming Guide's throughput table gives both compute capabilities the same 64 32-bit integer multiply-adds a
# clock per SM (as a100b read it, which is why the H200's value had been assumed for the A100), and the kernel was not
# profiled on either (no SASS or ncu run).
DROPOUT_RNG_SM_CYCLES_BY_GEN = {80: 0.64}
# Attention dropout inside a fused attention kernel (cuDNN, FlashAttention-2: dropout_p > 0, GPT-style recipes at
# Megatron-LM's --attention-dropout 0.1, arguments.py f2e5db402c l.947; memory.attention_dropout): the kernel draws a
# Philox number per attended score in the forward and draws it again in the backward (no mask is saved), SM work on
# top of the kernel's tensor-core time. SM-cycles per attended score (b x heads x queries x attended keys, the scores
# the FLOPs count: attention_flops / (2 (qk + v))), (forward, backward), per backend: FITTED ON
# tests/reference/kernels/h200/attention_dropout_h200.json ONLY (the lead's H200 run of
# bench/measure_attention_dropout.py: cuDNN 9.19 and FlashAttention-2 via SDPA, torch 2.11, causal bf16, b 1,
# s 4,096, d 128, 16/12/7 heads, dropout 0 vs 0.1, SM clock 1,980 MHz, 132 SMs): least squares through the origin of
# the dropout's extra seconds against the attended scores over the three head counts, forward from fwd_s, backward
# from fwd_bwd_s less the forward's extra. Per row: cuDNN forward 0.323/0.350/0.444 at 16/12/7 heads, backward
# 0.192/0.209/0.274; FA2 forward 0.128/0.148/0.198, backward 0.199/0.225/0.259 (the 7-head rows' 224 query tiles fill
# 132 SMs in two uneven waves: the constant under-charges small per-rank head counts by up to 25%).
# Other generations: the same SM-cycles a score at their own SMs and clock (sm_cycles_s; an assumption: on sm80 torch's
# own dropout draws at 1.5x Hopper's cycles, DROPOUT_RNG_SM_CYCLES_BY_GEN, and no fused kernel's draws were measured
# there; no published A100 run runs a fused attention); Blackwell has no SM clock here and is charged none
# (dropout_rng_s's rule). FlashAttention-3 and FP8 attention: not measured and not charged
# (FlashAttention-3's Hopper kernels take no dropout; TE's FP8 attention runs cuDNN, this table's cuDNN row is bf16).
FUSED_DROPOUT_SM_CYCLES = {"cudnn": (0.345, 0.206), "flash2": (0.142, 0.214)}
# The layout copies around it (the same CoreAttention, transformer.py at 6985e58; ParallelAttention/CoreAttention of
# 2022): forward the context's ``permute(2, 0, 1, 3).contiguous()`` from [b·np, s, hn] back to [s, b, np·hn] (read and
# write the output: 2 passes of its elements); backward torch.split's SplitBackward concatenates the q, k and v
# gradients into mixed_x_layer's (read and write q + k + v: 2 passes). The q/k/v views that feed baddbmm and bmm and
# their gradients' reshapes stay views (merging b and np keeps strides). A fused attention kernel (TE, flash) reads
# and writes the [s, b, np, hn] layout itself: none of these.
UNFUSED_LAYOUT_PASSES = 2
# Megatron-LM's own linears (Flavour.local_linear_biases; planner/flavours/megatron_lm.py has the source lines): the
# QKV bias add reads and writes the QKV output (2 passes); each bias gradient reads its output's gradient once
# (a reduction over the tokens: QKV and fc1 over the full tokens at their 1/t width; the attention's dense and fc2
# biases, full width h, over the tokens of the bias-dropout-add, 1/t of them under SP)
LOCAL_BIAS_BYTES = (2, 1)

# FP8 (TransformerEngine): cast each GEMM operand to fp8 with its transposed copy (cast_transpose: read bf16 2 B,
# write fp8 1 B twice) = 4 bytes per element of each forward GEMM's input and weight; amax reduction fused.
FP8_CAST_BYTES = 4

# Adam step per local parameter (apex / TE FusedAdam): read fp32 grad (4), read/write fp32 master weight, m and
# v (24), write bf16 weight (2), zero the grad (4) = 34 bytes.
ADAM_BYTES = 34

# torch.optim.AdamW over FSDP2's sharded fp32 parameters, gradients (reduce dtype fp32) and state, bytes per local
# parameter (workload.optimizer_implementation; the flavour trait torch_optimizer). "fused": _fused_adamw_ reads the
# parameter, gradient, exp_avg and exp_avg_sq and writes back three = 28 B (FSDP2 casts to bf16 in its all-gather,
# zero_grad sets the gradients to None: no bf16 copy, no zeroing). "foreach": _multi_tensor_adamw (pytorch 002d2f0b
# torch/optim/adamw.py, the non-capturable path): _foreach_mul_(params) 8, _foreach_lerp_(exp_avgs, grads) 12,
# _foreach_mul_(exp_avg_sqs) 8, _foreach_addcmul_(exp_avg_sqs, grads, grads) 12, _foreach_sqrt 8, _foreach_div_ 8,
# _foreach_add_(eps) 8, _foreach_addcdiv_(params, exp_avgs, denom) 16 = 80 B. torchtitan 9dec370 builds AdamW with
# foreach=not --optimizer.fused (store_true: foreach), 820504e with optimizer.implementation "fused" (its default).
TORCH_ADAMW_BYTES = {"fused": 28, "foreach": 80}
# torchtitan's clip_grad_norm_ every step (training.max_norm 1.0 by default; 9dec370 torchtitan/utils.py and 820504e
# torchtitan/distributed/utils.py): torch.nn.utils.get_total_norm's _foreach_norm reads each gradient (4 B), then
# clip_grads_with_norm_ multiplies every gradient by the clamped coefficient unconditionally ("avoids a `if clip_coef
# < 1:` conditional", torch/nn/utils/clip_grad.py): 4 + 8 = 12 B per local fp32 gradient
CLIP_GRAD_NORM_BYTES = 12


# Megatron-LM's Float16OptimizerWithFloat16Params before the distributed optimizer (megatron/optimizer/optimizer.py
# step() at 6985e58, the SC'21 code; the same steps at 55ba1f7b96), as passes of its own over each local parameter,
# bytes per parameter (Flavour.float16_optimizer_passes; megatron_lm_optimizer_bytes):
# - _copy_model_grads_to_main_grads: ``main_param.grad = model_param.grad.float()`` (or ``main_grad.float()``):
#   read the gradient, write it in fp32 (param bytes + 4), nothing where the gradient is already fp32 (``.float()``
#   returns the tensor itself: 55ba1f7b96 forces --accumulate-allreduce-grads-in-fp32 under bf16);
# - _unscale_main_grads_and_check_for_nan, only with a grad scaler (--fp16; bf16 has none):
#   torch._amp_foreach_non_finite_check_and_unscale_ reads and writes each fp32 gradient: 8;
# - clip_grad_norm_fp32 (--clip-grad 1.0, the default and the SC'21 CONFIG.sh's): amp_C.multi_tensor_l2norm reads each
#   gradient: 4 (the multi_tensor_scale that follows runs only when the norm exceeds 1: not charged, it is data);
# - apex FusedAdam (multi_tensor_adam: read the fp32 parameter, gradient, exp_avg and exp_avg_sq, write three): 28;
# - _copy_main_params_to_model_params: amp_C.multi_tensor_scale reads the fp32 master and writes the model's
#   16-bit parameter: 4 + param bytes.
# zero_grad(set_to_none=True) frees the gradients instead of writing them (0).
MEGATRON_LM_OPTIMIZER = {"unscale": 8, "l2norm": 4, "adam": 28, "master_read": 4}


def megatron_lm_optimizer_bytes(ctx: Context) -> float:
    """Bytes per local parameter of Megatron-LM's Float16OptimizerWithFloat16Params step (MEGATRON_LM_OPTIMIZER):
    the gradient's fp32 copy unless it is fp32 already, the unscale under fp16's loss scale, the norm, Adam and the
    copy back into the 16-bit parameter. fp16 with fp16 gradients: 6 + 8 + 4 + 28 + 6 = 52 B; bf16 with fp32 main
    gradients: 38 B."""
    t = MEGATRON_LM_OPTIMIZER
    copy_grads = 0.0 if ctx.grad_bytes >= 4 else ctx.grad_bytes + 4
    unscale = t["unscale"] if ctx.work.param_dtype == "fp16" else 0
    return copy_grads + unscale + t["l2norm"] + t["adam"] + t["master_read"] + ctx.param_bytes


# Megatron-Core's optimizer step, bytes per parameter of the optimizer's shard (all local parameters without the
# distributed optimizer), Megatron-LM f2e5db402c (July 2024) and d98e8a6 alike: megatron/core/optimizer/optimizer.py
# MixedPrecisionOptimizer.step -> prepare_grads (the main gradient is the fp32 grad buffer's view: ``.float()`` copies
# nothing, and bf16 has no grad scaler to unscale), clip_grad_norm (--clip-grad 1.0 by default, arguments.py;
# clip_grads.py get_grad_norm_fp32: amp_C.multi_tensor_l2norm reads each fp32 gradient: 4; the scale that follows
# runs only when the norm exceeds the clip: data, not charged), step_with_ready_grads: TransformerEngine's (or
# apex's) FusedAdam (multi_tensor_adam: read the fp32 master, gradient, exp_avg and exp_avg_sq, write three: 28),
# then _copy_main_params_to_model_params (distrib_optimizer.py: ``shard_model_param.data.copy_(shard_main_param)``,
# optimizer.py Float16OptimizerWithFloat16Params: _multi_tensor_copy_this_to_that): read the fp32 master (4) and
# write the parameter in its dtype (param bytes). bf16: 4 + 28 + 4 + 2 = 38 B.
MEGATRON_CORE_OPTIMIZER = {"l2norm": 4, "adam": 28, "master_read": 4}


def megatron_core_optimizer_bytes(ctx: Context) -> float:
    """Bytes per parameter of the optimizer's shard of Megatron-Core's optimizer step (MEGATRON_CORE_OPTIMIZER): the
    norm, Adam and the master's copy into the parameter (38 B under bf16). The gradient buffer's zeroing is over
    every local parameter, sharded or not (grad_buffer_bytes)."""
    return sum(MEGATRON_CORE_OPTIMIZER.values()) + ctx.param_bytes


def grad_buffer_bytes(ctx: Context) -> float:
    """Bytes per local parameter (the rank's whole gradient buffer, not the optimizer's shard) that the step writes
    every iteration under a flavour that runs Megatron-Core's optimizer (Flavour.core_optimizer_passes): the train
    step's ``model_chunk.zero_grad_buffer()`` (Megatron-LM f2e5db402c megatron/training/training.py l. 585, d98e8a6
    l. 3041) runs ParamAndGradBuffer.reset, ``self.grad_data.zero_()`` over the buffer in the gradient-reduction
    dtype (param_and_grad_buffer.py l. 503-508 at f2e5db402c: fp32 under bf16, arguments.py forces
    --accumulate-allreduce-grads-in-fp32). The DDP's NaN check of each bucket's gradient norm before its reduction
    (Bucket.start_grad_sync, ddp_config.check_for_nan_in_grad) is on in Megatron-LM's own loop
    (--check-for-nan-in-loss-and-grad, default on) but off in DistributedDataParallelConfig's default, which
    Megatron-Bridge and NeMo keep: not charged (no switch says which loop ran). 0 under other flavours."""
    f = ctx.flavour
    if not f.core_optimizer_passes or f.float16_optimizer_passes or f.torch_optimizer:
        return 0.0
    return float(ctx.grad_bytes)


def optimizer_bytes(ctx: Context) -> float:
    """HBM bytes of the optimizer step per local parameter: torch.optim's AdamW as the workload names its
    implementation (TORCH_ADAMW_BYTES, default fused) and the gradient clipping (CLIP_GRAD_NORM_BYTES) under a flavour
    that runs them (Flavour.torch_optimizer); Megatron-LM's fp16/bf16 optimizer's passes under a flavour that runs it
    (Flavour.float16_optimizer_passes: megatron_lm_optimizer_bytes); Megatron-Core's under a flavour that runs it
    (Flavour.core_optimizer_passes: megatron_core_optimizer_bytes, its gradient zeroing in grad_buffer_bytes); else a
    fused Adam with its bf16 copy and the gradient zeroing (ADAM_BYTES)."""
    if ctx.flavour.float16_optimizer_passes:
        return megatron_lm_optimizer_bytes(ctx)
    if ctx.flavour.core_optimizer_passes and not ctx.flavour.torch_optimizer:
        return megatron_core_optimizer_bytes(ctx)
    if not ctx.flavour.torch_optimizer:
        return ADAM_BYTES
    return TORCH_ADAMW_BYTES[ctx.work.optimizer_implementation or "fused"] + CLIP_GRAD_NORM_BYTES


@dataclass(frozen=True)
class Fusion:
    """Memory-bound kernels of a layer by how they are fused: bytes per element of each tensor they touch
    (forward) and how many kernels each launches. Backward: BACKWARD_BYTES x the bytes, the same launches."""

    norm: tuple[float, int]  # per element of h (RMSNorm/LayerNorm): bytes, kernels
    rotary: tuple[float, int]  # per element of q and k
    gated_act: tuple[float, int]  # per element of the ffn output (SwiGLU: reads 2, writes 1)
    act: tuple[float, int]  # per element of the ffn output (GeLU)
    residual: tuple[float, int]  # per element of h, each of the two residual adds (with bias/dropout)
    loss: float  # bytes per logit of the cross entropy, forward
    # the MoE combine as an atomic scatter-add of the routed rows into their tokens (SCATTER_ADD_HBM), not a
    # streamed reduce
    atomic_combine: bool = False


# Megatron-Core + TransformerEngine (and torch.compile, whose Inductor fuses the same chains): one kernel each;
# norm reads and writes h (2 + 2 B); rotary reads and writes q, k (apply_rope_fusion); SwiGLU reads 2f, writes f
# (bias_swiglu_fusion); GeLU reads and writes f; bias-dropout-add reads 2h, writes h; the fused vocab-parallel
# cross entropy reads and writes fp32 logits (4 + 4 B).
FUSED = Fusion(norm=(4, 1), rotary=(4, 1), gated_act=(6, 1), act=(4, 1), residual=(6, 1), loss=8)
# PyTorch eager (torchtitan without compile): RMSNorm is nn.RMSNorm (torchtitan 6404b93
# torchtitan/models/llama3/model/model.py TransformerBlock), i.e. F.rms_norm, which PyTorch 2.11 runs as one kernel
# on CUDA (this project's H200, tests/reference/kernels/h200/run2.json ``memory_bound``: rms_norm_fused 44 us for 67
# MB in and out, against 442 us for Hugging Face's fp32 op chain): read 2 write 2 B per element, 1 kernel; rotary
# via view_as_complex: upcast, complex mul, cast (2 -> 4, 4 -> 4, 4 -> 2: 20 B, 3
# kernels per tensor); SwiGLU silu(w1 x) then * w3 x (2 -> 2, 2 + 2 -> 2: 10 B, 2 kernels); residual add 6 B;
# cross entropy upcasts the bf16 logits, log-softmax and NLL (2 -> 4, 4 -> 4, read 4: 18 B).
# The MoE combine: torchtitan scatter-adds the weighted expert outputs into the tokens in bf16 (moe.py,
# ``scatter_add`` over token_indices_experts_sorted), top-k rows per token: atomic adds (atomic_combine).
EAGER = Fusion(
    norm=(4, 1), rotary=(20, 3), gated_act=(10, 2), act=(4, 1), residual=(6, 1), loss=18, atomic_combine=True
)
# bf16 atomic scatter-add throughput as a fraction of the HBM datasheet bandwidth, per byte of the rows added:
# torch index_add_ of 65,536 rows x 4,096 into 8,192 on this project's H200 (tests/reference/kernels/h200/run1.json
# and run2.json ``memory_bound`` moe_scatter_add.h4096: 2.20 ms both runs) = 1.22e11 adds/s x 2 B = 0.244 TB/s of
# the 4.8 TB/s: 0.0508; other GPUs taken at the same fraction of their HBM. Megatron-Core's unpermute without
# --moe-permute-fusion scatter-adds too (moe_utils.unpermute ``scatter_add_``), after the fp32 probs promote the
# rows: fp32 atomics, not measured here, so FUSED does not charge it.
SCATTER_ADD_HBM = 0.0508
BACKWARD_BYTES = 2.0  # backward elementwise kernels read the forward's inputs and the gradient and write two

# torchtitan's RMSNorm of norm_type "rmsnorm" as it ran in its 2024 benchmarks (torchtitan 9dec370
# torchtitan/models/norms.py RMSNorm: ``self._norm(x.float()).type_as(x) * self.weight``, ``_norm(x) = x *
# torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)``; F.rms_norm of those years is the same chain, aten
# layer_norm.cpp rms_norm_symint), eager, bf16 activations and weight (FSDP2 param_dtype bf16), bytes per element of
# the normalised tensor and kernels (workload.norm_kernel "ops"). Forward: x.float() (read 2, write 4), pow (4 + 4),
# mean (read 4), + eps and rsqrt (over the b·s row values only), x * r (4 + 4), type_as (4 + 2), * weight (2 + 2) =
# 36 B in 8 kernels. Backward, autograd's formulas (tools/autograd/derivatives.yaml, FunctionsManual.cpp): * weight's
# grad x weight (2 + 2) and grad x the normalised rows (2 + 2 + 2) summed over the tokens (read 2); type_as's
# ToCopyBackward to fp32 (2 + 4); x * r's grad x r (4 + 4) and grad x x (4 + 4 + 4) summed over h (read 4); rsqrt's
# -0.5 * grad * result.pow(3) (3 kernels over the row values); mean_backward's expand / n (write 4); pow_backward's
# grad * (2 * x.pow(1)) (pow(1) a copy 4 + 4, the scalar multiply 4 + 4, the product 4 + 4 + 4); the two paths' sum
# into x.float()'s gradient (4 + 4 + 4); x.float()'s ToCopyBackward to bf16 (4 + 2) = 92 B in 16 kernels.
RMSNORM_OPS = ((36, 8), (92, 16))

# Megatron-LM's MixedFusedLayerNorm as it ran before the persistent kernel (workload.norm_kernel "apex"): the kernels
# of megatron/fused_kernels/layer_norm_cuda_kernel.cu at 6985e58 (the SC'21 code), apex's of that date: forward
# cuApplyLayerNorm (one block a row: cuWelfordMuSigma2 reads the row, the apply loop reads it again, unvectorised),
# backward cuComputePartGradGammaBeta (reads x and dout), cuComputeGradGammaBeta (the partials) and
# cuComputeGradInput (reads x and dout for the row sums, then again to write dx): 3 kernels. Its time on the A100,
# published against apex's persistent FastLayerNorm (apex.contrib.layer_norm, NVIDIA/apex PR #1037, 2021-01-27:
# "Performance for B=32, S=512 on GA100", hidden 1024, fp16): forward 0.0751 ms (895.8 GB/s over 4 B an element)
# against 0.0535 ms (1258.0 GB/s), backward 0.1762 ms (572.2 GB/s over 6 B) against 0.0866 ms (1163.4 GB/s). Priced
# as the persistent kernel's bytes (4 B forward, 6 B backward: read x and dout once, write dx) at the streaming rate
# of every memory-bound kernel, times those measured ratios: bytes-equivalent per element and kernels each way. By
# the bytes of the code alone the ratios would be 6/4 and 10/6 (the rows read twice); the measurement says 1.40 and
# 2.03. Megatron-LM 55ba1f7b96 (Korthikanti et al. 2022) runs FastLayerNormFN for the hidden sizes of its
# persist_ln_hidden_sizes (megatron/model/fused_layer_norm.py; --no-persist-layer-norm store_true, so on by default
# with PyTorch >= 1.11) and this kernel for the others (Flavour.persist_layer_norm_sizes).
APEX_LAYER_NORM = ((4 * 1258.0 / 895.8, 1), (6 * 1163.4 / 572.2, 3))

# torch's loss parallelism (workload.loss_parallel; torch/distributed/tensor/parallel/loss.py, pytorch 02eef6b8)
# over torchtitan's ``F.cross_entropy(pred.flatten(0, 1).float(), labels)`` (torchtitan 9dec370 train.py loss_fn),
# bytes per logit of the rank's vocabulary shard and kernels over the logits. Forward: .float() (read 2, write 4),
# _log_softmax's amax (read 4), x - max (4 + 4), exp (4 + 4), sum (read 4), shifted - logsumexp (4 + 4) = 38 B in 6
# kernels (its x.to(fp32) and the result's .to(fp32) are no-ops on fp32 logits). Backward
# _nll_loss_and_log_softmax_backward: zeros_like (write 4), exp(x) (4 + 4), grad_input + exp (4 + 4 + 4),
# * grad_output (4 + 4); the log_softmax backward handler's .to(fp32) is a no-op; .float()'s ToCopyBackward to bf16
# (4 + 2) = 38 B in 5 kernels. The target masking's kernels over the b·s targets are not counted.
LOSS_PARALLEL_CROSS_ENTROPY = ((38, 6), (38, 5))

# Megatron's cross entropy without --cross-entropy-loss-fusion (megatron/core/tensor_parallel/cross_entropy.py at
# f2e5db402c; megatron/mpu/cross_entropy.py of 2021 runs the same ops), bytes per logit and kernels: forward the
# fp32 upcast (read 2, write 4), max (read 4), subtract the max (read and write 4), exp (4 + 4), sum (4) and the
# softmax's divide (4 + 4) = 38 B in 6 kernels; backward the softmax times the gradient (4 + 4) and the cast back
# to bf16 (read 4, write 2) = 14 B in 2 kernels (the target's one-hot update touches a logit per token).
UNFUSED_CROSS_ENTROPY = ((38, 6), (14, 2))

# MLA's RoPE under Megatron-Core's rope fusion (MLA_ROPE_KERNELS; apply_rope_fusion, which the Megatron-Bridge 25.11
# performance scripts set: scripts/performance/utils/overrides.py _set_common_perf_overrides l. 55 at 5776a6d90b).
# Megatron-LM 92c8482e6d (Megatron-Bridge 5776a6d90b's submodule) multi_latent_attention.py
# qkv_up_proj_and_rope_apply (l. 681-806) calls fused_apply_mla_rope_for_q and fused_apply_mla_rope_for_kv
# (megatron/core/fusions/fused_mla_yarn_rope_apply.py) instead of the torch split / rotary / cat path:
# - rotary_fwd_q_kernel rotates the rope slice (qk_rope_head_dim) of each head of q in place: read and write n x rope;
#   its backward does the same on dq;
# - rotary_fwd_kv_kernel reads the kv up-projection's output (n x (qk_nope + v)) and the shared k_pe (rope, once per
#   token) and writes a new key (n x (qk_nope + rope), k_pe rotated and broadcast to every head) and value (n x v):
#   the split and the concatenation the unfused path runs as torch.cat / .contiguous(); its backward reads dk and dv,
#   writes d_kv (n x (qk_nope + v)): its per-head load reads only dk's nope part (dk_in_off over k_dim =
#   qk_nope_head_dim), and the head-block-0 program alone reads dk's rope slices of every head (so dk is read once,
#   n x (qk_nope + rope)) and writes d_k_pe (rope). The cos / sin tables (s x rope, fp32) are read per token and
#   left out (<= 0.5% of these bytes at 128 heads). DeepSeek-V3 at tp 1 (n 128, nope 128, rope 64, v 128, bf16):
#   180,352 B a token forward and 180,352 B backward (mend8b: was 196,736, dk's rope slices counted twice); the
#   generic rotary charge (q and k_pe read and written, 4 B) was 33,024 and 66,048.
MLA_ROPE_KERNELS = 2
# The memory-bound kernels inside the checkpoint of ``--recompute-modules mla_up_proj`` (multi_latent_attention.py
# at 92c8482e6d l. 808-812: CheckpointWithoutOutput over qkv_up_proj_and_rope_apply, which runs q_layernorm and
# kv_layernorm (TE fuses each into its up-projection's LayerNormColumnParallelLinear: the norm kernel still runs),
# the two up-projections and the RoPE): the backward re-runs them beside the up-projections' GEMMs.
MLA_UP_PROJ_KERNELS = ("q_norm", "kv_norm", "mla_rope", "rotary")
# Ops a fusing framework still runs unfused (Flavour traits; gptoss), bytes per element of bf16 tensors and kernels,
# (forward, backward):
# - RoPE as torch ops (Flavour.unfused_rope_scalings; Megatron-LM rope_utils._apply_rotary_pos_emb_bshd at 92c8482,
#   the 25.11 container's, and d98e8a6), per element of q and of k: t * cos_ (read 2, write 2), _rotate_half's -x2
#   (half the elements read and written: 2) and torch.cat((-x2, x1)) (4), * sin_ (4), the add (read 4, write 2),
#   torch.cat((t, t_pass)) (4) = 24 B in 6 kernels; its autograd: grad * cos_ (4), grad * sin_ (4), the negation's
#   (2), the chunk's cat of the halves' gradients (4), the two paths' sum (6), the slice t[..., :rot_dim]'s zeros
#   and copy (6), and the empty t_pass's: its SliceBackward still writes a zero tensor of q's size (2; cat's
#   backward gives an empty input a defined empty gradient), added to the first (6) = 34 B in 9 kernels;
# - each of those calls (q, k) first builds cos_ and sin_ from the fp32 frequencies, (cos(freqs) * mscale).to(bf16)
#   and the same for sin: 6 kernels, 22 B each way per element of the s x rot_dim frequencies (ROPE_FREQS);
# - the GLU clamp as its own ops (Flavour.eager_glu_clamp; Megatron fused_bias_geglu.weighted_bias_quick_geglu_impl),
#   per element of the activation's output: x_glu.clamp(max=v) and x_linear.clamp(-v, v) read and write a half each
#   (4 + 4), torch.cat of the two (read 4, write 4) = 16 B in 3 kernels; backward PyTorch's clamp_backward
#   (FunctionsManual.cpp): the one-sided clamp's where(x <= max, grad, 0) after the compare (1-byte mask: 3 + 5 B),
#   the two-sided one's x >= min, x <= max, logical_and_ and where (3 + 3 + 3 + 5 B), each with its scalar zero's
#   fill, and the chunk's cat of the halves' gradients (8) = 30 B in 9 kernels;
# - the attention's bias-dropout-add unfused (Flavour.expert_bias_loop on a biased MoE): x + bias (read 2, write 2)
#   before the residual add (dropout 0 launches nothing: torch dropout returns its input at p = 0), per element of
#   h; backward the bias gradient, a sum over the tokens (read 2).
UNFUSED_ROPE = ((24, 6), (34, 9))
ROPE_FREQS = (44, 6)
GLU_CLAMP = ((16, 3), (30, 9))
# Of GLU_CLAMP's bytes, those its kernels move through a strided half of fc1's output (forward the two clamps' 8 B;
# backward the three compares' 9 B and the two where's 10 B): TensorIterator vectorizes only contiguous operands
# (PyTorch aten/src/ATen/native/cuda/CUDALoops.cuh gpu_kernel_impl_nocast: launch_vectorized_kernel when
# iter.is_contiguous(), else elementwise_kernel<128, 4> through an offset calculator: the kernel the profiles name for
# clamp, compare and where). Measured at GPT-OSS's shape (65,536 rows x 2 x 2,880 bf16, tests/reference/kernels/
# h200/glu_act.json and h100/glu_act.json, each kernel by name under torch.profiler): the seven strided kernels of one
# clamp forward and backward moved their 27 B an element at 1.47 TB/s on the H200 and 1.43 TB/s on the H100, whose
# copies ran at 4.07 and 2.92 TB/s: one rate on two GPUs of the same SMs and clock (132 at 1,980 MHz) and different
# HBM, so an issue rate, not a share of the HBM: 5.64 and 5.47 B an SM-cycle, STRIDED_BYTES_PER_SM_CYCLE their mean.
# A strided byte moves at the lower of that rate (x SMs x SM_CLOCK_MHZ; Blackwell's clock is not in that table:
# Hopper's 1,980 MHz is taken, an assumption) and the copy rate; the contiguous cat and logical_and ran at a copy's.
GLU_CLAMP_STRIDED = (8, 19)
STRIDED_BYTES_PER_SM_CYCLE = 5.55
# Megatron's weighted GLU backward (fusions/fused_bias_swiglu.py weighted_swiglu_back l. 90-97, fused_bias_geglu.py
# weighted_quick_geglu_back, at 92c8482e6d; Flavour.weighted_act_grad): the input gradient's kernel (read the
# gradient and fc1's output, write its gradient: 10 B per element of the R x f output) and the probs' gradient,
# torch.sum(act(y) * g, dim=-1), a reduction Inductor emits as its own kernel (read fc1's output and the gradient
# again: 6 B; the H200 run above: triton_poi_fused_..._cat_... and triton_red_fused_..._sum_1): 16 B in 2 kernels,
# against the plain fused backward's 12 B in 1: + WEIGHTED_ACT_GRAD (bytes, kernels).
WEIGHTED_ACT_GRAD = (4, 1)
UNFUSED_BIAS_ADD = ((4, 1), (2, 1))
# Megatron's flex dispatchers carry the router probs in fp32 (token_dispatcher.py at 92c8482: "HybridEP only supports
# float32 probs", "DeepEP only supports float32 probs", upcast); the alltoall and allgather ones in the router's dtype,
# the input's (bf16) unless --moe-router-dtype (router.py gating)
FP32_PROBS_DISPATCH = ("deepep", "hybridep")

# Which fusion a framework runs by default is its flavour's ``fused_kernels`` trait: Megatron-Core with
# TransformerEngine fuses; PyTorch-native trainers (torchtitan, FSDP scripts) and DeepSpeed run eager unless
# torch.compile is on. What "flash" attention means per generation is its ``flash_attention_by_sm``; PyTorch
# SDPA's flash backend is FlashAttention-2 (torch.nn.functional.scaled_dot_product_attention docs).


@dataclass(frozen=True)
class Kernel:
    """One kernel launch (or ``count`` alike): what the page and serving can show."""

    name: str
    kind: str  # gemm | attention | memory | cast
    time_s: float
    flops: float = 0.0
    bytes: float = 0.0
    shape: tuple = ()  # GEMM: (m, n, k, groups); attention: (b·heads, s_q, s_kv, head_dim)
    dtype: str = ""
    count: int = 1
    gpu_s: float | None = None  # the GPU's own time where a host floor raised time_s (None: time_s; gpu_seconds)
    # the host's launches for the group where they are not ``count``: 1 for the head of a captured CUDA graph (its
    # replay), 0 for the rest of the graph (te_graphed); None: count (host_launches)
    host_launches: int | None = None


def gpu_seconds(k: Kernel) -> float:
    """A kernel's GPU time without the host floor (``Kernel.gpu_s``): what planner/host.py's queues take."""
    return k.time_s if k.gpu_s is None else k.gpu_s


def host_launches(k: Kernel) -> int:
    """The host's launches for a kernel group: ``count``, or a graph's (Kernel.host_launches)."""
    return k.count if k.host_launches is None else k.host_launches


def launch(k: Kernel, host_s: float) -> tuple[float, float, int]:
    """A kernel group as planner/host.py's queues take it: (host seconds a launch, GPU seconds, count), the host's
    time spread over the group's ``count`` so that a graph's members carry its one replay (host_launches)."""
    return host_s * host_launches(k) / k.count, gpu_seconds(k), k.count


@dataclass(frozen=True)
class LayerKernels:
    """One layer, one micro-batch, one rank: the kernels of its forward, its backward, and what recompute reruns
    inside the backward (none, core attention, or the whole forward)."""

    forward: tuple[Kernel, ...]
    backward: tuple[Kernel, ...]
    recompute: tuple[Kernel, ...]
    attention: tuple[Kernel, ...] = ()  # the core-attention forward kernels (what selective recompute reruns)
    attention_bwd: tuple[Kernel, ...] = ()  # the core-attention backward kernels (as listed in ``backward``)


def generation(gpu: GPUSpec) -> int:
    """Compute capability generation x 10 (80 Ampere, 90 Hopper, 100 Blackwell; 103 B300 -> 100)."""
    return gpu.sm // 10 * 10


# ---- options ------------------------------------------------------------------------------------------------


def fusion(ctx: Context) -> Fusion:
    if ctx.work.torch_compile:
        return FUSED
    return FUSED if ctx.par.flavour.fused_kernels else EAGER


def cuda_graphs(ctx: Context) -> bool:
    """CUDA graphs capture the step's kernels (Megatron --enable-cuda-graph, torch CUDA graphs): off by default in
    Megatron-Core, torchtitan and DeepSpeed."""
    return bool(ctx.work.cuda_graphs)


def attention_kernel(ctx: Context, gpu: GPUSpec) -> str:
    """The core-attention kernel that runs: the one asked for, or for "flash" the flavour's for the GPU generation
    (flash_attention_by_sm); a model with learned sinks takes the first of the flavour's sink_attention_kernels
    where that one runs no sinks (Megatron + TE 2.9: cuDNN, not FlashAttention-2, on sm80)."""
    name = ctx.work.attention_kernel
    if name != "unfused" and fp8_attention(ctx) is not None:
        return FP8_DPA_KERNEL  # TE's FP8 attention runs on cuDNN only (FP8_DPA_KERNEL)
    if name != "flash":
        return name
    fl = ctx.par.flavour
    name = dict(fl.flash_attention_by_sm).get(generation(gpu), "flash2")
    sinks = fl.sink_attention_kernels if ctx.model.attention_sinks else ()
    return sinks[0] if sinks and name not in sinks else name


def fp8_attention(ctx: Context) -> tuple[bool, bool] | None:
    """(forward, backward) in FP8 of the core attention, or None when it runs bf16: TE's fp8_dpa
    (recipes.dpa_recipe: workload.fp8_dot_product_attention when training) runs the forward in FP8 and the backward
    too unless NVTE_FP8_DPA_BWD=0 (workload.fp8_dpa_backward; TransformerEngine d0067d0da backends.py
    FusedAttnFunc ``is_bwd_fp8 = fp8 and int(os.getenv("NVTE_FP8_DPA_BWD", "1"))``); a serving engine's FP8 context
    FMHA (workload.fp8_context_attention, inference prefill) the forward, there is no backward."""
    if dpa_recipe(ctx) is None:
        return (True, False) if engine_fp8_attention(ctx) else None
    return True, ctx.work.fp8_dpa_backward


def engine_fp8_attention(ctx: Context) -> bool:
    """Whether the core attention is a serving engine's FP8 context FMHA (workload.fp8_context_attention): an
    inference pass over a prompt (decode reads the KV cache, priced by its bytes) of a model without MLA (TensorRT-LLM
    runs MLA's context attention in bf16: aiconfigurator's MLA context tables, context_mla_perf.parquet at 1.3.0rc20,
    hold mla_dtype bfloat16 only, and an FP8 KV cache makes them slower, not faster: review r14a, 2); its rate is
    context_fmha_fp8_speedup's and it adds no casts (the engine's fused QKV preprocessing writes Q, K and V in FP8)."""
    return not ctx.training and ctx.s > 1 and ctx.work.fp8_context_attention and not ctx.model.mla


def context_fmha_fp8_speedup(kernel: str, gpu: GPUSpec, s_kv: float) -> float:
    """The engine's FP8 context FMHA's forward rate over its bf16 kernel's at ``s_kv`` keys, from each kernel's own
    fitted (ceiling, s0) (CONTEXT_FMHA_FP8); 1 where none was fitted (the bf16 rate)."""
    fit = CONTEXT_FMHA_FP8.get((kernel, generation(gpu)))
    if fit is None:
        return 1.0
    (c16, s16), (c8, s8) = fit
    return c8 * (s_kv + s16) / (c16 * (s_kv + s8))


def check_kernel_options(ctx: Context, gpu: GPUSpec) -> None:
    """A kernel option the GPU does not have is a SpecError naming the field and the rule."""
    gen = generation(gpu)
    if ctx.work.attention_kernel == "flash3" and gen not in FLASH3_GENERATIONS:
        raise SpecError(
            "workload.attention_kernel",
            f"flash3 (FlashAttention-3) runs on Hopper (sm90) only; {gpu.name} is sm{gpu.sm}: use flash2 or cudnn",
        )
    sinks = ctx.flavour.sink_attention_kernels
    if ctx.model.attention_sinks and sinks and attention_kernel(ctx, gpu) not in sinks:
        raise SpecError(
            "workload.attention_kernel",
            f"{ctx.work.attention_kernel} runs no learned attention sinks (model.attention_sinks) under "
            f"{ctx.flavour.name}: TransformerEngine 2.9 get_attention_backend disables FlashAttention for softmax_type "
            f"'learnable'; use one of {', '.join(('flash', *sinks))}",
        )
    if ctx.training and ctx.work.fused_grouped_mlp:
        check_fused_grouped_mlp(ctx)
    if ctx.work.cuda_graph_scope:
        check_cuda_graph_scope(ctx)
    check_recipe_gpu(ctx.work.fp8_recipe, gpu)  # compute capability, nvfp4's fp4 peak: the one home of the rule


def check_fused_grouped_mlp(ctx: Context) -> None:
    """TE's fused grouped MLP (FUSED_GROUPED_MLP) is Megatron's with TransformerEngine, MXFP8 only, for routed
    experts: anything else is a SpecError on workload.fused_grouped_mlp."""
    field = "workload.fused_grouped_mlp"
    if not ctx.flavour.te_fp8_recipes:
        framework = ctx.par.framework
        raise SpecError(field, f"is TransformerEngine's op fuser under Megatron-Core; framework is {framework!r}")
    recipe = ctx.work.recipe
    if recipe is None or not recipe.fused_grouped_mlp:
        got = recipe.name if recipe is not None else None
        raise SpecError(field, f"TE's fused grouped MLP kernels are MXFP8 only: needs fp8_recipe 'mxfp8', got {got!r}")
    if ctx.model.moe is None:
        raise SpecError(field, f"fuses the routed experts' MLP; model {ctx.model.name!r} has no MoE layers")


def check_cuda_graph_scope(ctx: Context) -> None:
    """A partial TE CUDA graph (TE_GRAPH_KERNELS) is of an MoE layer, in
    training (transformer_config.py cba6b0ed0f l. 1616-1620: "moe cuda graph is only supported for MoE"): anything
    else is a SpecError on workload.cuda_graph_scope."""
    field = "workload.cuda_graph_scope"  # the framework's rule: parallel.check_graph_scope (Flavour.te_graph_scopes)
    if ctx.model.moe is None:
        raise SpecError(field, f"captures part of an MoE layer; model {ctx.model.name!r} has no MoE layers")
    if not ctx.training:
        raise SpecError(field, "is a training graph (TE make_graphed_callables); the workload is inference")


# ---- GEMMs ------------------------------------------------------------------------------------------------


def gemm_dtype(ctx: Context) -> str:
    """The GEMM-table key of the layer's linear layers: the recipe's (Recipe.kernel_dtype), fp8 (per-tensor) for
    fp8 activations without a recipe, bf16 for 2-byte activations, else fp32."""
    if ctx.work.recipe is not None:
        return ctx.work.recipe.kernel_dtype
    if ctx.work.activation_dtype == "fp8":
        return "fp8"
    return "bf16" if ctx.x <= 2 else "fp32"


def math_dtype(dtype: str) -> str:
    """The dtype a GEMM's tensor cores compute in: a weight-only format's math dtype (_WEIGHT_ONLY_MATH), else
    ``dtype`` itself."""
    return _WEIGHT_ONLY_MATH.get(dtype, dtype)


def operand_bytes(dtype: str) -> float:
    """Bytes of one element of a GEMM's activation operand (a weight-only format's: its math dtype's)."""
    return {"bf16": 2.0, "fp16": 2.0, "fp32": 4.0, "tf32": 4.0, "nvfp4": 0.5}.get(math_dtype(dtype), 1.0)


def cast_bytes_per_element(ctx: Context, gpu: GPUSpec | None = None) -> float:
    """HBM bytes to quantize one element of a GEMM operand: the recipe's (Recipe.cast_bytes_per_element: read,
    rowwise and columnwise copies, block scales), or TE's per-tensor cast_transpose (FP8_CAST_BYTES). On a ``gpu``
    whose fp8 GEMMs take any layout (non_tn_fp8) TransformerEngine's per-tensor quantizers write the rowwise data
    only, no transpose (TransformerEngine v2.9 70f536662a pytorch/csrc/quantizer.cpp l. 126-137 Float8Quantizer and
    l. 331-340 Float8CurrentScalingQuantizer: ``with_transpose = columnwise_usage &&
    !nvte_is_non_tn_fp8_gemm_supported()``): one element copy fewer. Block recipes keep their columnwise copy (its
    scales run along the other dimension)."""
    recipe = ctx.work.recipe
    per = recipe.cast_bytes_per_element if recipe is not None else FP8_CAST_BYTES
    te_per_tensor = ctx.flavour.te_fp8_recipes and (recipe is None or not recipe.activation_block)
    one_copy = te_per_tensor and gpu is not None and non_tn_fp8(gpu)
    return per - (recipe.element_bytes if recipe is not None else 1) if one_copy else per


def non_tn_fp8(gpu: GPUSpec) -> bool:
    """Whether the GPU's fp8 GEMMs take non-TN layouts, so that TE needs no transposed fp8 copy: TransformerEngine
    v2.9 pytorch/utils.py is_non_tn_fp8_gemm_supported, compute capability 10.x, 11.x and >= 13.0 (Blackwell's
    datacenter parts; not 12.x)."""
    return 100 <= gpu.sm < 120 or gpu.sm >= 130


def dense_peak(gpu: GPUSpec, dtype: str) -> float:
    """Datasheet dense FLOP/s of a GEMM dtype at the configured power limit's sustained clock."""
    peak_dtype = _PEAK_DTYPE.get(dtype, math_dtype(dtype))
    if peak_dtype == "fp8" and not gpu.peak_tflops.get("fp8"):
        peak_dtype = "bf16"  # no fp8 tensor cores: the GEMM runs in bf16
    return gpu.peak(peak_dtype) * clock_fraction(gpu, dtype)


def clock_fraction(gpu: GPUSpec, dtype: str = "bf16") -> float:
    """The tensor clock a training step sustains as a fraction of the clock the datasheet peak is quoted at
    (DATASHEET_CLOCK_MHZ): the part's own measured clock (GPUSpec.sustained_clock) or its generation's
    (SUSTAINED_CLOCK) x the power-limit scale (GPUSpec.clock_scale); a trace-fitted clock replaces both. The one
    place the clock enters the model: a kernel table row measured at a known clock is predicted with this fraction
    replaced by its clock / DATASHEET_CLOCK_MHZ (bench/h200_tables.py at_clock). fp8 GEMMs hold a lower clock
    (the part's fp8_ratio or FP8_CLOCK)."""
    sustained, fp8_ratio, _ = sustained_clock(gpu)
    fp8 = _PEAK_DTYPE.get(dtype) == "fp8" and gpu.peak_tflops.get("fp8")
    clock = gpu_efficiency(gpu).clock if gpu.kernel_constants else 0.0  # what a trace fitted for this GPU
    # the fitted clock is the traced (median) part's: a slower part of the job (GPUSpec.part_clock) runs below it
    clock = clock * gpu.part_clock or gpu.clock_scale() * sustained
    return clock * (fp8_ratio if fp8 else 1.0)


def sustained_clock(gpu: GPUSpec) -> tuple[float, float, str]:
    """(fraction of the datasheet clock, fp8 / bf16 clock ratio, where they come from) that ``gpu`` sustains in a
    training step at its default power limit: its own measurement (GPUSpec.sustained_clock) or its generation's
    (SUSTAINED_CLOCK, FP8_CLOCK). clock_fraction reads it; a trace fit's warning names its source."""
    own = gpu.sustained_clock
    if own is not None:
        return own.fraction, own.fp8_ratio, f"the {gpu.name}'s own GPUSpec.sustained_clock {own.fraction}: {own.source}"
    gen = generation(gpu)
    fraction = SUSTAINED_CLOCK.get(gen, 1.0)
    return fraction, FP8_CLOCK.get(gen, 1.0), f"planner/kernels.py SUSTAINED_CLOCK {fraction} of its generation"


def gemm_ceiling(gpu: GPUSpec, dtype: str, eff: Efficiency) -> float:
    dtype = math_dtype(dtype)  # a weight-only GEMM's math dtype: a fitted bf16 ceiling is its too
    for name, ceiling in eff.gemm_ceilings:
        if name == dtype:
            return ceiling
    if dtype in DERIVED_CEILING:
        base, ratio = DERIVED_CEILING[dtype]
        return round(gemm_ceiling(gpu, base, eff) * ratio, 3)
    found = tabled_ceiling(gpu, dtype)
    if found is None and dtype != "bf16" and not gpu.peak_tflops.get("fp8"):
        found = tabled_ceiling(gpu, "bf16")
    return found if found is not None else eff.gemm


def tabled_ceiling(gpu: GPUSpec, dtype: str) -> float | None:
    """The ceiling a measured GEMM table gives ``dtype`` on ``gpu`` (None: no table has it): the part's own
    (GPUSpec.gemm_table, fitted on its own table) or its generation's (GEMM_CEILING)."""
    own = gpu.gemm_table
    for name, ceiling in own.ceilings if own is not None else ():
        if name == dtype:
            return ceiling
    return GEMM_CEILING.get((generation(gpu), dtype))


@lru_cache(maxsize=65536)
def gemm_time(
    rows: tuple[float, ...], n: float, k: float, dtype: str, gpu: GPUSpec, eff: Efficiency, k0: float = 0.0
) -> float:
    """Seconds of one GEMM (or a grouped GEMM over ``rows``: one m per group) of (m x k) @ (k x n) in ``dtype``.
    ``k0``: the main loop's amortisation length (0: the cuBLAS one, eff.gemm_k0; GROUPED_GEMM_K0 for
    torch._grouped_mm). Memoised by value (bounded): the search asks for the same shapes across layouts."""
    if n <= 0 or k <= 0 or not any(m > 0 for m in rows):
        return 0.0
    tm, tn = GEMM_TILE.get(generation(gpu), (128, 128))
    if dtype in _WEIGHT_OPERAND_BYTES:
        tm = WEIGHT_ONLY_TILE_M
    flops = sum(2.0 * m * n * k for m in rows)
    cols = math.ceil(n / tn)
    tiles = sum(math.ceil(m / tm) for m in rows if m > 0) * cols
    quant = sum(m for m in rows) * n / (tiles * tm * tn)
    split = max(1, min(gpu.sms // tiles, int(k // SPLIT_K_MIN))) if gpu.sms and len(rows) == 1 else 1
    fill = tiles * split / (tiles * split + eff.gemm_fill * gpu.sms) if gpu.sms else 1.0
    k_split = k / split  # each split runs k/split of the main loop
    k0 = k0 or eff.gemm_k0
    rate = dense_peak(gpu, dtype) * gemm_ceiling(gpu, dtype, eff) * quant * fill * k_split / (k_split + k0)
    x = operand_bytes(dtype)
    xw = _WEIGHT_OPERAND_BYTES.get(dtype, x)  # the (k x n) weight operand: a weight-only format's stored bytes
    traffic = sum(m * k * x + k * n * xw + m * n * 2 for m in rows)  # output in bf16
    # compute-bound: the FLOPs and the GEMM's fixed cost (prologue, epilogue, launch); memory-bound (decode's GEMV-
    # like shapes): the operands streamed at the HBM rate and a memory-bound kernel's floor (kernel_s). The H200's
    # m 1-8 GEMMs replayed from a CUDA graph (run2.json ``gemm_bf16`` decode_graph: 5.9 us for 16.8 MB of weights,
    # 57.2 us for 235 MB) leave 1-2 us beyond the bytes, not the compute-bound tables' 8 us (bench/h200_tables.py).
    return max(flops / rate + eff.gemm_fixed_s, traffic / (gpu.hbm_GBps * 1e9 * eff.hbm) + eff.kernel_s)


def gemm_peak_share(m: float, n: float, k: float, dtype: str, gpu: GPUSpec, eff: Efficiency) -> float:
    """The share of one GEMM's predicted time (gemm_time) that its FLOPs at the dense peak x the ceiling alone
    take: near 1 where the ceiling sets the time (a compute-bound shape), lower where the fixed cost, SM fill, the
    main loop's k0, tile quantisation or the HBM bound add to it. bench/kernel_fit.py own_ceilings fits a part's
    ceilings on the shapes where this share is high (COMPUTE_BOUND)."""
    t = gemm_time((m,), n, k, dtype, gpu, eff)
    return 2.0 * m * n * k / (dense_peak(gpu, dtype) * gemm_ceiling(gpu, dtype, eff)) / t if t else 0.0


def gemm_kernels(
    name: str,
    m: float,
    n: float,
    k: float,
    dtype: str,
    gpu: GPUSpec,
    eff: Efficiency,
    groups: int = 1,
    streams: int = 0,
    spread: float = 0.0,
    k0: float = 0.0,
) -> tuple[Kernel, Kernel, Kernel]:
    """Forward (m x k)(k x n), and its backward: data gradient (m x n)(n x k) and weight gradient (k x m)(m x n),
    per group when grouped (each expert's weight gradient is its own GEMM with k = its rows). ``streams`` 0: a
    group is one grouped kernel; n > 0: one GEMM launch per group spread over n streams (streamed_gemm_time).
    ``spread``: the standard deviation of the groups' rows about m (group_rows); 0: every group has m rows.
    ``k0``: the grouped kernel's main-loop amortisation length (gemm_time; 0: cuBLAS's)."""
    m = max(0.0, m)
    rows = group_rows(m, spread, groups)
    flops = 2.0 * m * n * k * groups
    shape = (m, n, k, groups)
    launches = groups if streams and groups > 1 else 1
    wgrad_rows = (_round(k),) * groups  # one (k x n) output per expert, reduced over that expert's rows
    shapes = ((rows, n, k), (rows, k, n), (wgrad_rows, n, m))
    times = [streamed_gemm_time(r, a, b, dtype, gpu, eff, streams, k0) for r, a, b in shapes]
    fwd, dgrad, wgrad = (
        Kernel(name + suffix, "gemm", t, flops, shape=shape, dtype=dtype, count=launches)
        for suffix, t in zip(("", ".dgrad", ".wgrad"), times, strict=True)
    )
    return fwd, dgrad, wgrad


@lru_cache(maxsize=1024)
def _normal_quantiles(groups: int) -> tuple[float, ...]:
    unit = NormalDist()
    return tuple(unit.inv_cdf((i + 0.5) / groups) for i in range(groups))


def group_rows(m: float, spread: float, groups: int) -> tuple[float, ...]:
    """The rows of ``groups`` GEMMs of mean m and standard deviation ``spread``: the groups' order statistics taken
    at the normal quantiles (i + 1/2) / groups (their sum stays groups x m). Dropless routing gives every expert a
    multinomial count of its own, not the mean: torch._grouped_mm pays a whole M tile for an expert one row past a
    tile's edge (tests/reference/kernels/h200/trace_qwen3_235b.ep1.s2048.json.gz: 128 experts at a mean of 128
    rows on 128-row tiles run 1.33x the equal-rows time, fwd fc1 1,096 us against 826 us predicted)."""
    if not spread or groups <= 1:
        return (_round(m),) * groups
    return tuple(_round(max(0.0, m + spread * z)) for z in _normal_quantiles(groups))


def streamed_gemm_time(
    rows: tuple[float, ...],
    n: float,
    k: float,
    dtype: str,
    gpu: GPUSpec,
    eff: Efficiency,
    streams: int = 0,
    k0: float = 0.0,
) -> float:
    """Seconds of len(rows) GEMMs launched one by one over ``streams`` CUDA streams (TransformerEngine's
    multi_stream_cublas_gemm: GEMM i on stream i % streams): they run in waves of ``streams`` concurrent GEMMs, a
    wave sharing the SMs as one grouped GEMM does (gemm_time over its rows) and paying one fixed cost (the
    concurrent GEMMs' prologues and tails overlap); ``streams`` 0 or one group: one grouped kernel (gemm_time,
    with the grouped kernel's ``k0``); cuBLAS launches keep cuBLAS's."""
    if not streams:
        return gemm_time(rows, n, k, dtype, gpu, eff, k0)
    if len(rows) <= streams:
        return gemm_time(rows, n, k, dtype, gpu, eff)
    if len(set(rows)) > 1:  # rows of their own (group_rows): wave by wave
        return sum(gemm_time(rows[i : i + streams], n, k, dtype, gpu, eff) for i in range(0, len(rows), streams))
    waves, rest = divmod(len(rows), streams)
    t = waves * gemm_time(rows[:streams], n, k, dtype, gpu, eff)
    return t + (gemm_time(rows[:rest], n, k, dtype, gpu, eff) if rest else 0.0)


def _round(v: float) -> float:
    return float(round(v, 3))


# ---- memory-bound kernels -----------------------------------------------------------------------------------


def hbm_s(nbytes: float, gpu: GPUSpec, eff: Efficiency) -> float:
    """Seconds to stream ``nbytes`` through HBM at the memory-bound kernels' efficiency (memory_kernel's byte term)."""
    return nbytes / (gpu.hbm_GBps * 1e9 * eff.hbm)


def memory_kernel(name: str, nbytes: float, gpu: GPUSpec, eff: Efficiency, count: int = 1, floor: float = 0.0):
    t = hbm_s(nbytes, gpu, eff) + count * eff.kernel_s
    if t >= count * floor:
        return Kernel(name, "memory", t, bytes=nbytes, count=count)
    return Kernel(name, "memory", count * floor, bytes=nbytes, count=count, gpu_s=t)


def fsdp_copy_kernels(
    gathered: float, gathers: float, reduced: float, reduces: float, param_bytes: float, grad_bytes: float, gpu, eff
) -> tuple[Kernel, ...]:
    """FSDP2's per-unit copies on the compute stream (flavour trait ``fsdp_unit_copies``), for ``gathered`` bytes
    all-gathered in ``gathers`` calls and ``reduced`` bytes reduce-scattered in ``reduces`` calls
    (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py, pytorch 010ae4a8):

    - foreach_all_gather_copy_out: the compute stream waits for the all-gather, then split_with_sizes_copy reads the
      all-gather output and writes the unsharded parameters: 2 bytes moved per byte gathered, one kernel per unit;
    - foreach_reduce: foreach_reduce_scatter_copy_in (torch._chunk_cat) reads the unsharded gradients, in the
      parameter dtype, and writes the reduce-scatter input in the reduce dtype (it casts bf16 -> fp32 as it
      copies), on the current stream before the reduce-scatter stream takes over: 1 + param/grad bytes per byte
      reduced, one kernel per unit.

    The all-gather copy-in (the local shard cast into the all-gather input) runs on its own stream and the
    reduce-scatter's divide and the sharded gradient's accumulation on the reduce-scatter stream: not here."""
    out = []
    if gathers:
        out.append(memory_kernel("fsdp.all_gather_copy_out", 2.0 * gathered, gpu, eff, gathers))
    if reduces:
        nbytes = reduced * (1.0 + param_bytes / grad_bytes)
        out.append(memory_kernel("fsdp.reduce_scatter_copy_in", nbytes, gpu, eff, reduces))
    return tuple(out)


def sp_layout_copy_kernels(
    gathered: float, gathers: float, scattered: float, scatters: float, gpu, eff
) -> tuple[Kernel, ...]:
    """The copies DTensor's sequence-parallel collectives run on the compute stream (flavour trait
    ``sp_layout_copies``), for ``gathered`` bytes all-gathered in ``gathers`` calls and ``scattered`` bytes
    reduce-scattered in ``scatters`` calls (message bytes as the ledger counts them: the gathered output, the
    full reduce-scatter input; in the dtype on the wire). torch/distributed/_functional_collectives.py (pytorch
    38410cf9, the 2025-06 torchtitan runs; the same code since 2023):

    - all_gather_tensor(gather_dim=1): NCCL writes the tp shards one after the other along dim 0 ([tp·b, s/tp, h]);
      ``torch.cat(torch.chunk(res, group_size, dim=0), dim=gather_dim)`` re-lays them as [b, s, h]: reads and
      writes the gathered tensor, 2 bytes moved per byte gathered, one kernel. Later torch returns a view where
      every dim before the gather dim is 1 (torch/_utils.py ``_maybe_view_chunk_cat``): with b = 1 no copy, so
      the caller passes no gathers then;
    - reduce_scatter_tensor(scatter_dim=1): ``torch.cat(torch.chunk(self, group_size, dim=scatter_dim))`` makes each
      rank's destination block contiguous before NCCL: reads and writes the full input, 2 bytes per byte
      reduce-scattered, one kernel.

    Inductor cannot fold either copy: the all-gather's output and a matmul's (an extern kernel) are not fusible
    producers, and the collective takes a contiguous input."""
    out = []
    if gathers:
        out.append(memory_kernel("dtensor.all_gather_cat", 2.0 * gathered, gpu, eff, gathers))
    if scatters:
        out.append(memory_kernel("dtensor.reduce_scatter_cat", 2.0 * scattered, gpu, eff, scatters))
    return tuple(out)


# torch's async TP (Inductor's micro-pipeline TP pass, Flavour.async_tp_single_matmul) runs each fused GEMM as one
# GEMM per TP rank's shard of its rows (torch/distributed/_symmetric_memory/__init__.py, pytorch 0e9ed9cf:
# _pipelined_all_gather_and_consume calls the shard consumer once per source rank, ``ag_out.chunk(group_size)``;
# _fused_matmul_reduce_scatter_impl's chunk_producer once per destination rank over ``A.chunk(group.size())``). The
# forward's column-parallel GEMMs consume the sequence-parallel all-gather, the row-parallel ones produce the
# reduce-scatter, and in the backward the row-parallel GEMMs' data gradients consume the all-gather of the output
# gradient; the column-parallel input gradients' reduce-scatter sums several matmuls and is not fused (step.py).
ASYNC_TP_GATHER_GEMMS = ("qkv", "fc1")
ASYNC_TP_SCATTER_GEMMS = ("attn_out", "fc2")


def async_tp_split(
    ctx: Context, moe: bool, gpu: GPUSpec, eff: Efficiency | None = None, rerun: bool = False
) -> tuple[float, float, float]:
    """What torch's async TP adds to one layer, one micro-batch, one rank (seconds): (forward GEMMs, forward
    memory-bound, backward GEMMs). Each fused GEMM of m rows runs as tp GEMMs of m/tp rows (ASYNC_TP_GATHER_GEMMS,
    ASYNC_TP_SCATTER_GEMMS; each at its own shape's efficiency and fixed cost) in place of one; a fused
    matmul-reduce-scatter then sums the tp partials it received on the compute stream (``reduce_fn``, torch.sum over
    dim 0: reads the m x n partials, writes the m/tp x n shard, in the GEMM's output dtype, bf16). ``rerun``: what a
    fully recomputed layer's re-run adds (the forward's share of the GEMMs full_rerun keeps; no backward). Memoised
    by value (per_layer)."""
    return per_layer(_ASYNC_TP, _async_tp_split, ctx, moe, gpu, efficiency(gpu, eff), rerun)


_ASYNC_TP: dict = {}


def _async_tp_split(
    ctx: Context, moe: bool, gpu: GPUSpec, eff: Efficiency, rerun: bool = False
) -> tuple[float, float, float]:
    t = ctx.par.tp
    lk = layer_kernels(ctx, moe, gpu, eff)
    floor = 0.0 if cuda_graphs(ctx) else eff.cpu_op_s
    split = per_layer(_ASYNC_TP_GEMMS, _async_tp_gemm_s, ctx, moe, gpu, eff)  # the one home of the per-shard split

    def extra(k: Kernel) -> float:
        return split[k.name] - k.time_s

    fused = ASYNC_TP_GATHER_GEMMS + ASYNC_TP_SCATTER_GEMMS
    ran = full_rerun(ctx, lk.forward, moe) if rerun else lk.forward
    forward = [k for k in ran if k.kind == "gemm" and k.name in fused]
    dgrads = {n + ".dgrad" for n in ASYNC_TP_SCATTER_GEMMS}
    fwd = sum(extra(k) for k in forward)
    bwd = 0.0 if rerun else sum(extra(k) for k in lk.backward if k.kind == "gemm" and k.name in dgrads)
    mem = sum(
        memory_kernel("async_tp.reduce", (k.shape[0] * k.shape[1]) * (1 + 1 / t) * 2, gpu, eff, 1, floor).time_s
        for k in forward
        if k.name in ASYNC_TP_SCATTER_GEMMS
    )
    return fwd, mem, bwd


# TransformerEngine's userbuffers (Megatron --tp-comm-overlap, Flavour.userbuffers) run each GEMM they overlap as
# chunks, in TE v1.8 (3ec998e96c, NeMo 24.07's; pytorch/csrc/comm_gemm_overlap.h) and v2.9 (70f536662a,
# Megatron-Bridge 25.11's; common/comm_gemm_overlap/comm_gemm_overlap.cpp) alike, with initialize_ub's defaults
# (pytorch/module/base.py: methods, ``num_splits = 4 if method == "pipeline" else 0``, _NUM_MAX_UB_STREAMS = 3):
# - "ring_exchange" (qkv_fprop, fc1_fprop, proj_dgrad, fc2_dgrad): UbufP2PCommOverlap::split_overlap_ag (v2.9
#   CommOverlapP2PBase::split_overlap_ag) runs one te_gemm per TP rank's shard of the gathered rows (``n_chunk =
#   _ubufs[0].size(0)``, ``for (int i = 0; i < _tp_size; i++)``), chunk i on ``_stream_compute[i % streams]``;
# - "pipeline" (proj_fprop, fc2_fprop): UbufCommOverlap::split_overlap_rs (CommOverlapBase::split_overlap_rs) runs
#   num_splits te_gemms of ``m_chunk = m / _num_splits`` of the weight's rows (m = A.size(0): the output features)
#   each, over the same streams;
# - "bulk" (qkv_dgrad, qkv_wgrad, fc1_dgrad, fc1_wgrad): one whole GEMM beside the bulk copy (contention.py).
# The streams are min(_NUM_MAX_UB_STREAMS, chunks) (the constructors' ``std::min(num_max_streams, tp_size)`` and
# ``std::min(num_max_streams, num_splits)``): the chunks run as streamed_gemm_time's waves, the home of TE's
# multi-stream GEMMs. A run's ub config may set proj_fprop / fc2_fprop to "ring_exchange" instead
# (workload.userbuffers_proj_fprop / userbuffers_fc2_fprop): split_overlap_rs_p2p then runs tp te_gemms of m/tp rows
# (Megatron-Bridge 5776a6d90b src/megatron/bridge/training/comm_overlap.py: every userbuffers_fp8_* config but
# h6144_tp2's, e.g. l. 108-118 userbuffers_fp8_h100_h8192_tp4_mbs1_seqlen8192, which
# scripts/performance/configs/llama/llama3_llm_pretrain.py llama3_70b_pretrain_config_h100 picks for the 25.11
# Llama3-70B FP8-CS row). Not read: the configs' ``set_sm_margin`` (the pipelined GEMMs then run on the SMs the
# reduce-scatter leaves; docs/step-time.md, sized).
USERBUFFERS_RING_GEMMS = ("qkv", "fc1", "attn_out.dgrad", "fc2.dgrad")
USERBUFFERS_PIPELINE_GEMMS = ("attn_out", "fc2")  # by default; the ub config's method: _userbuffers_methods
USERBUFFERS_PIPELINE_SPLITS = 4
USERBUFFERS_STREAMS = 3


def userbuffers_chunks_s(m: float, n: float, k: float, dtype: str, chunks: int, by_rows: bool, gpu, eff) -> float:
    """Seconds of one (m x k)(k x n) GEMM run as TE userbuffers' ``chunks`` te_gemms (USERBUFFERS_RING_GEMMS: by
    rows, m/chunks each; USERBUFFERS_PIPELINE_GEMMS: by output columns, n/chunks each) over min(3, chunks)
    streams (streamed_gemm_time), less the whole GEMM's seconds (gemm_time)."""
    whole = gemm_time((m,), n, k, dtype, gpu, eff)
    streams = min(USERBUFFERS_STREAMS, chunks)
    if by_rows:
        return streamed_gemm_time((m / chunks,) * chunks, n, k, dtype, gpu, eff, streams) - whole
    return streamed_gemm_time((m,) * chunks, n / chunks, k, dtype, gpu, eff, streams) - whole


_USERBUFFERS: dict = {}


def userbuffers_split(ctx: Context, moe: bool, gpu: GPUSpec, eff=None, rerun: bool = False) -> tuple[float, ...]:
    """What TE's userbuffers add to one layer, one micro-batch, one rank (seconds), in async_tp_split's form:
    (forward GEMMs, forward memory-bound (none), backward GEMMs): each overlapped GEMM as its chunks
    (USERBUFFERS_RING_GEMMS over tp shards of its rows, USERBUFFERS_PIPELINE_GEMMS in USERBUFFERS_PIPELINE_SPLITS
    column blocks) in place of one. An MoE layer's attention only (its experts' GEMMs carry no userbuffers).
    ``rerun``: a fully recomputed layer's re-run (full_rerun's forward GEMMs). Memoised by value (per_layer)."""
    if ctx.par.tp <= 1:
        return 0.0, 0.0, 0.0
    return per_layer(_USERBUFFERS, _userbuffers_extra, ctx, moe, gpu, efficiency(gpu, eff), rerun)


def _userbuffers_chunks(ctx: Context) -> dict[str, tuple[int, bool]]:
    """Each overlapped GEMM's (chunks, by rows): the ring exchanges tp row shards, the forward reduce-scatters as
    the run's ub config has them (workload.userbuffers_proj_fprop / userbuffers_fc2_fprop: "pipeline",
    USERBUFFERS_PIPELINE_SPLITS column blocks, TE's default; "ring_exchange", tp row shards)."""
    t = ctx.par.tp
    method = {"attn_out": ctx.work.userbuffers_proj_fprop, "fc2": ctx.work.userbuffers_fc2_fprop}
    return {n: (t, True) for n in USERBUFFERS_RING_GEMMS} | {
        n: (t, True) if method[n] == "ring_exchange" else (USERBUFFERS_PIPELINE_SPLITS, False)
        for n in USERBUFFERS_PIPELINE_GEMMS
    }


def _userbuffers_extra(ctx: Context, moe: bool, gpu: GPUSpec, eff: Efficiency, rerun: bool) -> tuple[float, ...]:
    lk = layer_kernels(ctx, moe, gpu, eff)
    chunked = _userbuffers_chunks(ctx)
    if moe:
        chunked = {n: v for n, v in chunked.items() if n.startswith(("qkv", "attn_out"))}

    def extra(k: Kernel) -> float:
        if k.kind != "gemm" or k.name not in chunked or not k.shape:
            return 0.0
        m, n, kk, _ = k.shape
        chunks, by_rows = chunked[k.name]
        if k.name.endswith(".dgrad"):  # the data gradient: (m x n)(n x k), gemm_kernels' shapes
            n, kk = kk, n
        return userbuffers_chunks_s(m, n, kk, k.dtype, chunks, by_rows, gpu, eff)

    ran = full_rerun(ctx, lk.forward, moe) if rerun else lk.forward
    fwd = sum(extra(k) for k in ran)
    bwd = 0.0 if rerun else sum(extra(k) for k in lk.backward)
    return fwd, 0.0, bwd


def gemm_operand_bytes(ctx: Context, gpu: GPUSpec, name: str) -> float:
    """Bytes of a dense layer's GEMM ``name``'s activation operand A (in the GEMM's operand dtype), forward or
    backward: a forward GEMM's X (m x k); a data gradient's dY (m x n: gemm_kernels' (m x n)(n x k), e.g. a fused
    backward reduce-scatter's ``fc1.dgrad``, m x ffn/t). What torch's fused matmul-reduce-scatter re-lays
    (step._sp_layout_copies). 0 when the layer has no such GEMM. Every kernel carries its forward shape (m, n, k)."""
    k = _dense_gemm(ctx, gpu, name)
    if k is None:
        return 0.0
    m, n, kk, _ = k.shape
    return m * (n if name.endswith(".dgrad") else kk) * operand_bytes(k.dtype)


def reads_stored_operands(ctx: Context, gpu: GPUSpec, name: str) -> bool:
    """Whether a dense layer's GEMM ``name`` reads its activation operands as another op stored them: a GEMM in a
    16- or 32-bit dtype does (cuBLAS takes either operand transposed, so a tensor whose rows it can stride through is
    read in place, any other is first copied); a quantized GEMM (a low-precision recipe's dtype, _PEAK_DTYPE) reads
    what its recipe's casts wrote, in the layout _scaled_mm needs (torchao's tensorwise float8: the cast and the
    transposed copy of each operand, already in the kernel list). False where the layer has no such GEMM."""
    k = _dense_gemm(ctx, gpu, name)
    return k is not None and k.dtype not in _PEAK_DTYPE


def _dense_gemm(ctx: Context, gpu: GPUSpec, name: str) -> Kernel | None:
    """A dense layer's GEMM kernel ``name`` (forward or backward), or None."""
    lk = layer_kernels(ctx, False, gpu)
    return next((k for k in (*lk.forward, *lk.backward) if k.kind == "gemm" and k.name == name), None)


def async_tp_gemm_s(ctx: Context, gpu: GPUSpec, eff: Efficiency | None = None) -> dict[str, float]:
    """A dense layer's GEMMs as async TP runs them, one micro-batch, one rank (seconds by kernel name): the fused
    ones split into tp GEMMs of m/tp rows (async_tp_split's pieces), the others as priced. Memoised by value."""
    return per_layer(_ASYNC_TP_GEMMS, _async_tp_gemm_s, ctx, False, gpu, efficiency(gpu, eff))


_ASYNC_TP_GEMMS: dict = {}


def _async_tp_gemm_s(ctx: Context, moe: bool, gpu: GPUSpec, eff: Efficiency) -> dict[str, float]:
    t = ctx.par.tp
    lk = layer_kernels(ctx, moe, gpu, eff)
    floor = 0.0 if cuda_graphs(ctx) else eff.cpu_op_s
    split = {**dict.fromkeys(ASYNC_TP_GATHER_GEMMS + ASYNC_TP_SCATTER_GEMMS, 0)}
    split |= {n + ".dgrad": 1 for n in ASYNC_TP_SCATTER_GEMMS}
    out = {}
    for k in (*lk.forward, *lk.backward):
        if k.kind != "gemm":
            continue
        if k.name in split:
            m, n, kk, _ = k.shape
            base = k.name.removesuffix(".dgrad")
            piece = gemm_kernels(base, m / t, n, kk, k.dtype, gpu, eff)[split[k.name]]
            out[k.name] = t * _floored(piece, floor).time_s
        else:
            out[k.name] = k.time_s
    return out


# ---- the layer -------------------------------------------------------------------------------------------


# Persistent per-expert load imbalance of a trained router, as measured: MaxVio_global = (max_i Load_i - mean Load) /
# mean Load over a whole validation set (Wang et al. 2024, "Auxiliary-Loss-Free Load Balancing Strategy for
# Mixture-of-Experts", arXiv 2408.15664, Eq. 4 and Table 2; DeepSeekMoE 1B and 3B, 64 routed experts, top-6):
# auxiliary-loss-controlled routing 0.72 (1B) and 0.52 (3B), loss-free balancing (the expert bias DeepSeek-V3 adopts,
# Megatron --moe-router-enable-expert-bias) 0.04 at both sizes. The larger model's aux-loss figure is taken. Keyed by
# MoESpec: expert_bias wins; load_balancing "aux_loss" (Megatron's default); the other balancings (none,
# seq_aux_loss) have no measurement here: 0.
ROUTING_MAXVIO = {"expert_bias": 0.04, "aux_loss": 0.52}


def routing_maxvio(moe) -> float:
    """The measured MaxVio_global of the MoE's router balancing (ROUTING_MAXVIO)."""
    return ROUTING_MAXVIO["expert_bias"] if moe.expert_bias else ROUTING_MAXVIO.get(moe.load_balancing, 0.0)


def expert_rows(ctx: Context, eff: Efficiency = EFFICIENCY) -> tuple[float, int]:
    """(rows per local expert on the busiest EP rank, local experts). Tokens of the etp x ep ranks, top-k copies
    each, over E experts (token_dispatcher.py); dropless routing is not uniform:

    - per step the busiest of the ep ranks carries R + sqrt(2·ln(ep)·R) copies for a rank mean R (the maximum of ep
      near-Gaussian multinomial counts, Gumbel's extreme-value limit);
    - a trained router keeps its hottest expert at (1 + MaxVio) x the mean load (ROUTING_MAXVIO, measured), and
      that expert's rank carries the excess, mean x MaxVio (with one rank, ep = 1, the rank carries every copy
      whatever the skew);

    times (1 + moe_skew) (0: a trace refits it); a capacity factor pads every expert to its capacity."""
    m, par = ctx.model.moe, ctx.par
    t, etp, ep = par.tp, par.etp, par.ep
    local = max(1, m.num_experts // ep)
    mean = (ctx.b * ctx.s_cp / t) * etp * ep * m.top_k / m.num_experts
    if m.capacity_factor:
        return mean * m.capacity_factor, local
    rank = mean * local
    busiest = rank + math.sqrt(2.0 * math.log(ep) * rank) + mean * routing_maxvio(m) if ep > 1 else rank
    return busiest * (1.0 + eff.moe_skew) / local, local


def layer_kernels(ctx: Context, moe: bool, gpu: GPUSpec, eff: Efficiency | None = None) -> LayerKernels:
    """The kernels of one layer (see the module docstring), memoised by value: on ``layer_kernels_key`` (what
    they read of the context), the kind of layer, the GPU and the constants, so that contexts differing in
    what the kernels do not read (pp, dp when training, ZeRO, the pipeline schedule) share one entry. Bounded:
    cleared past LAYER_KERNELS_KEPT entries. ``eff`` None: the GPU's constants (gpu_efficiency)."""
    return per_layer(_LAYER_KERNELS, _layer_kernels_of_tokens, ctx, moe, gpu, efficiency(gpu, eff))


_LAYER_KERNELS: dict = {}
_TOKEN_KERNELS: dict = {}  # (token_kernels_key, moe, gpu, eff) -> a LayerKernels of those tokens (search8)
LAYER_KERNELS_KEPT = 4096  # entries of each per-layer memo before it is cleared


def token_kernels_key(ctx: Context) -> tuple | None:
    """The value key of what a layer's kernels other than core attention read of the context (search8): the
    GEMMs and element-wise kernels read the micro-batch size b and cp only through the tokens one rank holds,
    T = b·s/cp (``_layer_kernels``' ``T``; the MoE routing's rows, ``expert_rows``), and s/cp alone only in the
    unfused rotary's frequency table (``_attention_projections``, rotary_freqs). Core attention reads b, s/cp,
    the KV length and the ring's steps apart (``attention_kernels``), cp_comm and cp_load_balance: it is priced
    per context and spliced into a token-keyed layer at its own place, so each forward and backward keeps its
    kernels and their order exactly (``_layer_kernels_of_tokens``). None where that split is not made: inference
    (b reads dp) and decode; unfused attention is not split either (``_layer_kernels_of_tokens``: its GEMMs and
    softmax, kinds gemm and memory, sit among the layer's own and the fp8 casts' operands)."""
    if not ctx.training or ctx.s == 1:
        return None
    par = ctx.par
    return (
        ctx.model,
        _token_work(ctx.work),
        ctx.b * ctx.s_cp,
        ctx.s_cp if unfused_rope(ctx) else None,
        par.tp,
        par.sp,
        par.ep,
        par.etp,
        *kernel_traits(par.flavour),
        par.ep_dispatch,
    )


@lru_cache(maxsize=256)
def _token_work(work):
    """The workload less its micro-batch size (which the token kernels read only through T, in the key)."""
    return replace(work, micro_batch_size=1)


def _layer_kernels_of_tokens(ctx: Context, moe: bool, gpu: GPUSpec, eff: Efficiency) -> LayerKernels:
    """``_layer_kernels`` of ``ctx`` (layer_kernels' miss), built from a layer of equal tokens per rank when one
    was priced (token_kernels_key): its kernels with its core attention replaced by ``ctx``'s, at the same
    places in the forward and the backward, so every pass sums the same kernels in the same order (bit-equal;
    tests/planner/test_search_speed.py checks it against ``_layer_kernels`` over drawn layouts). Bounded as
    layer_kernels' memo."""
    key = ctx.token_kernels_key
    if key is None or attention_kernel(ctx, gpu) == "unfused":
        return _layer_kernels(ctx, moe, gpu, eff)
    key = (key, moe, gpu, eff)
    base = _TOKEN_KERNELS.get(key)
    if base is None:
        if len(_TOKEN_KERNELS) >= LAYER_KERNELS_KEPT:
            _TOKEN_KERNELS.clear()
        base = _TOKEN_KERNELS[key] = _layer_kernels(ctx, moe, gpu, eff)
        return base
    core_fwd, core_bwd = attention_kernels(ctx, gpu, eff, 0.0 if cuda_graphs(ctx) else eff.cpu_op_s)
    forward = _spliced(base.forward, base.attention, core_fwd)
    backward = _spliced(base.backward, base.attention_bwd, core_bwd)
    rc = ctx.work.activation_recompute
    recompute = full_rerun(ctx, forward, moe) if rc == "full" else core_fwd if rc == "selective" else ()
    return LayerKernels(forward, backward, recompute, core_fwd, core_bwd)


def _spliced(kernels: tuple, old: tuple, new: tuple) -> tuple:
    """``kernels`` with the contiguous run ``old`` (the very objects) replaced by ``new``."""
    at = next(i for i, k in enumerate(kernels) if k is old[0])
    return kernels[:at] + new + kernels[at + len(old) :]


def per_layer(memo: dict, fn, ctx: Context, moe: bool | None, gpu: GPUSpec, eff: Efficiency, *args):
    """``fn(ctx, moe, gpu, eff, *args)`` memoised in ``memo`` on (layer_kernels_key, moe, gpu, eff, args): for
    what reads no more of the context than a layer's kernels do (args: plain values). Bounded: cleared past
    LAYER_KERNELS_KEPT entries."""
    key = (layer_kernels_key(ctx), moe, gpu, eff, args)
    return memo_by(memo, key, LAYER_KERNELS_KEPT, fn, ctx, moe, gpu, eff, *args)


def per_tokens(memo: dict, fn, ctx: Context, moe: bool | None, gpu: GPUSpec, eff: Efficiency, *args):
    """``per_layer`` for what reads the micro-batch size b and cp only through the tokens one rank holds,
    b·s/cp, as a layer's kernels other than core attention do (token_kernels_key): the input embedding, the
    decoder's final norm, the LM head and its loss. Memoised in ``memo`` on (token_kernels_key, moe, gpu, eff,
    args), so layouts with equal tokens per rank (b 2, cp 2 and b 1, cp 1) share an entry; where that key is None
    (inference, decode) on layer_kernels_key, as per_layer. Bounded: cleared past LAYER_KERNELS_KEPT entries."""
    tokens = ctx.token_kernels_key
    key = (layer_kernels_key(ctx) if tokens is None else ("tokens", tokens), moe, gpu, eff, args)
    return memo_by(memo, key, LAYER_KERNELS_KEPT, fn, ctx, moe, gpu, eff, *args)


def memo_by(memo: dict, key, kept: int, fn, *args):
    """``fn(*args)`` memoised in ``memo`` under ``key`` (a value the caller derives from what fn reads), bounded:
    cleared past ``kept`` entries. The one shape of the planner's value memos (per_layer, rules/tensor.py
    _by_layout)."""
    found = memo.get(key)
    if found is None:
        if len(memo) >= kept:
            memo.clear()
        found = memo[key] = fn(*args)
    return found


def layer_kernels_key(ctx: Context) -> tuple:
    """The value key of everything a layer's kernels read of the context (layer_kernels_key_of), built once per
    context object: ``Context.layer_kernels_key``, a cached property (the context is frozen). A stage's passes
    look it up for every per-layer memo, some 30,000 times on a 20,000-layout search."""
    return ctx.layer_kernels_key


def layer_kernels_key_of(ctx: Context) -> tuple:
    """The value key of everything a layer's kernels read of the context: the model, the workload (micro-batch,
    sequence, dtypes, recipe, kernel options, recompute), dp where it splits the batch (inference), the degrees
    the shapes read (tp, cp, SP, ep, expert tp), the framework's traits the kernels read (its flavour's fusion
    and default attention kernel) and cp_comm. Not pp, virtual stages, the schedule, dp when training, ZeRO nor
    the rank order.
    tests/planner/test_search_speed.py checks equal keys give equal kernels over drawn layouts."""
    par = ctx.par
    return (
        ctx.model,
        ctx.work,
        None if ctx.training else par.dp,
        par.tp,
        par.cp,
        par.sp,
        par.ep,
        par.etp,
        *kernel_traits(par.flavour),
        par.cp_comm,
        par.cp_load_balance,
        par.ep_dispatch,
    )


def kernel_traits(flavour) -> tuple:
    """What a layer's kernels read of the framework's flavour (fusion, attention_kernel, ...): its traits, not
    its name (a name may be registered again). The one list of layer_kernels_key and token_kernels_key."""
    return (
        flavour.fused_kernels,
        flavour.flash_attention_by_sm,
        flavour.sink_attention_kernels,
        flavour.grad_accumulation_fusion,
        flavour.fused_cross_entropy,
        flavour.expert_gemm_streams,
        flavour.dispatch_count_sync,
        flavour.count_sync_needs_ep,
        flavour.count_sync_after_permute,
        flavour.host_launch_s,  # queue_launch_s
        flavour.moe_score_combine,
        flavour.fp8_expert_padding,
        flavour.unfused_rope_scalings,
        flavour.eager_glu_clamp,
        flavour.weighted_act_grad,
        flavour.expert_bias_loop,
        flavour.dispatch_preprocess_launches,
        flavour.local_linear_biases,
        flavour.vocab_parallel_loss,  # the head's loss: its vocabulary and kernels (loss_vocab, loss_chain)
        flavour.loss_parallel_switch,
        flavour.embedding_transposes,
        flavour.torchao_float8,  # _fp8_casts: recipes.float8_gathered
        flavour.te_fp8_recipes,  # expert_quantize_launches
        flavour.recompute_stops_at_last_save,  # full_rerun
        flavour.cp_rotate_methods,  # torch_cp_merge_kernels
        flavour.persist_layer_norm_sizes,  # apex_norm
        flavour.hf_modules,  # the LM head's and the embedding's vocabulary shard (vocab_shard)
    )


def _residual_add(k: _Layer, elements: float) -> None:
    """One bias-dropout-add over ``elements`` (Fusion.residual: x + bias, dropout, + residual). With hidden dropout
    (memory.hidden_dropout) it also writes the 1-byte mask its backward reads (DROPOUT_BYTES: torch's native_dropout
    keeps a bool mask, as does torch.compile's decomposition, which Megatron-Core's jit_fuser runs) and draws a Philox
    number per element: the forward takes the longer of its bytes and its draws (with_draws); the backward reads the
    mask once beside BACKWARD_BYTES x the add's bytes. Where Megatron runs it unfused (unfused_bias_add: GPT-OSS's
    bias_dropout_fusion False, fused_bias_dropout.py bias_dropout_add_unfused at f2e5db402c) the dropout is torch's own
    kernel before the add. Dropout 0 adds nothing (memory.dropout_probs)."""
    from .memory import hidden_dropout

    nbytes, count = k.fu.residual
    if not hidden_dropout(k.ctx):
        k.mem("residual_add", nbytes * elements, count)
        return
    if unfused_bias_add(k.ctx):  # bias_dropout_fusion off: bias_dropout_add_unfused runs torch's dropout on its own
        # (fused_dropout: read and write x bytes and the 1-byte mask, backward masked_scale alike), then the add
        drop = (2 * k.ctx.x + DROPOUT_BYTES) * elements
        k.mem("residual_dropout", drop, 1, back=1.0)
        k.fwd[-1] = with_draws(k.fwd[-1], elements, drop, k.gpu, k.eff)
        k.mem("residual_add", nbytes * elements, count)
        return
    mask = DROPOUT_BYTES * elements
    forward = nbytes * elements + mask
    k.mem("residual_add", forward, count, back=(BACKWARD_BYTES * nbytes * elements + mask) / forward)
    k.fwd[-1] = with_draws(k.fwd[-1], elements, forward, k.gpu, k.eff)


def _layer_kernels(ctx: Context, moe: bool, gpu: GPUSpec, eff: Efficiency) -> LayerKernels:
    mdl, par = ctx.model, ctx.par
    t, T, h = par.tp, ctx.b * ctx.s_cp, mdl.hidden_size
    T_sp = T / (t if par.sp else 1)
    k = _Layer(ctx, gpu, eff)
    k.norm("input_norm", T_sp * h)
    core_index = _attention_projections(k, T)
    core_fwd, core_bwd = attention_kernels(ctx, gpu, eff, k.floor)
    k.fwd[core_index:core_index] = list(core_fwd)
    k.bwd.extend(core_bwd)
    bias_add = unfused_bias_add(ctx)
    (bias_f, bias_n), (bias_b, _) = UNFUSED_BIAS_ADD
    if bias_add:
        k.mem("attn_bias_add", bias_f * T_sp * h, bias_n, back=bias_b / bias_f)
    _residual_add(k, T_sp * h)
    k.norm("pre_mlp_norm", T_sp * h)
    if moe:
        _moe_mlp(k, T, T_sp)
    else:
        _dense_mlp(k, T)
        if bias_add:  # a dense layer's fc2 bias comes out for its bias-dropout-add too (an MoE layer's does not)
            k.mem("mlp_bias_add", bias_f * T_sp * h, bias_n, back=bias_b / bias_f)
    _residual_add(k, T_sp * h)
    if k.dt not in ("bf16", "fp32"):
        _fp8_casts(k)
    if ctx.training and not grad_accumulation_fusion(ctx):
        _grad_accumulation(k, moe)
    if ctx.flavour.local_linear_biases and mdl.linear_bias:
        _local_biases(k, T, T_sp, moe)
    if moe:
        forward, backward = te_graphed(ctx, tuple(k.fwd), tuple(k.bwd), eff, graph_copies(k, T_sp))
    else:
        forward, backward = tuple(k.fwd), tuple(k.bwd)
    rc = ctx.work.activation_recompute if ctx.training else "none"
    if rc == "full":
        recompute = full_rerun(ctx, forward, moe)
    elif rc == "selective":
        recompute = tuple(core_fwd)
    else:
        recompute = ()
    return LayerKernels(forward, backward, recompute, tuple(core_fwd), tuple(core_bwd))


# An MoE layer's kernels in Megatron-Core's partial TransformerEngine CUDA graph (workload.cuda_graph_scope), by scope:
# "moe_router" captures the pre-MLP norm, the router and, without moe_shared_expert_overlap (the planner runs the
# shared experts in line), the shared experts (Megatron-LM cba6b0ed0f transformer_layer.py
# _get_submodules_under_cudagraphs l. 790-797; moe_layer.py l. 296-306: shared_experts_compute, route, preprocess);
# "moe_preprocess" the dispatcher's preprocess with them (moe_layer.py l. 190-203 MoELayer.preprocess, the graph
# returning at MoECudaGraphPartialCaptureSignal). Each graph is one replay a layer and micro-batch on the host (TE
# make_graphed_callables: a forward graph and a backward graph), its kernels' GPU time unchanged.
TE_GRAPH_KERNELS = {
    "moe_router": ("pre_mlp_norm", "router", "router_topk", "shared_fc1", "shared_activation", "shared_fc2"),
    "moe_preprocess": ("dispatch_preprocess",),
}
# The alltoall dispatcher's dispatch_preprocess ends with permutation 1 (token_dispatcher.py cba6b0ed0f l. 600-653:
# preprocess, then permute(...) l. 641-653), so its graph holds the permute too; the allgather dispatcher's permute
# runs in dispatch_postprocess after the all-gather (l. 253-261, 304) and the flex dispatchers' preprocess is metadata
# (l. 1426-1450): PERMUTE_BEFORE_WAIT below names the dispatchers whose preprocess graph captures it
GRAPHED_PERMUTE = "permute"
# TE v2.9 pytorch/graph.py l. 650-655 and 668-673: each replay first copies its user arguments into the graph's static
# inputs (forward: the MoE layer's hidden_states, one copy_) and, backward, each incoming gradient into the static
# grad outputs (one copy_ per graph output with a gradient). The outputs (Megatron-LM cba6b0ed0f moe_utils.py l.
# 1052-1092 get_early_return_outputs): "route" returns hidden_states, probs and the bool routing_map (2 with a
# gradient), "preprocess" the permuted hidden_states and probs and the residual (3); the shared experts' output
# besides where there is one. Each by its elements a token: "hidden" h, "logits" E, "rows" top_k x h, "row_probs" top_k
GRAPH_GRAD_OUTPUTS = {"moe_router": ("hidden", "logits"), "moe_preprocess": ("rows", "row_probs", "hidden")}


def graphed_preprocess(ctx: Context) -> bool:
    """Whether the alltoall dispatcher's preprocess (and its permutation) is in the TE graph: Megatron then copies the
    counts to the host at "before_ep_alltoall", after the permutation, not "before_permutation_1"
    (token_dispatcher.py cba6b0ed0f l. 445-451 ``cuda_dtoh_point``, an attribute of MoEAlltoAllTokenDispatcher
    only: the other dispatchers' preprocess moves no copy)."""
    return ctx.training and "moe_preprocess" in ctx.work.cuda_graph_scope and ctx.par.ep_dispatch in PERMUTE_BEFORE_WAIT


def graphed_pre_mlp_norm(ctx: Context, moe: bool) -> bool:
    """Whether an MoE layer's pre-MLP norm is in a moe_router TE graph: Megatron then does not recompute it under
    selective "layernorm" recompute, only the input norm (transformer_layer.py cba6b0ed0f l. 386-397
    recompute_pre_mlp_layernorm; transformer_config.py l. 1690-1698 warns "Will only recompute the
    input_layernorm"). compute.recompute_modules_forward (the rerun's time) and memory.freed_activations (the MLP
    input then stays) read it."""
    return moe and ctx.training and "moe_router" in ctx.work.cuda_graph_scope


def graph_copies(k: _Layer, T_sp: float) -> tuple[Kernel, Kernel] | None:
    """TE's copies around a partial graph's replays (GRAPH_GRAD_OUTPUTS): the forward's input copy and the backward's
    incoming gradients' copies, memory-bound (read and write), one launch each; None without a scope."""
    ctx = k.ctx
    scope = ctx.work.cuda_graph_scope if ctx.training else ()
    if not scope:
        return None
    m, h, x = ctx.model.moe, ctx.model.hidden_size, max(ctx.x, 2)  # the layer's bf16 tensors (fp8 is in the GEMMs)
    size = {"hidden": h, "logits": m.num_experts, "rows": m.top_k * h, "row_probs": m.top_k}
    outputs = GRAPH_GRAD_OUTPUTS["moe_preprocess" if "moe_preprocess" in scope else "moe_router"]
    outputs += ("hidden",) if m.shared_ffn else ()  # the shared experts' output
    grads, per_token = len(outputs), sum(size[o] for o in outputs)
    forward = memory_kernel("graph_input_copy", 2 * T_sp * h * x, k.gpu, k.eff, 1, k.floor)
    backward = memory_kernel("graph_grad_copy", 2 * T_sp * per_token * x, k.gpu, k.eff, grads, k.floor)
    return forward, backward


def te_graphed(
    ctx: Context, forward: tuple, backward: tuple, eff: Efficiency, copies: tuple[Kernel, Kernel] | None = None
) -> tuple[tuple, tuple]:
    """An MoE layer's ``forward`` and ``backward`` with the kernels of a partial TE CUDA graph (TE_GRAPH_KERNELS of
    the workload's cuda_graph_scope, GRAPHED_PERMUTE under graphed_preprocess) as one replay each way, after TE's
    copies (``copies``: graph_copies): the forward's contiguous run from the pre-MLP norm, the backward's kernels of
    those modules (their names before the first "."); the preprocess's copies of the counts stay host launches
    (Flavour.dispatch_count_copies: made at the all-to-all, outside the graph). Unchanged without a scope. A dense
    layer has no such graph (transformer_layer.py l. 790: ``self.is_moe_layer and 'moe_router' in ...``)."""
    scope = ctx.work.cuda_graph_scope if ctx.training else ()
    names = {n for s in scope for n in TE_GRAPH_KERNELS[s]} | ({GRAPHED_PERMUTE} if graphed_preprocess(ctx) else set())
    at = next((i for i, k in enumerate(forward) if k.name == "pre_mlp_norm"), None) if names else None
    if at is None:
        return forward, backward
    end = at
    while end < len(forward) and forward[end].name in names:
        end += 1
    copy_f, copy_b = ((c,) for c in copies) if copies is not None else ((), ())
    left = dispatch_count_copies(ctx)
    run = tuple(replace(k, host_launches=left) if k.name == "dispatch_preprocess" else k
                for k in _one_replay(forward[at:end], eff))  # fmt: skip
    fwd = forward[:at] + copy_f + run + forward[end:]
    own = [i for i, k in enumerate(backward) if k.name.split(".", 1)[0] in names]
    if not own:
        return fwd, backward
    replayed = dict(zip(own, _one_replay(tuple(backward[i] for i in own), eff), strict=True))
    bwd = tuple(replayed.get(i, k) for i, k in enumerate(backward))
    return fwd, bwd[: own[0]] + copy_b + bwd[own[0] :]


def dispatch_count_copies(ctx: Context) -> int:
    """The preprocess's device-to-host copies of the counts (Flavour.dispatch_count_copies, dispatch_preprocess's
    three cases) where its graph leaves them outside; 0 where the preprocess is not graphed."""
    copies = ctx.flavour.dispatch_count_copies
    if not copies or not graphed_preprocess(ctx) or not dispatch_preprocess(ctx):
        return 0
    many, one, padded = copies
    if ctx.model.moe.capacity_factor:
        return padded
    return many if ctx.par.ep * ctx.par.etp > 1 else one


def _one_replay(kernels: tuple, eff: Efficiency) -> tuple:
    """A captured graph's kernels: the first carries the replay's one launch (at least one dispatch, cpu_op_s), the
    rest their GPU time and no launch."""
    if not kernels:
        return ()
    head, rest = kernels[0], kernels[1:]
    g = gpu_seconds(head)
    first = replace(head, time_s=max(g, eff.cpu_op_s), gpu_s=g, host_launches=1)
    return (first, *(replace(k, time_s=gpu_seconds(k), gpu_s=None, host_launches=0) for k in rest))


# what a dense layer's forward runs from its output linear on (kernels.full_rerun): fc2, its bias and the residual add
LAYER_TAIL = ("fc2", "mlp_bias_add", "residual_dropout", "residual_add")
BDA_KERNELS = ("residual_dropout", "residual_add")  # a bias-dropout-add's kernels (_residual_add)


def rerun_stops_at_last_save(ctx: Context) -> bool:
    """Whether a fully recomputed layer re-runs only what its backward needs (Flavour.recompute_stops_at_last_save
    under torch.compile: the min-cut partitioner); eager, the whole forward."""
    return ctx.flavour.recompute_stops_at_last_save and ctx.work.torch_compile


def full_rerun(ctx: Context, forward: tuple, moe: bool) -> tuple:
    """The kernels a fully recomputed layer runs again in its backward: the whole forward, or, where the re-run
    stops at what the backward needs (rerun_stops_at_last_save), a dense layer's forward without its tail
    (LAYER_TAIL from fc2 on): nothing in the backward reads fc2's output nor the residual sum after it. An MoE
    layer ends in its combine: re-run whole (no source read for what its backward keeps). The fp8 casts (one lump,
    "fp8_cast") stay whole: fc2's own casts are an over-count."""
    if moe or not rerun_stops_at_last_save(ctx):
        return forward
    names = [k.name for k in forward]
    if "fc2" not in names:
        return forward
    at = names.index("fc2")
    return forward[:at] + tuple(k for k in forward[at:] if k.name not in LAYER_TAIL)


def moe_block(forward: tuple) -> tuple:
    """The kernels of an MoE layer's ``forward`` that Megatron's selective "moe" recompute re-runs: its checkpoint of
    the MoE layer (Megatron-LM 92c8482e6d transformer_layer.py, recompute_mlp: tensor_parallel.checkpoint of
    self.mlp), from the router through the combine, with the shared experts and the dispatcher's count sync; not
    the pre-MLP norm nor the residual add after it. () without a router (a dense layer)."""
    names = [k.name for k in forward]
    if "router" not in names:
        return ()
    at = names.index("router")
    # up to the bias-dropout-add after it (its unfused dropout kernel, where one runs, included: outside the checkpoint)
    end = min((i for i, n in enumerate(names) if n in BDA_KERNELS and i > at), default=len(names))
    return forward[at:end]


def mtp_runs_bf16(ctx: Context) -> bool:
    """Whether the MTP modules run bf16 GEMMs where the decoder runs a recipe: a recipe they do not enter (nvfp4:
    Megatron-LM d98e8a6 multi_token_prediction.py _proj_and_transformer_layer enters get_fp8_context only when
    config.fp8, "currently ignoring FP4 in MTP layers"; rules/fp8.py mtp_quantized). The one home of the rule: the
    module's own kernels here, its transformer layers' context in compute.mtp_bf16_context."""
    from .rules.fp8 import mtp_quantized

    return ctx.work.recipe is not None and not mtp_quantized(ctx)


def mtp_module_kernels(ctx: Context, gpu: GPUSpec, eff: Efficiency | None = None) -> LayerKernels:
    """One MTP module's own kernels beside its transformer layer (which is one more layer of the chunk holding
    ``m``, counted by layer_kernels) and the shared output layer (compute.head_kernels, on the loss's rank), one
    micro-batch, one rank (Megatron-LM d98e8a6 multi_token_prediction.py MultiTokenPredictionLayer
    ``_concat_embeddings``: enorm over the shifted tokens' embedding, hnorm over the previous depth's hidden
    states, torch.cat into [s, b, 2h], eh_proj a ColumnParallelLinear 2h -> h/tp; then ``final_layernorm``;
    DeepSeek-V3 report §2.2). The norms run on the sequence shard under SP, eh_proj on the gathered rows. eh_proj
    runs in the module's fp8 context (rules/fp8.py mtp_quantized), bf16 otherwise ("currently ignoring FP4 in
    MTP layers"). Recompute: full by the uniform method checkpoints the module whole (recompute.mtp_checkpointed:
    ``_checkpointed_forward``), so the backward re-runs these too; block and selective leave them alone. Memoised
    by value (per_layer)."""
    return per_layer(_MTP_KERNELS, _mtp_module_kernels, ctx, None, gpu, efficiency(gpu, eff))


_MTP_KERNELS: dict = {}


def _mtp_module_kernels(ctx: Context, _moe, gpu: GPUSpec, eff: Efficiency) -> LayerKernels:
    from .recompute import mtp_checkpointed

    par, h = ctx.par, ctx.model.hidden_size
    T = ctx.b * ctx.s_cp
    T_sp = T / (par.tp if par.sp else 1)
    k = _Layer(ctx, gpu, eff)
    if mtp_runs_bf16(ctx):
        k.dt = "bf16"
    norm_b, norm_n = k.fu.norm
    k.mem("mtp.enorm", norm_b * T_sp * h, norm_n)
    k.mem("mtp.hnorm", norm_b * T_sp * h, norm_n)
    k.mem("mtp.concat", 4 * T_sp * h * ctx.x, 1)  # torch.cat: read h + h, write 2h (x bytes an element)
    k.gemm("mtp.eh_proj", T, h / par.tp, 2 * h)
    k.mem("mtp.final_layernorm", norm_b * T_sp * h, norm_n)
    if k.dt not in ("bf16", "fp32"):
        _fp8_casts(k)
    if ctx.training and not grad_accumulation_fusion(ctx):
        _grad_accumulation(k, False)
    checkpointed = tuple(k.fwd)  # _checkpointed_forward wraps _proj_and_transformer_layer, not _get_embeddings
    # _get_embeddings rolls the ids and positions one token left (multi_token_prediction.py roll_tensor: two
    # torch.roll over int64, 16 B a token read and written), then looks the shifted tokens up
    k.mem("mtp.embedding.roll_ids", 2 * 2 * 8 * T, 2, back=0)
    _embedding_lookup(k, T, "mtp.embedding")
    forward, backward = tuple(k.fwd), tuple(k.bwd)
    return LayerKernels(forward, backward, checkpointed if mtp_checkpointed(ctx.work) else ())


# PyTorch's dense embedding backward (aten/src/ATen/native/cuda/Embedding.cu embedding_dense_backward_cuda: a radix
# sort of the indices; EmbeddingBackwardKernel.cu embedding_backward_cuda_kernel: at::zeros of the [num_weights, h]
# gradient, segment offsets, partial sums per segment, their sum scattered into the rows): its launches, counted
# from those two files (sort 4, segments 2, partials 2, scatter 1, zeros 1)
EMBEDDING_BACKWARD_LAUNCHES = 10
# VocabParallelEmbedding.forward with tp > 1: the out-of-shard mask (two compares and their or), clone, subtract the
# shard's start, index_put of 0 (six int64 kernels over the ids); then output_parallel[input_mask, :] = 0 (nonzero
# and index_put: two)
VOCAB_MASK_LAUNCHES, VOCAB_MASK_OUTPUT_LAUNCHES = 6, 2
# torch dropout (aten/src/ATen/native/cuda/Dropout.cu fused_dropout): read x, write x and a 1-byte mask per element;
# its backward reads the gradient and the mask and writes the gradient (masked_scale)
DROPOUT_BYTES = 1  # the mask's bytes per element, beside 2x of data each way


def embedding_kernels(ctx: Context, gpu: GPUSpec, eff: Efficiency | None = None) -> LayerKernels:
    """The main model's input embedding on the rank holding it (the first stage), one micro-batch, training:
    ``_embedding_lookup`` of its b·s/cp tokens (Megatron-LM d98e8a6 gpt_model.py ``_preprocess``:
    ``self.embedding(input_ids=..., position_ids=...)``, LanguageModelEmbedding over VocabParallelEmbedding).
    Its TP reduction is a ledger call (rules/tensor.py ``tp.embedding``). Not recomputed: the checkpoints wrap
    the transformer layers only. Inference runs no backward and is not counted here (a gather of b rows a
    decode step). Memoised by value (per_layer)."""
    return per_tokens(_EMBEDDING_KERNELS, _embedding_kernels, ctx, None, gpu, efficiency(gpu, eff))


_EMBEDDING_KERNELS: dict = {}


def _embedding_kernels(ctx: Context, _moe, gpu: GPUSpec, eff: Efficiency) -> LayerKernels:
    k = _Layer(ctx, gpu, eff)
    if ctx.training:
        _embedding_lookup(k, ctx.b * ctx.s_cp, "embedding")
    return LayerKernels(tuple(k.fwd), tuple(k.bwd), ())


def _embedding_lookup(k: _Layer, T: float, name: str) -> None:
    """A word-embedding lookup of T tokens on one rank, forward and backward: Megatron-LM d98e8a6
    megatron/core/models/common/embeddings/language_model_embedding.py LanguageModelEmbedding.forward over
    tensor_parallel/layers.py VocabParallelEmbedding.forward (its TP all-reduce or reduce-scatter is a ledger
    call, rules/tensor.py). With tp > 1 the vocabulary-shard mask over the ids; F.embedding gathers T rows of h
    (read and write x bytes each); the masked rows zeroed; learned positions (GPT) a second lookup in the
    [seq, h] table and its add; the [b, s, h] -> [s, b, h] transpose made contiguous (Flavour.embedding_transposes:
    torch models keep [b, s, h]); under SP with positions the local scatter's contiguous split, and Megatron's
    clone of the scattered output (clone_scatter_output_in_embedding, True by default in transformer_config.py;
    Flavour.embedding_transposes too); the embedding dropout where the model trains with hidden dropout
    (memory.hidden_dropout: Megatron's embedding_dropout is torch.nn.Dropout(config.hidden_dropout)), on the
    sequence shard under SP.
    The backward runs the dropout's, the transpose's and the mask's gradients, then PyTorch's dense embedding
    backward (aten/src/ATen/native/cuda/Embedding.cu embedding_dense_backward_cuda), which zero-fills the whole
    [V/t, h] gradient and sums the T rows into it (EMBEDDING_BACKWARD_LAUNCHES), and the DDP backward hook adds
    that gradient into the main_grad (Megatron distributed/param_and_grad_buffer.py, grad_accumulation_bytes:
    fp32, read 2 + 4 and write 4 bytes a weight, every micro-batch; with several lookups of one weight in a
    micro-batch autograd sums their gradients first and the hook runs once, a little less than counted here;
    torch's AccumulateGrad adds from the second micro-batch on): the two V·h terms dominate (DeepSeek-V3, tp 1:
    11.1 GB a lookup). The main model's lookup (``embedding_kernels``) and each MTP module's
    (``_mtp_module_kernels``, after its roll of the ids) run this."""
    from .memory import hidden_dropout

    ctx, t = k.ctx, k.ctx.par.tp
    mdl, x = ctx.model, ctx.x
    h = mdl.hidden_size
    row = T * h * x
    sbh = ctx.par.flavour.embedding_transposes
    positions = mdl.learned_position_embeddings
    sp_copies = (positions + 1) if (sbh and ctx.par.sp and t > 1) else 0  # the scatter's split, the clone
    out = row / (t if ctx.par.sp else 1)  # the embedding's output: the sequence shard under SP
    dropout = hidden_dropout(ctx)
    # (runs, name, bytes, launches), in the order they run
    forward = (
        (t > 1, ".vocab_mask", 6 * 2 * 8 * T, VOCAB_MASK_LAUNCHES),
        (True, ".gather", 2 * row, 1),
        (t > 1, ".mask_output", row, VOCAB_MASK_OUTPUT_LAUNCHES),
        (positions, ".positions", 2 * row + 3 * row, 2),  # F.embedding of the positions, the add
        (sbh, ".transpose", 2 * row, 1),
        (sp_copies, ".sp_copy", 2 * out, sp_copies),
        (dropout, ".dropout", out * (2 + DROPOUT_BYTES / x), 1),
    )
    for runs, what, nbytes, launches in forward:
        if runs:
            k.mem(name + what, nbytes, launches, back=0)
    if not ctx.training:
        return
    backward = (
        (dropout, ".dropout.bwd", out * (2 + DROPOUT_BYTES / x), 1),
        (sbh, ".transpose.bwd", 2 * row, 1),
        (t > 1, ".mask_output.bwd", row, VOCAB_MASK_OUTPUT_LAUNCHES),
    )
    for runs, what, nbytes, launches in backward:
        if runs:
            k.bwd.append(memory_kernel(name + what, nbytes, k.gpu, k.eff, launches, k.floor))
    _dense_embedding_backward(k, T, vocab_shard(ctx), name)
    if positions:
        _dense_embedding_backward(k, T, mdl.seq_length, name + ".positions")


def _dense_embedding_backward(k: _Layer, T: float, rows: int, name: str) -> None:
    """PyTorch's dense embedding backward of T looked-up rows into a [rows, h] table (zero fill in the weight's
    dtype, the rows read and summed in, the sort's keys and values) and the main_grad add of that gradient."""
    ctx = k.ctx
    grad = rows * ctx.model.hidden_size  # the weight gradient's elements
    dense = grad * ctx.param_bytes + 2 * T * ctx.model.hidden_size * ctx.x + 4 * 8 * T
    k.bwd.append(memory_kernel(name + ".wgrad", dense, k.gpu, k.eff, EMBEDDING_BACKWARD_LAUNCHES, k.floor))
    k.bwd.append(memory_kernel(name + ".main_grad", grad_accumulation_bytes(ctx, grad), k.gpu, k.eff, 1, k.floor))


class _Layer:
    """A layer's kernels as they are listed, forward and backward: a GEMM adds its forward and its two backward
    GEMMs (dgrad, wgrad), a memory-bound kernel its forward and (unless ``back`` is 0) its backward."""

    def __init__(self, ctx: Context, gpu: GPUSpec, eff: Efficiency):
        self.ctx, self.gpu, self.eff = ctx, gpu, eff
        self.dt = gemm_dtype(ctx)
        # a recipe whose backward GEMMs take another kernel, rescaled after it (Recipe.backward_kernel_dtype)
        recipe = ctx.work.recipe
        self.dt_bwd = (recipe.backward_kernel_dtype if recipe is not None else "") or self.dt
        self.fu = fusion(ctx)
        self.floor = 0.0 if cuda_graphs(ctx) else eff.cpu_op_s
        self.fwd: list[Kernel] = []
        self.bwd: list[Kernel] = []
        self.weights = 0.0  # GEMM weight elements of the layer on this rank (their gradients accumulate)
        self.weight_tensors = 0

    def gemm(self, name, m, n, k, dtype=None, groups=1):
        self.weights += k * n * groups
        self.weight_tensors += groups
        f, d, w = gemm_kernels(name, m, n, k, dtype or self.dt, self.gpu, self.eff, groups)
        if dtype is None and self.dt_bwd != self.dt:
            _, d, w = gemm_kernels(name, m, n, k, self.dt_bwd, self.gpu, self.eff, groups)
            # each backward GEMM's output scaled by the scale vectors after it (ROWWISE_RESCALE_BYTES): dgrad's
            # (m x k), wgrad's (k x n) per group
            for rescaled, elements in ((d, m * k * groups), (w, k * n * groups)):
                self.bwd.append(_floored(rescaled, self.floor))
                self.bwd.append(
                    memory_kernel(rescaled.name + ".rescale", ROWWISE_RESCALE_BYTES * elements, self.gpu, self.eff,
                                  groups, self.floor)
                )  # fmt: skip
            self.fwd.append(_floored(f, self.floor))
            return
        self.fwd.append(_floored(f, self.floor))
        self.bwd.extend((_floored(d, self.floor), _floored(w, self.floor)))

    def norm(self, name, elements, count=1):
        """``count`` norms over ``elements`` each: one kernel each way, the eager op chain (RMSNORM_OPS), or
        Megatron-LM's pre-persistent MixedFusedLayerNorm (APEX_LAYER_NORM)."""
        chain = RMSNORM_OPS if norm_ops(self.ctx) else APEX_LAYER_NORM if apex_norm(self.ctx) else None
        if chain is not None:
            (fb, fn), (bb, bn) = chain
            self.fwd.append(memory_kernel(name, fb * elements, self.gpu, self.eff, count * fn, self.floor))
            self.bwd.append(memory_kernel(name + ".bwd", bb * elements, self.gpu, self.eff, count * bn, self.floor))
        else:
            self.mem(name, self.fu.norm[0] * elements, count * self.fu.norm[1])

    def mem(self, name, nbytes, count=1, back=BACKWARD_BYTES):
        self.fwd.append(memory_kernel(name, nbytes, self.gpu, self.eff, count, self.floor))
        if back:
            self.bwd.append(memory_kernel(name + ".bwd", nbytes * back, self.gpu, self.eff, count, self.floor))


def final_norm_kernels(ctx: Context, gpu: GPUSpec, eff: Efficiency) -> tuple[tuple[Kernel, ...], tuple[Kernel, ...]]:
    """The decoder's final norm on the chunk that runs it (memory.holds_final_norm): Megatron-Core
    transformer_block.py ``final_layernorm`` (TENorm, built when post_process / has_final_layernorm_in_this_stage,
    run after the last layer), torchtitan models/llama3/model.py ``self.norm`` before ``self.output``; priced as a
    layer's norms are (_Layer.norm: the fused kernel, or the eager RMSNorm chain) over the rank's tokens x h, the
    sequence shard under SP (Megatron's final norm runs on the SP-sharded hidden states before the output layer's
    all-gather). (forward, backward); inference reads the forward only."""
    t, h = ctx.par.tp, ctx.model.hidden_size
    T = ctx.b * ctx.s_cp
    k = _Layer(ctx, gpu, eff)
    k.norm("final_norm", T / (t if ctx.par.sp else 1) * h)
    return tuple(k.fwd), tuple(k.bwd)


def _attention_projections(k: _Layer, T: float) -> int:
    """The attention's projections (MLA's low-rank ones, or fused QKV), norms and rotary; returns where in the
    forward list the core attention goes."""
    mdl, t, h, fu = k.ctx.model, k.ctx.par.tp, k.ctx.model.hidden_size, k.fu
    if mdl.mla:
        a, heads = mdl.mla, mdl.num_attention_heads
        qk = a.qk_nope_head_dim + a.qk_rope_head_dim
        fused = a.q_lora_rank and fused_mla_down_proj(k.ctx)
        if fused:  # one GEMM over the input, its quantize once (engine_kernels: SGLANG_FUSED_QKV_A and the others)
            k.gemm("qkv_down", T, mla_down_proj_n(a), h)
        if a.q_lora_rank:
            if not fused:
                k.gemm("q_down", T, a.q_lora_rank, h)
            k.norm("q_norm", T * a.q_lora_rank)
            k.gemm("q_up", T, heads * qk / t, a.q_lora_rank)
        else:
            k.gemm("q_proj", T, heads * qk / t, h)
        if not fused:
            k.gemm("kv_down", T, a.kv_lora_rank + a.qk_rope_head_dim, h)
        k.norm("kv_norm", T * a.kv_lora_rank)
        k.gemm("kv_up", T, heads * (a.qk_nope_head_dim + a.v_head_dim) / t, a.kv_lora_rank)
        if mla_rope_fused(k.ctx):
            _mla_rope_fused(k, T)
        else:
            rope = T * heads / t * a.qk_rope_head_dim + T * a.qk_rope_head_dim
            k.mem("rotary", fu.rotary[0] * rope, 2 * fu.rotary[1])
        k.gemm("attn_out", T, h, heads * a.v_head_dim / t)
        return len(k.fwd) - 1
    q = mdl.num_attention_heads * mdl.head_size / t
    kv = mdl.kv_heads_per_rank(t) * mdl.head_size  # past kv_heads ranks, each computes its copy of one head
    k.gemm("qkv", T, q + 2 * kv, h)
    if mdl.qk_norm:
        k.norm("qk_norm", T * (q + kv), 2)
    if not mdl.learned_position_embeddings:
        if unfused_rope(k.ctx):
            (f_b, f_n), (b_b, b_n) = UNFUSED_ROPE
            k.mem("rotary", f_b * T * (q + kv), 2 * f_n, back=0)
            # built once per call, for q and for k: twice the bytes and the kernels
            k.mem("rotary_freqs", 2 * ROPE_FREQS[0] * k.ctx.s_cp * mdl.head_size, 2 * ROPE_FREQS[1], back=0)
            k.bwd.append(memory_kernel("rotary.bwd", b_b * T * (q + kv), k.gpu, k.eff, 2 * b_n, k.floor))
        else:
            k.mem("rotary", fu.rotary[0] * T * (q + kv), 2 * fu.rotary[1])
    core_index = len(k.fwd)
    k.gemm("attn_out", T, h, q)
    return core_index


def fused_mla_down_proj(ctx: Context) -> bool:
    """Whether an inference pass runs MLA's q_a and kv_a projections as one GEMM (EngineKernels.fused_mla_down_proj:
    the serving engine's own fused linear, planner/engine_kernels.py); training keeps Megatron-Core's two."""
    ek = ctx.work.engine_kernels
    return not ctx.training and ek is not None and ek.fused_mla_down_proj is not None


def mla_down_proj_n(mla) -> int:
    """The fused down projection's output width: q_lora_rank + kv_lora_rank + qk_rope_head_dim (DeepSeek-V3 2,112)."""
    return mla.q_lora_rank + mla.kv_lora_rank + mla.qk_rope_head_dim


def mla_rope_bytes(mla, heads: float, x: float) -> tuple[tuple[float, float], tuple[float, float]]:
    """Bytes per token of Megatron-Core's fused MLA RoPE kernels (MLA_ROPE_KERNELS), ((q, kv) forward, (q, kv)
    backward), for ``heads`` heads on the rank and ``x``-byte activations (one home: the layer's kernels, tests)."""
    n, nope, rope, v = heads, mla.qk_nope_head_dim, mla.qk_rope_head_dim, mla.v_head_dim
    q_fwd = 2 * n * rope * x  # in place: read and write the rope slice of each head
    kv_fwd = (n * (nope + v) + rope + n * (nope + rope) + n * v) * x  # read kv and k_pe; write key and value
    q_bwd = 2 * n * rope * x  # in place on dq's rope slice
    kv_bwd = (n * (nope + rope) + n * v + n * (nope + v) + rope) * x  # dk, dv -> dkv; dk_pe's sum
    return (q_fwd, kv_fwd), (q_bwd, kv_bwd)


def mla_rope_fused(ctx: Context) -> bool:
    """Whether MLA's RoPE runs as Megatron-Core's fused Triton kernels (MLA_ROPE_KERNELS): training under a fusing
    flavour, not torch.compile (torchtitan does not run fused_mla_yarn_rope_apply; the same test as unfused_rope)."""
    return ctx.training and fusion(ctx) is FUSED and not ctx.work.torch_compile


def _mla_rope_fused(k: _Layer, T: float) -> None:
    """MLA's RoPE, split and key/value assembly as Megatron-Core's two fused Triton kernels each way
    (MLA_ROPE_KERNELS): the mla_rope forward kernels sit after the up-projections, as the checkpoint of
    ``mla_up_proj`` re-runs them (compute.recompute_modules_forward)."""
    mla, heads = k.ctx.model.mla, k.ctx.model.num_attention_heads / k.ctx.par.tp
    (q_f, kv_f), (q_b, kv_b) = mla_rope_bytes(mla, heads, max(k.ctx.x, 2))
    k.fwd.append(memory_kernel("mla_rope", T * (q_f + kv_f), k.gpu, k.eff, MLA_ROPE_KERNELS, k.floor))
    k.bwd.append(memory_kernel("mla_rope.bwd", T * (q_b + kv_b), k.gpu, k.eff, MLA_ROPE_KERNELS, k.floor))


def norm_ops(ctx: Context) -> bool:
    """Whether the layers' RMSNorms run as the eager op chain (workload.norm_kernel "ops", RMSNORM_OPS): only where
    nothing fuses them (an eager flavour without torch.compile; Inductor fuses the chain inside compiled blocks)."""
    return ctx.work.norm_kernel == "ops" and fusion(ctx) is EAGER


def apex_norm(ctx: Context) -> bool:
    """Whether the layers' norms run Megatron-LM's MixedFusedLayerNorm kernels of before the persistent one
    (APEX_LAYER_NORM): workload.norm_kernel "apex" where given, else where the flavour's norm falls back to them
    (Flavour.persist_layer_norm_sizes: Megatron-LM 55ba1f7b96 for a hidden size outside persist_ln_hidden_sizes)."""
    given = ctx.work.norm_kernel
    if given is not None:
        return given == "apex"
    sizes = ctx.par.flavour.persist_layer_norm_sizes
    return sizes is not None and ctx.model.hidden_size not in sizes


def unfused_rope(ctx: Context) -> bool:
    """Whether the framework runs this model's RoPE as torch ops (Flavour.unfused_rope_scalings; UNFUSED_ROPE):
    a fusing framework's non-MLA rotary under a scaling it does not fuse (MLA's RoPE is its own path)."""
    mdl = ctx.model
    return (
        fusion(ctx) is FUSED
        and not ctx.work.torch_compile
        and mdl.mla is None
        and mdl.rope_scaling in ctx.flavour.unfused_rope_scalings
    )


def unfused_bias_add(ctx: Context) -> bool:
    """Whether the attention's (and a dense MLP's) bias-dropout-add runs unfused (UNFUSED_BIAS_ADD): a biased MoE
    under a framework whose grouped experts forbid bias_dropout_fusion (Flavour.expert_bias_loop)."""
    mdl = ctx.model
    return ctx.training and ctx.flavour.expert_bias_loop and mdl.linear_bias and mdl.moe is not None


def expert_bias_loop(ctx: Context, local: int) -> tuple[float, int, float, int]:
    """A biased MoE's fc2 bias added per local expert, scaled by the probs (Flavour.expert_bias_loop: Megatron
    TEGroupedMLP._apply_bias, torch.split / t + b * p / torch.cat), as (forward bytes per element of the R x h
    rows, forward kernels, backward bytes, backward kernels); () when there is none. With probs in the activations'
    dtype (bf16): b * p writes 2, the add reads 4 and writes 2, the cat reads and writes 2 each = 12 B in 2 x local
    + 1 kernels; backward, for b and for p, grad x the other (read 2, write 2) and its sum (read 2), and the split's
    cat of the rows' gradients (read 2, write 2) = 16 B in 4 x local + 1. With fp32 probs (FP32_PROBS_DISPATCH) the
    products, sums and cat are fp32 and a cast back follows: 28 B in 2 x local + 2, backward 40 B in 5 x local + 2
    (the casts of the gradient to fp32 and of each expert's rows' gradient back). Not under CUDA graphs: the loop
    needs each expert's rows on the host (experts.py: "this path must never be included in a CUDA graph"), so a
    captured step runs the packed bias in the epilogue."""
    mdl = ctx.model
    if not (ctx.training and ctx.flavour.expert_bias_loop and mdl.linear_bias) or cuda_graphs(ctx):
        return ()
    x = 2.0
    pb = 4.0 if ctx.par.ep_dispatch in FP32_PROBS_DISPATCH else x
    cast = pb != x
    forward = pb + (x + 2 * pb) + 2 * pb + (pb + x if cast else 0.0)
    backward = 2 * (pb + x if cast else 0.0) + 2 * 3 * pb + 2 * x
    return forward, 2 * local + 1 + cast, backward, 4 * local + 1 + (local + 1 if cast else 0)


def _local_biases(k: _Layer, T: float, T_sp: float, moe: bool) -> None:
    """Megatron-LM's own linears' bias kernels (LOCAL_BIAS_BYTES): the QKV bias add after the qkv GEMM, and the
    bias gradients' reductions (QKV, the attention's dense; fc1 and fc2 in a dense layer)."""
    ctx, x = k.ctx, k.ctx.x
    mdl, t, h = ctx.model, ctx.par.tp, ctx.model.hidden_size
    qkv = (mdl.num_attention_heads + 2 * mdl.kv_heads) * mdl.head_size / t
    add, reduce = LOCAL_BIAS_BYTES
    after = next(i for i, g in enumerate(k.fwd) if g.name == "qkv") + 1
    k.fwd.insert(after, memory_kernel("qkv_bias_add", add * x * T * qkv, k.gpu, k.eff, 1, k.floor))
    fc1 = _activation(k)[0] * mdl.ffn_hidden_size / t  # the fc1 output's width (gate and up when gated)
    grads = [T * qkv, T_sp * h] + ([] if moe else [T * fc1, T_sp * h])
    k.bwd.append(memory_kernel("bias_grads", reduce * x * sum(grads), k.gpu, k.eff, len(grads), k.floor))


def _activation(k: _Layer) -> tuple[int, float, tuple]:
    """(1 or 2 up-projections, the activation's bytes per element and kernel count): gated (SwiGLU) or not."""
    gated = k.ctx.model.gated_mlp
    return (2 if gated else 1), gated, (k.fu.gated_act if gated else k.fu.act)


def _dense_mlp(k: _Layer, T: float) -> None:
    gate, _, (act_b, act_n) = _activation(k)
    f, h = k.ctx.model.ffn_hidden_size / k.ctx.par.tp, k.ctx.model.hidden_size
    k.gemm("fc1", T, gate * f, h)
    k.mem("activation", act_b * T * f, act_n)
    k.gemm("fc2", T, h, f)


def _moe_mlp(k: _Layer, T: float, T_sp: float) -> None:
    """The router, the shared experts (a dense MLP over tp) and the routed experts (routed_expert_kernels)."""
    ctx, gpu, eff = k.ctx, k.gpu, k.eff
    mdl, par, t, h = ctx.model, ctx.par, ctx.par.tp, ctx.model.hidden_size
    gate, gated, (act_b, act_n) = _activation(k)
    m = mdl.moe
    E = m.num_experts
    k.gemm("router", T_sp, E, h, dtype="bf16" if k.dt != "fp32" else k.dt)  # the router stays in high precision
    # router: fp32 softmax/sigmoid over E logits, top-k, the aux loss; Megatron-Core's router (moe/router.py)
    # runs ~8 small kernels (softmax, topk, scatter to the routing map, the aux-loss sums)
    k.mem("router_topk", 4 * 3 * T_sp * E, 8)
    if m.shared_ffn:
        k.gemm("shared_fc1", T, gate * m.shared_ffn / t, h)
        k.mem("shared_activation", act_b * T * m.shared_ffn / t, act_n)
        k.gemm("shared_fc2", T, h, m.shared_ffn / t)
    rows, local = expert_rows(ctx, eff)
    tokens = dispatched_tokens(ctx)
    f = m.expert_ffn_hidden_size / par.etp
    x = max(2, ctx.x)  # fp8 recipes keep the tensors between kernels in bf16
    # a training framework's expert GEMMs (Flavour.expert_gemm_streams); serving engines run one fused MoE kernel
    # (vLLM/SGLang fused_moe, TensorRT-LLM's CUTLASS MoE: the measured tables of test_kernels)
    fused = fused_grouped_mlp(ctx)
    streams = ctx.flavour.expert_gemm_streams if ctx.training and not fused else 0
    # a training flavour with one grouped kernel runs torch._grouped_mm (CUTLASS ptr-array, GROUPED_GEMM_K0), each
    # expert's count its own multinomial draw about the mean rows (variance ~ the mean when E >> 1; a capacity
    # factor pads every expert to its capacity: no spread). Measured on that kernel only (the H200 trace and run 2's
    # grouped table); per-expert launches and the serving engines' fused MoE (its own fitted tables) keep the mean
    grouped_mm = ctx.training and not streams
    spread = math.sqrt(rows) if grouped_mm and not m.capacity_factor else 0.0
    k0 = GROUPED_GEMM_K0 if grouped_mm and not fused else 0.0  # TE's fused grouped kernel: cuBLAS's amortisation
    sort = chunk_sort(ctx, local)
    dt = EXPERT_GEMM_DTYPE.get(ctx.work.param_dtype, k.dt)  # MXFP4 experts: weight-only, bf16 math
    # torchtitan's fp32 score multiply before the scatter-add (Flavour.moe_score_combine); torch.compile fuses it
    scores = () if ctx.work.torch_compile else ctx.flavour.moe_score_combine
    clamp = bool(gated and mdl.glu_clamp and ctx.flavour.eager_glu_clamp and ctx.training)
    clamp = clamp and not ctx.work.torch_compile  # Inductor fuses the clamp into the activation
    ef, eb = routed_expert_kernels(
        tokens,
        rows,
        local,
        h,
        f,
        gated,
        dt,
        x,
        k.fu,
        gpu,
        eff,
        k.floor,
        streams=streams,
        sort=sort,
        spread=spread,
        k0=k0,
        score_combine=scores,
        fp8_pad=fp8_expert_padding(ctx, dt) and not fused,
        fused_activation=fused,
        # the fused grouped MLP (TE's op fuser) clamps inside its activation and scales fc2's bias by the probs in
        # its GEMM (Megatron-LM d98e8a6 experts.py _make_fused_ops: ScaledClampedQGeGLU, scale_bias)
        glu_clamp=clamp and not fused,
        expert_bias=() if fused else expert_bias_loop(ctx, local),
        weighted_act=bool(gated and ctx.training and ctx.flavour.weighted_act_grad),
        engine=engine_expert_memory(ctx, rows * local, f, x),
    )
    fl = ctx.flavour
    if (
        ctx.training
        and fl.dispatch_count_sync
        and not m.capacity_factor
        and not cuda_graphs(ctx)
        and (par.ep > 1 or not fl.count_sync_needs_ep)
    ):
        # the dispatcher's: the experts' row counts go to the host before the all-to-all (or the dispatch's end on
        # one rank), whether the experts then launch one by one or as the fused grouped MLP: the CPU waits for the
        # GPU, whose queue then runs dry until the host has launched the next kernel (one host dispatch, cpu_op_s)
        # (its own GPU work: one small device-to-host copy, a memory-bound kernel's fixed cost). Not under CUDA
        # graphs: a captured step holds no host wait (its dispatch is sync-free: Megatron-Bridge 26.08's
        # full-iteration graphs with static expert buffers); host_sync then has nothing to find
        # torchtitan reorders its tokens first and then blocks (Flavour.count_sync_after_permute): the sync follows
        # the permute, whose kernels the wait drains (host_sync then finds nothing queued past it)
        # a TE graph of the preprocess moves Megatron's copy of the counts after the permutation (graphed_preprocess)
        after = fl.count_sync_after_permute or graphed_preprocess(ctx)
        at = next((i + 1 for i, e in enumerate(ef) if e.name == "permute"), 0) if after else 0
        ef.insert(at, Kernel(COUNT_SYNC, "memory", eff.cpu_op_s, bytes=8 * m.num_experts, gpu_s=eff.kernel_s))
    pre = dispatch_preprocess(ctx)
    if pre:  # the counts and splits the sync waits for; forward only: integer counts, no gradient
        ef.insert(0, memory_kernel("dispatch_preprocess", T_sp * E + 8 * E * (par.ep + 2), gpu, eff, pre, k.floor))
    k.fwd.extend(ef)
    k.bwd.extend(eb)


# The host waits for the GPU once per MoE layer forward: Megatron-Core's alltoall and allgather dispatchers move the
# experts' token counts to the host and synchronise the stream (Megatron-LM 92c8482e6d
# megatron/core/transformer/moe/token_dispatcher.py ``_maybe_dtoh_and_synchronize``: the alltoall dispatcher's
# ``cuda_sync_point`` "before_ep_alltoall" for dropless routing over ep > 1, "before_permutation_1" with a capacity
# factor... for one rank "before_finish"; TEGroupedMLP takes the counts as a host list, experts.py). The kernel that
# stands for it in a layer's forward:
COUNT_SYNC = "expert_counts_sync"


# Dispatchers whose host copies the counts before the first permutation and waits only before the all-to-all, the
# permutation's launches queued in between (token_dispatcher.py 92c8482e6d MoEAlltoAllTokenDispatcher:
# ``cuda_dtoh_point`` "before_permutation_1" without a moe_preprocess CUDA graph, ``d2h_event.synchronize()`` at the
# ``cuda_sync_point`` "before_ep_alltoall" for dropless ep > 1); the allgather dispatcher's ``.cpu()`` blocks at once.
PERMUTE_BEFORE_WAIT = ("alltoall",)


def host_sync(ctx: Context, forward: tuple[Kernel, ...]) -> tuple[int, int] | None:
    """Where the host syncs with the GPU in a layer's ``forward``: (the index of COUNT_SYNC, the launch groups after
    it that are enqueued before the host waits: the permute under PERMUTE_BEFORE_WAIT with ep > 1), or None: no
    sync, or CUDA graphs (no host launches to wait for). compute.layer_pass then runs the layer through the host's
    queue (planner/host.py synced_period)."""
    if cuda_graphs(ctx):
        return None
    at = next((i for i, k in enumerate(forward) if k.name == COUNT_SYNC), None)
    if at is None:
        return None
    par = ctx.par
    early = par.ep_dispatch in PERMUTE_BEFORE_WAIT and par.ep * par.etp > 1
    return at, int(early and at + 1 < len(forward) and forward[at + 1].name == "permute")


def queue_launch_s(ctx: Context, eff: Efficiency) -> float:
    """The host's seconds per launch in a synced layer's queue (compute.layer_pass, planner/host.py): a calibrated
    ``host_launch_s`` as given (the user's own host); else the flavour's own (Flavour.host_launch_s: torchtitan's
    eager layer) at the node's host factor (``host_per_op``); else Efficiency's (Megatron-Core's measured layer, kept
    on every host: the factor scales eager PyTorch's host costs only, 76fb6e1), or the eager dispatch ``cpu_op_s``
    (at the factor) where that is 0."""
    own = ctx.flavour.host_launch_s
    if own and not eff.host_launch_given:
        return own * eff.host_per_op
    return eff.host_launch_s or eff.cpu_op_s


# Megatron-Core's combined 1F1B EP overlap (--overlap-moe-expert-parallel-comm; Megatron-LM core_v0.15.0 0d7e02bd26,
# the 25.11 container's: megatron/core/models/common/model_chunk_schedule_plan.py TransformerLayerSchedulePlan.run)
# issues a layer's backward of one micro-batch ("b") and its forward of the next ("f") from one host thread, node by
# node, in this order. The nodes (models/gpt/fine_grained_callables.py build_transformer_layer_callables): attn;
# post_attn, the pre-MLP norm, the router and the dispatcher's preprocess (the count copy, then the first permute);
# dispatch, the wait for the counts ("before_ep_alltoall") and the all-to-all; mlp, the sort, the experts and the
# unsort; combine, the all-to-all, the unpermute and the residual add; "_dw", backward_dw: the attention's and the
# experts' weight gradients. A node waits for the one before it of its own micro-batch (one CUDA event per model
# chunk, pipeline_parallel/utils.py stream_acquire_context), not for the other micro-batch's.
COMBINED_1F1B_ORDER = (
    ("b", "combine"), ("f", "attn"), ("f", "post_attn"), ("b", "mlp"), ("f", "dispatch"), ("b", "mlp_dw"),
    ("b", "dispatch"), ("f", "mlp"), ("f", "combine"), ("b", "post_attn"), ("b", "attn"), ("b", "attn_dw"),
)  # fmt: skip
_BACKWARD_SUFFIXES = (".bwd", ".dgrad", ".wgrad")


# Dispatchers whose host wait for the token counts is in the dispatch node (``token_dispatch``), so that under the
# combined 1F1B the other micro-batch's mlp backward is enqueued before it: the alltoall dispatcher's
# ``d2h_event.synchronize()`` at "before_ep_alltoall" (token_dispatcher.py core_v0.15.0 MoEAlltoAllTokenDispatcher
# token_dispatch), DeepEP's ``Buffer.dispatch`` ("the CPU will wait for GPU's signal to arrive", fused_a2a.py
# core_v0.15.0 FusedDispatch.forward, called from MoEFlexTokenDispatcher.token_dispatch). HybridEP is not in
# core_v0.15.0: not read, its wait taken at the copy.
WAIT_IN_DISPATCH_NODE = ("alltoall", "deepep")


def _forward_nodes(forward: tuple[Kernel, ...], sync: tuple[int, int]) -> list[str] | None:
    """The node of each kernel of an MoE layer's ``forward`` (COMBINED_1F1B_ORDER's names), by its place: attn before
    the pre-MLP norm, post_attn through the count copy and the permute queued after it (host_sync), mlp up to the
    unpermute, combine from it; the fp8 casts (one group, nearly all of them the experts' splits) in mlp. None
    where the layer lacks one of those kernels."""
    names = [k.name for k in forward]
    if "pre_mlp_norm" not in names or "unpermute" not in names:
        return None
    start, end, combine = names.index("pre_mlp_norm"), sync[0] + sync[1], names.index("unpermute")
    if not start <= end < combine:
        return None
    nodes = []
    for i, k in enumerate(forward):
        node = "attn" if i < start else "post_attn" if i <= end else "mlp" if i < combine else "combine"
        nodes.append("mlp" if k.kind == "cast" else node)
    return nodes


def _backward_nodes(backward: tuple[Kernel, ...], forward: tuple[Kernel, ...], f_nodes: list[str]) -> list[str]:
    """The node of each kernel of the layer's ``backward``: its forward kernel's (the name less .bwd / .dgrad /
    .wgrad, the k-th of a repeated name the k-th); without a twin, the node of the forward's first kernel of its
    family (the name before the first "."; FP8 attention's backward casts, fp8_attn.dout_quantize and
    fp8_attn.dqkv_dequantize, in attn with the forward's fp8_attn casts: TE's FusedAttnFunc.backward runs them); then
    attention's backward in attn, the experts' and the attention's weight gradients in their node's backward_dw (the
    router's stays in post_attn: a plain module's wgrad, not a backward_dw), the rest in mlp."""
    where: dict[str, list[str]] = {}
    family: dict[str, str] = {}
    for k, node in zip(forward, f_nodes, strict=True):
        where.setdefault(k.name, []).append(node)
        if "." in k.name:
            family.setdefault(k.name.split(".", 1)[0], node)
    seen: dict[str, int] = {}
    nodes = []
    for k in backward:
        base = next((k.name[: -len(s)] for s in _BACKWARD_SUFFIXES if k.name.endswith(s)), k.name)
        i = seen[k.name] = seen.get(k.name, -1) + 1
        found = where.get(base, ())
        kin = family.get(k.name.split(".", 1)[0]) if "." in k.name else None
        node = found[min(i, len(found) - 1)] if found else kin or ("attn" if k.kind == "attention" else "mlp")
        wgrad = k.name.endswith(".wgrad") and node in ("attn", "mlp") and k.kind == "gemm"
        nodes.append(node + "_dw" if wgrad else node)
    return nodes


def combined_pair_launches(ctx: Context, lk: LayerKernels) -> tuple[tuple[Kernel, ...], int, int] | None:
    """An MoE layer's backward and the next micro-batch's forward as Megatron's combined 1F1B issues them
    (COMBINED_1F1B_ORDER): (the pair's kernels in host order, the index of the count copy, the launch groups the host
    enqueues between the copy and the wait: the rest of post_attn (the alltoall dispatcher's permute) and, under a
    WAIT_IN_DISPATCH_NODE dispatcher, the other micro-batch's whole mlp backward, issued before the forward's dispatch
    node waits; 0 for a dispatcher that waits at the copy), or None:
    no sync in the layer (host_sync), or its kernels do not split into the nodes. compute.combined_pair runs it
    through the host's queue (planner/host.py synced_period)."""
    sync = host_sync(ctx, lk.forward)
    if sync is None:
        return None
    f_nodes = _forward_nodes(lk.forward, sync)
    if f_nodes is None:
        return None
    b_nodes = _backward_nodes(lk.backward, lk.forward, f_nodes)
    # the host waits in the dispatch node, after b.mlp; a blocking copy after the permute (torchtitan's,
    # Flavour.count_sync_after_permute) waits at the copy itself
    early = ctx.par.ep_dispatch in WAIT_IN_DISPATCH_NODE and not ctx.flavour.count_sync_after_permute
    pair: list[Kernel] = []
    copy = queued = 0
    for side, node in COMBINED_1F1B_ORDER:
        kernels, nodes = (lk.forward, f_nodes) if side == "f" else (lk.backward, b_nodes)
        for i, (k, n) in enumerate(zip(kernels, nodes, strict=True)):
            if n == node:
                if side == "f" and i == sync[0]:
                    copy = len(pair)
                pair.append(k)
        if side == "b" and node == "mlp" and early:
            queued = len(pair) - copy - 1
    return tuple(pair), copy, queued


def cross_entropy_fusion(ctx: Context) -> bool:
    """Whether the loss is one fused kernel: torch.compile fuses it; else the workload's setting, else the
    framework's (Megatron: --cross-entropy-loss-fusion off)."""
    given = ctx.work.cross_entropy_fusion
    if given is not None:
        return given
    return bool(ctx.work.torch_compile) or ctx.par.flavour.fused_cross_entropy


def vocab_parallel_loss(ctx: Context) -> bool:
    """Whether the LM head keeps the logits sharded over TP and the loss runs vocab-parallel (3 fp32 all-reduces):
    the workload's loss_parallel where the flavour has the switch (torchtitan's), else the flavour's."""
    given = ctx.work.loss_parallel
    return ctx.flavour.vocab_parallel_loss if given is None else given


def loss_vocab(ctx: Context) -> int:
    """The vocabulary one rank's loss runs over: its shard of the LM head's output, or, where the logits are
    all-gathered over TP before the loss (vocab_parallel_loss False: DTensor's ColwiseParallel with
    output_layouts Replicate(), torchtitan 9dec370 parallelize_llama.py when loss_parallel is off; the ledger's
    tp.lm_head.logits), the whole vocabulary on every rank. The one home of the loss's width: compute.py's head
    kernels and memory.py's logits (``_logits``, ``mtp_loss_bytes``) read it."""
    t = ctx.par.tp
    if t > 1 and ctx.training and not vocab_parallel_loss(ctx):
        return ctx.model.vocab_size
    return vocab_shard(ctx)


def vocab_shard(ctx: Context) -> int:
    """The rows of the vocabulary one TP rank's embedding and LM head hold: Megatron pads the vocabulary to a
    multiple of 128 x tp (ModelSpec.padded_vocab); torch's modules keep the checkpoint's (Flavour.hf_modules: the
    vocabulary unpadded, as params.py counts it) and DTensor's Shard(0) splits it by torch.chunk, ceil(V / tp) on
    the largest shard (Llama 3's 128,256 over tp 8: 16,032 a rank, not 16,128)."""
    t, m = ctx.par.tp, ctx.model
    if ctx.flavour.hf_modules:
        return -(-m.vocab_size // t)
    return m.padded_vocab(t) // t


def loss_chain(ctx: Context) -> tuple[tuple[float, int], tuple[float, int]] | None:
    """The cross entropy as its separate kernels, ((forward bytes per logit, kernels), (backward ...)), or None for
    one kernel each way (the fused loss; the eager F.cross_entropy of a framework without loss parallelism,
    Fusion.loss). Megatron without --cross-entropy-loss-fusion: UNFUSED_CROSS_ENTROPY; an eager framework's loss
    parallelism over tp > 1 (torch loss_parallel), whether or not torch.compile fused the blocks (torchtitan 9dec370
    compiles each TransformerBlock, its loss stays eager: enter cross_entropy_fusion false):
    LOSS_PARALLEL_CROSS_ENTROPY, for the flavour whose switch is torch's loss_parallel (Flavour.loss_parallel_switch;
    DeepSpeed's eager loss keeps one kernel)."""
    if not ctx.training or (fusion(ctx) is FUSED and cross_entropy_fusion(ctx)):
        return None
    if ctx.flavour.fused_kernels:
        return UNFUSED_CROSS_ENTROPY
    if ctx.par.tp > 1 and ctx.flavour.loss_parallel_switch and vocab_parallel_loss(ctx):
        return LOSS_PARALLEL_CROSS_ENTROPY
    return None


def one_kernel_loss_bytes(ctx: Context) -> float:
    """Bytes per logit of the loss run as one kernel (loss_chain None): the fused loss's when the loss is fused
    (Megatron's fusion, or torch.compile unless cross_entropy_fusion says its loss stayed eager), else the eager
    F.cross_entropy's (EAGER.loss)."""
    return FUSED.loss if fusion(ctx) is FUSED and cross_entropy_fusion(ctx) else EAGER.loss


def grad_accumulation_fusion(ctx: Context) -> bool:
    """Whether weight gradients accumulate inside their GEMM: the workload's setting, else the framework's."""
    given = ctx.work.grad_accumulation_fusion
    return ctx.par.flavour.grad_accumulation_fusion if given is None else given


# Without gradient-accumulation fusion each weight's gradient is added to its accumulation buffer by a kernel of
# its own, every micro-batch: Megatron-LM's DDP backward hook ``param.main_grad.add_(param.grad.data)``
# (megatron/model/distributed.py, _make_param_hook; the fusion into the wgrad GEMM, apex
# fused_weight_gradient_mlp_cuda, came with Megatron-LM's --gradient-accumulation-fusion in 2022). Per element it
# reads the fresh gradient (the parameter dtype) and reads and writes the buffer (the gradient-reduce dtype: fp32
# with --accumulate-allreduce-grads-in-fp32, else the parameter's). PyTorch autograd's AccumulateGrad does the same
# add from the second micro-batch on; this charges every micro-batch (over by 1/m there).


def _grad_accumulation(k: _Layer, moe: bool) -> None:
    """The backward's gradient-accumulation adds over the layer's GEMM weights (routed experts included)."""
    ctx = k.ctx
    weights, tensors = k.weights, k.weight_tensors
    if moe:
        m, par = ctx.model.moe, ctx.par
        local = max(1, m.num_experts // par.ep)
        f = m.expert_ffn_hidden_size / par.etp
        weights += local * ((2 if ctx.model.gated_mlp else 1) * f + f) * ctx.model.hidden_size
        tensors += 2 * local
    nbytes = grad_accumulation_bytes(ctx, weights)
    k.bwd.append(memory_kernel("grad_accumulation", nbytes, k.gpu, k.eff, max(1, tensors), k.floor))


def grad_accumulation_bytes(ctx: Context, weights: float) -> float:
    """HBM bytes of ``main_grad.add_(grad)`` over ``weights`` elements (Megatron's DDP hook,
    distributed/param_and_grad_buffer.py): read the gradient in the weight's dtype, read and write the main_grad
    in the gradient-reduction dtype (fp32 by default, bf16 with grad_reduce_dtype bf16)."""
    return weights * (ctx.param_bytes + 2 * ctx.grad_bytes)


def _fp8_casts(k: _Layer) -> None:
    """The quantizing casts of a low-precision recipe's GEMM operands, one micro-batch: in training TE's casts
    (cast_bytes_per_element), in inference each GEMM input's one rowwise quantize (input_quantize_bytes, the kernel
    the engines run) and the weights, if they are not stored quantized, at the recipe's bytes."""
    ctx, fwd = k.ctx, k.fwd
    # operands: the activations (m x k), and the weights (k x n) unless they are stored quantized (fp8
    # parameters, as inference engines load fp8 checkpoints: nothing to cast per step), arrive quantized (torchao's
    # FSDP2 float8 all-gather, recipes.float8_gathered: fsdp_pre_all_gather casts the 1/(dp x cp) shard before the
    # gather, not counted here, and the backward uses the gathered float8 weight; the routed experts' grouped weights
    # are not Float8Linear weights and are gathered in bf16, rules/data.py _float8_buffer: they are cast as before),
    # or TransformerEngine keeps them quantized between micro-batches (te_weight_cache: cast once a step,
    # step_weight_cast_bytes, in the optimizer step's time)
    stored, gathered, cached = ctx.param_bytes <= 1, float8_gathered(ctx), te_weight_cache(ctx)
    gemms = _cast_gemms(ctx, fwd)
    # a LayerNormLinear's input under TE: the norm's fusion takes part of its quantize (norm_fed_cast_bytes)
    fed = [g for g in gemms if cached and g.name in NORM_FED_LINEARS and g.shape[3] == 1]
    inputs = sum(cast_input_elements(ctx, g) for g in gemms if g not in fed)
    weights = sum(
        g.shape[2] * g.shape[1] * g.shape[3]
        for g in gemms
        if not (stored or cached) and not (gathered and g.name not in EXPERT_GEMMS)
    )
    per_element = cast_bytes_per_element(ctx, k.gpu)
    per_input = per_element if ctx.training else input_quantize_bytes(ctx.work.fp8_recipe)
    nbytes = inputs * per_input + weights * per_element
    nbytes += sum(g.shape[0] * g.shape[2] for g in fed) * norm_fed_cast_bytes(ctx, k.gpu)
    # the backward: under TE, what TE quantizes there (te_backward_cast_elements: each GEMM's output gradient and
    # linear_proj's saved original input); elsewhere (torchao's Float8Linear casts its weight and grad output again)
    # the forward's bytes
    back = te_backward_cast_elements(ctx, gemms) * per_element if cached else nbytes
    # the pass's quantize launches at the measured cast rate (CAST_HBM, whose large-tensor measurement holds one
    # kernel's fixed cost): the dense linears' (dense_quantize_launches) and the experts' per-split quantizes
    # (expert_quantize_launches), each launch beyond the first a memory-bound kernel's fixed cost and, without CUDA
    # graphs, at least one host dispatch
    experts = expert_quantize_launches(ctx, gemms)
    for name, dense, out, pass_bytes in (("fp8_cast", False, fwd, nbytes), ("fp8_cast.bwd", True, k.bwd, back)):
        t = _mem_s(pass_bytes, k.gpu, k.eff)
        count = dense_quantize_launches(ctx, gemms, backward=dense) + experts
        cast = Kernel(name, "cast", t, bytes=pass_bytes, count=count)
        if count > 1:
            cast = _floored(replace(cast, time_s=t + (count - 1) * k.eff.kernel_s), k.floor)
        out.append(cast)
    swizzles = scale_swizzles(ctx, fwd)
    if swizzles:  # the backward's dgrad and wgrad calls: twice the forward's swizzles
        scales, launches = swizzles
        fwd.append(memory_kernel("scale_swizzle", scales, k.gpu, k.eff, launches, k.floor))
        k.bwd.append(memory_kernel("scale_swizzle.bwd", 2 * scales, k.gpu, k.eff, 2 * launches, k.floor))


# Where a DeepEP dispatch of an inference pass carries fp8 (workload.moe_dispatch_dtype), the routed experts' fc1
# input arrives quantized: DeepEP dispatches fp8 only as (e4m3 data, 1x128 block scales) (deep_ep buffer.py
# ``dispatch``: ``x`` a tensor or an (FP8, scales) tuple; vLLM's comment in its DeepEP prepare/finalize: "DeepEP kernels
# only support dispatching block-quantized activation scales"), so the engine quantizes before the exchange, once per
# token on the sending rank, not per routed copy on the receiving one:
# - normal kernels ("deepep"): SGLang ``_DeepEPDispatcherImplNormal.dispatch_a`` ("TODO hard code 128 block
#   quant, use fp8 communication": ``sglang_per_token_group_quant_fp8(hidden_states, 128)`` before
#   ``buffer.dispatch``; its contiguous experts then ep_scatter the fp8 rows and quantize only the down projection's
#   input, ``forward_deepgemm_contiguous``); vLLM ``DeepEPHTPrepareAndFinalize.prepare`` (block-quantized: "Quant and
#   Dispatch", ``moe_kernel_quantize_input`` then ``_do_dispatch``). The cast covers the rank's own tokens;
# - low-latency kernels ("deepep_ll"): the dispatch kernel casts inside itself (``low_latency_dispatch(...,
#   use_fp8=True)``, SGLang ``_DeepEPDispatcherImplLowLatency``), timed in DeepEP's table the LL fit reads: no cast.
# Block-scaled recipes only (DeepEP's fp8 layout); training keeps TE's casts of the permuted copies.
QUANTIZED_BEFORE_DISPATCH = {"deepep": "sender", "deepep_ll": "in_dispatch"}
# A post-quant dispatch (workload.DISPATCH_FORMATS: TensorRT-LLM's NVFP4 rows on DeepEP's normal and low-latency
# kernels) takes rows its sender quantized, on both kernels: communication/deep_ep_low_latency.py at f72b25a65f89
# asserts ``hidden_states.dtype == torch.uint8 and hidden_states_sf is not None`` before low_latency_dispatch_fp4 (no
# cast inside DeepEP's kernel), deep_ep.py at c12e67bb66fe dispatches the (hidden_states, hidden_states_sf) pair; the
# cast holds the rank's own tokens at the format's recipe
POST_QUANT_SENDER = "sender"


def dispatched_tokens(ctx: Context) -> float:
    """Tokens this rank dispatches to the routed experts: the etp group's b·s/cp rows after SP's gather (``T / tp x
    etp``, ``T`` = b·s/cp as _layer_kernels passes it to _moe_mlp); the one home of that count for _moe_mlp and the
    quantize before a DeepEP dispatch (cast_input_elements)."""
    return ctx.b * ctx.s_cp / ctx.par.tp * ctx.par.etp


def cast_input_elements(ctx: Context, g: Kernel) -> float:
    """Elements of GEMM ``g``'s input that the pass's quantize kernel casts (_fp8_casts): its m x k per group, except
    the routed experts' fc1 behind an fp8 DeepEP dispatch of an inference pass (QUANTIZED_BEFORE_DISPATCH): the rank's
    own tokens x k once before the exchange (normal kernels), none outside the dispatch kernel (low-latency)."""
    where = quantized_dispatch(ctx)
    if g.name != EXPERT_GEMMS[0] or where is None:
        return g.shape[0] * g.shape[2] * g.shape[3]
    if where == "in_dispatch":
        return 0.0
    return dispatched_tokens(ctx) * g.shape[2]


def quantized_dispatch(ctx: Context) -> str | None:
    """Where an inference pass's DeepEP dispatch quantizes the routed experts' input (QUANTIZED_BEFORE_DISPATCH:
    "sender" or "in_dispatch"), where it carries fp8 block-scaled rows (workload.moe_dispatch_dtype under a
    BLOCK_DISPATCH_RECIPES recipe); None: the experts quantize what they receive (training, bf16 rows, another
    dispatcher)."""
    dtype, where = ctx.work.moe_dispatch_dtype, QUANTIZED_BEFORE_DISPATCH.get(ctx.par.ep_dispatch)
    if ctx.training or where is None:
        return None
    if dtype in DISPATCH_FORMATS:  # post-quant rows arrive from the sender's own quantize (POST_QUANT_SENDER)
        return POST_QUANT_SENDER
    return where if dtype == "fp8" and (ctx.work.fp8_recipe or "") in BLOCK_DISPATCH_RECIPES else None


def deepep_received_tokens(ctx: Context, rows: float) -> float:
    """Tokens DeepEP delivers to one rank for ``rows`` routed copies over its local experts: each token once, however
    many of its top-k experts the rank holds; under uniform routing a token reaches D distinct EP ranks (rules/
    deepep.py ``destinations``, DeepSeek's node-limited routing included, the count DeepEP's legs move), so a
    received token carries k / D of the rank's copies."""
    from .rules.deepep import destinations

    return rows * destinations(ctx)[1] / ctx.model.moe.top_k


def engine_expert_memory(ctx: Context, rows: float, f: float, x: int) -> tuple:
    """The serving engine's own kernels around its routed experts (planner/engine_kernels.py), as routed_expert_kernels'
    ``engine`` pairs, for ``rows`` routed copies of expert width ``f``: behind an fp8 DeepEP normal dispatch the
    contiguous experts' ep_scatter and ep_gather (EngineKernels.fp8_ep_scatter); on the low-latency layout the
    masked experts' none, and their activation writing fc2's quantized input (EngineKernels.masked_act_quant; fc2's
    cast then none: _quantized_in_epilogue). (): the default kernels."""
    ek, where = ctx.work.engine_kernels, quantized_dispatch(ctx)
    if ek is None or where is None:
        return ()
    h, k = ctx.model.hidden_size, ctx.model.moe.top_k
    if where == "sender" and ek.fp8_ep_scatter and ctx.work.moe_dispatch_dtype == "fp8":  # ep_scatter's fp8 rows
        received = deepep_received_tokens(ctx, rows)
        return (
            ("permute", (ep_scatter_bytes(received, rows, h, f, k), EP_SCATTER_LAUNCHES, BACKWARD_BYTES)),
            ("unpermute", (ep_gather_bytes(received, rows, h, k, x), EP_GATHER_LAUNCHES, BACKWARD_BYTES)),
        )
    if masked_act_quant(ctx):
        act = ("expert_activation", (MASKED_ACT_QUANT_BYTES * rows * f, 1, BACKWARD_BYTES))
        return (("permute", None), ("unpermute", None), act)
    return ()


def masked_act_quant(ctx: Context) -> bool:
    """Whether fc2's input is quantized by the masked experts' activation kernel (engine_expert_memory)."""
    ek = ctx.work.engine_kernels
    gated = ctx.model.gated_mlp
    return bool(ek and ek.masked_act_quant and gated and quantized_dispatch(ctx) == "in_dispatch")


# the fp8 recipes whose activation scales are DeepEP's 1x128 blocks
BLOCK_DISPATCH_RECIPES = ("blockwise",)


def te_weight_cache(ctx: Context) -> bool:
    """Whether TransformerEngine quantizes each linear weight once a step rather than in every micro-batch's
    forward and backward: training under a TE flavour (Flavour.te_fp8_recipes). Megatron-Core passes
    is_first_microbatch to every TE linear (Megatron-LM core_r0.8.0 baf94af3c6
    transformer/custom_layers/transformer_engine.py TELinear.forward: ``is_first_microbatch=_is_first_microbatch``,
    then ``self.is_first_microbatch = False``; pipeline_parallel/schedules.py forward_step
    ``model.set_is_first_microbatch()`` for the first micro-batch of each model chunk), and TE casts the weight with
    its transpose into a cached workspace only then (TransformerEngine v1.8 3ec998e96c module/linear.py l. 997-1002:
    ``update_workspace = is_first_microbatch is None or is_first_microbatch``, ``cache_name="weight"``; v2.9
    70f536662a the same through get_weight_workspace); the backward's dgrad reads the cached transpose
    (v1.8 linear.py l. 463 ``weight_fp8.transpose_2d()``), and a full recompute's re-run forward finds
    is_first_microbatch False. With fp8 primary weights (fp8_param_gather) the weight is fp8 already: the optimizer
    casts it (step_weight_cast_bytes)."""
    return ctx.training and ctx.flavour.te_fp8_recipes


def norm_fed_cast_bytes(ctx: Context, gpu: GPUSpec) -> float:
    """HBM bytes per element a TE training pass spends beyond the norm to quantize a LayerNormLinear's input
    (NORM_FED_LINEARS), where the recipe fuses part of it into the norm (Recipe.norm_fused_read_bytes,
    norm_writes_quantized): the cast's bytes (cast_bytes_per_element) less the read the norm saves; where the norm
    writes the fp8 rowwise data itself, less that write too and plus the transpose's read of it on a TN-only GPU
    (non_tn_fp8: no columnwise copy on Blackwell). Delayed scaling 2 B on Hopper, 0 on Blackwell; current scaling 4
    and 3; the unfused recipes their whole cast. The norm's own output write is left at bf16's 2 B (1 B over under
    delayed scaling)."""
    recipe = ctx.work.recipe or recipe_of("delayed")
    per = cast_bytes_per_element(ctx, gpu) - recipe.norm_fused_read_bytes
    if recipe.norm_writes_quantized:
        per -= recipe.element_bytes * non_tn_fp8(gpu)  # Blackwell: no transpose, nothing left to write
    return per


def te_backward_cast_elements(ctx: Context, gemms: list[Kernel]) -> float:
    """Elements a TE training backward quantizes, one micro-batch (the pass's cast GEMMs ``gemms``): each linear's
    output gradient, m x n per group (TransformerEngine v1.8 module/base.py grad_output_preprocess:
    ``fp8_cast_transpose_fused`` / ``fp8_cast_transpose_bgrad_fused`` of grad_output; v2.9 the same
    ``quantizer(grad_output)`` / ``tex.bgrad_quantize``: the rowwise copy for dgrad and the columnwise one for wgrad,
    the recipe's cast bytes), and linear_proj's saved bf16 input quantized again where the recipe honours
    save_original_input (ORIGINAL_INPUT_LINEARS, as dense_quantize_launches counts it). No weight: TE's backward
    reads the forward's cached quantized weight (te_weight_cache)."""
    recipe = ctx.work.recipe or recipe_of("delayed")
    again = recipe.saves_original_input
    return sum(
        g.shape[0] * g.shape[3] * (g.shape[1] + (again and g.name in ORIGINAL_INPUT_LINEARS) * g.shape[2])
        for g in gemms
    )


# fp8 primary weights (Megatron --fp8-param-gather, TransformerEngine v2.9 70f536662a tensor/utils.py
# cast_master_weights_to_fp8): per element of the rank's master shard, ``master_weight.to(model_weight.dtype)`` (read
# fp32 4, write bf16 2; l. 107, every recipe), then the recipe's cast of the bf16 shard into the fp8 parameter
# (master_cast_bytes)
MASTER_TO_BF16_BYTES = 6


def master_cast_bytes(recipe) -> float:
    """HBM bytes per master-shard element of cast_master_weights_to_fp8 under a per-tensor ``recipe``:
    MASTER_TO_BF16_BYTES, then the recipe's read of the bf16 shard (Recipe.cast_read_bytes) and its fp8 write
    (element_bytes). Current scaling reads it twice, ``tex.compute_amax`` (l. 274) and ``quantizer.update_quantized``
    (l. 332): 6 + 4 + 1 = 11 B; delayed scaling once, its update_quantized writing the amax as it casts
    (_cast_master_weights_to_fp8_delayed_scaling, l. 145-195, no amax pass): 6 + 2 + 1 = 9 B."""
    return MASTER_TO_BF16_BYTES + recipe.cast_read_bytes + recipe.element_bytes


# and per element of the whole weight, once a step, the transpose of the gathered fp8 weight where the GPU's fp8
# GEMMs take TN layouts only (float8_tensor_storage.py _create_transpose ``tex.fp8_transpose``: read 1, write 1, from
# update_usage(columnwise_usage=True) in the first micro-batch; utils.py is_non_tn_fp8_gemm_supported: compute
# capability 10.x and >= 13.0 need none)
FP8_TRANSPOSE_BYTES = 2


def step_weight_cast_bytes(ctx: Context, stage: int, gpu: GPUSpec) -> float:
    """HBM bytes a training step of a TE flavour spends quantizing one rank's linear weights on ``stage``, once a step
    (te_weight_cache): every quantized weight (params.quantized_numels) at the recipe's cast bytes
    (cast_bytes_per_element: read, the rowwise and the columnwise copy, scales); with fp8 primary weights
    (fp8_param_gather, a per-tensor recipe: cast_master_weights_to_fp8) the optimizer's cast of the master shard
    (master_cast_bytes over 1/(dp x cp) of the dense and 1/expert_dp of the expert weights under the distributed
    optimizer) and the transpose of the gathered weight on a TN-only GPU (FP8_TRANSPOSE_BYTES). 0 when nothing is
    quantized or TE does not cache (inference, torchao's Float8Linear: charged in every pass by _fp8_casts)."""
    if not te_weight_cache(ctx) or not quantized_gemm(gemm_dtype(ctx)):
        return 0.0
    from .params import quantized_numels

    numels = sum(quantized_numels(ctx, stage))
    recipe = ctx.work.recipe or recipe_of("delayed")
    if not (ctx.work.fp8_param_gather and not recipe.activation_block and recipe.gemm_dtype == "fp8"):
        return numels * cast_bytes_per_element(ctx, gpu)
    experts = sum(quantized_numels(ctx, stage, experts_only=True))
    par = ctx.par
    dense_shard, expert_shard = (par.dp * par.cp, par.expert_dp) if par.zero_stage >= 1 else (1, 1)
    master = (numels - experts) / dense_shard + experts / expert_shard
    return master * master_cast_bytes(recipe) + (not non_tn_fp8(gpu)) * numels * FP8_TRANSPOSE_BYTES


# The linears TransformerEngine's LayerNormLinear serves under Megatron-Core's TE spec (Recipe.norm_quantize_launches:
# Megatron-LM 92c8482e6d gpt_layer_specs.py column_parallel_layer_norm_linear for linear_qkv, a dense linear_fc1, and
# MLA's linear_q_up_proj / linear_kv_up_proj with qk_layernorm); every other TE linear quantizes its input itself
NORM_FED_LINEARS = ("qkv", "fc1", "q_up", "kv_up")
# Megatron-Core sets save_original_input on linear_proj for a non-delayed fp8 recipe or fp4 (Megatron-LM 92c8482e6d
# transformer/attention.py l. 239-255, TE >= 2.6 / 2.7): its backward quantizes the saved bf16 input again for the
# wgrad (TE v2.9 module/linear.py l. 768-772, ``inputmat_total = ctx.input_quantizer(inputmat_total)``)
ORIGINAL_INPUT_LINEARS = ("attn_out",)


def dense_quantize_launches(ctx: Context, gemms: list[Kernel], backward: bool) -> int:
    """Kernel launches a training pass of a TE flavour makes to quantize its dense (one-weight) linears' operands,
    ``gemms`` being the pass's cast GEMMs (_cast_gemms; grouped ones, shape[3] > 1, are expert_quantize_launches'):
    forward, each linear's input (Recipe.quantize_launches), or its norm's output for a LayerNormLinear
    (NORM_FED_LINEARS: Recipe.norm_quantize_launches); backward, each linear's output gradient (TE v2.9
    module/base.py grad_output_preprocess: ``quantizer(grad_output)``, or tex.bgrad_quantize with a bias, one
    quantize either way) and linear_proj's original input again where the recipe honours save_original_input
    (ORIGINAL_INPUT_LINEARS). The weights' casts are not counted: TE keeps a weight's quantized copy between
    micro-batches (is_first_microbatch). Inference and a framework without TE's recipes: one cast kernel a pass."""
    if not ctx.training or not ctx.flavour.te_fp8_recipes:
        return 1
    recipe = ctx.work.recipe or recipe_of("delayed")
    dense = [g.name for g in gemms if g.shape[3] == 1]
    if backward:
        again = sum(n in ORIGINAL_INPUT_LINEARS for n in dense) if recipe.saves_original_input else 0
        return (len(dense) + again) * recipe.quantize_launches
    return sum(recipe.norm_quantize_launches if n in NORM_FED_LINEARS else recipe.quantize_launches for n in dense)


def scale_swizzles(ctx: Context, fwd: list[Kernel]) -> tuple[float, int] | None:
    """The forward pass's block-scale swizzles where TE swizzles at the GEMM (workload.scale_swizzle "gemm";
    Recipe.gemm_swizzle_launches): (HBM bytes, launches). Each low-precision GEMM call of the pass, a grouped one
    included (one multi-tensor swizzle an operand list), swizzles its two operands' scales: one E8M0 / E4M3 byte a
    block (Recipe.activation_block) of the activation and of the weight, read and written. The backward's dgrad and
    wgrad calls make twice as many. None when nothing swizzles (another recipe, the quantizer's swizzle, inference,
    a framework without TE)."""
    recipe = ctx.work.recipe
    if recipe is None or not recipe.gemm_swizzle_launches or ctx.work.scale_swizzle != "gemm":
        return None
    if not ctx.training or not ctx.flavour.te_fp8_recipes:
        return None
    calls = [g for g in fwd if _cast(g)]
    elements = sum((g.shape[0] + g.shape[1]) * g.shape[2] * g.shape[3] for g in calls)
    scales = 2 * elements / recipe.activation_block * recipe.scale_bytes
    return scales, len(calls) * recipe.gemm_swizzle_launches


def expert_quantize_launches(ctx: Context, gemms: list[Kernel]) -> int:
    """Kernel launches a training pass makes to quantize the inputs of its grouped (per-expert) low-precision GEMMs
    (``gemms``: the pass's GEMMs whose inputs are cast, _cast_gemms):
    TE's GroupedLinear quantizes each expert's split on its own (tex.split_quantize) unless the recipe has the fused
    multi-tensor kernel (Recipe.fused_split_quantize) or the fused grouped MLP quantizes the group at once, each
    split taking the recipe's launches (Recipe.quantize_launches; fp8 without a recipe runs as delayed scaling).
    The layer's other casts stay one kernel per pass (_fp8_casts); the weights' are not counted: TE keeps a weight's
    quantized copy between micro-batches (is_first_microbatch). 0 for inference (its one cast kernel per pass) and for
    a framework without TransformerEngine's recipes (Flavour.te_fp8_recipes: torchao's grouped fp8 is not TE's)."""
    if not ctx.training or not ctx.flavour.te_fp8_recipes:
        return 0
    recipe = ctx.work.recipe or recipe_of("delayed")
    one = recipe.fused_split_quantize or fused_grouped_mlp(ctx)
    splits = sum(1 if one else g.shape[3] for g in gemms if g.shape[3] > 1)
    return splits * recipe.quantize_launches


# TransformerEngine's fused grouped MLP for the routed experts (TE ForwardGroupedMLP_CuTeGEMMSwiGLU_MXFP8 /
# BackwardGroupedMLP_CuTeGEMMDSwiGLU_MXFP8, TE PR 2769; Megatron-Core --use-transformer-engine-op-fuser with
# NVTE_CUTEDSL_FUSED_GROUPED_MLP=1, set by the Megatron-Bridge 26.08 MXFP8 perf recipes at 4ab94dfad, e.g.
# perf_recipes/qwen/gb200/qwen3_moe.py). NVIDIA's description ("Boosting MoE Training Throughput with Advanced Fusion
# Kernels", NVIDIA technical blog, 2026-06-15): fc1 as one grouped GEMM with the GLU activation in its epilogue and
# the MXFP8 quantize of its output fused, fc2 one grouped GEMM, the token counts read on the device (sync-free, so
# the whole iteration can be graphed). In the kernel list: the expert GEMMs as one grouped kernel each, no activation
# kernel, one grouped quantize launch for fc1's input and none for fc2's, no count sync and no fp8 padding. MXFP8 only
# (Recipe.fused_grouped_mlp).
EXPERT_GEMMS = ("experts_fc1", "experts_fc2")


def fused_grouped_mlp(ctx: Context) -> bool:
    """Whether the routed experts run TE's fused grouped MLP (FUSED_GROUPED_MLP): training, workload's switch."""
    return ctx.training and ctx.work.fused_grouped_mlp


# The GEMM classes whose measured rows hold one quantize of the activation besides the GEMM, by (generation, table
# dtype), and the recipe whose quantize it is. aiconfigurator 095f58a51c4c collector/trtllm/collect_gemm.py run_gemm
# builds ``x`` in bf16 and a TensorRT-LLM 1.3.0rc20 Linear with its weight already quantized (_build_weights: fp8 /
# fp8_block weights cast to e4m3 with their scales, nvfp4 by fp4_quantize with swizzled E4M3 scales; the block-fp8
# weight's UE8M0 resmoothing and scale layout in post_load_weights, before timing) and times ``gemm.forward(x)``, so
# each row also quantizes x once, rowwise, and writes a bf16 output (tensorrt_llm/_torch/modules/linear.py
# FP8BlockScalesLinearMethod.apply: on sm100 torch.ops.trtllm.fp8_swap_ab_gemm, whose runner first runs
# fp8_utils.per_token_quant_and_transform(input) and then deep_gemm.fp8_gemm_nt; on Hopper fp8_quantize_1x128 then
# fp8_block_scaling_gemm; NVFP4LinearMethod._input_prepare: fp4_quantize of x with the static input scale the collector
# loads, E4M3 scales per 16, then nvfp4_gemm). The per-tensor fp8 rows hold one too, with its amax (FP8QDQLinearMethod:
# no input scale loaded, so quantize_e4m3_per_tensor's dynamic path, "the collected fp8 GEMM includes the
# compute-scale overhead", the collector's note), but no ceiling is fitted on them (Hopper's fp8 is this project's
# torch._scaled_mm, the GEMM alone; Blackwell's per-tensor fp8 and MXFP8 take block-scaled fp8's: GEMM_CEILING's
# note): not listed. bf16 rows are F.linear / cublas_mm alone. bench/kernel_fit.py reads these rows less the quantize
# (timed_quantize_s, at the planner's own cast price: input_quantize_s), so GEMM_CEILING and the parts' GEMM tables
# mean the GEMM alone and a pass charges every quantize it runs (_fp8_casts): TE's casts in training, the engine's one
# rowwise quantize in inference (bwcast14; replaces serve14's skip of the inference casts, which left training's
# counted twice). Blackwell's DeepGEMM writes its 1x128 scales as packed UE8M0 (1 B each, not the blockwise recipe's
# fp32 4 B: 0.023 B of the 3.03 B an element moves; not told apart).
TIMED_QUANTIZE = {(90, "fp8_block"): "blockwise", (100, "fp8_block"): "blockwise", (100, "nvfp4"): "nvfp4"}
# One rowwise quantize of a bf16 GEMM input, per element: read the bf16 element (2 B, once: the engines quantize at a
# static input scale, TensorRT-LLM's checkpoint ``input_scale``, or a per-block scale taken in the same pass), write
# its quantized copy in one direction with its block scales (Recipe.saved_input_bytes); without a recipe, fp8 1 B.
BF16_READ_BYTES = 2


def input_quantize_bytes(recipe_name: str | None) -> float:
    """HBM bytes per element of one rowwise quantize of a GEMM's bf16 input (BF16_READ_BYTES and the one quantized
    copy): an inference engine's linear, and what a TIMED_QUANTIZE table row holds."""
    recipe = recipe_of(recipe_name)
    return BF16_READ_BYTES + (recipe.saved_input_bytes if recipe is not None else 1.0)


def input_quantize_s(elements: float, recipe_name: str | None, gpu: GPUSpec, eff: Efficiency) -> float:
    """Seconds of one rowwise quantize of ``elements`` bf16 inputs at the measured cast rate (_mem_s, CAST_HBM)."""
    return _mem_s(elements * input_quantize_bytes(recipe_name), gpu, eff)


def timed_quantize_s(gpu: GPUSpec, dtype: str, m: float, k: float, eff: Efficiency) -> float:
    """The quantize of the (m x k) input a measured GEMM row of table class ``dtype`` on ``gpu`` holds besides the
    GEMM (TIMED_QUANTIZE; 0 for the others): bench/kernel_fit.py subtracts it before fitting the ceilings."""
    recipe = TIMED_QUANTIZE.get((generation(gpu), dtype))
    return input_quantize_s(m * k, recipe, gpu, eff) if recipe else 0.0


# The per-tensor fp8 rows (aiconfigurator's "fp8" class, Hopper and Blackwell) time TensorRT-LLM's FP8QDQLinearMethod
# with no input scale loaded: quantize_e4m3_per_tensor's dynamic path, an amax reduction over x (a kernel reading the
# bf16 input, BF16_READ_BYTES) and then the one rowwise quantize at that scale (input_quantize_s, per-tensor 3 B), the
# "compute-scale overhead" the collector's note says the row includes (TIMED_QUANTIZE's note). No ceiling is fitted on
# these rows, so they are not taken out of them: bench/kernel_fit.py table adds this to the model's GEMM instead, so
# that the kernel-class table compares like with like (mend14b)
DYNAMIC_QUANTIZE = {(90, "fp8"): "tensorwise", (100, "fp8"): "tensorwise"}


def dynamic_quantize_s(gpu: GPUSpec, dtype: str, m: float, k: float, eff: Efficiency) -> float:
    """The amax and quantize of the (m x k) bf16 input a per-tensor fp8 table row holds besides the GEMM
    (DYNAMIC_QUANTIZE; 0 for the other classes), at the planner's cast price (_mem_s, input_quantize_s)."""
    recipe = DYNAMIC_QUANTIZE.get((generation(gpu), dtype))
    if recipe is None:
        return 0.0
    return _mem_s(m * k * BF16_READ_BYTES, gpu, eff) + input_quantize_s(m * k, recipe, gpu, eff)


def _quantized_in_epilogue(ctx: Context, g: Kernel) -> bool:
    """fc2's input under the fused grouped MLP (quantized by fc1's epilogue) or behind the serving engine's masked
    activation (masked_act_quant: quantized by the activation kernel): no cast kernel of its own."""
    return g.name == EXPERT_GEMMS[1] and (fused_grouped_mlp(ctx) or masked_act_quant(ctx))


# Megatron-Core's TEGroupedMLP under fp8 pads each expert's rows to the fp8 GEMMs' alignment before linear_fc1 and
# unpads linear_fc2's output (Megatron-LM core_v0.15.0 megatron/core/transformer/moe/experts.py: Fp8Padding /
# Fp8Unpadding of the hidden states and of the permuted probs); TransformerEngine v2.9 module/fp8_padding.py aligns
# to 16 rows (32 under MXFP8) with one tex.fused_multi_row_padding (a copy into the padded buffer) and returns the
# input untouched only when every expert's count is already aligned, which dropless routing's multinomial counts
# almost never are. With a capacity factor every expert runs its capacity: not counted.
FP8_EXPERT_PADDING = "Megatron-LM core_v0.15.0 moe/experts.py TEGroupedMLP; TransformerEngine v2.9 fp8_padding.py"


def fp8_expert_padding(ctx: Context, dtype: str) -> bool:
    """Whether the routed experts' rows are padded for their low-precision GEMMs (FP8_EXPERT_PADDING): a training
    flavour that pads (Flavour.fp8_expert_padding), a quantized expert GEMM dtype, dropless routing."""
    padded = ctx.training and ctx.flavour.fp8_expert_padding and quantized_gemm(dtype)
    return padded and not ctx.model.moe.capacity_factor


# Megatron-Core's alltoall dispatcher receives each expert's rows grouped by source rank, (source rank, local
# expert) chunks; with more than one local expert it re-orders them by expert after the dispatch and back before
# the combine (token_dispatcher.py MoEAlltoAllTokenDispatcher dispatch_postprocess / combine_preprocess ->
# moe_utils.sort_chunks_by_idxs: torch.split + torch.cat of the tokens and their probs, or TE's
# fused_sort_chunks_by_index under --moe-permute-fusion: the same copy in one kernel); their backward is the
# reverse copy. The flex (DeepEP, HybridEP) and allgather dispatchers permute once on the receiving side.
CHUNK_SORT_DISPATCH = ("alltoall",)


def chunk_sort(ctx: Context, local: int) -> bool:
    """Whether the dispatcher re-orders the received rows by local expert (CHUNK_SORT_DISPATCH)."""
    return ctx.training and ctx.par.ep > 1 and local > 1 and ctx.par.ep_dispatch in CHUNK_SORT_DISPATCH


def dispatch_preprocess(ctx: Context) -> int:
    """Launches of the alltoall dispatcher's preprocess in one MoE layer forward (Flavour.dispatch_preprocess_launches:
    the per-expert counts summed from the routing map, the splits derived from the gathered counts, their copies to
    the host before the count sync); 0 outside training, another dispatcher or a flavour that lists none. Its bytes:
    the T x E bool routing map read once, the counts beside it."""
    launches = ctx.flavour.dispatch_preprocess_launches
    if not launches or not ctx.training or ctx.par.ep_dispatch not in CHUNK_SORT_DISPATCH:
        return 0
    many, one, padded = launches
    if ctx.model.moe.capacity_factor:
        return padded
    return many if ctx.par.ep * ctx.par.etp > 1 else one


def routed_expert_kernels(
    tokens: float,
    rows: float,
    local: int,
    h: int,
    f: float,
    gated: bool,
    dtype: str,
    x: int,
    fu: Fusion,
    gpu: GPUSpec,
    eff: Efficiency = EFFICIENCY,
    floor: float = 0.0,
    streams: int = 0,
    sort: bool = False,
    spread: float = 0.0,
    k0: float = 0.0,
    score_combine: tuple[float, int, float, int] = (),
    fp8_pad: bool = False,
    fused_activation: bool = False,
    glu_clamp: bool = False,
    expert_bias: tuple[float, int, float, int] = (),
    weighted_act: bool = False,
    engine: tuple = (),
) -> tuple[list[Kernel], list[Kernel]]:
    """(forward, backward) kernels of the routed experts on one rank: ``tokens`` dispatched, ``rows`` per local
    expert, ``local`` experts of width ``f``. Permute: argsort of the routing map, then a gather of the rows into
    expert order (Megatron-Core moe_utils.permute: read the tokens, write R rows, the indices); the experts as two
    grouped GEMMs around the activation (``streams``: per-expert launches, gemm_kernels); unpermute: read R rows
    and the probs, scatter-add into the tokens. ``sort``: the received rows are re-ordered from (source rank,
    expert) to (expert, source rank) after the dispatch and back before the combine (chunk_sort). ``spread``: the
    standard deviation of an expert's rows about ``rows`` (group_rows; 0: every expert at the mean); ``k0``: the
    grouped kernel's main-loop amortisation length (GROUPED_GEMM_K0 for torch._grouped_mm; 0: cuBLAS's).
    ``score_combine``: the combine's score multiply as its own kernels (Flavour.moe_score_combine: bytes and launches
    per element of the R x h rows, forward and backward) after a zeros_like of the tokens' output; (): none.
    ``fp8_pad``: the experts' rows padded to the fp8 GEMMs' alignment before fc1 and unpadded after fc2
    (Flavour.fp8_expert_padding: FP8_EXPERT_PADDING's copies). ``fused_activation``: the activation runs in fc1's
    epilogue and its gradient in the backward grouped kernel (FUSED_GROUPED_MLP): no kernel of its own.
    ``glu_clamp``: the GLU clamp's own kernels before the activation (GLU_CLAMP, per element of the R x f output);
    ``expert_bias``: the fc2 bias added per expert after the second GEMM (expert_bias_loop); (): none.
    ``weighted_act``: the activation multiplies by the probs and its backward sums their gradient in a kernel of its
    own (WEIGHTED_ACT_GRAD). ``engine``: the serving engine's own kernels in place of some of these
    (engine_expert_memory: (name, entry or None to drop it) pairs)."""
    R = rows * local
    fwd: list[Kernel] = []
    bwd: list[Kernel] = []
    gemms = {"experts_fc1": ((2 if gated else 1) * f, h), "experts_fc2": (h, f)}
    act = fu.gated_act if gated else fu.act
    memory, counts, strided = _routed_memory(
        tokens, R, h, f, x, act, fused_activation, fp8_pad, score_combine, weighted_act, expert_bias
    )
    _replaced(memory, engine)
    for name in _routed_order(sort, glu_clamp, bool(expert_bias), bool(score_combine)):
        if name in gemms:
            kf, kd, kw = gemm_kernels(
                name, rows, *gemms[name], dtype, gpu, eff, groups=local, streams=streams, spread=spread, k0=k0
            )
            fwd.append(_floored(kf, floor))
            bwd.extend((_floored(kd, floor), _floored(kw, floor)))
        elif name in memory:
            k, kb = _routed_memory_pair(name, memory[name], counts, strided, R * h, fu, gpu, eff, floor)
            fwd.append(k)
            bwd.append(kb)
    return fwd, bwd


def _routed_memory(
    tokens: float,
    R: float,
    h: int,
    f: float,
    x: int,
    act: tuple[float, int],
    fused_activation: bool,
    fp8_pad: bool,
    score_combine: tuple[float, int, float, int],
    weighted_act: bool,
    expert_bias: tuple[float, int, float, int],
) -> tuple[dict, dict, dict]:
    """routed_expert_kernels' memory-bound kernels over ``R`` routed rows: (memory: name -> (forward bytes, kernels,
    backward bytes / forward bytes); counts: name -> (forward kernels, backward kernels) where the backward launches
    another count; strided: name -> (forward, backward) strided bytes)."""
    act_b, act_n = act
    memory = {
        "permute": (x * h * (tokens + R) + 16 * R, 3, BACKWARD_BYTES),
        # torch.cat of the chunks: read and write every received row and its fp32 prob; the backward is the reverse
        # copy of the gradient (the prob's gradient goes its own way: not counted)
        "sort_chunks": (2 * (x * h + 4) * R, 1, x * h / (x * h + 4)),
        "expert_activation": (act_b * R * f, act_n, BACKWARD_BYTES),
        "unsort_chunks": (2 * x * h * R, 1, 1.0),
        "unpermute": (x * h * (R + tokens) + 4 * R, 2, BACKWARD_BYTES),
    }
    if fused_activation:
        del memory["expert_activation"]
    if fp8_pad:
        # TE fused_multi_row_padding of the rows (read R·h, write R·h) and of their fp32 probs; the unpadding copy of
        # fc2's output; each backward the reverse copy (FP8_EXPERT_PADDING)
        memory["fp8_padding"] = (2 * x * h * R + 8 * R, 2, 1.0)
        memory["fp8_unpadding"] = (2 * x * h * R, 1, 1.0)
    counts = {}
    if score_combine:
        fb, fn, bb, bn = score_combine
        forward = fb * R * h + x * h * tokens  # the score multiply's rows and the zeros_like of the tokens' output
        # the backward reads bb·R·h: 0 on a rank with no rows (and then maybe no tokens: no 0/0)
        memory["combine_scores"] = (forward, fn + 1, bb * R * h / forward if R else 0.0)
        counts["combine_scores"] = (fn + 1, bn)
    if weighted_act and "expert_activation" in memory:
        wb, wn = WEIGHTED_ACT_GRAD
        memory["expert_activation"] = (act_b * R * f, act_n, (BACKWARD_BYTES * act_b + wb) / act_b)
        counts["expert_activation"] = (act_n, act_n + wn)
    (clamp_f, clamp_n), (clamp_b, clamp_bn) = GLU_CLAMP
    memory["expert_act_clamp"] = (clamp_f * R * f, clamp_n, clamp_b / clamp_f)
    counts["expert_act_clamp"] = (clamp_n, clamp_bn)
    strided = {"expert_act_clamp": tuple(b * R * f for b in GLU_CLAMP_STRIDED)}
    if expert_bias:
        fb, fn, bb, bn = expert_bias
        memory["expert_bias"] = (fb * R * h, fn, bb / fb)
        counts["expert_bias"] = (fn, bn)
    return memory, counts, strided


def _replaced(memory: dict, engine: tuple) -> None:
    """``memory`` (routed_expert_kernels' memory-bound kernels) with the engine's entries in place: each (name, entry)
    sets one, (name, None) drops it."""
    for name, entry in engine:
        memory.pop(name, None)
        if entry is not None:
            memory[name] = entry


def _routed_order(sort: bool, glu_clamp: bool, expert_bias: bool, score_combine: bool) -> list[str]:
    """routed_expert_kernels' kernels in Megatron's order (experts.py TEGroupedMLP.forward): pad, fc1, the activation
    (the clamp first), fc2, unpad, the per-expert bias; the chunk sorts only with ``sort``."""
    order = ["permute", "sort_chunks", "fp8_padding", "experts_fc1"] + (["expert_act_clamp"] if glu_clamp else [])
    order += ["expert_activation", "experts_fc2", "fp8_unpadding"] + (["expert_bias"] if expert_bias else [])
    order += ["unsort_chunks"]
    order += ["combine_scores", "unpermute"] if score_combine else ["unpermute"]
    return order if sort else [n for n in order if "sort_chunks" not in n]


def _routed_memory_pair(
    name: str,
    entry: tuple[float, int, float],
    counts: dict,
    strided: dict,
    elements: float,
    fu: Fusion,
    gpu: GPUSpec,
    eff: Efficiency,
    floor: float,
) -> tuple[Kernel, Kernel]:
    """(forward, backward) of one of routed_expert_kernels' memory-bound kernels (_routed_memory's ``entry``);
    ``elements``: the R·h routed elements (the atomic combine's adds)."""
    nbytes, count, back = entry
    k = memory_kernel(name, nbytes, gpu, eff, count, floor)
    if name == "unpermute" and fu.atomic_combine:  # the R·h bf16 adds at the atomic rate
        atomic = 2 * elements / (gpu.hbm_GBps * 1e9 * SCATTER_ADD_HBM) + count * eff.kernel_s
        k = replace(k, time_s=max(k.time_s, atomic), gpu_s=None if k.gpu_s is None else max(k.gpu_s, atomic))
    back_count = counts[name][1] if name in counts else count
    kb = memory_kernel(name + ".bwd", nbytes * back, gpu, eff, back_count, floor)
    if name in strided:
        k, kb = (_strided(kk, b, gpu, eff, floor) for kk, b in zip((k, kb), strided[name], strict=True))
    return k, kb


def _strided(k: Kernel, strided_bytes: float, gpu: GPUSpec, eff: Efficiency, floor: float) -> Kernel:
    """``k`` with ``strided_bytes`` of its bytes moved at the lower of the copy rate and TensorIterator's
    unvectorized rate (STRIDED_BYTES_PER_SM_CYCLE x SMs x SM clock); as it is where the GPU's SMs are unknown."""
    copy = gpu.hbm_GBps * 1e9 * eff.hbm
    issue = STRIDED_BYTES_PER_SM_CYCLE * gpu.sms * SM_CLOCK_MHZ.get(generation(gpu), SM_CLOCK_MHZ[90]) * 1e6
    if not gpu.sms or issue >= copy:
        return k
    extra = strided_bytes * (1 / issue - 1 / copy)
    # the GPU's own time grows, then the host floor applies to it (not floor + extra on a floored kernel)
    return _floored(replace(k, time_s=gpu_seconds(k) + extra, gpu_s=None), floor)


def quantized_gemm(dtype: str) -> bool:
    """Whether a GEMM of ``dtype`` computes in a low precision (its math dtype, math_dtype: a weight-only format's
    GEMM takes its bf16 activations as they are, with no quantizing cast)."""
    return math_dtype(dtype) not in ("bf16", "fp32")


def _cast(k: Kernel) -> bool:
    return k.kind == "gemm" and quantized_gemm(k.dtype)


def _cast_gemms(ctx: Context, fwd: list[Kernel]) -> list[Kernel]:
    """The pass's GEMMs whose inputs a separate kernel quantizes (not those whose producer quantizes its output in
    its epilogue: _quantized_in_epilogue): _fp8_casts' bytes and expert_quantize_launches' splits."""
    return [g for g in fwd if _cast(g) and not _quantized_in_epilogue(ctx, g)]


# A cast to fp8 streams below a copy's rate: tensor.to(float8_e4m3fn) of 67 and 134 MB on this project's H200 moves
# its bytes (read 2, write 1 per element) at 0.614-0.657 of the HBM datasheet bandwidth (runs 1 and 2
# ``memory_bound`` fp8_cast.h4096, .h8192; median 0.636), against copies' 0.877 (bench/h200_tables.py).
CAST_HBM = 0.636


def _mem_s(nbytes: float, gpu: GPUSpec, eff: Efficiency) -> float:
    """Seconds of a quantizing cast's bytes (CAST_HBM); a trace's fitted hbm scales it alike."""
    return nbytes / (gpu.hbm_GBps * 1e9 * CAST_HBM * eff.hbm / EFFICIENCY.hbm)


cast_s = _mem_s  # the same, for compute.optimizer_s's once-a-step weight casts


def _floored(k: Kernel, floor: float) -> Kernel:
    if k.time_s >= floor * k.count:
        return k
    return Kernel(k.name, k.kind, floor * k.count, k.flops, k.bytes, k.shape, k.dtype, k.count, gpu_seconds(k))


# ---- attention ------------------------------------------------------------------------------------------


def kv_length(ctx: Context) -> int:
    """Keys each query attends to: the sequence (training, prefill) or the cache (decode)."""
    if not ctx.training and ctx.work.phase == "decode":
        return ctx.work.context_length or ctx.model.seq_length
    return ctx.s


def causal_keys(s: int, window: int | None) -> float:
    """Mean keys a query attends to under the causal mask, over s queries: (s + 1)/2, or with a window w < s,
    (sum_{i<w} (i + 1) + (s - w)·w) / s."""
    if not window or window >= s:
        return (s + 1) / 2
    return (window * (window + 1) / 2 + (s - window) * window) / s


@lru_cache(maxsize=256)  # a request may pack 65,536 documents; asked per layer and pass (bounded, keyed by value)
def document_keys(histogram: tuple[tuple[int, int], ...], window: int | None) -> float:
    """Mean keys a query attends to when the sequence packs documents of ``histogram``'s lengths, (length, count)
    pairs (WorkloadSpec.document_histogram: workload.document_lengths counted once, so the cache key hashes the
    distinct lengths, not every document), each causal within itself: sum_i L_i · causal_keys(L_i, w) / sum_i L_i.
    The kernels skip the blocks outside a document (FlashAttention's varlen path over cu_seqlens; TE's THD format),
    so their work is sum_i L_i(L_i + 1)/2 query-key pairs, the per-document form of the sum(L_i²) Megatron-LM d98e8a6
    training.py num_floating_point_operations counts for packed (THD) batches (seqlen_squared_sum_in_batch). Under
    context parallelism TE splits each document into 2·cp chunks, rank r holding chunks r and 2cp-1-r of each
    (context_parallel.py get_cu_seqlens_on_cp_rank: each document's two halves; thd_get_partitioned_indices), so
    every rank averages the same."""
    return sum(n * c * causal_keys(n, window) for n, c in histogram) / sum(n * c for n, c in histogram)


def square_keys(n: int, window: int | None) -> float:
    """Keys per query PaLM's whole square counts for an n-token (causal) sequence: n, which is 2·causal_keys(n) - 1
    (twice the mask's nonzero pairs, less the diagonal). Within a sliding window w < n the same count of the band,
    2·causal_keys(n, w) - 1 = 2w - w(w - 1)/n - 1 (equal to n at w = n): the band's nonzero pairs w(w+1)/2 +
    (n - w)·w are what NVIDIA NeMo's flops_formulas.py (gpt_oss_flops_calculator, attention_mask_nz_elem, 2025)
    counts for a sliding layer. Counting a sliding layer's whole square instead made the MFU of a window far
    below the sequence exceed 1 (hostile10: Llama-3 8B with sliding_window 4096 at 131,072 tokens, 1.70)."""
    return float(n) if not window or window >= n else 2 * causal_keys(n, window) - 1


def flops_keys(ctx: Context) -> float:
    """Keys per query the model FLOPs (MFU) count, the mean over the model's layers: kv_length, the whole square
    (PaLM Appendix B), or with packed documents sum(L_i²)/s, as Megatron-LM d98e8a6 training.py
    num_floating_point_operations replaces batch · s² by seqlen_squared_sum_in_batch = sum_i L_i² for THD batches.
    A sliding layer (ModelSpec.attention_window) counts its band (square_keys); a decode query the keys it attends
    (ModelSpec.attended_keys)."""
    mdl, s_kv = ctx.model, kv_length(ctx)
    counted = ctx.work.document_histogram if ctx.training else None
    if not mdl.sliding_window:
        if counted:
            return sum(n * n * c for n, c in counted) / sum(n * c for n, c in counted)
        return s_kv
    windows = Counter(mdl.attention_window(i) for i in range(mdl.num_layers))

    def keys(window: int | None) -> float:
        if counted:
            return sum(n * c * square_keys(n, window) for n, c in counted) / sum(n * c for n, c in counted)
        if s_kv != ctx.s:  # a decode query: the cache up to it, within the window
            return float(s_kv if window is None else min(s_kv, window))
        return square_keys(s_kv, window)

    return sum(k * keys(window) for window, k in windows.items()) / mdl.num_layers


def layer_keys(ctx: Context) -> tuple[float, ...]:
    """Mean keys per query of each layer: its window is the model's (ModelSpec.attention_window); a decode query
    (kv_length != s: one token or several, as speculative decoding's) sees the cache up to it
    (ModelSpec.attended_keys), a causal pass causal_keys. The one per-layer weighting attended_keys and
    layer_mix_keys share."""
    mdl, s_kv = ctx.model, kv_length(ctx)
    if s_kv != ctx.s:
        return tuple(float(mdl.attended_keys(i, s_kv)) for i in range(mdl.num_layers))
    return tuple(cp_rank_causal_keys(ctx, mdl.attention_window(i)) for i in range(mdl.num_layers))


def attended_keys(ctx: Context) -> float:
    """Mean keys per query over the model's layers (the layer mix, not per layer: one kernel model): the mean
    of layer_keys."""
    mdl, s_kv = ctx.model, kv_length(ctx)
    if not mdl.sliding_window:  # every layer alike: layer_keys' value without the walk
        return s_kv if s_kv != ctx.s else cp_rank_causal_keys(ctx)
    return sum(layer_keys(ctx)) / mdl.num_layers


def cp_rank_causal_keys(ctx: Context, window: int | None = None) -> float:
    """Mean keys per query of causal attention (within ``window`` keys, if any) on the busiest context-parallel rank:
    causal_keys when the sequence is sharded balanced (TE's 2 x cp chunks; torch context_parallel's default head-tail
    load balancing). Without it (parallel.cp_load_balance false: torch's _cp_options.enable_load_balance;
    _context_parallel/_attention.py _is_causal_behavior SKIPs the blocks after the rank's own) rank cp-1 holds the
    last n = s/cp queries, query j (1-based, j = a+1 .. s, a = s - n) over min(j, w) keys: without a window
    s - s/(2 cp) + 1/2 on average ((2 cp - 1) / cp of the balanced work), w when w <= a + 1, else
    (w(w+1)/2 - a(a+1)/2 + (s - w)·w) / n."""
    s, c = ctx.s, ctx.par.cp
    if ctx.training and ctx.work.document_lengths:  # packed documents (parallel._documents_fit: TE's per-document CP)
        return document_keys(ctx.work.document_histogram, window)
    if c > 1 and ctx.par.cp_load_balance is False:
        n = s / c
        a = s - n
        if not window or window >= s:
            return a + (n + 1) / 2
        if window <= a + 1:
            return float(window)
        return (window * (window + 1) / 2 - a * (a + 1) / 2 + (s - window) * window) / n
    return causal_keys(s, window)


def attention_flops(ctx: Context) -> float:
    """Core attention forward on one rank: QKᵀ and PV over the attended keys (flash skips masked blocks)."""
    qk, v = attention_head_dims(ctx)
    return core_attention_flops(ctx.b, ctx.s_cp, attended_keys(ctx), ctx.model.num_attention_heads / ctx.par.tp, qk, v)


def attention_head_dims(ctx: Context) -> tuple[int, int]:
    """(query/key, value) head dims of core attention: MLA's qk_nope + qk_rope and v_head_dim (DeepSeek-V3 192,
    128), else the model's head size for both."""
    mla = ctx.model.mla
    if mla:
        return mla.qk_nope_head_dim + mla.qk_rope_head_dim, mla.v_head_dim
    return ctx.model.head_size, ctx.model.head_size


def core_attention_flops(b: float, queries: float, keys: float, heads: float, qk: int, v: int) -> float:
    """Forward FLOPs of core attention: QKᵀ (2·qk) and PV (2·v) per query, key and head over ``keys`` mean
    attended keys per query (the one home of the count: attention_flops, trace_fit.attention_points)."""
    return 2.0 * b * queries * keys * heads * (qk + v)


def attention_ceiling(
    kernel: str,
    gpu: GPUSpec,
    eff: Efficiency,
    fp8: tuple[bool, bool] = (False, False),
    speedups: Mapping = ATTENTION_FP8_SPEEDUP,
) -> tuple[float, float]:
    """(forward, backward) ceiling of ``kernel`` as a fraction of the dense bf16 peak: ATTENTION_CEILING or what a
    trace fitted, times the FP8 kernel's speedup (``speedups``: TE's ATTENTION_FP8_SPEEDUP, or a serving engine's
    context_fmha_fp8_speedup) on the passes ``fp8`` runs in FP8."""
    fwd, bwd = ATTENTION_CEILING.get((kernel, generation(gpu)), (eff.attention_fwd, eff.attention_bwd))
    if eff.attention_ceilings:  # what a trace fitted for this GPU (planner/trace_fit.py)
        fitted = dict(eff.attention_ceilings)
        fwd, bwd = fitted.get(f"{kernel}_fwd", fwd), fitted.get(f"{kernel}_bwd", bwd)
    up_f, up_b = speedups.get((kernel, generation(gpu)), (1.0, 1.0))
    return fwd * (up_f if fp8[0] else 1.0), bwd * (up_b if fp8[1] else 1.0)


def attention_kernels(
    ctx: Context, gpu: GPUSpec, eff: Efficiency, floor: float
) -> tuple[tuple[Kernel, ...], tuple[Kernel, ...]]:
    """Core attention of one layer on one rank: (forward kernels, backward kernels). Context parallelism with
    the ring (p2p) runs cp block kernels per pass over s/cp keys each and merges their partial outputs
    (Megatron-Core / TE context_parallel: a correction kernel per step); all-gather CP runs one kernel."""
    if ctx.s == 1:  # decode reads the layer's KV cache once (memory-bound)
        nbytes = kv_cache_bytes_per_layer(ctx)
        return (memory_kernel("decode_attention", nbytes, gpu, eff, 1, floor),), ()
    kernel = attention_kernel(ctx, gpu)
    if kernel == "unfused":
        fwd, bwd = unfused_attention(ctx, gpu, eff)
        if ctx.model.attention_sinks:
            sink_f, sink_b = unfused_sink_kernels(ctx, gpu, eff)
            fwd, bwd = (*fwd, *sink_f), (*bwd, *sink_b)
        return fwd, bwd
    flops = attention_flops(ctx)
    heads = ctx.model.num_attention_heads / ctx.par.tp
    qk, v = attention_head_dims(ctx)
    steps = ctx.par.cp if ctx.par.cp > 1 and ctx.par.cp_comm == "p2p" else 1
    s_kv = kv_length(ctx) / steps
    if ctx.model.sliding_window:
        s_kv = layer_mix_keys(ctx, s_kv, eff.attention_s0)
    shape = (ctx.b * heads, ctx.s_cp, kv_length(ctx), qk)
    # head_dim_rate's d: per score one exponential against 2·qk + 2·v matmul FLOPs (QKᵀ and PV; its 4·d at
    # qk = v = d), so the exponential is amortised over their mean (qk + v) / 2 (MLA: 160, at the d-128 rate)
    fp8 = fp8_attention(ctx)
    engine = engine_fp8_attention(ctx)
    up = context_fmha_fp8_speedup(kernel, gpu, s_kv) if engine else 0.0
    speedups = {(kernel, generation(gpu)): (up, 1.0)} if engine else ATTENTION_FP8_SPEEDUP
    f_t, b_t = flash_attention_s(
        flops, s_kv, kernel, gpu, eff, steps, (qk + v) / 2, fp8 or (False, False), speedups
    )  # fmt: skip
    drop_f, drop_b = fused_dropout_s(ctx, kernel, flops / (2.0 * (qk + v)), gpu, fp8 is not None)
    f_t, b_t = f_t + drop_f, b_t + drop_b
    dt_f, dt_b = ("fp8" if p else "bf16" for p in (fp8 or (False, False)))
    fwd = [_floored(Kernel(f"{kernel}_fwd", "attention", f_t, flops, shape=shape, dtype=dt_f, count=steps), floor)]
    bwd = [
        _floored(
            Kernel(
                f"{kernel}_bwd", "attention", b_t, FLASH_BWD * flops, shape=shape, dtype=dt_b,
                count=steps * FLASH_BWD_KERNELS,
            ),
            floor,
        )
    ]  # fmt: skip
    if fp8 and not engine:  # TE's casts around its FP8 attention; the engine's FMHA quantizes in its preprocessing
        cast_f, cast_b = fp8_attention_casts(ctx, gpu, eff, fp8[1], floor)
        fwd = [*cast_f, *fwd]
        bwd = [*cast_b, *bwd]
    if steps > 1 and ctx.flavour.cp_rotate_methods:  # torch's context_parallel: its own merge, in torch ops
        merge_fwd, merge_bwd = torch_cp_merge_kernels(ctx, steps, gpu, eff, floor)
        fwd += merge_fwd
        bwd += merge_bwd
    elif steps > 1:  # the ring's output correction: read the partial output and lse, rescale, accumulate
        out = ctx.b * ctx.s_cp * heads * v * 4  # fp32 accumulator of the output (v wide)
        fwd.append(memory_kernel("cp_merge", 3 * out * (steps - 1), gpu, eff, steps - 1, floor))
        bwd.append(memory_kernel("cp_merge.bwd", 3 * out * (steps - 1), gpu, eff, steps - 1, floor))
    return tuple(fwd), tuple(bwd)


def fp8_attention_casts(
    ctx: Context, gpu: GPUSpec, eff: Efficiency, backward_fp8: bool, floor: float = 0.0
) -> tuple[tuple[Kernel, ...], tuple[Kernel, ...]]:
    """The memory-bound casts around TE's FP8 attention on one rank, one layer, one micro-batch (FP8_DPA_CAT_BYTES,
    FP8_DPA_DEQUANTIZE_BYTES): forward, Q, K, V concatenated (not under MXFP8) and quantized, and the output
    dequantized where the kernel writes it as fp8 (Recipe.dpa_fp8_output: delayed scaling; current scaling and MXFP8
    write bf16); backward in FP8, the output gradient quantized and dQ, dK, dV dequantized where the kernel writes
    them as fp8 (the same trait; docwait10: before, every recipe paid that launch); none in a bf16 backward. A
    quantize reads the bf16 element (twice under current scaling: Recipe.cast_read_bytes) and writes one copy
    with its block scales (Recipe.saved_input_bytes)."""
    recipe = ctx.work.recipe
    qk, v = attention_head_dims(ctx)
    tokens, t = ctx.b * ctx.s_cp, ctx.par.tp
    heads, kv_heads = ctx.model.num_attention_heads / t, ctx.model.kv_heads_per_rank(t)
    qkv = tokens * (heads * qk + kv_heads * (qk + v))
    out = tokens * heads * v
    read = recipe.cast_read_bytes + recipe.saved_input_bytes  # one copy (rowwise; V columnwise under MXFP8)
    launches = recipe.quantize_launches
    # MXFP8 quantizes Q, K and V each on its own (no cat: FP8_DPA_QKV_TENSORS), the others the concatenated one
    qkv_launches = launches * (FP8_DPA_QKV_TENSORS if recipe.activation_block else 1)
    cat_bytes = FP8_DPA_CAT_BYTES * qkv
    cat = [] if recipe.activation_block else [memory_kernel("fp8_attn.qkv_cat", cat_bytes, gpu, eff, 1, floor)]
    fp8_out = recipe.dpa_fp8_output  # the kernel writes O (and dQ, dK, dV) as fp8: TE dequantizes them
    out_cast = (memory_kernel("fp8_attn.out_dequantize", FP8_DPA_DEQUANTIZE_BYTES * out, gpu, eff, 1, floor),)
    fwd = (
        *cat,
        memory_kernel("fp8_attn.qkv_quantize", read * qkv, gpu, eff, qkv_launches, floor),
        *(out_cast if fp8_out else ()),
    )
    if not backward_fp8:
        return fwd, ()
    grads = (memory_kernel("fp8_attn.dqkv_dequantize", FP8_DPA_DEQUANTIZE_BYTES * qkv, gpu, eff, 1, floor),)
    bwd = (
        memory_kernel("fp8_attn.dout_quantize", read * out, gpu, eff, launches, floor),
        *(grads if fp8_out else ()),
    )
    return fwd, bwd


# torch's ring attention merges and accumulates in torch ops (torch/distributed/tensor/experimental/_attention.py,
# pytorch 38410cf9 / 010ae4a8: _templated_ring_attention with _SDPAMerger, _templated_ring_attention_backward;
# _ContextParallelOptions.convert_to_f32 True). Bytes per element, (bytes, launches), of: O the output (b·heads·s/cp·v),
# R its rows (the logsumexp, b·heads·s/cp), Q the query, KV the key and value together.
# Forward, every step: _SDPAMerger.step's out.to(float32) (2 read, 4 written); the lse is fp32 already (no kernel)
TORCH_CP_CAST_O = (6.0, 1)
# forward, every merge (steps after the first): out - block_out 12, sigmoid(...) * that 8, out - that 12 (O); and over
# the rows block_lse - lse 12, sigmoid 8, the product's read 4, lse - block_lse 12, logsigmoid 8, lse - that 12 (R)
TORCH_CP_MERGE_O = (32.0, 3)
TORCH_CP_MERGE_R = (56.0, 5)
# both passes, every step but the last: next_kv = torch.cat([key.flatten(), value.flatten()]) in bf16 (2 + 2)
TORCH_CP_KV_CAT = (4.0, 1)
# forward, once: results()'s out.to(bf16) (4 + 2)
TORCH_CP_OUT_CAST = (6.0, 1)
# backward, once: zeros_like of the fp32 dq, dk, dv accumulators (4 written)
TORCH_CP_ZEROS = (4.0, 3)
# backward, every step: grad_query += grad_query_ (fp32 += bf16: 4 + 2 read, 4 written) on Q; grad_key += and
# grad_value += (10) and next_grad_kv = torch.cat of the fp32 dk, dv for the dKV rotation (4 + 4) on KV
TORCH_CP_DQ_ADD = (10.0, 1)
TORCH_CP_DKV_ADD = (18.0, 3)
# backward, once: grad_query.to(bf16) on Q, the last received dkv .to(bf16) on KV (4 + 2 each)
TORCH_CP_GRAD_CASTS = (6.0, 2)


def torch_cp_merge_kernels(
    ctx: Context, steps: int, gpu: GPUSpec, eff: Efficiency, floor: float = 0.0
) -> tuple[list[Kernel], list[Kernel]]:
    """The memory-bound kernels torch's ring attention runs beside its cp SDPA blocks, one layer, one micro-batch,
    the busiest rank (the last: every step a whole, non-partial merge, load-balanced or not; a partial merge on
    another rank touches half the output and re-cats the whole, _partial_update), in the order of the TORCH_CP_*
    tables: (forward, backward). About 38 B per output element per merge against the 12 B of the fused correction
    the other flavours run, and the fp32 dq/dk/dv accumulation of the backward."""
    heads, kv_heads, t = ctx.model.num_attention_heads, ctx.model.kv_heads, ctx.par.tp
    qk, v = attention_head_dims(ctx)
    rows = ctx.b * ctx.s_cp * heads / t
    o, q, kv = rows * v, rows * qk, ctx.b * ctx.s_cp * kv_heads / t * (qk + v)

    def kern(name, table, elements, times):
        per, launches = table
        return memory_kernel(name, per * elements * times, gpu, eff, launches * times, floor)

    merges = steps - 1
    fwd = [
        kern("cp_merge.cast", TORCH_CP_CAST_O, o, steps),
        kern("cp_merge", TORCH_CP_MERGE_O, o, merges),
        kern("cp_merge.lse", TORCH_CP_MERGE_R, rows, merges),
        kern("cp_kv_cat", TORCH_CP_KV_CAT, kv, merges),
        kern("cp_merge.out_cast", TORCH_CP_OUT_CAST, o, 1),
    ]
    bwd = [
        kern("cp_grad.zeros", TORCH_CP_ZEROS, q + kv, 1),
        kern("cp_grad.dq_add", TORCH_CP_DQ_ADD, q, steps),
        kern("cp_grad.dkv_add", TORCH_CP_DKV_ADD, kv, steps),
        kern("cp_kv_cat.bwd", TORCH_CP_KV_CAT, kv, merges),
        kern("cp_grad.casts", TORCH_CP_GRAD_CASTS, q + kv, 1),
    ]
    return fwd, bwd


# A windowed layer's fused kernel walks whole key tiles: a block of FLASH_TILE query rows spans its window and the
# block itself, w + FLASH_TILE keys, of which each query attends about w (FlashAttention-2's query blocks are 128 rows;
# its hdim-64 forward tile is 128 x 128: Dao-AILab/flash-attention csrc/flash_attn/src/flash_fwd_launch_template.h
# run_mha_fwd_hdim64, Flash_fwd_kernel_traits<64, 128, 128, 4>; cuDNN's tiles are not published: the H200 check).
# Checked on this project's H200 (cuDNN 9.19 through XLA, b 4 x 64 heads x d 64, GQA 8, causal, window (128, 0);
# tests/reference/kernels/h200/swa_cudnn.json): a windowed layer takes 0.29 / 0.33 (forward / backward) of a full
# layer's time at 4k, 0.17 / 0.19 at 8k, 0.79 / 0.76 at 1k; this rule gives 0.30, 0.17, 0.74 (before it: 0.45, 0.25,
# 1.05: the window charged the whole per-block overhead s0 on 128 keys, against s0/2 on a causal layer's).
FLASH_TILE = 128


def layer_mix_keys(ctx: Context, s_kv: float, s0: float) -> float:
    """The keys per query block whose shape term s/(s + s0) times a layer mix's mean FLOPs (attended_keys) gives the
    mix's time, where each layer runs at its own cost per query block, in keys at the ceiling: a full (causal) layer
    its mean keys x (s_kv + s0) / s_kv, i.e. its keys plus the per-block overhead s0/2 (mean s_kv/2); a windowed layer
    (window w < s_kv) its mean keys + FLASH_TILE (the band's tiles) + the same s0/2, at most the full layer's cost;
    queries against a cache (kv_length != s) a windowed layer at its window's term, mean x (w + s0) / w.
    GPT-OSS alternates a 128-token window with full attention (``full_attention_interval``): at 4k tokens its
    windowed layers take 0.30 of a full layer's time (the one window applied to every layer's term, as before
    round five, made its attention 3.9x as long at 4k, 5.1x at 8k)."""
    mdl = ctx.model
    causal = kv_length(ctx) == ctx.s  # a pass over the sequence itself (not a query against a cache)
    full = cp_rank_causal_keys(ctx) * (s_kv + s0) / s_kv if causal else 0.0  # a windowed layer's cap
    keys = weighted = 0.0
    for i, mean in enumerate(layer_keys(ctx)):  # each layer weighed by its keys, as attended_keys weighs it
        window = mdl.attention_window(i)
        keys += mean
        if window is None or window >= s_kv:
            weighted += mean * (s_kv + s0) / s_kv
        elif causal:
            weighted += min(mean + FLASH_TILE + s0 / 2, full)
        else:  # queries against a cache: each at its window's own term (no tile measurement here)
            weighted += mean * (window + s0) / window
    shape = keys / weighted
    return s0 * shape / (1 - shape)


def flash_attention_s(
    flops: float,
    s_kv: float,
    kernel: str,
    gpu: GPUSpec,
    eff: Efficiency = EFFICIENCY,
    launches: int = 1,
    head_dim: float = HEAD_DIM_REF,
    fp8: tuple[bool, bool] = (False, False),
    speedups: Mapping = ATTENTION_FP8_SPEEDUP,
) -> tuple[float, float]:
    """(forward, backward) seconds of a fused attention kernel executing ``flops`` forward over ``s_kv`` keys
    per query block: the kernel's ceiling x s_kv/(s_kv + s0) x its head-dim rate (head_dim_rate) of the bf16 peak,
    the passes ``fp8`` names at the FP8 kernel's speedup (attention_ceiling; core attention stays bf16 under fp8
    recipes unless fp8_dpa: workload.fp8_dot_product_attention); the backward FLASH_BWD x the FLOPs at its own
    ceiling."""
    shape_f = s_kv / (s_kv + eff.attention_s0)
    d_f, d_b = head_dim_rate(kernel, head_dim)
    c_f, c_b = attention_ceiling(kernel, gpu, eff, fp8, speedups)
    c_f, c_b = c_f * d_f, c_b * d_b
    peak = dense_peak(gpu, "bf16")
    forward = flops / (peak * c_f * shape_f) + launches * eff.kernel_s
    backward = FLASH_BWD * flops / (peak * c_b * shape_f) + launches * FLASH_BWD_KERNELS * eff.kernel_s
    return forward, backward


def unfused_attention(ctx: Context, gpu: GPUSpec, eff: Efficiency) -> tuple[tuple[Kernel, ...], tuple[Kernel, ...]]:
    """Megatron-LM's pre-flash core attention on one rank: per (batch, head) QKᵀ (s x d @ d x s) and PV
    (s x s @ s x d) as batched GEMMs over the whole square (the causal mask is applied, not skipped), with the
    memory-bound softmax (and dropout, where the model trains with attention dropout) over the b·(a/t)·s² scores
    between them."""
    from .memory import attention_dropout

    mdl = ctx.model
    bh, d, s_q, s_k = ctx.b * mdl.num_attention_heads / ctx.par.tp, mdl.head_size, ctx.s_cp, ctx.s
    dtype = "bf16" if ctx.x <= 2 else "fp32"
    groups = max(1, round(bh))
    qk = gemm_kernels("attn_scores", s_q, s_k, d, dtype, gpu, eff, groups)
    pv = gemm_kernels("attn_values", s_q, d, s_k, dtype, gpu, eff, groups)
    dropout = UNFUSED_DROPOUT_BYTES if attention_dropout(ctx) else (0, 0)  # training only (memory.dropout_probs)
    (soft_fb, soft_fk), (soft_bb, soft_bk) = unfused_softmax_bytes(ctx.x, s_q, s_k, groups)
    scores = bh * s_q * s_k
    drop_k = bool(dropout[0])
    soft_f = memory_kernel("softmax_dropout", scores * (soft_fb + dropout[0]), gpu, eff, soft_fk + drop_k)
    if drop_k:  # the dropout's Philox draws where they take longer than its bytes (DROPOUT_RNG_SM_CYCLES)
        soft_f = with_draws(soft_f, scores, scores * dropout[0], gpu, eff)
    soft_b = memory_kernel("softmax_dropout.bwd", scores * (soft_bb + dropout[1]), gpu, eff, soft_bk + drop_k)
    # the layout copies (UNFUSED_LAYOUT_PASSES): the context out, the q/k/v gradients' concatenation
    tokens, x = ctx.b * ctx.s_cp, ctx.x
    context = tokens * bh / ctx.b * d * x
    qkv = context + 2 * tokens * mdl.kv_heads_per_rank(ctx.par.tp) * d * x
    copy_f = memory_kernel("attn_context_copy", UNFUSED_LAYOUT_PASSES * context, gpu, eff)
    copy_b = memory_kernel("qkv_split.bwd", UNFUSED_LAYOUT_PASSES * qkv, gpu, eff)
    return (qk[0], soft_f, pv[0], copy_f), (pv[1], pv[2], soft_b, qk[1], qk[2], copy_b)


def fused_dropout_s(ctx: Context, kernel: str, scores: float, gpu: GPUSpec, fp8: bool = False) -> tuple[float, float]:
    """(forward, backward) seconds attention dropout adds to a fused attention kernel over ``scores`` attended scores:
    scores x FUSED_DROPOUT_SM_CYCLES[kernel] / (SMs x SM clock), where the model trains with attention dropout
    (memory.attention_dropout: p > 0; p 0 draws nothing); 0 for kernels without a measurement (FlashAttention-3, FP8
    attention) and GPUs without an SM clock (SM_CLOCK_MHZ)."""
    from .memory import attention_dropout

    cycles = FUSED_DROPOUT_SM_CYCLES.get(kernel)
    if cycles is None or fp8 or not attention_dropout(ctx):
        return 0.0, 0.0
    per_cycle = sm_cycles_s(scores, gpu)  # 0 without a clock
    return cycles[0] * per_cycle, cycles[1] * per_cycle


def with_draws(kernel: Kernel, elements: float, nbytes: float, gpu: GPUSpec, eff: Efficiency) -> Kernel:
    """``kernel``, a dropout moving ``nbytes``, at the longer of its bytes and its Philox draws over ``elements``
    (dropout_rng_s): the unfused attention's dropout and the bias-dropout-add's."""
    excess = dropout_rng_s(elements, gpu) - hbm_s(nbytes, gpu, eff)
    return replace(kernel, time_s=kernel.time_s + excess) if excess > 0 else kernel


def dropout_rng_s(elements: float, gpu: GPUSpec) -> float:
    """Seconds torch's dropout forward spends drawing its mask over ``elements`` on the SMs: elements x the
    generation's SM-cycles an element (dropout_rng_cycles) at its SMs and SM clock (sm_cycles_s); 0 where the GPU's
    SMs or SM clock are not known."""
    return dropout_rng_cycles(gpu) * sm_cycles_s(elements, gpu)


def dropout_rng_cycles(gpu: GPUSpec) -> float:
    """SM-cycles torch's dropout forward spends drawing one element: the generation's measured value
    (DROPOUT_RNG_SM_CYCLES_BY_GEN: the A100's), else the H200's (DROPOUT_RNG_SM_CYCLES)."""
    return DROPOUT_RNG_SM_CYCLES_BY_GEN.get(generation(gpu), DROPOUT_RNG_SM_CYCLES)


def sm_cycles_s(elements: float, gpu: GPUSpec) -> float:
    """Seconds ``elements`` SM-cycles spread over the whole GPU take: elements / (SMs x SM_CLOCK_MHZ x the power-limit
    scale, GPUSpec.clock_scale: a lowered limit lowers the SM clock as it does the GEMMs'); 0 where the GPU's SMs or
    SM clock are not known."""
    clock = SM_CLOCK_MHZ.get(generation(gpu), 0) * gpu.clock_scale()
    if not clock or not gpu.sms:
        return 0.0
    return elements / (gpu.sms * clock * 1e6)


# Learned attention sinks in unfused attention, as TransformerEngine v2.9's UnfusedDotProductAttention runs them
# (Megatron-Core's attention_backend "unfused"; dot_product_attention/backends.py l. 467-478 and 491-492): the sink
# logit is concatenated to the scores as one more key column, torch.cat([scores, sink.expand(b, np, sq, 1)], -1) in
# the scores' dtype (read a score, write it: 2 x its bytes, one kernel), the softmax runs over s_k + 1 columns and
# probs[..., :-1] drops the column (a view). Backward: the slice's SliceBackward writes a zeroed [.., s_k + 1]
# gradient and copies the incoming one into it (write, read and write: 3 x the score's bytes, two kernels); the cat's
# backward narrows (views) and the sink's own gradient sums the last column over (b, sq) (one reduction kernel,
# b·np·sq scores read). Not charged: TE then runs the softmax under an "arbitrary" mask (the padded mask) instead of
# the causal kernel. Megatron-Core's local path (SoftmaxOne, fusions/fused_softmax.py at 92c8482e6d) does the same
# on fp32 scores. Fused kernels carry the sink inside (cuDNN: no kernel, no byte).
UNFUSED_SINK_PASSES = (2, 3)  # score-sized passes (forward cat, backward zeros + copy)
UNFUSED_SINK_KERNELS = (1, 3)  # forward cat; backward zeros, copy, the sink gradient's sum


def unfused_sink_kernels(ctx: Context, gpu: GPUSpec, eff: Efficiency) -> tuple[tuple[Kernel, ...], tuple[Kernel, ...]]:
    """The sink column's kernels of unfused attention (UNFUSED_SINK_PASSES) on one rank: one layer, one micro-batch,
    the b·(a/t) x s_q x s_k scores of ``unfused_attention`` in the activation dtype."""
    bh = ctx.b * ctx.model.num_attention_heads / ctx.par.tp
    scores, rows = bh * ctx.s_cp * ctx.s, bh * ctx.s_cp
    x = 2 if ctx.x <= 2 else 4
    fwd = memory_kernel("softmax_sink", UNFUSED_SINK_PASSES[0] * x * scores, gpu, eff, UNFUSED_SINK_KERNELS[0])
    nbytes = UNFUSED_SINK_PASSES[1] * x * scores + x * rows
    bwd = memory_kernel("softmax_sink.bwd", nbytes, gpu, eff, UNFUSED_SINK_KERNELS[1])
    return (fwd,), (bwd,)


def unfused_softmax_bytes(
    score_bytes: float, s_q: float, s_k: float, batches: int
) -> tuple[tuple[float, int], tuple[float, int]]:
    """((forward bytes a score, kernels), (backward ...)) of Megatron-LM's FusedScaleMaskSoftmax on a causal square of
    ``batches`` (b·np) score matrices: the fused upper-triangular kernel where fused_softmax.py (6985e58) allows it
    (UNFUSED_SOFTMAX_BYTES), else the torch ops over the whole square (UNFUSED_SOFTMAX_TORCH)."""
    fused = (
        score_bytes <= 2
        and s_q == s_k
        and 16 < s_k <= UNFUSED_SOFTMAX_FUSED_MAX_KEYS
        and s_q % 4 == 0
        and batches % 4 == 0
    )
    if fused:
        return (UNFUSED_SOFTMAX_BYTES[0], 1), (UNFUSED_SOFTMAX_BYTES[1], 1)
    return UNFUSED_SOFTMAX_TORCH[2 if score_bytes <= 2 else 4]


def kv_cache_bytes_per_layer(ctx: Context) -> int:
    """K and V of every cached token of the rank's sequences (ModelSpec.kv_token_bytes: kv_heads_per_rank(t)
    heads, or MLA's latent whole on every rank), in the KV cache's dtype."""
    return ctx.b * (kv_length(ctx) // ctx.par.cp) * ctx.model.kv_token_bytes(ctx.par.tp, ctx.kv_bytes)


__all__ = [
    "ADAM_BYTES",
    "ATTENTION_CEILING",
    "ATTENTION_CEILING_KEYS",
    "EFFICIENCY",
    "GEMM_CEILING",
    "GEMM_DTYPES",
    "HOST_CPUS",
    "KERNEL_CONSTANTS",
    "Efficiency",
    "HostCPU",
    "Kernel",
    "LayerKernels",
    "attention_flops",
    "check_kernel_options",
    "clock_fraction",
    "core_attention_flops",
    "cross_entropy_fusion",
    "efficiency",
    "gemm_peak_share",
    "gemm_time",
    "gpu_efficiency",
    "host_efficiency",
    "kernel_constants",
    "layer_kernels",
    "layer_kernels_key",
    "layer_kernels_key_of",
    "moe_block",
    "per_layer",
    "per_tokens",
    "queue_launch_s",
    "routing_maxvio",
    "sustained_clock",
    "tabled_ceiling",
]
