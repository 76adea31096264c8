"""Traffic of the low-precision recipes (workload.fp8_recipe, planner/recipes.py), Megatron flavour:

- ``fp8.amax`` (delayed scaling only): TransformerEngine all-reduces (MAX) the amaxes of every fp8 tensor of
  an autocast region when the region's forward ends and again when its backward ends
  (transformer_engine/pytorch/quantization.py FP8GlobalStateManager.reduce_and_update_fp8_tensors, one
  fused call per direction). Megatron-Core wraps each model chunk's transformer block in one autocast for
  delayed scaling (transformer_block.py use_outer_fp8_context) with fp8_group = the amax-reduction group,
  TP x CP x DP (megatron/core/fp8_utils.py get_fp8_context, parallel_state.get_amax_reduction_group).
  A TE linear holds 3 forward fp8 tensors (input, weight, output) and 2 backward ones (grad output, grad
  input); a grouped linear (experts) that many per GEMM. Messages: 3·G·4 bytes forward, 2·G·4 backward,
  G = fp8 GEMMs of the chunk. The step time counts it on the pass like a TP call (parallelism "tp":
  it blocks the pass), though its group spans TP x CP x DP. The current-scaling and block recipes scale
  from each tensor's own amax and issue none of these.
- ``dp.fp8_param_amax`` / ``edp.fp8_param_amax`` (fp8_param_gather with the distributed optimizer): the
  optimizer step casts each rank's master shard to the fp8 primary weights after one MAX all-reduce of
  the amaxes over the DP group (TE tensor/utils.py cast_master_weights_to_fp8 / _to_nvfp4; Megatron
  fp8_utils.py quantize_param_shard), Recipe.master_cast_amaxes fp32 values per weight.
- ``fp8.tp_amax`` / ``fp8.tp_amax.bwd`` (current scaling: tensorwise and nvfp4, under sequence parallelism):
  a column-parallel linear's input is gathered over TP before its quantization, so its amax is all-reduced
  (MAX, one fp32) over TP first; a row-parallel linear's output gradient likewise in backward (TE
  module/linear.py _customize_quantizers_float8_current_scaling and _customize_quantizers_nvfp4:
  with_amax_reduction on GEMM1_INPUT for parallel_mode "column", GRAD_OUTPUT1 for "row"). Per layer:
  forward qkv (MLA: q and kv up-projections) and fc1 (the shared expert's in MoE layers), backward proj and
  fc2; the routed experts' grouped linears do not reduce. A full recompute issues the forward ones again,
  and so do the selective modules that hold column-parallel linears (``_rerun_columns``).
The fp8 parameter all-gather itself is in rules/data.py (``dp.params.fp8``).
- MTP modules (training, fp8 recipes only: Megatron-LM d98e8a6 multi_token_prediction.py
  _proj_and_transformer_layer enters get_fp8_context when config.fp8, "currently ignoring FP4 in MTP layers")
  run two autocast regions of their own per module, eh_proj's (_concat_embeddings) and the transformer
  layer's, outside the decoder's: under delayed scaling each region's exit and its backward reduce its amaxes
  (``fp8.amax.mtp.eh_proj``: 3 and 2 fp32, one linear; ``fp8.amax.mtp``: the block's 3·G and 2·G); under
  current scaling with SP eh_proj is one more column-parallel linear reducing its input amax over TP. Under
  nvfp4 neither the MTP block nor eh_proj quantizes: none of their calls, first run or re-run (whole or by
  selective modules; ``_quantized_layer`` is the one cut-off).
"""

from __future__ import annotations

from dataclasses import replace

from collectives import Op

from ..context import Context
from ..layout import Group
from ..ledger import Call, recomputed, stage_classes
from ..params import stage_params
from ..recipes import quantized
from ..recompute import chunk_plans, mtp_checkpointed, rerun_layers

TE = "TransformerEngine 2.x transformer_engine/pytorch/"
AMAX_SOURCE = (
    TE + "quantization.py reduce_and_update_fp8_tensors; Megatron-Core transformer_block.py outer fp8 autocast "
    "(delayed), fp8_utils.py get_fp8_context (amax-reduction group tp x cp x dp)"
)
CAST_SOURCE = TE + "tensor/utils.py cast_master_weights_to_fp8 (MAX all-reduce of packed amaxes over the DP group)"
TP_AMAX_SOURCE = TE + "module/linear.py _customize_quantizers_float8_current_scaling / _nvfp4 (amax_reduction_group tp)"
FORWARD_TENSORS, BACKWARD_TENSORS = 3, 2  # TE Linear num_fp8_tensors: fwd input/weight/output, bwd 2
AMAX_BYTES = 4


def calls(ctx: Context) -> list[Call]:
    recipe = ctx.work.recipe
    # TransformerEngine's FP8/FP4 recipes and their amax reductions: a trait of the flavour (planner/flavours/)
    if recipe is None or not ctx.flavour.te_fp8_recipes:
        return []
    out = _amax(ctx) if recipe.amax_history else []
    if recipe.tp_amax and ctx.par.sp:
        out += _tp_amax(ctx)
    if ctx.work.fp8_param_gather and ctx.training and ctx.par.zero_stage == 1:
        out += _master_cast(ctx)
    return out


def gemms(ctx: Context, layer: int) -> int:
    """fp8 GEMMs of one layer on one rank: the attention linears (Megatron fused qkv + proj, or MLA's five),
    and the MLP's two, or per local expert two plus the shared expert's two."""
    m = ctx.model
    attn = sum(1 for name, _, _ in m.mla.projections(1, 1) if "norm" not in name) if m.mla else 2
    if not m.is_moe_layer(layer):
        return attn + 2
    return attn + 2 * (m.moe.num_experts // ctx.par.ep) + (2 if m.moe.shared_ffn else 0)


def chunk_gemms(ctx: Context, stage: int) -> tuple[int, ...]:
    """fp8 GEMMs of each model chunk of one rank (its decoder layers split into chunks_per_rank equal runs,
    Context.stage_layers' interleaved order; the MTP block is not in the chunk's autocast)."""
    layers = [i for i in ctx.stage_layers[stage] if i < ctx.model.num_layers]
    v = ctx.par.chunks_per_rank
    size = len(layers) // v
    return tuple(sum(gemms(ctx, i) for i in layers[c * size : (c + 1) * size]) for c in range(v))


def mtp_quantized(ctx: Context) -> bool:
    """Whether the MTP modules' linears run the recipe (module docstring): training, MTP layers, an fp8 recipe."""
    recipe = ctx.work.recipe
    return bool(ctx.training and ctx.model.mtp_layers and recipe is not None and recipe.gemm_dtype == "fp8")


def _quantized_layer(ctx: Context, layer: int) -> bool:
    """Whether a layer's linears run the recipe: every decoder layer; an MTP block (layers num_layers and
    after) only under an fp8 recipe (mtp_quantized; nvfp4: the MTP block stays bf16). The one home of the
    cut-off the TP amax counts read, first run and re-run alike."""
    return layer < ctx.model.num_layers or mtp_quantized(ctx)


def _amax(ctx: Context) -> list[Call]:
    par = ctx.par
    if par.tp * par.cp * par.dp == 1:
        return []
    out = []
    phases = [("forward", FORWARD_TENSORS)] + ([("backward", BACKWARD_TENSORS)] if ctx.training else [])

    def call(name: str, phase: str, message: int, count: int, source: str = AMAX_SOURCE) -> Call:
        return Call(
            name=f"{name}{'' if phase == 'forward' else '.bwd'}",
            op=Op.ALLREDUCE,
            phase=phase,
            message_bytes=message,
            calls_per_iteration=count * ctx.passes,
            group=Group(("tp", "cp", "dp")),
            source=source,
            dtype="fp32",
            parallelism="tp",  # blocking, once per pass: on the pass's stream like a TP call
        )

    for first, stages in stage_classes(range(par.pp), lambda s: chunk_gemms(ctx, s)).items():
        chunks = chunk_gemms(ctx, first)
        for g in sorted(set(chunks)):
            for phase, tensors in phases:
                out.append(call("fp8.amax", phase, tensors * g * AMAX_BYTES, chunks.count(g)).on(stages))
    if mtp_quantized(ctx):  # each module's two regions (module docstring), on the rank holding ``m``
        n, block = ctx.model.mtp_layers, gemms(ctx, ctx.model.num_layers)
        src = AMAX_SOURCE + "; multi_token_prediction.py _proj_and_transformer_layer (its own fp8 contexts)"
        held = tuple(s for s in range(par.pp) if ctx.holds_mtp(s))
        for phase, tensors in phases:
            out.append(call("fp8.amax.mtp.eh_proj", phase, tensors * AMAX_BYTES, n, src).on(held))
            out.append(call("fp8.amax.mtp", phase, tensors * block * AMAX_BYTES, n, src).on(held))
    return out


def tp_amax_linears(ctx: Context, layer: int) -> tuple[int, int]:
    """(column-parallel, row-parallel) TE linears of one layer whose quantizers reduce over TP under SP."""
    m = ctx.model
    column, row = (2 if m.mla else 1), 1  # qkv (MLA: q and kv up-projections); proj
    if not m.is_moe_layer(layer) or m.moe.shared_ffn:
        column, row = column + 1, row + 1  # fc1 and fc2 of the dense MLP or of the shared expert
    return column, row


def _tp_amax(ctx: Context) -> list[Call]:
    out = []
    mtp = mtp_quantized(ctx)
    counts = {
        s: [tp_amax_linears(ctx, i) for i in ctx.stage_layers[s] if _quantized_layer(ctx, i)] for s in range(ctx.par.pp)
    }
    eh_proj = {s: ctx.model.mtp_layers if mtp and ctx.holds_mtp(s) else 0 for s in range(ctx.par.pp)}
    totals = {
        s: (sum(c for c, _ in v) + eh_proj[s], sum(r for _, r in v), _rerun_columns(ctx, s)) for s, v in counts.items()
    }
    for first, stages in stage_classes(range(ctx.par.pp), totals.get).items():
        column, row, again = totals[first]
        wanted = [("fp8.tp_amax", "forward", column)]
        if ctx.training:
            wanted.append(("fp8.tp_amax.bwd", "backward", row))
        for name, phase, linears in wanted:
            call = Call(
                name=name,
                op=Op.ALLREDUCE,
                phase=phase,
                message_bytes=AMAX_BYTES,
                calls_per_iteration=linears * ctx.passes,
                group=Group(("tp",)),
                source=TP_AMAX_SOURCE,
                dtype="fp32",
                parallelism="tp",
            )
            out.append(call.on(stages))
            if phase == "forward" and again:
                out.append(replace(recomputed(call), calls_per_iteration=again * ctx.passes).on(stages))
    return out


def _rerun_columns(ctx: Context, stage: int) -> int:
    """The forward amax reductions that re-run layers and modules issue again: each layer's plan, chunk by
    chunk (recompute.chunk_plans: every layer with uniform recompute, the first recompute_num_layers of each
    chunk with block). Selective modules re-run their own column-parallel linears under te_checkpoint
    (Megatron-LM d98e8a6 transformer_layer.py / moe_layer.py with fp8; recompute.rerun_layers): ``mlp`` a
    dense layer's fc1, ``moe`` and ``shared_experts`` the shared expert's fc1 (twice with both: nested),
    ``mla_up_proj`` MLA's q and kv up-projections (multi_latent_attention.py qkv_up_checkpoint)."""
    if not ctx.training:
        return 0
    mtp = mtp_quantized(ctx)
    again = rerun_layers(ctx, stage, "all" if mtp else "decoder")  # nvfp4: the MTP blocks re-run in bf16
    m = ctx.model
    shared = again.shared_experts if m.moe and m.moe.shared_ffn else 0
    modules = again.mlp + shared
    modules += 2 * again.up_proj  # MLA's q and kv up-projections (recompute.rerun_layers)
    if mtp and mtp_checkpointed(ctx.work) and ctx.holds_mtp(stage):
        modules += m.mtp_layers  # each module's checkpoint re-runs eh_proj (recompute.MTP_UNIFORM)
    if not again.whole:
        return modules
    plans = (
        zip(chunk.layers, plans, strict=True)
        for chunk, plans in zip(ctx.chunks[stage], chunk_plans(ctx, stage), strict=True)
    )
    rerun = (i for pairs in plans for i, plan in pairs if plan.full and _quantized_layer(ctx, i))
    return modules + sum(tp_amax_linears(ctx, i)[0] for i in rerun)


def _master_cast(ctx: Context) -> list[Call]:
    recipe, par = ctx.work.recipe, ctx.par
    out = []
    for stage in range(par.pp):
        dense, expert = stage_params(ctx, stage)
        for kind, params, group, size in (
            ("dp", dense, Group(("cp", "dp")), par.dp * par.cp),
            ("edp", expert, Group(("dp",), expert=True), par.expert_dp),
        ):
            amaxes = sum(recipe.master_cast_amaxes(p.numel) for p in params if quantized(p.name))
            if not amaxes or size == 1:
                continue
            out.append(
                Call(
                    name=f"{kind}.fp8_param_amax",
                    op=Op.ALLREDUCE,
                    phase="optimizer",
                    message_bytes=amaxes * AMAX_BYTES,
                    calls_per_iteration=1,
                    group=group,
                    source=CAST_SOURCE + f" ({recipe.name})",
                    dtype="fp32",
                    parallelism=kind,
                ).on((stage,))
            )
    return out
