"""Cluster specifications: plain validated dataclasses (bandwidth in GB/s = 1e9 B/s per direction, latency
in seconds). The HTTP layer maps its pydantic models onto these; presets.py holds the named ones."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from .._errors import CollectiveError
from .gpu import GPUSpec

INTRA_FABRICS = ("switch", "full_mesh", "ring", "none")
NETWORKS = ("fat_tree", "torus", "dragonfly", "hypercube", "none")


@dataclass(frozen=True)
class IntraNode:
    """The fabric inside one node (one NVLink domain).

    ``switch``: every device has ``bandwidth_GBps`` to a non-blocking switch (NVSwitch; the several
    switch chips of a DGX are one logical switch because traffic is sprayed over all of them).
    ``full_mesh``: every pair of devices has a direct link of ``bandwidth_GBps`` (8-NPU boards).
    ``ring``: device i links to i+1 with ``bandwidth_GBps``. ``none``: one device per node.
    """

    fabric: str = "switch"
    bandwidth_GBps: float = 450.0
    latency_s: float = 0.7e-6
    in_network_reduction: bool = False
    link_name: str = "nvlink"


@dataclass(frozen=True)
class Network:
    """The fabric between nodes.

    ``fat_tree``: NICs attach to leaf switches, leaves to spines; ``rail_optimized`` puts NIC k of every node
    of a scalable unit on leaf k (DGX SuperPOD), otherwise all NICs of a node share the node's leaf;
    ``oversubscription`` = leaf downlink / uplink capacity. ``torus`` (``dims``), ``dragonfly``
    (``group_size`` routers per group, all-to-all inside a group, one global link per pair of groups),
    ``hypercube``: one router per node, router links of ``link_bandwidth_GBps``.
    """

    topology: str = "fat_tree"
    rail_optimized: bool = True
    nodes_per_leaf: int = 32
    num_spines: int = 8
    oversubscription: float = 1.0
    dims: tuple[int, ...] = ()
    group_size: int = 4
    link_bandwidth_GBps: float = 50.0
    switch_latency_s: float = 0.15e-6
    in_network_reduction: bool = False


@dataclass(frozen=True)
class ClusterSpec:
    name: str
    num_nodes: int
    devices_per_node: int
    intra: IntraNode = field(default_factory=IntraNode)
    nics_per_node: int = 8
    nic_bandwidth_GBps: float = 50.0
    nic_latency_s: float = 1.0e-6
    pcie_bandwidth_GBps: float = 64.0
    network: Network = field(default_factory=Network)
    device: str = ""
    gpu: GPUSpec | None = None  # compute and memory of each device (gpu.py); None: step time unavailable
    description: str = ""
    sources: tuple[str, ...] = ()
    calibration: object = None  # fitted constants (fit.Constants, hashable) price_call applies; None: defaults

    @property
    def num_devices(self) -> int:
        return self.num_nodes * self.devices_per_node

    def with_nodes(self, num_nodes: int) -> ClusterSpec:
        return replace(self, num_nodes=num_nodes)


MAX_DEVICES = 131_072


def validate_cluster(spec: ClusterSpec) -> None:
    """Every rule with its numbers; raises CollectiveError naming the field."""
    _positive("num_nodes", spec.num_nodes)
    _positive("devices_per_node", spec.devices_per_node)
    if spec.num_devices > MAX_DEVICES:
        raise CollectiveError(
            "num_nodes",
            f"num_nodes x devices_per_node = {spec.num_nodes} x {spec.devices_per_node} = {spec.num_devices} "
            f"devices; at most {MAX_DEVICES} are supported",
        )
    if spec.intra.fabric not in INTRA_FABRICS:
        raise CollectiveError(
            "intra.fabric", f"unknown fabric {spec.intra.fabric!r}; known: {', '.join(INTRA_FABRICS)}"
        )
    if spec.intra.fabric == "none" and spec.devices_per_node > 1:
        raise CollectiveError(
            "intra.fabric", f"'none' needs 1 device per node, got {spec.devices_per_node} (they would be disconnected)"
        )
    if spec.intra.fabric != "none" or spec.devices_per_node > 1:
        _bandwidth("intra.bandwidth_GBps", spec.intra.bandwidth_GBps)
    _non_negative("intra.latency_s", spec.intra.latency_s)
    net = spec.network
    if net.topology not in NETWORKS:
        raise CollectiveError("network.topology", f"unknown network {net.topology!r}; known: {', '.join(NETWORKS)}")
    if spec.num_nodes > 1 and net.topology == "none":
        raise CollectiveError(
            "network.topology", f"{spec.num_nodes} nodes need a network, got 'none' (the graph would be disconnected)"
        )
    if spec.num_nodes > 1:
        _positive("nics_per_node", spec.nics_per_node)
        _bandwidth("nic_bandwidth_GBps", spec.nic_bandwidth_GBps)
        _bandwidth("pcie_bandwidth_GBps", spec.pcie_bandwidth_GBps)
        if spec.devices_per_node % spec.nics_per_node and spec.nics_per_node % spec.devices_per_node:
            raise CollectiveError(
                "nics_per_node",
                f"devices_per_node {spec.devices_per_node} and nics_per_node {spec.nics_per_node}: "
                "one must divide the other",
            )
        _non_negative("nic_latency_s", spec.nic_latency_s)
        _non_negative("network.switch_latency_s", net.switch_latency_s)
        _validate_network(spec)


def _validate_network(spec: ClusterSpec) -> None:
    net = spec.network
    if net.topology == "fat_tree":
        _positive("network.nodes_per_leaf", net.nodes_per_leaf)
        _positive("network.num_spines", net.num_spines)
        if net.oversubscription < 1:
            raise CollectiveError(
                "network.oversubscription", f"must be >= 1 (downlink:uplink), got {net.oversubscription}"
            )
        return
    _bandwidth("network.link_bandwidth_GBps", net.link_bandwidth_GBps)
    if net.topology == "torus":
        product = 1
        for d in net.dims:
            _positive("network.dims", d)
            product *= d
        if product != spec.num_nodes:
            dims = " x ".join(map(str, net.dims)) or "()"
            raise CollectiveError(
                "network.dims", f"torus {dims} = {product} routers but the cluster has {spec.num_nodes} nodes"
            )
    elif net.topology == "dragonfly":
        _positive("network.group_size", net.group_size)
        if spec.num_nodes % net.group_size:
            raise CollectiveError(
                "network.group_size", f"{spec.num_nodes} nodes do not split into groups of {net.group_size}"
            )
    elif net.topology == "hypercube" and spec.num_nodes & (spec.num_nodes - 1):
        raise CollectiveError("num_nodes", f"a hypercube needs a power-of-two number of nodes, got {spec.num_nodes}")


def _positive(name: str, value) -> None:
    if not value > 0:
        raise CollectiveError(name, f"must be > 0, got {value}")


MIN_BANDWIDTH_GBPS = 1e-3  # 1 MB/s: below it a byte count over a link overflows the float seconds


def _bandwidth(name: str, value) -> None:
    if not value >= MIN_BANDWIDTH_GBPS:
        raise CollectiveError(
            name, f"must be >= {MIN_BANDWIDTH_GBPS} GB/s (zero or negative bandwidth is no link), got {value}"
        )


def _non_negative(name: str, value) -> None:
    if not value >= 0:
        raise CollectiveError(name, f"must be >= 0, got {value}")
