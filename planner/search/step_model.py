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
        return float((stage_matrix(calls, par.pp) @ (counts * times)).max())


_INCIDENCE: dict = {}


def stage_matrix(calls, stages: int) -> np.ndarray:
    """(stages x calls) 0/1: which stages issue each call; memoised on the call list's identity."""
    key = (tuple(id(c) for c in calls), stages)
    found = _INCIDENCE.get(key)
    if found is None:
        found = np.zeros((stages, len(calls)))
        for i, call in enumerate(calls):
            found[list(call.stages), i] = 1.0
        if len(_INCIDENCE) > 4096:
            _INCIDENCE.clear()
        _INCIDENCE[key] = found
    return found


__all__ = ["StepModel"]
