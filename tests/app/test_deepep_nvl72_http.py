"""DeepEP's normal kernels on a GB200 NVL72 rack over HTTP (issue 21, layouts3 item 2): groups of 8 NVLink peers,
the RDMA leg between them priced on the NICs (rules/deepep.py; tests/planner/test_deepep_nvl72.py by hand)."""

import copy

BODY = {
    "model": {"preset": "deepseek-v3"},
    "workload": {"kind": "training", "micro_batch_size": 1, "global_batch_size": 64, "seq_length": 4096},
    "parallel": {"dp": 64, "ep": 16, "ep_dispatch": "deepep"},
    "cluster": {"preset": "gb200-nvl72", "num_nodes": 1, "devices_per_node": 64, "nics_per_node": 64},
}


def test_deepep_ep16_in_one_rack_has_an_rdma_leg_on_the_nics(api):
    r = api.post("/v1/plan", json=BODY)
    assert r.status_code == 200, r.text
    calls = {c["name"]: c for c in r.json()["calls"]}
    rdma = calls["ep.dispatch.rdma"]
    assert rdma["message_bytes"] == 8160 * 7168 * 2  # 4,096 tokens x 1.9921875 groups per token, bf16 rows
    assert rdma["time_s"] >= rdma["message_bytes"] / 2 / 50e9  # half leaves each rank through a 50 GB/s NIC
    body = copy.deepcopy(BODY)
    body["parallel"]["ep_dispatch"] = "hybridep"  # the whole NVLink domain: no RDMA leg
    names = {c["name"] for c in api.post("/v1/plan", json=body).json()["calls"]}
    assert "ep.dispatch.nvlink" in names and "ep.dispatch.rdma" not in names


def test_the_rdma_legs_links_colour_the_drawn_racks(api):
    """The RDMA leg is priced on nodes of 8 but its placement.links are the cluster's own links (planner/
    kernel_view.py): on two NVL72 racks the busiest links POST /v1/topology draws for the RDMA group are the
    links the plan reports, with the same labels, and they carry its utilisation; on one rack (one node, no NICs
    in its graph) the links have id -1 and a label saying they are DeepEP's view."""
    body = copy.deepcopy(BODY)
    body["model"]["num_layers"] = 4
    body["cluster"] = {"preset": "gb200-nvl72", "num_nodes": 2}
    body["parallel"]["dp"] = 144
    body["workload"]["global_batch_size"] = 144
    body["options"] = {"links_per_call": 64}
    r = api.post("/v1/plan", json=body)
    assert r.status_code == 200, r.text
    plan = r.json()
    rdma = next(c for c in plan["calls"] if c["name"] == "ep.dispatch.rdma")
    links = rdma["placement"]["links"]
    assert links and all(link["id"] >= 0 for link in links)
    drawn = api.post("/v1/topology", json={
        "cluster": plan["cluster"], "devices": rdma["placement"]["group_devices"],
        "utilisation": [{"id": link["id"], "utilisation": link["utilisation"]} for link in links],
    })  # fmt: skip
    assert drawn.status_code == 200, drawn.text
    edges = {e["label"]: e for e in drawn.json()["edges"] if len(e["links"]) == 1}
    reported = {link["label"]: link for link in links}
    shared = edges.keys() & reported.keys()
    assert {"node 0 nic 0 -> leaf 0", "node 0 nic 8 -> leaf 8"} <= shared  # GPU 8 on rail 8, not the view's 0
    for label in shared:
        assert edges[label]["links"] == [reported[label]["id"]]
        assert edges[label]["utilisation"] == reported[label]["utilisation"] > 0
    one = api.post("/v1/plan", json=BODY).json()
    lone = next(c for c in one["calls"] if c["name"] == "ep.dispatch.rdma")["placement"]
    assert lone["links"] and {link["id"] for link in lone["links"]} == {-1}
    assert lone["bottleneck_link"].endswith("(as DeepEP sees the cluster)")
