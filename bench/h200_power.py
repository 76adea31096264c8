"""The clock a pass sustains from its own kernel mix under the power cap: the data on this project's H200 (and the
H100, never fitted on), the fit, and the held-out check (issue 20 item 3; docs/step-time.md "The clock from the
pass's own power (clock12)").

    PYTHONPATH=. python bench/h200_power.py

The data: bench/measure_kernels.py's runs (tests/reference/kernels/h200/run1.json, run2.json; h100/run1.json) and
the nvidia-smi logs beside them (SM clock, power, temperature and clock-event reasons every 250 ms; 0x4 = software
power cap). A burst is matched to the log by time: a run's ``t_s`` counts from its start (provenance ``date_utc``,
whole seconds: up to 1 s early), and a settled window drops its first 5 s (the clock starts at the 1,980 MHz boost
before the cap acts). nvidia-smi's power is an average over about a second, so only sustained sections say what a
kernel class draws; short per-row bursts say only the clock NVML read after them (``sm_mhz``).

The model: P = P_static + a_class x f^3 (Weste & Harris §5.2, collectives/topology/gpu.py STATIC_POWER_FRACTION's
law) with one P_static shared by every class. A class that alone holds the cap at clock f_c has a_c = (P_cap -
P_static) / f_c^3, so a pass of time shares w_c(f) holds the f solving

    sum_c w_c(f) x_c(f) = 1,   x_c(f) = (f / f_c)^3   (the share of the cap's dynamic power at f)

and P_static cancels for every capped class. GEMM and attention time scale 1/f; memory-bound kernels do not.
A memory-bound class never reached the cap alone (its copies ran at 1,980 MHz, reason 0x0): x_mem(f) =
x_mem_boost (f / 1,980)^3, x_mem_boost = (P_mem - P_static) / (P_cap - P_static) from the copies' own samples,
P_static the board's draw at 1,980 MHz with no kernel running (idle samples of the same log).
"""

from __future__ import annotations

import json
import math
import sys
from collections import defaultdict
from contextlib import nullcontext
from dataclasses import replace
from datetime import datetime
from statistics import median

import h200_tables
from kernel_fit import REFERENCE  # bench/kernel_fit.py: the one home of the kernel tables' folder

from collectives.topology.gpu import GPUS as GPU_CARDS
from planner.context import Context
from planner.kernels import DATASHEET_CLOCK_MHZ, EFFICIENCY, gemm_time, gpu_seconds, layer_kernels

SETTLE_S = 5.0  # a sustained section's first seconds run at the boost clock before the cap acts
BOOST_MHZ = 1980  # nvidia-smi clocks.max.sm of both GPUs (run provenance), the clock an uncapped kernel runs at
CAP_REASON = 0x4  # nvidia-smi clocks_event_reasons: software power cap
# the runs whose logs hold each class: (folder, run with the sustained GEMMs and the trained layer)
GPUS = {"h200": ("h200", "run2"), "h100": ("h100", "run1")}
LAYER = h200_tables.TRAINED_LAYER  # the layer both GPUs trained back to back (``layer_sustained``)


def smi(folder: str, run: str) -> list[tuple[float, int, float, int, int]]:
    """(seconds after the run's start, SM MHz, W, deg C, clock-event reasons) of each nvidia-smi sample."""
    data = json.loads((REFERENCE / folder / f"{run}.json").read_text())
    t0 = datetime.strptime(data["provenance"]["date_utc"], "%Y-%m-%dT%H:%M:%SZ")
    out = []
    for line in (REFERENCE / folder / f"{run}_smi.csv").read_text().splitlines():
        p = [x.strip() for x in line.split(",")]
        t = datetime.strptime(p[0], "%Y/%m/%d %H:%M:%S.%f")
        out.append(((t - t0).total_seconds(), int(p[1].split()[0]), float(p[3].split()[0]), int(p[4]), int(p[5], 16)))
    return out


def sections(folder: str, run: str) -> dict:
    return json.loads((REFERENCE / folder / f"{run}.json").read_text())["sections"]


def _window(samples, start: float, end: float) -> dict:
    inside = [s for s in samples if start <= s[0] <= end]
    return {
        "mhz": median(s[1] for s in inside),
        "mhz_range": (min(s[1] for s in inside), max(s[1] for s in inside)),
        "watts": median(s[2] for s in inside),
        "celsius": median(s[3] for s in inside),
        "samples": len(inside),
        "capped": sum(1 for s in inside if s[4] & CAP_REASON) / len(inside),
    }


def sustained(gpu: str) -> dict:
    """Per class that ran long enough for the log's power to be its own: the settled clock, power and temperature
    of the 8192^3 bf16 and fp8 GEMM bursts and of the Llama-3-8B eager layer trained back to back, with the
    GEMMs' TFLOP/s per MHz (time scales 1/f where it is flat across bursts)."""
    folder, run = GPUS[gpu]
    samples, secs = smi(folder, run), sections(folder, run)
    out = {}
    rows = secs["sustained"]["rows"]
    for dtype in ("bf16", "fp8"):
        mine = [r for r in rows if r[0] == dtype]
        start, end = mine[0][2] + SETTLE_S, mine[-1][2]
        out[f"gemm_{dtype}"] = _window(samples, start, end)
        out[f"gemm_{dtype}"]["tflops"] = median(r[3] for r in mine if r[2] >= start)
    steps = secs["layer_sustained"]["rows"]
    start, end = steps[0][2] + SETTLE_S, steps[-1][2]
    out["layer"] = _window(samples, start, end)
    out["layer"]["step_s"] = median(r[3] for r in steps if r[2] >= start)
    return out


def ceiling_at_read_clock(gpu: str, dtype: str) -> float:
    """The sustained GEMMs' TFLOP/s as a fraction of the dense peak at the clock the log read (datasheet x MHz /
    DATASHEET_CLOCK_MHZ): what the same SMs do per reported clock; the tables' unthrottled ceiling is 0.886
    (bf16) and 0.844 (fp8), planner/kernels.py GEMM_CEILING."""
    w = sustained(gpu)[f"gemm_{dtype}"]
    peak = _card(gpu).peak(dtype) / 1e12
    return w["tflops"] / (peak * w["mhz"] / DATASHEET_CLOCK_MHZ[90])


def _card(gpu: str):
    return GPU_CARDS[{"h200": "h200-sxm-141gb", "h100": "h100-sxm5-80gb"}[gpu]]


def step_follows_clock(gpu: str) -> tuple[float, float]:
    """(correlation of step time with 1 / the NVML clock, the share of the step at 1,560 MHz that the least-squares
    fit step = A + B / f gives B / f) over the trained layer's settled bursts: how much of the step follows the
    clock the log reads (the model's compute-bound share is 0.90 for this layer)."""
    folder, run = GPUS[gpu]
    rows = sections(folder, run)["layer_sustained"]["rows"]
    pts = [(1 / r[4], r[3]) for r in rows if r[2] - rows[0][2] >= SETTLE_S]
    mx, my = sum(x for x, _ in pts) / len(pts), sum(y for _, y in pts) / len(pts)
    sxy = sum((x - mx) * (y - my) for x, y in pts)
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    syy = sum((y - my) ** 2 for _, y in pts)
    b = sxy / sxx
    a = my - b * mx
    return sxy / math.sqrt(sxx * syy), (b / 1560) / (a + b / 1560)


def idle_watts(gpu: str) -> float:
    """The board's draw at the boost clock with no kernel running (P_static): samples at 1,980 MHz, reason 0, under
    140 W, after the first 2 s (the CUDA context is up)."""
    folder, run = GPUS[gpu]
    return median(s[2] for s in smi(folder, run) if s[0] > 2 and s[1] == BOOST_MHZ and s[4] == 0 and s[2] < 140)


def short_burst_mhz(gpu: str) -> dict:
    """The SM clock NVML read after each timed row (median by section): the GEMM tables, cuDNN attention."""
    folder, run = GPUS[gpu]
    secs = sections(folder, run)
    clock = {name: s["columns"].index("sm_mhz") for name, s in secs.items() if "sm_mhz" in s["columns"]}
    att = secs["attention"]
    return {
        "gemm_bf16": median(r[clock["gemm_bf16"]] for r in secs["gemm_bf16"]["rows"]),
        "gemm_fp8": median(r[clock["gemm_fp8"]] for r in secs["gemm_fp8"]["rows"]),
        "attention": median(r[clock["attention"]] for r in att["rows"] if r[1] == "cudnn"),
    }


def memory_watts(gpu: str) -> float:
    """What the memory-bound section draws while it runs uncapped at the boost clock: its samples at 1,980 MHz,
    reason 0, above 300 W (the copies of >= 32 MiB; the section's launch-bound rows and the idle tail below)."""
    folder, run = GPUS[gpu]
    secs = sections(folder, run)
    order = list(secs)
    i = order.index("memory_bound")
    start, end = secs[order[i - 1]]["seconds"], secs["memory_bound"]["seconds"]
    return median(
        s[2] for s in smi(folder, run) if start <= s[0] <= end and s[1] == BOOST_MHZ and s[4] == 0 and s[2] > 300
    )


def fit(gpu: str) -> dict:
    """Each class's capped clock f_c (MHz) and the memory-bound class's boost share, from ``gpu``'s own logs.
    Attention never ran sustained: its short bursts' NVML clock times the GEMMs' sustained / short-burst ratio
    (the same measurement procedure read on the class that has both)."""
    sus, short = sustained(gpu), short_burst_mhz(gpu)
    p_static, p_cap = idle_watts(gpu), sus["gemm_bf16"]["watts"]
    short_to_sustained = sus["gemm_bf16"]["mhz"] / short["gemm_bf16"]
    return {
        "gemm_bf16": sus["gemm_bf16"]["mhz"],
        "gemm_fp8": sus["gemm_fp8"]["mhz"],
        "attention": short["attention"] * short_to_sustained,
        "attention_short": short["attention"],
        "short_to_sustained": short_to_sustained,
        "p_static": p_static,
        "p_cap": p_cap,
        "p_mem": memory_watts(gpu),
        "mem_boost_share": (memory_watts(gpu) - p_static) / (p_cap - p_static),
        "layer_mhz": sus["layer"]["mhz"],
        "layer_range": sus["layer"]["mhz_range"],
    }


# ---- a pass's clock -------------------------------------------------------------------------------------------


def shares(kernels, f_mhz: float | None = None, at: float | None = None) -> dict[str, float]:
    """Time share by power class of ``kernels`` (the model's, built at ``at`` MHz), moved to ``f_mhz``: GEMM and
    attention time x at / f, memory-bound (and cast) time as is."""
    by: dict[str, float] = defaultdict(float)
    for k in kernels:
        cls = {"gemm": f"gemm_{'fp8' if k.dtype.startswith('fp8') else 'bf16'}", "attention": "attention"}.get(
            k.kind, "memory"
        )
        scale = at / f_mhz if (f_mhz and at and cls != "memory") else 1.0
        by[cls] += gpu_seconds(k) * scale
    total = sum(by.values())
    return {c: t / total for c, t in by.items()}


def dynamic_share(w: dict[str, float], f: float, clocks: dict) -> float:
    """sum_c w_c x_c(f): the pass's dynamic power at f as a share of the cap's (1 = at the cap)."""
    out = 0.0
    for cls, share in w.items():
        if cls == "memory":
            out += share * clocks["mem_boost_share"] * (f / BOOST_MHZ) ** 3
        else:
            out += share * (f / clocks[cls]) ** 3
    return out


def pass_clock(kernels, at: float, clocks: dict) -> float:
    """The f (MHz, at most the boost) at which the pass's average power meets the cap (bisection, 0.1 MHz)."""
    lo, hi = 500.0, float(BOOST_MHZ)
    if dynamic_share(shares(kernels, hi, at), hi, clocks) <= 1:
        return hi
    while hi - lo > 0.1:
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if dynamic_share(shares(kernels, mid, at), mid, clocks) > 1 else (mid, hi)
    return (lo + hi) / 2


def layer_pass(row: dict, at: float, **work):
    """The model's own kernels of one measured layer (bench/h200_tables.py layer_context) built at ``at`` MHz:
    forward and backward, as trained; ``work`` replaces workload fields (an fp8 recipe)."""
    ctx, moe = h200_tables.layer_context(row)
    if work:
        ctx = Context(ctx.model, replace(ctx.work, **work), ctx.par)
    lk = layer_kernels(ctx, moe, h200_tables.at_clock(at))
    return (*lk.forward, *lk.backward)


def _layer(gpu: str, layer: str, at: float, **work):
    """The model's kernels of the measured layer named ``layer`` (run 2's or the held-out run's) on ``gpu``."""
    with h200_tables.on_gpu(gpu) if gpu in h200_tables.OTHER_GPUS else nullcontext():
        rows = [r for run in ("run2", "run3_heldout") for r in h200_tables.load(run)["layers"] if r["layer"] == layer]
        return layer_pass(rows[0], at, **work)


def predict(gpu: str, layer: str, at: float = 1560.0, **work) -> tuple[float, dict]:
    """(predicted clock MHz, time shares at it) of a measured layer on ``gpu`` from its own kernel mix, the
    classes from ``gpu``'s own logs (``fit``); ``at``: the clock the kernels are built at (any: moved to f)."""
    kernels = _layer(gpu, layer, at, **work)
    f = pass_clock(kernels, at, fit(gpu))
    return f, shares(kernels, f, at)


def bracket(gpu: str, layer: str, at: float = 1560.0) -> tuple[float, float]:
    """The predicted clock's range over what the logs leave open: attention as hot as the bf16 GEMMs or drawing
    nothing dynamic, memory-bound kernels at their full boost share or at none."""
    base, kernels = fit(gpu), _layer(gpu, layer, at)
    low = pass_clock(kernels, at, {**base, "attention": base["gemm_bf16"], "mem_boost_share": 1.0})
    high = pass_clock(kernels, at, {**base, "attention": math.inf, "mem_boost_share": 0.0})
    return low, high


def _gemm_clock(dtype: str, seconds: float) -> float:
    """The clock at which the model times one 8192^3 GEMM of ``dtype`` at ``seconds``."""
    return h200_tables.solve_down(
        lambda f: gemm_time((8192.0,), 8192.0, 8192.0, dtype, h200_tables.at_clock(f, dtype), EFFICIENCY), seconds
    )


def effective_clocks(gpu: str, layer: str = LAYER) -> dict:
    """The clocks in the model's own units, by throughput instead of the log's reading: the f at which the model
    times the sustained 8192^3 GEMMs (planner/kernels.py gemm_time) and the trained layer's step (layer_kernels,
    pass_time) as measured. Then the mix model on them: GEMM classes at their effective clocks, attention scaled
    by the same effective / read ratio as the bf16 GEMMs."""
    sus, clocks = sustained(gpu), fit(gpu)
    out = {}
    with h200_tables.on_gpu(gpu) if gpu in h200_tables.OTHER_GPUS else nullcontext():
        for dtype in ("bf16", "fp8"):
            out[f"gemm_{dtype}"] = _gemm_clock(dtype, 2 * 8192**3 / (sus[f"gemm_{dtype}"]["tflops"] * 1e12))
        out["layer"] = h200_tables.layer_clock_mhz(sus["layer"]["step_s"], layer)
    ratio = out["gemm_bf16"] / clocks["gemm_bf16"]
    mixed = {
        **clocks,
        "gemm_bf16": out["gemm_bf16"],
        "gemm_fp8": out["gemm_fp8"],
        "attention": clocks["attention"] * ratio,
    }
    out["predicted_layer"] = pass_clock(_layer(gpu, layer, 1560.0), 1560.0, mixed)
    return out


def sustained_by_throughput(gpu: str) -> tuple[float, float]:
    """(sustained clock fraction, fp8 / bf16 clock ratio) by throughput (``effective_clocks``), rounded to the 3
    digits the model keeps: the trained layer's clock over the datasheet clock, and the sustained fp8 GEMMs' clock
    over the bf16 ones'. What planner/kernels.py SUSTAINED_CLOCK / FP8_CLOCK hold for Hopper (the H100's) and the
    H200 preset's own GPUSpec.sustained_clock (collectives/topology/gpu.py), sus12."""
    eff = effective_clocks(gpu)
    return round(eff["layer"] / DATASHEET_CLOCK_MHZ[90], 3), round(eff["gemm_fp8"] / eff["gemm_bf16"], 3)


def main() -> None:
    for gpu in GPUS:
        sus, clocks = sustained(gpu), fit(gpu)
        print(f"== {gpu}: P_static {clocks['p_static']:.0f} W (idle at {BOOST_MHZ} MHz), cap {clocks['p_cap']:.0f} W")
        for cls, w in sus.items():
            lo, hi = w["mhz_range"]
            print(
                f"  {cls:10s} {w['mhz']:6.0f} MHz [{lo}-{hi}] {w['watts']:6.1f} W {w['celsius']:.0f} C "
                f"capped {w['capped']:.0%} n {w['samples']}"
            )
        print(
            f"  attention {clocks['attention']:.0f} MHz (short bursts {clocks['attention_short']:.0f} x "
            f"{clocks['short_to_sustained']:.3f}); memory-bound {clocks['p_mem']:.0f} W at {BOOST_MHZ} MHz uncapped: "
            f"boost share {clocks['mem_boost_share']:.2f}"
        )
        corr, share = step_follows_clock(gpu)
        print(
            f"  sustained GEMMs at the read clock: bf16 {ceiling_at_read_clock(gpu, 'bf16'):.3f}, fp8 "
            f"{ceiling_at_read_clock(gpu, 'fp8'):.3f} of peak; the layer's step against 1/clock: r {corr:+.2f}, "
            f"share that follows the clock {share:.0%}"
        )
        eff = effective_clocks(gpu)
        print(
            f"  by throughput (the model's units): bf16 GEMMs {eff['gemm_bf16']:.0f} MHz, fp8 {eff['gemm_fp8']:.0f}, "
            f"the layer {eff['layer']:.0f}; the mix predicts {eff['predicted_layer']:.0f}"
        )
        fraction, ratio = sustained_by_throughput(gpu)
        print(
            f"  the model's sustained clock: {fraction:.3f} of {DATASHEET_CLOCK_MHZ[90]:,} MHz (the layer), fp8 GEMMs "
            f"at {ratio:.3f} of the bf16 clock"
        )
        for layer in (LAYER,):
            f, w = predict(gpu, layer)
            lo, hi = bracket(gpu, layer)
            shares_txt = ", ".join(f"{c} {s:.1%}" for c, s in sorted(w.items()))
            print(
                f"  held out: {layer} predicted {f:.0f} MHz (bracket {lo:.0f}-{hi:.0f}), measured "
                f"{clocks['layer_mhz']:.0f} [{clocks['layer_range'][0]}-{clocks['layer_range'][1]}]: {shares_txt}"
            )
    print("== what the model would do (H200 classes), not measured:")
    for layer in ("llama3_8b.tp1.s4096", "llama3_70b.tp8.s8192", "llama3_405b.tp8.s8192", "llama3_8b.tp2.s16384"):
        f, _ = predict("h200", layer)
        f8, w8 = predict("h200", layer, fp8_recipe="tensorwise")
        print(f"  {layer:24s} bf16 {f:5.0f} MHz   fp8 tensorwise {f8:5.0f} MHz ({w8.get('gemm_fp8', 0):.0%} fp8 GEMM)")


if __name__ == "__main__":
    sys.exit(main())
