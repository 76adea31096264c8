"""The held-out nccl-tests logs of tests/reference/nccl_heldout/ (README there: provenance), priced blind.

Each log is parsed by our nccl-tests parser; each row's measured bus bandwidth is nccl-tests' own (size /
mean of the out-of-place and in-place times x the op's factor, ``Run.busbw_GBps``); the prediction is the
library pricer on the manifest's preset with the default constants, NCCL_ALGO as the log states it. Nothing
here is fitted: these logs were not used to choose any constant.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from collectives.topology.cluster import Cluster
from collectives.topology.fit import placement_for
from collectives.topology.library import LibraryCalibration
from collectives.topology.nccl_tests import parse
from collectives.topology.presets import PRESETS
from collectives.topology.select import price_call

HELDOUT = Path(__file__).parents[1] / "reference" / "nccl_heldout"
BANDS = ((64 << 20, ">= 64 MiB"), (64 << 10, "64 KiB-64 MiB"), (0, "< 64 KiB"))


def band(size: int) -> str:
    return next(name for floor, name in BANDS if size >= floor)


@dataclass(frozen=True)
class HeldOutRow:
    entry: dict  # the manifest entry of the log
    size_bytes: int
    measured_busbw_GBps: float
    predicted_busbw_GBps: float
    nccl_algorithm: str  # what the pricer ran (NCCL's name)

    @property
    def error(self) -> float:
        return self.predicted_busbw_GBps / self.measured_busbw_GBps - 1

    @property
    def band(self) -> str:
        return band(self.size_bytes)

    @property
    def category(self) -> str:
        """GPU x nodes x network, e.g. 'B200 2 nodes efa'."""
        e = self.entry
        return f"{e['gpu']} {e['nodes']} node{'s' if e['nodes'] > 1 else ''} {e['network']}"


def manifest() -> list[dict]:
    return json.loads((HELDOUT / "manifest.json").read_text())


def cluster_of(entry: dict) -> Cluster:
    """The manifest's preset at its node count, with the network kind the log's system has."""
    spec = PRESETS[entry["preset"]](entry["nodes"])
    if "network_kind" in entry:
        spec = replace(spec, network=replace(spec.network, kind=entry["network_kind"]))
    return Cluster(spec)


def rows(calibration: LibraryCalibration | None = None) -> list[HeldOutRow]:
    out = []
    for entry in manifest():
        text = (HELDOUT / entry["file"]).read_text()
        (run,) = parse(text, op=entry["op"], ranks=entry["ranks"])
        cluster = cluster_of(entry)
        placement = placement_for(run.ranks, cluster.spec)
        for row in run.rows:
            price = price_call(
                run.op, row.size_bytes, placement, cluster, calibration=calibration, pricing="library",
                nccl_algo=entry["nccl_algo"],
            )  # fmt: skip
            out.append(HeldOutRow(entry, row.size_bytes, run.busbw_GBps(row), price.busbw_GBps, price.nccl_algorithm))
    return out
