"""frozen_hash (collectives/_hashing.py): the dataclass's own hash, computed once, for the specs the memos key on."""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field, fields, replace

from collectives._hashing import frozen_hash
from collectives.topology import cluster_preset
from planner import ParallelSpec, WorkloadSpec, model_preset
from planner.context import Context


@dataclass(frozen=True)
class Toy:
    a: int
    b: tuple = ()
    c: str = field(default="x", compare=False)  # not compared: not hashed, as the dataclass hashes
    d: int = field(default=0, hash=False)

    __hash__ = frozen_hash


@dataclass(frozen=True)
class Plain:
    a: int
    b: tuple = ()
    c: str = field(default="x", compare=False)
    d: int = field(default=0, hash=False)


def test_the_value_is_the_dataclass_hash():
    assert hash(Toy(1, (2, 3), "y", 4)) == hash(Plain(1, (2, 3), "y", 4)) == hash((1, (2, 3)))
    assert Toy(1, (2,), "y") == Toy(1, (2,), "z")  # equality is the dataclass's own


def test_specs_hash_as_before_and_once():
    spec = cluster_preset("dgx-h100", 4)
    assert hash(spec) == hash(tuple(getattr(spec, f.name) for f in fields(spec)))
    assert spec.__dict__["_hash"] == hash(spec)
    moved = replace(spec, num_nodes=8)
    assert "_hash" not in moved.__dict__ and moved != spec and hash(moved) != hash(spec)
    ctx = Context(model_preset("llama3-8b"), WorkloadSpec(micro_batch_size=1, global_batch_size=8), ParallelSpec(tp=8))
    assert hash(ctx) == hash((ctx.model, ctx.work, ctx.par, ctx.devices_per_node, ctx.device_sms))
    again = Context(ctx.model, ctx.work, ctx.par)
    assert again == ctx and hash(again) == hash(ctx)
    assert {ctx: 1}[again] == 1


def test_a_pickled_spec_is_equal_and_hashes_alike():
    spec = cluster_preset("dgx-h100", 2)
    hash(spec)
    back = pickle.loads(pickle.dumps(spec))
    assert back == spec and hash(back) == hash(spec)
