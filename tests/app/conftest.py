"""An httpx client on the app through the ASGI transport, usable from plain (sync) tests."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from app.main import create_app
from app.settings import Settings


class Api:
    """Runs an httpx.AsyncClient (ASGITransport) on a private event loop."""

    def __init__(self, settings: Settings | None = None):
        self.app = create_app(settings or Settings())
        self.loop = asyncio.new_event_loop()
        self.client = httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app), base_url="http://commplan.test")

    def request(self, method: str, url: str, **kwargs) -> httpx.Response:
        return self.loop.run_until_complete(self.client.request(method, url, **kwargs))

    def get(self, url: str, **kwargs) -> httpx.Response:
        return self.request("GET", url, **kwargs)

    def post(self, url: str, **kwargs) -> httpx.Response:
        return self.request("POST", url, **kwargs)

    def close(self) -> None:
        self.loop.run_until_complete(self.client.aclose())
        self.loop.close()


@pytest.fixture(scope="module")
def api():
    client = Api()
    yield client
    client.close()


@pytest.fixture
def small_limits():
    client = Api(Settings(max_body_bytes=2048, max_batch=3, max_devices=64, max_verify_elements=4096))
    yield client
    client.close()


@pytest.fixture
def cold_prices(monkeypatch) -> list[int]:
    """A counter ([calls]) of planner.plan's ``_price_op``, the prices the service really makes, from empty price,
    (cluster, options) prefix and contention caches."""
    from collections import OrderedDict

    import collectives.topology.library.pricer as library
    import planner.plan as plan_mod

    calls, price_op = [0], plan_mod._price_op

    def counting(*args, **kwargs):
        calls[0] += 1
        return price_op(*args, **kwargs)

    monkeypatch.setattr(plan_mod, "_price_op", counting)
    for module, name in ((plan_mod, "_PRICES"), (plan_mod, "_PREFIXES"), (library, "_CONTENTION")):
        monkeypatch.setattr(module, name, OrderedDict())
    return calls


LLAMA70B = {
    "model": {"preset": "llama3-70b"},
    "workload": {"kind": "training", "micro_batch_size": 1, "global_batch_size": 1024},
    "parallel": {"tp": 8, "pp": 4, "dp": 16, "zero_stage": 1, "sequence_parallel": True},
    "cluster": {"preset": "dgx-h100", "num_nodes": 64},
    "options": {"algorithm": "auto"},
}
