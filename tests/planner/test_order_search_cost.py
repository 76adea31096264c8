"""The order-priced schedules' search cost (vsearch13, review r12a #2): the runner's sweep and loop give the same
makespans bit for bit at random chunk tables; the bound the screen keeps for a layout whose pipeline may run its order
(busiest_rank_s) is never above the pipeline (Hypothesis over random passes, every order-priced schedule); timing
walks the screened layouts in the order of their compute-only bounds whatever it prices when (evaluate._InOrder, over
random bounds with ties); and a V / zero-bubble search gives the same answer however many bounds it prices at once."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collectives.topology import cluster_preset
from planner import WorkloadSpec, model_preset
from planner import pipeline_jitter as pj
from planner.pipeline import Schedule, StagePass, busiest_rank_s, by_order, pipeline_time
from planner.search import evaluate
from planner.search.engine import search
from planner.search.evaluate import Problem, Screened, _InOrder
from planner.search.space import Constraints

KINDS = ("zb-h1", "zbv", "dualpipe", "dualpipev")
_share = st.floats(0.05, 0.95)


@st.composite
def _passes(draw, p: int) -> list[StagePass]:
    """p ranks of their own pass: total 0.2-5, forward 0.1-0.6 of it, W up to the backward, a chunk-0 share."""
    out = []
    for _ in range(p):
        total, f, w, a = draw(st.floats(0.2, 5.0)), draw(st.floats(0.1, 0.6)), draw(_share), draw(_share)
        fwd, bwd = f * total, (1 - f) * total
        out.append(StagePass(fwd, bwd, fwd * a, bwd * (1 - a), w * bwd))
    return out


@st.composite
def _cases(draw) -> tuple[list[StagePass], Schedule]:
    kind = draw(st.sampled_from(KINDS))
    p = draw(st.sampled_from((2, 4, 6, 8)))
    least = 2 * p if kind.startswith("dual") else 1
    m = draw(st.integers(least, 6 * p))
    m += m % 2 if kind.startswith("dual") else 0
    return draw(_passes(p)), Schedule(kind, p, m, 1 if kind == "zb-h1" else 2)


@settings(max_examples=120, deadline=None)
@given(_cases())
def test_the_busiest_rank_bound_is_never_above_the_ordered_pipeline(case):
    """The screen keeps m times the slowest rank's pass for a layout whose pipeline may run its order, and timing
    prices the pipeline only when that bound is at most what it reaches (``_InOrder``). Sound because
    pipeline_time = m·(t_max + wait) + bubble + fill with wait, fill >= 0 and the ordered bubble max(0, span - m·t_max)
    >= 0, and IEEE rounding is monotone: fl(m·(t_max + wait)) >= fl(m·t_max), adding a non-negative never lowers a
    sum. Here over random passes (each rank's own total, forward share, W and chunk split) at every order-priced
    schedule, m from its least to 6p: where the order runs, too, its makespan is at least m·t_max (the slowest rank
    runs m passes one after another)."""
    passes, sched = case
    exact = pipeline_time(passes, sched).time_s
    assert busiest_rank_s(passes, sched) <= exact
    if by_order(passes, sched):
        span = pj.order_span(passes, sched)
        assert span is None or span >= sched.microbatches * max(x.total_s for x in passes) * (1 - 1e-12)


@settings(max_examples=60, deadline=None)
@given(case=_cases(), columns=st.integers(1, 40))
def test_the_sweep_and_the_loop_give_the_same_makespans_bit_for_bit(case, columns):
    """``_sweep`` (one gather a level from ``_levels_plan``, the durations gathered in level order once) and
    ``_span_one`` (the loop, appending) at random chunk tables: the same max and add per op, so the same floats."""
    passes, sched = case
    _, graph = pj._span_graph(sched)
    if graph is None:
        return
    rng = np.random.default_rng(columns)
    base = pj.chunk_table(passes, graph.chunks, graph.blocks)  # as _run_orders
    tables = np.hstack([base * rng.uniform(0.5, 1.5, base.shape) for _ in range(columns)])
    tables[-1] = 0.0  # the no-time row
    swept = pj.makespans(replace(graph, at=graph.cell), tables)
    looped = [pj._span_one(graph, tables[:, c].tolist()) for c in range(columns)]
    assert swept.tolist() == looped
    assert len(graph.plan[0]) == 2 * len(graph.at)  # laid out once, on the structure: two inputs an op


@settings(max_examples=150, deadline=None)
@given(
    rows=st.lists(st.tuples(st.integers(0, 6), st.integers(0, 3), st.booleans()), min_size=1, max_size=60),
    ahead=st.sampled_from((1, 2, 5, 32)),
    stop=st.one_of(st.just(math.inf), st.integers(0, 7)),
)
def test_timing_walks_the_screened_layouts_in_bound_order_whatever_it_prices_when(rows, ahead, stop):
    """Bounds with many ties (integers), some known in the screen, the others kept at a busiest-rank bound below
    or at theirs: ``_InOrder`` gives the layouts in the order Screened.of sorts every bound known (bound, then the
    walk), each with its own bound; where timing stops (the first bound above ``stop``) it has priced no layout
    whose kept bound is above ``stop``, and the count left is the same."""
    exact = [float(e) for e, _, _ in rows]
    kept = [e if known else e - gap for e, (_, gap, known) in zip(exact, rows, strict=True)]
    known = [k for _, _, k in rows]
    picks = [(i, 1, 0) for i in range(len(rows))]
    priced: list[int] = []

    def price(asked):
        priced.extend(i for i, _, _ in asked)
        return [exact[i] for i, _, _ in asked]

    walk = _InOrder(Screened.of(None, kept, picks, None, known), price, ahead)
    want = sorted(range(len(rows)), key=lambda i: (exact[i], i))
    got = []
    for _ in rows:
        bound_s, index, _, _ = walk.next(stop)
        if bound_s > stop:
            break
        got.append((bound_s, index))
    reached = [(exact[i], i) for i in want if exact[i] <= stop]
    assert got == reached
    # batches go by kept bound and each starts at one within ``stop``: only the last may reach past it
    assert len([i for i in priced if kept[i] > stop]) < ahead
    assert len(set(priced)) == len(priced)  # none priced twice


@pytest.mark.parametrize("ahead", [1, 7, 10**9])
def test_a_v_search_gives_the_same_answer_however_many_bounds_it_prices_at_once(ahead, monkeypatch):
    """A search of ZBV / DualPipeV / ZB-H1 layouts (Llama3-8B on 4 DGX H100, gbs 256): its counts and every best
    layout's step time equal the search pricing one bound at a time, seven, or all of a shape's at the first need
    (what the screen did before vsearch13), and the bounded count too (the walk's order is the same)."""
    model = model_preset("llama3-8b")
    work = WorkloadSpec(global_batch_size=256, seq_length=4096)
    fixed = {"pipeline_schedule": ["zbv", "dualpipev", "zb-h1"], "pp": [2, 4, 8], "framework": "megatron"}
    problem = Problem(model, work, cluster_preset("dgx-h100", 4), Constraints.of(fixed), top_k=3)

    def answer():
        out = search(problem, workers=1).outcome
        return (out.evaluated, out.feasible, out.bounded), [(x[0], x[2]) for x in out.best]

    reference = answer()
    monkeypatch.setattr(evaluate, "PRICE_AHEAD", ahead)
    assert answer() == reference
    assert reference[0][1] > 50 and reference[0][2] > 0  # a space with layouts to order and to bound
