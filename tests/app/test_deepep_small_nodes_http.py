"""DeepEP's normal kernels on nodes smaller than their NVLink group (review r14e finding 9; rules/deepep.py
``_check_nvlink_group``): DeepEP joins min(ep, 8) consecutive EP ranks by NVLink (csrc/deep_ep.cpp ``rank %
NUM_MAX_NVL_PEERS``), so EP 16 on 4-GPU nodes and EP 4 over 2-GPU nodes are a 422 on parallel.ep_dispatch naming
the numbers; they planned (200) before. EP 8 on 8-GPU nodes and EP 16 in one 16-GPU node still plan."""

import pytest


def body(nodes: int, per_node: int, ep: int, dispatch: str = "deepep") -> dict:
    return {
        "model": {"preset": "deepseek-v3", "num_layers": 4},
        "cluster": {"preset": "dgx-h100", "num_nodes": nodes, "devices_per_node": per_node, "nics_per_node": per_node},
        "workload": {"kind": "training", "micro_batch_size": 1, "global_batch_size": nodes * per_node,
                     "seq_length": 4096},
        "parallel": {"dp": nodes * per_node, "ep": ep, "ep_dispatch": dispatch},
    }  # fmt: skip


@pytest.mark.parametrize(("nodes", "per_node", "ep", "group"), [(4, 4, 16, 8), (2, 2, 4, 4)])
def test_a_node_smaller_than_deepeps_nvlink_group_is_a_422(api, nodes, per_node, ep, group):
    r = api.post("/v1/plan?summary=true", json=body(nodes, per_node, ep))
    assert r.status_code == 422, r.text
    (detail,) = r.json()["detail"]
    assert detail["loc"][-2:] == ["parallel", "ep_dispatch"]
    msg = detail["msg"]
    assert f"join {group} consecutive EP ranks" in msg and f"min(ep {ep}, NUM_MAX_NVL_PEERS 8)" in msg
    assert f"a node of {per_node} devices holds {per_node} of this layout's EP ranks" in msg
    assert api.post("/v1/plan?summary=true", json=body(nodes, per_node, ep, "alltoall")).status_code == 200


@pytest.mark.parametrize(("nodes", "per_node", "ep"), [(3, 8, 8), (1, 16, 16)])
def test_nodes_that_hold_the_group_still_plan(api, nodes, per_node, ep):
    assert api.post("/v1/plan?summary=true", json=body(nodes, per_node, ep)).status_code == 200


def test_megatrons_flex_dispatcher_joins_the_expert_tp_x_ep_group(api):
    """Megatron's flex dispatcher builds DeepEP's buffer over the tp x ep group (token_dispatcher.py
    ``_DeepepManager(group=self.tp_ep_group)``): at tp 2 (expert TP 2 by default) and ep 8 the EP ranks are 2 apart,
    4 on a node, but the 16-rank tp x ep group fills two 8-GPU nodes, which DeepEP runs; it plans (a 422 for a
    moment this round, the check read the EP ranks alone)."""
    request = body(4, 8, 8)
    request["parallel"] |= {"tp": 2, "dp": 16, "sequence_parallel": True}
    r = api.post("/v1/plan?summary=true", json=request)
    assert r.status_code == 200, r.text
    # with expert TP 1 Megatron re-partitions tp x dp so that the EP ranks are adjacent (parallel_state.py): it plans
    request["parallel"]["expert_tp"] = 1
    assert api.post("/v1/plan?summary=true", json=request).status_code == 200
