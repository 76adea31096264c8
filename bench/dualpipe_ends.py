"""DualPipe's ends on review r12a #3's case (DeepSeek-V3 at 64 layers, MTP 1, tp 1, pp 8, dp 8, ep 8, m 16 on 8 DGX
H100; the review's /tmp/r12a_dp.py and /tmp/r12a_mem.py). Until dualpipe13 the planner laid DualPipe out as DualPipeV
(rank 0's every op carrying the embedding and the head, loss and MTP; rank pp - 1 no end); now as
deepseek-ai/DualPipe examples/example_dualpipe.py builds it (planner/pipeline.py StageMap MIRRORED: rank r runs
stage r one way and pp - 1 - r the other of a pp-stage model held twice). This prints, for DualPipe and DualPipeV,
the order's makespan at the plan's passes (no sends), m times the slowest rank, the pipeline (with the sends), the
step, and each rank's parameter bytes; docs/step-time.md "(dualpipe13)" has them before and after.

    PYTHONPATH=. python bench/dualpipe_ends.py
"""

from __future__ import annotations

from dataclasses import replace

from collectives.topology import cluster_preset
from planner import Options, ParallelSpec, WorkloadSpec, build_plan, model_preset
from planner import pipeline_jitter as pj
from planner import step as step_module
from planner.pipeline import pipeline_time


def ends(kind: str = "dualpipe", pp: int = 8, nodes: int = 8) -> dict:
    """The figures above for ``kind`` on DeepSeek-V3 at 64 layers, pp ``pp``, m 16, ep 8 on ``nodes`` DGX H100."""
    seen = {}

    def spy(passes, sched):
        seen["passes"], seen["sched"] = list(passes), sched
        return pipeline_time(passes, sched)

    model = replace(model_preset("deepseek-v3"), num_layers=64)
    work = WorkloadSpec(micro_batch_size=1, global_batch_size=16 * nodes, seq_length=4096)
    par = ParallelSpec(tp=1, pp=pp, dp=nodes * 8 // pp, ep=8, pipeline_schedule=kind, virtual_pipeline_stages=2)
    original = step_module.pipeline_time
    step_module.pipeline_time = spy
    try:
        plan = build_plan(model, work, par, cluster_preset("dgx-h100", nodes), Options(timeline=False))
    finally:
        step_module.pipeline_time = original
    passes, sched = seen["passes"], seen["sched"]
    return {
        "order_s": pj.order_span(passes, sched),
        "m_slowest_s": sched.microbatches * max(x.total_s for x in passes),
        "pipeline_s": pipeline_time(passes, sched).time_s,
        "step_s": plan.step.time_s,
        "exposed_comm_s": plan.step.exposed_comm_s,
        "params_bytes": [s.params_bytes for s in plan.memory.per_stage],
        "optimizer_bytes": [s.optimizer_bytes for s in plan.memory.per_stage],
        # rank 0's data-parallel calls: (name, bytes per call, calls, group size, time of one call)
        "dp_calls": [
            (pc.call.name, pc.call.message_bytes, pc.call.calls_per_iteration, pc.group_size, round(pc.price.time_s, 4))
            for pc in plan.calls
            if pc.call.parallelism in ("dp", "edp") and 0 in pc.call.stages and pc.call.message_bytes > 64
        ],
    }


if __name__ == "__main__":
    for kind in ("dualpipe", "dualpipev"):
        got = ends(kind)
        print(kind, {k: v if isinstance(v, list) else round(v, 3) for k, v in got.items()})
