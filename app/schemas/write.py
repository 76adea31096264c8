"""Response models written straight off the planner's typed results, without validating them again.

Validating a 16,384-GPU plan into ``PlanOut`` re-checked some 35,000 group-rank and device integers and
every row the planner had already typed, only to dump them again: about 60% of the JSON answer's time
(docs/pricing.md "Speed"). ``writer(model)`` compiles a response model into one function that reads its
fields off a planner object the way ``reader`` does (``From`` paths and ``derive``, nested blocks, dicts by
key) and gives the data ``model.model_dump(mode="python")`` would: keys in field order, defaults for
absent keys, and the coercions lax validation applies to what the planner hands over (an int in a float
field becomes a float, so ``400`` is written ``400.0`` as before). ``pydantic_core.to_json`` then writes
it with the same float and string writer the model's serializer uses, so the bytes are the model's.

What is not done: constraints (``ge``, ``Literal`` members, ``max_length``) are not re-checked on the way
out, and integer items of a list or dict are passed as they are (a list of ints is not walked); the
planner's dataclasses type them. A model whose output a validator or serializer would change is refused when
compiled, and tests/app/test_write.py checks the writer against ``model_validate`` on many plans.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable
from functools import cache
from operator import attrgetter, index

from pydantic import BaseModel

from .read import SAME, From

Convert = Callable[[object], object] | None  # None: the value is written as it is
SCALARS = (str, bool, int, float)
MISSING = object()  # a required field a dict source lacks


@cache
def writer(model: type[BaseModel]) -> Callable[[object], dict]:
    """The function that writes ``model``'s fields off a planner object (or a dict) as plain Python data.
    The fields read by attribute path are read by one ``attrgetter`` into a dict in field order (in C); only
    derived fields and the values to convert cost a Python call each."""
    _check_plain(model)
    names = tuple(model.model_fields)
    sources = {
        name: next((m for m in f.metadata if isinstance(m, From)), From()) for name, f in model.model_fields.items()
    }
    read = [
        (name, source.path or name) for name, source in sources.items() if source.derive is None and source.path != SAME
    ]
    derived = [
        (name, source.derive or _itself) for name, source in sources.items() if source.derive or source.path == SAME
    ]
    converts = [
        (name, EXACT.get(c), c) for name, f in model.model_fields.items() if (c := _convert(f.annotation)) is not None
    ]
    defaults = {name: _default(field) for name, field in model.model_fields.items()}
    required = frozenset(name for name, value in defaults.items() if value is MISSING)
    read_names, get = [name for name, _ in read], _getter([path for _, path in read])

    def write(obj) -> dict:
        if type(obj) is dict:
            data = _from_dict(obj, defaults, names, required)
        else:
            data = dict.fromkeys(names)
            data.update(zip(read_names, get(obj), strict=True))
            for name, derive in derived:
                data[name] = derive(obj)
        for name, exact, convert in converts:
            value = data[name]
            if value is not None and type(value) is not exact:
                data[name] = convert(value)
        return data

    return write


def _from_dict(obj: dict, defaults: dict, names: tuple, required: frozenset) -> dict:
    """A dict source's fields in field order, defaults for absent keys, other keys left out (as validation
    leaves them). The required fields are looked for among the keys (a set comparison in C), not by comparing
    every value with the MISSING mark (a Python comparison per float)."""
    if not required <= obj.keys():
        absent = [name for name in names if name in required and name not in obj]
        raise ValueError(f"the response block lacks the required field(s) {absent}")
    data = {**defaults, **obj}
    if len(data) != len(names):
        data = {name: data[name] for name in names}
    return data


def _getter(paths: list[str]) -> Callable[[object], tuple]:
    """One C call that reads every path off an object, as a tuple (attrgetter's single path is not one)."""
    if not paths:
        return lambda obj: ()
    get = attrgetter(*paths)
    return get if len(paths) > 1 else lambda obj: (get(obj),)


def _itself(obj):
    return obj


def _default(field) -> object:
    return MISSING if field.is_required() else field.get_default(call_default_factory=True)


def _convert(annotation) -> Convert:
    """How a value of the planner becomes what validating it against ``annotation`` would give."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return _convert(args[0])
    if annotation is float:
        return float
    if annotation is int:
        return _integer
    if annotation in (str, bool, typing.Any) or origin is typing.Literal:
        return None
    if _is_model(annotation):
        return writer(annotation)
    if origin is list:
        item = _item(args[0])
        return None if item is None else lambda values: [None if v is None else item(v) for v in values]
    if origin is dict and args[0] is str:
        item = _item(args[1])
        return None if item is None else lambda values: {k: None if v is None else item(v) for k, v in values.items()}
    if origin in (typing.Union, types.UnionType):
        return _union([a for a in args if a is not type(None)])
    raise TypeError(f"no writer for the response type {annotation!r}")


def _item(annotation) -> Convert:
    """An item of a list or dict: integers are passed as they are (not walked: a plan's group ranks and
    devices are some 35,000 of them, which the planner types); floats and blocks are converted."""
    if typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    return None if annotation is int else _convert(annotation)


def _union(members: list) -> Convert:
    """``X | None`` as ``X``; ``str | Model`` (a GPU by name or by fields): a string as it is, else the model."""
    if len(members) == 1:
        return _convert(members[0])
    scalars = [m for m in members if m in SCALARS]
    models = [m for m in members if _is_model(m)]
    if scalars != [str] or len(models) != 1 or len(members) != 2:
        raise TypeError(f"no writer for the response union {members!r}")
    model = writer(models[0])
    return lambda value: value if type(value) is str else model(value)


def _integer(value) -> int:
    """An int as it is; lax validation's other ints: an integral float, a numpy integer."""
    if type(value) is int:
        return value
    if isinstance(value, float):
        if not value.is_integer():
            raise ValueError(f"{value!r} is not an integer")
        return int(value)
    return index(value)


# a converter -> the type of the values it gives back unchanged: the writer skips the call for those
EXACT = {float: float, _integer: int}


def _is_model(annotation) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _check_plain(model: type[BaseModel]) -> None:
    """Refuse a model whose output a validator or serializer would change: the writer would skip them.
    A ``before`` model validator that reads a planner object into a dict (``CallOut``) changes nothing, nor
    does a field validator marked ``refuses_only``."""
    decorators = model.__pydantic_decorators__
    after = [d for d in decorators.model_validators.values() if d.info.mode != "before"]
    # a validator that only refuses (base.Strict's control characters) changes no value it passes
    fields = [d for d in decorators.field_validators.values() if not getattr(d.func, "refuses_only", False)]
    changing = (fields, decorators.field_serializers, decorators.model_serializers,
                decorators.computed_fields, after)  # fmt: skip
    if any(changing):
        raise TypeError(f"{model.__name__} has validators or serializers that the writer would skip")


__all__ = ["writer"]
