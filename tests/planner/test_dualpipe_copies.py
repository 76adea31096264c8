"""DualPipe's two copies (dualpipe13b): each stage's gradients summed over both copies every step (rules/data.py, the
twins' dp replicas in one group: Group.mirror; DeepSeek-V3 report §3.2.1, deepseek-ai/DualPipe 3da1bbe
example_dualpipe.py:167-174), and the timeline drawn from the order the step is priced by
(pipeline_jitter.order_blocks)."""

from __future__ import annotations

import pytest

from collectives.topology import cluster_preset
from planner import Options, ParallelSpec, WorkloadSpec, build_plan, model_preset
from planner import step as step_module
from planner.pipeline import pipeline_time

MODEL = model_preset("llama3-8b")  # 32 layers, 8 a stage at pp 4
WORK = WorkloadSpec(micro_batch_size=1, global_batch_size=16, seq_length=4096)


def _plan(sched: str, zero: int = 1, framework: str = "megatron", timeline: bool = False):
    par = ParallelSpec(tp=1, pp=4, dp=2, pipeline_schedule=sched, zero_stage=zero, framework=framework)
    return build_plan(MODEL, WORK, par, cluster_preset("dgx-h100", 1), Options(timeline=timeline))


def _dp(plan) -> dict:
    return {(pc.call.name, pc.call.stages): pc for pc in plan.calls if pc.call.parallelism == "dp"}


def test_the_twins_reduce_both_stages_over_both_copies():
    """ZeRO-1, dp 2: rank r holds stages r and 3 - r, and so does rank 3 - r, so one group of 2 x dp ranks reduces
    both stages' gradients (ranks 0, 1 of stage 0 and 6, 7 of stage 3; order tp-cp-ep-dp-pp: rank = dp + 2·pp); its
    bytes are 1F1B's stage r and stage 3 - r buckets together (fp32 grads, one bucket, padded to lcm(4, 128))."""
    dual, one = _dp(_plan("dualpipe")), _dp(_plan("1f1b"))
    ends, middle = dual["dp.grads", (0, 3)], dual["dp.grads", (1, 2)]
    assert (ends.group_size, ends.num_groups, list(ends.group_ranks)) == (4, 1, [0, 1, 6, 7])
    assert (middle.group_size, middle.num_groups, list(middle.group_ranks)) == (4, 1, [2, 3, 4, 5])
    first, last, inner = (one["dp.grads", s].call.message_bytes for s in ((0,), (3,), (1, 2)))
    assert ends.call.message_bytes == first + last == 18_161_876_992
    assert middle.call.message_bytes == 2 * inner == 2 * 6_979_584_000
    assert dual["dp.params", (0, 3)].call.message_bytes == ends.call.message_bytes // 2  # bf16 params of the same
    assert ends.call.group.mirror and not one["dp.grads", (0,)].call.group.mirror
    # the optimizer shards over the same 4 ranks: rank 0's two stages / 4 = 1F1B's one stage / 2
    opt = [s.optimizer_bytes for s in _plan("dualpipe").memory.per_stage]
    assert opt[0] == opt[3] and opt[0] == pytest.approx((first + last) // 4 * 12 / 4, rel=1e-6)


def test_sharded_units_sum_the_copies_shards():
    """torch ZeRO-3 (FSDP2): each copy shards over its own dp ranks and gathers in its own order; the reduced shard is
    all-reduced with the twin's (HSDP's replicate form): pairs (0, 6), (1, 7), (2, 4), (3, 5), each unit's shard (its
    reduce-scatter's bytes / dp 2) as often as the unit is reduced; 1F1B has no such call."""
    plan = _plan("dualpipe", zero=3, framework="torch")
    rows = [pc for pc in plan.calls if pc.call.name == "dp.grads.replicas"]
    layer = next(pc for pc in rows if pc.call.stages == (0, 1, 2, 3))
    assert (layer.group_size, layer.num_groups, list(layer.group_ranks)) == (2, 4, [0, 6])
    scatter = next(pc for pc in plan.calls if pc.call.name == "dp.grads" and pc.call.stages == (0, 1, 2, 3))
    assert layer.call.message_bytes == scatter.call.message_bytes // 2  # the shard of the unit the group scattered
    assert layer.call.calls_per_iteration == scatter.call.calls_per_iteration
    assert not [pc for pc in _plan("1f1b", zero=3, framework="torch").calls if pc.call.name == "dp.grads.replicas"]


@pytest.mark.parametrize("sched", ["dualpipe", "dualpipev", "zbv", "zb-h1"])
def test_the_timeline_is_the_priced_order(sched, monkeypatch):
    """The compute blocks come from the order the step is priced by: the last ends at the pipeline's priced span, each
    rank's last where the step starts that rank's exposed gradient reduction (step.drain_leads_of: the order's own
    ends), and DualPipe's last rank starts direction 1 at time 0 (dualpipe.py: rank pp - 1 begins the second
    direction)."""
    seen = {}

    def spy(passes, s):
        seen["pipe"], seen["leads"] = pipeline_time(passes, s).time_s, step_module.drain_leads_of(passes, s)
        return pipeline_time(passes, s)

    monkeypatch.setattr(step_module, "pipeline_time", spy)
    plan = _plan(sched, timeline=True)
    blocks = [e for e in plan.step.timeline if e["stream"] == "compute" and e["microbatch"] >= 0]
    assert max(e["end_s"] for e in blocks) == pytest.approx(seen["pipe"], rel=1e-9)
    assert all(e["microbatches"] == 1 for e in blocks)
    for rank, lead in enumerate(seen["leads"]):  # each rank's last block ends where the step places its reduction
        last = max(e["end_s"] for e in blocks if e["stage"] == rank)
        assert last == pytest.approx(seen["pipe"] - lead, rel=1e-9)
    if sched == "dualpipe":
        first = min((e for e in blocks if e["stage"] == 3), key=lambda e: e["start_s"])
        assert (first["start_s"], first["direction"], first["name"]) == (0.0, 1, "forward")
        zero = min((e for e in blocks if e["stage"] == 0), key=lambda e: e["start_s"])
        assert (zero["start_s"], zero["direction"]) == (0.0, 0)
