"""The torch options of issue 21 (torchopt) over HTTP, as a torchtitan user enters them: workload.fp8_recipe
"rowwise" (torchao Float8LinearRecipeName.ROWWISE), workload.fp8_param_gather with workload.fp8_precompute_scale
(FSDP2's float8 all-gather), parallel.cp_rotate_method (torch context_parallel's set_rotate_method); each 422 names
its field, the rule and the numbers; the page offers each field (frontend/js/controls.js). The byte counts are
hand-checked in tests/planner/test_torch_options.py."""

from __future__ import annotations

import json
import re

import pytest

from planner import flavours
from tests.app.test_kernels_http import error as _refused  # (the field the 422 names, its message)
from tests.app.test_kernels_http import plan as _plan

LINEAR = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336  # Llama-3 8B's Float8Linear elements per layer


def _body(workload=None, **parallel) -> dict:
    return {
        "model": {"preset": "llama3-8b"},
        "workload": {"kind": "training", "micro_batch_size": 1, "global_batch_size": 8, **(workload or {})},
        "parallel": {"framework": "torch", "dp": 8, "zero_stage": 3, **parallel},
        "cluster": {"preset": "dgx-h100", "num_nodes": 1},
        "options": {"timeline": False},
    }


def _rows(plan: dict, name: str) -> list[dict]:
    return [c for c in plan["calls"] if c["name"] == name]


def test_rowwise_recipe_plans_slower_than_tensorwise_on_hopper(api):
    rowwise = _plan(api, _body({"fp8_recipe": "rowwise"}))
    tensorwise = _plan(api, _body({"fp8_recipe": "tensorwise"}))
    bf16 = _plan(api, _body())
    # the rowwise forward GEMM at 0.95 of the tensorwise kernel's ceiling, the backward ones rescaled after it
    assert tensorwise["step"]["time_s"] < rowwise["step"]["time_s"] < bf16["step"]["time_s"]
    rows = {a["field"]: a["value"] for a in rowwise["assumptions"]}
    assert rows["workload.fp8_recipe"] == "rowwise" and rows["workload.fp8_param_gather"] == "off"


def test_rowwise_refusals_name_field_and_numbers(api):
    body = _body({"fp8_recipe": "rowwise"})
    body["cluster"] = {"preset": "dgx-a100", "num_nodes": 1}
    field, msg = _refused(api, body)
    assert field == "workload.fp8_recipe" and ">= 8.9" in msg and "compute capability 8.0" in msg
    field, msg = _refused(api, _body({"fp8_recipe": "rowwise"}, framework="megatron", zero_stage=1))
    assert field == "workload.fp8_recipe" and "framework 'megatron' does not run" in msg


def test_float8_all_gather_and_precomputed_scales_over_http(api):
    plan = _plan(api, _body({"fp8_recipe": "tensorwise", "fp8_param_gather": True}))
    (layers,) = [c for c in _rows(plan, "dp.params") if c["calls_per_iteration"] == 32]
    assert layers["message_bytes"] == LINEAR + 2 * 4096 * 2  # float8 weights at 1 B, the two norms in bf16
    (amax,) = _rows(plan, "dp.params.amax")
    assert (amax["message_bytes"], amax["calls_per_iteration"]) == (4, 7 * 32)
    pre = _plan(api, _body({"fp8_recipe": "tensorwise", "fp8_param_gather": True, "fp8_precompute_scale": True}))
    assert not _rows(pre, "dp.params.amax")
    (scales,) = _rows(pre, "dp.fp8_scales")
    assert (scales["message_bytes"], scales["calls_per_iteration"]) == (4 * 7 * 32, 1)
    rows = {a["field"]: a["value"] for a in pre["assumptions"]}
    assert rows["workload.fp8_param_gather"] == "on" and rows["workload.fp8_precompute_scale"] == "on"


@pytest.mark.parametrize(
    ("workload", "parallel", "field", "words"),
    [
        ({"fp8_recipe": "rowwise", "fp8_param_gather": True}, {}, "workload.fp8_param_gather",
         "supports tensorwise scaling only"),
        ({"fp8_recipe": "tensorwise", "fp8_param_gather": True}, {"zero_stage": 1}, "workload.fp8_param_gather",
         "got zero_stage 1"),
        ({"fp8_recipe": "tensorwise", "fp8_precompute_scale": True}, {}, "workload.fp8_precompute_scale",
         "needs fp8_param_gather"),
        ({}, {"cp": 2, "dp": 4, "cp_comm": "a2a"}, "parallel.cp_comm", "cp_rotate_method (allgather, alltoall)"),
        ({}, {"cp": 2, "dp": 4, "cp_rotate_method": "alltoall", "framework": "megatron", "zero_stage": 1},
         "parallel.cp_rotate_method", "framework 'megatron' takes cp_comm"),
        ({}, {"cp": 2, "dp": 4, "cp_rotate_method": "ring"}, "parallel.cp_rotate_method", "allgather"),
    ],
)  # fmt: skip
def test_torch_option_refusals_over_http(api, workload, parallel, field, words):
    got, msg = _refused(api, _body(workload, **parallel))
    assert got == field and words in msg, msg


def test_cp_rotate_method_over_http(api):
    kv = 2 * 4096 * 8 * 128 * 2  # K and V of s/c = 4,096 tokens, 8 KV heads x 128, bf16
    gather = _plan(api, _body(cp=2, dp=4))
    (g,) = _rows(gather, "cp.ring.kv_gather")
    assert (g["op"], g["message_bytes"], g["calls_per_iteration"]) == ("allgather", 2 * kv, 32 * 2)
    rows = {a["field"]: a["value"] for a in gather["assumptions"]}
    assert rows["parallel.cp_rotate_method"] == "allgather" and "parallel.cp_comm" not in rows
    rotate = _plan(api, _body(cp=2, dp=4, cp_rotate_method="alltoall"))
    (s,) = _rows(rotate, "cp.ring.kv")
    assert (s["op"], s["message_bytes"], s["calls_per_iteration"]) == ("sendrecv", kv, 1 * 32 * 2)
    (d,) = _rows(rotate, "cp.ring.dkv")
    assert (d["message_bytes"], d["calls_per_iteration"]) == (2 * kv, 2 * 32 * 2)  # fp32, c sends per call


def test_the_page_offers_each_torch_option(api):
    controls = api.get("/static/js/controls.js").text

    def row(path: str) -> str:
        return next(line for line in controls.splitlines() if line.strip().startswith(f'["{path}"'))

    def choices(path: str) -> set[str]:
        found = json.loads(re.search(r'"select", (\[.*\]), "', row(path)).group(1))
        return {x[0] if isinstance(x, list) else x for x in found}

    assert "rowwise" in choices("workload.fp8_recipe")
    assert '"select", ON_OFF' in row("workload.fp8_precompute_scale")  # on / off, blank = the default (off)
    assert choices("parallel.cp_rotate_method") == set(flavours.flavour("torch").cp_rotate_methods)
    assert '"select", ON_OFF' in row("parallel.cp_load_balance")


def test_cp_load_balance_over_http(api):
    balanced = _plan(api, _body(cp=4, dp=2))
    skewed = _plan(api, _body(cp=4, dp=2, cp_load_balance=False))
    assert skewed["step"]["compute_s"] > balanced["step"]["compute_s"]
    assert {c["name"]: c["message_bytes"] for c in skewed["calls"]} == {
        c["name"]: c["message_bytes"] for c in balanced["calls"]
    }  # the bytes do not depend on it
    rows = {a["field"]: a["value"] for a in skewed["assumptions"]}
    assert rows["parallel.cp_load_balance"] == "off"
    field, msg = _refused(api, _body(cp=2, dp=4, cp_load_balance=True, framework="megatron", zero_stage=1))
    assert field == "parallel.cp_load_balance" and "enable_load_balance" in msg


def test_search_with_rowwise_screens_out_te_frameworks(api):
    """fp8_recipe rowwise is torchao's: a search that leaves the framework open ranks only torch layouts, and counts
    the Megatron and DeepSpeed variants as pruned by workload.fp8_recipe (the same rule /v1/plan refuses them with;
    before mend7 the screen missed it and the search answered that 422 for its first Megatron layout)."""
    body = {
        "model": {"preset": "llama3-8b", "num_layers": 4},
        "workload": {"kind": "training", "global_batch_size": 16, "fp8_recipe": "rowwise"},
        "cluster": {"preset": "dgx-h100", "num_nodes": 1},
        "constraints": {"tp": [1, 2], "pp": 1, "micro_batch_size": 1},
        "top_k": 50,
    }
    r = api.post("/v1/search", json=body)
    assert r.status_code == 200, r.text
    found = r.json()
    assert found["results"] and {h["parallel"]["framework"] for h in found["results"]} == {"torch"}
    assert found["pruned"].get("workload.fp8_recipe", 0) > 0, found["pruned"]
    for hit in found["results"][:2]:  # and /v1/plan takes each ranked layout
        plan = {k: body[k] for k in ("model", "cluster")} | {"options": {"timeline": False}}
        plan["workload"] = body["workload"] | {"micro_batch_size": hit["micro_batch_size"]}
        plan["workload"]["activation_recompute"] = hit["activation_recompute"]
        plan["parallel"] = hit["parallel"]
        assert api.post("/v1/plan", json=plan).status_code == 200
