"""Traces of other PyTorch, ROCm, cuDNN and NCCL versions read by rule (planner/profile_trace.py): Kineto's pre-1.10
category names, Chrome's B/E duration pairs, HIP launch calls, Tensile GEMMs, cuDNN's convolutions and ops; and the
ways a trace is refused. The real traces are tests/reference/traces (README.md: their provenance and the jq counts
asserted here)."""

import copy
import gzip
import json
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from planner import SpecError
from planner.profile_trace import LAUNCH_CALL, WAIT_CALL, category, kernel_class, load_trace

TRACES = Path(__file__).resolve().parents[1] / "reference" / "traces"


def _events(name: str) -> dict:
    data = json.loads(gzip.decompress((TRACES / name).read_bytes()))
    return {"traceEvents": data} if isinstance(data, list) else data


def _same(a, b) -> None:
    """Two traces read alike: every kernel (name, class, operator; its time to the microsecond timestamps' float
    rounding: an end at 4.2e12 us minus its start keeps ~1e-9 s), operator and launch."""
    assert [replace(k, dur_s=0) for k in a.kernels] == [replace(k, dur_s=0) for k in b.kernels]
    assert [k.dur_s for k in a.kernels] == pytest.approx([k.dur_s for k in b.kernels], abs=1e-9)
    assert a.ops == b.ops and a.steps == b.steps and len(a.launches) == len(b.launches)
    for x, y in zip(a.launches, b.launches, strict=True):
        assert (x.thread, x.start_s, x.kernel_start_s, x.after_wait) == (
            y.thread,
            y.start_s,
            y.kernel_start_s,
            y.after_wait,
        )
        assert x.end_s == pytest.approx(y.end_s, abs=1e-9)


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        # cuDNN's precompiled convolutions (the name's <s|h|i>cudnn), engines, FFT and Winograd, xmma implicit GEMMs,
        # and its bundled CUTLASS (Kineto's 2021 ResNet-50 sample, HTA's AlexNet and nccl_data traces)
        ("volta_scudnn_128x64_relu_medium_nn_v1", "conv"),
        ("cudnn_infer_ampere_scudnn_128x64_relu_xregs_large_nn_v1", "conv"),
        ("void implicit_convolve_sgemm<float, float, 128, 5, 5, 3, 3, 3, 1, false, true, true>(int)", "conv"),
        ("void cudnn::cnn::wgrad_alg0_engine<float, 128, 6, 7, 3, 3, 5, false, 512>(int)", "conv"),
        ("void cudnn::detail::dgrad_engine<float, 512, 6, 5, 3, 3, 3, false>(int)", "conv"),
        ("void fft2d_r2c_32x32<float, false, 0u, false>(float2*)", "conv"),
        ("sm80_xmma_fprop_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc_nchw_tilesize128x128x16", "conv"),
        ("void cutlass_cudnn_infer::Kernel<cutlass_tensorop_s1688dgrad_optimized_tf32_64x256_16x4_nhwc>(x)", "conv"),
        ("void cask_cudnn::computeOffsetsKernel<false, false>(cask_cudnn::ComputeOffsetsParams)", "conv"),
        # ROCm: Tensile's GEMMs (rocBLAS, hipBLASLt), the MI250 trace
        ("Cijk_Alik_Bljk_SB_Bias_AS_SAV_UserArgs_MT64x16x32_MI16x16x1_SN_LDSB0", "gemm"),
        # cuDNN's ops library and batch norms, PyTorch's own kernels and THCUNN's (memory-bound, no matrix product)
        ("void cudnn::ops::nchwToNhwcKernel<float, float, float, false, true, (cudnnKernelDataType_t)2>(x)", "memory"),
        ("void nchwToNhwcKernel<float, float, float, true, false, (cudnnKernelDataType_t)0>(x)", "memory"),
        ("void cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float, int, 128, true, 1, true>(cudnnTensorStruct)", "memory"),
        ("void at::native::(anonymous namespace)::max_pool_forward_nchw<float, float>(int)", "memory"),
        ("void at::native::(anonymous namespace)::fused_dropout_kernel_vec<float, float, unsigned int>(x)", "memory"),
        ("void cunn_ClassNLLCriterion_updateOutput_kernel<float, float>(float*)", "memory"),
        # Inductor's kernels by category (torch/_inductor/codegen/triton.py: triton_<cat[:3]>_<fused>_<n>): a template
        # is a matmul unless it is flex attention or a convolution; pointwise and reductions are memory-bound
        ("triton_tem_fused_addmm_relu_1", "gemm"),
        ("triton_tem_fused_flex_attention_0", "attention"),
        ("triton_tem_fused_convolution_2", "conv"),
        ("triton_per_fused_native_layer_norm_3", "memory"),
        ("triton_poi_fused_add_cos_sin_0", "memory"),
        # NCCL 2.19+ (src/device/generate.py) and Blackwell's cuBLAS and cuDNN, as public profiles print them
        ("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "nccl"),
        ("nvjet_sm100_qrsss_256x256_128x4_2x1_2cta_v_bz_NTT", "gemm"),
        ("cudnn_generated_fort_native_sdpa_sm100_flash_bprop_f16_knob_7_128x128x64", "attention"),
        # FlashAttention 2 and 3 (FA3 inside a CUTLASS device kernel: attention is matched first), Transformer
        # Engine's own kernels (its GEMMs are cuBLASLt's)
        (
            "void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::bfloat16_t>>(x)",
            "attention",
        ),
        ("void cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<x>>>(x)", "attention"),
        ("void transformer_engine::detail::cast_transpose_kernel<8, true, float, __nv_bfloat16>(x)", "memory"),
        ("void transformer_engine::fused_rope_forward_kernel<__nv_bfloat16>(x)", "memory"),
        # unchanged: cuBLAS GEMMs, fbgemm_gpu's embeddings, NCCL 2.19+'s generic kernel, a sleep
        ("volta_sgemm_64x64_nn", "gemm"),
        ("void split_embedding_codegen_forward_unweighted_kernel<float>(x)", "other"),
        ("ncclDevKernel_Generic_4(ncclDevKernelArgsStorage<4096ul>)", "nccl"),
        ("at::cuda::(anonymous namespace)::spin_kernel(long)", "other"),
    ],
)
def test_kernel_names_of_other_versions_classify_by_their_library(name, kind):
    assert kernel_class(name) == kind


def test_launch_and_wait_calls_of_cuda_and_hip():
    for name in ("cudaLaunchKernel", "cuLaunchKernelEx", "hipLaunchKernel", "hipExtModuleLaunchKernel",
                 "hipModuleLaunchKernel", "hipLaunchCooperativeKernel"):  # fmt: skip
        assert LAUNCH_CALL.match(name), name
    for name in ("cudaGraphLaunch", "hipGraphLaunch", "hipMemcpyWithStream", "hipGetDevicePropertiesR0600"):
        assert not LAUNCH_CALL.match(name), name
    for name in ("hipDeviceSynchronize", "hipStreamSynchronize", "hipMemcpyWithStream", "cudaMemcpyAsync"):
        assert WAIT_CALL.match(name), name
    assert not WAIT_CALL.match("hipMemcpyPeerAsync") and not WAIT_CALL.match("hipLaunchKernel")


def test_the_categories_kineto_wrote_before_torch_1_10_read_as_todays():
    """Kineto's tb_plugin maps Operator/Runtime/Kernel/Memcpy/Memset (lower-cased) as cpu_op/cuda_runtime/kernel/
    gpu_memcpy/gpu_memset: the MI250 trace renamed so reads exactly as written today."""
    old = {"cpu_op": "Operator", "cuda_runtime": "Runtime", "kernel": "Kernel", "user_annotation": "user_annotation"}
    assert {category(v) for v in old.values()} == set(old) and category("Memset") == "gpu_memset"
    assert category("mtia_ccp_events") is None and category(None) is None
    data = _events("hta_mi250_minitoy_train_ROCm6_2_kineto.json.gz")
    renamed = copy.deepcopy(data)
    for e in renamed["traceEvents"]:
        e["cat"] = {"gpu_memcpy": "Memcpy"}.get(e.get("cat"), old.get(e.get("cat"), e.get("cat")))
    _same(load_trace(data), load_trace(renamed))


def test_b_e_duration_pairs_read_as_complete_events():
    """Each 'X' event of the MI250 trace that lasts written as a 'B' and an 'E' (the E with ph, ts, pid, tid and
    an extra arg) reads as the same trace. B/E nest per thread: at one time an end closes before a begin opens,
    the longer begin opens first and the later-opened end closes first (zero-length events stay 'X')."""
    data = _events("hta_mi250_minitoy_train_ROCm6_2_kineto.json.gz")
    keyed = []
    for i, e in enumerate(data["traceEvents"]):
        if e.get("ph") != "X" or not e.get("dur") or e.get("cat") == "Trace":
            keyed.append(((e.get("ts", 0), 2, 0, i), e))
            continue
        begin = {k: v for k, v in e.items() if k != "dur"} | {"ph": "B"}
        end = {"ph": "E", "ts": e["ts"] + e["dur"], "pid": e["pid"], "tid": e["tid"], "args": {"end": 1}}
        keyed += [((e["ts"], 1, -e["dur"], i), begin), ((end["ts"], 0, -e["ts"], i), end)]
    events = [e for _, e in sorted(keyed, key=lambda p: p[0])]
    assert sum(e["ph"] == "B" for e in events) > 100
    as_pairs = load_trace({**data, "traceEvents": events})
    _same(load_trace(data), as_pairs)
    assert Counter(k.kind for k in as_pairs.kernels) == {"gemm": 2, "memory": 12, "copy": 2}


@pytest.mark.parametrize(
    ("events", "where", "words"),
    [
        ([{"ph": "E", "ts": 5, "pid": 1, "tid": 1}], "trace.traceEvents[0]", "no open 'B'"),
        ([{"ph": "B", "cat": "kernel", "name": "k", "ts": 1, "pid": 1, "tid": 1},
          {"ph": "B", "cat": "cpu_op", "name": "k", "ts": 2, "pid": 1, "tid": 1}],
         "trace.traceEvents[0]", "2 'B' events are never closed"),
        ([{"ph": "B", "cat": "kernel", "name": "k", "ts": 9, "pid": 1, "tid": 1},
          {"ph": "E", "ts": 5, "pid": 1, "tid": 1}], "trace.traceEvents[0]", "dur >= 0"),
        ([{"ph": "B", "cat": "kernel", "name": "k", "ts": "9", "pid": 1, "tid": 1},
          {"ph": "E", "ts": 10, "pid": 1, "tid": 1}], "trace.traceEvents[0]", "numeric ts"),
    ],
)  # fmt: skip
def test_broken_b_e_pairs_are_refused_naming_the_event(events, where, words):
    with pytest.raises(SpecError) as err:
        load_trace({"traceEvents": events})
    assert err.value.field == where and words in str(err.value)


def test_a_trace_of_another_device_names_what_it_holds():
    """HTA's MTIA traces hold mtia_ccp_events and mtia_runtime, no CUDA kernel: refused naming them, not called a
    CPU-only run; the counts are in the page's units."""
    events = [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": i, "dur": 1, "pid": 1, "tid": 1} for i in range(1200)
    ]
    events += [{"ph": "X", "cat": "mtia_ccp_events", "name": "k", "ts": 1, "dur": 1, "pid": 2, "tid": 1}] * 3
    with pytest.raises(SpecError) as err:
        load_trace({"traceEvents": events})
    assert "among 1,203 events (1,200 CPU operators" in str(err.value)
    assert "its other activities are mtia_ccp_events (3), which are not CUDA or ROCm kernels" in str(err.value)


def test_the_real_traces_classify_as_counted_by_hand():
    """README.md's jq counts: the kernels by class of each trace, and the GEMM-named kernels a convolution operator
    launched (cuDNN's 1x1 convolutions run CUTLASS GEMMs) counted as the convolution's."""
    expected = {
        "hta_nccl_data.json.gz": {"gemm": 15, "conv": 300 + 234 + 66, "memory": 2064, "copy": 1074, "nccl": 21},
        "kineto_resnet50_2steps.json.gz": {"gemm": 10, "conv": 574 + 66 + 2, "memory": 2272, "copy": 108},
        "hta_alexnet.json.gz": {"gemm": 12, "conv": 16 + 2, "memory": 49, "copy": 19},
        "hta_mi250_minitoy_train_ROCm6_2_kineto.json.gz": {"gemm": 2, "memory": 12, "copy": 2},
        "hta_inference_rank_1.json.gz": {"gemm": 2, "memory": 2},
        "hta_triton_example.json.gz": {"memory": 1},
    }
    for name, kinds in expected.items():
        trace = load_trace((TRACES / name).read_bytes())
        assert Counter(k.kind for k in trace.kernels) == kinds, name


def test_an_execution_trace_or_chakra_graph_is_refused_naming_its_keys():
    """HTA's execution_trace test data (PyTorch's ExecutionTraceObserver: schema, pid, time, start_ts, nodes,
    finish_ts) and Chakra's JSON graph (workload_graph...) are other files than the Kineto trace: the 422 says so."""
    et = {"schema": "1.0.3-chakra.0.0.4", "pid": 1, "time": "x", "start_ts": 0, "nodes": [], "finish_ts": 1}
    with pytest.raises(SpecError) as err:
        load_trace(json.dumps(et))
    assert err.value.field == "trace.traceEvents"
    assert "the object's keys are schema, pid, time, start_ts, nodes, finish_ts: an execution trace" in str(err.value)
    with pytest.raises(SpecError) as err:
        load_trace({"traceEvents": 5})
    assert "keys" not in str(err.value)


def test_a_collective_row_says_its_group_and_bus_bandwidth():
    """Kineto's NCCL kernel args (torch >= 2.1: Collective name, In msg nelems, dtype, Group size): two allreduces of
    524,288 bf16 (1 MiB) in 100 us among 8 ranks are nccl-tests' 1,048,576 / 100e-6 x 2 x 7 / 8 = 18.35 GB/s of bus
    bandwidth; a row whose kernels record different group sizes says none."""
    from planner.trace_fit import compare_collectives

    def kernel(ts, group):
        args = {"Collective name": "allreduce", "In msg nelems": 524288, "Out msg nelems": 524288,
                "dtype": "BFloat16", "Group size": group}  # fmt: skip
        return {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(x)", "ts": ts,
                "dur": 100, "pid": 0, "tid": 7, "args": args}  # fmt: skip

    rows, _, _ = compare_collectives(load_trace({"traceEvents": [kernel(0, 8), kernel(200, 8)]}))
    (row,) = rows
    assert (row["op"], row["message_bytes"], row["group_size"], row["trace_calls_per_step"]) == (
        "allreduce",
        1_048_576,
        8,
        1.0,
    )  # fmt: skip  (the two kernels repeat: 2 steps of one)
    assert row["trace_busbw_GBps"] == pytest.approx(1_048_576 / 100e-6 * 2 * 7 / 8 / 1e9, rel=1e-12)
    (mixed,) = compare_collectives(load_trace({"traceEvents": [kernel(0, 8), kernel(200, 4)]}))[0]
    assert mixed["group_size"] is None and mixed["trace_busbw_GBps"] is None


def test_a_trace_without_args_reads_by_names_alone():
    """The MI250 trace with every event's args removed (a converter that drops them, or a hand-cut trace): the kernels
    classify by their names as before, nothing links them to an operator or a launch call, and nothing fails."""
    data = _events("hta_mi250_minitoy_train_ROCm6_2_kineto.json.gz")
    bare = {**data, "traceEvents": [{k: v for k, v in e.items() if k != "args"} for e in data["traceEvents"]]}
    trace, full = load_trace(bare), load_trace(data)
    assert [(k.name, k.kind) for k in trace.kernels] == [(k.name, k.kind) for k in full.kernels]
    assert all(k.op_index == -1 for k in trace.kernels) and trace.launches == () and not trace.record_shapes
    assert len(full.launches) == 14 and trace.steps == full.steps == 2


def test_a_trace_over_the_event_limit_says_both_counts_in_human_units():
    events = [{"ph": "X", "cat": "kernel", "name": "k", "ts": i, "dur": 1} for i in range(1001)]
    with pytest.raises(SpecError) as err:
        load_trace({"traceEvents": events}, max_events=1000)
    assert err.value.field == "trace.traceEvents" and "1,001 events is more than the limit of 1,000" in str(err.value)
