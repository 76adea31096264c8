"""Predicted vs measured GEMM kernels (tests/reference/kernels/aiconfigurator_gemm.json).

    PYTHONPATH=. python bench/kernel_fit.py          # the per-class table of docs/step-time.md
    PYTHONPATH=. python bench/kernel_fit.py --fit    # refit the global constants (k0, fill, fixed cost) and the
                                                     # per-(generation, dtype) ceilings, by least squares in log time

The tables were measured in short bursts at the boost clock; planner/kernels.py predicts at the clock sustained
through a training step (SUSTAINED_CLOCK), so the comparison scales the compute-bound part back by that factor.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import replace
from pathlib import Path
from statistics import median

from collectives.topology.gpu import GPUS
from planner.kernels import EFFICIENCY, GEMM_CEILING, SUSTAINED_CLOCK, gemm_time, generation

DATA = Path(__file__).resolve().parent.parent / "tests" / "reference" / "kernels" / "aiconfigurator_gemm.json"


def load() -> dict:
    return json.loads(DATA.read_text())


def rows(data: dict):
    """(system, gpu, dtype, m, n, k, measured seconds) for every measured GEMM."""
    for system, entry in data["systems"].items():
        gpu = GPUS[entry["gpu"]]
        for dtype, table in entry["dtypes"].items():
            for m, n, k, ms in table:
                yield system, gpu, dtype, m, n, k, ms * 1e-3


def predicted(gpu, dtype, m, n, k, eff=EFFICIENCY) -> float:
    """The model's time at the tables' (burst) clock."""
    t = gemm_time((float(m),), float(n), float(k), dtype, gpu, eff)
    return (t - eff.gemm_fixed_s) * SUSTAINED_CLOCK.get(generation(gpu), 1.0) + eff.gemm_fixed_s


def table(data: dict, eff=EFFICIENCY) -> list[dict]:
    by: dict[tuple, list[float]] = {}
    for system, gpu, dtype, m, n, k, measured in rows(data):
        by.setdefault((system, dtype), []).append(predicted(gpu, dtype, m, n, k, eff) / measured - 1)
    out = []
    for (system, dtype), errors in by.items():
        gpu = GPUS[data["systems"][system]["gpu"]]
        out.append(
            {
                "system": system,
                "dtype": dtype,
                "n": len(errors),
                "ceiling": GEMM_CEILING.get((generation(gpu), dtype)),
                "median_abs": median(abs(e) for e in errors),
                "signed_median": median(errors),
                "p90_abs": sorted(abs(e) for e in errors)[int(0.9 * len(errors))],
            }
        )
    return out


def fit(data: dict) -> None:
    best = None
    for k0 in (0.0, 64.0, 128.0, 256.0):
        for fill in (0.0, 0.1, 0.25, 0.5):
            for fixed in (2e-6, 4e-6, 6e-6, 8e-6):
                eff = replace(EFFICIENCY, gemm_k0=k0, gemm_fill=fill, gemm_fixed_s=fixed)
                logs = [math.log(predicted(g, d, m, n, k, eff) / t) for _, g, d, m, n, k, t in rows(data)]
                rms = math.sqrt(sum(x * x for x in logs) / len(logs))
                if best is None or rms < best[0]:
                    best = (rms, k0, fill, fixed)
    print(f"rms log error {best[0]:.3f} at k0 = {best[1]:g}, fill = {best[2]:g}, fixed = {best[3] * 1e6:g} us")


def main() -> None:
    data = load()
    if "--fit" in sys.argv:
        fit(data)
    print("| GPU (table) | dtype | GEMMs | ceiling | median abs error | signed median | p90 abs error |")
    print("|---|---|---|---|---|---|---|")
    rows_ = table(data)
    for r in rows_:
        print(
            f"| {r['system']} | {r['dtype']} | {r['n']} | {r['ceiling']:.3f} | {r['median_abs']:.1%} | "
            f"{r['signed_median']:+.1%} | {r['p90_abs']:.1%} |"
        )


if __name__ == "__main__":
    main()
