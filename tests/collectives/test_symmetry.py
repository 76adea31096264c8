"""The symmetry seam (collectives/topology/symmetry.py): each network says its unit, and a placement moved
by it prices exactly as where it sits, with its links moved back."""

from dataclasses import replace

import numpy as np
import pytest

from collectives import Op
from collectives.topology import (
    Cluster,
    Network,
    canonical,
    cluster_for,
    cluster_preset,
    neighbourhood,
    price_call,
    tiling_unit,
)


def test_each_network_says_its_unit():
    # fat-tree: the scalable unit (32 DGX H100 nodes x 8 GPUs); one node: the whole cluster; routers: none
    assert Cluster(cluster_preset("dgx-h100", 64)).symmetry_unit == 32 * 8
    assert Cluster(cluster_preset("dgx-h100", 1)).symmetry_unit == 8
    assert Cluster(cluster_preset("tpu-torus", 64)).symmetry_unit is None
    dragonfly = replace(cluster_preset("dgx-h100", 16), network=Network("dragonfly", group_size=4))
    assert Cluster(dragonfly).symmetry_unit is None
    # 50 nodes are not a whole number of 20-node units: no tiling, though the unit still exists
    a100 = Cluster(cluster_preset("dgx-a100", 50))
    assert a100.symmetry_unit == 160 and tiling_unit(a100) is None
    assert tiling_unit(Cluster(cluster_preset("dgx-a100", 60))) == 160


def test_canonical_moves_whole_units_then_whole_nodes_inside_one_unit():
    cluster = Cluster(cluster_preset("dgx-h100", 96))  # 3 units of 256 devices
    inside = np.array([[300, 301], [310, 311]])  # nodes 37 and 38, both in unit 1
    moved, shift = canonical(inside, cluster)
    assert shift == 296 and moved.tolist() == [[4, 5], [14, 15]]  # unit 1 -> 0, then node 37 -> node 0
    across = np.array([[300, 600]])  # units 1 and 2: only whole units move
    moved, shift = canonical(across, cluster)
    assert shift == 256 and moved.tolist() == [[44, 344]]
    torus = Cluster(cluster_preset("tpu-torus", 64))
    assert canonical(np.array([[5, 9]]), torus)[1] == 0


def test_neighbourhood_keeps_the_groups_sharing_a_unit_with_group_0():
    cluster = Cluster(cluster_preset("dgx-h100", 64))  # units: devices 0-255, 256-511
    placement = np.array([[0, 300], [8, 264], [256, 400], [16, 24]])
    assert neighbourhood(placement, cluster).tolist() == placement.tolist()  # all touch unit 0 or 1
    two = np.array([[0, 8], [260, 270], [16, 24]])
    assert neighbourhood(two, cluster).tolist() == [[0, 8], [16, 24]]
    torus = Cluster(cluster_preset("tpu-torus", 64))
    assert neighbourhood(np.array([[0, 1], [40, 41]]), torus).shape == (2, 2)  # no unit: every group


@pytest.mark.parametrize(
    ("preset", "nodes", "pricing", "op"),
    [
        ("dgx-h100", 96, "library", Op.ALLGATHER),
        ("dgx-h100", 96, "schedule", Op.ALLTOALL),
        ("pcie-server", 72, "schedule", Op.ALLREDUCE),  # not rail-optimised: one leaf per unit
        ("aws-p5", 72, "library", Op.REDUCESCATTER),  # four NICs per GPU
    ],
)
def test_a_moved_placement_prices_alike_and_its_links_move_back(preset, nodes, pricing, op):
    """The automorphism canonical relies on: same time, same bytes, and the moved placement's busiest links
    translated back are the links the placement itself reports."""
    cluster = Cluster(cluster_preset(preset, nodes))
    d = cluster.per_node
    # two 4-node groups inside the second unit (nodes 37..44), then group 0 straddling units 1 and 2
    for first_node in (37, 62):
        nodes_of = [[first_node + i for i in range(4)], [first_node + 4 + i for i in range(4)]]
        placement = np.array([[n * d + g for n in row for g in (0, 1)] for row in nodes_of])
        moved, shift = canonical(placement, cluster)
        here = price_call(op, 1 << 24, placement, cluster, pricing=pricing, top_links=8)
        there = price_call(op, 1 << 24, moved, cluster, pricing=pricing, top_links=8)
        assert there.time_s == here.time_s and there.algorithm == here.algorithm
        assert [cluster.translate_link(link["id"], shift) for link in there.links] == [x["id"] for x in here.links]
        assert [link["bytes"] for link in there.links] == [x["bytes"] for x in here.links]


def test_translate_link_refuses_a_shift_the_cluster_has_no_symmetry_for():
    torus = Cluster(cluster_preset("tpu-torus", 64))
    assert torus.translate_link(3, 0) == 3
    with pytest.raises(Exception, match="cannot move a placement"):
        torus.translate_link(3, 8)


def test_cluster_for_builds_once_per_spec():
    spec = cluster_preset("dgx-h100", 4)
    assert cluster_for(spec) is cluster_for(cluster_preset("dgx-h100", 4))
    assert cluster_for(spec) is not cluster_for(cluster_preset("dgx-h100", 8))
