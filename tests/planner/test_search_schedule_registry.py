"""The search reads pipeline schedules from the registry (planner/pipeline.py ``register``), not from names
(issue 19 Build 3, speed4): the default schedules are the ``searched`` ones, the chunks per rank come from the
traits, and a schedule registered in a test is enumerated and checked like the built-in ones."""

from __future__ import annotations

import pytest

from planner import SpecError
from planner.pipeline import FOLDED, SCHEDULE_TRAITS, ScheduleTraits, register, schedule_traits

from .test_search_options import SCHEDULES, space


def test_the_default_schedules_are_the_searched_ones():
    assert [n for n, t in SCHEDULE_TRAITS.items() if t.searched] == ["1f1b", "interleaved"]
    assert space(20).schedules == ["1f1b", "interleaved"]


@pytest.mark.parametrize("name", list(SCHEDULE_TRAITS))
def test_chunks_per_rank_from_the_traits(name):
    """``runs_chunks`` is the rule the search's explicit layouts used by name: interleaved any v >= 2, the V
    schedules (zbv, dualpipe, dualpipev) exactly 2, the others 1."""
    by_name = {
        "interleaved": lambda v: v >= 2,
        "zbv": lambda v: v == 2,
        "dualpipe": lambda v: v == 2,
        "dualpipev": lambda v: v == 2,
    }.get(name, lambda v: v == 1)
    assert [schedule_traits(name).runs_chunks(v) for v in range(1, 6)] == [by_name(v) for v in range(1, 6)]


def test_explicit_layouts_pick_the_schedules_that_run_their_chunks():
    layouts = ["Et*5|t*5|t*5|t*5L", "Et*2|t*3|t*3|t*2|t*2|t*3|t*3|t*2L"]
    s = space(20, pipeline_schedule=SCHEDULES, pipeline_layout=layouts)
    splits = s.stage_splits(4)
    assert [(v, sched) for v, sched, *_ in splits] == [
        (1, "1f1b"), (1, "zb-h1"),  # 4 virtual stages on pp 4: one chunk per rank
        (2, "dualpipe"), (2, "dualpipev"), (2, "interleaved"), (2, "zbv"),  # 8: two
    ]  # fmt: skip


def test_a_registered_schedule_is_searched_when_named():
    """A toy V schedule, registered here only: the constraints accept it, the space gives it two chunks per
    rank from its traits, and an unregistered name is refused naming every registered one."""
    toy = SCHEDULE_TRAITS["zbv"]
    register(ScheduleTraits("toy-v", toy.bubble, toy.warmup, toy.in_flight, stage_map=FOLDED, min_pp=2))
    try:
        s = space(20, pipeline_schedule=["1f1b", "toy-v"])
        assert s.pipelines(4) == [(1, "1f1b"), (2, "toy-v")]
        with pytest.raises(SpecError) as err:
            space(20, pipeline_schedule=["1f1b", "toy-w"])
        assert err.value.field == "constraints.pipeline_schedule"
        known = "1f1b, interleaved, gpipe, zb-h1, zbv, dualpipe, dualpipev, toy-v"
        assert f"'toy-w' is not one of {known}" in str(err.value)
    finally:
        del SCHEDULE_TRAITS["toy-v"]
    assert space(20).schedules == ["1f1b", "interleaved"]
