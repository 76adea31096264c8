"""The drawn subgraph (collectives/topology/view.py): closed-form sizes, the links a group's traffic really
crosses, labels from the one description of the links, bounds at 16,384 devices."""

from __future__ import annotations

from dataclasses import replace
from itertools import permutations

import numpy as np
import pytest

from collectives import CollectiveError
from collectives.topology import Cluster, cluster_preset
from collectives.topology.spec import Network
from collectives.topology.view import MAX_BOXES, MAX_GPUS, MAX_NICS, MAX_NODES, subgraph


def routed(cluster: Cluster, devices) -> set[int]:
    """Link ids the all-pairs traffic of ``devices`` loads (Cluster.route, the pricer's router)."""
    pairs = np.array(list(permutations(devices, 2)), dtype=np.int64)
    loads, _ = cluster.route(pairs[:, 0], pairs[:, 1], None)
    return {int(i) for i, b in zip(loads.links, loads.bytes, strict=True) if b > 0}


def kinds(view) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in view.vertices:
        out[v.kind] = out.get(v.kind, 0) + 1
    return out


def test_four_dgx_nodes_in_detail_closed_form():
    """4 DGX H100 nodes: per node 8 GPUs x (NVSwitch up + down, PCIe up + down) + 8 NICs x (up + down) = 48
    directed links; the 8 rail leaves of the unit join through the spines: 8 x 2 more."""
    cluster = Cluster(cluster_preset("dgx-h100", 4))
    view = subgraph(cluster, [0, 8, 16, 24])
    assert not view.aggregated and not view.truncated and view.nodes_drawn == (0, 1, 2, 3)
    assert len(view.edges) == 4 * 48 + 8 * 2
    assert kinds(view) == {"node": 4, "gpu": 32, "switch": 4, "nic": 32, "leaf": 8, "spine": 1}
    assert [v.id for v in view.vertices if v.member] == ["d0", "d8", "d16", "d24"]
    assert routed(cluster, [0, 8, 16, 24]) <= view.link_ids
    ids = {v.id for v in view.vertices}
    for e in view.edges:  # every edge is one link, named as pricing names it, between drawn vertices
        (link,) = e.links
        d = cluster.describe_link(link)
        assert (e.label, e.kind, e.family, e.capacity_GBps) == (d["label"], d["kind"], d["family"], d["capacity_GBps"])
        assert {e.source, e.target} <= ids


def test_labels_come_from_the_endpoints_graph_uses():
    cluster = Cluster(cluster_preset("dgx-h100", 2))
    g = cluster.graph()
    for u, v, data in g.edges(data=True):
        label = cluster.describe_link(data["link"])["label"]
        assert label.startswith(cluster.vertex_name(u) + " -> ")
        assert label.endswith(cluster.vertex_name(v, within=cluster.vertex_node(u)))
    labels = [cluster.describe_link(f.start)["label"] for f in cluster.families.values()]
    assert labels == [
        "node 0 gpu 0 -> switch",
        "node 0 switch -> gpu 0",
        "node 0 gpu 0 -> nic 0",
        "node 0 nic 0 -> gpu 0",
        "node 0 nic 0 -> leaf 0",
        "leaf 0 -> node 0 nic 0",
        "leaf 0 -> spines",
        "spines -> leaf 0",
    ]


def test_one_leaf_needs_no_spines():
    """Not rail-optimised, both nodes on one leaf: traffic never reaches the spines, nor does the drawing."""
    cluster = Cluster(cluster_preset("pcie-server", 2))
    view = subgraph(cluster, [0, 8])
    assert "spine" not in kinds(view) and kinds(view)["leaf"] == 1
    assert routed(cluster, [0, 8]) <= view.link_ids
    assert len(view.edges) == 2 * (8 * 2 + 8 * 2 + 2)  # per node: PCIe switch and host links up and down, 1 NIC


def test_full_mesh_node():
    cluster = Cluster(cluster_preset("npu-mesh-8"))
    view = subgraph(cluster, list(range(8)))
    assert len(view.edges) == 8 * 7 and kinds(view) == {"node": 1, "gpu": 8}
    assert routed(cluster, range(8)) == view.link_ids


def test_torus_draws_every_shortest_path():
    """Routers 0 and 21 are (1,1,1) apart in the 4x4x4 torus: the 6 shortest paths cover the 12 edges of the
    unit cube, 24 directed links, and its 8 corner routers; each node adds PCIe and NIC up and down."""
    cluster = Cluster(cluster_preset("tpu-torus"))
    view = subgraph(cluster, [0, 21])
    assert sum(e.family == "router" for e in view.edges) == 24
    assert kinds(view) == {"node": 2, "gpu": 2, "nic": 2, "router": 8}
    assert len(view.edges) == 24 + 2 * 4
    assert routed(cluster, [0, 21]) == view.link_ids


def test_nvl72_draws_the_groups_gpus_first():
    cluster = Cluster(cluster_preset("gb200-nvl72", 2))
    group = [*range(60, 72), 72 + 5]
    view = subgraph(cluster, group)
    assert view.truncated  # 72 GPUs per node, MAX_GPUS drawn
    assert sum(v.kind == "gpu" for v in view.vertices) == 2 * MAX_GPUS
    assert sorted(int(v.id[1:]) for v in view.vertices if v.member) == group
    assert routed(cluster, group) <= view.link_ids


def test_many_nodes_aggregate_into_boxes_and_rails():
    """16 nodes, one device each: 16 boxes, 8 rails, one bundle per node and NIC holding its up and down link."""
    cluster = Cluster(cluster_preset("dgx-h100", 64))
    group = list(range(0, 128, 8))
    view = subgraph(cluster, group, {cluster.families["nic_up"].start + 8: 0.9})
    assert view.aggregated and view.nodes == 16 > MAX_NODES
    assert kinds(view) == {"node_box": 16, "rail": 8}
    assert all(v.members == 1 for v in view.vertices if v.kind == "node_box")
    assert len(view.edges) == 16 * 8 and all(e.bundle for e in view.edges)
    busy = [e for e in view.edges if e.utilisation > 0]
    assert [(e.id, e.utilisation) for e in busy] == [("b1-0", 0.9)]
    nic_links = {link for link in routed(cluster, group) if cluster.describe_link(link)["kind"] == "nic"}
    assert nic_links <= view.link_ids


def test_16384_devices_stay_bounded():
    cluster = Cluster(cluster_preset("dgx-h100", 2048))
    view = subgraph(cluster, range(16384))
    assert view.aggregated and view.truncated and view.nodes == 2048
    assert len(view.vertices) == MAX_BOXES + 8 and len(view.edges) == MAX_BOXES * 8
    assert all(v.members == 8 for v in view.vertices if v.kind == "node_box")


def test_16384_node_torus_stays_bounded():
    spec = cluster_preset("tpu-torus", 16384)
    cluster = Cluster(replace(spec, network=replace(spec.network, dims=(16, 32, 32))))
    view = subgraph(cluster, range(16384))
    assert view.aggregated and len(view.vertices) == MAX_BOXES
    # the first 128 routers are 4 full 32-rings along the last axis plus the links between those rings
    assert len(view.edges) == 2 * (128 + 3 * 32)
    far = subgraph(cluster, [0, 16 * 32 * 32 // 2 + 16 * 32 + 16])  # (8,16,16) apart: a huge ECMP box
    assert far.truncated and sum(e.family == "router" for e in far.edges) == 512


@pytest.mark.parametrize(
    ("devices", "rule"),
    [([], "at least one device"), ([0, 32], "outside the cluster's 32 devices"), ([3, 3], "device 3 is listed twice")],
)
def test_bad_devices_name_the_rule(devices, rule):
    with pytest.raises(CollectiveError, match=rule) as err:
        subgraph(Cluster(cluster_preset("dgx-h100", 4)), devices)
    assert err.value.field == "devices"


def test_unknown_link_in_the_utilisation():
    with pytest.raises(CollectiveError, match="no link 9999") as err:
        subgraph(Cluster(cluster_preset("dgx-h100", 4)), [0], {9999: 0.5})
    assert err.value.field == "utilisation"


def test_dragonfly_from_the_spec():
    """A dragonfly built from the spec (not a preset) draws like the torus: its links from the router table."""
    spec = cluster_preset("dgx-h100", 16)
    spec = replace(spec, network=Network("dragonfly", group_size=4, link_bandwidth_GBps=25.0))
    cluster = Cluster(spec)
    view = subgraph(cluster, [0, 8 * 5])
    assert routed(cluster, [0, 40]) <= view.link_ids
    assert {e.label for e in view.edges if e.family == "router"} <= {
        f"router {u} -> router {v}" for u, v in cluster.network.links
    }


def test_many_nics_per_node_stay_bounded():
    """1,024 NICs on each of 128 nodes would be 131,072 bundles: the first MAX_NICS of each node are drawn."""
    cluster = Cluster(replace(cluster_preset("dgx-h100", 128), nics_per_node=1024))
    view = subgraph(cluster, range(0, 1024, 8))
    assert view.aggregated and view.truncated
    assert len(view.edges) == 128 * MAX_NICS and kinds(view) == {"node_box": 128, "rail": MAX_NICS}
