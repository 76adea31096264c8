"""Cluster topologies as link graphs, routing, and contention-aware pricing of schedules.

Public surface: ``Cluster`` and ``cluster_for`` (one immutable cluster per spec, cached), the specs and
presets, ``price`` / ``price_call`` / ``candidates`` (pricing), ``check_concurrent_groups`` (a call's groups
disjoint), and the symmetry shortcuts ``neighbourhood``, ``canonical``, ``tiling_unit`` (symmetry.py)."""

from .calibration import DEFAULT as DEFAULT_CALIBRATION
from .calibration import Calibration
from .cluster import Cluster, cluster_for
from .presets import PRESETS, cluster_preset
from .pricing import Price, price
from .select import candidates, check_concurrent_groups, price_call
from .spec import ClusterSpec, IntraNode, Network, validate_cluster
from .symmetry import canonical, neighbourhood, tiling_unit

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
    "canonical",
    "check_concurrent_groups",
    "cluster_for",
    "cluster_preset",
    "neighbourhood",
    "price",
    "price_call",
    "tiling_unit",
    "validate_cluster",
]
