"""mend13a (review r13a #4, #7): the SimAI, Chakra and Chrome-trace exports of a DualPipe plan read the passes the step
counts (Plan.passes: a pass over a rank's two stages is one micro-batch each way, m / 2 of them), not m: before, SimAI
and Chakra gave a DualPipe rank twice its compute and the trace put ZeRO-2's per-micro-batch gradient reduce-scatters
on a stream the step did not."""

from __future__ import annotations

from dataclasses import replace

import pytest

from collectives.topology import cluster_preset
from planner import Options, ParallelSpec, WorkloadSpec, build_plan, model_preset
from planner.exports import chakra_trace, chrome_trace, simai_workload

from .test_chakra import chakra_classes, read_trace
from .test_exports import parse_simai


def _plan(schedule: str, zero: int = 1):
    model = replace(model_preset("llama3-8b"), num_layers=8)
    work = WorkloadSpec(micro_batch_size=1, global_batch_size=32, seq_length=4096)
    par = ParallelSpec(tp=2, pp=4, dp=2, zero_stage=zero, pipeline_schedule=schedule)
    return build_plan(model, work, par, cluster_preset("dgx-h100", 2), Options())


def _step_compute_s(plan, stage: int) -> float:
    """The rank's forward and backward compute in the step: its passes x its pass (step._training's ``runs``)."""
    comp = plan.step.stages[stage].compute
    return plan.passes * (comp.forward.total_s + comp.backward.total_s)


@pytest.mark.parametrize("schedule", ["1f1b", "dualpipe"])
def test_simai_and_chakra_carry_the_steps_compute(schedule):
    """Each rank's exported compute, summed over the file (SimAI: ga x its layers' forward and input-gradient times, in
    ns; Chakra: its compute nodes, in us), is the step's within rounding: 1F1B's 16 passes and DualPipe's 8."""
    plan = _plan(schedule)
    assert (plan.num_microbatches, plan.passes) == (16, 16 if schedule == "1f1b" else 8)
    comp_type = chakra_classes()["Node"].DESCRIPTOR.fields_by_name["type"].enum_type.values_by_name["COMP_NODE"].number
    for stage in range(4):
        want = _step_compute_s(plan, stage)
        simai = parse_simai(simai_workload(plan, stage))
        assert simai["header"]["ga"] == plan.passes
        per_pass = sum(layer["times"][0] + layer["times"][1] for layer in simai["layers"]) * 1e-9
        assert simai["header"]["ga"] * per_pass == pytest.approx(want, rel=1e-4)
        _, nodes = read_trace(chakra_trace(plan, stage))
        comp = [n.duration_micros for n in nodes if n.type == comp_type]
        assert len(comp) == 2 * plan.passes and sum(comp) * 1e-6 == pytest.approx(want, rel=1e-4)


def test_the_trace_puts_zero2_gradient_reduce_scatters_where_the_step_does():
    """ZeRO-2 reduce-scatters the gradients after every backward (``step._stream``: per pass, "dp.backward"); a
    DualPipe rank's dp.grads run once a pass (8 of them at m 16) and sit in the trace's "dp backward" blocks, as
    1F1B's 16 do, not on the step-end "grad_reduce" stream."""
    blocks = {}
    for schedule in ("1f1b", "dualpipe"):
        plan = _plan(schedule, zero=2)
        grads = [pc.call.calls_per_iteration for pc in plan.calls if pc.call.name == "dp.grads"]
        assert grads and set(grads) == {plan.passes}
        events = chrome_trace(plan)["traceEvents"]
        blocks[schedule] = {
            e["name"] for e in events if any(c.get("name") == "dp.grads" for c in e.get("args", {}).get("calls", []))
        }
    assert blocks["dualpipe"] == blocks["1f1b"] == {"dp backward"}
