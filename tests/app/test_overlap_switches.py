"""The overlap switches are one list (planner/step.py OVERLAP_DEFAULTS): the planner's Overlap, the request's
OverlapIn and the plan's assumptions all follow it, and each switch given over HTTP is the value the plan runs."""

from __future__ import annotations

import dataclasses

import pytest

from app.schemas.plan import OVERLAP_SWITCHES, OverlapIn
from planner import ParallelSpec, WorkloadSpec, model_preset
from planner.assumptions import SCHEMA_SOURCES
from planner.context import Context
from planner.step import OVERLAP_DEFAULTS, Overlap

MOE = {
    "model": {"preset": "mixtral-8x7b"},
    "workload": {"kind": "training", "global_batch_size": 64},
    "parallel": {"tp": 2, "pp": 2, "dp": 8, "ep": 8, "zero_stage": 1, "sequence_parallel": True, "cp": 1},
    "cluster": {"preset": "dgx-h100", "num_nodes": 4},
}


def test_every_list_of_switches_is_the_planners():
    names = list(OVERLAP_DEFAULTS)
    assert len(names) == 8 and [f.name for f in dataclasses.fields(Overlap)] == names
    assert list(OverlapIn.model_fields) == names == list(OVERLAP_SWITCHES) == list(SCHEMA_SOURCES)
    assert all(OverlapIn.model_fields[n].description == OVERLAP_SWITCHES[n] for n in names)
    assert Overlap() == Overlap(**dict.fromkeys(names)) and hash(Overlap()) == hash(Overlap())
    with pytest.raises(dataclasses.FrozenInstanceError):
        Overlap().tp_comm_overlap = True


@pytest.mark.parametrize(("framework", "zero", "grad_reduce"), [("megatron", 1, False), ("torch", 3, True)])
def test_resolved_takes_the_framework_default_where_the_request_is_silent(framework, zero, grad_reduce):
    par = ParallelSpec(tp=2, pp=2, dp=8, zero_stage=zero, framework=framework)
    ctx = Context(model_preset("llama3-8b"), WorkloadSpec(global_batch_size=64), par)
    resolved = Overlap().resolved(ctx)
    assert resolved.overlap_grad_reduce is grad_reduce and resolved.fsdp_prefetch is True
    assert resolved.tp_comm_overlap is False and resolved.overlap_p2p is False  # 1f1b, not interleaved
    assert Overlap(overlap_grad_reduce=not grad_reduce).resolved(ctx).overlap_grad_reduce is (not grad_reduce)


@pytest.mark.parametrize("name", list(OVERLAP_DEFAULTS))
def test_each_switch_given_over_http_is_the_value_the_plan_assumes(api, name):
    rows = {}
    for value in (True, False):
        answer = api.post("/v1/plan", json={**MOE, "options": {"overlap": {name: value}}})
        assert answer.status_code == 200, answer.text
        rows[value] = {a["field"]: a["value"] for a in answer.json()["assumptions"]}
    field = f"options.overlap.{name}"
    if name in ("fsdp_prefetch", "cp_ring_overlap"):  # the row is shown where the switch applies: ZeRO-3, cp > 1
        assert field not in rows[True] and field not in rows[False]
    else:
        assert (rows[True][field], rows[False][field]) == ("on", "off")
    bad = api.post("/v1/plan", json={**MOE, "options": {"overlap": {name: "sometimes"}}})
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"][-1] == name
