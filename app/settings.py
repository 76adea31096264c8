"""Service settings from the environment (COMMPLAN_*), read once at start-up."""

from __future__ import annotations

import os
from dataclasses import dataclass


def _int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


@dataclass(frozen=True)
class Settings:
    max_body_bytes: int = 8 * 2**20  # 413 above this
    max_batch: int = 2000  # plan requests per POST /v1/plan/batch
    max_devices: int = 131_072  # devices in one cluster
    max_verify_elements: int = 1 << 24  # num_ranks x count for POST /v1/collectives/verify
    max_price_transfers: int = 1 << 22  # ranks x concurrent groups for POST /v1/collectives/price

    @classmethod
    def from_env(cls) -> Settings:
        return cls(
            max_body_bytes=_int("COMMPLAN_MAX_BODY_BYTES", cls.max_body_bytes),
            max_batch=_int("COMMPLAN_MAX_BATCH", cls.max_batch),
            max_devices=_int("COMMPLAN_MAX_DEVICES", cls.max_devices),
            max_verify_elements=_int("COMMPLAN_MAX_VERIFY_ELEMENTS", cls.max_verify_elements),
            max_price_transfers=_int("COMMPLAN_MAX_PRICE_TRANSFERS", cls.max_price_transfers),
        )
