"""The parameters one rank of a pipeline stage holds, in registration order, split into the dense buffer
(reduced over the data-parallel x context-parallel group) and the expert buffer (reduced over the expert
data-parallel group, parallel_state.py).

Sharding over TP follows Megatron: column- and row-parallel weights and column-parallel biases are split,
norms, row-parallel biases, routers and position embeddings are replicated; the vocabulary is padded to a
multiple of 128·t (the torch and DeepSpeed flavours do not pad, and keep q, k, v and gate, up as separate
modules, as a Hugging Face model registers them). Registration order matters for gradient buckets
(DDP and Megatron both fill buckets walking the parameters in reverse).
MLA (DeepSeek) follows MLASpec.projections: the two down-projections and the latent norms are replicated on
every TP rank (Megatron TELinear parallel_mode "duplicated"), the up-projections and linear_proj are split.
Attention sinks (GPT-OSS) are per head: split with the heads. MTP modules (DeepSeek-V3) sit on the rank
whose chunk holds them (``m`` in the layout; without a layout the last stage: Megatron-LM d98e8a6
multi_token_prediction.py mtp_on_this_rank), each with its norms and eh_proj; their transformer blocks are
layers num_layers.. of Context.stage_layers, and an MTP chunk without the embedding holds a copy of the
word embedding they read (gpt_model.py builds the embedding when pre_process or mtp_process). The output
layer stays with the loss (post_process): the MTP logits and loss are computed there (gpt_model.py
_postprocess, process_mtp_loss), the MTP chunk passing its hidden states on concatenated with the main ones.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from .context import Context
from .ledger import stage_classes
from .model import ModelSpec
from .parallel import ParallelSpec
from .workload import WorkloadSpec

# (model, layout) pairs whose per-stage parameter lists are kept: a plan asks for every stage twice (the
# data-parallel rule and the memory model), the layout search for the same few models many times
STAGE_PARAMS_CACHE = 64

Params = tuple["Param", ...]


@dataclass(frozen=True)
class Param:
    name: str
    numel: int
    unit: str  # the FSDP / ZeRO-3 unit: "root" (embedding, final norm, head) or "layer.N"
    tensors: int = 1  # the tensors it stands for: a Linear's weight and bias, a LayerNorm's weight and bias


def stage_params(ctx: Context, stage: int) -> tuple[Params, Params]:
    """(dense, expert) parameters of one rank of ``stage``, as immutable tuples shared between plans."""
    return _params_by_stage(ctx.model, _holding(ctx.par))[stage]


@lru_cache(maxsize=4096)  # small values (a layout each); the search's screen sees thousands of layouts
def _holding(par: ParallelSpec) -> ParallelSpec:
    """The layout with what the parameter lists never read (dp, cp, ZeRO stage, sequence parallelism) at
    fixed values: _stage_params reads tp, ep, expert tp, the framework and the stage split only, so layouts
    that differ elsewhere (a search's shapes and variants: thousands a second) share one entry. Memoised by
    value (the search asks again for each context of a layout; ``replace`` re-validates the whole spec)."""
    if (par.dp, par.cp, par.zero_stage, par.sequence_parallel) == (1, 1, 0, False):
        return par
    return replace(par, dp=1, cp=1, zero_stage=0, sequence_parallel=False)


@lru_cache(maxsize=STAGE_PARAMS_CACHE)
def _params_by_stage(model: ModelSpec, par: ParallelSpec) -> tuple[tuple[Params, Params], ...]:
    # the parameters depend on the model and the layout alone (never on the workload), so the key is
    # those two frozen specs and any workload gives the same lists
    ctx = Context(model, WorkloadSpec(), par)
    layers: dict = {}  # a layer's lists, built once: DualPipe's ranks r and pp - 1 - r hold the same layers (mend13a)
    return tuple(_stage_params(ctx, stage, layers) for stage in range(par.pp))


def alike_stages(ctx: Context) -> dict[int, tuple[int, ...]]:
    """Stages whose ranks hold alike parameters (the same sizes, names and unit boundaries but for the layer
    numbers): first stage -> every stage of the class (ledger.stage_classes), memoised like the lists."""
    return _alike_stages(ctx.model, _holding(ctx.par))


@lru_cache(maxsize=STAGE_PARAMS_CACHE)
def _alike_stages(model: ModelSpec, par: ParallelSpec) -> dict[int, tuple[int, ...]]:
    by_stage = _params_by_stage(model, par)
    return stage_classes(range(par.pp), lambda stage: tuple(_shape(params) for params in by_stage[stage]))


def _shape(params: Params) -> tuple:
    """A parameter list with its layer numbers taken out: name within its unit, size, root or not, and which
    unit of the list it belongs to."""
    shape, unit, ordinal = [], None, -1
    for p in params:
        if p.unit != unit:
            unit, ordinal = p.unit, ordinal + 1
        shape.append((p.name.removeprefix(p.unit), p.numel, p.unit == "root", ordinal))
    return tuple(shape)


def _stage_params(ctx: Context, stage: int, layers: dict | None = None) -> tuple[Params, Params]:
    """The rank's (dense, expert) lists in registration order. ``layers``: each layer's (dense, expert) lists by its
    index, shared by the ranks of one layout (a layer's lists read the layout and the layer, never the rank)."""
    layers = {} if layers is None else layers
    m, t = ctx.model, ctx.par.tp
    torch = ctx.flavour.hf_modules  # separate q, k, v and gate, up; the vocabulary unpadded (planner/flavours/)
    vocab = m.vocab_size if torch else m.padded_vocab(t)
    dense: list[Param] = []
    expert: list[Param] = []
    if ctx.is_first(stage):
        dense.append(Param("embedding.word", vocab // t * m.hidden_size, "root"))
        if m.learned_position_embeddings:
            dense.append(Param("embedding.position", m.seq_length * m.hidden_size, "root"))
    for layer in ctx.stage_layers[stage]:
        if layer not in layers:
            layers[layer] = (_layer(ctx, layer, torch), _experts(ctx, layer))
        dense += layers[layer][0]
        expert += layers[layer][1]
    if ctx.is_last(stage):
        dense.append(Param("final_norm", m.norm_params(), "root", _norm_tensors(m)))
    if ctx.holds_mtp(stage):
        if ctx.mtp_embedding_copy(stage):
            dense.append(Param("mtp.embedding.word", vocab // t * m.hidden_size, "root"))
        for i in range(m.mtp_layers):
            # enorm, hnorm, final_layernorm replicated; eh_proj (2h -> h) a column-parallel linear
            unit = f"layer.{m.num_layers + i}"
            dense += [
                Param(f"mtp.{i}.norms", 3 * m.norm_params(), unit),
                Param(f"mtp.{i}.eh_proj", 2 * m.hidden_size * m.hidden_size // t, unit),
            ]
    if ctx.is_last(stage) and (not m.tied_embeddings or ctx.par.pp > 1):
        dense.append(Param("output_layer", vocab // t * m.hidden_size, "root"))
    return tuple(dense), tuple(expert)


def _layer(ctx: Context, layer: int, torch: bool) -> list[Param]:
    m, t = ctx.model, ctx.par.tp
    unit = f"layer.{layer}"
    h, hd = m.hidden_size, m.head_size
    # K and V as the ranks hold them: kv_heads / t each, or one copy of a head per rank past kv_heads ranks (the
    # serving engines' replication, ModelSpec.kv_heads_per_rank; t x that is the K width summed over the TP group)
    q, kv = m.num_attention_heads * hd, m.kv_heads_per_rank(t) * t * hd
    bias = m.linear_bias or m.qkv_bias
    qkv_t, o_t = 1 + bool(bias), 1 + bool(m.linear_bias)
    out = [Param(f"{unit}.input_norm", m.norm_params(), unit, _norm_tensors(m))]
    if m.mla:
        out += [
            Param(f"{unit}.{name}", numel // t if split else numel, unit)
            for name, numel, split in m.mla.projections(h, m.num_attention_heads)
        ]
    elif torch:
        out += [
            Param(f"{unit}.q", (h * q + (q if bias else 0)) // t, unit, qkv_t),
            Param(f"{unit}.k", (h * kv + (kv if bias else 0)) // t, unit, qkv_t),
            Param(f"{unit}.v", (h * kv + (kv if bias else 0)) // t, unit, qkv_t),
            Param(f"{unit}.o", q * h // t + (h if m.linear_bias else 0), unit, o_t),
        ]
    else:
        out += [
            Param(f"{unit}.qkv", (h * (q + 2 * kv) + ((q + 2 * kv) if bias else 0)) // t, unit, qkv_t),
            Param(f"{unit}.proj", q * h // t + (h if m.linear_bias else 0), unit, o_t),
        ]
    if m.qk_norm:
        out.append(Param(f"{unit}.qk_norm", 2 * hd, unit, 2))
    if m.attention_sinks:  # GptOssAttention.sinks: one logit per head, split with the heads
        out.append(Param(f"{unit}.sinks", m.num_attention_heads // t, unit))
    out.append(Param(f"{unit}.mlp_norm", m.norm_params(), unit, _norm_tensors(m)))
    if m.is_moe_layer(layer):
        router = h * m.moe.num_experts + (m.moe.num_experts if m.linear_bias else 0)
        out.append(Param(f"{unit}.router", router, unit))
        if m.moe.shared_ffn:
            out += _mlp(ctx, f"{unit}.shared", m.moe.shared_ffn, t, unit, torch)
    else:
        out += _mlp(ctx, f"{unit}.mlp", m.ffn_hidden_size, t, unit, torch)
    return out


def _mlp(ctx: Context, prefix: str, ffn: int, t: int, unit: str, torch: bool) -> list[Param]:
    m = ctx.model
    h, bias = m.hidden_size, m.linear_bias
    down = Param(f"{prefix}.down", ffn * h // t + (h if bias else 0), unit, 1 + bool(bias))
    if torch and m.gated_mlp:
        return [Param(f"{prefix}.gate", h * ffn // t, unit), Param(f"{prefix}.up", h * ffn // t, unit), down]
    up_rows = ffn * (2 if m.gated_mlp else 1)
    return [Param(f"{prefix}.up", (h * up_rows + (up_rows if bias else 0)) // t, unit, 1 + bool(bias)), down]


def _norm_tensors(m: ModelSpec) -> int:
    return 2 if m.norm == "layernorm" else 1  # weight (and bias)


def _experts(ctx: Context, layer: int) -> list[Param]:
    m = ctx.model
    if not m.is_moe_layer(layer):
        return []
    local = m.moe.num_experts // ctx.par.ep
    per_expert = m.expert_params() // ctx.par.etp
    return [Param(f"layer.{layer}.experts", local * per_expert, f"layer.{layer}")]


def total(params: Params) -> int:
    return sum(p.numel for p in params)


def quantized_numels(ctx: Context, stage: int, experts_only: bool = False) -> tuple[int, ...]:
    """Element counts of the stage's TE linear weights that the fp8/fp4 recipe quantizes (recipes.quantized:
    not embeddings, output layer, norms, routers, sinks), dense then expert (biases inside the linears'
    counts are included: at most 0.1% of GPT-OSS's); ``experts_only``: the expert ones alone (a checkpoint format
    that stores only the MoE experts so, workload.EXPERT_WEIGHT_FORMATS)."""
    from .recipes import quantized

    groups = stage_params(ctx, stage)[1:] if experts_only else stage_params(ctx, stage)
    return tuple(p.numel for params in groups for p in params if quantized(p.name))


def recipe_weight_bytes(ctx: Context, stage: int) -> int:
    """What the recipe adds to one rank's weights: TE's quantized rowwise and columnwise copies of every
    linear weight with their scales (recipes.Recipe.weight_copy_bytes); with fp8_param_gather those copies
    are the primary weights and the bf16 ones are gone (Megatron --fp8-param-gather)."""
    recipe = ctx.work.recipe
    if recipe is None or (ctx.training and ctx.par.zero_stage >= 3):
        return 0  # ZeRO-3 / FSDP units are gathered and cast per use: no persistent copies
    if ctx.training and ctx.flavour.torchao_float8:
        # torchao's Float8Linear casts its weight in every forward and backward (float8_linear.py
        # matmul_with_hp_or_float8_args) and keeps no quantized copy between micro-batches (TE's is_first_microbatch
        # cache); its float8 all-gather (fp8_param_gather) keeps the bf16/fp32 shard as the parameter
        return 0
    if not ctx.training:
        return 0  # an inference engine loads the quantized checkpoint as its only copy (workload.param_dtype)
    numels = quantized_numels(ctx, stage)
    copies = sum(recipe.weight_copy_bytes(n) for n in numels)
    return copies - (sum(numels) * ctx.param_bytes if ctx.work.fp8_param_gather else 0)
