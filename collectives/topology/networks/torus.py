"""A torus of routers, one per node (TPU-like 3-D torus): ``dims`` routers per dimension, wrapping round;
ECMP over every shortest path (_routed.py)."""

from __future__ import annotations

import networkx as nx

from ..._errors import CollectiveError
from ..spec import _positive
from . import register
from ._routed import RouterNetwork


@register
class Torus(RouterNetwork):
    name = "torus"
    summary = "routers in a k-ary n-cube (dims), one per node, wrapping round"
    fields = (*RouterNetwork.fields, "dims")
    visit_weight = 1  # torus 256 routers ~1 s (docs/hardening.md)

    @classmethod
    def validate(cls, spec) -> None:
        super().validate(spec)
        product = 1
        for d in spec.network.dims:
            _positive("network.dims", d)
            product *= d
        if product != spec.num_nodes:
            dims = " x ".join(map(str, spec.network.dims)) or "()"
            raise CollectiveError(
                "network.dims", f"torus {dims} = {product} routers but the cluster has {spec.num_nodes} nodes"
            )

    def build_graph(self) -> nx.Graph:
        g = nx.grid_graph(dim=list(reversed(self.network.dims)), periodic=True)
        return nx.convert_node_labels_to_integers(g, ordering="sorted")
