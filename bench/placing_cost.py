"""CPU of placing a plan's calls, a rank: the measurement behind planner/estimate.py ``PLACED_PER_UNIT`` (speed15's
0.63 ns a rank at 16,384 GPUs, 9.4 at 512; review r15c #4: no script reproduced it; mend15d, docs/search.md
"Review r15c's findings (mend15d)").

For each of ``--items`` Llama-3 70B layouts of bench/batch_scale.py (the batch the constant was fitted for), every
call of its ledger asks a fresh ``RankLayout`` (its memo cold, as a layout new to the service) for its placement,
as the plan and the estimate do (repeats of a call's groups hit the memo, as in a plan); best of ``--repeat``, CPU
time. Prints ns a rank of every call's placement (what ``placing_work`` divides by PLACED_PER_UNIT) and the constant
that charges it at cost: 15 ns a unit / ns a rank.

    PYTHONPATH=. python bench/placing_cost.py                    # 512 and 16,384 GPUs (64 and 2,048 DGX H100)
    PYTHONPATH=. python bench/placing_cost.py --nodes 2048 --items 5
"""

from __future__ import annotations

import argparse
import time

from app.convert import plan_inputs
from app.schemas.plan import PlanRequest
from app.settings import Settings
from bench.batch_scale import configs
from planner.layout import RankLayout
from planner.plan import prepare

UNIT_NS = 15.0  # one work unit (planner/estimate.py's module docstring)


def placing_ns(model: str, preset: str, nodes: int, items: int, repeat: int) -> tuple[float, int]:
    """(CPU ns a placed rank, ranks placed) over ``items`` layouts, each the best of ``repeat`` cold runs."""
    seconds, ranks, settings = 0.0, 0, Settings()
    for item in configs(model, preset, nodes, items):
        model_spec, work, par, cluster, options = plan_inputs(PlanRequest.model_validate(item), settings)
        calls = prepare(model_spec, work, par, cluster, options).calls
        best = float("inf")
        for _ in range(repeat):
            layout = RankLayout(par)
            start = time.process_time()
            placed = sum(layout.placement(c.group, c.stages).size for c in calls)
            best = min(best, time.process_time() - start)
        seconds, ranks = seconds + best, ranks + placed
    return seconds * 1e9 / ranks, ranks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama3-70b")
    ap.add_argument("--preset", default="dgx-h100")
    ap.add_argument("--nodes", default="64,2048", help="comma-separated node counts (8 GPUs a node)")
    ap.add_argument("--items", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    for nodes in (int(x) for x in args.nodes.split(",")):
        ns, ranks = placing_ns(args.model, args.preset, nodes, args.items, args.repeat)
        print(f"{args.model} on {nodes * 8:,} GPUs, {args.items} layouts: {ranks:,} ranks placed, {ns:.2f} ns a rank; "
              f"PLACED_PER_UNIT at cost = {UNIT_NS:.0f} / {ns:.2f} = {UNIT_NS / ns:.0f}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
