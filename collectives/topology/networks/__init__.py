"""The networks between nodes, one plug-in module each, registered here by name (the one registry).

Every module of this package is imported on first use and registers its class with ``@register``; a new
network is a new module (or, in a test, a class passed to ``register``), nothing else. ``network_type`` is
the one place a name is looked up: an unknown name is an error naming ``network.topology`` and every
registered name, never a silent default. _base.py says what a plug-in answers.
"""

from __future__ import annotations

from ..registry import Registry
from ._base import Families, NetworkModel

register, unregister, names, network_type = Registry(__name__, __path__, "network.topology", "network").functions()

__all__ = ["Families", "NetworkModel", "names", "network_type", "register", "unregister"]
