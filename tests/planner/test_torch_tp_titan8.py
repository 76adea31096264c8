"""torch's tensor parallelism as the torchtitan 2025-06 runs ran it (issue 20, titan8; docs/step-time.md "Torch TP
(titan8)"), each mechanism from its source line:

- DTensor's sequence-parallel collectives gather and scatter on dim 1 of [b, s, h] through functional collectives
  that move dim 0 only: a torch.cat copy on the compute stream per call (2 B moved per byte of the call's message;
  none for a gather at b = 1, torch/_utils.py _maybe_view_chunk_cat), except where async TP's fused ops re-lay it;
- a fully re-run layer stops at its last saved tensor (torch/utils/checkpoint.py early stop; the min-cut
  partitioner under torch.compile): fc2, its reduce-scatter and the residual add are not re-run;
- torchtitan's per-op SAC under torch.compile does not re-run the attention's output projection.
"""

from dataclasses import replace

import pytest

from collectives.topology import cluster_preset
from planner import Options, Overlap, ParallelSpec, WorkloadSpec, build_plan, model_preset
from planner.compute import pass_time, per_op_sac_reruns_out_proj, per_op_sac_shares, recompute_modules_forward
from planner.context import Context
from planner.flavours import flavour, register, unregister
from planner.kernels import efficiency, full_rerun, gemm_operand_bytes, layer_kernels, sp_layout_copy_kernels
from planner.spread import pace, slowest_part

H100 = cluster_preset("dgx-h100", 1).gpu
EFF = efficiency(H100, None)
MODEL = replace(model_preset("llama3-8b"), num_layers=4)
# one copy of a [2, 8192, 4096] bf16 tensor (the 8B's TP unit at b 2): read and written once at 0.877 of the H100's
# 3,350 GB/s, plus the kernel's 5 us
UNIT = 2 * 8192 * 4096 * 2
COPY_S = 2 * UNIT / (3350e9 * 0.877) + 5e-6
# spread15: what the step adds runs at the pace of the slowest of the plans' 8 GPUs (planner/spread.py)
PACE = pace(H100.variability, 8)
# mend15f: on that part at clock / PACE (spread.slowest_part) the HBM-bound copies take the median part's seconds
SLOW = slowest_part(H100, PACE)


@pytest.fixture
def no_copies():
    """torch with the sequence-dim copies switched off: what the copies add is the difference."""
    register(replace(flavour("torch"), name="torch-nocopy", sp_layout_copies=False))
    yield "torch-nocopy"
    unregister("torch-nocopy")


def _plan(framework, b=2, overlap=False, **work):
    lp = {"loss_parallel": True} if flavour(framework).loss_parallel_switch else {}
    w = WorkloadSpec(micro_batch_size=b, global_batch_size=b, torch_compile=True, **lp, **work)
    par = ParallelSpec(tp=8, sequence_parallel=True, framework=framework)
    options = Options(timeline=False, overlap=Overlap(tp_comm_overlap=overlap))
    return build_plan(MODEL, w, par, cluster_preset("dgx-h100", 1), options)


def test_copy_kernels_closed_form():
    """1 GB gathered in 4 calls, 3 GB reduce-scattered in 6: 2 and 6 GB moved at the achieved HBM bandwidth, one
    kernel a call."""
    gather, scatter = sp_layout_copy_kernels(1e9, 4, 3e9, 6, H100, EFF)
    rate = H100.hbm_GBps * 1e9 * EFF.hbm
    assert gather.name == "dtensor.all_gather_cat" and gather.bytes == 2e9 and gather.count == 4
    assert gather.time_s == pytest.approx(2e9 / rate + 4 * EFF.kernel_s)
    assert scatter.name == "dtensor.reduce_scatter_cat" and scatter.bytes == 6e9 and scatter.count == 6
    assert scatter.time_s == pytest.approx(6e9 / rate + 6 * EFF.kernel_s)
    assert sp_layout_copy_kernels(0, 0, 0, 0, H100, EFF) == ()


def test_every_sequence_parallel_call_copies_its_tensor_once(no_copies):
    """4 layers, b 2, no recompute: per layer 2 all-gathers and 2 reduce-scatters each way, and the embedding's
    reduce-scatter and the head's all-gather (and their conjugates): 36 calls of one TP unit, each one copy of it."""
    with_copies, without = _plan("torch"), _plan(no_copies)
    tp = [pc.call for pc in with_copies.calls if pc.call.op.value in ("allgather", "reducescatter")]
    tp = [c for c in tp if c.parallelism == "tp"]
    assert sum(c.calls_per_iteration for c in tp) == 36 and {c.message_bytes for c in tp} == {UNIT}
    assert with_copies.step.compute_s - without.step.compute_s == pytest.approx(36 * COPY_S, rel=1e-9)
    assert with_copies.step.compute_s > without.step.compute_s


def test_a_single_sequence_gathers_into_a_view(no_copies):
    """b = 1: the gathered [tp, 1, s/tp, h] is [1, s, h] as it lies (_maybe_view_chunk_cat), the reduce-scatters
    still copy: 18 copies of half the unit."""
    grown = _plan("torch", b=1).step.compute_s - _plan(no_copies, b=1).step.compute_s
    assert grown == pytest.approx(18 * (UNIT / (3350e9 * 0.877) + 5e-6), rel=1e-9)


def test_async_tp_copies_only_what_it_leaves_unfused(no_copies):
    """Under async TP the unfused calls copy whole: the summed input gradients' reduce-scatters (2 a layer), the
    embedding's and the head's calls (outside the compiled blocks): 12 units. The fused ops re-lay only their own
    operand (_symmetric_memory's movedim(...).flatten at b > 1): a gather its shard (1/8 unit), a reduce-scatter
    its matmul's input A: attn_out's 16,384 x 512 (1/8 unit), fc2's 16,384 x 1,792 (7/16 unit); per layer 2
    gathers and 2 reduce-scatters forward, 2 gathers backward: 4 x (4/8 + 9/16) = 4.25 units, read and written, in
    24 kernels. asynctp14: each gather also copies its shard into its p2p buffer (4 x 4/8 = 2 units more, 16
    kernels: step._fused_relayout), and the weight gradients copy the 4 gathered tensors they read again, 16 units
    whole (step._strided_reads; tests/planner/test_async_tp_transfers_asynctp14.py)."""
    grown = _plan("torch", overlap=True).step.compute_s - _plan(no_copies, overlap=True).step.compute_s
    fused = 2 * 6.25 * UNIT / (3350e9 * 0.877) + 40 * 5e-6
    assert grown == pytest.approx((12 + 16) * COPY_S + fused, rel=1e-9)


def test_megatron_has_no_such_copies():
    """TE's sequence-parallel gathers write [s, b, h] along s, the first dim: no copy (the trait is off)."""
    assert not flavour("megatron").sp_layout_copies and flavour("torch").sp_layout_copies


def _ctx(framework="torch", **work):
    w = WorkloadSpec(micro_batch_size=2, global_batch_size=2, **work)
    return Context(MODEL, w, ParallelSpec(tp=8, sequence_parallel=True, framework=framework))


def test_full_recompute_stops_before_fc2():
    """Under torch.compile the re-run holds what the backward needs: the layer's forward without fc2 and the
    residual add after it (an fp8 recipe's lumped casts stay); eager (torchtitan's early_stop=False) and Megatron
    re-run all."""
    ctx = _ctx(activation_recompute="full", torch_compile=True)
    fwd = layer_kernels(ctx, False, H100).forward
    names = [k.name for k in fwd]
    assert names[-2:] == ["fc2", "residual_add"]
    assert [k.name for k in full_rerun(ctx, fwd, False)] == names[:-2]
    assert full_rerun(ctx, fwd, True) == fwd  # an MoE layer: no source read, whole
    fp8 = _ctx(activation_recompute="full", activation_dtype="fp8", fp8_recipe="tensorwise", torch_compile=True)
    fp8_fwd = layer_kernels(fp8, False, H100).forward
    fp8_names = [k.name for k in fp8_fwd]
    assert fp8_names[-3:] == ["fc2", "residual_add", "fp8_cast"]
    assert [k.name for k in full_rerun(fp8, fp8_fwd, False)] == [*fp8_names[:-3], "fp8_cast"]
    eager = _ctx(activation_recompute="full")
    eager_fwd = layer_kernels(eager, False, H100).forward
    assert full_rerun(eager, eager_fwd, False) == eager_fwd
    megatron = _ctx("megatron", activation_recompute="full")
    mfwd = layer_kernels(megatron, False, H100).forward
    assert full_rerun(megatron, mfwd, False) == mfwd


def test_full_recompute_plan_drops_the_output_reduce_scatter_and_fc2(no_copies):
    """The ledger: no tp.mlp.down_proj.recompute under torch (the other 3 forward calls re-issue); the step: the
    backward re-runs 4 x (the forward less fc2 and the residual add)."""
    torch_plan = _plan("torch", activation_recompute="full")
    rows = {pc.call.name: pc.call for pc in torch_plan.calls}
    assert "tp.mlp.down_proj.recompute" not in rows
    assert all(rows[f"tp.{n}.recompute"].calls_per_iteration == 4 for n in ("attn.qkv", "attn.out_proj", "mlp.up_proj"))
    megatron = {pc.call.name for pc in _plan("megatron", activation_recompute="full").calls}
    assert "tp.mlp.down_proj.recompute" in megatron
    ctx = _ctx(activation_recompute="full", torch_compile=True, loss_parallel=True)
    fwd = layer_kernels(ctx, False, SLOW).forward  # the plan's kernels: the slowest part's
    tail = sum(k.time_s for k in fwd[-2:])
    st = torch_plan.step.stages[0]
    assert st.compute.recompute_s == pytest.approx(4 * (pass_time(fwd).total_s - tail), rel=1e-9)


def test_per_op_sac_under_compile_leaves_out_proj():
    """The policy saves every odd mm: q, v, w1, w2; k, o, w3 re-run eager, k and w3 under compile (o's output feeds
    only the saved reduce-scatter). Llama 3 8B: h 4,096, 8 KV heads of 128, 32 heads, ffn 14,336."""
    compiled = _ctx(activation_recompute="selective", selective_ac_option="op", torch_compile=True)
    eager = _ctx(activation_recompute="selective", selective_ac_option="op")
    assert not per_op_sac_reruns_out_proj(compiled) and per_op_sac_reruns_out_proj(eager)
    lk = layer_kernels(compiled, False, H100)
    layer = pass_time(lk.forward)
    a = recompute_modules_forward(compiled, lk, layer, H100, EFF, frozenset({"op"}), False)
    b = recompute_modules_forward(eager, lk, layer, H100, EFF, frozenset({"op"}), False)
    params = 4096 * (4096 + 2 * 1024 + 4096) + 3 * 4096 * 14336
    assert a.gemm_s == pytest.approx(layer.gemm_s * 4096 * (1024 + 14336) / params, rel=1e-12)
    assert b.gemm_s == pytest.approx(layer.gemm_s * 4096 * (1024 + 4096 + 14336) / params, rel=1e-12)
    assert a.elementwise_s == b.elementwise_s == layer.elementwise_s


def test_async_tp_rerun_share_stops_before_fc2():
    """A fully re-run layer under async TP re-adds the split GEMMs and partial sums of what it re-runs: qkv, attn_out
    and fc1 (with attn_out's partial sum), not fc2 nor its sum; no backward GEMM."""
    from planner.kernels import async_tp_split, gemm_kernels

    ctx = _ctx(activation_recompute="full", torch_compile=True)
    lk = layer_kernels(ctx, False, H100)
    f_gemm, f_mem, _ = async_tp_split(ctx, False, H100)
    r_gemm, r_mem, r_bwd = async_tp_split(ctx, False, H100, rerun=True)
    fc2 = next(k for k in lk.forward if k.name == "fc2")
    m, n, kk, _ = fc2.shape
    fc2_extra = 8 * gemm_kernels("fc2", m / 8, n, kk, fc2.dtype, H100, EFF)[0].time_s - fc2.time_s
    assert r_gemm == pytest.approx(f_gemm - fc2_extra, rel=1e-12) and r_bwd == 0.0
    assert r_mem == pytest.approx(f_mem / 2, rel=1e-12)  # attn_out's and fc2's sums are equal: [16,384, 4,096]


def test_torch_ring_attention_merges_in_fp32_torch_ops():
    """torch's context_parallel ring (_attention.py _SDPAMerger, convert_to_f32): Llama 3 8B, cp 4, b 1, 8,192
    tokens: a rank holds 2,048 queries of 32 heads (O = Q = 8,388,608 elements of 128, 65,536 rows) and 2,048 keys
    and values of 8 heads (KV = 4,194,304). Forward: 4 casts to fp32 (6 B), 3 merges of 32 B an output element and
    56 B a row, 3 K/V concatenations (4 B), the cast back (6 B); backward: the fp32 zeros (4 B over Q + KV), 4 dq
    adds (10 B), 4 dk/dv adds and concatenations (18 B), 3 K/V concatenations, the casts back (6 B over Q + KV).
    Megatron's ring keeps its fused correction, 12 B an output element a merge."""
    from planner.kernels import attention_kernels

    def core(framework):
        w = WorkloadSpec(micro_batch_size=1, global_batch_size=1, seq_length=8192)
        ctx = Context(model_preset("llama3-8b"), w, ParallelSpec(cp=4, framework=framework))
        return attention_kernels(ctx, H100, EFF, 0.0)

    o, rows, kv = 8_388_608, 65_536, 4_194_304
    fwd, bwd = core("torch")
    merged = {k.name: (k.bytes, k.count) for k in fwd if k.kind == "memory"}
    assert merged == {
        "cp_merge.cast": (6 * o * 4, 4),
        "cp_merge": (32 * o * 3, 9),
        "cp_merge.lse": (56 * rows * 3, 15),
        "cp_kv_cat": (4 * kv * 3, 3),
        "cp_merge.out_cast": (6 * o, 1),
    }
    # about 38 B an output element a merge (the cast and the merge), against 12
    assert (merged["cp_merge.cast"][0] * 3 / 4 + merged["cp_merge"][0]) / (3 * o) == 38.0
    back = {k.name: (k.bytes, k.count) for k in bwd if k.kind == "memory"}
    assert back == {
        "cp_grad.zeros": (4 * (o + kv), 3),
        "cp_grad.dq_add": (10 * o * 4, 4),
        "cp_grad.dkv_add": (18 * kv * 4, 12),
        "cp_kv_cat.bwd": (4 * kv * 3, 3),
        "cp_grad.casts": (6 * (o + kv), 2),
    }
    rate = H100.hbm_GBps * 1e9 * EFF.hbm
    assert next(k for k in fwd if k.name == "cp_merge").time_s == pytest.approx(32 * o * 3 / rate + 9 * EFF.kernel_s)
    mfwd, mbwd = core("megatron")
    assert [(k.name, k.bytes) for k in mfwd if k.kind == "memory"] == [("cp_merge", 12 * o * 3)]
    assert [(k.name, k.bytes) for k in mbwd if k.kind == "memory"] == [("cp_merge.bwd", 12 * o * 3)]


def test_a_fused_op_hides_its_copies_behind_its_own_gemm_only():
    """max(c + g/tp, g) - g: 2 ms of copies around a 1 ms GEMM in 8 pieces leave 1.125 ms exposed; around a 4 ms
    GEMM nothing (4 ms >= 2 + 0.5)."""
    from planner.step import fused_op_exposed_s

    assert fused_op_exposed_s(2e-3, 1e-3, 8) == pytest.approx(1.125e-3)
    assert fused_op_exposed_s(2e-3, 4e-3, 8) == 0.0
    assert fused_op_exposed_s(2e-3, 16e-3 / 7, 8) == pytest.approx(0.0, abs=1e-15)  # the break-even: g = 8c/7


def test_async_tp_exposes_each_fused_call_beyond_its_gemm():
    """The 4-layer 8B at b 2 under async TP: each forward fused call (qkv's and fc1's gathers, attn_out's and fc2's
    reduce-scatters) and each backward one (the two grad-output gathers) exposes max(0, c + g/8 - g) with c its
    transfer (asynctp14: 7 copy-engine pulls of one peer's 1/8 of the message at the H100's measured rate,
    step.fused_transfer_s) and g its split GEMM; summed per pass. Nothing was exposed in the forward before (the
    pass-wide rule hid all TP behind all GEMMs)."""
    from collectives.topology.gpu import peer_copy
    from planner.kernels import async_tp_gemm_s
    from planner.step import fused_transfer_s

    plan = _plan("torch", overlap=True)
    st = plan.step.stages[0]
    price = {pc.call.name: fused_transfer_s(pc.call.message_bytes, 8, peer_copy(H100)) for pc in plan.calls}
    gemm = async_tp_gemm_s(_ctx(torch_compile=True, loss_parallel=True), SLOW)  # the plan's: the slowest part's

    def exposed(pairs):
        return sum(4 * max(0.0, price[n] + gemm[g] / 8 - gemm[g]) for n, g in pairs)

    fwd = exposed([("tp.attn.qkv", "qkv"), ("tp.mlp.up_proj", "fc1"), ("tp.attn.out_proj", "attn_out"),
                   ("tp.mlp.down_proj", "fc2")])  # fmt: skip
    bwd = exposed([("tp.attn.out_proj.dgrad", "attn_out.dgrad"), ("tp.mlp.down_proj.dgrad", "fc2.dgrad")])
    assert st.tp_fused_fwd_s == pytest.approx(fwd, rel=1e-12) and st.tp_fused_bwd_s == pytest.approx(bwd, rel=1e-12)
    assert fwd > 0  # qkv's GEMM (n 768) is shorter than its gather
    assert st.exposed_by_stream[("tp", "forward")] >= fwd


def test_re_issued_gathers_run_with_the_re_run_gemm():
    """Per-op SAC re-runs k alone of q, k, v (8 KV heads of 40: 1/6 of qkv's width) and w3 alone of w1, w3 (1/2 of
    fc1): the re-issued gathers fuse with that share; a fully re-run layer re-runs the whole GEMMs."""
    from planner.rules.tensor import async_tp_fused_gemms

    op = async_tp_fused_gemms(_ctx(activation_recompute="selective", selective_ac_option="op", torch_compile=True))
    assert op["tp.attn.qkv.recompute"] == ("qkv", pytest.approx(1 / 6)) and op["tp.mlp.up_proj.recompute"] == (
        "fc1",
        0.5,
    )
    assert op["tp.attn.qkv"] == ("qkv", 1.0) and "tp.attn.qkv.dgrad" not in op  # q, k, v summed: unfused
    full = async_tp_fused_gemms(_ctx(activation_recompute="full", torch_compile=True))
    assert full["tp.attn.out_proj.recompute"] == ("attn_out", 1.0) and full["tp.mlp.up_proj.recompute"] == ("fc1", 1.0)


def test_torchs_head_keeps_the_vocabulary_unpadded():
    """Llama 3's 128,256 over tp 8: torch's head and embedding hold 16,032 rows a rank (DTensor's Shard(0) of the
    checkpoint's vocabulary), Megatron's 16,128 (padded to 128 x 8: 129,024); an uneven split takes the larger
    chunk (torch.chunk): 128,256 over 7 -> 18,323 (ceil of 18,322.3)."""
    from planner.kernels import vocab_shard

    assert vocab_shard(_ctx(loss_parallel=True)) == 16032 and vocab_shard(_ctx("megatron")) == 16128
    w = WorkloadSpec(micro_batch_size=2, global_batch_size=2)
    assert vocab_shard(Context(MODEL, w, ParallelSpec(tp=7, framework="torch"))) == 18323


def test_async_tp_copies_hold_no_sms(monkeypatch):
    """The fused ops move shards with copy_ of peer buffers (cudaMemcpyAsync: the copy engines): the hidden TP holds
    no SMs beside the GEMMs, only HBM bytes (planner/contention.py); NCCL's channels (24 here) were charged before."""
    from planner import step as S

    seen = []
    real = S._holds

    def spy(*args, **kwargs):
        seen.append(real(*args, **kwargs))
        return seen[-1]

    monkeypatch.setattr(S, "_holds", spy)
    _plan("torch", overlap=True)
    share = seen[-1]["tp.forward"][0]
    assert share.sms == 0.0 and share.hbm_Bps > 0
    register(replace(flavour("torch"), name="torch-nccl-sms", tp_overlap_sms=()))
    try:
        _plan("torch-nccl-sms", overlap=True)
        assert seen[-1]["tp.forward"][0].sms > 0
    finally:
        unregister("torch-nccl-sms")


def test_fused_backward_reduce_scatter_finds_its_dgrad_operand():
    # the fused backward matmul-reduce-scatter of fc1 (a non-gated MLP) re-lays dY, its dgrad GEMM's A: GPT-3 175B,
    # tp 8, b 2, s 2048: m = 4096 rows, ffn / tp = 6144, bf16 (before: the lookup searched the forward only, 0)
    c = Context(
        model_preset("gpt3-175b"),
        WorkloadSpec(micro_batch_size=2, global_batch_size=16, torch_compile=True),
        ParallelSpec(tp=8, sequence_parallel=True, framework="torch"),
    )
    assert gemm_operand_bytes(c, H100, "fc1.dgrad") == 4096 * 6144 * 2 == 50_331_648
    # a forward GEMM's A is its input X (m x h): fc1's 4096 x 12288
    assert gemm_operand_bytes(c, H100, "fc1") == 4096 * 12288 * 2
    assert gemm_operand_bytes(c, H100, "no_such_gemm") == 0.0


def test_per_op_sac_shares_one_home():
    """k of q, k, v (8 of 32 + 16 heads' widths), o eager only, w3 of the gated w1, w3; the async-TP re-issues read
    the same shares (rules/tensor.py _async_tp_fused_gemms)."""
    from planner.rules.tensor import async_tp_fused_gemms

    work = {"activation_recompute": "selective", "selective_ac_option": "op", "torch_compile": True}
    compiled = _ctx(**work)
    assert per_op_sac_shares(compiled) == {"qkv": 8 / 48, "attn_out": 0.0, "fc1": 0.5}
    assert per_op_sac_shares(_ctx(**(work | {"torch_compile": False})))["attn_out"] == 1.0
    shares = {share for _, share in async_tp_fused_gemms(compiled).values()}
    assert {8 / 48, 0.5} <= shares


def test_tp_rows_tallied_only_for_flavours_that_read_them():
    """stream_totals' per-row TP tallies (tp.<phase>.<op>.<name>, through _unit_totals) are built for torch (SP
    copies, async TP) and skipped for Megatron; with them, each row's calls and bytes are the ledger's."""
    from planner.step import stream_totals, tp_key, tp_rows_read

    assert tp_rows_read(_ctx("torch")) and not tp_rows_read(_ctx("megatron"))
    torch_plan = _plan("torch")
    calls, m, zero = torch_plan.calls, torch_plan.num_microbatches, 0
    on = stream_totals(calls, m, zero, 1, True)
    off = stream_totals(calls, m, zero, 1, False)
    assert not off.tp_seconds and not any(k.startswith("tp.") for k in off.unit_volume)
    gathers = [pc.call for pc in calls if pc.call.parallelism == "tp" and pc.call.op.value == "allgather"]
    c = next(c for c in gathers if c.phase == "forward")
    key = tp_key("forward", "allgather", c.name)
    assert on.unit_count[key] == [c.calls_per_iteration]
    assert on.unit_volume[key] == [c.calls_per_iteration * c.message_bytes]
    assert on.time == off.time
