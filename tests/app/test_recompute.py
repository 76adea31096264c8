"""Recompute as configured over HTTP (issue 21 item 3): each new workload field, and the 422s."""

import copy

import pytest

SMALL = {
    "model": {"preset": "llama3-8b"},
    "workload": {"kind": "training", "micro_batch_size": 1, "global_batch_size": 16},
    "parallel": {"tp": 1, "pp": 2, "dp": 4},
    "cluster": {"preset": "dgx-h100", "num_nodes": 1},
}


def plan(api, **workload):
    body = copy.deepcopy(SMALL)
    body["workload"].update(workload)
    return api.post("/v1/plan", json=body)


def acts(r):
    return [s["activations_bytes"] for s in r.json()["memory"]["per_stage"]]


def test_recompute_fields_change_memory_and_time(api):
    none = plan(api)
    block = plan(api, activation_recompute="full", recompute_method="block", recompute_num_layers=4)
    uniform = plan(api, activation_recompute="full", recompute_method="uniform", recompute_num_layers=4)
    full = plan(api, activation_recompute="full")
    for r in (none, block, uniform, full):
        assert r.status_code == 200, r.text
    assert acts(full) < acts(uniform) < acts(block) < acts(none)
    # time: block re-runs 4 of each stage's 16 layers, uniform and full all of them
    t = {k: r.json()["step"]["time_s"] for k, r in dict(none=none, block=block, uniform=uniform, full=full).items()}
    assert t["none"] < t["block"] < t["uniform"] == pytest.approx(t["full"])
    mods = plan(api, activation_recompute="selective", recompute_modules=["core_attn", "mlp", "layernorm"])
    attn = plan(api, activation_recompute="selective")
    assert mods.status_code == 200 and acts(mods) < acts(attn)
    assert mods.json()["step"]["time_s"] > attn.json()["step"]["time_s"]


@pytest.mark.parametrize(
    ("workload", "field", "words"),
    [
        (
            {"activation_recompute": "selective", "recompute_modules": ["moe_act"]},
            "recompute_modules",
            "the model has no MoE layers",
        ),
        (
            {"activation_recompute": "selective", "recompute_method": "block"},
            "recompute_method",
            "goes with activation_recompute 'full'",
        ),
        (
            {"activation_recompute": "full", "recompute_num_layers": 40},
            "recompute_num_layers",
            "recompute_num_layers 40 > num_layers 32",
        ),
        ({"activation_recompute": "selective", "recompute_modules": ["attention"]}, "recompute_modules", ""),
    ],
)
def test_bad_recompute_is_422(api, workload, field, words):
    r = plan(api, **workload)
    assert r.status_code == 422, r.text
    assert any(d["loc"][-1] == field or d["loc"][-2] == field for d in r.json()["detail"]), r.text
    assert words in r.text


def test_recompute_fields_are_training_fields(api):
    body = {
        "model": {"preset": "llama3-8b"},
        "workload": {"kind": "inference", "batch_size": 8, "recompute_method": "block"},
        "parallel": {"tp": 8},
        "cluster": {"preset": "dgx-h100", "num_nodes": 1},
    }
    r = api.post("/v1/plan", json=body)
    assert r.status_code == 422 and "recompute_method describes a training workload" in r.text


def test_torch_selective_checkpointing_over_http(api):
    body = copy.deepcopy(SMALL)
    body["parallel"]["framework"] = "torch"
    body["workload"]["activation_recompute"] = "selective"
    out = {}
    for option in ("op", "2"):
        body["workload"]["selective_ac_option"] = option
        r = api.post("/v1/plan", json=body)
        assert r.status_code == 200, r.text
        out[option] = acts(r)
    del body["workload"]["selective_ac_option"]
    default = acts(api.post("/v1/plan", json=body))  # core_attn: flash keeps everything else
    assert out["op"] < default and out["2"] < default
    body["parallel"]["framework"] = "megatron"
    body["workload"]["selective_ac_option"] = "op"
    r = api.post("/v1/plan", json=body)
    assert r.status_code == 422 and "selective_ac_option" in r.text and "framework torch" in r.text


def test_cpu_offload_over_http(api):
    body = copy.deepcopy(SMALL)
    body["parallel"] = {"tp": 1, "pp": 1, "dp": 8}
    body["workload"]["global_batch_size"] = 8
    base = api.post("/v1/plan", json=body)
    body["workload"]["cpu_offloading_num_layers"] = 16
    off = api.post("/v1/plan", json=body)
    assert base.status_code == 200 and off.status_code == 200, off.text
    assert acts(off)[0] < acts(base)[0]
    body["parallel"] = {"tp": 1, "pp": 2, "dp": 4}
    r = api.post("/v1/plan", json=body)
    assert r.status_code == 422 and "no support for Pipeline parallelism with CPU offloading" in r.text
