"""The wire writer (app/schemas/write.py) writes the bytes the validated response model writes."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Literal

import pytest
from pydantic import BaseModel, Field, field_serializer
from pydantic_core import to_json

from app.schemas.cluster import LinkOut
from app.schemas.plan import BatchItem, PlanOut
from app.schemas.write import writer
from app.serialize import plan_dict, plan_item_json, plan_json
from collectives.topology import cluster_preset
from planner import Options, ParallelSpec, WorkloadSpec, build_plan, model_preset

PLANS = {
    "llama3-70b tp8 pp4 full contention": (
        "llama3-70b", ("dgx-h100", 8), ParallelSpec(tp=8, pp=4, dp=2, zero_stage=1, sequence_parallel=True),
        WorkloadSpec(micro_batch_size=1, global_batch_size=64), Options(contention="full"),
    ),
    "mixtral ep8 schedule pricing": (
        "mixtral-8x7b", ("dgx-a100", 4), ParallelSpec(tp=2, dp=16, ep=8, zero_stage=1, sequence_parallel=True),
        WorkloadSpec(micro_batch_size=1, global_batch_size=32), Options(pricing="schedule"),
    ),
    "llama3-8b fsdp reversed device map": (
        "llama3-8b", ("dgx-h100", 2), ParallelSpec(dp=16, framework="torch", zero_stage=3),
        WorkloadSpec(micro_batch_size=1, global_batch_size=16), Options(device_map=tuple(range(16))[::-1]),
    ),
}  # fmt: skip


def built(name: str):
    model, (cluster, nodes), par, work, options = PLANS[name]
    return build_plan(model_preset(model), work, par, cluster_preset(cluster, nodes), options)


@pytest.mark.parametrize("name", sorted(PLANS))
def test_plan_bytes_are_the_validated_models(name):
    plan = built(name)
    validated = PlanOut.model_validate(plan, from_attributes=True)
    assert plan_json(plan) == validated.model_dump_json().encode()
    assert plan_item_json(plan) == BatchItem(ok=True, plan=validated).model_dump_json().encode()
    assert plan_dict(plan) == validated.model_dump(mode="json")
    ranks = sum(len(c["placement"]["group_ranks"]) for c in plan_dict(plan)["calls"])
    assert ranks == sum(len(pc.group_ranks) for pc in plan.calls) > 0


def test_a_plan_without_gpu_writes_null_step_and_memory():
    model, (cluster, nodes), par, work, options = PLANS["llama3-8b fsdp reversed device map"]
    no_gpu = replace(cluster_preset(cluster, nodes), gpu=None)
    plan = build_plan(model_preset(model), work, par, no_gpu, options)
    body = json.loads(plan_json(plan))
    assert body["step"] is None and body["memory"] is None
    assert plan_json(plan) == PlanOut.model_validate(plan, from_attributes=True).model_dump_json().encode()


LINK = {"id": 3, "family": "nic_up", "kind": "nic", "index": 1, "label": "node 0 nic 1 -> leaf 0",
        "capacity_GBps": 50, "bytes": 2.0, "busy_s": 1, "utilisation": float("inf"), "extra": "dropped"}  # fmt: skip


def test_a_block_read_from_a_dict_is_coerced_as_validation_coerces_it():
    # ints in float fields become floats, an integral float in an int field an int, keys in field order,
    # unknown keys dropped, a non-finite float null
    data = writer(LinkOut)(LINK)
    assert list(data) == list(LinkOut.model_fields)
    assert (data["capacity_GBps"], data["bytes"], data["busy_s"]) == (50.0, 2, 1.0)
    assert type(data["capacity_GBps"]) is float and type(data["bytes"]) is int
    written = to_json(data, inf_nan_mode="null")
    assert written == LinkOut.model_validate(LINK).model_dump_json().encode()
    assert b'"utilisation":null' in written


def test_a_fractional_float_in_an_int_field_is_refused():
    with pytest.raises(ValueError, match=r"2\.5 is not an integer"):
        writer(LinkOut)({**LINK, "bytes": 2.5})


def test_a_required_field_missing_from_a_dict_is_refused():
    with pytest.raises(ValueError, match=r"lacks the required field\(s\) \['label'\]"):
        writer(LinkOut)({k: v for k, v in LINK.items() if k != "label"})


def test_models_the_writer_cannot_write_faithfully_are_refused_when_compiled():
    class Serialised(BaseModel):
        x: float

        @field_serializer("x")
        def _x(self, x: float) -> str:
            return f"{x} s"

    class Unioned(BaseModel):
        x: int | float

    class Fine(BaseModel):
        kind: Literal["a", "b"]
        sizes: list[int] = Field(default_factory=list)
        by_name: dict[str, float] = Field(default_factory=dict)

    with pytest.raises(TypeError, match="validators or serializers"):
        writer(Serialised)
    with pytest.raises(TypeError, match="no writer for the response union"):
        writer(Unioned)
    assert writer(Fine)({"kind": "a", "by_name": {"x": 1}}) == {"kind": "a", "sizes": [], "by_name": {"x": 1.0}}


# ---- long rank lists written once and spliced (app/serialize.py) ----------------------------------------


@pytest.mark.parametrize("name", sorted(PLANS))
@pytest.mark.parametrize("threshold", [1, 4, 8, 16])
def test_spliced_rank_lists_give_to_json_bytes(name, threshold, monkeypatch):
    # a low threshold splices most calls' lists (runs of plain calls between spliced ones, the first and the
    # last call spliced or not, custom device maps whose ranks and devices differ): the bytes are to_json's
    import app.serialize as serialize

    monkeypatch.setattr(serialize, "LONG_LIST", threshold)
    monkeypatch.setattr(serialize, "_LISTS", type(serialize._LISTS)())
    plan = built(name)
    data = writer(PlanOut)(plan)
    spliced = [c for c in data["calls"] if serialize._has_long_lists(c)]
    assert 0 < len(spliced) <= len(data["calls"])
    expected = to_json(data, inf_nan_mode="null")
    assert plan_json(plan) == expected
    assert plan_json(plan) == expected  # again: the lists now come from the cache
    item = writer(BatchItem)({"ok": True, "plan": plan})
    assert plan_item_json(plan) == to_json(item, inf_nan_mode="null")


def test_a_cached_list_is_used_only_for_an_equal_list(monkeypatch):
    # the cache key (length, first, middle, last) is shared by lists that differ elsewhere: each gets its own bytes
    import app.serialize as serialize

    monkeypatch.setattr(serialize, "_LISTS", type(serialize._LISTS)())
    a = list(range(2048))
    b = [*a[:5], 7, *a[6:]]
    assert serialize._int_list(a) == to_json(a)
    assert serialize._int_list(b) == to_json(b) != to_json(a)
    assert serialize._int_list(a) == to_json(a)


def test_the_16k_gpu_plan_splices_its_world_group():
    # the 405B plan's dp.grad_norm lists all 16,384 ranks; written once and spliced, the same bytes
    from app.serialize import LONG_LIST, _has_long_lists

    model = model_preset("llama3-405b")
    par = ParallelSpec(tp=8, pp=16, dp=128, zero_stage=1, sequence_parallel=True, first_stage_layers=7,
                       last_stage_layers=7)  # fmt: skip
    plan = build_plan(model, WorkloadSpec(micro_batch_size=1, global_batch_size=2048), par,
                      cluster_preset("dgx-h100", 2048))  # fmt: skip
    data = writer(PlanOut)(plan)
    long = [c for c in data["calls"] if _has_long_lists(c)]
    assert [c["name"] for c in long] == ["dp.grad_norm"] and len(long[0]["placement"]["group_ranks"]) == 16384
    assert LONG_LIST <= 16384
    assert plan_json(plan) == to_json(data, inf_nan_mode="null")


def test_the_list_cache_is_bounded_in_lists_and_in_integers(monkeypatch):
    import app.serialize as serialize

    monkeypatch.setattr(serialize, "_LISTS", type(serialize._LISTS)())
    monkeypatch.setattr(serialize, "LIST_CACHE", 3)
    monkeypatch.setattr(serialize, "LIST_CACHE_ITEMS", 5000)
    lists = [list(range(k, k + 1500)) for k in range(5)]
    for values in lists:
        assert serialize._int_list(values) == to_json(values)
    assert [kept[0] for kept, _ in serialize._LISTS.values()] == [2, 3, 4]  # 3 lists, 4,500 integers
    big = list(range(6000))  # over the whole bound: written, not kept
    assert serialize._int_list(big) == to_json(big) and len(serialize._LISTS) == 3
    longer = list(range(10, 4010))  # 4,000 more: the oldest go until 5,000 integers at most are kept
    serialize._int_list(longer)
    assert [kept[0] for kept, _ in serialize._LISTS.values()] == [10]
