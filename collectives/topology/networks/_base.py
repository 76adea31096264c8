"""What a network between nodes is to the rest of the system: one class per network, registered by name.

A network plug-in is built once per cluster (``Cluster.network``) from the cluster's spec and answers
everything the cluster, the pricers, the cost guard and the drawing ask of the network, so none of them
compares a network's name:

- **rules** (``validate``, a class method): every rule the spec's ``network`` block must meet, with its
  numbers, raising CollectiveError naming the field (``network.dims``);
- **work** (``work`` / ``work_rule``, class methods): the units the service's cost guard charges to build the
  network's routing before any cluster exists (0: nothing beyond the pricing the guard already charges), and
  ``pairs_work``: the units of routing node pairs for the first time (the schedule pricer's transfers);
- **link table** (``families``): the network's own link families after the NICs, as
  (name, kind, count, capacity GB/s, latency s); ``attach`` names the vertex NIC i's up-link reaches, and
  ``endpoints`` the two vertices of the network's own link i of a family (as ``Cluster.graph`` names them);
- **routing** (``route``): bytes per network link for transfers between NICs, and the path latency;
- **in-network reduction** (``reduces``): whether the network's switches reduce (SHARP, NCCL CollNet);
- **symmetry** (``unit_nodes``, ``nodes_alike_in_unit``, ``link_shifts``): symmetry.py prices with it;
- **library pricer** (``ring_links``): links past the NICs a ring of nodes loads, in NCCL's model;
- **drawing** (``draw_aggregated``, ``capped_family``): the aggregated view of view.py.

A spec's ``Network`` block is one flat dataclass (spec.py) holding every network's parameters; a plug-in
reads the fields it names in ``fields`` and ignores the others.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from ..._errors import CollectiveError

Families = list[tuple[str, str, int, float, float]]  # (name, kind, count, capacity_GBps, latency_s)


class NetworkModel:
    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    fields: ClassVar[tuple[str, ...]] = ()  # the spec.Network fields this network reads
    # the family whose links the detailed view caps at view.MAX_ROUTER_LINKS (a network whose paths fan out)
    capped_family: ClassVar[str | None] = None
    connects_nodes: ClassVar[bool] = True  # False: a one-node cluster only (spec.validate_cluster says so)
    # symmetry (symmetry.py): nodes per unit of symmetry, None when the network has none
    unit_nodes: int | None = None
    nodes_alike_in_unit = False

    def __init__(self, spec):
        self.spec, self.network, self.num_nodes = spec, spec.network, spec.num_nodes

    # ---- before any cluster is built -----------------------------------------------------------------
    @classmethod
    def validate(cls, spec) -> None:
        """Every rule of this network for ``spec`` (a ClusterSpec of more than one node)."""

    @classmethod
    def work(cls, spec) -> int:
        """Work units (planner/estimate.py: about 15 ns each) of building this network's routing for ``spec``."""
        return 0

    @classmethod
    def work_rule(cls, spec) -> str:
        """How ``work`` was counted, for a refusal: 'a torus of 1024 routers is routed by ...'."""
        return f"a {cls.name} of {spec.num_nodes} nodes costs {cls.work(spec):,} units to route"

    def pairs_work(self, pairs: int) -> int:
        """Work units of routing ``pairs`` distinct (source, destination) node pairs for the first time (``route``
        over transfers between them, paths memoised per pair). 0: routed vectorised over the transfers, in the work
        the cost guard already charges per rank (a fat-tree's levels, fitted on DGX H100: planner/estimate.py)."""
        return 0

    # ---- the link table --------------------------------------------------------------------------------
    def families(self) -> Families:
        return []

    def attach(self, nic: int) -> tuple:
        """The vertex global NIC ``nic``'s up-link reaches (and its down-link leaves)."""
        raise CollectiveError("network", f"network {self.name!r} has no links")

    def endpoints(self, family: str, i: int) -> tuple[tuple, tuple]:
        raise CollectiveError("link", f"network {self.name!r} has no link family {family!r}")

    # ---- routing ---------------------------------------------------------------------------------------
    def route(self, loads, start, nic_src, nic_dst, node_src, node_dst, nbytes) -> float:
        """Add the bytes of transfers NIC nic_src[i] -> nic_dst[i] (on nodes node_src[i] -> node_dst[i]) to
        ``loads`` on the network's links (``start(family)``: the family's first link id); ``nbytes`` None is
        one byte each. Returns the longest path's latency past the NICs."""
        raise CollectiveError("network", f"network {self.name!r} cannot route between nodes")

    def route_all_pairs(self, loads, start, nic, node, block, out, into) -> float:
        """An all-pairs class between nodes (collectives/topology/pricing.py ``route_all_pairs``): every rank x
        sends ``out[x] + into[y]`` to every rank y of its ``block`` on another node. Adds the bytes on the
        network's links and returns the longest path's latency, as ``route`` would for those transfers. By
        default through ``route`` on the NIC pairs of each block, each carrying its ranks' sums (exact for any
        network); a network whose links a transfer loads at its two ends only overrides it in O(n)."""
        num_nics = self.num_nodes * self.spec.nics_per_node
        keys, first, inverse, count = np.unique(
            block * num_nics + nic, return_index=True, return_inverse=True, return_counts=True
        )
        o_sum, i_sum = np.bincount(inverse.ravel(), out), np.bincount(inverse.ravel(), into)
        a, b = pairs_within(keys // num_nics)
        a, b = a[node[first[a]] != node[first[b]]], b[node[first[a]] != node[first[b]]]
        weight = o_sum[a] * count[b] + count[a] * i_sum[b]
        return self.route(loads, start, nic[first[a]], nic[first[b]], node[first[a]], node[first[b]], weight)

    @property
    def reduces(self) -> bool:
        """Whether the switches reduce (SHARP; the in_network algorithm and NCCL's CollNet across nodes)."""
        return False

    # ---- symmetry --------------------------------------------------------------------------------------
    def link_shifts(self, units: int) -> dict[str, int]:
        raise CollectiveError("network", f"a {self.name} network has no unit of symmetry to move links by")

    # ---- the library pricer (NCCL's model) ------------------------------------------------------------
    def ring_links(self, cluster, placement, pg, pn, weight) -> list[tuple[int, float, float]]:
        """Links past the NICs that NCCL's ring of nodes loads, as (link id, bytes per bus byte, busy ratio to
        group 0's own NIC); library/pricer.py ``_nic_loads`` names the arguments. None by default."""
        return []

    # ---- drawing (view.py's aggregated view) ----------------------------------------------------------
    def draw_aggregated(self, builder, drawn: list[int]) -> None:
        """Add the network's edges between the node boxes ``drawn`` to ``builder`` (view._Aggregated)."""


def alike(key: np.ndarray, out: np.ndarray, into: np.ndarray):
    """Per entry: how many entries share its key, and their sums of ``out`` and of ``into``."""
    _, inverse, count = np.unique(key, return_inverse=True, return_counts=True)
    return count[inverse], np.bincount(inverse, out)[inverse], np.bincount(inverse, into)[inverse]


def pairs_within(key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every ordered pair (i, j), i != j, of entries with the same key: sum of squares of the run lengths."""
    order = np.argsort(key, kind="stable")
    ordered = key[order]
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
    lengths = np.diff(np.r_[starts, len(key)])
    start = np.repeat(starts, lengths)
    length = np.repeat(lengths, lengths)
    offset = np.arange(len(key)) - start
    src, dst = [], []
    for shift in range(1, int(lengths.max(initial=1))):
        live = length > shift
        src.append(order[live])
        dst.append(order[start[live] + (offset[live] + shift) % length[live]])
    if not src:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    return np.concatenate(src), np.concatenate(dst)
