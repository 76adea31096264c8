"""Frameworks round two (issue 24): DDP's switches, DeepSpeed's ZeRO++ and overlap_comm, FSDP2 inside
torch.distributed.pipelining; closed forms from the frameworks' source (each rule cites its file and line)."""

from dataclasses import replace

import pytest

from app.serialize import plan_dict
from collectives.topology import ClusterSpec, IntraNode, Network
from collectives.topology.gpu import gpu_preset
from planner import Context, ModelSpec, Overlap, ParallelSpec, SpecError, WorkloadSpec, build_plan
from planner.parallel import DDPConfig, zero_config_from_dict
from planner.params import stage_params
from planner.rules.data import pipeline_passes
from planner.rules.deepspeed import qwz_groups

SMALL = ModelSpec(4, 1024, 8, 4096, 32000, 1024, num_kv_heads=8)


def host(devices: int, nodes: int = 1) -> ClusterSpec:
    if nodes == 1:
        return ClusterSpec("host", 1, devices, IntraNode("switch", 300.0), network=Network("none"))
    return ClusterSpec(
        "hosts", nodes, devices, IntraNode("switch", 300.0), nics_per_node=1, nic_bandwidth_GBps=25.0,
        network=Network("fat_tree"),
    )  # fmt: skip


def calls(model, work, par, cluster=None) -> list[dict]:
    return plan_dict(build_plan(model, work, par, cluster or host(par.world_size)))["calls"]


def rows(plan: list[dict], name: str) -> list[tuple[int, int]]:
    return sorted((c["message_bytes"], c["calls_per_iteration"]) for c in plan if c["name"] == name)


# ---- DDP -------------------------------------------------------------------------------------------------


def test_ddp_default_buckets_have_a_1_mib_first_bucket():
    """distributed.py _BucketCapacityConfig: the default cap (25 MiB) comes with a 1 MiB first bucket in the
    rebuilt (gradient-order) layout; a given bucket_cap_mb caps every bucket."""
    work = WorkloadSpec(micro_batch_size=1, global_batch_size=4, param_dtype="fp32")
    par = ParallelSpec(dp=4, framework="torch")
    tied = replace(SMALL, tied_embeddings=True)  # no LM head: the last registered parameters are small
    default = rows(calls(tied, work, par), "dp.grads")
    ctx = Context(tied, work, par)
    dense, _ = stage_params(ctx, 0)
    total = sum(p.numel for p in dense) * 4
    assert sum(b * n for b, n in default) == total
    # reverse registration: final norm (4 KiB) + layer 3's down (16 MiB) close the first bucket at >= 1 MiB
    first = (1024 + 4096 * 1024) * 4
    assert (first, 1) in default
    explicit = rows(calls(tied, work, replace(par, ddp=DDPConfig(bucket_cap_mb=25))), "dp.grads")
    assert (first + 4096 * 1024 * 4, 1) in explicit  # final norm, down and up reach 25 MiB together
    assert (first, 1) not in explicit and sum(b * n for b, n in explicit) == total


def test_ddp_find_unused_parameters_keeps_the_initial_layout_and_reduces_the_used_map():
    """reducer.cpp: never rebuilt with find_unused_parameters (registration order, first bucket from the
    embedding), and one int32 all-reduce of one flag per parameter tensor each step."""
    work = WorkloadSpec(micro_batch_size=1, global_batch_size=8, param_dtype="fp32")
    par = ParallelSpec(dp=4, framework="torch", ddp=DDPConfig(find_unused_parameters=True))
    plan = calls(SMALL, work, par)
    tensors = 1 + 4 * 9 + 2  # embedding, 9 per layer (2 norms, q, k, v, o, gate, up, down), final norm, head
    assert rows(plan, "dp.used_parameters") == [(4 * tensors, 1)]
    used = next(c for c in plan if c["name"] == "dp.used_parameters")
    assert used["dtype"] == "int32" and used["group_size"] == 4
    # the initial layout starts at the embedding: 32000 x 1024 fp32 = 125 MiB, over the 1 MiB first bucket
    assert (32000 * 1024 * 4, 1) in rows(plan, "dp.grads")
    static = calls(SMALL, work, replace(par, ddp=DDPConfig(find_unused_parameters=True, static_graph=True)))
    assert rows(static, "dp.used_parameters") == []  # only the first iteration sends the map
    assert rows(static, "dp.grads") == rows(calls(SMALL, work, replace(par, ddp=DDPConfig())), "dp.grads")


def test_ddp_says_when_its_steady_state_starts_and_that_bucket_views_change_nothing():
    work = WorkloadSpec(micro_batch_size=1, global_batch_size=8, param_dtype="fp32")
    par = ParallelSpec(dp=4, framework="torch")
    plan = build_plan(SMALL, work, replace(par, ddp=DDPConfig(static_graph=True)), host(4))
    assert any("steady state from step 2" in w for w in plan.warnings)
    plain = build_plan(SMALL, work, par, host(4))
    assert any("steady state from step 1" in w for w in plain.warnings)
    view = build_plan(SMALL, work, replace(par, ddp=DDPConfig(gradient_as_bucket_view=True)), host(4))
    assert any("gradient_as_bucket_view" in w and "do not change" in w for w in view.warnings)
    assert plan_dict(view)["calls"] == plan_dict(plain)["calls"]


@pytest.mark.parametrize(
    "par, field",
    [
        (ParallelSpec(dp=4, ddp=DDPConfig(find_unused_parameters=True)), "parallel.ddp"),  # megatron
        (ParallelSpec(dp=4, framework="torch", zero_stage=3, ddp=DDPConfig(static_graph=True)), "parallel.ddp"),
        (ParallelSpec(dp=4, framework="torch", ddp=DDPConfig(bucket_cap_mb=0.0)), "parallel.ddp.bucket_cap_mb"),
        (
            ParallelSpec(dp=4, framework="torch", dp_bucket_bytes=1 << 20, ddp=DDPConfig(bucket_cap_mb=1.0)),
            "parallel.ddp.bucket_cap_mb",
        ),
    ],
)
def test_ddp_switches_outside_ddp_are_refused(par, field):
    with pytest.raises(SpecError) as err:
        calls(SMALL, WorkloadSpec(micro_batch_size=1, global_batch_size=8), par)
    assert err.value.field == field


# ---- ZeRO++ and DeepSpeed's overlap ---------------------------------------------------------------------


def _ds(**zero) -> ParallelSpec:
    zc = zero_config_from_dict({"stage3_param_persistence_threshold": 0, **zero})
    return ParallelSpec(dp=8, zero_stage=3, framework="deepspeed", zero_config=zc)


WORK4 = WorkloadSpec(micro_batch_size=1, global_batch_size=32, param_dtype="bf16")  # 4 micro-batches on dp 8


def test_hpz_regathers_on_the_secondary_groups_after_the_first_forward():
    """partition_parameters.py:1571-1575 and _partition_param_sec: once released, a parameter is re-gathered over
    its hpZ group of zero_hpz_partition_size ranks; only micro-batch 0's forward gathers over all 8."""
    released = {"stage3_max_reuse_distance": 0, "stage3_max_live_parameters": 1}  # no parameter kept into backward
    base = calls(SMALL, WORK4, _ds(**released))
    hpz = calls(SMALL, WORK4, _ds(**released, zero_hpz_partition_size=2))
    fwd, bwd = rows(base, "dp.params"), rows(base, "dp.params.bwd")
    assert fwd and bwd and all(n % 4 == 0 for _, n in fwd + bwd)
    assert rows(hpz, "dp.params") == [(b, n // 4) for b, n in fwd]  # the first micro-batch's forward
    assert rows(hpz, "dp.params.hpz") == [(b, 3 * n // 4) for b, n in fwd]
    assert rows(hpz, "dp.params.bwd.hpz") == bwd and rows(hpz, "dp.params.bwd") == []
    assert {c["group_size"] for c in hpz if c["name"].endswith(".hpz")} == {2}
    # the secondary partition costs numel/2 more parameter bytes per rank (planner/memory.py)
    gpu_cluster = replace(host(8), gpu=gpu_preset("h100-sxm5-80gb"))
    mem0 = build_plan(SMALL, WORK4, _ds(), gpu_cluster).memory.per_stage[0]
    mem2 = build_plan(SMALL, WORK4, _ds(zero_hpz_partition_size=2), gpu_cluster).memory.per_stage[0]
    assert mem2.params_bytes - mem0.params_bytes == pytest.approx(mem0.params_bytes * 8 / 2, rel=1e-6)


def test_qwz_gathers_int8_and_block_scales():
    plain = calls(SMALL, WORK4, _ds())
    q = calls(SMALL, WORK4, _ds(zero_quantized_weights=True))
    for (elements_bytes, n), (int8, m) in zip(rows(plain, "dp.params"), rows(q, "dp.params"), strict=True):
        assert (int8, m) == (elements_bytes // 2, n)  # bf16 -> int8, the same elements
    scales = rows(q, "dp.params.scales")
    assert scales == sorted((4 * 8 * qwz_groups(b // 2 // 8), n) for b, n in rows(plain, "dp.params"))


def test_qwz_group_count_follows_cuda_quantizer():
    """CUDAQuantizer.quantize: ceil(n/8000) groups, up until 8 * groups divides n, doubled while 16 * groups
    divides n and groups stay over 8000 elements."""
    assert qwz_groups(47184) == 6
    assert qwz_groups(1 << 20) == 256  # 131 -> 256: 8*256 | 2^20, and 2^20/256 = 4096 < 8000
    assert qwz_groups(8000) == 1


def test_qgz_replaces_the_reduce_scatter_across_nodes_only():
    one_node = calls(SMALL, WORK4, _ds(zero_quantized_gradients=True), host(8))
    assert not any("qgz" in c["name"] for c in one_node)
    two = calls(SMALL, WORK4, _ds(zero_quantized_gradients=True), host(4, nodes=2))
    intra = [c for c in two if c["name"] == "dp.grads.qgz_intra"]
    inter = [c for c in two if c["name"] == "dp.grads.qgz_inter"]
    assert intra and {c["group_size"] for c in intra} == {4} and {c["group_size"] for c in inter} == {2}
    # int4: half a byte per element inside the node, a quarter of that (the node-reduced share) across
    assert sorted(c["message_bytes"] // 4 for c in intra) == sorted(c["message_bytes"] for c in inter)
    # every 2-D gradient of the step goes through qgZ: the down projection (4096 x 1024) among them
    assert any(c["message_bytes"] == 4096 * 1024 // 2 for c in intra)
    norms = [c for c in two if c["name"] == "dp.grads" and c["op"] == "reducescatter"]
    assert norms and {c["message_bytes"] for c in norms} == {1024 * 2}  # 1-D norms fall back, bf16


def test_overlap_comm_drives_the_overlap_default():
    ctx = Context(SMALL, WORK4, _ds())
    assert Overlap().resolved(ctx).overlap_grad_reduce  # DeepSpeed: None -> True at ZeRO-3
    off = Context(SMALL, WORK4, _ds(overlap_comm=False))
    assert not Overlap().resolved(off).overlap_grad_reduce
    on = zero_config_from_dict({"overlap_comm": True})
    z1 = ParallelSpec(dp=8, zero_stage=1, framework="deepspeed", zero_config=on)
    assert Overlap().resolved(Context(SMALL, WORK4, z1)).overlap_grad_reduce
    default = replace(z1, zero_config=zero_config_from_dict({}))
    assert not Overlap().resolved(Context(SMALL, WORK4, default)).overlap_grad_reduce


@pytest.mark.parametrize(
    "zero, field, words",
    [
        ({"zero_hpz_partition_size": 3}, "parallel.zero_config.zero_hpz_partition_size", "must divide"),
        ({"round_robin_gradients": True}, "parallel.zero_config.round_robin_gradients", "not modelled"),
        ({"zero_hpz_size": 2}, "parallel.zero_config.zero_hpz_size", "DeepSpeed has no"),
        ({"overlap_comm": 1}, "parallel.zero_config.overlap_comm", "true or false"),
    ],
)
def test_zero_config_refusals_name_the_key(zero, field, words):
    with pytest.raises(SpecError) as err:
        calls(SMALL, WORK4, _ds(**zero))
    assert err.value.field == field and words in err.value.rule


def test_zero_plus_plus_is_zero3_only():
    zc = zero_config_from_dict({"zero_hpz_partition_size": 2})
    with pytest.raises(SpecError) as err:
        calls(SMALL, WORK4, ParallelSpec(dp=8, zero_stage=2, framework="deepspeed", zero_config=zc))
    assert err.value.field == "parallel.zero_config.zero_hpz_partition_size" and "zero_stage 2" in err.value.rule


# ---- FSDP2 inside torch.distributed.pipelining ---------------------------------------------------------


def test_pipeline_pass_orders_follow_torch_schedules():
    work = WorkloadSpec(micro_batch_size=1, global_batch_size=8)
    par = ParallelSpec(pp=2, dp=2, framework="torch", zero_stage=3)
    ctx = Context(SMALL, work, par)
    assert pipeline_passes(ctx, 0) == [list("FFBFBFBB")]  # warm-up min(4, 2 - 0) = 2
    assert pipeline_passes(ctx, 1) == [list("FBFBFBFB")]
    gpipe = Context(SMALL, work, replace(par, pipeline_schedule="gpipe"))
    assert pipeline_passes(gpipe, 1) == [list("FFFFBBBB")]


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_fsdp2_in_a_pipeline_reduces_once_and_regathers_after_forwards(schedule):
    """stage.py:844-847: no reduction or reshard after a micro-batch's backward; perform_reduce_grad once. A block
    is gathered by the step's first pass and by each pass that follows a forward: m + 1 = 5 per step for both
    schedules (forward w, backward m - w + 1); the root once; with reshard_after_forward=False every unit once."""
    work = WorkloadSpec(micro_batch_size=1, global_batch_size=8)
    par = ParallelSpec(pp=2, dp=2, framework="torch", zero_stage=3, pipeline_schedule=schedule)
    plan = calls(SMALL, work, par)
    layers = 2  # per stage
    for stage, warmup in ((0, 2 if schedule == "1f1b" else 4), (1, 1 if schedule == "1f1b" else 4)):
        mine = [c for c in plan if stage in c["stages"] and c["name"].startswith("dp.")]
        fwd = sum(c["calls_per_iteration"] for c in mine if c["name"] == "dp.params")
        bwd = sum(c["calls_per_iteration"] for c in mine if c["name"] == "dp.params.bwd")
        grads = sum(c["calls_per_iteration"] for c in mine if c["name"] == "dp.grads")
        assert (fwd, bwd) == (layers * warmup + 1, layers * (4 - warmup + 1))
        assert grads == layers + 1  # once per unit: the blocks and the stage's root
    z2 = calls(SMALL, work, replace(par, zero_stage=2))
    for stage in (0, 1):
        mine = [c for c in z2 if stage in c["stages"]]
        assert sum(c["calls_per_iteration"] for c in mine if c["name"] == "dp.params") == layers + 1
        assert not any(c["name"] == "dp.params.bwd" for c in mine)


def test_search_templates_refuse_fsdp2_in_a_pipeline():
    """A template extrapolates counts from m = 1 and 2; the warm-up min(m, pp - stage) is not linear beyond, so the
    search builds these layouts exactly (planner/search/templates.py)."""
    from planner.search import templates

    work = WorkloadSpec(micro_batch_size=1, global_batch_size=16)
    par = ParallelSpec(pp=4, dp=2, framework="torch", zero_stage=3)
    with pytest.raises(templates.NotLinear):
        templates.build(templates.DATA_RULES, SMALL, work, par)
    ledger = calls(SMALL, replace(work, global_batch_size=16), par)
    stage0 = [c for c in ledger if c["stages"] == [0] and c["name"] == "dp.params.bwd"]
    assert sum(c["calls_per_iteration"] for c in stage0) == 1 * (8 - 4 + 1)  # one block, m = 8, warm-up 4
