"""POST /v1/calibrate: nccl-tests logs in, fitted constants and a cluster for /v1/plan out; or a torch.profiler
trace in, the compute constants fitted for its GPU and its collectives against a plan's ledger out."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, model_validator

from collectives.topology.spec import NETWORK_KINDS

from .cluster import ClusterIn, Strict
from .plan import ModelIn, ParallelIn, WorkloadIn

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


# A trace: the HTTP body limit (COMMPLAN_MAX_BODY_BYTES, 8 MiB) bounds what comes as JSON; a gzipped trace sent as
# base64 text ("H4sI...") may unpack to MAX_TRACE_BYTES; planner/profile_trace.py MAX_EVENTS bounds the events.
MAX_TRACE_BYTES = 256 << 20


class CompareIn(Strict):
    """The configuration the trace ran: its plan's ledger is compared with the trace's collectives (the cluster is
    the request's)."""

    model: ModelIn
    workload: WorkloadIn = Field(default_factory=WorkloadIn)
    parallel: ParallelIn = Field(default_factory=ParallelIn)


class CalibrateRequest(Strict):
    free_text = frozenset({"trace"})  # a trace's kernel names and arguments are the profiler's, not names of ours
    cluster: ClusterIn
    logs: list[LogIn] = Field(default_factory=list, max_length=MAX_LOGS, description="nccl-tests logs (or a trace)")
    network_kind: Literal[NETWORK_KINDS] | None = Field(
        default=None, description="the cluster's network kind (default: the cluster's own network.kind)"
    )
    trace: dict | list | str | None = Field(
        default=None,
        description="a torch.profiler Chrome trace (export_chrome_trace): the JSON itself, its text, or the "
        f".json.gz file as base64 text (unpacked at most {MAX_TRACE_BYTES >> 20} MiB)",
    )
    trace_steps: int | None = Field(
        default=None, ge=1, le=100_000, description="steps the trace holds (default: its ProfilerStep#N annotations)"
    )
    compare: CompareIn | None = Field(
        default=None, description="the trace's configuration: its plan's ledger against the trace's collectives"
    )

    @model_validator(mode="after")
    def _logs_or_trace(self):
        if not self.logs and self.trace is None:
            raise ValueError("give nccl-tests logs (logs: at least 1) or a profiler trace (trace), or both")
        if self.compare is not None and self.trace is None:
            raise ValueError("compare needs a trace: it compares the trace's collectives with the plan's ledger")
        return self


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


class KernelClassOut(BaseModel):
    kind: str = Field(
        description="gemm, attention, conv (cuDNN/MIOpen convolutions, not modelled), memory, copy (memcpy/memset), "
        "nccl or other (planner/profile_trace.py "
        "KERNEL_CLASSES, OP_CLASSES)"
    )
    count: int
    per_step: float
    seconds_per_step: float
    share: float = Field(description="of the trace's kernel time")


class UnclassifiedOut(BaseModel):
    name: str = Field(description="a kernel's name that no class matches (the first 300 characters)")
    count: int
    seconds_per_step: float


class KernelRowOut(BaseModel):
    kind: str = Field(
        description="gemm, grouped_gemm (torch._grouped_mm), attention, memory (contiguous) or memory_strided "
        "(PyTorch's unvectorised elementwise_kernel: shown, not fitted)"
    )
    op: str = Field(description="the aten operator that launched the kernel(s)")
    shape: list[int] = Field(
        description="gemm: M, N, K, groups (grouped: the mean rows per group); attention: batch, query heads, "
        "query length, key length, head dim; memory: HBM bytes"
    )
    dtype: str
    count: int
    measured_s: float = Field(description="median over the trace's launches (a GEMM: every kernel its op launched)")
    before_s: float = Field(
        description="planner/kernels.py with the cluster's constants (the defaults unless cluster.calibration.kernels)"
    )
    after_s: float = Field(description="with the constants fitted on this trace")


class CollectiveRowOut(BaseModel):
    op: str
    message_bytes: int | None = Field(description="nccl-tests convention; null where the trace records no sizes")
    group_size: int | None = Field(
        default=None, description="Kineto's recorded Group size (torch >= 2.1), when the row's kernels agree on one"
    )
    trace_calls_per_step: float
    trace_s_per_call: float | None
    trace_busbw_GBps: float | None = Field(
        default=None,
        description="nccl-tests' bus bandwidth of the traced calls (message bytes / seconds per call x busbw factor), "
        "where the size and group are recorded; a lower bound: a kernel's time includes its wait for its peers",
    )
    plan_calls_per_iteration: int = Field(description="the plan's ledger on the traced rank's stage (0: no plan)")
    plan_s_per_call: float | None
    plan_calls: list[str] = Field(description="the ledger rows' names")


class HostOut(BaseModel):
    """The host's time per kernel launch read off the trace (planner/trace_fit.py host_launch)."""

    launches: int = Field(description="kernel launch calls (cudaLaunchKernel, cuLaunchKernelEx...) with their kernel")
    host_bound: int = Field(description="of them, kernels that started within lag_s of their call's return")
    gaps: int = Field(
        description="the gaps read: consecutive host-bound launches of one thread, no synchronising call or copy "
        "between"
    )
    host_launch_s: float | None = Field(
        description="their median, returned as constants.host_launch_s; null with too few gaps (a GPU-bound trace)"
    )
    quartiles_s: list[float] | None = Field(description="the gaps' 25th and 75th percentiles")
    mean_s: float | None = Field(description="the gaps' mean")
    lag_s: float = Field(description="a kernel that starts this soon after its call returns found the GPU idle")


class TraceOut(BaseModel):
    device: str = Field(description="deviceProperties[0].name")
    sms: int
    steps: int
    steps_from: str = Field(
        description="ProfilerStep (its annotations), repeats (the kernel sequence repeats that often), request "
        "(trace_steps) or none (one step assumed)"
    )
    rank: int | None
    world_size: int | None
    events: int
    record_shapes: bool
    kernels: list[KernelClassOut]
    constants: dict = Field(
        description="fitted compute constants (planner/kernels.py KERNEL_CONSTANTS names: clock, gemm_ceiling by "
        "dtype, gemm_fixed_s, attention_ceiling by kernel_pass, hbm, kernel_s, host_launch_s)"
    )
    rows: list[KernelRowOut]
    median_error_before: dict[str, float] = Field(description="by kernel group: median |before / measured - 1|")
    median_error_after: dict[str, float]
    stage: int | None = Field(description="the plan's stage the trace's rank is on (with compare)")
    collectives: list[CollectiveRowOut]
    unclassified: list[UnclassifiedOut] = Field(description="kernels of no class, the most time first (at most 20)")
    host: HostOut = Field(description="the host's time per launch where the GPU waited for it")
    warnings: list[str]


class CalibrateOut(BaseModel):
    cluster: dict = Field(description="the request's cluster with the fitted `calibration`: post it to /v1/plan")
    constants: dict = Field(description="fitted constants by group; absent names keep the defaults")
    rows: list[RowOut]
    median_error_before: float | None = Field(
        description="median |before / measured - 1| over all rows (no logs: null)"
    )
    median_error_after: float | None = Field(description="median |after / measured - 1| over all rows (no logs: null)")
    stages: list[dict] = Field(description="each fitting stage: parameters, rows, median errors, kept or not")
    runs: list[RunOut]
    warnings: list[str] = Field(
        description="what makes the fit doubtful: a log run on another GPU than the cluster's, a constant fitted "
        "to an end of its range"
    )
    trace: TraceOut | None = Field(default=None, description="the profiler trace's calibration (with trace)")
