"""The fabrics inside a node, one plug-in module each, registered here by name (as networks/ registers the
networks between nodes): a new fabric is a new module; an unknown name is an error naming ``intra.fabric``
and every registered name. _base.py says what a plug-in answers."""

from __future__ import annotations

from ..registry import Registry
from ._base import FabricModel, Families

register, unregister, names, fabric_type = Registry(__name__, __path__, "intra.fabric", "fabric").functions()

__all__ = ["FabricModel", "Families", "fabric_type", "names", "register", "unregister"]
