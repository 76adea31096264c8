"""Framework flavours and their fields over HTTP (httpx against the app): a registered toy flavour plans, an
unknown one is a 422 naming parallel.framework."""

from dataclasses import replace

import pytest

from planner import flavours
from planner.flavours.megatron import FLAVOUR as MEGATRON

BODY = {
    "model": {"preset": "llama3-8b", "num_layers": 4},
    "workload": {"micro_batch_size": 1, "global_batch_size": 8},
    "parallel": {"tp": 2, "dp": 4},
    "cluster": {"preset": "dgx-h100"},
}


def plan(api, **parallel):
    return api.post("/v1/plan", json=BODY | {"parallel": BODY["parallel"] | parallel})


def total(calls: list[dict], name: str) -> int:
    return sum(c["calls_per_iteration"] for c in calls if c["name"] == name)


def test_toy_flavour_over_http(api):
    flavours.register(replace(MEGATRON, name="toy", fused_column_dgrad=False))
    try:
        toy, megatron = plan(api, framework="toy"), plan(api, framework="megatron")
        assert toy.status_code == 200, toy.text
        # q, k, v all-reduce their input gradients separately: 3 x Megatron's fused QKV, 4 layers x 2 micro-batches
        assert total(toy.json()["calls"], "tp.attn.qkv.dgrad") == 3 * total(
            megatron.json()["calls"], "tp.attn.qkv.dgrad"
        )
        assert total(megatron.json()["calls"], "tp.attn.qkv.dgrad") == 4 * 2
    finally:
        flavours.unregister("toy")


@pytest.mark.parametrize("name", ["jax", "toy", ""])
def test_unknown_framework_is_a_422(api, name):
    r = plan(api, framework=name)
    assert r.status_code == 422, r.text
    (err,) = r.json()["detail"]
    assert err["loc"] == ["body", "parallel", "framework"]
    assert "must be one of megatron, torch, deepspeed" in err["msg"]


TORCH_DDP = BODY | {
    "parallel": {"dp": 16, "framework": "torch"},
    "model": {"preset": "llama3-8b", "num_layers": 2},
    "workload": {"micro_batch_size": 1, "global_batch_size": 32},
    "cluster": {"preset": "dgx-h100", "num_nodes": 2},
}


def test_ddp_switches_over_http(api):
    ddp = {"find_unused_parameters": True, "bucket_cap_mb": 50.0}
    r = api.post("/v1/plan", json=TORCH_DDP | {"parallel": TORCH_DDP["parallel"] | {"ddp": ddp}})
    assert r.status_code == 200, r.text
    plan = r.json()
    used = [c for c in plan["calls"] if c["name"] == "dp.used_parameters"]
    # 2 layers x 9 tensors + embedding + final norm + LM head, one int32 each, over the 16 DP ranks
    assert [(c["message_bytes"], c["dtype"], c["group_size"]) for c in used] == [(4 * 21, "int32", 16)]
    assert any("find_unused_parameters" in w for w in plan["warnings"])
    bad = api.post("/v1/plan", json=TORCH_DDP | {"parallel": TORCH_DDP["parallel"] | {"ddp": {"static": True}}})
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"][:4] == ["body", "parallel", "ddp", "static"]
    megatron = TORCH_DDP["parallel"] | {"framework": "megatron", "ddp": {"static_graph": True}}
    r = api.post("/v1/plan", json=TORCH_DDP | {"parallel": megatron})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "parallel", "ddp"]


def test_zero_plus_plus_over_http(api):
    zero = {"zero_hpz_partition_size": 8, "stage3_param_persistence_threshold": 0, "overlap_comm": False}
    par = {"dp": 16, "framework": "deepspeed", "zero_stage": 3, "zero_config": zero}
    r = api.post("/v1/plan", json=TORCH_DDP | {"parallel": par})
    assert r.status_code == 200, r.text
    calls = r.json()["calls"]
    hpz = [c for c in calls if c["name"].endswith(".hpz")]
    # the secondary groups are the 8 GPUs of one DGX node; 2 micro-batches: the second forward's gathers there
    assert hpz and {c["group_size"] for c in hpz} == {8}
    assert {c["group_size"] for c in calls if c["name"] == "dp.params"} == {16}
    for key, value, words in (
        ("zero_hpz_partition_size", 3, "must divide"),
        ("round_robin_gradients", True, "not modelled"),
        ("zero_quantized_gradient", True, "DeepSpeed has no"),
    ):
        bad = par | {"zero_config": {key: value}}
        r = api.post("/v1/plan", json=TORCH_DDP | {"parallel": bad})
        assert r.status_code == 422, r.text
        (err,) = r.json()["detail"]
        assert err["loc"] == ["body", "parallel", "zero_config", key] and words in err["msg"]
