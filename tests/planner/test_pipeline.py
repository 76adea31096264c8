"""Pipeline schedules in closed form (planner/pipeline.py): Narayanan et al. SC'21 §2.2 bubbles, and a timeline
that agrees with the critical path."""

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.pipeline import Schedule, StagePass, busiest_rank_s, pipeline_time, timeline, warmup_microbatches


@pytest.mark.parametrize("kind", ["1f1b", "gpipe"])
def test_equal_stages_take_m_plus_p_minus_one_slots(kind):
    p, m, f, b = 8, 32, 1.0, 2.0
    t = pipeline_time([StagePass(f, b)] * p, Schedule(kind, p, m))
    assert t.time_s == pytest.approx((m + p - 1) * (f + b))
    assert t.bubble_s[0] / t.busy_s[0] == pytest.approx((p - 1) / m)  # bubble fraction (p-1)/m


def test_interleaving_divides_the_bubble_by_v():
    p, m, v, f, b = 8, 32, 4, 1.0, 2.0
    t = pipeline_time([StagePass(f, b)] * p, Schedule("interleaved", p, m, v))
    assert t.time_s == pytest.approx(m * (f + b) + (p - 1) * (f + b) / v)


def test_boundary_sends_on_the_critical_path():
    p, m, c = 4, 8, 0.1
    base = pipeline_time([StagePass(1.0, 2.0)] * p, Schedule("1f1b", p, m)).time_s
    blocking = pipeline_time([StagePass(1.0, 2.0)] * p, Schedule("1f1b", p, m, 1, c, False)).time_s
    overlapped = pipeline_time([StagePass(1.0, 2.0)] * p, Schedule("1f1b", p, m, 1, c, True)).time_s
    assert overlapped == pytest.approx(base + 2 * (p - 1) * c)  # only the fill and the drain
    assert blocking == pytest.approx(overlapped + 2 * m * c)


def test_megatron_warmup_counts():
    assert [warmup_microbatches(Schedule("1f1b", 4, 8), s) for s in range(4)] == [3, 2, 1, 0]
    # schedules.py: (p - s - 1)·2 + (v - 1)·p
    assert warmup_microbatches(Schedule("interleaved", 4, 8, 2), 0) == 3 * 2 + 4
    assert warmup_microbatches(Schedule("1f1b", 4, 2), 0) == 2


stage_times = st.lists(st.tuples(st.floats(0.01, 5.0), st.floats(0.01, 10.0)), min_size=1, max_size=6)


@settings(max_examples=60, deadline=None)
@given(stage_times, st.integers(1, 40), st.sampled_from(["1f1b", "gpipe", "interleaved"]), st.integers(2, 4))
def test_critical_path_bounds_and_timeline(times, m, kind, v):
    passes = [StagePass(f, b) for f, b in times]
    p = len(passes)
    v = v if kind == "interleaved" else 1
    sched = Schedule(kind, p, m, v)
    t = pipeline_time(passes, sched)
    slowest = max(x.total_s for x in passes)
    assert t.time_s >= m * slowest - 1e-9  # the slowest stage is busy m times
    assert t.time_s >= sum(x.total_s for x in passes) / v - 1e-9  # one micro-batch crosses every stage
    assert all(b >= -1e-9 for b in t.bubble_s)
    events = timeline(passes, sched)
    for s in range(p):
        mine = sorted((e for e in events if e["stage"] == s), key=lambda e: e["start_s"])
        assert sum(e["microbatches"] for e in mine if e["name"] in ("forward", "1f1b")) == m * v
        assert sum(e["microbatches"] for e in mine if e["name"] in ("backward", "1f1b")) == m * v
        for a, b in itertools.pairwise(mine):
            assert b["start_s"] >= a["end_s"] - 1e-9  # one compute stream: blocks never overlap
        assert mine[0]["start_s"] >= -1e-9 and mine[-1]["end_s"] <= t.time_s + 1e-9


def test_large_counts_are_aggregated():
    passes = [StagePass(1.0, 2.0)] * 16
    events = timeline(passes, Schedule("1f1b", 16, 4096))
    assert len(events) <= 3 * 16
    assert {e["name"] for e in events} == {"forward", "1f1b", "backward"}


@settings(max_examples=200, deadline=None)
@given(
    kind=st.sampled_from(["gpipe", "1f1b", "interleaved", "zb-h1", "zbv", "dualpipe", "dualpipev"]),
    p=st.sampled_from([1, 2, 4, 8]),
    m=st.integers(1, 64),
    sends=st.sampled_from([0.0, 1e-4]),
    times=st.lists(st.tuples(st.floats(1e-5, 1.0), st.floats(1e-5, 2.0), st.floats(0.0, 1.0)), min_size=8, max_size=8),
)
def test_pipeline_time_is_never_below_the_busiest_rank(kind, p, m, sends, times):
    """busiest_rank_s (the layout search prunes on it before the bubble) is m x the slowest rank's pass, and
    pipeline_time only adds non-negative terms to it, bit for bit (so the search's pruning drops no layout
    that its compute-only bound would keep)."""
    v = 2 if kind in ("interleaved", "zbv", "dualpipe", "dualpipev") else 1
    passes = [StagePass(f, b, weight_s=b * w / 2) for f, b, w in times[:p]]
    sched = Schedule(kind, p, m, v, sends)
    busiest = busiest_rank_s(passes, sched)
    assert busiest == m * max(x.forward_s + x.backward_s for x in passes)
    assert busiest <= pipeline_time(passes, sched).time_s
