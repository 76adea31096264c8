"""An algorithm is one registered module (collectives/algorithms/): a toy one registered here, in the test only,
is listed, executed and checked against its closed form, and priced over HTTP like the built-in ones."""

from __future__ import annotations

import numpy as np
import pytest

from collectives import CollectiveError, Op, build_schedule, layouts
from collectives.algorithms import Cost, Request, register, unregister
from collectives.schedule import Schedule, Step, Transfers

NAME = "toy_star"


def star_cost(req: Request) -> Cost:
    """n-1 reduce steps into rank 0, one step back out: rank 0 receives and sends (n-1) M."""
    n, m = req.num_ranks, req.message_bytes
    return Cost(n, (n - 1) * m, (n - 1) * m)


def star(req: Request) -> Schedule:
    """Rank 0 reduces every other rank's buffer, one rank a step, then sends the sum to all at once."""
    n = req.num_ranks
    layout = layouts.chunked(req.op, req.count, 1)

    def steps():
        for r in range(1, n):
            yield Step.of(Transfers.of(r, 0, 0, 0, True))
        yield Step.of(Transfers.of(0, np.arange(1, n), 0, 0, False))

    return Schedule(req.op, NAME, n, req.count, req.itemsize, layout, steps)


@pytest.fixture
def toy():
    register(NAME, Op.ALLREDUCE, cost=star_cost, formula="n·α + (n-1)·M·β", source="a test")(star)
    yield NAME
    unregister(NAME, Op.ALLREDUCE)


def test_a_toy_algorithm_is_listed_run_and_checked_over_http(api, toy):
    listed = api.get("/v1/collectives/algorithms").json()
    assert {"algorithm": NAME, "op": "allreduce", "formula": "n·α + (n-1)·M·β", "source": "a test"} in listed
    body = {"op": "allreduce", "algorithm": NAME, "num_ranks": 5, "count": 12, "dtype": "float32", "seed": 3}
    r = api.post("/v1/collectives/verify", json=body)
    assert r.status_code == 200, r.text
    v = r.json()
    assert v["ok"] and v["max_abs_error"] <= v["tolerance"], v
    assert v["steps"] == v["expected_steps"] == 5
    m = 12 * 4  # 12 float32
    assert v["bytes_sent_per_rank"] == v["expected_bytes_sent_per_rank"] == 4 * m  # (n-1) M at rank 0
    assert v["bytes_sent"] == [4 * m, m, m, m, m] and v["bytes_received"] == [4 * m, m, m, m, m]


def test_a_toy_algorithm_prices_on_a_cluster_over_http(api, toy):
    """Pinned on 8 GPUs of one DGX H100 (schedule pricer): rank 0's NVLink ports carry (n-1) M each way,
    the busiest links; a ring moves 2(n-1)/n M per port, so the star is slower."""
    m, n = 1 << 24, 8
    body = {"op": "allreduce", "message_bytes": m, "cluster": {"preset": "dgx-h100"}, "group_size": n,
            "pricing": "schedule"}  # fmt: skip
    star_price = api.post("/v1/collectives/price", json=body | {"algorithm": NAME})
    assert star_price.status_code == 200, star_price.text
    p = star_price.json()
    assert p["algorithm"] == NAME and p["steps"] == n
    assert p["bytes_sent_per_rank"] == (n - 1) * m
    assert p["bottleneck_link"]["bytes"] == (n - 1) * m and p["bottleneck_link"]["label"] == "node 0 gpu 0 -> switch"
    ring = api.post("/v1/collectives/price", json=body | {"algorithm": "ring"}).json()
    assert p["time_s"] > ring["time_s"]


def test_unregistered_the_toy_is_unknown(toy):
    unregister(NAME, Op.ALLREDUCE)
    with pytest.raises(CollectiveError, match="unknown algorithm 'toy_star'; known: binomial_tree, bruck, direct"):
        build_schedule("allreduce", NAME, 4, 8)


def test_a_pair_registers_once():
    with pytest.raises(CollectiveError, match="ring allreduce is registered already"):
        register("ring", Op.ALLREDUCE, cost=star_cost, formula="", source="")(star)
