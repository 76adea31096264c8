"""A framework flavour changed in a few traits, registered for one test and always taken back (one home for the
register / yield / unregister the flavour tests repeat)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

from planner import flavours
from planner.flavours.base import Flavour


@contextmanager
def flavour_variant(base: Flavour, name: str, **changes) -> Iterator[str]:
    """``base`` with ``changes`` registered as ``name`` while the block runs; yields the name a request sends."""
    flavours.register(replace(base, name=name, **changes))
    try:
        yield name
    finally:
        flavours.unregister(name)
