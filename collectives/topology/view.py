"""The part of a cluster one group's traffic touches, as vertices and edges to draw (issue 9 item 1).

Built from the cluster's own link table: every edge is one or more link ids of :class:`Cluster`, with the
label ``describe_link`` gives it, which is the label pricing reports in a call's ``placement.links``, and
its endpoints come from ``Cluster.endpoints``, the same description ``Cluster.graph`` reads.

Two shapes, both bounded in size whatever the group:

- **detailed** (the group spans at most ``MAX_NODES`` nodes): the nodes as boxes holding their GPUs (the
  group's first, then the others, at most ``MAX_GPUS`` per node) and every link that traffic among those GPUs
  crosses as ``Cluster.route`` routes it (the node's switch or mesh, PCIe, NICs, leaves, the spines when it
  crosses leaves, every router on a shortest path, at most ``MAX_ROUTER_LINKS`` of the network's
  ``capped_family``), plus each GPU's PCIe and
  NIC links into the network. One edge per directed link. Routing decides, so a new fabric or network is
  drawn once it is routed, with no change here.
- **aggregated** (more nodes): the first ``MAX_BOXES`` nodes as boxes counting their devices in the group,
  and what the network plug-in draws between them (``draw_aggregated``): on a fat-tree each node's NIC k
  (k < ``MAX_NICS``) joins its rail (rail-optimised: leaf k of every unit) or its unit's leaf, one edge
  holding both directions' link ids; on a router network, the router links between drawn nodes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from .._errors import CollectiveError
from .cluster import Cluster

MAX_NODES = 6  # nodes drawn in detail; more is drawn aggregated (a screen holds about six node boxes)
MAX_GPUS = 16  # GPUs drawn per node (an NVL72 rack shows its group's GPUs first)
MAX_BOXES = 128  # node boxes in the aggregated view
MAX_NICS = 16  # NICs per box bundled to their rails in the aggregated view: at most 128 x 16 = 2,048 bundles
MAX_ROUTER_LINKS = 512  # router links on shortest paths drawn in the detailed view of a router network


@dataclass(frozen=True)
class Vertex:
    """``kind``: gpu, node (the box holding a node's GPUs), switch (the node's NVSwitch or PCIe switch), nic,
    leaf, spine, router; aggregated: node_box, rail. ``parent``: the node box a vertex is drawn in."""

    id: str
    kind: str
    label: str
    node: int | None = None
    parent: str | None = None
    member: bool = False  # a GPU of the group
    members: int = 0  # node_box: how many of its devices are in the group


@dataclass(frozen=True)
class Edge:
    """One directed link (``links`` has its id and ``label`` is its label), or a bundle of links drawn as
    one (aggregated view). ``utilisation``: the busiest of ``links`` in the utilisations given."""

    id: str
    source: str
    target: str
    links: tuple[int, ...]
    label: str
    kind: str
    family: str
    capacity_GBps: float
    utilisation: float = 0.0

    @property
    def bundle(self) -> bool:
        return len(self.links) > 1


@dataclass(frozen=True)
class Subgraph:
    vertices: tuple[Vertex, ...]
    edges: tuple[Edge, ...]
    aggregated: bool
    nodes: int  # nodes the devices span
    nodes_drawn: tuple[int, ...]
    truncated: bool  # something was left out to stay in bounds (GPUs, boxes or router links)

    @property
    def link_ids(self) -> set[int]:
        return {link for e in self.edges for link in e.links}


def subgraph(cluster: Cluster, devices: Sequence[int], utilisation: Mapping[int, float] | None = None) -> Subgraph:
    """The subgraph drawn for a group on ``devices`` (global device ids), edges coloured by ``utilisation``
    (link id -> busy fraction; links absent are idle)."""
    dev = np.asarray(devices, dtype=np.int64)
    if dev.size == 0:
        raise CollectiveError("devices", "give at least one device, got none")
    cluster.check_devices(dev, "devices")
    if np.unique(dev).size != dev.size:
        values, counts = np.unique(dev, return_counts=True)
        raise CollectiveError("devices", f"device {int(values[counts > 1][0])} is listed twice")
    use = dict(utilisation or {})
    for link in use:
        if not 0 <= link < cluster.num_links:
            raise CollectiveError("utilisation", f"no link {link}: the cluster has links 0..{cluster.num_links - 1}")
    nodes = list(dict.fromkeys((dev // cluster.per_node).tolist()))  # in the group's order
    if len(nodes) > MAX_NODES:
        return _Aggregated(cluster, dev, nodes, use).build()
    return _Detailed(cluster, dev, nodes, use).build()


class _Builder:
    def __init__(self, cluster: Cluster, dev: np.ndarray, nodes: list[int], use: dict[int, float]):
        self.cluster, self.dev, self.nodes, self.use = cluster, dev, nodes, use
        self.members = set(dev.tolist())
        self.vertices: dict[str, Vertex] = {}
        self.edges: list[Edge] = []
        self.truncated = False

    def vertex(self, v: Vertex) -> None:
        self.vertices.setdefault(v.id, v)

    def edge(self, edge_id: str, source: str, target: str, links: Iterable[int], label: str | None = None) -> None:
        links = tuple(int(link) for link in links)
        first = self.cluster.describe_link(links[0])
        self.edges.append(
            Edge(
                edge_id,
                source,
                target,
                links,
                label or first["label"],
                first["kind"],
                first["family"],
                first["capacity_GBps"],
                max(self.use.get(link, 0.0) for link in links),
            )
        )

    def result(self, aggregated: bool, drawn: list[int]) -> Subgraph:
        return Subgraph(
            tuple(self.vertices.values()), tuple(self.edges), aggregated, len(self.nodes), tuple(drawn), self.truncated
        )


class _Detailed(_Builder):
    """The links traffic among the drawn GPUs crosses, as ``Cluster.route`` routes it (so a new fabric or
    network is drawn as soon as it is routed), plus each GPU's way into the network (PCIe and NIC, both
    directions, as routing takes it for in-network reduction); vertices named by ``Cluster.endpoints``."""

    def build(self) -> Subgraph:
        c = self.cluster
        gpus: list[int] = []
        for node in self.nodes:
            self.vertex(Vertex(f"n{node}", "node", f"node {node}", node))
            gpus += self._gpus(node)
        for g in gpus:
            self.vertex(self._vertex(("device", g)))
        for link in self._links(np.array(gpus, dtype=np.int64)):
            u, v = c.endpoints(link)
            self.vertex(self._vertex(u))
            self.vertex(self._vertex(v))
            self.edge(f"e{link}", _vid(c, u), _vid(c, v), (link,))
        return self.result(False, self.nodes)

    def _gpus(self, node: int) -> list[int]:
        d = self.cluster.per_node
        everyone = range(node * d, (node + 1) * d)
        first = [g for g in everyone if g in self.members] + [g for g in everyone if g not in self.members]
        self.truncated |= d > MAX_GPUS
        return sorted(first[:MAX_GPUS])

    def _links(self, gpus: np.ndarray) -> list[int]:
        """Sorted link ids: routed among ``gpus`` and to the network, whose ends are drawn GPUs or lie
        outside any node (a ring passing an undrawn GPU is cut there); router links capped."""
        c = self.cluster
        src, dst = np.repeat(gpus, gpus.size), np.tile(gpus, gpus.size)
        apart = src != dst
        if not c.fabric.connects_devices:  # GPUs of a node do not talk to each other (Cluster.route refuses)
            apart &= c.node_of(src) != c.node_of(dst)
        found = set(_loaded(c.route(src[apart], dst[apart], None)[0]))
        if c.num_nodes > 1:  # a negative device is the network's switch (Cluster.route)
            switch = np.full(gpus.size, -1, dtype=np.int64)
            found.update(
                _loaded(c.route(np.concatenate([gpus, switch]), np.concatenate([switch, gpus]), None, "network")[0])
            )
        drawn = set(gpus.tolist())
        keep = sorted(link for link in found if all(self._drawn(end, drawn) for end in c.endpoints(link)))
        capped = c.network.capped_family if c.num_nodes > 1 else None
        fanned = [link for link in keep if c.family_of(link).name == capped]
        self.truncated |= len(fanned) > MAX_ROUTER_LINKS
        dropped = set(fanned[MAX_ROUTER_LINKS:])
        return [link for link in keep if link not in dropped]

    def _drawn(self, vertex: tuple, gpus: set[int]) -> bool:
        if vertex[0] == "device":
            return vertex[1] in gpus
        node = self.cluster.vertex_node(vertex)
        return node is None or node in self.nodes

    def _vertex(self, key: tuple) -> Vertex:
        c, kind = self.cluster, key[0]
        node = c.vertex_node(key)
        parent = f"n{node}" if node is not None else None
        if kind == "device":
            return Vertex(_vid(c, key), "gpu", str(key[1] % c.per_node), node, parent, key[1] in self.members)
        if kind == "switch":
            label = "PCIe switch" if c.spec.intra.link_name == "pcie" else "NVSwitch"
            return Vertex(_vid(c, key), "switch", label, node, parent)
        return Vertex(_vid(c, key), kind, c.vertex_name(key, within=node), node, parent)


class _Aggregated(_Builder):
    """Node boxes; NIC links bundled per node and rail (fat-tree) or router links between boxes."""

    def build(self) -> Subgraph:
        c, d = self.cluster, self.cluster.per_node
        drawn = self.nodes[:MAX_BOXES]
        self.truncated = len(self.nodes) > len(drawn)
        counts = np.bincount(self.dev // d, minlength=c.num_nodes)
        for node in drawn:
            self.vertex(Vertex(f"b{node}", "node_box", f"node {node}", node, members=int(counts[node])))
        if c.num_nodes > 1:
            c.network.draw_aggregated(self, drawn)  # the network plug-in draws its part (networks/)
        return self.result(True, drawn)


def _loaded(loads) -> list[int]:
    return [int(link) for link in loads.links[loads.bytes > 0]]


VERTEX_PREFIX = {"leaf": "l", "router": "r"}


def _vid(cluster: Cluster, key: tuple) -> str:
    """Drawing ids: d<device>, s<node>, c<global NIC>, l<leaf>, spine, r<router>; a vertex kind of another
    network plug-in: <kind>:<index> (its first letter could be taken)."""
    kind = key[0]
    if kind == "device":
        return f"d{key[1]}"
    if kind == "switch":
        return f"s{key[1]}"
    if kind == "nic":
        return f"c{key[1] * cluster.spec.nics_per_node + key[2]}"
    if kind == "spine":
        return "spine"
    return f"{VERTEX_PREFIX.get(kind, kind + ':')}{key[1]}"
