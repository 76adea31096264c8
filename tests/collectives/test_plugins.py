"""Invariants every fabric plug-in keeps (collectives/topology/fabrics/): its families are laid out node by node,
so moving a placement by whole nodes moves each link to the link joining the moved endpoints."""

from __future__ import annotations

from dataclasses import replace

import pytest

from collectives.topology import Cluster, cluster_preset, fabrics
from collectives.topology.spec import Network


def moved(vertex: tuple, devices: int, per_node: int) -> tuple:
    """A device or a node's switch after a move by ``devices`` devices (whole nodes)."""
    if vertex[0] == "device":
        return ("device", vertex[1] + devices)
    return (vertex[0], vertex[1] + devices // per_node, *vertex[2:])


@pytest.mark.parametrize("fabric", [f for f in fabrics.names() if f != "none"])
def test_a_fabrics_links_move_with_the_placement(fabric):
    spec = cluster_preset("dgx-h100", 4)
    spec = replace(spec, intra=replace(spec.intra, fabric=fabric), network=Network("fat_tree", nodes_per_leaf=1))
    c = Cluster(spec)
    shift = c.symmetry_unit  # a fat-tree of one node per leaf: every node is a unit of symmetry
    assert shift == c.per_node == 8
    families = [c.families[f[0]] for f in c.fabric.families()]
    assert families
    for fam in families:
        last = fam.start + fam.size - shift * fam.size // c.num_devices  # links of the last node have no next
        for link in range(fam.start, last):
            u, v = c.endpoints(link)
            there = c.translate_link(link, shift)
            assert c.endpoints(there) == (moved(u, shift, c.per_node), moved(v, shift, c.per_node)), (fabric, link)
