"""The calibration procedure: a user's nccl-tests logs on a cluster -> observations -> the fit (fit.py) ->
rows before and after, the runs read and warnings. POST /v1/calibrate and ``commplan calibrate`` both call
:func:`calibrate`; errors name the request's fields (``logs.2.nodes``, ``calibration``) as CollectiveError.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

from .._errors import CollectiveError
from .fit import BOUNDS, Constants, FitResult, Observation, fit, placement_for
from .library import normalise_algo
from .nccl_tests import Run, parse
from .spec import NCCL_VERSIONS, ClusterSpec, nccl_minor, validate_cluster


@dataclass(frozen=True)
class Log:
    """One nccl-tests output as printed, with what the caller knows better than the log."""

    text: str
    nodes: int | None = None  # default: the hosts its rank lines name
    ranks: int | None = None
    op: str | None = None
    algorithm: str | None = None  # pins.py syntax; default: NCCL_ALGO if the log shows it, else auto


@dataclass(frozen=True)
class RunRead:
    """One run found in a log, and how it is priced."""

    log: int
    op: str
    ranks: int
    nodes: int
    rows: int
    nccl_version: str
    priced_as_nccl: str
    nccl_algo: str
    devices: tuple[str, ...]
    gpus_per_process: int = 1  # nccl-tests -g N


@dataclass
class Calibrated:
    result: FitResult
    sources: list[tuple[int, int]]  # (log, line) of each of result.rows
    runs: list[RunRead] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def constants(self) -> dict[str, dict[str, float]]:
        """The fitted constants by group, groups without any left out."""
        return {group: values for group, values in self.result.constants.to_dict().items() if values}


def calibrate(
    base: ClusterSpec, logs: Sequence[Log], start: dict | None = None, *, max_rows: int, max_devices: int
) -> Calibrated:
    """Fit the cluster ``base``'s constants, from ``start`` (fit.py names), to every table row of ``logs``
    (at most ``max_rows`` in all; each run on at most ``max_devices`` devices)."""
    observations: list[Observation] = []
    where: list[tuple[int, int]] = []
    runs: list[RunRead] = []
    total = 0
    for i, log in enumerate(logs):
        with _under(f"logs.{i}."):
            parsed = parse(log.text, log.op, log.ranks, "text", max_rows)
        total += sum(len(r.rows) for r in parsed)
        if total > max_rows:
            raise CollectiveError(
                f"logs.{i}.text", f"logs 0..{i} hold {total} table rows; at most {max_rows} in all (the limit)"
            )
        for r in parsed:
            spec, nccl_algo = _run_cluster(base, i, log, r, max_devices)
            runs.append(
                RunRead(
                    i,
                    r.op.value,
                    r.ranks,
                    spec.num_nodes,
                    len(r.rows),
                    r.nccl_version,
                    spec.nccl_version,
                    r.nccl_algo,
                    tuple(r.devices),
                    r.gpus_per_process,
                )
            )
            for row in r.rows:
                if row.size_bytes:
                    where_from = f"logs[{i}] line {row.line}"
                    busbw = r.busbw_GBps(row)
                    observations.append(Observation(r.op, row.size_bytes, r.ranks, spec, busbw, nccl_algo, where_from))
                    where.append((i, row.line))
    with _as("calibration"):
        constants = Constants.from_dict(start or {})
    with _as("logs"):
        result = fit(observations, constants)
    index = {id(o): w for o, w in zip(observations, where, strict=True)}  # fit drops rows without bandwidth
    done = Calibrated(result, [index[id(r.observation)] for r in result.rows], runs)
    done.warnings = [*_other_gpu(runs, base.gpu), *_one_process(runs), *_at_bounds(done.constants)]
    return done


def _run_cluster(base: ClusterSpec, i: int, log: Log, r: Run, max_devices: int) -> tuple[ClusterSpec, str]:
    """The cluster one run ran on (the request's, at the run's node count and NCCL), checked, and the NCCL
    algorithm it is priced with."""
    prefix = f"logs.{i}."
    if r.ranks < 2:
        raise CollectiveError(
            f"{prefix}text",
            f"line {r.first_line}: a run of 1 rank moves no data (a binary built without MPI=1 runs every "
            "process alone, each printing its own 1-rank table); give ranks if the log is complete",
        )
    nodes = log.nodes or len(r.hosts)
    if not nodes:
        raise CollectiveError(f"{prefix}nodes", f"line {r.first_line}: the log names no hosts; give nodes")
    if len(r.hosts) > nodes:
        raise CollectiveError(f"{prefix}nodes", f"{nodes} given but the rank lines name {len(r.hosts)} hosts")
    spec = replace(base, num_nodes=nodes)  # the log's node count on the request's cluster
    if r.nccl_version and nccl_minor(r.nccl_version) in NCCL_VERSIONS:  # the run's own NCCL's model
        spec = replace(spec, nccl_version=nccl_minor(r.nccl_version))
    devices = nodes * spec.devices_per_node
    if devices > max_devices:
        raise CollectiveError(
            f"{prefix}nodes",
            f"{nodes} nodes x {spec.devices_per_node} = {devices} devices; this service prices at most {max_devices}",
        )
    with _as(f"{prefix}nodes"):  # a torus sized for other counts
        validate_cluster(spec)
    with _under(prefix):
        placement_for(r.ranks, spec)
    nccl_algo = log.algorithm or r.nccl_algo or "auto"
    with _as(f"{prefix}algorithm"):
        normalise_algo(nccl_algo)
    return spec, nccl_algo


@contextmanager
def _as(name: str) -> Iterator[None]:
    """Inside, a CollectiveError names ``name`` instead (the whole input is at fault)."""
    try:
        yield
    except CollectiveError as err:
        raise CollectiveError(name, err.rule) from None


@contextmanager
def _under(prefix: str) -> Iterator[None]:
    """Inside, a CollectiveError's field sits under ``prefix`` (``logs.2.`` + ``text``)."""
    try:
        yield
    except CollectiveError as err:
        raise CollectiveError(prefix + err.field, err.rule) from None


def _gpu_models(name: str) -> set[str]:
    """The model names in a GPU's name: 'A100 SXM4 80GB' -> {A100}; 'NVIDIA GB200' -> {GB200}; form factors
    (SXM4, PCIe, NVL72), memory (80GB, HBM3) name no model."""
    words = re.split(r"[\s_-]+", name.upper())
    return {
        w
        for w in words
        if re.fullmatch(r"[A-Z]+\d+[A-Z]?", w)
        and not w.endswith("GB")
        and not w.startswith(("SXM", "PCIE", "NVL", "HBM"))
    }


def _other_gpu(runs: list[RunRead], gpu) -> list[str]:
    """A log run on another GPU than the cluster's: its constants would price the cluster wrongly, silently
    (an A100 log on dgx-h100 drove efficiency.nic to its floor)."""
    models = _gpu_models(gpu.name) if gpu is not None else set()
    if not models:
        return []  # a GPU whose name says no model: nothing to compare
    warned = {}
    for run in runs:
        others = [d for d in run.devices if not models & _gpu_models(d)]
        if others and run.log not in warned:
            warned[run.log] = (
                f"logs.{run.log}: ran on {', '.join(others)}, but the cluster's GPU is {gpu.name}: constants "
                "fitted on one GPU price another wrongly; calibrate the cluster the log ran on"
            )
    return list(warned.values())


def _one_process(runs: list[RunRead]) -> list[str]:
    """A run with -g N > 1: one process (thread) launches every GPU's call in turn inside one NCCL group
    (nccl-tests a0b82b2 src/common.cu startColl: ``if (args->nGpus > 1) ncclGroupStart()``). That adds a
    floor to small messages that a training job, one process per GPU, does not have (issue 23: ~35 us on
    8 x H100 with -g 8), and the latency constants fitted on it price the job's small calls too slow."""
    return [
        f"logs.{run.log}: {run.op} on {run.ranks} ranks ran with -g {run.gpus_per_process} (one process drives "
        f"{run.gpus_per_process} GPUs); training runs one process per GPU, so its small-message rows carry a "
        "launch floor the job does not have and the latency constants fitted on them price small calls too slow"
        for run in runs
        if run.gpus_per_process > 1
    ]


def _at_bounds(constants: dict) -> list[str]:
    """A fitted constant at an end of its range (fit.py BOUNDS): the logs ask for more than the constant can
    give, so the cluster is likely not the one they ran on (GPU, NICs, network kind, nodes). A plugin latency
    of zero is InfiniBand's own value, not a bound hit."""
    out = []
    for group, values in constants.items():
        low, high = BOUNDS[group]
        for name, value in values.items():
            if value >= high * (1 - 1e-9) or (low > 0 and value <= low * (1 + 1e-9)):
                out.append(
                    f"cluster.calibration.{group}.{name} = {value:g} sits at the end of its range [{low:g}, {high:g}]: "
                    "the logs do not fit this cluster; check its GPU, NICs, network kind and the node count"
                )
    return out
