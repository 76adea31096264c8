"""Pricing shortcuts from the cluster's symmetry: price fewer groups, and price a placement once wherever it sits.

A cluster's *unit of symmetry* (:attr:`Cluster.symmetry_unit`, said by each network module) is a block of
devices such that moving a placement by whole units changes no price: a fat-tree's scalable unit (every unit
is wired alike, networks/fat_tree.py), the whole cluster when it is one node; router networks (networks/_routed.py)
have none.

- :func:`neighbourhood`: the groups whose traffic can share a link with group 0, those touching a unit
  group 0 touches. Every link group 0 uses then carries exactly the load it carries with all groups
  running, so with symmetric layouts (every group placed like group 0, as rank orders make them) the
  busiest link is found at a fraction of the cost. Without a unit, every group is kept.
- :func:`canonical`: the placement moved down by whole units so that it starts in unit 0 and, when it
  lies inside one unit whose nodes are interchangeable (``Cluster.nodes_alike_in_unit``: a fat-tree's
  nodes all hang off their unit's leaves), by whole nodes so that it starts on node 0; and how many
  devices it moved (:meth:`Cluster.translate_link` moves the priced links back). The move keeps the
  order of devices, so the links' order, and with it which of tied links are reported, is kept too.
  The same call on another pipeline stage or replica then hits a price cache.
- :func:`tiling_unit`: the unit when it tiles the cluster exactly, so that a shift by s devices prices like
  a shift by s mod unit (stages of a pipeline are such shifts of one another).
"""

from __future__ import annotations

import numpy as np

from .cluster import Cluster

__all__ = ["canonical", "neighbourhood", "tiling_unit"]


def tiling_unit(cluster: Cluster) -> int | None:
    """The unit of symmetry in devices when the cluster is a whole number of units, else None."""
    unit = cluster.symmetry_unit
    return unit if unit and cluster.num_devices % unit == 0 else None


def canonical(placement: np.ndarray, cluster: Cluster) -> tuple[np.ndarray, int]:
    """The placement moved down by whole units of symmetry so that it starts in unit 0, and inside one
    unit of interchangeable nodes by whole nodes so that it starts on node 0; and the devices it moved.
    Unchanged (0) on a cluster without symmetry."""
    unit = cluster.symmetry_unit
    if unit is None:
        return placement, 0
    low = int(placement.min())
    shift = low // unit * unit
    if cluster.nodes_alike_in_unit and int(placement.max()) < shift + unit:
        shift = low // cluster.per_node * cluster.per_node
    return (placement - shift, shift) if shift else (placement, 0)


def neighbourhood(placement: np.ndarray, cluster: Cluster) -> np.ndarray:
    """The rows (groups) of ``placement`` touching a unit of symmetry that row 0 touches; all rows on a
    cluster without symmetry or of one unit."""
    unit = cluster.symmetry_unit
    if len(placement) == 1 or unit is None:
        return placement
    num_units = -(-cluster.num_devices // unit)
    if num_units == 1:
        return placement
    near = np.zeros(num_units, dtype=bool)
    near[placement[0] // unit] = True
    return placement[near[placement // unit].any(axis=1)]
