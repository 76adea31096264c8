"""Model presets with their published parameter totals, and import of Hugging Face config.json files."""

from __future__ import annotations

from dataclasses import replace

from ._errors import SpecError
from .model import MLASpec, ModelSpec, MoESpec

MODEL_PRESETS: dict[str, ModelSpec] = {
    "llama3-8b": ModelSpec(
        32,
        4096,
        32,
        14336,
        128256,
        8192,
        num_kv_heads=8,
        name="Llama-3 8B",
        published_params=8.03e9,
        source="meta-llama/Meta-Llama-3-8B config.json; model card: 8.03B",
    ),
    "llama3-70b": ModelSpec(
        80,
        8192,
        64,
        28672,
        128256,
        8192,
        num_kv_heads=8,
        name="Llama-3 70B",
        published_params=70.6e9,
        source="meta-llama/Meta-Llama-3-70B config.json; model card: 70.6B",
    ),
    "llama3-405b": ModelSpec(
        126,
        16384,
        128,
        53248,
        128256,
        8192,
        num_kv_heads=8,
        name="Llama-3.1 405B",
        published_params=405.9e9,
        source="meta-llama/Llama-3.1-405B config.json; The Llama 3 Herd of Models (2024), Table 3",
    ),
    "mixtral-8x7b": ModelSpec(
        32,
        4096,
        32,
        14336,
        32000,
        4096,
        num_kv_heads=8,
        name="Mixtral 8x7B",
        published_params=46.7e9,
        moe=MoESpec(8, 2, 14336),
        source="mistralai/Mixtral-8x7B-v0.1 config.json; Mixtral of Experts (2024): 47B total, 13B active",
    ),
    "mixtral-8x22b": ModelSpec(
        56,
        6144,
        48,
        16384,
        32768,
        4096,
        num_kv_heads=8,
        name="Mixtral 8x22B",
        published_params=141e9,
        moe=MoESpec(8, 2, 16384),
        source="mistralai/Mixtral-8x22B-v0.1 config.json; Mistral AI: 141B total, 39B active",
    ),
    "deepseek-v3": ModelSpec(
        61,
        7168,
        128,
        18432,
        129280,
        4096,
        num_kv_heads=128,
        head_dim=128,
        name="DeepSeek-V3",
        published_params=671e9,
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
        source="deepseek-ai/DeepSeek-V3 config.json; DeepSeek-V3 technical report: 671B total (685B on the hub "
        "includes the 14B multi-token-prediction module, not modelled), 37B active",
    ),
    "qwen3-30b-a3b": ModelSpec(
        48,
        2048,
        32,
        6144,
        151936,
        4096,
        num_kv_heads=4,
        head_dim=128,
        qk_norm=True,
        name="Qwen3-30B-A3B",
        published_params=30.5e9,
        moe=MoESpec(128, 8, 768),
        source="Qwen/Qwen3-30B-A3B config.json; model card: 30.5B total, 3.3B active",
    ),
    "qwen2-57b-a14b": ModelSpec(
        28,
        3584,
        28,
        18944,
        151936,
        4096,
        num_kv_heads=4,
        qkv_bias=True,
        name="Qwen2-57B-A14B",
        published_params=57.4e9,
        moe=MoESpec(64, 8, 2560, num_shared_experts=1, shared_expert_ffn_hidden_size=20480),
        source="Qwen/Qwen2-57B-A14B config.json; Qwen2 technical report: 57B total, 14B active",
        notes=("the shared-expert gate (hidden x 1 per layer, 0.1M parameters) is not modelled",),
    ),
    "gpt3-175b": ModelSpec(
        96,
        12288,
        96,
        49152,
        50257,
        2048,
        gated_mlp=False,
        tied_embeddings=True,
        norm="layernorm",
        linear_bias=True,
        learned_position_embeddings=True,
        name="GPT-3 175B",
        published_params=175e9,
        source="Language Models are Few-Shot Learners (2020), Table 2.1: 175.0B",
    ),
}


def model_preset(name: str) -> ModelSpec:
    if name not in MODEL_PRESETS:
        raise SpecError("model.preset", f"unknown model preset {name!r}; known: {', '.join(MODEL_PRESETS)}")
    return MODEL_PRESETS[name]


# Hugging Face config.json -------------------------------------------------------------------------------

DEFAULT_SEQ_CAP = 8192


def from_hf_config(config: dict, seq_length: int | None = None, name: str = "") -> ModelSpec:
    """A ModelSpec from a Hugging Face config.json (Llama, Mistral, Mixtral, Qwen2/3(-MoE), DeepSeek-V2/V3).

    ``seq_length`` defaults to max_position_embeddings capped at 8192 (long-context models advertise
    128K positions that nobody trains every step with).
    """
    get = config.get
    try:
        layers, hidden, heads = config["num_hidden_layers"], config["hidden_size"], config["num_attention_heads"]
        vocab = config["vocab_size"]
    except KeyError as missing:
        raise SpecError(f"model.hf_config.{missing.args[0]}", "required field is missing") from None
    kind = str(get("model_type", "")).lower()
    seq = seq_length or min(get("max_position_embeddings", 4096), DEFAULT_SEQ_CAP)
    spec = ModelSpec(
        num_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        ffn_hidden_size=get("intermediate_size", 4 * hidden),
        vocab_size=vocab,
        seq_length=seq,
        num_kv_heads=get("num_key_value_heads", heads),
        head_dim=get("head_dim"),
        tied_embeddings=bool(get("tie_word_embeddings", False)),
        qkv_bias=bool(get("attention_bias", False)) or kind.startswith("qwen2"),
        qk_norm=kind.startswith("qwen3"),
        name=name or get("_name_or_path", kind or "hf-model"),
        source="Hugging Face config.json",
    )
    return replace(spec, moe=_hf_moe(config, kind), mla=_hf_mla(config))


def _hf_moe(config: dict, kind: str) -> MoESpec | None:
    get = config.get
    experts = get("num_local_experts") or get("n_routed_experts") or get("num_experts")
    if not experts:
        return None
    top_k = get("num_experts_per_tok", 2)
    expert_ffn = get("moe_intermediate_size") or get("intermediate_size")
    shared = get("n_shared_experts") or (1 if get("shared_expert_intermediate_size") else 0)
    return MoESpec(
        num_experts=experts,
        top_k=top_k,
        expert_ffn_hidden_size=expert_ffn,
        num_shared_experts=shared,
        shared_expert_ffn_hidden_size=get("shared_expert_intermediate_size"),
        first_dense_layers=get("first_k_dense_replace", 0),
        layer_freq=get("moe_layer_freq", get("decoder_sparse_step", 1)) or 1,
        # DeepSeek-V3's "noaux_tc" router: bias-based balancing (Megatron --moe-router-enable-expert-bias)
        expert_bias=get("topk_method") == "noaux_tc",
        node_limit=get("topk_group") if (get("n_group") or 1) > 1 else None,  # group-limited routing
    )


def _hf_mla(config: dict) -> MLASpec | None:
    if not config.get("kv_lora_rank"):
        return None
    get = config.get
    return MLASpec(
        get("q_lora_rank") or 0,
        get("kv_lora_rank"),
        get("qk_nope_head_dim", 128),
        get("qk_rope_head_dim", 64),
        get("v_head_dim", 128),
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
