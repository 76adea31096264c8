"""Transformer model specification and exact parameter counts.

Parameter counting follows the modules a Llama/Mixtral/Qwen/DeepSeek/GPT implementation registers; the
preset tests compare the totals with the published ones (tests/planner/test_models.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

from collectives._hashing import frozen_hash

from ._errors import SpecError, one_of

LOAD_BALANCING = ("aux_loss", "seq_aux_loss", "none")
# Hugging Face's RoPE types (transformers modeling_rope_utils.py ROPE_INIT_FUNCTIONS; "default" is plain RoPE)
ROPE_SCALINGS = ("default", "linear", "dynamic", "yarn", "longrope", "llama3")
# Megatron-LM's --attention-dropout and --hidden-dropout defaults (megatron/training/arguments.py at f2e5db402c
# l. 947-949: default=0.1 both), which GPT-style runs keep unless their recipe says otherwise
INFERRED_DROPOUT = 0.1


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
    # layers (0-based) that keep a dense MLP whatever the rule above says (HF Qwen3MoeConfig.mlp_only_layers)
    mlp_only_layers: tuple[int, ...] = ()

    @property
    def shared_ffn(self) -> int:
        if self.shared_expert_ffn_hidden_size is not None:
            return self.shared_expert_ffn_hidden_size
        return self.num_shared_experts * self.expert_ffn_hidden_size


@dataclass(frozen=True)
class MLASpec:
    """DeepSeek-V2/V3 multi-head latent attention (DeepSeek-V3 technical report §2.1.1).

    ``q_lora_rank`` 0 means no query compression (DeepSeek-V2-Lite: one column-parallel q projection).
    """

    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def latent_kv_dim(self) -> int:
        """Elements cached per token and layer: the compressed latent c_KV and the shared decoupled RoPE key
        (kv_lora_rank + qk_rope_head_dim = 576 for DeepSeek-V3), whatever the head count or TP (report
        §2.1.1 eq. 1-5: only c_KV and k_R are cached)."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    def absorbed(self) -> tuple[int, int]:
        """(qk dim, v dim) per head of the absorbed decode form: W_UK folds into the query and W_UV into the
        output projection (DeepSeek-V2 report §2.1.2), so every head attends over the cached latent:
        scores at kv_lora_rank + rope dims, values at kv_lora_rank (FlashMLA / vLLM's MLA backend:
        head_dim 576, head_dim_v 512 for DeepSeek-V3)."""
        return self.latent_kv_dim, self.kv_lora_rank

    def projections(self, hidden: int, heads: int) -> tuple[tuple[str, int, bool], ...]:
        """(name, parameters, split over TP) of one MLA block, in Megatron-Core's registration order
        (megatron/core/transformer/multi_latent_attention.py MLASelfAttention; gpt_layer_specs.py: the two
        down-projections are ``backend.linear()``, TELinear with parallel_mode "duplicated", i.e. replicated
        on every TP rank, the q/kv layernorms are fused into the column-parallel up-projections and
        replicated, linear_proj is row-parallel)."""
        out: list[tuple[str, int, bool]] = []
        if self.q_lora_rank:
            out += [
                ("q_down", hidden * self.q_lora_rank, False),
                ("q_norm", self.q_lora_rank, False),
                ("q_up", self.q_lora_rank * heads * self.qk_head_dim, True),
            ]
        else:
            out.append(("q", hidden * heads * self.qk_head_dim, True))
        out += [
            ("kv_down", hidden * self.latent_kv_dim, False),
            ("kv_norm", self.kv_lora_rank, False),
            ("kv_up", self.kv_lora_rank * heads * (self.qk_nope_head_dim + self.v_head_dim), True),
            ("proj", heads * self.v_head_dim * hidden, True),
        ]
        return tuple(out)


@dataclass(frozen=True)
class ModelSpec:
    __hash__ = frozen_hash  # computed once (collectives/_hashing.py): the planner's memos key on the spec

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
    # the RoPE scaling (Hugging Face rope_scaling.rope_type: "yarn" for GPT-OSS); changes no parameter, but a
    # framework may run a scaled RoPE unfused (Flavour.unfused_rope_scalings); None: plain RoPE
    rope_scaling: str | None = None
    # the GLU's clamp limit (GPT-OSS swiglu_limit 7.0: the gate clamped above, the linear half to +-limit; Megatron
    # activation_func_clamp_value); changes no parameter, a framework may run it as its own ops
    # (Flavour.eager_glu_clamp)
    glu_clamp: float | None = None
    mtp_layers: int = 0  # DeepSeek-V3 multi-token prediction modules (HF num_nextn_predict_layers)
    # the dropout probabilities the model trains with, as its recipe sets them (Megatron --attention-dropout on the
    # attention probabilities, --hidden-dropout on each block's output in its bias-dropout-add and on the embedding);
    # None: the inferred rule (``dropout_probs``); 0 launches nothing and saves nothing
    attention_dropout: float | None = None
    hidden_dropout: float | None = None
    name: str = ""
    published_params: float | None = None
    source: str = ""
    notes: tuple[str, ...] = field(default_factory=tuple)

    # ---- derived -----------------------------------------------------------------------------------
    def dropout_probs(self) -> tuple[float, float]:
        """(attention, hidden) dropout probabilities in training: the fields where set, otherwise the inferred rule:
        a GPT-style model (learned positions or linear biases) at Megatron-LM's defaults, --attention-dropout 0.1
        and --hidden-dropout 0.1 (megatron/training/arguments.py at f2e5db402c l. 947-949; INFERRED_DROPOUT), and a
        Llama-style one (rotary, no biases) at 0, as those recipes set it (planner/presets.py PRESET_DROPOUT)."""
        inferred = INFERRED_DROPOUT if (self.learned_position_embeddings or self.linear_bias) else 0.0
        attention, hidden = self.attention_dropout, self.hidden_dropout
        return (inferred if attention is None else attention, inferred if hidden is None else hidden)

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_attention_heads

    @property
    def head_size(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    def kv_heads_per_rank(self, tp: int) -> int:
        """KV heads one tensor-parallel rank holds (K and V projections, KV cache, attention kernel): kv_heads / tp,
        or one replicated head once tp passes kv_heads (the serving engines' layout: vLLM ModelConfig.get_num_kv_heads
        ``max(1, total_num_kv_heads // tensor_parallel_size)``, vllm/config/model.py at 18ec66292536; SGLang and
        TensorRT-LLM alike, docs/serving.md "KV heads replicated past TP"). Whether a layout may replicate is the
        flavour's or the engine's rule (parallel.kv_heads_rule); this is only the count."""
        return max(1, self.kv_heads // tp)

    def kv_token_bytes(self, tp: int, elem_bytes: int) -> int:
        """KV-cache bytes one token adds to one layer on one tensor-parallel rank: K and V of the rank's
        kv_heads_per_rank(tp) heads (past kv_heads ranks each keeps one replicated head); MLA: the compressed
        latent kv_lora_rank + qk_rope_head_dim, whole on every rank (DeepSeek-V3 report §2.1.1)."""
        if self.mla:
            return (self.mla.kv_lora_rank + self.mla.qk_rope_head_dim) * elem_bytes
        return 2 * self.kv_heads_per_rank(tp) * self.head_size * elem_bytes

    def padded_vocab(self, tp: int, divisible_by: int = 128) -> int:
        """Megatron pads the vocabulary to a multiple of make_vocab_size_divisible_by x tp
        (megatron/training/tokenizer/tokenizer.py _vocab_size_with_padding)."""
        multiple = divisible_by * tp
        return -(-self.vocab_size // multiple) * multiple

    def is_moe_layer(self, layer: int) -> bool:
        """Layers num_layers .. num_layers + mtp_layers - 1 are the MTP modules' transformer blocks, which
        follow the same rule (DeepSeek-V3's MTP block is an MoE layer: modeling_deepseek.py builds layer 61
        like the others)."""
        moe = self.moe
        if moe is None or layer < moe.first_dense_layers or layer in moe.mlp_only_layers:
            return False
        return (layer - moe.first_dense_layers) % moe.layer_freq == 0

    @property
    def num_moe_layers(self) -> int:
        return sum(self.is_moe_layer(i) for i in range(self.num_layers + self.mtp_layers))

    def attention_window(self, layer: int) -> int | None:
        """Keys one query of ``layer`` (0-based) attends at most: the sliding window, or None (all)."""
        if self.sliding_window is None:
            return None
        k = self.full_attention_interval
        return None if k and (layer + 1) % k == 0 else self.sliding_window

    def attended_keys(self, layer: int, length: int) -> int:
        """Keys the last query of a ``length``-token sequence attends in ``layer`` (the KV a decode step keeps)."""
        window = self.attention_window(layer)
        return length if window is None else min(length, window)

    # ---- parameters --------------------------------------------------------------------------------
    def norm_params(self) -> int:
        return self.hidden_size * (2 if self.norm == "layernorm" else 1)

    def attention_params(self) -> int:
        h, hd = self.hidden_size, self.head_size
        sinks = self.num_attention_heads if self.attention_sinks else 0
        if self.mla:
            return sum(n for _, n, _ in self.mla.projections(h, self.num_attention_heads)) + sinks
        q, kv = self.num_attention_heads * hd, self.kv_heads * hd
        weights = h * q + 2 * h * kv + q * h
        biases = (q + 2 * kv + h) if self.linear_bias else (q + 2 * kv) if self.qkv_bias else 0
        qk_norm = 2 * hd if self.qk_norm else 0
        return weights + biases + qk_norm + sinks

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
        # the router's bias: GPT-OSS (GptOssTopKRouter.bias, transformers modeling_gpt_oss.py)
        router = self.hidden_size * moe.num_experts + (moe.num_experts if self.linear_bias else 0)
        return router + (self.mlp_params(moe.shared_ffn) if moe.shared_ffn else 0)

    def layer_params(self, layer: int) -> int:
        base = self.attention_params() + 2 * self.norm_params()
        if self.is_moe_layer(layer):
            return base + self.moe_dense_params() + self.moe.num_experts * self.expert_params()
        return base + self.mlp_params(self.ffn_hidden_size)

    def embedding_params(self) -> int:
        emb = self.vocab_size * self.hidden_size
        return emb + (self.seq_length * self.hidden_size if self.learned_position_embeddings else 0)

    def mtp_module_params(self) -> int:
        """One multi-token-prediction module without the embedding and output head it shares with the main
        model (DeepSeek-V3 report §2.2; Megatron-Core multi_token_prediction.py MultiTokenPredictionLayer:
        enorm, hnorm, eh_proj 2h -> h, one transformer layer, final_layernorm)."""
        return 3 * self.norm_params() + 2 * self.hidden_size * self.hidden_size

    def mtp_params(self) -> int:
        """All MTP modules: their own parts and their transformer blocks (layers num_layers, num_layers + 1...)."""
        blocks = sum(self.layer_params(self.num_layers + i) for i in range(self.mtp_layers))
        return self.mtp_layers * self.mtp_module_params() + blocks

    def total_params(self) -> int:
        """Every trained parameter once: the main model and its MTP modules (which share its embedding and head).
        Memoised by value (``_total_params``): every plan's MFU asks for it, 61 layers' sums each time."""
        try:
            return _total_params(self)
        except TypeError:  # a spec holding an unhashable value (a list where a tuple belongs): computed, not kept
            return _total_params.__wrapped__(self)

    def active_params(self) -> int:
        """Parameters one token touches (MoE: top-k routed experts instead of all), MTP modules included."""
        if not self.moe:
            return self.total_params()
        idle = (self.moe.num_experts - self.moe.top_k) * self.expert_params() * self.num_moe_layers
        return self.total_params() - idle


@lru_cache(maxsize=256)  # value keys: ModelSpec is frozen
def _total_params(m: ModelSpec) -> int:
    body = sum(m.layer_params(i) for i in range(m.num_layers))
    head = 0 if m.tied_embeddings else m.vocab_size * m.hidden_size
    return m.embedding_params() + body + m.norm_params() + head + m.mtp_params()


def validate_model(m: ModelSpec) -> None:
    _validate_heads(m)
    if m.norm not in ("rmsnorm", "layernorm"):
        raise SpecError("model.norm", f"must be 'rmsnorm' or 'layernorm', got {m.norm!r}")
    if m.moe:
        _validate_moe(m.moe, m.num_layers)
    _validate_window(m)
    if m.rope_scaling is not None:
        one_of("model.rope_scaling", m.rope_scaling, ROPE_SCALINGS)
    if m.glu_clamp is not None and not (m.glu_clamp > 0 and m.gated_mlp):
        raise SpecError(
            "model.glu_clamp",
            f"clamps a gated MLP's two halves: needs gated_mlp and a limit > 0, got {m.glu_clamp} "
            f"(gated_mlp {m.gated_mlp})",
        )
    if m.mtp_layers < 0:
        raise SpecError("model.mtp_layers", f"must be >= 0, got {m.mtp_layers}")
    _validate_dropout(m)


def _validate_heads(m: ModelSpec) -> None:
    """The sizes, then the attention heads: kv heads dividing the heads, the hidden size dividing into heads."""
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


def _validate_dropout(m: ModelSpec) -> None:
    for name in ("attention_dropout", "hidden_dropout"):
        p = getattr(m, name)
        if p is not None and not 0 <= p < 1:  # NaN fails both comparisons
            raise SpecError(f"model.{name}", f"a dropout probability must be in [0, 1) or null (inferred), got {p}")


def _validate_window(m: ModelSpec) -> None:
    """Sliding-window attention: a window, and every k-th layer full (gpt-oss, Gemma 3)."""
    if m.sliding_window is not None and m.sliding_window < 1:
        raise SpecError("model.sliding_window", f"must be >= 1 or null, got {m.sliding_window}")
    if m.full_attention_interval is not None:
        if m.sliding_window is None:
            raise SpecError(
                "model.full_attention_interval",
                f"full_attention_interval {m.full_attention_interval} needs a sliding_window (every layer is full)",
            )
        if not 1 <= m.full_attention_interval <= m.num_layers:
            raise SpecError(
                "model.full_attention_interval",
                f"must be in [1, num_layers {m.num_layers}], got {m.full_attention_interval}",
            )


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
    stray = [i for i in moe.mlp_only_layers if not 0 <= i < layers]
    if stray:
        raise SpecError("model.moe.mlp_only_layers", f"layers must be in [0, num_layers {layers}), got {stray[:4]}")
    if moe.layer_freq < 1:
        raise SpecError("model.moe.layer_freq", f"must be >= 1, got {moe.layer_freq}")
    if moe.node_limit is not None and moe.node_limit < 1:
        raise SpecError("model.moe.node_limit", f"must be >= 1 or null, got {moe.node_limit}")
    one_of("model.moe.load_balancing", moe.load_balancing, LOAD_BALANCING)
    if moe.capacity_factor is not None and moe.capacity_factor <= 0:
        raise SpecError("model.moe.capacity_factor", f"must be > 0 or null (dropless), got {moe.capacity_factor}")
