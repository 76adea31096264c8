"""The search explores selective recompute modules, torch's selective checkpointing, CPU activation offload and
explicit pipeline layouts / first-last stage layers (issue 21, layouts3 item 3), each opt-in as a constraint;
the screen's step time and memory equal build_plan's on every one (as tests/planner/test_search_options.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from collectives.topology import cluster_preset
from planner import MODEL_PRESETS, SpecError, WorkloadSpec, build_plan
from planner.search import Constraints, Problem, search
from planner.search.space import SAME, Recompute, Shape, Space, Variant, recompute_fields
from tests.planner.test_search_options import model_of, screen_vs_plan

LAYOUT = "Et*2|t*3|t*3|t*2|t*2|t*3|t*3|t*2L"  # 20 layers over pp 4 x 2 virtual stages


def space(layers=20, devices=8, preset="llama3-8b", **allowed) -> Space:
    return Space(model_of(layers, preset), WorkloadSpec(global_batch_size=64), devices, Constraints.of(allowed))


def test_default_space_is_unchanged():
    s = space()
    assert s.recomputes == ["none", "selective", "full"]
    assert s.stage_splits(4) == [(1, "1f1b", None, SAME, None), (5, "interleaved", None, SAME, None)]


def test_recompute_options_are_choices():
    s = space(
        recompute_modules=[["core_attn"], ["core_attn", "mlp"], ["layernorm", "mlp"]],
        selective_ac_option=["op", "2"],
        cpu_offloading_num_layers=[0, 2],
    )
    assert s.recomputes == [
        "none", Recompute("none", offload=2),
        Recompute("selective", modules=("core_attn",)), Recompute("selective", modules=("core_attn", "mlp")),
        Recompute("selective", modules=("layernorm", "mlp")),
        Recompute("selective", ac_option="2"), Recompute("selective", ac_option="op"),
        "full",
    ]  # fmt: skip
    assert recompute_fields(Recompute("none", offload=2)) == {
        "activation_recompute": "none", "recompute_method": None, "recompute_num_layers": None,
        "cpu_offloading_num_layers": 2,
    }  # fmt: skip
    # one flat list is one module set
    flat = space(recompute_modules=["core_attn", "mlp"]).recomputes
    assert flat[1] == Recompute("selective", modules=("core_attn", "mlp"))


@pytest.mark.parametrize(
    ("allowed", "field", "words"),
    [
        ({"recompute_modules": [["attention"]]}, "constraints.recompute_modules", "unknown module 'attention'"),
        ({"selective_ac_option": ["every"]}, "constraints.selective_ac_option", "'op' or a positive layer"),
        ({"cpu_offloading_num_layers": [-1]}, "constraints.cpu_offloading_num_layers", "integers >= 0"),
        ({"pipeline_layout": ["Ex*3|L"]}, "constraints.pipeline_layout", "virtual stage 0 has 'x'"),
    ],
)
def test_bad_options_name_the_constraint(allowed, field, words):
    with pytest.raises(SpecError) as err:
        space(**allowed)
    assert err.value.field == field and words in err.value.rule


def test_layouts_and_stage_layers_are_splits():
    """A layout of 8 virtual stages runs at pp 4 with v 2 (interleaved, and the V schedules when listed) and
    at pp 8 with v 1; at pp 3 once, for the rules to refuse by name. First/last stage layers: each pair."""
    s = space(pipeline_layout=[LAYOUT], pipeline_schedule=["1f1b", "interleaved", "zbv"])
    assert s.stage_splits(4) == [(2, "interleaved", None, None, LAYOUT), (2, "zbv", None, None, LAYOUT)]
    assert s.stage_splits(8) == [(1, "1f1b", None, None, LAYOUT)]
    assert s.stage_splits(3) == [(1, "1f1b", None, None, LAYOUT)]
    t = space(first_stage_layers=[4, 5], last_stage_layers=[6])
    assert [split[2:4] for split in t.stage_splits(4) if split[0] == 1] == [(4, 6), (5, 6)]
    assert t.variants_per_shape(2, 4, every=True) == len(t.stage_splits(4)) * 4 * 2 * 3
    # walked (counts12): DeepSpeed runs only its two 1f1b splits at ZeRO 0 and 1 beside pp 4 (flavours/deepspeed.py)
    assert t.variants_per_shape(2, 4) == (len(t.stage_splits(4)) * 4 * 2 + 2 * 2) * 2


def test_screen_equals_build_plan_on_recompute_modules_and_layouts():
    """20 layers, tp 2 x pp 4 on one DGX H100: selective module sets, an explicit layout string and first 4 /
    last 6 stage layers (4 + 5 + 5 + 6)."""
    shape, work = Shape(2, 1, 4, 1), WorkloadSpec(global_batch_size=16)
    plain = Variant(shape, 1, "1f1b", 1, True, "megatron")
    cases = [
        (plain, 1, Recompute("selective", modules=("core_attn", "mlp"))),
        (plain, 1, Recompute("selective", modules=("layernorm", "mlp"))),
        (Variant(shape, 2, "interleaved", 1, True, "megatron", None, "alltoall", None, LAYOUT), 1, "none"),
        (Variant(shape, 2, "interleaved", 1, True, "megatron", None, "alltoall", None, LAYOUT), 1,
         Recompute("selective", modules=("mlp",))),
        (Variant(shape, 1, "1f1b", 1, True, "megatron", 4, "alltoall", 6), 1, "full"),
    ]  # fmt: skip
    screen_vs_plan(model_of(20), cluster_preset("dgx-h100", 1), work, shape, cases)


def test_screen_equals_build_plan_on_torch_checkpointing_and_offload():
    """torchtitan's per-op ("op") and every-2nd-block ("2") checkpointing (framework torch), and Megatron's
    CPU offload of 2 layers (pp 1: tp 8 on one node)."""
    work = WorkloadSpec(global_batch_size=16)
    torch = Shape(2, 1, 4, 1)
    cases = [(Variant(torch, 1, "1f1b", 1, True, "torch"), 1, Recompute("selective", ac_option=o)) for o in ("op", "2")]
    screen_vs_plan(model_of(20), cluster_preset("dgx-h100", 1), work, torch, cases)
    flat = Shape(8, 1, 1, 1)
    cases = [(Variant(flat, 1, "1f1b", 1, True, "megatron"), 1, Recompute("none", offload=2))]
    screen_vs_plan(model_of(20), cluster_preset("dgx-h100", 1), work, flat, cases)


def test_screen_equals_build_plan_on_moe_modules():
    """Mixtral cut to 4 layers, ep 8 on 16 H100: ``moe`` re-lists its dispatch (recompute.rerun_layers)."""
    model = replace(MODEL_PRESETS["mixtral-8x7b"], seq_length=2048, num_layers=4)
    shape = Shape(1, 1, 2, 8, 8, 1)
    cases = [(Variant(shape, 1, "1f1b", 1, False, "megatron"), 1, Recompute("selective", modules=m))
             for m in (("moe",), ("moe_act",), ("core_attn", "moe"))]  # fmt: skip
    screen_vs_plan(model, cluster_preset("dgx-h100", 2), WorkloadSpec(global_batch_size=16), shape, cases)


def test_a_search_returns_the_new_fields():
    """tp 2 x pp 4 fixed on 8 H100: the best layout among the listed module sets and layouts is a real plan."""
    allowed = {
        "tp": 2, "pp": 4, "zero_stage": 1, "sequence_parallel": True, "framework": "megatron",
        "micro_batch_size": 1, "activation_recompute": ["selective"],
        "recompute_modules": [["core_attn"], ["mlp"]], "pipeline_layout": [LAYOUT],
        "pipeline_schedule": ["interleaved"],
    }  # fmt: skip
    cluster = cluster_preset("dgx-h100", 1)
    problem = Problem(model_of(20), WorkloadSpec(global_batch_size=16), cluster, Constraints.of(allowed), top_k=4)
    result = search(problem)
    assert result.outcome.evaluated == 2 and len(result.results) == 2
    for r in result.results:
        assert r.layout.parallel.pipeline_layout == LAYOUT and r.layout.choice.modules in (("core_attn",), ("mlp",))
        work = r.layout.workload(problem.work)
        plan = build_plan(problem.model, work, r.layout.parallel, problem.cluster)
        assert r.plan.step.time_s == pytest.approx(plan.step.time_s, rel=1e-9)


def test_screen_equals_build_plan_for_deepep_on_an_nvl72_rack():
    """DeepEP's RDMA leg inside one NVLink domain is priced on the NICs (plan.priced_cluster) by the search as by
    build_plan: Qwen3-30B-A3B cut to 4 layers, EP 16 on 64 GPUs of a GB200 NVL72 rack, pp 2."""
    rack = replace(cluster_preset("gb200-nvl72", 1), devices_per_node=64, nics_per_node=64)
    model = replace(MODEL_PRESETS["qwen3-30b-a3b"], seq_length=2048, num_layers=4)
    shape = Shape(1, 1, 2, 32, 16, 1)
    cases = [(Variant(shape, 1, "1f1b", 1, False, "megatron", None, d), 1, "none") for d in ("deepep", "hybridep")]
    screen_vs_plan(model, rack, WorkloadSpec(global_batch_size=64), shape, cases)
