"""POST /v1/search over HTTP: the contract's shape, /v1/plan agreeing, NDJSON progress, limits, empty spaces."""

from __future__ import annotations

import json

from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings

BODY = {
    "model": {"preset": "llama3-8b", "seq_length": 2048, "num_layers": 8},
    "workload": {"kind": "training", "global_batch_size": 16},
    "cluster": {"preset": "dgx-h100", "num_nodes": 1},
    "constraints": {"framework": "megatron", "zero_stage": 1, "activation_recompute": "none", "memory_headroom": 0.05},
    "top_k": 3,
}
client = TestClient(create_app())


def test_search_answers_the_contract_and_plan_agrees():
    r = client.post("/v1/search", json=BODY)
    assert r.status_code == 200, r.text
    d = r.json()
    assert d["results"] and d["feasible"] <= d["evaluated"]
    assert d["space_size"] == d["evaluated"] + sum(d["pruned"].values()) - d["pruned"].get("memory", 0)
    times = [x["step"]["time_s"] for x in d["results"]]
    assert times == sorted(times)
    best = d["results"][0]
    for stage in best["memory"]["per_stage"]:
        assert stage["peak_bytes"] <= best["memory"]["capacity_bytes"] * 0.95
    plan = {k: BODY[k] for k in ("model", "cluster")} | {
        "workload": BODY["workload"] | {"micro_batch_size": best["micro_batch_size"],
                                        "activation_recompute": best["activation_recompute"]},
        "parallel": best["parallel"],
    }  # fmt: skip
    p = client.post("/v1/plan", json=plan)
    assert p.status_code == 200, p.text
    # the plan router's own function: the typed plan the answer was written from
    from app.inputs import plan_of
    from app.schemas.plan import PlanRequest

    same = plan_of(PlanRequest.model_validate(plan), client.app.state.settings)
    assert same.step.time_s == best["step"]["time_s"] == p.json()["step"]["time_s"]


def test_stream_sends_progress_lines_then_the_result():
    with client.stream("POST", "/v1/search", json=BODY, headers={"Accept": "application/x-ndjson"}) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("application/x-ndjson")
        lines = [json.loads(line) for line in r.iter_lines() if line]
    assert lines[0]["type"] == "progress" and lines[-1]["type"] == "result"
    done = [x["done"] for x in lines[:-1]]
    assert done == sorted(done) and done[-1] == lines[-1]["space_size"] == lines[0]["total"]
    assert lines[-1]["results"][0]["step"]["time_s"] <= lines[-2]["best"]["step_time_s"] * (1 + 1e-12)


def test_a_space_the_rules_refuse_up_front_is_a_422_with_the_rule():
    """A tp that divides no device count leaves no layout to walk (counts12: refused up front, outside the space):
    a 422 naming the rule and the numbers, where round 11 answered 200 with no result."""
    r = client.post("/v1/search", json=BODY | {"constraints": {"tp": 3}})
    assert r.status_code == 422, r.text
    detail = r.json()["detail"][0]
    assert (
        detail["loc"][-1] == "constraints"
        and "(tp*cp*pp is at least 3, which must divide the devices)" in detail["msg"]
    )


def test_the_answer_counts_what_the_rules_refused_up_front_apart_from_the_space():
    """DeepSpeed beside Megatron over ZeRO 0 and 2: DeepSpeed's rules beside pp refuse layouts up front, each counted
    by its reason with DeepSpeed's message (pruned_up_front), outside space_size, which the size limit counts: a limit
    of exactly space_size is searched, the counts still add up (space_size = evaluated + pruned other than memory)
    and a tp that divides nothing is counted there too."""
    body = BODY | {"constraints": {"framework": ["megatron", "deepspeed"], "zero_stage": [0, 2], "tp": [1, 2, 3],
                                   "activation_recompute": "none"}}  # fmt: skip
    d = client.post("/v1/search", json=body).json()
    assert d["space_size"] == d["evaluated"] + sum(d["pruned"].values()) - d["pruned"].get("memory", 0)
    up = d["pruned_up_front"]
    assert set(up) == {"world_size", "parallel.pipeline_schedule", "parallel.zero_stage"} and min(up.values()) > 0
    assert d["pruned_up_front_examples"]["parallel.zero_stage"] == (
        "framework 'deepspeed' runs ZeRO stages up to 1 beside pipeline parallelism, got zero_stage 2 at pp 2"
    )
    assert d["pruned_reasons"]["parallel.zero_stage"] == "ZeRO stage" and not set(up) & set(d["pruned_examples"])
    limited = TestClient(create_app(Settings(max_search_layouts=d["space_size"])))
    again = limited.post("/v1/search", json=body)
    assert again.status_code == 200, again.text
    assert again.json()["space_size"] == d["space_size"] and again.json()["pruned_up_front"] == up
    refused = TestClient(create_app(Settings(max_search_layouts=d["space_size"] - 1))).post("/v1/search", json=body)
    every = d["space_size"] + sum(up.values())
    assert refused.status_code == 422 and refused.json()["detail"][0]["msg"].startswith(
        f"the space holds {d['space_size']:,} runnable layouts ({every:,} before the rules that refuse layouts up front"
    )


def test_space_over_the_limit_is_a_422_naming_size_and_limit():
    limited = TestClient(create_app(Settings(max_search_layouts=10)))  # COMMPLAN_MAX_SEARCH_LAYOUTS=10
    r = limited.post("/v1/search", json=BODY | {"constraints": {}})
    assert r.status_code == 422
    msg = r.json()["detail"][0]["msg"]
    assert "above the limit of 10" in msg and "holds" in msg


def test_bad_constraint_is_a_422_naming_the_field():
    r = client.post("/v1/search", json=BODY | {"constraints": {"tp": [0]}})
    assert r.status_code == 422
    assert r.json()["detail"][0]["loc"][:3] == ["body", "constraints", "tp"]


def test_cli_search_prints_the_table(tmp_path, capsys):
    from app.cli import main

    path = tmp_path / "search.json"
    path.write_text(json.dumps(BODY))
    assert main(["search", str(path), "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert "layouts evaluated" in out and "megatron" in out
    assert main(["search", str(tmp_path / "missing.json")]) == 2


def test_memory_headroom_defaults_to_five_percent_and_reasons_come_in_words():
    """Issue 25 item 8: a search that leaves memory_headroom out keeps 5% of each device free (the schema's
    default, stated in the OpenAPI description): the same answer as 0.05 given, and 3 layouts between 95% and
    100% of capacity that 0 admits are over memory. Each pruning reason comes with its words."""
    body = {
        "model": {"preset": "llama3-8b", "seq_length": 8192},
        "workload": {"kind": "training", "global_batch_size": 16},
        "cluster": {"preset": "dgx-h100", "num_nodes": 1},
        "constraints": {"framework": "megatron", "activation_recompute": "none", "tp": [1, 2], "pp": [1],
                        "zero_stage": [1]},
        "top_k": 100,
    }  # fmt: skip
    answers = {}
    for headroom in (None, 0.05, 0.0):
        constraints = body["constraints"] | ({} if headroom is None else {"memory_headroom": headroom})
        r = client.post("/v1/search", json=body | {"constraints": constraints})
        assert r.status_code == 200, r.text
        answers[headroom] = r.json()
    unset, five, zero = answers[None], answers[0.05], answers[0.0]
    strip = lambda d: {k: v for k, v in d.items() if k not in ("elapsed_s", "layouts_per_s")}  # noqa: E731
    assert strip(unset) == strip(five)
    assert (unset["feasible"], zero["feasible"]) == (18, 21) and unset["evaluated"] == zero["evaluated"] == 38
    peak = lambda hit: max(s["peak_bytes"] for s in hit["memory"]["per_stage"]) / hit["memory"]["capacity_bytes"]  # noqa: E731
    assert max(map(peak, unset["results"])) <= 0.95 < max(map(peak, zero["results"])) <= 1
    assert unset["pruned_reasons"] == {"memory": "memory"}
    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    field = schemas["ConstraintsIn"]["properties"]["memory_headroom"]
    assert field["default"] == 0.05 and "default 0.05 (5%)" in field["description"]
    bad = client.post("/v1/search", json=body | {"constraints": body["constraints"] | {"tp": [1, 3]}})
    words = bad.json()["pruned_reasons"]
    assert "world_size" in words and "world_size" in bad.json()["pruned_up_front"]  # the words of both counts
    assert words and all("." not in w and "_" not in w for w in words.values()), words
