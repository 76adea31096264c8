"""Field-by-field hostile mutations of valid bodies on every POST endpoint (round 13, hostile13; docs/hardening.md
"Hostile input, round 13 (hostile13)").

Each example takes a valid body of one route (a preset's, or one with its model and cluster written out field by
field so every number is a field to break) and mutates one to three of its nodes: a leaf becomes a huge or negative
integer, a float JSON has or has not (NaN, Infinity, 1e400, -0.0, 1e308, 5e-324), a number as a string, a wrong enum
string, unicode, a control character, null, an empty list or object, a 2,000-deep nesting; a key is deleted, doubled
(the same key twice in one object) or joined by an unknown sibling; a query parameter gets a hostile value. Whole
bodies are also sent broken (not an object, empty, truncated, 10 MB, nested 100,000 deep, a BOM, duplicate keys).

Every answer must be a 200 whose JSON has no NaN or Infinity and whose times and byte counts are finite and >= 0
(byte counts integers), a 413, a 422 whose every detail names a field that exists (in the route's request schema or
in the body sent) and a rule, or a 503 naming the deadline or a busy slot; it must come within the deadline the
cost guard sets (COMMPLAN_DEADLINE_S) plus a margin. Never a 500.

CI: derandomized, a fixed seed, 30 EXAMPLES per route (11 s wall at load 4 on 2 shared cores). The long profile:
``COMMPLAN_HOSTILE_EXAMPLES=3000 COMMPLAN_HOSTILE_SEED=10`` (examples per route; a seed turns derandomizing off).
The real-server test listens on ``COMMPLAN_HOSTILE_PORT`` (default a free port)."""

from __future__ import annotations

import copy
import csv
import gzip
import io
import json
import math
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import hypothesis
import pytest
from hypothesis import strategies as st

from app.settings import Settings
from tests.conftest import ROOT, answering, free_port

from .conftest import Api
from .test_hostile_combos import SETTINGS
from .test_hostile_routes import in_range

REF = Path(__file__).resolve().parents[1] / "reference"
EXAMPLES = int(os.environ.get("COMMPLAN_HOSTILE_EXAMPLES", "30"))
SEED = os.environ.get("COMMPLAN_HOSTILE_SEED")
PROFILE = (
    hypothesis.settings(SETTINGS, max_examples=EXAMPLES)
    if SEED is None
    else hypothesis.settings(SETTINGS, max_examples=EXAMPLES, derandomize=False)
)
DEADLINE_S = Settings().deadline_s
MARGIN_S = 10.0  # a loaded shared machine: the event loop's own wait for the GIL, the encoding, the transport
MAX_BODY = Settings().max_body_bytes

# ---- valid bodies ----------------------------------------------------------------------------------------------

H100 = {"preset": "dgx-h100", "num_nodes": 1}
NOT_REQUEST_FIELDS = ("name", "published_params", "source", "notes", "params_total", "params_active")


def _written_out() -> tuple[dict, dict, dict]:
    """Llama-3 8B and Mixtral 8x7B as model blocks field by field, and a DGX H100 as a cluster block (the plan
    answer's own ``cluster``, which posts back), so that every number of theirs is a field the fuzz can break."""
    api = Api()
    try:
        models = api.get("/v1/presets/models").json()
        plan = api.post("/v1/plan", json={"model": {"preset": "llama3-8b"}, "parallel": {"tp": 8}, "cluster": H100})
        document = api.get("/openapi.json").json()
    finally:
        api.close()
    dense, moe = (
        {k: v for k, v in models[n].items() if k not in NOT_REQUEST_FIELDS} for n in ("llama3-8b", "mixtral-8x7b")
    )
    return dense, moe, plan.json()["cluster"], document


DENSE, MOE, CLUSTER, OPENAPI = _written_out()
PLAN = {
    "model": {"preset": "llama3-8b"},
    "workload": {"kind": "training", "global_batch_size": 64},
    "parallel": {"tp": 2, "pp": 2, "dp": 2},
    "cluster": H100,
}
PLAN_FULL = {
    "model": DENSE,
    "workload": {
        "kind": "training",
        "micro_batch_size": 1,
        "global_batch_size": 32,
        "seq_length": 4096,
        "activation_recompute": "selective",
    },
    "parallel": {
        "tp": 2,
        "pp": 2,
        "dp": 2,
        "cp": 1,
        "zero_stage": 1,
        "sequence_parallel": True,
        "pipeline_schedule": "1f1b",
        "framework": "megatron",
        "dp_bucket_bytes": 40_000_000,
        "order": "tp-cp-ep-dp-pp",
    },
    "cluster": CLUSTER,
    "options": {"algorithm": "auto", "pricing": "library"},
}
PLAN_MOE = {
    "model": MOE,
    "workload": {"kind": "training", "micro_batch_size": 1, "global_batch_size": 16, "seq_length": 2048},
    "parallel": {"tp": 2, "ep": 4, "dp": 4, "zero_stage": 1, "sequence_parallel": True},
    "cluster": H100,
}
DECODE = {
    "model": {"preset": "llama3-8b"},
    "workload": {"kind": "inference", "phase": "decode", "batch_size": 16, "context_length": 4096},
    "parallel": {"tp": 8},
    "cluster": CLUSTER,
}
SERVE = {
    "model": {"preset": "llama3-8b"},
    "cluster": H100,
    "engine": "vllm",
    "traffic": {"input_tokens": 1000, "output_tokens": 200, "concurrency": 64},
    "deployment": {"pools": [{"role": "both", "workers": 2, "tp": 4, "max_batch_tokens": 8192}]},
    "options": {"kv_dtype": "fp8", "cuda_graphs": True, "chunked_prefill": True},
}
SERVE_DISAGG = SERVE | {
    "model": MOE,
    "engine": "sglang",
    "deployment": {"pools": [{"role": "prefill", "workers": 1, "tp": 4}, {"role": "decode", "workers": 1, "tp": 4}]},
}
LOG = (REF / "nccl_logs" / "00_allreduce_1x8_github-com-azure-ai-benchmarking-guide.txt").read_text()
BENCH = (REF / "serving" / "vllm-bench-serve-docs.txt").read_text()
_SAMPLED = json.loads(gzip.decompress((REF / "traces" / "hta_sampled_rank-0.json.gz").read_bytes()))
_GPU_SIDE = ("kernel", "gpu_memcpy", "gpu_memset", "user_annotation", None, "Trace")
TRACE = {k: v for k, v in _SAMPLED.items() if k != "traceEvents"} | {
    "traceEvents": [e for e in _SAMPLED["traceEvents"] if e.get("cat") in _GPU_SIDE][:400]
}
SEARCH_PINNED = {"zero_stage": 1, "micro_batch_size": 1, "recompute": "none", "framework": "megatron", "cp": 1}


@dataclass(frozen=True)
class Route:
    name: str
    path: str  # with {fmt} filled
    body: dict
    query: dict  # query parameter -> a valid value ("" : none by default)


ROUTES = [
    Route("plan", "/v1/plan", PLAN_FULL, {"summary": "false"}),
    Route("plan-moe", "/v1/plan", PLAN_MOE, {"summary": "true"}),
    Route("plan-decode", "/v1/plan", DECODE, {}),
    Route("batch", "/v1/plan/batch", {"requests": [PLAN, PLAN_MOE]}, {"summary": "true"}),
    Route("explore", "/v1/plan/explore", {"request": PLAN, "call": "tp.attn.out_proj", "sizes": [1024, 1 << 20]}, {}),
    Route("export-csv", "/v1/plan/export/csv", PLAN, {}),
    Route("export-simai", "/v1/plan/export/simai", PLAN, {"stage": "1"}),
    Route("export-nccl-tests", "/v1/plan/export/nccl-tests", PLAN, {"launcher": "srun"}),
    Route(
        "search",
        "/v1/search",
        {
            "model": {"preset": "llama3-8b"},
            "workload": {"kind": "training", "global_batch_size": 64},
            "cluster": H100,
            "constraints": SEARCH_PINNED | {"tp": [1, 2, 4]},
            "top_k": 3,
        },
        {"stream": "false"},
    ),
    Route("serve", "/v1/serve", SERVE, {}),
    Route("serve-disagg", "/v1/serve", SERVE_DISAGG, {}),
    Route(
        "serve-search",
        "/v1/serve/search",
        {
            "model": {"preset": "llama3-8b"},
            "cluster": H100,
            "traffic": {"input_tokens": 2000, "output_tokens": 200, "concurrency": 64},
            "engines": ["vllm"],
            "modes": ["aggregated"],
            "sla": {"ttft_s": 3.0, "tpot_s": 0.06},
            "top_k": 3,
        },
        {"stream": "false"},
    ),
    Route(
        "serve-calibrate",
        "/v1/serve/calibrate",
        {
            "model": {"preset": "llama3-8b"},
            "cluster": H100,
            "deployment": {"pools": [{"tp": 1}]},
            "runs": [{"text": BENCH}],
        },
        {},
    ),
    Route("serve-export", "/v1/serve/export", SERVE, {"model_path": "meta-llama/Llama-3.1-8B", "format": "launch"}),
    Route(
        "price",
        "/v1/collectives/price",
        {"op": "allreduce", "algorithm": "auto", "message_bytes": 1 << 20, "cluster": CLUSTER, "group_size": 8},
        {},
    ),
    Route(
        "verify",
        "/v1/collectives/verify",
        {"op": "allreduce", "algorithm": "ring", "num_ranks": 4, "count": 64, "dtype": "float32", "seed": 3},
        {},
    ),
    Route(
        "schedule",
        "/v1/collectives/schedule",
        {"op": "reducescatter", "algorithm": "ring", "num_ranks": 4, "count": 64},
        {},
    ),
    Route("calibrate-logs", "/v1/calibrate", {"cluster": H100, "logs": [{"text": LOG, "nodes": 1}]}, {}),
    Route("calibrate-trace", "/v1/calibrate", {"cluster": H100, "trace": TRACE, "trace_steps": 1}, {}),
    Route(
        "topology",
        "/v1/topology",
        {"cluster": CLUSTER, "devices": [0, 1, 2, 3], "utilisation": [{"id": 0, "utilisation": 0.5}]},
        {},
    ),
]
BY_NAME = {r.name: r for r in ROUTES}

# ---- hostile values --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Raw:
    """JSON text written as it is: the numbers JSON has no value for, and nestings too deep to build as objects."""

    text: str


@dataclass(frozen=True)
class Pairs:
    """An object that may name a key twice (JSON allows it; the last one wins in Python's parser)."""

    items: tuple


NUMBERS = [2**63, 2**63 - 1, -(2**63), 2**64 + 1, 10**40, 0, -1, -0.0, 0.5, 1.5, 1e308, -1e308, 5e-324, 1e-300, 1e16]
STRINGS = ["", "nope", "NaN", "Infinity", "-1", "8", "1e3", "é中🙂", "\u202e", "a\nb", "\ud800", "x" * 5000, " auto"]
RAW = ["NaN", "Infinity", "-Infinity", "1e400", "-1e400", "1" + "0" * 400, "-0", "1.0e-400", "[" * 2000 + "]" * 2000]
OTHERS = [None, True, False, [], {}, [None], {"": 1}, [[[[[[1]]]]]], Raw('{"a":' * 2000 + "1" + "}" * 2000)]
QUERY = ["", "-1", "2", "99", str(2**70), "abc", "true", "1e3", "nan", "a\nb", "é", "x" * 3000]


def _near(value) -> list:
    """Values of the same kind as a valid one, but wrong: off by a half, scaled past int64, as a string."""
    if isinstance(value, bool):
        return [0, 1, "true", str(value)]
    if isinstance(value, float) and not math.isfinite(value):  # an earlier mutation scaled it past a double
        return [0.0, -1.0]
    if isinstance(value, int | float):
        other = int(value) if isinstance(value, float) else value * 10**12
        return [value + 0.5, -value, value * 2**40, str(value), float(value), other]
    if isinstance(value, str):
        return [value.upper(), value + "x", value[:-1], value * 40, [value]]
    if isinstance(value, list):
        return [value * 2000 if len(value) < 5 else value[:1], [*value, value[0] if value else 0], value[::-1]]
    if isinstance(value, dict):
        return [[value], {**value, **{k: None for k in list(value)[:2]}}]
    return [0]


def _edges(route: Route, path: tuple) -> list:
    """Values at the edges the route's schema gives the field (its bounds, its longest string, its longest list,
    each of its enum's names): valid one by one, extreme or contradictory together."""
    values = []
    for node in SCHEMA.leaves(SCHEMA.request(route.path)[0], list(path)):
        low, high = node.get("minimum", node.get("exclusiveMinimum")), node.get("maximum", node.get("exclusiveMaximum"))
        kind = node.get("type")
        if kind == "integer":
            values += [int(v) for v in (low, high) if v is not None] + [int(high) - 1] * (high is not None)
        elif kind == "number":
            values += [v for v in (low, high) if v is not None] + [high * 0.999] * (high is not None)
        elif kind == "string":
            values += node.get("enum", []) + ["a" * node.get("maxLength", 0)] * ("maxLength" in node)
        elif kind == "boolean":
            values += [True, False]
        elif kind == "array" and "maxItems" in node:
            values.append([0] * node["maxItems"])
    return values


def _nodes(value, path=()):
    """Every (path, value) of a body, lists walked at their first two items and their last."""
    yield path, value
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _nodes(v, (*path, k))
    elif isinstance(value, list):
        for i in sorted({0, 1, len(value) - 1} & set(range(len(value)))):
            yield from _nodes(value[i], (*path, i))


def _parent(body, path):
    for part in path[:-1]:
        body = body[part]
    return body


def _copy(value):
    return json.loads(json.dumps(value))


@st.composite
def mutated(draw, route: Route):
    """A body of ``route`` with one to three nodes broken, and its query; with a list of what was done."""
    body = _copy(route.body)
    done = []
    for _ in range(draw(st.sampled_from([1, 1, 1, 2, 3]))):
        paths = [p for p, _ in _nodes(body) if p and not _inside_raw(body, p)]
        if not paths:  # the body's only field became a leaf
            break
        path = draw(st.sampled_from(paths))
        parent, key = _parent(body, path), path[-1]
        kind = draw(st.sampled_from(["replace", "replace", "near", "raw", "delete", "unknown", "twice"]))
        if kind == "delete" and isinstance(parent, dict):
            del parent[key]
        elif kind == "unknown" and isinstance(parent, dict):
            parent[draw(st.sampled_from(["zz_unknown", "é", "", "__proto__", key.upper()]))] = 1
        elif kind == "twice" and isinstance(parent, dict):
            other = draw(st.sampled_from(NUMBERS + STRINGS[:4] + OTHERS[:5]))
            first = draw(st.booleans())
            pair = ((key, other), (key, parent[key])) if first else ((key, parent[key]), (key, other))
            parent[key] = Pairs(pair)  # written out by _encode as the key twice in the parent
        else:
            pool = {"replace": NUMBERS + STRINGS + OTHERS, "raw": [Raw(t) for t in RAW]}
            pool["near"] = _near(parent[key]) + _edges(route, path)
            parent[key] = copy.deepcopy(draw(st.sampled_from(pool.get(kind, NUMBERS))))  # later mutations edit it
        done.append((kind, path))
    query = dict(route.query)
    if route.query and draw(st.integers(0, 3)) == 0:
        name = draw(st.sampled_from(sorted(route.query)))
        query[name] = draw(st.sampled_from(QUERY))
        done.append(("query", (name,)))
    return body, {k: v for k, v in query.items() if v != ""}, done


def _inside_raw(body, path) -> bool:
    for part in path:
        if isinstance(body, Raw | Pairs) or not isinstance(body, dict | list):
            return True
        body = body[part]
    return isinstance(body, Pairs)


def _encode(value) -> str:
    """JSON text of a body holding Raw values and Pairs (the key twice: written where the key is)."""
    if isinstance(value, Raw):
        return value.text
    if isinstance(value, dict):
        parts = []
        for k, v in value.items():
            items = v.items if isinstance(v, Pairs) else ((k, v),)
            parts += [f"{json.dumps(key)}:{_encode(x)}" for key, x in items]
        return "{" + ",".join(parts) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_encode(v) for v in value) + "]"
    return json.dumps(value)


def _shadow(value):
    """The body as the service parses it (the last of a doubled key wins), a Raw as a placeholder."""
    if isinstance(value, Pairs):
        return _shadow(value.items[-1][1])
    if isinstance(value, Raw):
        return value  # what the service parsed from it (a deep nesting's keys) is not known here: any field below
    if isinstance(value, dict):
        return {k: _shadow(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_shadow(v) for v in value]
    return value


# ---- what every answer must be ---------------------------------------------------------------------------------


class Schema:
    """The routes' request schemas from the service's own OpenAPI document: does a loc name a field?"""

    def __init__(self, document: dict):
        self.doc = document
        self.defs = document["components"]["schemas"]

    def request(self, path: str) -> tuple[dict, set[str]]:
        template = re.sub(r"/export/[^/]+$", "/export/{fmt}", path)
        op = self.doc["paths"][template]["post"]
        schema = op["requestBody"]["content"]["application/json"]["schema"]
        return schema, {p["name"] for p in op.get("parameters", [])}

    def _deref(self, node: dict) -> dict:
        while "$ref" in node:
            node = self.defs[node["$ref"].rsplit("/", 1)[-1]]
        return node

    def leaves(self, node: dict, parts: list) -> list[dict]:
        """The schema nodes a body path may be (each member of a union), ``[]`` where it names no field."""
        node = self._deref(node)
        members = node.get("anyOf", []) + node.get("oneOf", [])
        if members:
            return [leaf for alt in members for leaf in self.leaves(alt, parts)]
        if not parts:
            return [node]
        head, props = parts[0], node.get("properties", {})
        if head in props:
            return self.leaves(props[head], parts[1:])
        if "items" in node and isinstance(head, int):
            return self.leaves(node["items"], parts[1:])
        return []

    def resolves(self, node: dict, parts: list) -> bool:
        node = self._deref(node)
        if not parts or node == {}:
            return True
        members = node.get("anyOf", []) + node.get("oneOf", []) + node.get("allOf", [])
        if any(self.resolves(alt, parts) for alt in members):
            return True
        head, rest = parts[0], parts[1:]
        props = node.get("properties", {})
        if head in props:
            return self.resolves(props[head], rest)
        if "items" in node and (isinstance(head, int) or str(head).isdigit()):
            return self.resolves(node["items"], rest)
        extra = node.get("additionalProperties")
        if isinstance(extra, dict):
            return self.resolves(extra, rest)
        return extra is True or (node.get("type") == "object" and not props and extra is None)


SCHEMA = Schema(OPENAPI)


def _walks(value, parts: list) -> bool:
    for part in parts:
        if isinstance(value, Raw):
            return True
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and str(part).isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return False
    return True


def _strict(text: str):
    def refuse(constant):
        raise AssertionError(f"the answer holds {constant}, which JSON does not have")

    return json.loads(text, parse_constant=refuse)


def _plain_cells(text: str, why):
    """A CSV's numbers are plain decimals (docs/CONTRACT.md exports): finite, never in scientific notation."""
    for row in csv.reader(io.StringIO(text)):
        for cell in row:
            if re.fullmatch(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?|[-+]?(nan|inf|infinity)", cell.strip(), re.I):
                assert math.isfinite(float(cell)) and "e" not in cell.lower(), (cell, why)


def judge(response: httpx.Response, elapsed: float, schema: Schema, path: str, shadow, why) -> str:
    """Fails unless the answer is one the contract allows; returns its kind."""
    status = response.status_code
    assert status in (200, 413, 422, 503), (status, response.text[:1500], why)
    assert elapsed <= DEADLINE_S + MARGIN_S, (f"answered after {elapsed:.1f} s", why)
    kind = response.headers.get("content-type", "")
    if status == 200:
        if "ndjson" in kind:
            for line in response.text.splitlines():
                in_range(_strict(line), why)
                assert _strict(line).get("status", 200) != 500, (line[:800], why)
        elif "json" in kind:
            in_range(_strict(response.text), why)
        elif "csv" in kind:
            _plain_cells(response.text, why)
        return "200"
    detail = _strict(response.text)["detail"]
    assert isinstance(detail, list) and detail, (status, detail, why)
    if status == 503:
        assert all(d["type"] in ("deadline", "busy") for d in detail), (detail, why)
        return "503"
    request, params = schema.request(path)
    for err in detail:
        loc, msg = err["loc"], err["msg"]
        assert isinstance(msg, str) and msg.strip() and err["type"], (err, why)
        where = loc[0]
        assert where in ("body", "query", "path"), (err, why)
        if where == "body" and err["type"] not in ("json_invalid", "too_many_errors"):
            parts = loc[1:]
            assert schema.resolves(request, parts) or _walks(shadow, parts), ("no such field", err, why)
        elif where in ("query", "path"):
            assert len(loc) == 2 and loc[1] in params, ("no such parameter", err, why)
    return str(status)


def send(api: Api, route: Route, text: str, query: dict) -> tuple[httpx.Response, float]:
    start = time.monotonic()
    response = api.post(route.path, params=query, content=text.encode("utf-8", "surrogatepass"), headers=JSON)
    return response, time.monotonic() - start


JSON = {"content-type": "application/json"}


# ---- the tests -------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def schema() -> Schema:
    return SCHEMA


def test_every_base_body_is_answered(api, schema):
    """The bodies the fuzz breaks are valid: each is a 200 as sent (else every mutation would be refused for the
    same reason and nothing past the first check would be tested)."""
    for route in ROUTES:
        response, elapsed = send(api, route, json.dumps(route.body), route.query)
        assert response.status_code == 200, (route.name, response.text[:800])
        judge(response, elapsed, schema, route.path, route.body, route.name)


@pytest.mark.parametrize("name", list(BY_NAME))
@hypothesis.seed(int(SEED or 13))
@PROFILE
@hypothesis.given(data=st.data())
def test_every_field_broken_is_refused_or_answered_in_range(api, schema, name, data):
    route = BY_NAME[name]
    body, query, done = data.draw(mutated(route))
    text = _encode(body)
    response, elapsed = send(api, route, text, query)
    judge(response, elapsed, schema, route.path, _shadow(body), (name, done, query, text[:600]))


def _whole_bodies(route: Route) -> dict[str, tuple[bytes, tuple]]:
    """Bodies broken as a whole, and the statuses each may get."""
    text = json.dumps(route.body)
    first = next(iter(route.body))
    return {
        "null": (b"null", (422,)),
        "a list": (json.dumps([route.body]).encode(), (422,)),
        "a string": (b'"x"', (422,)),
        "a number": (b"1e400", (422,)),
        "empty": (b"", (422,)),
        "an empty object": (b"{}", (422,)),
        "truncated": (text[: len(text) // 2].encode(), (422,)),
        "trailing garbage": ((text + "}{").encode(), (422,)),
        "a byte-order mark": (b"\xef\xbb\xbf" + text.encode(), (200, 422)),
        "latin-1": ('{"x": "\xe9"}'.encode("latin-1"), (422,)),
        "nested 100,000 deep": (("[" * 100_000 + "]" * 100_000).encode(), (422,)),
        "every key twice": (("{" + text[1:-1] + "," + text[1:-1] + "}").encode(), (200,)),
        "the first key twice, null last": ((text[:-1] + f', "{first}": null}}').encode(), (422, 200)),
        "10 MB": ((text[:-1] + ', "pad": "' + "x" * (10 * 2**20) + '"}').encode(), (413,)),
        "one byte over": ((text[:-1] + ', "pad": "' + "x" * (MAX_BODY - len(text)) + '"}').encode(), (413,)),
    }


@pytest.mark.parametrize("name", ["plan", "batch", "explore", "export-csv", "search", "serve", "serve-search",
                                  "serve-calibrate", "serve-export", "price", "verify", "schedule",
                                  "calibrate-logs", "topology"])  # fmt: skip
def test_whole_bodies_broken(api, schema, name):
    route = BY_NAME[name]
    for what, (content, allowed) in _whole_bodies(route).items():
        start = time.monotonic()
        response = api.post(route.path, params=route.query, content=content, headers=JSON)
        why = (name, what)
        assert response.status_code in allowed, (response.status_code, response.text[:800], why)
        judge(response, time.monotonic() - start, schema, route.path, route.body, why)


# ---- over TCP: a real server -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def real_server():
    """`commplan serve` (uvicorn, worker processes) on COMMPLAN_HOSTILE_PORT or a free port."""
    port = int(os.environ.get("COMMPLAN_HOSTILE_PORT") or free_port())
    cmd = [sys.executable, "-m", "app.cli", "serve", "--host", "127.0.0.1", "--port", str(port)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    assert answering(base), "the server did not start"
    try:
        with httpx.Client(base_url=base, timeout=DEADLINE_S + 2 * MARGIN_S) as client:
            yield client
    finally:
        proc.terminate()
        proc.wait(timeout=20)


@hypothesis.seed(int(SEED or 13))
@hypothesis.settings(PROFILE, max_examples=max(EXAMPLES * 2, 20))
@hypothesis.given(data=st.data())
def test_a_real_server_takes_broken_fields(real_server, schema, data):
    """The same mutations over TCP to uvicorn and the worker processes (`commplan serve`'s default), every route:
    the answer's status, its detail and its time, and the server still answers /healthz afterwards."""
    route = data.draw(st.sampled_from(ROUTES))
    body, query, done = data.draw(mutated(route))
    text = _encode(body)
    start = time.monotonic()
    response = real_server.post(route.path, params=query, content=text.encode("utf-8", "surrogatepass"), headers=JSON)
    judge(response, time.monotonic() - start, schema, route.path, _shadow(body), (route.name, done, query, text[:600]))
    assert real_server.get("/healthz", timeout=5).status_code == 200


def test_a_real_server_refuses_whole_bodies(real_server, schema):
    route = BY_NAME["plan"]
    for what, (content, allowed) in _whole_bodies(route).items():
        start = time.monotonic()
        response = real_server.post(route.path, content=content, headers=JSON)
        assert response.status_code in allowed, (response.status_code, response.text[:800], what)
        judge(response, time.monotonic() - start, schema, route.path, route.body, what)
    assert real_server.get("/healthz", timeout=5).status_code == 200


# ---- what the fuzz found, fixed (each failed before its fix) ---------------------------------------------------

GPU_OBJECT = {"name": "x", "peak_tflops": {"bf16": -1}}
SEARCH = BY_NAME["search"].body


OVER = "Input should be less than or equal to 131072, got 9223372036854775808"
CONSTRAINTS = [  # a search constraint: one value or a list of them
    ({"tp": [1, 2**63]}, ["tp", 1], OVER),
    ({"micro_batch_size": 1.5}, ["micro_batch_size"], "Input should be a valid integer or a valid list, got 1.5"),
    ({"micro_batch_size": 2**63}, ["micro_batch_size"], OVER),
    ({"recompute": ["none", "x"]}, ["recompute", 1], "Input should be 'none', 'selective' or 'full', got 'x'"),
    ({"framework": 5}, ["framework"], "Input should be 'megatron', 'torch' or 'deepspeed', got 5"),
]


@pytest.mark.parametrize(
    ("path", "body", "loc", "msg"),
    [
        (
            "/v1/plan",
            PLAN | {"cluster": H100 | {"gpu": 2**63}},
            ["body", "cluster", "gpu"],
            "Input should be a valid string or a valid dictionary or object to extract fields from, "
            "got 9223372036854775808",
        ),
        (
            "/v1/plan",
            PLAN | {"cluster": H100 | {"gpu": GPU_OBJECT}},
            ["body", "cluster", "gpu", "peak_tflops", "bf16"],
            "Input should be greater than or equal to 0, got -1",
        ),
        (
            "/v1/topology",
            {"cluster": H100 | {"gpu": {"name": "x", "zz": 1}}, "devices": [0]},
            ["body", "cluster", "gpu", "zz"],
            "Extra inputs are not permitted",
        ),
        (
            "/v1/plan",
            PLAN | {"parallel": {"pipeline_layout": 5}},
            ["body", "parallel", "pipeline_layout"],
            "Input should be a valid string or a valid list, got 5",
        ),
    ]
    + [
        ("/v1/search", SEARCH | {"constraints": c}, ["body", "constraints", *tail], msg) for c, tail, msg in CONSTRAINTS
    ],
)
def test_a_union_field_is_refused_at_the_field_itself(api, path, body, loc, msg):
    """A field that takes one of several shapes (a GPU name or object, a degree or a list of degrees, a layout
    string or list) was refused with pydantic's member names inside loc (`cluster.gpu.str`,
    `cluster.gpu.GPUIn.peak_tflops.bf16`, `constraints.tp.list[constrained-int].1`), fields the request does not
    have, and with one error per member: a GPU object with one negative number was also "cluster.gpu.str: Input
    should be a valid string". Now one error at the request's own field, from the member that took the value's
    shape, or naming each shape where none did."""
    r = api.post(path, json=body)
    assert r.status_code == 422, r.text[:800]
    assert r.json()["detail"] == [{"loc": loc, "msg": msg, "type": r.json()["detail"][0]["type"]}], r.text[:800]


def test_a_batch_item_and_the_cli_name_a_union_field_alike(api, tmp_path, capsys):
    """The batch's items and the CLI read pydantic's errors through the same function (app/errors.py `untagged`),
    and say a model member as a JSON object, not by its class name ("or instance of GPUIn")."""
    from app.cli import main

    item = PLAN | {"cluster": H100 | {"gpu": 2**63}}
    (result,) = api.post("/v1/plan/batch", json={"requests": [item]}).json()["results"]
    assert result["error"]["detail"] == [
        {
            "loc": ["body", "cluster", "gpu"],
            "msg": "Input should be a valid string or a valid dictionary (a JSON object), got 9223372036854775808",
            "type": "string_type",
        }
    ]
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(PLAN | {"cluster": H100 | {"gpu": GPU_OBJECT}}))
    assert main(["plan", str(path)]) == 2
    assert capsys.readouterr().err == (
        "commplan: cluster.gpu.peak_tflops.bf16: Input should be greater than or equal to 0, got -1\n"
    )


@pytest.mark.parametrize("text", ["a" * 2_000_000, "a:" * 1_000_000])
def test_a_log_of_one_long_line_is_refused_promptly(api, text):
    """A calibrate log's `text` may hold 2,000,000 characters; one line of them made the nccl-tests reader's pattern
    for a glued NCCL message run about an hour in C (collectives/topology/nccl_tests.py `_NCCL_INLINE`): the request
    got its 503 at the deadline but its thread ran on (a served worker is killed). Now a 422 naming the field."""
    start = time.process_time()
    r = api.post("/v1/calibrate", json={"cluster": H100, "logs": [{"text": text}]})
    assert r.status_code == 422, r.text[:800]
    assert r.json()["detail"] == [
        {
            "loc": ["body", "logs", "0", "text"],
            "msg": "no nccl-tests result rows found (lines starting with the size in bytes) in 1 lines",
            "type": "value_error.spec",
        }
    ], r.text[:800]
    assert time.process_time() - start < 5


@pytest.mark.parametrize(
    ("world", "said"),
    [(10**400, "an integer of 401 digits"), (2**31, "2147483648"), (2**63, "9223372036854775808")],
    ids=["10^400", "2^31", "2^63"],
)
def test_a_trace_of_a_world_past_c10ds_int_is_refused(api, world, said):
    """A trace's `distributedInfo.world_size` of 10^400 was read and answered back as it was, a 200 holding a
    401-digit integer that no JSON reader of 64-bit numbers takes (found by the long profile, seed 7). torch writes
    it from c10d's C int: past 2^31 - 1 it is a 422 naming the field and the number."""
    trace = TRACE | {"distributedInfo": {"backend": "nccl", "rank": 0, "world_size": world}}
    r = api.post("/v1/calibrate", json={"cluster": H100, "trace": trace})
    assert r.status_code == 422, r.text[:800]
    (err,) = r.json()["detail"]
    assert err["loc"] == ["body", "trace", "distributedInfo"], err
    assert err["msg"] == f"world_size is at most 2,147,483,647 (c10d's int), got rank 0, world_size {said}", err
    ok = api.post(
        "/v1/calibrate", json={"cluster": H100, "trace": TRACE | {"distributedInfo": {"world_size": 2**31 - 1}}}
    )
    assert ok.status_code == 200 and ok.json()["trace"]["world_size"] == 2**31 - 1, ok.text[:800]


@pytest.mark.parametrize("where", ["kernel", "gpu_memcpy"])
def test_a_trace_name_that_is_no_unicode_text_is_refused(api, where):
    """A kernel named "\\ud800" (JSON's escape of a lone surrogate) was answered among the unclassified kernels and
    the answer failed to encode: a logged 500 (the long profile, seed 10). Now a 422 naming the event."""
    trace = copy.deepcopy(TRACE)
    i = max(k for k, e in enumerate(trace["traceEvents"]) if e.get("cat") == where)
    trace["traceEvents"][i]["name"] = "\ud800"
    text = json.dumps({"cluster": H100, "trace": trace})  # ensure_ascii: the escape as a client writes it
    r = api.post("/v1/calibrate", content=text.encode(), headers=JSON)
    assert r.status_code == 422, r.text[:800]
    (err,) = r.json()["detail"]
    assert err["loc"] == ["body", "trace", f"traceEvents[{i}]", "name"], err
    assert err["msg"] == "a lone surrogate (U+D800 at character 1) is not text", err
