"""POST /v1/calibrate: nccl-tests logs in, fitted constants and a cluster for /v1/plan out."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from .cluster import ClusterIn, Strict

# Bounds: one nccl-tests run of 8 B..16 GiB is ~32 rows and ~5 kB (more with NCCL_DEBUG=INFO), so 1,000 rows
# is every op at several node counts; a fit searches at most 64 rows per stage and prices all rows 3-4 times.
MAX_LOGS = 64
MAX_LOG_CHARS = 2_000_000
MAX_ROWS = 1_000


class LogIn(Strict):
    free_text = frozenset({"text"})  # the log itself: lines, and whatever nccl-tests printed
    text: str = Field(max_length=MAX_LOG_CHARS, description="nccl-tests output as it printed (stdout of rank 0)")
    nodes: int | None = Field(
        default=None, ge=1, le=1 << 17, description="nodes the run used; default: the hosts named by its rank lines"
    )
    ranks: int | None = Field(default=None, ge=1, le=1 << 20, description="default: from the log's rank lines")
    op: str | None = Field(
        default=None, max_length=32, description="e.g. allreduce or all_reduce_perf; default: the binary the log names"
    )
    algorithm: str | None = Field(
        default=None,
        max_length=32,
        description="pin the algorithm priced (default: NCCL_ALGO if the log shows it, else auto)",
    )
    name: str | None = Field(default=None, max_length=200)


class CalibrateRequest(Strict):
    cluster: ClusterIn
    logs: list[LogIn] = Field(min_length=1, max_length=MAX_LOGS)
    network_kind: Literal["ib", "roce", "efa", "efa_sendrecv", "tcpx", "tcpxo"] | None = Field(
        default=None, description="the cluster's network kind (default: the cluster's own network.kind)"
    )


class RowOut(BaseModel):
    op: str
    size_bytes: int
    nodes: int
    ranks: int
    measured_busbw_GBps: float = Field(description="size / time x nccl-tests' busbw factor, from the printed time")
    before_GBps: float = Field(description="bus bandwidth priced with the default constants")
    after_GBps: float = Field(description="bus bandwidth priced with the fitted constants")
    fitted: bool = Field(description="priced by NCCL's model, which the constants calibrate (alltoall, sendrecv: no)")
    log: int = Field(description="index into logs")
    line: int = Field(description="line of the row in its log")


class RunOut(BaseModel):
    log: int
    op: str
    ranks: int
    nodes: int
    rows: int
    nccl_version: str | None = Field(description="as the log says")
    priced_as_nccl: str = Field(
        description="the NCCL tuning model priced with: the log's when modelled, else the cluster's"
    )
    nccl_algo: str | None
    devices: list[str]
    gpus_per_process: int = Field(default=1, description="nccl-tests -g N: GPUs one process drove (nGpus)")


class CalibrateOut(BaseModel):
    cluster: dict = Field(description="the request's cluster with the fitted `calibration`: post it to /v1/plan")
    constants: dict = Field(description="fitted constants by group; absent names keep the defaults")
    rows: list[RowOut]
    median_error_before: float = Field(description="median |before / measured - 1| over all rows")
    median_error_after: float = Field(description="median |after / measured - 1| over all rows")
    stages: list[dict] = Field(description="each fitting stage: parameters, rows, median errors, kept or not")
    runs: list[RunOut]
    warnings: list[str] = Field(
        description="what makes the fit doubtful: a log run on another GPU than the cluster's, a constant fitted "
        "to an end of its range"
    )
