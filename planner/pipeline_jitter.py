"""How much later a pipeline ends when its micro-batches differ in time, from the schedule's own order (issue 21,
docwait10; planner/documents.py reads it for packed documents).

A micro-batch j takes t_j on every stage (the same packs: a proportionate pipeline), its forward a share phi of it
and its backward the rest, each split evenly over the rank's v chunks; t_j = 1 + rho·z_j in units of the mean,
z_j independent standard normals. Every rank runs its operations in its schedule's order (``ScheduleTraits.order``)
as a list schedule: an operation starts when its rank and its input are free (a forward waits for its micro-batch's
forward on the virtual stage before: Megatron's chunk c of rank d is stage c·p + d, so rank 0 waits for the last
rank's chunk c - 1; a backward for the backward on the stage after, the last stage's for its own forward; p2p taken
as free). The makespan is the longest path of that graph, which is not the flow shop's sum_j t_j + (p - 1)·max_j t_j
(Pinedo, "Scheduling", §6.2): 1F1B's steady state has no slack (every rank's forward of one micro-batch waits on its
neighbour's backward of another), so each micro-batch adds a max and the excess grows linearly in m; Megatron's
interleaved order has slack that absorbs small spreads (docs/step-time.md, "(docwait10)").

``jitter`` evaluates it: DRAWS fixed-seed draws (common random numbers, numpy's PCG64 with SEED: deterministic) run
together through the graph in its longest-path levels (operations counted, found by relaxation in 2-3 Gauss-Seidel
rounds), each level one vectorised step over its operations and the draws. It returns, per unit of sigma, the mean
excess over the uniform makespan (the sum of the draws' own (t_j - 1) subtracted as a control variate: t_j = max(1 +
rho·z_j, 0) clipped at 0, so the clipped draws' sum, which keeps the mean work at what the planner prices; review r10a
#3) and the makespan's standard deviation. The draws run on a grid of (phi, rho) nodes per structure (schedule, p, v,
m), cached by node; a candidate's (phi, rho) is cubic in phi and in log rho over its sixteen nodes, run together
(mend10a; outside the grid its own key, phi to 0.01, rho to two significant figures: the excess is not linear in rho
once the spread uses up the interleaved order's slack). The work of a call (``work``: cells and levels) is bounded by
CELLS: beyond it the candidate's own (phi, rho) alone, then fewer draws (down to MIN_DRAWS), then its stand-ins' orders
(``ScheduleTraits.wait_stand_ins``, review r11a #1), then the flow shop (None;
``method`` says which). Up to m2 micro-batches, the most whose operations a rank (``per_microbatch``·m: 2·m·v for
Megatron's orders) fit in MAX_STEPS (at least 4p), the graph is run directly; beyond, at m2 and at m1 about m2/4
(multiples of p, in steady state), and both moments extrapolated linearly in m: a max-plus system with independent steps
grows its mean linearly in m, at its cycle time (Baccelli, Cohen, Olsder, Quadrat, "Synchronization and Linearity",
1992, ch. 7, the ergodic theory of stochastic event graphs), and its variance is taken to grow so too (a sum over weakly
dependent steps; never below the m2 run's); both checked against the direct evaluation in
tests/planner/test_pipeline_jitter.py (1F1B's mean within 1%, the interleaved order's flat one within 0.5 sigma, the sd
within 12%). A schedule without an order is None: GPipe, whose every-forward-then-every- backward makespan is the flow
shop's exactly (documents.py). ZB-H1, ZBV, DualPipe and DualPipeV run their own orders (sched11; pipeline._order_zb_h1,
_order_zbv, _order_dual): a backward split into its input gradient (I) and a weight gradient (W) run later, a share
omega of the pass; DualPipe's two directions (micro-batches m/2.. from the last rank); an F&B pair starting once both
inputs are in and sending both outputs at its end (the op kinds: ``_ROW``)."""

from __future__ import annotations

import math
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from contextlib import suppress
from dataclasses import dataclass, field, replace
from functools import lru_cache
from itertools import pairwise

import numpy as np

from .pipeline import (
    IS_FORWARD,
    IS_GRADIENT,
    OP_F_LATE,
    OP_IDLE,
    SENDS_GRADIENT,
    Schedule,
    StagePass,
    own_passes,
    schedule_traits,
)

DRAWS = 256  # fixed-seed draws: the mean excess to 2-3% (its sampling error; tests/planner/test_pipeline_jitter.py)
MIN_DRAWS = 8  # the fewest draws before the flow shop (sched11: error measured in docs/step-time.md "(sched11)")
SEED = 20261126
# a rank's operations (2·m·v) in the longest direct run; beyond, two runs (m1 and m2) extrapolated (module docstring)
MAX_STEPS = 256
# The grid the draws run on (mend10a, review r10a #2): forward shares and log-spaced spreads; a candidate's
# (phi, rho) inside it reads its sixteen nearest nodes (those not cached run together, one vectorised pass; cached
# per structure and node), cubic (Lagrange) in phi and in log rho; outside it its own key is run. Interpolation
# error against direct runs: at most 0.9% of the mean and 0.7% of the sd over 6 structures x 66 (phi, rho)
# (docs/step-time.md "(mend10a)"; linear between nodes it was 3-6% in the interleaved order's steep rise);
# tests/planner/test_pipeline_jitter.py holds it within INTERPOLATION_ERROR.
PHI_NODES = tuple(k / 20 for k in range(2, 19))  # 0.1 .. 0.9 by 0.05
RHO_NODES = tuple(float(f"{0.01 * 2 ** (k / 2):.4g}") for k in range(15))  # 0.01 .. 1.28 by sqrt(2)
INTERPOLATION_ERROR = (0.01, 0.05)  # |interpolated - direct| <= 1% of the mean per sigma + 0.05 (the test's bound)
NODES = 16  # nodes a candidate runs at most at once (4 phi x 4 rho, cubic in phi and log rho)
# The work bound (review r10a #1): cells (ops x columns) of one call, its levels' numpy steps and the relaxation's
# rounds (``work``), at most CELLS (under 1 s of one core: 2-5 ns a cell, measured in docs/step-time.md
# "(mend10a)"); beyond it the candidate's own (phi, rho) alone, then fewer draws (at least MIN_DRAWS), then the
# flow shop (``draws`` 0), said in the plan's Assumptions row (``method``) and charged by planner/estimate.py
# (CELL_UNITS cells a work unit).
CELLS = 1 << 28
CELL_UNITS = 5  # cells (2-5 ns) in one of planner/estimate.py's work units (about 15 ns)
CHUNK = 1 << 21  # cells of one sweep's array (16 MiB): columns run in chunks of it (cache-resident: ~5 ns a cell)
LEVEL_CELLS = 3_000  # one level's numpy steps (10-20 us measured, docs/step-time.md "(mend10a)") in cells
RELAX_CELLS = 2  # one relaxation round over one op (7-10 ns measured at pp 128, docs/step-time.md) in cells
RELAX_ROUNDS = 8  # Gauss-Seidel rounds before an order is called deadlocked (Megatron's settle in 2-3; the test)
# The rounds a structure's relaxation is charged (``laid_cells``): the most measured, the last finding no change:
# ZB-H1 and ZBV 2, DualPipe and DualPipeV 3 at p 4-48, m 2p-64p (guard14, ``_Graph.rounds``); Megatron's 2-3 (mend10a)
RELAX_CHARGED = 3
# one rank step of the relaxation (a gather, two maxima, a cumulative max, a compare over the rank's ops) in cells:
# 3.8 us fixed measured cold at p 4-48 (guard14; LEVEL_CELLS, a draws' sweep level, was charged before)
RANK_STEP_CELLS = 1_300
# one op of a structure laid out past its order and relaxation (``_inputs``: its input found; ``_graph``: the level
# sort, its rows, its cell; the sweep's plan) in cells: 71 ns measured cold at p 4-48 (guard14; not charged before)
LAY_CELLS = 24
# operations kept in the structures' cache (4 int32 arrays an op, ``cell`` too: ~134 MiB at most; with a swept
# structure's ``plan``, two more: ~200 MiB)
GRAPH_OPS = 1 << 23


@dataclass(frozen=True)
class Jitter:
    """A pipeline's makespan under per-micro-batch spread sigma, per unit of sigma: ``mean`` the expected excess
    over the uniform makespan, ``sd`` its standard deviation (the sum of the micro-batches' spreads included)."""

    mean: float
    sd: float


@dataclass(frozen=True)
class _Graph:
    """A schedule's operations in longest-path levels, without phi: op i is row i + 1 of the run (row 0 is time 0);
    it waits for rows ``prev[i]`` (its rank's previous op) and ``dep[i]`` (its input) and runs the duration in row
    ``at[i]`` of the run's (blocks·m + 1 x columns) durations (``durations``: micro-batch j's forward at row j, its
    full backward at m + j, where the order splits weight gradients off (``blocks`` 4, else 2) its input-gradient
    backward at 2m + j and its weight gradient at 3m + j, no time at the last row); level
    k holds ops bounds[k]..bounds[k + 1] - 1, which wait only on earlier levels; ``last``: the ranks' last ops'
    rows; ``split``: the ops of one kind a micro-batch runs on a rank (its chunks there: v interleaved, 2 in a V, 1
    for DualPipe's two directions), each taking 1/split of its pass."""

    prev: np.ndarray
    dep: np.ndarray
    at: np.ndarray
    bounds: tuple[int, ...]
    last: np.ndarray
    split: int = 1
    blocks: int = 2
    # each op's row of a per-(rank, chunk, block) duration table (``order_span``): ((rank·chunks + chunk)·blocks +
    # block), the table's last row (p·chunks·blocks) for no time
    cell: np.ndarray | None = None
    chunks: int = 1  # the chunks of a rank in that table (v: DualPipe's two stages though a micro-batch runs one)
    rounds: int = 0  # the relaxation's rounds laying it out took (``_laid``; ``laid_cells`` charges RELAX_CHARGED)
    # ``_sweep``'s per-level gather indices, laid out on its first sweep (``_levels_plan``) and shared by the copies
    # ``replace`` makes (the same dict): {0: plan}
    plan: dict = field(default_factory=dict, compare=False, repr=False)


_ROW = np.array([0, 1, 2, 3, -1, 0, -1])  # op kind (pipeline.OP_*) -> its block of m duration rows (-1: the zero row)


def _orders(kind: str, p: int, v: int, m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every rank's (kind, micro-batch, virtual stage), padded with OP_IDLE to the longest rank's count."""
    sched = Schedule(kind, p, m, v)
    order = schedule_traits(kind).order
    ranks = [order(sched, d) for d in range(p)]
    n = max(len(r[0]) for r in ranks)
    out = np.full((3, p, n), OP_IDLE, dtype=np.intp)
    out[1:] = 0
    for d, r in enumerate(ranks):
        for i, x in enumerate(r):
            out[i, d, : len(x)] = x
    return out[0], out[1], out[2]


def _inputs(op: np.ndarray, mb: np.ndarray, stage: np.ndarray, m: int) -> np.ndarray:
    """The flat index (rank·n + position) of the op each op waits for (-1: none): a forward at virtual stage s the
    forward of its micro-batch at s - 1 (none at 0); a backward (and the wait of an F&B pair) the backward at s + 1,
    at the last stage its own forward; a weight gradient, after its backward on its own rank, nothing more. An
    output leaves with the op that sends it: OP_F_LATE's with the next op on its rank."""
    p, n = op.shape
    stages = int(stage.max()) + 1
    flat = np.arange(p * n).reshape(p, n)
    sent = np.full((2, m, stages), -1, dtype=np.intp)  # (forward 0 / backward 1, micro-batch, stage) -> flat
    fwd, grad = IS_FORWARD[op], SENDS_GRADIENT[op]
    sent[0, mb[fwd], stage[fwd]] = (flat + (op == OP_F_LATE))[fwd]
    sent[1, mb[grad], stage[grad]] = flat[grad]
    waits = np.full((p, n), -1, dtype=np.intp)
    f_in = fwd & (stage > 0)
    waits[f_in] = sent[0, mb[f_in], stage[f_in] - 1]
    g = IS_GRADIENT[op]
    top = g & (stage == stages - 1)
    waits[top] = sent[0, mb[top], stage[top]]
    inner = g & ~top
    waits[inner] = sent[1, mb[inner], stage[inner] + 1]
    if np.any(waits[f_in | g] < 0):
        raise RuntimeError("an order's op waits for an input no rank produces")
    return waits


def _levels(kind: str, p: int, v: int, m: int) -> tuple[np.ndarray, ...]:
    """``_laid`` less its rounds."""
    return _laid(kind, p, v, m)[:5]


def _laid(kind: str, p: int, v: int, m: int) -> tuple:
    """Per rank d and position i (its i-th op): op kind, micro-batch, virtual stage, the flat index d·n + i of its input
    (-1: none) and its longest-path level (ops counted), by relaxation: a level is at least its rank's previous
    op's + 1 and its input's + 1; a round visits the ranks 0..p-1 then back (Gauss-Seidel: each takes its inputs'
    newest levels, then runs a cumulative max along the rank). It was Jacobi (all ranks at once, about 2p rounds:
    O(p) passes over 8p²v ops, the bound's binding cost at pp 128; review r10a #1); the same levels (test); last,
    the rounds it took, the one that found no change included (``_Graph.rounds``)."""
    op, mb, stage = _orders(kind, p, v, m)
    n = op.shape[1]
    flat = _inputs(op, mb, stage, m)
    step = np.arange(n)
    level = np.append(np.broadcast_to(step + 1, (p, n)).ravel(), 0)  # flat; the last: "no input", level 0
    ranks = level[:-1].reshape(p, n)
    sweep = [*range(p), *range(p - 1, -1, -1)]  # Gauss-Seidel: each rank reads its neighbours' newest levels
    for rounds in range(1, RELAX_ROUNDS + 1):  # Megatron's settle in 1-2 rounds, a third finds no change (mend10a)
        changed = False
        for d in sweep:
            new = np.maximum(ranks[d], level[flat[d]] + 1)
            new = np.maximum.accumulate(new - step) + step
            if not np.array_equal(new, ranks[d]):
                ranks[d] = new
                changed = True
        if not changed:
            return op, mb, stage, flat, ranks, rounds
    raise RuntimeError(f"the {kind} orders at p {p}, v {v}, m {m} deadlock (no fixed point in {RELAX_ROUNDS} rounds)")


_GRAPHS: OrderedDict[tuple, _Graph] = OrderedDict()  # (kind, p, v, m) -> structure, least recently used first


def _graph(kind: str, p: int, v: int, m: int) -> _Graph:
    """The structure of (kind, p, v, m), cached (a search's structures: bounded by their operations, GRAPH_OPS)."""
    key = (kind, p, v, m)
    found = _GRAPHS.get(key)
    if found is not None:
        with suppress(KeyError):  # another thread may have let it go since (each step atomic under the GIL)
            _GRAPHS.move_to_end(key)
        return found
    *laid, rounds = _laid(kind, p, v, m)
    op, mb, stage, flat, level = (x.ravel() for x in laid)
    ops = len(mb)
    n = ops // p
    by_level = np.argsort(level, kind="stable")
    row = np.empty(ops + 1, dtype=np.int32)  # flat index -> row; flat -1 (no input) -> row 0
    row[by_level] = np.arange(1, ops + 1)
    row[-1] = 0
    first = np.arange(ops) % n == 0
    prev = np.where(first, 0, row[np.arange(ops) - 1])[by_level].astype(np.int32)
    dep = row[flat][by_level]
    bounds = (0, *(np.flatnonzero(np.diff(level[by_level])) + 1).tolist(), ops)
    traits = schedule_traits(kind)
    chunks, blocks = _table_shape(kind, v)
    at = np.where(_ROW[op] < 0, blocks * m, _ROW[op] * m + mb)[by_level].astype(np.int32)
    split = traits.stage_map.visits(v)  # the chunks a micro-batch visits on one rank
    # the rank's chunk an op runs (pipeline.StageMap.op_chunk: virtual stage s is chunk s // p, Megatron's c·p + d, a
    # V's r and 2p - 1 - r; DualPipe's by the op's direction, stage r one way and p - 1 - r the other; dualpipe13)
    rank = np.arange(ops) // n
    cell = (rank * chunks + traits.stage_map.op_chunk(rank, stage, p)) * blocks + _ROW[op]
    cell = np.where(_ROW[op] < 0, p * chunks * blocks, cell)[by_level].astype(np.int32)
    last = row[np.arange(p) * n + n - 1]
    graph = _GRAPHS[key] = _Graph(prev, dep, at, bounds, last, split, blocks, cell, chunks, rounds=rounds)
    if ops <= TIMELINE_OPS:  # the per-rank arrays order_blocks draws from, kept apart (not laid out again; guard14)
        _keep(_TIMELINE_LEVELS, key, tuple(laid), TIMELINE_KEPT)
    with suppress(KeyError, RuntimeError):  # another thread's eviction in between
        while sum(len(g.at) for g in list(_GRAPHS.values())) > GRAPH_OPS and len(_GRAPHS) > 1:
            _GRAPHS.popitem(last=False)
    return graph


def _table_shape(kind: str, v: int) -> tuple[int, int]:
    """(chunks, blocks) of a structure's per-(rank, chunk, block) table (``_Graph.chunks``, ``blocks``): a rank's v
    chunks, and 4 blocks where the order splits weight gradients off (forward, backward, input gradient, weight
    gradient), else 2."""
    return max(1, v), 4 if schedule_traits(kind).splits_weights else 2


def durations(t: np.ndarray, phi: float, split: int, omega: float = 0.0, blocks: int = 2) -> np.ndarray:
    """Micro-batch times ``t`` (m x columns) as a run's (blocks·m + 1 x columns) op durations (``_Graph``): each
    chunk's forward a share ``phi`` / split of it, its full backward (1 - phi) / split, and with 4 blocks its weight
    gradient ``omega`` / split and its input gradient the rest; a last row of no time."""
    omega = min(omega, 1 - phi)  # a grid node's phi may leave less backward than omega (then all of it is W)
    shares = (phi / split, (1 - phi) / split, (1 - phi - omega) / split, omega / split)[:blocks]
    return np.concatenate([t * s for s in shares] + [np.zeros((1, t.shape[1]))])


def makespans(graph: _Graph, dur: np.ndarray) -> np.ndarray:
    """The makespan of each column of ``dur`` (``durations``), one vectorised step a level, in column chunks of
    at most CHUNK cells."""
    return rank_ends(graph, dur).max(axis=0)


def rank_ends(graph: _Graph, dur: np.ndarray) -> np.ndarray:
    """Each rank's last op's end (p x columns) in each column of ``dur``, in column chunks of at most CHUNK cells
    (``_sweep``): their max down a column is its makespan (``order_ends`` keeps them apart, guard14)."""
    rows = len(graph.at) + 1
    width = max(1, CHUNK // rows)
    return np.hstack([_sweep_ends(graph, dur[:, c : c + width]) for c in range(0, dur.shape[1], width)])


def _levels_plan(graph: _Graph) -> np.ndarray:
    """The ops' inputs level by level, level k (ops s..e - 1) at 2s..2e - 1: its ``prev`` rows, then its ``dep``
    rows (int32, 8 bytes an op; one array, not a view a level, whose ~280 bytes a level would outweigh the
    structure at small p): laid out once per structure (``_Graph.plan``), so a level of ``_sweep`` is one gather,
    one max and one add (vsearch13: 1.6-2.0 us a level at one column, against 3.2-3.5 us slicing three index arrays
    and gathering the durations a level; docs/step-time.md "(vsearch13)")."""
    found = graph.plan.get(0)
    if found is None:
        bounds = np.array(graph.bounds)
        sizes = np.diff(bounds)
        start = np.repeat(bounds[:-1], sizes)  # each op's level's first op
        inputs = np.empty(2 * len(graph.prev), dtype=np.int32)
        inputs[start + np.arange(len(start))] = graph.prev
        inputs[start + np.repeat(sizes, sizes) + np.arange(len(start))] = graph.dep
        found = graph.plan.setdefault(0, inputs)  # atomic: another thread's equal plan may have landed first
    return found


def _sweep(graph: _Graph, dur: np.ndarray) -> np.ndarray:
    """The makespan of each column of ``dur`` (``_sweep_ends``' max down each column)."""
    return _sweep_ends(graph, dur).max(axis=0)


def _sweep_ends(graph: _Graph, dur: np.ndarray) -> np.ndarray:
    """Each rank's last op's end (p x columns) in each column of ``dur``: level by level, each op the max of its two
    inputs' ends plus its duration (the rows of ``dur`` gathered in level order once, ``at``), the same max and add
    as ``_span_one``."""
    done = np.empty((len(graph.at) + 1, dur.shape[1]))  # every row written (level by level) before it is read
    done[0] = 0.0
    times = dur[graph.at]  # op i's duration at row i - 1 (level order)
    inputs, maximum = _levels_plan(graph), np.maximum
    for s, e in pairwise(graph.bounds):
        got = done[inputs[2 * s : 2 * e]]
        out = done[s + 1 : e + 1]
        k = e - s
        maximum(got[:k], got[k:], out=out)
        out += times[s:e]
    return done[graph.last]


def schedule_makespans(
    kind: str, p: int, v: int, phi: float, t: np.ndarray, omega: float = 0.0
) -> tuple[np.ndarray, float]:
    """The list schedule's makespans for micro-batch times ``t`` (m x draws) and its uniform makespan (all 1), the
    weight gradient a share ``omega`` of a pass: what bench/document_wait_sim.py prints."""
    graph = _graph(kind, p, v, t.shape[0])
    spans = makespans(graph, durations(np.hstack((np.ones((t.shape[0], 1)), t)), phi, graph.split, omega, graph.blocks))
    return spans[1:], float(spans[0])


def _spans(m2: int, p: int) -> tuple[int, int]:
    """(m1, m2): the runs beyond the longest direct one (module docstring)."""
    return max(2 * p, m2 // 4 // p * p), m2


def build_cells(kind: str) -> tuple[int, int]:
    """Cells one op and one rank of ``kind``'s order cost to write out (``ScheduleTraits.order_op_cells``,
    ``order_rank_cells``): ``work``'s and ``laid_cells``' ``build`` and ``rank``."""
    traits = schedule_traits(kind)
    return traits.order_op_cells, traits.order_rank_cells


def per_microbatch(kind: str, v: int) -> int:
    """A rank's ops per micro-batch, at most: a forward and a backward per chunk (2v, Megatron's orders); where the
    order splits weight gradients off, a forward, a backward or an input gradient, and a weight gradient or an F&B
    pair's wait, per chunk the micro-batch visits on the rank (3·split; pipeline._order_zb_h1, _order_zbv,
    _order_dual)."""
    traits = schedule_traits(kind)
    return 3 * traits.stage_map.visits(v) if traits.splits_weights else 2 * max(1, v)


def _longest(p: int, v: int, per: int = 0) -> int:
    # the longest direct run (at least four groups of p)
    return max(4 * p, MAX_STEPS // (per or 2 * v) // p * p)


def _runs(p: int, v: int, m: int, per: int = 0) -> tuple[int, ...]:
    """The micro-batch counts actually run for m: m itself, or (m1, m2) to extrapolate from; ``per``: the rank's
    ops a micro-batch (``per_microbatch``; 0: 2v)."""
    m2 = _longest(p, v, per)
    return (m,) if m <= m2 else _spans(m2, p)


def laid_cells(p: int, ops: int, build: int = 0, rank: int = 0, rounds: int = RELAX_CHARGED) -> int:
    """Cells of laying a structure of ``ops`` ops on ``p`` ranks out cold (``_graph``): its order written out
    (``build`` cells an op and ``rank`` a rank: ``build_cells``), each op's input, level sort and rows (LAY_CELLS),
    and the relaxation (``rounds`` Gauss-Seidel rounds of 2p rank steps over the ops: RELAX_CHARGED up front, a laid
    structure's own ``_Graph.rounds`` counted after). The one charge of a structure's build: ``work`` (the draws')
    and ``span_work`` (the step's order) add it (guard14)."""
    relax = rounds * (RELAX_CELLS * ops + 2 * p * RANK_STEP_CELLS)
    return (build + LAY_CELLS) * ops + rank * p + relax


def work(p: int, v: int, m: int, draws_: int, nodes: int = NODES, per: int = 0, build: int = 0, rank: int = 0) -> int:
    """Cells of one call at ``draws_`` draws on ``nodes`` grid nodes (each with its uniform column): per run of
    per·m·p ops (``per_microbatch``; 0: 2v), the sweep's ops x columns and its levels' numpy steps (LEVEL_CELLS
    each, per column chunk), the structure laid out once (``laid_cells``: ``build`` cells an op and ``rank`` a rank
    where the order is written from runs, ``build_cells``)."""
    total, columns, per = 0, nodes * (draws_ + 1), per or 2 * v
    for mr in _runs(p, v, m, per):
        ops, levels = per * mr * p, per * mr + 2 * (p - 1)
        chunks = -(-columns // max(1, CHUNK // (ops + 1)))
        total += ops * columns + levels * chunks * LEVEL_CELLS + laid_cells(p, ops, build, rank)
    return total


@lru_cache(maxsize=1024)
def runs_at(p: int, v: int, m: int, per: int = 0, build: int = 0, rank: int = 0) -> tuple[int, int]:
    """(nodes, draws) a call runs within CELLS: the grid (NODES nodes, DRAWS draws) where it fits, else the
    candidate's own key (one node) at DRAWS, else at the most of DRAWS / 2^k down to MIN_DRAWS; draws 0: the flow
    shop (``method`` says which). ``per``: the rank's ops a micro-batch (``per_microbatch``; 0: 2v); ``build``,
    ``rank``: the cells an op and a rank cost to write out (``build_cells``)."""
    if p == 1 or work(p, v, m, DRAWS, NODES, per, build, rank) <= CELLS:
        return NODES, DRAWS
    d = DRAWS
    while d >= MIN_DRAWS and work(p, v, m, d, 1, per, build, rank) > CELLS:
        d //= 2
    return 1, d if d >= MIN_DRAWS else 0


def draws(p: int, v: int, m: int, per: int = 0, build: int = 0) -> int:
    """The draws a call runs (``runs_at``); 0: the flow shop."""
    return runs_at(p, v, m, per, build)[1]


@lru_cache(maxsize=1024)
def order_run(kind: str, p: int, v: int, m: int) -> tuple[str, int, int, int] | None:
    """(kind, v, nodes, draws) of the order a call runs: ``kind``'s own within the work bound (``runs_at``), else
    its stand-ins in turn at the same (p, m) (``ScheduleTraits.wait_stand_ins``: cheaper orders whose wait errs on
    the safe side; review r11a #1), else None: the flow shop (also for an order not
    written out). One stage runs none either (None)."""
    traits = schedule_traits(kind)
    if p == 1 or traits.order is None:
        return None
    for k, kv in ((kind, v), *traits.wait_stand_ins):
        nodes, d = runs_at(p, kv, m, per_microbatch(k, kv), *build_cells(k))
        if d:
            return k, kv, nodes, d
    return None


def call_work(kind: str, p: int, v: int, m: int) -> int:
    """Cells of one call as it runs (``order_run``; planner/estimate.py charges it): the order run, its own or a
    stand-in's; 0 for the flow shop (an order not written out, or every one over the bound) and for one stage."""
    run = order_run(kind, p, v, m)
    if run is None:
        return 0
    k, kv, nodes, d = run
    return work(p, kv, m, d, nodes, per_microbatch(k, kv), *build_cells(k))


def method(sched: Schedule) -> str:
    """How the wait for packed micro-batches is found for ``sched`` (the plan's Assumptions row)."""
    p, v, m = sched.stages, max(1, sched.chunks), sched.microbatches
    if p == 1:
        return "one stage: its micro-batches back to back, the spread of their sum (no pipeline to wait in)"
    if sched.traits.order is None:
        return f"the flow shop's (p - 1)·E[max of m] (the {sched.kind} order is not written out)"
    run = order_run(sched.kind, p, v, m)
    own = f"the {sched.kind} order at pp {p}, v {v}, m {m} is over the work bound ({CELLS:,} cells)"
    if run is None:
        return (
            f"the flow shop's (p - 1)·E[max of m]: {own}, and so are its stand-ins; it is short of an order with no "
            "slack in its steady state (1F1B's run once at pp 256-1024, m 4p: 3.9-4.4x the flow shop's)"
        )
    kind, kv, nodes, d = run
    error = "" if d == DRAWS else f", sampling error {math.sqrt(DRAWS / d):.1f}x the {DRAWS} draws' 2-3%"
    how = "interpolated on its (phi, rho) grid" if nodes > 1 else "at its own (phi, rho)"
    if kind == sched.kind:
        return f"the {kind} order run as a list schedule, {d} fixed-seed draws {how}{error}"
    return (
        f"{own}: the cheaper {kind} order (v {kv}, no slack in its steady state) run in its place as a list schedule, "
        f"{d} fixed-seed draws {how}{error}; it waits no less than the {sched.kind} order, to 0.5% (the safe side, "
        "measured at pp 4-128: ZB-H1 0.64-1.005 of 1F1B's wait, DualPipe(V) 0.20-0.82, ZBV 0.04-0.64, the interleaved "
        "order 0.07-0.69), where the flow shop was 3.6x short (review r11a #1)"
    )


_NODE_CACHE: OrderedDict[tuple, tuple[float, float]] = OrderedDict()
NODE_CACHE = 1 << 14  # (structure, phi, rho) moments kept (two floats each)


def _node_moments(
    kind: str, p: int, v: int, m: int, nodes: list[tuple[float, float]], d: int, omega: float = 0.0
) -> list[tuple]:
    """(mean excess per sigma, variance per sigma²) at each (phi, rho) node, those not cached run together: each
    node's uniform column and its d draws, t = max(1 + rho·z, 0), the weight gradient a share ``omega`` of a pass;
    the draws' own (t - 1) / rho subtracted as the control variate (review r10a #3: its mean is the clipped
    draws', so clipping adds no work the planner does not price)."""
    keys = [(kind, p, v, m, d, omega, phi, rho) for phi, rho in nodes]
    got = {k: _NODE_CACHE.get(k) for k in keys}  # read once: another thread may evict between steps
    missing = [k for k, found in got.items() if found is None]
    if missing:
        # C order: the first m1 rows are the same draws at any m (common random numbers across m and nodes)
        z = np.random.Generator(np.random.PCG64(SEED)).standard_normal((m, DRAWS))[:, :d]
        ts = [np.maximum(1.0 + k[-1] * z, 0.0) for k in missing]
        graph = _graph(kind, p, v, m)
        dur = np.hstack(
            [
                durations(np.hstack((np.ones((m, 1)), t)), k[-2], graph.split, omega, graph.blocks)
                for k, t in zip(missing, ts, strict=True)
            ]
        )
        spans = makespans(graph, dur).reshape(len(missing), d + 1)
        for k, t, span in zip(missing, ts, spans, strict=True):
            rho = k[-1]
            extra = (span[1:] - span[0]) / rho
            got[k] = _NODE_CACHE[k] = (
                float(np.mean(extra - (t - 1.0).sum(axis=0) / rho)),
                float(np.var(extra, ddof=1)),
            )
    with suppress(KeyError):
        for k in got:
            _NODE_CACHE.move_to_end(k)
        while len(_NODE_CACHE) > NODE_CACHE:
            _NODE_CACHE.popitem(last=False)
    return [got[k] for k in keys]


def _moments(
    kind: str, p: int, v: int, m: int, nodes: list[tuple[float, float]], d: int, omega: float = 0.0
) -> list[tuple]:
    """The nodes' moments at m: run directly, or at m1 and m2 and extrapolated linearly in m (module docstring)."""
    runs = _runs(p, v, m, per_microbatch(kind, v))
    if len(runs) == 1:
        return _node_moments(kind, p, v, m, nodes, d, omega)
    (m1, m2), grow = runs, (m - runs[1]) / (runs[1] - runs[0])
    near, far = (_node_moments(kind, p, v, mr, nodes, d, omega) for mr in (m1, m2))
    # the variance is not let fall below the m2 run's (a sum over more steps; with few draws the two runs' noise
    # could extrapolate it to 0: interleaved pp 64 v 16 m 1024 at 16 draws, sched11)
    return [
        (a2 + grow * (a2 - a1), max(v2, v2 + grow * (v2 - v1))) for (a1, v1), (a2, v2) in zip(near, far, strict=True)
    ]


def _bracket(nodes: tuple[float, ...], x: float, scale=float, points: int = 2) -> list[tuple[float, float]]:
    """(node, weight) pairs interpolating in scale(x) over the ``points`` nodes nearest x (Lagrange: 2 linear,
    4 cubic), the window kept inside the grid."""
    i = min(max(bisect_right(nodes, x) - points // 2, 0), len(nodes) - points)
    window = nodes[i : i + points]
    at = [scale(n) for n in window]
    u = scale(x)
    weights = [math.prod((u - b) / (a - b) for b in at if b != a) for a in at]
    return list(zip(window, weights, strict=True))


def jitter(sched: Schedule, phi: float, rho: float, omega: float = 0.0) -> Jitter | None:
    """The excess and spread of ``sched``'s makespan per unit of sigma (module docstring), the forward a share
    ``phi`` of a micro-batch, the weight gradient a share ``omega`` (read by the orders that split it off,
    ``ScheduleTraits.splits_weights``: to 0.01, the grid's nodes run at it) and its spread ``rho`` of its mean:
    inside the grid (PHI_NODES x RHO_NODES) interpolated between its nodes, outside it run at phi to 0.01 and rho to
    two significant figures (at least 1e-4); None for a schedule whose order is not written out or whose run is
    over the work bound (``method`` says which; the caller's flow shop)."""
    p, v, m = sched.stages, max(1, sched.chunks), sched.microbatches
    if p == 1:  # one stage runs the micro-batches back to back: the sum of m, no excess
        return Jitter(0.0, math.sqrt(m))
    run = order_run(sched.kind, p, v, m)
    if run is None:
        return None
    kind, v, nodes, d = run  # its own order, or a stand-in's (``order_run``)
    phi, rho = round(phi, 2), float(f"{max(rho, 1e-4):.2g}")
    if nodes > 1 and PHI_NODES[0] <= phi <= PHI_NODES[-1] and RHO_NODES[0] <= rho <= RHO_NODES[-1]:
        phis, rhos = _bracket(PHI_NODES, phi, float, 4), _bracket(RHO_NODES, rho, math.log, 4)
        weighted = [((f, r), wf * wr) for f, wf in phis for r, wr in rhos]
    else:
        weighted = [((phi, rho), 1.0)]
    weighted = [(node, w) for node, w in weighted if abs(w) > 1e-12]
    omega = round(min(max(omega, 0.0), 1.0 - phi), 2) if schedule_traits(kind).splits_weights else 0.0
    moments = _moments(kind, p, v, m, [node for node, _ in weighted], d, omega)
    mean = sum(w * a for (_, w), (a, _) in zip(weighted, moments, strict=True))
    var = sum(w * b for (_, w), (_, b) in zip(weighted, moments, strict=True))
    return Jitter(mean, math.sqrt(max(0.0, var)))


# The step's pipeline at unequal ranks (vsched12, review r11a #3): the order's list schedule with ONE deterministic
# column, each op the time of its (rank, chunk, op) from the plan's StagePass parts. Bounded by ORDER_OPS (the ops of
# one run: 0.1 ms at p 8, m 16 with the structure cached, about 2 ms to build it; at most 6 ms, 30 ms with the build,
# up to the bound: docs/step-time.md "(vsched12)"). Beyond it one run at m2, the most micro-batches (a multiple of
# 2p, at least 4p) within it, and the slowest rank's pass for each micro-batch past m2: in steady state the slowest
# rank never idles (the runs' slope is its pass from m 4p-8p on, p 4-8, random ranks), and before that the bubble
# only falls, so this is never below the direct run and at most 1.4% above it at m2 = 4p
# (tests/planner/test_pipeline_vsched.py); monotone in every op's time, as the search's bound needs. Where even
# m2 = 4p is over it (a V beyond pp 48, ZB-H1 and DualPipe beyond pp 64), None: the closed form.
ORDER_OPS = 1 << 16
# one column runs as a Python loop over the ops (63-69 ns an op since vsearch13, 84-102 before) where they are fewer
# than this many a level, else as ``_sweep``'s numpy steps (1.6-1.8 us a level at one column, one gather a level
# since vsearch13; 3-4 us before): the two cross at 25-29 ops a level (p 24-32; measured with ZB-H1, ZBV and
# DualPipeV at p 4-48, docs/step-time.md "(vsearch13)"; 40 at vsched12's; the same makespans bit for bit)
LOOP_PER_LEVEL = 27
# one level of an order run's ``_sweep`` in cells (CELL_UNITS a 15 ns unit: ~3 ns a cell): 1.6-2.0 us measured at
# one column, p 4-48 (docs/step-time.md "(vsearch13)"); ``span_work`` charges it (the draws' wider sweeps keep
# LEVEL_CELLS)
SPAN_LEVEL_CELLS = 600
SPANS_KEPT = 4096  # (passes, schedule) makespans kept, least recently used first
# one op of ``_span_one``'s loop in cells (CELL_UNITS a 15 ns unit: ~3 ns a cell): 63-69 ns an op measured with ZBV,
# DualPipeV and ZB-H1 at p 4-48 (docs/step-time.md "(vsearch13)"; 90-130 ns at mend12a's loop), ``span_work`` charges it
SPAN_LOOP_CELLS = 22
_SPANS: OrderedDict[tuple, float | None] = OrderedDict()
ENDS_KEPT = 4096  # (passes, schedule) -> each rank's end in its order's run, least recently used first
_ENDS: OrderedDict[tuple, tuple[float, ...] | None] = OrderedDict()


def chunk_table(passes: Sequence[StagePass], split: int, blocks: int) -> np.ndarray:
    """The per-(rank, chunk, block) op times of ``_Graph.cell`` (blocks: forward, full backward, input gradient,
    weight gradient), one column: with one chunk the rank's F, B, B - W, W; with two (a V) chunk 0's forward the
    pass's ``fill_s`` and chunk 1's backward its ``drain_s`` (step.stage_passes: each chunk's real share, the
    backward's share taken as the forward's), the other chunk the rest, W in the backward's shares. ``split``: the
    rank's chunks, which share the pass over all of them (``StagePass.pass_forward_s``: DualPipe's is a micro-batch
    each way, each chunk the stage one direction runs, dualpipe13)."""
    rows = []
    for x in passes:
        if split == 1:
            fwd, bwd = (x.forward_s,), (x.backward_s,)
        else:
            fill, drain = x.ends(split)
            fwd = (fill, *((x.pass_forward_s - fill) / (split - 1),) * (split - 1))
            bwd = (*((x.pass_backward_s - drain) / (split - 1),) * (split - 1), drain)
        for f, b in zip(fwd, bwd, strict=True):
            w = x.weight_s * (b / x.backward_s if x.backward_s > 0 else x.copies / split)
            rows.append((f, b, b - w, w)[:blocks])
    return np.append(np.array(rows, dtype=np.float64).ravel(), 0.0)[:, None]


def span_run(kind: str, p: int, v: int, m: int) -> int:
    """The micro-batches the run takes: m within ORDER_OPS, else the most (a multiple of 2p: DualPipe's even m) within
    it if at least 4p (past ZBV's 2p - 1 and DualPipe(V)'s 2p), else 0: over the bound."""
    per = per_microbatch(kind, v) * p
    if per * m <= ORDER_OPS:
        return m
    m2 = ORDER_OPS // per // (2 * p) * (2 * p)
    return m2 if m2 >= 4 * p else 0


def span_work(kind: str, p: int, v: int, m: int, columns: int = 1) -> int:
    """Cells of ``columns`` order runs at (kind, p, v, m) as ``order_span`` / ``order_spans`` run them cold
    (``span_run``: 0 over ORDER_OPS or for one stage): the structure laid out once (``laid_cells``: the order
    written out, each op's input, level and rows, RELAX_CHARGED relaxation rounds; guard14: 0.4-0.6 of it was
    charged before), then ``run_cells`` of the columns, the ops (per_microbatch·run·p) and levels counted as
    ``work`` counts them; planner/estimate.py charges it (CELL_UNITS a unit)."""
    traits = schedule_traits(kind)
    run = span_run(kind, p, max(1, v), m) if traits.orders_at(p) else 0
    if not run:
        return 0
    per = per_microbatch(kind, v)
    ops, levels = per * run * p, per * run + 2 * (p - 1)
    return laid_cells(p, ops, *build_cells(kind)) + run_cells(columns, ops, levels)


def run_cells(columns: int, ops: int, levels: int) -> int:
    """Cells of ``columns`` runs of a laid-out structure of ``ops`` ops in ``levels`` levels: each column its loop
    (SPAN_LOOP_CELLS an op) where the columns' ops are fewer than LOOP_PER_LEVEL a level, else one sweep (an op and
    column a cell, SPAN_LEVEL_CELLS a level per column chunk, and 2 cells an op: the sweep's plan laid out)."""
    if _loops_cheaper(columns, ops, levels):
        return columns * ops * SPAN_LOOP_CELLS
    chunks = -(-columns // max(1, CHUNK // (ops + 1)))
    return 2 * ops + columns * ops + levels * chunks * SPAN_LEVEL_CELLS


def _loops_cheaper(columns: int, ops: int, levels: int) -> bool:
    """Whether ``columns`` runs of ``ops`` ops in ``levels`` levels cost less as one loop a column (``_span_one``)
    than as one sweep (fewer than LOOP_PER_LEVEL ops a level): the choice the runs make and ``span_work`` charges."""
    return columns * ops < LOOP_PER_LEVEL * levels


def _span_one(graph: _Graph, table: list[float]) -> float:
    """``_sweep`` of one column as a loop over the ops in level order (each op's inputs are earlier rows)."""
    return max(_ends_one(graph, table))


def _ends_one(graph: _Graph, table: list[float]) -> list[float]:
    """Each rank's last op's end in ``_span_one``'s loop (order_ends reads them apart; dualpipe13b)."""
    prev, dep, cell = (memoryview(x) for x in (graph.prev, graph.dep, graph.cell))  # int32, no copy
    done = [0.0]  # op i's end at i + 1, appended in level order (vsearch13: 75-80 ns an op, 90-100 indexed)
    append = done.append
    for a, b, c in zip(prev, dep, cell, strict=True):
        x = done[a]
        y = done[b]
        append((x if x > y else y) + table[c])
    return [done[r] for r in graph.last.tolist()]


def _span_key(passes: Sequence[StagePass], sched: Schedule) -> tuple:
    return (tuple(passes), sched.kind, sched.stages, max(1, sched.chunks), sched.microbatches, ORDER_OPS)


def _span_graph(sched: Schedule) -> tuple[int, _Graph | None]:
    """(the micro-batches the run takes, its structure): 0 and None where it runs none (``_span_takes``)."""
    run = _span_takes(sched)
    return (run, _graph(sched.kind, sched.stages, max(1, sched.chunks), run)) if run else (0, None)


def _span_takes(sched: Schedule) -> int:
    """The micro-batches the run takes: 0 where the run is over ORDER_OPS, the order is not written out or the
    schedule's rules do not hold (an order runs only where they hold: its chunks per rank, DualPipe's even pp,
    DualPipe(V)'s even m >= 2pp; a plan's checked by planner/parallel.py, pipeline_time is also called bare)."""
    p, v, m = sched.stages, max(1, sched.chunks), sched.microbatches
    traits = sched.traits
    valid = traits.order is not None and traits.runs_chunks(v) and not traits.microbatch_rule(sched.kind, m, p)
    valid = valid and not (traits.even_pp and p % 2)
    return span_run(sched.kind, p, v, m) if valid else 0


def _keep(memo: OrderedDict, key: tuple, value, kept: int) -> None:
    memo[key] = value
    with suppress(KeyError):
        while len(memo) > kept:
            memo.popitem(last=False)


def order_span(passes: Sequence[StagePass], sched: Schedule) -> float | None:
    """The makespan of ``sched``'s order with each op the time of its (rank, chunk, op) in ``passes`` (``chunk_table``;
    p2p left out, as ``bubble_s``'s forms leave it): one deterministic column through the cached structure, past
    ``span_run`` the slowest pass a micro-batch more; memoised on (passes, kind, p, v, m) (``order_spans`` fills the
    memo for many at once); None where the run is over ORDER_OPS (``order_method``), the order is not written out or
    the schedule's rules do not hold."""
    key = _span_key(passes, sched)
    if key in _SPANS:
        with suppress(KeyError):
            _SPANS.move_to_end(key)
            return _SPANS[key]
    return _run_orders(((passes, sched),))[0].get(key)


def order_spans(jobs: Iterable[tuple[Sequence[StagePass], Schedule]]) -> None:
    """``order_span`` of many (passes, schedule) at once into its memo (mend12a, review r12a #2): the jobs of one
    structure (kind, p, v, run) not yet memoised run as the columns of ONE ``_sweep`` (its numpy steps a level
    shared by the columns: 1.6-2.0 us a level plus 2-5 ns a cell, against ``_span_one``'s 63-69 ns an op and
    column; ``makespans``: in chunks of CHUNK cells) where the columns' ops are at least LOOP_PER_LEVEL a level,
    else each column its own loop (as for one job alone: ``order_span`` runs through the same ``_run_orders``). The same
    makespans bit for bit (each column's max and add in the same order; tests/planner/test_pipeline_vsched.py): the
    search calls it with the bounds timing prices together (planner/search/evaluate.py ``_InOrder``, step_model.py
    ``lower_bounds_many``) and a window's data floors and refined bounds (``warm_paths``)."""
    _run_orders(jobs)


def _run_orders(
    jobs: Iterable[tuple[Sequence[StagePass], Schedule]], again: bool = False
) -> tuple[dict[tuple, float | None], dict[tuple, tuple[float, ...] | None]]:
    """The makespans and each rank's end (``order_ends``: None where the run does not take all m micro-batches) of
    the jobs not yet memoised (``again``: of every job), by memo key, each kept in both memos from the same run
    (guard14: the step's ``drain_leads_of`` read the ends through a second run of the same column): grouped by
    structure, each group one sweep or one loop a column (``order_spans``), the slowest pass a micro-batch past the
    run. A table of no time at all (the search's data floors: passes of no compute) ends every rank at 0.0 without
    a run (every op's max and add of zeros is 0.0; guard14), its structure not laid out for it."""
    groups: dict[tuple, dict] = {}
    out: dict[tuple, float | None] = {}
    ends: dict[tuple, tuple[float, ...] | None] = {}
    for passes, sched in jobs:
        key = _span_key(passes, sched)
        if (key in _SPANS and not again) or key in out:
            continue
        run = _span_takes(sched)
        if not run:
            out[key] = ends[key] = None
            continue
        found = groups.setdefault((sched.kind, sched.stages, max(1, sched.chunks), run), {})
        found.setdefault(key, (own_passes(passes, sched), sched))
    for (kind, p, v, run), pending in groups.items():
        tables = {key: chunk_table(passes, *_table_shape(kind, v)) for key, (passes, _) in pending.items()}
        columns = {key: [0.0] * p for key, table in tables.items() if not table.any()}
        timed = [key for key in tables if key not in columns]
        if timed:
            graph = _graph(kind, p, v, run)
            if _loops_cheaper(len(timed), len(graph.at), len(graph.bounds) - 1):
                runs = [_ends_one(graph, tables[key][:, 0].tolist()) for key in timed]
            else:
                runs = rank_ends(replace(graph, at=graph.cell), np.hstack([tables[key] for key in timed])).T.tolist()
            columns.update(zip(timed, runs, strict=True))
        for key, (passes, sched) in pending.items():
            col = columns[key]
            out[key] = max(col) + (sched.microbatches - run) * max(x.total_s for x in passes)
            ends[key] = tuple(col) if run == sched.microbatches else None
    for key, span in out.items():
        _keep(_SPANS, key, span, SPANS_KEPT)
        _keep(_ENDS, key, ends[key], ENDS_KEPT)
    return out, ends


def order_method(sched: Schedule) -> str:
    """How ``pipeline.bubble_s`` prices ``sched``'s fill and drain where its ranks or chunks differ (the plan's
    Assumptions row; the closed form where every rank and chunk is equal, where it is exact)."""
    p, v, m = sched.stages, max(1, sched.chunks), sched.microbatches
    if not sched.traits.orders_at(p):
        return ""
    run = span_run(sched.kind, p, v, m)
    how = f"the {sched.kind} order run as a list schedule, each rank's and chunk's forward and gradients at their times"
    if run and run < m:
        how += f" at m {run} ({ORDER_OPS:,} ops a run at most), the slowest rank's pass a micro-batch beyond"
    elif not run:
        how = (
            f"the closed form, each other rank's share summed (the order at pp {p}, m {m} is over {ORDER_OPS:,} ops a "
            "run; above the order where one rank is slower, below it by up to 0.34 of a pass a rank where ranks split "
            "their passes differently)"
        )
    return f"{how} where ranks or chunks differ; the closed form, exact there, where all are equal"


__all__ = [
    "CELLS",
    "CELL_UNITS",
    "DRAWS",
    "MAX_STEPS",
    "PHI_NODES",
    "RHO_NODES",
    "SEED",
    "Jitter",
    "call_work",
    "draws",
    "durations",
    "jitter",
    "makespans",
    "method",
    "order_method",
    "order_run",
    "order_span",
    "order_spans",
    "runs_at",
    "schedule_makespans",
    "span_work",
    "work",
]


# ops of an order the timeline draws one block each (order_blocks); past it the closed-form timeline (pipeline.timeline)
TIMELINE_OPS = 4096
# structures of at most TIMELINE_OPS ops whose per-rank arrays (``_levels``: five intp arrays, 40 bytes an op)
# ``_graph`` keeps for ``order_blocks``, least recently laid out first: 64, as the lru_cache of the second layout they
# replace held (guard14), at most ~10 MiB; apart from the structures' cache, whose GRAPH_OPS bound counts 16 B an op
TIMELINE_KEPT = 64
_TIMELINE_LEVELS: OrderedDict[tuple, tuple[np.ndarray, ...]] = OrderedDict()
# the drawn name of each op kind (pipeline.OP_*): the input-gradient backward is a backward, OP_WAIT and OP_IDLE none
_DRAWN = ("forward", "backward", "backward", "wgrad", "", "forward", "")


def order_ends(passes: Sequence[StagePass], sched: Schedule) -> tuple[float, ...] | None:
    """When each rank's last op ends in ``sched``'s order run at ``passes``' times (``order_span``'s run: the same
    structure, chunk table and max-then-add; the largest is its makespan), so the step places each rank's gradient
    reduction after its own last backward (planner/step.py ``drain_leads_of``; dualpipe13b: DualPipe's last rank ends
    last too, where 1F1B's shape had it drain first). None where the run does not take all m micro-batches (over
    ORDER_OPS), the order is not written out or the schedule's rules do not hold. Memoised with ``order_span``: the
    run that prices the makespan keeps the ends too (guard14)."""
    key = _span_key(passes, sched)
    if key in _ENDS:
        with suppress(KeyError):
            _ENDS.move_to_end(key)
            return _ENDS[key]
    return _run_orders(((passes, sched),), again=True)[1].get(key)


def order_blocks(passes: Sequence[StagePass], sched: Schedule, span_s: float) -> list[dict] | None:
    """The compute blocks of ``sched``'s own order per rank, from the run ``order_span`` prices (the same structure,
    chunk table and max-then-add, dualpipe13b): each op one block at its list-schedule time t, drawn at
    t + S·min(1, t / e) where S = ``span_s`` - the makespan (the sends the run leaves out, 2(p - 1) one-way sends and m
    steady waits, which the priced pipeline adds: pipeline.pipeline_time) and e the earliest rank's end: every rank's
    last block then ends S after its end in the run, where the step prices it (``order_ends``), the last at ``span_s``,
    and time 0 stays 0. DualPipe's blocks carry their ``direction`` (the op's chunk, StageMap.op_chunk). None where
    ``order_ends`` is, or the order holds over TIMELINE_OPS ops."""
    graph = _span_graph(sched)[1]
    p = sched.stages
    ends = order_ends(passes, sched)
    if ends is None or graph is None or len(graph.at) > TIMELINE_OPS:
        return None
    traits = sched.traits
    key = (sched.kind, p, max(1, sched.chunks), sched.microbatches)  # the run takes all m (``order_ends``)
    found = _TIMELINE_LEVELS.get(key)  # the per-rank arrays ``_graph`` laid the structure out from
    op, mb, stage, flat, level = found if found is not None else _levels(*key)
    n = op.shape[1]
    rank = np.arange(p)[:, None]
    cell = (rank * graph.chunks + traits.stage_map.op_chunk(rank, stage, p)) * graph.blocks + _ROW[op]
    table = chunk_table(passes, graph.chunks, graph.blocks)[:, 0]
    dur = np.where(_ROW[op] < 0, 0.0, table[np.minimum(cell, len(table) - 1)]).ravel().tolist()
    flat, ops = flat.ravel().tolist(), op.ravel().tolist()
    end = [0.0] * (p * n)
    start = [0.0] * (p * n)
    for i in np.argsort(level.ravel(), kind="stable").tolist():  # level order: each op's inputs are done
        before = end[i - 1] if i % n else 0.0
        after = end[flat[i]] if flat[i] >= 0 else 0.0
        start[i] = before if before > after else after
        end[i] = start[i] + dur[i]
    sends, first = span_s - max(ends), min(ends)

    def drawn(t: float) -> float:
        return max(0.0, t + sends * (min(1.0, t / first) if first > 0 else 1.0))

    chunk = traits.stage_map.op_chunk(rank, stage, p).ravel().tolist()
    mbs = mb.ravel().tolist()
    events = []
    for i, kind in enumerate(ops):
        if not _DRAWN[kind] or dur[i] <= 0:
            continue
        ev = {
            "stage": i // n,
            "stream": "compute",
            "name": _DRAWN[kind],
            "microbatch": mbs[i],
            "microbatches": 1,
            "start_s": drawn(start[i]),
            "end_s": drawn(end[i]),
        }
        if traits.directions > 1:
            ev["direction"] = chunk[i]
        events.append(ev)
    return events
