"""NCCL's cost model on our cluster graph (the ``library`` pricer): tables.py (NCCL's constants), graphs.py
(the topology search: channels and per-channel speed), model.py (the tuner: latency and bandwidth per
algorithm x protocol), calibration.py (our global constants), pricer.py (placement, contention, Price)."""

from .calibration import DEFAULT_LIBRARY, NETWORK_KINDS, LibraryCalibration
from .pricer import NCCL_NAMES, SCHEDULE_OF, choose, curves, is_nvidia, normalise_algo, normalise_proto, price_library

__all__ = [
    "DEFAULT_LIBRARY",
    "NCCL_NAMES",
    "NETWORK_KINDS",
    "SCHEDULE_OF",
    "LibraryCalibration",
    "choose",
    "curves",
    "is_nvidia",
    "normalise_algo",
    "normalise_proto",
    "price_library",
]
