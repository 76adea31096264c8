"""Adapter between the search and the step-time and memory models (planner/step.py, planner/memory.py).

The search screens every layout with this adapter and then re-evaluates the best few with ``build_plan``,
so the step and memory blocks it returns are exactly /v1/plan's. Without a step model (a cluster whose GPU
spec is missing, or a planner without step.py) the screen ranks by the communication time of the busiest
stage, calls serialised: ``Plan.totals()["time_s"]``.
"""

from __future__ import annotations

import numpy as np

from collectives.topology import Cluster

from ..model import ModelSpec
from ..parallel import ParallelSpec
from ..workload import WorkloadSpec


class StepModel:
    def __init__(self, model: ModelSpec, cluster: Cluster, headroom: float = 0.0):
        self.model, self.cluster, self.headroom = model, cluster, headroom
        self.last_reason = ""

    def fits(self, par: ParallelSpec, work: WorkloadSpec) -> bool:
        return True

    def step_time(self, par: ParallelSpec, work: WorkloadSpec, calls, counts: np.ndarray, times: np.ndarray) -> float:
        per_stage = np.zeros(par.pp)
        for call, count, time in zip(calls, counts.tolist(), times.tolist(), strict=True):
            per_stage[list(call.stages)] += count * time
        return float(per_stage.max())


__all__ = ["StepModel"]
