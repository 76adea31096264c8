"""ep_dispatch "hybridep" over HTTP: NVIDIA's HybridEP (Megatron-Core flex dispatcher, DeepEP hybrid-ep branch)
moves DeepEP's two legs (rules/deepep.py): RDMA once per token and remote NVLink domain, then NVLink once per
target GPU; only the source differs. Hand-checked on Qwen3-30B-A3B, ep 16 over two DGX H100."""

from __future__ import annotations

import copy

from fastapi.testclient import TestClient

from app.main import create_app

client = TestClient(create_app())

BODY = {
    "model": {"preset": "qwen3-30b-a3b"},  # 48 MoE layers, h 2048, 128 experts, top 8, seq 4096
    "workload": {"kind": "training", "micro_batch_size": 1, "global_batch_size": 16},
    "parallel": {"tp": 1, "pp": 1, "dp": 16, "ep": 16, "zero_stage": 1},
    "cluster": {"preset": "dgx-h100", "num_nodes": 2},
}


def ep_calls(dispatch: str) -> dict:
    body = copy.deepcopy(BODY)
    body["parallel"]["ep_dispatch"] = dispatch
    r = client.post("/v1/plan", json=body)
    assert r.status_code == 200, r.text
    return {c["name"]: c for c in r.json()["calls"] if c["name"].startswith(("ep.dispatch", "ep.combine"))}


def test_hybridep_moves_deepeps_legs_by_hand():
    """T = 4096 tokens per rank (b 1, s 4096, tp 1), 8 ranks per node, 2 nodes: a token's 8 picks hit
    2·(1 - 1/2^8) = 1.9921875 nodes on average, so the RDMA leg carries 4096 x 1.9921875 = 8160 rows of
    2048 bf16 = 33,423,360 bytes per layer, 48 layers x 1 micro-batch; forward and backward, dispatch and
    combine alike (combine and the gradients in bf16)."""
    hybrid, deep = ep_calls("hybridep"), ep_calls("deepep")
    assert set(hybrid) == set(deep) == {
        f"{name}.{leg}" for name in ("ep.dispatch", "ep.combine", "ep.dispatch.bwd", "ep.combine.bwd")
        for leg in ("rdma", "nvlink")
    }  # fmt: skip
    for name, call in hybrid.items():
        assert (call["message_bytes"], call["calls_per_iteration"], call["group_size"]) == (
            deep[name]["message_bytes"], deep[name]["calls_per_iteration"], deep[name]["group_size"]
        )  # fmt: skip
        assert "HybridEP" in call["source"] and "HybridEP" not in deep[name]["source"]
    assert hybrid["ep.dispatch.rdma"]["message_bytes"] == 8160 * 2048 * 2 == 33_423_360
    assert hybrid["ep.dispatch.rdma"]["calls_per_iteration"] == 48
    assert hybrid["ep.dispatch.rdma"]["group_size"] == 2 and hybrid["ep.dispatch.nvlink"]["group_size"] == 8


def test_hybridep_fp8_dispatch_is_422():
    body = copy.deepcopy(BODY)
    body["parallel"]["ep_dispatch"] = "hybridep"
    body["workload"]["moe_dispatch_dtype"] = "fp8"
    r = client.post("/v1/plan", json=body)
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert any(d["loc"][-1] == "moe_dispatch_dtype" and "does not support fp8 dispatch" in d["msg"] for d in detail)
