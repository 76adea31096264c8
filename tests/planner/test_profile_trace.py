"""A torch.profiler trace read, classified, fitted and compared (planner/profile_trace.py, planner/trace_fit.py), on
two real public traces (tests/reference/traces/README.md: counts checked there by hand with jq) and on small traces
built here from Kineto's own field names (libkineto/src/output_json.cpp)."""

import gzip
import json
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collectives.topology.gpu import GPUS
from planner import ModelSpec, ParallelSpec, SpecError, WorkloadSpec, build_plan
from planner.kernels import EFFICIENCY, gemm_time
from planner.profile_trace import (
    TraceOp,
    elementwise_bytes,
    gemm_shape,
    kernel_class,
    load_trace,
    message_bytes,
)
from planner.trace_fit import compare_collectives, fit_trace, gemm_points, memory_points

TRACES = Path(__file__).resolve().parents[1] / "reference" / "traces"
A100 = GPUS["a100-sxm4-80gb"]


@pytest.fixture(scope="module")
def control():
    return load_trace((TRACES / "hta_trace_diff_control.json.gz").read_bytes())


@pytest.fixture(scope="module")
def sampled():
    return load_trace(gzip.decompress((TRACES / "hta_sampled_rank-0.json.gz").read_bytes()).decode())


def test_the_public_traces_parse_and_classify_as_counted_by_hand(control, sampled):
    # tests/reference/traces/README.md: jq counts
    kernels = Counter(k.kind == "copy" for k in control.kernels)
    assert kernels[False] == 8568 and sum(k.kind != "copy" for k in sampled.kernels) == 1154
    assert kernels[True] == 654 + 228  # jq: cat gpu_memset and gpu_memcpy events (class copy)
    assert (control.steps, sampled.steps) == (6, 2)
    assert (control.device, control.sms, control.compute_capability) == ("NVIDIA A100-PG509-200", 108, 80)
    assert (control.rank, control.world_size, sampled.rank, sampled.world_size) == (3, 8, 0, 128)
    nccl = Counter(k.collective for k in control.kernels if k.kind == "nccl")
    assert nccl == {"allreduce": 18, "sendrecv": 42}
    assert sum(k.dur_s for k in control.kernels if k.collective == "allreduce") == pytest.approx(32880e-6)
    assert Counter(k.collective for k in sampled.kernels if k.kind == "nccl") == {"sendrecv": 10}
    kinds = Counter(k.kind for k in control.kernels)
    assert kinds["gemm"] == 2382 + 6 and Counter(k.kind for k in sampled.kernels)["gemm"] == 376 + 10
    # no size recorded before torch 2.1: counts and times only
    assert all(k.message_bytes is None for k in control.kernels if k.kind == "nccl")
    assert control.record_shapes and sampled.record_shapes


def test_kernel_names_classify_by_library():
    assert kernel_class("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)") == "nccl"
    assert kernel_class("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1") == "gemm"
    assert kernel_class("nvjet_sm100_qrsss_256x256_128x4_2x1_2cta_v_bz_NTT") == "gemm"
    assert kernel_class("void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4>>") == "attention"
    assert kernel_class("cudnn_generated_fort_native_sdpa_sm90_knob_7_64x128x128_4x1x1_kernel0_0") == "attention"
    assert kernel_class("void fbgemm_gpu::permute_2D_data_kernel<false, int>") == "other"
    assert kernel_class("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>") == "memory"
    assert kernel_class("void cub::DeviceRadixSortOnesweepKernel<...>") == "memory"  # routing's sort: bytes
    assert kernel_class("void split_embedding_codegen_forward_unweighted_kernel<float>") == "other"


def test_gemm_shapes_come_from_the_aten_operands(control):
    """(M, N, K, groups) by the aten schemas; the trace's most frequent GEMM, aten::mm of (100 x 1024) @
    (1024 x 256), runs 78 times (jq), each a CUTLASS kernel and cuBLAS's split-K reduction: all 78 recovered."""
    assert gemm_shape(TraceOp("aten::mm", ((100, 1024), (1024, 256)))) == (100, 256, 1024, 1)
    assert gemm_shape(TraceOp("aten::addmm", ((512,), (1024, 1705), (1705, 512), (), ()))) == (1024, 512, 1705, 1)
    assert gemm_shape(TraceOp("aten::linear", ((4, 2048, 4096), (1024, 4096), (1024,)))) == (8192, 1024, 4096, 1)
    assert gemm_shape(TraceOp("aten::bmm", ((32, 128, 64), (32, 64, 256)))) == (128, 256, 64, 32)
    assert gemm_shape(TraceOp("aten::mm", ((100, 1024), (512, 256)))) is None  # inner dims differ
    shapes = Counter((p.op, p.m, p.n, p.k) for p in gemm_points(control))
    assert shapes[("aten::mm", 100, 256, 1024)] == 78


def test_elementwise_bytes_read_the_inputs_and_write_the_output():
    # add(a, b) of 1024 x 1024 fp32: read 2 x 4 MiB, write 4 MiB
    assert elementwise_bytes(TraceOp("aten::add", ((1024, 1024), (1024, 1024), ()), ("float", "float", "Scalar"))) == (
        3 * 4 * 1024 * 1024
    )
    # copy_(self bf16, src fp32): self is written (2 B), src read (4 B)
    assert elementwise_bytes(TraceOp("aten::copy_", ((10,), (10,), ()), ("c10::BFloat16", "float", "Scalar"))) == 60
    assert elementwise_bytes(TraceOp("aten::sum", ((10,),), ("float",))) is None  # a reduction: not a point


def test_the_fit_improves_the_public_trace_and_names_its_doubts(control):
    """A100 (the trace's A100-PG509-200 is the SXM4 part with 40 GB: 108 SMs alike): GEMM ceiling per dtype,
    fixed cost, HBM fraction and per-kernel cost refitted; the median error of the memory-bound kernels falls. Its
    host is the bound for 2,333 of 8,568 launches: host_launch_s is their gaps' median, 35 us (tests/planner/
    test_trace_fit_host.py)."""
    fit = fit_trace(control, A100)
    assert set(fit.constants) == {"gemm_ceiling", "gemm_fixed_s", "hbm", "kernel_s", "host_launch_s"}
    assert fit.constants["host_launch_s"] == fit.efficiency.host_launch_s == 35e-6
    assert set(fit.constants["gemm_ceiling"]) == {"tf32", "fp32"}
    assert len(gemm_points(control)) == 1776 and len(memory_points(control)) == 3942
    assert fit.median_error_after["memory"] < 0.8 * fit.median_error_before["memory"]
    assert fit.median_error_after["gemm"] < 0.3
    # the fitted ceiling is what the model then uses
    tf32 = fit.constants["gemm_ceiling"]["tf32"]
    big = gemm_time((8192.0,), 8192.0, 8192.0, "tf32", A100, fit.efficiency) - fit.efficiency.gemm_fixed_s
    assert big == pytest.approx(2 * 8192**3 / (156e12 * tf32 * 8192 / (8192 + EFFICIENCY.gemm_k0)), rel=0.02)
    # its fp32 (SIMT) GEMMs have k = 30: far from what a ceiling describes, and it says so
    assert any("gemm_ceiling.fp32" in w for w in fit.warnings)
    row = next(r for r in fit.rows if r["op"] == "aten::mm" and r["shape"] == [100, 256, 1024, 1])
    assert row["count"] == 78 and row["dtype"] == "tf32"
    summary = {k["kind"]: k for k in fit.kernels}
    assert summary["nccl"]["per_step"] == 10 and summary["gemm"]["count"] == 2388
    assert sum(k["share"] for k in fit.kernels) == pytest.approx(1.0)


def _kineto_trace(kernels, steps=1, rank=0, world=8):
    """A trace as Kineto writes one: kernels launched under aten ops on one host thread."""
    events, t = [], 0
    for i in range(steps):
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{i}", "ts": 0, "dur": 1})
    for corr, (name, dur, args, op) in enumerate(kernels, start=1):
        if op:
            events.append({"ph": "X", "cat": "cpu_op", "name": op[0], "pid": 1, "tid": 1, "ts": t, "dur": 10,
                           "args": {"External id": corr, "Input Dims": op[1], "Input type": op[2]}})  # fmt: skip
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": t + 1,
                       "dur": 2, "args": {"correlation": corr, "External id": corr}})  # fmt: skip
        events.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": t + 5, "dur": dur,
                       "args": {"correlation": corr, **args}})  # fmt: skip
        t += 100
    return {"traceEvents": events, "distributedInfo": {"rank": rank, "world_size": world}}


def test_nccl_message_bytes_follow_nccl_tests():
    """Kineto's collective metadata (output_json.cpp; its own test uses _allgather_base, Float, 65664 in and
    131328 out, group size 2): allgather's message is the gathered output, allreduce's the buffer."""
    args = {"Collective name": "_allgather_base", "dtype": "Float", "In msg nelems": 65664, "Out msg nelems": 131328}
    assert message_bytes("allgather", args) == 131328 * 4
    assert message_bytes("allreduce", {"dtype": "BFloat16", "In msg nelems": 1000, "Out msg nelems": 1000}) == 2000
    assert message_bytes("allreduce", {"dtype": "Float"}) is None
    trace = load_trace(_kineto_trace([("ncclDevKernel_AllGather_RING_LL(x)", 30, args | {"Group size": 2}, None)]))
    (k,) = trace.kernels
    assert (k.collective, k.message_bytes, k.group_size) == ("allgather", 525312, 2)


def test_the_collectives_meet_the_ledger():
    """A small GPT under DDP on 8 H100s: the ledger's gradient allreduce buckets against a trace that recorded the
    same messages: matched by (op, bytes), calls per step and seconds per call side by side."""
    spec = ModelSpec(num_layers=2, hidden_size=1024, num_attention_heads=8, ffn_hidden_size=4096, vocab_size=32000,
                     seq_length=1024, name="tiny")  # fmt: skip
    work = WorkloadSpec(micro_batch_size=1, global_batch_size=8)
    par = ParallelSpec(dp=8, zero_stage=0)
    from collectives.topology import cluster_preset

    plan = build_plan(spec, work, par, cluster_preset("dgx-h100", 1))
    allreduce = [pc for pc in plan.calls if pc.call.op.value == "allreduce"]
    biggest = max(allreduce, key=lambda pc: pc.call.message_bytes)
    nelems = biggest.call.message_bytes // 4  # fp32 gradients
    assert nelems * 4 == biggest.call.message_bytes
    kernel = ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(x)", 500, {"dtype": "Float", "In msg nelems": nelems}, None)
    trace = load_trace(_kineto_trace([kernel, kernel], steps=2))
    rows, stage, warnings = compare_collectives(trace, plan)
    assert stage == 0 and warnings == []
    row = next(r for r in rows if r["message_bytes"] == biggest.call.message_bytes)
    assert row["trace_calls_per_step"] == 1 and row["trace_s_per_call"] == pytest.approx(500e-6)
    assert row["plan_calls_per_iteration"] == biggest.call.calls_per_iteration
    assert row["plan_s_per_call"] == pytest.approx(biggest.price.time_s)
    # the public trace records no sizes: one row per op, counts only, and it says the world differs
    control = load_trace((TRACES / "hta_trace_diff_control.json.gz").read_bytes())
    rows, _, warnings = compare_collectives(control, plan)
    by_op = {r["op"]: r for r in rows}
    assert by_op["allreduce"]["trace_calls_per_step"] == 3 and by_op["sendrecv"]["trace_calls_per_step"] == 7
    assert by_op["allreduce"]["message_bytes"] is None and by_op["allreduce"]["plan_calls_per_iteration"] >= 1
    assert warnings == [] and control.world_size == plan.world_size == 8


@pytest.mark.parametrize(
    "data, field, words",
    [
        ('{"traceEvents": [{"ph": "X", "cat": "kernel"', "trace", "truncated"),
        ("[1, 2", "trace", "not JSON"),
        ({"events": []}, "trace.traceEvents", "missing"),
        (
            {"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 0, "dur": "5"}]},
            "trace.traceEvents[0]",
            "dur",
        ),
        (
            {"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 5}]},
            "trace",
            "no GPU kernel",
        ),
        (b"\x1f\x8b\x08\x00" + b"\x00" * 8, "trace", "gzip"),
        ({"traceEvents": [7]}, "trace.traceEvents[0]", "an event is an object"),
    ],
)
def test_a_malformed_or_truncated_trace_names_what_is_wrong(data, field, words):
    with pytest.raises(SpecError) as err:
        load_trace(data)
    assert err.value.field == field and words in err.value.rule


def test_hostile_shapes_and_numbers_are_read_safely():
    """Dims nested deeper than a tensor list, a huge or non-finite time, JSON nested past the parser: named or
    ignored, never a crash."""
    deep = [[[[[[1]]]]]]
    kernel = ("void gemm_kernel(x)", 5, {}, ("aten::mm", deep, ["float"]))
    trace = load_trace(_kineto_trace([kernel]))
    assert gemm_shape(trace.ops[0]) is None
    odd_types = ("void gemm_kernel(x)", 5, {}, ("aten::mm", [[8, 8], [8, 8]], 5))
    trace = load_trace(_kineto_trace([odd_types] * 3))
    assert trace.ops[0].types == () and fit_trace(trace, A100).constants == {}  # shapes, but no dtype: no point
    huge = {"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 0, "dur": 10**400}]}
    with pytest.raises(SpecError, match="numeric ts and dur"):
        load_trace(huge)
    with pytest.raises(SpecError, match="nested deeper"):
        load_trace("[" * 100_000 + "]" * 100_000)


def test_a_truncated_gzip_and_a_bomb_are_refused():
    raw = (TRACES / "hta_sampled_rank-0.json.gz").read_bytes()
    with pytest.raises(SpecError, match="ends early"):
        load_trace(raw[: len(raw) // 2])
    with pytest.raises(SpecError, match=r"more than 1,000 bytes \(1.00 KB, the limit\)"):  # the page's units too
        load_trace(gzip.compress(json.dumps({"traceEvents": []}).encode() + b" " * 5000), max_bytes=1000)
    with pytest.raises(SpecError, match="more than the limit of 3"):
        load_trace({"traceEvents": [{}] * 4}, max_events=3)


_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-(10**20), 10**20), st.floats(allow_nan=False), st.text(max_size=8)
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
_NAMES = ["ncclDevKernel_AllReduce_Sum_f32", "void gemm(x)", "aten::mm", "aten::add", "ProfilerStep#1", 7]
_ARGS = ["correlation", "Input Dims", "Input type", "dtype", "In msg nelems", "Out msg nelems", "Group size"]
_EVENT = st.fixed_dictionaries(
    {
        "ph": st.sampled_from(["X", "B", 1]),
        "cat": st.sampled_from(["kernel", "cpu_op", "cuda_runtime", "user_annotation", None]),
    },
    optional={
        "name": st.sampled_from(_NAMES),
        "ts": _SCALARS,
        "dur": _SCALARS,
        "pid": _VALUES,
        "tid": _VALUES,
        "args": st.dictionaries(st.sampled_from(_ARGS), _VALUES, max_size=4),
    },
)


@settings(max_examples=150, deadline=None)
@given(st.lists(_EVENT, max_size=12), _VALUES)
def test_any_event_list_is_read_or_refused_with_a_spec_error(events, extra):
    """Whatever JSON a hostile trace holds, the reader and the fit answer or raise SpecError: never a crash."""
    try:
        trace = load_trace({"traceEvents": events, "deviceProperties": extra, "distributedInfo": extra})
    except SpecError:
        return
    fit_trace(trace, A100)
    compare_collectives(trace)
