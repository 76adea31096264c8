"""What the search's size limit counts (counts12, docs/search.md): ``Space.size`` is the layouts the search walks,
every one of which it evaluates or prunes by a later rule; what the rules refuse up front (world_size, max_dp_group,
a framework's pipeline schedules and ZeRO stages beside pp: planner/parallel.py framework_pipeline_rule) is counted
apart (``Pruned.up_front``). Checked against the whole space enumerated layout by layout through /v1/plan's own
validator, on spaces small enough to walk."""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import replace

import pytest

from collectives.topology import cluster_preset
from planner import MODEL_PRESETS, SpecError, WorkloadSpec
from planner.search import Constraints, Problem, search, space_of
from planner.search.evaluate import evaluate_shapes
from planner.search.space import DP_GROUP, MEMORY, WORLD, Pruned, Shape, Variant

MODEL = replace(MODEL_PRESETS["llama3-8b"], seq_length=2048, num_layers=8)
WORK = WorkloadSpec(global_batch_size=16)
BOTH = {"framework": ["megatron", "deepspeed"], "activation_recompute": ["none", "full"]}
# (constraints, max_dp_group): DeepSpeed beside Megatron over every ZeRO stage (both of DeepSpeed's rules), a tp
# that divides no device count (world_size) and a gradient-group limit (max_dp_group); DeepSpeed alone with the
# schedules it does not run listed (gpipe, interleaved) and zero-bubble ones
CASES = [
    (BOTH | {"tp": [1, 2, 3, 4]}, 4),
    ({"framework": "deepspeed", "pipeline_schedule": ["1f1b", "gpipe", "interleaved", "zb-h1"], "zero_stage": [1, 2],
      "activation_recompute": "none"}, 0),
]  # fmt: skip
# the messages of framework_pipeline_rule (planner/parallel.py), which validate_parallel raises before any other
FRAMEWORK_RULES = ("pipeline schedule(s), got", "beside pipeline parallelism, got zero_stage")


def problem_of(allowed: dict, max_dp_group: int = 0, model=MODEL) -> Problem:
    return Problem(model, WORK, cluster_preset("dgx-h100", 1), Constraints.of(allowed, max_dp_group=max_dp_group))


def walked(space) -> tuple[int, Counter, dict]:
    """Every layout of the constrained space, one by one: (layouts /v1/plan's validator does not refuse by a
    framework's rule, layouts refused up front by reason, their first messages), with every variant of every
    (tp, cp, pp, ep, expert tp) as the space lists its axes (no rule applied), each checked by ``Space.check``
    (validate_parallel)."""
    runnable, refused, examples = 0, Counter(), {}
    for tp, cp, pp, divides in space._triples():
        dp = space.devices // (tp * cp * pp) if divides else 1
        per_b = len(space.micro_batches(dp)) * len(space.recomputes)
        for ep, etp in itertools.product(space.eps, space.expert_tps(tp)):
            axes = (space.stage_splits(pp), space.sps(tp), space.frameworks, space.zeros, space.dispatches)
            variants = list(itertools.product(*axes))
            if not divides or cp * dp > space.c.max_dp_group:
                refused[WORLD if not divides else DP_GROUP] += len(variants) * per_b
                continue
            for (v, schedule, first, last, layout), sp, framework, zero, dispatch in variants:
                variant = Variant(
                    Shape(tp, cp, pp, dp, ep, etp), v, schedule, zero, sp, framework, first, dispatch, last, layout
                )
                err = space.check(variant, 1)
                if err is not None and any(words in err.rule for words in FRAMEWORK_RULES):
                    refused[err.field] += per_b
                    examples.setdefault(err.field, err.rule)
                else:
                    runnable += per_b
    return runnable, refused, examples


@pytest.mark.parametrize("allowed, max_dp_group", CASES)
def test_the_size_is_what_the_search_walks_layout_by_layout(allowed, max_dp_group):
    """size() = the layouts no up-front rule refuses, counted one by one through validate_parallel; size(every) = the
    whole constrained space; the screen of every shape (no bound) counts each walked layout once: evaluated + pruned
    by a later rule = size(), and the search answers space_size = size() with the same up-front counts."""
    problem = problem_of(allowed, max_dp_group)
    space = space_of(problem)
    runnable, refused, examples = walked(space)
    up = Pruned()
    shapes = list(space.shapes(up))
    assert space.size() == runnable > 0
    assert space.size(every=True) == runnable + sum(refused.values())
    assert up.up_front == {k: n for k, n in refused.items() if n} and up.counts == {}
    assert all(up.up_front_examples[k] == examples[k] for k in examples)  # the first variant the walk refuses
    out = evaluate_shapes(problem, shapes)  # no threshold: every walked layout screened
    assert out.done == out.evaluated + out.pruned.total - out.pruned.counts.get(MEMORY, 0) == space.size()
    assert out.evaluated == out.feasible + out.pruned.counts.get(MEMORY, 0) + out.bounded_before_memory
    assert not any(any(words in ex for words in FRAMEWORK_RULES) for ex in out.pruned.examples.values())
    result = search(problem, workers=1)
    total = result.outcome
    assert (
        result.space_size == space.size() == total.evaluated + total.pruned.total - total.pruned.counts.get(MEMORY, 0)
    )
    assert total.pruned.up_front == up.up_front and result.results


def test_the_first_case_refuses_by_every_up_front_rule():
    """The first case exercises all four rules, with DeepSpeed's messages as /v1/plan gives them."""
    space = space_of(problem_of(*CASES[0]))
    up = Pruned()
    list(space.shapes(up))
    assert set(up.up_front) == {WORLD, DP_GROUP, "parallel.pipeline_schedule", "parallel.zero_stage"}
    assert up.up_front_examples["parallel.pipeline_schedule"] == (
        "framework 'deepspeed' runs only the 1f1b pipeline schedule(s), got 'interleaved' at pp 2"
    )
    assert up.up_front_examples["parallel.zero_stage"] == (
        "framework 'deepspeed' runs ZeRO stages up to 1 beside pipeline parallelism, got zero_stage 2 at pp 2"
    )


def test_deepspeed_with_only_interleaved_schedules_is_an_empty_space_with_the_reason():
    """DeepSpeed runs 1F1B only beside pp > 1 (PipelineEngine's TrainSchedule): an interleaved-only DeepSpeed search
    has no layout to walk, and the refusal names the rule, its count and its message (not the product rule, not the
    schedule's pp >= 2)."""
    problem = problem_of({"framework": "deepspeed", "pipeline_schedule": "interleaved"})
    space = space_of(problem)
    assert space.size() == 0 < space.size(every=True)
    with pytest.raises(SpecError) as err:
        search(problem, workers=1)
    assert err.value.field == "constraints"
    assert err.value.rule == (
        f"leave no layout on the 8 devices: every layout is refused up front: {space.size(every=True):,} by "
        "parallel.pipeline_schedule (framework 'deepspeed' runs only the 1f1b pipeline schedule(s), got 'interleaved' "
        "at pp 2)"
    )


def test_deepspeed_zero_2_beside_pp_only_is_an_empty_space_with_the_reason():
    """DeepSpeed's PipelineEngine asserts ZeRO < 2 beside pp > 1: a search of ZeRO 2 and 3 at pp 2 and 4 is refused by
    that rule, with every layout of the space counted under it."""
    problem = problem_of({"framework": "deepspeed", "pipeline_schedule": "1f1b", "pp": [2, 4], "zero_stage": [2, 3]})
    with pytest.raises(SpecError) as err:
        search(problem, workers=1)
    assert err.value.rule.endswith(
        f"every layout is refused up front: {space_of(problem).size(every=True):,} by parallel.zero_stage (framework "
        "'deepspeed' runs ZeRO stages up to 1 beside pipeline parallelism, got zero_stage 2 at pp 2)"
    )


def test_a_space_over_the_limit_before_the_rules_and_under_it_after_is_searched():
    """A limit between the runnable layouts and the space before the rules: refused when the rules' refusals
    counted (round 11), searched now; one below the runnable count is refused, stating both numbers."""
    problem = problem_of(BOTH | {"zero_stage": [0, 2]})
    space = space_of(problem)
    runnable, every = space.size(), space.size(every=True)
    assert runnable < every
    for limit in (runnable, every - 1):
        result = search(problem, workers=1, max_layouts=limit)
        assert result.space_size == runnable and result.results
    with pytest.raises(SpecError) as err:
        search(problem, workers=1, max_layouts=runnable - 1)
    assert err.value.rule.startswith(
        f"the space holds {runnable:,} runnable layouts ({every:,} before the rules that refuse layouts up front: "
    )
    assert f"above the limit of {runnable - 1:,} (COMMPLAN_MAX_SEARCH_LAYOUTS)" in err.value.rule
