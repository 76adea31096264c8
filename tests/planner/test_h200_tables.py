"""The kernel model against this project's own H200 kernel tables (tests/reference/kernels/h200/: run 1 and run 2
measured by bench/measure_kernels.py on the lent H200 SXM 141 GB at 700 W, PyTorch 2.11, cuDNN 9.19; run 3 the
held-out whole layers, measured before any constant was refitted). bench/h200_tables.py is the one home of the
comparison: each kernel row is predicted at the SM clock it logged; whole layers at the clock their short bursts hold
in the model's units (h200_tables.burst_clock_mhz: the trained 8B layer's own row)."""

import sys
from pathlib import Path

import pytest

from planner.kernels import (
    ATTENTION_CEILING,
    DATASHEET_CLOCK_MHZ,
    EFFICIENCY,
    FP8_CLOCK,
    GEMM_CEILING,
    GROUPED_GEMM_K0,
    clock_fraction,
    dense_peak,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import h200_tables
import kernel_fit

CLASSES = {c["class"]: c for c in h200_tables.classes()}


def test_the_committed_hopper_constants_are_what_runs_1_and_2_measure():
    """A fixed point: refitting on runs 1-2 (h200_tables.fit) gives back the committed constants within 1.5%.
    The trained layer's logged clock 1,560 / 1,830 MHz (run 2 layer_sustained: not the model's, which is 0.798 by
    throughput, test_h200_power.py); bf16 GEMM ceiling 0.886; cudnn (0.705, 0.576) and
    flash2 (0.353, 0.307) attention; HBM 4.21 TB/s of 4.8; eager dispatch 10 us. cuDNN 9.19's attention fits
    (0.705, 0.576), 28% and 37% above the committed (0.55, 0.42): not adopted (planner/kernels.py says why)."""
    fit = h200_tables.fit()
    assert h200_tables.sustained_clock_mhz() == 1560
    assert fit["logged_clock"] == pytest.approx(1560 / 1830)
    assert clock_fraction(h200_tables.GPU) == 0.798 < fit["logged_clock"]
    assert GEMM_CEILING[90, "bf16"] == pytest.approx(fit["gemm_bf16"], rel=0.015)
    fwd, bwd = ATTENTION_CEILING["flash2", 90]
    assert (fwd, bwd) == pytest.approx((fit["flash2_fwd"], fit["flash2_bwd"]), rel=0.015)
    assert ATTENTION_CEILING["cudnn", 90] == (0.55, 0.42)
    assert (fit["cudnn_fwd"], fit["cudnn_bwd"]) == pytest.approx((0.705, 0.576), rel=0.02)
    assert EFFICIENCY.hbm == pytest.approx(fit["hbm"], rel=0.005) and fit["hbm"] * 4800 == pytest.approx(4210, rel=0.01)
    # the graph-replayed floor of a tiny kernel (1.3 us) is not the model's kernel_s (5 us): a real eager step's
    # memory-bound kernels fit 4 us (the HTA trace, tests/app/test_calibrate_trace.py)
    assert fit["kernel_s"] == pytest.approx(1.3e-6, rel=0.05) and EFFICIENCY.kernel_s == 5e-6
    assert EFFICIENCY.cpu_op_s == pytest.approx(fit["cpu_op_s"], rel=0.01)


def test_fp8_gemms_and_casts_at_the_h200s_rates():
    """Hopper fp8 is the H200's: tensorwise torch._scaled_mm at its logged clocks fits 0.844-0.852 (the committed
    0.844), held at FP8_CLOCK of the bf16 clock in a step; a cast to fp8 streams at 0.636 of the HBM datasheet rate
    (CAST_HBM), not a copy's 0.877. aiconfigurator's H100 fp8 table (clock not recorded) runs slower than this:
    tests/planner/test_kernels.py states by how much."""
    fit = h200_tables.fit()
    assert GEMM_CEILING[90, "fp8"] == pytest.approx(fit["gemm_fp8"], rel=0.015)
    # not measured here: aiconfigurator's H100 block-scaled ceiling (0.596 at its rows' clock) under FP8_CLOCK, 0.629
    # on its rows as timed; the GEMM alone, those rows less their input quantize (bwcast14, kernel_fit.AS_TIMED), 0.728
    assert FP8_CLOCK[90] == 0.947 and kernel_fit.AS_TIMED["h100_sxm", "fp8_block"] == round(0.596 / 0.947, 3)
    assert GEMM_CEILING[90, "fp8_block"] == kernel_fit.quantize_free_ceiling("h100_sxm", "fp8_block") == 0.728
    assert CLASSES["GEMM fp8 tensorwise"]["median_abs"] < 0.06
    assert CLASSES["memory fp8_cast"]["median_abs"] < 0.05


def test_the_clock_enters_once():
    """The model's Hopper peak is the datasheet's (quoted at 1,830 MHz: 132 SMs x 4,096 FLOP/clk) x the sustained
    fraction, the H200's own by throughput (GPUSpec.sustained_clock: 0.798); fp8 at its fp8 ratio of it (0.969:
    1,367 / 1,411 MHz, the sustained GEMMs in the model's units); a row at a logged clock is predicted at datasheet
    x clock / 1,830 (at_clock), whatever the sustained fraction is."""
    gpu = h200_tables.GPU
    own = gpu.sustained_clock
    assert 132 * 4096 * DATASHEET_CLOCK_MHZ[90] * 1e6 == pytest.approx(989.4e12, rel=1e-4)
    assert dense_peak(gpu, "bf16") == pytest.approx(989.4e12 * 0.798) and own.fraction == 0.798
    assert clock_fraction(gpu, "fp8") == pytest.approx(0.798 * 0.969) and own.fp8_ratio == 0.969
    for dtype in ("bf16", "fp8"):
        at = h200_tables.at_clock(1455, dtype)
        assert dense_peak(at, dtype) == pytest.approx(gpu.peak(dtype) * 1455 / 1830)


@pytest.mark.parametrize(
    "name, median_abs",
    [
        ("GEMM bf16 fwd", 0.05),
        ("GEMM bf16 dgrad", 0.05),
        ("GEMM bf16 wgrad", 0.06),
        ("GEMM bf16 decode (m 1-256)", 0.10),
        ("GEMM bf16 decode_graph (m 1-256)", 0.09),
        ("grouped _grouped_mm coarse (uniform)", 0.05),
        ("grouped _grouped_mm coarse (zipf 1.2)", 0.04),
        ("grouped _grouped_mm fine (uniform)", 0.06),
        ("grouped _grouped_mm fine (zipf 1.2)", 0.09),
        ("attention flash2 fwd", 0.09),
        ("attention flash2 bwd", 0.04),
        ("copy >= 128 MiB eager", 0.03),
        ("memory add", 0.08),
        ("memory silu_mul_eager", 0.04),
    ],
)
def test_each_kernel_class_within_its_measured_median(name, median_abs):
    """Median |predicted / measured - 1| per class of the H200 tables (run 2's rows at their logged clocks;
    memory-bound and launch rows of runs 1 and 2): the numbers docs/step-time.md shows."""
    assert CLASSES[name]["median_abs"] < median_abs, CLASSES[name]


def test_what_the_model_still_misses_on_the_h200():
    """Measured, not fixed (docs/step-time.md): FlashAttention-2's head-dim-64 rows run 12% slower forward than the
    model gives them (its d-64 rate is 0.97 of d 128's, kernels.HEAD_DIM_K, but these rows run slower than the d-128
    class's GQA rows); copies under 128 MiB sit in the 50 MB L2 and run faster than HBM; cuDNN 9.19's attention runs
    28% (forward) and 37% (backward) faster than the committed cudnn ceiling, and its d-64 rows, now at their d-64
    rate (gptoss), 16% and 30% faster (they read -11% / +7% when d 64 ran at the d-128 rate)."""
    assert 0.10 < CLASSES["attention cudnn d64 fwd"]["signed_median"] < 0.20
    assert 0.25 < CLASSES["attention cudnn d64 bwd"]["signed_median"] < 0.35
    assert CLASSES["attention flash2 d64 fwd"]["signed_median"] < -0.10
    assert CLASSES["copy < 128 MiB graph"]["signed_median"] > 0.15
    assert 0.25 < CLASSES["attention cudnn fwd"]["signed_median"] < 0.31
    assert 0.33 < CLASSES["attention cudnn bwd"]["signed_median"] < 0.40


def test_held_out_layers_within_the_issue_targets():
    """Run 3's seven PyTorch-eager layers (measured before any refit) with the planner's own layer kernels at its
    bursts' clock in the model's units (1,570 MHz: the 8B layer's own burst row, burst_clock_mhz): forward + backward
    median |error| 3.1%, signed -0.0%, worst +9.2% (Llama-3 8B at 16k; at the read clock 1,560 MHz before sus12:
    3.5%, +0.5%, +9.9%: 10 MHz higher the only change); Qwen3-235B's MoE layer -4.2% (-26.2% before the grouped
    GEMM's spread rows and ptr-array k0, -12.2% before the torch flavour listed torchtitan's fp32 score multiply: the
    bench's layer runs its own gather and bf16 multiply instead, 8 B per routed element where torchtitan's is 20, so
    part of that step is the bench's unlisted class-(c) kernels cancelling, docs/step-time.md); the four dense layers
    within 10% each. Issue 20's targets: median <= 10%, signed within 5%, none beyond 30%."""
    rows = h200_tables.layer_table(h200_tables.HELDOUT_RUN)
    s = h200_tables.summary("step", [r["step_err"] for r in rows])
    assert s["n"] == 7 and s["median_abs"] < 0.045 and abs(s["signed_median"]) <= 0.02 and abs(s["worst"]) < 0.11
    moe = {r["layer"]: r["step_err"] for r in rows if ".ep" in r["layer"]}
    assert -0.06 < moe["qwen3_235b.ep1.s2048"] < -0.01 and 0.01 < moe["gptoss_like.ep4.s4096"] < 0.06, moe
    dense = {r["layer"]: r["step_err"] for r in rows if ".ep" not in r["layer"]}
    assert len(dense) == 4 and all(abs(e) < 0.10 for e in dense.values()), dense


def test_the_fit_set_layers():
    """Run 2's five layers: the three dense ones within 8% forward + backward; the two MoE layers still too fast (-5.3%,
    -6.7% at the bursts' 1,570 MHz; -4.9%, -6.1% at 1,560 before sus12; -17.3% and -8.5% before torchtitan's fp32 score
    multiply was listed: the bench's layer runs a zero fill, a clone and an index_copy in its permute, unvectorised silu
    and mul on the chunked fc1 output and a gather and bf16 score multiply in place of torchtitan's fp32 one, class (c)
    of docs/step-time.md "The MoE layers read from a profiler trace")."""
    rows = {r["layer"]: r["step_err"] for r in h200_tables.layer_table("run2")}
    assert all(abs(rows[n]) < 0.08 for n in rows if ".ep" not in n)
    assert -0.08 < rows["qwen3_30b_a3b.ep1.s4096"] < -0.02 and -0.09 < rows["mixtral_8x7b.ep1.s4096"] < -0.04


def test_a_layer_is_built_as_the_planner_builds_it():
    """One rank's share as a tp-1 model with head dim 128, the torch flavour (eager), cuDNN attention, micro-batch
    = the batch: the layer kernels read what the bench's layer runs (MoE with its experts and top-k)."""
    row = next(r for r in h200_tables.load("run3_heldout")["layers"] if r["layer"].startswith("qwen3_235b"))
    ctx, moe = h200_tables.layer_context(row)
    assert moe and ctx.model.moe.num_experts == 128 and ctx.model.moe.top_k == 8
    assert ctx.model.head_size == 128 and ctx.b == 1 and ctx.s == 2048
    assert ctx.par.flavour.name == "torch" and ctx.work.attention_kernel == "cudnn"


def test_a_second_gpu_never_fitted_on_the_h100():
    """The H100 80GB HBM3 measured with the same script after the H200 runs (tests/reference/kernels/h100/README.md)
    and never fitted on: the H200's constants hold there. Its whole layers, held out (seven) and the five of the
    fit grid: dense within 11%, the held-out median under 8%; bf16 GEMMs 8% median. What it measures: a Llama-3
    8B eager layer trained back to back logs 1,605 MHz (the H200's 1,560). Its layers are compared at its own 8B
    layer's burst clock in the model's units (1,658 MHz; 1,560 before sus12): held out 3.1%, signed -0.7%, worst
    -6.8% (2.3%, +2.3%, +10.6% before)."""
    with h200_tables.on_gpu("h100"):
        assert h200_tables.GPU.name == "H100 SXM5 80GB"
        assert h200_tables.sustained_clock_mhz() == 1605
        classes = {c["class"]: c for c in h200_tables.classes()}
        held = h200_tables.layer_table("run3_heldout")
        grid = h200_tables.layer_table("run2")
    assert h200_tables.GPU.name != "H100 SXM5 80GB"  # the block restores the H200
    for p in ("fwd", "dgrad", "wgrad"):
        assert classes[f"GEMM bf16 {p}"]["n"] == 144 and classes[f"GEMM bf16 {p}"]["median_abs"] < 0.09
    s = h200_tables.summary("step_err", [r["step_err"] for r in held])
    assert s["n"] == 7 and s["median_abs"] < 0.06 and abs(s["signed_median"]) <= 0.05 and abs(s["worst"]) < 0.12
    dense = [r["step_err"] for r in held + grid if ".ep" not in r["layer"]]
    assert len(dense) == 7 and all(abs(e) < 0.11 for e in dense), dense


def test_grouped_gemm_k0_is_the_fit_sets_fixed_point():
    """kernels.GROUPED_GEMM_K0 is what run 2's 48 torch._grouped_mm rows fit (bench/h200_tables.py
    --fit-grouped-k0: the median |log error| minimum on a 32-step grid), at 3.6% median; cuBLAS's k0 (128) there
    leaves the fine-grained rows 12-20% fast."""
    k0, err = h200_tables.fit_grouped_k0()
    assert k0 == GROUPED_GEMM_K0 == 320.0 and 0.03 < err < 0.04
    rows = list(h200_tables.grouped_rows(k0=EFFICIENCY.gemm_k0))
    fine = [p / m - 1 for c, _, p, m in rows if c == "grouped _grouped_mm fine (uniform)"]
    assert sorted(fine)[len(fine) // 2] < -0.10
