"""Calibration from a user's profiler trace: the kernel model's few compute constants refitted for the trace's
GPU, every measured kernel before and after, and the trace's collectives against the plan's ledger.

The constants and how (planner/kernel_fit.py's procedure, the one bench/kernel_fit.py runs on aiconfigurator's
tables):

- **The clock, the GEMM ceiling per dtype and the GEMM fixed cost**: every host GEMM operator with recorded shapes
  (profile_trace.gemm_shape) is one point, its measured time the sum of the kernels it launched (a split-K GEMM's
  reduction included); the grid chooses ``gemm_fixed_s`` with each dtype's median centred out. A trace records no
  clock, and a GEMM's time goes as 1 / (clock x ceiling): where a measured table gives the GPU a ceiling for a
  dtype (kernels.tabled_ceiling: the part's own or its generation's GEMM_CEILING, measured at known clocks), that
  ceiling is kept and the median of those GEMMs fits the tensor ``clock`` (a fraction of the datasheet clock,
  kernels.clock_fraction); a dtype without one
  (tf32 on an A100) fits its own ceiling at that clock. k0 and SM fill, shape terms a trace's few shapes cannot
  separate, stay the tables'. torch._grouped_mm points (profile_trace.grouped_shape) are predicted and shown, not
  fitted: their main loop is GROUPED_GEMM_K0's.
- **Fused attention ceilings**: every cuDNN or FlashAttention forward and backward operator with recorded shapes
  (profile_trace.attention_shape) is one point at the fitted clock; each (kernel, pass) ceiling is scaled to its
  median with s0 kept (one sequence length cannot separate them).
- **HBM fraction and per-kernel cost**: every elementwise operator that launched one contiguous (vectorised)
  kernel, with its bytes (profile_trace.elementwise_bytes), is one point of ``bytes / (hbm_GBps x hbm) + kernel_s``
  (kernels.memory_kernel); a grid chooses ``hbm`` on those moving at least HBM_MIN_BYTES, then ``kernel_s`` on all.
  Strided ones (STRIDED_KERNEL) are shown, not fitted.

- **The host's time per launch** (``host_launch_s``, the two queues' c of planner/host.py): where the host is the
  bound, the GPU idle until each launch reaches it (a kernel that starts within HOST_BOUND_LAG_S of its launch
  call's return), the time between two such consecutive launches of one thread is the host's own per launch: the
  median of those gaps (host_launch). A gap over a call that may wait for the GPU is left out; with fewer than
  MIN_HOST_GAPS the trace is GPU-bound (the host keeps ahead, and its gaps may be the GPU's pace: a full launch
  queue blocks the call) and the constant keeps its default.

A group with fewer than ``MIN_POINTS`` points keeps its defaults and says so. "Before" predictions are at the GPU
as the plan runs it (the sustained clock under its power limit), "after" at the fitted clock.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from itertools import pairwise
from statistics import fmean, median, quantiles

from collectives.primitives import Op, busbw_factor
from collectives.topology.gpu import GPUSpec

from .kernel_fit import class_scales, fit_grid, log_errors
from .kernels import (
    DATASHEET_CLOCK_MHZ,
    GROUPED_GEMM_K0,
    KERNEL_CONSTANTS,
    Efficiency,
    attention_ceiling,
    causal_keys,
    clock_fraction,
    core_attention_flops,
    efficiency,
    flash_attention_s,
    gemm_ceiling,
    gemm_time,
    generation,
    group_rows,
    memory_kernel,
    sustained_clock,
    tabled_ceiling,
)
from .profile_trace import (
    HostLaunch,
    Trace,
    attention_shape,
    elementwise_bytes,
    gemm_dtype,
    gemm_shape,
    grouped_shape,
    value_head_dim,
)
from .words import human_seconds, sig3

MIN_POINTS = 3
OPS_BY_VALUE = {op.value: op for op in Op}  # a traced collective's op ("allreduce"...) as the Op busbw_factor takes
FIXED_GRID_S = (1e-6, 2e-6, 3e-6, 4e-6, 5e-6, 6e-6, 8e-6, 10e-6, 12e-6, 16e-6)
HBM_GRID = tuple(round(0.3 + 0.025 * i, 3) for i in range(29))  # 0.3 .. 1.0
KERNEL_GRID_S = (1e-6, 1.5e-6, 2e-6, 2.5e-6, 3e-6, 4e-6, 5e-6, 6e-6, 8e-6, 10e-6)
CEILING_RANGE = KERNEL_CONSTANTS["gemm_ceiling"]  # what a request may hand back (cluster.calibration.kernels)
ATTENTION_RANGE = KERNEL_CONSTANTS["attention_ceiling"]
CLOCK_RANGE = KERNEL_CONSTANTS["clock"]
# The GEMM fit alternates the fixed cost (by grid, at a clock) and the clock (at a fixed cost) until the fixed cost
# repeats, and steps the clock until it moves less than CLOCK_TOLERANCE: a fit that does not depend on the clock it
# starts from (sus12: from 0.852 or 0.798 of the datasheet clock, the H200 MoE trace fitted 4 us / 1.0145 and
# 5 us / 1.0374 with one grid and three clock steps; both 4 us / 1.0185 now). Bounds on the loops, not tuned.
FIT_ROUNDS = 4
CLOCK_STEPS = 20
CLOCK_TOLERANCE = 1e-4
# constant_text's range: a fraction and a time shown as digits between these, a bound in words past them (the
# constants' own ranges, KERNEL_CONSTANTS, are well inside: fractions 0.05-6.4, times 1 us-100 us)
SHOWN_FRACTION = (1e-6, 1e6)
SHOWN_S_MAX = 1e3  # below 1 ns human_seconds writes "< 1 ns"
MAX_ROWS = 100  # per kernel group, the largest total time first
MAX_UNCLASSIFIED = 20  # kernel names listed by unclassified(), the most time first
GROUPS = ("gemm", "grouped_gemm", "attention", "memory", "memory_strided")
# PyTorch's elementwise loops (aten/src/ATen/native/cuda/CUDALoops.cuh gpu_kernel_impl_nocast, 2.x): when every
# operand is contiguous, launch_vectorized_kernel (``vectorized_elementwise_kernel<...>``: 16-byte loads);
# otherwise launch_legacy_kernel<128, unroll> (``elementwise_kernel<128, 4, ...>``), one element per thread through
# an OffsetCalculator. The planner's memory-bound kernels stream contiguous tensors at ``hbm``; the strided ones
# (a chunk's strided halves, a transpose, rotary's slices) run far below it (the H200 Llama-3 8B trace: 0.28-0.46
# of HBM against 0.91-0.93 for the vectorised kernels of the same sizes), so they are shown, not fitted.
# The HBM fraction is fitted on kernels that move more than any L2 holds (H100/H200 50 MB, A100 40 MB: the
# architecture whitepapers), so their bytes come from HBM; smaller ones fit the per-kernel cost.
HBM_MIN_BYTES = 64 << 20
STRIDED_KERNEL = re.compile(r"(?<![A-Za-z_])elementwise_kernel(?:_manual_unroll)?<")  # the latter: with a cast
# A kernel that starts this soon after its launch call returns found the GPU idle, waiting for it: the launch
# latency on an empty queue. The H200 Megatron-Core MoE trace (tests/reference/kernels/h200/trace_megatron_qwen3_30b
# .ep8_alltoall_T8192) starts 80% of its kernels 1.4-2.6 us after their calls return; a kernel queued behind work
# waits for it (its 9th decile 17.9 us; the dense H200 trace's ms). 5 us or 10 us move its median gap by under 1%.
HOST_BOUND_LAG_S = 5e-6
# The median of 20 gaps has its 95% confidence interval between the 6th and the 15th of them (binomial order
# statistics): fewer, and host_launch_s keeps its default.
MIN_HOST_GAPS = 20


@dataclass(frozen=True)
class GemmPoint:
    op: str
    m: int
    n: int
    k: int
    groups: int
    dtype: str
    measured_s: float
    grouped: bool = False  # torch._grouped_mm: m is the mean rows per group
    ragged: bool = False  # its weight gradient: each group's own K (the mean is k)

    @property
    def inputs(self) -> tuple:
        return self.m, self.n, self.k, self.groups, self.dtype, self.grouped, self.ragged

    @property
    def group(self) -> str:
        return "grouped_gemm" if self.grouped else "gemm"

    @property
    def shape(self) -> tuple:
        return self.m, self.n, self.k, self.groups


@dataclass(frozen=True)
class AttentionPoint:
    op: str
    kernel: str  # kernels.ATTENTION_CEILING's name: cudnn, flash2
    backward: bool
    flops: float  # the forward's FLOPs over the attended keys (kernels.core_attention_flops)
    s_kv: int
    shape: tuple  # batch, query heads, query length, key length, head dim
    measured_s: float  # the operator's attention kernels (the backward's 3)
    group = "attention"
    dtype = "bf16"

    @property
    def inputs(self) -> tuple:
        return self.kernel, self.backward, self.flops, self.s_kv, self.shape[4]

    @property
    def key(self) -> str:
        return f"{self.kernel}_{'bwd' if self.backward else 'fwd'}"


@dataclass(frozen=True)
class MemoryPoint:
    op: str
    nbytes: int
    measured_s: float
    strided: bool = False  # PyTorch's legacy elementwise_kernel: an operand is not contiguous (STRIDED_KERNEL)
    dtype = ""

    @property
    def group(self) -> str:
        return "memory_strided" if self.strided else "memory"

    @property
    def shape(self) -> tuple:
        return (self.nbytes,)

    @property
    def inputs(self) -> tuple:
        return self.op, self.nbytes


@dataclass(frozen=True)
class HostFit:
    """The host's time per launch read off a trace's launch calls (host_launch)."""

    launches: int  # kernel launch calls matched with their kernel (profile_trace.HostLaunch)
    host_bound: int  # of them, kernels that started within HOST_BOUND_LAG_S of their call's return
    gaps: int  # the gaps read: consecutive host-bound launches of one thread, no wait between
    host_launch_s: float | None  # their median; None with fewer than MIN_HOST_GAPS
    quartiles_s: tuple[float, float] | None  # their 25th and 75th percentiles
    mean_s: float | None  # their mean (a few long gaps, the framework's Python between launches, lift it)

    def as_dict(self) -> dict:
        return {
            "launches": self.launches,
            "host_bound": self.host_bound,
            "gaps": self.gaps,
            "host_launch_s": self.host_launch_s,
            "quartiles_s": list(self.quartiles_s) if self.quartiles_s else None,
            "mean_s": self.mean_s,
            "lag_s": HOST_BOUND_LAG_S,
        }


@dataclass(frozen=True)
class TraceFit:
    efficiency: Efficiency  # the defaults with the fitted constants
    gpu: GPUSpec  # the GPU with the fitted constants (kernel_constants: the clock among them)
    constants: dict  # what was fitted: name -> value (gemm_ceiling by dtype, attention_ceiling by kernel_pass)
    kernels: list[dict]  # per class: count, seconds per step, share
    rows: list[dict]  # GEMM, attention and memory points grouped by shape: measured, before, after
    median_error_before: dict  # by group (GROUPS): median |before / measured - 1|
    median_error_after: dict
    warnings: list[str]
    unclassified: list[dict]  # kernels no class names: name, count, seconds per step
    host: HostFit | None = None  # the host's time per launch (host_launch)


def gemm_points(trace: Trace) -> list[GemmPoint]:
    by_op: dict[int, list] = {}
    for k in trace.kernels:
        if k.kind == "gemm" and k.op_index >= 0:
            by_op.setdefault(k.op_index, []).append(k)
    out = []
    for i, launched in by_op.items():
        op = trace.ops[i]
        shape, grouped = gemm_shape(op), grouped_shape(op)
        dtype = gemm_dtype(op, [k.name for k in launched]) if shape or grouped else None
        seconds = sum(k.dur_s for k in launched)
        if dtype and seconds > 0:
            if shape:
                out.append(GemmPoint(op.name, *shape, dtype, seconds))
            elif grouped:
                m, n, k, groups, ragged = grouped
                out.append(GemmPoint(op.name, m, n, k, groups, dtype, seconds, True, ragged))
    return out


def attention_points(trace: Trace) -> list[AttentionPoint]:
    """Each fused attention operator with recorded shapes: its attention kernels' time against its FLOPs."""
    by_op: dict[int, float] = {}
    for k in trace.kernels:
        if k.kind == "attention" and k.op_index >= 0:
            by_op[k.op_index] = by_op.get(k.op_index, 0.0) + k.dur_s
    out = []
    for i, seconds in by_op.items():
        found = attention_shape(trace.ops[i])
        if found is None or seconds <= 0:
            continue
        kernel, backward, b, heads, s_q, s_kv, d, causal = found
        keys = causal_keys(s_kv, None) if causal and s_q == s_kv else s_kv
        flops = core_attention_flops(b, s_q, keys, heads, d, value_head_dim(trace.ops[i]) or d)
        out.append(AttentionPoint(trace.ops[i].name, kernel, backward, flops, s_kv, (b, heads, s_q, s_kv, d), seconds))
    return out


def memory_points(trace: Trace) -> list[MemoryPoint]:
    by_op: dict[int, list] = {}
    for k in trace.kernels:
        if k.op_index >= 0:
            by_op.setdefault(k.op_index, []).append(k)
    out = []
    for i, launched in by_op.items():
        if len(launched) != 1 or launched[0].kind != "memory" or launched[0].dur_s <= 0:
            continue
        nbytes = elementwise_bytes(trace.ops[i])
        if nbytes:
            strided = bool(STRIDED_KERNEL.search(launched[0].name))
            out.append(MemoryPoint(trace.ops[i].name, nbytes, launched[0].dur_s, strided))
    return out


def host_bound(launch: HostLaunch) -> bool:
    """Its kernel found the GPU idle: it started within HOST_BOUND_LAG_S of the call's return."""
    return launch.kernel_start_s - launch.end_s <= HOST_BOUND_LAG_S


def host_gaps(launches: tuple[HostLaunch, ...]) -> list[float]:
    """Start to start of each two consecutive launches (by their calls' start) of one thread, both host-bound, with
    no call that may wait for the GPU between: the host's own time for the second launch and what its thread did
    since the first (the framework's code, the operator's dispatch, a memset's or copy's call)."""
    return [
        b.start_s - a.start_s
        for a, b in pairwise(launches)
        if a.thread == b.thread and not b.after_wait and host_bound(a) and host_bound(b)
    ]


def host_launch(trace: Trace) -> HostFit:
    """The host's time per launch: the median of host_gaps where at least MIN_HOST_GAPS were read."""
    gaps = sorted(host_gaps(trace.launches))
    bound = sum(1 for launch in trace.launches if host_bound(launch))
    if len(gaps) < MIN_HOST_GAPS:
        return HostFit(len(trace.launches), bound, len(gaps), None, None, None)
    q = quantiles(gaps, n=4)
    ns = lambda x: round(x, 9)  # noqa: E731  (Kineto's clock: microseconds with three decimals)
    return HostFit(len(trace.launches), bound, len(gaps), ns(median(gaps)), (ns(q[0]), ns(q[2])), ns(fmean(gaps)))


def predict_gemm(p: GemmPoint, gpu: GPUSpec, eff: Efficiency) -> float:
    """As kernels.gemm_kernels prices it: a grouped GEMM's groups at their multinomial spread about the mean
    (group_rows, sd sqrt(m)) on the ptr-array kernel's GROUPED_GEMM_K0; its ragged-K weight gradient at the mean K."""
    if not p.grouped:
        return gemm_time((float(p.m),) * p.groups, float(p.n), float(p.k), p.dtype, gpu, eff)
    rows = (float(p.m),) * p.groups if p.ragged else group_rows(float(p.m), math.sqrt(p.m), p.groups)
    return gemm_time(rows, float(p.n), float(p.k), p.dtype, gpu, eff, GROUPED_GEMM_K0)


def predict_attention(p: AttentionPoint, gpu: GPUSpec, eff: Efficiency) -> float:
    forward, backward = flash_attention_s(p.flops, p.s_kv, p.kernel, gpu, eff, head_dim=p.shape[4])
    return backward if p.backward else forward


def predict_memory(p: MemoryPoint, gpu: GPUSpec, eff: Efficiency) -> float:
    return memory_kernel(p.op, p.nbytes, gpu, eff).time_s


PREDICT = {
    "gemm": predict_gemm,
    "grouped_gemm": predict_gemm,
    "attention": predict_attention,
    "memory": predict_memory,
    "memory_strided": predict_memory,
}


def with_clock(gpu: GPUSpec, clock: float) -> GPUSpec:
    """``gpu`` running its tensor work at ``clock`` of the datasheet clock (kernels.clock_fraction reads it)."""
    return replace(gpu, kernel_constants=tuple(sorted(dict(gpu.kernel_constants, clock=clock).items())))


def fit_trace(trace: Trace, gpu: GPUSpec, base: Efficiency | None = None) -> TraceFit:
    """The constants of ``base`` (default: the GPU's own, kernels.gpu_efficiency) refitted on ``trace`` for ``gpu``
    (module docstring)."""
    base = efficiency(gpu, base)
    warnings = device_warnings(trace, gpu)
    if trace.steps_from == "none":
        warnings.append(
            "no ProfilerStep#N annotations and the kernels do not repeat: the per-step figures are the whole "
            "trace's; call prof.step() each step or give trace_steps"
        )
    gemms, mems_all, attns = gemm_points(trace), memory_points(trace), attention_points(trace)
    plain = [p for p in gemms if not p.grouped]
    mems = [p for p in mems_all if not p.strided]
    eff, fitted_gpu, constants = base, gpu, {}
    if len(plain) >= MIN_POINTS:
        eff, fitted_gpu, constants = _fit_gemms(plain, gpu, eff, warnings)
    else:
        advice = "too few ran (GEMM_OPERANDS: aten::mm, addmm, bmm, baddbmm, matmul, linear, _scaled_mm)"
        warnings.append(
            f"{len(plain)} GEMM operators with recorded shapes (at least {MIN_POINTS} fit the clock and the GEMM "
            f"constants): {advice if trace.record_shapes else 'profile with record_shapes=True'}; the GEMM "
            "constants keep their defaults"
        )
    if attns:
        eff, fitted = _fit_attention(attns, fitted_gpu, eff, warnings)
        if fitted:
            constants["attention_ceiling"] = fitted
    if len(mems) >= MIN_POINTS:
        eff = _fit_memory(mems, gpu, eff)
        constants |= {"hbm": eff.hbm, "kernel_s": eff.kernel_s}
        for name, value, grid_ in (("hbm", eff.hbm, HBM_GRID), ("kernel_s", eff.kernel_s, KERNEL_GRID_S)):
            if value in (grid_[0], grid_[-1]):
                low, high = constant_text(name, grid_[0]), constant_text(name, grid_[-1])
                warnings.append(f"{name} = {constant_text(name, value)} is an end of its range ({low} .. {high})")
    else:
        warnings.append(
            f"{len(mems)} contiguous elementwise operators with recorded shapes (at least {MIN_POINTS} fit the HBM "
            "fraction and the per-kernel cost): they keep their defaults"
        )
    host = host_launch(trace)
    if host.host_launch_s is not None:
        c = _clipped("host_launch_s", host.host_launch_s, KERNEL_CONSTANTS["host_launch_s"], warnings)
        eff = replace(eff, host_launch_s=c, host_launch_given=True)
        constants["host_launch_s"] = c
    warnings.append(host_warning(host))
    points = [*gemms, *attns, *mems_all]
    missing, summary = unclassified(trace), kernel_summary(trace)
    warnings += coverage_warnings(summary, missing)
    return TraceFit(
        eff,
        fitted_gpu,
        constants,
        summary,
        _rows(points, (gpu, base), (fitted_gpu, eff)),
        _median_errors(points, gpu, base),
        _median_errors(points, fitted_gpu, eff),
        warnings,
        missing,
        host,
    )


def coverage_warnings(summary: list[dict], missing: list[dict]) -> list[str]:
    """What of the kernel time the model does not cover: the convolutions (profile_trace KERNEL_CLASSES "conv":
    cuDNN/MIOpen, which a transformer's plan has none of) and the kernels no class names, by their counts (every
    one, not only the listed names: MAX_UNCLASSIFIED)."""
    by = {row["kind"]: row for row in summary}
    out = []
    if "conv" in by:
        conv = by["conv"]
        out.append(
            f"{conv['count']:,} kernels ({conv['share']:.1%} of the kernel time) are convolutions (cuDNN, MIOpen), "
            "which the planner does not model: counted and timed, not fitted; a transformer's plan has none"
        )
    if missing:
        other = by["other"]
        out.append(
            f"{other['count']:,} kernels ({other['share']:.1%} of the kernel time) have no class "
            f"(profile_trace.KERNEL_CLASSES): {', '.join(r['name'][:60] for r in missing[:3])}; see unclassified"
        )
    return out


def host_warning(host: HostFit) -> str:
    """What the host's time per launch rests on, or why the trace gives none."""
    if host.host_launch_s is not None:
        return (
            f"host_launch_s ({host.host_launch_s * 1e6:.1f} us, the median of {host.gaps} gaps) was read with the "
            "profiler on, which adds host time to every operator (this project's H200 host: tiny ops 10.1 us "
            "without it, 15.6-17.4 us with it): without it the host launches faster"
        )
    if not host.launches:
        return (
            "no kernel launch calls (cudaLaunchKernel, cuLaunchKernel...) with their kernels' correlation: profile "
            "with ProfilerActivity.CPU and CUDA; host_launch_s keeps its default"
        )
    return (
        f"{host.gaps} gaps between host-bound launches ({host.host_bound} of {host.launches} launches found the GPU "
        f"idle; at least {MIN_HOST_GAPS} gaps fit host_launch_s): the GPU stays ahead of the host's launches "
        "(GPU-bound), so the trace does not show the host's time per launch; host_launch_s keeps its default"
    )


def _measured(p) -> float:
    return p.measured_s


def _same(p) -> tuple:
    """What a prediction depends on: the point less its measured time."""
    return p.inputs


def _fit_clock(tabled, gpu: GPUSpec, eff: Efficiency, clock: float) -> float:
    """The tensor clock at which ``tabled`` (GEMMs of a dtype with a measured ceiling) sit at their median: the
    clock scaled by predicted / measured until it moves less than CLOCK_TOLERANCE (the fixed cost and the HBM bound
    make the time not quite 1 / clock)."""
    for _ in range(CLOCK_STEPS):
        at = with_clock(gpu, clock)
        scale = class_scales(
            log_errors(tabled, eff, lambda p, e, at=at: predict_gemm(p, at, e), _measured, None, _same)
        )[None]
        clock *= scale
        if abs(scale - 1) < CLOCK_TOLERANCE or not CLOCK_RANGE[0] / 10 <= clock <= CLOCK_RANGE[1] * 10:
            break  # settled, or well outside what the fit may keep (_clipped says so): it ran to inf (review r14d #2)
    return clock


def _fit_gemms(gemms, gpu, eff, warnings) -> tuple[Efficiency, GPUSpec, dict]:
    """The fixed cost by grid with each dtype's ceiling centred out and the clock on the dtypes the generation has a
    measured ceiling for, alternately until the fixed cost repeats (FIT_ROUNDS); then the other dtypes' ceilings at
    that clock, each scaled to its median (three rounds: the fixed cost and the HBM bound make the time not quite
    1 / (clock x ceiling))."""
    gen = generation(gpu)
    tabled = [p for p in gemms if tabled_ceiling(gpu, p.dtype) is not None]
    clock, fixed = clock_fraction(gpu, "bf16"), None
    for _ in range(FIT_ROUNDS):  # the fixed cost is chosen at a clock, the clock at a fixed cost: until both settle
        at = with_clock(gpu, clock)
        grid = [replace(eff, gemm_fixed_s=s) for s in FIXED_GRID_S]
        _, eff = fit_grid(gemms, grid, lambda p, e, at=at: predict_gemm(p, at, e), _measured, _dtype, _same)
        clock = _fit_clock(tabled, gpu, eff, clock) if tabled else clock
        if not tabled or eff.gemm_fixed_s == fixed:
            break
        fixed = eff.gemm_fixed_s
    constants: dict = {"gemm_fixed_s": eff.gemm_fixed_s}
    if tabled:
        clock = _clipped("clock", clock, CLOCK_RANGE, warnings)
        gpu = with_clock(gpu, clock)
        constants["clock"] = round(clock, 4)
        sustained = clock_fraction(replace(gpu, kernel_constants=()), "bf16")
        if clock > 1.05 * sustained and gen in DATASHEET_CLOCK_MHZ:
            mhz = DATASHEET_CLOCK_MHZ[gen]
            warnings.append(
                f"the trace's GEMMs ran at {clock:.3f} of the datasheet clock ({clock * mhz:,.0f} MHz of {mhz:,}), "
                f"above the {sustained:.3f} ({sustained * mhz:,.0f} MHz) a training step sustains under the power "
                f"cap ({sustained_clock(gpu)[2]}): a few profiled steps run "
                "before the cap pulls the clock down. A plan with this clock is the burst's; profile after ~30 s of "
                "training, or drop calibration.kernels.clock to plan at the sustained clock"
            )
    rest = [p for p in gemms if tabled_ceiling(gpu, p.dtype) is None]
    ceilings = {d: gemm_ceiling(gpu, d, eff) for d in sorted({p.dtype for p in rest})}
    for _ in range(3 if ceilings else 0):
        trial = replace(eff, gemm_ceilings=tuple(ceilings.items()))
        scales = class_scales(log_errors(rest, trial, lambda p, e: predict_gemm(p, gpu, e), _measured, _dtype, _same))
        ceilings = {d: c * scales[d] for d, c in ceilings.items()}
    ceilings = {d: _clipped(f"gemm_ceiling.{d}", c, CEILING_RANGE, warnings) for d, c in ceilings.items()}
    if ceilings:
        eff = replace(eff, gemm_ceilings=tuple(ceilings.items()))
        constants["gemm_ceiling"] = {d: round(c, 4) for d, c in ceilings.items()}
    return eff, gpu, constants


def _fit_memory(mems, gpu, eff) -> Efficiency:
    """``hbm`` (with ``kernel_s``) on the kernels that stream more than HBM_MIN_BYTES (the tables' way: the HBM
    fraction from big copies), then ``kernel_s`` on all; with fewer than MIN_POINTS big ones, both on all."""
    predict = lambda p, e: predict_memory(p, gpu, e)  # noqa: E731
    big = [p for p in mems if p.nbytes >= HBM_MIN_BYTES]
    if len(big) < MIN_POINTS:
        grid = [replace(eff, hbm=h, kernel_s=s) for h in HBM_GRID for s in KERNEL_GRID_S]
        return fit_grid(mems, grid, predict, _measured, same=_same)[1]
    grid = [replace(eff, hbm=h, kernel_s=s) for h in HBM_GRID for s in KERNEL_GRID_S]
    _, eff = fit_grid(big, grid, predict, _measured, same=_same)
    return fit_grid(mems, [replace(eff, kernel_s=s) for s in KERNEL_GRID_S], predict, _measured, same=_same)[1]


def _fit_attention(points, gpu, eff, warnings) -> tuple[Efficiency, dict]:
    """Each (kernel, pass) ceiling with at least MIN_POINTS points scaled to its median at ``gpu``'s clock."""
    by: dict[str, list] = {}
    for p in points:
        by.setdefault(p.key, []).append(p)
    fitted = {}
    for key, group in sorted(by.items()):
        if len(group) < MIN_POINTS:
            warnings.append(f"{len(group)} {key} attention operators (at least {MIN_POINTS} fit its ceiling): kept")
            continue
        kernel, _, direction = key.rpartition("_")
        c = attention_ceiling(kernel, gpu, eff)[direction == "bwd"]
        for _ in range(3):
            trial = replace(eff, attention_ceilings=tuple(sorted({**dict(eff.attention_ceilings), key: c}.items())))
            errors = log_errors(group, trial, lambda p, e: predict_attention(p, gpu, e), _measured, None, _same)
            c *= class_scales(errors)[None]
        fitted[key] = round(_clipped(f"attention_ceiling.{key}", c, ATTENTION_RANGE, warnings), 4)
    if fitted:
        eff = replace(eff, attention_ceilings=tuple(sorted({**dict(eff.attention_ceilings), **fitted}.items())))
    return eff, fitted


def constant_text(name: str, value) -> str:
    """A fitted constant as users read it: seconds (a name ending _s: gemm_fixed_s, kernel_s, host_launch_s) in
    human units, a fraction to 4 digits, a group by key ("fp32 1, tf32 0.6247"): never 1e-06 (the CLI printed
    ``kernel_s = 1e-06`` and the warnings ``host_launch_s = 0.000`` before traces14)."""
    if isinstance(value, dict):
        return ", ".join(f"{key} {constant_text(key, v)}" for key, v in value.items())
    if not math.isfinite(value):
        return sig3(value)
    if name.endswith("_s"):
        # past the words' range a bound, never a 300-digit decimal (review r14d #2: constant_text of 1e-300)
        return human_seconds(value) if abs(value) < SHOWN_S_MAX else "more than 1,000 s"
    if abs(value) >= SHOWN_FRACTION[1]:
        return "more than 1,000,000"
    if 0 < abs(value) < SHOWN_FRACTION[0]:
        return "under 0.000001"
    text = sig3(value, 4)  # fractions: 0.05-6.4; 4 digits as ":.4g" wrote them, never its exponent (1e-05)
    return text.rstrip("0").rstrip(".") if "." in text else text


def _clipped(name: str, value: float, bounds: tuple, warnings: list[str]) -> float:
    low, high = bounds
    if not low / 10 <= value <= high * 10:  # inf, NaN, or run away (_fit_clock stops there): no fit to clip
        kept = low if math.isnan(value) or value < low else high
        warnings.append(
            f"the {name} fit failed: it ran to {constant_text(name, value)}, past 10x its range "
            f"{constant_text(name, low)} .. {constant_text(name, high)}; {name} = {constant_text(name, kept)} kept, "
            "its bound; check that the trace's kernel durations are a profiler's microseconds"
        )
        return kept
    if not low <= value <= high:
        shown = (constant_text(name, x) for x in (value, low, high))
        warnings.append("{} = {} is outside {} .. {}: clipped".format(name, *shown))
    return min(high, max(low, value))


def _dtype(p: GemmPoint) -> str:
    return p.dtype


def _rows(points, before: tuple, after: tuple) -> list[dict]:
    """The points grouped by (group, op, shape, dtype): measured median, predicted before and after ((gpu, eff)
    each), the most total time first, at most MAX_ROWS per group."""
    groups: dict[tuple, list] = {}
    for p in points:
        groups.setdefault((p.group, p.op, p.shape, p.dtype), []).append(p)
    rows = []
    for (kind, op, shape, dtype), same in groups.items():
        predict = PREDICT[kind]
        rows.append(
            {
                "kind": kind,
                "op": op,
                "shape": list(shape),
                "dtype": dtype,
                "count": len(same),
                "measured_s": median(p.measured_s for p in same),
                "before_s": predict(same[0], *before),
                "after_s": predict(same[0], *after),
                "_total": sum(p.measured_s for p in same),
            }
        )
    rows.sort(key=lambda r: -r["_total"])
    out, kept = [], dict.fromkeys(GROUPS, 0)
    for r in rows:
        if kept[r["kind"]] < MAX_ROWS:
            kept[r["kind"]] += 1
            del r["_total"]
            out.append(r)
    return out


def _median_errors(points, gpu, eff) -> dict:
    by: dict[str, list[float]] = {}
    for p in points:
        by.setdefault(p.group, []).append(abs(PREDICT[p.group](p, gpu, eff) / p.measured_s - 1))
    return {g: median(by[g]) for g in GROUPS if g in by}


def unclassified(trace: Trace) -> list[dict]:
    """The kernels no class names (KERNEL_CLASSES, OP_CLASSES): by name, the most time first."""
    by: dict[str, list] = {}
    for k in trace.kernels:
        if k.kind == "other":
            by.setdefault(k.name, [0, 0.0])
            by[k.name][0] += 1
            by[k.name][1] += k.dur_s
    ranked = sorted(by.items(), key=lambda item: -item[1][1])[:MAX_UNCLASSIFIED]
    return [{"name": n[:300], "count": c, "seconds_per_step": t / trace.steps} for n, (c, t) in ranked]


def kernel_summary(trace: Trace) -> list[dict]:
    """Per kernel class: launches and seconds per profiled step, and the share of the kernels' time."""
    by: dict[str, list] = {}
    for k in trace.kernels:
        by.setdefault(k.kind, [0, 0.0])
        by[k.kind][0] += 1
        by[k.kind][1] += k.dur_s
    total = sum(t for _, t in by.values()) or 1.0
    order = ("gemm", "attention", "conv", "memory", "copy", "nccl", "other")
    return [
        {
            "kind": kind,
            "count": by[kind][0],
            "per_step": by[kind][0] / trace.steps,
            "seconds_per_step": by[kind][1] / trace.steps,
            "share": by[kind][1] / total,
        }
        for kind in order
        if kind in by
    ]


def device_warnings(trace: Trace, gpu: GPUSpec) -> list[str]:
    """The trace's GPU (deviceProperties) against the cluster's: another family or SM count makes the fit
    another GPU's."""
    out = []
    family = re.search(r"[A-Z]+\d+", gpu.name.upper())
    if trace.device and family and family.group(0) not in trace.device.upper():
        out.append(f"the trace ran on {trace.device!r}; the constants are fitted for the cluster's GPU {gpu.name!r}")
    if trace.sms and gpu.sms and trace.sms != gpu.sms:
        out.append(f"the trace's GPU has {trace.sms} SMs, the cluster's {gpu.name} {gpu.sms}")
    if not trace.device:
        out.append("the trace has no deviceProperties: its GPU is taken to be the cluster's")
    return out


# ---- collectives against the ledger -------------------------------------------------------------------------


def trace_stage(trace: Trace, world_size: int, pp: int) -> int:
    """The pipeline stage of the traced rank under Megatron-Core's rank order (pp slowest); 0 when the trace
    does not say its rank or ran on another world size."""
    if trace.rank is None or trace.world_size != world_size or pp <= 1:
        return 0
    return min(pp - 1, trace.rank // (world_size // pp))


def compare_collectives(trace: Trace, plan=None, stage: int | None = None) -> tuple[list[dict], int | None, list[str]]:
    """The trace's NCCL kernels by (op, message bytes) against the plan's ledger rows of the traced rank's
    stage: calls per step and seconds per call on both sides; (rows, that stage, warnings). Bytes are matched
    where the trace records them (Kineto's "In msg nelems"), else rows are by op (counts and times only).
    Without a plan, the trace's side alone."""
    warnings = []
    calls = plan.calls if plan is not None else []
    if plan is not None:
        pp = max((max(pc.call.stages, default=0) for pc in calls), default=0) + 1
        stage = trace_stage(trace, plan.world_size, pp) if stage is None else stage
        if trace.world_size and trace.world_size != plan.world_size:
            warnings.append(f"the trace ran on {trace.world_size} ranks, the plan on {plan.world_size}")
    traced: dict[str, dict] = {}
    for k in trace.kernels:
        if k.kind == "nccl":
            traced.setdefault(k.collective, {}).setdefault(k.message_bytes, []).append(k)
    planned: dict[str, dict] = {}
    for pc in calls:
        c = pc.call
        if stage in c.stages:
            planned.setdefault(c.op.value, {}).setdefault(c.message_bytes, []).append(pc)
    rows = []
    for op in sorted(set(traced) | set(planned)):
        sizes_t, sizes_p = traced.get(op, {}), planned.get(op, {})
        by_size = sizes_t and None not in sizes_t
        keys = sorted(set(sizes_t) | set(sizes_p)) if by_size else [None]
        for size in keys:
            kernels = sizes_t.get(size, []) if by_size else [t for v in sizes_t.values() for t in v]
            calls = sizes_p.get(size, []) if by_size else [pc for v in sizes_p.values() for pc in v]
            rows.append(_collective_row(op, size, kernels, calls, trace.steps))
    return rows, stage, warnings


def _collective_row(op: str, size: int | None, kernels: list, calls: list, steps: int) -> dict:
    """One (op, message bytes) row: the trace's calls per step and seconds per call, its recorded group size
    (Kineto's "Group size", when every kernel of the row records the same one) and the bus bandwidth those give by
    nccl-tests' convention (message bytes / seconds x busbw_factor: collectives.primitives, doc/PERFORMANCE.md), a
    lower bound, since a kernel's time includes its wait for the slowest peer; the plan's calls and price."""
    times = [k.dur_s for k in kernels]
    groups = {k.group_size for k in kernels}
    group = groups.pop() if len(groups) == 1 else None
    per_call = sum(times) / len(times) if times else None
    busbw = None
    if per_call and size and group and op in OPS_BY_VALUE:
        busbw = size / per_call * busbw_factor(OPS_BY_VALUE[op], group) / 1e9
        busbw = busbw if math.isfinite(busbw) else None  # a sub-ns kernel of an exabyte: no bandwidth to show
    n_plan = sum(pc.call.calls_per_iteration for pc in calls)
    return {
        "op": op,
        "message_bytes": size,
        "group_size": group,
        "trace_calls_per_step": len(times) / steps,
        "trace_s_per_call": per_call,
        "trace_busbw_GBps": busbw,
        "plan_calls_per_iteration": n_plan,
        "plan_s_per_call": (
            sum(pc.call.calls_per_iteration * pc.price.time_s for pc in calls) / n_plan if n_plan else None
        ),
        "plan_calls": sorted({pc.call.name for pc in calls})[:8],
    }


__all__ = [
    "HostFit",
    "TraceFit",
    "compare_collectives",
    "fit_trace",
    "host_gaps",
    "host_launch",
    "kernel_summary",
    "trace_stage",
    "unclassified",
    "with_clock",
]
