"""Response models read off the planner's dataclasses, each wire key written once: in its model.

A response model's field is read, by default, from the attribute of the same name (pydantic's
``from_attributes``). Where the wire names or groups a value differently from the planner, the field says
where it comes from with ``From``: a dotted attribute path (``From("call.name")``), a function of the
object (``From(derive=...)``), or ``From(SAME)`` for a nested block read off the same object (a call's
``placement`` block). ``reader(model)`` compiles those into one function per model that builds the
model's data as a dict, which pydantic validates faster than it reads attributes one by one: the
16,384-GPU plan's rows are read in C (``operator.attrgetter``), not through pydantic's attribute lookups.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from operator import attrgetter

from pydantic import BaseModel

SAME = "."  # From(SAME): the nested block is read off the object itself, not off one of its attributes


@dataclass(frozen=True)
class From:
    """Where a wire field lives on the planner's object: ``path`` (dotted attributes) or ``derive(obj)``."""

    path: str = ""
    derive: Callable[[object], object] | None = None


@cache
def reader(model: type[BaseModel]) -> Callable[[object], dict]:
    """The function that reads ``model``'s fields off a planner object, as a dict of field name -> value."""
    getters: list[tuple[str, Callable]] = []
    for name, field in model.model_fields.items():
        source = next((m for m in field.metadata if isinstance(m, From)), From())
        if source.derive is not None:
            getters.append((name, source.derive))
        elif source.path == SAME:
            getters.append((name, reader(field.annotation)))
        else:
            getters.append((name, attrgetter(source.path or name)))
    return lambda obj: {name: get(obj) for name, get in getters}


__all__ = ["SAME", "From", "reader"]
