"""app.client in-process (no server): typed results equal the raw JSON, errors carry the field and the rule."""

from __future__ import annotations

import asyncio
import csv
import dataclasses
import io
import types
import typing

import pytest

from app import client
from app.client import (
    AsyncClient,
    Call,
    Client,
    CommplanError,
    Plan,
    SearchResult,
    ServeResult,
    ServeSearchResult,
    decode,
)
from app.main import create_app

from .conftest import LLAMA70B


@pytest.fixture(scope="module")
def cp():
    with Client(app=create_app()) as client:
        yield client


def test_plan_in_process_is_typed_and_matches_the_json(cp, api):
    plan = cp.plan(LLAMA70B)
    raw = api.post("/v1/plan", json=LLAMA70B).json()
    assert isinstance(plan, Plan) and isinstance(plan.calls[0], Call)
    assert plan.world_size == 512 and plan.num_microbatches == 64
    assert [c.name for c in plan.calls] == [c["name"] for c in raw["calls"]]
    assert plan.totals.time_s == raw["totals"]["time_s"]
    assert [s.time_s for s in plan.totals.per_stage] == [s["time_s"] for s in raw["totals"]["per_stage"]]
    first = plan.calls[0]
    assert first.time_per_iteration_s == first.time_s * first.calls_per_iteration
    assert first.placement.group_devices == raw["calls"][0]["placement"]["group_devices"]
    assert plan.raw == raw  # fields added later stay reachable


def test_bad_request_raises_with_field_and_numbers(cp):
    bad = {**LLAMA70B, "parallel": {**LLAMA70B["parallel"], "tp": 16}}
    with pytest.raises(CommplanError) as err:
        cp.plan(bad)
    assert err.value.status == 422
    assert "tp*cp*pp*dp = 16*1*4*16 = 1024 but the cluster has 512" in str(err.value)
    assert err.value.fields == ["parallel"] or err.value.fields[0].startswith("parallel")
    # both properties, read alike (messages was a method beside the fields property: polish6)
    assert isinstance(err.value.messages, list) and len(err.value.messages) == len(err.value.fields) >= 1
    assert [m.split(":", 1)[0] for m in err.value.messages] == err.value.fields
    assert "= 1024 but the cluster has 512" in err.value.messages[0]


def test_batch_keeps_order_and_isolates_errors(cp):
    bad = {**LLAMA70B, "parallel": {**LLAMA70B["parallel"], "tp": 16}}
    results = cp.plan_batch([LLAMA70B, bad])
    assert isinstance(results[0], Plan) and isinstance(results[1], CommplanError)
    assert results[1].status == 422


def test_export_through_the_client(cp):
    rows = list(csv.reader(io.StringIO(cp.export(LLAMA70B, "csv"))))
    assert len(rows) == 1 + len(cp.plan(LLAMA70B).calls)


def test_async_client_in_process():
    async def run():
        async with AsyncClient(app=create_app()) as acp:
            plan = await acp.plan(LLAMA70B)
            models = await acp.presets("models")
            return plan, models

    plan, models = asyncio.run(run())
    assert plan.world_size == 512 and "llama3-70b" in models


def test_decode_reads_the_v11_blocks():
    """step and memory (CONTRACT v1.1) decode into dataclasses; absent blocks are None."""
    data = {
        "world_size": 8,
        "num_microbatches": 2,
        "calls": [],
        "totals": {"time_s": 0.5, "per_stage": [], "by_parallelism": {}},
        "step": {
            "time_s": 1.5,
            "compute_s": 1.0,
            "exposed_comm_s": 0.25,
            "bubble_s": 0.25,
            "mfu": 0.41,
            "tokens_per_s": 9000.0,
            "timeline": [{"stage": 0, "stream": "compute", "name": "F0", "microbatch": 0, "start_s": 0, "end_s": 1}],
        },
        "memory": {
            "capacity_bytes": 80_000_000_000,
            "fits": False,
            "per_stage": [
                {
                    "stage": 0,
                    "param_count": 10,
                    "params_bytes": 20,
                    "grads_bytes": 20,
                    "optimizer_bytes": 120,
                    "activations_bytes": 5,
                    "buffers_bytes": 1,
                    "peak_bytes": 166,
                }
            ],
        },
    }
    plan = decode(Plan, data)
    assert plan.step.timeline[0].end_s == 1 and plan.step.mfu == 0.41
    assert plan.memory.per_stage[0].peak_bytes == 166 and plan.memory.fits is False
    assert decode(Plan, {**data, "step": None}).step is None


def test_search_and_plan_agree_through_the_client(cp):
    """A small search (one 8-GPU node, 8 layers), typed; planning its best result gives the same step time."""
    body = {
        "model": {"preset": "llama3-8b", "seq_length": 2048, "num_layers": 8},
        "workload": {"kind": "training", "global_batch_size": 16},
        "cluster": {"preset": "dgx-h100", "num_nodes": 1},
        "constraints": {"framework": "megatron", "zero_stage": 1, "activation_recompute": "none"},
        "top_k": 3,
    }
    found = cp.search(body)
    assert 0 < len(found.results) <= 3 and found.feasible <= found.evaluated
    assert [r.step.time_s for r in found.results] == sorted(r.step.time_s for r in found.results)
    best = found.results[0]
    assert all(s.peak_bytes <= best.memory.capacity_bytes for s in best.memory.per_stage)
    request = {
        "model": body["model"],
        "workload": {**body["workload"], "micro_batch_size": best.micro_batch_size,
                     "activation_recompute": best.activation_recompute},
        "parallel": best.parallel,
        "cluster": body["cluster"],
    }  # fmt: skip
    plan = cp.plan(request)
    assert plan.step.time_s == pytest.approx(best.step.time_s, rel=1e-9)
    assert plan.memory.fits and len(plan.memory.per_stage) == best.parallel["pp"]


# ---- the records follow the wire format ---------------------------------------------------------------------------
def _resolve(schema: dict, components: dict) -> tuple[dict, bool]:
    """(the schema with its $ref followed, whether null is allowed)."""
    options = schema.get("anyOf", [schema])
    nullable = {"type": "null"} in options
    (inner,) = [o for o in options if o != {"type": "null"}][:1]
    ref = inner.get("$ref")
    return (components[ref.rsplit("/", 1)[1]] if ref else inner), nullable


def _agrees(kind, schema: dict, components: dict, where: str) -> list[str]:
    """Where the client's type ``kind`` disagrees with the server's JSON schema (empty: it agrees)."""
    schema, nullable = _resolve(schema, components)
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (typing.Union, types.UnionType):
        (kind,) = [a for a in args if a is not type(None)]
        return _agrees(kind, schema, components, where)
    if nullable:
        return [f"{where}: the server may send null, the client's {kind} may not"]
    if dataclasses.is_dataclass(kind):
        if schema.get("type") == "object" and "properties" not in schema:
            return []  # an object the server does not describe (search's step and memory: the plan's blocks)
        props = schema.get("properties", {})
        out = [f"{where}.{f.name}: not in the server's schema" for f in dataclasses.fields(kind)
               if f.name != "raw" and f.name not in props]  # fmt: skip
        hints = typing.get_type_hints(kind)
        for f in dataclasses.fields(kind):
            if f.name in props:
                out += _agrees(hints[f.name], props[f.name], components, f"{where}.{f.name}")
        return out
    if origin is list:
        if schema.get("type") != "array":
            return [f"{where}: a list in the client, {schema} on the server"]
        return _agrees(args[0], schema["items"], components, f"{where}[]")
    expected = {int: "integer", float: "number", str: "string", bool: "boolean", dict: "object"}[origin or kind]
    return [] if schema.get("type") == expected else [f"{where}: {kind} in the client, {schema} on the server"]


@pytest.mark.parametrize(
    "path, record",
    [
        ("/v1/plan", Plan),
        ("/v1/search", SearchResult),
        ("/v1/serve", ServeResult),
        ("/v1/serve/search", ServeSearchResult),
    ],
)
def test_records_are_the_servers_response_fields(path, record):
    """Every field of a client record is a field of the server's response schema (OpenAPI), of the same JSON type,
    recursively; nullable on the server only where the client takes None."""
    doc = create_app().openapi()
    schema = doc["paths"][path]["post"]["responses"]["200"]["content"]["application/json"]["schema"]
    assert _agrees(record, schema, doc["components"]["schemas"], record.__name__) == []


def test_records_table_makes_named_frozen_dataclasses():
    for name, record in client.RECORDS.items():
        assert getattr(client, name) is record and record.__name__ == name and record.__module__ == "app.client"
        assert record.__dataclass_params__.frozen
    assert len(client.RECORDS) == 19
    pool = decode(client.ServePool, {"role": "decode", "gpus": 8, "batch": 4, "step_s": 0.01,
                                     "input_tokens_per_s": 1.0, "output_tokens_per_s": 2.0, "calls": []})  # fmt: skip
    assert pool.fits is True and pool.prefill_calls == [] and pool.prefill_calls is not decode(
        client.ServePool, {"role": "d", "gpus": 1, "batch": 1, "step_s": 1.0, "input_tokens_per_s": 1.0,
                           "output_tokens_per_s": 1.0, "calls": []}).prefill_calls  # fmt: skip
    with pytest.raises(dataclasses.FrozenInstanceError):
        pool.gpus = 4
    assert client.Call.time_per_iteration_s.__get__(decode(client.Call, {
        "name": "x", "parallelism": "tp", "op": "allreduce", "phase": "fwd", "stages": [0], "group_size": 8,
        "num_groups": 1, "message_bytes": 8, "calls_per_iteration": 3, "algorithm": "ring", "bytes_sent_per_rank": 14,
        "bytes_received_per_rank": 14, "time_s": 0.5})) == 1.5  # fmt: skip
