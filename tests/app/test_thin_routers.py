"""Routers are thin: the CLI reaches the domain without any router (calibration, exports, plans, searches),
and the domain procedures answer what the routes answer."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from planner import build_plan
from planner.exports import TEXT_EXPORTS, chrome_trace, plan_csv, render

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
    assert r.text == render(plan, "csv") == plan_csv(plan)
    assert set(TEXT_EXPORTS) == {"csv", "nccl-tests", "aicb", "simai"}
    with pytest.raises(ValueError, match="format: unknown export 'xml'; known: csv, nccl-tests, aicb, simai"):
        render(plan, "xml")
    trace = api.post("/v1/plan/export/trace", json=LLAMA70B)  # the trace is the domain's object, written as JSON
    assert trace.json() == json.loads(json.dumps(chrome_trace(plan)))
