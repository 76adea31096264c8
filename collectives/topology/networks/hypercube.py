"""A hypercube of routers, one per node: router i links to every i XOR 2^k; ECMP over every shortest path
(_routed.py)."""

from __future__ import annotations

import networkx as nx

from ..._errors import CollectiveError
from . import register
from ._routed import RouterNetwork


@register
class Hypercube(RouterNetwork):
    name = "hypercube"
    summary = "routers on a hypercube (a power-of-two number of nodes)"
    visit_weight = 4  # hypercube 256 routers ~1.4 s (docs/hardening.md)

    @classmethod
    def validate(cls, spec) -> None:
        super().validate(spec)
        if spec.num_nodes & (spec.num_nodes - 1):
            raise CollectiveError(
                "num_nodes", f"a hypercube needs a power-of-two number of nodes, got {spec.num_nodes}"
            )

    def build_graph(self) -> nx.Graph:
        return nx.convert_node_labels_to_integers(
            nx.hypercube_graph(self.num_nodes.bit_length() - 1), ordering="sorted"
        )
