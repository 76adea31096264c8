"""CPU of a plan's ``candidates: "all"`` call, cold, against its charge (planner/estimate.py ``every_work``; speed15,
docs/search.md "Round 15's slow corners (speed15)"): ``price_call(which="all", pricing="schedule")`` on DGX H100
placements, the schedule and route memos cleared before each run, best of two, CPU time.

    PYTHONPATH=. python bench/every_work_cost.py                          # the grid the EVERY_* weights were fitted on
    PYTHONPATH=. python bench/every_work_cost.py --ops allreduce --ranks 8,256 --groups 1,8

Groups of n <= 8 ranks sit in one node each (tensor-parallel-like); larger groups take one rank a node, strided by
g (data-parallel-like). All-to-all messages are rounded down to a multiple of n (equal blocks).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import collectives.topology.pricing as routes
import collectives.topology.select as select
from collectives import Op
from collectives.topology import Cluster, cluster_preset
from planner.estimate import every_work

UNIT_S = 15e-9  # one work unit (planner/estimate.py's module docstring)
GRID = [(n, g) for n in (8, 16, 32, 64, 128, 256, 512, 1024) for g in (1, 8) if n > 8 or g == 1] + [
    (8, 16), (8, 128), (8, 144), (8, 1024), (2, 64), (2, 512), (4, 256), (32, 32), (144, 8), (2048, 1),
]  # fmt: skip


def cold_ms(op: Op, n: int, g: int, message: int) -> tuple[float, float]:
    """(measured ms, charged ms) of one cold ``candidates: all`` call of ``op`` on g groups of n ranks."""
    cluster = Cluster(cluster_preset("dgx-h100", max(1, g * n // 8)))
    placement = np.arange(g * n).reshape(g, n) if n <= 8 else np.arange(g * n).reshape(n, g).T.copy()
    size = message // (n * 8) * n * 8 if op is Op.ALLTOALL else message
    best = []
    for _ in range(2):
        select.cached_schedule.cache_clear()
        routes._NODES.clear()
        routes._ROUTES.clear()
        start = time.process_time()
        select.price_call(op, size, placement, cluster, "auto", which="all", pricing="schedule")
        best.append(time.process_time() - start)
    charged = every_work(op, n, g, select.candidates(op, cluster, "all"), size) * UNIT_S
    return min(best) * 1e3, charged * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", default="allreduce,allgather,reducescatter,broadcast,alltoall")
    ap.add_argument("--ranks", help="comma-separated n (with --groups: their product replaces the grid)")
    ap.add_argument("--groups", default="1")
    ap.add_argument("--message", type=int, default=1 << 28)
    args = ap.parse_args()
    grid = GRID
    if args.ranks:
        grid = [(int(n), int(g)) for n in args.ranks.split(",") for g in args.groups.split(",")]
    ratios = []
    for n, g in grid:
        for op in (Op(x) for x in args.ops.split(",")):
            measured, charged = cold_ms(op, n, g, args.message)
            ratios.append(measured / charged)
            print(f"{op.value:14s} n {n:5d} g {g:5d}: {measured:9.2f} ms CPU, charged {charged:9.2f} ms, "
                  f"measured / charged {measured / charged:.2f}", flush=True)  # fmt: skip
    print(
        f"{len(ratios)} calls: measured / charged {min(ratios):.2f}-{max(ratios):.2f}, median {np.median(ratios):.2f}"
    )


if __name__ == "__main__":
    main()
