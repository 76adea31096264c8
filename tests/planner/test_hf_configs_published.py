"""Hugging Face config.json files as users paste them (tests/reference/hf_configs, provenance in its README): each
either imports as the model its card publishes (the total within 1% of the published count; layers, heads, KV
heads, head dim, vocabulary, tied embeddings, windows, experts, top-k as the config says) or is refused with a
SpecError naming the key that makes it an architecture the planner does not model."""

import json
from pathlib import Path

import pytest

from planner import SpecError, from_hf_config

HF_DIR = Path(__file__).parents[1] / "reference" / "hf_configs"


def hf(name: str) -> dict:
    return json.loads((HF_DIR / f"{name}.json").read_text())


# Llama 4's vision tower by hand from its vision_config (transformers modeling_llama4.py Llama4VisionModel): the
# unfold patch embedding 3 x 14 x 14 -> 1408 (no bias), class embedding, 577 positions, two LayerNorms, 34 encoder
# layers (q/k/v/o with bias, fc1 1408 -> 5632 and fc2 back with bias, two LayerNorms), the pixel-shuffle adapter
# (5632 -> 4096 -> 4096, no bias) and the projector 4096 -> 5120 (no bias). The cards' totals count it.
_VIT_LAYER = 4 * (1408 * 1408 + 1408) + (1408 * 5632 + 5632) + (5632 * 1408 + 1408) + 2 * 2 * 1408
LLAMA4_VISION = (588 + 1 + 577 + 2 * 2) * 1408 + 34 * _VIT_LAYER + 5632 * 4096 + 4096 * 4096 + 4096 * 5120

# name: {published, counts_vision_encoder, source}: the card's or report's total and where it says so
PUBLISHED = {k: v for k, v in json.loads((HF_DIR / "published.json").read_text()).items() if not k.startswith("_")}

# name: layers, heads, kv heads, head dim, vocab, tied, (window, full every k-th), (experts, top-k, MoE layers)
SHAPES = {
    "llama-2-7b": (32, 32, 32, 128, 32000, False, (None, None), None),
    "llama-3.1-405b": (126, 128, 8, 128, 128256, False, (None, None), None),
    "mistral-7b-v0.1": (32, 32, 8, 128, 32000, False, (4096, None), None),  # every layer slides
    "mistral-nemo-instruct-2407": (40, 32, 8, 128, 131072, False, (None, None), None),  # head_dim 128, not 160
    "qwen2.5-72b-instruct": (80, 64, 8, 128, 152064, False, (None, None), None),  # use_sliding_window false
    "gemma-2-9b": (42, 16, 8, 256, 256000, True, (4096, 2), None),  # head_dim 256, not 3584 / 16
    "gemma-3-1b-it": (26, 4, 1, 256, 262144, True, (512, 6), None),
    "gemma-3-27b-it": (62, 32, 16, 128, 262208, True, (1024, 6), None),  # text_config, Gemma3TextConfig defaults
    "gemma-3-12b-it": (48, 16, 8, 256, 262208, True, (1024, 6), None),  # head_dim 256 by default, not 3840 / 16
    "gemma-3-4b-it": (34, 8, 4, 256, 262208, True, (1024, 6), None),  # heads 8, kv heads 4 by default
    "gpt2": (12, 12, 12, 64, 50257, True, (None, None), None),
    "phi-3.5-mini-instruct": (32, 32, 32, 96, 32064, False, (262144, None), None),
    "mixtral-8x22b-v0.1": (56, 48, 8, 128, 32768, False, (None, None), (8, 2, 56)),
    "qwen1.5-moe-a2.7b": (24, 16, 16, 128, 151936, False, (None, None), (60, 4, 24)),
    "deepseek-v2-lite": (27, 16, 16, 128, 102400, False, (None, None), (64, 6, 26)),  # first_k_dense_replace 1
    "deepseek-v2": (60, 128, 128, 128, 102400, False, (None, None), (160, 6, 59)),
    "kimi-k2-instruct": (61, 64, 64, 112, 163840, False, (None, None), (384, 8, 60)),
    "glm-4.5": (92, 96, 8, 128, 151552, False, (None, None), (160, 8, 90)),  # 89 main MoE layers + the MTP one
    "dbrx-base": (40, 48, 8, 128, 100352, False, (None, None), (16, 4, 40)),
    "phi-3.5-moe-instruct": (32, 32, 8, 128, 32064, False, (131072, None), (16, 2, 32)),
    "llama-4-scout-17b-16e-instruct": (48, 40, 8, 128, 202048, False, (None, None), (16, 1, 48)),
    "llama-4-maverick-17b-128e-instruct": (48, 40, 8, 128, 202048, False, (None, None), (128, 1, 24)),
}  # fmt: skip

# name: (the key refused, words of the rule)
REFUSED = {
    "falcon-7b": ("model.hf_config.parallel_attn", "side by side"),
    "jamba-v0.1": ("model.hf_config.attn_layer_period", "Mamba (SSM) layers"),
    "qwen3-next-80b-a3b-instruct": ("model.hf_config.linear_conv_kernel_dim", "linear-attention layers"),
    "t5-base": ("model.hf_config.is_encoder_decoder", "encoder-decoder"),
    "whisper-large-v3": ("model.hf_config.is_encoder_decoder", "encoder-decoder"),
    "vit-base-patch16-224": ("model.hf_config.image_size", "vision encoder"),
}


def test_every_reference_config_has_an_outcome_here():
    names = {p.stem for p in HF_DIR.glob("*.json")} - {"published"}
    have = set(PUBLISHED) | set(SHAPES) | set(REFUSED) | {"deepseek-v3", "gpt-oss-120b", "gpt-oss-20b"}
    assert names - have <= {"qwen3-30b-a3b", "qwen3-235b-a22b"}  # those four: test_models.py, against presets
    assert set(REFUSED).isdisjoint(PUBLISHED) and len(names) >= 30


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_total_within_one_percent_of_the_published_count(name):
    row = PUBLISHED[name]
    beyond = LLAMA4_VISION if row["counts_vision_encoder"] else 0
    model = from_hf_config(hf(name))
    assert model.total_params() + beyond == pytest.approx(row["published"], rel=0.01), row["source"]


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_shape_as_the_config_says(name):
    layers, heads, kv, head_dim, vocab, tied, window, moe = SHAPES[name]
    m = from_hf_config(hf(name))
    assert (m.num_layers, m.num_attention_heads, m.kv_heads, m.vocab_size, m.tied_embeddings) == (
        layers, heads, kv, vocab, tied,
    )  # fmt: skip
    assert (m.mla.qk_head_dim if m.mla else m.head_size) == (192 if m.mla else head_dim)
    assert (m.sliding_window, m.full_attention_interval) == window
    assert ((m.moe.num_experts, m.moe.top_k, m.num_moe_layers) if m.moe else None) == moe


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_architectures_not_modelled_are_refused_at_their_key(name):
    field, words = REFUSED[name]
    with pytest.raises(SpecError) as caught:
        from_hf_config(hf(name))
    assert caught.value.field == field and words in caught.value.rule, caught.value


def test_gpt2_by_hand():
    """modeling_gpt2.py: wte + wpe, per layer c_attn (768 -> 2304) and c_proj with biases, c_fc (768 -> 3072) and
    its c_proj with biases, ln_1 / ln_2 (weight and bias); ln_f; lm_head tied: 124,439,808."""
    h, v, p = 768, 50257, 1024
    layer = (h * 3 * h + 3 * h) + (h * h + h) + (h * 4 * h + 4 * h) + (4 * h * h + h) + 2 * 2 * h
    m = from_hf_config(hf("gpt2"))
    assert m.total_params() == v * h + p * h + 12 * layer + 2 * h == 124_439_808
    assert (m.norm, m.gated_mlp, m.linear_bias, m.learned_position_embeddings) == ("layernorm", False, True, True)
    assert m.dropout_probs() == (0.1, 0.1)  # attn_pdrop, resid_pdrop


def test_gemma_windows_alternate_as_the_modeling_files_say():
    """modeling_gemma2.py: layer i slides when i is even; Gemma 3: full when (i + 1) % sliding_window_pattern == 0."""
    g2, g3 = from_hf_config(hf("gemma-2-9b")), from_hf_config(hf("gemma-3-1b-it"))
    assert [g2.attention_window(i) for i in range(4)] == [4096, None, 4096, None]
    assert [g3.attention_window(i) is None for i in range(12)] == [(i + 1) % 6 == 0 for i in range(12)]
    # the Gemma 3 1B total misses only the two extra norms per layer Gemma has (2 x 1152 x 26 = 59,904)
    assert 999_885_952 - g3.total_params() == 2 * 1152 * 26
    # the newer config.json form with layer_types reads the same
    types = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(26)]
    assert from_hf_config(hf("gemma-3-1b-it") | {"layer_types": types}) == g3
    assert from_hf_config(hf("gemma-2-9b") | {"tie_word_embeddings": False}).tied_embeddings is False


def test_llama4_text_config_moe_interleave_and_chunks():
    """Scout: every layer MoE (16 experts of 8192 and one shared of 8192); Maverick: layers 1, 3, ... MoE with 128,
    the others dense at intermediate_size_mlp 16384 (configuration_llama4.py moe_layers default)."""
    scout = from_hf_config(hf("llama-4-scout-17b-16e-instruct"))
    mav = from_hf_config(hf("llama-4-maverick-17b-128e-instruct"))
    assert (scout.moe.expert_ffn_hidden_size, scout.moe.shared_ffn, scout.moe.num_shared_experts) == (8192, 8192, 1)
    assert [mav.is_moe_layer(i) for i in range(4)] == [False, True, False, True] and mav.ffn_hidden_size == 16384
    assert not scout.qk_norm  # Llama4TextL2Norm: no weights
    assert any("vision encoder" in n for n in scout.notes) and any("chunked attention" in n for n in scout.notes)
    # one chunk of 8192 is full causal attention; past it chunked attention is not modelled
    with pytest.raises(SpecError) as caught:
        from_hf_config(hf("llama-4-scout-17b-16e-instruct"), seq_length=16384)
    assert caught.value.field == "model.hf_config.text_config.attention_chunk_size" and "16,384" in caught.value.rule
    # active: 17B on both cards (two significant figures): 17.17B and 17.18B
    assert round(scout.active_params(), -9) == round(mav.active_params(), -9) == 17e9


def test_dbrx_nested_keys_and_their_errors():
    m = from_hf_config(hf("dbrx-base"))
    assert (m.hidden_size, m.kv_heads, m.moe.expert_ffn_hidden_size, m.seq_length) == (6144, 8, 10752, 8192)
    with pytest.raises(SpecError) as caught:
        from_hf_config(hf("dbrx-base") | {"attn_config": [8]})
    assert caught.value.field == "model.hf_config.attn_config" and "object" in caught.value.rule
    with pytest.raises(SpecError) as caught:
        from_hf_config(hf("dbrx-base") | {"ffn_config": hf("dbrx-base")["ffn_config"] | {"moe_top_k": 4.0}})
    assert caught.value.field == "model.hf_config.ffn_config.moe_top_k"
    with pytest.raises(SpecError) as caught:
        from_hf_config(hf("dbrx-base") | {"n_layers": None})
    assert caught.value.field == "model.hf_config.n_layers" and "required" in caught.value.rule


def test_kimi_k2_and_glm_45_as_deepseek_v3_kin():
    """Kimi K2's card says 1T total, 32B active (one significant figure): the import gives 1,026.4B and 32.9B.
    GLM-4.5: q/k/v bias (attention_bias) and per-head q/k norms (use_qk_norm), its MTP layer as DeepSeek-V3's."""
    k2 = from_hf_config(hf("kimi-k2-instruct"))
    assert k2.total_params() == 1_026_408_209_408 and round(k2.total_params(), -12) == 1e12
    assert round(k2.active_params(), -9) == 33e9 and k2.mtp_layers == 0 and k2.moe.expert_bias
    glm = from_hf_config(hf("glm-4.5"))
    assert glm.qkv_bias and glm.qk_norm and glm.mtp_layers == 1 and glm.moe.first_dense_layers == 3
    assert glm.attention_params() == 5120 * 96 * 128 * 2 + 2 * 5120 * 8 * 128 + (96 + 16) * 128 + 2 * 128


def test_hybrid_layer_types_and_unknown_families_are_named():
    base = hf("llama-3.1-8b-instruct")
    types = ["linear_attention"] * 3 + ["full_attention"] + ["linear_attention"] * 28
    with pytest.raises(SpecError) as caught:
        from_hf_config(base | {"layer_types": types})
    assert caught.value.field == "model.hf_config.layer_types"
    assert "layer type 'linear_attention' (layer 0) is not modelled" in caught.value.rule
    with pytest.raises(SpecError) as caught:
        from_hf_config(base | {"model_type": "bloom"})
    assert caught.value.field == "model.hf_config.model_type" and "'bloom'" in caught.value.rule
    # a hybrid's key inside a multimodal wrapper is named where it sits
    with pytest.raises(SpecError) as caught:
        from_hf_config({"model_type": "llava", "text_config": base | {"state_size": 16}})
    assert caught.value.field == "model.hf_config.text_config.state_size"
    # a key whose value says "not this" is no refusal: a GPT-NeoX-style false, a null
    assert from_hf_config(base | {"use_parallel_residual": False, "is_encoder_decoder": False}).total_params() == (
        from_hf_config(base).total_params()
    )


def test_deepseek_moe_layer_freq_counts_from_layer_zero():
    """modeling_deepseek_v3.py: layer i is MoE when i >= first_k_dense_replace and i % moe_layer_freq == 0."""
    config = hf("deepseek-v2-lite") | {"first_k_dense_replace": 3, "moe_layer_freq": 2}
    m = from_hf_config(config)
    assert [i for i in range(12) if m.is_moe_layer(i)] == [4, 6, 8, 10]
    assert m.num_moe_layers == len([i for i in range(27) if i >= 3 and i % 2 == 0])


def test_llama4_moe_layers_list_wins_over_the_step():
    """Llama4TextConfig.moe_layers (newer config.json files list it): exactly those layers are MoE."""
    config = hf("llama-4-maverick-17b-128e-instruct")
    listed = config | {"text_config": config["text_config"] | {"moe_layers": list(range(1, 48, 2))}}
    assert from_hf_config(listed).total_params() == from_hf_config(config).total_params()
    odd = config | {"text_config": config["text_config"] | {"moe_layers": [0, 5]}}
    m = from_hf_config(odd)
    assert [i for i in range(48) if m.is_moe_layer(i)] == [0, 5]
    with pytest.raises(SpecError) as caught:
        from_hf_config(config | {"text_config": config["text_config"] | {"moe_layers": [48]}})
    assert caught.value.field == "model.hf_config.text_config.moe_layers"


def test_qwen2_max_window_layers_with_sliding_on():
    """configuration_qwen2.py: with use_sliding_window, layers from max_window_layers on slide."""
    base = hf("qwen2.5-7b-instruct") | {"use_sliding_window": True, "sliding_window": 4096}
    assert from_hf_config(base | {"max_window_layers": 28}).sliding_window is None  # all 28 layers full
    assert from_hf_config(base | {"max_window_layers": 0}).attention_window(0) == 4096  # all slide
    with pytest.raises(SpecError) as caught:
        from_hf_config(base | {"max_window_layers": 21})
    assert caught.value.field == "model.hf_config.max_window_layers" and "layers 0-20 full" in caught.value.rule


def test_other_shapes_users_paste():
    """A pure Mamba (state-spaces/mamba-2.8b-hf's keys), an encoder (BERT: no is_encoder_decoder, an unknown
    model_type) and a multimodal wrapper whose language model is unknown are refused at the key; a config.json
    without model_type is read as Llama's, as before."""
    mamba = {"model_type": "mamba", "hidden_size": 2560, "num_hidden_layers": 64, "state_size": 16,
             "vocab_size": 50280, "expand": 2, "conv_kernel": 4}  # fmt: skip
    bert = {"model_type": "bert", "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
            "intermediate_size": 3072, "vocab_size": 30522}  # fmt: skip
    clip = {"model_type": "clip", "text_config": {"model_type": "clip_text_model", **bert}}
    for config, field in ((mamba, "model.hf_config.state_size"), (bert, "model.hf_config.model_type"),
                          (clip, "model.hf_config.text_config.model_type")):  # fmt: skip
        with pytest.raises(SpecError) as caught:
            from_hf_config(config)
        assert caught.value.field == field, caught.value
    plain = {k: v for k, v in hf("llama-3.1-8b-instruct").items() if k != "model_type"}
    assert from_hf_config(plain).total_params() == 8_030_261_248


@pytest.mark.parametrize(
    ("name", "keras", "hidden", "layers"),
    [("gemma-3-4b-it", 3_880_099_328, 2560, 34), ("gemma-3-12b-it", 11_765_788_416, 3840, 48),
     ("gemma-3-27b-it", 27_009_002_240, 5376, 62)],
)  # fmt: skip
def test_gemma3_text_totals_against_keras_hub_exactly(name, keras, hidden, layers):
    """keras-hub gemma3_presets.py (gemma3_instruct_<size>_text params) counts a 262,144-token vocabulary and Gemma's
    two extra norms per layer; the import counts the hub's 262,208 and leaves the norms out: the difference is
    exactly 64 x hidden - 2 x hidden x layers (review r12a #1: before the defaults, 12B read head_dim 240, -1.2%,
    and 4B was a 422 on its missing num_attention_heads)."""
    m = from_hf_config(hf(name))
    assert m.total_params() - keras == 64 * hidden - 2 * hidden * layers


# review r12a #1: keys the hub files may leave out, filled in as each family's configuration class does
# (configuration_<family>.py at transformers 008e574391): key -> what the import reads it as
CLASS_DEFAULTS = {
    "gemma2": ({"hidden_size": 3584, "num_hidden_layers": 42, "num_attention_heads": 16, "vocab_size": 256000},
               lambda m: (m.head_size, m.kv_heads, m.tied_embeddings, m.full_attention_interval), (256, 4, True, 2)),
    "qwen3": ({"hidden_size": 4096, "num_hidden_layers": 36, "num_attention_heads": 32, "vocab_size": 151936},
              lambda m: (m.head_size, m.kv_heads, m.sliding_window), (128, 32, None)),
    "mistral": ({"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "vocab_size": 32000},
                lambda m: (m.kv_heads, m.ffn_hidden_size, m.sliding_window), (8, 14336, 4096)),
    "gpt_oss": ({"hidden_size": 2880, "num_hidden_layers": 24, "num_local_experts": 32},
                lambda m: (m.head_size, m.kv_heads, m.sliding_window, m.full_attention_interval, m.moe.top_k,
                           m.glu_clamp, m.dropout_probs()), (64, 8, 128, 2, 4, 7.0, (0.0, 0.0))),
}  # fmt: skip


@pytest.mark.parametrize("kind", sorted(CLASS_DEFAULTS))
def test_keys_left_out_read_as_the_configuration_class_fills_them(kind):
    given, read, want = CLASS_DEFAULTS[kind]
    assert read(from_hf_config({"model_type": kind, **given})) == want


def test_llama4_and_dbrx_defaults_where_their_files_are_silent():
    """Llama4TextConfig: intermediate_size_mlp 16384 (dense layers), intermediate_size 8192 (experts and the shared
    one), 16 experts, top-1; DbrxAttentionConfig kv_n_heads 1 (MQA); DbrxFFNConfig 4 experts of 3584, top-1: not a
    dense model and not MHA (review r12a #1)."""
    text = {"hidden_size": 5120, "num_hidden_layers": 4, "interleave_moe_layer_step": 2}
    l4 = from_hf_config({"model_type": "llama4", "text_config": text})
    assert (l4.hidden_size, l4.ffn_hidden_size, l4.moe.expert_ffn_hidden_size, l4.moe.shared_ffn) == (
        5120, 16384, 8192, 8192,
    )  # fmt: skip
    assert (l4.moe.num_experts, l4.moe.top_k, [l4.is_moe_layer(i) for i in range(4)]) == (16, 1, [False, True] * 2)
    dbrx = from_hf_config({"model_type": "dbrx", "d_model": 6144, "n_heads": 48, "n_layers": 40, "vocab_size": 100352})
    assert (dbrx.kv_heads, dbrx.moe.num_experts, dbrx.moe.top_k, dbrx.moe.expert_ffn_hidden_size) == (1, 4, 1, 3584)


def test_a_null_nested_block_is_the_class_default():
    """DbrxConfig: attn_config / ffn_config None is DbrxAttentionConfig() / DbrxFFNConfig(): a null block reads as
    absent (review r12a #7), not a 422; a null key inside a block stays null (the import's own fallback)."""
    base = hf("dbrx-base")
    m = from_hf_config(base | {"ffn_config": None, "attn_config": None})
    assert (m.kv_heads, m.moe.num_experts, m.moe.top_k, m.moe.expert_ffn_hidden_size) == (1, 4, 1, 3584)
    explicit = from_hf_config(base | {"attn_config": base["attn_config"] | {"kv_n_heads": None}})
    assert explicit.kv_heads == 48  # null at the key: num_key_value_heads absent, MHA as LlamaConfig reads None


def test_an_unknown_wrapper_whose_text_names_no_type_is_refused():
    """review r12a #5: {"model_type": "llava_weird", "text_config": <Llama keys, no model_type>} was read as Llama;
    now a 422 at the wrapper's model_type. Known wrappers (gemma3, llama4) and known text families still read."""
    text = {k: v for k, v in hf("llama-3.1-8b-instruct").items() if k != "model_type"}
    with pytest.raises(SpecError) as caught:
        from_hf_config({"model_type": "llava_weird", "text_config": text})
    assert caught.value.field == "model.hf_config.model_type" and "'llava_weird'" in caught.value.rule
    assert "text_config names no model_type" in caught.value.rule
    assert from_hf_config({"model_type": "llama", "text_config": text}).total_params() == 8_030_261_248
    assert from_hf_config({"text_config": text}).total_params() == 8_030_261_248  # no wrapper type: as before
    named = {"model_type": "llava_weird", "text_config": text | {"model_type": "llama"}}
    assert from_hf_config(named).total_params() == 8_030_261_248


def test_hidden_dropout_is_a_family_trait():
    """review r12a #6: no_hidden_dropout sits in each HF_MODEL_TYPES entry (one table); GPT-2's class default
    resid_pdrop 0.1, Phi-3's 0.0; GPT-OSS (biases, so 0.1 would be inferred) reads 0."""
    from planner.presets import HF_MODEL_TYPES

    with_hidden_dropout = {k for k, v in HF_MODEL_TYPES.items() if not v.get("no_hidden_dropout")}
    assert with_hidden_dropout == {"phi3", "phimoe", "gpt2", "dbrx"}
    assert from_hf_config({"model_type": "gpt2", "n_embd": 768, "n_layer": 12}).dropout_probs() == (0.1, 0.1)
    assert from_hf_config({"model_type": "phi3", "hidden_size": 3072, "num_hidden_layers": 32}).hidden_dropout == 0.0
    oss = {k: v for k, v in hf("gpt-oss-20b").items() if k not in ("attention_dropout", "resid_pdrop")}
    assert from_hf_config(oss).dropout_probs() == (0.0, 0.0)


def test_o_proj_and_lm_head_biases_are_named():
    """review r12a #4: LlamaAttention / PhimoeAttention bias o_proj with attention_bias, and PhiMoE's lm_head_bias;
    ModelSpec counts q/k/v biases only, so the import counts those and names the rest (32 x 4096 + 32,064 on
    Phi-3.5-MoE, 4e-6 of its total). Qwen2 / GLM-4.5 keep o_proj unbiased: nothing to name."""
    phimoe = from_hf_config(hf("phi-3.5-moe-instruct"))
    assert phimoe.qkv_bias and any("o_proj" in n for n in phimoe.notes) and any("lm_head" in n for n in phimoe.notes)
    llama = from_hf_config(hf("llama-3.1-8b-instruct") | {"attention_bias": True})
    assert llama.qkv_bias and any("o_proj" in n for n in llama.notes)
    assert not any("o_proj" in n for n in from_hf_config(hf("glm-4.5")).notes)
    assert not any("o_proj" in n for n in from_hf_config(hf("llama-3.1-8b-instruct")).notes)


def test_the_warnings_say_which_keys_came_from_the_class():
    """A file that leaves a key to its class is read as transformers reads it, and the warnings list those keys
    with the values used (so a pasted fragment is not planned silently as the class's model)."""
    g4 = from_hf_config(hf("gemma-3-4b-it"))
    [note] = [n for n in g4.notes if "left out of config.json" in n]
    for said in ("head_dim 256", "num_attention_heads 8", "num_key_value_heads 4", "vocab_size 262208"):
        assert said in note
    assert not any("left out of config.json" in n for n in from_hf_config(hf("llama-3.1-8b-instruct")).notes)
    # the shape itself is never a class default: a fragment is refused where it would be LlamaConfig()'s Llama 2 7B
    for key in ("hidden_size", "num_hidden_layers"):
        with pytest.raises(SpecError) as err:
            from_hf_config({"model_type": "llama"} | {k: 32 for k in ("hidden_size", "num_hidden_layers") if k != key})
        assert err.value.field == f"model.hf_config.{key}" and "class's default is not read" in str(err.value)
    fragment = from_hf_config({"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32})
    assert (fragment.ffn_hidden_size, fragment.vocab_size) == (11008, 32000)  # the rest as LlamaConfig() fills it
    assert "intermediate_size 11008" in fragment.notes[-1] and "max_position_embeddings 2048" in fragment.notes[-1]
