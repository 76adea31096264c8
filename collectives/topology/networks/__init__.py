"""The networks between nodes, one plug-in module each, registered here by name (the one registry).

Every module of this package is imported on first use and registers its class with ``@register``; a new
network is a new module (or, in a test, a class passed to ``register``), nothing else. ``network_type`` is
the one place a name is looked up: an unknown name is an error naming ``network.topology`` and every
registered name, never a silent default. _base.py says what a plug-in answers.
"""

from __future__ import annotations

import importlib
import pkgutil

from ..._errors import CollectiveError
from ._base import Families, NetworkModel

_REGISTRY: dict[str, type[NetworkModel]] = {}
_LOADED = False


def register(cls: type[NetworkModel]) -> type[NetworkModel]:
    """Register a network class under its ``name`` (a class decorator); a name registers once."""
    if not cls.name:
        raise CollectiveError("network.topology", f"{cls.__name__} has no name to register under")
    if _REGISTRY.get(cls.name, cls) is not cls:
        raise CollectiveError("network.topology", f"network {cls.name!r} is registered already")
    _REGISTRY[cls.name] = cls
    return cls


def unregister(name: str) -> None:
    """Remove a registered network (tests that register a toy one)."""
    _REGISTRY.pop(name, None)


def _load() -> None:
    global _LOADED
    if not _LOADED:
        _LOADED = True
        for module in pkgutil.iter_modules(__path__):
            if not module.name.startswith("_"):
                importlib.import_module(f"{__name__}.{module.name}")


def names() -> tuple[str, ...]:
    """Every registered network, sorted."""
    _load()
    return tuple(sorted(_REGISTRY))


def network_type(name: str) -> type[NetworkModel]:
    """The class of network ``name``; an unknown name is a CollectiveError listing the known ones."""
    _load()
    cls = _REGISTRY.get(name)
    if cls is None:
        raise CollectiveError("network.topology", f"unknown network {name!r}; known: {', '.join(names())}")
    return cls


__all__ = ["Families", "NetworkModel", "names", "network_type", "register", "unregister"]
