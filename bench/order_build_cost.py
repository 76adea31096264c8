"""Cold order runs against the cost guard's charge (guard14; docs/step-time.md "(guard14)"): for ZB-H1, ZBV, DualPipe
and DualPipeV at (p, m), ``order_span`` of random unequal passes with no structure cached (best of 3, CPU time) and
``span_work`` at 3 ns a cell; for Megatron's interleaved order (the packed-document draws' structure) a cold ``_graph``
against ``laid_cells``. Prints a markdown table and the range of measured / charged.

    PYTHONPATH=. python bench/order_build_cost.py
"""

from __future__ import annotations

import random
import time

from planner import pipeline_jitter as pj
from planner.pipeline import Schedule, StagePass, schedule_traits

NS_A_CELL = 3e-9  # pipeline_jitter's cell (CELL_UNITS 5 a 15 ns unit)
GRID = ((4, 16), (8, 64), (16, 128), (32, 256), (32, 1024), (16, 2048), (48, 192))


def _passes(rng: random.Random, p: int, copies: int) -> list[StagePass]:
    """p ranks of their own pass (total 0.5-1.5, forward 0.2-0.45 of it, W a share of the backward, chunk split)."""
    out = []
    for _ in range(p):
        total, f, a = rng.uniform(0.5, 1.5), rng.uniform(0.2, 0.45), rng.uniform(0.2, 0.8)
        fwd, bwd = f * total, (1 - f) * total
        out.append(StagePass(fwd, bwd, copies * fwd * a, copies * bwd * (1 - a), 0.3 * bwd, copies))
    return out


def _cold(run, tries: int = 3) -> float:
    best = float("inf")
    for _ in range(tries):
        pj._SPANS.clear()
        pj._ENDS.clear()
        pj._GRAPHS.clear()
        start = time.process_time()
        run()
        best = min(best, time.process_time() - start)
    return best


def _row(kind: str, where: str, ops: int, charged: float, spent: float) -> None:
    print(f"| {kind} | {where} | {ops:,} | {charged * 1e3:.1f} ms | {spent * 1e3:.1f} ms | {spent / charged:.2f} |")


def main() -> None:
    rng = random.Random(1)
    print("| kind, v | p, m | ops | charged | measured cold | measured / charged |")
    print("| --- | --- | --- | --- | --- | --- |")
    ratios = []
    for kind in ("zb-h1", "zbv", "dualpipe", "dualpipev"):
        v = 1 if kind == "zb-h1" else 2
        for p, m in GRID:
            sched = Schedule(kind, p, m, v)
            passes = _passes(rng, p, schedule_traits(kind).directions)
            spent = _cold(lambda passes=passes, sched=sched: pj.order_span(passes, sched))
            charged = pj.span_work(kind, p, v, m) * NS_A_CELL
            ops = len(pj._graph(kind, p, v, pj.span_run(kind, p, v, m)).at)
            ratios.append(spent / charged)
            _row(f"{kind}, {v}", f"{p}, {m}", ops, charged, spent)
    for v in (2, 4):
        for p, m in ((8, 64), (16, 128), (32, 256)):
            run = pj._runs(p, v, m)[-1]
            spent = _cold(lambda p=p, v=v, run=run: pj._graph("interleaved", p, v, run))
            ops = 2 * v * run * p
            charged = pj.laid_cells(p, ops, *pj.build_cells("interleaved")) * NS_A_CELL
            _row(f"interleaved, {v} (structure)", f"{p}, {run}", ops, charged, spent)
    print(f"order runs, measured / charged: {min(ratios):.2f}-{max(ratios):.2f}")


if __name__ == "__main__":
    main()
