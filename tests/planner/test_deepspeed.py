"""The DeepSpeed flavour beyond the three recorded runs: accumulation, small buckets, ZeRO-3 without persistence,
fp16 — each expected value worked out by hand from DeepSpeed 0.19.6's source (planner/rules/deepspeed.py)."""

from collections import Counter
from dataclasses import replace

import pytest

from app.serialize import plan_dict
from planner import SpecError, build_plan
from planner.context import Context
from planner.parallel import ZeroConfig, zero_config_from_dict
from planner.params import stage_params
from planner.rules.deepspeed import fetch_sizes, module_tree, module_walk

from .traces import specs_from_trace

# the recorded runs' model, in registration order (tests/reference/deepspeed/*.json "params")
EMB, NORM, Q, KV, OUT, MLP = 32768, 64, 4096, 2048, 4096, 16384
LAYER = [NORM, Q, KV, KV, OUT, NORM, MLP, MLP, MLP]
PARAMS = [EMB, *LAYER, *LAYER, NORM, EMB]
TOTAL = sum(PARAMS)  # 188,736


def ds_plan(reference, stage: int, micro_batches: int = 1, dtype: str = "fp32", **zero) -> list[dict]:
    trace = reference(f"deepspeed/ds_zero{stage}_mb1.json")
    model, work, par, cluster = specs_from_trace(trace)
    work = replace(
        work, global_batch_size=work.global_batch_size * micro_batches, param_dtype=dtype, activation_dtype=dtype
    )
    par = replace(par, zero_config=ZeroConfig(**zero))
    return plan_dict(build_plan(model, work, par, cluster))["calls"]


def rows(calls: list[dict], name: str) -> Counter:
    return Counter({c["message_bytes"]: c["calls_per_iteration"] for c in calls if c["name"] == name})


def test_the_model_is_the_recorded_one(reference):
    trace = reference("deepspeed/ds_zero1_mb1.json")
    assert [p["numel"] for p in trace["model"]["params"]] == PARAMS


@pytest.mark.parametrize(("stage", "per_step"), [(1, 1), (2, 4)])
def test_accumulation_zero1_reduces_at_the_boundary_zero2_every_micro_batch(reference, stage, per_step):
    """engine.allreduce_gradients: ZeRO-1 only at the gradient-accumulation boundary; ZeRO-2 partitions
    gradients in every backward (stage_1_and_2.py reduce_ready_partitions_and_remove_grads)."""
    calls = ds_plan(reference, stage, micro_batches=4)
    assert rows(calls, "dp.grads") == {TOTAL * 4: per_step}
    assert rows(calls, "dp.params") == {TOTAL * 4: 1}
    assert rows(calls, "dp.grad_norm") == {4: 1}


def test_small_buckets_flush_before_they_would_overflow(reference):
    """reduce_bucket_size 40,000: ZeRO-2 walks gradients in reverse (lm_head first). A bucket is flushed when
    the next parameter would push it past 40,000 elements, so lm_head (32,768) + norm (64) close before the
    first down-projection; each 16,384 MLP matrix pairs up; ZeRO-1 walks forward from the embedding."""
    rev = list(reversed(PARAMS))
    expected, current = [], 0
    for n in rev:
        if current + n > 40_000 and current:
            expected.append(current)
            current = 0
        current += n
    expected.append(current)
    assert expected[:2] == [EMB + NORM, MLP * 2]
    calls = ds_plan(reference, 2, reduce_bucket_size=40_000)
    assert rows(calls, "dp.grads") == Counter(e * 4 for e in expected)
    assert sum(b * n for b, n in rows(calls, "dp.grads").items()) == TOTAL * 4


def test_a_parameter_larger_than_the_bucket_is_reduced_in_partition_slices(reference):
    """reduce_bucket_size 10,000 < the 32,768-element embedding: average_tensor splits it at the partition
    boundary (47,184 per rank) — it lies inside partition 0, one slice of 32,768 > 10,000: one all-reduce."""
    calls = ds_plan(reference, 1, reduce_bucket_size=10_000)
    grads = rows(calls, "dp.grads")
    assert grads[EMB * 4] == 2  # the embedding and the LM head, each alone
    assert sum(b * n for b, n in grads.items()) == TOTAL * 4


def test_zero3_without_persistence_gathers_in_forward_and_prefetches(reference):
    """stage3_param_persistence_threshold 0: nothing is resident. The model's own (root) module runs first and
    owns no parameter, so its fetch is only a prefetch: every parameter of the trace in one coalesced call
    (188,736 < 5e7 elements); with the default reuse distance (1e9) none is released before backward."""
    calls = ds_plan(reference, 3, stage3_param_persistence_threshold=0)
    assert rows(calls, "dp.params") == {TOTAL * 4: 1}
    assert rows(calls, "dp.params.bwd") == {}
    assert rows(calls, "dp.params.persistent") == {}
    assert rows(calls, "dp.grads") == {TOTAL * 4: 1}
    assert rows(calls, "dp.grad_norm") == {8: 1}  # fp64


def test_zero3_small_prefetch_and_no_reuse_regathers_in_backward():
    """Prefetch 1 element (one parameter per call) and reuse distance 0, three modules p0, p1, p2 (8, 16, 24
    elements, dp 4), trace p0 p1 p2 | p2 p1 p0. Step 0 fetches p0 and prefetches p1; step 1 prefetches p2;
    step 2 (the last forward module) prefetches past its own backward entry to p1's backward use, which was
    released after step 1. Reuse distance 0 releases p2 after forward, so backward fetches it again and
    prefetches p0; p1 is still resident from its forward prefetch."""
    zc = ZeroConfig(stage3_prefetch_bucket_size=1, stage3_max_reuse_distance=0)
    got = fetch_sizes([8, 16, 24], [False] * 3, zc, 4)
    assert got == [("forward", 8), ("forward", 16), ("forward", 24), ("forward", 16), ("backward", 24), ("backward", 8)]
    # a 10-element parameter on 4 ranks travels padded to ceil(10 / 4) x 4 = 12
    assert fetch_sizes([10], [False], ZeroConfig(), 4) == [("forward", 12)]
    assert fetch_sizes([10], [True], ZeroConfig(), 4) == []
    # the replay is memoised without the rank count: the same fetches padded for 5 ranks (8 -> 10, 16 -> 20,
    # 24 -> 25), and 4 ranks again unchanged
    padded5 = [("forward", 10), ("forward", 20), ("forward", 25), ("forward", 20), ("backward", 25), ("backward", 10)]
    assert fetch_sizes([8, 16, 24], [False] * 3, zc, 5) == padded5
    assert fetch_sizes([8, 16, 24], [False] * 3, zc, 4) == got


def test_module_tree_of_the_recorded_model(reference):
    """Root: embedding, two layer containers, final norm, head; a layer: norm, attention container (q, k, v, o),
    norm, MLP container (gate, up, down). Backward visits a container before its children, children reversed."""
    trace = reference("deepspeed/ds_zero3_mb1.json")
    model, work, par, _ = specs_from_trace(trace)
    params = stage_params(Context(model, work, par), 0)[0]
    assert [p.numel for p in params] == PARAMS
    layer0 = [1, [2, 3, 4, 5], 6, [7, 8, 9]]
    layer1 = [10, [11, 12, 13, 14], 15, [16, 17, 18]]
    assert module_tree(params) == [0, layer0, layer1, 19, 20]
    assert module_walk([0, [1, [2, 3]]], backward=False) == [(), (0,), (), (1,), (), (2,), (3,)]
    assert module_walk([0, [1, [2, 3]]], backward=True) == [(), (), (), (3,), (2,), (1,), (0,)]


def test_zero3_accumulation_repeats_gathers_and_reduce_scatters(reference):
    calls = ds_plan(reference, 3, micro_batches=3, stage3_param_persistence_threshold=0)
    assert rows(calls, "dp.params") == {TOTAL * 4: 3}
    assert rows(calls, "dp.grads") == {TOTAL * 4: 3}
    assert sum(rows(calls, "dp.params.persistent").values()) == 0


@pytest.mark.parametrize(
    ("stage", "dtype", "overflow"), [(1, "fp16", 1), (2, "bf16", 1), (3, "fp16", 1), (3, "bf16", 0)]
)
def test_loss_scaling_adds_the_overflow_check(reference, stage, dtype, overflow):
    """fp16 (and bf16 under ZeRO-1/2, whose check_grad_overflow defaults on) all-reduce a uint8 overflow flag
    before the step; ZeRO-3 checks only with fp16 (stage3._overflow_check_and_loss_scale_update)."""
    calls = ds_plan(reference, stage, dtype=dtype)
    assert sum(rows(calls, "dp.overflow_check").values()) == overflow
    assert all(c["dtype"] == "uint8" and c["message_bytes"] == 1 for c in calls if c["name"] == "dp.overflow_check")


def test_zero_config_rejects_unknown_keys_and_bad_values():
    with pytest.raises(SpecError) as err:
        zero_config_from_dict({"reduce_bucket_sz": 10})
    assert err.value.field == "parallel.zero_config.reduce_bucket_sz" and "reduce_bucket_size" in str(err.value)
    with pytest.raises(SpecError) as err:
        zero_config_from_dict({"stage3_max_reuse_distance": -1})
    assert err.value.field == "parallel.zero_config.stage3_max_reuse_distance"
    for bad in (float("inf"), float("nan"), 1.5, True, "5e8"):
        with pytest.raises(SpecError):
            zero_config_from_dict({"reduce_bucket_size": bad})
    assert zero_config_from_dict({"reduce_bucket_size": 5e8}) == ZeroConfig()


def test_expert_parameters_are_their_own_group_on_the_expert_grid():
    """DeepSpeed-MoE puts experts in their own parameter group over the expert data-parallel group."""
    from collectives.topology import cluster_preset
    from planner import ModelSpec, MoESpec, ParallelSpec, WorkloadSpec

    model = ModelSpec(2, 1024, 8, 4096, 32000, 1024, moe=MoESpec(8, 2, 1024))
    par = ParallelSpec(dp=8, ep=4, zero_stage=2, framework="deepspeed")
    calls = plan_dict(build_plan(model, WorkloadSpec(micro_batch_size=1, global_batch_size=8), par,
                       cluster_preset("dgx-h100", 1)))["calls"]  # fmt: skip
    edp = [c for c in calls if c["name"].startswith("edp.")]
    assert edp and all(c["parallelism"] == "edp" and c["expert_grid"] and c["group_size"] == 2 for c in edp)
