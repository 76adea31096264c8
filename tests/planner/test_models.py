"""Model presets against published parameter totals, and Hugging Face config.json import."""

import json
from dataclasses import replace
from pathlib import Path

import pytest

from planner import MODEL_PRESETS, SpecError, from_hf_config, model_preset
from planner.context import Context
from planner.model import ModelSpec, MoESpec, validate_model
from planner.parallel import ParallelSpec
from planner.params import stage_params, total
from planner.workload import WorkloadSpec

HF_DIR = Path(__file__).parents[1] / "reference" / "hf_configs"


@pytest.mark.parametrize("name", sorted(MODEL_PRESETS))
def test_preset_matches_published_total(name):
    model = MODEL_PRESETS[name]
    assert model.total_params() == pytest.approx(model.published_params, rel=0.01), model.source


def test_exact_counts_we_can_recompute_by_hand():
    # Llama-3 8B: 8,030,261,248 parameters (Hugging Face safetensors index)
    assert model_preset("llama3-8b").total_params() == 8_030_261_248
    # Mixtral 8x7B: 46.7B total, 12.9B active (two of eight experts)
    mixtral = model_preset("mixtral-8x7b")
    assert mixtral.active_params() == pytest.approx(12.9e9, rel=0.01)
    # DeepSeek-V3: 37B active per token in the main model (the MTP module is not in the report's 37B)
    assert replace(model_preset("deepseek-v3"), mtp_layers=0).active_params() == pytest.approx(37e9, rel=0.02)


HF_CONFIGS = {
    "llama3-8b": {
        "model_type": "llama",
        "num_hidden_layers": 32,
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "intermediate_size": 14336,
        "vocab_size": 128256,
        "max_position_embeddings": 8192,
        "tie_word_embeddings": False,
        "rms_norm_eps": 1e-5,
    },
    "mixtral-8x7b": {
        "model_type": "mixtral",
        "num_hidden_layers": 32,
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "intermediate_size": 14336,
        "vocab_size": 32000,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
        "max_position_embeddings": 32768,
        "tie_word_embeddings": False,
    },
    "deepseek-v3": {
        "model_type": "deepseek_v3",
        "num_hidden_layers": 61,
        "hidden_size": 7168,
        "num_attention_heads": 128,
        "num_key_value_heads": 128,
        "intermediate_size": 18432,
        "moe_intermediate_size": 2048,
        "vocab_size": 129280,
        "n_routed_experts": 256,
        "n_shared_experts": 1,
        "num_experts_per_tok": 8,
        "first_k_dense_replace": 3,
        "moe_layer_freq": 1,
        "q_lora_rank": 1536,
        "kv_lora_rank": 512,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
        "num_nextn_predict_layers": 1,
        "max_position_embeddings": 163840,
        "tie_word_embeddings": False,
    },
    "qwen3-30b-a3b": {
        "model_type": "qwen3_moe",
        "num_hidden_layers": 48,
        "hidden_size": 2048,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "intermediate_size": 6144,
        "moe_intermediate_size": 768,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "decoder_sparse_step": 1,
        "vocab_size": 151936,
        "max_position_embeddings": 40960,
        "tie_word_embeddings": False,
    },
    "qwen2-57b-a14b": {
        "model_type": "qwen2_moe",
        "num_hidden_layers": 28,
        "hidden_size": 3584,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "intermediate_size": 18944,
        "moe_intermediate_size": 2560,
        "shared_expert_intermediate_size": 20480,
        "num_experts": 64,
        "num_experts_per_tok": 8,
        "decoder_sparse_step": 1,
        "vocab_size": 151936,
        "max_position_embeddings": 32768,
        "tie_word_embeddings": False,
    },
}


@pytest.mark.parametrize("name", sorted(HF_CONFIGS))
def test_hf_config_import_counts_like_the_preset(name):
    imported = from_hf_config(HF_CONFIGS[name])
    assert imported.total_params() == MODEL_PRESETS[name].total_params()
    assert imported.seq_length <= 8192


def test_hf_config_missing_field_is_named():
    with pytest.raises(SpecError) as caught:
        from_hf_config({"hidden_size": 4096})
    assert caught.value.field == "model.hf_config.num_hidden_layers"


def test_vocab_padding_like_megatron():
    llama = model_preset("llama3-8b")
    assert llama.padded_vocab(1) == 128256  # already a multiple of 128
    assert llama.padded_vocab(8) == 129024  # next multiple of 1024
    assert model_preset("gpt3-175b").padded_vocab(8) == 51200


# ---- issue 21 item 4: MLA, MTP, sliding windows, sinks, QK-norm; the published configs -----------------


def _hf(name: str) -> dict:
    return json.loads((HF_DIR / f"{name}.json").read_text())


@pytest.mark.parametrize("name", ["deepseek-v3", "gpt-oss-120b", "gpt-oss-20b", "qwen3-30b-a3b", "qwen3-235b-a22b"])
def test_published_config_json_imports_as_the_preset(name):
    """The config.json of the hub (tests/reference/hf_configs) gives the preset field for field."""
    imported, preset = from_hf_config(_hf(name)), MODEL_PRESETS[name]
    same = {f: getattr(preset, f) for f in ("name", "source", "published_params", "seq_length", "notes", "head_dim")}
    assert replace(imported, **same) == preset
    assert imported.total_params() == pytest.approx(preset.published_params, rel=0.004), preset.source


def test_deepseek_v3_with_mtp_against_both_published_totals():
    """README_WEIGHTS.md: 685B = 671B main + 14B MTP; the hub's MTP stores its own embedding and head."""
    v3 = model_preset("deepseek-v3")
    assert v3.mtp_layers == 1 and _hf("deepseek-v3")["num_nextn_predict_layers"] == 1
    main = v3.total_params() - v3.mtp_params()
    assert main == replace(v3, mtp_layers=0).total_params()
    assert main == pytest.approx(671e9, rel=0.0001)  # 671.03B: error +0.004%
    copies = 2 * v3.vocab_size * v3.hidden_size  # the MTP's embed_tokens and shared_head.head on the hub
    assert v3.total_params() + copies == pytest.approx(685e9, rel=0.001)  # 684.49B: error -0.07%
    # one MTP module by hand: enorm, hnorm, final norm (3 x 7168) + eh_proj (2 x 7168 x 7168) + one MoE layer
    assert v3.mtp_module_params() == 3 * 7168 + 2 * 7168 * 7168
    assert v3.mtp_params() == v3.mtp_module_params() + v3.layer_params(61)
    assert v3.is_moe_layer(61) and v3.num_moe_layers == 59  # 58 main MoE layers + the MTP block


def test_gpt_oss_120b_by_hand():
    """modeling_gpt_oss.py, every module with its bias; the model card's 116.83B total, 5.13B active
    (which counts the unembedding, not the embedding)."""
    h, e, i, v = 2880, 128, 2880, 201088
    attn = (h * 4096 + 4096) + 2 * (h * 512 + 512) + (4096 * h + h) + 64  # q, k, v, o with biases, 64 sinks
    experts = e * (h * 2 * i + 2 * i + i * h + h)  # gate_up_proj (+bias), down_proj (+bias)
    layer = attn + 2 * h + (h * e + e) + experts  # 2 RMSNorms, router with bias
    m = model_preset("gpt-oss-120b")
    assert m.layer_params(0) == layer
    assert m.total_params() == 36 * layer + 2 * v * h + h == 116_829_156_672
    assert m.active_params() - v * h == pytest.approx(5.13e9, rel=0.001)
    assert model_preset("gpt-oss-20b").active_params() - v * h == pytest.approx(3.61e9, rel=0.001)


def test_qwen3_moe_presets_active_totals():
    """Model cards: Qwen3-30B-A3B 3.3B activated, Qwen3-235B-A22B 22B activated; QK-norm 2 x 128 per layer."""
    assert model_preset("qwen3-30b-a3b").active_params() == pytest.approx(3.3e9, rel=0.02)
    assert model_preset("qwen3-235b-a22b").active_params() == pytest.approx(22e9, rel=0.01)
    qwen = model_preset("qwen3-235b-a22b")
    assert qwen.attention_params() - replace(qwen, qk_norm=False).attention_params() == 2 * 128


def test_sliding_window_layers_follow_layer_types():
    m = model_preset("gpt-oss-120b")
    types = _hf("gpt-oss-120b")["layer_types"]
    assert [m.attention_window(i) is None for i in range(36)] == [t == "full_attention" for t in types]
    assert m.attended_keys(0, 8192) == 128 and m.attended_keys(1, 8192) == 8192 and m.attended_keys(0, 100) == 100
    # Mistral-style: one window for every layer; Qwen3's use_sliding_window false turns it off
    assert from_hf_config(HF_CONFIGS["llama3-8b"] | {"sliding_window": 4096}).attention_window(7) == 4096
    assert from_hf_config(_hf("qwen3-30b-a3b") | {"sliding_window": 4096}).sliding_window is None


def test_hf_layer_types_that_are_not_periodic_are_named():
    config = _hf("gpt-oss-20b")
    config["layer_types"] = ["full_attention"] + ["sliding_attention"] * 23
    with pytest.raises(SpecError) as caught:
        from_hf_config(config)
    assert caught.value.field == "model.hf_config.layer_types" and "[1]" in str(caught.value)
    config["layer_types"] = ["sliding_attention"] * 3
    with pytest.raises(SpecError) as caught:
        from_hf_config(config)
    assert "24" in str(caught.value) and "got 3" in str(caught.value)


def test_qwen_decoder_sparse_step_and_mlp_only_layers():
    """modeling_qwen3_moe.py: layer i is MoE when i not in mlp_only_layers and (i + 1) % step == 0."""
    config = _hf("qwen3-30b-a3b") | {"decoder_sparse_step": 2, "mlp_only_layers": [5, 0]}
    m = from_hf_config(config)
    expected = [i not in (0, 5) and (i + 1) % 2 == 0 for i in range(48)]
    assert [m.is_moe_layer(i) for i in range(48)] == expected
    with pytest.raises(SpecError) as caught:
        from_hf_config(_hf("qwen3-30b-a3b") | {"mlp_only_layers": [48]})
    assert caught.value.field == "model.hf_config.mlp_only_layers"


def test_mla_projections_under_tp_by_hand():
    """Megatron-Core MLA at tp 8 (gpt_layer_specs.py): q_down h x 1536 and kv_down h x 576 are replicated
    (TELinear "duplicated"), as are the latent norms 1536 and 512; q_up, kv_up and linear_proj are split."""
    v3 = model_preset("deepseek-v3")
    ctx = Context(v3, WorkloadSpec(), ParallelSpec(tp=8, ep=8))
    dense, _ = stage_params(ctx, 0)
    by_name = {p.name: p.numel for p in dense}
    h, heads = 7168, 128
    assert by_name["layer.0.q_down"] == h * 1536
    assert by_name["layer.0.q_norm"] == 1536
    assert by_name["layer.0.q_up"] == 1536 * heads * 192 // 8
    assert by_name["layer.0.kv_down"] == h * (512 + 64)
    assert by_name["layer.0.kv_norm"] == 512
    assert by_name["layer.0.kv_up"] == 512 * heads * (128 + 128) // 8
    assert by_name["layer.0.proj"] == heads * 128 * h // 8
    mla = sum(by_name[f"layer.0.{n}"] for n in ("q_down", "q_norm", "q_up", "kv_down", "kv_norm", "kv_up", "proj"))
    assert mla == 11_010_048 + 1536 + 4_718_592 + 4_128_768 + 512 + 2_097_152 + 14_680_064 == 36_636_672
    # under sequence parallelism the replicated weights' gradients are all-reduced over TP once per
    # iteration (finalize_model_grads.py): per layer 2 RMSNorms, both down-projections and the latent norms
    from planner.rules.tensor import norm_params

    sp = Context(v3, WorkloadSpec(), ParallelSpec(tp=8, pp=61, ep=8, sequence_parallel=True))
    per_layer = 2 * h + h * 1536 + 1536 + h * 576 + 512
    assert norm_params(sp, 0) == per_layer  # stage 0: layer 0 only (dense, no router)
    assert norm_params(sp, 60) == 2 * per_layer + 2 * h * 256 + (1 + 3) * h  # layer 60 + MTP, routers, 4 norms
    # tp 1 holds the whole block, MTP block included on the (only) stage
    whole = Context(v3, WorkloadSpec(), ParallelSpec())
    dense1, expert1 = stage_params(whole, 0)
    assert total(dense1) + total(expert1) == v3.total_params()
    # the latent KV a decode step caches per token and layer, and the absorbed head dims (FlashMLA 576 / 512)
    assert v3.mla.latent_kv_dim == 576 and v3.mla.absorbed() == (576, 512)


def test_mtp_block_sits_on_the_last_stage_with_its_embedding_copy():
    v3 = model_preset("deepseek-v3")
    ctx = Context(v3, WorkloadSpec(), ParallelSpec(pp=2, first_stage_layers=31))
    assert ctx.stage_layers[0] == list(range(31)) and ctx.stage_layers[1] == list(range(31, 62))
    last = {p.name: p.numel for p in stage_params(ctx, 1)[0]}
    assert last["mtp.embedding.word"] == 129280 * 7168 and last["mtp.0.eh_proj"] == 2 * 7168 * 7168
    assert "layer.61.kv_down" in last
    first, last_all = (sum(map(total, stage_params(ctx, s))) for s in (0, 1))
    assert first + last_all == v3.total_params() + 129280 * 7168  # the last stage's copy of the embedding
    # ... whose gradient is all-reduced with the first stage's (finalize_model_grads.py, mtp_num_layers)
    from planner.rules import pipeline

    [sync] = [c for c in pipeline.calls(ctx) if c.name == "embedding.tied_grads"]
    assert sync.message_bytes == 129280 * 7168 * 4 and sync.stages == (0, 1)
    assert not [c for c in pipeline.calls(Context(replace(v3, mtp_layers=0), WorkloadSpec(), ctx.par))
                if c.name == "embedding.tied_grads"]  # fmt: skip


def test_sinks_split_with_the_heads():
    ctx = Context(model_preset("gpt-oss-20b"), WorkloadSpec(), ParallelSpec(tp=4))
    by_name = {p.name: p.numel for p in stage_params(ctx, 0)[0]}
    assert by_name["layer.3.sinks"] == 64 // 4
    assert by_name["layer.3.router"] == 2880 * 32 + 32


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"sliding_window": 0}, "model.sliding_window"),
        ({"full_attention_interval": 2}, "model.full_attention_interval"),
        ({"sliding_window": 128, "full_attention_interval": 33}, "model.full_attention_interval"),
        ({"mtp_layers": -1}, "model.mtp_layers"),
        ({"moe": MoESpec(8, 2, 64, mlp_only_layers=(32,))}, "model.moe.mlp_only_layers"),
    ],
)
def test_bad_model_fields_are_named(change, field):
    with pytest.raises(SpecError) as caught:
        validate_model(replace(ModelSpec(32, 4096, 32, 14336, 32000, 4096), **change))
    assert caught.value.field == field


def test_deepep_two_legs_by_hand_in_process():
    """The HTTP test's numbers (tests/app/test_models_http.py, waiting on the cost guard) through build_plan:
    EP 16 over 2 nodes of 8, top 2 of 16 experts, 4096 tokens of h = 2048 bf16 per rank."""
    from collectives.topology import cluster_preset
    from planner.plan import build_plan

    model = ModelSpec(4, 2048, 16, 8192, 32000, 4096, moe=MoESpec(16, 2, 1024))
    par = ParallelSpec(ep=16, dp=16, ep_dispatch="deepep")
    result = build_plan(model, WorkloadSpec(global_batch_size=16), par, cluster_preset("dgx-h100", 2))
    legs = {pc.call.name: pc for pc in result.calls if pc.call.name.startswith("ep.dispatch.")}
    nodes = 2 * (1 - 0.5**2)
    gpus = 8 * (1 - (7 / 8) ** (2 / nodes))
    assert legs["ep.dispatch.rdma"].call.message_bytes == round(4096 * nodes) * 2048 * 2
    assert legs["ep.dispatch.nvlink"].call.message_bytes == round(4096 * nodes * gpus) * 2048 * 2
    assert legs["ep.dispatch.rdma"].price.span == "inter_node" and legs["ep.dispatch.nvlink"].price.span == "intra_node"


def test_decode_kv_cache_keeps_the_window_on_sliding_layers():
    """gpt-oss-20b decoding at 8192 tokens: 12 full layers keep 8192 keys, 12 sliding ones 128."""
    from planner.compute import kv_cache_bytes_per_layer
    from planner.memory import kv_cache_bytes

    work = WorkloadSpec(kind="inference", phase="decode", batch_size=8, context_length=8192)
    ctx = Context(model_preset("gpt-oss-20b"), work, ParallelSpec(dp=1))
    per_layer = kv_cache_bytes_per_layer(ctx)
    assert per_layer == 2 * 8 * 8192 * 8 * 64 * 2
    assert kv_cache_bytes(ctx, 0) == 12 * per_layer + 12 * per_layer * 128 // 8192
    full = Context(replace(model_preset("gpt-oss-20b"), sliding_window=None, full_attention_interval=None), work,
                   ParallelSpec(dp=1))  # fmt: skip
    assert kv_cache_bytes(full, 0) == 24 * per_layer


def test_recipes_describe_their_dtypes_scales_and_support():
    from planner.recipes import RECIPES

    assert {r.gemm_dtype for r in RECIPES.values()} == {"fp8", "fp4"}
    assert RECIPES["blockwise"].weight_scales(7168 * 2048) == 56 * 16  # DeepSeek-V3 expert up: 56 x 16 blocks
    assert RECIPES["mxfp8"].master_cast_amaxes(4096 * 4096) == 2 * 4096 * 4096 // 32
    assert RECIPES["nvfp4"].master_cast_amaxes(4096 * 4096) == 4096 * 4096 // 256 + 1
    assert RECIPES["delayed"].cast_bytes_per_element == 4  # TE cast_transpose: read 2, write 1 + 1
    assert RECIPES["tensorwise"].cast_bytes_per_element == 6  # plus the amax pass
    assert RECIPES["nvfp4"].weight_copy_bytes(4096 * 4096) == 4096 * 4096 + 2 * 4096 * 4096 // 256
    assert {n: r.min_sm for n, r in RECIPES.items()} == {
        "delayed": 89,
        "tensorwise": 89,
        "blockwise": 90,
        "mxfp8": 100,
        "nvfp4": 100,
        "rowwise": 89,
    }  # torchao rowwise: torch._scaled_mm needs sm 8.9


def test_delayed_amax_per_chunk_follows_the_chunk_layers():
    """DeepSeek-V3's first 3 dense layers make the first chunk's GEMM count differ: MLA's 5 linears + 2 (dense)
    or + 2 x 256/ep + 2 (shared) per MoE layer; interleaved v = 2 gives each chunk its own reduction size."""
    from planner.rules import fp8

    v3 = replace(model_preset("deepseek-v3"), num_layers=16, mtp_layers=0)
    par = ParallelSpec(pp=2, dp=8, ep=8, virtual_pipeline_stages=2, pipeline_schedule="interleaved")
    ctx = Context(v3, WorkloadSpec(global_batch_size=64, fp8_recipe="delayed"), par)
    moe, dense = 5 + 2 * 32 + 2, 5 + 2
    assert fp8.chunk_gemms(ctx, 0) == (3 * dense + moe, 4 * moe)  # layers 0-3 and 8-11
    rows = {(c.message_bytes, c.calls_per_iteration) for c in fp8.calls(ctx) if c.name == "fp8.amax" and 0 in c.stages}
    assert rows == {(3 * (3 * dense + moe) * 4, 8), (3 * 4 * moe * 4, 8)}  # 64 / (1 x dp 8) micro-batches


def test_mtp_adds_its_embedding_and_head_tp_calls_on_the_last_stage():
    """Megatron MTP: the shifted tokens through the shared (vocab-parallel) embedding, the output through the
    shared head and the vocab-parallel cross-entropy: 3 fp32 all-reduces of b·s values more per module."""
    from planner.rules import tensor

    v3 = replace(model_preset("deepseek-v3"), num_layers=4, mtp_layers=1, moe=None)
    par = ParallelSpec(tp=2, pp=2, dp=4, sequence_parallel=True)
    ctx = Context(v3, WorkloadSpec(global_batch_size=16), par)
    rows = {c.name: c for c in tensor.calls(ctx)}
    ce, mtp_ce = rows["tp.cross_entropy"], rows["tp.mtp.cross_entropy"]
    assert mtp_ce.message_bytes == ce.message_bytes == 4096 * 4 and mtp_ce.stages == (1,)
    assert mtp_ce.calls_per_iteration == ce.calls_per_iteration == 3 * 4  # 4 micro-batches
    assert rows["tp.mtp.embedding"].stages == (1,) and rows["tp.embedding"].stages == (0,)
    assert {n for n in rows if n.startswith("tp.mtp.")} == {
        "tp.mtp.embedding", "tp.mtp.embedding.dgrad", "tp.mtp.lm_head.input", "tp.mtp.lm_head.dgrad",
        "tp.mtp.lm_head.wgrad_gather", "tp.mtp.cross_entropy", "tp.mtp.eh_proj", "tp.mtp.eh_proj.gather",
        "tp.mtp.eh_proj.scatter.dgrad", "tp.mtp.eh_proj.dgrad", "tp.mtp.eh_proj.wgrad_gather",
    }  # fmt: skip


def test_mtp_sits_on_the_rank_its_layout_names():
    """``m`` in the layout puts the MTP module where Megatron-LM d98e8a6 builds it (mtp_on_this_rank: the rank
    whose chunk counts LayerType.mtp), here the last chunk of rank 2, away from the loss on rank 3: that rank
    holds the module's norms, eh_proj, transformer block and a copy of the word embedding (gpt_model.py builds
    the embedding on a pre_process or mtp_process chunk), looks the shifted tokens up there, and sends the main
    and MTP hidden states on concatenated (MultiTokenPredictionBlock.forward torch.cat); the output layer,
    the final norm and the MTP cross-entropy stay with the loss."""
    from planner.rules import pipeline, tensor

    v3 = replace(model_preset("deepseek-v3"), num_layers=6, mtp_layers=1, moe=None)
    par = ParallelSpec(tp=2, pp=4, dp=2, sequence_parallel=True, virtual_pipeline_stages=2,
                       pipeline_schedule="interleaved", pipeline_layout="Et|t|t|t|t|t|m|L")  # fmt: skip
    ctx = Context(v3, WorkloadSpec(global_batch_size=8), par)
    assert [ctx.holds_mtp(s) for s in range(4)] == [False, False, True, False]
    names = [{p.name: p.numel for p in stage_params(ctx, s)[0]} for s in range(4)]
    vocab, h = v3.padded_vocab(2) // 2, 7168
    assert names[2]["mtp.embedding.word"] == vocab * h and names[2]["mtp.0.eh_proj"] == 2 * h * h // 2
    assert names[2]["mtp.0.norms"] == 3 * h and "layer.6.kv_down" in names[2]  # the MTP block, layer 6
    assert {n for n in names[3] if not n.startswith("layer.3.")} == {"final_norm", "output_layer"}  # chunk 7: L
    assert not any(n.startswith("mtp.") for s in (0, 1, 3) for n in names[s])
    rows = {c.name: c for c in tensor.calls(ctx)}
    assert rows["tp.mtp.embedding"].stages == (2,) and rows["tp.embedding"].stages == (0,)
    assert rows["tp.mtp.cross_entropy"].stages == (3,) == rows["tp.cross_entropy"].stages
    a = 1 * 4096 * h * 2 // 2  # b·s·h·x / tp under sequence parallelism
    sends = {(c.name, c.stages): c.message_bytes for c in pipeline.calls(ctx)}
    assert sends["pp.activation.mtp", (2,)] == sends["pp.activation_grad.mtp", (3,)] == 2 * a  # 1 + mtp tensors
    assert sends["pp.activation", (2,)] == a  # rank 2's first chunk (layer 2) sends one tensor
    # eh_proj (column-parallel over [embedding, hidden], then its output gathered over TP and split back to the
    # sequence shard): A = 1 x 4096 x 7168 x 2 = 58,720,256 B; 8 sequences over dp 2 at b 1: 4 micro-batches
    whole = 4096 * h * 2
    eh = {c.name: (c.op.value, c.phase, c.message_bytes, c.calls_per_iteration, c.stages)
          for c in tensor.calls(ctx) if c.name.startswith("tp.mtp.eh_proj")}  # fmt: skip
    m = ctx.micro_batches
    assert m == 4
    assert eh == {
        "tp.mtp.eh_proj": ("allgather", "forward", 2 * whole, m, (2,)),
        "tp.mtp.eh_proj.gather": ("allgather", "forward", whole, m, (2,)),
        "tp.mtp.eh_proj.scatter.dgrad": ("allgather", "backward", whole, m, (2,)),
        "tp.mtp.eh_proj.dgrad": ("reducescatter", "backward", 2 * whole, m, (2,)),
        "tp.mtp.eh_proj.wgrad_gather": ("allgather", "backward", 2 * whole, m, (2,)),
    }
    no_sp = Context(v3, WorkloadSpec(global_batch_size=8), replace(par, sequence_parallel=False))
    assert {c.name: (c.op.value, c.message_bytes) for c in tensor.calls(no_sp) if "eh_proj" in c.name} == {
        "tp.mtp.eh_proj.gather": ("allgather", whole), "tp.mtp.eh_proj.dgrad": ("allreduce", 2 * whole),
    }  # fmt: skip
    # the default layout keeps the module with the loss on the last stage, copy included
    even = replace(par, pipeline_layout=None, virtual_pipeline_stages=None, pipeline_schedule="1f1b",
                   first_stage_layers=3)  # fmt: skip
    plain = Context(v3, WorkloadSpec(global_batch_size=8), even)
    assert [plain.holds_mtp(s) for s in range(4)] == [False, False, False, True]
    assert not any(c.name.endswith(".mtp") for c in pipeline.calls(plain))
    # moving the module moves its parameters: the same total over the ranks, one embedding copy in each
    held = [sum(total(stage_params(c, s)[0]) for s in range(4)) for c in (ctx, plain)]
    assert held[0] == held[1]
