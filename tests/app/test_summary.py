"""?summary=true on POST /v1/plan and /v1/plan/batch (issue 25: schedulers got ~70 KB per plan when they needed
the totals, step and memory): the full answer less `calls` and the step's `timeline`, every other value equal."""

from __future__ import annotations

from app.schemas.plan import SUMMARY_LEAVES_OUT, PlanOut, PlanSummaryOut

from .conftest import LLAMA70B

SUMMARY_KEYS = ["world_size", "num_microbatches", "params_total", "cluster", "totals", "step", "memory", "warnings"]


def _less(full: dict) -> dict:
    out = {k: v for k, v in full.items() if k not in ("calls", "assumptions")}
    out["step"] = {k: v for k, v in full["step"].items() if k != "timeline"}
    return out


def test_plan_summary_is_the_plan_without_calls_and_timeline(api):
    full = api.post("/v1/plan", json=LLAMA70B)
    short = api.post("/v1/plan", params={"summary": "true"}, json=LLAMA70B)
    assert full.status_code == short.status_code == 200
    body = short.json()
    assert list(body) == SUMMARY_KEYS == [k for k in PlanOut.model_fields if k not in SUMMARY_LEAVES_OUT]
    assert "timeline" not in body["step"] and full.json()["step"]["timeline"]
    assert body == _less(full.json())
    assert (
        body["memory"]["fits"] and body["totals"]["time_s"] > 0 and body["step"]["time_s"] > body["step"]["compute_s"]
    )
    PlanSummaryOut.model_validate(body)
    # the sizes docs/CONTRACT.md quotes for this request: ~70 KB in full, under 3 KB as a summary
    assert len(full.content) > 60_000 and len(short.content) < 3_000


def test_summary_false_is_the_full_plan(api):
    assert (
        api.post("/v1/plan", params={"summary": "false"}, json=LLAMA70B).json()
        == api.post("/v1/plan", json=LLAMA70B).json()
    )


def test_batch_summary_keeps_order_and_errors(api):
    small = {
        **LLAMA70B,
        "parallel": {**LLAMA70B["parallel"], "dp": 8},
        "cluster": {"preset": "dgx-h100", "num_nodes": 32},
    }
    bad = {**LLAMA70B, "parallel": {**LLAMA70B["parallel"], "tp": 3}}
    full = api.post("/v1/plan/batch", json={"requests": [LLAMA70B, bad, small]}).json()["results"]
    r = api.post("/v1/plan/batch", params={"summary": True}, json={"requests": [LLAMA70B, bad, small]})
    assert r.status_code == 200
    items = r.json()["results"]
    assert [i["ok"] for i in items] == [True, False, True]
    assert items[1]["error"] == full[1]["error"] and items[1]["error"]["status"] == 422
    for short, whole in zip((items[0], items[2]), (full[0], full[2]), strict=True):
        assert short["plan"] == _less(whole["plan"])
    assert items[0]["plan"]["world_size"] == 512 and items[2]["plan"]["world_size"] == 256


def test_summary_must_be_a_boolean(api):
    r = api.post("/v1/plan", params={"summary": "maybe"}, json=LLAMA70B)
    assert r.status_code == 422
    assert r.json()["detail"][0]["loc"] == ["query", "summary"]


def test_summary_is_in_the_openapi(api):
    spec = api.get("/openapi.json").json()
    for path in ("/v1/plan", "/v1/plan/batch"):
        params = {p["name"]: p for p in spec["paths"][path]["post"].get("parameters", [])}
        assert params["summary"]["in"] == "query" and params["summary"]["schema"]["type"] == "boolean"
