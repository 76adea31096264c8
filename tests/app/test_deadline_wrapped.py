"""A deadline that lands while pydantic's serializer runs Python code is a 503, not a 500.

Found from a fresh clone: POST /v1/plan/batch with 1,000 plans at load 5 ran past the 15 s deadline while the
batch was writing a plan's JSON (pydantic_core.to_json); the stop raised in the worker thread came back wrapped
as PydanticSerializationError, and the answer was a 500 "internal error (logged)"."""

from __future__ import annotations

import time

import httpx
import pytest
from fastapi import Request
from pydantic_core import to_json

from app.limits import run_bounded
from app.main import create_app
from app.settings import Settings


class _Slow:
    """An object pydantic can only write through a Python fallback, which runs past any deadline."""


def _slow_fallback(_value):
    end = time.monotonic() + 10
    while time.monotonic() < end:
        time.sleep(0.005)
    return "late"


def _app(deadline_s: float):
    app = create_app(Settings(deadline_s=deadline_s))

    @app.post("/test/slow-json")
    async def slow_json(request: Request):
        return await run_bounded(request, lambda: to_json([_Slow()], fallback=_slow_fallback))

    return app


@pytest.mark.anyio
async def test_a_deadline_inside_the_serializer_is_a_503_naming_the_deadline():
    transport = httpx.ASGITransport(app=_app(0.3))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
        start = time.monotonic()
        response = await http.post("/test/slow-json")
        took = time.monotonic() - start
    assert response.status_code == 503, response.text[:300]
    assert "COMMPLAN_DEADLINE_S" in response.json()["detail"][0]["msg"]
    assert took < 5


@pytest.fixture
def anyio_backend():
    return "asyncio"
