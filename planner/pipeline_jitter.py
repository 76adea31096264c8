"""How much later a pipeline ends when its micro-batches differ in time, from the schedule's own order (issue 21,
docwait10; planner/documents.py reads it for packed documents).

A micro-batch j takes t_j on every stage (the same packs: a proportionate pipeline), its forward a share phi of it
and its backward the rest, each split evenly over the rank's v chunks; t_j = 1 + rho·z_j in units of the mean,
z_j independent standard normals. Every rank runs its operations in its schedule's order (``ScheduleTraits.order``:
Megatron's 1F1B and interleaved 1F1B, torch's GPipe) as a list schedule: an operation starts when its rank and its
input are free (the forward of chunk c from the rank before, chunk c - 1's last rank on rank 0; the backward from the
rank after, chunk c + 1's first rank on the last, the last chunk's backward after its own forward; p2p taken as
free). The makespan is the longest path of that graph, which is not the flow shop's sum_j t_j + (p - 1)·max_j t_j
(Pinedo, "Scheduling", §6.2): 1F1B's steady state has no slack (every rank's forward of one micro-batch waits on its
neighbour's backward of another), so each micro-batch adds a max and the excess grows linearly in m; Megatron's
interleaved order has slack that absorbs small spreads (docs/step-time.md, "(docwait10)").

``jitter`` evaluates it: DRAWS fixed-seed draws (common random numbers, numpy's PCG64 with SEED: deterministic) run
together through the graph in its longest-path levels (operations counted, found by relaxation in about 2p
vectorised rounds), each level one vectorised step over its operations and the draws. It returns, per unit of sigma,
the mean excess over the uniform makespan (the sum of the draws' (t_j - 1) subtracted as a control variate: its mean
is 0, its spread the largest part of the makespan's) and the makespan's standard deviation. Keyed by value
(schedule, p, v, m, phi to 0.01, rho to two significant figures: the excess is not linear in rho once the spread
uses up the interleaved order's slack) and bounded. Up to m2 micro-batches, the most whose 2·m·v operations a rank
fit in MAX_STEPS (at least 4p), the graph is run directly; beyond, at m2 and at m1 about m2/4 (multiples of p, in
steady state), and both moments extrapolated linearly in m: a max-plus system with independent steps grows its mean
linearly in m, at its cycle time (Baccelli, Cohen, Olsder, Quadrat, "Synchronization and Linearity", 1992, ch. 7,
the ergodic theory of stochastic event graphs), and its variance is taken to grow so too (a sum over weakly
dependent steps); both checked against the direct evaluation in tests/planner/test_pipeline_jitter.py (1F1B's mean
within 1%, the interleaved order's flat one within 0.5 sigma, the sd within 12%). A schedule without an order is
None: GPipe, whose every-forward-then-every-backward makespan is the flow shop's exactly (documents.py), and ZB-H1,
ZBV, DualPipe(V) (a deferred weight gradient or two directions, not written out here), for which
planner/documents.py keeps the flow shop's (p - 1)·E[max of m], a known approximation."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from itertools import pairwise

import numpy as np

from .pipeline import Schedule, schedule_traits

DRAWS = 256  # fixed-seed draws: the mean excess to 2-3% (its sampling error; tests/planner/test_pipeline_jitter.py)
SEED = 20261126
# a rank's operations (2·m·v) in the longest direct run; beyond, two runs (m1 and m2) extrapolated (module docstring)
MAX_STEPS = 256


@dataclass(frozen=True)
class Jitter:
    """A pipeline's makespan under per-micro-batch spread sigma, per unit of sigma: ``mean`` the expected excess
    over the uniform makespan, ``sd`` its standard deviation (the sum of the micro-batches' spreads included)."""

    mean: float
    sd: float


@dataclass(frozen=True)
class _Graph:
    """A schedule's operations in longest-path levels: op i is row i + 1 of the run (row 0 is time 0); it waits for
    rows ``prev[i]`` (its rank's previous op) and ``dep[i]`` (its input) and runs coef[i]·t[mb[i]]; level k holds
    ops bounds[k]..bounds[k + 1] - 1, which wait only on earlier levels; ``last``: the ranks' last ops' rows;
    ``base``: the uniform makespan."""

    prev: np.ndarray
    dep: np.ndarray
    mb: np.ndarray
    coef: np.ndarray
    bounds: tuple[int, ...]
    last: np.ndarray
    base: float


@lru_cache(maxsize=16)
def _levels(kind: str, p: int, v: int, m: int) -> tuple[np.ndarray, ...]:
    """Per rank d and position i (its i-th op): backward?, micro-batch, the flat index d·n + i of its input
    (-1: none) and its longest-path level (ops counted), by relaxation: a level is at least its rank's previous
    op's + 1 and its input's + 1; each round takes the inputs, then runs a cumulative max along every rank."""
    sched = Schedule(kind, p, m, v)
    order = schedule_traits(kind).order
    backward, mb, chunk = (np.stack(x) for x in zip(*(order(sched, d) for d in range(p)), strict=True))
    n = backward.shape[1]
    d = np.broadcast_to(np.arange(p)[:, None], (p, n))
    at = np.empty((p, 2, m, v), dtype=np.intp)  # rank, backward?, micro-batch, chunk -> position
    at[d, backward.astype(np.intp), mb, chunk] = np.broadcast_to(np.arange(n), (p, n))
    # the input (module docstring): a forward from rank d - 1 (rank 0: the last rank's chunk c - 1); a backward
    # from rank d + 1 (the last rank: rank 0's chunk c + 1, or the last chunk's own forward)
    last_rank, last_chunk = d == p - 1, chunk == v - 1
    src = np.where(backward, np.where(last_rank, np.where(last_chunk, d, 0), d + 1), np.where(d > 0, d - 1, p - 1))
    c_in = np.where(backward & last_rank, chunk + 1, np.where(~backward & (d == 0), chunk - 1, chunk))
    own = backward & last_rank & last_chunk
    c_in = np.where(own, chunk, c_in)
    none = ~backward & (d == 0) & (chunk == 0)
    pos_in = at[src, np.where(own, 0, backward.astype(np.intp)), mb, np.clip(c_in, 0, v - 1)]
    flat = np.where(none, -1, src * n + pos_in)
    step = np.arange(n)
    level = np.broadcast_to(step + 1, (p, n)).copy()
    for _ in range(4 * p * v + 8):  # converges in about 2p rounds (tests/planner/test_pipeline_jitter.py)
        new = np.maximum(level, np.append(level.ravel(), 0)[flat] + 1)
        new = np.maximum.accumulate(new - step, axis=1) + step
        if np.array_equal(new, level):
            return backward, mb, flat, level
        level = new
    raise RuntimeError(f"the {kind} orders at p {p}, v {v}, m {m} deadlock")


@lru_cache(maxsize=16)
def _graph(kind: str, p: int, v: int, m: int, phi: float) -> _Graph:
    backward, mb, flat, level = (x.ravel() for x in _levels(kind, p, v, m))
    n = len(mb) // p
    by_level = np.argsort(level, kind="stable")
    row = np.empty(len(mb) + 1, dtype=np.intp)  # flat index -> row; flat -1 (no input) -> row 0
    row[by_level] = np.arange(1, len(mb) + 1)
    row[-1] = 0
    first = np.arange(len(mb)) % n == 0
    prev = np.where(first, 0, row[np.arange(len(mb)) - 1])[by_level]
    dep = row[flat][by_level]
    sorted_levels = level[by_level]
    bounds = (0, *(np.flatnonzero(np.diff(sorted_levels)) + 1).tolist(), len(mb))
    coef = np.where(backward, (1 - phi) / v, phi / v)[by_level]
    last = row[np.arange(p) * n + n - 1]
    graph = _Graph(prev, dep, mb[by_level], coef, bounds, last, 0.0)
    base = float(makespans(graph, np.ones((m, 1)))[0])
    return _Graph(prev, dep, graph.mb, coef, bounds, last, base)


def makespans(graph: _Graph, t: np.ndarray) -> np.ndarray:
    """The makespan of each column of ``t`` (m micro-batch times x draws): one vectorised step a level."""
    done = np.empty((len(graph.mb) + 1, t.shape[1]))  # every row written (level by level) before it is read
    done[0] = 0.0
    prev, dep, mb, coef = graph.prev, graph.dep, graph.mb, graph.coef[:, None]
    for s, e in pairwise(graph.bounds):
        out = done[s + 1 : e + 1]
        np.maximum(done[prev[s:e]], done[dep[s:e]], out=out)
        out += coef[s:e] * t[mb[s:e]]
    return done[graph.last].max(axis=0)


def schedule_makespans(kind: str, p: int, v: int, phi: float, t: np.ndarray) -> tuple[np.ndarray, float]:
    """The list schedule's makespans for micro-batch times ``t`` (m x draws) and its uniform makespan (all 1):
    what bench/document_wait_sim.py prints."""
    graph = _graph(kind, p, v, t.shape[0], phi)
    return makespans(graph, t), graph.base


def _run(kind: str, p: int, v: int, m: int, phi: float, rho: float) -> tuple[float, float]:
    """(mean excess, variance) per sigma, per sigma², of DRAWS fixed-seed draws at m micro-batches."""
    # C order: the first m1 rows are the same draws at any m (common random numbers across m)
    z = np.random.Generator(np.random.PCG64(SEED)).standard_normal((m, DRAWS))
    t = np.maximum(1.0 + rho * z, 0.0)
    graph = _graph(kind, p, v, m, phi)
    extra = (makespans(graph, t) - graph.base) / rho
    return float(np.mean(extra - z.sum(axis=0))), float(np.var(extra, ddof=1))


@lru_cache(maxsize=256)
def _jitter(kind: str, p: int, v: int, m: int, phi: float, rho: float) -> Jitter:
    if p == 1:  # one stage runs the micro-batches back to back: the sum of m, no excess
        return Jitter(0.0, math.sqrt(m))
    m2 = max(4 * p, MAX_STEPS // (2 * v) // p * p)  # the longest direct run (at least four groups of p)
    if m <= m2:
        mean, var = _run(kind, p, v, m, phi, rho)
        return Jitter(mean, math.sqrt(var))
    m1 = max(2 * p, m2 // 4 // p * p)  # far from it: the slope's sampling error is divided by m2 - m1
    (a1, v1), (a2, v2) = _run(kind, p, v, m1, phi, rho), _run(kind, p, v, m2, phi, rho)
    grow = (m - m2) / (m2 - m1)
    return Jitter(a2 + grow * (a2 - a1), math.sqrt(max(0.0, v2 + grow * (v2 - v1))))


def jitter(sched: Schedule, phi: float, rho: float) -> Jitter | None:
    """The excess and spread of ``sched``'s makespan per unit of sigma (module docstring), the forward a share
    ``phi`` of a micro-batch and its spread ``rho`` of its mean (phi kept to 0.01, rho to two significant
    figures, at least 1e-4: the cache's key); None for a schedule whose order is not written out (the caller's
    fallback)."""
    if sched.stages > 1 and sched.traits.order is None:
        return None
    rho = float(f"{max(rho, 1e-4):.2g}")
    return _jitter(sched.kind, sched.stages, max(1, sched.chunks), sched.microbatches, round(phi, 2), rho)


__all__ = ["DRAWS", "MAX_STEPS", "SEED", "Jitter", "jitter", "makespans", "schedule_makespans"]
