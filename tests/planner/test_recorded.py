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
