"""POST /v1/collectives/price is charged by the planner's own per-call work (planner.estimate.price_estimate,
the ``call_work`` a plan's call pays), and its answer is read off the Price by PriceOut's own fields."""

from __future__ import annotations

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
