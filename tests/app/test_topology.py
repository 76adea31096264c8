"""POST /v1/topology: the subgraph the page draws carries the link ids and labels a plan's placement.links
reports, for the presets of every kind of fabric; bounded at 16,384 devices; bad input is a 422."""

from __future__ import annotations

from itertools import permutations

import numpy as np
import pytest

from collectives.topology import Cluster, cluster_preset

from .conftest import LLAMA70B

LLAMA8B = {
    "model": {"preset": "llama3-8b"},
    "workload": {"kind": "training", "micro_batch_size": 1, "global_batch_size": 64},
    "options": {"algorithm": "auto", "links_per_call": 24},
}
PLANS = {
    "dgx-h100 fat-tree, 64 nodes": {**LLAMA70B, "options": {"algorithm": "auto", "links_per_call": 24}},
    "gb200-nvl72, 2 racks": {
        **LLAMA8B,
        "workload": {"kind": "training", "micro_batch_size": 1, "global_batch_size": 72},
        "parallel": {"tp": 8, "pp": 2, "dp": 9},
        "cluster": {"preset": "gb200-nvl72", "num_nodes": 2},
    },
    "tpu torus 4x4x4": {**LLAMA8B, "parallel": {"tp": 4, "dp": 16}, "cluster": {"preset": "tpu-torus"}},
    "npu full mesh, 2 boards": {
        **LLAMA8B,
        "parallel": {"tp": 8, "dp": 2},
        "cluster": {"preset": "npu-mesh-8", "num_nodes": 2},
    },
}


def group_links(cluster: Cluster, devices: list[int]) -> set[int]:
    """Links any traffic among ``devices`` can load: all ordered pairs routed as pricing routes them."""
    if len(devices) < 2:
        return set()
    pairs = np.array(list(permutations(devices, 2)), dtype=np.int64)
    loads, _ = cluster.route(pairs[:, 0], pairs[:, 1], None)
    return {int(i) for i, b in zip(loads.links, loads.bytes, strict=True) if b > 0}


@pytest.mark.parametrize("name", PLANS)
def test_subgraph_links_are_the_plans_links(api, name):
    plan = api.post("/v1/plan", json=PLANS[name])
    assert plan.status_code == 200, plan.text
    plan = plan.json()
    preset = PLANS[name]["cluster"]
    cluster = Cluster(cluster_preset(preset["preset"], preset.get("num_nodes")))
    matched = 0
    for call in plan["calls"]:
        p = call["placement"]
        uses = [{"id": link["id"], "utilisation": link["utilisation"]} for link in p["links"]]
        body = {"cluster": plan["cluster"], "devices": p["group_devices"], "utilisation": uses}
        r = api.post("/v1/topology", json=body)
        assert r.status_code == 200, r.text
        view = r.json()
        edges = {link: e for e in view["edges"] for link in e["links"]}
        reported = {link["id"]: link for link in p["links"]}
        for link_id, e in edges.items():
            if link_id in reported and len(e["links"]) == 1:  # a single link: named as pricing names it
                link = reported[link_id]
                assert (e["label"], e["kind"], e["family"]) == (link["label"], link["kind"], link["family"])
                assert e["capacity_GBps"] == link["capacity_GBps"] and e["utilisation"] == link["utilisation"]
        crossed = group_links(cluster, p["group_devices"]) & set(reported)
        if view["aggregated"]:
            crossed = {i for i in crossed if reported[i]["kind"] == "nic"}
        else:  # every device of the group is drawn, marked as a member
            assert sorted(v["id"] for v in view["vertices"] if v["member"]) == sorted(
                f"d{d}" for d in p["group_devices"]
            )
        assert crossed <= set(edges), (call["name"], crossed - set(edges))
        matched += len(crossed)
        if p["links"] and p["links"][0]["id"] in edges:  # the bottleneck is coloured by its utilisation
            assert edges[p["links"][0]["id"]]["utilisation"] >= p["links"][0]["utilisation"]
    assert matched >= 8  # the plan's reported links do lie on the drawn subgraphs


def test_the_page_gets_the_same_shape_as_the_domain(api):
    """4 DGX nodes: 4 x 48 node links + 8 leaves x 2 spine bundles (tests/collectives/test_view.py)."""
    r = api.post("/v1/topology", json={"cluster": {"preset": "dgx-h100", "num_nodes": 4}, "devices": [0, 8, 16, 24]})
    view = r.json()
    assert r.status_code == 200 and len(view["edges"]) == 208 and len(view["vertices"]) == 81
    assert view["nodes"] == 4 and view["nodes_drawn"] == [0, 1, 2, 3] and not view["aggregated"]
    first = view["edges"][0]
    assert first == {
        "id": "e0",
        "source": "d0",
        "target": "s0",
        "links": [0],
        "label": "node 0 gpu 0 -> switch",
        "kind": "nvlink",
        "family": "dev_up",
        "capacity_GBps": 450.0,
        "utilisation": 0.0,
    }


def test_16384_devices_are_bounded(api):
    body = {"cluster": {"preset": "dgx-h100", "num_nodes": 2048}, "devices": list(range(16384))}
    r = api.post("/v1/topology", json=body)
    view = r.json()
    assert r.status_code == 200 and view["aggregated"] and view["truncated"] and view["nodes"] == 2048
    assert len(view["vertices"]) == 128 + 8 and len(view["edges"]) == 128 * 8
    assert len(r.content) < 200_000


CLUSTER = {"preset": "dgx-h100", "num_nodes": 4}


@pytest.mark.parametrize(
    ("body", "loc", "msg"),
    [
        ({"cluster": CLUSTER, "devices": [0, 32]}, ["body", "devices"], "device 32 is outside the cluster's 32"),
        ({"cluster": CLUSTER, "devices": [5, 5]}, ["body", "devices"], "device 5 is listed twice"),
        ({"cluster": CLUSTER, "devices": []}, ["body", "devices"], "at least 1 item"),
        ({"cluster": CLUSTER, "devices": [0], "edges": []}, ["body", "edges"], "Extra inputs"),
        ({"cluster": CLUSTER, "devices": ["0"]}, ["body", "devices", 0], "valid integer"),
        (
            {
                "cluster": CLUSTER,
                "devices": [0],
                "utilisation": [{"id": 0, "utilisation": 1}, {"id": 208, "utilisation": 1}],
            },
            ["body", "utilisation", "1", "id"],
            "no link 208: the cluster has links 0..207",
        ),
        (
            {"cluster": CLUSTER, "devices": [0], "utilisation": [{"id": 0, "utilisation": -1.0}]},
            ["body", "utilisation", 0, "utilisation"],
            "greater than or equal to 0",
        ),
        (
            {"cluster": {"preset": "dgx-h100", "num_nodes": 1 << 17}, "devices": [0]},
            ["body", "cluster", "num_nodes"],
            "COMMPLAN_MAX_DEVICES",
        ),
        (
            {"cluster": {"preset": "nope"}, "devices": [0]},
            ["body", "cluster", "preset"],
            "unknown cluster preset 'nope'",
        ),
    ],
)
def test_bad_input_is_a_422_naming_the_field(api, body, loc, msg):
    r = api.post("/v1/topology", json=body)
    assert r.status_code == 422, r.text
    (err,) = r.json()["detail"]
    assert err["loc"] == loc and msg in err["msg"], err
