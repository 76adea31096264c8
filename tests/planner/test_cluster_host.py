"""The host CPU as a trait of the cluster's node (issue 20, grace9): cluster.cpu_vendor -> GPUSpec.host_cpu ->
planner/kernels.py HOST_CPUS, whose per-op factor scales eager PyTorch's host costs (the dispatch floor cpu_op_s, a
flavour's own eager host_launch_s: torchtitan's) and nothing a CUDA graph replays; Megatron-Core's measured
host_launch_s (its local layer on a Xeon VM, applied to TransformerEngine's kernel list) is kept on every host
(docs/step-time.md "Host CPUs and torchtitan's sync (grace9)"). Grace's factor: TransformerEngine issue 2053's
torch.nn.Linear forward CPU time, 37.08 us (GB200) and 33.17 us (GH200) against 13.48 us on an H100 DGX's Xeon
Platinum 8480C."""

from dataclasses import replace

import pytest

from collectives.topology import cluster_preset
from collectives.topology.gpu import GPUS
from collectives.topology.presets import PRESETS
from collectives.topology.spec import CPU_VENDORS
from planner import ParallelSpec, WorkloadSpec, build_plan, model_preset
from planner.compute import layer_pass
from planner.context import Context
from planner.kernels import (
    EFFICIENCY,
    HOST_CPUS,
    gpu_efficiency,
    host_efficiency,
    host_sync,
    kernel_constants,
    layer_kernels,
    queue_launch_s,
)

GRACE = (37.08 + 33.17) / 2 / 13.48  # TE issue 2053: the two Grace systems' mean over the Xeon 8480C
QWEN3 = model_preset("qwen3-30b-a3b")


def test_every_cpu_vendor_has_a_host_trait_with_its_source():
    assert set(HOST_CPUS) == set(CPU_VENDORS)
    assert HOST_CPUS["intel"].per_op == HOST_CPUS["amd"].per_op == 1.0
    grace = HOST_CPUS["arm"]
    assert "Grace" in grace.name and "Neoverse V2" in grace.name and "2053" in grace.source
    assert grace.per_op == round(GRACE, 2) == 2.61
    # the two systems' own ratios bracket it: 2.75 (GB200) and 2.46 (GH200)
    assert round(37.08 / 13.48, 2) == 2.75 and round(33.17 / 13.48, 2) == 2.46


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_each_preset_gpu_carries_its_nodes_host(name):
    cluster = cluster_preset(name, 2 if name != "tpu-torus" else 8)
    assert cluster.gpu.host_cpu == cluster.cpu_vendor
    grace = name in ("gb200-nvl72", "gb300-nvl72", "gh200")
    assert (cluster.cpu_vendor == "arm") == grace
    eff = gpu_efficiency(cluster.gpu)
    f = 2.61 if grace else 1.0
    assert eff.host_per_op == f
    assert eff.cpu_op_s == pytest.approx(f * 1e-5) and eff.host_launch_s == 38.2e-6 == EFFICIENCY.host_launch_s


def test_the_cluster_is_the_one_source_of_the_host():
    """A cluster whose cpu_vendor is changed re-labels its GPU; a bare GPU (no cluster) is on the x86 reference."""
    gb200 = cluster_preset("gb200-nvl72", 1)
    x86 = replace(gb200, cpu_vendor="intel")
    assert x86.gpu.host_cpu == "intel" and gpu_efficiency(x86.gpu) is EFFICIENCY
    assert GPUS["gb200-186gb"].host_cpu == "intel" and host_efficiency("intel") is EFFICIENCY
    assert gb200.gpu != x86.gpu and hash(gb200.gpu) != hash(x86.gpu)  # the planner's memos tell them apart


def _qwen3(framework="megatron", ep=8, **work):
    w = WorkloadSpec(micro_batch_size=1, global_batch_size=64, seq_length=4096, **work)
    return Context(QWEN3, w, ParallelSpec(dp=8, ep=ep, framework=framework))


def test_grace_against_x86_closed_form_on_a_synced_torchtitan_layer():
    """Qwen3-30B-A3B ep 8 under torchtitan on a B200 of GB200 (bf16, 4,096 tokens): its 40 forward launches at
    26.1 us (torch's own, x86) leave the layer GPU-bound on a Xeon (1.802 ms; 1.777 before blackwell13 priced the
    GB200's GEMMs at its own measured ceiling, 0.699 bf16 for Blackwell's 0.733, 1.795 before mend13b fitted it on the
    compute-bound shapes, 0.685); at 2.61 x 26.1 = 68.1 us on Grace
    the host is the bound: the period from sync to sync is its launches x that and the sync's own GPU work (a small
    device-to-host copy, kernel_s), 2.730 ms. Megatron's measured per-launch cost is the same on both hosts."""
    ctx = _qwen3("torch")
    arm = cluster_preset("gb200-nvl72", 1).gpu
    x86 = replace(arm, host_cpu="intel")
    out = {}
    for gpu in (x86, arm):
        eff = gpu_efficiency(gpu)
        lk = layer_kernels(ctx, True, gpu, eff)
        assert host_sync(ctx, lk.forward) is not None
        fwd = layer_pass(ctx, lk, eff)
        out[gpu.host_cpu] = (sum(k.count for k in lk.forward), queue_launch_s(ctx, eff), fwd.total_s)
    (n, c_x86, x86_s), (n_arm, c_arm, arm_s) = out["intel"], out["arm"]
    assert n == n_arm == 40 and c_x86 == 26.1e-6 and c_arm == pytest.approx(2.61 * 26.1e-6)
    assert arm_s == pytest.approx(n * c_arm + EFFICIENCY.kernel_s)  # host-bound: H_n + the sync's own GPU time
    assert x86_s > n * c_x86 and (round(x86_s * 1e3, 3), round(arm_s * 1e3, 3)) == (1.802, 2.730)
    meg = gpu_efficiency(arm)
    assert queue_launch_s(_qwen3(), meg) == queue_launch_s(_qwen3(), gpu_efficiency(x86)) == 38.2e-6


def test_a_calibrated_host_launch_replaces_the_scaled_one_as_given():
    """The user's own host_launch_s was read on their host: not scaled again; the eager floor still is."""
    arm = cluster_preset("gb200-nvl72", 1).gpu
    given = replace(arm, kernel_constants=kernel_constants({"host_launch_s": 2e-5}))
    eff = gpu_efficiency(given)
    assert eff.host_launch_s == 2e-5 and eff.host_launch_given and eff.cpu_op_s == pytest.approx(2.61e-5)
    assert queue_launch_s(_qwen3(), eff) == 2e-5
    assert queue_launch_s(_qwen3("torch"), eff) == 2e-5  # a flavour's own default gives way to the user's


def test_cuda_graph_replays_do_not_see_the_host():
    """Under CUDA graphs no op is launched from Python: no per-kernel floor, no synced queue. The same GB200 plan on
    a Grace and on a Xeon host is the same step, to the bit; eager, Grace's is slower."""
    model = model_preset("llama3-8b")
    par = ParallelSpec(dp=8)
    grace = cluster_preset("gb200-nvl72", 1)
    grace = replace(grace, devices_per_node=8, nics_per_node=8)
    xeon = replace(grace, cpu_vendor="intel")
    for graphs in (True, False):
        work = WorkloadSpec(micro_batch_size=1, global_batch_size=16, seq_length=2048, cuda_graphs=graphs)
        a, b = (build_plan(model, work, par, c).step.time_s for c in (grace, xeon))
        assert (a == b) if graphs else (a > b)
