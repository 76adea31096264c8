"""Issue 13 point 6: the planner returns dataclasses and app/ writes them as JSON once; the explorer starts
from the plan's own set-up (device_map, contention); collectives errors are placed in the request by one
mechanism, the explorer's included."""

from __future__ import annotations

import json
from typing import Annotated

import pytest
from pydantic import BaseModel

from app.cli import main
from app.schemas.read import SAME, From, reader
from app.schemas.write import writer
from app.serialize import plan_dict, plan_json
from collectives.topology import cluster_preset
from planner import ParallelSpec, WorkloadSpec, build_plan, model_preset

from .conftest import LLAMA70B

H100x4 = {"preset": "dgx-h100", "num_nodes": 4}
GBS64 = {"global_batch_size": 64}
TRANSPOSED = [(r % 8) * 4 + r // 8 for r in range(32)]  # rank r on node r % 8 // 2: tp groups cross nodes


@pytest.fixture(scope="module")
def moe_pp_plan():
    """Expert groups (expert_grid), point-to-point pairs (group_dims ["pp+1"]) and several stages."""
    par = ParallelSpec(tp=2, pp=2, dp=8, ep=8, zero_stage=1, sequence_parallel=True)
    return build_plan(
        model_preset("mixtral-8x7b"), WorkloadSpec(global_batch_size=64), par, cluster_preset("dgx-h100", 4)
    )


def test_every_wire_field_is_the_typed_value(moe_pp_plan):
    plan, wire = moe_pp_plan, json.loads(plan_json(moe_pp_plan))
    assert len(wire["calls"]) == len(plan.calls) and wire["world_size"] == plan.world_size == 32
    for pc, row in zip(plan.calls, wire["calls"], strict=True):
        c, p, where = pc.call, pc.price, row["placement"]
        assert (row["name"], row["op"], row["phase"], row["stages"]) == (c.name, c.op.value, c.phase, list(c.stages))
        assert (row["message_bytes"], row["calls_per_iteration"]) == (c.message_bytes, c.calls_per_iteration)
        assert (row["algorithm"], row["time_s"], row["bytes_sent_per_rank"]) == (p.algorithm, p.time_s,
                                                                                 p.bytes_sent_per_rank)  # fmt: skip
        assert row["group_dims"] == ([c.group.pairs] if c.group.pairs else list(c.group.dims))
        assert row["expert_grid"] is c.group.expert
        assert (where["span"], where["busbw_GBps"], where["channels"]) == (p.span, p.busbw_GBps, p.channels)
        assert where["bottleneck"] == p.bottleneck.get("kind", "none")
        assert where["bottleneck_link"] == (pc.links[0]["label"] if pc.links else "")
        assert where["group_devices"] == pc.group_devices and len(where["links"]) == len(pc.links)
    assert any(r["expert_grid"] for r in wire["calls"]) and any(r["group_dims"] == ["pp+1"] for r in wire["calls"])
    assert wire["step"]["time_s"] == plan.step.time_s and len(wire["step"]["timeline"]) == len(plan.step.timeline)
    assert [s["peak_bytes"] for s in wire["memory"]["per_stage"]] == [s.peak_bytes for s in plan.memory.per_stage]
    assert wire["memory"]["fits"] is plan.memory.fits


def test_totals_add_up_the_ledger(moe_pp_plan):
    plan, totals = moe_pp_plan, moe_pp_plan.totals
    for s, row in enumerate(totals.per_stage):
        on = [pc for pc in plan.calls if s in pc.call.stages]
        assert row.stage == s
        assert row.message_bytes == sum(pc.call.calls_per_iteration * pc.call.message_bytes for pc in on)
        assert row.bytes_sent == sum(pc.call.calls_per_iteration * pc.price.bytes_sent_per_rank for pc in on)
        assert row.time_s == pytest.approx(sum(pc.call.calls_per_iteration * pc.price.time_s for pc in on), rel=1e-12)
    assert totals.time_s == max(r.time_s for r in totals.per_stage) == totals.per_stage[totals.busiest_stage].time_s
    busiest = totals.per_stage[totals.busiest_stage]
    shares = totals.by_parallelism.values()
    assert sum(a.message_bytes for a in shares) == busiest.message_bytes
    assert sum(a.time_s for a in shares) == pytest.approx(busiest.time_s, rel=1e-12)
    assert plan_dict(plan)["totals"]["by_parallelism"].keys() == totals.by_parallelism.keys()


def test_cli_json_is_the_http_answer(api, tmp_path, capsys):
    path = tmp_path / "req.json"
    path.write_text(json.dumps(LLAMA70B))
    assert main(["plan", str(path), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == api.post("/v1/plan", json=LLAMA70B).json()


def test_reader_follows_paths_derivations_and_nested_blocks():
    class Inner(BaseModel):
        label: Annotated[str, From("node.label")]

    class Outer(BaseModel):
        size: int
        twice: Annotated[int, From(derive=lambda obj: 2 * obj.size)]
        inner: Annotated[Inner, From(SAME)]  # read off the same object

    node = type("Node", (), {"label": "gpu 3"})()
    obj = type("Obj", (), {"size": 4, "node": node})()
    assert reader(Outer)(obj) == {"size": 4, "twice": 8, "inner": {"label": "gpu 3"}}
    assert Outer.model_validate(reader(Outer)(obj)).model_dump() == {"size": 4, "twice": 8, "inner": {"label": "gpu 3"}}
    assert writer(Outer)(obj) == {"size": 4, "twice": 8, "inner": {"label": "gpu 3"}}


# ---- the explorer places a call as the plan does --------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "call", "nodes", "parallel"),
    [
        ({"device_map": TRANSPOSED, "pricing": "schedule"}, "dp.grads", 4, {"tp": 8, "dp": 4}),
        ({"device_map": TRANSPOSED, "pricing": "library"}, "tp.attn.out_proj", 4, {"tp": 8, "dp": 4}),
        ({"contention": "full", "pricing": "schedule"}, "tp.attn.out_proj", 64, {"tp": 8, "dp": 64}),
    ],
)
def test_explore_prices_the_plan_s_groups(api, options, call, nodes, parallel):
    """At the call's own size the explorer's series for the plan's algorithm is the plan's price, and auto is
    the plan's pick: same groups, same device map, every group under full contention."""
    request = {
        "model": {"preset": "llama3-8b"},
        "workload": {"global_batch_size": 64},
        "parallel": parallel,
        "cluster": {"preset": "dgx-h100", "num_nodes": nodes},
        "options": options,
    }
    row = next(c for c in api.post("/v1/plan", json=request).json()["calls"] if c["name"] == call)
    seen = api.post("/v1/plan/explore", json={"request": request, "call": call, "sizes": [1024]}).json()
    i = seen["sizes"].index(row["message_bytes"])
    library = options["pricing"] == "library"
    pick = f"{row['nccl_algorithm']}/{row['protocol']}" if library else row["algorithm"]
    assert seen["auto"][i] == pick
    assert {s["algorithm"]: s for s in seen["series"]}[pick]["time_s"][i] == row["time_s"]
    # each curve says who priced it: NCCL's model (the library's "Ring/Simple") or a textbook schedule ("ring")
    pricers = {s["algorithm"]: s["pricer"] for s in seen["series"]}
    assert pricers[pick] == ("library" if library else "schedule")
    assert all((p == "library") == ("/" in name) for name, p in pricers.items()), pricers
    assert seen["groups_priced"] == seen["num_groups"] == row["num_groups"]  # custom maps, full contention: all
    plain = {**request, "options": {"pricing": options["pricing"]}}
    default = api.post("/v1/plan/explore", json={"request": plain, "call": call, "sizes": [1024]}).json()
    assert (default["groups_priced"], default["series"]) != (seen["groups_priced"], seen["series"])
    assert default["groups_priced"] <= default["num_groups"] == row["num_groups"]  # group 0's neighbourhood


@pytest.mark.parametrize(
    ("change", "loc"),
    [
        ({"options": {"device_map": [0, 1]}}, ["body", "request", "options", "device_map"]),
        ({"options": {"nccl_algo": "warp"}}, ["body", "request", "options", "nccl_algo"]),
        ({"model": {"preset": "nope"}}, ["body", "request", "model", "preset"]),
        ({"cluster": {"preset": "dgx-h100", "gpu": "Z100"}}, ["body", "request", "cluster", "gpu"]),
        ({"parallel": {"tp": 3}}, ["body", "request", "parallel", "dp"]),
    ],
)
def test_explore_errors_name_the_field_inside_request(api, change, loc):
    request = {"model": {"preset": "llama3-8b"}, "workload": GBS64, "parallel": {"tp": 8}, "cluster": H100x4} | change
    r = api.post("/v1/plan/explore", json={"request": request, "call": "dp.grads"})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == loc, r.text


def test_explore_call_errors_stay_at_the_body_s_call(api):
    request = {"model": {"preset": "llama3-8b"}, "workload": GBS64, "parallel": {"tp": 8}, "cluster": H100x4}
    r = api.post("/v1/plan/explore", json={"request": request, "call": "nope"})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "call"]
    assert "no call 'nope'" in r.json()["detail"][0]["msg"]


def test_plan_and_export_place_a_pinned_algorithm_error_alike(api):
    body = {**LLAMA70B, "options": {"algorithm": "warp"}}
    plan, csv = api.post("/v1/plan", json=body), api.post("/v1/plan/export/csv", json=body)
    assert plan.status_code == csv.status_code == 422 and plan.json() == csv.json()
    assert plan.json()["detail"][0]["loc"][:3] == ["body", "options", "algorithm"]
