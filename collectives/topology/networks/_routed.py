"""Router-based networks: one router per node, joined as the subclass's graph (torus.py, dragonfly.py,
hypercube.py); ECMP over every shortest path. The share of each directed router link in a node pair's traffic
comes from shortest-path counts (Brandes), memoised per router pair. A new router network is a subclass with
its ``build_graph`` and its rules (``validate``, ``visit_weight``) in a module of its own.

Work (the cost guard, planner/estimate.py): routing runs a breadth-first search from each router a priced group
touches, num_nodes^2 router visits in the worst case, times ``visit_weight`` (measured: torus 256 routers
~1 s, hypercube 256 ~1.4 s, dragonfly 256 ~2.4 s; docs/hardening.md), against their own budget. Each router pair
a schedule's transfers meet is then routed once (``path``: a Python pass over every directed link, Brandes' shares):
``pairs_work``, PAIR_WEIGHT + PAIR_LINK_WEIGHT x directed links a pair (mend15d; bench/every_work_cost.py
--cluster tpu-torus, docs/search.md "Review r15c's findings (mend15d)").
"""

from __future__ import annotations

from collections import deque
from functools import cached_property
from typing import ClassVar

import networkx as nx
import numpy as np

from ..._errors import CollectiveError
from ..loads import _ones_if_none
from ._base import Families, NetworkModel


class RouterNetwork(NetworkModel):
    # Symmetry (symmetry.py): none is used. A torus is symmetric under translation, but a dragonfly's global
    # links and a partial hypercube are not, and every router link may carry any group's traffic, so
    # placements on router networks are always priced where they are.
    unit_nodes: int | None = None
    nodes_alike_in_unit = False

    fields = ("link_bandwidth_GBps", "switch_latency_s")
    capped_family = "router"
    visit_weight: ClassVar[int] = 1  # x num_nodes^2 router visits (module docstring)
    # a router pair routed the first time (``path``: a Python pass over every directed link; ``route``'s per-pair
    # loads), in the cost guard's ~15 ns units: least squares on relative error over 89 cold ``price_call(which="all")``
    # runs on tpu-torus (8-256 routers), dragonfly and hypercube (8-128), one rank a router, 1-16 groups, CPU time,
    # load 3-8 (bench/every_work_cost.py --cluster tpu-torus [--network ...], then --fit: 1,022 and 10.8; mend15d,
    # docs/search.md "Review r15c's findings (mend15d)")
    PAIR_WEIGHT: ClassVar[int] = 1_000
    PAIR_LINK_WEIGHT: ClassVar[int] = 11

    def __init__(self, spec):
        super().__init__(spec)
        self._memo: dict[tuple[int, int], tuple[np.ndarray, np.ndarray, int]] = {}
        self._bfs_memo: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def build_graph(self) -> nx.Graph:
        """The router graph over ``num_nodes`` routers, integer-labelled (each subclass its own)."""
        raise NotImplementedError

    @cached_property
    def graph(self) -> nx.Graph:
        return self.build_graph()

    @classmethod
    def validate(cls, spec) -> None:
        from ..spec import _bandwidth

        _bandwidth("network.link_bandwidth_GBps", spec.network.link_bandwidth_GBps)

    @classmethod
    def work(cls, spec) -> int:
        return cls.visit_weight * spec.num_nodes**2 if spec.num_nodes > 1 else 0

    @classmethod
    def work_rule(cls, spec) -> str:
        n = spec.num_nodes
        return (
            f"a {cls.name} of {n} routers is routed by a search from every router: "
            f"{cls.visit_weight} x {n}^2 = {cls.work(spec):,} router visits"
        )

    def pairs_work(self, pairs: int) -> int:
        return pairs * (self.PAIR_WEIGHT + self.PAIR_LINK_WEIGHT * len(self.links))

    def families(self) -> Families:
        net = self.network
        return [("router", "network_link", len(self.links), net.link_bandwidth_GBps, net.switch_latency_s)]

    def attach(self, nic: int) -> tuple:
        return ("router", nic // self.spec.nics_per_node)

    def endpoints(self, family: str, i: int) -> tuple[tuple, tuple]:
        if family != "router":
            return super().endpoints(family, i)
        u, v = self.links[i]
        return ("router", u), ("router", v)

    def draw_aggregated(self, builder, drawn: list[int]) -> None:
        """The router links between drawn node boxes."""
        base, boxes = builder.cluster.families["router"].start, set(drawn)
        for i, (u, v) in enumerate(self.links):
            if u in boxes and v in boxes:
                builder.edge(f"e{base + i}", f"b{u}", f"b{v}", (base + i,))

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

    def route(self, loads, start, nic_src, nic_dst, node_src, node_dst, nbytes) -> float:
        """Add each node pair's bytes to ``loads`` on the router links; the longest path's latency."""
        base, nbytes = start("router"), _ones_if_none(nbytes, node_src)
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
