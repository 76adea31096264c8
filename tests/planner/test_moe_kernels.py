"""What a Megatron-Core MoE layer launches beyond the ideal grouped kernel (planner/kernels.py, issue 20): one cuBLAS
GEMM per local expert over TransformerEngine's 4 streams, the host sync for the experts' row counts, and the
alltoall dispatcher's chunk re-ordering copies."""

from dataclasses import replace

import pytest

from collectives.topology.gpu import GPUS
from planner import ParallelSpec, WorkloadSpec, model_preset
from planner.context import Context
from planner.flavours import megatron
from planner.kernels import EFFICIENCY, expert_rows, gemm_time, layer_kernels, streamed_gemm_time

H100 = GPUS["h100-sxm5-80gb"]
QWEN3 = model_preset("qwen3-30b-a3b")  # 128 experts of width 768, top-8, h 2048


def qwen3(framework="megatron", ep=8, dp=8, **par):
    work = WorkloadSpec(micro_batch_size=1, global_batch_size=64 * dp // 8, seq_length=4096)
    return Context(QWEN3, work, ParallelSpec(dp=dp, ep=ep, framework=framework, **par))


def by_name(kernels):
    return {k.name: k for k in kernels}


def test_per_expert_gemms_run_in_waves_of_the_streams():
    """16 GEMMs over 4 streams: 4 waves, each the time of 4 concurrent GEMMs sharing the SMs (one fixed cost each);
    15 GEMMs: 3 full waves and one of 3; as many streams as GEMMs, or 0 streams: the one grouped kernel."""
    rows16 = (2048.0,) * 16
    wave = gemm_time(rows16[:4], 1536.0, 2048.0, "bf16", H100, EFFICIENCY)
    assert streamed_gemm_time(rows16, 1536.0, 2048.0, "bf16", H100, EFFICIENCY, 4) == pytest.approx(4 * wave)
    three = gemm_time(rows16[:3], 1536.0, 2048.0, "bf16", H100, EFFICIENCY)
    got = streamed_gemm_time(rows16[:15], 1536.0, 2048.0, "bf16", H100, EFFICIENCY, 4)
    assert got == pytest.approx(3 * wave + three)
    grouped = gemm_time(rows16, 1536.0, 2048.0, "bf16", H100, EFFICIENCY)
    assert streamed_gemm_time(rows16, 1536.0, 2048.0, "bf16", H100, EFFICIENCY, 0) == grouped
    assert streamed_gemm_time(rows16[:4], 1536.0, 2048.0, "bf16", H100, EFFICIENCY, 4) == wave
    # 3 more fixed costs than the grouped kernel, and a lower SM fill per wave: slower, by more than 3 fixed costs
    assert 4 * wave > grouped + 3 * EFFICIENCY.gemm_fixed_s


def test_megatron_launches_a_gemm_per_local_expert_and_syncs_for_the_counts():
    """Qwen3-30B-A3B at ep 8 under Megatron: 16 local experts, so each expert GEMM (forward, dgrad, wgrad) is 16
    launches timed as 4 waves; the forward starts the experts with one host sync (cpu_op_s); torchtitan's
    torch._grouped_mm is one kernel and needs no sync; a capacity factor (fixed shapes) needs no sync either."""
    assert megatron.FLAVOUR.expert_gemm_streams == 4
    c = qwen3()
    rows, local = expert_rows(c)
    assert local == 16
    lk = layer_kernels(c, True, H100)
    fwd, bwd = by_name(lk.forward), by_name(lk.backward)
    fc1 = fwd["experts_fc1"]
    assert fc1.count == 16 and fc1.shape[3] == 16
    r = (round(rows, 3),)
    assert fc1.time_s == pytest.approx(4 * gemm_time(r * 4, 1536.0, 2048.0, "bf16", H100, EFFICIENCY))
    assert bwd["experts_fc2.wgrad"].count == 16
    assert fwd["expert_counts_sync"].time_s == EFFICIENCY.cpu_op_s
    names = [k.name for k in lk.forward]
    assert names.index("expert_counts_sync") < names.index("permute") < names.index("experts_fc1")
    titan = by_name(layer_kernels(qwen3("torch"), True, H100).forward)
    assert titan["experts_fc1"].count == 1 and "expert_counts_sync" not in titan
    assert titan["experts_fc1"].time_s < fc1.time_s
    padded = Context(replace(QWEN3, moe=replace(QWEN3.moe, capacity_factor=1.0)), c.work, c.par)
    assert "expert_counts_sync" not in by_name(layer_kernels(padded, True, H100).forward)


def test_alltoall_dispatcher_sorts_the_received_chunks_by_expert():
    """The alltoall dispatcher's sort_chunks_by_idxs copies: forward 2·(2h + 4)·R bytes (rows and fp32 probs)
    after the dispatch and 2·2h·R before the combine, the backward one reverse copy of each (2·2h·R); R = the
    rank's received rows. Not with one local expert, not with ep 1, not with DeepEP's flex dispatcher."""
    c = qwen3()
    rows, local = expert_rows(c)
    R, h = rows * local, 2048
    lk = layer_kernels(c, True, H100)
    fwd, bwd = by_name(lk.forward), by_name(lk.backward)
    assert fwd["sort_chunks"].bytes == pytest.approx(2 * (2 * h + 4) * R)
    assert fwd["unsort_chunks"].bytes == pytest.approx(2 * 2 * h * R)
    assert bwd["sort_chunks.bwd"].bytes == pytest.approx(2 * 2 * h * R)
    assert bwd["unsort_chunks.bwd"].bytes == pytest.approx(2 * 2 * h * R)
    names = [k.name for k in lk.forward]
    assert names.index("permute") < names.index("sort_chunks") < names.index("experts_fc1")
    assert names.index("experts_fc2") < names.index("unsort_chunks") < names.index("unpermute")
    for other in (qwen3(ep=1), qwen3(ep=128, dp=128), qwen3(ep_dispatch="deepep")):
        assert "sort_chunks" not in by_name(layer_kernels(other, True, H100).forward)


def test_dense_layers_are_untouched():
    """A dense layer lists no MoE kernel, and the per-expert launches do not apply to one GEMM."""
    c = Context(model_preset("llama3-8b"), WorkloadSpec(micro_batch_size=1, global_batch_size=8), ParallelSpec(dp=8))
    lk = layer_kernels(c, False, H100)
    assert all(k.count == 1 for k in lk.forward if k.kind == "gemm")
    assert not {"sort_chunks", "expert_counts_sync"} & {k.name for k in lk.forward}


def test_serving_keeps_the_fused_moe_kernel():
    """Inference (serving engines' fused MoE) is one grouped kernel, with no host sync and no chunk sort."""
    c = qwen3()
    served = Context(c.model, replace(c.work, kind="inference", phase="prefill"), c.par)
    fwd = by_name(layer_kernels(served, True, H100).forward)
    assert fwd["experts_fc1"].count == 1
    assert not {"sort_chunks", "expert_counts_sync"} & set(fwd)


def test_each_expert_launch_pays_the_host_dispatch_without_cuda_graphs():
    """512 tokens per rank: each of the 16 experts' fc2 GEMMs is shorter than a host dispatch, so eager the GEMM
    is launch-bound at 16 x cpu_op_s; with CUDA graphs (no host floor) it is the 4 waves' GPU time."""
    work = WorkloadSpec(micro_batch_size=1, global_batch_size=64, seq_length=512)
    eager = Context(QWEN3, work, ParallelSpec(dp=8, ep=8))
    fc2 = by_name(layer_kernels(eager, True, H100).forward)["experts_fc2"]
    assert fc2.count == 16 and fc2.time_s == pytest.approx(16 * EFFICIENCY.cpu_op_s)
    graphed = Context(QWEN3, replace(work, cuda_graphs=True), eager.par)
    rows, _ = expert_rows(graphed)
    gpu_s = 4 * gemm_time((round(rows, 3),) * 4, 2048, 768.0, "bf16", H100, EFFICIENCY)
    assert by_name(layer_kernels(graphed, True, H100).forward)["experts_fc2"].time_s == pytest.approx(gpu_s)
    assert gpu_s < 16 * EFFICIENCY.cpu_op_s


def test_torchtitan_scores_the_routed_rows_in_fp32_before_the_scatter_add():
    """torchtitan's combine (token_dispatcher.py LocalTokenDispatcher.combine at b5bcd76c6): zeros_like(x), then
    (rows.to(float32) * scores).to(bf16): per element of the R x h routed rows 2 -> 4, 4 + 4, 4 -> 2 = 20 B in 3
    kernels (+ the zeros' 2·T·h in one); backward by autograd's formulas 6 + 8 + 12 + 4 + 6 = 36 B in 5 kernels.
    Megatron applies its probs inside the unpermute; torch.compile fuses the chain."""
    c = qwen3("torch")
    rows, local = expert_rows(c)
    R, h, T = rows * local, 2048, 4096
    lk = layer_kernels(c, True, H100)
    fwd, bwd = by_name(lk.forward), by_name(lk.backward)
    assert fwd["combine_scores"].bytes == pytest.approx(20 * R * h + 2 * T * h)
    assert fwd["combine_scores"].count == 4 and bwd["combine_scores.bwd"].count == 5
    assert bwd["combine_scores.bwd"].bytes == pytest.approx(36 * R * h)
    names = [k.name for k in lk.forward]
    assert names.index("experts_fc2") < names.index("combine_scores") < names.index("unpermute")
    # memory-bound at the achievable HBM rate, one fixed cost per launch: Qwen3-30B at ep 8, 4,096 tokens, 1.42 GB
    rate = H100.hbm_GBps * 1e9 * EFFICIENCY.hbm
    assert fwd["combine_scores"].time_s == pytest.approx(fwd["combine_scores"].bytes / rate + 4 * EFFICIENCY.kernel_s)
    assert 1.40e9 < fwd["combine_scores"].bytes < 1.45e9
    compiled = Context(c.model, replace(c.work, torch_compile=True), c.par)
    for other in (qwen3(), compiled):
        assert "combine_scores" not in by_name(layer_kernels(other, True, H100).forward)
