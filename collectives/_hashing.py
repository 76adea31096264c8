"""A frozen dataclass's hash, computed once.

The planner's value memos key on frozen specs (a plan's context, its cluster): the hash a dataclass generates
walks every field, nested specs included, on every look-up (a Context ~50 times a plan, each hashing the
model, workload and layout specs again). ``frozen_hash`` gives the same value, the hash of the tuple of the
fields the dataclass hashes, and keeps it in the instance's ``__dict__`` as ``functools.cached_property``
keeps its values; equality is the dataclass's own, and ``dataclasses.replace`` makes a new instance that
hashes afresh. Worker processes are forked (planner/search/engine.py, planner/sweep.py), so a hash kept
before the fork is the child's hash too."""

from __future__ import annotations

from dataclasses import fields


def frozen_hash(obj) -> int:
    """Use as ``__hash__ = frozen_hash`` in the body of a ``@dataclass(frozen=True)`` class."""
    found = obj.__dict__.get("_hash")
    if found is None:
        names = _HASHED.get(type(obj))
        if names is None:  # dataclasses.fields filters every field each call: ~10 us, once per class here
            names = _HASHED[type(obj)] = tuple(f.name for f in fields(obj) if (f.compare if f.hash is None else f.hash))
        found = obj.__dict__["_hash"] = hash(tuple(getattr(obj, name) for name in names))
    return found


_HASHED: dict = {}  # a dataclass -> the names of the fields its hash reads, in order (one entry per class)
