"""A frozen value's hash, computed once and kept beside the value, not in it.

The planner's value memos key on frozen specs (a plan's context, its cluster): the hash a dataclass generates
walks every field, nested specs included, on every look-up (a Context ~50 times a plan, each hashing the
model, workload and layout specs again). ``frozen_hash`` gives the same value, the hash of the tuple of the
fields the dataclass hashes, computed on the first look-up; equality is the dataclass's own. ``kept_property``
keeps a frozen value's derived values the same way (functools.cached_property writes them into ``__dict__``).

The kept hash lives in a side table keyed by the instance's identity, not in its ``__dict__`` (issue 19 item 3:
a spec is a small value without hidden attributes): ``vars(spec)`` holds its fields only, so
``Cls(**vars(spec))`` and ``dataclasses.replace`` both make an equal spec that hashes alike, and a pickle or a
copy carries no hash to another process (string hashes are seeded per process). Each entry is a weak
reference to the instance whose callback drops the entry: CPython calls it while the instance is freed
(``PyObject_ClearWeakRefs`` in the deallocator, or the collector's ``handle_weakrefs`` before it clears a
cycle), so the entry is gone before the address, hence the id, can be reused. Worker processes are forked
(planner/search/engine.py, planner/sweep.py): the table is copied with the instances, at the same ids."""

from __future__ import annotations

import weakref
from dataclasses import fields


class _Kept(weakref.ref):
    """The kept hash of one live instance; dropped from the table when the instance is freed."""

    __slots__ = ("key", "value")


def _forget(kept: _Kept) -> None:
    _KEPT.pop(kept.key, None)


def keep_hash(obj, value: int) -> int:
    """Keep ``value`` as ``obj``'s hash while ``obj`` lives; return it."""
    kept = _Kept(obj, _forget)
    kept.key, kept.value = id(obj), value
    _KEPT[kept.key] = kept
    return value


def kept_hash(obj, compute) -> int:
    """``obj``'s kept hash, ``compute(obj)`` kept on the first call (a frozen value with fields a dataclass
    cannot hash, such as dicts: collectives/topology/gpu.py, library/calibration.py)."""
    kept = _KEPT.get(id(obj))
    return kept.value if kept is not None else keep_hash(obj, compute(obj))


def frozen_hash(obj) -> int:
    """Use as ``__hash__ = frozen_hash`` in the body of a ``@dataclass(frozen=True)`` class."""
    kept = _KEPT.get(id(obj))  # inlined kept_hash: the look-up of every memo that keys on a spec
    if kept is not None:
        return kept.value
    names = _HASHED.get(type(obj))
    if names is None:  # dataclasses.fields filters every field each call: ~10 us, once per class here
        names = _HASHED[type(obj)] = tuple(f.name for f in fields(obj) if (f.compare if f.hash is None else f.hash))
    return keep_hash(obj, hash(tuple(getattr(obj, name) for name in names)))


class _KeptValues(weakref.ref):
    """The derived values kept for one live instance (kept_property), by name; dropped with the instance."""

    __slots__ = ("key", "values")


def _forget_values(kept: _KeptValues) -> None:
    _VALUES.pop(kept.key, None)


class kept_property:  # lower case, as the functools.cached_property it stands in for
    """``functools.cached_property`` for a frozen value: computed on the first read and kept beside the instance
    (a side table as the hash's), not in its ``__dict__``, so ``vars(spec)`` stays its fields."""

    def __init__(self, func) -> None:
        self.func, self.name, self.__doc__ = func, func.__name__, func.__doc__

    def __set_name__(self, owner, name: str) -> None:
        self.name = name

    def __get__(self, obj, owner=None):
        if obj is None:
            return self
        kept = _VALUES.get(id(obj))
        if kept is None:
            kept = _KeptValues(obj, _forget_values)
            kept.key, kept.values = id(obj), {}
            _VALUES[kept.key] = kept
        values = kept.values
        if self.name not in values:
            values[self.name] = self.func(obj)
        return values[self.name]


_KEPT: dict[int, _Kept] = {}  # id of a live instance -> its kept hash (the entry leaves with the instance)
_VALUES: dict[int, _KeptValues] = {}  # id of a live instance -> its kept_property values
_HASHED: dict = {}  # a dataclass -> the names of the fields its hash reads, in order (one entry per class)
