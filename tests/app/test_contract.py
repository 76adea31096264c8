"""The HTTP contract (CONTRACT.md) as scheduling systems call it, through httpx's ASGI transport."""

import copy

import pytest

from .conftest import LLAMA70B

CALL_FIELDS = {
    "name",
    "parallelism",
    "op",
    "phase",
    "stages",
    "group_size",
    "num_groups",
    "message_bytes",
    "calls_per_iteration",
    "algorithm",
    "bytes_sent_per_rank",
    "bytes_received_per_rank",
    "time_s",
    "placement",
}


def with_(base: dict, **blocks) -> dict:
    body = copy.deepcopy(base)
    for block, fields in blocks.items():
        body[block] = fields
    return body


def test_health(api):
    assert api.get("/healthz").json() == {"status": "ok"}


def test_plan_contract_example(api):
    r = api.post("/v1/plan", json=LLAMA70B)
    assert r.status_code == 200
    plan = r.json()
    assert plan["world_size"] == 512 and plan["num_microbatches"] == 64
    assert set(plan["calls"][0]) >= CALL_FIELDS
    assert {"span", "nodes_per_group", "bottleneck"} <= set(plan["calls"][0]["placement"])
    qkv = next(c for c in plan["calls"] if c["name"] == "tp.attn.qkv")
    assert (qkv["op"], qkv["group_size"], qkv["num_groups"], qkv["message_bytes"], qkv["calls_per_iteration"]) == (
        "allgather",
        8,
        64,
        134217728,
        1280,
    )
    assert qkv["placement"] == qkv["placement"] | {"span": "intra_node", "nodes_per_group": 1, "bottleneck": "nvlink"}
    totals = plan["totals"]
    assert totals["time_s"] == max(s["time_s"] for s in totals["per_stage"])
    assert set(totals["by_parallelism"]) == {"tp", "pp", "dp"}


def test_preset_overrides_and_derived_dp(api):
    body = with_(
        LLAMA70B, model={"preset": "llama3-70b", "seq_length": 4096}, parallel={"preset": "megatron-tp8-pp4-zero1"}
    )
    plan = api.post("/v1/plan", json=body).json()
    qkv = next(c for c in plan["calls"] if c["name"] == "tp.attn.qkv")
    assert qkv["message_bytes"] == 4096 * 8192 * 2
    assert plan["num_microbatches"] == 1024 // 16  # dp = 512 / (8*4) derived


def test_hf_config_and_custom_cluster(api):
    body = {
        "model": {
            "hf_config": {
                "model_type": "llama",
                "num_hidden_layers": 16,
                "hidden_size": 2048,
                "num_attention_heads": 32,
                "num_key_value_heads": 8,
                "intermediate_size": 8192,
                "vocab_size": 128256,
                "max_position_embeddings": 131072,
                "tie_word_embeddings": True,
            }
        },
        "workload": {"micro_batch_size": 2, "global_batch_size": 64},
        "parallel": {"tp": 2, "dp": 8, "zero_stage": 3, "framework": "torch"},
        "cluster": {
            "num_nodes": 2,
            "devices_per_node": 8,
            "intra": {"fabric": "full_mesh", "bandwidth_GBps": 56},
            "nics_per_node": 8,
            "nic_bandwidth_GBps": 25,
            "network": {"topology": "fat_tree", "oversubscription": 2},
        },
    }
    r = api.post("/v1/plan", json=body)
    assert r.status_code == 200, r.text
    assert any(c["name"] == "dp.params.bwd" for c in r.json()["calls"])


def test_inference_decode(api):
    body = with_(
        LLAMA70B,
        workload={"kind": "inference", "phase": "decode", "batch_size": 64, "context_length": 4096},
        parallel={"tp": 8, "dp": 64},
        cluster={"preset": "dgx-h100", "num_nodes": 64},
    )
    plan = api.post("/v1/plan", json=body).json()
    assert {c["phase"] for c in plan["calls"]} == {"forward"}


def test_batch_keeps_order_and_isolates_failures(api):
    good = LLAMA70B
    bad = with_(LLAMA70B, parallel={"tp": 8, "pp": 4, "dp": 8})
    r = api.post("/v1/plan/batch", json={"requests": [good, bad, {"model": {}}, good]})
    results = r.json()["results"]
    assert [x["ok"] for x in results] == [True, False, False, True]
    assert "tp*cp*pp*dp = 8*1*4*8 = 256 but the cluster has 512 devices" in results[1]["error"]["detail"][0]["msg"]
    assert results[2]["error"]["status"] == 422
    assert results[0]["plan"] == results[3]["plan"]


@pytest.mark.parametrize(
    ("body", "loc", "words"),
    [
        (
            with_(LLAMA70B, parallel={"tp": 16, "pp": 2, "dp": 16}),
            ["body", "parallel", "tp"],
            "num_kv_heads 8 is not divisible by tp 16",
        ),
        (with_(LLAMA70B, model={"preset": "llama-9"}), ["body", "model", "preset"], "unknown model preset 'llama-9'"),
        (with_(LLAMA70B, cluster={"preset": "dgx-z"}), ["body", "cluster", "preset"], "unknown cluster preset 'dgx-z'"),
        (
            with_(LLAMA70B, cluster={"preset": "dgx-h100", "num_nodes": 64, "nic_bandwidth_GBps": 0}),
            ["body", "cluster", "nic_bandwidth_GBps"],
            "greater than or equal to 0.001",
        ),
        (
            # both sources of a model: the preset used to win and the config.json was dropped without a word
            with_(LLAMA70B, model={"preset": "llama3-70b", "hf_config": {"num_hidden_layers": 2}}),
            ["body", "model", "hf_config"],
            "give either preset 'llama3-70b' or hf_config, not both",
        ),
        (
            # a field of the other kind of workload was dropped: a training batch_size of 64 planned a global batch of 1
            with_(LLAMA70B, workload={"kind": "training", "micro_batch_size": 1, "batch_size": 64}),
            ["body", "workload", "batch_size"],
            "batch_size describes an inference workload, but kind is 'training'; the training fields are "
            "micro_batch_size, global_batch_size, activation_recompute",
        ),
        (
            with_(LLAMA70B, workload={"kind": "inference", "batch_size": 8, "global_batch_size": 1024}),
            ["body", "workload", "global_batch_size"],
            "global_batch_size describes a training workload, but kind is 'inference'",
        ),
        (
            with_(LLAMA70B, model={"num_layers": 4}),
            ["body", "model", "hidden_size"],
            "required when neither preset nor hf_config",
        ),
        (
            with_(LLAMA70B, parallel={"tp": 8, "pp": 3}),
            ["body", "parallel", "dp"],
            "do not divide into tp*cp*pp = 8*1*3 = 24",
        ),
        (with_(LLAMA70B, options={"algorithm": "bruck"}), ["body", "options", "algorithm"], ""),
        (
            with_(LLAMA70B, cluster={"preset": "tpu-torus", "num_nodes": 64, "network": {"dims": [4, 4, 5]}}),
            ["body", "cluster", "network", "dims"],
            "torus 4 x 4 x 5 = 80 routers but the cluster has 64 nodes",
        ),
        (
            with_(LLAMA70B, workload={"micro_batch_size": 0}),
            ["body", "workload", "micro_batch_size"],
            "greater than or equal to 1",
        ),
    ],
)
def test_bad_plans_are_422_naming_field_and_rule(api, body, loc, words):
    r = api.post("/v1/plan", json=body)
    if loc[-1] == "algorithm":  # bruck implements allgather/alltoall only: used there, auto elsewhere
        assert r.status_code == 200
        return
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert any(d["loc"][: len(loc)] == loc and words in d["msg"] for d in detail), detail


def test_a_flood_of_unknown_fields_is_one_error(api):
    """100,000 unknown keys in one block were 100,000 errors (a 9 MB answer, seconds of the event loop)."""
    flood = {f"k{i}": i for i in range(100_000)}
    r = api.post("/v1/plan", json={"model": {"preset": "llama3-8b"} | flood, "cluster": {"preset": "dgx-h100"}})
    assert r.status_code == 422
    [error] = r.json()["detail"]
    assert error["loc"] == ["body", "model"]
    assert "100,000 unknown fields (first: 'k0', 'k1', 'k2'); at most 16" in error["msg"]
    # up to 16 unknown fields are each named where they are, as before
    few = {f"k{i}": i for i in range(16)}
    r = api.post("/v1/plan", json={"model": {"preset": "llama3-8b"}, "cluster": {"preset": "dgx-h100"} | few})
    assert [d["loc"] for d in r.json()["detail"]] == [["body", "cluster", f"k{i}"] for i in range(16)]


def test_many_errors_are_listed_fifty_then_counted(api):
    """One error per wrong item of a long list: the first 50, then how many more."""
    r = api.post("/v1/topology", json={"cluster": {"preset": "dgx-h100", "num_nodes": 2}, "devices": ["x"] * 5000})
    assert r.status_code == 422
    detail = r.json()["detail"]
    assert len(detail) == 51
    assert [d["loc"] for d in detail[:50]] == [["body", "devices", i] for i in range(50)]
    assert detail[50] == {
        "loc": ["body"],
        "msg": "4,950 more errors not listed (5,000 in all; the first 50 are above)",
        "type": "too_many_errors",
    }


def test_unknown_pinned_algorithm_is_named(api):
    r = api.post("/v1/plan", json=with_(LLAMA70B, options={"algorithm": "telepathy"}))
    assert r.status_code == 422
    assert r.json()["detail"][0]["loc"] == ["body", "options", "algorithm"]


def test_limits_refuse_up_front(small_limits):
    r = small_limits.post("/v1/plan", content=b"{" + b" " * 4096 + b"}", headers={"content-type": "application/json"})
    # the exact count and the page's units (it read "exceeds 8388608 bytes" on the page; user9)
    msg = "request body exceeds 2,048 bytes (2.05 KB; COMMPLAN_MAX_BODY_BYTES)"
    assert r.status_code == 413 and r.json()["detail"][0]["msg"] == msg
    r = small_limits.post("/v1/plan/batch", json={"requests": [{}] * 4})
    assert r.status_code == 422 and "at most 3 per batch" in r.json()["detail"][0]["msg"]
    r = small_limits.post("/v1/plan", json=with_(LLAMA70B, cluster={"preset": "dgx-h100", "num_nodes": 9}))
    assert r.status_code == 422 and "at most 64" in r.json()["detail"][0]["msg"]
    r = small_limits.post(
        "/v1/collectives/verify", json={"op": "allreduce", "algorithm": "ring", "num_ranks": 8, "count": 1024}
    )
    assert r.status_code == 422 and "8 x 1024 = 8192 elements; at most 4096" in r.json()["detail"][0]["msg"]


def test_price(api):
    r = api.post(
        "/v1/collectives/price",
        json={
            "op": "allreduce",
            "algorithm": "auto",
            "message_bytes": 1 << 30,
            "cluster": {"preset": "dgx-h100"},
            "group_size": 8,
        },
    )
    body = r.json()
    assert body["algorithm"] == "in_network" and 460 < body["busbw_GBps"] < 480
    assert body["bottleneck"] == "nvlink" and body["bytes_sent_per_rank"] == 1 << 30
    rail = {
        "op": "allreduce",
        "algorithm": "ring",
        "message_bytes": 1 << 30,
        "cluster": {"preset": "dgx-h100", "num_nodes": 4},
        "ranks": [0, 8, 16, 24],
        "concurrent_groups": [[i, i + 8, i + 16, i + 24] for i in range(1, 8)],
    }
    assert api.post("/v1/collectives/price", json=rail).json()["bottleneck"] == "nic"
    r = api.post("/v1/collectives/price", json={**rail, "ranks": [0, 999]})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"][:2] == ["body", "concurrent_groups"]
    r = api.post("/v1/collectives/price", json={**rail, "concurrent_groups": None, "ranks": [0, 999]})
    assert r.status_code == 422 and "device 999 is outside the cluster's 32 devices" in r.json()["detail"][0]["msg"]


def test_verify_and_catalogue(api):
    r = api.post(
        "/v1/collectives/verify",
        json={
            "op": "allreduce",
            "algorithm": "halving_doubling",
            "num_ranks": 6,
            "count": 1200,
            "dtype": "int32",
            "seed": 3,
        },
    )
    body = r.json()
    assert body["ok"] and body["max_abs_error"] == 0
    assert (
        body["bytes_sent_per_rank"] == body["expected_bytes_sent_per_rank"]
        and body["steps"] == body["expected_steps"] == 6
    )
    r = api.post(
        "/v1/collectives/verify",
        json={"op": "allgather", "algorithm": "recursive_doubling", "num_ranks": 6, "count": 12},
    )
    assert r.status_code == 422 and "power-of-two" in r.json()["detail"][0]["msg"]
    catalogue = api.get("/v1/collectives/algorithms").json()
    assert {"algorithm": "ring", "op": "allreduce"}.items() <= next(
        x for x in catalogue if x["algorithm"] == "ring" and x["op"] == "allreduce"
    ).items()


def test_schedule_view_shows_reduction_progress(api):
    body = api.post(
        "/v1/collectives/schedule", json={"op": "allreduce", "algorithm": "ring", "num_ranks": 4, "count": 8}
    ).json()
    assert body["wire_steps"] == 6 and len(body["steps"]) == 6
    assert body["initial"][2] == [[2], [2], [2], [2]]
    assert all(slot == [0, 1, 2, 3] for rank in body["steps"][-1]["holds"] for slot in rank)
    assert body["steps"][2]["holds"][0][0] == [0, 1, 2, 3]  # after the reduce-scatter rank 0 owns chunk 0


def test_presets(api):
    models = api.get("/v1/presets/models").json()
    assert models["llama3-8b"]["params_total"] == 8_030_261_248
    clusters = api.get("/v1/presets/clusters").json()
    assert clusters["dgx-h100"]["intra"]["bandwidth_GBps"] == 450
    assert "pretrain" in api.get("/v1/presets/workloads").json()
    assert "fsdp" in api.get("/v1/presets/parallel").json()


def test_openapi_has_examples_and_units(api):
    spec = api.get("/openapi.json").json()
    assert "GB/s = 1e9" in spec["info"]["description"]
    assert spec["components"]["schemas"]["PlanRequest"]["examples"]
    assert api.get("/docs").status_code == 200


def test_nccl_versions_are_the_library_table_and_each_plans(api):
    """GET /v1/collectives/nccl-versions (the page's NCCL version select): exactly the versions whose tuning
    tables are transcribed (tables.py VERSIONS), oldest first, and the default a cluster is priced with; every
    one is accepted as cluster.nccl_version and echoed in the plan's cluster, one past the newest is a 422."""
    from collectives.topology.library.tables import SUPPORTED_VERSIONS, VERSIONS

    body = api.get("/v1/collectives/nccl-versions").json()
    assert body["versions"] == list(SUPPORTED_VERSIONS) == list(VERSIONS) and body["default"] == body["versions"][-1]
    small = {**LLAMA70B, "parallel": {"tp": 8, "dp": 1}, "cluster": {"preset": "dgx-h100", "num_nodes": 1}}
    for version in (body["versions"][0], body["default"]):
        r = api.post(
            "/v1/plan",
            params={"summary": "true"},
            json={**small, "cluster": {**small["cluster"], "nccl_version": version}},
        )
        assert r.status_code == 200 and r.json()["cluster"]["nccl_version"] == version, r.text
    major, minor = body["default"].split(".")
    r = api.post(
        "/v1/plan", json={**small, "cluster": {**small["cluster"], "nccl_version": f"{major}.{int(minor) + 1}"}}
    )
    assert r.status_code == 422 and r.json()["detail"][0]["loc"][-1] == "nccl_version"


def test_cluster_choices_are_the_planners_lists_and_each_plans(api):
    """GET /v1/collectives/cluster-choices (the page's network-kind and CPU-vendor selects): exactly the planner's
    NETWORK_KINDS and CPU_VENDORS (collectives/topology/spec.py), each accepted by /v1/plan and echoed in its
    cluster block; a value off the list is a 422 naming the field and listing the choices."""
    from collectives.topology.spec import CPU_VENDORS, NETWORK_KINDS

    body = api.get("/v1/collectives/cluster-choices").json()
    assert body == {"network_kinds": list(NETWORK_KINDS), "cpu_vendors": list(CPU_VENDORS)}
    assert "efa_sendrecv" in body["network_kinds"] and body["cpu_vendors"] == ["intel", "amd", "arm"]
    small = {**LLAMA70B, "parallel": {"tp": 8, "dp": 2}, "cluster": {"preset": "dgx-h100", "num_nodes": 2}}
    tried = [("network", "kind", k) for k in body["network_kinds"]] + [
        (None, "cpu_vendor", v) for v in body["cpu_vendors"]
    ]
    for block, key, value in tried:
        cluster = {**small["cluster"], **({block: {key: value}} if block else {key: value})}
        r = api.post("/v1/plan", params={"summary": "true"}, json={**small, "cluster": cluster})
        assert r.status_code == 200, r.text
        echoed = r.json()["cluster"]
        assert (echoed[block][key] if block else echoed[key]) == value
    r = api.post("/v1/plan", json={**small, "cluster": {**small["cluster"], "network": {"kind": "myrinet"}}})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"][-2:] == ["network", "kind"], r.text
    assert "efa_sendrecv" in r.json()["detail"][0]["msg"]
