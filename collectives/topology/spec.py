"""Cluster specifications: plain validated dataclasses (bandwidth in GB/s = 1e9 B/s per direction, latency
in seconds). The HTTP layer maps its pydantic models onto these; presets.py holds the named ones."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

from .._errors import CollectiveError
from .._hashing import frozen_hash
from .fabrics import fabric_type
from .gpu import GPU_VARIABILITY, GPUSpec, measured_preset, nested_constants
from .networks import network_type

NETWORK_KINDS = ("ib", "roce", "efa", "efa_sendrecv", "tcpx", "tcpxo")  # per-hop latency: library/calibration.py
CPU_VENDORS = ("intel", "amd", "arm")  # NCCL's llMaxBw across nodes and per-step net overhead depend on it
NCCL_VERSIONS = tuple(f"2.{m}" for m in range(18, 31))  # 2.18 .. 2.30: library/tables.py VERSIONS


@dataclass(frozen=True)
class NcclEnv:
    """The NCCL environment variables the job sets, by NCCL's own names (0 / None: not set, NCCL's default).

    - ``NCCL_MIN_NCHANNELS`` / ``NCCL_MAX_NCHANNELS`` (connect.cc ncclMinNchannels / ncclMaxNchannels): the
      channels ring and tree run, within MAXCHANNELS of the version (a value above it is refused here, where
      NCCL would clamp it silently);
    - ``NCCL_NVLS_ENABLE`` (transport/nvls.cc, default 2: on where the GPU supports multicast; 0 off; 1 on);
    - ``NCCL_COLLNET_ENABLE`` (init.cc, default 0): CollNet (SHARP) needs it at 1 and a SHARP plugin, which
      ``network.in_network_reduction`` says the network has.
    """

    NCCL_MIN_NCHANNELS: int = 0
    NCCL_MAX_NCHANNELS: int = 0
    NCCL_NVLS_ENABLE: int = 2
    NCCL_COLLNET_ENABLE: int = 0


@dataclass(frozen=True)
class IntraNode:
    """The fabric inside one node (one NVLink domain); ``fabric`` names a registered fabric plug-in
    (fabrics/: one module each, ``fabrics.names()``).

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

    ``topology`` names a registered network plug-in (networks/: one module each, ``networks.names()``);
    this block holds every network's parameters and each plug-in reads its own (its ``fields``).
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
    in_network_reduction: bool = False  # SHARP in the switches (NCCL CollNet)
    kind: str = "ib"  # ib | roce | efa | efa_sendrecv | tcpxo


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
    nccl_version: str = "2.30"  # major.minor of the NCCL whose tuning model prices this cluster
    cpu_vendor: str = "intel"
    calibration: object = None  # a library.LibraryCalibration fitted for this cluster; None: the defaults
    nccl_env: NcclEnv = field(default_factory=NcclEnv)  # NCCL_* variables the job sets (NCCL's defaults)

    __hash__ = frozen_hash  # the dataclass's hash, computed once (.._hashing): the pricers' memos key on the spec

    def __post_init__(self) -> None:
        # the GPU is launched from this node's CPU: it carries the cluster's cpu_vendor as its host_cpu (one source,
        # the cluster's; planner/kernels.py prices host time per op by it)
        if self.gpu is not None and self.gpu.host_cpu != self.cpu_vendor:
            object.__setattr__(self, "gpu", replace(self.gpu, host_cpu=self.cpu_vendor))

    @property
    def num_devices(self) -> int:
        return self.num_nodes * self.devices_per_node


def spec_block(spec: ClusterSpec) -> dict:
    """The cluster as a request block (the HTTP ClusterIn): every field that prices it, no preset, so the
    block pasted into a new request rebuilds this spec."""
    block = {
        k: getattr(spec, k)
        for k in (
            "name",
            "num_nodes",
            "devices_per_node",
            "nics_per_node",
            "nic_bandwidth_GBps",
            "nic_latency_s",
            "pcie_bandwidth_GBps",
            "nccl_version",
            "cpu_vendor",
        )
    }
    block["intra"] = {f.name: getattr(spec.intra, f.name) for f in fields(spec.intra)}
    block["network"] = {
        f.name: list(v) if isinstance(v, tuple) else v
        for f in fields(spec.network)
        if (v := getattr(spec.network, f.name)) != ()
    }
    if spec.gpu is not None:
        g = spec.gpu
        block["gpu"] = {
            "name": g.name,
            "peak_tflops": dict(g.peak_tflops),
            "hbm_bytes": g.hbm_bytes,
            "hbm_GBps": g.hbm_GBps,
            "sm": g.sm,
            "nvlink_links": g.nvlink_links,
        }
        block["gpu"] |= {k: v for k in ("sms", "tdp_w", "min_power_w", "power_limit_w") if (v := getattr(g, k))}
        if g.variability != GPU_VARIABILITY:  # the default is left out (a block without it rebuilds the default)
            block["gpu"]["variability"] = g.variability
        if preset := measured_preset(g):  # the measured clock no field carries (gpu.py GPUSpec.sustained_clock)
            block["gpu"]["preset"] = preset
    if spec.nccl_env != NcclEnv():
        block["nccl_env"] = {
            f.name: v for f in fields(spec.nccl_env) if (v := getattr(spec.nccl_env, f.name)) != f.default
        }
    if spec.calibration is not None:  # fitted constants (fit.py names), as POST /v1/calibrate returns them
        c = spec.calibration
        block["calibration"] = {
            "efficiency": dict(c.efficiency),
            "latency_scale": dict(c.latency_scale),
            "network_latency_s": dict(c.network_latency_s),
        }
    if spec.gpu is not None and spec.gpu.kernel_constants:  # compute constants a profiler trace fitted
        block.setdefault("calibration", {})["kernels"] = nested_constants(spec.gpu.kernel_constants)
    return block


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
    fabric = fabric_type(spec.intra.fabric)  # an unknown name is an error listing the registered ones
    if spec.devices_per_node > 1 and not fabric.connects_devices:
        raise CollectiveError(
            "intra.fabric",
            f"{spec.intra.fabric!r} needs 1 device per node, got {spec.devices_per_node} (they would be disconnected)",
        )
    fabric.validate(spec)  # the fabric's own rules (fabrics/<name>.py)
    _non_negative("intra.latency_s", spec.intra.latency_s)
    _one_of("network.kind", spec.network.kind, NETWORK_KINDS, "network kind")
    _one_of("cpu_vendor", spec.cpu_vendor, CPU_VENDORS, "CPU vendor")
    if nccl_minor(spec.nccl_version) not in NCCL_VERSIONS:
        raise CollectiveError(
            "nccl_version",
            f"NCCL {spec.nccl_version!r} is outside the versions whose tuning tables are transcribed: "
            f"{NCCL_VERSIONS[0]} to {NCCL_VERSIONS[-1]} (major.minor, or major.minor.patch)",
        )
    _validate_calibration(spec.calibration)
    _validate_nccl_env(spec.nccl_env, nccl_minor(spec.nccl_version))
    net = spec.network
    network = network_type(net.topology)  # an unknown name is an error listing the registered ones
    if spec.num_nodes > 1 and not network.connects_nodes:
        raise CollectiveError(
            "network.topology",
            f"{spec.num_nodes} nodes need a network, got {net.topology!r} (the graph would be disconnected)",
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
        network.validate(spec)  # the network's own rules (networks/<name>.py)


def _validate_nccl_env(env: NcclEnv, version: str) -> None:
    from .library.tables import max_channels

    most = max_channels(version)
    for name in ("NCCL_MIN_NCHANNELS", "NCCL_MAX_NCHANNELS"):
        value = getattr(env, name)
        if not 0 <= value <= most:
            raise CollectiveError(
                f"nccl_env.{name}",
                f"must be within 1..{most} (MAXCHANNELS of NCCL {version}, device.h; 0: not set), got {value}",
            )
    for name, allowed in (("NCCL_NVLS_ENABLE", (0, 1, 2)), ("NCCL_COLLNET_ENABLE", (0, 1))):
        if getattr(env, name) not in allowed:
            raise CollectiveError(
                f"nccl_env.{name}", f"must be one of {', '.join(map(str, allowed))}, got {getattr(env, name)}"
            )


def _validate_calibration(cal) -> None:
    if cal is None:
        return
    from .library.calibration import LibraryCalibration

    if not isinstance(cal, LibraryCalibration):
        raise CollectiveError("calibration", f"must be a LibraryCalibration, got {type(cal).__name__}")
    for group in ("efficiency", "latency_scale", "network_latency_s"):
        for key, value in getattr(cal, group).items():
            if not (value > 0 if group != "network_latency_s" else value >= 0) or value != value:
                raise CollectiveError(
                    f"calibration.{group}.{key}",
                    f"must be {'>= 0' if group == 'network_latency_s' else '> 0'}, got {value}",
                )


def nccl_minor(version: str) -> str:
    """'2.30.7-1' or '2.30' -> '2.30'."""
    return ".".join(str(version).split("-")[0].split(".")[:2])


def _one_of(name: str, value: str, known: tuple[str, ...], what: str) -> None:
    if value not in known:
        raise CollectiveError(name, f"unknown {what} {value!r}; known: {', '.join(known)}")


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
