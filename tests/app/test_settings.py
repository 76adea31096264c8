"""Service settings (app/settings.py): read from COMMPLAN_* once, bounded, and the GIL switch interval a
running server uses (issue 26 item 4: /healthz prompt while work threads compute)."""

from __future__ import annotations

import sys

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings


def test_settings_read_the_environment_by_their_commplan_names(monkeypatch):
    monkeypatch.setenv("COMMPLAN_SWITCH_INTERVAL_S", "0.002")
    monkeypatch.setenv("COMMPLAN_WORK_SLOTS", "3")
    settings = Settings.from_env()
    assert settings.switch_interval_s == 0.002 and settings.work_slots == 3
    assert Settings().switch_interval_s == 0.001  # the default, measured in docs/hardening.md


@pytest.mark.parametrize("value", [0.0, -1.0, 5e-6, 0.5])
def test_a_switch_interval_out_of_range_is_refused_at_start(value):
    with pytest.raises(ValueError, match=r"COMMPLAN_SWITCH_INTERVAL_S .* outside 1e-05\.\.0\.1 seconds"):
        Settings(switch_interval_s=value)


def test_a_running_server_uses_its_switch_interval_and_gives_the_old_one_back():
    before = sys.getswitchinterval()
    app = create_app(Settings(switch_interval_s=0.0007))
    with TestClient(app) as client:  # the lifespan runs: the server has started
        assert sys.getswitchinterval() == pytest.approx(0.0007)
        assert client.get("/healthz").json() == {"status": "ok"}
    assert sys.getswitchinterval() == pytest.approx(before)
