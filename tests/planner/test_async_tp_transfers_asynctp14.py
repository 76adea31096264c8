"""torch's async TP, what its fused ops leave for the step (issue 20, asynctp14; docs/step-time.md "torch async TP's
transfers (asynctp14)"):

- the fused all-gather-matmul returns its gathered A as a [b, s, h] view of [s, b, h] memory
  (torch/distributed/_symmetric_memory/__init__.py ``unflatten``); a weight gradient that reads that tensor again
  flattens it to [b*s, h], no view of it when b > 1, and Inductor copies it first (ExternKernel.realize_input ->
  copy_input): once per gather of the forward and per grad output's gather, in the backward pass, where the weight
  gradient reads its operands as stored (bf16; a float8 recipe's casts copy them anyway);
- the fused ops move each peer's shard with one copy-engine pull after another (``copy_`` of the peer's symmetric
  buffer; "cp" from different streams cannot overlap): tp - 1 pulls of message / tp at the measured single-peer
  copy-engine read rate (nvbandwidth device_to_device_memcpy_read_ce on H100 SXM: 395.05 GB/s), not NCCL's price.
"""

import json
from dataclasses import replace
from pathlib import Path
from statistics import median

import pytest

import planner.step as step_module
from collectives.topology import cluster_preset
from collectives.topology.gpu import GPUS, PEER_COPY, PeerCopy, peer_copy
from planner import Options, Overlap, ParallelSpec, SpecError, WorkloadSpec, build_plan, model_preset
from planner.context import Context
from planner.kernels import async_tp_gemm_s, reads_stored_operands
from planner.rules.tensor import async_tp_wgrad_reads
from planner.spread import pace, paced_gpu

H100 = cluster_preset("dgx-h100", 1).gpu
MODEL = replace(model_preset("llama3-8b"), num_layers=4)
# one copy of a [2, 8192, 4096] bf16 tensor (the 8B's TP unit at b 2): read and written once at 0.877 of the H100's
# 3,350 GB/s, plus the kernel's 5 us (tests/planner/test_torch_tp_titan8.py's COPY_S)
UNIT = 2 * 8192 * 4096 * 2
COPY_S = 2 * UNIT / (3350e9 * 0.877) + 5e-6
# spread15: what the step adds runs at the pace of the slowest of the plans' 8 GPUs (planner/spread.py)
PACE = pace(H100.variability, 8)
READS = {
    "tp.attn.qkv": "qkv.wgrad",
    "tp.mlp.up_proj": "fc1.wgrad",
    "tp.attn.out_proj.dgrad": "attn_out.wgrad",
    "tp.mlp.down_proj.dgrad": "fc2.wgrad",
}


def _work(b=2, **work):
    return WorkloadSpec(micro_batch_size=b, global_batch_size=b, torch_compile=True, loss_parallel=True, **work)


def _ctx(model=MODEL, **work):
    return Context(model, _work(**work), ParallelSpec(tp=8, sequence_parallel=True, framework="torch"))


def _plan(b=2, **work):
    par = ParallelSpec(tp=8, sequence_parallel=True, framework="torch")
    options = Options(timeline=False, overlap=Overlap(tp_comm_overlap=True))
    return build_plan(MODEL, _work(b, **work), par, cluster_preset("dgx-h100", 1), options)


def test_the_gathers_a_weight_gradient_reads_again():
    """The column-parallel inputs' gathers feed qkv's and fc1's weight gradients, the grad outputs' gathers
    attn_out's and fc2's; a re-issue under recompute stands for the same tensor (not listed); the reduce-scatters
    return no tensor a weight gradient reads."""
    assert async_tp_wgrad_reads(_ctx()) == READS
    assert async_tp_wgrad_reads(_ctx(activation_recompute="full")) == READS
    op = async_tp_wgrad_reads(_ctx(activation_recompute="selective", selective_ac_option="op"))
    assert op == READS and not any(n.endswith(".recompute") for n in op)
    assert async_tp_wgrad_reads(_ctx(model=model_preset("mixtral-8x7b"))) == {}  # no GEMM mapped for MoE


def test_bf16_weight_gradients_read_what_was_stored_float8_ones_their_casts():
    """A bf16 GEMM reads the gathered tensor itself; torchao's tensorwise float8 GEMMs read their casts' copies;
    an unknown GEMM reads nothing."""
    bf16, fp8 = _ctx(), _ctx(activation_dtype="fp8", fp8_recipe="tensorwise")
    assert all(reads_stored_operands(bf16, H100, k) for k in READS.values())
    assert not any(reads_stored_operands(fp8, H100, k) for k in READS.values())
    assert not reads_stored_operands(bf16, H100, "no_such_gemm")


def test_each_read_gather_is_copied_once_in_the_backward(monkeypatch):
    """The 4-layer 8B at b 2, no recompute: per layer 4 gathered units copied (2 B moved a byte, one kernel each):
    16 copies, all in the backward pass; none when no weight gradient reads a stored operand (as under float8)."""
    with_copies = _plan().step.stages[0].compute
    monkeypatch.setattr(step_module, "reads_stored_operands", lambda ctx, gpu, name: False)
    without = _plan().step.stages[0].compute
    assert with_copies.forward.total_s == pytest.approx(without.forward.total_s, rel=1e-12)
    assert with_copies.backward.total_s - without.backward.total_s == pytest.approx(16 * COPY_S, rel=1e-9)  # unpaced


def test_full_recompute_copies_the_re_gathered_tensor_once():
    """Under full recompute the forward's gather returns no A (its tensor is gathered again by the re-run): still
    one copy per gathered tensor, 16 in all, not 16 + 8 for the re-issues."""
    plain, full = _plan(), _plan(activation_recompute="full")
    reads_plain = step_module._strided_reads(_ctx(), _totals(plain), 0, H100)
    reads_full = step_module._strided_reads(_ctx(activation_recompute="full"), _totals(full), 0, H100)
    assert reads_plain == pytest.approx((16 * UNIT, 16)) and reads_full == pytest.approx((16 * UNIT, 16))


def test_a_single_sequence_is_read_in_place():
    """b = 1: [1, s, h] over [s, 1, h] memory flattens to [s, h] as it lies: no copy."""
    plan = _plan(b=1)
    assert step_module._strided_reads(_ctx(b=1), _totals(plan), 0, H100) == (0.0, 0.0)


def test_float8_plans_copy_nothing_more():
    """torchao's tensorwise float8: the weight gradients read their casts' transposed copies: no copy here."""
    work = {"activation_dtype": "fp8", "fp8_recipe": "tensorwise"}
    plan = _plan(**work)
    assert step_module._strided_reads(_ctx(**work), _totals(plan), 0, H100) == (0.0, 0.0)


def _totals(plan):
    """The plan's per-row TP tallies (step.stream_totals over its priced calls: one micro-batch, one stage)."""
    return step_module.stream_totals(plan.calls, 1, 0, 1)


PEER_DATA = Path(__file__).resolve().parents[1] / "reference" / "nvbandwidth" / "h100_peer_copy.json"


def test_the_measured_copy_engine_pull():
    """The rate and the per-copy latency recomputed from the measurements kept in tests/reference/nvbandwidth: the
    nvbandwidth read-CE matrix's 56 pairs (sum 22,122.87 GB/s, 395.05 a pair) and the median of
    p2pBandwidthLatencyTest's 56 off-diagonal P2P latencies (2.78 us); Hopper with 18 NVLink links takes it (H100,
    H200), a part with another NVLink count or generation none; measured on an 8-GPU board."""
    data = json.loads(PEER_DATA.read_text())
    pairs = [float(v) for row in data["read_ce"]["bandwidth_matrix"] for v in row if v != "N/A"]
    lat = data["p2p_latency"]["gpu_latency_us"]
    off = [lat[i][j] for i in range(8) for j in range(8) if i != j]
    pull = peer_copy(H100)
    assert len(pairs) == len(off) == 56 and sum(pairs) == pytest.approx(data["read_ce"]["sum"], rel=1e-6)
    assert pull == PEER_COPY[(90, 18)] and pull.GBps == round(sum(pairs) / 56, 2) == 395.05
    assert pull.latency_s == pytest.approx(median(off) * 1e-6) and pull.board_gpus == 8
    assert "device_to_device_memcpy_read_ce" in pull.source and data["read_ce"]["name"] in pull.source
    assert peer_copy(GPUS["h200-sxm-141gb"]) is pull
    assert peer_copy(GPUS["h800-sxm5-80gb"]) is None and peer_copy(GPUS["a100-sxm4-80gb"]) is None
    assert peer_copy(GPUS["b200-180gb"]) is None
    assert PeerCopy(100.0, "x").seconds(1e9, 3) == pytest.approx(0.03)
    assert PeerCopy(100.0, "x", 2e-6).seconds(1e9, 3) == pytest.approx(0.03 + 6e-6)


def _fused_by_ledger(plan, gpu, tp):
    """A plan's forward exposure of its fused calls with each call's communication its ledger price (NCCL's)."""
    from planner.step import fused_op_exposed_s

    price = {pc.call.name: pc.price.time_s for pc in plan.calls}
    ctx = Context(MODEL, _work(), ParallelSpec(tp=tp, sequence_parallel=True, framework="torch"))
    # the fused ops' GEMMs as the plan times them: on the slowest of its GPUs (planner/spread.py; mend15f, where
    # the fused exposure used to read the median part's GEMMs beside the paced compute)
    gemm = async_tp_gemm_s(ctx, paced_gpu(ctx, gpu))
    return sum(4 * fused_op_exposed_s(price[n], gemm[k], tp) for n, k in PAIRS)


PAIRS = (
    ("tp.attn.qkv", "qkv"),
    ("tp.mlp.up_proj", "fc1"),
    ("tp.attn.out_proj", "attn_out"),
    ("tp.mlp.down_proj", "fc2"),
)


@pytest.mark.parametrize(
    ("where", "tp", "nodes", "per_node"),
    [("gh200", 4, 4, None), ("dgx-h100", 8, 2, 4), ("dgx-h100", 4, 1, 4), ("dgx-h100", 2, 1, 2)],
)
def test_the_measured_pull_only_behind_an_nvswitch_board(where, tp, nodes, per_node):
    """The measured pull needs both GPUs behind one NVSwitch of an 8-GPU board (PeerCopy.reaches; review r14a, 1):
    GH200 nodes of one GPU over InfiniBand, tp 8 over two nodes of 4, and H100 nodes of 4 or 2 (no NVSwitch on those
    boards) price the fused op's transfer at the ledger's (NCCL's) price, as before asynctp14."""
    cluster = cluster_preset(where, nodes)
    if per_node:
        cluster = replace(cluster, devices_per_node=per_node)
    par = ParallelSpec(tp=tp, sequence_parallel=True, framework="torch")
    options = Options(timeline=False, overlap=Overlap(tp_comm_overlap=True))
    plan = build_plan(MODEL, _work(), par, cluster, options)
    assert peer_copy(cluster.gpu) is not None  # a Hopper part with the measured pull, placed where it does not apply
    assert plan.step.stages[0].tp_fused_fwd_s == pytest.approx(_fused_by_ledger(plan, cluster.gpu, tp), rel=1e-12)


def test_the_switch_test_reads_the_price():
    """on_nvlink_switch: the DGX H100's TP group (one node, its busiest link an NVSwitch port) is; GH200's (NICs)
    and a full-mesh node's (no switch) are not."""
    from collectives.topology.pricing import on_nvlink_switch

    dgx, options = _plan(), Options(timeline=False, overlap=Overlap(tp_comm_overlap=True))
    gh = build_plan(MODEL, _work(), ParallelSpec(tp=4, sequence_parallel=True, framework="torch"),
                    cluster_preset("gh200", 4), options)  # fmt: skip
    tp_rows = [pc for pc in dgx.calls if pc.call.parallelism == "tp"]
    assert tp_rows and all(on_nvlink_switch(pc.price) for pc in tp_rows)
    assert not any(on_nvlink_switch(pc.price) for pc in gh.calls if pc.call.parallelism == "tp")
    h = cluster_preset("dgx-h100", 1)
    mesh = replace(h, intra=replace(h.intra, fabric="full_mesh"))
    m = build_plan(MODEL, _work(), ParallelSpec(tp=8, sequence_parallel=True, framework="torch"), mesh, options)
    assert not any(on_nvlink_switch(pc.price) for pc in m.calls if pc.call.parallelism == "tp")


def test_async_tp_without_compile_is_refused():
    """torchtitan raises 'Async TP requires torch.compile' (review r14a, 1): a SpecError on
    options.overlap.tp_comm_overlap naming workload.torch_compile; tp 1 (nothing to overlap) passes."""
    work = WorkloadSpec(micro_batch_size=2, global_batch_size=2, torch_compile=False, loss_parallel=True)
    options = Options(timeline=False, overlap=Overlap(tp_comm_overlap=True))
    with pytest.raises(SpecError) as err:
        build_plan(MODEL, work, ParallelSpec(tp=8, sequence_parallel=True, framework="torch"),
                   cluster_preset("dgx-h100", 1), options)  # fmt: skip
    assert err.value.field == "options.overlap.tp_comm_overlap"
    assert "workload.torch_compile" in str(err.value) and "Async TP requires" in str(err.value)


def test_without_a_measured_pull_the_ledger_prices_the_transfer():
    """On an A100 no copy-engine pull was measured: the fused op's communication is the call's ledger price, as
    before (the forward exposure of the same 4 layers from NCCL's prices)."""
    a100 = cluster_preset("dgx-a100", 1)
    par = ParallelSpec(tp=8, sequence_parallel=True, framework="torch")
    options = Options(timeline=False, overlap=Overlap(tp_comm_overlap=True))
    plan = build_plan(MODEL, _work(), par, a100, options)
    assert peer_copy(a100.gpu) is None
    assert plan.step.stages[0].tp_fused_fwd_s == pytest.approx(_fused_by_ledger(plan, a100.gpu, 8), rel=1e-12)


def test_a_gather_copies_its_shard_into_its_p2p_buffer_at_any_b():
    """_pipelined_multi_all_gather_and_consume copies the rank's shard into its symmetric buffer before the first
    shard's GEMM (mv, then a barrier): one shard (message / 8) and one kernel a call, at b 1 too; at b 2 the
    movedim-flatten re-layout of the shard besides (titan8). A reduce-scatter at b 1 copies nothing."""
    one, two = _ctx(b=1), _ctx(b=2)
    assert step_module._fused_relayout(one, H100, "allgather", 8e6, 3.0, ("qkv", 1.0)) == (1e6, 3.0)
    assert step_module._fused_relayout(two, H100, "allgather", 8e6, 3.0, ("qkv", 1.0)) == (2e6, 6.0)
    assert step_module._fused_relayout(one, H100, "reducescatter", 8e6, 3.0, ("fc2", 1.0)) == (0.0, 0.0)
    _, calls = step_module._fused_relayout(two, H100, "reducescatter", 8e6, 3.0, ("fc2", 1.0))
    assert calls == 3.0


def test_the_switch_test_only_where_the_fused_rows_are_priced(monkeypatch):
    """StreamTotals.tp_switched is read only by async TP's fused rows (step._async_tp_fused): the NVSwitch test runs
    only with tp_comm_overlap on torch and a measured pull (step.fused_rows_priced; review r14c, 7). With async TP
    off no TP call is tested and the per-row tallies count none behind a switch; with it on, every TP row's calls
    (the DGX H100's one node) are."""
    on, off = Overlap(tp_comm_overlap=True), Overlap(tp_comm_overlap=False)
    assert step_module.fused_rows_priced(_ctx(), on, H100)
    assert not step_module.fused_rows_priced(_ctx(), off, H100) and not step_module.fused_rows_priced(_ctx(), on, None)
    megatron = Context(MODEL, _work(), ParallelSpec(tp=8, sequence_parallel=True, framework="megatron"))
    assert not step_module.fused_rows_priced(megatron, on, H100)
    tested = []
    real = step_module.on_nvlink_switch
    monkeypatch.setattr(step_module, "on_nvlink_switch", lambda price: tested.append(price) or real(price))
    par = ParallelSpec(tp=8, sequence_parallel=True, framework="torch")
    build_plan(MODEL, _work(), par, cluster_preset("dgx-h100", 1), Options(timeline=False, overlap=off))
    assert tested == []
    plan = _plan()
    totals = step_module.stream_totals(plan.calls, 1, 0, 1, True, count_switched=True)
    assert tested and totals.tp_switched == {k: [n] for k, (n,) in totals.unit_count.items() if k in totals.tp_switched}
    assert not any(any(row) for row in _totals(plan).tp_switched.values())
