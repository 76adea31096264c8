"""Transformer model specification and exact parameter counts.

Parameter counting follows the modules a Llama/Mixtral/Qwen/DeepSeek/GPT implementation registers; the
preset tests compare the totals with the published ones (tests/planner/test_models.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ._errors import SpecError

LOAD_BALANCING = ("aux_loss", "seq_aux_loss", "none")


@dataclass(frozen=True)
class MoESpec:
    num_experts: int
    top_k: int
    expert_ffn_hidden_size: int
    num_shared_experts: int = 0
    shared_expert_ffn_hidden_size: int | None = None  # default: num_shared_experts x expert ffn
    first_dense_layers: int = 0
    layer_freq: int = 1  # every layer_freq-th layer after the dense ones is MoE
    capacity_factor: float | None = None  # None: dropless
    # Megatron --moe-router-load-balancing-type (default aux_loss, megatron/training/arguments.py):
    # aux_loss | seq_aux_loss | none
    load_balancing: str = "aux_loss"
    # Megatron --moe-router-enable-expert-bias: DeepSeek-V3's auxiliary-loss-free balancing (report §2.1.2)
    expert_bias: bool = False
    # node-limited routing: each token's experts lie on at most this many nodes (DeepSeek-V3 §2.1.2 M = 4;
    # Megatron --moe-router-group-topk with one group per node; HF topk_group). None: no limit
    node_limit: int | None = None

    @property
    def shared_ffn(self) -> int:
        if self.shared_expert_ffn_hidden_size is not None:
            return self.shared_expert_ffn_hidden_size
        return self.num_shared_experts * self.expert_ffn_hidden_size


@dataclass(frozen=True)
class MLASpec:
    """DeepSeek-V2/V3 multi-head latent attention (DeepSeek-V3 technical report §2.1.1)."""

    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int


@dataclass(frozen=True)
class ModelSpec:
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    ffn_hidden_size: int
    vocab_size: int
    seq_length: int
    num_kv_heads: int | None = None  # None: = num_attention_heads (MHA)
    head_dim: int | None = None  # None: hidden / heads
    gated_mlp: bool = True
    tied_embeddings: bool = False
    norm: str = "rmsnorm"  # rmsnorm (weight) | layernorm (weight + bias)
    linear_bias: bool = False  # biases on every linear (GPT-2/3)
    qkv_bias: bool = False  # biases on q, k, v only (Qwen2)
    qk_norm: bool = False  # per-head RMSNorm of q and k (Qwen3)
    learned_position_embeddings: bool = False  # GPT-2/3: max_position x hidden table
    moe: MoESpec | None = None
    mla: MLASpec | None = None
    # sliding-window attention: each query sees the last `sliding_window` keys (Mistral, GPT-OSS, Gemma 3);
    # with full_attention_interval k, layers k, 2k, ... (1-based) attend fully (GPT-OSS: 2; None: all sliding)
    sliding_window: int | None = None
    full_attention_interval: int | None = None
    attention_sinks: bool = False  # GPT-OSS: one learned sink logit per head and layer
    mtp_layers: int = 0  # DeepSeek-V3 multi-token prediction modules (HF num_nextn_predict_layers)
    name: str = ""
    published_params: float | None = None
    source: str = ""
    notes: tuple[str, ...] = field(default_factory=tuple)

    # ---- derived -----------------------------------------------------------------------------------
    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_attention_heads

    @property
    def head_size(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    def padded_vocab(self, tp: int, divisible_by: int = 128) -> int:
        """Megatron pads the vocabulary to a multiple of make_vocab_size_divisible_by x tp
        (megatron/training/tokenizer/tokenizer.py _vocab_size_with_padding)."""
        multiple = divisible_by * tp
        return -(-self.vocab_size // multiple) * multiple

    def is_moe_layer(self, layer: int) -> bool:
        moe = self.moe
        if moe is None or layer < moe.first_dense_layers:
            return False
        return (layer - moe.first_dense_layers) % moe.layer_freq == 0

    @property
    def num_moe_layers(self) -> int:
        return sum(self.is_moe_layer(i) for i in range(self.num_layers))

    # ---- parameters --------------------------------------------------------------------------------
    def norm_params(self) -> int:
        return self.hidden_size * (2 if self.norm == "layernorm" else 1)

    def attention_params(self) -> int:
        h, hd = self.hidden_size, self.head_size
        if self.mla:
            return self._mla_params()
        q, kv = self.num_attention_heads * hd, self.kv_heads * hd
        weights = h * q + 2 * h * kv + q * h
        biases = (q + 2 * kv + h) if self.linear_bias else (q + 2 * kv) if self.qkv_bias else 0
        qk_norm = 2 * hd if self.qk_norm else 0
        return weights + biases + qk_norm

    def _mla_params(self) -> int:
        m, h, heads = self.mla, self.hidden_size, self.num_attention_heads
        q = h * m.q_lora_rank + m.q_lora_rank + m.q_lora_rank * heads * (m.qk_nope_head_dim + m.qk_rope_head_dim)
        kv = h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank
        kv += m.kv_lora_rank * heads * (m.qk_nope_head_dim + m.v_head_dim)
        return q + kv + heads * m.v_head_dim * h

    def mlp_params(self, ffn: int) -> int:
        h = self.hidden_size
        matrices = (3 if self.gated_mlp else 2) * h * ffn
        return matrices + ((ffn * (2 if self.gated_mlp else 1) + h) if self.linear_bias else 0)

    def expert_params(self) -> int:
        """One routed expert."""
        return self.mlp_params(self.moe.expert_ffn_hidden_size)

    def moe_dense_params(self) -> int:
        """The non-expert part of an MoE layer's MLP block: router and shared experts."""
        moe = self.moe
        router = self.hidden_size * moe.num_experts
        return router + (self.mlp_params(moe.shared_ffn) if moe.shared_ffn else 0)

    def layer_params(self, layer: int) -> int:
        base = self.attention_params() + 2 * self.norm_params()
        if self.is_moe_layer(layer):
            return base + self.moe_dense_params() + self.moe.num_experts * self.expert_params()
        return base + self.mlp_params(self.ffn_hidden_size)

    def embedding_params(self) -> int:
        emb = self.vocab_size * self.hidden_size
        return emb + (self.seq_length * self.hidden_size if self.learned_position_embeddings else 0)

    def total_params(self) -> int:
        body = sum(self.layer_params(i) for i in range(self.num_layers))
        head = 0 if self.tied_embeddings else self.vocab_size * self.hidden_size
        return self.embedding_params() + body + self.norm_params() + head

    def active_params(self) -> int:
        """Parameters one token touches (MoE: top-k routed experts instead of all)."""
        if not self.moe:
            return self.total_params()
        idle = (self.moe.num_experts - self.moe.top_k) * self.expert_params() * self.num_moe_layers
        return self.total_params() - idle


def validate_model(m: ModelSpec) -> None:
    for name in ("num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size", "vocab_size", "seq_length"):
        if getattr(m, name) < 1:
            raise SpecError(f"model.{name}", f"must be >= 1, got {getattr(m, name)}")
    if m.num_kv_heads is not None and m.num_kv_heads < 1:
        raise SpecError("model.num_kv_heads", f"must be >= 1, got {m.num_kv_heads}")
    if m.num_attention_heads % m.kv_heads:
        raise SpecError(
            "model.num_kv_heads",
            f"num_attention_heads {m.num_attention_heads} is not divisible by num_kv_heads {m.kv_heads}",
        )
    if m.head_dim is None and m.hidden_size % m.num_attention_heads:
        raise SpecError(
            "model.hidden_size",
            f"hidden_size {m.hidden_size} is not divisible by num_attention_heads {m.num_attention_heads} "
            "(give head_dim explicitly)",
        )
    if m.norm not in ("rmsnorm", "layernorm"):
        raise SpecError("model.norm", f"must be 'rmsnorm' or 'layernorm', got {m.norm!r}")
    if m.moe:
        _validate_moe(m.moe, m.num_layers)


def _validate_moe(moe: MoESpec, layers: int) -> None:
    if moe.num_experts < 1 or moe.expert_ffn_hidden_size < 1:
        raise SpecError(
            "model.moe",
            f"num_experts and expert_ffn_hidden_size must be >= 1, got {moe.num_experts}, {moe.expert_ffn_hidden_size}",
        )
    if not 1 <= moe.top_k <= moe.num_experts:
        raise SpecError("model.moe.top_k", f"top_k {moe.top_k} must be between 1 and num_experts {moe.num_experts}")
    if not 0 <= moe.first_dense_layers < layers:
        raise SpecError(
            "model.moe.first_dense_layers", f"must be in [0, num_layers {layers}), got {moe.first_dense_layers}"
        )
    if moe.layer_freq < 1:
        raise SpecError("model.moe.layer_freq", f"must be >= 1, got {moe.layer_freq}")
    if moe.node_limit is not None and moe.node_limit < 1:
        raise SpecError("model.moe.node_limit", f"must be >= 1 or null, got {moe.node_limit}")
    if moe.load_balancing not in LOAD_BALANCING:
        raise SpecError(
            "model.moe.load_balancing",
            f"must be one of {', '.join(LOAD_BALANCING)}, got {moe.load_balancing!r}",
        )
    if moe.capacity_factor is not None and moe.capacity_factor <= 0:
        raise SpecError("model.moe.capacity_factor", f"must be > 0 or null (dropless), got {moe.capacity_factor}")
