"""No fabric: one device per node (its only way out is PCIe to the NICs)."""

from __future__ import annotations

from . import register
from ._base import FabricModel


@register
class NoFabric(FabricModel):
    name = "none"
    summary = "one device per node"
    connects_devices = False
    library_model = True  # NCCL's model: a GPU alone in its node talks over PCIe (library/pricer.py shape_of)

    @classmethod
    def validate(cls, spec) -> None:
        """Nothing to check: one device has no links inside its node."""
