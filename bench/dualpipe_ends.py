"""DualPipe's ends as the planner lays them out (review r12a #3; reproduced from the review's /tmp/r12a_dp.py and
/tmp/r12a_mem.py, mend12a). The planner lays DualPipe out as DualPipeV (planner/parallel.py rank_of: rank r holds
chunks r and 2p - 1 - r of a 2p split), so rank 0's every op carries the embedding and the head, loss and MTP, and
rank p - 1 neither. deepseek-ai/DualPipe examples/example_dualpipe.py builds rank r from stage r (one direction) and
stage p - 1 - r (the other) of a pp-stage model: ranks 0 and p - 1 each run an end on half their ops. This prints the
order's makespan as planned and with the ends split that way (rank 0's extra over a middle rank halved onto ranks 0
and p - 1, W averaged), m times the slowest rank both ways, and the ranks' parameter bytes.

    PYTHONPATH=. python bench/dualpipe_ends.py
"""

from __future__ import annotations

from dataclasses import replace

from collectives.topology import cluster_preset
from planner import Options, ParallelSpec, WorkloadSpec, build_plan, model_preset
from planner import pipeline_jitter as pj
from planner import step as step_module
from planner.pipeline import StagePass, pipeline_time


def ends(pp: int = 8, nodes: int = 8) -> dict:
    """DeepSeek-V3 at 64 layers (the review's case), pp ``pp``, m 16, ep 8 on ``nodes`` DGX H100: the figures above."""
    seen = {}

    def spy(passes, sched):
        seen["passes"], seen["sched"] = list(passes), sched
        return pipeline_time(passes, sched)

    model = replace(model_preset("deepseek-v3"), num_layers=64)
    work = WorkloadSpec(micro_batch_size=1, global_batch_size=16 * nodes, seq_length=4096)
    par = ParallelSpec(tp=1, pp=pp, dp=nodes * 8 // pp, ep=8, pipeline_schedule="dualpipe", virtual_pipeline_stages=2)
    original = step_module.pipeline_time
    step_module.pipeline_time = spy
    try:
        plan = build_plan(model, work, par, cluster_preset("dgx-h100", nodes), Options(timeline=False))
    finally:
        step_module.pipeline_time = original
    passes, sched = seen["passes"], seen["sched"]
    mid = passes[pp // 2]
    extra_f, extra_b = passes[0].forward_s - mid.forward_s, passes[0].backward_s - mid.backward_s
    split = list(passes)
    for r in (0, pp - 1):
        split[r] = StagePass(mid.forward_s + extra_f / 2, mid.backward_s + extra_b / 2, None, None,
                             (passes[0].weight_s + mid.weight_s) / 2)  # fmt: skip
    m = sched.microbatches
    return {
        "planned_s": pj.order_span(passes, sched),
        "ends_split_s": pj.order_span(split, sched),
        "m_slowest_planned_s": m * max(x.total_s for x in passes),
        "m_slowest_split_s": m * max(x.total_s for x in split),
        "params_bytes": [s.params_bytes for s in plan.memory.per_stage],
    }


if __name__ == "__main__":
    got = ends()
    print({k: v if isinstance(v, list) else round(v, 3) for k, v in got.items()})
