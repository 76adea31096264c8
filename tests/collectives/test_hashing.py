"""frozen_hash (collectives/_hashing.py): the dataclass's own hash, computed once, for the specs the memos key on."""

from __future__ import annotations

import gc
import os
import pickle
import subprocess
import sys
from dataclasses import dataclass, field, fields, replace

from collectives import _hashing
from collectives._hashing import frozen_hash
from collectives.topology import cluster_preset
from collectives.topology.library import LibraryCalibration
from planner import ParallelSpec, WorkloadSpec, build_plan, model_preset
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
    moved = replace(spec, num_nodes=8)
    assert moved != spec and hash(moved) != hash(spec)
    ctx = Context(model_preset("llama3-8b"), WorkloadSpec(micro_batch_size=1, global_batch_size=8), ParallelSpec(tp=8))
    assert hash(ctx) == hash((ctx.model, ctx.work, ctx.par, ctx.devices_per_node, ctx.device_sms))
    again = Context(ctx.model, ctx.work, ctx.par)
    assert again == ctx and hash(again) == hash(ctx)
    assert {ctx: 1}[again] == 1


class Counted:
    """A field value that counts how often it is hashed."""

    calls = 0

    def __hash__(self) -> int:
        Counted.calls += 1
        return 7


def test_the_hash_is_computed_once_per_instance():
    Counted.calls = 0
    toy = Toy(1, (Counted(),))
    assert hash(toy) == hash(toy) == hash((1, (Counted(),))) and Counted.calls == 2  # toy's once, the tuple's once
    twin = replace(toy)
    assert hash(twin) == hash(toy) and Counted.calls == 3  # a new instance hashes afresh, once


def _specs() -> list:
    cluster = cluster_preset("dgx-h100", 2)
    par = ParallelSpec(tp=2, ep=4, pp=2, zero_stage=1, sequence_parallel=True)
    work = WorkloadSpec(micro_batch_size=1, global_batch_size=64)
    ctx = Context(model_preset("mixtral-8x7b"), work, par, devices_per_node=8, device_sms=132)
    return [
        model_preset("llama3-8b"),
        model_preset("mixtral-8x7b"),
        work,
        par,
        ctx,
        cluster,
        cluster.gpu,
        LibraryCalibration().with_values(efficiency={"nic": 0.5}),
    ]


def test_a_hashed_spec_holds_its_fields_only():
    """Issue 19 item 3: a spec is a small value without hidden attributes. The kept hash sits beside the
    instance (collectives/_hashing.py), so after hashing vars() holds the fields alone, and both
    dataclasses.replace and Cls(**vars(spec)) make an equal spec with the same hash."""
    specs = _specs()
    assert {type(s).__name__ for s in specs} == {
        "ModelSpec",
        "WorkloadSpec",
        "ParallelSpec",
        "Context",
        "ClusterSpec",
        "GPUSpec",
        "LibraryCalibration",
    }
    for spec in specs:
        first = hash(spec)
        assert hash(spec) == first
        assert vars(spec) == {f.name: getattr(spec, f.name) for f in fields(spec)}, type(spec).__name__
        for twin in (replace(spec), type(spec)(**vars(spec))):
            assert twin is not spec and twin == spec and hash(twin) == first and {spec: 1}[twin] == 1
            assert vars(twin) == vars(spec)


def test_specs_hold_their_fields_only_after_a_plan():
    """A plan reads the specs' derived values too (WorkloadSpec.document_histogram, a kept_property: beside the
    spec as its hash is, where functools.cached_property wrote it into __dict__ and Cls(**vars(spec)) failed)."""
    model = model_preset("llama3-8b")
    work = WorkloadSpec(
        micro_batch_size=1, global_batch_size=16, seq_length=8192, document_lengths=(4096, 2048, 2048),
        document_packing="dp_balanced",
    )  # fmt: skip
    par, cluster = ParallelSpec(tp=2, pp=2, dp=2), cluster_preset("dgx-h100", 1)
    build_plan(model, work, par, cluster)
    assert work.document_histogram == ((2048, 2), (4096, 1)) and work.document_histogram is work.document_histogram
    for spec in (model, work, par, cluster, cluster.gpu):
        assert vars(spec) == {f.name: getattr(spec, f.name) for f in fields(spec)}, type(spec).__name__
        twin = type(spec)(**vars(spec))
        assert twin == spec and hash(twin) == hash(spec)
    assert type(work)(**vars(work)).document_histogram == work.document_histogram


def test_a_freed_spec_leaves_the_table():
    """The side table keeps an entry while its instance lives (a weak reference's callback drops it), so
    plans that build specs by the million do not grow it, and a reused id never answers a stale hash."""
    gc.collect()
    before = len(_hashing._KEPT)
    toys = [Toy(i) for i in range(100)]
    assert [hash(t) for t in toys] == [hash((i, ())) for i in range(100)]
    assert len(_hashing._KEPT) == before + 100
    del toys
    assert len(_hashing._KEPT) == before
    for i in range(100):  # a new instance at a freed address hashes as its own fields
        assert hash(Toy(i, (i,))) == hash((i, (i,)))
    cyclic = Toy(1, ([],))
    cyclic.b[0].append(cyclic)  # a cycle (a list: unhashable, so its hash is given): the collector frees it
    assert _hashing.keep_hash(cyclic, 5) == 5 and hash(cyclic) == 5 and len(_hashing._KEPT) == before + 1
    del cyclic
    gc.collect()
    assert len(_hashing._KEPT) == before
    values = len(_hashing._VALUES)
    work = WorkloadSpec(document_lengths=(1, 2, 2))
    assert work.document_histogram == ((1, 1), (2, 2)) and len(_hashing._VALUES) == values + 1
    del work
    assert len(_hashing._VALUES) == values


def test_a_pickle_carries_no_hash_to_a_process_with_another_seed():
    """String hashes are seeded per process: an unpickled spec hashes as its fields do where it is loaded."""
    spec = cluster_preset("dgx-h100", 2)
    hash(spec)
    check = (
        "import pickle, sys; from dataclasses import fields; s = pickle.loads(sys.stdin.buffer.read()); "
        "assert hash(s) == hash(tuple(getattr(s, f.name) for f in fields(s))); print(hash(s))"
    )
    seed = "2" if os.environ.get("PYTHONHASHSEED") == "1" else "1"  # not this process's seed
    env = {**os.environ, "PYTHONHASHSEED": seed}
    out = subprocess.run([sys.executable, "-c", check], input=pickle.dumps(spec), env=env, capture_output=True)
    assert out.returncode == 0, out.stderr.decode()


def test_a_pickled_spec_is_equal_and_hashes_alike():
    spec = cluster_preset("dgx-h100", 2)
    hash(spec)
    back = pickle.loads(pickle.dumps(spec))
    assert back == spec and hash(back) == hash(spec)
