"""Price every record of tests/reference/nccl/measurements.json with the default calibration."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..primitives import Op
from .calibration import DEFAULT, cluster_for_record
from .cluster import Cluster
from .select import price_call
from .spec import NCCL_VERSIONS, nccl_minor

# nccl-tests records without a size are statements about "large sizes"; they are priced at 4 GiB.
LARGE = 1 << 32


@dataclass
class Comparison:
    record: dict
    size_bytes: int
    measured_busbw: float
    predicted_busbw: float
    predicted_time_s: float
    algorithm: str

    @property
    def error(self) -> float:
        return (self.predicted_busbw - self.measured_busbw) / self.measured_busbw


def compare(record: dict, calibration=DEFAULT, pricing: str = "schedule") -> Comparison:
    size = record["size_bytes"] or LARGE
    n = record["gpus"]
    op = Op(record["op"])
    cluster = Cluster(with_run_version(cluster_for_record(record), record.get("nccl_version")))
    # sendrecv_perf: every GPU sends to the next and receives from the previous, all at once
    ring_pairs = np.stack([np.arange(n), (np.arange(n) + 1) % n], axis=1)
    placement = ring_pairs if op is Op.SENDRECV else np.arange(n)[None, :]
    if op is Op.ALLTOALL:
        size -= size % n
    algo = stated_algorithm(record)
    if pricing == "library":
        p = price_call(
            op,
            size,
            placement,
            cluster,
            calibration=calibration,
            pricing="auto",
            nccl_algo="ring" if algo == "ring" else "auto",
        )
    else:
        p = price_call(op, size, placement, cluster, algo, calibration=calibration)
    return Comparison(record, size, record["busbw_GBps"], p.busbw_GBps, p.time_s, p.algorithm)


def with_run_version(spec, version: str | None):
    """The spec priced with the NCCL its run used (tables.VERSIONS), where the run states one we transcribed;
    else with the spec's own (the newest)."""
    if version and nccl_minor(version) in NCCL_VERSIONS:
        return replace(spec, nccl_version=nccl_minor(version))
    return spec


def stated_algorithm(record: dict) -> str:
    """A record measured with the algorithm forced (NCCL_ALGO=RING) is priced with that algorithm;
    every other record with the selector, as NCCL chose for itself."""
    return "ring" if "NCCL_ALGO=RING" in (record.get("algo") or "") else "auto"


def compare_all(records: list[dict], calibration=DEFAULT, pricing: str = "schedule") -> list[Comparison]:
    return [compare(r, calibration, pricing) for r in records if r.get("busbw_GBps")]
