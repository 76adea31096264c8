"""A registry of plug-in classes by name, whose modules are the modules of one package (networks/, fabrics/):
every module of the package is imported on first use and registers its class with ``register``; a name
registers once; an unknown name is a CollectiveError naming the field and every registered name."""

from __future__ import annotations

import importlib
import pkgutil
import threading

from .._errors import CollectiveError


class Registry:
    def __init__(self, package: str, path, field: str, what: str):
        self.package, self.path, self.field, self.what = package, path, field, what
        self._classes: dict[str, type] = {}
        self._loaded = False
        self._lock = threading.RLock()  # a module that asks for the names while loading does not deadlock

    def register(self, cls: type) -> type:
        """Register ``cls`` under its ``name`` (a class decorator)."""
        if not cls.name:
            raise CollectiveError(self.field, f"{cls.__name__} has no name to register under")
        if self._classes.get(cls.name, cls) is not cls:
            raise CollectiveError(self.field, f"{self.what} {cls.name!r} is registered already")
        self._classes[cls.name] = cls
        return cls

    def unregister(self, name: str) -> None:
        """Remove a registered class (tests that register a toy one)."""
        self._classes.pop(name, None)

    def _load(self) -> None:
        """Import every module of the package once; a thread that asks meanwhile waits for all of them."""
        if self._loaded:
            return
        with self._lock:
            if not self._loaded:
                for module in pkgutil.iter_modules(self.path):
                    if not module.name.startswith("_"):
                        importlib.import_module(f"{self.package}.{module.name}")
                self._loaded = True

    def names(self) -> tuple[str, ...]:
        """Every registered name, sorted."""
        self._load()
        return tuple(sorted(self._classes))

    def functions(self):
        """(register, unregister, names, get): what a plug-in package exports."""
        return self.register, self.unregister, self.names, self.get

    def get(self, name: str) -> type:
        """The class registered as ``name``; an unknown name is an error listing the known ones."""
        self._load()
        cls = self._classes.get(name)
        if cls is None:
            raise CollectiveError(self.field, f"unknown {self.what} {name!r}; known: {', '.join(self.names())}")
        return cls
