"""A plan: the ledger of one iteration, placed on the cluster and priced, with totals (CONTRACT.md)."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from collectives import CollectiveError, Op
from collectives.topology import Cluster, ClusterSpec, Price, price_call

from ._errors import SpecError
from .context import Context
from .layout import Group, RankLayout
from .ledger import Call
from .model import ModelSpec, validate_model
from .parallel import ParallelSpec, validate_parallel
from .rules import ledger
from .workload import WorkloadSpec, validate_workload


@dataclass(frozen=True)
class Options:
    algorithm: str = "auto"  # or an algorithm name, used for every call whose op it implements
    candidates: str = "library"  # library | all (see collectives.topology.select)
    contention: str = "neighbourhood"  # neighbourhood | full


@dataclass
class PricedCall:
    call: Call
    num_groups: int
    group_size: int
    price: Price

    def to_dict(self) -> dict:
        c, p = self.call, self.price
        return {
            "name": c.name,
            "parallelism": c.parallelism,
            "op": c.op.value,
            "phase": c.phase,
            "stages": list(c.stages),
            "group_size": self.group_size,
            "num_groups": self.num_groups,
            "message_bytes": int(c.message_bytes),
            "calls_per_iteration": int(c.calls_per_iteration),
            "algorithm": p.algorithm,
            "bytes_sent_per_rank": p.bytes_sent_per_rank,
            "bytes_received_per_rank": p.bytes_received_per_rank,
            "time_s": p.time_s,
            "dtype": c.dtype,
            "group_dims": list(c.group.dims) if not c.group.pairs else [c.group.pairs],
            "expert_grid": c.group.expert,
            "source": c.source,
            "placement": {
                "span": p.span,
                "nodes_per_group": p.nodes_per_group,
                "bottleneck": p.bottleneck.get("kind", "none"),
                "bottleneck_link": p.bottleneck.get("label", ""),
                "busbw_GBps": p.busbw_GBps,
                "algbw_GBps": p.algbw_GBps,
                "steps": p.steps,
            },
        }


@dataclass
class Plan:
    world_size: int
    num_microbatches: int
    calls: list[PricedCall]
    num_stages: int
    params_total: int
    warnings: list[str] = field(default_factory=list)

    def totals(self) -> dict:
        stages = [{"stage": s, "message_bytes": 0, "bytes_sent": 0, "time_s": 0.0} for s in range(self.num_stages)]
        by_par: dict[str, list[dict]] = {}
        for pc in self.calls:
            c, p = pc.call, pc.price
            amounts = (
                c.calls_per_iteration * c.message_bytes,
                c.calls_per_iteration * p.bytes_sent_per_rank,
                c.calls_per_iteration * p.time_s,
            )
            rows = by_par.setdefault(
                c.parallelism, [{"message_bytes": 0, "bytes_sent": 0, "time_s": 0.0} for _ in range(self.num_stages)]
            )
            for s in c.stages:
                for key, value in zip(("message_bytes", "bytes_sent", "time_s"), amounts, strict=True):
                    stages[s][key] += value
                    rows[s][key] += value
        busiest = max(stages, key=lambda r: r["time_s"])
        return {
            "time_s": busiest["time_s"],
            "busiest_stage": busiest["stage"],
            "per_stage": stages,
            # per parallelism: its share on the busiest stage
            "by_parallelism": {k: v[busiest["stage"]] for k, v in by_par.items()},
        }

    def to_dict(self) -> dict:
        return {
            "world_size": self.world_size,
            "num_microbatches": self.num_microbatches,
            "params_total": self.params_total,
            "calls": [c.to_dict() for c in self.calls],
            "totals": self.totals(),
            "warnings": self.warnings,
        }


def build_plan(
    model: ModelSpec, work: WorkloadSpec, par: ParallelSpec, cluster_spec: ClusterSpec, options: Options = Options()
) -> Plan:
    validate_model(model)
    validate_workload(work)
    cluster = cluster_for(cluster_spec)
    validate_parallel(par, model, work, cluster.num_devices)
    _validate_options(options)
    ctx = Context(model, work, par)
    layout = RankLayout(par)
    priced = [_price(call, layout, cluster, options) for call in ledger(ctx)]
    return Plan(par.world_size, ctx.micro_batches, priced, par.pp, model.total_params())


def _validate_options(options: Options) -> None:
    if options.candidates not in ("library", "all"):
        raise SpecError("options.candidates", f"must be 'library' or 'all', got {options.candidates!r}")
    if options.contention not in ("neighbourhood", "full"):
        raise SpecError("options.contention", f"must be 'neighbourhood' or 'full', got {options.contention!r}")


# ---- pricing with caches ------------------------------------------------------------------------------

_CLUSTERS: OrderedDict = OrderedDict()
_PRICES: OrderedDict = OrderedDict()
CLUSTER_CACHE, PRICE_CACHE = 16, 20_000


def cluster_for(spec: ClusterSpec) -> Cluster:
    """Clusters are immutable: built once per spec and reused (routing tables, link rates)."""
    cluster = _CLUSTERS.get(spec)
    if cluster is None:
        cluster = _CLUSTERS[spec] = Cluster(spec)
        if len(_CLUSTERS) > CLUSTER_CACHE:
            _CLUSTERS.popitem(last=False)
    return cluster


def _price(call: Call, layout: RankLayout, cluster: Cluster, options: Options) -> PricedCall:
    placement = layout.placement(call.group, list(call.stages))
    priced_on = placement if options.contention == "full" else canonical(neighbourhood(placement, cluster), cluster)
    key = (cluster.spec, call.op, call.message_bytes, options, priced_on.shape, priced_on.tobytes())
    price = _PRICES.get(key)
    if price is None:
        price = _price_op(call.op, call.message_bytes, priced_on, cluster, options)
        _PRICES[key] = price
        if len(_PRICES) > PRICE_CACHE:
            _PRICES.popitem(last=False)
    return PricedCall(call, num_groups=len(placement), group_size=placement.shape[1], price=price)


def _price_op(op: Op, message: int, placement: np.ndarray, cluster: Cluster, options: Options) -> Price:
    if options.algorithm != "auto":
        try:
            return price_call(op, message, placement, cluster, options.algorithm)
        except CollectiveError as err:
            if "does not implement" not in str(err):
                raise
    return price_call(op, message, placement, cluster, "auto", which=options.candidates)


def canonical(placement: np.ndarray, cluster: Cluster) -> np.ndarray:
    """The placement moved down by whole leaf units so that it starts in unit 0. Every unit of a fat-tree
    is wired alike, so the move changes no price, and the same call on another stage (or another DP
    replica) hits the price cache."""
    spec = cluster.spec
    if cluster.num_nodes == 1 or spec.network.topology != "fat_tree":
        return placement
    per_unit = spec.network.nodes_per_leaf * cluster.per_node
    return placement - (placement.min() // per_unit) * per_unit


def neighbourhood(placement: np.ndarray, cluster: Cluster) -> np.ndarray:
    """The groups whose traffic can share a link with group 0: those touching a node under the same leaf
    switches as group 0's nodes. Every link group 0 uses then carries exactly the load it carries with
    all groups running, so with symmetric layouts (every group placed like group 0, as rank orders make
    them) the busiest link is found at a fraction of the cost. Router networks (torus, dragonfly,
    hypercube) share links everywhere and are always priced in full."""
    spec = cluster.spec
    if len(placement) == 1 or (cluster.num_nodes > 1 and spec.network.topology != "fat_tree"):
        return placement
    per_unit = spec.network.nodes_per_leaf * cluster.per_node
    units = np.unique(placement[0] // per_unit)
    touches = np.isin(placement // per_unit, units).any(axis=1)
    return placement[touches]


__all__ = ["Group", "Options", "Plan", "build_plan", "canonical", "cluster_for", "neighbourhood"]
