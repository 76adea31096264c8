"""Error tables of the library pricer on tests/reference/nccl/measurements.json (docs/pricing.md):
per category (GPU generation x nodes x size band) and leave-one-source-out (the global scalars refitted
without a source, then that source predicted); then the held-out logs of tests/reference/nccl_heldout/,
priced blind with the default constants. Run: PYTHONPATH=. python bench/library_table.py"""

import json
from collections import defaultdict
from pathlib import Path

import numpy as np

from collectives.topology.calibration import cluster_for_record
from collectives.topology.library import LibraryCalibration
from collectives.topology.library.calibration import GENERATIONS, generation
from collectives.topology.reference import compare_all
from tests.collectives.heldout import rows as heldout_rows

RECORDS = json.loads((Path(__file__).parents[1] / "tests/reference/nccl/measurements.json").read_text())


def band(size: int) -> str:
    return ">= 64 MiB" if size >= 64 << 20 else "64 KiB-64 MiB" if size >= 64 << 10 else "< 64 KiB"


def span(nodes: int) -> str:
    return "one node" if nodes == 1 else "across nodes"


def source(r: dict) -> str:
    return r["source"].split(":")[0].split(" ")[0]


def fit(records) -> LibraryCalibration:
    """The handful of scalars, each on the rows that show it:
    - efficiency per link kind: median measured / modelled busbw on >= 64 MiB rows (NCCL's raw model);
    - latency scale inside a node, per GPU generation: grid, median |error| on that generation's one-node rows
      below 64 MiB; a generation without rows takes the nearest generation's value (newer on a tie);
    - latency scale across nodes: the same on multi-node rows of non-EFA networks;
    - EFA's per-hop latency (the p4de records: aws-ofi-nccl's SENDRECV protocol): the same on EFA rows,
      with the inter-node scale fixed, together with the network step window's count of one-way latencies
      (window_fit; the count is a module constant, tables.WINDOW_ONE_WAYS, which a left-out source keeps)."""
    # priors, before any fit: NCCL's model as is, and the SENDRECV EFA latency as aws-ofi-nccl reports it to
    # NCCL's tuner for p4d/p4de (75 us, src/platform-aws.cpp), so that leaving out the one EFA source
    # really predicts it blind
    raw = LibraryCalibration(efficiency={}, latency_scale={}).with_values(network_latency_s={"efa_sendrecv": 75e-6})
    eff = defaultdict(list)
    for c in compare_all(records, raw, "library"):
        if c.size_bytes >= 64 << 20 and c.record["op"] != "sendrecv":
            kind = "nic" if c.record["nodes"] > 1 else "in_network" if c.algorithm == "in_network" else "nvlink"
            eff[kind].append(c.measured_busbw / c.predicted_busbw)
    cal = raw.with_values(efficiency={k: float(np.median(v)) for k, v in eff.items()})
    small = [r for r in records if r.get("size_bytes") and r["size_bytes"] < 64 << 20]
    one = [r for r in small if r["nodes"] == 1]
    efa = [r for r in small if r["nodes"] > 1 and "EFA" in r["interconnect"]]
    other = [r for r in small if r["nodes"] > 1 and "EFA" not in r["interconnect"]]
    scales = np.arange(1.0, 4.01, 0.125)
    fitted = {}
    for gen in GENERATIONS:
        rows = [r for r in one if generation(sm_of(r)) == gen]
        if rows:
            key = f"intra_node:{gen}"
            cal = _grid(cal, rows, [cal.with_values(latency_scale={key: s}) for s in scales])
            fitted[gen] = cal.latency_scale[key]
    cal = cal.with_values(latency_scale={f"intra_node:{g}": _nearest(g, fitted) for g in GENERATIONS})
    cal = cal.with_values(latency_scale={"inter_node": 1.0})
    for gen in GENERATIONS:  # the network's part, per generation, given the domain's part the rows carry
        rows = [r for r in other if generation(sm_of(r)) == gen]
        key = f"inter_node:{gen}"
        cal = _grid(cal, rows, [cal.with_values(latency_scale={key: s}) for s in np.arange(0.25, 4.01, 0.125)])
    return window_fit(efa, cal)[1]


def window_fit(rows, cal: LibraryCalibration) -> tuple[int, LibraryCalibration, float]:
    """tables.WINDOW_ONE_WAYS and EFA's SENDRECV per-hop latency, fitted together on ``rows`` (the EFA rows
    below 64 MiB: the fit set's only rows where the network step window binds, model.py Candidate.window_s):
    the pair of smallest median |busbw error| over {2, 3, 4, 5} one-way latencies x 10-150 us, priced cold
    each time (the smaller count on a tie). Returns (count, ``cal`` with the latency, median); without rows,
    (the kept count, ``cal``, nan). tables.WINDOW_ONE_WAYS is restored afterwards."""
    from collectives.topology.library import pricer
    from collectives.topology.library import tables as T

    kept = T.WINDOW_ONE_WAYS
    if not rows:
        return kept, cal, float("nan")
    trials = [cal.with_values(network_latency_s={"efa_sendrecv": u * 1e-6}) for u in range(10, 151, 10)]
    scored = []
    try:
        for k in (2, 3, 4, 5):
            T.WINDOW_ONE_WAYS = k
            pricer._CANDS.clear()
            for i, t in enumerate(trials):
                scored.append((float(np.median([abs(c.error) for c in compare_all(rows, t, "library")])), k, i))
    finally:
        T.WINDOW_ONE_WAYS = kept
        pricer._CANDS.clear()
    median, k, i = min(scored)
    return k, trials[i], median


def sm_of(record: dict) -> int:
    """The record's compute capability, from its preset (reference.py picks the preset by GPU)."""
    return cluster_for_record(record).gpu.sm


def _nearest(gen: str, fitted: dict[str, float]) -> float:
    """``gen``'s fitted value, or that of the nearest generation that has one (the newer on a tie)."""
    i = GENERATIONS.index(gen)
    order = sorted(range(len(GENERATIONS)), key=lambda j: (abs(j - i), -j))
    return next(fitted[GENERATIONS[j]] for j in order if GENERATIONS[j] in fitted)


def _grid(cal: LibraryCalibration, rows: list[dict], trials: list[LibraryCalibration]) -> LibraryCalibration:
    """The trial with the smallest median |busbw error| on ``rows`` (``cal`` when there are none)."""
    if not rows:
        return cal
    scored = [
        (float(np.median([abs(c.error) for c in compare_all(rows, t, "library")])), i) for i, t in enumerate(trials)
    ]
    return trials[min(scored)[1]]


def nvls_fill_hops_grid(records) -> dict[int, float]:
    """tables.NVLS_ONE_NODE_FILL_HOPS, re-derived: the fit set's one-node median |busbw error| at 64 KiB-64 MiB
    for 0, 1 and 2 extra hops of the one-node NVLS pipeline fill (model.py _pipeline), priced cold each time."""
    from collectives.topology.library import pricer
    from collectives.topology.library import tables as T

    kept, out = T.NVLS_ONE_NODE_FILL_HOPS, {}
    rows = [r for r in records if r["nodes"] == 1 and r.get("size_bytes") and 64 << 10 <= r["size_bytes"] < 64 << 20]
    try:
        for hops in (0, 1, 2):
            T.NVLS_ONE_NODE_FILL_HOPS = hops
            pricer._CANDS.clear()
            out[hops] = float(np.median([abs(c.error) for c in compare_all(rows, LibraryCalibration(), "library")]))
    finally:
        T.NVLS_ONE_NODE_FILL_HOPS = kept
        pricer._CANDS.clear()
    return out


def table(rows, key) -> list[str]:
    groups = defaultdict(list)
    for c in rows:
        groups[key(c)].append(abs(c.error))
    return [f"| {' | '.join(map(str, k))} | {len(v)} | {100 * np.median(v):.1f}% |" for k, v in sorted(groups.items())]


def main() -> None:
    print(f"fit on every record: {fit(RECORDS)}\n")
    efa = [r for r in RECORDS if r["nodes"] > 1 and "EFA" in r["interconnect"] and r.get("size_bytes")]
    k, t, median = window_fit([r for r in efa if r["size_bytes"] < 64 << 20], fit(RECORDS))
    lat = t.network_latency_s["efa_sendrecv"] * 1e6
    print(f"network step window: {k} one-way latencies, efa_sendrecv {lat:.0f} us; EFA < 64 MiB {100 * median:.1f}%\n")
    grid = ", ".join(f"{h}: {100 * e:.1f}%" for h, e in nvls_fill_hops_grid(RECORDS).items())
    print(f"one-node NVLS fill, extra hops -> one-node 64 KiB-64 MiB median: {grid}\n")
    rows = compare_all(RECORDS, LibraryCalibration(), "library")
    print("| GPU | nodes | size band | records | median abs busbw error |\n|---|---|---|---|---|")
    print("\n".join(table(rows, lambda c: (c.record["gpu"].split()[0], c.record["nodes"], band(c.size_bytes)))))
    print("\n| band | records | median abs busbw error |\n|---|---|---|")
    print("\n".join(table(rows, lambda c: (band(c.size_bytes),))))
    print("\n| span | band | records | median abs busbw error |\n|---|---|---|---|")
    print("\n".join(table(rows, lambda c: (span(c.record["nodes"]), band(c.size_bytes)))))
    print("\n| left-out source | band | records | median abs busbw error |\n|---|---|---|---|")
    for src in sorted({source(r) for r in RECORDS}):
        cal = fit([r for r in RECORDS if source(r) != src])
        held = compare_all([r for r in RECORDS if source(r) == src], cal, "library")
        print("\n".join(table(held, lambda c, s=src: (s, band(c.size_bytes)))))
    held = heldout_rows()
    print("\n| held-out system | band | rows | median abs busbw error |\n|---|---|---|---|")
    print("\n".join(table(held, lambda r: (r.category, r.band))))
    print("\n| held-out band | rows | median abs busbw error |\n|---|---|---|")
    print("\n".join(table(held, lambda r: (r.band,))))
    clean = [r for r in held if "noisy" not in r.entry.get("notes", "")]
    print("\n| held-out span (no noisy demo) | band | rows | median abs busbw error |\n|---|---|---|---|")
    print("\n".join(table(clean, lambda r: (span(r.entry["nodes"]), r.band))))


if __name__ == "__main__":
    main()
