"""Pipeline schedules in closed form: GPipe, 1F1B (PipeDream-Flush) and interleaved 1F1B, per stage.

Every stage s runs, per micro-batch, a forward of f_s and a backward of b_s seconds (compute plus the
communication that cannot overlap inside the pass); a boundary send costs c seconds. With m micro-batches,
p stages and v model chunks per stage (Narayanan et al. SC'21 §2.2):

    T = m·t_max + (Σ_s t_s - t_max)/v + 2·(p-1)·c      t_s = f_s + b_s, t_max = max_s t_s

which is (m + p - 1)·t for equal stages without interleaving (bubble (p-1)/m) and m·t + (p-1)·t/v with v
chunks (bubble (p-1)/(v·m)), and lets the slowest stage set the steady-state pace. GPipe runs the same
critical path as 1F1B (all forwards, then all backwards); it only holds more activations. Without
``overlap_p2p`` (Megatron overlaps p2p only in the interleaved schedule: --overlap-p2p-communication,
megatron/training/arguments.py) each steady-state micro-batch also waits for its two boundary transfers.

A real schedule of 10^5 micro-batch events is never built: ``timeline`` lays the same closed form out as
blocks per stage, one per micro-batch for the warm-up and cool-down when they are few, and one aggregated
block each for the warm-up, the steady state and the cool-down when 2·m·v·p exceeds MAX_EVENTS
(``microbatch`` is the first micro-batch of a block, ``microbatches`` how many it holds).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

MAX_EVENTS = 256  # compute blocks in all; beyond, each stage's warm-up, steady state and cool-down are one block each


@dataclass(frozen=True)
class StagePass:
    """One micro-batch on one rank of a stage, seconds: forward and backward (whole stage, all chunks)."""

    forward_s: float
    backward_s: float

    @property
    def total_s(self) -> float:
        return self.forward_s + self.backward_s


@dataclass(frozen=True)
class Schedule:
    kind: str  # gpipe | 1f1b | interleaved
    stages: int  # p
    microbatches: int  # m
    chunks: int = 1  # v: model chunks per stage (interleaved)
    p2p_s: float = 0.0  # one boundary send, seconds
    overlap_p2p: bool = False


@dataclass(frozen=True)
class PipelineTime:
    time_s: float  # start of the first forward to the end of the last backward
    busy_s: tuple[float, ...]  # per stage: m·(f_s + b_s)
    bubble_s: tuple[float, ...]  # per stage: time_s - busy_s (idle or waiting on a boundary)


def pipeline_time(passes: Sequence[StagePass], sched: Schedule) -> PipelineTime:
    """Closed-form critical path of the schedule (module docstring)."""
    m, p, v = sched.microbatches, sched.stages, max(1, sched.chunks)
    totals = [x.total_s for x in passes]
    t_max = max(totals)
    fill = 2 * (p - 1) * sched.p2p_s
    steady_wait = 0.0 if sched.overlap_p2p or p == 1 else 2 * sched.p2p_s
    time = m * (t_max + steady_wait) + (sum(totals) - t_max) / v + fill
    busy = tuple(m * t for t in totals)
    return PipelineTime(time, busy, tuple(time - b for b in busy))


def warmup_microbatches(sched: Schedule, stage: int) -> int:
    """Forwards before the first backward on ``stage``: p - s - 1 (1F1B); Megatron's interleaved schedule
    runs (p - s - 1)·2 + (v - 1)·p chunk forwards (schedules.py get_pp_rank_microbatches); GPipe all m."""
    p, m, v = sched.stages, sched.microbatches, max(1, sched.chunks)
    if sched.kind == "gpipe":
        return m
    if sched.kind == "interleaved":
        return min((p - stage - 1) * 2 + (v - 1) * p, m * v)
    return min(p - stage - 1, m)


def in_flight(sched: Schedule, stage: int) -> float:
    """Micro-batches whose activations one rank of ``stage`` holds at its peak, in units of a whole stage's
    layers: 1F1B min(p - s, m) (stage 0 holds p); interleaved (warm-up + 1) chunks of 1/v of the stage each,
    so stage 0 holds p·(1 + (p - 1)/(p·v)) (Korthikanti et al. 2022 §4.2.3, Megatron
    theoretical_memory_usage.py interleaved_schedule_memory_penalty); GPipe all m."""
    v = max(1, sched.chunks)
    if sched.kind == "interleaved":
        return min(warmup_microbatches(sched, stage) + 1, sched.microbatches * v) / v
    return min(warmup_microbatches(sched, stage) + 1, sched.microbatches)


def timeline(passes: Sequence[StagePass], sched: Schedule, start_s: float = 0.0) -> list[dict]:
    """Compute-stream blocks per stage consistent with ``pipeline_time``: warm-up forwards, the steady
    state (one forward + one backward per micro-batch at the slowest stage's pace), cool-down backwards.
    Each block: {stage, stream, name, microbatch (first), microbatches (count), start_s, end_s}."""
    total = pipeline_time(passes, sched).time_s
    p, m, v = sched.stages, sched.microbatches, max(1, sched.chunks)
    t_max = max(x.total_s for x in passes)
    period = t_max + (0.0 if sched.overlap_p2p or p == 1 else 2 * sched.p2p_s)
    events: list[dict] = []
    each = 2 * m * v * p <= MAX_EVENTS
    lead = tail = 0.0
    for s, x in enumerate(passes):
        f, b = x.forward_s / v, x.backward_s / v  # one chunk
        warm = warmup_microbatches(sched, s)
        steady = m * v - warm
        t = start_s + lead
        t = _blocks(events, s, "forward", 0, warm, f, t, each)
        if steady:
            per = period / v
            if each:
                for i in range(steady):
                    events.append(_event(s, "forward", warm + i, 1, t + i * per, t + i * per + f))
                    events.append(_event(s, "backward", i, 1, t + i * per + f, t + i * per + f + b))
            else:
                events.append(_event(s, "1f1b", warm, steady, t, t + steady * per))
        end = start_s + total - tail
        _blocks(events, s, "backward", steady, warm, b, end - warm * b, each)
        lead += f + sched.p2p_s
        tail += b + sched.p2p_s
    return events


def _blocks(events: list, stage: int, name: str, first: int, count: int, dur: float, t: float, each: bool) -> float:
    if count <= 0:
        return t
    if each:
        for i in range(count):
            events.append(_event(stage, name, first + i, 1, t + i * dur, t + (i + 1) * dur))
    else:
        events.append(_event(stage, name, first, count, t, t + count * dur))
    return t + count * dur


def _event(stage: int, name: str, mb: int, count: int, start: float, end: float) -> dict:
    return {
        "stage": stage,
        "stream": "compute",
        "name": name,
        "microbatch": mb,
        "microbatches": count,
        "start_s": start,
        "end_s": end,
    }


__all__ = ["PipelineTime", "Schedule", "StagePass", "in_flight", "pipeline_time", "timeline", "warmup_microbatches"]
