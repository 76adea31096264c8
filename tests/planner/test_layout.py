"""Rank layout: Megatron-Core's RankGenerator semantics (parallel_state.py docstring example)."""

import numpy as np
import pytest

from planner import ParallelSpec
from planner.layout import Group, RankLayout


def test_megatron_docstring_example():
    # "16 GPUs, tp 2, pp 4, dp 2: 8 tensor groups [g0, g1], [g2, g3], ...; 4 pipeline groups
    #  [g0, g4, g8, g12], ...; 8 data groups [g0, g2], [g1, g3], [g4, g6], ..." (initialize_model_parallel)
    layout = RankLayout(ParallelSpec(tp=2, pp=4, dp=2))
    assert layout.groups(("tp",)).tolist()[:3] == [[0, 1], [2, 3], [4, 5]]
    assert layout.groups(("pp",)).tolist() == [[0, 4, 8, 12], [1, 5, 9, 13], [2, 6, 10, 14], [3, 7, 11, 15]]
    assert layout.groups(("dp",)).tolist()[:4] == [[0, 2], [1, 3], [4, 6], [5, 7]]


def test_every_rank_in_exactly_one_group_of_each_kind():
    par = ParallelSpec(tp=4, cp=2, pp=2, dp=4, ep=4)
    layout = RankLayout(par)
    for dims, expert in (
        (("tp",), False),
        (("cp",), False),
        (("cp", "dp"), False),
        (("pp",), False),
        (("ep",), True),
        (("dp",), True),
    ):
        groups = layout.groups(dims, expert)
        assert sorted(groups.ravel().tolist()) == list(range(par.world_size)), dims


def test_expert_grid_repartitions_tp_cp_dp():
    layout = RankLayout(ParallelSpec(tp=2, dp=8, ep=4, expert_tp=1))
    ep = layout.groups(("ep",), expert=True)
    assert ep.tolist()[0] == [0, 1, 2, 3]  # expert_tp 1 -> ep is the fastest dimension
    assert layout.groups(("dp",), expert=True).tolist()[0] == [0, 4, 8, 12]


def test_pipeline_pairs_and_embedding_group():
    layout = RankLayout(ParallelSpec(tp=2, pp=4, dp=2))
    forward = layout.placement(Group(("pp",), pairs="pp+1"), [0, 3])
    pairs = forward.tolist()
    assert len(pairs) == 8 and [0, 4] in pairs and [1, 5] in pairs
    assert [12, 0] in pairs  # interleaved: last stage feeds the first stage's next chunk
    assert layout.placement(Group(("pp",), pairs="ends"), [0, 3]).tolist()[0] == [0, 12]


def test_sixteen_thousand_ranks_are_cheap():
    layout = RankLayout(ParallelSpec(tp=8, pp=16, dp=128))
    dp = layout.groups(("cp", "dp"), stages=[3])
    assert dp.shape == (8, 128)
    assert np.all(layout.stage_of(dp) == 3)


def test_layout_for_shares_read_only_placements():
    """Placements depend on the layout alone: plans of one layout share them, so nobody may write to them."""
    from planner.layout import layout_for

    par = ParallelSpec(tp=2, pp=4, dp=2)
    layout = layout_for(par)
    assert layout_for(ParallelSpec(tp=2, pp=4, dp=2)) is layout
    tp = layout.placement(Group(("tp",)), (1, 2))
    assert tp.tolist() == [[4, 5], [6, 7], [8, 9], [10, 11]]  # the TP groups of stages 1 and 2
    assert layout.placement(Group(("tp",)), (1, 2)) is tp
    with pytest.raises(ValueError, match="read-only"):
        tp[0, 0] = 99
