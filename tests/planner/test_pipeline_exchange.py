"""The pipeline's steady-state exchanges when its sends do not overlap (planner/pipeline.py steady_wait): 1F1B's two
one-way crossings a micro-batch; Megatron's interleaved schedule, one two-way exchange per chunk forward + backward
(send_forward_backward_recv_forward_backward, schedules.py at 6985e58 and d98e8a6), so v of them a micro-batch,
each sending both tensors through the rank's one egress and, under Megatron-LM 2021's scatter/gather, gathering
both received tensors over TP (p2p_communication.py _communicate at 6985e58). Closed forms on the ledger's own
prices (tests/app/test_pipeline_exchange_http.py: the same over HTTP)."""

from dataclasses import replace

import pytest

from collectives.topology import cluster_preset
from planner import Options, Overlap, ParallelSpec, WorkloadSpec, build_plan, flavours, model_preset
from planner.flavours.megatron_lm import FLAVOUR as MEGATRON_LM
from planner.pipeline import Schedule, StagePass, pipeline_time, steady_wait
from tests.flavour_variants import flavour_variant

PASSES = [StagePass(1.0, 2.0), StagePass(1.5, 2.5), StagePass(1.0, 2.0), StagePass(1.0, 2.0)]


@pytest.mark.parametrize("v", [2, 3, 4])
def test_interleaved_two_way_closed_form(v):
    """m (t_max + v x) + bubble + 2 (p - 1) c, x the two-way exchange; 1F1B's pairs 2c; overlap_p2p none."""
    c, x, m, p = 0.01, 0.03, 8, 4
    two = Schedule("interleaved", p, m, v, c, False, x)
    one = Schedule("interleaved", p, m, v, c, False)
    assert steady_wait(two) == pytest.approx(v * x) and steady_wait(one) == pytest.approx(2 * c)
    assert steady_wait(replace(two, overlap_p2p=True)) == 0.0 == steady_wait(replace(two, stages=1))
    t_max, bubble = 4.0, sum((f + b) / v for f, b in [(1.0, 2.0)] * 3)  # the three other ranks' ends, even chunks
    assert pipeline_time(PASSES, two).time_s == pytest.approx(m * (t_max + v * x) + bubble + 2 * (p - 1) * c)
    assert pipeline_time(PASSES, two).time_s - pipeline_time(PASSES, one).time_s == pytest.approx(m * (v * x - 2 * c))


# GPT-3 175B's width on 4 layers, TP8 x PP2 on two DGX A100 (the pipeline crosses the nodes' NICs), 2 chunks a rank
GPT = replace(model_preset("gpt3-175b"), num_layers=4)
WORK = WorkloadSpec(micro_batch_size=1, global_batch_size=8, activation_recompute="full", attention_kernel="unfused")
NO_OVERLAP = Options(overlap=Overlap(overlap_p2p=False), timeline=False)


def _plan(framework, schedule="interleaved", v=2):
    par = ParallelSpec(tp=8, pp=2, dp=1, pipeline_schedule=schedule, virtual_pipeline_stages=v, framework=framework)
    if schedule != "interleaved":
        par = replace(par, virtual_pipeline_stages=None)
    return build_plan(GPT, WORK, par, cluster_preset("dgx-a100", 2), NO_OVERLAP)


def _price(plan, name):
    return max(pc.price.time_s for pc in plan.calls if pc.call.name == name)


@pytest.fixture
def one_way():
    """Megatron-LM 2021 as if its interleaved steady state ran two one-way crossings a micro-batch."""
    with flavour_variant(MEGATRON_LM, "one-way", two_way_exchange_schedules=frozenset()) as name:
        yield name


def test_megatron_lm_interleaved_pays_v_two_way_exchanges(one_way):
    """Per micro-batch v (2 s + 2 g) instead of 2 (s + g): s the send of A/t (scatter/gather), g its TP all-gather,
    both priced in the plan's own ledger; m = 8 micro-batches, v = 2, so the step is 8 (4 s + 4 g - 2 s - 2 g) =
    16 (s + g) longer."""
    two, one = _plan("megatron-lm-2021"), _plan(one_way)
    s, g = _price(two, "pp.activation"), _price(two, "pp.gather")
    assert s > 1e-4 and g > 1e-4  # 6.3 MB over an HDR NIC; a 50 MB gather over NVLink
    assert {pc.call.name: pc.price.time_s for pc in two.calls} == {pc.call.name: pc.price.time_s for pc in one.calls}
    assert two.step.time_s - one.step.time_s == pytest.approx(8 * (2 * (2 * s + 2 * g) - 2 * (s + g)), rel=1e-9)
    assert two.step.exposed_comm_s - one.step.exposed_comm_s == pytest.approx(16 * (s + g), rel=1e-9)


def test_1f1b_and_overlapped_sends_are_unchanged(one_way):
    """1F1B's steady state is two one-way exchanges in both; with overlap_p2p nothing waits in the steady state."""
    assert _plan("megatron-lm-2021", "1f1b").step.time_s == _plan(one_way, "1f1b").step.time_s
    par = ParallelSpec(tp=8, pp=2, dp=1, pipeline_schedule="interleaved", virtual_pipeline_stages=2)
    overlapped = Options(overlap=Overlap(overlap_p2p=True), timeline=False)
    a100 = cluster_preset("dgx-a100", 2)
    lm, toy = (
        build_plan(GPT, WORK, replace(par, framework=f), a100, overlapped) for f in ("megatron-lm-2021", one_way)
    )
    assert lm.step.time_s == toy.step.time_s < _plan("megatron-lm-2021").step.time_s


def test_megatron_core_without_scatter_gather_doubles_its_send(one_way):
    """Megatron-Core's interleaved schedule runs the same two-way exchange (schedules.py d98e8a6 l. 1900-1940) with
    full tensors and no gathers: v x 2 s a micro-batch against 2 s."""
    core = _plan("megatron")
    s = _price(core, "pp.activation")
    assert not any(pc.call.name == "pp.gather" for pc in core.calls)
    flavours.register(
        replace(flavours.flavour("megatron"), name="core-one-way", two_way_exchange_schedules=frozenset())
    )
    try:
        base = _plan("core-one-way")
    finally:
        flavours.unregister("core-one-way")
    assert core.step.time_s - base.step.time_s == pytest.approx(8 * (2 * 2 * s - 2 * s), rel=1e-9)
