"""A layer's kernels' value key (kernels.layer_kernels_key), built once per context object: a context that
differs in any field a layer's kernels read gets its own key, never the first context's kept one; equal
contexts built apart get equal keys; the per-layer memos (compute.layer_forward) then give each its own."""

from __future__ import annotations

from dataclasses import replace

import pytest

from collectives.topology.gpu import GPUS
from planner import MODEL_PRESETS, ParallelSpec, WorkloadSpec
from planner.compute import layer_forward
from planner.context import Context
from planner.kernels import layer_kernels_key

MOE = MODEL_PRESETS["mixtral-8x7b"]
BASE = ParallelSpec(tp=2, cp=2, pp=2, dp=4, ep=2, sequence_parallel=True)
WORK = WorkloadSpec(micro_batch_size=1, global_batch_size=64)
# every field of the layout or workload a layer's kernels read (layer_kernels_key's docstring), changed alone
CHANGES = [
    ("parallel", {"tp": 4}),
    ("parallel", {"cp": 1}),
    ("parallel", {"sequence_parallel": False}),
    ("parallel", {"ep": 4}),
    ("parallel", {"expert_tp": 1}),
    ("parallel", {"framework": "torch"}),
    ("parallel", {"cp_comm": "all_gather"}),
    ("parallel", {"cp_load_balance": False}),
    ("parallel", {"ep_dispatch": "allgather"}),
    ("workload", {"micro_batch_size": 2}),
    ("workload", {"activation_recompute": "full"}),
]


def _fresh(ctx: Context) -> tuple:
    """The key of an equal context built anew (nothing kept on it yet)."""
    return layer_kernels_key(Context(ctx.model, ctx.work, ctx.par, ctx.devices_per_node))


@pytest.mark.parametrize(("part", "change"), CHANGES)
def test_a_context_differing_in_a_field_the_kernels_read_gets_its_own_key(part, change):
    first = Context(MOE, WORK, BASE)
    kept = layer_kernels_key(first)
    assert layer_kernels_key(first) is kept  # built once per context object
    if part == "parallel":
        other = replace(first, par=replace(BASE, **change))
    else:
        other = replace(first, work=replace(WORK, **change))
    assert layer_kernels_key(other) != kept
    assert layer_kernels_key(other) == _fresh(other) and kept == _fresh(first)


def test_the_per_layer_memo_prices_each_context_on_its_own_key():
    gpu = GPUS["h100-sxm5-80gb"]
    first = Context(MOE, WORK, BASE)
    wider = replace(first, par=replace(BASE, tp=4))
    for moe in (False, True):
        assert layer_forward(first, moe, gpu)[0].total_s > layer_forward(wider, moe, gpu)[0].total_s
        assert layer_forward(wider, moe, gpu) == layer_forward(Context(MOE, WORK, replace(BASE, tp=4)), moe, gpu)
