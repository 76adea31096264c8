"""The slowest GPU sets the pace (spread15, issue 20): a synchronous job runs at the speed of its slowest GPU.

Parts of one SKU under one power limit sustain different clocks (manufacturing variability and power management:
Sinha et al. SC'22, collectives/topology/gpu.py GPU_VARIABILITY). A training step synchronizes every rank (TP every
layer, PP every micro-batch, the DP reduction and the gradient-norm all-reduce every step), so each step waits for
the slowest of its N GPUs; a serving instance's step waits for the slowest of the instance's GPUs. The kernel
tables this project fits on were measured on one GPU each, taken as the median part. With each part's time
t·(1 + σ·z), z a standard normal fixed per part, the expected pace of N parts is t·(1 + σ·E[max of N normals])
(the expectation over which parts a job is given). Only GPU-bound time scales (the kernels' own seconds: GEMMs,
attention, memory-bound kernels, casts, the optimizer step): the host's launch waits and the network's price do not.

``expected_max_normal(n)``: E[max of n iid standard normals] = ∫ x·n·φ(x)·Φ(x)^(n-1) dx, integrated numerically
as ∫_0^∞ (1 - Φⁿ) dx - ∫_-∞^0 Φⁿ dx (Simpson's rule on [0, 12] and [-12, 0]), memoised by n; closed forms at n = 2, 3
(1/√π, 3/(2√π)) and 4 in tests/planner/test_spread.py. ``pace(gpu, n)``: 1 + σ·E[max of n]. One home: the plan
(compute.stage_compute), the layout search (search/step_model.py) and serving (build_plan's step, the overlapped
MoE step) all call ``slowest``.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from .compute import PassTime, StageCompute

_HALF = np.linspace(0.0, 12.0, 2401)  # Simpson nodes on each half (2,400 intervals); Φ(-12) is under 1e-32
_UPPER_CDF = 0.5 * np.array([math.erfc(-x / math.sqrt(2.0)) for x in _HALF])  # Φ on [0, 12]
_LOWER_CDF = 1.0 - _UPPER_CDF  # Φ(-x) = 1 - Φ(x): [-12, 0] mirrored
_WEIGHTS = np.ones_like(_HALF)
_WEIGHTS[1:-1:2], _WEIGHTS[2:-1:2] = 4.0, 2.0
_WEIGHTS *= (_HALF[1] - _HALF[0]) / 3.0


@lru_cache(maxsize=4096)
def expected_max_normal(n: int) -> float:
    """E[max of n iid standard normals] (0 for n = 1; ~3.2 at n = 1,024; ~3.9 at n = 16,384)."""
    if n < 1:
        raise ValueError(f"the order statistic needs n >= 1 parts, got {n}")
    if n == 1:
        return 0.0
    # the integrand jumps at 0 (1 - Φⁿ against -Φⁿ): each half on its own nodes
    upper = -np.expm1(n * np.log(_UPPER_CDF))  # 1 - Φⁿ on [0, 12], exact for Φ near 1
    with np.errstate(divide="ignore"):
        lower = np.exp(n * np.log(_LOWER_CDF))  # Φⁿ on [-12, 0]
    return float(np.dot(_WEIGHTS, upper) - np.dot(_WEIGHTS, lower))


def pace(sigma: float, n: int) -> float:
    """How much longer the slowest of ``n`` parts takes than the median part: 1 + σ·E[max of n]."""
    return 1.0 + sigma * expected_max_normal(n) if sigma > 0.0 and n > 1 else 1.0


def job_pace(ctx, gpu) -> float:
    """``pace`` of a plan: the GPU's ``variability`` over the ranks that gate each other's step, the layout's world
    size (training: DP couples every rank at the step's end; serving: the instance's GPUs, which one plan lays out)."""
    return pace(gpu.variability, ctx.par.world_size)


def slowest_pass(p: PassTime, k: float) -> PassTime:
    """A pass at the slowest part's pace ``k``: its GPU-bound seconds x k; the host's waits and FLOPs unchanged."""
    if k == 1.0:
        return p
    return PassTime(p.gemm_s * k, p.attention_s * k, p.elementwise_s * k, p.flops, p.fp8_cast_s * k, p.host_s)


def slowest(comp: StageCompute, k: float) -> StageCompute:
    """A stage's compute at the slowest part's pace ``k`` (``pace``): passes, core attention, optimizer, recompute."""
    if k == 1.0:
        return comp
    return StageCompute(
        slowest_pass(comp.forward, k),
        slowest_pass(comp.backward, k),
        comp.attention_fwd_s * k,
        comp.optimizer_s * k,
        comp.recompute_s * k,
    )


def spread_share(p: PassTime, k: float) -> float:
    """What of a pass already at pace ``k`` the spread added: its GPU-bound seconds x (1 - 1/k)."""
    return (p.total_s - p.host_s) * (1.0 - 1.0 / k) if k > 1.0 else 0.0


def stage_spread(comp: StageCompute, k: float, passes: float) -> float:
    """What the spread added to a stage's compute already at pace ``k`` over ``passes`` forward-backward passes
    and its optimizer step (StepTime.spread_s, a part of its compute_s)."""
    if k <= 1.0:
        return 0.0
    return passes * (spread_share(comp.forward, k) + spread_share(comp.backward, k)) + comp.optimizer_s * (1 - 1 / k)


__all__ = ["expected_max_normal", "job_pace", "pace", "slowest", "slowest_pass", "spread_share", "stage_spread"]
