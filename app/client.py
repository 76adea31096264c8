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

import asyncio
import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any

import httpx

JSON = dict[str, Any]


class CommplanError(Exception):
    """The server refused a request: ``status`` (422, 413, ...) and FastAPI's ``detail`` list."""

    def __init__(self, status: int, detail: Any):
        self.status, self.detail = status, detail
        super().__init__(f"{status}: {self.messages() if isinstance(detail, list) else detail}")

    def messages(self) -> list[str]:
        """'field: rule' per problem, e.g. 'parallel.tp: tp*cp*pp*dp = 16*1*4*16 = 1024 but ...'."""
        out = []
        for d in self.detail if isinstance(self.detail, list) else []:
            path = ".".join(str(x) for x in d.get("loc", []) if x != "body")
            out.append(f"{path}: {d.get('msg', '')}" if path else str(d.get("msg", "")))
        return out

    @property
    def fields(self) -> list[str]:
        return [m.split(":", 1)[0] for m in self.messages()]


# ---- typed results (CONTRACT.md names) ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Placement:
    span: str
    nodes_per_group: int
    bottleneck: str
    bottleneck_link: str = ""
    busbw_GBps: float = 0.0
    group_devices: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class Call:
    name: str
    parallelism: str
    op: str
    phase: str
    stages: list[int]
    group_size: int
    num_groups: int
    message_bytes: int
    calls_per_iteration: int
    algorithm: str
    bytes_sent_per_rank: int
    bytes_received_per_rank: int
    time_s: float
    placement: Placement | None = None
    protocol: str | None = None

    @property
    def time_per_iteration_s(self) -> float:
        return self.time_s * self.calls_per_iteration


@dataclass(frozen=True)
class StageTotal:
    stage: int
    message_bytes: int
    bytes_sent: int
    time_s: float


@dataclass(frozen=True)
class Totals:
    time_s: float
    per_stage: list[StageTotal]
    by_parallelism: dict[str, Any]
    busiest_stage: int = 0


@dataclass(frozen=True)
class TimelineEvent:
    stage: int
    stream: str
    name: str
    start_s: float
    end_s: float
    microbatch: int | None = None


@dataclass(frozen=True)
class Step:
    time_s: float
    compute_s: float
    exposed_comm_s: float
    bubble_s: float
    mfu: float
    tokens_per_s: float
    timeline: list[TimelineEvent] = field(default_factory=list)


@dataclass(frozen=True)
class StageMemory:
    stage: int
    param_count: int
    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    activations_bytes: int
    buffers_bytes: int
    peak_bytes: int


@dataclass(frozen=True)
class Memory:
    capacity_bytes: int
    fits: bool
    per_stage: list[StageMemory]


@dataclass(frozen=True)
class Plan:
    world_size: int
    num_microbatches: int
    calls: list[Call]
    totals: Totals
    step: Step | None = None
    memory: Memory | None = None
    warnings: list[str] = field(default_factory=list)
    raw: JSON = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class SearchHit:
    parallel: JSON
    micro_batch_size: int
    activation_recompute: str
    step: Step
    memory: Memory
    recompute_method: str | None = None  # where the search chose Megatron's --recompute-method
    recompute_num_layers: int | None = None


@dataclass(frozen=True)
class SearchResult:
    evaluated: int
    feasible: int
    elapsed_s: float
    pruned: dict[str, int]
    results: list[SearchHit]
    raw: JSON = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class Throughput:
    input_tokens_per_s: float
    output_tokens_per_s: float
    output_tokens_per_s_per_gpu: float
    tokens_per_s_per_user: float


@dataclass(frozen=True)
class KVCache:
    bytes_per_token: int
    capacity_tokens: int
    max_concurrency: int


@dataclass(frozen=True)
class KVTransfer:
    bytes_per_request: int
    time_s: float
    bottleneck: str
    senders: int = 1


@dataclass(frozen=True)
class ServePool:
    role: str
    gpus: int
    batch: int
    step_s: float
    input_tokens_per_s: float
    output_tokens_per_s: float
    calls: list[Call]
    fits: bool = True
    prefill_calls: list[Call] = field(default_factory=list)


@dataclass(frozen=True)
class ServeResult:
    """POST /v1/serve (CONTRACT v1.2): ``ttft_s`` is None when the queue grows without bound."""

    gpus: int
    ttft_s: float | None
    tpot_s: float
    fits: bool
    throughput: Throughput
    kv_cache: KVCache
    pools: list[ServePool]
    kv_transfer: KVTransfer | None = None
    bottleneck: str = ""
    request_rate: float = 0.0
    warnings: list[str] = field(default_factory=list)
    raw: JSON = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class ServeHit:
    engine: str
    mode: str
    request: JSON  # the /v1/serve body that reproduces it
    meets_sla: bool
    answer: ServeResult


@dataclass(frozen=True)
class ParetoPoint:
    engine: str
    mode: str
    request: JSON
    output_tokens_per_s_per_gpu: float
    tokens_per_s_per_user: float
    ttft_s: float | None = None
    tpot_s: float = 0.0


@dataclass(frozen=True)
class ServeSearchResult:
    results: list[ServeHit]
    pareto: list[ParetoPoint]
    evaluated: int
    candidates: int
    rejected: dict[str, int]
    why: str
    raw: JSON = field(default_factory=dict, repr=False, compare=False)


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
