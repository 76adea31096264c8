"""Price a schedule on a cluster with every concurrent group of the same call running at once.

``placement`` is a (groups x n) array of device ids: row g is group g's ranks in schedule order. All rows
run the same schedule at the same moment, so eight DP rings leaving one node share its NICs unless the
network is rail-optimised. Per step class: route every transfer of every group, add bytes per directed
link, and charge max over links of bytes / (capacity x efficiency), plus per step the overhead and the
longest path latency (DESIGN.md §7). The bandwidth term of a class is exact when its steps load the links
equally, which the regular algorithms do (up to one element per step for uneven splits); pipelined trees
are charged their total per-link bytes, the steady-state bound.

Cost grows as O(classes x groups x transfers per class): ring allreduce is 2 classes of n transfers per
group, so pricing 8 DP rings of 2,048 ranks routes 2 x 16,384 transfers with numpy. An all-pairs class (a
full mesh's direct step, schedule.py) is routed from per-rank sums in O(groups x n) instead of its n(n-1)
transfers per group (:func:`route_all_pairs`).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from .._errors import CollectiveError
from ..primitives import busbw_factor
from ..schedule import Schedule
from .calibration import DEFAULT, Calibration
from .cluster import Cluster, Loads
from .fabrics.switch import Switch
from .loads import _Loads
from .networks._base import alike, pairs_within


@dataclass
class Price:
    algorithm: str
    time_s: float
    algbw_GBps: float
    busbw_GBps: float
    bytes_sent_per_rank: int
    bytes_received_per_rank: int
    steps: int
    bottleneck: dict
    links: list[dict]
    span: str
    nodes_per_group: int
    protocol: str = ""  # library pricing: NCCL's protocol (LL, LL128, Simple)
    nccl_algorithm: str = ""  # library pricing: NCCL's algorithm (Ring, Tree, NVLS, NVLSTree, CollNet*, PAT)
    channels: int = 0  # library pricing: NCCL channels


def on_nvlink_switch(price: Price) -> bool:
    """Whether the group a price was taken on sits behind one NVLink switch: all its ranks in one node (``span``)
    and its busiest link an NVLink port of the switch fabric (a device's up- or down-link, fabrics/switch.py), not a
    direct mesh or ring link, PCIe or a NIC."""
    link = price.bottleneck if isinstance(price.bottleneck, dict) else {}
    return (
        price.span == "intra_node" and link.get("kind") == "nvlink" and link.get("family") in Switch.reduction_families
    )


# Where a placement's groups sit on nodes, by value: the schedule pricer reads it twice per call (the ranks per
# node a two-level schedule is built for, the nodes a group spans), and the calls of a plan (and of the next plan
# on the same placements) that move other sizes over the same devices share it, as they share a unit routing
# (unit_route) and the library pricer a placement's contention. Bounded in entries and in devices per entry.
NODES_CACHE = 1024
NODES_CACHE_DEVICES = 4096
_NODES: OrderedDict = OrderedDict()  # (cluster spec, placement shape, placement bytes) -> (local size, nodes)


def placement_nodes(cluster: Cluster, placement: np.ndarray) -> tuple[int, int]:
    """(ranks per node if every group is laid out node by node with the same count per node, else 0; the most
    nodes one group spans) of a (groups x n) placement, memoised by value for at most NODES_CACHE_DEVICES
    devices."""
    if placement.size > NODES_CACHE_DEVICES:
        return _placement_nodes(cluster, placement)
    key = (cluster.spec, placement.shape, placement.tobytes())
    found = _NODES.get(key)
    if found is None:
        found = _NODES[key] = _placement_nodes(cluster, placement)
        if len(_NODES) > NODES_CACHE:
            _NODES.popitem(last=False)
    return found


def _placement_nodes(cluster: Cluster, placement: np.ndarray) -> tuple[int, int]:
    nodes = cluster.node_of(placement)
    return (_local(nodes[0]) if len(nodes) else 0), _spans(nodes)


def _local(nodes: np.ndarray) -> int:
    """Ranks per node of one group's nodes if they run node by node with the same count per node, else 0."""
    changes = np.flatnonzero(np.diff(nodes)) + 1
    runs = np.diff(np.concatenate([[0], changes, [len(nodes)]]))
    if len(set(runs.tolist())) != 1 or len(np.unique(nodes)) != len(runs):
        return 0
    return int(runs[0])


def _spans(nodes: np.ndarray) -> int:
    """The most nodes one group (a row of ``nodes``) spans."""
    return int((np.diff(np.sort(nodes, axis=1), axis=1) != 0).sum(axis=1).max(initial=0)) + 1


def local_size(cluster: Cluster, placement: np.ndarray) -> int:
    """Ranks per node if every group is laid out node by node with the same count per node, else 0."""
    placement = np.atleast_2d(placement)
    if placement.size > NODES_CACHE_DEVICES:
        return _local(cluster.node_of(placement[0]))
    return placement_nodes(cluster, placement)[0]


def in_network_level(cluster: Cluster, placement: np.ndarray) -> str:
    """Where the reduction can happen for these groups: the node's switch (NVLS) when every group sits in
    one node, the network's switches (SHARP) otherwise."""
    one_node = bool((cluster.node_of(placement) == cluster.node_of(placement[:, :1])).all())
    spec = cluster.spec
    if one_node and cluster.fabric.reduces:
        return "intra"
    if not one_node and cluster.network.reduces:
        return "network"
    where = "the node's switch (NVLS)" if one_node else "the network switches (SHARP)"
    raise CollectiveError("algorithm", f"in_network needs reduction in {where}, which cluster {spec.name} lacks")


@dataclass
class Evaluation:
    """A priced schedule before it is summarised: enough to compare candidates cheaply."""

    schedule: Schedule
    placement: np.ndarray
    time_s: float
    loads: Loads
    rate: np.ndarray


def evaluate(
    schedule: Schedule, placement: np.ndarray, cluster: Cluster, calibration: Calibration = DEFAULT
) -> Evaluation:
    placement = np.atleast_2d(np.asarray(placement, dtype=np.int64))
    if placement.shape[1] != schedule.num_ranks:
        raise CollectiveError(
            "ranks", f"placement has {placement.shape[1]} ranks per group, schedule {schedule.num_ranks}"
        )
    cluster.check_devices(placement)
    level = in_network_level(cluster, placement) if schedule.num_virtual else None
    holders = placement  # the virtual holders (in-network switches) are -1 columns after the ranks
    if schedule.num_virtual:
        holders = np.hstack([placement, np.full((len(placement), schedule.num_virtual), -1, dtype=np.int64)])
    rate = cluster.rate(calibration, in_network=level)
    time = calibration.base_latency(schedule.algorithm) if schedule.num_steps else 0.0
    parts: list[Loads] = []
    routed: dict[bytes, tuple[Loads, float]] = {}
    for cls in schedule.step_classes():
        loads, latency = _route_class(cls, holders, cluster, level, routed)
        busiest = float((loads.bytes / rate[loads.links]).max(initial=0.0))
        time += busiest + cls.repeat * (calibration.step_overhead_s + latency)
        parts.append(loads)
    return Evaluation(schedule, placement, time, Loads.total(parts, cluster.num_links), rate)


def price(
    schedule: Schedule, placement: np.ndarray, cluster: Cluster, calibration: Calibration = DEFAULT, top_links: int = 5
) -> Price:
    return summarise(evaluate(schedule, placement, cluster, calibration), cluster, top_links)


def _route_class(cls, holders, cluster, level, routed):
    """Route a class's transfers for every group. Loads are linear in bytes, so a class whose transfers
    all carry the same bytes is routed once per (src, dst) pattern with unit weight and scaled: the
    reduce-scatter and all-gather halves of a ring share one routing."""
    if cls.all_pairs is not None:
        out, into, blocks = cls.all_pairs
        return route_all_pairs(cluster, holders[:, : len(out)], out, into, blocks)
    uniform = bool(len(cls.nbytes)) and bool((cls.nbytes == cls.nbytes[0]).all())
    key = cls.src.tobytes() + b"|" + cls.dst.tobytes()
    if uniform and key in routed:
        unit, latency = routed[key]
        return unit.scaled(float(cls.nbytes[0])), latency
    src = holders[:, cls.src].ravel()
    dst = holders[:, cls.dst].ravel()
    if not uniform:
        return cluster.route(src, dst, np.tile(cls.nbytes.astype(np.float64), len(holders)), level)
    loads, latency = routed[key] = unit_route(cluster, src, dst, level)
    return loads.scaled(float(cls.nbytes[0])), latency


# Unit routings of small classes, by value: which links a set of transfers loads, one byte each, depends on
# the cluster and the devices only, not on the bytes, so the calls of a plan (and of the next plan on the same
# placements) that move other sizes over the same devices share one routing, as the library pricer shares a
# placement's contention (library/pricer.py _placement_part). Bounded in entries and in transfers per entry
# (a key holds the device numbers); larger classes are routed each time, as before.
ROUTE_CACHE = 256
ROUTE_CACHE_TRANSFERS = 4096
_ROUTES: OrderedDict = OrderedDict()  # (cluster spec, in-network level, src bytes, dst bytes) -> (Loads, latency)


def unit_route(cluster: Cluster, src: np.ndarray, dst: np.ndarray, level: str | None) -> tuple[Loads, float]:
    """``cluster.route(src, dst, None, level)``, memoised by value for at most ROUTE_CACHE_TRANSFERS transfers;
    the memoised loads are read-only."""
    if len(src) > ROUTE_CACHE_TRANSFERS:
        return cluster.route(src, dst, None, level)
    src, dst = np.ascontiguousarray(src, dtype=np.int64), np.ascontiguousarray(dst, dtype=np.int64)
    key = (cluster.spec, level, src.tobytes(), dst.tobytes())
    found = _ROUTES.get(key)
    if found is None:
        loads, latency = cluster.route(src, dst, None, level)
        loads.links.flags.writeable = loads.bytes.flags.writeable = False
        found = _ROUTES[key] = (loads, latency)
        if len(_ROUTES) > ROUTE_CACHE:
            _ROUTES.popitem(last=False)
    return found


def route_all_pairs(cluster: Cluster, devices: np.ndarray, out_bytes, in_bytes, blocks=None):
    """What ``cluster.route`` gives for an all-pairs class on every group at once (pair (i, j), i != j, of
    group k: ``devices[k, i] -> devices[k, j]`` carrying ``out_bytes[i] + in_bytes[j]``, for i and j in the
    same block, ``blocks[i] == blocks[j]``; None: one block), without listing the g n(n-1) transfers: O(g n)
    numpy, plus the pairs inside each node (at most devices-per-node per rank) and what the network plug-in
    needs (``route_all_pairs``: O(n) on a fat-tree, the NIC pairs of each block on a router network).

    A transfer between nodes loads links at its source (host and NIC up-links) and at its destination (the
    same, down), so each of those links carries a sum over the peers of one rank that sit on other nodes:
    the block's total minus the rank's own node's share. Transfers inside a node are routed as they are."""
    g, n = devices.shape
    loads, latency = _Loads(cluster.num_links), 0.0
    block = np.unique(np.zeros(n) if blocks is None else blocks, return_inverse=True)[1].ravel()
    width = int(block.max(initial=0)) + 1
    dev = devices.ravel()
    group = np.repeat(np.arange(g, dtype=np.int64) * width, n) + np.tile(block, g)  # (group, block)
    out, into = np.tile(np.asarray(out_bytes, np.float64), g), np.tile(np.asarray(in_bytes, np.float64), g)
    n, total_out, total_in = alike(group, out, into)  # per rank: its block's size and sums
    node = cluster.node_of(dev)
    by_node = group * cluster.num_nodes + node
    c_node, o_node, i_node = alike(by_node, out, into)
    src, dst = pairs_within(by_node)
    if len(src):
        latency = cluster._route_intra(loads, dev[src], dev[dst], out[src] + into[dst])
    far = c_node < n  # ranks with peers on other nodes
    if not far.any():
        return loads.total(), latency
    sent = (n - c_node) * out + (total_in - i_node)
    received = (total_out - o_node) + (n - c_node) * into
    nic = cluster.nic_of(dev)
    for family, links, amounts in (
        ("host_up", dev, sent),
        ("host_down", dev, received),
        ("nic_up", nic, sent),
        ("nic_down", nic, received),
    ):
        loads.add(cluster.families[family].start + links[far], amounts[far])
    # past the NICs: the network plug-in's own (networks/: the fat-tree's leaf bundles in O(n), by default the
    # NIC pairs of each block)
    network = cluster.network.route_all_pairs(loads, cluster._fam, nic[far], node[far], group[far], out[far], into[far])
    inter = 2 * cluster.spec.nic_latency_s + network
    return loads.total(), max(latency, inter)


def _busiest(busy: np.ndarray, ids: np.ndarray, top: int) -> np.ndarray:
    """Indices of the ``top`` busiest links. Among links tied at the maximum the lowest ids win: the first
    group's own links, so the page highlights the group the user looks at. O(links), no sort."""
    top = min(top, len(busy))
    if not top:
        return np.zeros(0, dtype=np.int64)
    tied = np.flatnonzero(busy >= busy.max() * (1 - 1e-12))  # ascending ids, as ids are sorted
    if len(tied) >= top:
        return tied[:top]
    order = np.argpartition(-busy, top - 1)[:top]
    return order[np.argsort(-busy[order], kind="stable")]


def summarise(ev: Evaluation, cluster: Cluster, top_links: int = 5) -> Price:
    schedule, placement, time, rate = ev.schedule, ev.placement, ev.time_s, ev.rate
    sent, received = schedule.wire_bytes()
    ids, carried = ev.loads.links, ev.loads.bytes
    busy = carried / rate[ids]
    order = _busiest(busy, ids, top_links)
    links = [
        cluster.describe_link(int(ids[i]))
        | {"bytes": int(carried[i]), "busy_s": float(busy[i]), "utilisation": float(busy[i] / time) if time else 0.0}
        for i in order
        if carried[i] > 0
    ]
    algbw = schedule.message_bytes / time / 1e9 if time else 0.0
    nodes_per_group = placement_nodes(cluster, placement)[1]
    span = "intra_node" if nodes_per_group == 1 else "inter_node"
    return Price(
        algorithm=schedule.algorithm,
        time_s=time,
        algbw_GBps=algbw,
        busbw_GBps=algbw * busbw_factor(schedule.op, schedule.num_ranks),
        bytes_sent_per_rank=int(sent.max(initial=0)),
        bytes_received_per_rank=int(received.max(initial=0)),
        steps=schedule.num_steps,
        bottleneck=links[0] if links else {},
        links=links,
        span=span,
        nodes_per_group=nodes_per_group,
    )
