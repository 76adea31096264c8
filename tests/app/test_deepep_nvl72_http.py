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
