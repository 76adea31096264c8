"""Model presets with their published parameter totals, and import of Hugging Face config.json files."""

from __future__ import annotations

from dataclasses import replace

from ._errors import SpecError, got, shown
from .model import ROPE_SCALINGS, MLASpec, ModelSpec, MoESpec

# Models of one family share their architecture: a family's first model is spelled out, the others are it with
# what their config.json changes (dataclasses.replace).
_LLAMA3_8B = ModelSpec(
    32, 4096, 32, 14336, 128256, 8192, num_kv_heads=8, name="Llama-3 8B", published_params=8.03e9,
    source="meta-llama/Meta-Llama-3-8B config.json; model card: 8.03B",
)  # fmt: skip
_MIXTRAL_8X7B = ModelSpec(
    32, 4096, 32, 14336, 32000, 4096, num_kv_heads=8, name="Mixtral 8x7B", published_params=46.7e9,
    moe=MoESpec(8, 2, 14336),
    source="mistralai/Mixtral-8x7B-v0.1 config.json; Mixtral of Experts (2024): 47B total, 13B active",
)  # fmt: skip
_QWEN3_30B = ModelSpec(
    48, 2048, 32, 6144, 151936, 4096, num_kv_heads=4, head_dim=128, qk_norm=True, name="Qwen3-30B-A3B",
    published_params=30.5e9, moe=MoESpec(128, 8, 768),
    source="Qwen/Qwen3-30B-A3B config.json; model card: 30.5B total, 3.3B active",
)  # fmt: skip
_GPT_OSS_120B = ModelSpec(
    36, 2880, 64, 2880, 201088, 4096, num_kv_heads=8, head_dim=64, linear_bias=True, sliding_window=128,
    full_attention_interval=2, attention_sinks=True, name="gpt-oss-120b", published_params=116.83e9,
    moe=MoESpec(128, 4, 2880), rope_scaling="yarn", glu_clamp=7.0,
    source="openai/gpt-oss-120b config.json; gpt-oss-120b & gpt-oss-20b Model Card (OpenAI, 2025) Table 1: "
    "116.83B total, 5.13B active",
)  # fmt: skip

MODEL_PRESETS: dict[str, ModelSpec] = {
    "llama3-8b": _LLAMA3_8B,
    "llama3-70b": replace(
        _LLAMA3_8B, num_layers=80, hidden_size=8192, num_attention_heads=64, ffn_hidden_size=28672,
        name="Llama-3 70B", published_params=70.6e9,
        source="meta-llama/Meta-Llama-3-70B config.json; model card: 70.6B",
    ),
    "llama3-405b": replace(
        _LLAMA3_8B, num_layers=126, hidden_size=16384, num_attention_heads=128, ffn_hidden_size=53248,
        name="Llama-3.1 405B", published_params=405.9e9,
        source="meta-llama/Llama-3.1-405B config.json; The Llama 3 Herd of Models (2024), Table 3",
    ),
    "mixtral-8x7b": _MIXTRAL_8X7B,
    "mixtral-8x22b": replace(
        _MIXTRAL_8X7B, num_layers=56, hidden_size=6144, num_attention_heads=48, ffn_hidden_size=16384,
        vocab_size=32768, name="Mixtral 8x22B", published_params=141e9, moe=MoESpec(8, 2, 16384),
        source="mistralai/Mixtral-8x22B-v0.1 config.json; Mistral AI: 141B total, 39B active",
    ),
    "deepseek-v3": ModelSpec(
        61, 7168, 128, 18432, 129280, 4096,
        num_kv_heads=128,
        head_dim=128,
        name="DeepSeek-V3",
        published_params=685e9,
        # DeepSeek-V3 §2.1.2: auxiliary-loss-free bias plus a small sequence-wise balance loss
        moe=MoESpec(
            256,
            8,
            2048,
            num_shared_experts=1,
            first_dense_layers=3,
            load_balancing="seq_aux_loss",
            expert_bias=True,
            node_limit=4,
        ),
        mla=MLASpec(q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128),
        mtp_layers=1,  # report §2.2: D = 1 MTP module (config.json num_nextn_predict_layers 1)
        rope_scaling="yarn",  # config.json rope_scaling type "yarn" (MLA's decoupled RoPE: its own kernel path)
        source="deepseek-ai/DeepSeek-V3 config.json; DeepSeek-V3 README_WEIGHTS.md: 685B on the hub = 671B main "
        "model + 14B MTP module; the hub's MTP stores its own copies of the embedding and head, which the MTP "
        "here shares as in training (so total_params is 682.6B; with the two copies 684.5B); report: 37B active",
    ),
    "qwen3-30b-a3b": _QWEN3_30B,
    "qwen3-235b-a22b": replace(
        _QWEN3_30B, num_layers=94, hidden_size=4096, num_attention_heads=64, ffn_hidden_size=12288,
        name="Qwen3-235B-A22B", published_params=235e9, moe=MoESpec(128, 8, 1536),
        source="Qwen/Qwen3-235B-A22B config.json; model card: 235B total, 22B activated",
    ),
    "gpt-oss-120b": _GPT_OSS_120B,
    "gpt-oss-20b": replace(
        _GPT_OSS_120B, num_layers=24, name="gpt-oss-20b", published_params=20.91e9, moe=MoESpec(32, 4, 2880),
        source="openai/gpt-oss-20b config.json; gpt-oss-120b & gpt-oss-20b Model Card (OpenAI, 2025) Table 1: "
        "20.91B total, 3.61B active",
    ),
    "qwen2-57b-a14b": ModelSpec(
        28, 3584, 28, 18944, 151936, 4096,
        num_kv_heads=4,
        qkv_bias=True,
        name="Qwen2-57B-A14B",
        published_params=57.4e9,
        moe=MoESpec(64, 8, 2560, num_shared_experts=1, shared_expert_ffn_hidden_size=20480),
        source="Qwen/Qwen2-57B-A14B config.json; Qwen2 technical report: 57B total, 14B active",
        notes=("the shared-expert gate (hidden x 1 per layer, 0.1M parameters) is not modelled",),
    ),
    "gpt3-175b": ModelSpec(
        96, 12288, 96, 49152, 50257, 2048,
        gated_mlp=False,
        tied_embeddings=True,
        norm="layernorm",
        linear_bias=True,
        learned_position_embeddings=True,
        name="GPT-3 175B",
        published_params=175e9,
        source="Language Models are Few-Shot Learners (2020), Table 2.1: 175.0B",
    ),
}  # fmt: skip

# The dropout each preset trains with, as its published training recipe sets it: (attention, hidden, source). Without
# an entry a model keeps the inferred rule (ModelSpec.dropout_probs). Megatron-Bridge at 5776a6d90b (the 25.11
# performance summary's commit), Megatron-LM at f2e5db402c (the README table's).
_MB = "Megatron-Bridge 5776a6d90b src/megatron/bridge/models/"
_LLAMA_DROPOUT = (0.0, 0.0, _MB + "llama/llama_provider.py l. 48-49 (LlamaModelProvider): attention_dropout 0.0, "
                  "hidden_dropout 0.0")  # fmt: skip
_QWEN3_DROPOUT = (0.0, 0.0, _MB + "qwen/qwen_provider.py l. 377-378 (Qwen3MoEModelProvider): hidden_dropout 0.0, "
                  "attention_dropout 0.0")  # fmt: skip
_OSS_DROPOUT = (0.0, 0.0, _MB + "gpt_oss/gpt_oss_provider.py l. 54-55 (GPTOSSProvider): hidden_dropout 0.0, "
                "attention_dropout 0.0; openai/gpt-oss-120b config.json attention_dropout 0.0")  # fmt: skip
_MIXTRAL_DROPOUT = (0.0, 0.0, "Megatron-LM f2e5db402c examples/mixtral/train_mixtral_8x7b_distributed.sh l. 37-38: "
                    "--attention-dropout 0.0 --hidden-dropout 0.0")  # fmt: skip
PRESET_DROPOUT: dict[str, tuple[float, float, str]] = {
    "llama3-8b": _LLAMA_DROPOUT,
    "llama3-70b": _LLAMA_DROPOUT,
    "llama3-405b": _LLAMA_DROPOUT,
    "mixtral-8x7b": _MIXTRAL_DROPOUT,
    "mixtral-8x22b": _MIXTRAL_DROPOUT,
    "deepseek-v3": (0.0, 0.0, _MB + "deepseek/deepseek_provider.py l. 69-70 (DeepSeekModelProvider): "
                    "attention_dropout 0.0, hidden_dropout 0.0"),
    "qwen3-30b-a3b": _QWEN3_DROPOUT,
    "qwen3-235b-a22b": _QWEN3_DROPOUT,
    "gpt-oss-120b": _OSS_DROPOUT,
    "gpt-oss-20b": _OSS_DROPOUT,
    "qwen2-57b-a14b": (0.0, 0.0, _MB + "qwen/qwen_provider.py l. 58-59 (Qwen2ModelProvider, the Qwen2 family; no "
                       "Qwen2-MoE provider there): hidden_dropout 0.0, attention_dropout 0.0"),
    "gpt3-175b": (0.1, 0.1, "Megatron-LM f2e5db402c megatron/training/arguments.py l. 947-949 defaults "
                  "(--attention-dropout 0.1, --hidden-dropout 0.1), which examples/gpt3/train_gpt3_175b_distributed.sh "
                  "keeps (it sets neither)"),
}  # fmt: skip
MODEL_PRESETS = {
    name: replace(spec, attention_dropout=PRESET_DROPOUT[name][0], hidden_dropout=PRESET_DROPOUT[name][1])
    if name in PRESET_DROPOUT else spec
    for name, spec in MODEL_PRESETS.items()
}  # fmt: skip


def model_preset(name: str) -> ModelSpec:
    if name not in MODEL_PRESETS:
        raise SpecError("model.preset", f"unknown model preset {name!r}; known: {', '.join(MODEL_PRESETS)}")
    return MODEL_PRESETS[name]


# Hugging Face config.json -------------------------------------------------------------------------------

DEFAULT_SEQ_CAP = 8192


# The bounds of a model's integer fields: the HTTP schema (app/schemas/plan.py) takes its limits from this
# table and hf_config is read against it, so a model meets the same rules whether it arrives as fields,
# preset overrides or a config.json. They keep every product the rules form (b·s·h·bytes, parameters x
# bytes) inside int64 and every request cheap, far above any published model (Llama-3.1 405B: 126 layers,
# hidden 16,384, ffn 53,248, vocab 128,256; DeepSeek-V3: 256 experts).
BOUNDS: dict[str, tuple[int, int]] = {
    "num_layers": (1, 2048),
    "hidden_size": (1, 1 << 20),
    "num_attention_heads": (1, 1 << 14),
    "num_kv_heads": (1, 1 << 14),
    "head_dim": (1, 1 << 14),
    "ffn_hidden_size": (1, 1 << 20),
    "vocab_size": (1, 1 << 24),
    "seq_length": (1, 1 << 24),
    "num_experts": (1, 1 << 14),
    "top_k": (1, 1 << 14),
    "expert_ffn_hidden_size": (1, 1 << 20),
    "num_shared_experts": (0, 64),
    "shared_expert_ffn_hidden_size": (1, 1 << 20),
    "first_dense_layers": (0, 2048),
    "layer_freq": (1, 2048),
    "node_limit": (1, 1 << 14),
    "expert_groups": (1, 1 << 14),
    "q_lora_rank": (0, 1 << 16),
    "kv_lora_rank": (1, 1 << 16),
    "qk_nope_head_dim": (1, 4096),
    "qk_rope_head_dim": (0, 4096),
    "v_head_dim": (1, 4096),
    "sliding_window": (1, 1 << 24),
    "full_attention_interval": (1, 2048),
    "mtp_layers": (0, 64),
}
# config.json key -> the ModelSpec / MoESpec / MLASpec field whose bounds apply (transformers' names:
# LlamaConfig, MixtralConfig, Qwen2MoeConfig, Qwen3MoeConfig, DeepseekV3Config, transformers 4.x)
HF_KEYS: dict[str, str] = {
    "num_hidden_layers": "num_layers",
    "hidden_size": "hidden_size",
    "num_attention_heads": "num_attention_heads",
    "num_key_value_heads": "num_kv_heads",
    "head_dim": "head_dim",
    "intermediate_size": "ffn_hidden_size",
    "vocab_size": "vocab_size",
    "max_position_embeddings": "seq_length",
    "num_local_experts": "num_experts",
    "n_routed_experts": "num_experts",
    "num_experts": "num_experts",
    "num_experts_per_tok": "top_k",
    "moe_intermediate_size": "expert_ffn_hidden_size",
    "n_shared_experts": "num_shared_experts",
    "shared_expert_intermediate_size": "shared_expert_ffn_hidden_size",
    "first_k_dense_replace": "first_dense_layers",
    "moe_layer_freq": "layer_freq",
    "decoder_sparse_step": "layer_freq",
    "topk_group": "node_limit",
    "n_group": "expert_groups",  # DeepSeek's expert groups (one per node in node-limited routing)
    "q_lora_rank": "q_lora_rank",
    "kv_lora_rank": "kv_lora_rank",
    "qk_nope_head_dim": "qk_nope_head_dim",
    "qk_rope_head_dim": "qk_rope_head_dim",
    "v_head_dim": "v_head_dim",
    "experts_per_token": "top_k",  # GptOssConfig (beside num_experts_per_tok)
    "sliding_window": "sliding_window",
    # Gemma3TextConfig: layer i is full when (i + 1) % sliding_window_pattern == 0 (configuration_gemma3.py)
    "sliding_window_pattern": "full_attention_interval",
    "attention_chunk_size": "seq_length",  # Llama4TextConfig: chunked attention's chunk, in tokens
    # Qwen2Config: layers from this one on slide (with use_sliding_window); bounded as a layer count from 0
    "max_window_layers": "first_dense_layers",
    "num_nextn_predict_layers": "mtp_layers",  # DeepseekV3Config
}
# keys where 0 has always meant "none" in config.json files (a dense Qwen2 has num_experts 0)
HF_ZERO_IS_NONE = {
    "num_local_experts",
    "n_routed_experts",
    "num_experts",
    "shared_expert_intermediate_size",
    "kv_lora_rank",
    "moe_layer_freq",
    "decoder_sparse_step",
}
HF_TEXT = {"model_type": 64, "_name_or_path": 256, "topk_method": 32}
# What a model_type implies beyond its config keys (transformers configuration_*.py and modeling_*.py). The import
# reads only the families listed: another model_type is a 422 (its keys may mean something the import does not know;
# the model's fields can be given instead); a config.json without one is read as Llama's, with no class defaults.
#   fields:   ModelSpec fields its modeling file fixes whatever config.json says
#   defaults: what its configuration class fills in for EVERY key the import reads when config.json leaves it out
#             (an explicit null stays null), keyed by LlamaConfig's name. Read from huggingface/transformers
#             src/transformers/models/<family>/configuration_<family>.py at commit 008e574391 (the dataclass
#             defaults), except gemma3 (008f5c8c29), gpt_oss (02b8f42b42), phimoe (040e1a7e4b) and gpt2
#             (01ae98ae24; tie_word_embeddings PretrainedConfig's True). Left out where the class's default is
#             the import's own fallback: None num_key_value_heads (= heads), None head_dim (= hidden / heads),
#             tie_word_embeddings / attention_bias False, no experts, n_group 1, no layer list.
#   aliases:  LlamaConfig's key -> the key this family writes it under (a dotted path into a nested block)
#   no_hidden_dropout: its modeling file adds each sublayer's output to the residual as it is (LlamaDecoderLayer
#             and the files built on it; GptOssDecoderLayer) and its class has no key for one: hidden dropout 0
#             unless config.json names one (else inferred from the biases: GPT-OSS's would read 0.1)
#   o_bias:   attention_bias biases o_proj too (modeling_llama.py LlamaAttention, modeling_phimoe.py
#             PhimoeAttention: o_proj = nn.Linear(..., bias=config.attention_bias)); without it, only q/k/v
#             (modeling_glm4_moe.py Glm4MoeAttention: o_proj bias=False). ModelSpec counts q/k/v biases only
#             (qkv_bias): the o_proj bias (hidden per layer) is named in the warnings (_hf_bias_notes)
#   notes:    what the import leaves out, said in the plan's warnings
_GEMMA_NORMS = (
    "Gemma's two extra RMSNorms per layer (post_attention / post_feedforward_layernorm, 2 x hidden parameters) "
    "are not modelled"
)
# LlamaConfig (configuration_llama.py); MistralConfig / MixtralConfig the same but where they say otherwise
_LLAMA = {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
          "num_attention_heads": 32, "max_position_embeddings": 2048}  # fmt: skip
_MISTRAL = _LLAMA | {"intermediate_size": 14336, "num_key_value_heads": 8, "max_position_embeddings": 131072}
# Qwen2Config / Qwen3Config (num_key_value_heads 32, not None); Qwen2MoeConfig / Qwen3MoeConfig override these
_QWEN = {"vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 22016, "num_hidden_layers": 32,
         "num_attention_heads": 32, "num_key_value_heads": 32, "max_position_embeddings": 32768,
         "use_sliding_window": False, "sliding_window": 4096, "max_window_layers": 28}  # fmt: skip
_QWEN_MOE = {"hidden_size": 2048, "num_hidden_layers": 24, "decoder_sparse_step": 1}
# DeepseekV3Config (Kimi K2 ships its config under model_type kimi_k2, architectures DeepseekV3ForCausalLM)
_DEEPSEEK_V3 = {"vocab_size": 129280, "hidden_size": 7168, "intermediate_size": 18432, "num_hidden_layers": 61,
                "num_attention_heads": 128, "num_key_value_heads": 128, "max_position_embeddings": 4096,
                "moe_intermediate_size": 2048, "n_shared_experts": 1, "n_routed_experts": 256, "kv_lora_rank": 512,
                "q_lora_rank": 1536, "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128,
                "n_group": 8, "topk_group": 4, "num_experts_per_tok": 8, "first_k_dense_replace": 3,
                "num_nextn_predict_layers": 1}  # fmt: skip
_GEMMA3_TEXT = {"vocab_size": 262_208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
                "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "max_position_embeddings": 131_072,
                "tie_word_embeddings": True, "sliding_window": 4096, "sliding_window_pattern": 6}  # fmt: skip
_NO_DROP = {"no_hidden_dropout": True}
HF_MODEL_TYPES: dict[str, dict] = {
    "llama": _NO_DROP | {"o_bias": True, "defaults": _LLAMA},
    # MistralConfig: sliding_window 4096 (the v0.1 class; later files write null), every layer
    "mistral": _NO_DROP | {"defaults": _MISTRAL | {"sliding_window": 4096}},
    "mixtral": _NO_DROP | {"defaults": _MISTRAL | {"num_local_experts": 8, "num_experts_per_tok": 2}},
    # modeling_qwen2(_moe).py: q/k/v projections with bias=True, o_proj without; use_sliding_window false by default
    "qwen2": _NO_DROP | {"fields": {"qkv_bias": True}, "defaults": _QWEN},
    "qwen2_moe": _NO_DROP | {
        "fields": {"qkv_bias": True},
        "defaults": _QWEN | _QWEN_MOE | {"intermediate_size": 5632, "num_attention_heads": 16,
                                         "num_key_value_heads": 16, "moe_intermediate_size": 1408,
                                         "shared_expert_intermediate_size": 5632, "num_experts_per_tok": 4,
                                         "num_experts": 60},
        "notes": ("the shared-expert gate (hidden x 1 per layer) is not modelled",),  # Qwen2MoeSparseMoeBlock
    },
    # modeling_qwen3(_moe).py: q_norm, k_norm (Qwen3RMSNorm(head_dim)) in every attention block; Qwen3Config
    # head_dim 128; o_proj bias=False
    "qwen3": _NO_DROP | {"fields": {"qk_norm": True}, "defaults": _QWEN | {"head_dim": 128}},
    "qwen3_moe": _NO_DROP | {
        "fields": {"qk_norm": True},
        "defaults": _QWEN | _QWEN_MOE | {"intermediate_size": 6144, "num_key_value_heads": 4,
                                         "moe_intermediate_size": 768, "num_experts_per_tok": 8, "num_experts": 128},
    },
    # DeepseekV2Config: num_experts_per_tok None (the import's 2), n_group / topk_group None (no group limit)
    "deepseek_v2": _NO_DROP | {
        "defaults": _LLAMA | {"first_k_dense_replace": 0, "kv_lora_rank": 512, "q_lora_rank": 1536,
                              "n_routed_experts": 64, "n_shared_experts": 2, "qk_nope_head_dim": 128,
                              "qk_rope_head_dim": 64, "v_head_dim": 128, "moe_intermediate_size": 1407,
                              "topk_method": "greedy"},
    },
    "deepseek_v3": _NO_DROP | {"defaults": _DEEPSEEK_V3},
    "kimi_k2": _NO_DROP | {"defaults": _DEEPSEEK_V3},
    # modeling_glm4_moe.py: DeepSeek-V3's MoE keys; q/k/v bias from attention_bias (o_proj bias=False), q/k norms
    # from use_qk_norm
    "glm4_moe": _NO_DROP | {
        "defaults": {"vocab_size": 151552, "hidden_size": 4096, "intermediate_size": 10944, "num_hidden_layers": 46,
                     "num_attention_heads": 96, "num_key_value_heads": 8, "max_position_embeddings": 131072,
                     "moe_intermediate_size": 1408, "num_experts_per_tok": 8, "n_shared_experts": 1,
                     "n_routed_experts": 128, "first_k_dense_replace": 1, "num_nextn_predict_layers": 1},
    },
    # modeling_gpt_oss.py: q/k/v/o, router and experts all with biases (attention_bias true in every released
    # config; the router and the experts' gate_up/down biases regardless) and GptOssAttention.sinks; GptOssConfig's
    # layer_types default alternates sliding / full (layer i full when (i + 1) % 2 == 0: pattern 2)
    "gpt_oss": _NO_DROP | {
        "fields": {"linear_bias": True, "attention_sinks": True},
        "defaults": {"num_hidden_layers": 36, "num_local_experts": 128, "vocab_size": 201088, "hidden_size": 2880,
                     "intermediate_size": 2880, "head_dim": 64, "num_attention_heads": 64, "num_key_value_heads": 8,
                     "sliding_window": 128, "sliding_window_pattern": 2, "max_position_embeddings": 131072,
                     "num_experts_per_tok": 4, "swiglu_limit": 7.0, "attention_dropout": 0.0},
    },
    # modeling_phi3.py: fused qkv_proj and gate_up_proj, the parameters of Llama's separate ones, no biases;
    # Phi3Config resid_pdrop 0.0
    "phi3": {
        "defaults": {"vocab_size": 32064, "hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 32,
                     "num_attention_heads": 32, "max_position_embeddings": 4096, "resid_pdrop": 0.0},
    },
    # modeling_phimoe.py: nn.LayerNorm (weight and bias) around attention and the MoE block; PhimoeAttention's
    # o_proj and PhimoeForCausalLM's lm_head (lm_head_bias) biased as the config says
    "phimoe": {
        "fields": {"norm": "layernorm"},
        "o_bias": True,
        "defaults": {"vocab_size": 32064, "hidden_size": 4096, "intermediate_size": 6400, "num_hidden_layers": 32,
                     "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 131072,
                     "num_experts_per_tok": 2, "num_local_experts": 16},
    },
    # configuration_gemma*.py: tie_word_embeddings=True, head_dim 256. modeling_gemma2.py Gemma2DecoderLayer:
    # is_sliding = not bool(layer_idx % 2), every 2nd layer full (Gemma 3's sliding_window_pattern 2; no key in
    # Gemma2Config)
    "gemma": _NO_DROP | {
        "defaults": {"vocab_size": 256000, "hidden_size": 3072, "intermediate_size": 24576, "num_hidden_layers": 28,
                     "num_attention_heads": 16, "num_key_value_heads": 16, "head_dim": 256,
                     "max_position_embeddings": 8192, "tie_word_embeddings": True},
    },
    "gemma2": _NO_DROP | {
        "defaults": {"vocab_size": 256000, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
                     "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
                     "max_position_embeddings": 8192, "tie_word_embeddings": True, "sliding_window": 4096,
                     "sliding_window_pattern": 2},
        "notes": (_GEMMA_NORMS,),
    },
    # Gemma3TextConfig (gemma-3-4b/12b/27b-it's text_configs leave out what equals these: head_dim, heads, vocab,
    # sliding_window_pattern); modeling_gemma3.py Gemma3Attention: q_norm, k_norm (Gemma3RMSNorm(head_dim))
    "gemma3_text": _NO_DROP | {"fields": {"qk_norm": True}, "defaults": _GEMMA3_TEXT, "notes": (_GEMMA_NORMS,)},
    # configuration_llama4.py / modeling_llama4.py: dense layers' MLP is intermediate_size_mlp; each expert and
    # the one shared expert (Llama4TextMoe.shared_expert) intermediate_size; layers step-1, 2*step-1, ... are
    # MoE (moe_layers' default, Qwen's decoder_sparse_step rule); use_qk_norm is Llama4TextL2Norm, no weights
    "llama4_text": _NO_DROP | {
        "fields": {"qk_norm": False},
        "aliases": {
            "intermediate_size": "intermediate_size_mlp",
            "moe_intermediate_size": "intermediate_size",
            "shared_expert_intermediate_size": "intermediate_size",
            "decoder_sparse_step": "interleave_moe_layer_step",
        },
        "defaults": {"vocab_size": 202048, "hidden_size": 5120, "intermediate_size": 16384,
                     "moe_intermediate_size": 8192, "shared_expert_intermediate_size": 8192, "num_hidden_layers": 48,
                     "num_attention_heads": 40, "num_key_value_heads": 8, "head_dim": 128,
                     "max_position_embeddings": 131072, "num_experts_per_tok": 1, "num_local_experts": 16,
                     "decoder_sparse_step": 1, "attention_chunk_size": 8192},
        "notes": ("the NoPE layers (no_rope_layers) change no parameter or traffic; they are read as RoPE layers",),
    },
    # configuration_gpt2.py attribute_map and defaults (vocab 50257, n_positions 1024, n_embd 768, n_layer 12,
    # n_head 12, n_inner None: 4 x n_embd, resid_pdrop 0.1, tie_word_embeddings True); modeling_gpt2.py: Conv1D
    # c_attn / c_proj / c_fc with biases, wpe, LayerNorm, a GELU MLP
    "gpt2": {
        "fields": {"norm": "layernorm", "gated_mlp": False, "linear_bias": True, "learned_position_embeddings": True},
        "defaults": {"vocab_size": 50257, "max_position_embeddings": 1024, "hidden_size": 768,
                     "num_hidden_layers": 12, "num_attention_heads": 12, "tie_word_embeddings": True,
                     "resid_pdrop": 0.1, "attn_pdrop": 0.1},
        "aliases": {
            "num_hidden_layers": "n_layer", "hidden_size": "n_embd", "num_attention_heads": "n_head",
            "max_position_embeddings": "n_positions", "intermediate_size": "n_inner",
        },
    },
    # configuration_dbrx.py attribute_map, DbrxConfig / DbrxAttentionConfig / DbrxFFNConfig defaults (d_model 2048,
    # n_heads 16, n_layers 24, max_seq_len 2048, vocab 32000, resid_pdrop 0.0; kv_n_heads 1, attn_pdrop 0.0;
    # moe_num_experts 4, moe_top_k 1, ffn_hidden_size 3584: an absent or null block is the class's); modeling_dbrx.py:
    # LayerNorm without bias (hidden parameters, as RMSNorm's), every layer an MoE block
    "dbrx": {
        "aliases": {
            "num_hidden_layers": "n_layers", "hidden_size": "d_model", "num_attention_heads": "n_heads",
            "max_position_embeddings": "max_seq_len", "num_key_value_heads": "attn_config.kv_n_heads",
            "attention_dropout": "attn_config.attn_pdrop", "num_local_experts": "ffn_config.moe_num_experts",
            "num_experts_per_tok": "ffn_config.moe_top_k", "moe_intermediate_size": "ffn_config.ffn_hidden_size",
        },
        "defaults": {"hidden_size": 2048, "num_attention_heads": 16, "num_hidden_layers": 24,
                     "max_position_embeddings": 2048, "vocab_size": 32000, "resid_pdrop": 0.0,
                     "num_key_value_heads": 1, "attention_dropout": 0.0, "num_local_experts": 4,
                     "num_experts_per_tok": 1, "moe_intermediate_size": 3584},
    },
}  # fmt: skip
# a multimodal config.json holds its language model under text_config; the model_type that block has when it
# names none (configuration_llama4.py Llama4Config, configuration_gemma3.py Gemma3Config)
HF_TEXT_MODEL_TYPES = {"llama4": "llama4_text", "gemma3": "gemma3_text"}
HF_VISION_NOTE = "the vision encoder (vision_config) is not modelled: only the language model is planned"
# keys that say the architecture is one this planner does not model, first found refused at its key (a value other
# than null / false / 0 / empty): read as a Llama-style decoder they would be a silent wrong answer
HF_UNMODELLED: tuple[tuple[str, str], ...] = (
    ("is_encoder_decoder", "an encoder-decoder model (T5, BART, Whisper) is not modelled: only decoder-only models"),
    ("attn_layer_period", "Mamba (SSM) layers with attention every attn_layer_period-th layer (Jamba) are not "
     "modelled"),
    ("hybrid_override_pattern", "a Mamba / attention layer pattern (Nemotron-H) is not modelled"),
    ("layers_block_type", "a hybrid pattern of Mamba and attention blocks is not modelled"),
    ("state_size", "Mamba (SSM) layers (MambaConfig / Mamba2Config state_size) are not modelled"),
    ("ssm_cfg", "Mamba (SSM) layers (state-spaces ssm_cfg) are not modelled"),
    ("linear_conv_kernel_dim", "Gated DeltaNet linear-attention layers (Qwen3-Next) are not modelled"),
    ("parallel_attn", "attention and MLP side by side off one layernorm (Falcon) is not modelled: the planner's "
     "layers run them in turn"),
    ("use_parallel_residual", "attention and MLP side by side (GPT-NeoX use_parallel_residual) is not modelled"),
    ("image_size", "a vision encoder (image_size, patch_size) has no language model to plan"),
)  # fmt: skip
# config.json keys of the dropout probabilities, first found wins (transformers' configuration_*.py, read by code
# search at 02b8f42b42 for gpt_oss): attention_dropout (LlamaConfig, MistralConfig, MixtralConfig, Qwen2/3(Moe)Config,
# DeepseekV3Config, GptOssConfig, BloomConfig, GPTNeoXConfig, StableLmConfig), attn_pdrop (GPT2Config, GPTJConfig,
# PhiConfig), attention_probs_dropout_prob (BertConfig); hidden_dropout (BloomConfig, GPTNeoXConfig, StableLmConfig,
# PersimmonConfig), resid_pdrop (GPT2Config, GPTJConfig, PhiConfig), hidden_dropout_prob (BertConfig). The
# decoders this import builds (Llama, Mistral, Mixtral, Qwen, DeepSeek, GPT-OSS) name only attention_dropout.
HF_ATTENTION_DROPOUT = ("attention_dropout", "attn_pdrop", "attention_probs_dropout_prob")
HF_HIDDEN_DROPOUT = ("hidden_dropout", "resid_pdrop", "hidden_dropout_prob")
# layer_types entries (transformers configuration_utils.ALLOWED_LAYER_TYPES, the ones that matter here)
HF_FULL, HF_SLIDING = "full_attention", "sliding_attention"


class _HFConfig:
    """Typed, bounded reads of a config.json: an integer key must be a JSON integer (not a boolean, not
    1.0) within its field's bounds, a flag a boolean, a name a short string; null means absent. A family's
    ``traits`` (HF_MODEL_TYPES) say where it writes a key (aliases) and what its class fills in (defaults)."""

    def __init__(self, config, prefix: str = "model.hf_config", traits: dict | None = None):
        if not isinstance(config, dict):
            raise SpecError(prefix, f"must be a JSON object, got {got(config)}")
        self.config, self.prefix = config, prefix
        self.aliases, self.defaults = (traits or {}).get("aliases", {}), (traits or {}).get("defaults", {})
        self.filled: dict[str, object] = {}  # the keys read as the class's defaults (where written: value)

    def _where(self, key: str) -> str:
        return f"{self.prefix}.{self.aliases.get(key, key)}"

    def get(self, key: str, fill: bool = True):
        """``key`` where this family writes it; the family's default (``fill``) when config.json leaves it out."""
        node, parts = self.config, self.aliases.get(key, key).split(".")
        for i, part in enumerate(parts):
            # an absent key, or a null block above it (DbrxConfig: attn_config None is DbrxAttentionConfig()),
            # is the class's default; an explicit null at the key itself stays null
            if part not in node or (node[part] is None and i < len(parts) - 1):
                if not fill or self.defaults.get(key) is None:
                    return None
                self.filled[self.aliases.get(key, key)] = self.defaults[key]
                return self.defaults[key]
            node = node[part]
            if i < len(parts) - 1 and not isinstance(node, dict):
                raise SpecError(f"{self.prefix}.{'.'.join(parts[: i + 1])}", f"must be an object, got {got(node)}")
        return node

    def int(self, key: str, default=None):
        value = self.get(key)
        if value is None:
            return default
        if type(value) is not int:
            written = " written as a float" if isinstance(value, float) else ""  # 1e16 reads 10000000000000000
            raise SpecError(self._where(key), f"must be an integer, got {got(value)}{written}")
        if value == 0 and key in HF_ZERO_IS_NONE:
            return default
        lo, hi = BOUNDS[HF_KEYS[key]]
        if not lo <= value <= hi:
            shown = f"{value}" if abs(value) < 10**20 else f"an integer of {len(str(abs(value)))} digits"
            raise SpecError(
                self._where(key), f"must be in [{lo}, {hi}] like the model block's {HF_KEYS[key]}, got {shown}"
            )
        return value

    def required(self, key: str) -> int:
        value = self.int(key)
        if value is None:
            raise SpecError(self._where(key), "required field is missing (or null)")
        return value

    def shape(self, key: str) -> int:
        """A key config.json itself must give: the model's shape (hidden size, layer count) is never a class
        default. A fragment such as {"model_type": "llama"} would otherwise be planned as the configuration class's
        own default model (LlamaConfig(): Llama 2 7B), a model nobody pasted."""
        if self.get(key, fill=False) is None:
            raise SpecError(
                self._where(key),
                "required field is missing (or null): config.json must give the model's shape itself; its "
                "configuration class's default is not read for it",
            )
        return self.required(key)

    def flag(self, key: str, default: bool = False) -> bool:
        value = self.get(key)
        if value is None:
            return default
        if type(value) is not bool:
            raise SpecError(self._where(key), f"must be true or false, got {got(value)}")
        return value

    def number(self, key: str, default=None):
        """A positive JSON number (not a boolean), at most 1e6; null means absent."""
        value = self.get(key)
        if value is None:
            return default
        if type(value) not in (int, float) or not 0 < value <= 1e6:
            raise SpecError(self._where(key), f"must be a number in (0, 1,000,000], got {got(value)}")
        return float(value)

    def probability(self, keys: tuple[str, ...], default=None) -> float | None:
        """The first of ``keys`` present: a JSON number in [0, 1) (a dropout probability), as the model block's
        attention_dropout / hidden_dropout; null or absent: the class's default for one of them, else ``default``.
        A key config.json gives wins over another's class default (GPT-OSS with attn_pdrop, not attention_dropout)."""
        key = next((k for k in keys if self.get(k, fill=False) is not None), None)
        key = key or next((k for k in keys if self.get(k) is not None), None)
        if key is None:
            return default
        value = self.get(key)
        if type(value) not in (int, float) or not 0 <= value < 1:
            raise SpecError(self._where(key), f"a dropout probability must be a number in [0, 1), got {got(value)}")
        return float(value)

    def rope_scaling(self) -> str | None:
        """rope_scaling.rope_type (or its older key ``type``) when it is one of transformers' RoPE types
        (model.ROPE_SCALINGS); another name is ignored as other keys are; not an object: a SpecError."""
        value = self.get("rope_scaling")
        if value is None:
            return None
        if not isinstance(value, dict):
            raise SpecError(self._where("rope_scaling"), f"must be an object or null, got {got(value)}")
        kind = value.get("rope_type", value.get("type"))
        return kind if kind in ROPE_SCALINGS else None

    def text(self, key: str, default: str = "") -> str:
        value = self.get(key)
        if value is None:
            return default
        if not isinstance(value, str) or len(value) > HF_TEXT[key]:
            got_ = f"{len(value):,} characters" if isinstance(value, str) else got(value)
            raise SpecError(self._where(key), f"must be a string of at most {HF_TEXT[key]} characters, got {got_}")
        return value


def _hf_language_model(config) -> tuple[_HFConfig, str, list[str]]:
    """(the language model's config, its model_type, notes): ``text_config`` of a multimodal config.json (Llama 4,
    Gemma 3) or the file itself; an architecture this planner cannot model refused at the key that says so
    (HF_UNMODELLED), then a model_type it does not know; the family's traits attached."""
    hf = _HFConfig(config)
    kind, text = hf.text("model_type").lower(), config.get("text_config")
    notes = [HF_VISION_NOTE] if config.get("vision_config") is not None else []
    if text is not None:
        tie = config.get("tie_word_embeddings")  # the wrapper's key counts where the text block has none
        if isinstance(text, dict) and tie is not None:
            text = {"tie_word_embeddings": tie} | text
        hf = _HFConfig(text, "model.hf_config.text_config")
        kind = hf.text("model_type").lower() or _hf_wrapped_kind(kind)
    for key, why in HF_UNMODELLED:
        value = hf.config.get(key)
        if value not in (None, False, 0, "", [], {}):
            raise SpecError(hf._where(key), f"{why}; got {key} {got(value)}")
    if kind and kind not in HF_MODEL_TYPES:
        raise SpecError(
            hf._where("model_type"),
            f"model_type {shown(kind)[:40]} is not a family this import reads (its keys may mean what the import "
            f"does not know); give the model's fields instead, or one of: {', '.join(HF_MODEL_TYPES)}",
        )
    traits = HF_MODEL_TYPES.get(kind, {})
    return _HFConfig(hf.config, hf.prefix, traits), kind, notes + list(traits.get("notes", ()))


def _hf_wrapped_kind(wrapper: str) -> str:
    """The model_type of a text_config that names none: its wrapper's text model (HF_TEXT_MODEL_TYPES), or the
    wrapper's own where that is a family read here; an unknown wrapper is a 422 (its text block's keys may mean
    what the import does not know), as an unknown model_type at the top is."""
    if not wrapper or wrapper in HF_MODEL_TYPES:
        return wrapper
    if wrapper not in HF_TEXT_MODEL_TYPES:
        raise SpecError(
            "model.hf_config.model_type",
            f"model_type {shown(wrapper)[:40]} is not a multimodal wrapper this import reads and its text_config "
            f"names no model_type; give text_config.model_type (one of: {', '.join(HF_MODEL_TYPES)}), or the "
            f"model's fields instead (known wrappers: {', '.join(HF_TEXT_MODEL_TYPES)})",
        )
    return HF_TEXT_MODEL_TYPES[wrapper]


def _hf_bias_notes(hf: _HFConfig, traits: dict) -> tuple[str, ...]:
    """The biases the import reads but ModelSpec does not count (it has q/k/v biases, qkv_bias, and all-linear
    biases, linear_bias): o_proj's where attention_bias covers it (the family's o_bias trait), PhiMoE's lm_head
    (configuration_phimoe.py lm_head_bias; modeling_phimoe.py PhimoeForCausalLM lm_head bias=config.lm_head_bias)."""
    out = []
    if traits.get("o_bias") and hf.flag("attention_bias") and not traits.get("fields", {}).get("linear_bias"):
        out.append("attention_bias also biases o_proj (hidden parameters per layer); those biases are not counted")
    if hf.flag("lm_head_bias"):
        out.append("lm_head_bias: the output layer's bias (vocab_size parameters) is not counted")
    return tuple(out)


def from_hf_config(config: dict, seq_length: int | None = None, name: str = "") -> ModelSpec:
    """A ModelSpec from a Hugging Face config.json of a family in HF_MODEL_TYPES (Llama 2-4, Mistral, Mixtral,
    Qwen2/2.5/3(-MoE), DeepSeek-V2/V3, Kimi K2, GLM-4.5, GPT-OSS, Phi-3(.5)(-MoE), Gemma 1-3, GPT-2, DBRX), the
    language model of a multimodal one (text_config).

    Every key read is typed and bounded as the model block's field is (BOUNDS); other keys are ignored, as
    a config.json carries many this planner does not use, except those that say the architecture is one it
    cannot model (HF_UNMODELLED: a 422 at that key). ``seq_length`` defaults to max_position_embeddings
    capped at 8192 (long-context models advertise 128K positions that nobody trains every step with).
    """
    hf, kind, notes = _hf_language_model(config)
    traits = HF_MODEL_TYPES.get(kind, {})
    fields = traits.get("fields", {})
    layers, hidden = hf.shape("num_hidden_layers"), hf.shape("hidden_size")
    heads, vocab = hf.required("num_attention_heads"), hf.required("vocab_size")
    seq = seq_length or min(hf.int("max_position_embeddings", 4096), DEFAULT_SEQ_CAP)
    ffn = hf.int("intermediate_size", min(4 * hidden, BOUNDS["ffn_hidden_size"][1]))
    window, interval = _hf_window(hf, layers)
    spec = ModelSpec(
        num_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        ffn_hidden_size=ffn,
        vocab_size=vocab,
        seq_length=seq,
        num_kv_heads=hf.int("num_key_value_heads", heads),
        head_dim=hf.int("head_dim"),
        gated_mlp=fields.get("gated_mlp", True),
        tied_embeddings=hf.flag("tie_word_embeddings"),
        norm=fields.get("norm", "rmsnorm"),
        qkv_bias=(hf.flag("attention_bias") or fields.get("qkv_bias", False)) and not fields.get("linear_bias"),
        linear_bias=fields.get("linear_bias", False),
        qk_norm=fields.get("qk_norm", hf.flag("use_qk_norm")),  # GLM-4.5's key; Qwen3 and Gemma 3 by family
        learned_position_embeddings=fields.get("learned_position_embeddings", False),
        sliding_window=window,
        full_attention_interval=interval,
        attention_sinks=fields.get("attention_sinks", False),
        rope_scaling=hf.rope_scaling(),
        glu_clamp=hf.number("swiglu_limit"),
        mtp_layers=hf.int("num_nextn_predict_layers", 0),
        attention_dropout=hf.probability(HF_ATTENTION_DROPOUT),
        hidden_dropout=hf.probability(HF_HIDDEN_DROPOUT, 0.0 if traits.get("no_hidden_dropout") else None),
        name=name or hf.text("_name_or_path") or kind or "hf-model",
        source="Hugging Face config.json",
        notes=tuple(notes) + _hf_chunked_attention(hf, seq) + _hf_bias_notes(hf, traits),
    )
    moe, mla = _hf_moe(hf, ffn, layers), _hf_mla(hf)
    return replace(spec, moe=moe, mla=mla, notes=spec.notes + _hf_filled_note(hf, kind))


def _hf_filled_note(hf: _HFConfig, kind: str) -> tuple[str, ...]:
    """The keys config.json left out that the import read as the family's configuration class fills them in
    (HF_MODEL_TYPES defaults), said in the warnings: a file that omits what its class defaults is read as
    transformers reads it, and the user sees which values came from there."""
    if not hf.filled:
        return ()
    said = ", ".join(f"{key} {got(value)}" for key, value in sorted(hf.filled.items()))
    return (f"keys left out of config.json read as transformers' {kind} configuration class fills them in: {said}",)


def _hf_chunked_attention(hf: _HFConfig, seq: int) -> tuple[str, ...]:
    """Llama 4's chunked attention (attention_chunk_size: a query sees the keys of its own chunk only, on the RoPE
    layers) is full causal attention while the sequence fits in one chunk; past that it is not modelled."""
    chunk = hf.int("attention_chunk_size")
    if chunk is None:
        return ()
    if seq > chunk:
        raise SpecError(
            hf._where("attention_chunk_size"),
            f"chunked attention (chunks of {chunk:,} tokens) is not modelled past one chunk: seq_length {seq:,} "
            f"> {chunk:,} (give model.seq_length <= {chunk:,})",
        )
    return (f"chunked attention (attention_chunk_size {chunk:,}) is full attention at seq_length {seq:,}; decode "
            f"contexts past {chunk:,} tokens are priced as full attention",)  # fmt: skip


def _hf_window(hf: _HFConfig, layers: int) -> tuple[int | None, int | None]:
    """(sliding_window, full_attention_interval). GPT-OSS and Gemma 3 list ``layer_types``; Gemma 2/3 without them
    say every sliding_window_pattern-th layer is full; Mistral gives a window for every layer; Qwen2/3 carry a
    window that ``use_sliding_window: false`` turns off."""
    types = hf.get("layer_types")
    if hf.get("use_sliding_window") is False:
        return None, None
    window = hf.int("sliding_window")
    if types is None and hf.get("use_sliding_window") is True and window is not None:
        return _hf_max_window_layers(hf, layers, window)
    if types is None:
        pattern = hf.int("sliding_window_pattern")
        if window is None or pattern is None or pattern > layers:
            return window, None
        return (None, None) if pattern == 1 else (window, pattern)
    return _hf_layer_types(hf, layers, types, window)


def _hf_layer_types(hf: _HFConfig, layers: int, types, window: int | None) -> tuple[int | None, int | None]:
    """``layer_types`` (GPT-OSS, Gemma 3): full and sliding layers only, the full ones every k-th."""
    where = hf._where("layer_types")
    if not isinstance(types, list) or len(types) != layers:
        raise SpecError(
            where,
            f"must list num_hidden_layers {layers} entries of {HF_FULL!r} / {HF_SLIDING!r}"
            + (f", got {len(types)}" if isinstance(types, list) else ""),
        )
    stray = next(((i, t) for i, t in enumerate(types) if t not in (HF_FULL, HF_SLIDING)), None)
    if stray is not None:
        raise SpecError(
            where,
            f"layer type {got(stray[1])} (layer {stray[0]}) is not modelled: only {HF_FULL!r} and {HF_SLIDING!r} "
            "layers are",
        )
    full = [i + 1 for i, t in enumerate(types) if t == HF_FULL]
    if len(full) == layers:
        return None, None
    if window is None:
        raise SpecError(
            hf._where("sliding_window"),
            f"layer_types has {layers - len(full)} sliding layers (of {layers}) but sliding_window is missing",
        )
    if not full:
        return window, None
    k = full[0]
    if full != list(range(k, layers + 1, k)):
        raise SpecError(
            where,
            f"full-attention layers {full[:6]} (1-based) are not every {k}th layer: only a periodic pattern "
            "(full_attention_interval) is modelled",
        )
    return window, k


def _hf_max_window_layers(hf: _HFConfig, layers: int, window: int) -> tuple[int | None, int | None]:
    """Qwen2 with use_sliding_window: layers 0 .. max_window_layers - 1 attend fully, the rest slide
    (configuration_qwen2.py layer_types' default); a window on all or none of them is modelled, a split is not."""
    first = hf.int("max_window_layers", 0)
    if first >= layers:
        return None, None
    if first:
        raise SpecError(
            hf._where("max_window_layers"),
            f"use_sliding_window with max_window_layers {first} of num_hidden_layers {layers}: layers 0-{first - 1} "
            "full, the rest sliding; only all-sliding or a periodic pattern (full_attention_interval) is modelled",
        )
    return window, None


def _hf_moe(hf: _HFConfig, ffn: int, layers: int) -> MoESpec | None:
    experts = hf.int("num_local_experts") or hf.int("n_routed_experts") or hf.int("num_experts")
    if not experts:
        return None
    shared_ffn = hf.int("shared_expert_intermediate_size")
    # Qwen2/3-MoE: layer i is MoE when (i + 1) % decoder_sparse_step == 0 (modeling_qwen3_moe.py
    # Qwen3MoeDecoderLayer), i.e. layers k-1, 2k-1, ...; DeepSeek (modeling_deepseek_v3.py DeepseekV3DecoderLayer):
    # i >= first_k_dense_replace and i % moe_layer_freq == 0, i.e. from the first multiple of the freq on
    # (freq 1 in every released config)
    step, freq = hf.int("decoder_sparse_step"), hf.int("moe_layer_freq")
    first = hf.int("first_k_dense_replace", 0)
    first = -(-first // freq) * freq if freq else first
    dense = _hf_dense_layers(hf, layers)  # Llama 4's moe_layers list, where given, wins over its step
    step = None if hf.get("moe_layers") is not None else step
    return MoESpec(
        num_experts=experts,
        top_k=hf.int("num_experts_per_tok") or hf.int("experts_per_token", 2),
        expert_ffn_hidden_size=hf.int("moe_intermediate_size") or ffn,
        num_shared_experts=hf.int("n_shared_experts") or (1 if shared_ffn else 0),
        shared_expert_ffn_hidden_size=shared_ffn,
        first_dense_layers=first + (step - 1 if step else 0),
        layer_freq=freq or step or 1,
        # DeepSeek-V3's "noaux_tc" router: bias-based balancing (Megatron --moe-router-enable-expert-bias)
        expert_bias=hf.text("topk_method") == "noaux_tc",
        # DeepseekV3Config.seq_aux: the sequence-wise balance loss (report §2.1.2 eq. 17-20)
        load_balancing="seq_aux_loss" if hf.flag("seq_aux") else "aux_loss",
        node_limit=hf.int("topk_group") if (hf.int("n_group") or 1) > 1 else None,  # group-limited routing
        mlp_only_layers=tuple(sorted(set(_hf_layer_list(hf, "mlp_only_layers", layers) + dense))),
    )


def _hf_dense_layers(hf: _HFConfig, layers: int) -> tuple[int, ...]:
    """Llama4TextConfig.moe_layers, where given, lists the MoE layers whatever interleave_moe_layer_step says: the
    others keep their dense MLP (modeling_llama4.py Llama4TextDecoderLayer: is_moe_layer = layer_idx in moe_layers)."""
    if hf.get("moe_layers") is None:
        return ()
    moe = set(_hf_layer_list(hf, "moe_layers", layers))
    return tuple(i for i in range(layers) if i not in moe)


def _hf_layer_list(hf: _HFConfig, key: str, layers: int) -> tuple[int, ...]:
    value = hf.get(key)
    if value is None:
        return ()
    if (
        not isinstance(value, list)
        or len(value) > layers
        or any(type(i) is not int or not 0 <= i < layers for i in value)
    ):
        said = f"{len(value)} entries" if isinstance(value, list) and len(value) > layers else shown(value)[:60]
        raise SpecError(hf._where(key), f"must be a list of layer indices in [0, {layers}), got {said}")
    return tuple(sorted(set(value)))


def _hf_mla(hf: _HFConfig) -> MLASpec | None:
    kv_lora = hf.int("kv_lora_rank")
    if not kv_lora:
        return None
    return MLASpec(
        hf.int("q_lora_rank") or 0,  # null in DeepSeek-V2-Lite: no query compression
        kv_lora,
        hf.int("qk_nope_head_dim", 128),
        hf.int("qk_rope_head_dim", 64),
        hf.int("v_head_dim", 128),
    )


# Workload and parallel presets: partial specs a request can start from and override.
WORKLOAD_PRESETS: dict[str, dict] = {
    "pretrain": {"kind": "training", "micro_batch_size": 1, "global_batch_size": 1024},
    "pretrain-recompute": {
        "kind": "training",
        "micro_batch_size": 1,
        "global_batch_size": 1024,
        "activation_recompute": "full",
    },
    "prefill": {"kind": "inference", "phase": "prefill", "batch_size": 8},
    "decode": {"kind": "inference", "phase": "decode", "batch_size": 64},
}

PARALLEL_PRESETS: dict[str, dict] = {
    "megatron-tp8-pp4-zero1": {"tp": 8, "pp": 4, "zero_stage": 1, "sequence_parallel": True},
    "megatron-tp8-zero1": {"tp": 8, "zero_stage": 1, "sequence_parallel": True},
    "fsdp": {"framework": "torch", "zero_stage": 3},
    "ddp": {"framework": "torch", "zero_stage": 0},
    "moe-ep8": {"ep": 8, "zero_stage": 1},
}
