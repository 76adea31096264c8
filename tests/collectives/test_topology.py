"""Topologies, routing and contention: the effects the field designs for, with numbers."""

from dataclasses import replace

import numpy as np
import pytest

from collectives import CollectiveError, Op
from collectives.topology import (
    Cluster,
    ClusterSpec,
    IntraNode,
    Network,
    check_concurrent_groups,
    cluster_for,
    cluster_preset,
    price_call,
)

GIB = 1 << 30


def dp_groups(cluster: Cluster) -> np.ndarray:
    """One group per local index across all nodes (data parallel with TP = devices per node)."""
    return np.arange(cluster.num_devices).reshape(cluster.num_nodes, cluster.per_node).T


def test_full_mesh_group_of_4_gets_3_of_7_links():
    mesh = Cluster(cluster_preset("npu-mesh-8"))
    whole = price_call(Op.ALLREDUCE, GIB, np.arange(8)[None, :], mesh, "direct")
    half = price_call(Op.ALLREDUCE, GIB, np.arange(4)[None, :], mesh, "direct")
    assert half.busbw_GBps / whole.busbw_GBps == pytest.approx(3 / 7, rel=0.02)
    # and auto picks the mesh algorithm over the ring, which uses one link of seven
    assert price_call(Op.ALLREDUCE, GIB, np.arange(8)[None, :], mesh).algorithm == "direct"


def test_shared_nic_makes_eight_rings_eight_times_slower():
    shared = Cluster(cluster_preset("pcie-server", 16))
    railed = Cluster(replace(shared.spec, nics_per_node=8, network=replace(shared.spec.network, rail_optimized=True)))
    slow = price_call(Op.ALLREDUCE, GIB, dp_groups(shared), shared, "ring")
    fast = price_call(Op.ALLREDUCE, GIB, dp_groups(railed), railed, "ring")
    assert slow.time_s / fast.time_s == pytest.approx(8, rel=0.05)
    assert slow.bottleneck["kind"] == "nic"


def test_hierarchical_beats_flat_ring_across_many_nodes_for_large_messages():
    cluster = Cluster(cluster_preset("dgx-a100", 16))
    everyone = np.arange(128)[None, :]
    flat = price_call(Op.ALLREDUCE, GIB, everyone, cluster, "ring")
    two_level = price_call(Op.ALLREDUCE, GIB, everyone, cluster, "hierarchical")
    assert two_level.time_s < flat.time_s / 4


def test_halving_doubling_wins_small_ring_wins_or_ties_large():
    """Thakur et al.: same bandwidth term, log vs linear latency terms. With one NIC per node, halving-
    doubling's long-distance steps push all eight GPUs of a node through the NIC at once while the ring
    crosses each node boundary with one transfer: ring wins large messages. With a NIC per GPU both are
    NIC-bound on the same bytes: a tie."""
    for name, ring_vs_hd in (("pcie-server", 0.5), ("dgx-h100", 1.10)):
        cluster = Cluster(cluster_preset(name, 32))
        group = np.arange(256)[None, :]
        small_hd = price_call(Op.ALLREDUCE, 1024, group, cluster, "halving_doubling")
        small_ring = price_call(Op.ALLREDUCE, 1024, group, cluster, "ring")
        assert small_hd.time_s < small_ring.time_s / 10
        large_hd = price_call(Op.ALLREDUCE, GIB, group, cluster, "halving_doubling")
        large_ring = price_call(Op.ALLREDUCE, GIB, group, cluster, "ring")
        assert large_ring.time_s <= large_hd.time_s * ring_vs_hd, name


def test_rail_optimised_dp_traffic_never_crosses_spines_within_a_unit():
    cluster = Cluster(cluster_preset("dgx-h100", 32))  # 32 nodes = one scalable unit
    p = price_call(Op.ALLREDUCE, GIB, dp_groups(cluster), cluster, "ring")
    assert p.bottleneck["kind"] == "nic"
    assert all(link["kind"] not in ("leaf_uplink", "spine_downlink") for link in p.links)


def test_oversubscription_slows_cross_leaf_traffic():
    """8 rings leave each group of 4 nodes through one leaf: 8 transfers of M/n per step share the leaf's
    up-links (4 nodes x 8 NICs x 25 GB/s / ratio) while each NIC carries one. At 4:1 the two tie; at 8:1
    the up-links are the bottleneck and the ring takes twice as long."""

    def ring(ratio):
        spec = replace(
            cluster_preset("pcie-server", 64),
            nics_per_node=8,
            nic_bandwidth_GBps=25.0,
            network=Network("fat_tree", rail_optimized=False, nodes_per_leaf=4, oversubscription=ratio),
        )
        cluster = Cluster(spec)
        return price_call(Op.ALLREDUCE, GIB, dp_groups(cluster), cluster, "ring")

    full, over = ring(1.0), ring(8.0)
    assert full.bottleneck["kind"] == "nic"
    assert over.bottleneck["kind"] in ("leaf_uplink", "spine_downlink")
    assert over.time_s / full.time_s == pytest.approx(2, rel=0.1)


def test_route_conserves_bytes():
    cluster = Cluster(cluster_preset("dgx-h100", 4))
    rng = np.random.default_rng(0)
    src, dst = rng.integers(0, 32, 200), rng.integers(0, 32, 200)
    keep = src != dst
    src, dst = src[keep], dst[keep]
    nbytes = rng.integers(1, 1000, len(src)).astype(float)
    sparse, _ = cluster.route(src, dst, nbytes)
    loads = sparse.dense(cluster.num_links)
    cross = cluster.node_of(src) != cluster.node_of(dst)
    fam = cluster.families
    assert loads[fam["nic_up"].start : fam["nic_up"].start + fam["nic_up"].size].sum() == pytest.approx(
        nbytes[cross].sum()
    )
    assert loads[fam["dev_up"].start : fam["dev_up"].start + fam["dev_up"].size].sum() == pytest.approx(
        nbytes[~cross].sum()
    )


def test_torus_ecmp_shares():
    torus = Cluster(cluster_preset("tpu-torus", 64))
    _, shares, hops = torus.network.path(0, 21)  # (1,1,1) away in a 4x4x4 torus: 3 hops, 6 paths
    assert hops == 3
    assert shares.sum() == pytest.approx(3.0)  # every path crosses 3 links
    assert shares.max() == pytest.approx(1 / 3)
    p = price_call(Op.ALLREDUCE, GIB, np.arange(64)[None, :], torus, "ring")
    assert p.bottleneck["kind"] == "network_link"


@pytest.mark.parametrize("name", ["dgx-a100", "dgx-h100", "gb200-nvl72", "npu-mesh-8", "tpu-torus", "pcie-server"])
def test_presets_build_connected_graphs(name):
    cluster = Cluster(
        cluster_preset(name, 8 if name == "tpu-torus" else 2) if name != "tpu-torus" else cluster_preset(name)
    )
    g = cluster.graph()
    import networkx as nx

    assert nx.is_weakly_connected(g)
    kinds = {d["kind"] for _, d in g.nodes(data=True) if "kind" in d}
    assert "device" in kinds
    assert g.number_of_edges() == cluster.num_links


def test_dragonfly_and_hypercube_route():
    for net in (
        Network("dragonfly", group_size=4, link_bandwidth_GBps=25.0),
        Network("hypercube", link_bandwidth_GBps=25.0),
    ):
        spec = ClusterSpec(
            "x", 16, 4, IntraNode("switch", 100.0), nics_per_node=4, nic_bandwidth_GBps=25.0, network=net
        )
        cluster = Cluster(spec)
        p = price_call(Op.ALLGATHER, 1 << 24, dp_groups(cluster), cluster, "ring")
        assert p.time_s > 0 and p.links


@pytest.mark.parametrize(
    ("make", "field"),
    [
        (lambda: cluster_preset("dgx-h999"), "preset"),
        (lambda: Cluster(replace(cluster_preset("dgx-h100", 2), nic_bandwidth_GBps=0)), "nic_bandwidth_GBps"),
        (lambda: Cluster(replace(cluster_preset("dgx-h100"), intra=IntraNode("switch", -5.0))), "intra.bandwidth_GBps"),
        (lambda: Cluster(replace(cluster_preset("dgx-h100", 2), nics_per_node=0)), "nics_per_node"),
        (lambda: Cluster(replace(cluster_preset("dgx-h100", 2), network=Network("none"))), "network.topology"),
        (lambda: Cluster(replace(cluster_preset("dgx-h100"), intra=IntraNode("none"))), "intra.fabric"),
        (
            lambda: Cluster(replace(cluster_preset("tpu-torus", 64), network=Network("torus", dims=(4, 4, 5)))),
            "network.dims",
        ),
        (lambda: price_call(Op.ALLREDUCE, 1024, [[0, 99]], Cluster(cluster_preset("dgx-h100"))), "ranks"),
        (
            lambda: price_call(Op.ALLREDUCE, 1024, [[0, 1]], Cluster(cluster_preset("dgx-a100")), "in_network"),
            "algorithm",
        ),
    ],
)
def test_bad_clusters_are_named(make, field):
    with pytest.raises(CollectiveError) as caught:
        make()
    assert caught.value.field == field


def test_swing_beats_recursive_doubling_on_a_torus():
    """Swing's partners (±1, ±3, ±5, ±11…) sit closer on a torus than recursive doubling's (1, 2, 4, 8):
    fewer hops and fewer flows per link (De Sensi et al. 2024)."""
    from collectives.topology.presets import tpu_torus

    ring16 = Cluster(tpu_torus(16, dims=(16,)))
    group = np.arange(16)[None, :]
    for size in (1024, 1 << 26):
        swing = price_call(Op.ALLREDUCE, size, group, ring16, "swing")
        doubling = price_call(Op.ALLREDUCE, size, group, ring16, "recursive_doubling")
        assert swing.time_s < doubling.time_s * 0.9, size
        assert swing.bytes_sent_per_rank == doubling.bytes_sent_per_rank


def test_a_calls_groups_are_disjoint_for_every_caller():
    """Review r11a #7: the rule lives in collectives (price_call checks it, the HTTP route calls the same function):
    the same 8 devices twice, or half of them, is refused naming the device and both groups, whichever pricer
    (library or schedule); a concurrent group listing a device twice is refused; sendrecv pairs may share a device
    (a stage sends on and receives at once) and price; disjoint groups price as before."""
    cluster = cluster_for(cluster_preset("dgx-h100", 2))
    for placement, words in (
        ([[*range(8)], [*range(8)]], "device 0 is in group 0 and group 1: the groups of one call are disjoint"),
        ([[*range(8)], [*range(4, 12)]], "device 4 is in group 0 and group 1"),
        ([[*range(8)], [8] * 8], "group 1 lists a device twice: [8, 8,"),
    ):
        for pricing in ("library", "schedule"):
            with pytest.raises(CollectiveError) as err:
                price_call(Op.ALLREDUCE, 1 << 20, np.array(placement), cluster, pricing=pricing)
            assert err.value.field == "concurrent_groups" and words in err.value.rule, (placement, pricing)
        with pytest.raises(CollectiveError, match="concurrent_groups"):
            check_concurrent_groups(placement, Op.ALLGATHER)  # lists, as the route passes them (ragged allowed)
    check_concurrent_groups([[0, 1], [2, 3, 4]], Op.ALLREDUCE)  # disjoint; the sizes are the route's rule
    pairs = price_call(Op.SENDRECV, 1 << 20, np.array([[0, 1], [1, 2]]), cluster)
    assert pairs.time_s > 0
    apart = price_call(Op.ALLREDUCE, 1 << 20, np.array([[*range(8)], [*range(8, 16)]]), cluster)
    alone = price_call(Op.ALLREDUCE, 1 << 20, np.array([[*range(8)]]), cluster)
    assert apart.time_s == pytest.approx(alone.time_s, rel=1e-9)  # two nodes' NVLink domains share nothing
