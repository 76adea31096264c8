"""Accelerator specifications: what a device can compute and hold, as vendors publish it.

Peak rates are **dense** tensor-core rates (no 2:4 sparsity) in TFLOP/s = 1e12 FLOP/s per device; HBM
bandwidth in GB/s = 1e9 B/s; capacity in bytes as the driver reports it (``nvidia-smi --query-gpu=
memory.total``) where we know that figure, otherwise the vendor's decimal GB. The step-time model divides
FLOPs by ``peak_tflops[dtype]`` x an achieved efficiency; the memory model compares against
``hbm_bytes``. ``sm`` is the CUDA compute capability x 10 (80 Ampere, 90 Hopper, 100 Blackwell): NCCL's
tuning tables are keyed by it (src/graph/tuning.cc). ``nvlink_links`` is the NVLink count per GPU.

The GPU as it runs: ``sms`` (streaming multiprocessors: the GEMM model's tiles fill them, planner/kernels.py),
``tdp_w`` (the default power limit the published peaks and the measured kernel tables hold at) and
``min_power_w`` (the lowest limit ``nvidia-smi -pl`` accepts), and ``power_limit_w`` (the configured limit;
None = the default). Under a lower limit the tensor cores run at a lower sustained clock: ``clock_scale``.
``sustained_clock``: the tensor clock a training step holds at the default limit, measured on this very part
(SustainedClock, with its source); None = the generation's (planner/kernels.py SUSTAINED_CLOCK, FP8_CLOCK).
``gemm_table``: GEMM ceilings fitted on this part's own measured GEMM table (MeasuredGemm, with its source); None =
the generation's (planner/kernels.py GEMM_CEILING).
``kernel_constants``: what a profiler trace fitted for this GPU (the planner's kernel model reads them).
``variability``: the GPU-to-GPU spread of sustained throughput among parts of one SKU, a robust standard deviation as
a fraction of the median part's time (GPU_VARIABILITY; 0: every part alike); the planner's step time reads it
(planner/spread.py: a synchronous job runs at the pace of its slowest GPU).
``host_cpu``: the CPU of the node the GPU sits in (spec.CPU_VENDORS: intel, amd, arm), which launches its kernels;
the cluster sets it from its ``cpu_vendor`` (spec.ClusterSpec), the planner's host costs read it
(planner/kernels.py HOST_CPUS).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from .._errors import CollectiveError
from .._hashing import kept_hash

MIB = 1 << 20
GB = 10**9
DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8", "fp4")
# Static share of the board power under a compute load (leakage, HBM and I/O), the rest dynamic. Dynamic CMOS
# power is C·V²·f and, in the DVFS range, V rises with f, so the dynamic part goes as f³ (Weste & Harris,
# CMOS VLSI Design §5.2). A hand-set global constant (idle boards draw ~10% of TDP, nvidia-smi; static power under
# load is higher); a profiler trace at two power limits refits it.
STATIC_POWER_FRACTION = 0.2

# GPU-to-GPU variability (spread15; its evidence restated by mend15f after review r15e). Sinha, Guliani, Jain, Tran,
# Sinclair, Venkataraman, "Not All GPUs Are Created Equal: Characterizing Variability in Large-Scale, Accelerator-Rich
# Systems", SC'22. Two versions give two figures (tests/reference/variability/sinha_sc22.json):
# - arXiv 2208.11035v3 (abstract): 5 clusters (Summit, Vortex, Frontera, Longhorn: V100; Corona: MI60), 18,800 hours,
#   SGEMM, ResNet-50, BERT, LAMMPS, PageRank: "8% (max 22%) average performance variation", outliers up to 1.5x the
#   median GPU. The 22% maximum lies below the 1.5x outliers, so this figure leaves the outliers out.
# - the SC'22 proceedings page (sc22.supercomputing.org pap186): 4 clusters (no Frontera), "over 100,000 hours",
#   "32% (max 72%) average performance variation". Exactly 4x v3's average: which metric each version uses is not
#   stated in either abstract, and the paper's methods text was not read (not in the stored corpora).
# This project takes v3's 8% (the later version, the one that excludes the outliers) and reads "variation" as the span
# between a box plot's 1.5·IQR fences over the median, 4·IQR / median: THIS PROJECT'S READING, consistent with a
# commented-out computation (`range = q3 + 1.5 * iqr - (q1 - 1.5 * iqr)`, `percent_variability = range/q2 * 100`) in
# a 2024 plotting script of the authors' artifact (hal-uw/gpu_variability_sc22_artifact at bc84e72e77,
# plot_script/plot_aggregated.py l. 105-114, on the later Frontera/Longhorn ML data), not defined by it. A normal's
# IQR is 2·Φ⁻¹(0.75)·σ = 1.349σ, so σ = variation / (4 x 1.349) = 1.48% of the median part's time; were the 8% one
# IQR / median, σ would be 5.93% (x4). The fences sit at ±2.70σ (tail 0.35%): the expected slowest of N parts passes
# the upper fence from N ~ 290 on, where the source's box plots call parts outliers; those rows rely on operators
# draining the outliers (docs/step-time.md). Per generation: the only per-part fleet quartiles read are V100's and
# MI60's (Sinha et al.); the ICPP'22 study of 856 P100/V100/A100 parts (48 CUDA kernels; "Analyzing Performance and
# Power-Efficiency Variations among NVIDIA GPUs") finds the spread depends on the kernel and the generation, but only
# its abstract was in hand, no A100 figure; PAL (SC'24, arXiv 2408.11919) the same on the application. So Ampere,
# Hopper and Blackwell carry Volta's figure (docs/step-time.md "Review r15e's findings (mend15f)"). Never chosen by
# the published runs' error.
VARIATION_AVERAGE = 0.08  # Sinha et al. arXiv v3, average over clusters and applications (read as 4·IQR / median)
VARIATION_MAX = 0.22  # the same, the largest (cluster, application)
WHISKER_SPAN_IQR = 4.0  # (Q3 + 1.5 IQR) - (Q1 - 1.5 IQR) = 4 IQR: this project's reading of "variation"
NORMAL_IQR_SIGMAS = 1.3489795003921634  # 2·Φ⁻¹(0.75): a normal's IQR in standard deviations
VARIABILITY_RANGE = (0.0, 0.2)  # an input's bounds (cluster.gpu.variability): 0 turns it off; 0.2 is 4.9x the max σ


def sigma_from_variation(variation: float) -> float:
    """A robust σ (a fraction of the median) from Sinha et al.'s variation read as 4·IQR / median: IQR / 1.349."""
    return variation / (WHISKER_SPAN_IQR * NORMAL_IQR_SIGMAS)


GPU_VARIABILITY = round(sigma_from_variation(VARIATION_AVERAGE), 4)  # 0.0148


@dataclass(frozen=True)
class SustainedClock:
    """The tensor clock one part sustains through a training step at its default power limit, measured: ``fraction``
    of the clock its datasheet peak is quoted at (bf16 tensor work), ``fp8_ratio`` the clock its fp8 GEMMs hold over
    the bf16 ones under the same cap, ``source`` the measurement. Opaque here: planner/kernels.py clock_fraction reads
    it (the power-limit scale, clock_scale, multiplies it)."""

    fraction: float
    fp8_ratio: float
    source: str


@dataclass(frozen=True)
class MeasuredGemm:
    """GEMM ceilings fitted on one part's own measured GEMM table: ``ceilings`` as (GEMM dtype, fraction of the
    datasheet dense peak) pairs, ``source`` the table and the fit. Opaque here: planner/kernels.py gemm_ceiling reads
    it (after a trace's fitted ceilings, before the generation's GEMM_CEILING)."""

    ceilings: tuple[tuple[str, float], ...]
    source: str


@dataclass(frozen=True)
class GPUSpec:
    name: str
    peak_tflops: dict[str, float] = field(default_factory=dict)  # dense, per dtype
    hbm_bytes: int = 0
    hbm_GBps: float = 0.0
    sm: int = 0  # compute capability x 10; 0 = not an NVIDIA GPU (NCCL's tables do not apply)
    nvlink_links: int = 0
    source: str = ""
    sms: int = 0  # streaming multiprocessors (0: unknown, the GEMM model then skips tile quantization)
    tdp_w: float = 0.0  # default power limit (0: unknown, no power limit can be set)
    min_power_w: float = 0.0
    power_limit_w: float | None = None  # configured limit; None = tdp_w
    # Kernel constants fitted for this GPU on the user's own profiler trace (POST /v1/calibrate ``trace``), as
    # (name, value) pairs; () = the defaults. Opaque here: the planner's kernel model reads them
    # (planner/kernels.py KERNEL_CONSTANTS names them and their ranges).
    kernel_constants: tuple[tuple[str, float], ...] = ()
    # the node's host CPU (the cluster's cpu_vendor, set by ClusterSpec); opaque here like kernel_constants
    host_cpu: str = "intel"
    # the tensor clock measured on this part in a training step; None = its generation's (the module docstring)
    sustained_clock: SustainedClock | None = None
    # GEMM ceilings fitted on this part's own measured table; None = its generation's (the module docstring)
    gemm_table: MeasuredGemm | None = None
    # GPU-to-GPU spread of sustained throughput (a robust σ, a fraction of the median part's time; GPU_VARIABILITY)
    variability: float = GPU_VARIABILITY
    # this part's clock over the median part's of its SKU (1.0: the median part the kernel tables were measured on;
    # planner/spread.py slowest_part sets 1 / pace for the slowest part of a job). Not an input: never in a request.
    part_clock: float = 1.0

    def clock_scale(self) -> float:
        """Sustained tensor-core clock at ``power_limit_w`` as a fraction of the clock at the default limit:
        P = P_static + P_dyn·(f/f_tdp)³ solved for f (STATIC_POWER_FRACTION), times ``part_clock``. HBM runs at its
        own clock."""
        if self.power_limit_w is None or not self.tdp_w or self.power_limit_w >= self.tdp_w:
            return self.part_clock
        static = STATIC_POWER_FRACTION * self.tdp_w
        return self.part_clock * max(0.0, (self.power_limit_w - static) / (self.tdp_w - static)) ** (1 / 3)

    def peak(self, dtype: str) -> float:
        """Peak dense FLOP/s for ``dtype``; fp8 falls back to bf16 on parts without fp8 tensor cores."""
        tflops = self.peak_tflops.get(dtype) or (self.peak_tflops.get("bf16") if dtype == "fp8" else None)
        if not tflops:
            raise CollectiveError(
                "cluster.gpu.peak_tflops", f"GPU {self.name!r} has no peak rate for {dtype}; give peak_tflops.{dtype}"
            )
        return tflops * 1e12

    def __hash__(self) -> int:  # frozen, but the dict field needs a hash of its items
        return kept_hash(self, _gpu_hash)  # computed once (.._hashing): the planner's lru caches hash the GPU


def _gpu_hash(gpu: GPUSpec) -> int:
    fields = (gpu.name, tuple(sorted(gpu.peak_tflops.items())), gpu.hbm_bytes, gpu.hbm_GBps, gpu.sm, gpu.sms)
    rest = (gpu.power_limit_w, gpu.kernel_constants, gpu.host_cpu, gpu.sustained_clock, gpu.gemm_table, gpu.variability)
    return hash((*fields, *rest, gpu.part_clock))


def _gpu(name, bf16, fp8, tf32, fp32, hbm_bytes, hbm_GBps, sm, links, source, power=(0, 0, 0), fp4=0.0):
    """``power``: (SMs, default power limit W, lowest power limit W)."""
    peaks = {"bf16": bf16, "fp16": bf16, "tf32": tf32, "fp32": fp32}
    if fp8:
        peaks["fp8"] = fp8
    if fp4:
        peaks["fp4"] = fp4
    sms, tdp, low = power
    return GPUSpec(name, peaks, hbm_bytes, hbm_GBps, sm, links, source, sms, tdp, low)


# name: bf16 (= fp16), fp8, tf32, fp32 dense TFLOP/s; HBM bytes; HBM GB/s; sm; NVLink links per GPU; source;
# (SMs, default and lowest power limit W); fp4. A part that shares a family member's silicon is that member with
# what its datasheet changes (dataclasses.replace).
# fmt: off
_A100 = _gpu(
    "A100 SXM4 80GB", 312.0, 0.0, 156.0, 19.5, 81920 * MIB, 2039.0, 80, 12,
    "NVIDIA A100 Tensor Core GPU datasheet (2021): 312 TF bf16 dense, 2,039 GB/s HBM2e, 400 W; "
    "nvidia-smi 81920 MiB, power limits 100-400 W; 108 SMs (NVIDIA A100 architecture whitepaper)",
    (108, 400, 100),
)
_H100 = _gpu(
    "H100 SXM5 80GB", 989.4, 1978.9, 494.7, 66.9, 81559 * MIB, 3350.0, 90, 18,
    "NVIDIA H100 Tensor Core GPU datasheet (2023): 989 TF bf16 / 1,979 TF fp8 dense, 3.35 TB/s HBM3; "
    "nvidia-smi 81559 MiB, power limits 200-700 W; 132 SMs (NVIDIA H100 Tensor Core GPU Architecture "
    "whitepaper)",
    (132, 700, 200),
)
_GH200 = replace(
    _H100, name="GH200 96GB", peak_tflops=_H100.peak_tflops | {"fp32": 67.0}, hbm_bytes=96 * GB, hbm_GBps=4000.0,
    tdp_w=1000, min_power_w=450,
    source="NVIDIA GH200 Grace Hopper Superchip datasheet (2023): H100 compute (1,979 TF bf16 / 3,958 TF fp8 with "
    "sparsity), 96 GB HBM3 at 4 TB/s, module power 450-1,000 W (CPU, GPU and memory together); 132 SMs",
)
_B200 = _gpu(
    "B200 180GB", 2250.0, 4500.0, 1100.0, 75.0, 180 * GB, 8000.0, 100, 18,
    "NVIDIA DGX B200 datasheet (2024): 72 PF fp8 training (sparse) per 8 GPUs = 4.5 PF dense fp8, "
    "2.25 PF bf16 per GPU, 9 PF fp4 dense; 1,440 GB HBM3e, 64 TB/s per system; 1,000 W per GPU; 148 SMs",
    (148, 1000, 200), 9000.0,
)
_GB200 = _gpu(
    "B200 in GB200 NVL72", 2500.0, 5000.0, 1250.0, 80.0, 186 * GB, 8000.0, 100, 18,
    "NVIDIA GB200 NVL72 datasheet (2024): 360 PF bf16 and 720 PF fp8 sparse per 72 GPUs "
    "(2.5 / 5 PF dense per GPU, 10 PF fp4 dense), 13.4 TB HBM3e at 576 TB/s per rack; 1,200 W per GPU; "
    "148 SMs",
    (148, 1200, 200), 10000.0,
)
_H20 = _gpu(  # Hopper cut down for export: every rate its own
    "H20 96GB", 148.0, 296.0, 74.0, 44.0, 96 * GB, 4000.0, 90, 18,
    "NVIDIA HGX H20 product brief (2024): 148 TF bf16 / 296 TF fp8 dense, 96 GB HBM3 at 4.0 TB/s, "
    "NVLink 900 GB/s bidirectional, 400 W; 78 SMs",
    (78, 400, 200),
)
# fmt: on
# This project's H200 (700 W) by throughput: the clock at which planner/kernels.py times its Llama-3-8B layer trained
# back to back for 30 s as measured, 1,461 MHz of 1,830 = 0.798, and its sustained 8192^3 fp8 GEMMs over its bf16
# ones, 1,367 / 1,411 MHz = 0.969 (tests/reference/kernels/h200/run2.json ``layer_sustained``, ``sustained``;
# bench/h200_power.py effective_clocks prints them, tests/planner/test_h200_power.py recomputes them). Not the
# clock nvidia-smi logged (1,560 MHz, fp8 / bf16 0.918): under the cap that reading is not the tensor clock to ~10%
# (docs/step-time.md, clock12 and sus12). The other Hopper parts take the H100's measurement, the generation's row.
_H200_CLOCK = SustainedClock(
    0.798,
    0.969,
    "this project's H200 run 2 by throughput (bench/h200_power.py effective_clocks): 1,461 MHz layer, "
    "fp8 GEMMs 1,367 / bf16 1,411 MHz",
)
# GB200, B300 and GB300 GEMMs from their own measured tables: NVIDIA aiconfigurator (Apache-2.0, commit 095f58a5),
# systems gb200 / b300_sxm / gb300, gemm/trtllm/1.3.0rc20 (TensorRT-LLM's torch flow: cuBLASLt; DeepGEMM for
# fp8_block), the B200 table's (b200_sxm) source, grid and version; extract tests/reference/kernels/
# aiconfigurator_gemm_parts.json (bench/aiconfigurator_extract.py). Fitted by bench/kernel_fit.py own_ceilings with the
# global k0, fill and fixed cost kept: the generation's ceiling (planner/kernels.py GEMM_CEILING, fitted on b200_sxm)
# scaled, per table class (bf16; fp8_block, which per-tensor fp8 and MXFP8 take as the generation does; nvfp4), until
# the part's table is predicted with the B200 table's median bias on the shapes the ceiling governs (COMPUTE_BOUND:
# the FLOPs at peak x ceiling at least 0.8 of the predicted time, kernels.gemm_peak_share; mend13b). The datasheet
# peaks stay; the ceiling carries what the tables measured: at m, n, k >= 4,096 the GB200's bf16 GEMMs take 0.956
# of the B200's time, not the 0.90 of their datasheet peaks (2,500 / 2,250 TF), the B300's / GB300's nvfp4 0.867 /
# 0.821, not 0.67 / 0.60 (13.5 / 15 PF against 9); the model gives 0.964, 0.868 / 0.816. Fitted on every shape (the
# median), B300 / GB300 nvfp4 came out 0.246 / 0.227, slower than the B200's at every shape; docs/step-time.md
# "nvfp4 ceilings on the compute-bound shapes (mend13b)".
_AIC_PARTS = "aiconfigurator 095f58a5 {} gemm/trtllm/1.3.0rc20 (bench/kernel_fit.py own_ceilings, over b200_sxm's)"


def _measured_gemm(system: str, bf16: float, fp8: float, nvfp4: float) -> MeasuredGemm:
    """bf16, block-scaled fp8 (per-tensor fp8 and MXFP8 too) and nvfp4 ceilings of one part's table."""
    ceilings = (("bf16", bf16), ("fp8", fp8), ("fp8_block", fp8), ("mxfp8", fp8), ("nvfp4", nvfp4))
    return MeasuredGemm(ceilings, _AIC_PARTS.format(system))


# The block-fp8 and nvfp4 rows less the input quantize they time (bench/kernel_fit.py rows, gemm_alone_s; bwcast14),
# against the generation's GEMM-alone ceilings: the ceilings on the rows as timed were GB200 0.614 / 0.398, B300
# 0.708 / 0.321, GB300 0.695 / 0.308 (fp8 / nvfp4).
_GB200_GEMM = _measured_gemm("gb200", 0.685, 0.691, 0.446)
_B300_GEMM = _measured_gemm("b300_sxm", 0.744, 0.802, 0.373)
_GB300_GEMM = _measured_gemm("gb300", 0.804, 0.791, 0.356)
# fmt: off
GPUS: dict[str, GPUSpec] = {
    "a100-sxm4-80gb": _A100,
    "a100-pcie-80gb": replace(
        _A100, name="A100 PCIe 80GB", hbm_GBps=1935.0, nvlink_links=0, tdp_w=300, min_power_w=150,
        source="NVIDIA A100 Tensor Core GPU datasheet (2021): PCIe 80GB, 1,935 GB/s, 300 W; 108 SMs",
    ),
    "h100-sxm5-80gb": _H100,
    "h100-nvl-94gb": _gpu(
        "H100 NVL 94GB", 835.5, 1670.5, 417.5, 60.0, 94 * GB, 3900.0, 90, 0,
        "NVIDIA H100 NVL datasheet (2023): 1,671 TF bf16 / 3,341 TF fp8 with sparsity (half dense), 94 GB HBM3 "
        "at 3.9 TB/s, 350-400 W; NVLink bridge between pairs (600 GB/s) only; 132 SMs",
        (132, 400, 200),
    ),
    "gh200-96gb": _GH200,
    "gh200-144gb": replace(
        _GH200, name="GH200 144GB", hbm_bytes=144 * GB, hbm_GBps=4900.0,
        source="NVIDIA GH200 Grace Hopper Superchip datasheet (2024 HBM3e version): 144 GB HBM3e at 4.9 TB/s, the "
        "same H100 compute and 450-1,000 W module power; 132 SMs",
    ),
    "h800-sxm5-80gb": replace(
        _H100, name="H800 SXM5 80GB", nvlink_links=8,
        source="NVIDIA H800 (export variant of H100 SXM5): same tensor cores and HBM3, 8 NVLink links (400 GB/s); "
        "DeepSeek-V3 technical report §3.1",
    ),
    "h200-sxm-141gb": replace(
        _H100, name="H200 SXM 141GB", hbm_bytes=143771 * MIB, hbm_GBps=4800.0,
        source="NVIDIA H200 Tensor Core GPU datasheet (2024): H100 compute, 141 GB HBM3e at 4.8 TB/s; nvidia-smi "
        "143771 MiB; 700 W; 132 SMs",
        sustained_clock=_H200_CLOCK,
    ),
    "h20-96gb": _H20,
    "b200-180gb": _B200,
    "gb200-186gb": replace(_GB200, gemm_table=_GB200_GEMM),
    "b300-288gb": replace(
        _B200, name="B300 288GB", peak_tflops=_B200.peak_tflops | {"fp4": 13500.0}, hbm_bytes=288 * GB, sms=160,
        tdp_w=1100, gemm_table=_B300_GEMM,
        source="NVIDIA HGX B300 datasheet (2025): per 8 GPUs 36 PF bf16 and 72 PF fp8 with sparsity (2.25 / 4.5 PF "
        "dense per GPU), 108 PF dense fp4 (13.5 PF per GPU), 2.3 TB HBM3e; 1,100 W per GPU; 160 SMs (NVIDIA "
        "technical blog 'Inside NVIDIA Blackwell Ultra', 2025)",
    ),
    "gb300-288gb": replace(
        _GB200, name="B300 in GB300 NVL72", peak_tflops=_GB200.peak_tflops | {"fp4": 15000.0}, hbm_bytes=288 * GB,
        sms=160, tdp_w=1400, gemm_table=_GB300_GEMM,
        source="NVIDIA GB300 NVL72 datasheet (2025): per 72 GPUs 360 PF bf16 and 720 PF fp8 with sparsity (2.5 / 5 "
        "PF dense per GPU), 1,080 PF dense fp4 (15 PF per GPU), 20 TB HBM3e at 576 TB/s; 1,400 W per GPU; 160 SMs",
    ),
    "ascend-910b": _gpu(
        "Ascend 910B", 313.0, 0.0, 0.0, 0.0, 64 * GB, 1600.0, 0, 0,
        "Huawei Atlas 800T A2 training server brief: 313 TF fp16 per NPU, 64 GB HBM2e at 1.6 TB/s",
    ),
    "tpu-v4": _gpu(
        "TPU v4", 275.0, 0.0, 0.0, 0.0, 32 * (1 << 30), 1200.0, 0, 0,
        "Jouppi et al., TPU v4, ISCA 2023, Table 1: 275 TF bf16, 32 GiB HBM2 at 1,200 GB/s",
    ),
}
# fmt: on


def nested_constants(pairs: tuple[tuple[str, float], ...]) -> dict:
    """GPUSpec.kernel_constants as a request writes them: a dotted name as a nested block (``gemm_ceiling.bf16``
    -> {"gemm_ceiling": {"bf16": ...}})."""
    out: dict = {}
    for name, value in pairs:
        head, _, key = name.partition(".")
        if key:
            out.setdefault(head, {})[key] = value
        else:
            out[name] = value
    return out


def measured_preset(gpu: GPUSpec) -> str | None:
    """The preset (GPUS) whose measured sustained clock and GEMM table ``gpu`` carries, if any: a request block given
    field by field names it (``preset``), so that what it measured, which no request field carries, comes back when
    the block is pasted (spec.spec_block)."""
    measured = (gpu.sustained_clock, gpu.gemm_table)
    if measured == (None, None):
        return None
    return next((k for k, g in GPUS.items() if (g.sustained_clock, g.gemm_table) == measured), None)


def gpu_preset(name: str) -> GPUSpec:
    gpu = GPUS.get(name)
    if gpu is None:
        raise CollectiveError("cluster.gpu", f"unknown GPU {name!r}; known: {', '.join(GPUS)}")
    return gpu


def with_power_limit(gpu: GPUSpec, watts: float | None) -> GPUSpec:
    """``gpu`` under a configured power limit, checked against the range the part accepts."""
    if watts is None:
        return gpu
    if not gpu.tdp_w:
        raise CollectiveError(
            "cluster.gpu.power_limit_w", f"GPU {gpu.name!r} has no known power range (give tdp_w and min_power_w)"
        )
    if not gpu.min_power_w <= watts <= gpu.tdp_w:
        raise CollectiveError(
            "cluster.gpu.power_limit_w",
            f"{watts:g} W is outside {gpu.name}'s power-limit range {gpu.min_power_w:g}-{gpu.tdp_w:g} W "
            "(nvidia-smi -pl accepts the min..default limit)",
        )
    return replace(gpu, power_limit_w=float(watts))


@dataclass(frozen=True)
class PeerCopy:
    """One copy-engine pull over NVLink as measured: a single ``cudaMemcpyAsync`` from one peer's memory into the
    calling GPU's (the copy engine of the reading GPU, no SM), at ``GBps`` (1e9 B/s) per direction after a fixed
    ``latency_s`` a copy, ``source`` the measurements, taken between two GPUs of one NVSwitch board of
    ``board_gpus`` GPUs (``reaches``)."""

    GBps: float
    source: str
    latency_s: float = 0.0
    board_gpus: int = 0

    def seconds(self, nbytes: float, copies: int = 1) -> float:
        """``copies`` pulls of ``nbytes`` each, one after another (one copy engine at a time: the copies do not
        overlap one another), each its fixed latency plus its bytes at the rate."""
        return copies * (self.latency_s + nbytes / (self.GBps * GB))

    def reaches(self, switched: bool, per_node: int | None) -> bool:
        """Whether a group pulls at the measured rate: its ranks joined by one NVLink switch (``switched``:
        pricing.on_nvlink_switch of the group's price) in a node of at least the measured board's GPUs. Hopper's
        NVSwitch boards are the 8-GPU HGX H100 / H200; the 4-GPU HGX H100 joins its GPUs by direct NVLink, a third
        of the links to each peer ("NVSwitch: N/A", NVIDIA HGX H100 datasheet, 2023), the H100 NVL pairs by
        bridges, and a node of one GPU (GH200 over InfiniBand) has no NVLink peer at all."""
        return switched and (per_node or 0) >= self.board_gpus


# Copy-engine peer reads by (compute capability x 10, NVLink links per GPU): the parts whose GPU-to-GPU path is the
# measured one. Hopper with 18 NVLink4 links through NVSwitch (HGX H100 / H200 boards): nvbandwidth v0.10
# ``device_to_device_memcpy_read_ce`` ("Read tests launch a copy from the peer device to the target using the
# target's context": cuMemcpyAsync, the copy engine) on 8 x "NVIDIA H100 80GB HBM3" (driver 580.159.04, CUDA runtime
# 12.6, the report's own fields; it names no machine), every one of the 56 ordered pairs 394.9-395.1 GB/s, matrix sum
# 22,122.87 GB/s = 395.05 a pair (github.com/Azure/cluster-health-monitor, pkg/nodecheckerrunner/checkers/gpu/
# testdata/nvbandwidth_peer_report.json at 199cccbd; its matrix in tests/reference/nvbandwidth/h100_peer_copy.json).
# The same boards' copy-engine peer writes, cuda-samples p2pBandwidthLatencyTest (default CE, 160 MB copies),
# 371-377 GB/s a pair unidirectional and 742-749 GB/s both directions at once (NVIDIA/nccl issue 1264, HGX H100 SXM):
# a pull in each direction at once keeps ~99% of its one-way rate.
# The fixed cost of one copy (mend14a): cuda-samples p2pBandwidthLatencyTest's "P2P=Enabled Latency (P2P Writes)"
# GPU matrix (Samples/5_Domain_Specific/p2pBandwidthLatencyTest outputLatencyMatrix: 100 back-to-back
# cudaMemcpyPeerAsync of one 4-byte element on one stream, timed by CUDA events), on 8 x "NVIDIA H100 80GB HBM3"
# (NVSwitch, driver 595.71.05, CUDA 13.2) whose nvbandwidth device_to_device_memcpy_read_ce reads 395.05-395.25 GB/s,
# the rate above: median of the 56 pairs 2.78 us (2.26-3.35; the diagonal's local copies 1.97-2.27 us). Where it is:
# no public address is known to us. It is the search tool's stored GitHub index, file id 62193952648: a Korean-language
# server acceptance sheet (SPEC CPU 2017 / sysbench, STREAM, nvbandwidth v0.10.0 and p2pBandwidthLatencyTest outputs
# pasted as text beside GitHub user-attachments images), whose repository, path and author the index does not give
# (review r14c, 4); the matrix is kept in tests/reference/nvbandwidth/h100_peer_copy.json. What it measures: the
# issue-to-completion cost of a 4-byte peer *write* (a copy issued on the source GPU's stream), taken as the cost of
# torch's pulls, which are peer *reads* (copies issued on the reader's stream): the same copy engine and NVSwitch hop,
# no read latency measured. Other parts: no measurement read (None: the caller prices what it priced before).
PEER_COPY_LATENCY_S = 2.78e-6
PEER_COPY = {
    (90, 18): PeerCopy(
        395.05,
        "nvbandwidth v0.10 device_to_device_memcpy_read_ce, 8 x H100 80GB HBM3: 56 pairs 394.9-395.1 GB/s "
        "(Azure/cluster-health-monitor testdata/nvbandwidth_peer_report.json); 2.78 us a copy, cuda-samples "
        "p2pBandwidthLatencyTest P2P=Enabled (P2P Writes) latency, 4-byte copies, 8 x H100 80GB HBM3 (median of 56 "
        "pairs; a report in the search tool's stored index, no public address known), taken as a read's",
        PEER_COPY_LATENCY_S,
        8,
    ),
}


def peer_copy(gpu: GPUSpec) -> PeerCopy | None:
    """The measured copy-engine pull from one NVLink peer of ``gpu``'s kind (PEER_COPY), or None where none was
    measured; where the peers sit is the caller's to check (PeerCopy.reaches)."""
    return PEER_COPY.get((gpu.sm, gpu.nvlink_links))
