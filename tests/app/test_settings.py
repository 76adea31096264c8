"""Service settings (app/settings.py): read from COMMPLAN_* once, bounded, and the GIL switch interval a
running server uses (issue 26 item 4: /healthz prompt while work threads compute)."""

from __future__ import annotations

import asyncio
import gc
import os
import sys

import pytest
from fastapi.responses import JSONResponse
from fastapi.testclient import TestClient

from app import runner
from app.main import GC_YOUNG_SERVICE, create_app
from app.settings import Settings
from planner.deadline import Deadline


def test_settings_read_the_environment_by_their_commplan_names(monkeypatch):
    monkeypatch.setenv("COMMPLAN_SWITCH_INTERVAL_S", "0.002")
    monkeypatch.setenv("COMMPLAN_WORK_SLOTS", "3")
    settings = Settings.from_env()
    assert settings.switch_interval_s == 0.002 and settings.work_slots == 3
    assert Settings().switch_interval_s == 0.001  # the default, measured in docs/hardening.md


def test_compute_threads_default_to_the_cores_at_most_two_and_are_read_and_bounded(monkeypatch):
    assert Settings().compute_threads == min(os.cpu_count() or 1, 2)
    monkeypatch.setenv("COMMPLAN_COMPUTE_THREADS", "3")
    assert Settings.from_env().compute_threads == 3
    with pytest.raises(ValueError, match="COMMPLAN_COMPUTE_THREADS 0 is under 1"):
        Settings(compute_threads=0)


@pytest.mark.parametrize("value", [0.0, -1.0, 5e-6, 0.5])
def test_a_switch_interval_out_of_range_is_refused_at_start(value):
    with pytest.raises(ValueError, match=r"COMMPLAN_SWITCH_INTERVAL_S .* outside 1e-05\.\.0\.1 seconds"):
        Settings(switch_interval_s=value)


def test_a_running_server_uses_its_switch_interval_and_gives_the_old_one_back():
    before, collector = sys.getswitchinterval(), gc.get_threshold()
    app = create_app(Settings(switch_interval_s=0.0007))
    with TestClient(app) as client:  # the lifespan runs: the server has started
        assert sys.getswitchinterval() == pytest.approx(0.0007)
        # the young generation collected every 2,000 net new objects, not 700 (a plan's peak is ~1,800)
        assert gc.get_threshold() == (GC_YOUNG_SERVICE, *collector[1:]) and GC_YOUNG_SERVICE == 2_000
        assert client.get("/healthz").json() == {"status": "ok"}
    assert sys.getswitchinterval() == pytest.approx(before)
    assert gc.get_threshold() == collector


# ---- the event loop first (issue 26 item 4, round three) ---------------------------------------------------------


def test_forked_work_runs_niced_in_a_process_group_of_its_own():
    """A forked request (COMMPLAN_WORK_IN_PROCESS=1) leads its own process group (one SIGKILL stops it and its
    search workers) in the server's session, at nice +5 (runner.NICE) beside the event loop."""

    async def never() -> bool:
        return False

    def work():
        return os.getpid(), os.getsid(0), os.getpgid(0), os.getpriority(os.PRIO_PROCESS, 0)

    pid, sid, pgid, nice = asyncio.run(runner.run(work, Deadline(30), never))
    assert pid != os.getpid() and pgid == pid and sid == os.getsid(0)
    assert nice == min(os.getpriority(os.PRIO_PROCESS, 0) + runner.NICE, 19)


def test_fastapis_first_request_costs_are_paid_at_start_up(monkeypatch):
    """FastAPI 0.165 finds each endpoint's source file on its first call (fastapi/routing.py
    _extract_endpoint_context, cached by id) and builds each router's route table on the first request that
    reaches it: tens of ms of CPU on the event loop each. The lifespan pays them before the server listens."""
    from fastapi import routing

    from app.routers import calibrate, health, plan, search

    app = create_app(Settings())
    endpoints = [r.endpoint for m in (health, plan, search, calibrate) for r in m.router.routes]
    endpoints += [r.endpoint for r in app.routes if getattr(r, "path", None) in ("/", "/docs", "/redoc")]
    monkeypatch.setattr(routing, "_endpoint_context_cache", {})  # as in a fresh process: nothing asked yet
    with TestClient(app):
        assert {id(e) for e in endpoints} <= set(routing._endpoint_context_cache)
    paths = {path for _, path in app.state.warm_requests}
    assert {"/v1/plan", "/v1/calibrate", "/v1/search", "/v1/plan/export/json", "/healthz"} <= paths
    assert "/openapi.json" not in paths  # built in a thread when first asked, not at every start


def test_the_openapi_document_is_fastapis_built_once_off_the_loop():
    app = create_app(Settings())
    with TestClient(app) as client:
        first = client.get("/openapi.json")
        assert first.headers["content-type"] == "application/json"
        assert first.content == JSONResponse(app.openapi()).body == client.get("/openapi.json").content
    assert "/openapi.json" not in first.json()["paths"]
