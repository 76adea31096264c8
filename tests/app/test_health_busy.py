"""Searches that find every work slot busy are a 503 `busy` with Retry-After, not a wait without end (issue 26 item
6: twenty concurrent searches got exactly this; docs/hardening.md "Small things")."""

from __future__ import annotations

import asyncio

import httpx

from app.main import create_app
from app.settings import Settings
from tests.app.test_load import LARGE, SEARCH

# a plan that routes a 1,000-router torus: it computes until its deadline (tests/app/test_load.py uses it too); its
# routing is charged 1.3e9 units (mend15d: a router network's node pairs), so the budgets are lifted below
SLOW = LARGE | {"cluster": {"preset": "tpu-torus", "num_nodes": 1000}, "parallel": {"tp": 8, "pp": 5},
                "workload": {"micro_batch_size": 1, "global_batch_size": 1000}}  # fmt: skip


def test_searches_that_find_every_slot_busy_are_told_to_retry():
    settings = Settings(work_slots=1, queue_s=0.3, deadline_s=6, max_router_pairs=1 << 40, max_work=1 << 40)
    app = create_app(settings)

    async def main():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t", timeout=60) as c:
            slow = asyncio.ensure_future(c.post("/v1/plan", json=SLOW))
            for _ in range(200):  # until the slow plan holds the only slot (a fixed sleep lost the race at load)
                slots = getattr(app.state, "work_limiter", None)
                if slots is not None and slots.borrowed_tokens == 1:
                    break
                await asyncio.sleep(0.05)
            assert app.state.work_limiter.borrowed_tokens == 1
            busy = await asyncio.gather(*(c.post("/v1/search", json=SEARCH) for _ in range(20)))
            stopped = await slow
            after = await c.post("/v1/search", json=SEARCH)
        return busy, stopped, after

    busy, stopped, after = asyncio.run(main())
    assert [r.status_code for r in busy] == [503] * 20
    for r in busy:
        assert r.headers["retry-after"] == "1"
        (error,) = r.json()["detail"]
        assert error["type"] == "busy"
        assert error["msg"] == "all 1 work slots stayed busy for 0.3 s (COMMPLAN_WORK_SLOTS); retry"
    assert stopped.status_code == 503 and stopped.json()["detail"][0]["type"] == "deadline"
    assert after.status_code == 200 and after.json()["results"]  # the slot is free again
