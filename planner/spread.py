"""The slowest GPU sets the pace (spread15, issue 20): a synchronous job runs at the speed of its slowest GPU.

Parts of one SKU under one power limit sustain different clocks (manufacturing variability and power management:
Sinha et al. SC'22, collectives/topology/gpu.py GPU_VARIABILITY). A training step synchronizes every rank (TP every
layer, PP every micro-batch, the DP reduction and the gradient-norm all-reduce every step), so each step waits for
the slowest of its N GPUs; a serving instance's step waits for the slowest of the instance's GPUs. The kernel
tables this project fits on were measured on one GPU each, taken as the median part. With each part's time
t·(1 + σ·z), z a standard normal fixed per part, the expected pace of N parts is t·(1 + σ·E[max of N normals])
(the expectation over which parts a job is given). The spread is a clock spread ("identical GPUs sustain
different clocks"), so it enters the model where the clock does: the slowest part is the median part at clock / k
(``slowest_part``: GPUSpec.part_clock, read by kernels.clock_fraction and sm_cycles_s through GPUSpec.clock_scale,
the one place the clock enters, as a lowered power limit does), and the roofline decides what slows: compute-bound
GEMMs and attention by up to k, HBM-bound kernels (elementwise, casts, the optimizer step, a decode step's GEMMs)
not at all (mend15f, review r15e finding 3). The host's launch waits and the network's price do not move either.

``expected_max_normal(n)``: E[max of n iid standard normals] = ∫ x·n·φ(x)·Φ(x)^(n-1) dx, integrated numerically
as ∫_0^∞ (1 - Φⁿ) dx - ∫_-∞^0 Φⁿ dx (Simpson's rule on [0, 12] and [-12, 0]), memoised by n; closed forms at n = 2, 3
(1/√π, 3/(2√π)) and 4 in tests/planner/test_spread.py. ``pace(sigma, n)``: 1 + σ·E[max of n]. One home: every
caller that times kernels of a paced job (step.step_time and its pieces, the layout search's step_model, serving's
overlapped MoE step and fused all-reduce) times them on ``paced_gpu(ctx, gpu)``; ``compute_spread`` is the one
formula of what the pace added (StepTime.spread_s).
"""

from __future__ import annotations

import math
from dataclasses import replace
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


def slowest_part(gpu, k: float):
    """The slowest part of a job at pace ``k``: ``gpu`` at clock / k (GPUSpec.part_clock); ``gpu`` itself at k = 1."""
    return gpu if k == 1.0 else replace(gpu, part_clock=gpu.part_clock / k)


def paced_gpu(ctx, gpu):
    """The part that sets a plan's pace: ``slowest_part`` at ``job_pace``."""
    return slowest_part(gpu, job_pace(ctx, gpu))


def median_part(gpu):
    """The median part of the SKU (the part the kernel tables hold) of a ``paced_gpu``."""
    return gpu if gpu.part_clock == 1.0 else replace(gpu, part_clock=1.0)


def pass_spread(paced: PassTime, median: PassTime) -> float:
    """What the slowest part added to a pass: its seconds on the paced part less on the median part. A host-bound
    pass's launch wait absorbs the slower kernels (compute.PassTime.host_s shrinks as they grow), so the difference of
    the totals, not of the GPU-bound seconds, is what the step gains. Never below 0: a slower clock never speeds a
    pass, and where the host's wait absorbs every kernel the two totals differ only by rounding (-1e-17 s had reached
    the answer's step.spread_s: tests/app/test_hostile_combos.py)."""
    return max(0.0, paced.total_s - median.total_s)


def compute_spread(paced: StageCompute, median: StageCompute) -> tuple[float, float, float]:
    """What the slowest part added to one forward, one backward and the optimizer step of a stage timed on the paced
    part and on the median part. StepTime.spread_s (a part of compute_s) sums them over the step's passes."""
    return (
        pass_spread(paced.forward, median.forward),
        pass_spread(paced.backward, median.backward),
        max(0.0, paced.optimizer_s - median.optimizer_s),
    )


__all__ = [
    "compute_spread",
    "expected_max_normal",
    "job_pace",
    "median_part",
    "pace",
    "paced_gpu",
    "pass_spread",
    "slowest_part",
]
