"""Large JSON bodies are decoded and validated in a thread, not on the event loop, and answered exactly as FastAPI
answers them (app/body.py, issue 26 item 4): each body below is sent through the thread and through FastAPI's
own handler (the threshold raised past it), over HTTP, and the two answers must be the same bytes."""

from __future__ import annotations

import importlib
import json
import pkgutil
import threading

import pytest
from fastapi.routing import APIRoute

import app.body
import app.routers
from tests.app.conftest import LLAMA70B, Api

PAD = b" " * (app.body.OFF_LOOP_BYTES + 1)  # JSON allows whitespace after the value: the same body, over the limit
SMALL = {"model": {"preset": "llama3-8b"}, "parallel": {"tp": 8}, "cluster": {"preset": "dgx-h100"}}
EFA = {"preset": "dgx-a100", "network": {"kind": "efa"}}


def raw(value) -> bytes:
    return json.dumps(value).encode() + PAD


CASES = {
    # (path, body bytes); the content type is application/json but where KINDS says
    "plan": ("/v1/plan", raw(LLAMA70B)),
    "plan summary": ("/v1/plan?summary=true", raw(LLAMA70B)),
    "batch of 200": ("/v1/plan/batch", raw({"requests": [SMALL] * 200})),
    "bad JSON at byte 9,000+": ("/v1/plan", PAD + b'{"model": {"preset": "llama3-8b"},'),
    "not UTF-8": ("/v1/plan", b'{"model": "\xff\xfe"}' + PAD),
    "wrong type deep inside": ("/v1/plan", raw(LLAMA70B | {"cluster": {"preset": "dgx-h100", "num_nodes": "8"}})),
    "a boolean as an integer": ("/v1/plan", raw(SMALL | {"parallel": {"tp": True}})),
    "missing field": ("/v1/calibrate", raw({"logs": [{"text": "x" * 9000, "nodes": 2}]})),
    "1,000 unknown fields": ("/v1/plan", raw(SMALL | {f"k{i}": i for i in range(1000)})),
    "control character": ("/v1/plan", raw(SMALL | {"cluster": {"preset": "dgx-h100", "name": "x\ny"}})),
    "an array, not an object": ("/v1/plan", raw([SMALL] * 100)),
    "null": ("/v1/plan", b"null" + PAD),
    "bad body and bad query": ("/v1/plan?summary=maybe", raw({"model": 1})),
    "bad stage query, good body": ("/v1/plan/export/simai?stage=-1", raw(LLAMA70B)),
    "+json content type": ("/v1/plan", raw(SMALL)),
    "text/plain: FastAPI's": ("/v1/plan", raw(SMALL)),
    "nested too deeply: FastAPI's": ("/v1/plan", b"[" * 100_000 + b"]" * 100_000),
    "calibrate": ("/v1/calibrate", raw({"cluster": EFA, "logs": [{"text": "no rows here\n" * 700, "nodes": 2}]})),
    "price": (
        "/v1/collectives/price",
        raw(
            {
                "op": "allreduce",
                "message_bytes": 1 << 20,
                "cluster": {"preset": "dgx-h100"},
                "ranks": list(range(8)) * 300,
            }
        ),
    ),
    "search": ("/v1/search", raw({"model": {"preset": "llama3-8b"}, "cluster": {"preset": "dgx-h100"}, "top_k": 0})),
}
KINDS = {"+json content type": "application/vnd.commplan+json", "text/plain: FastAPI's": "text/plain"}
NOT_JSON = {"text/plain: FastAPI's"}  # not decoded by us at all; the nested one is tried, then left to FastAPI


@pytest.fixture(scope="module")
def api():
    client = Api()
    yield client
    client.close()


@pytest.mark.parametrize("case", CASES)
def test_a_large_body_is_answered_as_fastapi_answers_it(api, case, monkeypatch):
    path, body = CASES[case]
    kind = KINDS.get(case, "application/json")
    assert len(body) > app.body.OFF_LOOP_BYTES
    threads: list[int] = []
    decode = app.body.decode

    def spy(*args):
        threads.append(threading.get_ident())
        return decode(*args)

    monkeypatch.setattr(app.body, "decode", spy)
    off = api.post(path, content=body, headers={"content-type": kind})
    monkeypatch.setattr(app.body, "OFF_LOOP_BYTES", 1 << 40)  # FastAPI's own handler, on the loop
    on = api.post(path, content=body, headers={"content-type": kind})
    assert (off.status_code, off.content) == (on.status_code, on.content)
    assert len(threads) == (0 if case in NOT_JSON else 1)  # decoded once, in the thread
    assert threading.get_ident() not in threads  # not on the event loop's thread (this one)


def test_what_the_thread_answers(api):
    """The answers themselves, so that two identical wrong answers cannot pass: FastAPI's json_invalid at the
    byte, the body's errors after the query's, and a 200 for a valid large body."""
    _, body = CASES["bad JSON at byte 9,000+"]
    detail = api.post("/v1/plan", content=body, headers={"content-type": "application/json"}).json()["detail"]
    assert [(d["type"], d["loc"]) for d in detail] == [("json_invalid", ["body", len(body)])]
    _, body = CASES["bad body and bad query"]
    answer = api.post("/v1/plan?summary=maybe", content=body, headers={"content-type": "application/json"})
    locs = [d["loc"] for d in answer.json()["detail"]]
    assert answer.status_code == 422 and locs[0] == ["query", "summary"] and locs[1][0] == "body", locs
    _, body = CASES["wrong type deep inside"]
    detail = api.post("/v1/plan", content=body, headers={"content-type": "application/json"}).json()["detail"]
    assert [d["loc"] for d in detail] == [["body", "cluster", "num_nodes"]]
    _, body = CASES["plan"]
    answer = api.post("/v1/plan", content=body, headers={"content-type": "application/json"})
    assert answer.status_code == 200 and answer.json()["calls"]


def test_every_route_with_a_body_reads_it_off_the_loop():
    """A router added later with a JSON body gets the same treatment: every route of app/routers/* that takes a
    body is an OffLoopBody (its router's route_class)."""
    modules = [importlib.import_module(f"app.routers.{m.name}") for m in pkgutil.iter_modules(app.routers.__path__)]
    routes = [
        route
        for module in modules
        if hasattr(module, "router")
        for route in module.router.routes
        if isinstance(route, APIRoute) and route.dependant.body_params
    ]
    assert len(routes) >= 14, [r.path for r in routes]  # 14 when this was written
    assert [r.path for r in routes if not isinstance(r, app.body.OffLoopBody)] == []


def test_a_large_body_waits_for_a_compute_thread_no_longer_than_for_a_work_slot():
    """A body over OFF_LOOP_BYTES is decoded behind the compute gate; while every compute thread stays busy it waits
    at most queue_s and is a 503 busy, as a request waiting for a work slot is (it waited without end: review)."""
    import asyncio

    import httpx

    from app.main import create_app
    from app.settings import Settings
    from app.threads import gate

    application = create_app(Settings(compute_threads=1, queue_s=0.3))

    async def main():
        held = object()
        await gate(application).acquire_on_behalf_of(held)  # the only compute thread is taken
        try:
            transport = httpx.ASGITransport(app=application)
            async with httpx.AsyncClient(transport=transport, base_url="http://t", timeout=30) as client:
                return await client.post(
                    "/v1/plan", content=raw(LLAMA70B) + PAD, headers={"content-type": "application/json"}
                )
        finally:
            gate(application).release_on_behalf_of(held)

    r = asyncio.run(main())
    assert r.status_code == 503 and r.headers["retry-after"] == "1", r.text
    assert r.json()["detail"][0]["type"] == "busy"
