"""FP8 attention's kernel rate over HTTP (issue 21, fp8a9): workload.fp8_dot_product_attention now runs the core
attention on cuDNN's FP8 kernel (planner/kernels.py ATTENTION_FP8_SPEEDUP) with TransformerEngine's casts, and
workload.fp8_dpa_backward (TE's NVTE_FP8_DPA_BWD) keeps the backward in bf16 when false. Llama3-8B at s 8,192 on one
DGX H100, dp 8, delayed scaling: tests/planner/test_fp8_attention.py checks the kernels by hand."""

from __future__ import annotations

import copy

import pytest

BODY = {
    "model": {"preset": "llama3-8b"},
    "workload": {"kind": "training", "micro_batch_size": 1, "global_batch_size": 8, "seq_length": 8192,
                 "activation_dtype": "fp8", "fp8_recipe": "delayed"},
    "parallel": {"tp": 1, "pp": 1, "dp": 8},
    "cluster": {"preset": "dgx-h100", "num_nodes": 1},
    "options": {"timeline": False},
}  # fmt: skip


def post(api, status: int = 200, cluster: str = "dgx-h100", **workload) -> dict:
    b = copy.deepcopy(BODY)
    b["workload"] |= workload
    b["cluster"]["preset"] = cluster
    r = api.post("/v1/plan", json=b)
    assert r.status_code == status, r.text
    return r.json()


def test_fp8_attention_shortens_the_step_and_moves_no_byte(api):
    """Forward and backward in FP8 (the default), or the forward alone: each shorter than bf16 attention, the
    FP8 backward the shortest; the calls are the same (tp 1, cp 1: the attention moves nothing)."""
    plain = post(api)
    both = post(api, fp8_dot_product_attention=True)
    forward = post(api, fp8_dot_product_attention=True, fp8_dpa_backward=False)
    assert both["step"]["compute_s"] < forward["step"]["compute_s"] < plain["step"]["compute_s"]
    assert [(c["name"], c["message_bytes"]) for c in both["calls"]] == [
        (c["name"], c["message_bytes"]) for c in plain["calls"]
    ]
    rows = {a["field"]: a["value"] for a in forward["assumptions"]}
    assert rows["workload.fp8_dot_product_attention"] == "on" and rows["workload.fp8_dpa_backward"] == "off"
    assert "workload.fp8_dpa_backward" not in {a["field"] for a in plain["assumptions"]}


def test_fp8_attention_saves_fp8_tensors_over_http(api):
    """bf16 activations, delayed scaling: with the backward in FP8 the attention saves q, k, v and its output as
    fp8 data, 32 layers x (50,331,648 + 33,554,432) B less a micro-batch (tests/planner/test_fp8_attention.py)."""
    plain = post(api, activation_dtype="bf16")["memory"]["per_stage"][0]["activations_bytes"]
    fp8 = post(api, activation_dtype="bf16", fp8_dot_product_attention=True)["memory"]["per_stage"][0]
    forward = post(api, activation_dtype="bf16", fp8_dot_product_attention=True, fp8_dpa_backward=False)
    assert plain - fp8["activations_bytes"] == 32 * (50_331_648 + 33_554_432)
    assert forward["memory"]["per_stage"][0]["activations_bytes"] == plain


@pytest.mark.parametrize(
    ("cluster", "workload", "field", "words"),
    [
        ("dgx-h100", {"fp8_dpa_backward": False}, "workload.fp8_dpa_backward", "NVTE_FP8_DPA_BWD"),
        ("dgx-a100", {"fp8_dot_product_attention": True}, "workload.fp8_recipe", "compute capability"),
        ("dgx-h100", {"kind": "inference", "fp8_dpa_backward": True, "fp8_recipe": None, "activation_dtype": None},
         "workload.fp8_dpa_backward", "training workload"),
    ],
)  # fmt: skip
def test_fp8_attention_refusals_name_the_field(api, cluster, workload, field, words):
    """A backward switch without FP8 attention, FP8 attention on an A100 (no FP8 tensor cores: the recipe's 422),
    the training-only field on an inference workload."""
    b = copy.deepcopy(BODY)
    b["workload"] |= workload
    b["workload"] = {k: v for k, v in b["workload"].items() if v is not None}
    if b["workload"]["kind"] == "inference":
        for k in ("micro_batch_size", "global_batch_size"):
            b["workload"].pop(k)
    b["cluster"]["preset"] = cluster
    r = api.post("/v1/plan", json=b)
    assert r.status_code == 422, r.text
    (error,) = r.json()["detail"]
    assert ".".join(error["loc"][1:]) == field and words in error["msg"]
