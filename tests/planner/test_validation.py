"""Every violated rule is reported with its field and the numbers (torchtitan ParallelDims style)."""

from dataclasses import replace

import pytest

from app.serialize import plan_dict
from collectives.topology import cluster_preset
from planner import ParallelSpec, SpecError, WorkloadSpec, build_plan, model_preset
from planner.model import MoESpec, validate_model

LLAMA = model_preset("llama3-70b")
TRAIN = WorkloadSpec(micro_batch_size=1, global_batch_size=1024)


def plan(par, work=TRAIN, model=LLAMA, nodes=64):
    return build_plan(model, work, par, cluster_preset("dgx-h100", nodes))


@pytest.mark.parametrize(
    ("par", "work", "model", "nodes", "field", "words"),
    [
        (
            ParallelSpec(tp=8, pp=4, dp=8),
            TRAIN,
            LLAMA,
            64,
            "parallel",
            "tp*cp*pp*dp = 8*1*4*8 = 256 but the cluster has 512 devices",
        ),
        (ParallelSpec(tp=16, pp=2, dp=16), TRAIN, LLAMA, 64, "parallel.tp", "num_kv_heads 8 is not divisible by tp 16"),
        (ParallelSpec(tp=8, pp=3, dp=8), TRAIN, LLAMA, 24, "parallel.pp", "num_layers 80 is not divisible by pp 3"),
        (
            ParallelSpec(tp=8, pp=4, dp=16),
            WorkloadSpec(micro_batch_size=3, global_batch_size=1024),
            LLAMA,
            64,
            "workload.global_batch_size",
            "global_batch_size 1024 is not divisible by micro_batch_size*dp = 3*16 = 48",
        ),
        (ParallelSpec(tp=8, pp=4, dp=16, ep=2), TRAIN, LLAMA, 64, "parallel.ep", "need an MoE model"),
        (
            ParallelSpec(tp=8, cp=3, pp=4, dp=4),
            TRAIN,
            LLAMA,
            48,
            "parallel.cp",
            "sequence 8192 is not divisible by 2*cp = 6",
        ),
        (
            ParallelSpec(tp=8, pp=4, dp=16, zero_stage=4),
            TRAIN,
            LLAMA,
            64,
            "parallel.zero_stage",
            "must be 0, 1, 2 or 3",
        ),
        (
            ParallelSpec(tp=8, pp=4, dp=16, pipeline_schedule="zigzag"),
            TRAIN,
            LLAMA,
            64,
            "parallel.pipeline_schedule",
            "must be one of",
        ),
        (
            ParallelSpec(tp=8, pp=4, dp=16, pipeline_schedule="interleaved"),
            TRAIN,
            LLAMA,
            64,
            "parallel.virtual_pipeline_stages",
            "needs pp >= 2 and virtual_pipeline_stages >= 2",
        ),
        (
            ParallelSpec(tp=8, pp=4, dp=16, zero_stage=3, hybrid_shard_size=3),
            TRAIN,
            LLAMA,
            64,
            "parallel.hybrid_shard_size",
            "hybrid_shard_size 3 must divide dp 16",
        ),
        (
            ParallelSpec(tp=8, pp=4, dp=16, order="tp-dp-pp"),
            TRAIN,
            LLAMA,
            64,
            "parallel.order",
            "must name tp, cp, ep, dp and pp",
        ),
        (
            ParallelSpec(tp=8, pp=4, dp=16),
            WorkloadSpec(kind="inference", phase="decode", batch_size=24),
            LLAMA,
            64,
            "workload.batch_size",
            "batch_size 24 is not divisible by dp 16",
        ),
        (
            ParallelSpec(tp=8, pp=4, dp=16),
            WorkloadSpec(activation_recompute="some"),
            LLAMA,
            64,
            "workload.activation_recompute",
            "must be one of none, selective, full",
        ),
        (
            ParallelSpec(tp=8, pp=16, dp=4, first_stage_layers=6, last_stage_layers=6),
            TRAIN,
            LLAMA,
            64,
            "parallel.first_stage_layers",
            "80 - first/last 6+6 = 68 layers do not split evenly over the 14 other stages",
        ),
    ],
)
def test_rule_violations_name_field_and_numbers(par, work, model, nodes, field, words):
    with pytest.raises(SpecError) as caught:
        plan(par, work, model, nodes)
    assert caught.value.field == field
    assert words in str(caught.value)


def test_moe_rules():
    mixtral = model_preset("mixtral-8x7b")
    with pytest.raises(SpecError, match="num_experts 8 is not divisible by ep 3"):
        plan(ParallelSpec(tp=1, pp=1, dp=24, ep=3), WorkloadSpec(global_batch_size=24), mixtral, 3)
    with pytest.raises(SpecError, match=r"expert_tp\*ep = 2\*8 = 16 does not divide tp\*cp\*dp = 1\*1\*8 = 8"):
        plan(ParallelSpec(tp=1, pp=1, dp=8, ep=8, expert_tp=2), WorkloadSpec(global_batch_size=8), mixtral, 1)
    with pytest.raises(SpecError, match="top_k 9 must be between 1 and num_experts 8"):
        validate_model(replace(mixtral, moe=MoESpec(8, 9, 14336)))


def test_good_config_plans():
    result = plan_dict(plan(ParallelSpec(tp=8, pp=4, dp=16, zero_stage=1, sequence_parallel=True)))
    assert result["world_size"] == 512 and result["num_microbatches"] == 64
