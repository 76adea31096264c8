"""The MoE dispatcher's exchanges over HTTP (issue 20, moe9; docs/step-time.md "MoE (moe9)"): under an fp8 recipe
the hidden states still cross the EP group in bf16 (Megatron-LM 92c8482e6d token_dispatcher.py has no fp8 path;
TransformerEngine quantizes inside GroupedLinear), and Megatron's alltoall dispatcher sends the routed rows'
probabilities in an all-to-all of their own, forward and backward. Hand-checked on Qwen3-30B-A3B, ep 8 on one
DGX B200 under MXFP8: T = 4,096 tokens, top 8, h 2,048."""

from __future__ import annotations

import copy

from fastapi.testclient import TestClient

from app.main import create_app

client = TestClient(create_app())

BODY = {
    "model": {"preset": "qwen3-30b-a3b"},
    "workload": {
        "kind": "training", "micro_batch_size": 1, "global_batch_size": 8,
        "activation_dtype": "fp8", "fp8_recipe": "mxfp8",
    },
    "parallel": {"tp": 1, "pp": 1, "dp": 8, "ep": 8, "zero_stage": 1},
    "cluster": {"preset": "dgx-b200", "num_nodes": 1},
}  # fmt: skip


def ep_calls(**workload) -> dict:
    body = copy.deepcopy(BODY)
    body["workload"].update(workload)
    r = client.post("/v1/plan", json=body)
    assert r.status_code == 200, r.text
    return {c["name"]: c for c in r.json()["calls"] if c["name"].startswith(("ep.dispatch", "ep.combine"))}


def test_fp8_training_exchanges_the_hidden_states_in_bf16_and_the_probs_apart():
    """4,096 x 8 rows of 2,048 bf16 = 134,217,728 B each way and direction (not the fp8 activation dtype's half);
    the probabilities 4,096 x 8 x 2 B = 65,536 B; 48 layers x 1 micro-batch each."""
    calls = ep_calls()
    assert set(calls) == {
        "ep.dispatch", "ep.combine", "ep.dispatch.probs", "ep.combine.bwd", "ep.dispatch.bwd", "ep.dispatch.probs.bwd"
    }  # fmt: skip
    for name in ("ep.dispatch", "ep.combine", "ep.combine.bwd", "ep.dispatch.bwd"):
        assert (calls[name]["message_bytes"], calls[name]["dtype"]) == (4096 * 8 * 2048 * 2, "bf16"), name
    for name in ("ep.dispatch.probs", "ep.dispatch.probs.bwd"):
        assert (calls[name]["message_bytes"], calls[name]["dtype"]) == (65_536, "bf16"), name
    assert {c["calls_per_iteration"] for c in calls.values()} == {48}


def test_an_explicit_fp8_dispatch_keeps_its_byte_and_scales():
    """workload.moe_dispatch_dtype "fp8" (DeepSeek-style): 2,048 B + 16 fp32 scales a row out, bf16 back."""
    calls = ep_calls(moe_dispatch_dtype="fp8")
    assert calls["ep.dispatch"]["message_bytes"] == 4096 * 8 * (2048 + 16 * 4)
    assert calls["ep.dispatch"]["dtype"] == "fp8"
    assert calls["ep.combine"]["message_bytes"] == 4096 * 8 * 2048 * 2
