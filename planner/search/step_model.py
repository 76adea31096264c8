"""Adapter between the search and the step-time and memory models of planner/step.py: the same functions
``build_plan`` calls (``step_time`` and ``memory``), fed with rows built from the ledger templates and
the price curves instead of a priced plan, and without the timeline. The search re-evaluates its best
layouts with ``build_plan`` itself, so the step and memory blocks it answers are exactly /v1/plan's.

Without a GPU spec on the cluster there is no step time or memory (``build_plan`` says so in a warning);
the screen then ranks by the communication time of the busiest stage, calls serialised
(``Plan.totals()["time_s"]``), and every layout counts as fitting.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from collectives.topology import Cluster

from ..context import Context
from ..ledger import Call
from ..model import ModelSpec
from ..parallel import ParallelSpec
from ..step import Overlap, memory, step_time
from ..workload import WorkloadSpec


@dataclass(frozen=True)
class Priced:
    """What step_time reads of a PricedCall: the call, and the time of one call."""

    time_s: float


@dataclass(frozen=True)
class Row:
    call: Call
    price: Priced


class StepModel:
    def __init__(self, model: ModelSpec, cluster: Cluster, headroom: float = 0.0, overlap: Overlap | None = None):
        self.model, self.cluster, self.headroom = model, cluster, headroom
        self.overlap = overlap or Overlap()
        self.gpu = cluster.spec.gpu
        self.last_reason = ""

    def fits(self, par: ParallelSpec, work: WorkloadSpec, rows) -> bool:
        if self.gpu is None:
            return True
        mem = memory(Context(self.model, work, par), self.gpu, rows)
        limit = mem.capacity_bytes * (1 - self.headroom)
        worst = max(mem.per_stage, key=lambda s: s.peak_bytes)
        if worst.peak_bytes <= limit:
            return True
        self.last_reason = (
            f"stage {worst.stage} needs {worst.peak_bytes / 1e9:.1f} GB per device, above "
            f"{limit / 1e9:.1f} GB ({mem.capacity_bytes / 1e9:.1f} GB x (1 - headroom {self.headroom:g}))"
        )
        return False

    def step_time(self, par: ParallelSpec, work: WorkloadSpec, rows, counts: np.ndarray, times: np.ndarray) -> float:
        if self.gpu is None:
            return float((stage_matrix(rows, par.pp) @ (counts * times)).max())
        ctx = Context(self.model, work, par)
        return step_time(ctx, rows, self.gpu, self.overlap, with_timeline=False).time_s


_INCIDENCE: dict = {}


def stage_matrix(rows, stages: int) -> np.ndarray:
    """(stages x rows) 0/1: which stages issue each call; memoised on the row list's identity."""
    key = (tuple(id(r) for r in rows), stages)
    found = _INCIDENCE.get(key)
    if found is None:
        found = np.zeros((stages, len(rows)))
        for i, row in enumerate(rows):
            found[list(row.call.stages), i] = 1.0
        if len(_INCIDENCE) > 4096:
            _INCIDENCE.clear()
        _INCIDENCE[key] = found
    return found


__all__ = ["Priced", "Row", "StepModel"]
