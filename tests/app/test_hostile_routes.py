"""Hostile input on the routes round 10 did not walk (round 11, hostile11; docs/hardening.md "Round eleven
fuzzing"): /v1/search (constraints of every kind, empty and contradictory ranges, top_k at its bound, a stream the
client drops), /v1/serve/search (SLAs of 0, negative, infinite as strings, huge loads), /v1/calibrate with mangled
profiler traces, /v1/plan/explore, every export format, /v1/topology, /v1/collectives/price, verify and schedule,
/v1/plan/batch with good and bad items mixed, and the CLI's subcommands given bad files.

Every answer is a 200 whose numbers are finite, whose times and byte counts are >= 0 and whose byte counts are
integers; a 422 whose every detail names a field under ``body`` (or the query or path) and a rule; a 413 or a 503.
Never a 500. Derandomized Hypothesis with a fixed number of examples per route, well under a minute on one core."""

from __future__ import annotations

import copy
import gzip
import json
import math
import re
from pathlib import Path

import httpx
import hypothesis
import pytest
from hypothesis import strategies as st

from app.cli import main

from .test_hostile_combos import Picker, fuzz

REF = Path(__file__).resolve().parents[1] / "reference"
SAMPLED = json.loads(gzip.decompress((REF / "traces" / "hta_sampled_rank-0.json.gz").read_bytes()))
H100 = {"preset": "dgx-h100", "num_nodes": 1}
PLAN = {
    "model": {"preset": "llama3-8b"},
    "workload": {"kind": "training", "global_batch_size": 64},
    "parallel": {"tp": 2, "pp": 2, "dp": 2},
    "cluster": H100,
}
SEARCH = {"model": {"preset": "llama3-8b"}, "workload": {"kind": "training", "global_batch_size": 64}, "cluster": H100}
SERVE_SEARCH = {
    "model": {"preset": "llama3-8b"},
    "cluster": H100,
    "traffic": {"input_tokens": 2000, "output_tokens": 200, "concurrency": 64},
    "engines": ["vllm"],
    "top_k": 3,
}
TIMED = ("_s", "_bytes", "bytes", "time", "count", "steps")  # keys whose value is a duration or a count: >= 0


def numbers(value, path=""):
    if isinstance(value, bool):
        return
    if isinstance(value, int | float):
        yield path, value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from numbers(v, f"{path}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value[:500]):
            yield from numbers(v, f"{path}[{i}]")


def answered(response, body=None, refused_at=("body",)):
    """The answer's JSON if a 200 (checked), None if a 422 (checked) / 413 / 503; fails on anything else."""
    why = (response.status_code, response.text[:1500], json.dumps(body)[:1500] if body is not None else None)
    assert response.status_code in (200, 413, 422, 503), why
    if response.status_code == 422:
        for err in response.json()["detail"]:
            assert err["loc"] and err["loc"][0] in refused_at and err["msg"], (err, why)
        return None
    if response.status_code != 200 or "json" not in response.headers.get("content-type", ""):
        return None
    answer = response.json()
    in_range(answer, why)
    return answer


def in_range(answer, why) -> None:
    """Every number of an answer finite; durations and counts >= 0; byte counts integers."""
    for path, v in numbers(answer):
        assert abs(v) < 2**63 and math.isfinite(v), (path, v, why)  # an integer within int64 (JSON readers' limit)
        leaf = path.rsplit(".", 1)[-1].split("[")[0]
        if leaf.endswith(TIMED) and ".errors." not in path:  # a calibration's errors are signed fractions
            assert v >= 0, (path, v, why)
        if "bytes" in leaf:
            assert isinstance(v, int), (path, v, why)


# ---- /v1/search -----------------------------------------------------------------------------------------------

DEGREES = [1, 2, 3, 4, 8, 16, 131072]


def _degrees(pick: Picker):
    return pick([pick(DEGREES), [pick(DEGREES) for _ in range(pick([1, 2, 3]))]])


def constraints(pick: Picker) -> dict:
    """A few constraints of every kind, valid, contradictory or out of range."""
    every = {
        "tp": lambda: _degrees(pick),
        "pp": lambda: _degrees(pick),
        "cp": lambda: _degrees(pick),
        "ep": lambda: _degrees(pick),
        "expert_tp": lambda: _degrees(pick),
        "virtual_pipeline_stages": lambda: _degrees(pick),
        "micro_batch_size": lambda: _degrees(pick),
        "zero_stage": lambda: pick([0, 3, [1, 2], [], 4]),
        "sequence_parallel": lambda: pick([True, [True, False], []]),
        "framework": lambda: pick(["megatron", "torch", "deepspeed", ["torch", "deepspeed"], [], "jax"]),
        "pipeline_schedule": lambda: pick(["1f1b", ["interleaved", "zbv", "dualpipev"], [], "gpipe", "nope"]),
        "recompute": lambda: pick(["none", "full", ["selective", "full"]]),
        "recompute_method": lambda: pick(["uniform", ["block"], "nope"]),
        "recompute_num_layers": lambda: _degrees(pick),
        "recompute_modules": lambda: pick([["core_attn"], [["mlp", "layernorm"], ["moe"]], ["nope"]]),
        "selective_ac_option": lambda: pick(["op", "2", "0", "-1", ["op", "4"], "abc"]),
        "cpu_offloading_num_layers": lambda: pick([0, 4, [0, 16], 100000]),
        "pipeline_layout": lambda: pick(["Et|tL", ["Ettt|ttttL", "E|t*30|L"], "zz", "Et*31|tL"]),
        "first_stage_layers": lambda: _degrees(pick),
        "last_stage_layers": lambda: _degrees(pick),
        "ep_dispatch": lambda: pick(["alltoall", ["deepep", "hybridep"], "allgather"]),
        "uneven_stages": lambda: pick([True, False]),
        "max_dp_group": lambda: pick([0, 1, 4, -1]),
        "memory_headroom": lambda: pick([0.0, 0.05, 0.99, 1.0, -0.1]),
    }
    names = [pick(list(every)) for _ in range(pick([1, 2, 3]))]
    return {name: every[name]() for name in names}


# the dimensions a drawn constraint does not name, pinned: a few hundred layouts a search, not 18,612
PINNED = {"zero_stage": 1, "micro_batch_size": 1, "recompute": "none", "framework": "megatron", "cp": 1}


@fuzz(12)
@hypothesis.given(data=st.data())
def test_searches_with_hostile_constraints(api, data):
    pick = Picker(data)
    body = SEARCH | {"constraints": PINNED | constraints(pick), "top_k": pick([1, 10, 1000])}
    if pick.coin(4):
        body["model"] = {"preset": pick(["mixtral-8x7b", "qwen3-30b-a3b"])}
    answer = answered(api.post("/v1/search", json=body), body)
    if answer is not None:
        assert answer["evaluated"] <= answer["space_size"] and len(answer["results"]) <= body["top_k"], body
        times = [r["step"]["time_s"] for r in answer["results"] if r["step"]]
        assert times == sorted(times), body


def test_a_search_whose_constraints_leave_no_layout_says_why(api):
    """tp 8 x pp 8 x cp 8 on 8 devices: each degree divides the devices, their product does not, so the space is
    empty: a 422 at constraints naming the degrees and the product rule (an empty 200 before: hostile11), over the
    JSON and the streamed route alike (before the first byte), and the CLI's search alike (planner/search
    Space.checked_size)."""
    for url in ("/v1/search", "/v1/search?stream=true"):
        r = api.post(url, json=SEARCH | {"constraints": {"tp": 8, "pp": 8, "cp": 8}})
        assert r.status_code == 422, r.text
        (err,) = r.json()["detail"]
        assert err["loc"][-1] == "constraints"
        assert err["msg"].startswith("leave no layout on the 8 devices: tp [8], cp [8], pp [8] (tp*cp*pp is at least")


# ---- /v1/serve/search -----------------------------------------------------------------------------------------

SLA_BAD = [0, -1, "inf", "Infinity", "nan", "3", 3601, 1e308]
SLA_EDGE = [1e-300, 1e-9, 0.05, 3.0, 60, 3600, None]


@fuzz(10)
@hypothesis.given(data=st.data())
def test_serving_searches_with_hostile_slas_and_loads(api, data):
    pick = Picker(data)
    sla = {k: pick(SLA_BAD if pick.coin(4) else SLA_EDGE) for k in pick([["ttft_s"], ["tpot_s"], ["ttft_s", "tpot_s"]])}
    traffic = {"input_tokens": pick([2000, 1, 1 << 21]), "output_tokens": pick([200, 1, 1 << 21])}
    traffic |= pick([{"concurrency": pick([64, 1, 1 << 22])}, {"request_rate": pick([2.5, 1e-6, 1e6])}])
    if pick.coin(5):
        traffic["request_rate"] = pick(["inf", 0, 1e7])
    body = SERVE_SEARCH | {"sla": sla, "traffic": traffic}
    answer = answered(api.post("/v1/serve/search", json=body), body)
    if answer is not None:
        assert len(answer["results"]) <= body["top_k"] and answer["evaluated"] <= 3 * answer["candidates"], body
        if not answer["results"]:
            assert answer["why"], body  # an empty answer says why


# ---- /v1/serve/calibrate with mangled benchmark output ---------------------------------------------------------

BENCH = (REF / "serving" / "vllm-bench-serve-docs.txt").read_text()  # 10 requests, 1,369 tokens in, 2,212 out
BENCH_LABELS = ["Successful requests", "Total input tokens", "Total generated tokens", "Mean TTFT (ms)"]
BENCH_LABELS += ["Mean TPOT (ms)", "Output token throughput (tok/s)", "Benchmark duration (s)"]
DEPLOYMENT = {"model": {"preset": "llama3-8b"}, "cluster": H100, "deployment": {"pools": [{"tp": 1}]}}


def bench_with(label: str, value: str) -> str:
    return re.sub(rf"^({re.escape(label)}:\s+)\S+$", rf"\g<1>{value}", BENCH, flags=re.MULTILINE)


@fuzz(12)
@hypothesis.given(data=st.data())
def test_serving_calibrations_of_mangled_benchmark_output(api, data):
    pick = Picker(data)
    text = BENCH
    for _ in range(pick([1, 2, 3])):
        text = bench_with(pick(BENCH_LABELS), pick(["0", "-1", "1e-300", "1e300", "nan", "inf", "0.01", "abc", "7"]))
    body = DEPLOYMENT | {"engine": pick(["vllm", "sglang", "trtllm"]), "runs": [{"text": text}]}
    answer = answered(api.post("/v1/serve/calibrate", json=body), body)
    if answer is not None:
        assert all(0.05 <= v <= 20 for v in answer["constants"].values()), answer["constants"]
        traffic = answer["rows"][0]["traffic"]
        assert traffic["input_tokens"] >= 1 and traffic["output_tokens"] >= 1, traffic


@pytest.mark.parametrize("label", ["Total input tokens", "Total generated tokens"])
@pytest.mark.parametrize("value", ["0", "9"])
def test_a_run_of_under_one_token_a_request_is_refused(api, label, value):
    """10 requests that printed 0 (or 9) tokens in or out were planned as 1 token a request, a 200 whose fit
    (prefill_time_scale 8.1 for 0 tokens in) stood on traffic the run never sent; now a 422 naming the line."""
    r = api.post("/v1/serve/calibrate", json=DEPLOYMENT | {"runs": [{"text": bench_with(label, value)}]})
    assert r.status_code == 422, r.text[:500]
    (err,) = r.json()["detail"]
    assert err["loc"] == ["body", "runs", "0", "text"], err  # a planner rule's loc: its field's dotted parts
    assert err["msg"] == f"'{label}' is '{value}' over 10 requests: under one token a request", err


# ---- /v1/calibrate with a mangled trace -----------------------------------------------------------------------

EVENTS = SAMPLED["traceEvents"]
WRONG = [None, "x", -1, -1e18, 0, 1e300, 2**70, [], {}, True, "1e5", 1.5]


def mangled_trace(pick: Picker) -> dict:
    trace = copy.deepcopy(SAMPLED)
    events = trace["traceEvents"]
    for _ in range(pick([1, 3, 40])):
        e = events[pick(range(len(events)))]
        field = pick(["ts", "dur", "args", "name", "cat", "pid", "tid", "ph", "arg", "drop"])
        if field == "drop":
            e.pop(pick(["ts", "dur", "args", "name", "cat", "pid"]), None)
        elif field == "arg" and e.get("args"):
            e["args"][pick(sorted(e["args"]))] = pick(WRONG)
        else:
            e[field] = pick(WRONG)
    if pick.coin(5):
        events.append(pick([1, "s", None, [], {"ph": "X"}]))
    if pick.coin(5):
        trace["distributedInfo"] = pick([None, 5, {"rank": -1, "world_size": 0}, {"world_size": 2**64}, {"rank": 9}])
    return trace


@fuzz(10)
@hypothesis.given(data=st.data())
def test_calibrations_of_mangled_traces(api, data):
    pick = Picker(data)
    body = {"cluster": H100, "trace": mangled_trace(pick)}
    if pick.coin():
        body["trace_steps"] = pick([1, 7, 100000])
    if pick.coin(4):
        body["compare"] = {
            "model": {"preset": "llama3-8b"},
            "workload": {"global_batch_size": 8},
            "parallel": {"dp": 8},
        }
    answered(api.post("/v1/calibrate", json=body), body)


def _kernels_only(nccl: bool) -> dict:
    return {"traceEvents": [e for e in EVENTS if e.get("cat") == "kernel" and ("nccl" in e["name"].lower()) == nccl]}


@pytest.mark.parametrize(
    "trace, field, words",
    [
        ({"traceEvents": []}, "trace", "among 0 events"),
        ([], "trace", "among 0 events"),
        (json.dumps(SAMPLED)[:-5000], "trace", ""),
        ('{"traceEvents": [' + "[" * 5000 + "]" * 5000 + "]}", "trace", "nested"),
        ({"traceEvents": [dict(EVENTS[2402], dur="x")]}, "trace.traceEvents[0]", "got"),
        ({"traceEvents": [dict(EVENTS[2402], ts=2**70)]}, "trace.traceEvents[0]", str(2**70)),
        ({"traceEvents": [dict(EVENTS[2402], dur=-5.0)]}, "trace.traceEvents[0]", "-5.0"),
        ({"traceEvents": [7]}, "trace.traceEvents[0]", "int"),
        (
            {"traceEvents": [dict(EVENTS[2402], ts=1.682725898082228e27)]},
            "trace.traceEvents[0]",
            "got 16827258980822280",
        ),
        ({"traceEvents": [dict(EVENTS[2402], dur=None)]}, "trace.traceEvents[0]", "got 1682725898082228, null"),
    ],
    ids=[
        *["0 events", "an empty list", "truncated text", "deeply nested", "dur a string", "ts 2^70", "dur < 0", "7"],
        *["ts 1.7e27 positional (was 1.68e+27)", "dur null (was None)"],
    ],
)
def test_bad_traces_are_422s_naming_the_event(api, trace, field, words):
    r = api.post("/v1/calibrate", json={"cluster": H100, "trace": trace})
    assert r.status_code == 422, r.text[:500]
    (err,) = r.json()["detail"]
    assert ".".join(map(str, err["loc"])).startswith("body." + field) and words in err["msg"], err


@pytest.mark.parametrize(
    "info, msg",
    [
        ({"rank": 5, "world_size": 2}, "rank 5 is not below world_size 2"),
        ({"rank": 1.5}, "rank and world_size are integers, got rank 1.5, world_size null"),
        ({"rank": "3", "world_size": 8}, "rank and world_size are integers, got rank '3', world_size 8"),
        ({"rank": -1, "world_size": 0}, "needs rank >= 0 and world_size >= 1, got rank -1, world_size 0"),
    ],
)
def test_a_trace_placed_on_an_impossible_rank_is_refused(api, info, msg):
    """distributedInfo places the trace on a pipeline stage (planner/trace_fit.py trace_stage): rank 5 of 2 was
    clamped to the last stage, rank 1.5 truncated, rank -1 dropped, each a 200 before (hostile11)."""
    trace = SAMPLED | {"distributedInfo": {"backend": "nccl", **info}}
    r = api.post("/v1/calibrate", json={"cluster": H100, "trace": trace})
    assert r.status_code == 422, r.text[:300]
    assert r.json()["detail"] == [{"loc": ["body", "trace", "distributedInfo"], "msg": msg, "type": "value_error.spec"}]


@pytest.mark.parametrize("nccl", [False, True], ids=["no NCCL kernel", "NCCL kernels only"])
def test_traces_of_one_kind_of_kernel_answer(api, nccl):
    body = {"cluster": H100, "trace": _kernels_only(nccl)}
    answer = answered(api.post("/v1/calibrate", json=body))
    assert answer is not None and answer["trace"]["events"] == len(body["trace"]["traceEvents"]), body


def test_a_seven_mib_trace_answers(api):
    """7 MiB of events (repeated pids and correlation ids: one rank's events five times over), under the 8 MiB
    body limit: a 200 in bounded time, not a 413 or a 500."""
    trace = copy.deepcopy(SAMPLED)
    while len(json.dumps(trace)) < 7 << 20:
        trace["traceEvents"] += EVENTS[:4000]
    answer = answered(api.post("/v1/calibrate", json={"cluster": H100, "trace": trace}))
    assert answer is not None and answer["trace"]["events"] == len(trace["traceEvents"])


# ---- /v1/plan/explore, exports, topology, collectives, batch ---------------------------------------------------

CALLS = ["dp.grads", "dp.grad_norm", "tp.mlp.down_proj", "pp.activation", "pp.activation_grad", "nope", ""]


@fuzz(12)
@hypothesis.given(data=st.data())
def test_explore_every_call_at_hostile_sizes(api, data):
    pick = Picker(data)
    body = {"request": PLAN, "call": pick(CALLS)}
    if pick.coin(2):
        body["sizes"] = [pick([0, 1, 3, 7, 1 << 20, 1 << 46, -1, 1 << 47]) for _ in range(pick([1, 3, 24]))]
    if pick.coin():
        body["stage"] = pick([0, 1, 2, 99])
    answer = answered(api.post("/v1/plan/explore", json=body), body)
    if answer is not None:
        assert answer["sizes"] == sorted(set(answer["sizes"])), body
        for series in answer["series"]:
            assert len(series["time_s"]) == len(answer["sizes"]), body


FORMATS = ["json", "csv", "nccl-tests", "simai", "aicb", "trace", "chakra"]


@pytest.mark.parametrize("fmt", [*FORMATS, "xlsx", "JSON"])
def test_every_export_with_hostile_queries(api, fmt):
    for query in ["", "?stage=1", "?stage=2", "?stage=-1", "?stage=abc", "?launcher=srun", "?launcher=x"]:
        r = api.post(f"/v1/plan/export/{fmt}{query}", json=PLAN)
        answered(r, PLAN, refused_at=("body", "query", "path"))
        if fmt not in FORMATS:
            assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["path", "fmt"]
        elif "stage=2" in query and fmt in ("simai", "aicb", "chakra"):  # 2 pipeline stages: 0 and 1
            assert r.status_code == 422 and "stage 2 is not in 0..1" in r.json()["detail"][0]["msg"]


OPS = ["allreduce", "reducescatter", "allgather", "alltoall", "broadcast", "reduce", "gather", "scatter", "sendrecv"]
ALGORITHMS = ["auto", "ring", "direct", "hierarchical", "halving_doubling", "recursive_doubling", "bruck", "swing"]
ALGORITHMS += ["pairwise", "double_binary_tree", "binomial_tree", "in_network", "nope"]
CLUSTERS = [
    {"preset": "dgx-h100"},
    {"preset": "dgx-a100", "num_nodes": 4},
    {"preset": "gb200-nvl72"},
    {"preset": "dgx-h100", "num_nodes": 3, "network": {"topology": "torus", "dims": [3]}},
    {"preset": "dgx-h100", "num_nodes": 2, "nccl_version": "2.18"},
]


@fuzz(40)
@hypothesis.given(data=st.data())
def test_collectives_price_verify_and_schedule(api, data):
    pick = Picker(data)
    op, n = pick(OPS), pick([2, 4, 8, 16, 1, 3, 5])
    implements = [a["algorithm"] for a in api.get("/v1/collectives/algorithms").json() if a["op"] == op]
    algorithm = pick(ALGORITHMS) if pick.coin(4) or not implements else pick(implements)
    price = {
        "op": op,
        "algorithm": algorithm,
        "message_bytes": pick([0, 1, 7, 1 << 20, 1 << 46]),
        "cluster": pick(CLUSTERS),
    }
    price |= pick(
        [{"group_size": pick([1, 3, 8, 16, 72])}, {"ranks": [pick(range(24)) for _ in range(pick([1, 2, 4]))]}]
    )
    price |= pick([{}, {"pricing": "schedule"}, {"nccl_algo": pick(["Ring", "Tree", "NVLS", "PAT"])}])
    answer = answered(api.post("/v1/collectives/price", json=price), price)
    if answer is not None and price["message_bytes"] and answer["steps"]:
        assert answer["time_s"] > 0, price
    count, root, local = pick([64, 0, 1, 3, 8, 4096]), pick([0, 1, n - 1, n, 16]), pick([1, 2, 4, n])
    verify = {"op": op, "algorithm": algorithm, "num_ranks": n, "count": count, "root": root, "local_size": local}
    verify |= {"dtype": pick(["float16", "int8", "int64"]), "reduction": pick(["sum", "avg", "max"])}
    answer = answered(api.post("/v1/collectives/verify", json=verify), verify)
    if answer is not None:
        assert answer["ok"] and answer["bytes_sent_per_rank"] == answer["expected_bytes_sent_per_rank"], verify
    schedule = {k: verify[k] for k in ("op", "algorithm", "num_ranks", "count", "root", "local_size")}
    answered(api.post("/v1/collectives/schedule", json=schedule), schedule)


TWO_NODES = {"preset": "dgx-h100", "num_nodes": 2}


@pytest.mark.parametrize(
    "groups, loc, msg",
    [
        (
            {"ranks": [*range(8)], "concurrent_groups": [[*range(8)]]},
            "concurrent_groups",
            "device 0 is in group 0 and group 1",
        ),
        (
            {"ranks": [*range(8)], "concurrent_groups": [[*range(4, 12)]]},
            "concurrent_groups",
            "device 4 is in group 0 and group 1",
        ),
        (
            {"group_size": 8, "concurrent_groups": [[8] * 8]},
            "concurrent_groups",
            "group 1 lists a device twice: [8, 8,",
        ),
        (
            {"ranks": [0, 1], "group_size": 4},
            "group_size",
            "give ranks or group_size, not both; got 2 ranks and group_size 4",
        ),
    ],
    ids=[
        "the same 8 devices twice",
        "half of them twice",
        "a device twice in a concurrent group",
        "ranks and group_size",
    ],
)
def test_price_groups_that_overlap_or_disagree_are_refused(api, groups, loc, msg):
    """Each was a 200 before (hostile11): overlapping groups priced as if each had its devices to itself (the same
    8 GPUs twice: 39.8 us, the time of 8 other GPUs alongside), and group_size ignored beside ranks."""
    body = {"op": "allreduce", "message_bytes": 1 << 20, "cluster": TWO_NODES} | groups
    r = api.post("/v1/collectives/price", json=body)
    assert r.status_code == 422, r.text[:500]
    (err,) = r.json()["detail"]
    assert err["loc"] == ["body", loc] and err["msg"].startswith(msg), err


def test_point_to_point_pairs_may_share_a_device(api):
    """A pipeline stage sends on and receives at once: sendrecv pairs (0, 8) and (8, 0) run together."""
    body = {
        "op": "sendrecv",
        "message_bytes": 1 << 20,
        "cluster": TWO_NODES,
        "ranks": [0, 8],
        "concurrent_groups": [[8, 0]],
    }
    answer = answered(api.post("/v1/collectives/price", json=body), body)
    assert answer is not None and answer["time_s"] > 0


TOPOLOGY_CLUSTERS = [
    ({"preset": "dgx-h100", "num_nodes": 4}, 32),
    ({"preset": "gb200-nvl72", "num_nodes": 2}, 144),
    ({"preset": "dgx-h100", "num_nodes": 27, "network": {"topology": "torus", "dims": [3, 3, 3]}}, 216),
    ({"preset": "dgx-h100", "num_nodes": 8, "network": {"topology": "dragonfly", "group_size": 4}}, 64),
    ({"preset": "dgx-a100", "num_nodes": 2048}, 16384),
]


@fuzz(25)
@hypothesis.given(data=st.data())
def test_topology_of_hostile_device_lists(api, data):
    pick = Picker(data)
    cluster, n = pick(TOPOLOGY_CLUSTERS)
    devices = sorted({pick([0, 1, n - 1, 7, 63, 8, 9]) for _ in range(pick([1, 2, 8, 64]))})
    if pick.coin(4):  # outside the cluster, listed twice, or none
        devices = pick([[*devices, n], [*devices, devices[0]], []])
    body = {"cluster": cluster, "devices": devices}
    if pick.coin():
        body["utilisation"] = [{"id": pick([0, 5, 10**6]), "utilisation": pick([0, 0.5, 1e6])} for _ in range(2)]
    answer = answered(api.post("/v1/topology", json=body), body)
    if answer is not None:
        members = sum(v["member"] for v in answer["vertices"] if v["kind"] == "gpu")
        boxed = sum(v["members"] for v in answer["vertices"] if v["kind"] == "node_box")
        assert 0 < members + boxed <= len(devices), body


BAD_ITEMS = [
    PLAN | {"parallel": {"tp": 3}},
    {"model": {}},
    5,
    None,
    "x",
    [],
    PLAN | {"bogus": 1},
    PLAN | {"workload": {"kind": "training", "global_batch_size": -1}},
    PLAN | {"model": {"preset": "nope"}},
    PLAN | {"options": {"algorithm": "zzz"}},
]


@fuzz(10)
@hypothesis.given(data=st.data())
def test_batches_with_bad_items_answer_the_good_ones(api, data):
    pick = Picker(data)
    items = [pick([PLAN, PLAN, *BAD_ITEMS]) for _ in range(pick([1, 2, 5]))]
    answer = answered(api.post("/v1/plan/batch", json={"requests": items}), items)
    assert answer is not None, items
    for item, result in zip(items, answer["results"], strict=True):
        assert result["ok"] == (item is PLAN), (item, result)
        if not result["ok"]:
            assert result["error"]["status"] == 422 and result["error"]["detail"][0]["msg"], result


# ---- a real server: a streamed search the client drops ---------------------------------------------------------


def test_a_dropped_search_stream_leaves_the_server_answering(server):
    with httpx.Client(base_url=server, timeout=60) as client:
        for path, body in [("/v1/search", SEARCH), ("/v1/serve/search", SERVE_SEARCH)]:
            with client.stream("POST", f"{path}?stream=true", json=body) as r:
                assert r.status_code == 200
                first = json.loads(next(r.iter_lines()))
                assert first["type"] == "progress", first
        # the stream is closed mid-search; the service answers the next plan and a whole search
        assert client.post("/v1/plan", json=PLAN).status_code == 200
        lines = [json.loads(line) for line in client.post("/v1/search?stream=true", json=SEARCH).text.splitlines()]
        assert lines[-1]["type"] == "result" and lines[-1]["results"], lines[-1]


# ---- the CLI given bad files ----------------------------------------------------------------------------------

BAD_FILES = {
    "truncated.json": b'{"model":',
    "empty.json": b"",
    "latin1.json": b"\xff\xfe\x00bad",
    "deep.json": b"[" * 100_000 + b"]" * 100_000,
    "bad.yaml": b"x: [1\n",
}


@pytest.mark.parametrize("command", ["plan", "search", "serve-plan", "serve-search", "sweep"])
@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_the_cli_refuses_an_unreadable_file_with_its_reason(tmp_path, capsys, command, name):
    """Exit status 2 and one line naming the file (a UnicodeDecodeError, RecursionError or YAML traceback before
    hostile11's fix, exit 1)."""
    path = tmp_path / name
    path.write_bytes(BAD_FILES[name])
    assert main([command, str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"commplan: cannot read {path}: ") and "Traceback" not in err, err


def test_the_cli_refuses_an_unreadable_compare_file(tmp_path, capsys):
    compare = tmp_path / "compare.json"
    compare.write_bytes(b"\xff\xfe")
    trace = str(REF / "traces" / "hta_sampled_rank-0.json.gz")
    assert main(["calibrate", "--cluster", "dgx-h100", "--trace", trace, "--compare", str(compare)]) == 2
    assert capsys.readouterr().err.startswith(f"commplan: cannot read {compare}: ")


@pytest.mark.parametrize(
    "spec, words",
    [
        ([1, 2], "spec: a sweep spec is an object with base and grid, or with searches; got a list of 2 items"),
        (None, "spec: a sweep spec is an object with base and grid, or with searches; got null"),
        ({"model": {}}, "spec: a sweep spec is an object with base and grid, or with searches; got an object of 1 key"),
        ({"searches": 5}, "searches: must be a list of search requests (objects), got 5"),
        ({"base": [], "grid": {}}, "base: must be a search request (an object), got a list of 0 items"),
        ({"base": SEARCH, "grid": {"top_k": 3}}, "grid.top_k: must be a list of values, got 3"),
        ({"base": SEARCH, "grid": [1]}, "grid: must map dotted fields to lists of values, got a list of 1 item"),
        (
            {"base": SEARCH | {"model": "x"}, "grid": {"model.preset": ["llama3-8b"]}},
            "grid.model.preset: base's model is not an object to set preset in, got 'x'",
        ),
    ],
)
def test_a_sweep_spec_of_the_wrong_shape_is_refused_naming_its_field(tmp_path, capsys, spec, words):
    """An AttributeError, TypeError or KeyError traceback before (exit 1)."""
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    assert main(["sweep", str(path), "--out", str(tmp_path / "out.csv")]) == 2
    assert capsys.readouterr().err.strip() == f"commplan: {words}"


@pytest.mark.parametrize("command", ["search", "sweep", "serve"])
@pytest.mark.parametrize("workers", ["0", "-3", "x"])
def test_the_cli_refuses_a_worker_count_below_one(tmp_path, capsys, command, workers):
    """sweep --workers 0 was the process pool's ValueError traceback after the spec was read; search --workers -3
    ran on every core (hostile11). argparse's usage error, exit 2."""
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"base": SEARCH}))
    args = {"search": [str(spec)], "sweep": [str(spec)], "serve": []}[command]
    with pytest.raises(SystemExit) as stop:
        main([command, *args, "--workers", workers])
    assert stop.value.code == 2
    assert f"argument --workers: must be a whole number >= 1, got '{workers}'" in capsys.readouterr().err


def test_a_sweep_into_a_missing_folder_is_refused_before_it_runs(tmp_path, capsys):
    """A FileNotFoundError traceback after every search had run, before (hostile11)."""
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"base": SEARCH}))
    out = tmp_path / "nowhere" / "out.csv"
    assert main(["sweep", str(spec), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == f"commplan: cannot write {out}: {out.parent} is not a folder\n", err


def test_a_factor_held_at_its_bound_is_said(api):
    """A measured TTFT of 1e-300 ms was fitted as prefill_time_scale 0.05 (its lower bound) without a word; the answer
    now says the factor is held and which way the runs lie; an ordinary run has no warning."""
    tiny = DEPLOYMENT | {"runs": [{"text": bench_with("Mean TTFT (ms)", "1e-300")}]}
    held = api.post("/v1/serve/calibrate", json=tiny)
    plain = api.post("/v1/serve/calibrate", json=DEPLOYMENT | {"runs": [{"text": BENCH}]})
    assert held.status_code == 200 and plain.status_code == 200, (held.text, plain.text)
    answer = held.json()
    assert answer["constants"]["prefill_time_scale"] == 0.05
    (warning,) = [w for w in answer["warnings"] if w.startswith("prefill_time_scale")]
    assert warning.startswith("prefill_time_scale is held at its bound 0.05 (factors are kept within 0.05 to 20)")
    assert "measured faster" in warning
    assert all(0.05 < v < 20 for v in plain.json()["constants"].values()) and plain.json()["warnings"] == []
