"""Calibration from a user's profiler trace: the kernel model's few compute constants refitted for the trace's
GPU, every measured kernel before and after, and the trace's collectives against the plan's ledger.

The constants and how (planner/kernel_fit.py's procedure, the one bench/kernel_fit.py runs on aiconfigurator's
tables):

- **GEMM ceiling per dtype and the GEMM fixed cost**: every host GEMM operator with recorded shapes
  (profile_trace.gemm_shape) is one point, its measured time the sum of the kernels it launched (a split-K
  GEMM's reduction included); the grid chooses ``gemm_fixed_s``, each dtype's ceiling is its class's median
  (``gemm_ceilings``). k0 and SM fill, shape terms a trace's few shapes cannot separate, stay the tables'.
- **HBM fraction and per-kernel cost**: every elementwise operator that launched one kernel, with its bytes
  (profile_trace.elementwise_bytes), is one point of ``bytes / (hbm_GBps x hbm) + kernel_s``
  (kernels.memory_kernel); the grid chooses both.

A group with fewer than ``MIN_POINTS`` points keeps its defaults and says so. Predictions are at the GPU as the
plan runs it (sustained clock under its power limit), since a trace is measured under a training load.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from statistics import median

from collectives.topology.gpu import GPUSpec

from .kernel_fit import class_scales, fit_grid, log_errors
from .kernels import KERNEL_CONSTANTS, Efficiency, efficiency, gemm_ceiling, gemm_time, memory_kernel
from .profile_trace import Trace, elementwise_bytes, gemm_dtype, gemm_shape

MIN_POINTS = 3
FIXED_GRID_S = (1e-6, 2e-6, 3e-6, 4e-6, 5e-6, 6e-6, 8e-6, 10e-6, 12e-6, 16e-6)
HBM_GRID = tuple(round(0.3 + 0.025 * i, 3) for i in range(29))  # 0.3 .. 1.0
KERNEL_GRID_S = (1e-6, 1.5e-6, 2e-6, 2.5e-6, 3e-6, 4e-6, 5e-6, 6e-6, 8e-6, 10e-6)
CEILING_RANGE = KERNEL_CONSTANTS["gemm_ceiling"]  # what a request may hand back (cluster.calibration.kernels)
MAX_ROWS = 100  # per kernel group, the largest total time first


@dataclass(frozen=True)
class GemmPoint:
    op: str
    m: int
    n: int
    k: int
    groups: int
    dtype: str
    measured_s: float

    @property
    def inputs(self) -> tuple:
        return self.m, self.n, self.k, self.groups, self.dtype


@dataclass(frozen=True)
class MemoryPoint:
    op: str
    nbytes: int
    measured_s: float

    @property
    def inputs(self) -> tuple:
        return self.op, self.nbytes


@dataclass(frozen=True)
class TraceFit:
    efficiency: Efficiency  # the defaults with the fitted constants
    constants: dict  # what was fitted: name -> value (gemm_ceiling by dtype)
    kernels: list[dict]  # per class: count, seconds per step, share
    rows: list[dict]  # GEMM and memory points grouped by shape: measured, before, after
    median_error_before: dict  # by group (gemm, memory): median |before / measured - 1|
    median_error_after: dict
    warnings: list[str]


def gemm_points(trace: Trace) -> list[GemmPoint]:
    by_op: dict[int, list] = {}
    for k in trace.kernels:
        if k.kind == "gemm" and k.op_index >= 0:
            by_op.setdefault(k.op_index, []).append(k)
    out = []
    for i, launched in by_op.items():
        op = trace.ops[i]
        shape = gemm_shape(op)
        dtype = gemm_dtype(op, [k.name for k in launched]) if shape else None
        seconds = sum(k.dur_s for k in launched)
        if shape and dtype and seconds > 0:
            out.append(GemmPoint(op.name, *shape, dtype, seconds))
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
            out.append(MemoryPoint(trace.ops[i].name, nbytes, launched[0].dur_s))
    return out


def predict_gemm(p: GemmPoint, gpu: GPUSpec, eff: Efficiency) -> float:
    return gemm_time((float(p.m),) * p.groups, float(p.n), float(p.k), p.dtype, gpu, eff)


def predict_memory(p: MemoryPoint, gpu: GPUSpec, eff: Efficiency) -> float:
    return memory_kernel(p.op, p.nbytes, gpu, eff).time_s


def fit_trace(trace: Trace, gpu: GPUSpec, base: Efficiency | None = None) -> TraceFit:
    """The constants of ``base`` (default: the GPU's own, kernels.gpu_efficiency) refitted on ``trace`` for ``gpu``
    (module docstring)."""
    base = efficiency(gpu, base)
    warnings = device_warnings(trace, gpu)
    gemms, mems = gemm_points(trace), memory_points(trace)
    eff, constants = base, {}
    if len(gemms) >= MIN_POINTS:
        eff, constants = _fit_gemms(gemms, gpu, eff, warnings)
    else:
        warnings.append(
            f"{len(gemms)} GEMM operators with recorded shapes (at least {MIN_POINTS} fit the GEMM constants): "
            "profile with record_shapes=True; the GEMM constants keep their defaults"
        )
    if len(mems) >= MIN_POINTS:
        grid = [replace(eff, hbm=h, kernel_s=s) for h in HBM_GRID for s in KERNEL_GRID_S]
        _, eff = fit_grid(mems, grid, lambda p, e: predict_memory(p, gpu, e), _measured, same=_same)
        constants |= {"hbm": eff.hbm, "kernel_s": eff.kernel_s}
        for name, value, grid_ in (("hbm", eff.hbm, HBM_GRID), ("kernel_s", eff.kernel_s, KERNEL_GRID_S)):
            if value in (grid_[0], grid_[-1]):
                warnings.append(f"{name} = {value:g} is an end of its range ({grid_[0]:g} .. {grid_[-1]:g})")
    else:
        warnings.append(
            f"{len(mems)} elementwise operators with recorded shapes (at least {MIN_POINTS} fit the HBM fraction "
            "and the per-kernel cost): they keep their defaults"
        )
    rows = _rows(gemms, mems, gpu, base, eff)
    return TraceFit(
        eff,
        constants,
        kernel_summary(trace),
        rows,
        _median_errors(gemms, mems, gpu, base),
        _median_errors(gemms, mems, gpu, eff),
        warnings,
    )


def _measured(p) -> float:
    return p.measured_s


def _same(p) -> tuple:
    """What a prediction depends on: the point less its measured time."""
    return p.inputs


def _fit_gemms(gemms, gpu, eff, warnings) -> tuple[Efficiency, dict]:
    """The fixed cost by grid with each dtype's ceiling centred out, then each dtype's ceiling scaled to its
    median (three rounds: the fixed cost and the HBM bound make the time not quite 1 / ceiling)."""
    _, eff = fit_grid(
        gemms,
        [replace(eff, gemm_fixed_s=s) for s in FIXED_GRID_S],
        lambda p, e: predict_gemm(p, gpu, e),
        _measured,
        _dtype,
        _same,
    )
    ceilings = {d: gemm_ceiling(gpu, d, eff) for d in sorted({p.dtype for p in gemms})}
    for _ in range(3):
        trial = replace(eff, gemm_ceilings=tuple(ceilings.items()))
        scales = class_scales(log_errors(gemms, trial, lambda p, e: predict_gemm(p, gpu, e), _measured, _dtype, _same))
        ceilings = {d: c * scales[d] for d, c in ceilings.items()}
    low, high = CEILING_RANGE
    for d, c in ceilings.items():
        if not low <= c <= high:
            warnings.append(f"gemm_ceiling.{d} = {c:.3f} is outside {low} .. {high}: clipped")
            ceilings[d] = min(high, max(low, c))
    eff = replace(eff, gemm_ceilings=tuple(ceilings.items()))
    return eff, {"gemm_ceiling": {d: round(c, 4) for d, c in ceilings.items()}, "gemm_fixed_s": eff.gemm_fixed_s}


def _dtype(p: GemmPoint) -> str:
    return p.dtype


def _rows(gemms, mems, gpu, before: Efficiency, after: Efficiency) -> list[dict]:
    groups: dict[tuple, list] = {}
    for p in gemms:
        groups.setdefault(("gemm", p.op, (p.m, p.n, p.k, p.groups), p.dtype), []).append(p)
    for p in mems:
        groups.setdefault(("memory", p.op, (p.nbytes,), ""), []).append(p)
    rows = []
    for (kind, op, shape, dtype), points in groups.items():
        predict = predict_gemm if kind == "gemm" else predict_memory
        rows.append(
            {
                "kind": kind,
                "op": op,
                "shape": list(shape),
                "dtype": dtype,
                "count": len(points),
                "measured_s": median(p.measured_s for p in points),
                "before_s": predict(points[0], gpu, before),
                "after_s": predict(points[0], gpu, after),
                "_total": sum(p.measured_s for p in points),
            }
        )
    rows.sort(key=lambda r: -r["_total"])
    out, kept = [], {"gemm": 0, "memory": 0}
    for r in rows:
        if kept[r["kind"]] < MAX_ROWS:
            kept[r["kind"]] += 1
            del r["_total"]
            out.append(r)
    return out


def _median_errors(gemms, mems, gpu, eff) -> dict:
    out = {}
    for kind, points, predict in (("gemm", gemms, predict_gemm), ("memory", mems, predict_memory)):
        if points:
            out[kind] = median(abs(predict(p, gpu, eff) / p.measured_s - 1) for p in points)
    return out


def kernel_summary(trace: Trace) -> list[dict]:
    """Per kernel class: launches and seconds per profiled step, and the share of the kernels' time."""
    by: dict[str, list] = {}
    for k in trace.kernels:
        by.setdefault(k.kind, [0, 0.0])
        by[k.kind][0] += 1
        by[k.kind][1] += k.dur_s
    total = sum(t for _, t in by.values()) or 1.0
    order = ("gemm", "attention", "memory", "nccl", "other")
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
            traced.setdefault(k.collective, {}).setdefault(k.message_bytes, []).append(k.dur_s)
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
            times = sizes_t.get(size, []) if by_size else [t for v in sizes_t.values() for t in v]
            calls = sizes_p.get(size, []) if by_size else [pc for v in sizes_p.values() for pc in v]
            n_plan = sum(pc.call.calls_per_iteration for pc in calls)
            rows.append(
                {
                    "op": op,
                    "message_bytes": size,
                    "trace_calls_per_step": len(times) / trace.steps,
                    "trace_s_per_call": sum(times) / len(times) if times else None,
                    "plan_calls_per_iteration": n_plan,
                    "plan_s_per_call": (
                        sum(pc.call.calls_per_iteration * pc.price.time_s for pc in calls) / n_plan if n_plan else None
                    ),
                    "plan_calls": sorted({pc.call.name for pc in calls})[:8],
                }
            )
    return rows, stage, warnings


__all__ = ["TraceFit", "compare_collectives", "fit_trace", "kernel_summary", "trace_stage"]
