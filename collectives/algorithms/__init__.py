"""The algorithms, one module each: every module of this package registers its (algorithm, op) pairs with
``@register`` (_base.py, the one registry) when imported, and every module is imported here, so a new
algorithm is a new module (or, in a test, a builder passed to ``register``) and nothing else."""

import importlib
import pkgutil

from ._base import (
    Cost,
    Implementation,
    Request,
    allreduce_lower_bound,
    implementations,
    lookup,
    register,
    unregister,
    validate,
)

for _module in pkgutil.iter_modules(__path__):
    if not _module.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_module.name}")

__all__ = [
    "Cost",
    "Implementation",
    "Request",
    "allreduce_lower_bound",
    "implementations",
    "lookup",
    "register",
    "unregister",
    "validate",
]
