"""Selective recompute's re-listed calls over HTTP (issue 21, layouts3 item 1), and the 422 Megatron raises."""

import copy

QWEN = {
    "model": {"preset": "qwen2-57b-a14b"},
    "workload": {
        "kind": "training", "micro_batch_size": 1, "global_batch_size": 32,
        "activation_recompute": "selective", "recompute_modules": ["moe"],
    },
    "parallel": {"tp": 2, "pp": 4, "dp": 4, "ep": 4, "sequence_parallel": True},
    "cluster": {"preset": "dgx-h100", "num_nodes": 4},
}  # fmt: skip


def test_moe_recompute_lists_its_dispatch_again(api):
    """7 MoE layers per stage x 8 micro-batches: the dispatch (2048 tokens x top-8 x h 3584 x bf16) re-issued
    56 times in the backward, and the router's count reduction issued only there."""
    r = api.post("/v1/plan", json=QWEN)
    assert r.status_code == 200, r.text
    calls = {c["name"]: c for c in r.json()["calls"]}
    again = calls["ep.dispatch.recompute"]
    dispatch = 2048 * 8 * 3584 * 2
    assert (again["message_bytes"], again["calls_per_iteration"], again["phase"]) == (dispatch, 56, "backward")
    assert calls["ep.router.tokens_per_expert.recompute"]["calls_per_iteration"] == 56
    assert "ep.router.tokens_per_expert" not in calls


def test_shared_experts_recompute_with_the_shared_expert_overlap_is_a_422(api):
    body = copy.deepcopy(QWEN)
    body["workload"]["recompute_modules"] = ["shared_experts"]
    body["options"] = {"overlap": {"moe_shared_expert_overlap": True}}
    r = api.post("/v1/plan", json=body)
    assert r.status_code == 422, r.text
    detail = r.json()["detail"][0]
    assert detail["loc"][-1] == "moe_shared_expert_overlap" and "shared_experts recompute" in detail["msg"]
