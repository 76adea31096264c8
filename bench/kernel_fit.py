"""Predicted vs measured GEMM kernels (tests/reference/kernels/aiconfigurator_gemm.json).

    PYTHONPATH=. python bench/kernel_fit.py          # the per-class table of docs/step-time.md
    PYTHONPATH=. python bench/kernel_fit.py --parts  # GB200 / B300 / GB300 against the B200, their own ceilings
    PYTHONPATH=. python bench/kernel_fit.py --fit    # refit the global constants (k0, fill, fixed cost) and the
                                                     # per-(generation, dtype) ceilings, by least squares in log time

The tables do not record their clock; they are compared at the clock the datasheet peak is quoted at
(``burst``: the model's clock fraction, kernels.clock_fraction, replaced by 1), while planner/kernels.py predicts at
the clock sustained through a training step (SUSTAINED_CLOCK; bench/h200_tables.py compares this project's own H200
tables at the clock each row logged). The MoE table (aiconfigurator_moe.json: TensorRT-LLM's fused MoE
forward on H100) is compared with kernels.routed_expert_kernels' forward under uniform routing; its power-law
token distributions show what skewed routing costs over balanced.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import replace
from pathlib import Path
from statistics import median

from collectives.topology.gpu import GPUS, MeasuredGemm
from planner.kernel_fit import centred, class_scales, fit_grid, log_errors
from planner.kernels import (
    ATTENTION_CEILING,
    DATASHEET_CLOCK_MHZ,
    EFFICIENCY,
    FUSED,
    GEMM_CEILING,
    Efficiency,
    causal_keys,
    clock_fraction,
    dynamic_quantize_s,
    flash_attention_s,
    gemm_peak_share,
    gemm_time,
    generation,
    routed_expert_kernels,
    tabled_ceiling,
    timed_quantize_s,
)

REFERENCE = Path(__file__).resolve().parent.parent / "tests" / "reference" / "kernels"
DATA = REFERENCE / "aiconfigurator_gemm.json"
# GB200, B300, GB300 (and H200) tables of the same source, grid and TensorRT-LLM version as DATA's b200_sxm
# (bench/aiconfigurator_extract.py); not in the global fit: each part's ceilings are fitted on its own (own_ceilings)
PARTS = REFERENCE / "aiconfigurator_gemm_parts.json"
ANCHOR = "b200_sxm"  # the table Blackwell's GEMM_CEILING was fitted on
# the class of the anchor's table each Blackwell GEMM dtype's ceiling was fitted on (planner/kernels.py GEMM_CEILING:
# per-tensor fp8 and MXFP8 take block-scaled fp8's)
FITTED_ON = {"bf16": "bf16", "fp8": "fp8_block", "fp8_block": "fp8_block", "mxfp8": "fp8_block", "nvfp4": "nvfp4"}
MOE = REFERENCE / "aiconfigurator_moe.json"
ATTENTION = REFERENCE / "aiconfigurator_attention.json"
# TensorRT-LLM's context FMHA, by generation, is the kernel class it is compared as: on Hopper and Blackwell its
# warp-specialised kernels (the cuDNN / FlashAttention-3 class), on Ampere FlashAttention-2's algorithm
FMHA_CLASS = {80: "flash2", 90: "cudnn", 100: "cudnn"}


def load() -> dict:
    return json.loads(DATA.read_text())


def load_parts() -> dict:
    return json.loads(PARTS.read_text())


def burst(gpu):
    """``gpu`` with its peaks over kernels.clock_fraction: the model's bf16 GEMMs then run at the datasheet clock,
    and its fp8 GEMMs at FP8_CLOCK of it (fp8 holds a lower clock than bf16 under the same power cap, bursts or not:
    the H200's sustained sections)."""
    scale = clock_fraction(gpu, "bf16")
    return replace(gpu, peak_tflops={k: v / scale for k, v in gpu.peak_tflops.items()})


def rows(data: dict):
    """(system, gpu, dtype, m, n, k, measured seconds of the GEMM alone) for every measured GEMM: the row's latency
    less the input quantize it holds (gemm_alone_s)."""
    for system, entry in data["systems"].items():
        gpu = GPUS[entry["gpu"]]
        for dtype, table in entry["dtypes"].items():
            for m, n, k, ms in table:
                yield system, gpu, dtype, m, n, k, gemm_alone_s(gpu, dtype, m, k, ms * 1e-3)


def gemm_alone_s(gpu, dtype: str, m: int, k: int, measured_s: float) -> float:
    """A table row's latency less the quantize of its (m x k) input that it holds, at the planner's cast price
    (kernels.timed_quantize_s: the block-fp8 and nvfp4 rows time TensorRT-LLM's Linear.forward of a bf16 input,
    kernels.TIMED_QUANTIZE; 0 for the bf16 and per-tensor fp8 classes)."""
    return measured_s - timed_quantize_s(gpu, dtype, m, k, EFFICIENCY)


def predicted(gpu, dtype, m, n, k, eff=EFFICIENCY) -> float:
    """The model's time at the tables' (burst) clock."""
    return gemm_time((float(m),), float(n), float(k), dtype, burst(gpu), eff)


def errors_by(rows) -> dict:
    """predicted / measured - 1 of ``rows`` of (class, predicted s, measured s), by class in first-seen order."""
    by: dict = {}
    for key, predicted_s, measured_s in rows:
        by.setdefault(key, []).append(predicted_s / measured_s - 1)
    return by


def error_stats(errors: list[float]) -> dict:
    """The tables' columns of one class's relative errors: rows, median absolute, signed median, 90th percentile
    absolute."""
    return {
        "n": len(errors),
        "median_abs": median(abs(e) for e in errors),
        "signed_median": median(errors),
        "p90_abs": sorted(abs(e) for e in errors)[int(0.9 * len(errors))],
    }


def error_cells(r: dict) -> str:
    return f"{r['median_abs']:.1%} | {r['signed_median']:+.1%} | {r['p90_abs']:.1%} |"


def table(data: dict, eff=EFFICIENCY) -> list[dict]:
    """Per (system, class): the model against the GEMM-alone rows (rows); the per-tensor fp8 rows, which keep their
    dynamic amax and quantize (no ceiling is fitted on them), against the model's GEMM plus that quantize
    (kernels.dynamic_quantize_s): like with like."""
    by = errors_by(
        ((s, d), predicted(gpu, d, m, n, k, eff) + dynamic_quantize_s(gpu, d, m, k, eff), measured)
        for s, gpu, d, m, n, k, measured in rows(data)
    )
    return [
        {
            "system": system,
            "dtype": dtype,
            "ceiling": tabled_ceiling(GPUS[data["systems"][system]["gpu"]], dtype),
            **error_stats(errors),
        }
        for (system, dtype), errors in by.items()
    ]


def _table_scales(system: str, entry: dict, table: MeasuredGemm | None = None, bound: float = 0.0) -> dict:
    """predicted / measured at the median of each dtype of one table (planner/kernel_fit.py class_scales) at the
    global k0, fill and fixed cost, the GPU's GEMM table replaced by ``table`` (None: its generation's ceilings), over
    the shapes whose peak share (kernels.gemm_peak_share, at those ceilings) is at least ``bound`` (0: every shape)."""
    gpu = replace(GPUS[entry["gpu"]], gemm_table=table)
    at = burst(gpu)  # the tables' clock, as predicted's
    points = [p for p in rows({"systems": {system: entry}}) if gemm_peak_share(*p[3:6], p[2], at, EFFICIENCY) >= bound]
    by = log_errors(points, EFFICIENCY, lambda p, e: predicted(gpu, p[2], *p[3:6], e), _measured, _class)
    return {dtype: scale for (_, dtype), scale in class_scales(by).items()}


OWN_ROUNDS = 12  # the fixed cost and the HBM bound make a GEMM's time not quite 1 / ceiling: rounds settle it
# The shapes a part's ceiling governs (mend13b): those whose predicted time the FLOPs at the dense peak x the ceiling
# set to at least 0.8 (kernels.gemm_peak_share), i.e. the fixed cost, SM fill, k0, tile quantisation and the HBM bound
# together at most 20% of it (the model's own terms, not a shape list). On the b200_sxm grid that is 95 / 84 / 73 of
# 196 shapes (bf16 / fp8_block / nvfp4). Where the tables do not scale like the datasheet peaks (B300 / GB300 nvfp4:
# 0.93x the B200 at m 256, 1.15-1.22x at m, n, k >= 4,096) a median over every shape let the small ones, which the
# ceiling barely moves, set it: the large GEMMs came out 28-33% slow and slower than the B200's (review r13a, 3). At
# 0.5, 0.7, 0.8, 0.9 the B300's nvfp4 ceiling is 0.287 / 0.311 / 0.321 / 0.331; 0.8 chosen having seen that 0.5 still
# prices its large nvfp4 GEMMs 11.5% slow against the B200 (0.7-0.9 within 4.3%; docs/step-time.md, mend13b).
COMPUTE_BOUND = 0.8


# The generation's ceilings of the TIMED_QUANTIZE classes as fitted on the rows as timed (quantize included): Hopper
# block fp8 (sus12), Blackwell block fp8 and nvfp4 (blackwell13; mend13b kept them). bwcast14 refits each on the rows
# less their quantize (quantize_free_ceiling), keeping the median bias the ceiling had on the shapes it governs: only
# the quantize leaves the ceiling, nothing else is refitted.
AS_TIMED = {("h100_sxm", "fp8_block"): 0.629, ("b200_sxm", "fp8_block"): 0.635, ("b200_sxm", "nvfp4"): 0.415}


def quantize_free_ceiling(system: str, dtype: str, as_timed: float | None = None, bound: float | None = None) -> float:
    """The ceiling of ``system``'s ``dtype`` class that meets its GEMM-alone rows (rows) with the median predicted /
    measured that ``as_timed`` (AS_TIMED) had on the rows as timed, each over its compute-bound shapes (peak share
    >= ``bound``, COMPUTE_BOUND: mend13b's rule, a ceiling fitted on the shapes it governs; the small ones, where a
    quantize is up to half the row, are left to the fixed cost and fill). k0, fill and fixed cost kept; OWN_ROUNDS
    rounds of scaling. Rounded to 3 places, as GEMM_CEILING carries them."""
    entry = load()["systems"][system]
    as_timed = as_timed if as_timed is not None else AS_TIMED[system, dtype]
    bound = COMPUTE_BOUND if bound is None else bound
    alone = list(rows({"systems": {system: entry | {"dtypes": {dtype: entry["dtypes"][dtype]}}}}))
    timed = [(*p[:6], p[6] + timed_quantize_s(p[1], dtype, p[3], p[5], EFFICIENCY)) for p in alone]
    target = _class_scale(timed, dtype, as_timed, bound)
    ceiling = as_timed
    for _ in range(OWN_ROUNDS):
        ceiling *= _class_scale(alone, dtype, ceiling, bound) / target
    return round(ceiling, 3)


def _class_scale(points: list, dtype: str, ceiling: float, bound: float) -> float:
    """predicted / measured at the median of ``points`` whose peak share (kernels.gemm_peak_share) is at least
    ``bound``, with the ``dtype`` ceiling set to ``ceiling`` (an Efficiency.gemm_ceilings entry: kernels.gemm_ceiling,
    the one reader, takes it first)."""
    eff = replace(EFFICIENCY, gemm_ceilings=((dtype, ceiling),))
    kept = [p for p in points if gemm_peak_share(*p[3:6], dtype, burst(p[1]), eff) >= bound]
    return class_scales(log_errors(kept, eff, _predict, _measured))[None]


def own_ceilings(system: str, parts: dict | None = None, bound: float = COMPUTE_BOUND) -> dict[str, float]:
    """A part's GEMM ceilings fitted on its own table, k0, fill and fixed cost kept: each table class (FITTED_ON)
    scaled until the part's median predicted / measured over its compute-bound shapes (peak share >= ``bound`` at
    the trial ceilings) is the anchor's over the anchor's (ANCHOR, the table its generation's GEMM_CEILING was fitted
    on), starting from the generation's: where the ceiling governs, the part's table is then predicted with the
    anchor's median bias, so the two differ by what the tables measured. Rounded to 3 places, as gpu.py carries
    them."""
    parts = parts or load_parts()
    entry = parts["systems"][system]
    gen = generation(GPUS[entry["gpu"]])
    anchor = _table_scales(ANCHOR, load()["systems"][ANCHOR], bound=bound)
    ceilings = {dtype: GEMM_CEILING[gen, dtype] for dtype in FITTED_ON if (gen, dtype) in GEMM_CEILING}
    for _ in range(OWN_ROUNDS):
        own = _table_scales(system, entry, MeasuredGemm(tuple(ceilings.items()), "trial"), bound)
        ceilings = {dtype: c * own[FITTED_ON[dtype]] / anchor[FITTED_ON[dtype]] for dtype, c in ceilings.items()}
    return {dtype: round(c, 3) for dtype, c in ceilings.items()}


def speedups(system: str, dtype: str, parts: dict | None = None) -> dict:
    """ANCHOR's measured time / ``system``'s, shape by shape, over one dtype's table: median, p10, p90, min, max
    and the median by m."""
    parts = parts or load_parts()
    anchor = {tuple(r[:3]): r[3] for r in load()["systems"][ANCHOR]["dtypes"][dtype]}
    own = {tuple(r[:3]): r[3] for r in parts["systems"][system]["dtypes"][dtype]}
    ratio = {key: anchor[key] / own[key] for key in anchor}
    values = sorted(ratio.values())
    at = lambda q: values[int(q * (len(values) - 1))]  # noqa: E731
    by_m = {m: median(r for key, r in ratio.items() if key[0] == m) for m in sorted({key[0] for key in ratio})}
    return {"median": median(values), "p10": at(0.1), "p90": at(0.9), "min": values[0], "max": values[-1], "by_m": by_m}


LARGE = 4096  # the tables' largest shapes: m, n and k all at least this (50 of the 196-shape grid)


def ordering(system: str, dtype: str, parts: dict | None = None) -> dict:
    """The part's time over the B200's at the tables' largest shapes (LARGE), median over them: as the two tables
    measured (the GEMM alone: gemm_alone_s), and as the model prices the two presets (the part's own ceilings against
    the generation's)."""
    parts = parts or load_parts()
    entry = parts["systems"][system]
    part, b200 = GPUS[entry["gpu"]], GPUS[load()["systems"][ANCHOR]["gpu"]]
    anchor = {tuple(p[3:6]): p[6] for p in rows({"systems": {ANCHOR: load()["systems"][ANCHOR]}}) if p[2] == dtype}
    own = {tuple(p[3:6]): p[6] for p in rows({"systems": {system: entry}}) if p[2] == dtype and min(p[3:6]) >= LARGE}
    return {
        "shapes": len(own),
        "measured": median(t / anchor[key] for key, t in own.items()),
        "predicted": median(predicted(part, dtype, *key) / predicted(b200, dtype, *key) for key in own),
    }


def h200_table_clock(parts: dict | None = None) -> dict:
    """The clock aiconfigurator's H200 bf16 table ran at, two ways. ``logged_mhz``: at the shapes both measured (this
    project's run 2 ``gemm_bf16`` fwd / dgrad / wgrad, the same torch.mm -> cuBLAS), run 2's logged SM clock x its
    time over the table's, median over rows. ``model_mhz``: the clock at which the model (the H200's ceiling, fitted
    at run 2's logged clocks) meets the table's compact grid in median (time ~ 1 / clock)."""
    import h200_tables  # bench sibling; kept out of the module's imports: it loads the H200 runs

    parts = parts or load_parts()
    table = {tuple(r[:3]): r[3] * 1e-3 for r in parts["h200_sxm_at_run2_shapes"]}
    both = [
        (r["sm_mhz"] * r["seconds"] / table[key], r["seconds"] / table[key])
        for r in h200_tables.load("run2")["gemm_bf16"]
        if r["seconds"] is not None
        and r["pass"] in ("fwd", "dgrad", "wgrad")
        and (key := (r["m"], r["n"], r["k"])) in table
    ]
    entry = parts["systems"]["h200_sxm"]
    gpu = GPUS[entry["gpu"]]
    points = rows({"systems": {"h200_sxm": entry | {"dtypes": {"bf16": entry["dtypes"]["bf16"]}}}})
    scale = class_scales(log_errors(points, EFFICIENCY, _predict, _measured))[None]
    datasheet = DATASHEET_CLOCK_MHZ[generation(gpu)]
    return {
        "rows": len(both),
        "time_ratio": median(t for _, t in both),
        "logged_mhz": median(c for c, _ in both),
        "model_mhz": datasheet * scale,
        "datasheet_mhz": datasheet,
    }


def parts_report() -> None:
    """The GB200, B300 and GB300 tables against the B200's, their own ceilings, and the H200 table's clock."""
    parts = load_parts()
    head = (
        f"| part (table) | dtype | {ANCHOR} time / part's: median | p10 - p90 | min - max | by m (256 / 1k / 4k / 8k) |"
    )
    print(head)
    print("|---|---|---|---|---|---|")
    for system in (s for s in parts["systems"] if generation(GPUS[parts["systems"][s]["gpu"]]) == 100):
        for dtype in parts["systems"][system]["dtypes"]:
            r = speedups(system, dtype, parts)
            by_m = " / ".join(f"{v:.3f}" for v in r["by_m"].values())
            print(
                f"| {system} | {dtype} | {r['median']:.3f} | {r['p10']:.3f} - {r['p90']:.3f} | "
                f"{r['min']:.3f} - {r['max']:.3f} | {by_m} |"
            )
    print()
    print(f"| part (table) | dtype | m, n, k >= {LARGE:,} | part / B200 time, measured | model | model / measured |")
    print("|---|---|---|---|---|---|")
    for system in (s for s in parts["systems"] if generation(GPUS[parts["systems"][s]["gpu"]]) == 100):
        for dtype in parts["systems"][system]["dtypes"]:
            o = ordering(system, dtype, parts)
            print(
                f"| {system} | {dtype} | {o['shapes']} | {o['measured']:.3f} | {o['predicted']:.3f} | "
                f"{o['predicted'] / o['measured'] - 1:+.1%} |"
            )
    print()
    print("| GPU (table) | dtype | GEMMs | ceiling | median abs error | signed median | p90 abs error |")
    print("|---|---|---|---|---|---|---|")
    for r in table(parts):
        print(f"| {r['system']} | {r['dtype']} | {r['n']} | {r['ceiling']:.3f} | {error_cells(r)}")
    print()
    c = h200_table_clock(parts)
    print(
        f"h200_sxm bf16 table: {c['rows']} shapes in run 2, which took {c['time_ratio']:.3f}x the table's time: the "
        f"table at {c['logged_mhz']:,.0f} MHz in run 2's logged clock; the model meets its grid at "
        f"{c['model_mhz']:,.0f} MHz ({c['model_mhz'] / c['datasheet_mhz']:.3f} of {c['datasheet_mhz']:,})"
    )


def moe_rows():
    """(hidden, inter, experts, topk, ep, tokens, distribution, predicted s, measured s) per measured MoE forward."""
    data = json.loads(MOE.read_text())
    gpu = burst(GPUS[data["gpu"]])
    for h, f, experts, topk, ep, tokens, dist, ms in data["rows"]:
        local = experts // ep
        rows = tokens * topk / experts  # per local expert, uniform routing
        fwd, _ = routed_expert_kernels(tokens, rows, local, h, f, True, "bf16", 2, FUSED, gpu)
        yield h, f, experts, topk, ep, tokens, dist, sum(k.time_s for k in fwd), ms * 1e-3


def attention_rows():
    """(system, isl, predicted s, measured s) per measured causal attention forward (head dim 128)."""
    data = json.loads(ATTENTION.read_text())
    for system, entry in data["systems"].items():
        gpu = burst(GPUS[entry["gpu"]])
        for batch, isl, heads, _kv, ms in entry["rows"]:
            flops = 2.0 * batch * isl * causal_keys(isl, None) * heads * (128 + 128)
            predicted, _ = flash_attention_s(flops, isl, FMHA_CLASS[generation(gpu)], gpu)
            yield system, isl, predicted, ms * 1e-3


ATTENTION_FP8 = REFERENCE / "aiconfigurator_attention_fp8.json"
# the s0 grid of the context-FMHA fits (fmha_fit): 0 to 4,096 keys in steps of 64
FMHA_S0_GRID = tuple(64.0 * i for i in range(65))


def fmha_points(fp8: bool) -> list[tuple]:
    """(system, gpu at the tables' clock, batch, isl, heads, measured s) of TensorRT-LLM's causal context FMHA at
    head dim 128 on Hopper and Blackwell (aiconfigurator_attention_fp8.json: the FP8 kernel with an FP8 KV cache,
    ``fp8``, or the bf16 kernel's latency of the same shapes)."""
    data = json.loads(ATTENTION_FP8.read_text())
    return [
        (system, burst(GPUS[entry["gpu"]]), batch, isl, heads, (f8 if fp8 else bf) * 1e-3)
        for system, entry in data["systems"].items()
        for batch, isl, heads, _kv, f8, bf in entry["rows"]
    ]


def _fmha_predict(p, eff) -> float:
    """The bf16 FMHA's forward (flash_attention_s: the cudnn class's ATTENTION_CEILING x s / (s + eff's s0))."""
    _, gpu, batch, isl, heads, _ = p
    flops = 2.0 * batch * isl * causal_keys(isl, None) * heads * (128 + 128)
    return flash_attention_s(flops, isl, FMHA_CLASS[generation(gpu)], gpu, eff)[0]


def fmha_fit(points: list[tuple]) -> dict[str, tuple[float, float]]:
    """One kernel's own (forward ceiling, s0) per system of a context-FMHA table: the s0 of least rms log error
    over the system's shapes (planner/kernel_fit.py fit_grid over FMHA_S0_GRID), then its ceiling refitted at that
    s0 (class_scales: the cudnn class's bf16 ATTENTION_CEILING x predicted / measured at the median). The one fit of
    the bf16 and the FP8 kernel whose ratio planner/kernels.py CONTEXT_FMHA_FP8 holds."""
    grid = [replace(EFFICIENCY, attention_s0=s0) for s0 in FMHA_S0_GRID]
    out = {}
    for system in dict.fromkeys(p[0] for p in points):
        mine = [p for p in points if p[0] == system]
        _, eff = fit_grid(mine, grid, _fmha_predict, lambda p: p[5], lambda p: p[0])  # centred: s0 alone
        (scale,) = class_scales(log_errors(mine, eff, _fmha_predict, lambda p: p[5])).values()
        gen = generation(mine[0][1])
        out[system] = (ATTENTION_CEILING[(FMHA_CLASS[gen], gen)][0] * scale, eff.attention_s0)
    return out


def attention_table() -> list[dict]:
    by = errors_by((system, p, m) for system, _, p, m in attention_rows())
    return [{"system": system, **error_stats(e)} for system, e in by.items()]


def moe_table() -> list[dict]:
    by = errors_by((dist, p, m) for *_, dist, p, m in moe_rows())
    return [{"distribution": dist, **error_stats(e)} for dist, e in by.items()]


GRID = [
    replace(EFFICIENCY, gemm_k0=k0, gemm_fill=fill, gemm_fixed_s=fixed)
    for k0 in (0.0, 64.0, 128.0, 256.0)
    for fill in (0.0, 0.1, 0.25, 0.5)
    for fixed in (2e-6, 4e-6, 6e-6, 8e-6)
]


def _centred(points, eff) -> list[float]:
    """Log errors with each (GPU, dtype) class's median taken out: its ceiling refitted with the globals."""
    return centred(log_errors(points, eff, _predict, _measured, _class))


def _predict(p, eff) -> float:
    _, gpu, dtype, m, n, k, _ = p
    return predicted(gpu, dtype, m, n, k, eff)


def _measured(p) -> float:
    return p[6]


def _class(p) -> tuple:
    return p[0], p[2]


def fit(points) -> tuple[float, Efficiency]:
    """The grid point of (k0, fill, fixed cost) with the least rms log error over ``points``, each class's ceiling
    refitted with it (GEMM_CEILING holds the ceilings at the chosen point): planner/kernel_fit.py's procedure."""
    return fit_grid(points, GRID, _predict, _measured, _class)


def leave_one_source_out(data: dict) -> list[dict]:
    """Refit the global GEMM constants without one GPU's table; that table's shape error then (its ceilings,
    per-GPU measured constants, refitted on it)."""
    points = list(rows(data))
    out = []
    for system in data["systems"]:
        _, eff = fit([p for p in points if p[0] != system])
        errors = [math.exp(x) - 1 for x in _centred([p for p in points if p[0] == system], eff)]
        out.append(
            {
                "left_out": system,
                "k0": eff.gemm_k0,
                "fill": eff.gemm_fill,
                "fixed_us": eff.gemm_fixed_s * 1e6,
                "median_abs": median(abs(e) for e in errors),
            }
        )
    return out


def main() -> None:
    if "--parts" in sys.argv:
        parts_report()
        return
    data = load()
    if "--fit" in sys.argv:
        rms, eff = fit(list(rows(data)))
        fixed_us = eff.gemm_fixed_s * 1e6
        print(f"rms log error {rms:.3f} at k0 {eff.gemm_k0:g}, fill {eff.gemm_fill:g}, fixed {fixed_us:g} us")
        print("| left out | refitted k0 / fill / fixed | its median abs error |")
        print("|---|---|---|")
        for r in leave_one_source_out(data):
            print(f"| {r['left_out']} | {r['k0']:g} / {r['fill']:g} / {r['fixed_us']:g} us | {r['median_abs']:.1%} |")
        print()
    print("| GPU (table) | dtype | GEMMs | ceiling | median abs error | signed median | p90 abs error |")
    print("|---|---|---|---|---|---|---|")
    rows_ = table(data)
    for r in rows_:
        print(f"| {r['system']} | {r['dtype']} | {r['n']} | {r['ceiling']:.3f} | {error_cells(r)}")
    print()
    print(
        "| attention forward (TensorRT-LLM FMHA, causal, bf16, d 128) | measured | median abs error | signed median "
        "| p90 abs error |"
    )
    print("|---|---|---|---|---|")
    systems = json.loads(ATTENTION.read_text())["systems"]
    for r in attention_table():
        kernel = FMHA_CLASS[generation(GPUS[systems[r["system"]]["gpu"]])]
        print(f"| {r['system']} ({kernel}) | {r['n']} | {error_cells(r)}")
    print()
    print("| MoE forward, H100 bf16 (routing) | measured | median abs error | signed median | p90 abs error |")
    print("|---|---|---|---|---|")
    for r in moe_table():
        print(f"| {r['distribution']} | {r['n']} | {error_cells(r)}")


if __name__ == "__main__":
    main()
