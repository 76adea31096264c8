"""What a plan, an explore or one priced call will cost, estimated before any pricing (docs/hardening.md).

The estimate starts where the plan starts, :func:`planner.plan.prepare` (the same Context, with the cluster's
devices per node that DeepEP needs, the same layout and Cluster, and the ledger itself, which it hands on to
build_plan in ``Estimate.prepared`` so that a request builds it once), walks that ledger, and charges each
call for what the pricer will really do with it (:func:`pricing_path`, the mirror of
``planner.plan._price_op`` and ``collectives.topology.select.price_call``) on the groups the plan prices it
on (:func:`planner.plan.placement_priced`), once per stage class (:func:`planner.plan.price_classes`):

- NCCL's closed-form model (library pricing, the default on NVIDIA clusters): ``LIBRARY_WEIGHT`` per
  class, whatever the group size, plus the contention pass our library pricer adds (numpy over the groups
  priced, and a Python pass over group 0's NICs): ``CONTENTION_WEIGHT`` g n, memoised per placement;
- the step-by-step schedule pricer: what the schedules it builds materialise (:func:`schedule_work`).

Work units. One unit is about 15 ns of this machine's pricing engine (numpy 2.4, CPython 3.11, one core);
the weights were measured per algorithm on one group of n = 256 .. 65,536 ranks (docs/hardening.md):

- building and evaluating a call's candidate schedules: 70 n log2 n (npu-mesh-8: 69 at n = 16,384, 42 at
  65,536; dgx-h100: 25-47);
- routing every priced group: 4 g n log2 n (numpy over all transfers of a step class);
- in-network all-gather / reduce-scatter (NVLS / SHARP, when the cluster reduces in the network): 15 n^2
  (its layout keeps n blocks per rank: 2.4 s at n = 4,096);
- ``candidates: all``: 70 n^2 + g n^2 (at n = 4,096: halving-doubling allreduce 24 n^2, Bruck all-gather
  10 n^2, recursive doubling 7 n^2, in-network 9-14 n^2; the quadratic all-to-alls);
- the all-to-alls that list n(n-1) transfers (planner.explore.QUADRATIC: pairwise, Bruck): 60 n^2 + g n^2
  (the hierarchical one measured 18.5 n^2 of CPU and 613 MiB at n = 2,048 when it listed them). The direct
  (mesh) reduce-scatter, all-gather, allreduce and the direct and hierarchical all-to-alls are all-pairs
  classes, priced in O(g n) (collectives/topology/pricing.py route_all_pairs), and cost what a ring does;
- placing a call: g n (numpy arrays over the whole world, and the answer's rank lists);
- the plan's own work besides pricing (validation, ledger, step time, memory, the answer): ``PLAN_WEIGHT`` +
  ``LEDGER_CALL_WEIGHT`` a ledger call, fitted on this service's own plans with their prices memoised (batch14);
- a batch (:class:`BatchWork`): what the service memoises by value, one call's price on one placement and one
  contention pass over one placement, charged to the first plan that needs it, while the batch's keys fit half
  of that cache; measured / estimated CPU of 1,000-config batches 0.88-1.93 at 128-16,384 GPUs (docs/search.md);
- building a network's routing: the network plug-in's ``work`` (:func:`network_work`; router networks are
  routed by a breadth-first search from each router: num_nodes^2 router visits, x4 for dragonfly and
  hypercube), against their own budget;
- routing a schedule-priced call's node pairs the first time: the network plug-in's ``pairs_work`` over the pairs
  its candidates meet (:func:`routing_work`: a router network's Python pass over its links a pair; 0 on fat-trees).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from itertools import count
from typing import ClassVar

import numpy as np

from collectives import CollectiveError, Op
from collectives.algorithms import Request, lookup
from collectives.topology import Cluster, ClusterSpec, candidates
from collectives.topology.library.pricer import CONTENTION_CACHE
from collectives.topology.networks import network_type
from collectives.topology.select import resolve_pricing

from ._errors import SpecError
from .explore import QUADRATIC, QUADRATIC_LIMIT
from .memory import MAX_STAGE_BYTES, fewer_tokens
from .model import ModelSpec
from .parallel import ParallelSpec
from .pipeline_jitter import CELL_UNITS, span_work
from .pipeline_jitter import call_work as jitter_work
from .plan import (
    MAX_PARAMS,
    PRICE_CACHE,
    SITES_CACHE,
    Options,
    Prepared,
    ledger_memo,
    placement_priced,
    prepare,
    price_classes,
    priced_keys,
    pricing_options,
)
from .workload import WorkloadSpec

# Every bound is far above real jobs and keeps byte counts inside int64 (numpy's) with room for sums:
MAX_MESSAGE = 1 << 46  # bytes of one call, as the price endpoint's message_bytes (app/schemas/base.py)

# weights of the work model, in ~15 ns units (module docstring: what each was measured on)
LIBRARY_WEIGHT = 4_000  # one call through NCCL's model, any group size (~60 us measured: docs/hardening.md)
# x g n of the groups priced: the library pricer's contention pass over them (library/pricer.py _contention,
# memoised per placement): 100-170 units per rank over many groups on 131,072 H100, 156-520 for one group
# of 16,384-131,072 ranks (its Python pass over group 0's NICs and leaf bundles); charged at the top
CONTENTION_WEIGHT = 400
SCHEDULE_WEIGHT = 70  # x n log2 n: a call's candidate schedules (npu-mesh-8, 16,384 ranks: 236 ms = 69 n log2 n)
ROUTE_WEIGHT = 4  # x groups x n log2 n
BLOCKED_WEIGHT = 15  # x n^2: in-network all-gather / reduce-scatter
ALLTOALL_WEIGHT = 60  # x n^2: the all-to-alls of explore.QUADRATIC (memory-bound: 613 MiB at n = 2,048)
ALL_WEIGHT = 70  # x n^2: every algorithm (halving-doubling, the quadratic all-to-alls, ...)
HALVING_WEIGHT = 60  # x n^2: what `all` still costs once the quadratic ones are left out (explorer)
# A plan's ``candidates: all`` call (``every_work``: the pricer builds and evaluates each candidate schedule of the op,
# collectives/topology/select.py ``_price_schedule``): least squares on relative error over 123 cold
# ``price_call(which="all", pricing="schedule")`` runs on DGX H100 placements (allreduce, all-gather, reduce-scatter,
# broadcast, all-to-all; n 2-2,048 ranks on g 1-1,024 groups, 256 MiB, the schedule and route memos cleared; CPU
# time, load 1-4; speed15, docs/search.md "(speed15)"): measured / charged 0.51-3.5 a call, median 1.13, where
# 70 n^2 + g n^2 (fitted at n = 4,096) charged n 128-1,024 at 6-10x and n 8-16 at 0.04-0.15x (no candidate's fixed
# cost was charged). The band stated is 0.5-4.6: the all-gather at n = 2,048 measured 4.40 (load 6-8; review r15c:
# 4.55), its three block-listing candidates (Bruck, recursive doubling, in-network) sorting 4M-entry block lists
# past the caches; the reduce-scatter and allreduce there 2.1-2.2 (mend15d, tests/app/test_estimate_candidates.py
# holds the worst corner of each network type). Router networks add their node pairs' routing (routing_work).
EVERY_CANDIDATE_WEIGHT = 8_600  # a candidate schedule built and evaluated (0.13 ms; n 8: 0.1-0.5 ms a candidate)
EVERY_CANDIDATE_RANK_WEIGHT = 240  # x n, a candidate: its schedule's arrays over the group
EVERY_CANDIDATE_PLACED_WEIGHT = 5  # x g n, a candidate: routing every group (allreduce on 1,024 groups of 8: 12 ms)
EVERY_SQUARE_WEIGHT = 4  # x n^2: the op's candidates together (allreduce 750 ms at n 2,048: 12 n^2)
# x n^2 and x g n^2: the quadratic all-to-alls (explore.QUADRATIC: pairwise, Bruck list n(n - 1) transfers; all-to-all
# on 1,024 ranks 572 ms, on 8 groups of 1,024 1.83 s)
EVERY_QUADRATIC_WEIGHT = 36
EVERY_QUADRATIC_GROUP_WEIGHT = 7
# a schedule priced step by step (no closed-form step classes: ring broadcast's pipelined chain, K + n - 2 steps,
# collectives/algorithms/ring.py): 2,650 units a step and 12 a placed rank (ring broadcast at n 1,024: 88 ms)
STEPWISE = frozenset({("ring", Op.BROADCAST)})
EVERY_STEP_WEIGHT = 2_650
EVERY_STEP_PLACED_WEIGHT = 12
# what a plan costs besides pricing (validation, its ledger, step time, memory, the summary answer), all its prices
# memoised: least squares on 2,100 plans of bench/batch_scale.py (Llama-3 70B on 512 H100, DeepSeek-V3 on 256 H800,
# Llama-3 8B on 16 H100; their later cycles, prices cached; CPU time, load 4-6): 1.35 ms + 78 us a ledger call
# (docs/search.md, batch14); measured / fitted p5 0.49, p95 1.72
PLAN_WEIGHT = 90_000
LEDGER_CALL_WEIGHT = 5_000
# ranks of a call's placement a unit: planner/layout.py ``RankLayout.placement`` over a 16,384-GPU world measured
# 0.63 ns a rank (20 Llama-3 70B layouts of bench/batch_scale.py, every call's placement, memo cleared; 9.4 ns at
# 512 GPUs, where its per-call numpy steps dominate, which LEDGER_CALL_WEIGHT holds); 1 unit a rank charged 24x its
# CPU and refused 1,000 configs on 16,384 GPUs (batch14; speed15, docs/search.md). Reproduced by bench/placing_cost.py
# (mend15d, load 3-6): 0.57 ns a rank at 16,384 GPUs (15 / 0.57 = 26 ranks a unit at cost), 11.3 at 512; 16 keeps
# ~1.6x over the 16,384-GPU cost
PLACED_PER_UNIT = 16


@dataclass
class Estimate:
    """Work units of a request, and the largest contributor (named in a refusal)."""

    units: int = 0
    biggest: str = ""
    biggest_units: int = 0
    parts: list[str] = field(default_factory=list)
    # the plan's set-up and ledger the estimate walked (planner.plan.prepare): build_plan(..., prepared=)
    # prices these instead of building them again
    prepared: Prepared | None = field(default=None, repr=False, compare=False)
    # the parts of ``units`` the service memoises by value across requests (BatchWork): (kind, key, units), kind
    # "price" (planner.plan's price cache) or "contention" (the library pricer's contention pass)
    shared: tuple = field(default=(), repr=False, compare=False)

    def add(self, units: int, what: str) -> None:
        self.units += int(units)
        if units > self.biggest_units:
            self.biggest, self.biggest_units = what, int(units)


@dataclass(frozen=True)
class PricingPath:
    """What the pricer does with one call: NCCL's closed form (``library``), or the schedules it builds and
    prices step by step (``algorithms``; ``every``: all registered ones, ``candidates: all``)."""

    library: bool
    algorithms: tuple[str, ...] = ()
    every: bool = False


def _log2(n: int) -> int:
    return max(int(n - 1).bit_length(), 1)


def _implements(algorithm: str, op: Op) -> bool:
    try:
        lookup(algorithm, op)
    except CollectiveError:
        return False
    return True


def pricing_path(
    op: Op, n: int, cluster: Cluster, algorithm: str = "auto", which: str = "library", pricing: str = "auto"
) -> PricingPath:
    """What ``collectives.topology.select.price_call`` does with these arguments: NCCL's model where it
    applies (``auto`` on an NVIDIA cluster, an op NCCL's tuner prices, more than one rank), else the named
    schedule, else every candidate schedule (``which``)."""
    if algorithm == "auto" and n > 1:
        try:
            library = resolve_pricing(pricing, cluster, op) == "library"
        except CollectiveError:  # price_call refuses it with its own message
            library = True
        if library:
            return PricingPath(True)
    if algorithm != "auto":
        return PricingPath(False, (algorithm,))
    return PricingPath(False, candidates(op, cluster, which), every=which == "all")


def plan_pricing_path(op: Op, n: int, cluster: Cluster, options: Options) -> PricingPath:
    """What the plan's pricer does with one call (``planner.plan._price_op``): ``candidates: all`` compares
    every schedule step by step unless library pricing is asked for; a pinned algorithm is priced step by
    step where it implements ``op``, else the call is priced as under ``auto`` step by step."""
    pricing = options.pricer
    if options.algorithm == "auto" and pricing != "schedule":
        return pricing_path(op, n, cluster, "auto", options.candidates, pricing)
    if options.algorithm != "auto" and _implements(options.algorithm, op):
        return PricingPath(False, (options.algorithm,))
    return pricing_path(op, n, cluster, "auto", options.candidates, "schedule")


def in_network(cluster: ClusterSpec) -> bool:
    return cluster.intra.in_network_reduction or cluster.network.in_network_reduction


def schedule_work(op: Op, n: int, g: int, path: PricingPath, in_net: bool = False, sizes: int = 1,
                  message: int = MAX_MESSAGE) -> int:  # fmt: skip
    """Work units to price one call of ``op`` on ``g`` groups of ``n`` ranks along ``path``, at ``sizes``
    message sizes (the explorer prices each, and leaves the quadratic schedules out above
    planner.explore.QUADRATIC_LIMIT transfers); ``in_net``: the cluster can reduce in its switches."""
    if n <= 1:
        return 0
    if path.library:  # plus the contention pass, once per placement: contention_work
        return LIBRARY_WEIGHT * sizes
    log = _log2(n)
    units = SCHEDULE_WEIGHT * n * log + ROUTE_WEIGHT * g * n * log
    if in_net and op in (Op.ALLGATHER, Op.REDUCESCATTER) and "in_network" in path.algorithms:
        units += BLOCKED_WEIGHT * n * n
    if path.every and path.algorithms and sizes == 1:  # a plan's ``candidates: all`` (speed15)
        return every_work(op, n, g, path.algorithms, message)
    if path.every:  # the explorer: every schedule at every size (its own calibration at n = 4,096)
        quadratic_ok = sizes == 1 or n * n * g <= QUADRATIC_LIMIT
        units += (ALL_WEIGHT + g) * n * n if quadratic_ok else HALVING_WEIGHT * n * n
    elif any((name, op) in QUADRATIC for name in path.algorithms):
        units += (ALLTOALL_WEIGHT + g) * n * n
    return units * sizes


def every_work(op: Op, n: int, g: int, algorithms: tuple[str, ...], message: int = MAX_MESSAGE) -> int:
    """Work units of pricing one call of ``op`` on ``g`` groups of ``n`` ranks with each of ``algorithms`` (its
    ``candidates: all``), measured (EVERY_* weights): each candidate's fixed cost, its arrays over n ranks and its
    routing of g n; n^2 for the op's candidates, or the quadratic all-to-alls' n^2 and g n^2 where they are among
    them; and each step of a schedule priced step by step (STEPWISE: its registered closed-form step count at the
    call's ``message`` bytes, ``Implementation.cost``) with its g n."""
    k = len(algorithms)
    units = k * (EVERY_CANDIDATE_WEIGHT + EVERY_CANDIDATE_RANK_WEIGHT * n + EVERY_CANDIDATE_PLACED_WEIGHT * g * n)
    if any((name, op) in QUADRATIC for name in algorithms):
        units += (EVERY_QUADRATIC_WEIGHT + EVERY_QUADRATIC_GROUP_WEIGHT * g) * n * n
    else:
        units += EVERY_SQUARE_WEIGHT * n * n
    for name in algorithms:
        if (name, op) in STEPWISE:
            steps = lookup(name, op).cost(Request(op, n, max(message, 1), 1)).steps  # its pipeline chunks' steps
            units += EVERY_STEP_WEIGHT * steps + EVERY_STEP_PLACED_WEIGHT * g * n
    return units


# The schedules whose transfers join every pair of a group's ranks: the direct ("mesh") reduce-scatter, all-gather,
# allreduce and all-to-all and the hierarchical all-to-all (collectives/algorithms/direct.py, alltoall.py,
# hierarchical.py: ``StepClass.every_pair``), and the quadratic all-to-alls that list them (explore.QUADRATIC)
ALL_PAIRS = (
    QUADRATIC
    | {("direct", op) for op in (Op.REDUCESCATTER, Op.ALLGATHER, Op.ALLREDUCE, Op.ALLTOALL)}
    | {("hierarchical", Op.ALLTOALL)}
)
# The schedules that pair rank i with i +- 2^k, k < log2 n (collectives/algorithms/halving_doubling.py,
# recursive_doubling.py, bruck.py, swing.py): n log2 n pairs; the others (rings, trees, a root's sends) ~2 n
EXCHANGES = frozenset({"halving_doubling", "recursive_doubling", "bruck", "swing"})


def routed_pairs(op: Op, nodes, algorithms: tuple[str, ...]) -> int:
    """Distinct (source, destination) node pairs the schedule pricer routes for ``algorithms`` of ``op`` over groups
    that span ``nodes`` (one row of node ids a group): every ordered pair of a group's m nodes where an all-pairs
    schedule is among them (ALL_PAIRS), m log2 m where a distance-doubling one is (EXCHANGES; with a ring's m), else
    2 m (a ring and a tree); each distinct set of nodes once, as the network memoises a path per node pair
    (bench/every_work_cost.py --cluster: the torus and dragonfly points, docs/search.md "(mend15d)")."""
    rows = np.unique(np.sort(np.atleast_2d(nodes), axis=1), axis=0)
    m = (np.diff(rows, axis=1) != 0).sum(axis=1) + 1  # nodes of each distinct set
    if any((name, op) in ALL_PAIRS for name in algorithms):
        return int((m * (m - 1)).sum())
    per = np.maximum(np.ceil(np.log2(np.maximum(m, 2))), 1).astype(np.int64) + 1 if EXCHANGES & set(algorithms) else 2
    return int(np.minimum(m * (m - 1), per * m).sum())


def routing_work(cluster: Cluster, placement, op: Op, path: PricingPath, routed: set | None = None) -> int:
    """Routing a schedule-priced call's transfers on ``placement`` (groups x ranks) the first time: the network
    plug-in's ``pairs_work`` over :func:`routed_pairs` (a router network routes each node pair once, a Python pass
    over its links: review r15c's 256-router torus, ``candidates: all``, charged 145x under its CPU); 0 for NCCL's
    model and for networks routed vectorised (fat-trees: in the EVERY_* fit). ``routed``: the node groups a plan's
    earlier calls routed all pairs of, as the network's path memo holds them."""
    # the explorer's path lists no candidates: it prices every registered schedule (at every size, one routing)
    algorithms = path.algorithms or (candidates(op, cluster, "all") if path.every else ())
    if path.library or not algorithms or cluster.network.pairs_work(1) == 0:
        return 0
    nodes = np.unique(np.sort(cluster.node_of(np.asarray(placement)), axis=1), axis=0)
    key = nodes.tobytes()
    if routed is not None and key in routed:
        return 0
    if routed is not None and any((name, op) in ALL_PAIRS for name in algorithms):
        routed.add(key)
    return cluster.network.pairs_work(min(routed_pairs(op, nodes, algorithms), cluster.num_nodes**2))


def contention_work(path: PricingPath, g: int, n: int) -> int:
    """The library pricer's contention pass over ``g`` groups of ``n`` ranks (memoised per placement)."""
    return CONTENTION_WEIGHT * g * n if path.library and n > 1 else 0


def placing_work(placed: int, n: int) -> int:
    """Placing a call's ``placed`` ranks (numpy over the world's rank arrays, memoised per layout: PLACED_PER_UNIT
    ranks a unit) and its group 0's ``n`` ranks listed (the answer's ``group_ranks`` and ``group_devices``, copied
    into every plan and written in a full answer: a unit a rank)."""
    return placed // PLACED_PER_UNIT + n


def call_work(op: Op, g: int, n: int, path: PricingPath, in_net: bool, placed: int, classes: int = 1,
              sizes: int = 1, contend: bool = True, message: int = MAX_MESSAGE) -> int:  # fmt: skip
    """One call priced on ``g`` groups of ``n`` ranks: pricing on each of its ``classes`` stage classes
    (:func:`schedule_work`), its contention pass unless another call on the same groups paid it (``contend``),
    and placing and describing all its groups, ``placed`` ranks (:func:`placing_work`)."""
    units = classes * schedule_work(op, n, g, path, in_net, sizes, message) + placing_work(placed, n)
    return units + (classes * contention_work(path, g, n) if contend else 0)


def price_estimate(op: Op, g: int, n: int, cluster: Cluster, algorithm: str, which: str, pricing: str,
                   placement=None) -> Estimate:  # fmt: skip
    """The estimate of pricing one call on ``g`` concurrent groups of ``n`` ranks (POST /v1/collectives/price):
    the path ``price_call`` takes with these arguments, as a plan's call is charged, with the routing of the
    ``placement``'s node pairs on a router network (:func:`routing_work`; review r15c: a torus allreduce of 256
    ranks, ``candidates: all``, 6.5 s of CPU charged 13.6 ms)."""
    path = pricing_path(op, n, cluster, algorithm, which, pricing)
    est = Estimate()
    units = call_work(op, g, n, path, in_network(cluster.spec), g * n)
    if placement is not None:
        units += routing_work(cluster, placement, op, path)
    est.add(units, f"{op.value}: {g} groups of {n} ranks")
    return est


def network_work(cluster: ClusterSpec) -> int:
    """Work of building the network's routing: the network plug-in's own estimate (collectives/topology/
    networks/, ``work``: a torus / dragonfly / hypercube is routed by a search from every router)."""
    return network_type(cluster.network.topology).work(cluster)


def estimate(
    model: ModelSpec,
    work: WorkloadSpec,
    par: ParallelSpec,
    cluster_spec: ClusterSpec,
    options: Options | None = None,
    call: str | None = None,
    stage: int | None = None,
    sizes: int = 1,
) -> Estimate:
    """The estimate of planning (``call`` None), or of exploring the first call named ``call`` (on ``stage``)
    at ``sizes`` message sizes with every algorithm, as planner.explore does. Validates as build_plan does
    (the same set-up), and refuses models and calls too large for 64-bit byte counts."""
    options = options or Options()
    prepared = prepare(model, work, par, cluster_spec, options)
    # the walk reads the ledger, the layout, the cluster and these: memoised with the context's ledger
    memo, key = ledger_memo(prepared.ctx), (cluster_spec, options, call, stage, sizes)
    walked = memo.get(key) if memo is not None else None
    if walked is None:
        walked = _walk(prepared, cluster_spec, options, call, stage, sizes)
        if memo is not None:
            memo[key] = walked
            if len(memo) > WALKS_PER_CONTEXT:
                del memo[next(iter(memo))]
    units, biggest, biggest_units, parts, shared = walked
    est = Estimate(units, biggest, biggest_units, list(parts), prepared=prepared, shared=shared)
    if call is None:
        _documents_work(est, prepared.ctx)
        _order_work(est, prepared.ctx)
        own = PLAN_WEIGHT + LEDGER_CALL_WEIGHT * len(prepared.calls)
        est.add(own, "the plan's ledger, step time, memory and answer")
    return est


def _documents_work(est: Estimate, ctx) -> None:
    """The wait for the slowest packed micro-batch ("dp_balanced"): the schedule's order run over fixed-seed draws
    (planner/pipeline_jitter.py call_work: its cells, at most CELLS, CELL_UNITS a unit), for the same (schedule, pp,
    v, micro-batches) the step runs it on."""
    work, par = ctx.work, ctx.par
    if not (ctx.training and work.document_packing == "dp_balanced" and work.document_lengths):
        return
    m = ctx.micro_batches
    cells = jitter_work(par.pipeline_schedule, par.pp, max(1, par.chunks_per_rank), m)
    what = f"workload.document_packing: the {par.pipeline_schedule} order over {m} micro-batches"
    est.add(cells // CELL_UNITS, f"{what} at pp {par.pp} (planner/pipeline_jitter.py)")


def _order_work(est: Estimate, ctx) -> None:
    """The step's pipeline at unequal ranks (vsched12; mend12a, review r12a #2): the zero-bubble and DualPipe orders
    run once as a list schedule (planner/pipeline_jitter.py span_work: the structure laid out and one column; a
    plan runs one: its stages' passes, memoised), for the same (schedule, pp, v, micro-batches) the step runs it on;
    nothing where the schedule is not priced by its order or its run is over ORDER_OPS."""
    par = ctx.par
    if not ctx.training:
        return
    cells = span_work(par.pipeline_schedule, par.pp, max(1, par.chunks_per_rank), ctx.micro_batches)
    if cells:
        what = f"the {par.pipeline_schedule} order over {ctx.micro_batches} micro-batches at pp {par.pp}"
        est.add(cells // CELL_UNITS, f"{what} (planner/pipeline_jitter.py order_span)")


def _check_traffic(calls, training: bool) -> None:
    """Each stage's bytes in one iteration (the answer's ``totals.per_stage``: calls x bytes, summed) within
    memory.MAX_STAGE_BYTES: every call within MAX_MESSAGE, but times its micro-batches (2^24 at most) and layers the
    sum left int64 (hostile15)."""
    stages: dict[int, int] = {}
    for c in calls:
        for s in c.stages:
            stages[s] = stages.get(s, 0) + c.calls_per_iteration * c.message_bytes
    stage, total = max(stages.items(), key=lambda item: item[1], default=(0, 0))
    if total > MAX_STAGE_BYTES:
        raise SpecError(
            "workload",
            f"stage {stage} would move {total:,} bytes of messages in one iteration, over {MAX_STAGE_BYTES:,} (2^57, "
            f"the most a stage is planned with: past it the byte counts overflow 64 bits); {fewer_tokens(training)}",
        )


WALKS_PER_CONTEXT = 16  # (cluster, options, explored call) estimates kept per memoised context


def _walk(prepared: Prepared, cluster_spec: ClusterSpec, options: Options, call: str | None, stage: int | None,
          sizes: int) -> tuple:  # fmt: skip
    """The estimate's walk over the prepared ledger: (units, biggest, biggest_units, parts)."""
    layout, cluster = prepared.layout, prepared.cluster
    est, in_net, paths, contended, shared, seen = Estimate(), in_network(cluster_spec), {}, set(), [], set()
    routed: set = set()  # node groups whose pairs the network's path memo holds (routing_work)
    _check_traffic(prepared.calls, prepared.ctx.training)
    pair = (cluster_spec, pricing_options(options))  # the price cache's prefix (plan.py _pricer)
    for c in prepared.calls:
        if c.message_bytes > MAX_MESSAGE:
            raise SpecError(
                "workload",
                f"call {c.name} would move {c.message_bytes:,} bytes per call, over {MAX_MESSAGE:,} "
                "(2^46, 64 TiB: the largest message priced; products of batch, sequence, width and experts "
                "past it overflow 64-bit byte counts)",
            )
        if call is not None and (c.name != call or (stage is not None and stage not in c.stages)):
            continue
        priced_on = placement_priced(c, layout, cluster, options)
        g, n = priced_on.shape
        if call is None:
            path = paths.get((c.op, n)) or paths.setdefault((c.op, n), plan_pricing_path(c.op, n, cluster, options))
            keys = priced_keys(c, layout, cluster, options)  # before price_classes, which may turn to a view
            classes = price_classes(c, layout, cluster, options)
        else:  # the explorer: every schedule at every size, and NCCL's pairs where its model applies
            path, classes = PricingPath(False, every=True), [c.stages]
        placed = layout.placement(c.group, c.stages).size
        first = (c.group, tuple(classes)) not in contended  # calls on the same groups share one contention pass
        contended.add((c.group, tuple(classes)))
        units = call_work(c.op, g, n, path, in_net, placed, len(classes), sizes, first, c.message_bytes)
        units += routing_work(cluster, priced_on, c.op, path, routed)
        if call is None:  # what the price cache and the contention memo hold: one real entry per class's key
            # the estimate's classes (price_classes) split over the cache's keys (priced_keys, as many or fewer)
            per_key = len(classes) / max(len(keys), 1)
            priced = round(per_key * schedule_work(c.op, n, g, path, in_net, sizes, c.message_bytes))
            entries = [("price", pair, (c.op, c.message_bytes, k), priced) for k in keys]
            if first and path.library and n > 1:
                entries += [("contention", None, k, round(per_key * contention_work(path, g, n))) for k in keys]
            units -= _repeats(entries, shared, seen)
        how = "NCCL model" if path.library else "schedules"
        est.add(units, f"{c.name} ({c.op.value} on {g} groups of {n} ranks, {how})")
        if call is not None:
            break
    return est.units, est.biggest, est.biggest_units, tuple(est.parts), tuple(shared)


def _repeats(entries: list, shared: list, seen: set) -> int:
    """The units of ``entries`` (one call's price and contention keys) that an earlier call of the same plan already
    put in the service's caches (``seen``): the plan prices a key once (plan.py ``_PRICES``, the library pricer's
    ``_CONTENTION``), so a repeat costs a look-up only, not charged (speed15: a ledger's ~10 TP calls of one shape
    and message were each charged their pricing); the others are appended to ``shared`` (``BatchWork``)."""
    repeated = 0
    for entry in entries:
        key = (entry[0], entry[2])
        if key in seen:
            repeated += entry[3]
        else:
            seen.add(key)
            shared.append(entry)
    return repeated


class _Fifo:
    """A simulated cache of keys that evicts its oldest entry past ``capacity`` and does not reorder on a hit, as
    the service's caches (plan.py ``_PRICES``, ``_PREFIXES``; collectives/topology/library/pricer.py
    ``_CONTENTION``: ``OrderedDict.get`` then ``popitem(last=False)``)."""

    def __init__(self, capacity: int) -> None:
        self.capacity, self.held = capacity, OrderedDict()

    def get(self, key, make=bool) -> tuple[bool, object]:
        """(whether ``key`` was held, its value); a miss inserts ``make()`` under it, evicting the oldest."""
        if key in self.held:
            return True, self.held[key]
        value = self.held[key] = make()
        if len(self.held) > self.capacity:
            self.held.popitem(last=False)
        return False, value


class BatchWork:
    """The estimated work of a batch of plans (app/routers/plan.py): each plan's estimate, less what the service
    memoises by value and an earlier plan of the batch already paid for and the cache still holds when this plan
    runs (``Estimate.shared``: one price of one call on one stage class's placement, one contention pass over one
    placement). The caches are simulated in the batch's order, one real entry per key, at half their capacity (the
    other half for concurrent requests): the price cache (``PRICE_CACHE``), the contention memo
    (``CONTENTION_CACHE``) and the (cluster, options) prefixes that key every price (plan.py ``_pricer``,
    ``SITES_CACHE``: an evicted pair comes back under a new prefix, so no price stored under the old one is found
    again). A key the simulation has evicted is charged again, as the work redoes it."""

    BOUNDS: ClassVar[dict[str, int]] = {
        "price": PRICE_CACHE // 2,
        "contention": CONTENTION_CACHE // 2,
        "pair": SITES_CACHE // 2,
    }

    def __init__(self) -> None:
        self.total = Estimate()
        self.caches = {kind: _Fifo(bound) for kind, bound in self.BOUNDS.items()}
        self._prefixes = count()
        self.missed = dict.fromkeys(self.BOUNDS, 0)  # shared entries charged: the simulated caches' misses

    def add(self, est: Estimate, what: str) -> int:
        """Charge one plan's estimate; returns the units charged."""
        units, prefixes, pairs = est.units, {}, self.caches["pair"]
        for pair in dict.fromkeys(pair for _, pair, _, _ in est.shared if pair is not None):  # as _pricer, first
            prefixes[pair] = pairs.get(pair, lambda: next(self._prefixes))[1]
        for kind, pair, key, part in est.shared:
            if self.caches[kind].get((prefixes.get(pair), key))[0]:
                units -= part
            else:
                self.missed[kind] += 1
        self.total.add(units, what)
        return units


__all__ = [
    "MAX_MESSAGE",
    "MAX_PARAMS",
    "BatchWork",
    "Estimate",
    "PricingPath",
    "call_work",
    "contention_work",
    "estimate",
    "every_work",
    "in_network",
    "network_work",
    "placing_work",
    "plan_pricing_path",
    "price_estimate",
    "pricing_path",
    "routed_pairs",
    "routing_work",
    "schedule_work",
]
