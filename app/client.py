"""A typed Python client for the commplan HTTP API (CONTRACT.md): httpx, sync and async.

Against a server::

    with Client("http://127.0.0.1:8000") as cp:
        plan = cp.plan({"model": {"preset": "llama3-70b"}, ...})
        print(plan.totals.time_s, plan.calls[0].name)

In-process, no server (a scheduler's or a user's test suite)::

    from app.main import create_app
    with Client(app=create_app()) as cp:
        ...

``AsyncClient`` has the same methods as coroutines (in-process through ``httpx.ASGITransport``). Results are
frozen dataclasses of the contract's fields; fields the server adds later are kept in ``.raw``. A 422/413 raises
:class:`CommplanError` with the server's ``detail`` (field, rule and numbers).
"""

from __future__ import annotations

import ast
import asyncio
import dataclasses
import re
import types
import typing
from dataclasses import field
from typing import Any

import httpx

JSON = dict[str, Any]


class CommplanError(Exception):
    """The server refused a request: ``status`` (422, 413, ...) and FastAPI's ``detail`` list; ``messages`` and
    ``fields`` read it, both properties (``messages`` was a method beside the ``fields`` property)."""

    def __init__(self, status: int, detail: Any):
        self.status, self.detail = status, detail
        super().__init__(f"{status}: {self.messages if isinstance(detail, list) else detail}")

    @property
    def messages(self) -> list[str]:
        """'field: rule' per problem, e.g. 'parallel.tp: tp*cp*pp*dp = 16*1*4*16 = 1024 but ...'."""
        out = []
        for d in self.detail if isinstance(self.detail, list) else []:
            path = ".".join(str(x) for x in d.get("loc", []) if x != "body")
            out.append(f"{path}: {d.get('msg', '')}" if path else str(d.get("msg", "")))
        return out

    @property
    def fields(self) -> list[str]:
        """The field of each problem, in the order of ``messages``: 'parallel.tp'."""
        return [m.split(":", 1)[0] for m in self.messages]


# ---- typed results (CONTRACT.md names) ---------------------------------------------------------------------------
# One row per record of the wire format, "Record: field: type; field: type = default; ...", continued on indented
# lines; the records are frozen dataclasses made from these rows. A record's fields are the contract's (a subset
# of the response schema's: tests/app/test_client.py checks every one against the server's OpenAPI document);
# ``raw`` keeps the whole JSON object, fields added later included. A default ``[]`` is a fresh list per value.
# SearchHit.recompute_method / recompute_num_layers: where the search chose Megatron's --recompute-method (and
# recompute_modules, selective_ac_option, cpu_offloading_num_layers where it chose those);
# ServeHit.request and ParetoPoint.request: the /v1/serve body that reproduces the deployment.
_RECORDS = """
Placement: span: str; nodes_per_group: int; bottleneck: str; bottleneck_link: str = ""; busbw_GBps: float = 0.0;
    group_devices: list[int] = []
Call: name: str; parallelism: str; op: str; phase: str; stages: list[int]; group_size: int; num_groups: int;
    message_bytes: int; calls_per_iteration: int; algorithm: str; bytes_sent_per_rank: int;
    bytes_received_per_rank: int; time_s: float; placement: Placement | None = None; protocol: str | None = None
StageTotal: stage: int; message_bytes: int; bytes_sent: int; time_s: float
Totals: time_s: float; per_stage: list[StageTotal]; by_parallelism: dict[str, Any]; busiest_stage: int = 0
TimelineEvent: stage: int; stream: str; name: str; start_s: float; end_s: float; microbatch: int | None = None;
    overlapped: bool = False
Step: time_s: float; compute_s: float; exposed_comm_s: float; bubble_s: float; mfu: float; tokens_per_s: float;
    timeline: list[TimelineEvent] = []
StageMemory: stage: int; param_count: int; params_bytes: int; grads_bytes: int; optimizer_bytes: int;
    activations_bytes: int; buffers_bytes: int; peak_bytes: int
Memory: capacity_bytes: int; fits: bool; per_stage: list[StageMemory]
Plan: world_size: int; num_microbatches: int; calls: list[Call]; totals: Totals; step: Step | None = None;
    memory: Memory | None = None; warnings: list[str] = []; raw
SearchHit: parallel: JSON; micro_batch_size: int; activation_recompute: str; step: Step | None; memory: Memory | None;
    recompute_method: str | None = None; recompute_num_layers: int | None = None;
    recompute_modules: list[str] | None = None; selective_ac_option: str | None = None;
    cpu_offloading_num_layers: int | None = None
SearchResult: evaluated: int; feasible: int; elapsed_s: float; pruned: dict[str, int]; results: list[SearchHit]; raw
Throughput: input_tokens_per_s: float; output_tokens_per_s: float; output_tokens_per_s_per_gpu: float;
    tokens_per_s_per_user: float
KVCache: bytes_per_token: int; capacity_tokens: int; max_concurrency: int
KVTransfer: bytes_per_request: int; time_s: float; bottleneck: str; senders: int = 1; wire_bytes: int = 0
ServePool: role: str; gpus: int; batch: int; step_s: float; input_tokens_per_s: float; output_tokens_per_s: float;
    calls: list[Call]; fits: bool = True; prefill_calls: list[Call] = []
ServeResult: gpus: int; ttft_s: float | None; tpot_s: float; fits: bool; throughput: Throughput; kv_cache: KVCache;
    pools: list[ServePool]; kv_transfer: KVTransfer | None = None; bottleneck: str = ""; request_rate: float = 0.0;
    saturated: bool = False; warnings: list[str] = []; raw
ServeHit: engine: str; mode: str; request: JSON; meets_sla: bool; answer: ServeResult
ParetoPoint: engine: str; mode: str; request: JSON; output_tokens_per_s_per_gpu: float; tokens_per_s_per_user: float;
    ttft_s: float | None = None; tpot_s: float = 0.0; meets_sla: bool = False; gpus: int = 0
ServeSearchResult: results: list[ServeHit]; pareto: list[ParetoPoint]; evaluated: int; candidates: int;
    rejected: dict[str, int]; why: str; deployment_gpus: JSON | None = None; raw
"""


def _time_per_iteration_s(self: Any) -> float:
    return self.time_s * self.calls_per_iteration


# what a record holds beside its fields
_EXTRAS: dict[str, JSON] = {
    "Call": {"time_per_iteration_s": property(_time_per_iteration_s)},
    "ServeResult": {
        "__doc__": "POST /v1/serve (CONTRACT v1.2): ``ttft_s`` is None when the queue grows without bound; "
        "``saturated``: the asked rate is more than the deployment serves (``request_rate`` is what it serves)."
    },
}


def _field(spec: str) -> tuple[str, str, Any]:
    """'name: type' or 'name: type = default' (a literal; [] a fresh list), or 'raw': the whole JSON object."""
    if spec == "raw":
        return "raw", "JSON", field(default_factory=dict, repr=False, compare=False)
    name, rest = (s.strip() for s in spec.split(":", 1))
    kind, has_default, default = (s.strip() for s in rest.partition("="))
    if not has_default:
        return name, kind, field()
    value = ast.literal_eval(default)
    return name, kind, field(default_factory=list) if value == [] else field(default=value)


def _records(table: str) -> dict[str, type]:
    """The table's rows as frozen dataclasses of this module, in the table's order."""
    rows = re.split(r"\n(?=\S)", table.strip())
    out = {}
    for row in rows:
        name, body = row.split(":", 1)
        fields = [_field(" ".join(spec.split())) for spec in body.split(";")]
        namespace = {"__module__": __name__, **_EXTRAS.get(name, {})}
        out[name] = dataclasses.make_dataclass(name, fields, namespace=namespace, frozen=True)
    return out


RECORDS = _records(_RECORDS)
Placement, Call, StageTotal, Totals, TimelineEvent, Step, StageMemory, Memory, Plan = list(RECORDS.values())[:9]
SearchHit, SearchResult, Throughput, KVCache, KVTransfer, ServePool, ServeResult = list(RECORDS.values())[9:16]
ServeHit, ParetoPoint, ServeSearchResult = list(RECORDS.values())[16:]


def decode(cls: type, data: Any) -> Any:
    """``data`` (parsed JSON) as ``cls``: dataclasses by field (unknown keys ignored), lists and optionals inside."""
    if data is None:
        return None
    origin = typing.get_origin(cls)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(cls) if a is not type(None)]
        return decode(inner[0], data) if len(inner) == 1 else data
    if origin is list:
        (inner,) = typing.get_args(cls)
        return [decode(inner, x) for x in data]
    if dataclasses.is_dataclass(cls):
        hints = typing.get_type_hints(cls)
        values = {f.name: decode(hints[f.name], data[f.name]) for f in dataclasses.fields(cls) if f.name in data}
        if "raw" in hints:
            values["raw"] = data
        return cls(**values)
    return data


# ---- transports ------------------------------------------------------------------------------------------------
def _check(response: httpx.Response) -> httpx.Response:
    if response.status_code >= 400:
        try:
            detail = response.json().get("detail", response.text)
        except ValueError:
            detail = response.text
        raise CommplanError(response.status_code, detail)
    return response


def _batch_item(item: JSON) -> Plan | CommplanError:
    if item.get("ok"):
        return decode(Plan, item["plan"])
    error = item.get("error", {})
    return CommplanError(error.get("status", 422), error.get("detail", []))


class Client:
    """Synchronous client; ``app=`` plans in-process (an ``httpx.ASGITransport`` on a private event loop)."""

    def __init__(self, base_url: str = "http://commplan", *, app: Any = None, timeout: float = 60.0):
        self._loop: asyncio.AbstractEventLoop | None = None
        if app is not None:
            self._loop = asyncio.new_event_loop()
            self._async = httpx.AsyncClient(base_url=base_url, transport=httpx.ASGITransport(app=app), timeout=timeout)
        else:
            self._http = httpx.Client(base_url=base_url, timeout=timeout)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._loop is None:
            self._http.close()
        else:
            self._loop.run_until_complete(self._async.aclose())
            self._loop.close()

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        if self._loop is None:
            return _check(self._http.request(method, path, **kwargs))
        return _check(self._loop.run_until_complete(self._async.request(method, path, **kwargs)))

    def _post(self, path: str, body: JSON, **params: Any) -> httpx.Response:
        return self._request("POST", path, json=body, params=params or None)

    def plan(self, request: JSON) -> Plan:
        return decode(Plan, self._post("/v1/plan", request).json())

    def plan_batch(self, requests: list[JSON]) -> list[Plan | CommplanError]:
        return [_batch_item(r) for r in self._post("/v1/plan/batch", {"requests": requests}).json()["results"]]

    def search(self, request: JSON) -> SearchResult:
        return decode(SearchResult, self._post("/v1/search", request).json())

    def export(self, request: JSON, fmt: str, **params: Any) -> str:
        """``fmt``: json | csv | nccl-tests | simai | aicb | trace (params: ``stage``, ``launcher``)."""
        return self._post(f"/v1/plan/export/{fmt}", request, **params).text

    def serve(self, request: JSON) -> ServeResult:
        """POST /v1/serve: one serving deployment."""
        return decode(ServeResult, self._post("/v1/serve", request).json())

    def serve_search(self, request: JSON) -> ServeSearchResult:
        """POST /v1/serve/search: the best deployments under the request's SLA."""
        return decode(ServeSearchResult, self._post("/v1/serve/search", request).json())

    def serve_calibrate(self, request: JSON) -> JSON:
        """POST /v1/serve/calibrate: ``constants``, ``options`` to plan with, ``rows`` before and after."""
        return self._post("/v1/serve/calibrate", request).json()

    def presets(self, kind: str = "models") -> JSON:
        return self._request("GET", f"/v1/presets/{kind}").json()


class AsyncClient:
    """Asynchronous client; ``app=`` plans in-process through ``httpx.ASGITransport``."""

    def __init__(self, base_url: str = "http://commplan", *, app: Any = None, timeout: float = 60.0):
        transport = httpx.ASGITransport(app=app) if app is not None else None
        self._http = httpx.AsyncClient(base_url=base_url, transport=transport, timeout=timeout)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _post(self, path: str, body: JSON, **params: Any) -> httpx.Response:
        return _check(await self._http.post(path, json=body, params=params or None))

    async def plan(self, request: JSON) -> Plan:
        return decode(Plan, (await self._post("/v1/plan", request)).json())

    async def plan_batch(self, requests: list[JSON]) -> list[Plan | CommplanError]:
        body = (await self._post("/v1/plan/batch", {"requests": requests})).json()
        return [_batch_item(r) for r in body["results"]]

    async def search(self, request: JSON) -> SearchResult:
        return decode(SearchResult, (await self._post("/v1/search", request)).json())

    async def export(self, request: JSON, fmt: str, **params: Any) -> str:
        return (await self._post(f"/v1/plan/export/{fmt}", request, **params)).text

    async def serve(self, request: JSON) -> ServeResult:
        return decode(ServeResult, (await self._post("/v1/serve", request)).json())

    async def serve_search(self, request: JSON) -> ServeSearchResult:
        return decode(ServeSearchResult, (await self._post("/v1/serve/search", request)).json())

    async def serve_calibrate(self, request: JSON) -> JSON:
        return (await self._post("/v1/serve/calibrate", request)).json()

    async def presets(self, kind: str = "models") -> JSON:
        return _check(await self._http.get(f"/v1/presets/{kind}")).json()
