"""Framework defaults, validity rules and per-step calls read from Megatron-LM, TransformerEngine, PyTorch,
torchtitan and vLLM (each rule's source line is in its planner/rules module)."""

from dataclasses import replace

import pytest

from app.serialize import plan_dict
from collectives.topology import ClusterSpec, IntraNode, Network, cluster_preset
from planner import ModelSpec, MoESpec, ParallelSpec, SpecError, WorkloadSpec, build_plan, model_preset
from planner.rules.deepep import distinct
from planner.rules.tensor import vllm_padded_vocab

LLAMA70B = model_preset("llama3-70b")
MIXTRAL = model_preset("mixtral-8x7b")
SMALL = ModelSpec(4, 1024, 8, 4096, 32000, 1024, num_kv_heads=8)
TINY_MOE = replace(SMALL, moe=MoESpec(8, 2, 1024))


def host(devices: int) -> ClusterSpec:
    return ClusterSpec("host", 1, devices, IntraNode("switch", 300.0), network=Network("none"))


def calls(model, work, par, cluster=None) -> list[dict]:
    return plan_dict(build_plan(model, work, par, cluster or host(par.world_size)))["calls"]


def named(plan: list[dict], name: str) -> list[dict]:
    return [c for c in plan if c["name"] == name]


# ---- Megatron defaults and validity ----------------------------------------------------------------------


def test_expert_tp_defaults_to_tp_in_megatron_and_to_1_elsewhere():
    """arguments.py: --expert-tensor-parallel-size None -> tensor_model_parallel_size."""
    assert ParallelSpec(tp=4, ep=2, dp=2).etp == 4
    assert ParallelSpec(tp=4, ep=2, dp=2, framework="torch").etp == 1
    assert ParallelSpec(tp=4, ep=2, dp=2, expert_tp=1).etp == 1
    work = WorkloadSpec(micro_batch_size=1, global_batch_size=2)
    plan = calls(TINY_MOE, work, ParallelSpec(tp=2, ep=2, dp=2, sequence_parallel=True))
    gather = named(plan, "ep.expert_tp.gather")
    assert gather and gather[0]["group_size"] == 2


def test_expert_tp_default_that_does_not_fit_says_so():
    work = WorkloadSpec(micro_batch_size=1, global_batch_size=1)
    with pytest.raises(SpecError) as err:
        calls(MIXTRAL, work, ParallelSpec(tp=8, ep=8, sequence_parallel=True), cluster_preset("dgx-h100", 1))
    assert err.value.field == "parallel.ep" and "expert_tp defaults to tp" in str(err.value)


def test_ulysses_needs_kv_heads_per_tp_rank_divisible_by_cp():
    work = WorkloadSpec(micro_batch_size=1, global_batch_size=8)
    par = ParallelSpec(tp=8, cp=4, dp=8, cp_comm="a2a")
    with pytest.raises(SpecError) as err:
        calls(LLAMA70B, work, par, cluster_preset("dgx-h100", 32))
    assert err.value.field == "parallel.cp"
    assert "num_kv_heads 8 / tp 8 = 1 is not divisible by cp 4 (Ulysses)" in str(err.value)
    calls(LLAMA70B, work, replace(par, cp_comm="p2p"), cluster_preset("dgx-h100", 32))  # ring attention is fine


def test_ulysses_sends_q_k_v_separately():
    """TE flash_attn_a2a_communicate: one all_to_all_single per tensor: q, k, v, out forward; dout, dq, dk,
    dv backward. SMALL: 8 heads, 8 KV heads of 128, tp 2, cp 2 -> per rank b·s/c·(heads/t)·d·2 bytes."""
    work = WorkloadSpec(micro_batch_size=1, global_batch_size=1)
    plan = calls(SMALL, work, ParallelSpec(tp=2, cp=2, cp_comm="a2a"))
    unit = 1 * 1024 // 2 * 4 * 128 * 2
    a2a = {c["name"]: c["message_bytes"] for c in plan if c["parallelism"] == "cp"}
    assert a2a == {
        "cp.attn.q": unit, "cp.attn.k": unit, "cp.attn.v": unit, "cp.attn.out": unit,
        "cp.attn.dout": unit, "cp.attn.dq": unit, "cp.attn.dk": unit, "cp.attn.dv": unit,
    }  # fmt: skip


def test_fp8_dispatch_carries_its_1x128_fp32_scales():
    """DeepSeek-V3 §3.3: h fp8 values plus h/128 fp32 scales per token row; combine stays bf16."""
    work = WorkloadSpec(micro_batch_size=1, global_batch_size=2, moe_dispatch_dtype="fp8")
    plan = calls(TINY_MOE, work, ParallelSpec(ep=2, dp=2))
    rows = 1 * 1024 * 2  # tokens x top-k
    assert named(plan, "ep.dispatch")[0]["message_bytes"] == rows * (1024 + 1024 // 128 * 4)
    assert named(plan, "ep.combine")[0]["message_bytes"] == rows * 1024 * 2


# ---- per-step calls ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("zero", "group"), [(0, 2 * 2), (1, 2 * 2 * 2)])
def test_megatron_gradient_norm_group(zero, group):
    """clip_grads.py get_grad_norm_fp32: tp x pp without, every rank with the distributed optimizer."""
    work = WorkloadSpec(micro_batch_size=1, global_batch_size=4)
    plan = calls(SMALL, work, ParallelSpec(tp=2, pp=2, dp=2, zero_stage=zero))
    norm = named(plan, "dp.grad_norm")
    assert len(norm) == 1 and norm[0]["group_size"] == group
    assert norm[0]["message_bytes"] == 4 and norm[0]["calls_per_iteration"] == 1
    assert norm[0]["stages"] == [0, 1]
    assert not named(plan, "dp.found_inf")
    fp16 = calls(SMALL, replace(work, param_dtype="fp16"), ParallelSpec(tp=2, pp=2, dp=2, zero_stage=zero))
    assert named(fp16, "dp.found_inf")[0]["group_size"] == group


def test_moe_router_reductions_and_deepseek_expert_bias():
    work = WorkloadSpec(micro_batch_size=1, global_batch_size=8)
    plan = calls(TINY_MOE, work, ParallelSpec(tp=2, dp=4, ep=2, expert_tp=1, sequence_parallel=True))
    tokens = named(plan, "ep.router.tokens_per_expert")[0]
    assert (tokens["message_bytes"], tokens["group_size"], tokens["dtype"]) == (8 * 8, 2, "int64")
    assert tokens["calls_per_iteration"] == 4 * 2  # 4 MoE layers x 2 micro-batches
    assert not named(plan, "ep.router.expert_bias")
    biased = replace(TINY_MOE, moe=replace(TINY_MOE.moe, expert_bias=True))
    bias = named(calls(biased, work, ParallelSpec(tp=2, dp=4, ep=2, expert_tp=1, sequence_parallel=True)),
                 "ep.router.expert_bias")[0]  # fmt: skip
    assert (bias["message_bytes"], bias["group_size"], bias["calls_per_iteration"]) == (4 * 8 * 4, 8, 1)
    assert model_preset("deepseek-v3").moe.expert_bias


def test_attention_mask_broadcast_follows_the_dataloader_flag():
    """get_batch_on_this_tp_rank broadcasts the b x 1 x s x s bool mask when the loader builds it (default)."""
    work = WorkloadSpec(micro_batch_size=2, global_batch_size=2)
    plan = calls(SMALL, work, ParallelSpec(tp=2))
    mask = named(plan, "tp.data.attention_mask")[0]
    assert mask["message_bytes"] == 2 * 1024 * 1024 and mask["op"] == "broadcast"
    off = calls(SMALL, replace(work, attention_mask_in_dataloader=False), ParallelSpec(tp=2))
    assert not named(off, "tp.data.attention_mask")


def test_cross_entropy_is_fp32_and_inference_pads_the_vocab_like_vllm():
    train = calls(SMALL, WorkloadSpec(micro_batch_size=1, global_batch_size=1), ParallelSpec(tp=2))
    assert named(train, "tp.cross_entropy")[0]["dtype"] == "fp32"
    assert vllm_padded_vocab(32001) == 32064 and vllm_padded_vocab(128256) == 128256
    odd = replace(SMALL, vocab_size=32001)
    serve = calls(odd, WorkloadSpec(kind="inference", batch_size=4), ParallelSpec(tp=2))
    assert named(serve, "tp.lm_head.logits")[0]["message_bytes"] == 4 * 32064 * 2


def test_workload_seq_length_wins_over_the_model():
    work = WorkloadSpec(micro_batch_size=1, global_batch_size=1, seq_length=2048)
    plan = calls(SMALL, work, ParallelSpec(tp=2))
    assert named(plan, "tp.attn.out_proj")[0]["message_bytes"] == 2048 * 1024 * 2
    with pytest.raises(SpecError) as err:
        calls(SMALL, replace(work, seq_length=2047), ParallelSpec(tp=2, sequence_parallel=True))
    assert err.value.field == "parallel.sequence_parallel" and "2047" in str(err.value)


# ---- PyTorch -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("zero", "phase", "per_weight"), [(0, "optimizer", 3), (2, "backward", 2), (3, "backward", 2)])
def test_fsdp2_redistributes_partial_norm_grads_in_backward(zero, phase, per_weight):
    """Plain DTensor: AdamW reads each partial norm gradient 3 times. FSDP2 on a dp x tp mesh:
    _get_grad_inner_tensor turns Partial into Replicate once per weight and micro-batch, in backward."""
    work = WorkloadSpec(micro_batch_size=1, global_batch_size=4)
    par = ParallelSpec(tp=2, dp=2, zero_stage=zero, sequence_parallel=True, framework="torch")
    norms = named(calls(SMALL, work, par), "tp.norm_weight_grads")
    weights = 2 * SMALL.num_layers + 1
    assert len(norms) == 1 and norms[0]["phase"] == phase
    assert norms[0]["calls_per_iteration"] == weights * per_weight


def test_torchtitan_ep_exchanges_counts_with_all_to_all():
    work = WorkloadSpec(micro_batch_size=1, global_batch_size=2)
    torch = named(calls(TINY_MOE, work, ParallelSpec(ep=2, dp=2, framework="torch")), "ep.token_counts")[0]
    assert (torch["op"], torch["message_bytes"], torch["group_size"]) == ("alltoall", 8 * 8, 2)
    mega = named(calls(TINY_MOE, work, ParallelSpec(ep=2, dp=2)), "ep.token_counts")[0]
    assert (mega["op"], mega["message_bytes"]) == ("allgather", 2 * 8 * 8)


# ---- the HTTP surface of the new fields --------------------------------------------------------------------


@pytest.fixture(scope="module")
def api():
    from tests.app.conftest import Api

    client = Api()
    yield client
    client.close()


BODY = {
    "model": {"preset": "llama3-70b"},
    "workload": {"micro_batch_size": 1, "global_batch_size": 64},
    "cluster": {"preset": "dgx-h100", "num_nodes": 8},
}


@pytest.mark.parametrize(
    ("parallel", "loc", "words"),
    [
        ({"tp": 8, "framework": "deepspeed", "zero_config": {"bucket": 1}}, ["parallel", "zero_config", "bucket"],
         "DeepSpeed has no zero_optimization key 'bucket'"),
        ({"tp": 8, "cp": 4, "cp_comm": "a2a"}, ["parallel", "cp"],
         "num_kv_heads 8 / tp 8 = 1 is not divisible by cp 4 (Ulysses)"),
    ],
)  # fmt: skip
def test_new_rules_are_422_naming_field_and_numbers(api, parallel, loc, words):
    r = api.post("/v1/plan", json=BODY | {"parallel": parallel})
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert any(d["loc"][1 : 1 + len(loc)] == loc and words in d["msg"] for d in detail), detail


def test_zero_config_and_seq_length_reach_the_plan(api):
    body = BODY | {
        "parallel": {"tp": 8, "framework": "deepspeed", "zero_stage": 2, "zero_config": {"reduce_bucket_size": 1e8}},
        "workload": {"micro_batch_size": 1, "global_batch_size": 64, "seq_length": 4096},
    }
    r = api.post("/v1/plan", json=body)
    assert r.status_code == 200, r.text
    grads = [c for c in r.json()["calls"] if c["name"] == "dp.grads"]
    # every bucket stays within 1e8 bf16 elements but the embedding / LM head (128256 x 8192 / tp 8 = 131M),
    # which DeepSpeed reduces alone (extra_large_param_to_reduce)
    oversized = 128256 * 8192 // 8 * 2
    assert grads and all(c["message_bytes"] <= 1e8 * 2 or c["message_bytes"] == oversized for c in grads)
    assert any(c["message_bytes"] == oversized for c in grads)


# ---- DeepEP dispatch ---------------------------------------------------------------------------------------


def test_deepep_two_legs_on_two_nodes():
    """EP 16 over 2 DGX nodes, top-2, no node limit: a token reaches 2(1 - 1/2^2) = 1.5 nodes on average
    (one RDMA copy each, to the same-index GPU) and 8(1 - (7/8)^(2/1.5)) GPUs per node over NVLink."""
    model = replace(SMALL, moe=MoESpec(16, 2, 1024))
    work = WorkloadSpec(micro_batch_size=1, global_batch_size=16)
    plan = calls(model, work, ParallelSpec(ep=16, dp=16, ep_dispatch="deepep"), cluster_preset("dgx-h100", 2))
    tokens, row = 1024, 1024 * 2
    nodes, gpus = distinct(2, 2), distinct(8, 2 / distinct(2, 2))
    assert nodes == 1.5
    rdma, nvlink = named(plan, "ep.dispatch.rdma")[0], named(plan, "ep.dispatch.nvlink")[0]
    assert (rdma["group_size"], rdma["message_bytes"]) == (2, round(tokens * nodes) * row)
    assert (nvlink["group_size"], nvlink["message_bytes"]) == (8, round(tokens * nodes * gpus) * row)
    assert rdma["placement"]["bottleneck"] == "nic" and nvlink["placement"]["bottleneck"] == "nvlink"
    assert rdma["placement"]["group_ranks"] == [0, 8]  # same in-node index on each node
    assert nvlink["placement"]["group_ranks"] == list(range(8))
    for name in ("ep.combine.rdma", "ep.combine.nvlink", "ep.dispatch.bwd.rdma", "ep.combine.bwd.nvlink"):
        assert named(plan, name), name
    assert not named(plan, "ep.token_counts") and not named(plan, "ep.dispatch")


def test_deepep_node_limit_and_single_node():
    """DeepSeek-V3's M = 4 bounds the nodes per token; inside one node only the NVLink leg exists, one copy
    per target GPU: 8(1 - (7/8)^2) GPUs for top-2."""
    assert distinct(4, 8) == pytest.approx(4 * (1 - 0.75**8)) and distinct(1, 8) == 1.0
    model = replace(SMALL, moe=MoESpec(8, 2, 1024))
    work = WorkloadSpec(micro_batch_size=1, global_batch_size=8)
    plan = calls(model, work, ParallelSpec(ep=8, dp=8, ep_dispatch="deepep"), cluster_preset("dgx-h100", 1))
    leg = named(plan, "ep.dispatch.nvlink")[0]
    assert leg["message_bytes"] == round(1024 * distinct(8, 2)) * 1024 * 2 and leg["group_size"] == 8
    assert not named(plan, "ep.dispatch.rdma")
    assert model_preset("deepseek-v3").moe.node_limit == 4
