"""Routers are thin: the CLI reaches the domain without any router (calibration, exports, plans, searches),
and the domain procedures answer what the routes answer."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from planner import build_plan
from planner.exports import PLAN_EXPORTS, chrome_trace, export_of, plan_csv

from ..conftest import ROOT
from .conftest import LLAMA70B


def test_the_cli_imports_no_router():
    code = (
        "import sys, app.cli, app.search_cli, app.calibration, app.inputs\n"
        "print(sorted(m for m in sys.modules if m.startswith('app.routers')))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_an_export_over_http_is_the_domains_render(api):
    from app.convert import plan_inputs
    from app.schemas.plan import PlanRequest
    from app.settings import Settings

    plan = build_plan(*plan_inputs(PlanRequest.model_validate(LLAMA70B), Settings()))
    r = api.post("/v1/plan/export/csv", json=LLAMA70B)
    assert r.status_code == 200
    assert r.text == PLAN_EXPORTS["csv"].write(plan, 0, "mpirun") == plan_csv(plan)
    assert {n for n, e in PLAN_EXPORTS.items() if e.body == "text"} == {"csv", "nccl-tests", "aicb", "simai"}
    known = "json, csv, nccl-tests, simai, aicb, trace, chakra"
    with pytest.raises(ValueError, match=f"format: unknown export 'xml'; known: {known}"):
        export_of("xml")
    trace = api.post("/v1/plan/export/trace", json=LLAMA70B)  # the trace is the domain's object, written as JSON
    assert trace.json() == json.loads(json.dumps(chrome_trace(plan)))


def test_plan_exports_are_one_registry(api):
    """The plan's exports were listed in four places (the route's Format, MEDIA, OMITTED and PER_STAGE; the
    planner's TEXT_EXPORTS; the CLI's literal; the docs: review): now planner/exports.py PLAN_EXPORTS, which the
    route (its path's values, media types, file names, omitted calls), the CLI's --format and the docs read."""
    from app.cli import PLAN_FORMATS
    from planner.exports import PLAN_EXPORTS

    assert list(PLAN_EXPORTS) == ["json", "csv", "nccl-tests", "simai", "aicb", "trace", "chakra"]
    spec = api.get("/openapi.json").json()
    (param,) = spec["paths"]["/v1/plan/export/{fmt}"]["post"]["parameters"][:1]
    schema = param["schema"]
    enum = schema.get("enum") or spec["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]["enum"]
    assert enum == list(PLAN_EXPORTS)
    assert tuple(PLAN_FORMATS) == ("table", *PLAN_EXPORTS)
    docs = (ROOT / "docs/exports.md").read_text()
    assert all(f"POST /v1/plan/export/{name}" in docs for name in PLAN_EXPORTS)
    contract = (ROOT / "docs/CONTRACT.md").read_text()
    assert f"--format {'|'.join(PLAN_EXPORTS)}" in contract
    body = {**LLAMA70B, "parallel": {**LLAMA70B["parallel"]}}
    for name, export in PLAN_EXPORTS.items():
        r = api.post(f"/v1/plan/export/{name}", json=body)
        assert r.status_code == 200, (name, r.text[:300])
        assert r.headers["content-type"] == export.media_type
        disposition = r.headers["content-disposition"]
        tail = export.per_stage or f"commplan-plan.{export.extension}"
        assert disposition.endswith(f'{tail}"'), disposition
        assert ("x-commplan-omitted" in r.headers) <= (export.omitted is not None)
