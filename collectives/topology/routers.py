"""Router-based networks: one router per node joined as a torus, dragonfly or hypercube; ECMP over every
shortest path. The share of each directed router link in a node pair's traffic comes from shortest-path
counts (Brandes), memoised per router pair. Adding such a topology means adding its graph to ``graph_of``."""

from __future__ import annotations

from collections import deque
from functools import cached_property

import networkx as nx
import numpy as np

from .._errors import CollectiveError


def graph_of(network, num_nodes: int) -> nx.Graph:
    """The router graph of ``network`` (spec.Network) over ``num_nodes`` routers, integer-labelled."""
    if network.topology == "torus":
        g = nx.grid_graph(dim=list(reversed(network.dims)), periodic=True) if num_nodes > 1 else nx.empty_graph(1)
        return nx.convert_node_labels_to_integers(g, ordering="sorted")
    if network.topology == "hypercube":
        return nx.convert_node_labels_to_integers(nx.hypercube_graph(num_nodes.bit_length() - 1), ordering="sorted")
    return _dragonfly(num_nodes, network.group_size)


class RouterNetwork:
    # Symmetry (symmetry.py): none is used. A torus is symmetric under translation, but a dragonfly's global
    # links and a partial hypercube are not, and every router link may carry any group's traffic, so
    # placements on router networks are always priced where they are.
    unit_nodes: int | None = None
    nodes_alike_in_unit = False

    def link_shifts(self, units: int) -> dict[str, int]:
        raise CollectiveError("network", "router networks have no unit of symmetry to move links by")

    def __init__(self, network, num_nodes: int):
        self.network, self.num_nodes = network, num_nodes
        self._memo: dict[tuple[int, int], tuple[np.ndarray, np.ndarray, int]] = {}
        self._bfs_memo: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    @cached_property
    def graph(self) -> nx.Graph:
        return graph_of(self.network, self.num_nodes)

    @cached_property
    def links(self) -> list[tuple[int, int]]:
        """Directed router links, sorted: link i of the cluster's ``router`` family."""
        return sorted({(u, v) for u, v in self.graph.edges} | {(v, u) for u, v in self.graph.edges})

    @cached_property
    def _link_id(self) -> dict[tuple[int, int], int]:
        return {uv: i for i, uv in enumerate(self.links)}

    @cached_property
    def _adjacency(self) -> list[list[int]]:
        return [sorted(self.graph.neighbors(v)) for v in range(self.num_nodes)]

    def route(self, loads, base: int, node_src, node_dst, nbytes) -> float:
        """Add each node pair's bytes to ``loads`` (link ids from ``base``); the longest path's latency."""
        pairs = node_src * self.num_nodes + node_dst
        unique, inverse = np.unique(pairs, return_inverse=True)
        per_pair = np.bincount(inverse, weights=nbytes)
        longest = 0
        for pair, total in zip(unique.tolist(), per_pair.tolist(), strict=True):
            links, shares, hops = self.path(*divmod(pair, self.num_nodes))
            loads.add(base + links, total * shares)
            longest = max(longest, hops)
        return longest * self.network.switch_latency_s

    def _bfs(self, source: int) -> tuple[np.ndarray, np.ndarray]:
        """Hop distance and number of shortest paths from ``source`` to every router."""
        if source in self._bfs_memo:
            return self._bfs_memo[source]
        dist = np.full(self.num_nodes, -1, dtype=np.int64)
        count = np.zeros(self.num_nodes)
        dist[source], count[source] = 0, 1.0
        queue = deque([source])
        adjacency = self._adjacency
        while queue:
            u = queue.popleft()
            for v in adjacency[u]:
                if dist[v] < 0:
                    dist[v] = dist[u] + 1
                    queue.append(v)
                if dist[v] == dist[u] + 1:
                    count[v] += count[u]
        self._bfs_memo[source] = (dist, count)
        return dist, count

    def path(self, a: int, b: int):
        """ECMP over all shortest router paths a -> b: each link's share is the fraction of shortest paths
        through it, sigma_a(u) * sigma_b(v) / sigma_a(b) (Brandes' counting)."""
        key = (a, b)
        if key not in self._memo:
            dist_a, count_a = self._bfs(a)
            dist_b, count_b = self._bfs(b)
            total = dist_a[b]
            if total < 0:
                raise CollectiveError(
                    "network", f"router {b} is unreachable from router {a}: the graph is disconnected"
                )
            links, shares = [], []
            for (u, v), link in self._link_id.items():
                if dist_a[u] + 1 + dist_b[v] == total:
                    links.append(link)
                    shares.append(count_a[u] * count_b[v] / count_a[b])
            self._memo[key] = (np.array(links, dtype=np.int64), np.array(shares), int(total))
        return self._memo[key]


def _dragonfly(n: int, group_size: int) -> nx.Graph:
    """Routers in groups, all-to-all inside a group; one global link per pair of groups, attached
    round-robin to the routers of each group (Kim et al. 2008)."""
    g = nx.Graph()
    g.add_nodes_from(range(n))
    groups = n // group_size
    for grp in range(groups):
        members = range(grp * group_size, (grp + 1) * group_size)
        g.add_edges_from((u, v) for u in members for v in members if u < v)
    slot = [0] * groups
    for x in range(groups):
        for y in range(x + 1, groups):
            u = x * group_size + slot[x] % group_size
            v = y * group_size + slot[y] % group_size
            slot[x] += 1
            slot[y] += 1
            g.add_edge(u, v)
    return g
