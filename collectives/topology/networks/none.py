"""No network: a cluster of one node (a single DGX, an 8-NPU board). More nodes would be disconnected."""

from __future__ import annotations

from . import register
from ._base import NetworkModel


@register
class NoNetwork(NetworkModel):
    name = "none"
    summary = "one node, nothing between nodes"
    connects_nodes = False
