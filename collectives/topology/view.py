"""The part of a cluster one group's traffic touches, as vertices and edges to draw (issue 9 item 1).

Built from the cluster's own link table: every edge is one or more link ids of :class:`Cluster`, with the
label ``describe_link`` gives it, which is the label pricing reports in a call's ``placement.links``, and
its endpoints come from ``Cluster.endpoints``, the same description ``Cluster.graph`` reads. Nothing here
knows how a topology is wired; a new topology is a new family of links in the cluster, drawn as is.

Two shapes, both bounded in size whatever the group:

- **detailed** (the group spans at most ``MAX_NODES`` nodes): the nodes as boxes holding their GPUs (the
  group's first, then the others, at most ``MAX_GPUS`` per node), the node's switch, the NICs those GPUs
  use, and the network their traffic crosses: leaves and the spines (fat-tree) or every router on a
  shortest path between the nodes' routers (torus, dragonfly, hypercube; at most ``MAX_ROUTER_LINKS``).
  One edge per directed link.
- **aggregated** (more nodes): the first ``MAX_BOXES`` nodes as boxes counting their devices in the group;
  on a fat-tree each node's NIC k joins its rail (rail-optimised: leaf k of every unit) or its unit's leaf,
  one edge holding both directions' link ids; on a router network, the router links between drawn nodes.
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
        raise CollectiveError("devices", "give at least one device")
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
    """Every directed link among the drawn vertices, named by ``Cluster.endpoints``."""

    def build(self) -> Subgraph:
        c = self.cluster
        gpus: list[int] = []
        for node in self.nodes:
            self.vertex(Vertex(f"n{node}", "node", f"node {node}", node))
            gpus += self._gpus(node)
        for g in gpus:
            self.vertex(self._vertex(("device", g)))
        shown = {("device", g) for g in gpus}
        links = [link for link in self._candidate_links(gpus, shown) if self._inside(link, shown)]
        for link in links:
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

    def _candidate_links(self, gpus: list[int], shown: set[tuple]) -> list[int]:
        """Links leaving or entering the shown GPUs, the NICs and leaves those reach, and the network
        between them (adding the far ends to ``shown``); ``_inside`` keeps those whose both ends are drawn."""
        c, fam = self.cluster, self.cluster.families
        out: list[int] = []
        per = c.per_node
        for name in ("dev_up", "dev_down", "host_up", "host_down"):
            if name in fam:
                out += [fam[name].start + g for g in gpus]
        if "mesh" in fam:
            out += [
                fam["mesh"].start + g * per + (h % per) for g in gpus for h in gpus if g != h and g // per == h // per
            ]
        if "ring" in fam:
            out += [fam["ring"].start + 2 * g + side for g in gpus for side in (0, 1)]
        if c.num_nodes == 1:
            return out
        nics = sorted({int(n) for n in c.nic_of(np.array(gpus, dtype=np.int64))})
        out += [fam[name].start + n for name in ("nic_up", "nic_down") for n in nics]
        for link in out:  # the NICs' far ends (leaves, routers) are drawn
            shown.update(c.endpoints(link))
        if "leaf_up" in fam:
            leaves = sorted({int(c.leaf_of_nic(np.int64(n))) for n in nics})
            if len(leaves) > 1:  # traffic between leaves crosses the spines
                out += [fam[name].start + leaf for name in ("leaf_up", "leaf_down") for leaf in leaves]
                shown.add(("spine", "all"))
        elif "router" in fam:
            out += self._router_paths(shown)
        return out

    def _router_paths(self, shown: set[tuple]) -> list[int]:
        """Every link on a shortest path between two drawn nodes' routers (ECMP spreads over all of them)."""
        c, base = self.cluster, self.cluster.families["router"].start
        links: set[int] = set()
        for a in self.nodes:
            for b in self.nodes:
                if a != b:
                    links.update(int(link) for link in c.routers.path(a, b)[0])
        chosen = sorted(links)
        self.truncated |= len(chosen) > MAX_ROUTER_LINKS
        chosen = chosen[:MAX_ROUTER_LINKS]
        for link in chosen:
            shown.update(c.endpoints(base + link))
        return [base + link for link in chosen]

    def _inside(self, link: int, shown: set[tuple]) -> bool:
        u, v = self.cluster.endpoints(link)
        return u in shown and v in shown

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
        if c.num_nodes > 1 and "leaf_up" in c.families:
            self._rails(drawn)
        elif "router" in c.families:
            self._router_links(drawn)
        return self.result(True, drawn)

    def _rails(self, drawn: list[int]) -> None:
        c, k = self.cluster, self.cluster.spec.nics_per_node
        rail_optimized = c.spec.network.rail_optimized
        up, down = c.families["nic_up"].start, c.families["nic_down"].start
        for node in drawn:
            for i in range(k):
                nic = node * k + i
                rail = f"rail {i}" if rail_optimized else f"leaf {int(c.leaf_of_nic(np.int64(nic)))}"
                self.vertex(Vertex(rail, "rail", rail))
                label = f"node {node} nic {i} <-> {rail}"
                self.edge(f"b{node}-{i}", f"b{node}", rail, (up + nic, down + nic), label)

    def _router_links(self, drawn: list[int]) -> None:
        c, base, boxes = self.cluster, self.cluster.families["router"].start, set(drawn)
        for i, (u, v) in enumerate(c.router_links):
            if u in boxes and v in boxes:
                self.edge(f"e{base + i}", f"b{u}", f"b{v}", (base + i,))


def _vid(cluster: Cluster, key: tuple) -> str:
    """Drawing ids: d<device>, s<node>, c<global NIC>, l<leaf>, spine, r<router>."""
    kind = key[0]
    if kind == "device":
        return f"d{key[1]}"
    if kind == "switch":
        return f"s{key[1]}"
    if kind == "nic":
        return f"c{key[1] * cluster.spec.nics_per_node + key[2]}"
    if kind == "spine":
        return "spine"
    return f"{kind[0]}{key[1]}"
