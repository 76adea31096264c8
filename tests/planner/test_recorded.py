"""The plan against runs recorded for issue 24 with scripts/record_collectives.py (torch 2.13.0+cpu, gloo, 4
ranks, three steps; tests/reference/recorded/README.md): DDP's switches and FSDP2 inside
torch.distributed.pipelining, rank by rank, multiset of (op, group size, message bytes) at the steady step."""

from collections import Counter

import numpy as np
import pytest

from app.serialize import plan_dict
from planner import build_plan
from planner.layout import RankLayout

from .traces import plan_ops, specs_from_trace, trace_ops

# recording -> (the first steady step, the step that also carries DDP's two bucket-rebuild broadcasts): DDP
# rebuilds in step 1 (static_graph: step 2) and find_unused_parameters never; pipelining infers shapes in step 0
RECORDED = {
    "ddp_find_unused": (0, None),
    "ddp_find_unused_cap0.05": (0, None),
    "ddp_static_graph_cap0.05": (2, 2),
    "ddp_bucket_view_cap0.05": (1, 1),
    "fsdp2_pp2_1f1b_default": (1, None),
    "fsdp2_pp2_1f1b_noreshard": (1, None),
    "fsdp2_pp2_gpipe_default": (1, None),
    "fsdp2_pp2_gpipe_noreshard": (1, None),
    "fsdp2_pp2_interleaved_default": (1, None),
    "fsdp2_pp2_interleaved_noreshard": (1, None),
    # DeepSpeed 0.19.8 ZeRO-3, nothing persistent, 2 micro-batches; step 0 builds the partitions (and hpZ's
    # secondary copies: its all-gathers over 2 ranks)
    "ds_zero3_mb2_p0": (1, None),
    "ds_zero3_hpz2_mb2": (1, None),
    # qgZ on one host: DeepSpeed quantises gradients only when the group spans nodes (stage3.py), a plain ZeRO-3 step
    "ds_zero3_qgz": (2, None),  # one micro-batch: step 1 carries ZeRO-3's one-off order check (int64 broadcasts)
}


def _trace(reference, name: str) -> dict:
    trace = reference(f"recorded/{name}.json")
    assert trace["ok"], trace.get("reason")
    # the recorder names the group sizes per op; traces.trace_ops counts group_ranks
    for c in trace["calls"]:
        c["group_ranks"] = [None] * c["group_size"]
    return trace


@pytest.mark.parametrize("name", RECORDED)
def test_recorded_run_equals_plan_for_every_rank(reference, name):
    trace = _trace(reference, name)
    model, work, par, cluster = specs_from_trace(trace)
    plan = plan_dict(build_plan(model, work, par, cluster))
    stages = RankLayout(par).stage_of(np.arange(trace["world_size"]))
    steady, rebuild = RECORDED[name]
    for step in range(steady, 3):
        for rank in range(trace["world_size"]):
            ours, theirs = plan_ops(plan, int(stages[rank]), par.pp), trace_ops(trace, rank, step)
            if step == rebuild:
                # the rebuild step also broadcasts the new layout (bucket indices and sizes, int32), once each
                assert sorted(k[0] for k in theirs.elements() if k[0] == "broadcast") == ["broadcast"] * 2
                theirs = Counter({k: n for k, n in theirs.items() if k[0] != "broadcast"})
            assert ours == theirs, f"rank {rank} step {step}"


def test_the_rebuild_is_one_step_later_with_static_graph(reference):
    """Plain DDP broadcasts the rebuilt bucket layout in step 1 (tests/reference/pytorch), static_graph in step 2."""
    trace = _trace(reference, "ddp_static_graph_cap0.05")
    broadcasts = {s: sum(1 for c in trace["calls"] if c["step"] == s and c["op"] == "broadcast") for s in range(3)}
    assert broadcasts == {0: 0, 1: 0, 2: 2 * trace["world_size"]}
    step0 = trace_ops(trace, 0, 0)
    assert step0[("all_reduce", 4, 80)] == 1  # the used-parameter map (20 int32) in the delayed first step


def test_zero_plus_plus_hpz_regathers_on_the_secondary_group_as_recorded(reference):
    """ZeRO++ hpZ (zero_hpz_partition_size 2 of 4 ranks), read off the recording: the first micro-batch gathers
    over all 4 ranks and builds the secondary copy, the second gathers over its 2-rank secondary group
    (DeepSpeed 0.19.8 partition_parameters.py, `_allgather_params_coalesced` with the secondary group); the
    recorder tells the group from the all-gather's output over its input (188,736 fp32 in shards of 94,368)."""
    steady = [c for c in _trace(reference, "ds_zero3_hpz2_mb2")["calls"] if c["step"] == 2 and c["rank"] == 0]
    gathers = sorted((c["group_size"], c["bytes"]) for c in steady if c["op"] == "all_gather_into_tensor")
    assert gathers == [(2, 188_736 * 4), (4, 188_736 * 4)]
    plain = [c for c in _trace(reference, "ds_zero3_mb2_p0")["calls"] if c["step"] == 2 and c["rank"] == 0]
    assert sorted(c["group_size"] for c in plain if c["op"] == "all_gather_into_tensor") == [4, 4]


def test_quantised_weights_cannot_run_on_cpu_and_say_why(reference):
    """qwZ needs DeepSpeed's quantizer kernels, which have no CPU implementation: recorded as a failure."""
    trace = reference("recorded/ds_zero3_qwz.json")
    assert trace["ok"] is False and "not been implemented on CPU" in trace["reason"]
