"""The schedule pricer's unit routings memoised by value (collectives/topology/pricing.py unit_route): the same
loads as routing afresh, read-only, bounded, and prices unchanged whether the memo is warm or empty."""

from __future__ import annotations

import numpy as np
import pytest

from collectives import Op
from collectives.topology import cluster_preset, price_call
from collectives.topology import pricing as P
from collectives.topology.cluster import cluster_for


def fresh(cluster, src, dst, level=None):
    return cluster.route(src, dst, None, level)


def test_a_memoised_routing_is_the_fresh_one_and_read_only(monkeypatch):
    monkeypatch.setattr(P, "_ROUTES", type(P._ROUTES)())
    cluster = cluster_for(cluster_preset("dgx-h100", 4))
    src = np.arange(0, 16, dtype=np.int64)
    dst = (src + 8) % 32
    first = P.unit_route(cluster, src, dst, None)
    again = P.unit_route(cluster, src.copy(), dst.copy(), None)
    assert again is first  # found by value, not by identity
    loads, latency = fresh(cluster, src, dst)
    assert np.array_equal(first[0].links, loads.links) and np.array_equal(first[0].bytes, loads.bytes)
    assert first[1] == latency
    with pytest.raises(ValueError):
        first[0].bytes[0] = 1.0
    other = P.unit_route(cluster, src, (src + 16) % 32, None)  # other devices: another routing
    assert other is not first and not np.array_equal(other[0].links, first[0].links)


def test_the_memo_is_bounded_and_skips_large_classes(monkeypatch):
    monkeypatch.setattr(P, "_ROUTES", type(P._ROUTES)())
    monkeypatch.setattr(P, "ROUTE_CACHE", 3)
    monkeypatch.setattr(P, "ROUTE_CACHE_TRANSFERS", 8)
    cluster = cluster_for(cluster_preset("dgx-h100", 4))
    for k in range(1, 6):
        src = np.arange(8, dtype=np.int64)
        P.unit_route(cluster, src, (src + 8 * k) % 32, None)
    assert len(P._ROUTES) == 3
    big = np.arange(16, dtype=np.int64)
    P.unit_route(cluster, big, (big + 8) % 32, None)
    assert len(P._ROUTES) == 3


@pytest.mark.parametrize("op", [Op.SENDRECV, Op.ALLREDUCE, Op.ALLTOALL])
def test_prices_are_the_same_with_the_memo_warm_or_empty(op, monkeypatch):
    cluster = cluster_for(cluster_preset("dgx-h100", 4))
    placement = np.arange(32).reshape(4, 8).T.copy()  # 8 groups of 4, one rank per node
    if op is Op.SENDRECV:
        placement = np.stack([np.arange(8), np.arange(8) + 8], axis=1)
    prices = []
    for empty in (True, False, False):
        if empty:
            monkeypatch.setattr(P, "_ROUTES", type(P._ROUTES)())
        for size in (1 << 10, 3 << 20, 1 << 28):
            prices.append(price_call(op, size, placement, cluster, "auto", pricing="schedule"))
    assert prices[:3] == prices[3:6] == prices[6:]
    assert len({p.time_s for p in prices[:3]}) == 3  # three sizes, three times: the routing scaled, not reused as is
