"""Framework flavours as traits objects (planner/flavours/): the rules read traits, never a name; a toy flavour
registered here plans; ParallelSpec resolves its defaults on read."""

import re
from dataclasses import fields, replace
from pathlib import Path

import pytest

from app.serialize import plan_dict
from collectives.topology import ClusterSpec, IntraNode, Network
from planner import ModelSpec, MoESpec, ParallelSpec, SpecError, WorkloadSpec, build_plan, flavours
from planner.flavours import Zero
from planner.flavours.megatron import FLAVOUR as MEGATRON
from planner.flavours.torch import FLAVOUR as TORCH
from planner.parallel import FRAMEWORKS

SMALL = ModelSpec(4, 1024, 8, 4096, 32000, 1024, num_kv_heads=8)
TINY_MOE = replace(SMALL, moe=MoESpec(8, 2, 1024))
WORK = WorkloadSpec(micro_batch_size=1, global_batch_size=8)
PLANNER = Path(__file__).resolve().parents[2] / "planner"


def host(devices: int) -> ClusterSpec:
    return ClusterSpec("host", 1, devices, IntraNode("switch", 300.0), network=Network("none"))


def calls(par: ParallelSpec, model=SMALL, work=WORK) -> list[dict]:
    return plan_dict(build_plan(model, work, par, host(par.world_size)))["calls"]


def count(plan: list[dict], name: str) -> int:
    return sum(c["calls_per_iteration"] for c in plan if c["name"] == name)


@pytest.fixture
def toy():
    """Megatron's traits but PyTorch's separate q, k, v dgrads and a 1 MiB DDP bucket: a framework a plug-in
    author might add in one module."""
    flavour = replace(MEGATRON, name="toy", display="Toy", fused_column_dgrad=False, bucket_cap_bytes=1 << 20)
    flavours.register(flavour)
    yield flavour
    flavours.unregister("toy")


def test_rules_read_traits_never_a_framework_name():
    """Outside planner/flavours/ no module names a framework (the issue's grep)."""
    pattern = re.compile(r"""["'](torch|megatron|deepspeed)["']""")
    hits = [
        f"{path.relative_to(PLANNER)}:{n}"
        for path in PLANNER.rglob("*.py")
        if "flavours" not in path.parts and path.name != "presets.py"  # presets are request data, by name
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert hits == []


def test_builtin_flavours_registered_with_their_traits():
    assert flavours.names() == ("megatron", "torch", "deepspeed", "megatron-lm-2021")
    assert FRAMEWORKS == ("megatron", "torch", "deepspeed")  # the search never proposes Megatron-LM of 2021
    ds = flavours.flavour("deepspeed")
    # DeepSpeed wraps HF modules (separate q, k, v parameters) but its TP follows Megatron's fused backward
    assert ds.hf_modules and ds.fused_column_dgrad and ds.zero is Zero.DEEPSPEED
    assert not MEGATRON.hf_modules and TORCH.hf_modules and not TORCH.fused_column_dgrad


def test_parallel_spec_has_no_hidden_attributes_and_resolves_expert_tp_on_read():
    par = ParallelSpec(tp=8)
    assert set(vars(par)) == {f.name for f in fields(par)}
    assert par.expert_tp is None and par.etp == 8  # Megatron: --expert-tensor-parallel-size = tp
    as_torch = replace(par, framework="torch")
    assert as_torch.etp == 1  # torchtitan's default, not Megatron's 8 carried over
    assert replace(as_torch, framework="megatron").etp == 8
    assert replace(par, expert_tp=2, framework="torch").etp == 2  # a given value stays


def test_toy_flavour_plans_with_its_traits(toy):
    par = ParallelSpec(tp=2, dp=4, framework="toy")
    plan, megatron = calls(par), calls(replace(par, framework="megatron"))
    layers, m = 4, 8 // 4
    # fused_column_dgrad False: q, k, v each all-reduce their input gradient; gate, up are one fc1 (not gated)
    assert count(megatron, "tp.attn.qkv.dgrad") == layers * m
    assert count(plan, "tp.attn.qkv.dgrad") == 3 * layers * m
    # every other trait is Megatron's: the cross-entropy all-reduces, the batch broadcast, the fp32 reduction
    assert count(plan, "tp.cross_entropy") == count(megatron, "tp.cross_entropy") == 3 * m
    grads = [c for c in plan if c["name"] == "dp.grads"]
    assert {c["dtype"] for c in grads} == {"fp32"}
    # bucket_cap_bytes 1 MiB of fp32 gradients: a bucket closes once it holds >= 262,144 elements (the Reducer
    # rule), so all buckets but the last reach the cap; Megatron's default is one bucket per buffer
    sizes = [c["message_bytes"] for c in grads for _ in range(c["calls_per_iteration"])]
    assert len(sizes) > 10 and sum(s < (1 << 20) for s in sizes) <= 1
    assert count(megatron, "dp.grads") == 1
    assert sum(c["message_bytes"] * c["calls_per_iteration"] for c in grads) == sum(
        c["message_bytes"] * c["calls_per_iteration"] for c in megatron if c["name"] == "dp.grads"
    )


def test_unknown_framework_is_a_spec_error_naming_the_field():
    with pytest.raises(SpecError) as err:
        calls(ParallelSpec(tp=2, dp=4, framework="jax"))
    assert err.value.field == "parallel.framework"
    assert "must be one of megatron, torch, deepspeed" in err.value.rule and "'jax'" in err.value.rule


def test_a_serving_flavour_is_not_a_training_framework():
    flavours.register(replace(MEGATRON, name="toy-engine", kind="serving"))
    try:
        assert "toy-engine" not in flavours.names() and "toy-engine" in flavours.names("serving")
        with pytest.raises(SpecError) as err:
            calls(ParallelSpec(tp=2, dp=4, framework="toy-engine"))
        assert err.value.field == "parallel.framework" and "serving engine" in err.value.rule
    finally:
        flavours.unregister("toy-engine")


def test_moe_defaults_follow_the_flavour():
    # torch: expert TP 1 -> no expert-TP gather; Megatron: expert TP = tp = 2 -> the gather over 2 ranks
    work = WorkloadSpec(micro_batch_size=1, global_batch_size=2)
    torch_plan = calls(ParallelSpec(tp=2, ep=2, dp=2, framework="torch"), TINY_MOE, work)
    megatron = calls(ParallelSpec(tp=2, ep=2, dp=2, sequence_parallel=True), TINY_MOE, work)
    assert count(torch_plan, "ep.expert_tp.gather") == 0 < count(megatron, "ep.expert_tp.gather")
    with pytest.raises(SpecError) as err:  # Megatron's rule, read as the trait moe_tp_ep_needs_sp
        calls(ParallelSpec(tp=2, ep=2, dp=2), TINY_MOE, work)
    assert err.value.field == "parallel.sequence_parallel" and err.value.rule.startswith("Megatron requires")
