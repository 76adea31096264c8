"""TransformerEngine userbuffers' fallback over HTTP (issue 21, fp8a9; tests/planner/test_userbuffers_fallback.py):
options.overlap.tp_comm_overlap under Megatron hides only the TP rows userbuffers carry, and a recipe or shard they
cannot gather is a 422 naming the switch and TE's rule. Llama3-8B, tp 4 with sequence parallelism, one DGX H100."""

from __future__ import annotations

import copy

import pytest

BODY = {
    "model": {"preset": "llama3-8b"},
    "workload": {"kind": "training", "micro_batch_size": 1, "global_batch_size": 8, "seq_length": 4096},
    "parallel": {"tp": 4, "pp": 1, "dp": 2, "sequence_parallel": True},
    "cluster": {"preset": "dgx-h100", "num_nodes": 1},
    "options": {"timeline": False, "overlap": {"tp_comm_overlap": True}},
}


def body(cluster: str = "dgx-h100", **workload) -> dict:
    b = copy.deepcopy(BODY)
    b["workload"] |= workload
    b["cluster"]["preset"] = cluster
    return b


def test_the_overlap_leaves_the_embedding_and_head_exposed(api):
    on = api.post("/v1/plan", json=body())
    off_body = body()
    off_body["options"]["overlap"]["tp_comm_overlap"] = False
    off = api.post("/v1/plan", json=off_body)
    assert on.status_code == off.status_code == 200, on.text
    exposed_on, exposed_off = on.json()["step"]["exposed_comm_s"], off.json()["step"]["exposed_comm_s"]
    assert 0 < exposed_on < exposed_off


@pytest.mark.parametrize(
    ("cluster", "workload", "words"),
    [
        ("dgx-h100", {"activation_dtype": "fp8", "fp8_recipe": "blockwise"}, "Unsupported quantizer for Userbuffers"),
        ("dgx-b200", {"activation_dtype": "fp8", "fp8_recipe": "mxfp8", "seq_length": 4160}, "= 1040"),
    ],
)
def test_gathers_userbuffers_cannot_take_are_422(api, cluster, workload, words):
    r = api.post("/v1/plan", json=body(cluster, **workload))
    assert r.status_code == 422, r.text
    (error,) = r.json()["detail"]
    assert ".".join(error["loc"][1:]) == "options.overlap.tp_comm_overlap" and words in error["msg"]
