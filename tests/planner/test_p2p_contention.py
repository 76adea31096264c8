"""The SMs that hidden point-to-point calls and all-to-alls take from the compute beside them (issue 20, p2psm;
planner/contention.py, collectives/topology/library/p2p.py). A pass that hides h seconds of a call holding C of the
GPU's S SMs ends h x C / S later: the compute that ran beside it, W = h x (S - C) / S, took W x C / (S - C)
longer. Each number below is worked by hand."""

from dataclasses import replace

import numpy as np
import pytest

from collectives import Op
from collectives.topology import cluster_preset
from collectives.topology.gpu import GPUS
from collectives.topology.library import p2p
from collectives.topology.library import tables as T
from collectives.topology.library.graphs import Shape
from collectives.topology.library.model import Features
from planner import Options, Overlap, ParallelSpec, WorkloadSpec, build_plan, model_preset
from planner.compute import PassTime, StageCompute
from planner.contention import PP_OVERLAP_KERNELS, Share, ring_p2p_kernels, window_rate
from planner.context import Context
from planner.kernels import efficiency
from planner.layout import Group
from planner.ledger import Call, held_ctas
from planner.rules.context_parallel import kv_bytes
from planner.rules.expert import ll_sms
from planner.step import StageStep, StreamTotals, _pp_contention, stream_totals

H100 = GPUS["h100-sxm5-80gb"]  # 132 SMs
PAIR = Shape(90, 1, 2, 18 * T.nvlink_bw(90), True, 1, 0.0)  # two H100s of one DGX node (the CP ring's pairs)


def test_te_runs_the_ring_as_one_or_two_kernels():
    # TransformerEngine v2.9 context_parallel.py lines 1125-1127: batched (one kernel) only below sm 10.0 at cp 2
    assert ring_p2p_kernels(90, 2) == 1
    assert ring_p2p_kernels(90, 4) == 2
    assert ring_p2p_kernels(100, 2) == 2
    assert PP_OVERLAP_KERNELS == 2  # Megatron _p2p_ops: an isend and an irecv kernel


@pytest.mark.parametrize("cp", [2, 4])
def test_the_hidden_cp_ring_slows_the_attention_by_its_ctas(cp):
    """Llama 3 8B, 32k tokens, cp on one DGX H100 (dp fills the node): the ring's KV exchange (2 x 32768 / cp x 8
    KV heads x 128 x 2 B) between two H100s of the node runs on 16 p2p channels (a pair's nChannelsMin, 64 KiB
    to 16 MiB parts): one kernel at cp 2, an isend and an irecv kernel at cp 4. Hidden behind attention, the
    forward ends hidden x C / 132 later, less what of the ring stays exposed."""
    model = replace(model_preset("llama3-8b"), seq_length=32768)
    par = ParallelSpec(tp=1, cp=cp, dp=8 // cp, zero_stage=1)
    plan = build_plan(model, WorkloadSpec(global_batch_size=8 // cp), par, cluster_preset("dgx-h100"))
    ctx = Context(model, WorkloadSpec(global_batch_size=8 // cp), par)
    ring = [pc for pc in plan.calls if pc.call.op.value == "sendrecv" and pc.call.parallelism == "cp"]
    assert ring and {pc.call.message_bytes for pc in ring} == {kv_bytes(ctx)} == {2 * 32768 // cp * 8 * 128 * 2}
    ctas = p2p.sendrecv_ctas(PAIR, Features(), kv_bytes(ctx))
    assert ctas == 16
    assert {pc.price.channels for pc in ring} == {ctas}
    held = ctas * ring_p2p_kernels(90, cp)
    st = plan.step.stages[0]
    hidden = st.hidden_by_stream[("cp", "forward")]
    exposed = st.exposed_by_kind.get(("cp.ring", "forward"), 0.0)
    assert hidden > 0
    # nothing else hides in the forward (tp 1, no EP, the DP reduction is once per iteration)
    assert set(st.hidden_by_stream) <= {("cp", "forward"), ("cp", "backward")}
    assert st.slow_fwd_s == pytest.approx(max(0.0, hidden * held / 132 - exposed), rel=1e-12)
    if not exposed:
        beside = hidden * (132 - held) / 132  # the attention work done beside the ring
        assert st.slow_fwd_s == pytest.approx(beside * held / (132 - held), rel=1e-12)


def _stage(gemm_s: float) -> StageStep:
    pass_time = PassTime(gemm_s=gemm_s)
    return StageStep(0, StageCompute(pass_time, pass_time, 0.0, 0.0))


def test_pipeline_sends_hidden_under_overlap_p2p():
    """Interleaved 1F1B with --overlap-p2p-communication, v = 3 chunks: every pass of every chunk runs beside one
    boundary send's time (0.7 ms) of a send and a recv kernel of 4 p2p channels each (a pair across nodes, v2.30).
    A pass of GEMMs only: it ends 3 x 0.7 ms x 8 / 132 later; its HBM share is not read (compute-bound)."""
    par = ParallelSpec(pp=2, dp=1, pipeline_schedule="interleaved", virtual_pipeline_stages=3)
    ctx = Context(model_preset("llama3-8b"), WorkloadSpec(global_batch_size=8), par)
    totals = StreamTotals(send_s=0.0007, send_held=(4, 3 * (32 << 20)))
    st = _stage(0.050)
    _pp_contention(ctx, totals, [st], H100, efficiency(H100, None).hbm)
    assert st.slow_fwd_s == pytest.approx(3 * 0.0007 * 8 / 132, rel=1e-12)
    assert st.slow_bwd_s == pytest.approx(3 * 0.0007 * 8 / 132, rel=1e-12)
    # a pass shorter than the sends it hides: only its own length runs beside them
    short = _stage(0.001)
    _pp_contention(ctx, totals, [short], H100, efficiency(H100, None).hbm)
    assert short.slow_fwd_s == pytest.approx(0.001 * 8 / 132, rel=1e-12)


def test_overlap_p2p_slows_the_passes_of_a_plan():
    """The same plan with and without --overlap-p2p-communication: the steady-state sends stop costing the
    pipeline their time and start holding SMs beside every pass (the plan's longest boundary send's channels)."""
    model = model_preset("llama3-8b")
    par = ParallelSpec(tp=4, pp=4, dp=1, pipeline_schedule="interleaved", virtual_pipeline_stages=2)
    work = WorkloadSpec(global_batch_size=16)
    on = build_plan(model, work, par, cluster_preset("dgx-h100", 2))
    sends = [pc for pc in on.calls if pc.call.parallelism == "pp" and pc.call.op.value == "sendrecv"]
    assert sends and all(pc.price.channels > 0 for pc in sends)
    longest = max(sends, key=lambda pc: pc.price.time_s)
    st = on.step.stages[1]
    assert not st.hidden_by_stream  # nothing else hides in a pass (no tp_comm_overlap, no CP, no EP)
    # each pass runs beside v = 2 sends' time of a send and a recv kernel of the longest send's channels, its
    # compute-bound and memory-bound shares slowed by their SM and HBM terms
    t, held = longest.price.time_s, longest.price.channels
    moved = longest.price.bytes_sent_per_rank + 2 * longest.price.bytes_received_per_rank
    share = Share(2.0 * held, moved / t)
    for whole, slow in ((st.compute.forward, st.slow_fwd_s), (st.compute.backward, st.slow_bwd_s)):
        bound = (whole.gemm_s + whole.attention_s) / whole.total_s
        rate = window_rate(H100, efficiency(H100, None).hbm, share, bound)
        assert 0 < slow == pytest.approx(min(2 * t, whole.total_s) * (1 - rate), rel=1e-12)
        # no cheaper than the SM term alone on the pass's compute-bound share
        assert slow >= min(2 * t, whole.total_s) * bound * 2 * held / 132 * (1 - 1e-9)
    off_flags = Options(overlap=replace(Options().overlap, overlap_p2p=False))
    off = build_plan(model, work, par, cluster_preset("dgx-h100", 2), off_flags)
    assert off.step.stages[1].slow_fwd_s == 0.0


def test_deepep_legs_hold_their_kernels_sms_once():
    """DeepEP's normal dispatch runs its RDMA and NVLink legs in one kernel of Buffer.num_sms = 20 SMs
    (Megatron-LM 92c8482e6d moe_deepep_num_sms): over the longest leg's time the stream holds 20 SMs, not the
    legs' sum and not NCCL's channels (which its price may carry)."""
    price = type("P", (), {"channels": 32, "bytes_sent_per_rank": 0, "bytes_received_per_rank": 0, "time_s": 0.0})

    def leg(name, t):
        call = Call(
            name=name, op=Op.ALLTOALL, phase="forward", message_bytes=1, calls_per_iteration=2, stages=(0,),
            group=Group(("ep",), expert=True), source="test", parallelism="ep", kernel="ep.dispatch", sms=20,
        )  # fmt: skip
        p = price()
        p.time_s = t
        return type("PC", (), {"call": call, "price": p})()

    totals = stream_totals([leg("ep.dispatch.rdma", 0.003), leg("ep.dispatch.nvlink", 0.001)], 1, 1, 1)
    assert totals.sm_time["ep.forward"] == [pytest.approx(20 * 2 * 0.003, rel=1e-12)]
    assert totals.time["ep.forward"] == [pytest.approx(2 * 0.003, rel=1e-12)]


def test_deepep_plans_report_their_own_sms():
    """A DeepEP plan's legs report 20 (DeepEP) and a HybridEP plan's 16 as their channels, the collective
    all-to-all its NCCL CTAs."""
    model = model_preset("deepseek-v3")
    work = WorkloadSpec(global_batch_size=16)
    for dispatch, sms in (("deepep", 20), ("hybridep", 16)):
        par = ParallelSpec(tp=1, pp=1, dp=16, ep=16, zero_stage=1, ep_dispatch=dispatch)
        plan = build_plan(model, work, par, cluster_preset("dgx-h100", 2))
        legs = [pc for pc in plan.calls if pc.call.name.startswith(("ep.dispatch.", "ep.combine."))]
        legs = [pc for pc in legs if pc.call.name.endswith((".rdma", ".nvlink"))]
        assert legs and {pc.channels for pc in legs} == {sms}, dispatch


def test_deepep_low_latency_kernels_hold_one_block_per_expert():
    """DeepEP's low-latency dispatch launches ceil(E / ceil(E / S)) blocks (internode_ll.cu lines 564-570): E for
    Mixtral's 8 experts on an H100 (8 <= 132), not NCCL's all-to-all channels."""
    par = ParallelSpec(dp=8, ep=8, ep_dispatch="deepep_ll")
    work = WorkloadSpec(kind="inference", phase="decode", batch_size=64, context_length=4096)
    plan = build_plan(model_preset("mixtral-8x7b"), work, par, cluster_preset("dgx-h100"))
    ll = [pc for pc in plan.calls if pc.call.name.endswith(".ll")]
    assert ll and {pc.channels for pc in ll} == {pc.call.sms for pc in ll} == {8}


def nccl_alltoall_ctas(pc, preset: str) -> int:
    """NCCL's all-to-all CTAs on the call's first group (what its price says NCCL would launch)."""
    from collectives.topology import cluster_for
    from collectives.topology.library.pricer import features_of, shape_of

    cluster = cluster_for(cluster_preset(preset))
    shape = shape_of(cluster, np.array(pc.group_devices))
    return p2p.alltoall_ctas(shape, features_of(cluster), pc.call.message_bytes)


@pytest.mark.parametrize(
    "experts, preset, blocks",
    [
        (256, "dgx-h100", 128),
        (160, "dgx-h100", 80),
        (256, "dgx-b200", 128),
        (128, "dgx-h100", 128),
        (136, "dgx-h100", 68),
    ],
)
def test_deepep_low_latency_blocks_past_the_sm_count(experts, preset, blocks):
    """DeepEP 4e38d1d internode_ll.cu 564-570: num_warp_groups = ceil(E / S), num_sms = ceil(E / num_warp_groups),
    S the GPU's SMs (132 on an H100, 148 on a B200): 256 -> ceil(256 / 2) = 128, 160 -> 80, 136 -> 68, 128 -> 128; not E
    (review r8a finding 2), which past S held the whole GPU."""
    base = model_preset("deepseek-v3")
    model = replace(base, moe=replace(base.moe, num_experts=experts))
    par = ParallelSpec(dp=8, ep=8, ep_dispatch="deepep_ll")
    work = WorkloadSpec(kind="inference", phase="decode", batch_size=64, context_length=4096)
    plan = build_plan(model, work, par, cluster_preset(preset))
    ll = [pc for pc in plan.calls if pc.call.name.endswith(".ll")]
    assert ll and {pc.channels for pc in ll} == {pc.call.sms for pc in ll} == {blocks}
    # one home for "its own SMs, not NCCL's CTAs" (ledger.held_ctas, review r8a finding 6): the price keeps NCCL's
    # all-to-all channels; the report and the step read the call's SMs through the rule
    assert all(pc.price.channels == nccl_alltoall_ctas(pc, preset) != blocks for pc in ll)
    assert {held_ctas(pc.call, pc.price.channels) for pc in ll} == {blocks}
    # unknown SMs (a Context without the cluster's GPU): E, as before
    assert ll_sms(Context(model, work, par)) == experts


@pytest.mark.parametrize(
    "framework, cp, kernels", [("megatron", 2, 1), ("megatron", 4, 2), ("torch", 2, 1), ("torch", 4, 1)]
)
def test_only_te_runs_the_ring_as_two_kernels(framework, cp, kernels):
    """The CP ring's stream (cp.ring.*) on an H100: TransformerEngine's isend + irecv kernels at cp > 2 (contention.
    ring_p2p_kernels); torch's ring attention rotates K/V with one all_to_all_single (its _AllToAllRotater's
    permute_tensor), one kernel at any cp (review r8a finding 3): 16 channels held for 1 ms -> 16 or 32 SMs."""
    from planner.step import _holds

    par = ParallelSpec(framework=framework, cp=cp, dp=8 // cp)
    ctx = Context(model_preset("llama3-8b"), WorkloadSpec(global_batch_size=8), par)
    totals = StreamTotals(time={"cp.ring.forward": [0.001]}, sm_time={"cp.ring.forward": [16 * 0.001]},
                          hbm={"cp.ring.forward": [0.0]})  # fmt: skip
    share = _holds(ctx, totals, Overlap().resolved(ctx), 1, {"cp.ring.forward"}, H100)["cp.ring.forward"][0]
    assert share.sms == pytest.approx(16 * kernels, rel=1e-12)
