"""A plan: the ledger of one iteration, placed on the cluster and priced, with totals (CONTRACT.md)."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field, replace
from functools import cached_property

import numpy as np

from collectives import CollectiveError, Op
from collectives.topology import (
    Cluster,
    ClusterSpec,
    Price,
    canonical,
    cluster_for,
    neighbourhood,
    price_call,
    tiling_unit,
)
from collectives.topology.library import normalise_algo, normalise_proto
from collectives.topology.spec import spec_block

from ._errors import SpecError
from .assumptions import Assumption, plan_assumptions
from .context import Context, device_sms
from .kernel_view import drawn_links
from .kernels import kv_length
from .layout import Group, RankLayout, layout_for
from .ledger import Call, held_ctas, kernel_time
from .memory import Memory
from .model import ModelSpec, validate_model
from .parallel import ParallelSpec, validate_parallel
from .recipes import check_recipe_gpu
from .rules import ledger
from .rules.data import steady_state
from .step import Overlap, StepTime, memory, step_time
from .workload import WorkloadSpec, validate_workload


@dataclass(frozen=True)
class Options:
    algorithm: str = "auto"  # or an algorithm name, used for every call whose op it implements
    candidates: str = "library"  # library | all (see collectives.topology.select)
    contention: str = "neighbourhood"  # neighbourhood | full
    device_map: tuple[int, ...] | None = None  # rank r runs on device device_map[r]; None: rank = device
    links_per_call: int = 5  # busiest links reported per call (the page asks for more to colour the topology)
    pricing: str = "auto"  # auto | library (NCCL's model) | schedule (step by step); see collectives.topology.select
    nccl_algo: str = "auto"  # pin like NCCL_ALGO (library pricing)
    nccl_proto: str = "auto"  # pin like NCCL_PROTO (library pricing)
    overlap: Overlap = field(default_factory=Overlap)  # framework overlap switches for the step time (planner/step.py)
    timeline: bool = True  # build the step timeline (the search turns it off)

    @property
    def exact_contention(self) -> bool:
        """Price every group: asked for, or needed because a custom map may break the layout's symmetry."""
        return self.contention == "full" or self.device_map is not None

    @property
    def pricer(self) -> str:
        """The pricing the plan asks ``price_call`` for: ``candidates: all`` compares every textbook schedule step
        by step, unless library pricing is asked for (read by _price_op and planner/estimate.py alike)."""
        return "schedule" if self.candidates == "all" and self.pricing == "auto" else self.pricing


@dataclass
class PricedCall:
    call: Call
    num_groups: int
    group_size: int
    price: Price
    group_ranks: list[int] = field(default_factory=list)  # group 0, in schedule order
    group_devices: list[int] = field(default_factory=list)  # where those ranks run
    links: list[dict] = field(default_factory=list)  # the busiest links, labelled where they really are

    @property
    def channels(self) -> int:
        """The CTAs the call's kernel holds (Call.held_ctas): its own SMs (DeepEP, HybridEP) or NCCL's channels."""
        return held_ctas(self.call, self.price.channels)


@dataclass(frozen=True)
class Amounts:
    """What calls add up to on one stage, per iteration: message bytes, bytes one rank sends, seconds."""

    message_bytes: int = 0
    bytes_sent: int = 0
    time_s: float = 0.0


@dataclass(frozen=True)
class StageTotals(Amounts):
    stage: int = 0


@dataclass(frozen=True)
class Totals:
    """The ledger's communication added up per stage, calls serialised (not a step time: see StepTime)."""

    time_s: float  # the busiest stage's
    busiest_stage: int
    per_stage: list[StageTotals]
    by_parallelism: dict[str, Amounts]  # each parallelism's share on the busiest stage


@dataclass
class Plan:
    world_size: int
    num_microbatches: int
    # a rank's passes over all its chunks (Context.passes: m, DualPipe's m / 2, one micro-batch each way): what the
    # step's compute and per-pass calls are counted by, and the exports' passes (review r13a #4)
    passes: int
    calls: list[PricedCall]
    num_stages: int
    params_total: int
    cluster: dict = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    step: StepTime | None = None  # None when the cluster has no GPU spec
    memory: Memory | None = None
    parallel: ParallelSpec | None = None  # the layout planned (the exports' headers read it)
    assumptions: list[Assumption] = field(default_factory=list)  # the settings it was made under (assumptions.py)

    @cached_property
    def totals(self) -> Totals:
        """Computed once per plan (the answer, the invariants and the search read it): a plan's calls are not
        edited in place (planner/serving makes a new Plan with ``dataclasses.replace``, which starts without it)."""
        n = self.num_stages
        # per stage [message bytes, bytes sent, seconds], over every call and per parallelism; added in call
        # order (the float sums are those of one loop over the ledger)
        stages = [[0, 0, 0.0] for _ in range(n)]
        by_par: dict[str, list[list]] = {}
        for pc in self.calls:
            c = pc.call
            k = c.calls_per_iteration
            message, sent, time_s = k * c.message_bytes, k * pc.price.bytes_sent_per_rank, k * pc.price.time_s
            rows = by_par.get(c.parallelism) or by_par.setdefault(c.parallelism, [[0, 0, 0.0] for _ in range(n)])
            for s in c.stages:
                for row in (stages[s], rows[s]):
                    row[0] += message
                    row[1] += sent
                    row[2] += time_s
        busiest = max(range(n), key=lambda s: stages[s][2])
        return Totals(
            stages[busiest][2],
            busiest,
            [StageTotals(*row, stage=s) for s, row in enumerate(stages)],
            {name: Amounts(*rows[busiest]) for name, rows in by_par.items()},
        )


MAX_PARAMS = 1 << 50  # parameters of a model (1.1e15; GPT-3 is 1.75e11), x 16 bytes of optimizer state fits int64


@dataclass(frozen=True, eq=False)
class Prepared:
    """A plan's validated set-up and its ledger, built once (:func:`prepare`): the work estimate
    (planner/estimate.py) walks it before any pricing, and build_plan prices the same objects instead of
    building them again. ``inputs`` are the five arguments it was built from, matched by identity."""

    ctx: Context
    layout: RankLayout
    cluster: Cluster
    calls: tuple[Call, ...]
    params_total: int
    inputs: tuple

    def built_from(self, *inputs) -> bool:
        return len(inputs) == len(self.inputs) and all(a is b for a, b in zip(inputs, self.inputs, strict=True))


def prepare(
    model: ModelSpec, work: WorkloadSpec, par: ParallelSpec, cluster_spec: ClusterSpec, options: Options = Options()
) -> Prepared:
    """:func:`setup`, the ledger of that context and the model's parameter count: what the estimate and the
    plan both start from."""
    ctx, layout, cluster = setup(model, work, par, cluster_spec, options)
    params = model.total_params()  # memoised by value in planner/model.py
    if params > MAX_PARAMS:
        raise SpecError("model", f"{params:,} parameters; at most {MAX_PARAMS:,} (2^50) are planned here")
    return Prepared(ctx, layout, cluster, _ledger_of(ctx), params, (model, work, par, cluster_spec, options))


def build_plan(
    model: ModelSpec,
    work: WorkloadSpec,
    par: ParallelSpec,
    cluster_spec: ClusterSpec,
    options: Options = Options(),
    prepared: Prepared | None = None,
) -> Plan:
    """The plan of these inputs; ``prepared``: their set-up and ledger as the work estimate built them
    (``Estimate.prepared``), used when built from these very objects, else built here."""
    if prepared is None or not prepared.built_from(model, work, par, cluster_spec, options):
        prepared = prepare(model, work, par, cluster_spec, options)
    ctx, layout, cluster = prepared.ctx, prepared.layout, prepared.cluster
    pricer = _pricer(cluster, layout, pricing_options(options))
    priced = [row for call in prepared.calls for row in _price_by_stage(call, pricer)]
    m = ctx.micro_batches
    plan = Plan(par.world_size, m, ctx.passes, priced, par.pp, prepared.params_total, cluster_summary(cluster))
    plan.parallel = par
    plan.warnings += steady_state(ctx)  # where a framework's first steps differ from the ledger's
    plan.warnings += model.notes  # what the model's source leaves out (a config.json's vision encoder, ...)
    plan.assumptions = plan_assumptions(ctx, options.overlap, cluster_spec, options)
    gpu = cluster_spec.gpu
    if gpu is None:
        plan.warnings.append(f"cluster {cluster_spec.name!r} has no GPU spec: no step time or memory")
        return plan
    plan.step = step_time(ctx, priced, gpu, options.overlap, options.timeline, cluster_spec.pcie_bandwidth_GBps)
    plan.memory = memory(ctx, gpu, priced)
    plan.warnings += plan.memory.warnings() + _bubble_warning(plan.step, par, m)
    plan.warnings += _mfu_warning(plan.step, ctx) + plan.step.warnings
    return plan


def setup(
    model: ModelSpec, work: WorkloadSpec, par: ParallelSpec, cluster_spec: ClusterSpec, options: Options
) -> tuple[Context, RankLayout, Cluster]:
    """The validated inputs of a plan as the ledger and the placements need them; the explorer starts here too,
    so that it places a call exactly as the plan does."""
    validate_model(model)
    validate_workload(work)
    cluster = cluster_for(cluster_spec)
    validate_parallel(par, model, work, cluster.num_devices)
    check_recipe_gpu(work.fp8_recipe, cluster_spec.gpu)
    _validate_options(options, cluster.num_devices)
    per_node, sms = cluster.spec.devices_per_node, device_sms(cluster_spec)
    return _context(model, work, par, per_node, sms), layout_for(par), cluster


# ---- contexts and ledgers memoised by value --------------------------------------------------------------

# A Context and its ledger are pure functions of (model, work, par, devices per node): plans that differ only
# in the rest of the cluster (its network, NICs, GPU, node count at equal dp) or in the options share them,
# and with the context its cached properties (stage layers, chunks, activation sizes) that the ledger, the
# step time and the memory read. Bounded, first in first out as the price cache; the values are frozen
# (Context, a tuple of frozen Calls), and every caller validates its own inputs in ``setup`` first. Keyed by
# the Context's value (its hash is computed once: collectives/_hashing.py), so the memoised context finds its
# own entry cheaply; each entry also holds a memo of what is computed from the ledger with the request's
# other inputs (``ledger_memo``: the work estimate's walk), which goes with it.
CONTEXT_CACHE = 32
_CONTEXTS: OrderedDict = OrderedDict()  # Context -> [that context, its ledger or None, its ledger memo]


def _context(model: ModelSpec, work: WorkloadSpec, par: ParallelSpec, devices_per_node: int, sms: int = 0) -> Context:
    probe = Context(model, work, par, devices_per_node=devices_per_node, device_sms=sms)
    found = _CONTEXTS.get(probe)
    if found is None:
        found = _CONTEXTS[probe] = [probe, None, {}]
        if len(_CONTEXTS) > CONTEXT_CACHE:
            _CONTEXTS.popitem(last=False)
    return found[0]


def _entry(ctx: Context) -> list | None:
    found = _CONTEXTS.get(ctx)
    return found if found is not None and found[0] is ctx else None


def _ledger_of(ctx: Context) -> tuple[Call, ...]:
    """``rules.ledger(ctx)``, once per memoised context (one built elsewhere is not kept)."""
    found = _entry(ctx)
    if found is None:
        return tuple(ledger(ctx))
    if found[1] is None:
        found[1] = tuple(ledger(ctx))
    return found[1]


def ledger_memo(ctx: Context) -> dict | None:
    """A dict kept with a memoised context's ledger, for values computed from that ledger and the request's
    other inputs only, keyed by those inputs (planner/estimate.py: the work estimate's walk); None for a
    context not memoised here. Bounded as the contexts are: it goes with its context."""
    found = _entry(ctx)
    return None if found is None else found[2]


def placement_priced(call: Call, layout: RankLayout, cluster: Cluster, options: Options) -> np.ndarray:
    """The groups a call's price is computed on, as ``_price`` chooses them: the devices its ranks run on
    (``options.device_map``), every group under exact contention, else group 0's neighbourhood moved by the
    cluster's symmetry (collectives/topology/symmetry.py)."""
    return _placements(cluster, layout).site(call.group, call.stages, options).priced_on


def priced_keys(call: Call, layout: RankLayout, cluster: Cluster, options: Options) -> tuple[tuple, ...]:
    """The values a call's prices are memoised under, one per stage class as ``_price_by_stage`` prices them:
    (the cluster it is priced on, the hash of the class's ``_Site.price_key``: (shape, bytes), whose hash Python
    keeps with the bytes; 64 bits, so that an estimate memoised with its context holds no copy of a placement).
    The price cache (``_PRICES``) and the library pricer's contention pass (collectives/topology/library/
    pricer.py ``_placement_part``) are keyed by these, so a batch's plans that share one pay for it once."""
    memo = _placements(cluster, layout)._memo  # kept with the cluster's own placements, as _Placements.site keeps
    kept = options.device_map is None and not options.exact_contention  # its sites
    key = ("keys", call.group, call.stages, call.nvlink_peers)
    found = memo.get(key) if kept else None
    if found is None:
        cluster = priced_cluster(call, cluster)
        places = _placements(cluster, layout)
        if not call.group.pairs and ("pp" in call.group.dims or call.group.mirror):
            classes = [call.stages]
        else:
            classes = _stage_classes(call, places, options)
        found = tuple((cluster.spec, hash(places.site(call.group, members, options).price_key)) for members in classes)
        if kept:
            memo[key] = found
    return found


BUBBLE_WARNING = 0.25  # share of the step idle in the pipeline bubble worth a warning


def _bubble_warning(step: StepTime, par: ParallelSpec, m: int) -> list[str]:
    if not step.time_s or step.bubble_s / step.time_s <= BUBBLE_WARNING or par.pp == 1:
        return []
    return [
        f"stage {step.critical_stage} idles {step.bubble_s / step.time_s:.0%} of the step in the pipeline bubble "
        f"({m} micro-batches for {par.pp} stages): more micro-batches or virtual_pipeline_stages shrink it"
    ]


def _mfu_warning(step: StepTime, ctx: Context) -> list[str]:
    """MFU above 1 is its definition's, not a machine faster than its peak (invariants.MFU_CEILING): said."""
    if step.mfu <= 1:
        return []
    return [
        f"MFU {step.mfu:.0%} is above 100%: its model FLOPs (PaLM, Llama 3: 12·L·H·Q·T for attention) count causal "
        f"attention's whole square, twice the query-key pairs the kernels compute, and at {kv_length(ctx):,} keys a "
        f"query attention is most of the work (Megatron-LM's current num_floating_point_operations halves it)"
    ]


def cluster_summary(cluster: Cluster) -> dict:
    """The cluster as a request block (CONTRACT v1.1: the response's cluster block is a valid request
    cluster block): every field that prices it, nested as a request nests them, so pasting it into a new
    request rebuilds this cluster, and the page's topology view reads nodes, NICs and leaves from it."""
    return spec_block(cluster.spec)


def _validate_options(options: Options, num_devices: int) -> None:
    if options.device_map is not None:
        dm = options.device_map
        if len(dm) != num_devices or sorted(dm) != list(range(num_devices)):
            raise SpecError(
                "options.device_map",
                f"must list each of the cluster's {num_devices} devices once "
                f"(rank r runs on device_map[r]); got {len(dm)} entries",
            )
    if options.candidates not in ("library", "all"):
        raise SpecError("options.candidates", f"must be 'library' or 'all', got {options.candidates!r}")
    if options.pricing not in ("auto", "library", "schedule"):
        raise SpecError("options.pricing", f"must be 'auto', 'library' or 'schedule', got {options.pricing!r}")
    try:
        normalise_algo(options.nccl_algo)
        normalise_proto(options.nccl_proto)
    except CollectiveError as err:
        raise SpecError(f"options.{err.field}", err.rule) from None
    if options.contention not in ("neighbourhood", "full"):
        raise SpecError("options.contention", f"must be 'neighbourhood' or 'full', got {options.contention!r}")


# ---- pricing with caches ------------------------------------------------------------------------------

_PRICES: OrderedDict = OrderedDict()
PRICE_CACHE = 20_000
# (cluster, layout) pairs whose placements on the cluster are kept (each holds a few dozen small arrays)
SITES_CACHE = 16
_SITES: OrderedDict = OrderedDict()


@dataclass(frozen=True)
class _Site:
    """Where one call's groups sit, and the placement that prices them: the neighbourhood of group 0 moved
    to the start of the cluster by its symmetry (collectives/topology/symmetry.py), or every group where
    it is when contention is priced exactly."""

    ranks: np.ndarray  # groups x size, read-only
    devices: np.ndarray  # where the ranks run
    priced_on: np.ndarray
    shift: int  # devices priced_on was moved down by (symmetry.canonical)
    price_key: tuple  # priced_on as a hashable key: (shape, bytes)
    group_ranks: tuple[int, ...]  # group 0, in schedule order
    group_devices: tuple[int, ...]


def _site(ranks: np.ndarray, devices: np.ndarray, cluster: Cluster, exact: bool) -> _Site:
    priced_on, shift = (devices, 0) if exact else canonical(neighbourhood(devices, cluster), cluster)
    group_ranks = tuple(ranks[0].tolist())
    # ranks run on the devices of the same number (no device map): one tuple, so the answer's two lists of a
    # call hold the same int objects and app/serialize.py finds the second equal to the first at C speed
    group_devices = group_ranks if devices is ranks else tuple(devices[0].tolist())
    return _Site(ranks, devices, priced_on, shift, (priced_on.shape, priced_on.tobytes()), group_ranks, group_devices)


class _Placements:
    """A layout's placements on one cluster, memoised: they depend on (cluster, layout, group, stages) and
    not on the model or workload, so plans of one layout on one cluster share them. Kept are the small
    ones, the neighbourhoods the symmetry shortcut prices; exact contention and custom device maps (not
    part of the key) are worked out per plan."""

    def __init__(self, cluster: Cluster, layout: RankLayout):
        self.cluster, self.layout = cluster, layout
        self._memo: dict = {}

    def site(self, group: Group, stages: tuple[int, ...], options: Options) -> _Site:
        if options.device_map is not None:
            ranks = self.layout.placement(group, stages)
            return _site(ranks, np.asarray(options.device_map)[ranks], self.cluster, exact=True)
        if options.exact_contention:  # every group is priced: a key as large as the layout, not kept
            ranks = self.layout.placement(group, stages)
            return _site(ranks, ranks, self.cluster, exact=True)
        key = ("site", group, stages)
        found = self._memo.get(key)
        if found is None:  # the placement is looked up only for a site not yet kept
            ranks = self.layout.placement(group, stages)
            found = self._memo[key] = _site(ranks, ranks, self.cluster, exact=False)
        return found

    def within_node(self, group: Group, stages: tuple[int, ...]) -> bool:
        """Whether group 0 of the first of ``stages`` stays inside one node (ranks = devices)."""
        key = ("within_node", group, stages)
        if key not in self._memo:
            first = self.layout.placement(group, stages)[0].tolist()
            per_node = self.cluster.per_node
            self._memo[key] = len({r // per_node for r in first}) == 1
        return self._memo[key]

    def node_signature(self, group: Group, stage: int, options: Options) -> tuple:
        """Where a stage's groups sit, when no symmetry of the cluster is known (router networks, custom device
        maps): how many groups cross a node boundary, and the in-node positions of the first group. Stages
        alike in this are priced together, so a torus or dragonfly is not priced p times."""
        if options.device_map is not None:
            return self._node_signature(group, stage, options.device_map)
        key = ("nodes", group, stage)
        if key not in self._memo:
            self._memo[key] = self._node_signature(group, stage, None)
        return self._memo[key]

    def _node_signature(self, group: Group, stage: int, device_map: tuple[int, ...] | None) -> tuple:
        ranks = self.layout.placement(group, (stage,))
        devices = np.asarray(device_map)[ranks] if device_map else ranks
        nodes = devices // self.cluster.per_node
        crossing = int((nodes.max(axis=1) != nodes.min(axis=1)).sum())
        return crossing, tuple((devices[0] % self.cluster.per_node).tolist())


def _placements(cluster: Cluster, layout: RankLayout) -> _Placements:
    last = _LAST_SITES[0]  # a plan asks for the same pair ~90 times: no spec hashed (6 us a pair) when it is the last
    if last is not None and last.cluster is cluster and last.layout is layout:
        return last
    key = (cluster.spec, layout.par)
    found = _SITES.get(key)
    if found is None or found.cluster is not cluster or found.layout is not layout:
        found = _SITES[key] = _Placements(cluster, layout)
        if len(_SITES) > SITES_CACHE:
            _SITES.popitem(last=False)
    _LAST_SITES[0] = found
    return found


_LAST_SITES: list[_Placements | None] = [None]  # the pair _placements gave last (matched by identity)


@dataclass(frozen=True)
class _Pricer:
    """What one plan prices with: its placements, its options, and the price cache's key prefix for
    (cluster, options), interned so that it is hashed once per plan and not once per call."""

    places: _Placements
    options: Options
    prefix: int


_PREFIXES: OrderedDict = OrderedDict()
_next_prefix = iter(range(1 << 62))


def pricing_options(options: Options) -> Options:
    """The options a price is keyed by: the step-time switches (overlap, timeline) do not change a price, so they are
    kept out of the price cache's key. The one home of that key's options: build_plan, price_calls and the batch's
    estimate (estimate.py ``_walk``'s shared parts, which BatchWork matches against a simulation of these caches)."""
    if options.overlap == Overlap() and options.timeline:
        return options
    return replace(options, overlap=Overlap(), timeline=True)


def _pricer(cluster: Cluster, layout: RankLayout, options: Options) -> _Pricer:
    key = (cluster.spec, options)
    prefix = _PREFIXES.get(key)
    if prefix is None:
        # a new number for a new pair, even one seen before and evicted: no price is ever found under
        # a prefix that named other (cluster, options)
        prefix = _PREFIXES[key] = next(_next_prefix)
        if len(_PREFIXES) > SITES_CACHE:
            _PREFIXES.popitem(last=False)
    return _Pricer(_placements(cluster, layout), options, prefix)


def nvlink_view(spec: ClusterSpec, peers: int) -> ClusterSpec | None:
    """The cluster as a kernel that joins at most ``peers`` consecutive GPUs by NVLink sees it
    (``Call.nvlink_peers``; DeepEP's normal kernels, rules/deepep.py): nodes of ``peers`` devices, each with
    its share of the node's NICs, on the same network with as many devices per leaf. The devices keep their
    numbers, so a placement means the same devices in both. None where the nodes already hold at most
    ``peers`` devices or do not split into such nodes (then the cluster prices the call as built)."""
    per = spec.devices_per_node
    if not peers or per <= peers or per % peers or spec.nics_per_node % (per // peers):
        return None
    k = per // peers
    network = replace(spec.network, nodes_per_leaf=spec.network.nodes_per_leaf * k)
    return replace(
        spec, num_nodes=spec.num_nodes * k, devices_per_node=peers, nics_per_node=spec.nics_per_node // k,
        network=network, name=f"{spec.name} (as nodes of {peers})",
    )  # fmt: skip


def priced_cluster(call: Call, cluster: Cluster) -> Cluster:
    """The cluster ``call`` is priced on: ``cluster``, or its ``nvlink_view`` for a kernel of fewer NVLink peers."""
    view = nvlink_view(cluster.spec, call.nvlink_peers) if call.nvlink_peers else None
    return cluster if view is None else cluster_for(view)


def _price_by_stage(call: Call, pricer: _Pricer) -> list[PricedCall]:
    """One row per set of stages whose groups sit alike on the cluster (issue 9 item 5): a row merges
    stages only when their prices are equal, so a stage whose groups stay inside one NVLink domain is not
    priced like one whose groups straddle two.

    Stage s's groups are stage 0's shifted by s times the pipeline stride (ranks are a product grid), so
    stages whose shift is a whole number of units of the cluster's symmetry (``tiling_unit``) are priced
    once; without a known symmetry, stages are grouped by where their groups sit on nodes
    (``node_signature``). Each class is priced on its own placement; classes are merged back when equal."""
    cluster = priced_cluster(call, pricer.places.cluster)
    if cluster is not pricer.places.cluster:  # priced on the view (nvlink_view), drawn on the cluster as built
        real = pricer.places.cluster
        rows = _price_by_stage(call, _pricer(cluster, pricer.places.layout, pricer.options))
        for row in rows:
            row.links = drawn_links(cluster, real, row.links)
        return rows
    # a group across the pipeline dimension (dp.grad_norm over the whole world) is the same one group whichever
    # stage lists it: one row, one group (per-stage rows each counted it: "2 groups" of all 512 ranks); a mirror group
    # (DualPipe's copies) likewise: twins r and pp - 1 - r issue one call, and its members are no pipeline shift of
    # stage 0's, so the symmetry classes do not hold
    if not call.group.pairs and ("pp" in call.group.dims or call.group.mirror):
        return [_price(call, pricer)]
    classes = _stage_classes(call, pricer.places, pricer.options)
    if len(classes) == 1:
        return [_price(call, pricer)]
    rows: dict[tuple, PricedCall] = {}
    for members in classes:
        pc = _price(call.on(members), pricer)
        key = _price_identity(pc.price)
        if key in rows:
            row = rows[key]
            row.call = replace(row.call, stages=tuple(sorted(row.call.stages + pc.call.stages)))
            row.num_groups += pc.num_groups
        else:
            rows[key] = pc
    return sorted(rows.values(), key=lambda r: r.call.stages[0])


def _price_identity(price: Price) -> tuple:
    """What two stage classes of one call must share to be one ledger row: the schedule, NCCL's algorithm,
    protocol and channels, the time and the bottleneck link's kind (a row never merges an NVLink price with
    a NIC price, even at an equal time)."""
    where = price.bottleneck.get("kind") if isinstance(price.bottleneck, dict) else None
    return (price.algorithm, price.nccl_algorithm, price.protocol, price.channels, price.time_s, where)


def _stage_classes(call: Call, places: _Placements, options: Options) -> list[tuple[int, ...]]:
    """The sets of a call's stages priced apart (``_price_by_stage``), in order of their first stage.

    Collective groups and pipeline sends alike: stage s's placement is stage 0's moved by s times the
    pipeline stride, so stages whose move is a whole number of symmetry units share a class. A send that
    wraps round the pipeline (the last stage's ``pp+1`` to stage 0 in an interleaved schedule, the first
    stage's ``pp-1``) is not such a move and is a class of its own. The embedding group (``ends``) is one
    placement whatever the stage."""
    stages, pairs = call.stages, call.group.pairs
    if len(stages) < 2 or pairs == "ends" or places.layout.par.pp < 2 or call.group.mirror:
        return [stages]  # a mirror group (DualPipe's copies): one row, as _price_by_stage prices it
    if options.device_map is not None:
        return _classes(call, places, options)
    key = ("classes", call.group, stages)  # the estimate and the plan both ask; a custom map is not in the key
    found = places._memo.get(key)
    if found is None:
        found = places._memo[key] = tuple(_classes(call, places, options))
    return list(found)


def _classes(call: Call, places: _Placements, options: Options) -> list[tuple[int, ...]]:
    stages, layout, cluster, pairs = call.stages, places.layout, places.cluster, call.group.pairs  # pp >= 2
    stride = _pp_stride(layout, call.group.expert)
    unit = None if options.device_map is not None else tiling_unit(cluster)
    if unit and pairs is None and cluster.num_nodes > 1 and places.within_node(call.group, stages):
        unit = cluster.per_node  # groups inside one node: any whole-node shift prices alike
    wraps = {"pp+1": layout.par.pp - 1, "pp-1": 0}.get(pairs)
    classes: dict[object, list[int]] = {}
    for s in stages:
        if s == wraps:
            key: object = ("wraps", s)
        else:
            key = (s * stride) % unit if unit else places.node_signature(call.group, s, options)
        classes.setdefault(key, []).append(s)
    return [tuple(members) for members in classes.values()]


def price_classes(call: Call, layout: RankLayout, cluster: Cluster, options: Options) -> list[tuple[int, ...]]:
    """The sets of ``call``'s stages the plan prices apart, each on its own placement (``_price_by_stage``):
    what the cost estimate (planner/estimate.py) charges the pricer for."""
    return _stage_classes(call, _placements(priced_cluster(call, cluster), layout), options)


def _pp_stride(layout: RankLayout, expert: bool) -> int:
    """Rank distance between neighbouring stages: the product of the sizes of the dimensions ordered faster
    than pp (layout.py: the order names the dimensions fastest first)."""
    stride = 1
    for dim in layout.order:
        if dim == "pp":
            return stride
        stride *= layout.sizes[expert][dim]
    return stride


def _price(call: Call, pricer: _Pricer) -> PricedCall:
    cluster, options = pricer.places.cluster, pricer.options
    site = pricer.places.site(call.group, call.stages, options)
    key = (pricer.prefix, call.op, call.message_bytes, site.price_key)
    cached = _PRICES.get(key)
    if cached is None:
        cached = _PRICES[key] = (_price_op(call.op, call.message_bytes, site.priced_on, cluster, options), {})
        if len(_PRICES) > PRICE_CACHE:
            _PRICES.popitem(last=False)
    price, relabelled = cached
    if not site.shift:  # priced where it sits: its links are the price's own, as described by the pricer
        relabelled.setdefault(0, price.links)
    elif site.shift not in relabelled:
        relabelled[site.shift] = [
            cluster.describe_link(cluster.translate_link(link["id"], site.shift))
            | {"bytes": link["bytes"], "busy_s": link["busy_s"], "utilisation": link["utilisation"]}
            for link in price.links
        ]
    if call.fixed_s or call.achieved != 1.0:
        price = with_kernel_time(price, call)
    links = [dict(link) for link in relabelled[site.shift]]  # each call's own: callers may edit them
    num_groups, group_size = site.devices.shape
    return PricedCall(call, num_groups, group_size, price, list(site.group_ranks), list(site.group_devices), links)


def price_calls(calls: list[Call], par: ParallelSpec, cluster_spec: ClusterSpec, options: Options = Options()):
    """Calls a caller adds to a plan's ledger (a serving engine's own per-step calls: rules/engine_step.py), priced
    and placed exactly as build_plan prices its own (the same pricer, caches and per-stage rows)."""
    pricer = _pricer(cluster_for(cluster_spec), layout_for(par), pricing_options(options))
    return [row for call in calls for row in _price_by_stage(call, pricer)]


def with_kernel_time(price: Price, call: Call) -> Price:
    """A price at its call's own kernel's time (ledger.kernel_time: the fraction of the rate it achieves, its fixed
    time); its bandwidths are those of the longer time."""
    time_s = kernel_time(call, price.time_s)
    scale = price.time_s / time_s if time_s else 0.0
    return replace(price, time_s=time_s, algbw_GBps=price.algbw_GBps * scale, busbw_GBps=price.busbw_GBps * scale)


def _price_op(op: Op, message: int, placement: np.ndarray, cluster: Cluster, options: Options) -> Price:
    top = options.links_per_call
    pricing = options.pricer
    library = dict(pricing=pricing, nccl_algo=options.nccl_algo, nccl_proto=options.nccl_proto)
    if options.algorithm == "auto" and pricing != "schedule":
        return price_call(op, message, placement, cluster, "auto", which=options.candidates, top_links=top, **library)
    if options.algorithm != "auto":
        try:
            return price_call(op, message, placement, cluster, options.algorithm, top_links=top)
        except CollectiveError as err:
            if "does not implement" not in str(err):
                raise
    return price_call(op, message, placement, cluster, "auto", which=options.candidates, top_links=top)


__all__ = [
    "Amounts",
    "Options",
    "Plan",
    "Prepared",
    "PricedCall",
    "StageTotals",
    "Totals",
    "build_plan",
    "canonical",
    "cluster_for",
    "ledger_memo",
    "neighbourhood",
    "placement_priced",
    "prepare",
    "price_calls",
    "price_classes",
    "priced_keys",
    "pricing_options",
    "setup",
]
