"""Swing allreduce, latency-optimal variant (De Sensi et al., "Swing: Short-cutting Rings for Higher
Bandwidth Allreduce", NSDI 2024, §3).

At step s rank r exchanges its whole buffer with r + rho(s) if r is even, r - rho(s) if odd, where
rho(s) = (1 - (-2)^(s+1)) / 3 = 1, -1, 3, -5, 11, ...: the partners alternate direction and stay about
2^s / 1.5 apart instead of recursive doubling's 2^s, which shortens paths on tori. log2(p) steps of M each
way, p a power of two. (The paper's bandwidth-optimal variant, reduce-scatter + all-gather over the same
peers, is not implemented.)
"""

from __future__ import annotations

import numpy as np

from ._base import need_pow2
from .recursive_doubling import register_exchange_allreduce


def rho(step: int) -> int:
    return (1 - (-2) ** (step + 1)) // 3


def swing_peers(n: int, step: int) -> np.ndarray:
    r = np.arange(n)
    return np.where(r % 2 == 0, r + rho(step), r - rho(step)) % n


swing_allreduce = register_exchange_allreduce(
    "swing",
    swing_peers,
    check=need_pow2,
    formula="log2(n)·α + log2(n)·M·β (peers ±1, ±3, ±5, ±11…)",
    source="De Sensi et al., NSDI 2024 (Swing), latency-optimal variant",
)
