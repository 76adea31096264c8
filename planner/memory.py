"""Memory of one rank of each pipeline stage: weights, gradients, optimizer states, activations, buffers.

**Weights, gradients, optimizer** per parameter the rank holds (before sharding), by ZeRO stage:

    weights  = x_param                   (bf16: 2)
    grads    = x_grad                    (Megatron accumulates and reduces main grads in fp32: 4; others: x_param)
    optimizer= 4 (fp32 master, when params are not fp32) + 8 (Adam m and v)  = 12

so Megatron is 2 + 4 + 12 = 18 B/param, and 6 + 12/dp with the distributed optimizer
(megatron/training/theoretical_memory_usage.py, num_bytes_per_parameter), and DeepSpeed's mixed-precision
Adam is 2 + 2 + 12 = 16 B/param (Rajbhandari et al. 2020, ZeRO §3.1, K = 12). ZeRO-1 shards the optimizer,
ZeRO-2 also the gradients, ZeRO-3 / FSDP also the weights, over the data-parallel group (x cp for dense
parameters as Megatron's distributed optimizer does; expert parameters over the expert data-parallel
group; over hybrid_shard_size with HSDP). ZeRO-3 also holds the gathered units being used and prefetched.

**Activations** per layer and micro-batch, Korthikanti et al. 2022 ("Reducing Activation Recomputation in
Large Transformer Models") Table 2, generalised tensor by tensor to GQA, gated MLPs and dropout-free models;
for GPT (MHA, 4h GeLU MLP, LayerNorm, dropout) it is their 34·s·b·h + 5·a·s²·b bytes (2-byte activations):
attention 11·sbh + 5·a·s²·b (QKV input 2, Q and K 4, V 2, projection input 2, dropout mask 1; softmax 2,
its dropout mask 1 and output 2 per a·s²·b), MLP 19·sbh (input 2, GeLU input 8, output 8, dropout mask 1),
two norms 4·sbh. Tensor parallelism splits the 24·sbh inside the attention and MLP blocks; sequence
parallelism splits the rest; context parallelism splits s. Flash attention and selective recompute remove
the s² term (flash keeps only the output and the log-sum-exp); full recompute keeps each layer's input
(2·sbh, /t with SP) plus one layer's working set. MoE layers store the expert inputs and activations of the
top-k copies of each token. Micro-batches in flight come from the schedule (pipeline.in_flight).
The last stage also holds the fp32 logits of one micro-batch (4·s·b·V/t, Korthikanti §4.3; of every micro-batch
under GPipe, whose backwards wait for all forwards: pipeline.losses_in_flight) and, training, the
output layer's saved input (``head_input_bytes``); the chunk running the final norm its input
(``head_chunk_bytes``). Under an fp8/fp4
recipe TransformerEngine's linears save quantized copies of their inputs, and Megatron can keep the SwiGLU
input in fp8 (``activation_parts``; docs/step-time.md).

**Buffers**: a fixed WORKSPACE (CUDA context, cuBLAS/cuDNN workspaces, NCCL channel buffers) plus the
largest communication buffer the stage allocates besides its gradients.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from ._errors import SpecError
from .compute import kv_cache_bytes_per_layer, mtp_bf16_context
from .context import Context
from .kernels import fp8_attention, graphed_pre_mlp_norm, loss_vocab
from .model import ModelSpec
from .parallel import ParallelSpec
from .params import _holding, quantized_numels, recipe_weight_bytes, stage_params, total
from .pipeline import Schedule, in_flight_chunks, losses_in_flight
from .recipes import float8_gathered, gathered_param_bytes
from .recompute import LayerRecompute, chunk_plans, mtp_checkpointed, working_layers
from .workload import EXPERT_WEIGHT_FORMATS, WEIGHT_FORMAT_BYTES, WorkloadSpec

GIB = 1 << 30
# CUDA context (~0.5 GiB on Hopper), cuBLAS workspace (32 MiB/stream on SM90, cuBLAS docs "cublasSetWorkspace"),
# TransformerEngine/NCCL buffers (NCCL_BUFFSIZE 4 MiB per channel and peer); rounded up to a stated 1 GiB.
WORKSPACE_BYTES = 1 * GIB
ADAM_STATE_BYTES = 8  # m and v in fp32
MASTER_BYTES = 4  # fp32 master weights when the parameters are not fp32
# The most bytes one stage holds (its activations) or moves in an iteration (planner/estimate.py) in a plan answered:
# 2^57 (144 PB, 10^6 x an H200's memory), so that a stage's parts, and the bytes sent (up to log2 n = 17 x the message
# under recursive doubling), sum inside int64 (2^63), the largest integer a JSON reader takes. The bounds of each
# field (b, s, h, micro-batches) keep each factor in range, not their product: Llama-3 8B at global_batch_size 2^24
# and seq_length 2^22 (tp 4, pp 2, gpipe) answered 6.7e19 B of activations and 3.3e20 B of traffic a stage (hostile15).
MAX_STAGE_BYTES = 1 << 57
ZERO3_UNITS_IN_FLIGHT = 2  # the unit computing and the one prefetched (FSDP2 / DeepSpeed prefetch)


@dataclass(frozen=True)
class StageMemory:
    stage: int
    param_count: int
    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    activations_bytes: int
    buffers_bytes: int

    @property
    def peak_bytes(self) -> int:
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes + self.activations_bytes + self.buffers_bytes

    def largest(self) -> str:
        parts = {
            k: getattr(self, k)
            for k in ("params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes", "buffers_bytes")
        }
        return max(parts, key=parts.get).removesuffix("_bytes")


@dataclass(frozen=True)
class Memory:
    capacity_bytes: int
    per_stage: tuple[StageMemory, ...]

    @property
    def fits(self) -> bool:
        return all(s.peak_bytes <= self.capacity_bytes for s in self.per_stage)

    @property
    def peak_bytes(self) -> int:
        return max(s.peak_bytes for s in self.per_stage)

    def warnings(self) -> list[str]:
        """One line: which stages do not fit, and the worst one's peak and largest part."""
        over = [s for s in self.per_stage if s.peak_bytes > self.capacity_bytes]
        if not over:
            return []
        worst = max(over, key=lambda s: s.peak_bytes)
        part = worst.largest()
        which = f"stage {over[0].stage} does" if len(over) == 1 else f"stages {_ranges([s.stage for s in over])} do"
        return [
            f"{which} not fit ({len(over)} of {len(self.per_stage)}): stage {worst.stage} needs "
            f"{worst.peak_bytes / 1e9:.1f} GB per rank > {self.capacity_bytes / 1e9:.1f} GB capacity; largest part: "
            f"{part} ({getattr(worst, part + '_bytes') / 1e9:.1f} GB)"
        ]


def _ranges(stages: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2, 5'."""
    runs: list[list[int]] = []
    for s in stages:
        if runs and s == runs[-1][-1] + 1:
            runs[-1].append(s)
        else:
            runs.append([s])
    return ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else f"{r[0]}" for r in runs)


# ---- activations ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LayerActivations:
    """Bytes one layer stores for backward, for one micro-batch on one rank: split (over tp), replicated
    (over tp unless sequence parallel) and the s² attention-score part (gone with flash attention)."""

    split: float
    replicated: float
    scores: float

    def per_rank(self, tp: int, sp: bool, flash: bool) -> float:
        return self.split / tp + self.replicated / (tp if sp else 1) + (0.0 if flash else self.scores / tp)


def dropout_probs(ctx: Context) -> tuple[float, float]:
    """(attention, hidden) dropout probabilities this run applies: the model's (ModelSpec.dropout_probs: its recipe's,
    or Megatron-LM's 0.1 defaults for GPT-style models and 0 for Llama-style ones), training only: in eval mode
    torch.nn.Dropout returns its input and launches nothing (torch/nn/functional.py dropout: ``training=False``).
    A probability of 0 launches nothing either, in eager mode too: aten's ``dropout`` (aten/src/ATen/native/
    Dropout.cpp, read at 03d697c503 and as code search shows it today) takes the fused kernel only when
    ``is_fused_kernel_acceptable`` (``p > 0 && p < 1``) and otherwise ``_dropout_impl``, which returns its input for
    ``p == 0 || !train``; under torch.compile (Megatron-Core's jit_fuser, its fused bias-dropout-add) the
    decomposition (torch/_decomp/decompositions.py ``dropout``) returns ``input.clone()`` unless ``train and p != 0``,
    which the add's kernel absorbs; a fused attention (TE/cuDNN, FlashAttention-2) with dropout 0 draws no Philox
    numbers (FUSED_DROPOUT_SM_CYCLES is the p 0.1 vs p 0 difference). So no kernel, no draws, no saved mask."""
    return ctx.model.dropout_probs() if ctx.training else (0.0, 0.0)


def attention_dropout(ctx: Context) -> bool:
    """Whether the attention probabilities are dropped (Megatron --attention-dropout > 0): the fused attention's
    Philox draws (kernels.fused_dropout_s), the unfused attention's dropout kernel and its s x s mask."""
    return dropout_probs(ctx)[0] > 0


def hidden_dropout(ctx: Context) -> bool:
    """Whether each block's output is dropped (Megatron --hidden-dropout > 0): the bias-dropout-add's mask and draws
    (kernels.residual_bytes), its saved 1-byte mask per element (activation_parts), and the embedding's dropout."""
    return dropout_probs(ctx)[1] > 0


def saved_recipe(ctx: Context):
    """The fp8/fp4 recipe whose TE linears save quantized inputs for backward: training under a Megatron/TE
    flavour with ``workload.fp8_recipe`` (planner/recipes.py); None otherwise."""
    recipe = ctx.work.recipe
    return recipe if recipe is not None and ctx.training and ctx.flavour.te_fp8_recipes else None


def activation_parts(ctx: Context, moe: bool) -> dict[str, tuple[str, float]]:
    """Each tensor one layer saves for backward, by name: (split | replicated | scores, bytes) for b·s/cp tokens
    (Korthikanti et al. 2022 Table 2, module docstring), at the width it is saved at. Under an fp8/fp4 recipe
    (``saved_recipe``) a TE linear saves a quantized copy of its input (``Recipe.saved_input_bytes``, 1.03 B per
    element for blockwise and mxfp8) instead of the bf16 tensor, except where Megatron sets
    ``save_original_input`` and TE honours it (``Recipe.saves_original_input``): linear_proj, whose input the
    fused attention saves anyway (megatron/core/transformer/attention.py). The SwiGLU input is kept as
    float8_e4m3fn (1 B) with ``workload.activation_func_fp8_input_store`` (Megatron
    --activation-func-fp8-input-store, megatron/core/fusions/fused_bias_swiglu.py)."""
    mdl = ctx.model
    # each dropout as the model trains (dropout_probs: one rule decides the masks and the scores' 5·a·s²·b)
    drop_attn, drop_hidden = attention_dropout(ctx), hidden_dropout(ctx)
    tok = ctx.b * ctx.s_cp
    x, h, hd, heads = ctx.x, mdl.hidden_size, mdl.head_size, mdl.num_attention_heads
    recipe = saved_recipe(ctx)
    lin = recipe.saved_input_bytes if recipe else x  # bytes per element of a TE linear's saved input
    act = 1 if ctx.work.activation_func_fp8_input_store else x  # the SwiGLU input (fc1's output)
    if mdl.mla:  # Q and K at qk = nope + rope per head, V and the projection input at v_head_dim per head
        a = mdl.mla
        qkv, proj = heads * (2 * (a.qk_nope_head_dim + a.qk_rope_head_dim) + a.v_head_dim), heads * a.v_head_dim
        readers = 2 if a.q_lora_rank else 1  # linear_q_down_proj and linear_kv_down_proj each quantize the norm output
    else:  # Q and the projection input q wide, K and V kv wide (GQA; a copy per rank past kv_heads ranks, "split" / t)
        qkv, proj, readers = heads * hd + 2 * mdl.kv_heads_per_rank(ctx.par.tp) * ctx.par.tp * hd, heads * hd, 1
    mask = tok * h if drop_hidden else 0  # the bias-dropout-adds' 1-byte masks (hidden dropout)
    # an FP8 attention with its backward in FP8 saves the quantized q, k, v (and, delayed, the fp8 output) instead
    # of the bf16 ones (TransformerEngine d0067d0da backends.py FusedAttnFunc fp8_tensors; Recipe.dpa_fp8_output)
    dpa = ctx.work.recipe if (fp8_attention(ctx) or (False, False))[1] else None
    qkv_x = dpa.saved_input_bytes if dpa else x
    out_x = dpa.element_bytes if dpa and dpa.dpa_fp8_output else x
    parts = {
        "qkv_in": ("replicated", tok * h * (readers * lin if recipe else x)),  # the norm output, QKV's input
        "qkv": ("split", tok * qkv * qkv_x),  # Q, K, V for the attention kernel
        "proj_in": ("split", tok * proj * out_x),  # the attention output, linear_proj's input
        "attn_mask": ("replicated", mask),
        # softmax output (x bytes per score); with attention dropout also its 1-byte mask and x-byte output: 5·a·s²·b
        # at x = 2
        "scores": ("scores", ((2 * x + 1) if drop_attn else x) * heads * tok * ctx.s),
        "mlp_mask": ("replicated", mask),
        "norm_in": ("replicated", 2 * tok * h * x),  # the two norms' inputs
    }
    if recipe and not recipe.saves_original_input:  # delayed scaling: linear_proj keeps its quantized copy too
        parts["proj_in_copy"] = ("split", tok * proj * lin)
    gate = 2 if mdl.gated_mlp else 1
    if not moe:
        ffn = mdl.ffn_hidden_size
        parts["mlp_in"] = ("replicated", tok * h * lin)  # the pre-MLP norm output, fc1's input
        parts["act_in"] = ("split", tok * gate * ffn * act)
        parts["fc2_in"] = ("split", tok * ffn * lin)
        return parts
    m = mdl.moe
    copies = m.top_k * (m.capacity_factor or 1.0)
    ffn = m.expert_ffn_hidden_size
    parts["mlp_in"] = ("replicated", tok * h * x)  # the pre-MLP norm output the router saves (bf16)
    if recipe and m.shared_ffn:  # and the shared experts' fc1 quantizes it
        parts["mlp_in_copy"] = ("replicated", tok * h * lin)
    parts["router"] = ("replicated", tok * m.num_experts * 4)  # fp32 router logits
    parts["fc1_in"] = ("split", tok * copies * h * lin)  # the dispatched tokens, the experts' fc1 input
    parts["act_in"] = ("split", tok * copies * gate * ffn * act)
    parts["fc2_in"] = ("split", tok * copies * ffn * lin)
    if m.shared_ffn:
        parts["shared_act_in"] = ("split", tok * gate * m.shared_ffn * act)
        parts["shared_fc2_in"] = ("split", tok * m.shared_ffn * lin)
    return parts


def _sum_parts(parts: dict[str, tuple[str, float]], names) -> LayerActivations:
    by_kind = {"split": 0.0, "replicated": 0.0, "scores": 0.0}
    for name in names:
        if name in parts:
            kind, size = parts[name]
            by_kind[kind] += size
    return LayerActivations(by_kind["split"], by_kind["replicated"], by_kind["scores"])


def layer_activations(ctx: Context, moe: bool) -> LayerActivations:
    """Korthikanti et al. 2022 Table 2 tensor by tensor (module docstring, ``activation_parts``)."""
    parts = activation_parts(ctx, moe)
    return _sum_parts(parts, parts)


def freed_activations(ctx: Context, moe: bool, modules: frozenset[str]) -> LayerActivations:
    """The tensors of ``layer_activations`` that selective recompute of ``modules`` frees (planner/recompute.py
    lists what each module re-runs); core_attn's s² scores go through ``per_rank``'s ``flash`` switch. Under an
    fp8 recipe Megatron sets ``save_original_input`` on the linears whose input is recomputed (layernorm:
    linear_qkv / the down-projections and the shared experts' fc1; moe_act: the experts' fc2), so their
    quantized copies go too, except under delayed scaling, where TE keeps them (``Recipe.saves_original_input``)."""
    parts = activation_parts(ctx, moe)
    recipe = saved_recipe(ctx)
    copies_go = recipe is None or recipe.saves_original_input
    names: list[str] = []
    if "layernorm" in modules:  # the norms' outputs: the QKV input and the MLP input
        # the pre-MLP norm of an MoE layer in a moe_router graph is not recomputed: its output and copy stay
        mlp = [] if graphed_pre_mlp_norm(ctx, moe) else ["mlp_in"]
        names += mlp if moe else []
        names += ["qkv_in"] + [f"{n}_copy" for n in mlp] + ([] if moe else ["mlp_in"]) if copies_go else []
    if "mla_up_proj" in modules and ctx.model.mla:  # Q, K and V after the up-projections
        names.append("qkv")
    if not moe:
        if "mlp" in modules:
            names += ["act_in", "fc2_in"]
        return _sum_parts(parts, names)
    if "moe" in modules:  # the whole MoE block: experts, shared experts, router logits
        names += ["fc1_in", "act_in", "fc2_in", "shared_act_in", "shared_fc2_in", "router"]
        return _sum_parts(parts, names)
    if "moe_act" in modules and copies_go:  # the experts' activation output (fc2's input)
        names.append("fc2_in")
    if "shared_experts" in modules:
        names += ["shared_act_in", "shared_fc2_in"]
    return _sum_parts(parts, names)


def torch_op_sac_kept(ctx: Context) -> float:
    """What torchtitan's per-op selective checkpointing keeps of a dense block, per rank (planner/recompute.py):
    the block's input, the saved mm outputs (q, v, w1 and, gated, w2: odd in the order q, k, v, o, w1, w3, w2;
    the row-parallel w2's is its full-width partial sum), the attention output and its fp32 log-sum-exp, and
    with sequence parallelism the two reduce-scatter outputs."""
    mdl, par = ctx.model, ctx.par
    t, sp = par.tp, par.sp
    sbx, h, hd = ctx.b * ctx.s_cp * ctx.x, mdl.hidden_size, mdl.head_size
    q, kv = mdl.num_attention_heads * hd, mdl.kv_heads * hd
    kept = sbx * (q + kv + q + mdl.ffn_hidden_size) / t + sbx * h / (t if sp else 1)
    kept += ctx.b * ctx.s_cp * mdl.num_attention_heads / t * 4
    if mdl.gated_mlp:  # w2 is the 7th mm; without a gate the 6th, recomputed
        kept += sbx * h
    if sp:
        kept += 2 * sbx * h / t
    return kept


@lru_cache(maxsize=4096)
def stage_activation_bytes(ctx: Context, stage: int, sched: Schedule, flash: bool | None = None) -> int:
    """Activations one rank of ``stage`` holds at its peak (training) or for one pass (inference): what each
    layer keeps under recompute as configured (planner/recompute.py) for the chunks in flight
    (pipeline.in_flight_chunks), plus the working set a full recompute rebuilds. The s² scores are kept
    only by unfused attention (``workload.attention_kernel``) without core_attn recompute."""
    par = ctx.par
    t, sp = par.tp, par.sp
    flash = ctx.work.attention_kernel == "flash" if flash is None else flash
    if not ctx.training:  # one layer's working set at a time
        kinds = [k for k in (False, True) if (ctx.moe_layers(stage) if k else ctx.dense_layers(stage))]
        per_rank = (layer_activations(ctx, k).per_rank(t, sp, flash) for k in kinds)
        return int(max(per_rank, default=0.0)) + _logits(ctx, stage)
    parts = chunk_activations(ctx, stage, flash)
    return held_activation_bytes(parts, in_flight_chunks(sched, stage), losses_in_flight(sched))


@dataclass(frozen=True)
class ChunkActivations:
    """The parts of a training stage's activations that do not read the pipeline schedule: what one
    micro-batch in flight of each of its chunks keeps (bytes, in the chunks' order on the rank), the working
    set a full recompute rebuilds, what CPU offload moves out, and the logits (last stage). The schedule
    only says how many micro-batches of each chunk are in flight (pipeline.in_flight_chunks)."""

    per_chunk: tuple[float, ...]
    working: float
    offloaded: float
    logits: int


def held_activation_bytes(parts: ChunkActivations, in_flight: tuple[float, ...], losses: int = 1) -> int:
    """A stage's activations at its peak: each chunk's bytes times its micro-batches in flight, plus the working
    set, less what is offloaded, plus the logits of the ``losses`` micro-batches whose loss is held
    (pipeline.losses_in_flight; ``stage_activation_bytes``'s sum, in its order)."""
    held = 0.0
    for count, kept in zip(in_flight, parts.per_chunk, strict=True):
        held += count * kept
    return int(held + parts.working - parts.offloaded) + parts.logits * losses


def chunk_activations(ctx: Context, stage: int, flash: bool | None = None) -> ChunkActivations:
    """``ChunkActivations`` of a training stage (``stage_activation_bytes`` before the schedule's counts). The MTP
    blocks' layers (a chunk's last ``chunk_mtp`` layers) save their tensors at the width of the context they run in
    (compute.mtp_bf16_context: bf16 under nvfp4, which Megatron-LM d98e8a6 multi_token_prediction.py l. 1386-1402
    runs outside the fp4 context), the decoder's at the decoder's."""
    par = ctx.par
    t, sp = par.tp, par.sp
    flash = ctx.work.attention_kernel == "flash" if flash is None else flash
    kinds = [k for k in (False, True) if (ctx.moe_layers(stage) if k else ctx.dense_layers(stage))]
    full = {moe: layer_activations(ctx, moe) for moe in kinds}
    bf16 = mtp_bf16_context(ctx) if ctx.holds_mtp(stage) else None  # None: the MTP layers run as the decoder's
    kept: dict = {}

    def keeps(moe: bool, plan: LayerRecompute, mtp: bool = False) -> float:
        key = (moe, plan, mtp)
        if key not in kept:
            at = bf16 if mtp else ctx
            if "op" in plan.modules:
                kept[key] = torch_op_sac_kept(at)
            elif plan.full:
                kept[key] = _sequence_row(at) if plan.keeps_input else 0.0
            else:
                acts, freed = layer_activations(at, moe), freed_activations(at, moe, plan.modules)
                left = LayerActivations(acts.split - freed.split, acts.replicated - freed.replicated, acts.scores)
                kept[key] = left.per_rank(t, sp, flash or "core_attn" in plan.modules)
        return kept[key]

    # a layer's plan is one object for every layer it is equal for (recompute._chunk_plans repeats it), so it
    # is looked up by identity here, not hashed field by field per layer; each chunk's sum adds its layers'
    # values in their order (the keys, the look-ups and the sum run in C: no Python call per layer)
    by_plan: dict = {}
    per_chunk = []
    for chunk, plans, c, n_mtp in zip(
        ctx.chunk_kinds[stage], chunk_plans(ctx, stage), ctx.chunks[stage], ctx.chunk_mtp[stage], strict=True
    ):
        # (moe, id of its plan, whether an MTP block at its own width) per layer, in order
        marks = (False,) * (len(chunk) - n_mtp) + (bf16 is not None,) * n_mtp if n_mtp else (False,) * len(chunk)
        layers = list(zip(chunk, map(id, plans), marks, strict=True))
        new = set(layers).difference(by_plan)
        if new:
            plan_of = dict(zip(map(id, plans), plans, strict=True))
            for moe, ident, mtp in new:
                by_plan[moe, ident, mtp] = keeps(moe, plan_of[ident], mtp)
        per_chunk.append(sum(map(by_plan.__getitem__, layers)) + mtp_chunk_bytes(ctx, c) + head_chunk_bytes(ctx, c))
    working = working_layers(ctx) * max((full[k].per_rank(t, sp, flash) for k in kinds), default=0.0)
    if mtp_checkpointed(ctx.work) and ctx.holds_mtp(stage):  # the backward rebuilds one MTP module whole
        block = layer_activations(bf16 or ctx, ctx.model.is_moe_layer(ctx.model.num_layers)).per_rank(t, sp, flash)
        working = max(working, block + mtp_module_bytes(ctx))
    return ChunkActivations(tuple(per_chunk), working, offloaded_bytes(ctx, stage), _logits(ctx, stage))


def _sequence_row(ctx: Context) -> float:
    """Bytes of one [s/cp, b, h] activation on a rank: split over tp with sequence parallelism."""
    return ctx.b * ctx.s_cp * ctx.model.hidden_size * ctx.x / (ctx.par.tp if ctx.par.sp else 1)


def holds_final_norm(ctx: Context, chunk) -> bool:
    """Whether ``chunk`` runs the decoder's final norm (Megatron-LM d98e8a6 transformer_block.py
    has_final_layernorm_in_this_stage): without MTP the block that post-processes (the chunk with the loss);
    with MTP layers the block holding the last decoder layer (layer_number == num_layers), wherever the loss is."""
    if ctx.model.mtp_layers and ctx.training:
        return ctx.model.num_layers - 1 in chunk.layers
    return chunk.loss


def head_chunk_bytes(ctx: Context, chunk) -> float:
    """What one micro-batch of ``chunk`` keeps for the decoder's final norm, training only: its input on the
    chunk that runs it (``holds_final_norm``; TE's RMSNorm/LayerNorm saves its input for backward, one
    [s/cp, b, h] row, the sequence shard under SP like the layers' norms), per micro-batch in flight of that
    chunk as a layer's norms are. The output layer's input goes with the logits (``head_input_bytes``)."""
    return _sequence_row(ctx) if ctx.training and holds_final_norm(ctx, chunk) else 0.0


def head_input_bytes(ctx: Context) -> float:
    """The output layer's saved input on the loss's rank, training only, counted with the logits (``_logits``,
    one micro-batch: the two live from the head's forward to its backward, as the MTP heads' inputs do in
    ``mtp_loss_bytes``). Megatron-LM d98e8a6 megatron/core/tensor_parallel/layers.py
    LinearWithGradAccumulationAndAsyncCommunication.forward: ``ctx.save_for_backward(input, weight)`` before the
    sequence-parallel all-gather, so the shard, one [s/cp, b, h] row / tp (the gathered copy lives in the
    global "mpu" buffer and backward gathers again). A flavour that keeps the gathered input for wgrad
    (``sp_wgrad_regather`` False: DTensor's ColwiseParallel output layer gathers, then its matmul saves the
    gathered tensor) keeps the whole row. The output layer runs in bf16 outside the fp8 context (gpt_model.py;
    only the mxfp8 ``fp8_output_proj`` TE head, not modelled, quantizes it)."""
    if not ctx.training:
        return 0.0
    gathered = ctx.par.sp and not ctx.flavour.sp_wgrad_regather
    return _sequence_row(ctx) * (ctx.par.tp if gathered else 1)


def mtp_module_bytes(ctx: Context) -> float:
    """What one MTP module saves for backward besides its transformer layer (Megatron-LM d98e8a6
    multi_token_prediction.py MultiTokenPredictionLayer, one micro-batch, per rank): the inputs of enorm (the
    shifted tokens' embedding), hnorm (the previous depth's hidden states) and final_layernorm (the layer's
    output), one [s, b, h] row each, and eh_proj's [s, b, 2h] input (torch.cat of the two norms' outputs), which
    TE quantizes under an fp8 recipe (the module's _concat_embeddings runs in get_fp8_context; fp4 is ignored
    there: "currently ignoring FP4 in MTP layers"). Norms and eh_proj keep the sequence shard under SP (the
    column-parallel eh_proj re-gathers it for wgrad)."""
    recipe = saved_recipe(ctx)
    lin = recipe.saved_input_bytes if recipe is not None and recipe.gemm_dtype == "fp8" else ctx.x
    row = _sequence_row(ctx)
    return 3 * row + 2 * row * lin / ctx.x


def mtp_chunk_bytes(ctx: Context, chunk) -> float:
    """What one micro-batch of ``chunk`` keeps for the MTP modules beyond their transformer blocks (layers of
    the chunk, counted with the decoder's under the plan recompute.chunk_plans gives them), training only: on
    the chunk holding ``m``, each module's ``mtp_module_bytes``, or under full uniform recompute the
    checkpoint's two saved inputs (hidden_states and decoder_input: tensor_parallel.checkpoint's
    save_for_backward, multi_token_prediction.py _checkpointed_forward). The loss's part is ``mtp_loss_bytes``."""
    n = ctx.model.mtp_layers if ctx.training and chunk.mtp else 0
    if not n:
        return 0.0
    return n * (2 * _sequence_row(ctx) if mtp_checkpointed(ctx.work) else mtp_module_bytes(ctx))


def mtp_loss_bytes(ctx: Context) -> float:
    """What the loss's rank keeps for the MTP losses of one micro-batch (gpt_model.py _postprocess ->
    multi_token_prediction.py process_mtp_loss), counted like the main model's logits (``_logits``, one
    micro-batch): per module the output layer's input (its slice of the concatenated hidden states, bf16:
    the output layer runs outside the fp8 context) and the fp32 softmax the vocab-parallel cross-entropy saves
    (tensor_parallel/cross_entropy.py: logits.float(), exp in place, save_for_backward(exp_logits, ...)),
    4·b·s/cp·V/tp bytes."""
    n = ctx.model.mtp_layers if ctx.training else 0
    if not n:
        return 0.0
    return n * (_sequence_row(ctx) + 4 * ctx.b * ctx.s_cp * loss_vocab(ctx))


def offloaded_bytes(ctx: Context, stage: int) -> float:
    """Activations of one micro-batch that CPU offload moves to host memory (and back): those of the first
    ``cpu_offloading_num_layers`` layers (TransformerEngine get_cpu_offload_context over the model's layers;
    Megatron allows it only with pp 1, where one micro-batch is in flight). No staging buffer is counted."""
    n = ctx.work.cpu_offloading_num_layers if ctx.training else 0
    if not n:
        return 0.0
    t, sp, flash = ctx.par.tp, ctx.par.sp, ctx.work.attention_kernel == "flash"
    layers = ctx.stage_layers[stage][:n]
    per = {k: layer_activations(ctx, k).per_rank(t, sp, flash) for k in {ctx.model.is_moe_layer(i) for i in layers}}
    return sum(per[ctx.model.is_moe_layer(i)] for i in layers)


def stage_activation_key(ctx: Context, stage: int, sched: Schedule) -> tuple:
    """The value key of everything ``stage_activation_bytes`` (default kernel) reads: ``chunk_activation_key``
    and, training, each chunk's micro-batches in flight. The layout search memoises on it."""
    held = in_flight_chunks(sched, stage) if ctx.training else None
    return (*chunk_activation_key(ctx, stage), held)


def activation_tokens(ctx: Context) -> int | tuple[int, int]:
    """What ``chunk_activations`` reads of the micro-batch size b and of cp, training: their tokens per rank
    b·s/cp alone. Every size it adds up is a multiple of ``ctx.b * ctx.s_cp`` computed as that integer first
    (``activation_parts``' tok, ``torch_op_sac_kept``, ``_sequence_row``, ``_logits``' rows, ``mtp_loss_bytes``);
    the s² scores are tok·s with s the workload's whole sequence, and nothing reads b or cp apart (recompute's
    plans read the workload's recompute fields and the chunks' layer counts, offload its layer count). So
    (b, cp) pairs with equal b·(s // cp) keep the same bytes to the bit (tests/planner/test_search_speed.py).
    Inference (the last position's logits read b alone): (b, s/cp)."""
    tokens = ctx.b * ctx.s_cp
    return tokens if ctx.training else (ctx.b, ctx.s_cp)


def chunk_activation_key(ctx: Context, stage: int) -> tuple:
    """The value key of everything ``chunk_activations`` (default kernel) reads: (model, workload (its
    micro-batch size read only through the tokens), ``activation_tokens``, then plain values of the layout and
    the stage alone): the rank's sequences per pass (inference), tp, SP, the traits of the framework it reads
    (whether the head keeps the gathered input, whether TE saves fp8 copies), the kinds (MoE or dense) of each of
    the stage's chunks' layers in order and its head. Not cp nor b apart: layouts whose b·s/cp agree share a
    key. What each layer keeps (recompute.chunk_plans) reads the workload and the chunks' layer counts and
    order, offload the stage's first layers, never their global indices: stages alike (and layouts differing
    in pp or in the schedule) share a key."""
    par = ctx.par
    layers = (ctx.chunk_kinds[stage], ctx.is_last(stage))  # the layers, what each keeps (recompute.py), offload
    mtp = (ctx.chunk_mtp[stage],) if ctx.model.mtp_layers else ()
    head = tuple(holds_final_norm(ctx, c) for c in ctx.chunks[stage])  # head_chunk_bytes, by chunk
    flavour = par.flavour  # head_input_bytes, saved_recipe, loss_vocab
    dims = (par.tp, par.sp, flavour.sp_wgrad_regather, flavour.te_fp8_recipes, flavour.vocab_parallel_loss)
    inference = None if ctx.training else par.dp
    return (ctx.model, ctx.work, activation_tokens(ctx), inference, *dims, *layers, *mtp, head)


def _logits(ctx: Context, stage: int) -> int:
    if not ctx.is_last(stage):
        return 0
    rows = ctx.b * ctx.s_cp if ctx.training else ctx.b  # inference keeps the last position's logits only
    # fp32 logits over the vocabulary the rank's loss runs over (kernels.loss_vocab: V/t vocab-parallel, V gathered)
    return 4 * rows * loss_vocab(ctx) + int(mtp_loss_bytes(ctx) + head_input_bytes(ctx))


# ---- weights, gradients, optimizer ----------------------------------------------------------------------


def _shards(ctx: Context, expert: bool) -> int:
    """Ranks a ZeRO shard spreads over: hybrid_shard_size, or the group the data-parallel rule reduces over
    (Context.dp_ranks: DualPipe's flat buffers over both copies' replicas, 2 x dp x cp)."""
    if ctx.par.hybrid_shard_size:
        return ctx.par.hybrid_shard_size
    return ctx.dp_ranks(expert)


@lru_cache(maxsize=4096)
def param_totals(ctx: Context, stage: int) -> tuple[int, int, int]:
    """(dense, expert, largest ZeRO-3 unit) parameter counts of one rank of ``stage`` (params.py), cached
    on the context and on the parameter lists' own key (params._holding: layouts that differ in dp, cp,
    ZeRO or SP share it): the search asks for the same stages many times."""
    return _param_totals(ctx.model, _holding(ctx.par), stage)


@lru_cache(maxsize=4096)
def _param_totals(model: ModelSpec, par: ParallelSpec, stage: int) -> tuple[int, int, int]:
    dense, expert = stage_params(Context(model, WorkloadSpec(), par), stage)
    return total(dense), total(expert), _largest_unit(dense)


@dataclass(frozen=True)
class HeldBytes:
    """What one rank of a stage holds besides activations and communication buffers: weights, gradients,
    optimizer states (sharded by ZeRO stage) and the fixed buffers (workspace, ZeRO-3 units in flight)."""

    param_count: int
    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    buffers_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes + self.buffers_bytes


def held_bytes(ctx: Context, stage: int) -> HeldBytes:
    """Weights, gradients, optimizer states and fixed buffers of one rank of ``stage`` (module docstring).
    Reads the parameter counts (params.py), the dtypes, the ZeRO stage and the sharding groups; not the
    micro-batch, recompute or sequence parallelism (the layout search shares it across those)."""
    nd, ne, unit = param_totals(ctx, stage)
    xp = ctx.param_bytes
    z = ctx.par.zero_stage if ctx.training else 0
    params = grads = opt = 0.0
    for count, is_expert in ((nd, False), (ne, True)):
        if not count:
            continue
        shards = _shards(ctx, is_expert)
        params += count * xp / (shards if z >= 3 else 1)
        if z >= 3 and ctx.flavour.zero_plus_plus and ctx.par.zero_config.zero_hpz_partition_size > 1:
            # hpZ's secondary partition of every released parameter (DeepSpeed partition_parameters.py
            # _partition_param_sec: aligned numel / zero_hpz_partition_size, kept until the step)
            params += count * xp / ctx.par.zero_config.zero_hpz_partition_size
        if ctx.training:
            grads += count * ctx.grad_bytes / (shards if z >= 2 else 1)
            opt_per = ADAM_STATE_BYTES + (MASTER_BYTES if xp < 4 else 0)
            opt += count * opt_per / (shards if z >= 1 else 1)
    params += recipe_weight_bytes(ctx, stage)  # fp8/fp4 weight copies (workload.fp8_recipe, params.py)
    if ctx.work.param_dtype in WEIGHT_FORMAT_BYTES:
        # a block-scaled checkpoint stores only the linear weights so: the rest (embedding, output layer, norms)
        # in the activation dtype (workload.WEIGHT_FORMAT_BYTES); int() below rounds the product once
        # (MXFP4 only the routed experts' weights: workload.EXPERT_WEIGHT_FORMATS)
        experts_only = ctx.work.param_dtype in EXPERT_WEIGHT_FORMATS
        params += (nd + ne - sum(quantized_numels(ctx, stage, experts_only))) * (ctx.x - xp)
    buffers = WORKSPACE_BYTES
    if z >= 3 and ctx.training:
        buffers += ZERO3_UNITS_IN_FLIGHT * gathered_unit_bytes(ctx, stage, unit)
    return HeldBytes(nd + ne, int(params), int(grads), int(opt), int(buffers))


def stage_memory(
    ctx: Context, stage: int, sched: Schedule, calls: Sequence = (), comm_buffer: int | None = None
) -> StageMemory:
    """One rank of ``stage``; ``calls`` (ledger Calls or PricedCalls) size the communication buffers."""
    held = held_bytes(ctx, stage)
    acts = stage_activation_bytes(ctx, stage, sched)
    if not ctx.training:
        acts += kv_cache_bytes(ctx, stage)
    comm = comm_buffers(calls).get(stage, 0) if comm_buffer is None else comm_buffer
    if acts > MAX_STAGE_BYTES:
        raise SpecError(
            "workload",
            f"stage {stage} would hold {int(acts):,} bytes of activations, over {MAX_STAGE_BYTES:,} (2^57, the most "
            f"a stage is planned with: past it the byte counts overflow 64 bits); {fewer_tokens(ctx.training)}",
        )
    return StageMemory(
        stage,
        held.param_count,
        held.params_bytes,
        held.grads_bytes,
        held.optimizer_bytes,
        int(acts),
        held.buffers_bytes + int(comm),
    )


def fewer_tokens(training: bool) -> str:
    """What shrinks a stage's bytes past MAX_STAGE_BYTES: the tokens of one iteration."""
    if training:
        return "fewer tokens an iteration (global_batch_size x seq_length) or micro-batches in flight"
    return "fewer tokens a pass (batch_size x context_length)"


def gathered_unit_bytes(ctx: Context, stage: int, unit: int) -> int:
    """Bytes of the largest ZeRO-3 unit while gathered: ``unit`` elements at the parameter dtype, or, with torchao's
    FSDP2 float8 all-gather (rules/data.py fsdp_float8_all_gather), its Float8Linear weights at 1 B (the gathered
    float8 data fsdp_post_all_gather wraps as the unsharded weight)."""
    if not float8_gathered(ctx):
        return unit * ctx.param_bytes
    return _largest_unit(stage_params(ctx, stage)[0], lambda p: gathered_param_bytes(ctx, p, False))


def _largest_unit(params, size_of=lambda p: p.numel) -> int:
    """The largest ZeRO-3 unit's size over ``params``: elements, or what ``size_of`` counts of each parameter."""
    units: dict[str, int] = {}
    for p in params:
        units[p.unit] = units.get(p.unit, 0) + size_of(p)
    return max(units.values(), default=0)


def kv_cache_bytes(ctx: Context, stage: int) -> int:
    """The stage's KV cache; when decoding, a sliding-window layer keeps only its last window of keys
    (model.attended_keys; vLLM's sliding-window KV manager frees the blocks that left the window)."""
    per_layer, layers, m = kv_cache_bytes_per_layer(ctx), ctx.stage_layers[stage], ctx.model
    if m.sliding_window is None or ctx.work.phase != "decode":
        return per_layer * len(layers)
    length = ctx.work.context_length or m.seq_length
    return int(sum(per_layer * m.attended_keys(i, length) / length for i in layers))


def comm_buffers(calls: Sequence) -> dict[int, int]:
    """Per stage, the largest communication buffer that is not already counted (TP gathers and CP KV are
    activations, DP gradients live in the gradient buffer): the all-to-all send + receive buffers of EP."""
    largest: dict[int, int] = {}
    for c in calls:
        call = getattr(c, "call", c)
        if call.parallelism == "ep":
            for s in call.stages:
                largest[s] = max(largest.get(s, 0), 2 * call.message_bytes)
    return largest


def memory_per_stage(ctx: Context, sched: Schedule, capacity_bytes: int, calls: Sequence = ()) -> Memory:
    buffers = comm_buffers(calls)
    return Memory(capacity_bytes, tuple(stage_memory(ctx, s, sched, (), buffers.get(s, 0)) for s in range(ctx.par.pp)))


__all__ = [
    "WORKSPACE_BYTES",
    "ChunkActivations",
    "HeldBytes",
    "LayerActivations",
    "Memory",
    "StageMemory",
    "activation_tokens",
    "chunk_activation_key",
    "chunk_activations",
    "comm_buffers",
    "freed_activations",
    "held_activation_bytes",
    "held_bytes",
    "kv_cache_bytes",
    "layer_activations",
    "memory_per_stage",
    "mtp_chunk_bytes",
    "mtp_loss_bytes",
    "mtp_module_bytes",
    "offloaded_bytes",
    "stage_activation_bytes",
    "stage_activation_key",
    "stage_memory",
]
