"""The profiler-trace calibration round-tripped on real LLM training traces (issue 20 item 4): torch.profiler over 3
forward + backward steps of a dense Llama-3 8B layer and of a Qwen3-235B MoE layer on this project's H200
(PyTorch 2.11, cuDNN 9.19, CUDA 13; tests/reference/kernels/h200/README.md, profile_*.txt for the per-op
tables): every kernel classified, the compute constants fitted near the committed ones (each tolerance with its
reason), and the layer the planner lists predicted from them against the trace's own kernel time by class."""

import sys
from collections import Counter
from pathlib import Path

import pytest

from collectives.topology.gpu import GPUS
from planner.compute import pass_time
from planner.kernels import (
    DATASHEET_CLOCK_MHZ,
    EFFICIENCY,
    GEMM_CEILING,
    clock_fraction,
    gemm_time,
    layer_kernels,
)
from planner.profile_trace import attention_shape, grouped_shape, load_trace, repeats
from planner.trace_fit import STRIDED_KERNEL, fit_trace, gemm_points, with_clock

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import h200_tables

H200_DIR = Path(__file__).resolve().parents[1] / "reference" / "kernels" / "h200"
H200 = GPUS["h200-sxm-141gb"]


def _trace(name):
    return load_trace((H200_DIR / f"trace_{name}.json.gz").read_bytes())


@pytest.fixture(scope="module")
def dense():
    trace = _trace("llama3_8b.tp1.s4096")
    return trace, fit_trace(trace, H200)


@pytest.fixture(scope="module")
def moe():
    trace = _trace("qwen3_235b.ep1.s2048")
    return trace, fit_trace(trace, H200)


def test_every_kernel_of_the_dense_trace_is_classified_as_the_profile_table_counts(dense):
    """profile_llama3_8b.tp1.s4096.txt (key_averages over the same 3 steps): 36 aten::mm (12 a step, each one nvjet
    kernel: launched by cuLaunchKernelEx, cat cuda_driver), 3 cuDNN forwards and 3 backwards (flash_bprop,
    compute_dot_do_o, convert_dq and 2 fmha_reduce_head: GQA's dK/dV head sums); no ProfilerStep annotation, so the
    steps are the kernel sequence's repeats."""
    trace, fit = dense
    assert (trace.device, trace.sms, trace.compute_capability) == ("NVIDIA H200", 132, 90)
    assert (trace.steps, trace.steps_from) == (3, "repeats")
    kinds = Counter(k.kind for k in trace.kernels)
    assert kinds == {"gemm": 36, "attention": 18, "memory": 135, "copy": 42}  # 189 kernels + 42 memsets
    assert all(k.op_index >= 0 for k in trace.kernels)  # every kernel found its launching operator
    assert fit.unclassified == []
    mm = [k for k in trace.kernels if trace.ops[k.op_index].name == "aten::mm"]  # each nvjet after a memset
    assert Counter(k.kind for k in mm) == {"gemm": 36, "copy": 36}
    assert sum(k.dur_s for k in mm) == pytest.approx(19.887e-3, abs=2e-6)  # Self CUDA 19.887 ms
    attention = [k for k in trace.kernels if k.kind == "attention"]
    fwd = [k for k in attention if trace.ops[k.op_index].name == "aten::_cudnn_attention_forward"]
    assert sum(k.dur_s for k in fwd) == pytest.approx(762.266e-6, abs=2e-6)  # the fprop kernel's 3 calls
    bwd = [k for k in trace.kernels if trace.ops[k.op_index].name == "aten::_cudnn_attention_backward"]
    assert Counter(k.kind for k in bwd) == {"attention": 15, "copy": 3}
    assert sum(k.dur_s for k in bwd) == pytest.approx(2.368e-3, abs=2e-6)  # the op's Self CUDA, memsets with it


def test_the_moe_trace_reads_its_grouped_gemms_and_routing_kernels(moe):
    """_grouped_mm: forward and data gradient 2D (17,376 x K) x 3D (128, K, N) with offs (128): 128 groups of
    17,376 / 128 = 135 rows; the weight gradient 2D x 2D, ragged K. CUB's radix sort, scans, gathers, topk and
    index_put's indexing_backward_kernel are memory-bound data movement: nothing is left unclassified."""
    trace, fit = moe
    assert trace.steps == 3 and fit.unclassified == []
    grouped = Counter((p.shape, p.ragged) for p in gemm_points(trace) if p.grouped)
    assert grouped == {
        ((135, 3072, 4096, 128), False): 3,
        ((135, 4096, 3072, 128), False): 3,
        ((3072, 4096, 135, 128), True): 3,
        ((135, 1536, 4096, 128), False): 3,
        ((135, 4096, 1536, 128), False): 3,
        ((4096, 1536, 135, 128), True): 3,
    }
    kinds = Counter(k.kind for k in trace.kernels)
    assert kinds["gemm"] == 63 and kinds["attention"] == 18 and "other" not in kinds


def test_shapes_follow_the_aten_schemas():
    from planner.profile_trace import TraceOp

    cudnn = TraceOp(
        "aten::_cudnn_attention_forward",
        ((1, 32, 4096, 128), (1, 8, 4096, 128), (1, 8, 4096, 128)),
        concrete=("", "", "", "", "", "", "4096", "4096", "True", "0.", "True", "False", ""),
    )
    assert attention_shape(cudnn) == ("cudnn", False, 1, 32, 4096, 4096, 128, True)
    dims = ((2, 1024, 16, 64), (2, 1024, 4, 64))
    flash = TraceOp("aten::_flash_attention_forward", dims, concrete=("",) * 8 + ("False",))
    assert attention_shape(flash) == ("flash2", False, 2, 16, 1024, 1024, 64, False)  # (B, S, H, D), not causal
    assert grouped_shape(TraceOp("aten::_grouped_mm", ((256, 64), (4, 64, 32), (4,)))) == (64, 32, 64, 4, False)
    assert grouped_shape(TraceOp("aten::_grouped_mm", ((64, 256), (256, 32), (4,)))) == (64, 32, 64, 4, True)
    from dataclasses import replace

    trace = _trace("llama3_8b.tp1.s4096")
    fit = fit_trace(replace(trace, steps=1, steps_from="none"), H200)
    assert any("no ProfilerStep#N annotations" in w for w in fit.warnings)
    assert STRIDED_KERNEL.search("void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<")
    assert STRIDED_KERNEL.search("void at::native::elementwise_kernel_manual_unroll<128, 4, ...>")
    assert not STRIDED_KERNEL.search("void at::native::vectorized_elementwise_kernel<8, at::native::FillFunctor<")
    assert not STRIDED_KERNEL.search("void at::native::unrolled_elementwise_kernel<...>")  # contiguous, with a cast
    assert repeats(list("abcabcabc")) == 3 and repeats(list("abcabcab")) == 1 and repeats(list("aaaa")) == 4


def test_the_dense_trace_fits_the_h200_constants(dense):
    """The fitted constants against the committed ones (planner/kernels.py), each tolerance with its reason:

    - clock 0.963 of the 1,830 MHz datasheet clock (1,762 MHz): between the 0.798 a training step sustains under the
      700 W cap (the H200's own GPUSpec.sustained_clock: run 2's 30 s loop by throughput) and the 1,980 MHz boost
      (1.082) nvidia-smi read during the profile (run4_profile_smi.csv: 1,980 MHz at 80-146 W: 3 short steps never
      reach the cap). The bf16 ceiling is kept at the tables' 0.886 (measured at logged clocks), so the clock carries
      what the trace says;
    - cuDNN attention (0.721, 0.576) against the H200 tables' own cuDNN 9.19 fit (0.705, 0.576; docs/step-time.md)
      within 3%: the trace's one shape (s 4,096, causal, GQA 32/8) at the fitted clock agrees with 57 timed shapes.
      The committed (0.55, 0.42) is aiconfigurator's older FMHA, kept for the 2024 stacks: 24-27% below;
    - hbm 0.95 against 0.877 (copies >= 128 MiB): within 10%; the trace's big adds run at 0.91-0.93 of the
      datasheet HBM (part of an operand the kernel before wrote, 33.5 MB, may still sit in the 50 MB L2);
    - kernel_s 1 us against 5 us: a kernel's own time on the GPU; the committed 5 us is the eager step's
      (the CUDA-graph replay of tiny kernels measured 1.05-2.4 us, runs 1-2 ``launch``)."""
    _, fit = dense
    c = fit.constants
    assert c["clock"] == pytest.approx(0.963, abs=0.005)
    assert clock_fraction(H200) == 0.798 < c["clock"] < 1980 / DATASHEET_CLOCK_MHZ[90]
    # what the trace pins is clock x ceiling (0.853 of the 989 TF datasheet peak): should the bf16 ceiling be
    # refitted on the tables, the clock moves against it
    assert c["clock"] * GEMM_CEILING[(90, "bf16")] == pytest.approx(0.853, abs=0.005)
    assert "gemm_ceiling" not in c  # bf16 has a measured ceiling: the clock is fitted instead
    assert c["attention_ceiling"]["cudnn_fwd"] == pytest.approx(0.705, rel=0.03)
    assert c["attention_ceiling"]["cudnn_bwd"] == pytest.approx(0.576, rel=0.03)
    assert c["hbm"] == pytest.approx(EFFICIENCY.hbm, rel=0.10) and c["hbm"] == 0.95
    assert c["kernel_s"] == 1e-6 and c["gemm_fixed_s"] == 1e-6
    assert any("1,762 MHz" in w and "0.798 (1,460 MHz)" in w and "sustained_clock" in w for w in fit.warnings)
    # the clock is what the model then runs at: a big bf16 GEMM goes exactly as 1 / clock
    big = (8192.0,), 8192.0, 8192.0, "bf16"
    ratio = gemm_time(*big, with_clock(H200, c["clock"]), EFFICIENCY) / gemm_time(*big, H200, EFFICIENCY)
    fixed = EFFICIENCY.gemm_fixed_s
    t0 = gemm_time(*big, H200, EFFICIENCY) - fixed
    assert (ratio * (t0 + fixed) - fixed) / t0 == pytest.approx(clock_fraction(H200) / c["clock"], rel=1e-9)
    # the kernels before and after: GEMMs 15.4% -> 1.4% median, cuDNN attention 52% -> 1.6%, contiguous memory
    # kernels 28% -> 7.1%; PyTorch's strided elementwise_kernel rows (not fitted) stay 40-60% slow in the model
    before, after = fit.median_error_before, fit.median_error_after
    # (the "before" medians are the committed constants': 15.4%, 52.5%, 28.0% when this was written)
    assert before["gemm"] > 0.1 and after["gemm"] < 0.02
    assert before["attention"] > 0.3 and after["attention"] < 0.02
    assert before["memory"] > 0.15 and after["memory"] < 0.08
    assert after["memory_strided"] > 0.4


def _layer(name):
    rows = [r for run in ("run2", "run3_heldout") for r in h200_tables.load(run)["layers"] if r["layer"] == name]
    return h200_tables.layer_context(rows[0])


def _by_kind(ctx, moe_layer, gpu, eff):
    lk = layer_kernels(ctx, moe_layer, gpu, eff)
    out = Counter()
    for k in (*lk.forward, *lk.backward):
        out[k.kind] += k.time_s
    return out, pass_time(lk.forward).total_s + pass_time(lk.backward).total_s


def test_the_layer_planned_with_the_fitted_constants_matches_the_trace_by_class(dense, moe):
    """The round trip: the planner's own kernel list of the traced layer (kernels.layer_kernels, the bench's layer
    context: torch eager, cuDNN attention), before and after the fit, against the trace's kernel time per step. Dense:
    GEMMs 8.05 -> 6.61 ms (trace 6.62), attention 1.71 -> 1.04 ms (trace 1.04); "before" is at the H200's sustained
    0.798 (7.55 and 1.60 at 0.852 before sus12: compute-bound time x 0.852 / 0.798 = 1.068). Its memory-bound kernels
    stay short (0.91 ms against 1.70 ms): the bench's strided halves, cat/neg rotary and copies are what the model does
    not list (docs/step-time.md class (c)). MoE: GEMMs 7.53 -> 6.04 ms against 6.62 (the grouped GEMMs' forward and
    dgrad were already 12-17% fast in the model, the burst clock makes them faster), attention 1.03 -> 0.58 ms against
    0.60."""
    _, fit = dense
    ctx, is_moe = _layer("llama3_8b.tp1.s4096")
    measured = {k["kind"]: k["seconds_per_step"] for k in fit.kernels}
    before, step_before = _by_kind(ctx, is_moe, H200, None)
    after, step_after = _by_kind(ctx, is_moe, fit.gpu, fit.efficiency)
    assert before["gemm"] / measured["gemm"] - 1 > 0.08  # +21.7% at the H200's sustained 0.798 (+14.0% at 0.852)
    assert after["gemm"] == pytest.approx(measured["gemm"], rel=0.01)
    assert after["attention"] == pytest.approx(measured["attention"], rel=0.01)
    assert before["attention"] > 1.5 * measured["attention"]
    assert after["memory"] < 0.6 * measured["memory"]  # what the model does not list: not fitted away
    assert step_after < 0.9 * step_before  # 0.789x (0.836x from 0.852)

    _, fit = moe
    ctx, is_moe = _layer("qwen3_235b.ep1.s2048")
    measured = {k["kind"]: k["seconds_per_step"] for k in fit.kernels}
    before, _ = _by_kind(ctx, is_moe, H200, None)
    after, _ = _by_kind(ctx, is_moe, fit.gpu, fit.efficiency)
    assert after["attention"] == pytest.approx(measured["attention"], rel=0.03)
    assert after["gemm"] / measured["gemm"] - 1 == pytest.approx(-0.085, abs=0.01)
    assert before["gemm"] > measured["gemm"]  # +13.8% at the H200's sustained 0.798 (+6.7% at 0.852)
    assert fit.constants["clock"] == pytest.approx(1.015, abs=0.005)  # GEMMs of 2,048 tokens: a shorter burst


def test_an_attention_points_flops_are_the_planners_with_mlas_head_dims():
    """trace_fit.attention_points counts FLOPs with the planner's one formula (kernels.core_attention_flops, which
    attention_flops calls), with the value's own head dim: an MLA operator (DeepSeek-V3: q and k 192, v 128)
    does 2·b·s·keys·heads·(192 + 128), not (192 + 192) as the restated line gave (review)."""
    from planner.kernels import causal_keys, core_attention_flops
    from planner.profile_trace import Trace, TraceKernel, TraceOp, value_head_dim
    from planner.trace_fit import attention_points

    q, v = (1, 16, 4096, 192), (1, 16, 4096, 128)
    mla = TraceOp("aten::_cudnn_attention_forward", (q, q, v), concrete=("",) * 10 + ("True",))
    gqa = TraceOp("aten::_cudnn_attention_forward", (q, q, q), concrete=("",) * 10 + ("True",))
    assert value_head_dim(mla) == 128 and value_head_dim(gqa) == 192
    kernels = (TraceKernel("cudnn_fmha", "attention", 1e-3, 0), TraceKernel("cudnn_fmha", "attention", 1e-3, 1))
    trace = Trace(kernels, (mla, gqa), "NVIDIA H200", 132, 90, 1, None, None, 2, True)
    points = attention_points(trace)
    keys = causal_keys(4096, None)
    assert points[0].flops == 2.0 * 4096 * keys * 16 * (192 + 128) == core_attention_flops(1, 4096, keys, 16, 192, 128)
    assert points[1].flops == 2.0 * 4096 * keys * 16 * (192 + 192)
