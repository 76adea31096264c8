"""Issue 21 items 4-6 over HTTP: the new model fields, the published presets and config.json files, the fp8/fp4
recipes and fp8 parameter gather, and the MoE communication options (allgather, DeepEP's two legs, the
overlap switches). Byte counts are worked by hand in each test."""

import json
from pathlib import Path

import pytest

HF_DIR = Path(__file__).parents[1] / "reference" / "hf_configs"
H100x2 = {"preset": "dgx-h100", "num_nodes": 2}


def plan(api, body: dict, status: int = 200) -> dict:
    r = api.post("/v1/plan", json=body)
    assert r.status_code == status, r.text
    return r.json()


def calls(result: dict, prefix: str) -> dict:
    return {c["name"]: c for c in result["calls"] if c["name"].startswith(prefix)}


def refused(result: dict, loc: list[str], *words: str) -> None:
    detail = result["detail"]
    assert any(d["loc"] == ["body", *loc] and all(w in d["msg"] for w in words) for d in detail), detail


# ---- models ---------------------------------------------------------------------------------------------


def test_gpt_oss_preset_and_its_config_json_give_the_published_total(api):
    """gpt-oss-20b: 20,914,757,184 parameters (model card 20.91B), by preset and by the hub's config.json."""
    body = {"model": {"preset": "gpt-oss-20b"}, "workload": {"global_batch_size": 16}, "cluster": H100x2}
    assert plan(api, body)["params_total"] == 20_914_757_184
    body["model"] = {"hf_config": json.loads((HF_DIR / "gpt-oss-20b.json").read_text())}
    assert plan(api, body)["params_total"] == 20_914_757_184
    # the fields one by one: sinks are 64 per layer, the windows change no parameter
    body["model"] = {"preset": "gpt-oss-20b", "attention_sinks": False, "sliding_window": None,
                     "full_attention_interval": None}  # fmt: skip
    assert plan(api, body)["params_total"] == 20_914_757_184 - 24 * 64


def test_presets_list_the_new_models_with_their_fields(api):
    models = api.get("/v1/presets/models").json()
    assert {"gpt-oss-120b", "gpt-oss-20b", "qwen3-235b-a22b", "deepseek-v3"} <= set(models)
    oss = models["gpt-oss-120b"]
    assert (oss["sliding_window"], oss["full_attention_interval"], oss["attention_sinks"]) == (128, 2, True)
    assert models["deepseek-v3"]["mtp_layers"] == 1


def test_qwen3_mlp_only_layers_over_http(api):
    """A dense layer instead of an MoE one: 128 experts (3 x 2048 x 768 each) and the router (2048 x 128) go,
    one dense SwiGLU MLP (3 x 2048 x 6144) comes."""
    moe = {"num_experts": 128, "top_k": 8, "expert_ffn_hidden_size": 768}
    body = {"model": {"preset": "qwen3-30b-a3b", "moe": moe}, "workload": {"global_batch_size": 16}, "cluster": H100x2}
    base = plan(api, body)["params_total"]
    body["model"]["moe"] = moe | {"mlp_only_layers": [0, 47]}
    dense = plan(api, body)["params_total"]
    assert base - dense == 2 * (128 * 3 * 2048 * 768 + 2048 * 128 - 3 * 2048 * 6144)


def test_deepseek_v3_mtp_layers_over_http(api):
    """The MTP module on the last stage: with mtp_layers 0 the main model's 671.03B; with 1 its block, norms
    and eh_proj (11.61B) join, and the last stage's ledger carries one more MoE layer's all-to-alls."""
    body = {
        "model": {"preset": "deepseek-v3", "mtp_layers": 0},
        "workload": {"global_batch_size": 128},
        "parallel": {"pp": 2, "ep": 64, "dp": 64, "first_stage_layers": 31},
        "cluster": {"preset": "dgx-h100", "num_nodes": 16},
    }
    main = plan(api, body)
    assert main["params_total"] == 671_026_404_352
    body["model"]["mtp_layers"] = 1
    with_mtp = plan(api, body)
    assert with_mtp["params_total"] - main["params_total"] == 11_610_067_968
    before, after = (calls(p, "ep.dispatch")["ep.dispatch"] for p in (main, with_mtp))
    # stage 1 holds layers 31..60: 30 MoE layers, 31 with the MTP block; 2 micro-batches per rank
    rows = {tuple(c["stages"]): c["calls_per_iteration"] for c in with_mtp["calls"] if c["name"] == "ep.dispatch"}
    assert rows[(1,)] == 31 * 2 and before["message_bytes"] == after["message_bytes"]


def test_mla_without_query_compression_over_http(api):
    """q_lora_rank 0 (DeepSeek-V2-Lite): one column-parallel q projection h x heads x (nope + rope)."""
    model = {
        "num_layers": 2, "hidden_size": 1024, "num_attention_heads": 8, "ffn_hidden_size": 4096,
        "vocab_size": 32000, "seq_length": 2048,
        "mla": {"q_lora_rank": 0, "kv_lora_rank": 256, "qk_nope_head_dim": 64, "qk_rope_head_dim": 32,
                "v_head_dim": 64},
    }  # fmt: skip
    body = {"model": model, "workload": {"global_batch_size": 16}, "cluster": H100x2}
    q = 1024 * 8 * 96
    kv = 1024 * (256 + 32) + 256 + 256 * 8 * (64 + 64)
    attn = q + kv + 8 * 64 * 1024
    layer = attn + 2 * 1024 + 3 * 1024 * 4096
    assert plan(api, body)["params_total"] == 2 * layer + 2 * 32000 * 1024 + 1024


def test_mla_projections_under_tp_over_http(api):
    """Per TP rank (tp 2, one stage): q_down h x 512 and kv_down h x (256 + 32) and the two latent norms whole
    on every rank; q_up, kv_up and the output projection halved; with SP their gradients (and the layer norms')
    are all-reduced over TP once per iteration."""
    model = {
        "num_layers": 2, "hidden_size": 1024, "num_attention_heads": 8, "ffn_hidden_size": 4096,
        "vocab_size": 32000, "seq_length": 2048,
        "mla": {"q_lora_rank": 512, "kv_lora_rank": 256, "qk_nope_head_dim": 64, "qk_rope_head_dim": 32,
                "v_head_dim": 64},
    }  # fmt: skip
    body = {
        "model": model,
        "workload": {"global_batch_size": 16},
        "parallel": {"tp": 2, "dp": 8, "sequence_parallel": True},
        "cluster": H100x2,
    }
    result = plan(api, body)
    replicated = 1024 * 512 + 512 + 1024 * (256 + 32) + 256
    split = 512 * 8 * 96 + 256 * 8 * (64 + 64) + 8 * 64 * 1024
    layer = replicated + split // 2 + 2 * 1024 + 3 * 1024 * 4096 // 2
    head = 2 * 32000 * 1024 // 2 + 1024  # vocab 32,000 is a multiple of 128 x 2: no padding
    assert result["memory"]["per_stage"][0]["param_count"] == 2 * layer + head
    sp_grads = calls(result, "tp.sp_param_grads")["tp.sp_param_grads"]
    assert sp_grads["message_bytes"] == (2 * (replicated + 2 * 1024) + 1024) * 4  # fp32 main grads


@pytest.mark.parametrize(
    ("model", "loc", "words"),
    [
        ({"preset": "llama3-8b", "full_attention_interval": 2}, ["model", "full_attention_interval"], "sliding_window"),
        ({"preset": "gpt-oss-20b", "full_attention_interval": 25}, ["model", "full_attention_interval"], "24"),
        ({"preset": "llama3-8b", "sliding_window": 0}, ["model", "sliding_window"], "greater than or equal to 1"),
        ({"preset": "llama3-8b", "mtp_layers": 65}, ["model", "mtp_layers"], "less than or equal to 64"),
        (
            {"preset": "qwen3-30b-a3b", "moe": {"num_experts": 128, "top_k": 8, "expert_ffn_hidden_size": 768,
                                                "mlp_only_layers": [48]}},
            ["model", "moe", "mlp_only_layers"], "[48]",
        ),
        (
            {"hf_config": json.loads((HF_DIR / "gpt-oss-20b.json").read_text()) | {"layer_types": ["full_attention"]}},
            ["model", "hf_config", "layer_types"], "got 1",
        ),
    ],
)  # fmt: skip
def test_bad_model_fields_are_422_naming_them(api, model, loc, words):
    result = plan(api, {"model": model, "workload": {"global_batch_size": 16}, "cluster": H100x2}, 422)
    refused(result, loc, words)


# ---- fp8 / fp4 recipes ------------------------------------------------------------------------------------

LLAMA8B_FP8 = {
    "model": {"preset": "llama3-8b"},
    "workload": {"global_batch_size": 64, "fp8_recipe": "delayed"},
    "parallel": {"tp": 2, "dp": 8, "zero_stage": 1, "sequence_parallel": True},
    "cluster": H100x2,
}


def test_fp8_param_gather_bytes_by_hand(api):
    """Llama-3 8B at tp 2: each rank's TE linear weights are 32 layers x (qkv 4096 x 6144 + proj 4096 x 4096 +
    fc1 4096 x 28672 + fc2 14336 x 4096) / 2 = 3,489,660,928 elements, gathered at 1 B each; the rest
    (padded embedding and head 128,256 x 4096 / 2 each, 65 norms of 4096) stays bf16."""
    linear = 32 * (4096 * 6144 + 4096 * 4096 + 4096 * 28672 + 14336 * 4096) // 2
    rest = 2 * 128256 * 4096 // 2 + 65 * 4096
    plain = plan(api, LLAMA8B_FP8)
    assert sum(c["message_bytes"] for c in calls(plain, "dp.params").values()) == 2 * (linear + rest)
    body = json.loads(json.dumps(LLAMA8B_FP8))
    body["workload"]["fp8_param_gather"] = True
    result = plan(api, body)
    gathers = calls(result, "dp.params")
    assert gathers["dp.params.fp8"]["message_bytes"] == linear and gathers["dp.params.fp8"]["dtype"] == "fp8"
    assert gathers["dp.params"]["message_bytes"] == 2 * rest
    # the optimizer's amax all-reduce before the cast: one fp32 per weight (4 per layer) with delayed scaling
    assert calls(result, "dp.fp8_param_amax")["dp.fp8_param_amax"]["message_bytes"] == 32 * 4 * 4
    # the primary weights are fp8: the rank holds the rowwise + columnwise fp8 copies instead of bf16 + copies
    mem_plain, mem_fp8 = (p["memory"]["per_stage"][0]["params_bytes"] for p in (plain, result))
    assert mem_plain - mem_fp8 == 2 * linear


def test_delayed_scaling_amax_reduction_by_hand(api):
    """3 fp8 tensors per GEMM forward and 2 backward, 4 GEMMs per layer, fp32, once per micro-batch (8)."""
    result = plan(api, LLAMA8B_FP8)
    amax = calls(result, "fp8.amax")
    assert amax["fp8.amax"]["message_bytes"] == 3 * 4 * 32 * 4
    assert amax["fp8.amax.bwd"]["message_bytes"] == 2 * 4 * 32 * 4
    assert amax["fp8.amax"]["calls_per_iteration"] == 64 // 8 and amax["fp8.amax"]["group_size"] == 16
    body = json.loads(json.dumps(LLAMA8B_FP8))
    body["workload"]["fp8_recipe"] = "blockwise"  # scales from each tile's own amax: no reduction
    assert not calls(plan(api, body), "fp8.amax")


def test_current_scaling_amax_over_tp_by_hand(api):
    """tensorwise under SP: per layer the qkv and fc1 inputs' amax (one fp32) all-reduced over TP in forward,
    proj's and fc2's output gradients in backward; 32 layers x 8 micro-batches."""
    body = json.loads(json.dumps(LLAMA8B_FP8))
    body["workload"]["fp8_recipe"] = "tensorwise"
    amax = calls(plan(api, body), "fp8.tp_amax")
    assert {n: (c["message_bytes"], c["calls_per_iteration"], c["group_size"]) for n, c in amax.items()} == {
        "fp8.tp_amax": (4, 32 * 2 * 8, 2),
        "fp8.tp_amax.bwd": (4, 32 * 2 * 8, 2),
    }
    body["parallel"]["sequence_parallel"] = False  # each rank quantizes the whole input: nothing to reduce
    assert not calls(plan(api, body), "fp8.tp_amax")


def test_blackwell_recipes_are_refused_on_hopper(api):
    body = json.loads(json.dumps(LLAMA8B_FP8))
    body["workload"]["fp8_recipe"] = "mxfp8"
    refused(plan(api, body, 422), ["workload", "fp8_recipe"], "10.0", "9.0")
    body["cluster"] = {"preset": "dgx-b200", "num_nodes": 2}
    fp8 = plan(api, body)
    body["workload"]["fp8_recipe"] = None
    assert fp8["step"]["time_s"] < plan(api, body)["step"]["time_s"]


def test_fp8_param_gather_needs_a_recipe_and_megatron(api):
    body = json.loads(json.dumps(LLAMA8B_FP8))
    body["workload"] = {"global_batch_size": 64, "fp8_param_gather": True}
    refused(plan(api, body, 422), ["workload", "fp8_param_gather"], "fp8_recipe")
    body["workload"]["fp8_recipe"] = "tensorwise"
    body["parallel"] |= {"framework": "torch", "sequence_parallel": False}
    refused(plan(api, body, 422), ["workload", "fp8_param_gather"], "torch")


# ---- MoE communication --------------------------------------------------------------------------------------

MOE = {
    "num_layers": 4, "hidden_size": 2048, "num_attention_heads": 16, "ffn_hidden_size": 8192,
    "vocab_size": 32000, "seq_length": 4096,
    "moe": {"num_experts": 16, "top_k": 2, "expert_ffn_hidden_size": 1024},
}  # fmt: skip


def moe_body(parallel: dict, **workload) -> dict:
    return {
        "model": MOE,
        "workload": {"global_batch_size": 16} | workload,
        "parallel": {"ep": 16, "dp": 16} | parallel,
        "cluster": H100x2,
    }


def test_allgather_dispatcher_bytes_by_hand(api):
    """Megatron MoEAllGatherTokenDispatcher, tp 2 + SP, ep 8: each rank holds 4096 / 2 tokens; the TP x EP
    group (16) gathers 16 x 2048 rows of h = 2048 bf16, their routing map (16 experts, 1 B) and probabilities
    (bf16), and reduce-scatters the output."""
    result = plan(api, moe_body({"tp": 2, "ep": 8, "dp": 8, "sequence_parallel": True, "ep_dispatch": "allgather"}))
    rows = 16 * 2048
    ag = calls(result, "ep.allgather")
    assert ag["ep.allgather.hidden"]["message_bytes"] == rows * 2048 * 2
    assert ag["ep.allgather.combine"]["op"] == "reducescatter"
    assert ag["ep.allgather.routing_map"]["message_bytes"] == rows * 16
    assert ag["ep.allgather.probs"]["message_bytes"] == rows * 16 * 2
    assert ag["ep.allgather.hidden"]["group_size"] == 16
    assert not calls(result, "ep.dispatch") and not calls(result, "ep.token_counts")


def test_deepep_two_legs_over_http_by_hand(api):
    """EP 16 over 2 nodes of 8: each token's 2 experts fall on 2(1 - 1/2^2) = 1.5 nodes on average (RDMA leg,
    one copy per node) and 8(1 - (7/8)^(2/1.5)) GPUs per node reached (NVLink leg); 4096 tokens, h = 2048 bf16."""
    result = plan(api, moe_body({"ep_dispatch": "deepep"}))
    legs = calls(result, "ep.dispatch")
    nodes = 2 * (1 - 0.5**2)
    gpus = 8 * (1 - (7 / 8) ** (2 / nodes))
    assert legs["ep.dispatch.rdma"]["message_bytes"] == round(4096 * nodes) * 2048 * 2
    assert legs["ep.dispatch.nvlink"]["message_bytes"] == round(4096 * nodes * gpus) * 2048 * 2
    assert legs["ep.dispatch.rdma"]["placement"]["span"] == "inter_node"
    assert legs["ep.dispatch.nvlink"]["placement"]["span"] == "intra_node"
    assert set(calls(result, "ep.combine")) == {"ep.combine.rdma", "ep.combine.nvlink", "ep.combine.bwd.rdma",
                                                "ep.combine.bwd.nvlink"}  # fmt: skip


@pytest.mark.parametrize("capacity_factor", [1.0, None], ids=["drop-and-pad", "dropless"])
def test_moe_overlap_switches_shorten_the_step(api, capacity_factor):
    body = moe_body({"pp": 2, "ep": 8, "dp": 8}, global_batch_size=64)
    body["model"] = MOE | {"moe": MOE["moe"] | {"num_shared_experts": 1, "capacity_factor": capacity_factor}}
    base = plan(api, body)["step"]
    body["options"] = {"overlap": {"moe_shared_expert_overlap": True}}
    shared = plan(api, body)["step"]
    body["options"] = {"overlap": {"overlap_moe_expert_parallel_comm": True}}
    a2a = plan(api, body)["step"]
    assert a2a["exposed_comm_s"] < shared["exposed_comm_s"] < base["exposed_comm_s"]
    hidden = base["exposed_comm_s"] - a2a["exposed_comm_s"]
    if capacity_factor:
        # the same kernels (no count sync: drop-and-pad); the hidden all-to-alls (NCCL grouped p2p: 32 CTAs over 8
        # H100 peers, p2psm) slow the compute beside them by C/(S - C) of the time they hide at most
        # (planner/contention.py): slower, bounded
        assert base["compute_s"] < a2a["compute_s"] <= base["compute_s"] + hidden * 32 / (132 - 32)
    else:
        # dropless: each forward waits for its token counts; the combined 1F1B enqueues the other micro-batch's
        # expert backward between the copy and the wait, so the wait no longer drains the GPU (compute.combined_pair)
        assert a2a["compute_s"] < base["compute_s"]
    body["parallel"]["ep_dispatch"] = "allgather"
    refused(plan(api, body, 422), ["options", "overlap", "overlap_moe_expert_parallel_comm"], "allgather")
