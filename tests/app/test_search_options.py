"""POST /v1/search over HTTP with the options of issue 21: pipeline schedules (zb-h1, zbv, dualpipe,
dualpipev), uneven first/last stages with virtual stages, Megatron's recompute method and layers, and the
MoE token dispatcher. Each result is a layout /v1/plan answers with the same step time; bad values are
422s naming the constraint."""

from __future__ import annotations

import copy

import pytest
from fastapi.testclient import TestClient

from app.main import create_app

client = TestClient(create_app())

DENSE = {  # 20 layers on one DGX H100: 4 + 6 + 6 + 4 is the only split over 4 ranks of 2 chunks
    "model": {"preset": "llama3-8b", "seq_length": 2048, "num_layers": 20},
    "workload": {"kind": "training", "global_batch_size": 16},
    "cluster": {"preset": "dgx-h100", "num_nodes": 1},
    "constraints": {
        "framework": "megatron",
        "zero_stage": 1,
        "tp": 2,
        "pp": 4,
        "micro_batch_size": 1,
        "pipeline_schedule": ["1f1b", "interleaved", "zb-h1", "zbv", "dualpipe", "dualpipev"],
        "uneven_stages": True,
        "activation_recompute": ["none", "full"],
        "recompute_method": "block",
        "recompute_num_layers": [1, 2],
    },
    "top_k": 100,
}

MOE = {  # Mixtral 8x7B cut to 4 layers, ep 8 on two DGX H100
    "model": {"preset": "mixtral-8x7b", "seq_length": 2048, "num_layers": 4},
    "workload": {"kind": "training", "global_batch_size": 16},
    "cluster": {"preset": "dgx-h100", "num_nodes": 2},
    "constraints": {
        "framework": "megatron",
        "zero_stage": 1,
        "tp": 1,
        "cp": 1,
        "pp": 2,
        "ep": 8,
        "micro_batch_size": 1,
        "activation_recompute": "none",
        "ep_dispatch": ["alltoall", "allgather", "deepep", "hybridep"],
    },
    "top_k": 10,
}


def search(body: dict) -> dict:
    r = client.post("/v1/search", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def plan_of(body: dict, hit: dict) -> dict:
    """/v1/plan on a search result, posted as the result writes it."""
    work = body["workload"] | {"micro_batch_size": hit["micro_batch_size"],
                               "activation_recompute": hit["activation_recompute"]}  # fmt: skip
    for name in ("recompute_method", "recompute_num_layers"):
        if name in hit:
            work[name] = hit[name]
    req = {"model": body["model"], "cluster": body["cluster"], "workload": work, "parallel": hit["parallel"]}
    r = client.post("/v1/plan", json=req)
    assert r.status_code == 200, r.text
    return r.json()


def test_schedules_uneven_stages_and_recompute_methods_over_http():
    """Every schedule asked for is searched with its virtual stages (zb-h1 1; zbv, dualpipe, dualpipev and
    the uneven interleaved 2, first and last stage 4 layers), full recompute per block 1 and 2; /v1/plan
    answers each kind of result with the search's step time."""
    d = search(DENSE)
    assert d["space_size"] == d["evaluated"] + sum(d["pruned"].values()) - d["pruned"].get("memory", 0)
    kinds = {}
    for hit in d["results"]:
        p = hit["parallel"]
        kinds.setdefault((p["pipeline_schedule"], p["virtual_pipeline_stages"], p.get("first_stage_layers")), hit)
    assert set(kinds) >= {
        ("1f1b", 1, None), ("zb-h1", 1, None), ("zbv", 2, 4), ("dualpipe", 2, 4), ("dualpipev", 2, 4),
        ("interleaved", 2, 4), ("interleaved", 5, None),
    }  # fmt: skip
    choices = {
        (h["activation_recompute"], h.get("recompute_method"), h.get("recompute_num_layers")) for h in d["results"]
    }
    assert choices == {("none", None, None), ("full", "block", 1), ("full", "block", 2)}
    for hit in kinds.values():
        assert plan_of(DENSE, hit)["step"]["time_s"] == hit["step"]["time_s"]
    block = next(h for h in d["results"] if h.get("recompute_num_layers") == 2)
    assert plan_of(DENSE, block)["step"]["time_s"] == block["step"]["time_s"]


def test_token_dispatchers_over_http():
    """alltoall (the default, left out of the parallel block), allgather, DeepEP and HybridEP each searched;
    /v1/plan agrees, and DeepEP's and HybridEP's plans list their legs (rules/deepep.py)."""
    d = search(MOE)
    by = {h["parallel"].get("ep_dispatch", "alltoall"): h for h in d["results"]}
    assert set(by) == {"alltoall", "allgather", "deepep", "hybridep"}
    for dispatch, hit in by.items():
        plan = plan_of(MOE, hit)
        assert plan["step"]["time_s"] == hit["step"]["time_s"]
        names = {c["name"] for c in plan["calls"] if c["parallelism"] == "ep"}
        legs = any(n.endswith((".nvlink", ".rdma")) for n in names)  # DeepEP's legs (ep 8 in one node: NVLink)
        assert legs == (dispatch in ("deepep", "hybridep")), names
    default = search(copy.deepcopy(MOE) | {"constraints": MOE["constraints"] | {"ep_dispatch": None}})
    assert {h["parallel"].get("ep_dispatch", "alltoall") for h in default["results"]} == {"alltoall"}


@pytest.mark.parametrize(
    ("constraints", "field", "words"),
    [
        ({"pipeline_schedule": "zb-h2"}, "pipeline_schedule", ""),
        ({"ep_dispatch": "deepep_ll"}, "ep_dispatch", ""),  # low-latency DeepEP is an inference kernel
        ({"recompute_method": "blocky"}, "recompute_method", ""),
        ({"recompute_num_layers": 0}, "recompute_num_layers", ""),
        ({"recompute_num_layers": [2, 21]}, "recompute_num_layers", "recompute_num_layers 21 > num_layers 20"),
        ({"uneven_stages": "sometimes"}, "uneven_stages", ""),
    ],
)
def test_bad_new_constraints_are_422_naming_the_field(constraints, field, words):
    body = copy.deepcopy(DENSE)
    body["constraints"] = {"framework": "megatron", **constraints}
    r = client.post("/v1/search", json=body)
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert any(field in [str(x) for x in d["loc"]] and words in d["msg"] for d in detail), detail
