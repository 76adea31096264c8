"""Print the calibration error table of the README: every NCCL record priced with the default constants.

Run: .venv/bin/python bench/calibration_table.py [path/to/measurements.json]
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

from collectives.topology.reference import compare_all

DEFAULT_PATH = Path(__file__).resolve().parents[1] / "tests" / "reference" / "nccl" / "measurements.json"


def main(path: Path = DEFAULT_PATH) -> None:
    rows = compare_all(json.loads(Path(path).read_text()))
    groups = defaultdict(list)
    for c in rows:
        r = c.record
        groups[(r["gpu"], r["nodes"], r["gpus"], r["op"], r["interconnect"][:48])].append(c)
    print("| system | op | records | sizes | algorithms chosen | median abs error | worst |")
    print("|---|---|---|---|---|---|---|")
    for (gpu, nodes, gpus, op, net), cs in groups.items():
        errors = [abs(c.error) * 100 for c in cs]
        sizes = f"{_size(min(c.size_bytes for c in cs))}–{_size(max(c.size_bytes for c in cs))}"
        algos = ", ".join(sorted({c.algorithm for c in cs}))
        print(
            f"| {gpu}, {nodes} node(s) x {gpus // nodes} ({net}) | {op} | {len(cs)} | {sizes} | {algos} | "
            f"{np.median(errors):.1f}% | {max(errors):.1f}% |"
        )
    small = [abs(c.error) * 100 for c in rows if c.size_bytes <= 64 << 10]
    large = [abs(c.error) * 100 for c in rows if c.size_bytes >= 64 << 20]
    print(f"\nmessages <= 64 KiB: {len(small)} records, median abs error {np.median(small):.1f}% (bound 30%)")
    print(f"messages >= 64 MiB: {len(large)} records, median abs error {np.median(large):.1f}% (bound 10%)")


def _size(b: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= scale:
            return f"{b / scale:g} {unit}"
    return f"{b} B"


if __name__ == "__main__":
    main(*(Path(a) for a in sys.argv[1:]))
