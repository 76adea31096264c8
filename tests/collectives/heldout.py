"""The held-out nccl-tests logs of tests/reference/nccl_heldout/ (README there: provenance), priced blind.

Each log is parsed by our nccl-tests parser; each row's measured bus bandwidth is nccl-tests' own (size /
mean of the out-of-place and in-place times x the op's factor, ``Run.busbw_GBps``); the prediction is the
library pricer on the manifest's preset with the default constants, NCCL_ALGO as the log states it. Nothing
here is fitted: these logs were not used to choose any constant.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, replace
from pathlib import Path

from collectives.topology.cluster import Cluster
from collectives.topology.fit import placement_for
from collectives.topology.library import LibraryCalibration
from collectives.topology.nccl_tests import parse
from collectives.topology.presets import PRESETS
from collectives.topology.reference import with_run_version
from collectives.topology.select import price_call

from .nccl_logs import factor, write_run

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
        """GPU, nodes x GPUs per node, network, e.g. 'B200 2 x 8 efa'."""
        e = self.entry
        return f"{e['gpu']} {e['nodes']} x {e['gpus_per_node']} {e['network']}"


def manifest() -> list[dict]:
    return json.loads((HELDOUT / "manifest.json").read_text())


def cluster_of(entry: dict) -> Cluster:
    """The manifest's preset at its node count, with the network kind the log's system has and the NCCL
    version its log prints (the newest where it prints none)."""
    spec = PRESETS[entry["preset"]](entry["nodes"])
    if "network_kind" in entry:
        spec = replace(spec, network=replace(spec.network, kind=entry["network_kind"]))
    return Cluster(with_run_version(spec, entry.get("nccl_version")))


# mpirun --tag-output prefixes every write of a rank with "[job,rank]<stdout>:"; nccl-tests prints a row in
# three writes (size columns, out-of-place, in-place: src/common.cu at v2.13.9, lines 602 and 555-557), so in
# a tagged log the tag also sits inside the row. The parser reads a tag at the start of a line only.
MPIRUN_TAG = re.compile(r"\[\d+,\d+\]<std(?:out|err)>:")


def log_text(entry: dict) -> str:
    """The text of a manifest entry's log as the parser reads it: the stored file, with mpirun's tags taken
    out of the middle of lines where the entry says its author ran ``mpirun --tag-output``."""
    text = (HELDOUT / entry["file"]).read_text()
    return MPIRUN_TAG.sub("", text) if entry.get("mpirun_tag_output") else text


def rows(calibration: LibraryCalibration | None = None) -> list[HeldOutRow]:
    out = []
    for entry in manifest():
        (run,) = parse(log_text(entry), op=entry["op"], ranks=entry["ranks"])
        cluster = cluster_of(entry)
        placement = placement_for(run.ranks, cluster.spec)
        for row in run.rows:
            price = price_call(
                run.op, row.size_bytes, placement, cluster, calibration=calibration, pricing="library",
                nccl_algo=entry["nccl_algo"],
            )  # fmt: skip
            out.append(HeldOutRow(entry, row.size_bytes, run.busbw_GBps(row), price.busbw_GBps, price.nccl_algorithm))
    return out


# Azure's result tables label sizes 1K, 65K, 132K ... 8G: powers of two with the digits rounded (as in the
# reference set, tests/reference/README.md); the unit letter gives the power of 1024.
_LABEL = re.compile(r"^\|\s*(\d+)([KMG])\s*\|\s*([\d.]+)\s*\|")
_UNIT = {"K": 10, "M": 20, "G": 30}


def table_rows(markdown: str, op: str, ranks: int) -> list[dict]:
    """The rows of a published busbw table: size (the power of two its label rounds), busbw as printed, time
    and algbw derived from it (nccl-tests' own relation, busbw = algbw x factor)."""
    rows = []
    for line in markdown.splitlines():
        if m := _LABEL.match(line.strip()):
            number, unit, busbw = int(m.group(1)), m.group(2), float(m.group(3))
            size = 1 << round(math.log2(number) + _UNIT[unit])
            algbw = busbw / factor(op, ranks)
            rows.append({"size_bytes": size, "time_us": size / (algbw * 1e3), "algbw_GBps": algbw, "busbw_GBps": busbw})
    return rows


def log_from_table(entry: dict) -> str:
    """The nccl-tests log a manifest entry's published table stands for (``entry['table']``)."""
    rows = table_rows((HELDOUT / entry["table"]).read_text(), entry["op"], entry["ranks"])
    return write_run(entry["op"], entry["nodes"], entry["ranks"], entry["gpu"], rows, entry["nccl_version"], False)
