"""Model presets against published parameter totals, and Hugging Face config.json import."""

import pytest

from planner import MODEL_PRESETS, SpecError, from_hf_config, model_preset


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
    # DeepSeek-V3: 37B active per token
    assert model_preset("deepseek-v3").active_params() == pytest.approx(37e9, rel=0.02)


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
