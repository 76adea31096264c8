"""The pricers' value memos of issue 19 (plan7): NCCL's closed-form answer by the closed form's own inputs
(library/pricer.py ``_tuned``), where a placement's groups sit on nodes (pricing.py ``placement_nodes``) and a
schedule's wire bytes. Each gives what computing afresh gives, is bounded, and leaves every price unchanged
whether it is warm or empty."""

from __future__ import annotations

import numpy as np
import pytest

from collectives import Op
from collectives.topology import cluster_preset, price_call
from collectives.topology import pricing as P
from collectives.topology.cluster import cluster_for
from collectives.topology.library import pricer as L
from collectives.topology.library.calibration import DEFAULT_LIBRARY
from collectives.topology.library.model import best
from collectives.topology.select import cached_schedule


@pytest.fixture
def cluster():
    return cluster_for(cluster_preset("dgx-h100", 4))


def test_the_tuned_answer_is_the_closed_form_and_shared_by_groups_of_one_shape(cluster, monkeypatch):
    monkeypatch.setattr(L, "_TUNED", type(L._TUNED)())
    a = np.arange(32).reshape(4, 8).T.copy()  # 8 groups of 4, one rank per node
    b = a[::-1].copy()  # the same groups listed from the last: group 0 on other devices, the same shape
    shape = L.shape_of(cluster, a[0])
    assert L.shape_of(cluster, b[0]) == shape and not np.array_equal(a[0], b[0])
    feat = L.features_of(cluster)
    for nbytes in (8, 1 << 20, 3 << 27):
        cand = best(Op.ALLREDUCE, nbytes, L._candidates(Op.ALLREDUCE, shape, feat, DEFAULT_LIBRARY, "auto", "auto"))
        got, lat_s, bw_s, (schedule, sent, received, steps), channels = L._tuned(
            Op.ALLREDUCE, nbytes, shape, feat, DEFAULT_LIBRARY, "auto", "auto"
        )
        assert got == cand and lat_s == cand.latency_s_at(nbytes)
        assert bw_s == cand.time_s(nbytes, Op.ALLREDUCE) - lat_s and channels == cand.channels_used(nbytes)
        assert schedule == L.SCHEDULE_OF[cand.algorithm] and sent > 0 and received > 0 and steps > 0
    assert len(L._TUNED) == 3
    first = price_call(Op.ALLREDUCE, 1 << 20, a, cluster, pricing="library")
    second = price_call(Op.ALLREDUCE, 1 << 20, b, cluster, pricing="library")
    assert len(L._TUNED) == 3  # both placements found the entry made above
    assert first.time_s == second.time_s and first.nccl_algorithm == second.nccl_algorithm


def test_library_prices_are_the_same_with_the_memo_warm_or_empty(cluster, monkeypatch):
    placement = np.arange(32).reshape(4, 8).T.copy()
    prices = []
    for empty in (True, False, True):
        if empty:
            monkeypatch.setattr(L, "_TUNED", type(L._TUNED)())
        for op in (Op.ALLREDUCE, Op.ALLGATHER, Op.REDUCESCATTER):
            for size in (4, 1 << 16, 3 << 20, 1 << 30):
                prices.append(price_call(op, size, placement, cluster, pricing="library"))
    assert prices[:12] == prices[12:24] == prices[24:]
    assert len({p.time_s for p in prices[:4]}) == 4


def test_the_tuned_memo_is_bounded(cluster, monkeypatch):
    monkeypatch.setattr(L, "_TUNED", type(L._TUNED)())
    monkeypatch.setattr(L, "TUNED_CACHE", 3)
    placement = np.arange(8).reshape(1, 8)
    for k in range(6):
        price_call(Op.ALLREDUCE, 1024 << k, placement, cluster, pricing="library")
    assert len(L._TUNED) == 3


def fresh_nodes(cluster, placement):
    """The two facts as computed before the memo: select.local_size's runs and summarise's sorted rows."""
    nodes = cluster.node_of(placement[0])
    changes = np.flatnonzero(np.diff(nodes)) + 1
    runs = np.diff(np.concatenate([[0], changes, [len(nodes)]]))
    local = 0 if len(set(runs.tolist())) != 1 or len(np.unique(nodes)) != len(runs) else int(runs[0])
    rows = np.sort(cluster.node_of(placement), axis=1)
    return local, int((np.diff(rows, axis=1) != 0).sum(axis=1).max(initial=0)) + 1


def test_placement_nodes_is_the_fresh_computation_and_bounded(cluster, monkeypatch):
    monkeypatch.setattr(P, "_NODES", type(P._NODES)())
    monkeypatch.setattr(P, "NODES_CACHE", 4)
    rng = np.random.default_rng(7)
    cases = [
        np.arange(32).reshape(4, 8),  # one node per group: 8 per node, 1 node
        np.arange(32).reshape(4, 8).T.copy(),  # one rank per node: 1 per node, 4 nodes
        np.arange(32).reshape(2, 16),  # two whole nodes: 8 per node, 2 nodes
        np.array([[0, 1, 2, 8, 9, 16]]),  # uneven runs: 0, 3 nodes
        np.array([[0, 8, 1, 9]]),  # back to a node already left: 0, 2 nodes
        *(rng.permutation(32).reshape(4, 8) for _ in range(4)),
    ]
    for placement in cases:
        assert P.placement_nodes(cluster, placement) == fresh_nodes(cluster, placement)
        assert P.local_size(cluster, placement) == fresh_nodes(cluster, placement)[0]
    assert len(P._NODES) == 4
    monkeypatch.setattr(P, "NODES_CACHE_DEVICES", 8)  # larger placements are worked out each time, not kept
    P._NODES.clear()
    assert P.placement_nodes(cluster, cases[2]) == (8, 2) and P.local_size(cluster, cases[2]) == 8
    assert not P._NODES


def test_schedule_prices_are_the_same_with_the_placement_memo_warm_or_empty(cluster, monkeypatch):
    sends = np.stack([np.arange(8), np.arange(8) + 8], axis=1)
    rings = np.arange(32).reshape(4, 8).T.copy()
    prices = []
    for empty in (True, False):
        if empty:
            monkeypatch.setattr(P, "_NODES", type(P._NODES)())
        for op, placement in ((Op.SENDRECV, sends), (Op.ALLREDUCE, rings), (Op.ALLTOALL, rings)):
            prices.append(price_call(op, 3 << 20, placement, cluster, "auto", pricing="schedule"))
    assert prices[:3] == prices[3:]
    assert [p.nodes_per_group for p in prices[:3]] == [2, 4, 4]


def test_wire_bytes_are_kept_read_only_and_equal_to_a_fresh_count():
    schedule = cached_schedule("ring", Op.ALLREDUCE, 8, 1 << 20, 1)
    sent, received = schedule.wire_bytes()
    assert schedule.wire_bytes()[0] is sent
    again = schedule._wire_bytes()
    assert np.array_equal(sent, again[0]) and np.array_equal(received, again[1])
    assert int(sent.max()) == 2 * 7 * (1 << 20) // 8  # ring allreduce: 2(n-1)/n x M per rank
    with pytest.raises(ValueError):
        sent[0] = 0
