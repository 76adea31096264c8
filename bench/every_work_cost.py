"""CPU of a plan's ``candidates: "all"`` call, cold, against its charge (planner/estimate.py ``every_work``; speed15,
docs/search.md "Round 15's slow corners (speed15)"): ``price_call(which="all", pricing="schedule")`` on DGX H100
placements (or ``--cluster``'s), the schedule and route memos cleared and the cluster built anew before each run (its
network's path memo cold), best of two, CPU time. Charged: ``every_work`` plus ``routing_work`` (the network's
``pairs_work`` over the node pairs routed: router networks; mend15d, docs/search.md "Review r15c's findings").

    PYTHONPATH=. python bench/every_work_cost.py                          # the grid the EVERY_* weights were fitted on
    PYTHONPATH=. python bench/every_work_cost.py --ops allreduce --ranks 8,256 --groups 1,8
    PYTHONPATH=. python bench/every_work_cost.py --cluster tpu-torus      # the router networks' grid (mend15d)
    PYTHONPATH=. python bench/every_work_cost.py --cluster tpu-torus --network dragonfly --ranks 64,256

Groups of n <= a node's devices sit in one node each (tensor-parallel-like); larger groups take one rank a node,
strided by g (data-parallel-like). All-to-all messages are rounded down to a multiple of n (equal blocks).
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import time

import numpy as np

import collectives.topology.pricing as routes
import collectives.topology.select as select
from collectives import Op
from collectives.topology import Cluster, cluster_preset
from planner.estimate import PricingPath, every_work, routed_pairs, routing_work

UNIT_S = 15e-9  # one work unit (planner/estimate.py's module docstring)
GRID = [(n, g) for n in (8, 16, 32, 64, 128, 256, 512, 1024) for g in (1, 8) if n > 8 or g == 1] + [
    (8, 16), (8, 128), (8, 144), (8, 1024), (2, 64), (2, 512), (4, 256), (32, 32), (144, 8), (2048, 1),
]  # fmt: skip
# router networks, one device a node: n nodes of one group (the 256-router torus is review r15c's worst admitted plan)
ROUTER_GRID = [(n, 1) for n in (8, 16, 32, 64, 128, 256)] + [(8, 8), (16, 16)]


def cluster_for(preset: str, nodes: int, network: str | None = None) -> Cluster:
    """``preset`` on ``nodes`` nodes; ``network`` swaps its network's plug-in (dragonfly, hypercube: no preset)."""
    spec = cluster_preset(preset, nodes)
    if network:
        spec = dataclasses.replace(spec, network=dataclasses.replace(spec.network, topology=network))
    return Cluster(spec)


def placement_of(n: int, g: int, per: int) -> np.ndarray:
    """g groups of n ranks: one node each where n <= ``per`` (a node's devices), else one rank a node, strided by g."""
    return np.arange(g * n).reshape(g, n) if n <= per else np.arange(g * n).reshape(n, g).T.copy()


def charged_units(op: Op, n: int, g: int, message: int, cluster: Cluster) -> tuple[int, int]:
    """(units the cost guard charges a ``candidates: all`` call of ``op`` on g groups of n ranks placed as
    :func:`placement_of`, those of them for routing its node pairs)."""
    placement = placement_of(n, g, cluster.per_node)
    algorithms = select.candidates(op, cluster, "all")
    routing = routing_work(cluster, placement, op, PricingPath(False, algorithms, every=True))
    return every_work(op, n, g, algorithms, message) + routing, routing


def cold_ms(op: Op, n: int, g: int, message: int, preset: str = "dgx-h100", network: str | None = None):
    """(measured ms, charged ms, node pairs' routing units) of one cold ``candidates: all`` call of ``op`` on g
    groups of n ranks."""
    per = cluster_preset(preset, 1).devices_per_node
    nodes = max(1, g * n // per)
    placement = placement_of(n, g, per)
    size = message // (n * 8) * n * 8 if op is Op.ALLTOALL else message
    best = []
    for _ in range(2):
        cluster = cluster_for(preset, nodes, network)
        select.cached_schedule.cache_clear()
        routes._NODES.clear()
        routes._ROUTES.clear()
        start = time.process_time()
        select.price_call(op, size, placement, cluster, "auto", which="all", pricing="schedule")
        best.append(time.process_time() - start)
    charged, routing = charged_units(op, n, g, size, cluster)
    return min(best) * 1e3, charged * UNIT_S * 1e3, routing


ROW = re.compile(r"(\w+)\s+n\s+(\d+) g\s+(\d+):\s+([\d.]+) ms CPU")


def fit_pairs(paths: list[str]) -> None:
    """Least squares on relative error of RouterNetwork's PAIR_WEIGHT and PAIR_LINK_WEIGHT (collectives/topology/
    networks/_routed.py) over this script's printed runs (``== PRESET [--network NAME]`` headers, then its rows):
    measured units = every_work + pairs x (PAIR_WEIGHT + PAIR_LINK_WEIGHT x directed links)."""
    rows, cluster = [], None
    for line in (line for path in paths for line in open(path)):  # noqa: SIM115
        if line.startswith("=="):
            words = line.split()
            preset, network = words[1], (words[3] if len(words) > 3 else None)
        elif (hit := ROW.match(line)) and preset != "dgx-h100":
            op, n, g, ms = Op(hit[1]), int(hit[2]), int(hit[3]), float(hit[4])
            cluster = cluster_for(preset, g * n, network)
            placement = np.arange(g * n).reshape(n, g).T.copy()
            algorithms = select.candidates(op, cluster, "all")
            pairs = routed_pairs(op, cluster.node_of(placement), algorithms)
            every = every_work(op, n, g, algorithms)
            rows.append((network or preset, op, n, g, ms / 1e3 / UNIT_S, every, pairs, len(cluster.network.links)))
    measured, every, pairs, links = (np.array([r[i] for r in rows], dtype=float) for i in (4, 5, 6, 7))
    design = np.stack([pairs / measured, pairs * links / measured], axis=1)
    (a, b), *_ = np.linalg.lstsq(design, 1 - every / measured, rcond=None)
    print(f"{len(rows)} calls: PAIR_WEIGHT {a:.0f}, PAIR_LINK_WEIGHT {b:.2f}")
    for kind in dict.fromkeys(r[0] for r in rows):
        mine = np.array([r[0] == kind for r in rows])
        ratio = measured[mine] / (every[mine] + pairs[mine] * (round(a) + round(b) * links[mine]))
        before = measured[mine] / every[mine]  # every_work alone, as before mend15d
        print(f"  {kind}, {mine.sum()} calls: measured / charged {ratio.min():.2f}-{ratio.max():.2f}, median "
              f"{np.median(ratio):.2f} (every_work alone: {before.min():.1f}-{before.max():.1f})")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", default="allreduce,allgather,reducescatter,broadcast,alltoall")
    ap.add_argument("--ranks", help="comma-separated n (with --groups: their product replaces the grid)")
    ap.add_argument("--groups", default="1")
    ap.add_argument("--message", type=int, default=1 << 28)
    ap.add_argument("--cluster", default="dgx-h100", help="a cluster preset (tpu-torus: the router networks' grid)")
    ap.add_argument("--network", help="swap the preset's network plug-in (dragonfly, hypercube)")
    ap.add_argument("--fit", nargs="+", help="fit the router networks' pair weights on these printed runs")
    args = ap.parse_args()
    if args.fit:
        return fit_pairs(args.fit)
    grid = GRID if args.cluster == "dgx-h100" and not args.network else ROUTER_GRID
    if args.ranks:
        grid = [(int(n), int(g)) for n in args.ranks.split(",") for g in args.groups.split(",")]
    ratios = []
    for n, g in grid:
        for op in (Op(x) for x in args.ops.split(",")):
            measured, charged, routing = cold_ms(op, n, g, args.message, args.cluster, args.network)
            ratios.append(measured / charged)
            routed = f"(routing {routing * UNIT_S * 1e3:.2f})"
            print(f"{op.value:14s} n {n:5d} g {g:5d}: {measured:9.2f} ms CPU, charged {charged:9.2f} ms {routed}, "
                  f"measured / charged {measured / charged:.2f}", flush=True)  # fmt: skip
    print(
        f"{len(ratios)} calls: measured / charged {min(ratios):.2f}-{max(ratios):.2f}, median {np.median(ratios):.2f}"
    )


if __name__ == "__main__":
    main()
