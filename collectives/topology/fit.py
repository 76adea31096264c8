"""Fit a handful of global constants to a user's own nccl-tests measurements, and report every row
before and after.

The constants (never one per row; DESIGN.md §7):

- ``efficiency.<link kind>``: the achievable fraction of a link kind's rated bandwidth, fitted on rows of
  at least 256 MiB (where nccl-tests' bus bandwidth has reached its plateau: the busbw curves in
  nccl-tests doc/PERFORMANCE.md and every large-size record of tests/reference/nccl flatten by 256 MiB).
  Only the kinds that are the bottleneck of some such row are fitted; ``in_network`` is the NVLS port rate.
- ``latency_scale.<span>``: a multiplier on every fixed per-call and per-step latency of calls inside one
  node (``intra_node``) or across nodes (``inter_node``), fitted on rows of at most 64 KiB (where NCCL's
  own model is latency-bound: src/graph/tuning.cc picks LL there, whose bandwidth term is small).
- ``network_latency_s.<network kind>``: the per-hop latency of the network (ib, roce, efa, tcpxo), fitted
  on the same small rows of multi-node runs.

Method: coordinate-wise search, each parameter on a log-spaced grid inside its bounds and then a
golden-section refinement (GRID + 2 + GOLDEN_STEPS evaluations: 0.1% resolution), minimising the median
absolute log error of the stage's rows (at most STAGE_ROWS of them, evenly spread; robust to a few outliers;
log error treats "twice too fast" and "twice too slow" alike) plus a small pull towards the defaults so that
parameters the rows cannot tell apart stay where they were. Deterministic, bounded, two sweeps when a stage
has several parameters. A stage is kept only if the median error over *all* rows does not rise; rows between 64 KiB and
256 MiB are fitted by nothing and show whether the constants carry over.

The mapping of these names onto the pricer is ``calibration_for`` / ``apply_constants`` below (the one
adapter), the place to change when the pricer's own constants change. A cluster spec carries fitted
constants in ``ClusterSpec.calibration``; price_call reads them from there (select.py ``calibration_of``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from .._errors import CollectiveError
from ..primitives import Op
from .calibration import DEFAULT, Calibration
from .cluster import Cluster
from .select import price_call
from .spec import ClusterSpec

SPANS = ("intra_node", "inter_node")
NETWORK_KINDS = ("ib", "roce", "efa", "tcpxo")
GROUPS = ("efficiency", "latency_scale", "network_latency_s")
# bounds of each group: an efficiency is a fraction of the rated rate; a latency scale within 4x of NCCL's
# tables; a per-hop network latency between a switch hop of InfiniBand (~0.2 us, NVIDIA Quantum-2 port to
# port is ~0.13 us) and an EFA/SRD message through the provider (~15-20 us, AWS EFA documentation) x 2.5
BOUNDS = {"efficiency": (0.2, 1.0), "latency_scale": (0.25, 4.0), "network_latency_s": (0.2e-6, 50e-6)}
LINK_KINDS = (*DEFAULT.efficiency, "in_network")  # calibration.py's link kinds; in_network: NVLS ports
BANDWIDTH_MIN_BYTES = 256 << 20
LATENCY_MAX_BYTES = 64 << 10
PULL = 0.002  # weight of |log(value / default)| added to the objective: breaks ties towards the defaults
GRID = 13
GOLDEN_STEPS = 12
SWEEPS = 2
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
                if group == "latency_scale" and key not in SPANS:
                    raise CollectiveError(f"{field}.{name}", f"unknown span; known: {', '.join(SPANS)}")
                if group == "network_latency_s" and key not in NETWORK_KINDS:
                    raise CollectiveError(f"{field}.{name}", f"unknown network kind; known: {', '.join(NETWORK_KINDS)}")
                low, high = BOUNDS[group]
                if not (isinstance(value, int | float) and low <= value <= high):
                    raise CollectiveError(f"{field}.{name}", f"must be within [{low:g}, {high:g}], got {value!r}")
                out = out.with_value(name, value)
        return out


# ---------------------------------------------------------------------------------------------------------
# The one adapter: named constants -> the inputs of the current pricer (calibration.py Calibration and the
# ClusterSpec's nic_latency_s). When the library pricer exposes its own constants (efficiency per link kind,
# latency scale per span, per-hop latency per network kind), these two functions are what changes.


def calibration_for(constants: Constants, span: str, base: Calibration = DEFAULT) -> Calibration:
    """The pricer's Calibration under ``constants`` for a call of ``span``: link efficiencies replaced (NVLS
    ports: ``in_network``), and every fixed latency of the pricer (per-call base latency, per-step overhead)
    multiplied by the span's scale."""
    efficiency = dict(base.efficiency)
    in_network = base.in_network_efficiency
    for kind, value in constants.efficiency:
        if kind == "in_network":
            in_network = value
        else:
            efficiency[kind] = value
    scale = dict(constants.latency_scale).get(span, 1.0)
    return replace(
        base,
        efficiency=efficiency,
        in_network_efficiency=in_network,
        step_overhead_s=base.step_overhead_s * scale,
        base_latency_s={k: v * scale for k, v in base.base_latency_s.items()},
        default_base_latency_s=base.default_base_latency_s * scale,
    )


def apply_constants(constants: Constants, spec: ClusterSpec, kind: str | None = None) -> ClusterSpec:
    """The cluster spec carrying ``constants``: the network's per-hop latency is the spec's own
    ``nic_latency_s``; the rest rides along in ``spec.calibration`` for price_call (select.py) to read."""
    return replace(_with_hop(constants, spec, kind), calibration=constants if constants != Constants() else None)


def pricing_inputs(
    constants: Constants, spec: ClusterSpec, span: str, kind: str | None = None
) -> tuple[ClusterSpec, Calibration]:
    """What price_call takes under ``constants``: the spec (its own constants dropped: the calibration is
    passed explicitly) and the Calibration."""
    return replace(_with_hop(constants, spec, kind), calibration=None), calibration_for(constants, span)


def _with_hop(constants: Constants, spec: ClusterSpec, kind: str | None) -> ClusterSpec:
    hop = dict(constants.network_latency_s).get(network_kind(spec, kind))
    return replace(spec, nic_latency_s=hop) if hop is not None else spec


# NCCL_ALGO as a log shows it -> the current pricer's algorithm (select.py LIBRARY_CANDIDATES)
ALGORITHMS = {
    "ring": "ring",
    "tree": "double_binary_tree",
    "nvls": "in_network",
    "nvlstree": "in_network",
    "collnet": "in_network",
    "collnetdirect": "in_network",
    "collnetchain": "in_network",
}


def default_value(name: str, spec: ClusterSpec, base: Calibration = DEFAULT) -> float:
    """The value a parameter has when no constant is given."""
    group, key = name.split(".", 1)
    if group == "efficiency":
        return base.in_network_efficiency if key == "in_network" else base.efficiency.get(key, 1.0)
    if group == "latency_scale":
        return 1.0
    return spec.nic_latency_s


def network_kind(spec: ClusterSpec, given: str | None = None) -> str:
    """The cluster's network kind: as given, as the spec says (``network_kind``, once the presets carry
    it), else EFA when the NIC latency is EFA's (calibration.py EFA_LATENCY_S) and InfiniBand otherwise."""
    kind = given or getattr(spec, "network_kind", None) or getattr(spec.network, "kind", None)
    if kind is None:
        kind = "efa" if spec.nic_latency_s >= 10e-6 else "ib"
    if kind not in NETWORK_KINDS:
        raise CollectiveError("network_kind", f"unknown network kind {kind!r}; known: {', '.join(NETWORK_KINDS)}")
    return kind


# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Observation:
    """One measured row: ``ranks`` GPUs spread evenly over ``spec.num_nodes`` nodes ran ``op``."""

    op: Op
    size_bytes: int
    ranks: int
    spec: ClusterSpec
    measured_busbw_GBps: float
    algorithm: str = "auto"
    network_kind: str = "ib"
    where: str = ""  # e.g. "logs[0] line 41", for messages

    @property
    def nodes(self) -> int:
        return self.spec.num_nodes

    @property
    def span(self) -> str:
        return "intra_node" if self.nodes == 1 else "inter_node"


@dataclass(frozen=True)
class RowResult:
    observation: Observation
    before_GBps: float
    after_GBps: float

    @property
    def error_before(self) -> float:
        return self.before_GBps / self.observation.measured_busbw_GBps - 1

    @property
    def error_after(self) -> float:
        return self.after_GBps / self.observation.measured_busbw_GBps - 1


@dataclass
class FitResult:
    constants: Constants  # the fitted values only; everything else keeps the pricer's defaults
    rows: list[RowResult]
    median_error_before: float
    median_error_after: float
    stages: list[dict]  # per stage: name, parameters, rows, median errors, kept or not

    def row_errors(self, which: str) -> np.ndarray:
        return np.array([abs(getattr(r, f"error_{which}")) for r in self.rows])


class _Pricer:
    """Prices observations under constants; keeps every Calibration and Cluster it made alive for its own
    lifetime (Cluster.rate memoises by id(calibration), so a freed calibration's id must not come back)."""

    def __init__(self):
        self.clusters: dict[ClusterSpec, Cluster] = {}
        self.inputs: dict[tuple, tuple[ClusterSpec, Calibration]] = {}
        self.busbws: dict[tuple, float] = {}

    def busbw(self, obs: Observation, constants: Constants) -> float:
        """Memoised: repeated runs of one test price the same row once per set of constants."""
        key = (obs.op, obs.size_bytes, obs.ranks, obs.spec, obs.algorithm, obs.network_kind, constants)
        if key not in self.busbws:
            self.busbws[key] = self.price(obs, constants).busbw_GBps
        return self.busbws[key]

    def price(self, obs: Observation, constants: Constants):
        key = (constants, obs.spec, obs.span, obs.network_kind)
        if key not in self.inputs:
            self.inputs[key] = pricing_inputs(constants, obs.spec, obs.span, obs.network_kind)
        spec, calibration = self.inputs[key]
        cluster = self.clusters.get(spec) or self.clusters.setdefault(spec, Cluster(spec))
        return self._price(obs, cluster, calibration)

    @staticmethod
    def _price(obs: Observation, cluster: Cluster, calibration: Calibration):
        placement = placement_for(obs.ranks, cluster.spec)
        size = obs.size_bytes
        if obs.op is Op.SENDRECV:  # sendrecv_perf: rank r sends to r+1 and receives from r-1, all at once
            ring = placement[0]
            placement = np.stack([ring, np.roll(ring, -1)], axis=1)
        if obs.op is Op.ALLTOALL:
            size -= size % obs.ranks
        try:
            return price_call(obs.op, size, placement, cluster, obs.algorithm, calibration=calibration)
        except CollectiveError as err:
            raise CollectiveError(err.field, f"{obs.where}: {err.rule}") from None


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


def log_error(predicted: float, measured: float) -> float:
    return abs(math.log(max(predicted, 1e-30) / measured))


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
        raise CollectiveError("logs", "no row with a positive size and bandwidth to fit")
    pricer = _Pricer()
    before = np.array([pricer.busbw(o, start) for o in obs])
    measured = np.array([o.measured_busbw_GBps for o in obs])
    current, current_pred = start, before
    stages: list[dict] = []
    plan = [p for p in _stages(obs, pricer, start, bandwidth_min_bytes, latency_max_bytes) if p[2]]
    rejected = []
    for stage, rows, names in plan:
        current, current_pred, kept = _stage(stage, rows, names, obs, measured, current, current_pred, pricer, stages)
        if not kept:
            rejected.append((stage, rows, names))
    if rejected and len(rejected) < len(plan):  # a stage that raised the error may not once the other moved
        for stage, rows, names in rejected:
            current, current_pred, _ = _stage(stage, rows, names, obs, measured, current, current_pred, pricer, stages)
    fitted = Constants()
    for name in current.names():
        fitted = fitted.with_value(name, current.get(name))
    rows = [RowResult(o, float(b), float(a)) for o, b, a in zip(obs, before, current_pred, strict=True)]
    return FitResult(fitted, rows, _median_rel(before, measured), _median_rel(current_pred, measured), stages)


def _stage(stage, rows, names, obs, measured, current, current_pred, pricer, stages):
    """Search ``names`` on ``rows``; keep the result only if the median error over all rows does not rise."""
    candidate = _search(rows, names, current, pricer)
    pred = np.array([pricer.busbw(o, candidate) for o in obs])
    kept = _median_rel(pred, measured) <= _median_rel(current_pred, measured)
    idx = [i for i, o in enumerate(obs) if o in set(rows)]
    stages.append(
        {
            "stage": stage,
            "parameters": names,
            "rows": len(rows),
            "median_error_before": _median_rel(current_pred[idx], measured[idx]),
            "median_error_after": _median_rel(pred[idx], measured[idx]),
            "kept": bool(kept),
        }
    )
    return (candidate, pred, True) if kept else (current, current_pred, False)


def _median_rel(pred: np.ndarray, measured: np.ndarray) -> float:
    return float(np.median(np.abs(pred / measured - 1))) if len(measured) else 0.0


def _stages(obs, pricer, start, bandwidth_min_bytes, latency_max_bytes):
    """(name, rows, parameters) of the bandwidth stage, then of the latency stage."""
    large = [o for o in obs if o.size_bytes >= bandwidth_min_bytes]
    kinds = set()
    for o in large:
        price = pricer.price(o, start)
        if price.algorithm == "in_network" and o.nodes == 1:
            kinds.add("in_network")  # NVLS: the NVSwitch ports run at the NVLS efficiency (calibration.py)
        elif price.bottleneck.get("kind"):
            kinds.add(price.bottleneck["kind"])
    yield "bandwidth", large, [f"efficiency.{k}" for k in sorted(kinds)]
    small = [o for o in obs if o.size_bytes <= latency_max_bytes]
    names = [f"latency_scale.{s}" for s in SPANS if any(o.span == s for o in small)]
    names += sorted({f"network_latency_s.{o.network_kind}" for o in small if o.nodes > 1})
    yield "latency", small, names


def _search(rows: list[Observation], names: list[str], start: Constants, pricer: _Pricer) -> Constants:
    if len(rows) > STAGE_ROWS:  # deterministic, spread over sizes, ops and node counts alike
        order = sorted(rows, key=lambda o: (o.span, o.op.value, o.nodes, o.size_bytes))
        rows = [order[i] for i in np.linspace(0, len(order) - 1, STAGE_ROWS).round().astype(int)]
    measured = np.array([o.measured_busbw_GBps for o in rows])
    spec = rows[0].spec
    defaults = {n: start.get(n) or default_value(n, spec) for n in names}

    def objective(constants: Constants) -> float:
        pred = np.array([pricer.busbw(o, constants) for o in rows])
        errors = np.abs(np.log(np.maximum(pred, 1e-30) / measured))
        pull = sum(abs(math.log((constants.get(n) or defaults[n]) / defaults[n])) for n in names)
        return float(np.median(errors)) + PULL * pull

    current = start
    for n in names:
        current = current.with_value(n, defaults[n])
    for _ in range(SWEEPS if len(names) > 1 else 1):  # one parameter: one pass finds its minimum
        for n in names:
            current = current.with_value(n, _line_search(lambda v, n=n, c=current: objective(c.with_value(n, v)), n))
    return current


def _line_search(f, name: str) -> float:
    """Minimum of f over the bounds of ``name``'s group: a log-spaced grid, then golden-section between the
    best grid point's neighbours. Deterministic; GRID + GOLDEN_STEPS evaluations."""
    low, high = BOUNDS[name.split(".", 1)[0]]
    grid = np.geomspace(low, high, GRID)
    values = [f(float(v)) for v in grid]
    i = int(np.argmin(values))
    a, b = math.log(grid[max(i - 1, 0)]), math.log(grid[min(i + 1, GRID - 1)])
    best_x, best_f = float(grid[i]), values[i]
    ratio = (math.sqrt(5) - 1) / 2
    c, d = b - ratio * (b - a), a + ratio * (b - a)
    fc, fd = f(math.exp(c)), f(math.exp(d))
    for _ in range(GOLDEN_STEPS):
        if fc <= fd:
            b, d, fd = d, c, fc
            c = b - ratio * (b - a)
            fc = f(math.exp(c))
        else:
            a, c, fc = c, d, fd
            d = a + ratio * (b - a)
            fd = f(math.exp(d))
    for x, fx in ((math.exp(c), fc), (math.exp(d), fd)):
        if fx < best_f:
            best_x, best_f = x, fx
    return best_x
