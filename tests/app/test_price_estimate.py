"""POST /v1/collectives/price is charged by the planner's own per-call work (planner.estimate.price_estimate,
the ``call_work`` a plan's call pays), and its answer is read off the Price by PriceOut's own fields."""

from __future__ import annotations

import numpy as np
import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings
from collectives import Op
from collectives.topology import cluster_for, cluster_preset, price_call
from planner.estimate import (
    CONTENTION_WEIGHT,
    LIBRARY_WEIGHT,
    PLACED_PER_UNIT,
    ROUTE_WEIGHT,
    SCHEDULE_WEIGHT,
    price_estimate,
)

H100x2 = {"preset": "dgx-h100", "num_nodes": 2}
LIBRARY = {"op": "allreduce", "message_bytes": 1 << 20, "group_size": 16, "cluster": H100x2}
RING = {**LIBRARY, "algorithm": "ring"}


def test_price_estimate_closed_forms():
    cluster = cluster_for(cluster_preset("dgx-h100", 2))
    # NCCL's model: O(1) per call, the contention pass over the g x n ranks, and placing them (placing_work: the
    # g x n ranks PLACED_PER_UNIT a unit and group 0's n listed, speed15)
    library = price_estimate(Op.ALLREDUCE, 1, 16, cluster, "auto", "library", "auto")
    assert library.units == LIBRARY_WEIGHT + CONTENTION_WEIGHT * 16 + 16 // PLACED_PER_UNIT + 16
    assert library.biggest == "allreduce: 1 groups of 16 ranks"
    # a pinned schedule: building it (n log2 n), routing it on each group (g n log2 n), placing; no NCCL pass
    ring = price_estimate(Op.ALLREDUCE, 3, 16, cluster, "ring", "library", "auto")
    assert ring.units == SCHEDULE_WEIGHT * 16 * 4 + ROUTE_WEIGHT * 3 * 16 * 4 + 3 * 16 // PLACED_PER_UNIT + 16


@pytest.mark.parametrize(("body", "units"), [(LIBRARY, LIBRARY_WEIGHT + CONTENTION_WEIGHT * 16 + 1 + 16),
                                             (RING, SCHEDULE_WEIGHT * 64 + ROUTE_WEIGHT * 64 + 1 + 16)])  # fmt: skip
def test_price_is_refused_over_http_exactly_above_its_estimate(body, units):
    at = TestClient(create_app(Settings(max_work=units))).post("/v1/collectives/price", json=body)
    assert at.status_code == 200, at.text
    below = TestClient(create_app(Settings(max_work=units - 1))).post("/v1/collectives/price", json=body)
    assert below.status_code == 422
    assert f"estimated work {units:,} units" in below.json()["detail"][0]["msg"]


def test_price_answer_is_the_price_read_by_its_schema(api):
    answer = api.post("/v1/collectives/price", json=RING).json()
    cluster = cluster_for(cluster_preset("dgx-h100", 2))
    price = price_call(Op.ALLREDUCE, 1 << 20, [list(range(16))], cluster, "ring")
    assert answer["bottleneck"] == price.bottleneck["kind"] != "none"
    assert answer["bottleneck_link"]["label"] == price.bottleneck["label"]
    assert (answer["time_s"], answer["bytes_sent_per_rank"]) == (price.time_s, price.bytes_sent_per_rank)
    assert answer["bytes_sent_per_rank"] == 2 * 15 * (1 << 20) // 16  # ring: 2(n-1)/n M


def test_a_router_network_is_charged_routing_its_node_pairs():
    """A router network routes each node pair once, a Python pass over its directed links (RouterNetwork.path):
    ``pairs_work`` = pairs x (1,000 + 11 x links). The pairs: every ordered one where an all-pairs schedule is a
    candidate (``candidates: all`` has direct), (log2 m + 1) m for a distance-doubling one, 2 m for a ring; a fat-tree
    routes vectorised (nothing added). Review r15c: a 256-rank torus allreduce, 6.5 s of CPU, was charged 13.6 ms."""
    torus = cluster_for(cluster_preset("tpu-torus", 64))
    placement = np.arange(64).reshape(1, 64)
    assert len(torus.network.links) == 384  # 4 x 4 x 4: 64 routers x 6 directed links

    def added(cluster, algorithm, which):
        alone = price_estimate(Op.ALLREDUCE, 1, 64, cluster, algorithm, which, "schedule")
        return price_estimate(Op.ALLREDUCE, 1, 64, cluster, algorithm, which, "schedule", placement).units - alone.units

    assert added(torus, "auto", "all") == 64 * 63 * (1_000 + 11 * 384)
    assert added(torus, "halving_doubling", "library") == (6 + 1) * 64 * (1_000 + 11 * 384)
    assert added(torus, "ring", "library") == 2 * 64 * (1_000 + 11 * 384)
    assert added(cluster_for(cluster_preset("dgx-h100", 8)), "auto", "all") == 0
    body = {"op": "allreduce", "message_bytes": 1 << 20, "ranks": list(range(64)), "candidates": "all",
            "cluster": {"preset": "tpu-torus", "num_nodes": 64}}  # fmt: skip
    refused = TestClient(create_app(Settings(max_work=64 * 63 * (1_000 + 11 * 384)))).post(
        "/v1/collectives/price", json=body
    )
    assert refused.status_code == 422 and "COMMPLAN_MAX_WORK" in refused.text, refused.text
