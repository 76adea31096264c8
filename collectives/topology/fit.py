"""Fit a handful of global constants to a user's own nccl-tests measurements, and report every row
before and after.

The constants (never one per row; DESIGN.md §7) are the library pricer's (library/calibration.py
``LibraryCalibration``, NCCL's tuning model times our constants), by the same names:

- ``efficiency.<kind>``: achieved / NCCL-modelled bus bandwidth of the resource that bounds the algorithm
  (``nvlink``, ``in_network`` for NVLS, ``pcie``, ``nic`` for anything across nodes: library/model.py
  ``_kind``), fitted on rows of at least 256 MiB (where nccl-tests' bus bandwidth has reached its plateau: the
  busbw curves of nccl-tests doc/PERFORMANCE.md and every large record of tests/reference/nccl flatten by
  256 MiB). Only the kinds that bound some such row are fitted.
- ``latency_scale.<part>``: multiplies a part of NCCL's modelled latency (library/model.py ``_latencies``): the
  NVLink domain's terms (``intra_node``: the base latency and the intra-node hops, of one-node and multi-node
  calls alike) or the network's (``inter_node``), fitted on rows of at most 64 KiB (where NCCL's model is
  latency-bound: tuning.cc picks LL there, whose bandwidth term is small); a multi-node row fits the
  network's, its NVLink legs keeping the domain's scale of the one-node rows or the defaults.
- ``network_latency_s.<network kind>``: the network plugin's per-hop latency (ib, roce, efa, tcpxo; NCCL's
  graph->latencyInter), fitted on the same small rows of multi-node runs.

Rows NCCL's tuner does not price (alltoall, sendrecv, gather, scatter: the schedule pricer prices them, with
its own global constants) and rows on clusters the library model does not cover are reported, not fitted.

Method: coordinate-wise search, each parameter on a grid inside its bounds (log-spaced; latencies also try
0) and then a golden-section refinement (GRID + 2 + GOLDEN_STEPS evaluations: 0.1% resolution), minimising
the median absolute log error of the stage's rows (at most STAGE_ROWS of them, evenly spread; robust to a
few outliers; log error treats "twice too fast" and "twice too slow" alike) plus a small pull towards the
defaults so that parameters the rows cannot tell apart stay where they were. Deterministic, bounded, two
sweeps when a stage has several parameters. A stage is kept only if the median error over *all* fitted rows
does not rise; rows between 64 KiB and 256 MiB are fitted by nothing and show whether the constants carry
over.

The mapping of these names onto the pricer is ``calibration_for`` / ``apply_constants`` (the one adapter):
a cluster spec carries the fitted constants in ``ClusterSpec.calibration``, which the library pricer reads.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace

import numpy as np

from .._errors import CollectiveError
from ..primitives import Op
from .cluster import Cluster
from .library import DEFAULT_LIBRARY, LibraryCalibration
from .library.calibration import SPANS, latency_keys
from .library.model import NCCL_FUNCS
from .select import price_call, resolve_pricing
from .spec import NETWORK_KINDS, ClusterSpec

GROUPS = ("efficiency", "latency_scale", "network_latency_s")
# bounds of each group: an efficiency is achieved / NCCL-modelled bandwidth (above 1 where NCCL's model is
# pessimistic, as its 2-3x latency tables are the other way); a latency scale within 0.25-6x of NCCL's tables
# (the library defaults are 1.75-2.75 by GPU generation, docs/pricing.md); a plugin latency from none (InfiniBand,
# whose latency NCCL's tables hold) to 100 us (EFA/SRD through aws-ofi-nccl is ~15-25 us, AWS EFA docs)
BOUNDS = {"efficiency": (0.2, 1.5), "latency_scale": (0.25, 6.0), "network_latency_s": (0.0, 100e-6)}
LATENCY_FLOOR_S = 0.1e-6  # the smallest non-zero latency the grid tries
LINK_KINDS = ("nvlink", "in_network", "pcie", "nic")  # library/model.py _kind
BANDWIDTH_MIN_BYTES = 256 << 20
LATENCY_MAX_BYTES = 64 << 10
PULL = 0.002  # weight of |log(value / default)| added to the objective: breaks ties towards the defaults
GRID = 13
GOLDEN_STEPS = 12
SWEEPS = 2
TIEBREAK_WEIGHT = 0.25  # weight of the mid-size rows' median log error in the latency stage's objective
JOINT_GRID = 6  # values per parameter of the coarse joint grid that seeds a second search
JOINT_GRID_MAX_NAMES = 3  # 6^3 = 216 evaluations at most
MIN_GAIN = 0.0  # a stage must lower the median error over all rows by more than this to be kept
STAGE_ROWS = 64  # rows a stage searches on at most (evenly spread over its rows): bounds the fit's cost


@dataclass(frozen=True)
class Constants:
    """Named global scalars (hashable, so a cluster spec can carry them). Absent names keep the pricer's
    defaults. ``name`` is ``group.key``: ``efficiency.nvlink``, ``latency_scale.inter_node``,
    ``network_latency_s.ib``."""

    efficiency: tuple[tuple[str, float], ...] = ()
    latency_scale: tuple[tuple[str, float], ...] = ()
    network_latency_s: tuple[tuple[str, float], ...] = ()

    def get(self, name: str) -> float | None:
        group, key = name.split(".", 1)
        return dict(getattr(self, group)).get(key)

    def with_value(self, name: str, value: float) -> Constants:
        group, key = name.split(".", 1)
        values = dict(getattr(self, group)) | {key: float(value)}
        return replace(self, **{group: tuple(sorted(values.items()))})

    def names(self) -> list[str]:
        return [f"{g}.{k}" for g in GROUPS for k, _ in getattr(self, g)]

    def to_dict(self) -> dict:
        return {g: dict(getattr(self, g)) for g in GROUPS}

    @classmethod
    def from_dict(cls, data: dict | None, field: str = "calibration") -> Constants:
        """Validated: known groups, known spans and network kinds, values inside BOUNDS."""
        out = cls()
        for group, values in (data or {}).items():
            if group not in GROUPS:
                raise CollectiveError(f"{field}.{group}", f"unknown group; known: {', '.join(GROUPS)}")
            for key, value in (values or {}).items():
                name = f"{group}.{key}"
                if group == "efficiency" and key not in LINK_KINDS:
                    raise CollectiveError(f"{field}.{name}", f"unknown link kind; known: {', '.join(LINK_KINDS)}")
                if group == "latency_scale" and key not in latency_keys():
                    raise CollectiveError(
                        f"{field}.{name}",
                        f"unknown span; known: {', '.join(SPANS)}, each optionally :<GPU generation>"
                        f" ({', '.join(latency_keys()[len(SPANS) :])})",
                    )
                if group == "network_latency_s" and key not in NETWORK_KINDS:
                    raise CollectiveError(f"{field}.{name}", f"unknown network kind; known: {', '.join(NETWORK_KINDS)}")
                low, high = BOUNDS[group]
                if isinstance(value, bool) or not (isinstance(value, int | float) and low <= value <= high):
                    raise CollectiveError(f"{field}.{name}", f"must be within [{low:g}, {high:g}], got {value!r}")
                out = out.with_value(name, value)
        return out


# ---------------------------------------------------------------------------------------------------------
# The one adapter: named constants -> what the pricer reads. The library pricer's LibraryCalibration takes
# the same three groups by the same names (library/calibration.py), so a name left out keeps its default.


def calibration_for(constants: Constants, base: LibraryCalibration = DEFAULT_LIBRARY) -> LibraryCalibration:
    return base.with_values(**constants.to_dict())


def apply_constants(constants: Constants, spec: ClusterSpec) -> ClusterSpec:
    """The cluster spec carrying ``constants`` for /v1/plan (the library pricer reads ClusterSpec.calibration)."""
    return replace(spec, calibration=calibration_for(constants) if constants != Constants() else None)


def default_value(name: str, base: LibraryCalibration = DEFAULT_LIBRARY) -> float:
    """The value a parameter has when no constant is given (library/calibration.py: eff() and
    net_latency_us() default to 1 and 0, the pricer's latency scale to 1)."""
    group, key = name.split(".", 1)
    return getattr(base, group).get(key, 0.0 if group == "network_latency_s" else 1.0)


def fitted_by_library(op: Op, cluster: Cluster) -> bool:
    """Whether ``op`` on this cluster is priced by NCCL's model, which the constants calibrate."""
    return op in NCCL_FUNCS and resolve_pricing("auto", cluster, op) == "library"


# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Observation:
    """One measured row: ``ranks`` GPUs spread evenly over ``spec.num_nodes`` nodes ran ``op``."""

    op: Op
    size_bytes: int
    ranks: int
    spec: ClusterSpec
    measured_busbw_GBps: float
    nccl_algo: str = "auto"  # as NCCL_ALGO was set for the run (pins.py syntax)
    where: str = ""  # e.g. "logs[0] line 41", for messages

    @property
    def nodes(self) -> int:
        return self.spec.num_nodes

    @property
    def span(self) -> str:
        return "intra_node" if self.nodes == 1 else "inter_node"

    @property
    def sm(self) -> int:
        return self.spec.gpu.sm if self.spec.gpu else 0


@dataclass(frozen=True)
class RowResult:
    observation: Observation
    before_GBps: float
    after_GBps: float
    fitted: bool  # priced by NCCL's model, which the constants calibrate

    @property
    def error_before(self) -> float:
        return self.before_GBps / self.observation.measured_busbw_GBps - 1

    @property
    def error_after(self) -> float:
        return self.after_GBps / self.observation.measured_busbw_GBps - 1


@dataclass
class FitResult:
    constants: Constants  # the values that differ from the defaults; everything else keeps them
    rows: list[RowResult]
    median_error_before: float
    median_error_after: float
    stages: list[dict]  # per stage: name, parameters, rows, median errors, kept or not


class _Pricer:
    """Prices observations under constants, memoised (a fit prices each row a few hundred times)."""

    def __init__(self):
        self.clusters: dict[ClusterSpec, Cluster] = {}
        self.calibrations: dict[Constants, LibraryCalibration] = {}
        self.busbws: dict[tuple, float] = {}
        self.calls: dict[tuple, tuple] = {}  # row -> (op, size, placement, cluster): no constant changes them

    def cluster(self, spec: ClusterSpec) -> Cluster:
        spec = replace(spec, calibration=None)  # the calibration is passed with each call
        return self.clusters.get(spec) or self.clusters.setdefault(spec, Cluster(spec))

    def busbw(self, obs: Observation, constants: Constants) -> float:
        """Memoised: repeated runs of one test price the same row once per set of constants."""
        key = (obs.op, obs.size_bytes, obs.ranks, obs.spec, obs.nccl_algo, constants)
        if key not in self.busbws:
            self.busbws[key] = self.price(obs, constants).busbw_GBps
        return self.busbws[key]

    def price(self, obs: Observation, constants: Constants):
        if constants not in self.calibrations:
            self.calibrations[constants] = calibration_for(constants)
        op, size, placement, cluster = self.call(obs)
        try:
            return price_call(
                op, size, placement, cluster, calibration=self.calibrations[constants], pricing="auto",
                nccl_algo=obs.nccl_algo, top_links=0,
            )  # fmt: skip  # top_links=0: the fit reads the bandwidth and NCCL's pick, never the busiest links
        except CollectiveError as err:
            raise CollectiveError(err.field, f"{obs.where}: {err.rule}") from None

    def call(self, obs: Observation) -> tuple:
        """The call a row prices, built once per row: the constants are the only thing a fit varies."""
        key = (obs.op, obs.size_bytes, obs.ranks, obs.spec)
        got = self.calls.get(key)
        if got is None:
            cluster = self.cluster(obs.spec)
            placement = placement_for(obs.ranks, cluster.spec)
            size = obs.size_bytes
            if obs.op is Op.SENDRECV:  # sendrecv_perf: rank r sends to r+1 and receives from r-1, all at once
                ring = placement[0]
                placement = np.stack([ring, np.roll(ring, -1)], axis=1)
            if obs.op is Op.ALLTOALL:
                size -= size % obs.ranks
            got = self.calls[key] = (obs.op, size, placement, cluster)
        return got

    def fitted(self, obs: Observation) -> bool:
        return fitted_by_library(obs.op, self.cluster(obs.spec))


def placement_for(ranks: int, spec: ClusterSpec) -> np.ndarray:
    """Ranks laid out node by node, the same count on each node, as mpirun/srun place nccl-tests ranks."""
    nodes = spec.num_nodes
    if ranks % nodes or ranks // nodes > spec.devices_per_node:
        raise CollectiveError(
            "nodes",
            f"{ranks} ranks on {nodes} nodes of {spec.devices_per_node} devices: the ranks must split evenly, "
            f"at most {spec.devices_per_node} per node",
        )
    per = ranks // nodes
    return (np.arange(nodes)[:, None] * spec.devices_per_node + np.arange(per)[None, :]).reshape(1, -1)


def fit(
    observations: list[Observation],
    start: Constants = Constants(),
    bandwidth_min_bytes: int = BANDWIDTH_MIN_BYTES,
    latency_max_bytes: int = LATENCY_MAX_BYTES,
) -> FitResult:
    """Fit the constants the observations can inform, starting from ``start`` (the pricer's defaults
    when empty); returns every row before and after."""
    obs = [o for o in observations if o.size_bytes > 0 and o.measured_busbw_GBps > 0]
    if not obs:
        raise CollectiveError("logs", f"no row with a positive size and bandwidth to fit (of {len(observations)} rows)")
    pricer = _Pricer()
    before = np.array([pricer.busbw(o, start) for o in obs])
    measured = np.array([o.measured_busbw_GBps for o in obs])
    fittable = _distinct([o for o in obs if pricer.fitted(o)])
    current, current_pred = start, before
    stages: list[dict] = []
    plan = [p for p in _stages(fittable, pricer, start, bandwidth_min_bytes, latency_max_bytes) if p[1] and p[2]]
    rejected = []
    for part in plan:
        current, current_pred, kept = _try([part], obs, measured, current, current_pred, pricer, stages)
        if not kept:
            rejected.append(part)
    if rejected and len(rejected) < len(plan):  # a stage that raised the error may not once the other moved
        for part in rejected:
            current, current_pred, _ = _try([part], obs, measured, current, current_pred, pricer, stages)
    elif len(rejected) == len(plan) > 1:  # neither helps alone where both are off (a lower efficiency and
        # a lower latency cancel on mid sizes): the stages in turn, kept together on the same two tests
        current, current_pred, _ = _try(plan, obs, measured, current, current_pred, pricer, stages)
    fitted = Constants()
    for name in current.names():  # values within 0.1% of the default are the default
        if abs(_coordinate(name, current.get(name)) - _coordinate(name, default_value(name))) > 1e-3:
            fitted = fitted.with_value(name, current.get(name))
    rows = [
        RowResult(o, float(b), float(a), pricer.fitted(o)) for o, b, a in zip(obs, before, current_pred, strict=True)
    ]
    return FitResult(fitted, rows, _median_rel(before, measured), _median_rel(current_pred, measured), stages)


def _try(plan, obs, measured, current, current_pred, pricer, stages):
    """Search each stage's ``names`` on its rows, in turn; keep the result only if it lowers the median error
    over all rows by more than MIN_GAIN and, fitted on either half of the rows (every other one), it does not
    raise the median error of the rows that half left out: a constant moves only when moving it also predicts
    rows it was not fitted on. Records the attempt (errors over the stages' own rows) in ``stages``."""

    def fitted(half: int | None) -> Constants:
        start = current
        for _, rows, names, tiebreak in plan:
            part = rows if half is None else rows[half::2]
            start = _search(part, names, start, pricer, tiebreak) if part else start
        return start

    def holds_out(half: int) -> bool:
        used = {_measurement(o) for _, rows, _, _ in plan for o in rows[half::2]}
        if not used:
            return True
        idx = [i for i, o in enumerate(obs) if _measurement(o) not in used]
        constants = fitted(half)
        pred = np.array([pricer.busbw(obs[i], constants) for i in idx])
        return _median_rel(pred, measured[idx]) <= _median_rel(current_pred[idx], measured[idx])

    candidate = fitted(None)
    pred = np.array([pricer.busbw(o, candidate) for o in obs])
    gain = _median_rel(current_pred, measured) - _median_rel(pred, measured)
    kept = gain > MIN_GAIN and all(holds_out(h) for h in (0, 1))
    members = {o for _, rows, _, _ in plan for o in rows}
    idx = [i for i, o in enumerate(obs) if o in members]
    stages.append(
        {
            "stage": "+".join(p[0] for p in plan),
            "parameters": [n for p in plan for n in p[2]],
            "rows": len(members),
            "median_error_before": _median_rel(current_pred[idx], measured[idx]),
            "median_error_after": _median_rel(pred[idx], measured[idx]),
            "kept": bool(kept),
        }
    )
    return (candidate, pred, True) if kept else (current, current_pred, False)


def _measurement(o: Observation) -> Observation:
    """A row as what was measured, without where it was read: the same run read twice (a log uploaded twice, two
    logs of one run) is one measurement."""
    return replace(o, where="") if o.where else o


def _distinct(rows: list[Observation]) -> list[Observation]:
    """The rows a fit searches on, each measurement once (first read kept): a repeated row would sit in both halves
    of the hold-out test (``_try``), which then holds out no row it was not fitted on, and the fit degenerates
    (user15: the same nccl-tests log uploaded twice fitted nothing where once fitted 4.87% -> 2.75%)."""
    seen: set[Observation] = set()
    return [o for o in rows if not (_measurement(o) in seen or seen.add(_measurement(o)))]


def _median_rel(pred: np.ndarray, measured: np.ndarray) -> float:
    return float(np.median(np.abs(pred / measured - 1))) if len(measured) else 0.0


def _stages(obs, pricer, start, bandwidth_min_bytes, latency_max_bytes):
    """(name, rows, parameters) of the bandwidth stage, then of the latency stage."""
    large = [o for o in obs if o.size_bytes >= bandwidth_min_bytes]
    kinds = {_bound_by(o, pricer.price(o, start)) for o in large}
    yield "bandwidth", large, [f"efficiency.{k}" for k in sorted(kinds)], []
    small = [o for o in obs if o.size_bytes <= latency_max_bytes]
    # the key each row's latency reads: its span, or its span for its GPU generation where that has its own
    cal = calibration_for(start)
    # the key each row's span reads. A multi-node row's latency has three parts (library/model.py _latencies) that
    # small rows cannot tell apart: its NVLink legs keep the domain's scale the one-node rows (these logs' or the
    # defaults') give; its per-hop network latency is one name, the plugin's latency where the network has one
    # (EFA, RoCE, TCPX(O)), else the scale of NCCL's NET table
    names = sorted(
        {
            f"latency_scale.{cal.latency_key(o.span, o.sm)}"
            for o in small
            if o.nodes == 1 or not cal.network_latency_s.get(o.spec.network.kind)
        }
    )
    names += sorted({f"network_latency_s.{o.spec.network.kind}" for o in small if o.nodes > 1})
    # The rows between the bands break ties: small rows alone cannot tell a larger latency scale from a
    # larger per-hop latency (they price alike there), the mid-size rows can.
    middle = [o for o in obs if latency_max_bytes < o.size_bytes < bandwidth_min_bytes]
    yield "latency", small, names, middle


def _bound_by(obs: Observation, price) -> str:
    """The resource whose efficiency scales this row's bandwidth (library/model.py _kind)."""
    if obs.nodes > 1:
        return "nic"
    if getattr(price, "nccl_algorithm", "") == "NVLS":
        return "in_network"
    return "nvlink" if obs.spec.intra.link_name == "nvlink" else "pcie"


def _search(
    rows: list[Observation], names: list[str], start: Constants, pricer: _Pricer, tiebreak: list[Observation] = ()
) -> Constants:
    rows = _spread(rows)
    defaults = {n: start.get(n) if start.get(n) is not None else default_value(n) for n in names}

    tiebreak = _spread(list(tiebreak))

    def log_errors(sample: list[Observation], constants: Constants) -> np.ndarray:
        pred = np.array([pricer.busbw(o, constants) for o in sample])
        return np.abs(np.log(np.maximum(pred, 1e-30) / np.array([o.measured_busbw_GBps for o in sample])))

    memo: dict[Constants, float] = {}  # a point the search comes back to (a start, each descent's end) is priced once

    def objective(constants: Constants) -> float:
        got = memo.get(constants)
        if got is None:
            got = memo[constants] = evaluate(constants)
        return got

    def evaluate(constants: Constants) -> float:
        pull = sum(abs(_coordinate(n, constants.get(n)) - _coordinate(n, defaults[n])) for n in names)
        ties = TIEBREAK_WEIGHT * float(np.median(log_errors(tiebreak, constants))) if tiebreak else 0.0
        return float(np.median(log_errors(rows, constants))) + ties + PULL * pull

    first = start
    for n in names:
        first = first.with_value(n, defaults[n])
    starts = [first]
    if 1 < len(names) <= JOINT_GRID_MAX_NAMES:
        # Latency scale and per-hop latency trade off along a valley (a larger scale with a smaller hop
        # latency prices small rows alike), where a coordinate search stops wherever it enters. A coarse
        # joint grid finds the valley's best region; the search then starts from there too.
        starts.append(min(_joint_grid(names, first), key=objective))
    return min((_descend(objective, names, s) for s in starts), key=objective)


def _descend(objective, names: list[str], current: Constants) -> Constants:
    for _ in range(SWEEPS if len(names) > 1 else 1):  # one parameter: one pass finds its minimum
        for n in names:
            current = current.with_value(n, _line_search(lambda v, n=n, c=current: objective(c.with_value(n, v)), n))
    return current


def _joint_grid(names: list[str], base: Constants):
    """Every combination of JOINT_GRID values per name, even in the search coordinate within its bounds."""
    axes = []
    for n in names:
        low, high = BOUNDS[n.split(".", 1)[0]]
        off = _offset(n)
        axes.append([math.exp(x) - off for x in np.linspace(math.log(low + off), math.log(high + off), JOINT_GRID)])
    for values in itertools.product(*axes):
        point = base
        for n, v in zip(names, values, strict=True):
            point = point.with_value(n, max(v, 0.0))
        yield point


def _spread(rows: list[Observation]) -> list[Observation]:
    """At most STAGE_ROWS rows, deterministic, spread over spans, ops, node counts and sizes alike."""
    if len(rows) <= STAGE_ROWS:
        return rows
    order = sorted(rows, key=lambda o: (o.span, o.op.value, o.nodes, o.size_bytes))
    return [order[i] for i in np.linspace(0, len(order) - 1, STAGE_ROWS).round().astype(int)]


def _offset(name: str) -> float:
    """Latencies are searched on log(value + LATENCY_FLOOR_S), so that 0 (no plugin latency) is reachable."""
    return LATENCY_FLOOR_S if name.startswith("network_latency_s.") else 0.0


def _coordinate(name: str, value: float) -> float:
    return math.log(value + _offset(name))


def _line_search(f, name: str) -> float:
    """Minimum of f over the bounds of ``name``'s group: a grid even in the search coordinate, then
    golden-section between the best grid point's neighbours. Deterministic; GRID + 2 + GOLDEN_STEPS
    evaluations."""
    low, high = BOUNDS[name.split(".", 1)[0]]
    off = _offset(name)
    grid = np.linspace(math.log(low + off), math.log(high + off), GRID)

    def value(x: float) -> float:  # a latency under 1 ns is none
        v = min(max(math.exp(x) - off, low), high)
        return 0.0 if off and v < 0.01 * off else v

    values = [f(value(x)) for x in grid]
    i = int(np.argmin(values))
    a, b = grid[max(i - 1, 0)], grid[min(i + 1, GRID - 1)]
    best_x, best_f = float(grid[i]), values[i]
    ratio = (math.sqrt(5) - 1) / 2
    c, d = b - ratio * (b - a), a + ratio * (b - a)
    fc, fd = f(value(c)), f(value(d))
    for _ in range(GOLDEN_STEPS):
        if fc <= fd:
            b, d, fd = d, c, fc
            c = b - ratio * (b - a)
            fc = f(value(c))
        else:
            a, c, fc = c, d, fd
            d = a + ratio * (b - a)
            fd = f(value(d))
    for x, fx in ((c, fc), (d, fd)):
        if fx < best_f:
            best_x, best_f = x, fx
    return value(best_x)
