"""The schedule view (collectives/steps.py), which POST /v1/collectives/schedule answers: closed forms of
ring allreduce and the step limit."""

from __future__ import annotations

import pytest

from collectives import CollectiveError, build_schedule
from collectives import steps as view


def test_ring_allreduce_gathers_every_rank_into_every_slot_in_2n_minus_2_steps():
    n = 4
    sched = build_schedule("allreduce", "ring", n, 8, 4)
    v = view.schedule_view(sched)
    assert v.schedule is sched and len(v.steps) == sched.num_steps == 2 * (n - 1)
    assert v.initial == [[[r]] * n for r in range(n)]  # rank r holds only its own data in every slot
    assert all(slot == list(range(n)) for holder in v.steps[-1].holds for slot in holder)
    # reduce-scatter half: reduces; all-gather half: copies; n transfers a step of one slot (8 x 4 / 4 bytes)
    assert [all(t["reduce"] for t in s.transfers) for s in v.steps] == [True] * (n - 1) + [False] * (n - 1)
    assert all(len(s.transfers) == n and {t["bytes"] for t in s.transfers} == {8} for s in v.steps)


def test_a_schedule_over_the_step_limit_is_refused_naming_it(monkeypatch):
    monkeypatch.setattr(view, "MAX_VIEW_STEPS", 5)
    with pytest.raises(CollectiveError, match="num_ranks: 6 steps; the step view shows at most 5"):
        view.schedule_view(build_schedule("allreduce", "ring", 4, 8, 4))
