"""Cluster topologies as link graphs, routing, and contention-aware pricing of schedules."""

from .calibration import DEFAULT as DEFAULT_CALIBRATION
from .calibration import Calibration
from .cluster import Cluster
from .presets import PRESETS, cluster_preset
from .pricing import Price, price
from .select import candidates, price_call
from .spec import ClusterSpec, IntraNode, Network, validate_cluster

__all__ = [
    "DEFAULT_CALIBRATION",
    "PRESETS",
    "Calibration",
    "Cluster",
    "ClusterSpec",
    "IntraNode",
    "Network",
    "Price",
    "candidates",
    "cluster_preset",
    "price",
    "price_call",
    "validate_cluster",
]
