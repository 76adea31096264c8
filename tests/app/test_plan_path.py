"""The plan path builds its set-up and ledger once (issue 19, speed4): the work estimate hands them to
build_plan (``Estimate.prepared``), and ``Plan.totals`` is computed once per plan. Answers are unchanged:
byte for byte the same JSON as a plan built from scratch, over HTTP and in-process."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

import planner.estimate as estimate_module
import planner.plan as plan_module
import planner.rules as rules
from app.serialize import plan_json
from collectives.topology import cluster_preset
from planner import ParallelSpec, WorkloadSpec, build_plan, model_preset
from planner.estimate import estimate
from planner.plan import MAX_PARAMS, prepare

from .conftest import LLAMA70B

PAR = ParallelSpec(tp=8, pp=4, dp=4, zero_stage=1, sequence_parallel=True)
WORK = WorkloadSpec(micro_batch_size=1, global_batch_size=64)


def _inputs(model: str = "llama3-70b"):
    return model_preset(model), WORK, PAR, cluster_preset("dgx-h100", 16), plan_module.Options()


def test_estimate_hands_its_ledger_to_the_plan():
    inputs = _inputs()
    work = estimate(*inputs)
    assert work.prepared is not None and work.prepared.built_from(*inputs)
    fresh = build_plan(*inputs)
    handed = build_plan(*inputs, prepared=work.prepared)
    assert plan_json(handed) == plan_json(fresh)
    assert [pc.call.name for pc in handed.calls] == [pc.call.name for pc in fresh.calls]


def test_a_set_up_of_other_inputs_is_not_used():
    """Matched by identity: a Prepared of another model (or an equal but different object) is rebuilt, so it can
    never price the wrong ledger."""
    inputs = _inputs()
    other = prepare(*_inputs("llama3-8b")[:1], *inputs[1:])
    assert not other.built_from(*inputs)
    assert plan_json(build_plan(*inputs, prepared=other)) == plan_json(build_plan(*inputs))
    assert build_plan(*inputs, prepared=other).params_total == model_preset("llama3-70b").total_params()


def test_the_parameter_bound_is_checked_in_the_set_up():
    huge = replace(model_preset("llama3-405b"), num_layers=126 * 4000)
    assert huge.total_params() > MAX_PARAMS
    with pytest.raises(plan_module.SpecError) as err:
        prepare(huge, *_inputs()[1:])
    assert err.value.field == "model" and "2^50" in str(err.value)


def test_totals_are_computed_once_per_plan(monkeypatch):
    plan = build_plan(*_inputs())
    first = plan.totals
    assert plan.totals is first  # cached
    busiest = max(first.per_stage, key=lambda s: s.time_s)
    assert first.time_s == busiest.time_s and first.busiest_stage == busiest.stage
    # a plan made from it by dataclasses.replace (planner/serving) adds its totals up again
    fewer = replace(plan, calls=plan.calls[:1])
    pc = plan.calls[0]
    expected = pc.call.calls_per_iteration * pc.price.time_s
    assert fewer.totals.per_stage[pc.call.stages[0]].time_s == pytest.approx(expected, rel=1e-12)


def test_one_ledger_per_request_over_http(api, monkeypatch):
    """POST /v1/plan: the estimate and the plan walk one ledger (it was built twice), and the answer is the
    plan built from scratch in-process, byte for byte."""
    built = []
    real = rules.merge_stages  # every ledger() ends in it, whichever module imported ledger
    monkeypatch.setattr(rules, "merge_stages", lambda calls: built.append(len(calls)) or real(calls))
    plan_module._CONTEXTS.clear()  # an earlier test may have left this context and its ledger memoised
    answer = api.post("/v1/plan", json=LLAMA70B)
    assert answer.status_code == 200, answer.text
    assert len(built) == 1
    again = api.post("/v1/plan", json=LLAMA70B)  # the same values: the memoised ledger, the same bytes
    assert len(built) == 1 and again.content == answer.content
    body = answer.json()
    assert body["world_size"] == 512 and body["totals"]["time_s"] > 0


def test_batch_items_plan_their_own_set_up(api):
    """Two different items and a repeat of the first in one batch: each answer is that item's own plan."""
    other = json.loads(json.dumps(LLAMA70B))
    other["parallel"] = {"tp": 4, "pp": 8, "dp": 16, "zero_stage": 1}
    answer = api.post("/v1/plan/batch", json={"requests": [LLAMA70B, other, LLAMA70B]})
    assert answer.status_code == 200, answer.text
    results = answer.json()["results"]
    assert [r["ok"] for r in results] == [True, True, True]
    singles = [api.post("/v1/plan", json=item).json() for item in (LLAMA70B, other)]
    for result, single in zip(results, (singles[0], singles[1], singles[0]), strict=True):
        assert result["plan"]["step"]["time_s"] == single["step"]["time_s"]
        assert result["plan"]["totals"] == single["totals"]
    assert results[0]["plan"]["step"]["time_s"] != results[1]["plan"]["step"]["time_s"]


def test_contexts_and_ledgers_are_memoised_by_value_and_bounded(monkeypatch):
    """plan._context: equal (model, work, par, devices per node) share one Context and its ledger, whatever
    the objects; another value (a different batch, another node size) is its own; the memo keeps at most
    CONTEXT_CACHE entries, first in first out, and a plan from a memoised ledger is the fresh one's bytes."""
    plan_module._CONTEXTS.clear()
    model, work, par, cluster, options = _inputs()
    first = prepare(model, work, par, cluster, options)
    twin = prepare(replace(model), replace(work), replace(par), replace(cluster), options)  # equal, not the same
    assert twin.ctx is first.ctx and twin.calls is first.calls
    other = prepare(model, replace(work, global_batch_size=128), par, cluster, options)
    assert other.ctx is not first.ctx and other.ctx.micro_batches == 2 * first.ctx.micro_batches
    wide = prepare(model, work, par, replace(cluster, num_nodes=8, devices_per_node=16), options)
    assert wide.ctx is not first.ctx and wide.ctx.devices_per_node == 16
    memoised = plan_json(build_plan(model, work, par, cluster, options))
    plan_module._CONTEXTS.clear()
    assert plan_json(build_plan(model, work, par, cluster, options)) == memoised
    monkeypatch.setattr(plan_module, "CONTEXT_CACHE", 2)
    for batch in (64, 128, 256, 512):
        prepare(model, replace(work, global_batch_size=batch), par, cluster, options)
    assert len(plan_module._CONTEXTS) == 2
    kept = {ctx.work.global_batch_size for ctx in plan_module._CONTEXTS}
    assert kept == {256, 512}


def test_the_estimate_walk_is_memoised_with_the_ledger(monkeypatch):
    """planner.estimate: the walk over a memoised context's ledger is kept with it (plan.ledger_memo), keyed by
    the cluster, the options and the explored call: a repeated estimate is the fresh one's figures, other
    options or another cluster are walked afresh, and the walks go with their context."""
    plan_module._CONTEXTS.clear()
    model, work, par, cluster, options = _inputs()
    walked = []
    real = estimate_module._walk
    monkeypatch.setattr(estimate_module, "_walk", lambda *args: walked.append(args[2]) or real(*args))
    first = estimate(model, work, par, cluster, options)
    again = estimate(replace(model), replace(work), replace(par), replace(cluster), options)  # equal values
    assert len(walked) == 1 and again.prepared.ctx is first.prepared.ctx
    assert (again.units, again.biggest, again.biggest_units) == (first.units, first.biggest, first.biggest_units)
    full = estimate(model, work, par, cluster, replace(options, pricing="schedule"))  # charged otherwise
    slower = estimate(model, work, par, replace(cluster, nic_bandwidth_GBps=25.0), options)  # same context
    assert len(walked) == 3 and full.units != first.units and slower.prepared.ctx is first.prepared.ctx
    assert len(plan_module.ledger_memo(first.prepared.ctx)) == 3
    plan_module._CONTEXTS.clear()
    assert plan_module.ledger_memo(first.prepared.ctx) is None
    fresh = estimate(model, work, par, cluster, options)
    assert len(walked) == 4 and (fresh.units, fresh.biggest) == (first.units, first.biggest)
