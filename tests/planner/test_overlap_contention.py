"""Compute slowed by the communication hidden behind it (planner/contention.py, issue 20 overlap7): the SMs an
NCCL kernel holds (its channels), TransformerEngine's userbuffers SMs under tp_comm_overlap, and the HBM the
calls' copies take; each number below is worked by hand."""

from dataclasses import replace

import pytest

from collectives.topology import cluster_preset
from collectives.topology.gpu import GPUS
from planner import Options, ParallelSpec, WorkloadSpec, build_plan, model_preset
from planner.compute import PassTime, StageCompute
from planner.contention import HBM_FLOOR, Share, compute_rate, hbm_bytes, memory_rate, slowdown_s, window_rate
from planner.context import Context
from planner.kernels import efficiency
from planner.step import FRAMEWORK_OVERLAP, StageStep, StreamTotals, _contention, _holds, _pass_exposed, stream_totals

H100 = GPUS["h100-sxm5-80gb"]  # 132 SMs, 3,350 GB/s


def test_a_gemm_beside_nccl_runs_on_the_sms_left():
    # 24 NCCL channels = 24 CTAs resident on 24 of the H100's 132 SMs: the GEMM keeps 108 of them
    assert compute_rate(H100, Share(sms=24)) == pytest.approx(108 / 132, rel=1e-15)
    # its slowdown 1/r - 1 = 24/108 = 22.2%: inside what Lee et al. 2025 (arXiv 2507.03114) measure for compute
    # overlapped with communication on 4 x A100/H100 (mean 18.9%, max 40.0%); checked, not fitted
    assert 1 / compute_rate(H100, Share(sms=24)) - 1 == pytest.approx(24 / 108, rel=1e-12)
    assert 0.0 < 24 / 108 < 0.40
    # an A100's 108 SMs beside the same 24 channels: 24/84 = 28.6%
    assert 1 / compute_rate(GPUS["a100-sxm4-80gb"], Share(sms=24)) - 1 == pytest.approx(24 / 84, rel=1e-12)
    # no SM count known: no SM term
    assert compute_rate(replace(H100, sms=0), Share(sms=24)) == 1.0


def test_memory_bound_kernels_share_hbm_with_the_copies():
    eff = efficiency(H100, None).hbm
    peak = 3350e9 * eff
    # 500 GB/s of copies leave the memory-bound kernel 1 - 500e9 / (3,350e9 x eff) of its rate
    assert memory_rate(H100, eff, Share(hbm_Bps=500e9)) == pytest.approx(1 - 500e9 / peak, rel=1e-12)
    # never below an even share of the memory controllers
    assert memory_rate(H100, eff, Share(hbm_Bps=10 * peak)) == HBM_FLOOR
    # bytes of one call: what it sends read once, what it receives written by the peer and read back
    price = type("P", (), {"bytes_sent_per_rank": 7 << 20, "bytes_received_per_rank": 7 << 20})()
    assert hbm_bytes(price) == 3 * (7 << 20)


def test_a_window_of_mixed_compute_is_the_harmonic_mix():
    eff = efficiency(H100, None).hbm
    share = Share(sms=33, hbm_Bps=0.25 * 3350e9 * eff)  # a quarter of the SMs and a quarter of the HBM
    # 60% of the window's time compute-bound at 99/132 = 0.75, 40% memory-bound at 0.75: r = 0.75
    assert window_rate(H100, eff, share, 0.6) == pytest.approx(0.75, rel=1e-12)
    share = Share(sms=33, hbm_Bps=0.5 * 3350e9 * eff)  # memory-bound at 0.5
    # a unit of work takes 0.6 / 0.75 + 0.4 / 0.5 = 1.6: r = 0.625
    assert window_rate(H100, eff, share, 0.6) == pytest.approx(1 / 1.6, rel=1e-12)
    # 10 ms hidden at r = 0.625: the compute ends 3.75 ms later; 1 ms of the call exposed absorbs 1 ms of that
    assert slowdown_s(0.010, 0.0, 0.625) == pytest.approx(0.00375, rel=1e-12)
    assert slowdown_s(0.010, 0.001, 0.625) == pytest.approx(0.00275, rel=1e-12)
    assert slowdown_s(0.010, 0.005, 0.625) == 0.0  # the call outlasts the longer compute: nothing added
    assert slowdown_s(0.0, 0.0, 0.5) == 0.0


def _stage(gemm_s: float, memory_s: float) -> StageStep:
    pass_time = PassTime(gemm_s=gemm_s, elementwise_s=memory_s)
    return StageStep(0, StageCompute(pass_time, pass_time, 0.0, 0.0))


def test_te_userbuffers_tp_overlap_holds_its_own_sms():
    """One forward's TP window by hand: Megatron + TE --tp-comm-overlap, 2 ms of ring-exchange all-gathers (copy
    engine: 0 SMs) and 2 ms of pipelined reduce-scatters (TE initialize_ub num_sm 16), all hidden behind 10 ms of
    GEMMs: on average 8 SMs held, the GEMMs at 124/132: 4 ms x 8/132 = 0.2424 ms later."""
    par = ParallelSpec(tp=8, sequence_parallel=True)
    ctx = Context(model_preset("llama3-8b"), WorkloadSpec(global_batch_size=8), par)
    totals = StreamTotals(
        time={"tp.forward": [0.004]},
        sm_time={"tp.forward": [24 * 0.004]},  # what NCCL's ring would hold: TE's table replaces it
        hbm={"tp.forward": [0.0]},
        tp_ops={"tp.forward.allgather": [0.002], "tp.forward.reducescatter": [0.002]},
    )
    st = _stage(0.010, 0.002)
    st.hidden_by_stream[("tp", "forward")] = 0.004
    flags = replace(FRAMEWORK_OVERLAP, tp_comm_overlap=True).resolved(ctx)
    _contention(st, _holds(ctx, totals, flags, 1, {"tp.forward"}, H100), flags, H100, efficiency(H100, None).hbm)
    assert st.slow_fwd_s == pytest.approx(0.004 * 8 / 132, rel=1e-12)
    assert st.slow_bwd_s == 0.0
    # the same window without TE's table (torch async TP): NCCL's 24 channels
    flags = replace(FRAMEWORK_OVERLAP, tp_comm_overlap=False).resolved(ctx)
    st2 = _stage(0.010, 0.002)
    st2.hidden_by_stream[("tp", "forward")] = 0.004
    _contention(st2, _holds(ctx, totals, flags, 1, {"tp.forward"}, H100), flags, H100, efficiency(H100, None).hbm)
    assert st2.slow_fwd_s == pytest.approx(0.004 * 24 / 132, rel=1e-12)


def test_te_bulk_wgrad_gathers_hold_sms():
    """A backward TP window by hand, Megatron + TE --tp-comm-overlap: 2 ms of ring-exchange all-gathers (proj/fc2
    dgrad: copy engine, 0 SMs), 2 ms of bulk all-gathers (qkv/fc1 dgrad, the SP input re-gathered for wgrad: TE v2.9
    initialize_ub methods["bulk"], CommOverlap num_sm 16) and 2 ms of reduce-scatters (16), all hidden behind 20 ms
    of GEMMs: on average (2 x 16 + 2 x 16) / 6 SMs held, the backward 0.064 / 132 s later. (Before the bulk
    gathers had their own key they counted as the ring's copy engine: 0.032 / 132.)"""
    par = ParallelSpec(tp=8, sequence_parallel=True)
    ctx = Context(model_preset("llama3-8b"), WorkloadSpec(global_batch_size=8), par)
    totals = StreamTotals(
        time={"tp.backward": [0.006]},
        sm_time={"tp.backward": [24 * 0.006]},
        hbm={"tp.backward": [0.0]},
        tp_ops={
            "tp.backward.allgather": [0.002],
            "tp.backward.allgather.bulk": [0.002],
            "tp.backward.reducescatter": [0.002],
        },
    )
    st = _stage(0.020, 0.002)
    st.hidden_by_stream[("tp", "backward")] = 0.006
    flags = replace(FRAMEWORK_OVERLAP, tp_comm_overlap=True).resolved(ctx)
    _contention(st, _holds(ctx, totals, flags, 1, {"tp.backward"}, H100), flags, H100, efficiency(H100, None).hbm)
    assert st.slow_bwd_s == pytest.approx(0.064 / 132, rel=1e-12)


def test_wgrad_gathers_summed_under_the_bulk_key():
    """stream_totals files the SP wgrad re-gathers (rules/tensor.py "*.wgrad_gather") under "allgather.bulk" and
    the other backward all-gathers under "allgather": each key's seconds are its calls' seconds."""
    plan = build_plan(
        model_preset("llama3-8b"),
        WorkloadSpec(global_batch_size=8),
        ParallelSpec(tp=8, dp=1, sequence_parallel=True),
        cluster_preset("dgx-h100", 1),
    )
    totals = stream_totals(plan.calls, 8, 0, 1)

    def seconds(bulk: bool) -> float:
        return sum(
            pc.call.calls_per_iteration * pc.price.time_s
            for pc in plan.calls
            if pc.call.parallelism == "tp"
            and pc.call.phase == "backward"
            and pc.call.op.value == "allgather"
            and pc.call.name.endswith(".wgrad_gather") == bulk
        )

    assert seconds(True) > 0 and seconds(False) > 0
    assert totals.tp_ops["tp.backward.allgather.bulk"][0] == pytest.approx(seconds(True), rel=1e-12)
    assert totals.tp_ops["tp.backward.allgather"][0] == pytest.approx(seconds(False), rel=1e-12)


def test_the_cp_ring_absorbs_only_its_own_exposure():
    """The CP stream reports the ring's p2p ("cp.ring") and the CP all-gather ("cp", never hidden) together; the
    ring's slowdown subtracts only the ring's own exposed part. 2.2 ms of ring behind 2 ms of attention (0.2 ms
    exposed) beside a 4 ms all-gather, the ring holding 33 of 132 SMs: 2 ms x 0.25 - 0.2 ms = 0.3 ms. (Subtracting
    the stream's 4.2 ms sum gave 0.)"""
    par = ParallelSpec(tp=1, cp=2)
    ctx = Context(model_preset("llama3-8b"), WorkloadSpec(global_batch_size=8), par)
    flags = FRAMEWORK_OVERLAP.resolved(ctx)
    st = _stage(0.010, 0.002)
    st.hidden_by_stream[("cp", "forward")] = 0.002
    st.exposed_by_stream[("cp", "forward")] = 0.004 + 0.0002  # the all-gather's 4 ms and the ring's 0.2 ms
    st.exposed_by_kind[("cp.ring", "forward")] = 0.0002
    holds = {"cp.ring.forward": [Share(sms=33)]}
    _contention(st, holds, flags, H100, efficiency(H100, None).hbm)
    assert st.slow_fwd_s == pytest.approx(0.002 * 0.25 - 0.0002, rel=1e-12)


def test_cp_exposure_recorded_per_kind():
    """_pass_exposed keeps the ring's own exposure beside the CP stream's sum: the all-gather (kind "cp") is all
    exposed, the ring (kind "cp.ring") exposes what attention (forward: 1 x attention_fwd_s) leaves."""
    par = ParallelSpec(tp=1, cp=2)
    ctx = Context(model_preset("llama3-8b"), WorkloadSpec(global_batch_size=8), par)
    flags = replace(FRAMEWORK_OVERLAP, cp_ring_overlap=True).resolved(ctx)
    st = StageStep(0, StageCompute(PassTime(gemm_s=0.010, attention_s=0.002), PassTime(gemm_s=0.020), 0.002, 0.0))
    m = ctx.micro_batches
    rows = [("cp", "cp", [0.004 * m]), ("cp.ring", "cp", [0.0025 * m])]
    exposed = _pass_exposed(ctx, st, "forward", rows, flags, False)
    ring_left = 0.0025 - st.compute.attention_fwd_s
    assert ring_left > 0
    assert exposed == pytest.approx(0.004 + ring_left, rel=1e-12)
    assert st.exposed_by_stream[("cp", "forward")] == pytest.approx(0.004 + ring_left, rel=1e-12)
    assert st.exposed_by_kind[("cp.ring", "forward")] == pytest.approx(ring_left, rel=1e-12)
    assert st.hidden_by_stream[("cp", "forward")] == pytest.approx(st.compute.attention_fwd_s, rel=1e-12)


def test_fsdp_prefetch_window_from_the_priced_calls():
    """torch FSDP2 Llama-3 8B on one DGX H100 node: the forward's parameter all-gathers hide behind the whole
    forward. By hand from the plan's own priced calls: SMs held = channels, HBM = sent + 2 x received over the
    stream's time, the window's rate the harmonic mix of (132 - channels)/132 on the GEMM/attention share and
    1 - HBM rate/(3,350 GB/s x hbm efficiency) on the memory-bound share; the forward ends hidden x (1 - r) later."""
    model = model_preset("llama3-8b")
    par = ParallelSpec(tp=1, dp=8, zero_stage=3, framework="torch")
    plan = build_plan(model, WorkloadSpec(global_batch_size=16, micro_batch_size=1), par, cluster_preset("dgx-h100", 1))
    m = 2
    gathers = [
        pc
        for pc in plan.calls
        if pc.call.parallelism == "dp" and pc.call.op.value == "allgather" and pc.call.phase == "forward"
    ]
    assert gathers and all(pc.price.channels > 0 for pc in gathers)
    seconds = sum(pc.call.calls_per_iteration * pc.price.time_s for pc in gathers)
    sm_seconds = sum(pc.call.calls_per_iteration * pc.price.time_s * pc.price.channels for pc in gathers)
    moved = sum(
        pc.call.calls_per_iteration * (pc.price.bytes_sent_per_rank + 2 * pc.price.bytes_received_per_rank)
        for pc in gathers
    )
    st = plan.step.stages[0]
    hidden = st.hidden_by_stream[("dp", "forward")]
    exposed = st.exposed_by_stream.get(("dp", "forward"), 0.0)
    assert hidden == pytest.approx(seconds / m - exposed, rel=1e-9)
    fwd = st.compute.forward
    f_c = (fwd.gemm_s + fwd.attention_s) / fwd.total_s
    r_c = (132 - sm_seconds / seconds) / 132
    r_m = max(0.5, 1 - (moved / seconds) / (3350e9 * efficiency(H100, None).hbm))
    rate = 1 / (f_c / r_c + (1 - f_c) / r_m)
    assert st.slow_fwd_s == pytest.approx(max(0.0, hidden * (1 - rate) - exposed), rel=1e-9)
    assert st.slow_fwd_s > 0
    # the reported compute is the slowed one
    assert plan.step.compute_s == pytest.approx(
        m * (fwd.total_s + st.slow_fwd_s + st.compute.backward.total_s + st.slow_bwd_s)
        + st.compute.optimizer_s
        + st.slow_dp_s,
        rel=1e-12,
    )


def test_nothing_hidden_nothing_slowed():
    """Megatron's defaults on one node with TP: nothing overlaps (overlap_grad_reduce off, tp_comm_overlap off),
    so no pass is slowed."""
    plan = build_plan(
        model_preset("llama3-8b"),
        WorkloadSpec(global_batch_size=8),
        ParallelSpec(tp=8, dp=1, sequence_parallel=True),
        cluster_preset("dgx-h100", 1),
        Options(),
    )
    st = plan.step.stages[0]
    assert st.slow_fwd_s == st.slow_bwd_s == st.slow_dp_s == 0.0
