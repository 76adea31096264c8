"""Error tables of the library pricer on tests/reference/nccl/measurements.json (docs/pricing.md):
per category (GPU generation x nodes x size band) and leave-one-source-out (the global scalars refitted
without a source, then that source predicted). Run: PYTHONPATH=. python bench/library_table.py"""

import json
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import numpy as np

from collectives.topology.library import LibraryCalibration
from collectives.topology.reference import compare_all

RECORDS = json.loads((Path(__file__).parents[1] / "tests/reference/nccl/measurements.json").read_text())


def band(size: int) -> str:
    return ">= 64 MiB" if size >= 64 << 20 else "64 KiB-64 MiB" if size >= 64 << 10 else "< 64 KiB"


def source(r: dict) -> str:
    return r["source"].split(":")[0].split(" ")[0]


def fit(records) -> LibraryCalibration:
    """The handful of scalars: efficiency per link kind (median measured/modelled on >= 64 MiB rows, from
    NCCL's raw model) and one latency scale (grid, median |error| on 64 KiB-64 MiB rows)."""
    raw = LibraryCalibration(efficiency={}, latency_scale={})
    eff = defaultdict(list)
    for c in compare_all(records, raw, "library"):
        if c.size_bytes >= 64 << 20 and c.record["op"] != "sendrecv":
            kind = "nic" if c.record["nodes"] > 1 else "in_network" if c.algorithm == "in_network" else "nvlink"
            eff[kind].append(c.measured_busbw / c.predicted_busbw)
    cal = replace(raw, efficiency={k: float(np.median(v)) for k, v in eff.items()})
    best = None
    for s in np.arange(1.0, 4.01, 0.25):
        trial = replace(cal, latency_scale={"intra_node": s, "inter_node": s})
        err = [abs(c.error) for c in compare_all(records, trial, "library") if band(c.size_bytes) == "64 KiB-64 MiB"]
        score = float(np.median(err)) if err else 0.0
        if best is None or score < best[0]:
            best = (score, trial)
    return best[1]


def table(rows, key) -> list[str]:
    groups = defaultdict(list)
    for c in rows:
        groups[key(c)].append(abs(c.error))
    return [f"| {' | '.join(map(str, k))} | {len(v)} | {100 * np.median(v):.1f}% |" for k, v in sorted(groups.items())]


def main() -> None:
    rows = compare_all(RECORDS, LibraryCalibration(), "library")
    print("| GPU | nodes | size band | records | median abs busbw error |\n|---|---|---|---|---|")
    print("\n".join(table(rows, lambda c: (c.record["gpu"].split()[0], c.record["nodes"], band(c.size_bytes)))))
    print("\n| band | records | median abs busbw error |\n|---|---|---|")
    print("\n".join(table(rows, lambda c: (band(c.size_bytes),))))
    print("\n| left-out source | band | records | median abs busbw error |\n|---|---|---|---|")
    for src in sorted({source(r) for r in RECORDS}):
        cal = fit([r for r in RECORDS if source(r) != src])
        held = compare_all([r for r in RECORDS if source(r) == src], cal, "library")
        print("\n".join(table(held, lambda c, s=src: (s, band(c.size_bytes)))))


if __name__ == "__main__":
    main()
