"""A dragonfly (Kim et al. 2008): routers in groups of ``group_size``, all-to-all inside a group, one global
link per pair of groups; ECMP over every shortest path (_routed.py)."""

from __future__ import annotations

import networkx as nx

from ..._errors import CollectiveError
from ..spec import _positive
from . import register
from ._routed import RouterNetwork


@register
class Dragonfly(RouterNetwork):
    name = "dragonfly"
    summary = "router groups (group_size), all-to-all inside, one global link per pair of groups"
    fields = (*RouterNetwork.fields, "group_size")
    visit_weight = 4  # dragonfly 256 routers ~2.4 s (docs/hardening.md)

    def build_graph(self) -> nx.Graph:
        """Global links attached round-robin to the routers of each group."""
        n, group_size = self.num_nodes, self.network.group_size
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

    @classmethod
    def validate(cls, spec) -> None:
        super().validate(spec)
        _positive("network.group_size", spec.network.group_size)
        if spec.num_nodes % spec.network.group_size:
            raise CollectiveError(
                "network.group_size", f"{spec.num_nodes} nodes do not split into groups of {spec.network.group_size}"
            )
