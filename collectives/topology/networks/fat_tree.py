"""A two-level fat-tree: NICs on leaf switches, leaves on spines (DGX SuperPOD and most GPU clusters).

``rail_optimized`` puts NIC k of every node of a scalable unit (``nodes_per_leaf`` nodes) on leaf k of that
unit (DGX SuperPOD), otherwise all NICs of the unit's nodes share one leaf. ECMP spreads a leaf's traffic
evenly over its spine up-links, so they act as one bundle of nics_per_leaf x NIC rate / oversubscription
(exact for an even split). A transfer between NICs on one leaf crosses 1 switch, otherwise 3.

Symmetry (symmetry.py): every scalable unit is wired alike (its nodes, their NICs, its own leaves, one
bundle per leaf to the same spines), so moving a placement by whole units changes no price; the leaf
links move by ``leaves_per_unit`` per unit. Inside a unit every node hangs off the same leaves (NIC k on
leaf k, or all on the unit's one leaf), so the nodes of one unit are interchangeable too.
"""

from __future__ import annotations

from functools import cached_property

import numpy as np

from ..._errors import CollectiveError
from ..loads import _pick
from ..spec import _positive
from . import register
from ._base import Families, NetworkModel


@register
class FatTree(NetworkModel):
    name = "fat_tree"
    summary = "leaf switches under spines; rail-optimised or not; oversubscription; SHARP"
    fields = ("rail_optimized", "nodes_per_leaf", "num_spines", "oversubscription", "switch_latency_s",
              "in_network_reduction")  # fmt: skip
    # the nodes of one unit hang off the same leaves: any of them may stand for any other
    nodes_alike_in_unit = True

    def __init__(self, spec):
        super().__init__(spec)
        self.nics_per_node, self.nic_GBps = spec.nics_per_node, spec.nic_bandwidth_GBps

    @classmethod
    def validate(cls, spec) -> None:
        net = spec.network
        _positive("network.nodes_per_leaf", net.nodes_per_leaf)
        _positive("network.num_spines", net.num_spines)
        if net.oversubscription < 1:
            raise CollectiveError(
                "network.oversubscription", f"must be >= 1 (downlink:uplink), got {net.oversubscription}"
            )

    @property
    def units(self) -> int:
        return -(-self.num_nodes // self.network.nodes_per_leaf)

    @property
    def leaves_per_unit(self) -> int:
        return self.nics_per_node if self.network.rail_optimized else 1

    @property
    def unit_nodes(self) -> int:
        """Nodes per unit of symmetry: the scalable unit under one set of leaves."""
        return self.network.nodes_per_leaf

    def link_shifts(self, units: int) -> dict[str, int]:
        """How far this network's link families move when a placement moves ``units`` units on."""
        leaves = units * self.leaves_per_unit
        return {"leaf_up": leaves, "leaf_down": leaves}

    @property
    def num_leaves(self) -> int:
        return self.units * self.leaves_per_unit

    @property
    def nics_per_leaf(self) -> int:
        nodes = min(self.network.nodes_per_leaf, self.num_nodes)
        return nodes if self.network.rail_optimized else nodes * self.nics_per_node

    @property
    def bundle_GBps(self) -> float:
        return self.nics_per_leaf * self.nic_GBps / self.network.oversubscription

    @property
    def reduces(self) -> bool:
        return self.network.in_network_reduction

    def families(self) -> Families:
        latency = self.network.switch_latency_s
        return [
            ("leaf_up", "leaf_uplink", self.num_leaves, self.bundle_GBps, latency),
            ("leaf_down", "spine_downlink", self.num_leaves, self.bundle_GBps, latency),
        ]

    def attach(self, nic: int) -> tuple:
        return ("leaf", int(self.leaf_of(np.int64(nic))))

    def endpoints(self, family: str, i: int) -> tuple[tuple, tuple]:
        if family == "leaf_up":
            return ("leaf", i), ("spine", "all")
        if family == "leaf_down":
            return ("spine", "all"), ("leaf", i)
        return super().endpoints(family, i)

    @cached_property
    def _leaf_of_nic(self) -> np.ndarray:
        k = self.nics_per_node
        nic = np.arange(self.num_nodes * k)
        unit = (nic // k) // self.network.nodes_per_leaf
        return unit * k + nic % k if self.network.rail_optimized else unit

    def leaf_of(self, nic: np.ndarray) -> np.ndarray:
        return self._leaf_of_nic[nic]

    def route(self, loads, start, nic_src, nic_dst, node_src, node_dst, nbytes) -> float:
        """Add the leaf bundles' bytes; the switches' latency."""
        leaf_src, leaf_dst = self.leaf_of(nic_src), self.leaf_of(nic_dst)
        cross = leaf_src != leaf_dst
        loads.add(start("leaf_up") + leaf_src[cross], _pick(nbytes, cross))
        loads.add(start("leaf_down") + leaf_dst[cross], _pick(nbytes, cross))
        return (3 if cross.any() else 1) * self.network.switch_latency_s

    # ---- NCCL's ring of nodes (library/pricer.py) -------------------------------------------------------
    def ring_links(self, cluster, placement, pg, pn, weight) -> list[tuple[int, float, float]]:
        """A node-to-node hop whose two nodes sit under different leaf units crosses the spines: the NICs of
        the sending node push their share up their leaf's bundle (nics_per_leaf x NIC rate / oversubscription).
        Group 0's bundles as (link id, bytes per bus byte, busy ratio to group 0's own NIC)."""
        spec = self.spec
        crossing = np.isin(pg * spec.num_nodes + pn // spec.nics_per_node, self._crossing_hops(cluster, placement))
        own = (pg == 0) & crossing
        if not own.any():
            return []
        leaf = self.leaf_of(pn)
        fam = cluster.families["leaf_up"]
        up = np.bincount(leaf[crossing], weight[crossing], minlength=fam.size)
        share = fam.capacity_GBps / spec.nic_bandwidth_GBps  # a bundle's capacity in NICs
        ratios = up[leaf[own]] / share / weight[own]
        best = {}
        for i, r in zip(leaf[own].tolist(), ratios.tolist(), strict=True):
            best[i] = max(r, best.get(i, 0.0))
        return [(fam.start + i, float(up[i]), r) for i, r in best.items()]

    def _crossing_hops(self, cluster, placement: np.ndarray) -> np.ndarray:
        """Keys group x num_nodes + node of every node whose next node in its group's ring of nodes (ascending,
        wrapping round) sits under another leaf unit."""
        g, n = placement.shape
        nodes = np.sort(cluster.node_of(placement), axis=1).ravel()
        group = np.repeat(np.arange(g), n)
        keep = np.r_[True, (nodes[1:] != nodes[:-1]) | (group[1:] != group[:-1])]
        nodes, group = nodes[keep], group[keep]
        starts = np.flatnonzero(np.r_[True, group[1:] != group[:-1]])
        ends = np.r_[starts[1:] - 1, len(nodes) - 1]
        nxt = np.r_[nodes[1:], 0]
        nxt[ends] = nodes[starts]
        unit = self.network.nodes_per_leaf
        cross = nodes // unit != nxt // unit
        return group[cross] * self.num_nodes + nodes[cross]

    # ---- drawing -----------------------------------------------------------------------------------------
    def draw_aggregated(self, builder, drawn: list[int]) -> None:
        """Each node's NIC k (k < view.MAX_NICS) joins its rail (rail-optimised: leaf k of every unit) or its
        unit's leaf, one edge holding both directions' link ids."""
        from ..view import MAX_NICS, Vertex

        c, k = builder.cluster, self.nics_per_node
        up, down = c.families["nic_up"].start, c.families["nic_down"].start
        builder.truncated |= k > MAX_NICS
        for node in drawn:
            for i in range(min(k, MAX_NICS)):
                nic = node * k + i
                rail = f"rail {i}" if self.network.rail_optimized else f"leaf {int(self.leaf_of(np.int64(nic)))}"
                builder.vertex(Vertex(rail, "rail", rail))
                label = f"node {node} nic {i} <-> {rail}"
                builder.edge(f"b{node}-{i}", f"b{node}", rail, (up + nic, down + nic), label)
