"""Framework flavours as traits objects, one module per framework, and their registry.

    flavour(name) -> Flavour          the registered flavour, or SpecError naming parallel.framework
    register(Flavour)                 add one (a plug-in, or a test's toy flavour); replaces one of that name
    names(kind="training")            the registered names of a kind, in registration order

The rules, the step time and the validity checks read a flavour's traits (planner/flavours/base.py), never its
name: ``grep -rn '"torch"\\|"megatron"\\|"deepspeed"' planner`` finds only these modules.
"""

from __future__ import annotations

from .._errors import SpecError
from . import deepspeed, megatron, megatron_lm, torch
from .base import Flavour, Zero

_REGISTRY: dict[str, Flavour] = {}


def register(f: Flavour) -> Flavour:
    if f.kind not in ("training", "serving"):
        raise ValueError(f"flavour {f.name!r}: kind must be 'training' or 'serving', got {f.kind!r}")
    _REGISTRY[f.name] = f
    return f


def unregister(name: str) -> None:
    _REGISTRY.pop(name, None)


def names(kind: str | None = "training") -> tuple[str, ...]:
    return tuple(n for n, f in _REGISTRY.items() if kind is None or f.kind == kind)


def flavour(name: str) -> Flavour:
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise SpecError("parallel.framework", f"must be one of {', '.join(names(None))}, got {name!r}") from None


for _module in (megatron, torch, deepspeed, megatron_lm):
    register(_module.FLAVOUR)

DEFAULT = megatron.FLAVOUR.name

__all__ = ["DEFAULT", "Flavour", "Zero", "flavour", "names", "register", "unregister"]
