"""torchtitan's count sync over ep > 1 (issue 20, grace9): its AllToAllTokenDispatcher copies the all-to-all's output
splits to the host blocking (torchtitan b5bcd76c6 token_dispatcher.py _sync_token_count_exchange, l. 301-305), so an
ep > 1 MoE layer's forward runs through the two queues of planner/host.py, at torch's own host time per launch
(Flavour.host_launch_s: 26.1 us, the median host-bound gap of this project's eager MoE trace, which the trace fit
itself reads: tests/planner/test_trace_fit_host.py), on the node's host (HOST_CPUS), not at Megatron-Core's 38.2 us."""

from dataclasses import replace
from pathlib import Path

import pytest

from collectives.topology import cluster_preset
from collectives.topology.gpu import GPUS
from planner import ParallelSpec, WorkloadSpec, model_preset
from planner.compute import layer_pass, pass_time
from planner.context import Context
from planner.flavours import megatron, torch
from planner.host import free_running, synced_period
from planner.kernels import (
    COUNT_SYNC,
    EFFICIENCY,
    gpu_efficiency,
    gpu_seconds,
    host_sync,
    layer_kernels,
    queue_launch_s,
)
from planner.profile_trace import load_trace
from planner.trace_fit import host_launch

H100 = GPUS["h100-sxm5-80gb"]
QWEN3 = model_preset("qwen3-30b-a3b")
TRACE = Path(__file__).resolve().parents[1] / "reference" / "kernels" / "h200" / "trace_qwen3_235b.ep1.s2048.json.gz"


def titan(ep=8, **work):
    w = WorkloadSpec(micro_batch_size=1, global_batch_size=64, seq_length=4096, **work)
    return Context(QWEN3, w, ParallelSpec(dp=8, ep=ep, framework="torch"))


def test_the_flavours_say_who_syncs_and_at_what_host_cost():
    t, m = torch.FLAVOUR, megatron.FLAVOUR
    assert t.dispatch_count_sync and t.count_sync_needs_ep and t.count_sync_after_permute
    assert m.dispatch_count_sync and not m.count_sync_needs_ep and not m.count_sync_after_permute
    assert torch.FLAVOUR.host_launch_s == 26.1e-6 and megatron.FLAVOUR.host_launch_s == 0.0


def test_torch_own_host_cost_is_the_eager_moe_traces():
    """The constant is what POST /v1/calibrate reads off the committed eager MoE trace (71 gaps, median 26.1 us)."""
    host = host_launch(load_trace(TRACE.read_bytes()))
    assert host.gaps == 71 and round(host.host_launch_s * 1e6, 1) == round(torch.FLAVOUR.host_launch_s * 1e6, 1)


def test_an_ep8_titan_layer_syncs_and_runs_through_the_hosts_queue():
    """Qwen3-30B-A3B ep 8 under torchtitan: the forward lists the sync and is the two queues' period at 26.1 us a
    launch; the backward (no sync) the slower queue; ep 1 (LocalTokenDispatcher) has no sync and keeps the floors."""
    ctx = titan()
    lk = layer_kernels(ctx, True, H100)
    sync = host_sync(ctx, lk.forward)
    names = [k.name for k in lk.forward]
    # _local_reorder, then the blocking copy, which drains the stream: the sync follows the permute, nothing queued
    assert sync == (names.index("permute") + 1, 0) and names[sync[0]] == COUNT_SYNC
    c = queue_launch_s(ctx, EFFICIENCY)
    assert c == 26.1e-6
    fwd, bwd = (layer_pass(ctx, lk, EFFICIENCY, backward=b) for b in (False, True))
    launches = [(c, gpu_seconds(k), k.count) for k in lk.forward]
    assert fwd.total_s == pytest.approx(synced_period(launches, *sync), rel=1e-12)
    assert bwd.total_s == pytest.approx(free_running([(c, gpu_seconds(k), k.count) for k in lk.backward]), rel=1e-12)
    one = titan(ep=1)
    lk1 = layer_kernels(one, True, H100)
    assert host_sync(one, lk1.forward) is None and COUNT_SYNC not in [k.name for k in lk1.forward]
    assert layer_pass(one, lk1, EFFICIENCY) == pass_time(lk1.forward)


def test_torch_host_cost_scales_with_the_nodes_host_and_gives_way_to_a_calibrated_one():
    ctx = titan()
    grace = gpu_efficiency(cluster_preset("gb200-nvl72", 1).gpu)
    assert queue_launch_s(ctx, grace) == pytest.approx(26.1e-6 * 2.61)
    mine = replace(EFFICIENCY, host_launch_s=1.5e-5, host_launch_given=True)
    assert queue_launch_s(ctx, mine) == 1.5e-5
    # Megatron keeps Efficiency's own (its measured layer on TE's kernel list; docs/step-time.md grace9)
    meg = Context(QWEN3, ctx.work, ParallelSpec(dp=8, ep=8))
    assert queue_launch_s(meg, EFFICIENCY) == queue_launch_s(meg, grace) == 38.2e-6  # kept on every host


def test_cuda_graphs_or_a_capacity_factor_leave_no_sync():
    graphs = titan(cuda_graphs=True)
    assert host_sync(graphs, layer_kernels(graphs, True, H100).forward) is None
    padded = Context(replace(QWEN3, moe=replace(QWEN3.moe, capacity_factor=1.0)), titan().work, titan().par)
    assert COUNT_SYNC not in [k.name for k in layer_kernels(padded, True, H100).forward]
