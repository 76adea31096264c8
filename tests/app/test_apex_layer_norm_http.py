"""workload.norm_kernel "apex" over HTTP (planner/kernels.py APEX_LAYER_NORM): Megatron-LM's MixedFusedLayerNorm of
before its persistent kernel lengthens the step by its norms' extra bytes and names itself in the assumptions; the
megatron-lm-2021 default follows persist_ln_hidden_sizes; an unknown kernel is a 422 naming the field."""

import pytest

from planner.kernels import APEX_LAYER_NORM, EFFICIENCY

BODY = {
    "model": {"preset": "gpt3-175b", "num_layers": 2},
    "workload": {"micro_batch_size": 1, "global_batch_size": 1, "activation_recompute": "none"},
    "parallel": {"tp": 8, "framework": "megatron-lm-2021"},
    "cluster": {"preset": "dgx-a100"},
    "options": {"timeline": False},
}


def _plan(api, **work):
    r = api.post("/v1/plan", json=BODY | {"workload": BODY["workload"] | work})
    assert r.status_code == 200, r.text
    return r.json()


def _norm_row(plan):
    (row,) = [r for r in plan["assumptions"] if r["field"] == "workload.norm_kernel"]
    return row


def test_apex_norms_over_http(api):
    """Two layers of GPT-3 width, one micro-batch of 2,048 tokens on every TP rank, no recompute: 2 norms a layer
    and the final norm, each over 2,048 x 12,288 elements; apex adds (5.6173 - 4) B forward and (12.1992 - 8) B
    backward an element at the A100's streaming rate, and two more launches backward."""
    apex, fused = _plan(api, norm_kernel="apex"), _plan(api)
    assert _norm_row(apex)["value"] == "apex" and _norm_row(fused)["value"] == "fused"
    assert "persist_ln_hidden_sizes" in _norm_row(fused)["source"]
    (fwd, _), (bwd, _) = APEX_LAYER_NORM
    rate = 2039e9 * EFFICIENCY.hbm  # the dgx-a100 preset's A100 80GB
    norms, elements = 2 * 2 + 1, 2048 * 12288
    extra = norms * (elements * ((fwd - 4) + (bwd - 8)) / rate + 2 * EFFICIENCY.kernel_s)
    assert apex["step"]["time_s"] - fused["step"]["time_s"] == pytest.approx(extra, rel=1e-6)


def test_an_unknown_norm_kernel_is_a_422(api):
    r = api.post("/v1/plan", json=BODY | {"workload": BODY["workload"] | {"norm_kernel": "legacy"}})
    assert r.status_code == 422, r.text
    (err,) = r.json()["detail"]
    assert err["loc"] == ["body", "workload", "norm_kernel"] and "apex" in err["msg"]
