"""Predicted vs measured on this project's own H200 kernel tables (tests/reference/kernels/h200/, measured by
bench/measure_kernels.py on the lent H200 SXM 141 GB, 700 W, PyTorch 2.11, cuDNN 9.19; README.md there).

    PYTHONPATH=. python bench/h200_tables.py           # per kernel class, then whole eager layers (fit, held out)

One home for loading those tables (``load``) and for running the model at the clock a row was measured at
(``at_clock``): the model's dense peak is the datasheet peak x the fraction of the datasheet's tensor clock the
GPU sustains (planner/kernels.py dense_peak, clock_fraction); a row measured at ``sm_mhz`` is predicted with that
fraction replaced by sm_mhz / DATASHEET_CLOCK_MHZ. Only compute-bound work (GEMM and attention FLOPs) scales with
the clock; HBM runs at its own clock.

Runs 1 and 2 (kernel tables) are what constants may be fitted on; run 3 (``run3_heldout.json``: seven whole layers
measured before any refit) is the held-out check. Run 1 has no per-row clock: its GEMM and attention rows are not
compared (run 2 measured the same grid with clocks); its launch and memory-bound rows are (no clock needed).
"""

from __future__ import annotations

import json
import math
import sys
from contextlib import contextmanager
from dataclasses import replace
from functools import lru_cache
from statistics import median

from kernel_fit import REFERENCE  # bench/kernel_fit.py: the one home of the kernel tables' folder

from collectives.topology.gpu import GPUS
from planner import ModelSpec, ParallelSpec, WorkloadSpec
from planner.compute import pass_time
from planner.context import Context
from planner.kernels import (
    ATTENTION_CEILING,
    DATASHEET_CLOCK_MHZ,
    EAGER,
    EFFICIENCY,
    FUSED,
    GEMM_CEILING,
    GROUPED_GEMM_K0,
    Efficiency,
    _mem_s,
    causal_keys,
    clock_fraction,
    flash_attention_s,
    gemm_time,
    generation,
    group_rows,
    layer_kernels,
    memory_kernel,
    streamed_gemm_time,
)
from planner.model import MoESpec

DIR = REFERENCE / "h200"
GPU = GPUS["h200-sxm-141gb"]
FIT_RUNS = ("run1", "run2")
HELDOUT_RUN = "run3_heldout"
TRAINED_LAYER = "llama3_8b.tp1.s4096"  # the layer run 2 also trained back to back (``layer_sustained``)
# The other GPU measured with the same script (tests/reference/kernels/h100/README.md), never fitted on: the check
# of the H200's constants on a second GPU. Its one run has the per-row clock (the H200's run 2 role) and its
# held-out layers (run 3's role); ``on_gpu("h100")`` reads those files under the H200 runs' names.
OTHER_GPUS = {"h100": ("h100-sxm5-80gb", {"run1": "run1", "run2": "run1", "run3_heldout": "run1_heldout"})}
_ALIAS: dict[str, str] = {}


@contextmanager
def on_gpu(name: str):
    """Run this module's tables on another measured GPU (OTHER_GPUS) within the block."""
    global DIR, GPU
    saved = DIR, GPU, dict(_ALIAS)
    key, alias = OTHER_GPUS[name]
    DIR, GPU = REFERENCE / name, GPUS[key]
    _ALIAS.clear()
    _ALIAS.update(alias)
    try:
        yield
    finally:
        DIR, GPU = saved[0], saved[1]
        _ALIAS.clear()
        _ALIAS.update(saved[2])


def load(run: str) -> dict:
    """One run's sections: {section: [row as a dict of its columns]}."""
    data = json.loads((DIR / f"{_ALIAS.get(run, run)}.json").read_text())
    return {
        name: [dict(zip(s["columns"], row, strict=True)) for row in s["rows"]] for name, s in data["sections"].items()
    }


def at_clock(mhz: float | None, dtype: str = "bf16", gpu=None):
    """``gpu`` with its peaks scaled so that the model's dense peak of ``dtype`` (datasheet x clock_fraction) is the
    datasheet peak at ``mhz``: datasheet x mhz / DATASHEET_CLOCK_MHZ. None: the model's own sustained clock."""
    gpu = gpu or GPU
    if mhz is None:
        return gpu
    scale = mhz / DATASHEET_CLOCK_MHZ[generation(gpu)] / clock_fraction(gpu, dtype)
    return replace(gpu, peak_tflops={k: v * scale for k, v in gpu.peak_tflops.items()})


def _err(predicted: float, measured: float) -> float:
    return predicted / measured - 1


# ---- per kernel class ----------------------------------------------------------------------------------------


def gemm_rows(eff: Efficiency = EFFICIENCY):
    """(class, row, predicted s, measured s) for run 2's bf16 and fp8 GEMMs. Eager rows take at least the host's
    dispatch (cpu_op_s), as the model floors a kernel without CUDA graphs; graph rows do not."""
    sections = load("run2")
    for r in sections["gemm_bf16"]:
        if r["seconds"] is None:
            continue
        kind = "decode" if r["pass"].startswith("decode") else "train"
        t = gemm_time((float(r["m"]),), float(r["n"]), float(r["k"]), "bf16", at_clock(r["sm_mhz"]), eff)
        if r["pass"] != "decode_graph":
            t = max(t, eff.cpu_op_s)
        name = f"GEMM bf16 {r['pass']}" if kind == "train" else f"GEMM bf16 {r['pass']} (m 1-256)"
        yield name, r, t, r["seconds"]
    for r in sections["gemm_fp8"]:
        if r["seconds"] is None:
            continue
        t = gemm_time((float(r["m"]),), float(r["n"]), float(r["k"]), "fp8", at_clock(r["sm_mhz"], "fp8"), eff)
        yield f"GEMM fp8 {r['scaling']}", r, max(t, eff.cpu_op_s), r["seconds"]


GROUPED = {  # column -> (n, k) of each expert's GEMM from the row (hidden h, intermediate f): m = the expert's rows
    "fc1": lambda h, f: (2 * f, h),
    "fc2": lambda h, f: (h, f),
    "dgrad_fc2": lambda h, f: (f, h),
}


def grouped_rows(eff: Efficiency = EFFICIENCY, k0: float = GROUPED_GEMM_K0):
    """(class, row, predicted s, measured s) for run 2's expert GEMMs, with each expert's rows at the mean of the
    padded rows spread as multinomial counts (group_rows; the measured counts are not kept; the zipf-skewed rows are
    a class of their own, at the mean): torch._grouped_mm
    as one grouped kernel; the loop as one GEMM per expert on one stream (streamed_gemm_time, 1 stream), each at
    least the host's dispatch."""
    for r in load("run2")["grouped"]:
        e, h, f = r["local_experts"], r["hidden"], r["inter"]
        mean = r["padded_tokens"] / e  # multinomial counts: each expert's own draw about the mean (group_rows)
        rows = group_rows(mean, math.sqrt(mean) if r["zipf_skew"] == 0 else 0.0, e)
        gpu = at_clock(r["sm_mhz"])
        skew = "uniform" if r["zipf_skew"] == 0 else "zipf 1.2"
        grain = "fine" if f <= 1024 else "coarse"
        for col, shape in GROUPED.items():
            n, k = shape(h, f)
            measured = r[f"grouped_{col}_s"]
            if measured:
                t = gemm_time(rows, n, k, "bf16", gpu, eff, k0)
                yield f"grouped _grouped_mm {grain} ({skew})", r, t, measured
            looped = r.get(f"loop_{col}_s")
            if looped:
                t = max(streamed_gemm_time(rows, n, k, "bf16", gpu, eff, 1), e * eff.cpu_op_s)
                yield f"grouped loop {grain} ({skew})", r, t, looped
        measured = r["grouped_wgrad_fc2_s"]
        if measured:  # per expert (f x rows) @ (rows x h): k = the expert's rows
            t = gemm_time((float(f),) * e, float(h), mean, "bf16", gpu, eff, k0)
            yield f"grouped _grouped_mm {grain} ({skew})", r, t, measured


def attention_rows(eff: Efficiency = EFFICIENCY):
    """(class, row, predicted s, measured s) for run 2's causal attention (cudnn, flash2): the forward and the
    backward (forward + backward minus forward), each at least the host's dispatch."""
    for r in load("run2")["attention"]:
        if not r["causal"] or r["kernel"] not in ("cudnn", "flash2"):
            continue
        s, d = r["seq"], r["head_dim"]
        flops = 2.0 * r["batch"] * s * causal_keys(s, None) * r["heads"] * 2 * d
        f, b = flash_attention_s(flops, s, r["kernel"], at_clock(r["sm_mhz"]), eff, head_dim=d)
        cls = f"attention {r['kernel']}" + ("" if d == 128 else f" d{d}")
        yield f"{cls} fwd", r, max(f, eff.cpu_op_s), r["fwd_s"]
        yield f"{cls} bwd", r, max(b, eff.cpu_op_s), r["bwd_s"]


# memory-bound ops the model has, by the op's label prefix: (bytes per element of the bf16 tensor, kernels), from
# the model's own fusion tables (kernels.FUSED, EAGER): F.rms_norm is one fused kernel (FUSED.norm, and EAGER's:
# nn.RMSNorm); silu(a) * b is EAGER.gated_act per output element; a + b is the residual add (.to(float8): the
# model's cast, kernels._mem_s). Hugging Face's fp32 RMSNorm op chain, rms_norm_eager, is no framework's norm here.
MEMORY_OPS = {
    "rms_norm_fused.": (FUSED.norm[0] / 2, FUSED.norm[1]),
    "silu_mul_eager.": (EAGER.gated_act[0] / 2, EAGER.gated_act[1]),
    "add.": (EAGER.residual[0] / 2, EAGER.residual[1]),
}


def memory_rows(eff: Efficiency = EFFICIENCY, runs=FIT_RUNS):
    """(class, row, predicted s, measured s): copies by size (eager: at least cpu_op_s; CUDA graph: kernel_s's
    floor only) and the ops of MEMORY_OPS at 8,192 tokens; launch: a tiny op eager (cpu_op_s) and replayed."""
    for run in runs:
        sections = load(run)
        for r in sections["memory_bound"]:
            op = r["op"]
            if op == "copy":
                t = memory_kernel("copy", r["bytes_moved"], GPU, eff).time_s
                big = "copy >= 128 MiB" if r["tensor_bytes"] >= 2**27 else "copy < 128 MiB"
                yield f"{big} eager", r, max(t, eff.cpu_op_s), r["eager_s"]
                if r["graph_s"]:
                    yield f"{big} graph", r, t, r["graph_s"]
                continue
            if op.startswith("fp8_cast."):  # the model's cast kernel (kernels._mem_s, CAST_HBM): read 2, write 1
                yield "memory fp8_cast", r, max(_mem_s(1.5 * r["tensor_bytes"], GPU, eff), eff.cpu_op_s), r["eager_s"]
            for prefix, (per, count) in MEMORY_OPS.items():
                if op.startswith(prefix):
                    t = memory_kernel(op, per * r["tensor_bytes"], GPU, eff, count, eff.cpu_op_s).time_s
                    yield f"memory {prefix.rstrip('.')}", r, t, r["eager_s"]
        for r in sections["launch"]:
            yield "launch eager (host dispatch)", r, eff.cpu_op_s, r["eager_s_per_op"]
            yield "launch graph (kernel floor)", r, eff.kernel_s, r["graph_s_per_op"]


def classes(eff: Efficiency = EFFICIENCY) -> list[dict]:
    """Per kernel class: n, median |error|, signed median, worst (signed)."""
    by: dict[str, list[float]] = {}
    for rows in (gemm_rows(eff), grouped_rows(eff), attention_rows(eff), memory_rows(eff)):
        for cls, _, predicted, measured in rows:
            by.setdefault(cls, []).append(_err(predicted, measured))
    return [summary(cls, errors) for cls, errors in by.items()]


def summary(label: str, errors: list[float]) -> dict:
    return {
        "class": label,
        "n": len(errors),
        "median_abs": median(abs(e) for e in errors),
        "signed_median": median(errors),
        "worst": max(errors, key=abs),
    }


# ---- whole layers ----------------------------------------------------------------------------------------


def layer_context(r: dict) -> tuple[Context, bool]:
    """The measured layer (bench/measure_kernels.py Layer) as the planner sees it: one rank's share as a tp 1 model
    of that shape (head dim 128), PyTorch eager (the torch flavour: unfused elementwise kernels, no CUDA graphs),
    cuDNN attention, micro-batch = the batch, the sequence as given; weight gradients returned by autograd.grad,
    not accumulated into a buffer (grad_accumulation_fusion on: no accumulation kernel)."""
    moe = MoESpec(r["experts"], r["topk"], r["expert_ffn"]) if r["experts"] else None
    model = ModelSpec(
        num_layers=1,
        hidden_size=r["hidden"],
        num_attention_heads=r["heads"],
        num_kv_heads=r["kv_heads"],
        head_dim=128,
        ffn_hidden_size=r["ffn"] or r["expert_ffn"],
        vocab_size=32000,
        seq_length=r["seq"],
        moe=moe,
    )
    work = WorkloadSpec(
        micro_batch_size=r["batch"],
        global_batch_size=r["batch"],
        seq_length=r["seq"],
        attention_kernel="cudnn",
        grad_accumulation_fusion=True,
    )
    return Context(model, work, ParallelSpec(framework="torch")), moe is not None


def layer_rows(run: str, eff: Efficiency | None = None, clock: bool = False):
    """(layer row, predicted forward s, predicted forward + backward s) with the planner's own layer kernels
    (kernels.layer_kernels), at the clock the section's short bursts hold in the model's units (``burst_clock_mhz``),
    or with ``clock`` at the clock NVML read after the layer's timing. The burst one is the comparison: the layer's
    clock reading does not say its speed (run 2 ``layer_sustained``: 10.5 ms per step at the first burst's 1,980 MHz
    reading, 10.8 ms at 1,560 MHz once settled, 3% apart for a 21% clock step while its GEMMs are 60% of the step):
    the power cap holds the tensor cores' throughput within milliseconds, before the reported clock follows. Nor is
    the planner's sustained clock (kernels.clock_fraction, by throughput since sus12): these rows are timed in short
    bursts between host work, 6.6% (H200) and 8.3% (H100) faster than the same 8B layer trained back to back."""
    at = at_clock(burst_clock_mhz())
    for r in load(run)["layers"]:
        ctx, moe = layer_context(r)
        lk = layer_kernels(ctx, moe, at_clock(r["sm_mhz"]) if clock else at, eff)
        fwd = pass_time(lk.forward).total_s
        yield r, fwd, fwd + pass_time(lk.backward).total_s


def solve_down(fn, target: float, lo: float = 800.0, hi: float = 2500.0) -> float:
    """The f (MHz) where the decreasing ``fn`` meets ``target`` (bisection, 0.01 MHz)."""
    while hi - lo > 0.01:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if fn(mid) > target else (lo, mid)
    return (lo + hi) / 2


def layer_clock_mhz(seconds: float, layer: str = TRAINED_LAYER) -> float:
    """A measured step of run 2's ``layer`` in the model's units: the clock at which its own kernels
    (layer_kernels, forward + backward, pass_time) take ``seconds``."""
    row = next(r for r in load("run2")["layers"] if r["layer"] == layer)
    ctx, moe = layer_context(row)

    def step(f: float) -> float:
        lk = layer_kernels(ctx, moe, at_clock(f))
        return pass_time(lk.forward).total_s + pass_time(lk.backward).total_s

    return solve_down(step, seconds)


def burst_clock_mhz() -> float:
    """The clock the ``layers`` section's short bursts hold in the model's units: ``layer_clock_mhz`` of the trained
    8B layer's own row there (the one layer also trained back to back, ``layer_sustained``; the other layers are
    compared at it). H200 1,570 MHz, H100 1,658: above the sustained 1,461 and 1,510 (bench/h200_power.py
    effective_clocks)."""
    return _burst_clock_mhz(DIR, GPU)


@lru_cache(maxsize=4)
def _burst_clock_mhz(folder, gpu) -> float:  # keyed by the tables on_gpu selects
    row = next(r for r in load("run2")["layers"] if r["layer"] == TRAINED_LAYER)
    return layer_clock_mhz(row["fwd_bwd_s"])


def layer_table(run: str, eff: Efficiency | None = None, clock: bool = False) -> list[dict]:
    out = []
    for r, fwd, step in layer_rows(run, eff, clock):
        out.append(
            {
                "layer": r["layer"],
                "sm_mhz": r["sm_mhz"],
                "fwd_err": _err(fwd, r["fwd_s"]),
                "step_err": _err(step, r["fwd_bwd_s"]),
                "measured_step_s": r["fwd_bwd_s"],
            }
        )
    return out


def sustained_clock_mhz() -> float:
    """The SM clock the Llama-3-8B eager layer holds when trained back to back (run 2 ``layer_sustained``), median
    over the bursts after its first 5 s (the first seconds run at the boost clock before the power cap acts)."""
    rows = load("run2")["layer_sustained"]
    t0 = rows[0]["t_s"]
    return median(r["sm_mhz"] for r in rows if r["t_s"] - t0 >= 5)


def _scale(rows, classes) -> float:
    """predicted / measured at the median over the rows of ``classes`` (kernel_fit.class_scales: a ceiling times
    this is its refit)."""
    logs = [math.log(p / m) for c, _, p, m in rows if c in classes]
    return math.exp(median(logs))


def fit(eff: Efficiency = EFFICIENCY) -> dict:
    """The global constants as runs 1-2 measure them, from the model's current ones (a fixed point once committed:
    tests/planner/test_h200_tables.py): the trained layer's logged clock fraction (not the model's); the bf16 and
    fp8 (tensorwise) GEMM ceilings and the cudnn and flash2 attention ceilings (head dim 128, causal) at each row's
    clock, with the
    shape terms (k0, fill, fixed cost, s0) as fitted on the aiconfigurator tables; HBM from copies of >= 128 MiB;
    the kernel floor from CUDA-graph replays of tiny kernels (launch, and copies <= 1 MiB); the host's dispatch
    per op from eager tiny ops (launch)."""
    gen = generation(GPU)
    gemms = list(gemm_rows(eff))
    attention = list(attention_rows(eff))
    out = {
        # the clock nvidia-smi logged through the trained layer: not the model's (kernels.clock_fraction, by
        # throughput: bench/h200_power.py effective_clocks), kept as the logs' reading
        "logged_clock": sustained_clock_mhz() / DATASHEET_CLOCK_MHZ[gen],
        "gemm_bf16": GEMM_CEILING[gen, "bf16"] * _scale(gemms, {f"GEMM bf16 {p}" for p in ("fwd", "dgrad", "wgrad")}),
        "gemm_fp8": GEMM_CEILING[gen, "fp8"] * _scale(gemms, {"GEMM fp8 tensorwise"}),
    }
    for kernel in ("cudnn", "flash2"):
        fwd, bwd = ATTENTION_CEILING[kernel, gen]
        out[f"{kernel}_fwd"] = fwd * _scale(attention, {f"attention {kernel} fwd"})
        out[f"{kernel}_bwd"] = bwd * _scale(attention, {f"attention {kernel} bwd"})
    copies, floors, hosts = [], [], []
    for run in FIT_RUNS:
        sections = load(run)
        for r in sections["memory_bound"]:
            if r["op"] == "copy" and r["tensor_bytes"] >= 2**27:
                copies.append(r["bytes_moved"] / r["eager_s"])
            if r["op"] == "copy" and r["graph_s"] and r["tensor_bytes"] <= 2**20:
                floors.append(r["graph_s"])
        floors += [r["graph_s_per_op"] for r in sections["launch"]]
        hosts += [r["eager_s_per_op"] for r in sections["launch"]]
    out["hbm"] = median(copies) / (GPU.hbm_GBps * 1e9)
    out["kernel_s"] = median(floors)
    out["cpu_op_s"] = median(hosts)
    return out


def fit_grouped_k0(eff: Efficiency = EFFICIENCY) -> tuple[float, float]:
    """(k0, median abs error) of torch._grouped_mm's main-loop amortisation length (kernels.GROUPED_GEMM_K0) that
    minimises the median abs log error over run 2's _grouped_mm rows (every grain and skew), on a 32-step grid."""
    best = None
    for k0 in range(128, 1025, 32):
        errs = [abs(math.log(p / m)) for c, _, p, m in grouped_rows(eff, float(k0)) if "_grouped_mm" in c]
        score = median(errs)
        if best is None or score < best[1]:
            best = (float(k0), score)
    return best[0], math.exp(best[1]) - 1.0


def _pct(x: float) -> str:
    return f"{x * 100:+.1f}%"


def main() -> None:
    if "--gpu" in sys.argv:  # e.g. --gpu h100: the same tables on another measured GPU, nothing refitted
        with on_gpu(sys.argv[sys.argv.index("--gpu") + 1]):
            report()
        return
    report()


def report() -> None:
    if "--fit-grouped-k0" in sys.argv:
        k0, err = fit_grouped_k0()
        print(f"torch._grouped_mm k0: {k0:.0f} (median abs error {100 * err:.1f}%)")
        return
    if "--fit" in sys.argv:
        for name, value in fit().items():
            print(f"{name}: {value:.4g}")
        return
    print(
        f"{GPU.name}: the trained layer's logged clock {sustained_clock_mhz():.0f} MHz; the layers section's bursts "
        f"in the model's units {burst_clock_mhz():.0f} MHz"
    )
    print(
        f"| kernel class ({DIR.name}, {', '.join(sorted({_ALIAS.get(r, r) for r in FIT_RUNS}))}) | rows "
        "| median abs error | signed median | worst |"
    )
    print("|---|---|---|---|---|")
    for c in classes():
        print(f"| {c['class']} | {c['n']} | {c['median_abs']:.1%} | {_pct(c['signed_median'])} | {_pct(c['worst'])} |")
    for run, label in (("run2", "fit set"), (HELDOUT_RUN, "held out")):
        print()
        print(f"| layer ({run}, {label}) | SM MHz | forward | forward + backward |")
        print("|---|---|---|---|")
        rows = layer_table(run)
        for r in rows:
            print(f"| {r['layer']} | {r['sm_mhz']} | {_pct(r['fwd_err'])} | {_pct(r['step_err'])} |")
        for key in ("fwd_err", "step_err"):
            s = summary(key, [r[key] for r in rows])
            print(
                f"{key}: median abs {s['median_abs']:.1%}, signed {_pct(s['signed_median'])}, worst {_pct(s['worst'])}"
            )
    if "--clock" in sys.argv:
        for run in (*FIT_RUNS[1:], HELDOUT_RUN):
            rows = layer_table(run, clock=True)
            print(run, "at the clock read after each layer:", [f"{r['layer']} {_pct(r['step_err'])}" for r in rows])


if __name__ == "__main__":
    main()
