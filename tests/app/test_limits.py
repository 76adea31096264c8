"""The pieces of app/limits.py and planner/deadline.py on their own: the work model's closed forms, the
non-finite filter, the neighbourhood count, error-body sanitising and the cooperative deadline."""

from __future__ import annotations

import json
import time

import pytest

from app.errors import safe
from app.limits import non_finite
from collectives import Op
from collectives.topology import cluster_for, cluster_preset
from planner import ParallelSpec, WorkloadSpec, deadline, model_preset
from planner.estimate import (
    ALL_WEIGHT,
    ALLTOALL_WEIGHT,
    BLOCKED_WEIGHT,
    CONTENTION_WEIGHT,
    EVERY_CANDIDATE_PLACED_WEIGHT,
    EVERY_CANDIDATE_RANK_WEIGHT,
    EVERY_CANDIDATE_WEIGHT,
    EVERY_SQUARE_WEIGHT,
    LIBRARY_WEIGHT,
    PLACED_PER_UNIT,
    ROUTE_WEIGHT,
    SCHEDULE_WEIGHT,
    PricingPath,
    estimate,
    network_work,
    plan_pricing_path,
    pricing_path,
    schedule_work,
)
from planner.plan import Options, placement_priced, price_classes, setup
from planner.rules import ledger

RING = PricingPath(False, ("ring", "double_binary_tree", "hierarchical", "in_network"))


def test_schedule_work_closed_forms():
    n, g = 1024, 4  # log2 1024 = 10
    base = SCHEDULE_WEIGHT * n * 10 + ROUTE_WEIGHT * g * n * 10
    assert schedule_work(Op.ALLREDUCE, n, g, RING) == base
    ag = PricingPath(False, ("ring", "hierarchical", "in_network"))
    assert schedule_work(Op.ALLGATHER, n, g, ag, in_net=True) == base + BLOCKED_WEIGHT * n * n
    assert schedule_work(Op.ALLGATHER, n, g, PricingPath(False, ("ring",)), in_net=True) == base  # not tried
    pairwise = PricingPath(False, ("pairwise",))
    assert schedule_work(Op.ALLTOALL, n, g, pairwise) == base + (ALLTOALL_WEIGHT + g) * n * n
    # direct and hierarchical all-to-alls are all-pairs step classes, priced in O(g n) (pricing.route_all_pairs)
    assert schedule_work(Op.ALLTOALL, n, g, PricingPath(False, ("direct", "hierarchical"))) == base
    every = PricingPath(False, ("ring",), every=True)  # a plan's candidates: all (every_work, speed15)
    per_candidate = EVERY_CANDIDATE_WEIGHT + EVERY_CANDIDATE_RANK_WEIGHT * n + EVERY_CANDIDATE_PLACED_WEIGHT * g * n
    assert schedule_work(Op.ALLREDUCE, n, g, every) == per_candidate + EVERY_SQUARE_WEIGHT * n * n
    explorer = PricingPath(False, every=True)  # every schedule at every size: its own n = 4,096 calibration
    assert schedule_work(Op.ALLREDUCE, n, g, explorer) == base + (ALL_WEIGHT + g) * n * n
    assert schedule_work(Op.ALLREDUCE, n, g, RING, sizes=14) == 14 * base
    assert schedule_work(Op.SENDRECV, 1, 100, PricingPath(False, ("direct",))) == 0
    # a full mesh's direct allreduce is priced per class in O(n): charged as a ring, not n^2
    assert schedule_work(Op.ALLREDUCE, n, g, PricingPath(False, ("ring", "direct"))) == base


def test_a_closed_form_call_is_o1_whatever_the_group_size():
    """NCCL's model prices any group in O(1) (its contention pass is numpy over the groups, charged as the
    placement): the 4-byte gradient-norm allreduce over 131,072 ranks costs what one over 16 does."""
    h100 = cluster_for(cluster_preset("dgx-h100", 16384))
    for n in (16, 4096, 131072):
        path = pricing_path(Op.ALLREDUCE, n, h100)
        assert path == PricingPath(True)
        assert schedule_work(Op.ALLREDUCE, n, 1, path) == LIBRARY_WEIGHT
    # the same call where the pricer builds schedules: charged for them
    assert not pricing_path(Op.ALLREDUCE, 4096, h100, pricing="schedule").library
    assert pricing_path(Op.ALLREDUCE, 4096, h100, algorithm="ring") == PricingPath(False, ("ring",))
    assert not pricing_path(Op.ALLTOALL, 4096, h100).library  # NCCL's tuner does not price all-to-all
    assert not pricing_path(Op.ALLREDUCE, 64, cluster_for(cluster_preset("npu-mesh-8", 8))).library  # not NCCL
    # the plan's own rule (planner.plan._price_op): candidates 'all' under pricing auto builds every schedule
    every = plan_pricing_path(Op.ALLREDUCE, 4096, h100, Options(candidates="all"))
    assert every.every and not every.library
    assert plan_pricing_path(Op.ALLREDUCE, 4096, h100, Options(candidates="all", pricing="library")).library
    # a pinned algorithm the op lacks falls back to the candidates, step by step
    pinned = plan_pricing_path(Op.BROADCAST, 4096, h100, Options(algorithm="double_binary_tree"))
    assert pinned == PricingPath(False, ("ring",))


def test_the_estimate_is_built_from_the_plans_set_up():
    """The plan's set-up (planner.plan.setup), ledger and priced placements: on 131,072 H100 the 405B plan's
    largest part is the 4-byte gradient-norm allreduce over the whole world, charged one NCCL-model call and
    one contention pass over its 131,072 ranks (it was charged 298,713,088 units: 130 n log2 n + 4 n log2 n
    + n, as if its schedules were built), and the whole plan is within the budget of 2^27."""
    model, work = model_preset("llama3-405b"), WorkloadSpec(micro_batch_size=1, global_batch_size=16384)
    par = ParallelSpec(
        tp=8, pp=16, dp=1024, zero_stage=1, sequence_parallel=True, first_stage_layers=7, last_stage_layers=7
    )
    spec, options = cluster_preset("dgx-h100", 16384), Options()
    est = estimate(model, work, par, spec, options)
    ctx, layout, cluster = setup(model, work, par, spec, options)
    norm = next(c for c in ledger(ctx) if c.name == "dp.grad_norm")
    assert norm.message_bytes == 4 and placement_priced(norm, layout, cluster, options).shape == (1, 131072)
    assert price_classes(norm, layout, cluster, options) == [norm.stages]  # one group: one class
    assert est.biggest.startswith("dp.grad_norm (allreduce on 1 groups of 131072 ranks, NCCL model)")
    assert est.biggest_units == LIBRARY_WEIGHT + CONTENTION_WEIGHT * 131072 + 131072 // PLACED_PER_UNIT + 131072
    assert est.units < 1 << 27
    # the TP calls share their groups: one contention pass for all of them, one model call each
    tp = [c for c in ledger(ctx) if c.parallelism == "tp"]
    assert len({c.group for c in tp}) < len(tp)


def test_router_work_is_quadratic_in_routers():
    assert network_work(cluster_preset("tpu-torus", 512)) == 512**2
    assert network_work(cluster_preset("tpu-torus", 1)) == 0
    assert network_work(cluster_preset("dgx-h100", 4096)) == 0  # fat-tree: no search


def test_groups_priced_counts_the_neighbourhood():
    """The estimate prices a call on the groups the plan prices it on (planner.plan.placement_priced)."""
    spec = cluster_preset("dgx-h100", 128)  # 32 nodes x 8 GPUs = 256 devices per leaf unit, 4 units
    model, work = model_preset("llama3-8b"), WorkloadSpec(micro_batch_size=1, global_batch_size=1024)
    ctx, layout, cluster = setup(model, work, ParallelSpec(tp=8, dp=128), spec, Options())
    calls = {c.name: c for c in ledger(ctx)}
    tp, dp = calls["tp.attn.out_proj"], calls["dp.grads"]
    assert placement_priced(tp, layout, cluster, Options()).shape == (32, 8)  # the groups of group 0's unit
    assert placement_priced(tp, layout, cluster, Options(contention="full")).shape == (128, 8)
    assert placement_priced(dp, layout, cluster, Options()).shape == (8, 128)


@pytest.mark.parametrize(
    ("body", "bad"),
    [
        (b'{"a": NaN}', "NaN"),
        (b'{"a": [1, -Infinity]}', "-Infinity"),
        (b'{"a": 1e309}', "1e309"),
        (b'{"a": 1e308}', None),
        (b'{"a": "NaN and 1e999 inside a string"}', None),
        (b'{"a": 123456789e-300}', None),
        (b"not json NaN", None),  # FastAPI answers unreadable bodies itself
    ],
)
def test_non_finite_numbers_are_found(body, bad):
    assert non_finite(body) == bad


def test_safe_makes_every_error_encodable():
    value = {"\ud800": [float("nan"), float("inf"), "x\udfffy", 2**70, True, None, ("t",)]}
    encoded = json.dumps(safe(value), allow_nan=False, ensure_ascii=False).encode("utf-8")
    assert json.loads(encoded) == {"\\ud800": ["nan", "inf", "x\\udfffy", 2**70, True, None, ["t"]]}


def test_deadline_check_is_a_no_op_outside_a_request():
    assert deadline.current() is None
    deadline.check()


def test_deadline_check_raises_once_the_time_is_up():
    with deadline.bounded(deadline.Deadline(0.05)) as d:
        deadline.check()
        time.sleep(0.06)
        with pytest.raises(deadline.DeadlineExceeded) as caught:
            deadline.check()
        assert caught.value.reason == "deadline" and d.expired()
    assert deadline.current() is None


def test_deadline_cancel_names_the_reason():
    with deadline.bounded(deadline.Deadline(60)) as d:
        d.cancel("disconnected")
        with pytest.raises(deadline.DeadlineExceeded) as caught:
            deadline.check()
    assert caught.value.reason == "disconnected"
