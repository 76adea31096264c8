"""The request schema's pipeline schedules are the registry's (planner/pipeline.py), read at import (issue 19
Build 3, speed4): the OpenAPI still lists them as an enum, and a name outside it is a 422 naming the field
and every known schedule, for /v1/plan and /v1/search alike."""

from __future__ import annotations

from planner.pipeline import SCHEDULE_TRAITS

from .conftest import LLAMA70B

KNOWN = list(SCHEDULE_TRAITS)


def _enums(prop: dict) -> list[list[str]]:
    out = [prop["enum"]] if "enum" in prop else []
    for part in prop.get("anyOf", []):
        out += _enums(part) + (_enums(part["items"]) if "items" in part else [])
    return out


def test_openapi_lists_the_registered_schedules(api):
    schemas = api.get("/openapi.json").json()["components"]["schemas"]
    assert _enums(schemas["ParallelIn"]["properties"]["pipeline_schedule"]) == [KNOWN]
    constraint = schemas["ConstraintsIn"]["properties"]["pipeline_schedule"]
    assert _enums(constraint) == [KNOWN, KNOWN]
    assert any(p.get("maxItems") == len(KNOWN) for p in constraint["anyOf"])


def test_an_unknown_schedule_is_a_422_naming_the_known_ones(api):
    plan = {**LLAMA70B, "parallel": {**LLAMA70B["parallel"], "pipeline_schedule": "zb-h2"}}
    answer = api.post("/v1/plan", json=plan)
    assert answer.status_code == 422
    (error,) = answer.json()["detail"]
    assert error["loc"][-2:] == ["parallel", "pipeline_schedule"]
    assert all(f"'{name}'" in error["msg"] for name in KNOWN)

    search = {
        "model": {"preset": "llama3-8b"},
        "workload": {"global_batch_size": 64},
        "cluster": {"preset": "dgx-h100", "num_nodes": 1},
        "constraints": {"pipeline_schedule": ["1f1b", "zb-h2"]},
    }
    answer = api.post("/v1/search", json=search)
    assert answer.status_code == 422
    locs = [e["loc"] for e in answer.json()["detail"]]
    assert any(loc[1:3] == ["constraints", "pipeline_schedule"] for loc in locs), locs
    assert all(f"'{name}'" in answer.text for name in KNOWN)
