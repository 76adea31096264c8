"""A two-level fat-tree: NICs on leaf switches, leaves on spines.

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

from .loads import _pick


class FatTree:
    def __init__(self, network, num_nodes: int, nics_per_node: int, nic_GBps: float):
        self.network, self.num_nodes, self.nics_per_node, self.nic_GBps = network, num_nodes, nics_per_node, nic_GBps

    @property
    def units(self) -> int:
        return -(-self.num_nodes // self.network.nodes_per_leaf)

    @property
    def leaves_per_unit(self) -> int:
        return self.nics_per_node if self.network.rail_optimized else 1

    # the nodes of one unit hang off the same leaves: any of them may stand for any other
    nodes_alike_in_unit = True

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

    @cached_property
    def _leaf_of_nic(self) -> np.ndarray:
        k = self.nics_per_node
        nic = np.arange(self.num_nodes * k)
        unit = (nic // k) // self.network.nodes_per_leaf
        return unit * k + nic % k if self.network.rail_optimized else unit

    def leaf_of(self, nic: np.ndarray) -> np.ndarray:
        return self._leaf_of_nic[nic]

    def route(self, loads, up: int, down: int, nic_src, nic_dst, nbytes) -> float:
        """Add the leaf bundles' bytes (link ids from ``up`` / ``down``); the switches' latency."""
        leaf_src, leaf_dst = self.leaf_of(nic_src), self.leaf_of(nic_dst)
        cross = leaf_src != leaf_dst
        loads.add(up + leaf_src[cross], _pick(nbytes, cross))
        loads.add(down + leaf_dst[cross], _pick(nbytes, cross))
        return (3 if cross.any() else 1) * self.network.switch_latency_s
