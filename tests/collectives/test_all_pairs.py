"""The all-pairs step class (a full mesh's direct step) priced in O(n): the same link loads, latency and
price as routing its n(n-1) transfers one by one, on every kind of node fabric and network."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from collectives import Op
from collectives.topology import cluster_for, cluster_preset
from collectives.topology.pricing import evaluate, route_all_pairs
from collectives.topology.select import cached_schedule, price_call
from collectives.topology.spec import Network

rng = np.random.default_rng(7)


def _clusters():
    mesh = cluster_preset("npu-mesh-8", 8)  # full mesh in the node, rail-optimised fat-tree, 16 nodes a leaf
    yield "npu-mesh-8", replace(mesh, network=replace(mesh.network, nodes_per_leaf=2))  # several leaves
    yield (
        "npu-mesh-8 one leaf per unit",
        replace(mesh, network=replace(mesh.network, nodes_per_leaf=2, rail_optimized=False)),
    )
    yield "dgx-h100", cluster_preset("dgx-h100", 4)  # NVSwitch, 4 NICs a leaf bundle
    yield "pcie-server", cluster_preset("pcie-server", 6)  # one NIC per node
    yield "torus", cluster_preset("tpu-torus", 27)  # one chip per node, routers
    yield "dragonfly", replace(mesh, network=Network("dragonfly", group_size=2))


CLUSTERS = dict(_clusters())


def _placements(num_devices: int):
    devices = rng.permutation(num_devices)
    yield "one group in order", np.arange(min(12, num_devices))[None, :]
    yield "two scattered groups", devices[:16].reshape(2, 8)
    yield "four groups of 3", devices[:12].reshape(4, 3)
    yield "one node", np.arange(min(4, num_devices))[None, :]


@pytest.mark.parametrize("name", sorted(CLUSTERS))
def test_all_pairs_loads_match_routing_every_transfer(name):
    cluster = cluster_for(CLUSTERS[name])
    for what, devices in _placements(cluster.num_devices):
        g, n = devices.shape
        out, into = rng.integers(0, 1000, n), rng.integers(0, 1000, n)
        for blocks in (None, rng.integers(0, 3, n)):  # every pair, or pairs inside blocks (a two-level step)
            fast, fast_latency = route_all_pairs(cluster, devices, out, into, blocks)
            same = np.ones((n, n), dtype=bool) if blocks is None else blocks[:, None] == blocks[None, :]
            i, j = np.nonzero(same & ~np.eye(n, dtype=bool))
            if not len(i):
                continue
            src, dst = devices[:, i].ravel(), devices[:, j].ravel()
            slow, slow_latency = cluster.route(src, dst, np.tile((out[i] + into[j]).astype(float), g))
            np.testing.assert_allclose(
                fast.dense(cluster.num_links), slow.dense(cluster.num_links), rtol=1e-12, err_msg=f"{name}: {what}"
            )
            assert fast_latency == slow_latency, (name, what)


@pytest.mark.parametrize(
    ("algorithm", "op"),
    [("direct", op) for op in (Op.ALLREDUCE, Op.REDUCESCATTER, Op.ALLGATHER, Op.ALLTOALL)]
    + [("hierarchical", Op.ALLTOALL)],
)
@pytest.mark.parametrize("name", ["npu-mesh-8", "dgx-h100", "torus"])
def test_all_pairs_schedules_price_as_their_expanded_transfers(name, algorithm, op):
    """A schedule's price from its all-pairs classes equals the price of the same schedule with the classes
    listed transfer by transfer (uneven blocks included: 1,000,003 bytes over 12 ranks)."""
    cluster = cluster_for(CLUSTERS[name])
    devices = rng.permutation(cluster.num_devices)[:24].reshape(2, 12)
    count = 1_000_003 if op is not Op.ALLTOALL else 12 * 83_333
    schedule = cached_schedule(algorithm, op, 12, count, 4 if algorithm == "hierarchical" else 0)
    classes = schedule.step_classes()
    assert all(c.all_pairs is not None and len(c.src) == 0 for c in classes)
    listed = replace(schedule, _cached_classes=[c.expanded() for c in classes])
    fast, slow = evaluate(schedule, devices, cluster), evaluate(listed, devices, cluster)
    assert fast.time_s == pytest.approx(slow.time_s, rel=1e-12)
    np.testing.assert_allclose(fast.loads.dense(cluster.num_links), slow.loads.dense(cluster.num_links), rtol=1e-12)
    assert [a.tolist() for a in schedule.wire_bytes()] == [a.tolist() for a in listed.wire_bytes()]


def test_a_4096_rank_mesh_allreduce_is_priced_without_its_16m_transfers():
    """The 4,096-NPU gradient-norm allreduce that took the server to gigabytes (issue 26 item 2): one
    all-pairs class, priced from 4,096-long vectors."""
    cluster = cluster_for(cluster_preset("npu-mesh-8", 512))
    p = price_call(Op.ALLREDUCE, 1 << 20, np.arange(4096)[None, :], cluster, "direct")
    n, m = 4096, 1 << 20
    assert p.bytes_sent_per_rank == 2 * (m * (n - 1) // n)  # algorithms/direct.py: 2 (n-1)/n M
    assert p.steps == 2 and p.time_s > 0
