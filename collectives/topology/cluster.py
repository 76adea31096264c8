"""A cluster as directed links with capacities, and device-to-device routing over them.

Every directed link has an integer id; links of one kind form a *family* laid out so that the link a
transfer uses is index arithmetic on the device number (``dev_up[d] = d`` and so on). Routing a step of
16,384 transfers is therefore a handful of numpy operations, with no all-pairs shortest paths:

- inside a node: the fabric plug-in's (fabrics/: one module per fabric, registered by name; switch: device
  up-link then the destination's down-link; full mesh: the direct link; ring: the shorter way round, split
  evenly when both ways are equally short);
- between nodes: device -> its NIC (PCIe) -> network -> the destination's NIC -> device. The network part
  is the network plug-in's (networks/: one module per network, registered by name): on a fat-tree leaf,
  or leaf -> spines -> leaf, the up-links of one leaf acting as one bundle (ECMP); on a torus, dragonfly or
  hypercube every shortest router path, equally likely (ECMP), shares from shortest-path counts.

:meth:`Cluster.graph` builds the same links as a networkx DiGraph with typed nodes for inspection and
drawing; routing never needs it. :attr:`Cluster.network` is the plug-in built for this cluster: its link
families come after the NICs', it routes between NICs, names its links' endpoints and says its unit of
symmetry (``unit_nodes``, ``link_shifts``); :attr:`Cluster.symmetry_unit` and :meth:`Cluster.translate_link`
turn that into devices and link ids, and symmetry.py prices with it. loads.py sums bytes per link.

Clusters are immutable: :func:`cluster_for` builds one per spec and keeps the last ``CLUSTER_CACHE``
(routing tables, link rates and labels are memoised on them).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache

import networkx as nx
import numpy as np

from .._errors import CollectiveError
from .fabrics import FabricModel, fabric_type
from .loads import Loads, _Loads, _ones_if_none, _pick
from .networks import NetworkModel, network_type
from .spec import ClusterSpec, validate_cluster

__all__ = ["CLUSTER_CACHE", "Cluster", "Family", "Loads", "cluster_for"]

CLUSTER_CACHE = 16  # clusters kept by cluster_for: a service plans on a few clusters at a time


@dataclass(frozen=True)
class Family:
    name: str
    kind: str
    start: int
    size: int
    capacity_GBps: float
    latency_s: float


class Cluster:
    def __init__(self, spec: ClusterSpec):
        validate_cluster(spec)
        self.spec = spec
        self.num_nodes, self.per_node = spec.num_nodes, spec.devices_per_node
        self.num_devices = spec.num_devices
        self.families: dict[str, Family] = {}
        self._layout_links()

    # ---- link layout -------------------------------------------------------------------------------
    def _add(self, name: str, kind: str, size: int, capacity: float, latency: float) -> None:
        start = sum(f.size for f in self.families.values())
        self.families[name] = Family(name, kind, start, size, capacity, latency)

    def _layout_links(self) -> None:
        s, n_dev = self.spec, self.num_devices
        for family in self.fabric.families():
            self._add(*family)
        if self.num_nodes == 1:
            return
        k = s.nics_per_node
        self._add("host_up", "pcie", n_dev, s.pcie_bandwidth_GBps, 0.0)
        self._add("host_down", "pcie", n_dev, s.pcie_bandwidth_GBps, 0.0)
        self._add("nic_up", "nic", self.num_nodes * k, s.nic_bandwidth_GBps, s.nic_latency_s)
        self._add("nic_down", "nic", self.num_nodes * k, s.nic_bandwidth_GBps, s.nic_latency_s)
        for family in self.network.families():
            self._add(*family)

    @cached_property
    def fabric(self) -> FabricModel:
        """The fabric inside each node: the plug-in registered under the spec's ``intra.fabric``."""
        return fabric_type(self.spec.intra.fabric)(self.spec)

    @cached_property
    def network(self) -> NetworkModel:
        """The network between nodes: the plug-in registered under the spec's ``network.topology``."""
        return network_type(self.spec.network.topology)(self.spec)

    @cached_property
    def symmetry_unit(self) -> int | None:
        """Devices by which a placement can be moved without changing its price: the whole cluster when it
        is one node, else the network's unit (``unit_nodes`` nodes), or None when the network has none."""
        if self.num_nodes == 1:
            return self.num_devices
        nodes = self.network.unit_nodes
        return None if nodes is None else nodes * self.per_node

    @property
    def nodes_alike_in_unit(self) -> bool:
        """Whether the nodes of one unit of symmetry are interchangeable (a placement inside one unit may
        move by whole nodes too): said by the network; trivially so on one node."""
        return self.num_nodes == 1 or self.network.nodes_alike_in_unit

    @property
    def num_links(self) -> int:
        return sum(f.size for f in self.families.values())

    @cached_property
    def capacity_GBps(self) -> np.ndarray:
        return np.concatenate([np.zeros(0), *(np.full(f.size, f.capacity_GBps) for f in self.families.values())])

    def rate(self, calibration, in_network: str | None = None) -> np.ndarray:
        """Bytes per second each link really carries: capacity x the calibrated efficiency of its kind.
        When the node's switch reduces (``in_network='intra'``, NVLS) the device ports run at the NVLS
        efficiency instead; SHARP in the network (``'network'``) streams at line rate, so links keep theirs."""
        key = (id(calibration), in_network)
        cache = self.__dict__.setdefault("_rate_memo", {})
        if key not in cache:
            per_family = [
                np.full(f.size, f.capacity_GBps * 1e9 * self._efficiency(f, calibration, in_network))
                for f in self.families.values()
            ]
            cache[key] = np.concatenate([np.zeros(0), *per_family])  # a one-device cluster has no links
        return cache[key]

    def _efficiency(self, f: Family, calibration, in_network: str | None) -> float:
        if in_network == "intra" and f.name in self.fabric.reduction_families:
            return calibration.in_network_efficiency
        return calibration.efficiency.get(f.kind, 1.0)

    def translate_link(self, link: int, shift: int) -> int:
        """The same link on a placement moved ``shift`` devices further on, a shift that symmetry.canonical
        makes: whole units of symmetry (``symmetry_unit``), plus whole nodes inside one unit. Pricing reuses
        the moved placement's price and relabels its links with this."""
        if shift == 0:
            return link
        for start, end, step in self._link_shifts(shift):
            if start <= link < end:
                return link + step
        raise CollectiveError("link", f"no link {link}")

    def _link_shifts(self, shift: int) -> list[tuple[int, int, int]]:
        """(first id, end id, step) per family for a placement moved ``shift`` devices on (memoised). Links
        of the network move by the whole units in the shift; the rest of a shift keeps the placement
        under the same leaves."""
        memo = self.__dict__.setdefault("_shift_memo", {})
        if shift not in memo:
            if self.symmetry_unit is None or shift % self.per_node:
                raise CollectiveError("link", f"cluster {self.spec.name!r} cannot move a placement by {shift} devices")
            nodes = shift // self.per_node
            step = self.fabric.link_shifts(shift) | {
                "host_up": shift,
                "host_down": shift,
                "nic_up": nodes * self.spec.nics_per_node,
                "nic_down": nodes * self.spec.nics_per_node,
            }
            if self.num_nodes > 1:
                step |= self.network.link_shifts(shift // self.symmetry_unit)
            memo[shift] = [(f.start, f.start + f.size, step.get(f.name, 0)) for f in self.families.values()]
        return memo[shift]

    def describe_link(self, link: int) -> dict:
        """id, family, index, kind, label and capacity of one link (memoised; callers get a copy)."""
        memo = self.__dict__.setdefault("_describe_memo", {})
        if link not in memo:
            memo[link] = self._describe(link)
        return dict(memo[link])

    def _describe(self, link: int) -> dict:
        f = self.family_of(link)
        i = int(link - f.start)
        return {
            "id": int(link),
            "family": f.name,
            "kind": f.kind,
            "index": i,
            "label": self._label(f, i),
            "capacity_GBps": f.capacity_GBps,
        }

    def _label(self, f: Family, i: int) -> str:
        """``source -> target``, named from the link's endpoints (``endpoints``: the one description of where
        each link runs); the target leaves out the node its source already names (``node 3 gpu 1 -> nic 0``)."""
        u, v = self._endpoints(f.name, i)
        return f"{self.vertex_name(u)} -> {self.vertex_name(v, within=self.vertex_node(u))}"

    def vertex_node(self, vertex: tuple) -> int | None:
        """The node a vertex of the graph sits in (GPU, its switch, its NICs); None for network switches."""
        if vertex[0] == "device":
            return vertex[1] // self.per_node
        return vertex[1] if vertex[0] in ("switch", "nic") else None

    def vertex_name(self, vertex: tuple, within: int | None = None) -> str:
        """``node 3 gpu 1``, ``node 3 switch``, ``node 3 nic 0``, ``leaf 4``, ``spines``, ``router 7``; without
        the ``node 3`` when the vertex is ``within`` node 3."""
        kind, node = vertex[0], self.vertex_node(vertex)
        local = {"device": lambda: f"gpu {vertex[1] % self.per_node}", "switch": lambda: "switch"}
        name = local[kind]() if kind in local else "spines" if kind == "spine" else f"{kind} {vertex[-1]}"
        return name if node is None or node == within else f"node {node} {name}"

    # ---- device coordinates ------------------------------------------------------------------------
    def node_of(self, dev: np.ndarray) -> np.ndarray:
        return dev // self.per_node

    def nic_of(self, dev: np.ndarray) -> np.ndarray:
        """Global NIC index a device sends through: its rail's NIC (NIC i*K/D of its node)."""
        return self._nic_table[dev]

    @cached_property
    def _nic_table(self) -> np.ndarray:
        k, d = self.spec.nics_per_node, self.per_node
        dev = np.arange(self.num_devices)
        return dev // d * k + (dev % d) * k // d

    def check_devices(self, devices: np.ndarray, field: str = "ranks") -> None:
        if devices.size and (devices.min() < 0 or devices.max() >= self.num_devices):
            bad = int(devices[(devices < 0) | (devices >= self.num_devices)][0])
            raise CollectiveError(
                field, f"device {bad} is outside the cluster's {self.num_devices} devices (0..{self.num_devices - 1})"
            )

    # ---- routing -----------------------------------------------------------------------------------
    def route(self, src: np.ndarray, dst: np.ndarray, nbytes: np.ndarray | None, in_network: str | None = None):
        """Bytes per link (sparse :class:`Loads`) for transfers src[i] -> dst[i] of nbytes[i] (``None``: one
        byte each), and the longest path latency.

        A negative device number stands for the in-network reduction switch (see in_network.py):
        ``in_network='intra'`` (NVLS: the node's switch) or ``'network'`` (SHARP: the leaf).
        """
        loads = _Loads(self.num_links)
        latency = 0.0
        to_switch, from_switch = dst < 0, src < 0
        if to_switch.any() or from_switch.any():
            latency = self._route_in_network(
                loads, src, dst, _ones_if_none(nbytes, src), to_switch, from_switch, in_network
            )
            keep = ~(to_switch | from_switch)
            src, dst, nbytes = src[keep], dst[keep], _pick(nbytes, keep)
            if src.size == 0:  # all to or from the switch: no device pair left (a fabric 'none' node has none)
                return loads.total(), latency
        same = self.node_of(src) == self.node_of(dst)
        if same.all():
            latency = max(latency, self._route_intra(loads, src, dst, nbytes))
        elif not same.any():
            latency = max(latency, self._route_inter(loads, src, dst, nbytes))
        else:
            latency = max(latency, self._route_intra(loads, src[same], dst[same], _pick(nbytes, same)))
            latency = max(latency, self._route_inter(loads, src[~same], dst[~same], _pick(nbytes, ~same)))
        return loads.total(), latency

    def _fam(self, name: str) -> int:
        return self.families[name].start

    def _route_intra(self, loads, src, dst, nbytes) -> float:
        return self.fabric.route(loads, self._fam, src, dst, nbytes)

    def _route_inter(self, loads, src, dst, nbytes) -> float:
        s = self.spec
        loads.add(self._fam("host_up") + src, nbytes)
        loads.add(self._fam("host_down") + dst, nbytes)
        nic_src, nic_dst = self.nic_of(src), self.nic_of(dst)
        loads.add(self._fam("nic_up") + nic_src, nbytes)
        loads.add(self._fam("nic_down") + nic_dst, nbytes)
        network = self.network.route(loads, self._fam, nic_src, nic_dst, self.node_of(src), self.node_of(dst), nbytes)
        return 2 * s.nic_latency_s + network

    def _route_in_network(self, loads, src, dst, nbytes, to_switch, from_switch, level) -> float:
        if level == "intra":
            return self.fabric.route_reduction(
                loads, self._fam, src[to_switch], nbytes[to_switch], dst[from_switch], nbytes[from_switch]
            )
        nbytes = _ones_if_none(nbytes, src)
        up, down = src[to_switch], dst[from_switch]
        loads.add(self._fam("host_up") + up, nbytes[to_switch])
        loads.add(self._fam("nic_up") + self.nic_of(up), nbytes[to_switch])
        loads.add(self._fam("nic_down") + self.nic_of(down), nbytes[from_switch])
        loads.add(self._fam("host_down") + down, nbytes[from_switch])
        return self.spec.nic_latency_s + 2 * self.spec.network.switch_latency_s

    # ---- the graph view ----------------------------------------------------------------------------
    def graph(self) -> nx.DiGraph:
        """The cluster as a networkx DiGraph: typed nodes (device, switch, nic, leaf, spine, router) and
        directed edges carrying ``link`` (the id routing uses), ``kind``, ``capacity_GBps``, ``latency_s``.
        For clusters of a few thousand devices; routing itself never builds it."""
        g = nx.DiGraph()
        d = self.per_node
        for dev in range(self.num_devices):
            g.add_node(("device", dev), kind="device", node=dev // d, local=dev % d)
        for name, fam in self.families.items():
            for i in range(fam.size):
                u, v = self._endpoints(name, i)
                g.add_edge(
                    u, v, link=fam.start + i, kind=fam.kind, capacity_GBps=fam.capacity_GBps, latency_s=fam.latency_s
                )
        return g

    def endpoints(self, link: int) -> tuple[tuple, tuple]:
        """The two vertices a link joins, as graph() names them: the one description of the link geometry
        that graph(), the labels and the drawn subgraph (view.py) all read."""
        f = self.family_of(link)
        return self._endpoints(f.name, link - f.start)

    def family_of(self, link: int) -> Family:
        for f in self.families.values():
            if f.start <= link < f.start + f.size:
                return f
        raise CollectiveError("link", f"no link {link} (the cluster has {self.num_links})")

    def _endpoints(self, name: str, i: int):
        d, k = self.per_node, self.spec.nics_per_node
        nic = ("nic", i // d, (i % d) * k // d)
        if name == "host_up":
            return ("device", i), nic
        if name == "host_down":
            return nic, ("device", i)
        if name in ("nic_up", "nic_down"):
            here, there = ("nic", i // k, i % k), self.network.attach(i)
            return (here, there) if name == "nic_up" else (there, here)
        if name in self.intra_families:
            return self.fabric.endpoints(name, i)
        return self.network.endpoints(name, i)

    @cached_property
    def intra_families(self) -> frozenset[str]:
        return frozenset(f[0] for f in self.fabric.families())


@lru_cache(maxsize=CLUSTER_CACHE)
def cluster_for(spec: ClusterSpec) -> Cluster:
    """The cluster of ``spec``, built once and reused while it is among the last ``CLUSTER_CACHE`` used."""
    return Cluster(spec)
