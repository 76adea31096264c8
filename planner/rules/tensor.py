"""Tensor parallelism (and sequence parallelism) traffic.

Megatron (Shoeybi et al. 2019, SC'21 §3; megatron/core/tensor_parallel/mappings.py, layers.py): every
transformer block is a column-parallel linear followed by a row-parallel one (attention: fused QKV then the
output projection; MLP: fused fc1 then fc2). Without sequence parallelism each row-parallel output is
all-reduced in forward and each column-parallel input gradient in backward: 4 all-reduces of
A = b·s/c·h·x per layer and micro-batch, 8·b·s·h·(t-1)/t elements sent per rank with a ring.
With sequence parallelism (Korthikanti et al. 2022 §4.2.2) the all-reduces become all-gather before each
column-parallel linear and reduce-scatter after each row-parallel one; backward has the conjugates (a
reduce-scatter per column-parallel input, an all-gather per row-parallel output) plus an all-gather that
re-gathers the column-parallel input for the weight gradient
(LinearWithGradAccumulationAndAsyncCommunication.backward): 2 AG + 2 RS forward, 4 AG + 2 RS backward.

PyTorch DTensor (torch.distributed.tensor.parallel; the Megatron-style plan of torchtitan): q, k, v and
gate, up are separate colwise linears, so backward all-reduces each input gradient separately (5 per
block); with sequence parallelism no input re-gather happens in backward, the vocabulary-parallel
cross-entropy is not used (the LM head gathers the logits), and norm weights keep partial gradients that
the optimizer all-reduces as it reads them (3 reads per weight in AdamW: reference/pytorch/tp2_sp.json) —
unless FSDP2 shards the DTensor parameters on top, whose post-backward reduces them (_norm_grads).

Multi-head latent attention (Megatron-LM d98e8a6 multi_latent_attention.py; ``_attention_inputs``): the two
down-projections are duplicated on every TP rank (TELinear parallel_mode "duplicated") and read the
sequence-parallel shard, so the attention's column-parallel inputs are the latents: with sequence
parallelism the q and kv up-projections each all-gather theirs (b·s·q_lora_rank and b·s·kv_lora_rank
elements; without q compression linear_q_proj gathers the hidden states) and the decoupled RoPE key is
all-gathered on its own (``gather_from_sequence_parallel_region(k_pos_emb)``, b·s·qk_rope_head_dim), each
with its reduce-scatter conjugate in backward and the two linears' wgrad re-gathers. Without sequence
parallelism the two up-projections all-reduce their input gradients (and the RoPE key's partial gradient is
reduced by nothing: Megatron issues no call for it).
"""

from __future__ import annotations

from dataclasses import replace

from collectives import Op

from .._errors import SpecError
from ..compute import mtp_bf16_context, per_op_sac_shares
from ..context import Context
from ..kernels import memo_by, mtp_runs_bf16, rerun_stops_at_last_save, vocab_parallel_loss
from ..layout import Group
from ..ledger import Call, recomputed, rule_call, stage_classes
from ..recompute import Reruns, layer_counts, mtp_checkpointed, rerun_layers
from .engine_gather import TP_SUMMED, WORKER_REDUCED

TP = Group(("tp",))
M = "Megatron-LM d98e8a6 "
FSDP2_TP = "torch/distributed/fsdp/_fully_shard/_fsdp_param.py _get_grad_inner_tensor (Partial -> Replicate)"
VLLM = "vllm LogitsProcessor._gather_logits; vocab_parallel_embedding.py pads to 64"
VLLM_VOCAB_PADDING = 64  # vllm/model_executor/layers/vocab_parallel_embedding.py DEFAULT_VOCAB_PADDING_SIZE


def calls(ctx: Context) -> list[Call]:
    if ctx.par.tp == 1:
        return []
    out: list[Call] = []
    alike = stage_classes(
        range(ctx.par.pp),
        lambda stage: (_block_counts(ctx, stage), rerun_layers(ctx, stage), _mtp_bf16(ctx, stage) is not None),
    )
    for stage in range(ctx.par.pp):
        if stage in alike:  # the blocks depend on the stage's block counts alone
            out += [c.on(alike[stage]) for c in _blocks(ctx, stage)]
        if ctx.is_first(stage):
            out += [c.at(stage) for c in _embedding(ctx)]
        if ctx.is_last(stage):
            out += [c.at(stage) for c in _head(ctx) + _mtp(ctx, _head)]
        if ctx.holds_mtp(stage):
            out += [c.at(stage) for c in _mtp(ctx, _embedding) + _eh_proj(ctx)]
        if ctx.training:
            out += [c.at(stage) for c in _data_broadcast(ctx, stage) + _norm_grads(ctx, stage)]
    return out


def _mb(
    ctx: Context, *, name: str, op: Op, phase: str, count: int, source: str, message: int | None = None,
    dtype: str | None = None,
) -> Call:  # fmt: skip
    """A TP call issued ``count`` times per pass over the rank's chunks (Context.passes: a micro-batch, DualPipe's one
    each way); the message defaults to the TP unit A, in the hidden
    states' dtype (Context.hidden_dtype: bf16 under an fp8 recipe, whose GEMM outputs and gradients are bf16)."""
    message = ctx.activation if message is None else message
    return rule_call(
        name=name, op=op, phase=phase, message=message, count=count * ctx.passes, group=TP, source=source,
        dtype=dtype or ctx.hidden_dtype,
    )  # fmt: skip


def _gemm_input(ctx: Context, per_token: int, *, grad_output: bool = False, mtp: bool = False) -> dict:
    """The message and dtype of an all-gather of a TE linear's GEMM operand (a column-parallel input, its wgrad
    re-gather, a row-parallel grad output) at ``per_token`` elements a token: quantized under a recipe
    (Context.gemm_input), the hidden states' width otherwise. ``mtp``: a linear of an MTP module, which runs
    bf16 under a recipe it does not enter (kernels.mtp_runs_bf16: nvfp4, "currently ignoring FP4 in MTP
    layers"), so gathers at the hidden states' width there."""
    elements = ctx.b * ctx.s_cp * per_token
    if mtp and mtp_runs_bf16(ctx):
        return {"message": elements * ctx.hidden_bytes, "dtype": ctx.hidden_dtype}
    message, dtype = ctx.gemm_input(elements, grad_output=grad_output, width=per_token)
    return {"message": message, "dtype": dtype}


def _layer_kinds(ctx: Context, stage: int, layers: str) -> tuple[int | None, int | None]:
    """(dense, MoE) layers of ``stage`` in the set ``layers`` ("all": None, None, the stage's; "decoder" or "mtp":
    recompute.layer_counts' split, the one home of which layers are MTP blocks)."""
    if layers == "all":
        return None, None
    counts = layer_counts(ctx, stage, layers)
    moe = sum(n for (is_moe, _), n in counts.items() if is_moe)
    return sum(counts.values()) - moe, moe


def _block_counts(ctx: Context, stage: int, dense: int | None = None, moe: int | None = None) -> tuple[int, int]:
    """(attention blocks, tensor-parallel MLP blocks) of ``dense`` and ``moe`` layers (default: the
    stage's). An MoE layer's routed experts move tokens by all-to-all (rules/expert.py); only its shared
    experts form a TP MLP, or a serving engine's MoE whose output its exchange leaves partial over TP
    (engine_gather.TP_SUMMED: one all-reduce of the layer's output, shared experts included)."""
    dense = ctx.dense_layers(stage) if dense is None else dense
    moe = ctx.moe_layers(stage) if moe is None else moe
    summed = ctx.par.ep_dispatch in TP_SUMMED
    # the engines' worker-wide reduce-scatter sums the shared experts with the routed ones (WORKER_REDUCED)
    reduced = ctx.par.ep_dispatch in WORKER_REDUCED and ctx.par.dp > 1
    shared = moe if ctx.model.moe and (ctx.model.moe.shared_ffn or summed) and not reduced else 0
    return dense + moe, dense + shared


def _mtp_bf16(ctx: Context, stage: int) -> Context | None:
    """The context ``stage``'s MTP blocks run in when it is not the decoder's (compute.mtp_bf16_context: under
    nvfp4 the MTP modules stay bf16, Megatron-LM d98e8a6 multi_token_prediction.py
    MultiTokenPredictionLayer._proj_and_transformer_layer enters ``get_fp8_context`` only ``if self.config.fp8``:
    "TODO: currently ignoring FP4 in MTP layers"), else None."""
    return mtp_bf16_context(ctx) if ctx.training and ctx.holds_mtp(stage) else None


def _blocks(ctx: Context, stage: int) -> list[Call]:
    """The transformer blocks' TP calls of ``stage``. Where its MTP blocks run bf16 under the decoder's recipe
    (_mtp_bf16), the decoder's layers and the MTP blocks are counted apart, each in its own context, so the MTP
    blocks' quantized gathers (Context.gemm_input) carry the hidden states' width; calls alike in both join."""
    bf16 = _mtp_bf16(ctx, stage)
    if bf16 is None:
        return _layer_calls(ctx, stage)
    return _joined(_layer_calls(ctx, stage, "decoder"), _layer_calls(bf16, stage, "mtp"))


MTP_BLOCK = f"; the MTP block runs bf16 ({M}multi_token_prediction.py _proj_and_transformer_layer: no fp4 context)"


def _joined(decoder: list[Call], mtp: list[Call]) -> list[Call]:
    """The decoder's block calls with the MTP blocks': a call the MTP blocks issue alike (name, bytes, dtype) adds
    its count to the decoder's row; one that differs (a gather in bf16 where the decoder's is quantized) is its own
    row, named tp.mtp.* as the module's other calls."""
    out = list(decoder)
    at = {(c.name, c.message_bytes, c.dtype): i for i, c in enumerate(out)}
    for c in mtp:
        i = at.get((c.name, c.message_bytes, c.dtype))
        if i is None:
            out.append(replace(c, name="tp.mtp." + c.name.removeprefix("tp."), source=c.source + MTP_BLOCK))
        else:
            out[i] = replace(out[i], calls_per_iteration=out[i].calls_per_iteration + c.calls_per_iteration)
    return out


def _layer_calls(ctx: Context, stage: int, layers: str = "all") -> list[Call]:
    """The TP calls of ``stage``'s transformer layers in the set ``layers`` (recompute.LAYER_SETS)."""
    attn, mlp = _block_counts(ctx, stage, *_layer_kinds(ctx, stage, layers))
    out = _forward(ctx, attn, mlp)
    if ctx.training:
        out += _backward(ctx, attn, mlp)
        again = rerun_layers(ctx, stage, layers)  # the layers re-run whole re-issue their forward calls (recompute.py)
        if again.whole:
            out += [recomputed(c) for c in _whole_reruns(ctx, stage, again)]
        out += _rerun_mlps(ctx, again) + _rerun_up_proj(ctx, again) + _rerun_per_op(ctx, again)
    return out


def _whole_reruns(ctx: Context, stage: int, again: Reruns) -> list[Call]:
    """The forward calls the fully re-run layers issue again: all of them, or, where the re-run stops at what the
    backward needs (kernels.rerun_stops_at_last_save, full_rerun), all but the dense
    layers' output linear's collective (the MLP's reduce-scatter, or all-reduce without SP, is the last call of
    _forward): the backward needs nothing of the layer's output."""
    calls = _forward(ctx, *_block_counts(ctx, stage, again.dense, again.moe))
    if not (rerun_stops_at_last_save(ctx) and again.dense):
        return calls
    last = _forward(ctx, *_block_counts(ctx, stage, 0, again.moe))[-1]  # only the MoE layers' shared experts'
    return [last if c.name == last.name else c for c in calls]


def _rerun_per_op(ctx: Context, again: Reruns) -> list[Call]:
    """torchtitan's per-op SAC re-runs the collectives its policy does not save (recompute.rerun_layers): a
    dense block's forward calls but the reduce-scatters, i.e. the two all-gathers with sequence parallelism,
    the two rowwise all-reduces without it."""
    if not again.per_op:
        return []
    what = "torchtitan per-op SAC (activation_checkpoint.py SelectiveAC: all_gather / all_reduce not saved)"
    return [recomputed(c, what) for c in _forward(ctx, again.per_op, again.per_op) if c.op != Op.REDUCESCATTER]


def _attention_inputs(ctx: Context) -> tuple[tuple[str, int, bool], ...]:
    """(name, elements per token, a column-parallel linear's input) of the tensors the attention block
    gathers under sequence parallelism: the fused QKV's input (h), or MLA's latents and RoPE key (module
    docstring; multi_latent_attention.py get_query_key_value_tensors)."""
    m = ctx.model
    if not m.mla:
        return (("qkv", m.hidden_size, True),)
    q = ("q_up", m.mla.q_lora_rank, True) if m.mla.q_lora_rank else ("q_proj", m.hidden_size, True)
    return q, ("kv_up", m.mla.kv_lora_rank, True), ("k_pos_emb", m.mla.qk_rope_head_dim, False)


def summed_dgrad_names(ctx: Context) -> tuple[str, ...]:
    """The backward TP rows (ledger names) whose column-parallel input gradient sums several linears' matmuls:
    the attention input's with q, k and v as their own modules and the gated MLP's up_proj (gate and up), where
    the flavour does not fuse them (fl.fused_column_dgrad False; _backward counts them so). MLA's inputs are one
    linear each, a fused QKV or fc1, or a non-gated fc1, one matmul: none. What an async-TP pass that fuses only
    "reduce_scatter_tensor(A @ B)" leaves unfused (step._async_tp_unfused)."""
    if ctx.flavour.fused_column_dgrad:
        return ()
    attn = () if ctx.model.mla else tuple(f"tp.attn.{n}.dgrad" for n, _, linear in _attention_inputs(ctx) if linear)
    return attn + (("tp.mlp.up_proj.dgrad",) if ctx.model.gated_mlp else ())


def async_tp_fused_names(ctx: Context) -> frozenset[str]:
    """``_async_tp_fused_names`` memoised by value (_by_layout)."""
    return _by_layout(_FUSED_NAMES, _async_tp_fused_names, ctx)


def _async_tp_fused_names(ctx: Context) -> frozenset[str]:
    """The TP rows (ledger names) of a transformer block that torch's async-TP pass fuses with their matmul
    (torch/_inductor/fx_passes/micro_pipeline_tp.py: all_gather -> mm, including funcol's chunk/cat of a
    gather_dim != 0, and reduce_scatter_tensor(A @ B)): every sequence-parallel gather and reduce-scatter of the
    block, its forward's re-issues under recompute (the re-gathered input feeds the re-run matmul), but the summed
    input gradients' reduce-scatters (summed_dgrad_names). The embedding and the head sit outside torchtitan's
    compiled blocks (parallelize_llama.py apply_compile wraps each TransformerBlock): not fused."""
    if not ctx.par.sp:
        return frozenset()
    forward = [c for c in _forward(ctx, 1, 1) if c.op in (Op.ALLGATHER, Op.REDUCESCATTER)]
    names = {c.name for c in forward} | {recomputed(c).name for c in forward}
    return frozenset(names | {c.name for c in _backward(ctx, 1, 1)}) - set(summed_dgrad_names(ctx))


# the GEMM (a layer kernel's name, kernels.py) each fused TP row of a dense block runs with under torch's async TP:
# the column-parallel inputs' gathers feed qkv and fc1, the row-parallel outputs' reduce-scatters take attn_out's
# and fc2's, the grad outputs' gathers feed their data gradients; a single-matmul input gradient (a non-gated fc1)
# reduce-scatters fc1's. A re-issued gather or reduce-scatter runs with the re-run GEMM (async_tp_fused_gemms)
ASYNC_TP_FUSED_GEMMS = {
    "tp.attn.qkv": "qkv",
    "tp.mlp.up_proj": "fc1",
    "tp.attn.out_proj": "attn_out",
    "tp.mlp.down_proj": "fc2",
    "tp.attn.out_proj.dgrad": "attn_out.dgrad",
    "tp.mlp.down_proj.dgrad": "fc2.dgrad",
    "tp.attn.qkv.dgrad": "qkv.dgrad",
    "tp.mlp.up_proj.dgrad": "fc1.dgrad",
}


def async_tp_fused_gemms(ctx: Context) -> dict[str, tuple[str, float]]:
    """``_async_tp_fused_gemms`` memoised by value (_by_layout)."""
    return _by_layout(_FUSED_GEMMS, _async_tp_fused_gemms, ctx)


def _by_layout(memo: dict, fn, ctx: Context):
    """``fn(ctx)`` memoised on what the TP rules read of the context (the model, workload and layout; bounded:
    cleared past 256 entries): the step asks for the async-TP rows of every plan and searched layout."""
    return memo_by(memo, (ctx.model, ctx.work, ctx.par), 256, fn, ctx)


_FUSED_GEMMS: dict = {}
_FUSED_NAMES: dict = {}


def _async_tp_fused_gemms(ctx: Context) -> dict[str, tuple[str, float]]:
    """Each fused TP row of a dense non-MLA block (async_tp_fused_names) -> (the GEMM it runs with, the share of
    that GEMM the fused op computes): 1, but for re-issues under torchtitan's per-op SAC, which re-runs k alone of
    q, k, v (its kv_heads x head_dim of the fused qkv's width) and w3 alone of the gated w1, w3 (half of fc1)
    (compute.per_op_sac_shares). {} for MLA or MoE models (no mapping read)."""
    m = ctx.model
    if m.mla or m.moe:
        return {}
    fused = async_tp_fused_names(ctx)
    out = {name: (gemm, 1.0) for name, gemm in ASYNC_TP_FUSED_GEMMS.items() if name in fused}
    per_op = ctx.work.selective_ac_option == "op" and ctx.work.activation_recompute == "selective"
    part = per_op_sac_shares(ctx) if per_op else {}
    shares = {"tp.attn.qkv": part["qkv"], "tp.mlp.up_proj": part["fc1"]} if per_op else {}
    for c in _forward(ctx, 1, 1):
        again = recomputed(c).name
        if again in fused and c.name in out:
            out[again] = (out[c.name][0], shares.get(c.name, 1.0))
    return out


def async_tp_wgrad_reads(ctx: Context) -> dict[str, str]:
    """``_async_tp_wgrad_reads`` memoised by value (_by_layout)."""
    return _by_layout(_WGRAD_READS, _async_tp_wgrad_reads, ctx)


_WGRAD_READS: dict = {}


def _async_tp_wgrad_reads(ctx: Context) -> dict[str, str]:
    """Each fused all-gather of a dense non-MLA block whose gathered tensor a weight gradient reads again -> that
    weight gradient's GEMM (a layer kernel's name): the column-parallel inputs' gathers (tp.attn.qkv, tp.mlp.up_proj:
    qkv.wgrad, fc1.wgrad) and the grad outputs' gathers (tp.attn.out_proj.dgrad, tp.mlp.down_proj.dgrad:
    attn_out.wgrad, fc2.wgrad). Inductor's pass replaces every use of the gathered result with the fused op's A
    (torch/_inductor/fx_passes/micro_pipeline_tp.py fuse_all_gather_matmul: ``all_gather.replace_with(new_ag_node)``;
    return_A stays True while a use is left), and the weight gradient's matmul is not among the fused ones (those
    take the reshaped tensor itself as their left operand: dW = dY^T @ X reads X as its right one, a grad output
    through a transpose). One read a gather of the forward, whether its A is saved or gathered again
    by a re-run (the re-issue, ``.recompute``, is not listed: it stands for the same tensor). {} where no GEMM is
    mapped (async_tp_fused_gemms: MoE, MLA)."""
    gathers = {c.name for c in (*_forward(ctx, 1, 1), *_backward(ctx, 1, 1)) if c.op == Op.ALLGATHER}
    fused = async_tp_fused_gemms(ctx)
    return {name: gemm.removesuffix(".dgrad") + ".wgrad" for name, (gemm, _) in fused.items() if name in gathers}


# TransformerEngine's userbuffers under Megatron --tp-comm-overlap (Flavour.userbuffers): the TE linears built with
# one of these buffer names overlap their sequence-parallel all-gather / reduce-scatter with their GEMM (Megatron-LM
# d98e8a6 extensions/transformer_engine.py TELinear: ub_overlap_ag / ub_overlap_rs; TELayerNormColumnParallelLinear:
# ub_bulk_dgrad re-gathers the input behind the dgrad GEMM, ub_overlap_rs_dgrad). A TELinear named otherwise (MLA's
# q_down_proj, q_up_proj, kv_up_proj; MTP's mtp_eh_proj) sets ``self.config.tp_comm_overlap = False`` with "The user
# buffer name ... is not supported in Transformer Engine. Disabling TP communication overlap for this layer." on the
# TransformerConfig every module shares, so every TE linear built after it runs NCCL: under MLA all the decoder's TP
# (the first layer's linear_proj, built before, the one exception: not counted); with MTP the MTP blocks' inner
# layers, built after their eh_proj (userbuffers_decoder_share). The embedding's reduce-scatter and
# the output layer's gathers are Megatron's own mappings, never userbuffers.
USERBUFFERS_NAMES = ("qkv", "proj", "fc1", "fc2")
USERBUFFERS_ROWS = ("tp.attn.qkv", "tp.attn.out_proj", "tp.mlp.up_proj", "tp.mlp.down_proj")
# TE d0067d0da module/base.py fill_userbuffers_buffer_for_all_gather: userbuffers gather bf16, Float8 (delayed,
# current scaling) and MXFP8 data; an MXFP8 shard needs rows (the product of its leading dims) divisible by 128,
# and any other quantizer (Float8BlockQuantizer, NVFP4Quantizer) raises "Unsupported quantizer for Userbuffers"
USERBUFFERS_MXFP8_ROWS = 128
# the rows userbuffers_rows gives, built once: forward, .dgrad and .wgrad_gather, each also re-issued under recompute
_USERBUFFERS_CARRIED = frozenset(
    r + end + again for r in USERBUFFERS_ROWS for end in ("", ".dgrad", ".wgrad_gather") for again in ("", ".recompute")
)


def userbuffers_rows(ctx: Context) -> frozenset[str]:
    """The TP ledger rows Megatron's --tp-comm-overlap carries on TE userbuffers (USERBUFFERS_ROWS: forward, their
    ``.dgrad`` and ``.wgrad_gather`` conjugates, their re-issues under recompute); every other TP row stays on NCCL
    and is not overlapped (step.py _userbuffers_fallback). None under MLA: its first non-listed linear switches the
    shared config's overlap off (USERBUFFERS_NAMES)."""
    return frozenset() if ctx.model.mla else _USERBUFFERS_CARRIED


def userbuffers_decoder_share(ctx: Context, stage: int) -> dict[str, float]:
    """Per row userbuffers carry (userbuffers_rows) that ``stage``'s MTP blocks join (_joined: the same call alike),
    the share of its calls the decoder's layers issue; the MTP blocks' share runs NCCL. Megatron-LM d98e8a6
    multi_token_prediction.py MultiTokenPredictionLayer builds its eh_proj (tp_comm_buffer_name "mtp_eh_proj") before
    its inner transformer layer (mtp_model_layer), and that name switches the shared config's tp_comm_overlap off
    (USERBUFFERS_NAMES), so the inner layer's qkv, proj, fc1 and fc2 are built without a ub_name; the decoder's,
    built before it (gpt_model.py: self.decoder, then self.mtp, both on self.config), keep theirs. {} where the stage
    holds no MTP block (every carried row the decoder's)."""
    if not (ctx.training and ctx.holds_mtp(stage)):
        return {}
    carried = userbuffers_rows(ctx)
    decoder: dict[tuple, float] = {}
    for c in _layer_calls(ctx, stage, "decoder"):
        key = (c.name, c.message_bytes, c.dtype)
        decoder[key] = decoder.get(key, 0) + c.calls_per_iteration
    out = {}
    for c in _layer_calls(_mtp_bf16(ctx, stage) or ctx, stage, "mtp"):
        own = decoder.get((c.name, c.message_bytes, c.dtype))
        if own is not None and c.name in carried and own + c.calls_per_iteration > 0:  # tp 1: rows of no call
            out[c.name] = own / (own + c.calls_per_iteration)
    return out


def check_userbuffers(ctx: Context) -> None:
    """Under Megatron --tp-comm-overlap, tp > 1 without sequence parallelism is a 422 (Megatron asserts), and so is a
    quantized gather TE's userbuffers cannot take (TE raises at the first forward; USERBUFFERS_MXFP8_ROWS): a block
    recipe other than MXFP8, or an MXFP8 shard whose rows b·s/(cp·tp) are not a multiple of 128. MLA models are
    exempt from the latter: their overlap is off (userbuffers_rows)."""
    field = "options.overlap.tp_comm_overlap"
    if ctx.par.tp == 1 or not ctx.par.sp:
        # Megatron-LM d98e8a64dd megatron/training/arguments.py validate_args: l. 1430-1439 set args.sequence_parallel
        # = False whenever tp == 1 ("Disabling sequence parallelism because tensor model parallelism is disabled"),
        # then l. 1441-1442 assert it under --tp-comm-overlap, so at tp 1 the assert fires whatever SP was asked
        # (review r14d #6; at core_r0.8.0 baf94af3c6 the assert, l. 199-200, came before the tp 1 reset, l. 469).
        # Userbuffers overlap the sequence-parallel all-gather and reduce-scatter, and there are none without SP
        got = "tp 1, where Megatron turns it off first" if ctx.par.tp == 1 else f"false at tp {ctx.par.tp}"
        raise SpecError(
            field,
            f"Megatron's --tp-comm-overlap needs parallel.sequence_parallel, got {got} (Megatron-LM d98e8a64dd "
            "training/arguments.py: 'Tensor parallel communication/GEMM overlap can happen only when sequence "
            "parallelism is enabled')",
        )
    recipe = ctx.gather_recipe
    if recipe is None or ctx.par.tp == 1 or not userbuffers_rows(ctx):
        return
    if recipe.activation_block and recipe.name != "mxfp8":
        raise SpecError(
            field,
            f"TransformerEngine's userbuffers gather bf16, per-tensor fp8 and mxfp8 data only: fp8_recipe "
            f"{recipe.name!r} raises 'Unsupported quantizer for Userbuffers' (TE module/base.py "
            "fill_userbuffers_buffer_for_all_gather)",
        )
    rows = ctx.b * ctx.s_cp // ctx.par.tp
    if recipe.name == "mxfp8" and rows % USERBUFFERS_MXFP8_ROWS:
        raise SpecError(
            field,
            f"TransformerEngine's userbuffers need an mxfp8 shard of rows divisible by {USERBUFFERS_MXFP8_ROWS}, "
            f"got micro_batch_size x sequence / (cp x tp) = {rows} (TE module/base.py "
            "fill_userbuffers_buffer_for_all_gather)",
        )


def _width(ctx: Context, per_token: int) -> int:
    """The TP unit A = b·s/c·h·x at ``per_token`` elements instead of h."""
    return ctx.activation // ctx.model.hidden_size * per_token


def _rerun_up_proj(ctx: Context, again: Reruns) -> list[Call]:
    """Selective ``mla_up_proj``: MLA's q and kv up-projections run under CheckpointWithoutOutput
    (multi_latent_attention.py ``qkv_up_checkpoint``, re-run when the core attention's backward starts:
    discard_output_and_register_recompute), so under sequence parallelism their input all-gathers are issued
    again; the RoPE key's gather happens before the checkpoint and is not. Without sequence parallelism the
    column-parallel forward issues nothing."""
    if not (again.up_proj and ctx.par.sp):
        return []
    src = f"{ctx.flavour.sp_source}; selective recompute (mla_up_proj; {M}multi_latent_attention.py qkv_up_checkpoint)"
    return [
        recomputed(_mb(ctx, name=f"tp.attn.{name}", op=Op.ALLGATHER, phase="forward", count=again.up_proj,
                       source=src, **_gemm_input(ctx, width)))
        for name, width, linear in _attention_inputs(ctx)
        if linear
    ]  # fmt: skip


def _rerun_mlps(ctx: Context, again: Reruns) -> list[Call]:
    """Selective recompute of the modules that hold a TP MLP (recompute.rerun_layers): ``mlp`` re-runs a
    dense layer's fc1 and fc2, ``moe`` and ``shared_experts`` the shared experts' (each checkpoint's
    forward runs again in the backward with its collectives): the MLP half of the forward calls."""
    shared = again.shared_experts if ctx.model.moe and ctx.model.moe.shared_ffn else 0
    what = {"mlp": again.mlp, "moe": again.moe_block if shared else 0, "shared_experts": again.shared if shared else 0}
    mlps = again.mlp + shared
    if not mlps:
        return []
    listed = ", ".join(name for name, n in what.items() if n)
    return [
        recomputed(c, f"selective recompute ({listed}; {M}transformer_layer.py _forward_mlp, moe_layer.py)")
        for c in _forward(ctx, 0, mlps)
        if c.calls_per_iteration
    ]


def _forward(ctx: Context, attn: int, mlp: int) -> list[Call]:
    src = ctx.flavour.sp_source if ctx.par.sp else ctx.flavour.tp_source
    if not ctx.par.sp:
        return [
            _mb(ctx, name="tp.attn.out_proj", op=Op.ALLREDUCE, phase="forward", count=attn, source=src),
            _mb(ctx, name="tp.mlp.down_proj", op=Op.ALLREDUCE, phase="forward", count=mlp, source=src),
        ]
    # a linear's input is gathered quantized under a recipe (Context.gemm_input); MLA's RoPE key is gathered
    # by Megatron's gather_from_sequence_parallel_region at the hidden states' width
    gathers = [
        _mb(ctx, name=f"tp.attn.{name}", op=Op.ALLGATHER, phase="forward", count=attn, source=src,
            **(_gemm_input(ctx, width) if linear else {"message": _width(ctx, width)}))
        for name, width, linear in _attention_inputs(ctx)
    ]  # fmt: skip
    h = ctx.model.hidden_size
    return [
        *gathers,
        _mb(ctx, name="tp.attn.out_proj", op=Op.REDUCESCATTER, phase="forward", count=attn, source=src),
        _mb(ctx, name="tp.mlp.up_proj", op=Op.ALLGATHER, phase="forward", count=mlp, source=src, **_gemm_input(ctx, h)),
        _mb(ctx, name="tp.mlp.down_proj", op=Op.REDUCESCATTER, phase="forward", count=mlp, source=src),
    ]


def _backward(ctx: Context, attn: int, mlp: int) -> list[Call]:
    fl = ctx.flavour
    inputs = _attention_inputs(ctx)
    if not ctx.par.sp:
        # one all-reduce per column-parallel input gradient: fused QKV and fc1, or q,k,v and gate,up; MLA's
        # two up-projections (the RoPE key's gradient is reduced by nothing)
        qkv, up = (1, 1) if fl.fused_column_dgrad else (3, 2 if ctx.model.gated_mlp else 1)
        src = fl.tp_source
        return [
            _mb(ctx, name=f"tp.attn.{name}.dgrad", op=Op.ALLREDUCE, phase="backward",
                count=(1 if ctx.model.mla else qkv) * attn, source=src, message=_width(ctx, width))
            for name, width, linear in inputs
            if linear
        ] + [
            _mb(ctx, name="tp.mlp.up_proj.dgrad", op=Op.ALLREDUCE, phase="backward", count=up * mlp, source=src),
        ]  # fmt: skip
    src = fl.sp_source
    out = [
        _mb(ctx, name=f"tp.attn.{name}.dgrad", op=Op.REDUCESCATTER, phase="backward", count=attn, source=src,
            message=_width(ctx, width))
        for name, width, _ in inputs
    ] + [
        # the row-parallel linears' grad outputs, quantized for dgrad and wgrad (Context.gemm_input)
        _mb(ctx, name="tp.attn.out_proj.dgrad", op=Op.ALLGATHER, phase="backward", count=attn, source=src,
            **_gemm_input(ctx, ctx.model.hidden_size, grad_output=True)),
        _mb(ctx, name="tp.mlp.up_proj.dgrad", op=Op.REDUCESCATTER, phase="backward", count=mlp, source=src),
        _mb(ctx, name="tp.mlp.down_proj.dgrad", op=Op.ALLGATHER, phase="backward", count=mlp, source=src,
            **_gemm_input(ctx, ctx.model.hidden_size, grad_output=True)),
    ]  # fmt: skip
    if fl.sp_wgrad_regather:
        out += [
            _mb(ctx, name=f"tp.attn.{name}.wgrad_gather", op=Op.ALLGATHER, phase="backward", count=attn,
                source=src, **_gemm_input(ctx, width))
            for name, width, linear in inputs
            if linear
        ] + [
            _mb(ctx, name="tp.mlp.up_proj.wgrad_gather", op=Op.ALLGATHER, phase="backward", count=mlp, source=src,
                **_gemm_input(ctx, ctx.model.hidden_size)),
        ]  # fmt: skip
    return out


def _embedding(ctx: Context) -> list[Call]:
    """VocabParallelEmbedding: each rank looks up its vocabulary slice, the partial sums are all-reduced,
    or reduce-scattered into the sequence-parallel region (megatron/core/tensor_parallel/layers.py;
    LanguageModelEmbedding). With learned position embeddings Megatron all-reduces, then scatters
    locally; the scatter's backward all-gathers."""
    src = ctx.flavour.embedding_source
    if not ctx.par.sp:
        return [_mb(ctx, name="tp.embedding", op=Op.ALLREDUCE, phase="forward", count=1, source=src)]
    positions = ctx.model.learned_position_embeddings and ctx.flavour.embedding_allreduce_with_positions
    fwd_op = Op.ALLREDUCE if positions else Op.REDUCESCATTER
    out = [_mb(ctx, name="tp.embedding", op=fwd_op, phase="forward", count=1, source=src)]
    if ctx.training:
        out.append(_mb(ctx, name="tp.embedding.dgrad", op=Op.ALLGATHER, phase="backward", count=1, source=src))
    return out


def _mtp(ctx: Context, part) -> list[Call]:
    """Each MTP module (training) looks up the shifted tokens in the embedding on the MTP rank and is scored
    with the LM head and cross-entropy on the loss rank (Megatron-LM d98e8a6 multi_token_prediction.py
    MultiTokenPredictionLayer: self.embedding(...) where the MTP block runs; gpt_model.py _postprocess
    -> process_mtp_loss on the post_process stage): ``part`` (_embedding or _head)'s TP calls once more per
    module, named tp.mtp.*."""
    n = ctx.model.mtp_layers
    if not n or not ctx.training:
        return []
    src = "; Megatron-Core multi_token_prediction.py (MTP module: embedding on its rank, output head with the loss)"
    return [
        replace(c, name="tp.mtp." + c.name.removeprefix("tp."), calls_per_iteration=c.calls_per_iteration * n,
                source=c.source + src)
        for c in part(ctx)
    ]  # fmt: skip


def _eh_proj(ctx: Context) -> list[Call]:
    """Each MTP module's eh_proj (Megatron-LM d98e8a6 multi_token_prediction.py _concat_embeddings): a
    column-parallel linear over the concatenated [embedding, hidden] (2h), whose output is gathered over TP
    (gather_from_tensor_model_parallel_region: an all-gather of the h/t slices, A gathered) and, with SP,
    split back to the sequence shard (scatter_to_sequence_parallel_region: no call forward, an all-gather of
    A backward). With SP the linear all-gathers its 2A input forward, reduce-scatters its input gradient and
    re-gathers the input for wgrad backward; without SP it all-reduces its 2A input gradient. eh_proj is a TE
    linear (gpt_layer_specs.py get_mtp_layer_spec_for_backend: eh_proj = backend.column_parallel_linear(),
    TEColumnParallelLinear) run in the module's fp8 context (_proj_and_transformer_layer: get_fp8_context when
    config.fp8): its 2h-wide input is gathered quantized under an fp8 recipe (_gemm_input), at the hidden states'
    width under nvfp4 (kernels.mtp_runs_bf16); its output and the gradients stay bf16."""
    n = ctx.model.mtp_layers
    if not n or not ctx.training:
        return []
    src = f"{M}multi_token_prediction.py MultiTokenPredictionLayer._concat_embeddings (eh_proj)"
    two = 2 * ctx.activation
    gathered = _gemm_input(ctx, 2 * ctx.model.hidden_size, mtp=True)  # the SP input's gather and wgrad re-gather

    def call(name: str, op: Op, phase: str, message: int | None = None, **quantized) -> Call:
        return _mb(ctx, name=f"tp.mtp.eh_proj{name}", op=op, phase=phase, count=n, source=src, message=message,
                   **quantized)  # fmt: skip

    if not ctx.par.sp:
        forward = [call(".gather", Op.ALLGATHER, "forward", ctx.activation)]
        out = [*forward, call(".dgrad", Op.ALLREDUCE, "backward", two)]
    else:
        forward = [
            call("", Op.ALLGATHER, "forward", **gathered),
            call(".gather", Op.ALLGATHER, "forward", ctx.activation),
        ]
        out = [
            *forward,
            call(".scatter.dgrad", Op.ALLGATHER, "backward", ctx.activation),
            call(".dgrad", Op.REDUCESCATTER, "backward", two),
        ]
        if ctx.flavour.sp_wgrad_regather:
            out.append(call(".wgrad_gather", Op.ALLGATHER, "backward", **gathered))
    if mtp_checkpointed(ctx.work):  # the module's checkpoint re-runs _concat_embeddings (recompute.MTP_UNIFORM)
        out += [recomputed(c, f"full recompute ({M}multi_token_prediction.py _checkpointed_forward)") for c in forward]
    return out


def _head(ctx: Context) -> list[Call]:
    """The LM head is a column-parallel linear over the vocabulary. Megatron keeps the logits sharded and
    runs the vocab-parallel cross-entropy: 3 all-reduces of b·s/c fp32 values (max, predicted logit,
    sum of exponentials; megatron/core/tensor_parallel/cross_entropy.py, the logits are cast to fp32 first).
    PyTorch gathers the logits (b·s/c·V·x) and computes the loss locally, unless loss parallelism is on
    (workload.loss_parallel, torchtitan's default with tp > 1): then the same 3 fp32 all-reduces
    (torch/distributed/tensor/parallel/loss.py, Flavour.loss_parallel_source). Inference gathers the last
    position's logits for sampling (vLLM LogitsProcessor._gather_logits) over the serving engine's
    vocabulary, padded to a multiple of 64 (vllm/model_executor/layers/vocab_parallel_embedding.py
    DEFAULT_VOCAB_PADDING_SIZE = 64), not Megatron's 128·t."""
    model = ctx.model
    tokens = ctx.b * ctx.s_cp
    if not ctx.training:
        logits = ctx.b * vllm_padded_vocab(model.vocab_size) * ctx.x
        return [
            _mb(ctx, name="tp.lm_head.logits", op=Op.ALLGATHER, phase="forward", count=1, source=VLLM, message=logits)
        ]
    out = []
    if ctx.par.sp:
        src = ctx.flavour.sp_source
        out += [
            _mb(ctx, name="tp.lm_head.input", op=Op.ALLGATHER, phase="forward", count=1, source=src),
            _mb(ctx, name="tp.lm_head.dgrad", op=Op.REDUCESCATTER, phase="backward", count=1, source=src),
        ]
        if ctx.flavour.sp_wgrad_regather:
            out.append(_mb(ctx, name="tp.lm_head.wgrad_gather", op=Op.ALLGATHER, phase="backward", count=1, source=src))
    else:
        src = ctx.flavour.tp_source
        out.append(_mb(ctx, name="tp.lm_head.dgrad", op=Op.ALLREDUCE, phase="backward", count=1, source=src))
    if not vocab_parallel_loss(ctx):
        logits = tokens * model.vocab_size * ctx.hidden_bytes  # the head's bf16 output under an fp8 recipe
        src = ctx.flavour.tp_source
        out.append(
            _mb(ctx, name="tp.lm_head.logits", op=Op.ALLGATHER, phase="forward", count=1, source=src, message=logits)
        )
    else:
        out.append(
            _mb(
                ctx,
                name="tp.cross_entropy",
                op=Op.ALLREDUCE,
                phase="forward",
                count=3,
                source=ctx.flavour.loss_parallel_source
                or M + "megatron/core/tensor_parallel/cross_entropy.py:25,130,146,150 (fp32 max, target, sum exp)",
                message=tokens * 4,
                dtype="fp32",
            )
        )
    return out


def vllm_padded_vocab(vocab: int) -> int:
    return -(-vocab // VLLM_VOCAB_PADDING) * VLLM_VOCAB_PADDING


def _data_broadcast(ctx: Context, stage: int) -> list[Call]:
    """Megatron's rank 0 of each TP group loads the batch and broadcasts it (megatron/training/utils.py
    get_batch_on_this_tp_rank): tokens and position ids to the first stage, labels and loss mask to the
    last, and the attention mask (bool b x 1 x s x s) to both when the data loader builds it
    (--create-attention-mask-in-dataloader, on by default in megatron/training/arguments.py); the full
    sequence, before the context-parallel split. Megatron-LM 2021-22's packed broadcast instead where the flavour
    has it (_packed_batch)."""
    if not ctx.flavour.tp_broadcasts_batch:
        return []
    if ctx.flavour.tp_batch_packed:
        keys, per_micro_batch, source = _packed_batch(ctx)
        wanted = [(name, size, dtype, per_micro_batch) for name, size, dtype in keys]
    else:
        tokens = ctx.b * ctx.s
        wanted = []
        if ctx.is_first(stage):
            wanted += [("tokens", tokens * 8, "int64", 1), ("position_ids", tokens * 8, "int64", 1)]
        if ctx.is_last(stage):
            wanted += [("labels", tokens * 8, "int64", 1), ("loss_mask", tokens * 4, "fp32", 1)]
        if ctx.work.attention_mask_in_dataloader and ctx.end_copies(stage):
            # once for each micro-batch the rank runs at an end: DualPipe's ranks 0 and pp - 1 run a first stage one
            # way and a last stage the other, m in all, as each of 1F1B's two end ranks does (review r13a #5)
            wanted.append(("attention_mask", ctx.b * ctx.s * ctx.s, "bool", ctx.end_copies(stage)))
        source = M + "megatron/core/utils.py:2167 get_batch_on_this_tp_rank"
    return [
        _mb(ctx, name=f"tp.data.{name}", op=Op.BROADCAST, phase="forward", count=count, source=source, message=size,
            dtype=dtype)
        for name, size, dtype, count in wanted
    ]  # fmt: skip


# Megatron-LM before Megatron-Core: mpu/data.py broadcast_data at 6985e58 (and 55ba1f7b96) broadcasts the keys' sizes
# (_MAX_DATA_DIM = 5 int64 a key) and then the keys packed into one int64 tensor; GPT's get_batch asks for one key,
# "text" (b x (s + 1) tokens: the inputs and the labels shifted by one)
PACKED_BATCH_DIMS = 5
PACKED_BATCH_SOURCE = "Megatron-LM 6985e58 pretrain_gpt.py get_batch, megatron/mpu/data.py broadcast_data"


def _packed_batch(ctx: Context) -> tuple[list[tuple[str, int, str]], int, str]:
    """Megatron-LM 2021-22's batch (Flavour.tp_batch_packed) as (broadcasts, calls per micro-batch, source):
    pretrain_gpt.py's forward_step calls get_batch on every pipeline stage, once per model chunk and micro-batch, and
    get_batch broadcasts the sizes of its one key, then the "text" tokens, b x (s + 1) int64; the labels, loss mask,
    attention mask and position ids are built on each rank (get_ltor_masks_and_position_ids)."""
    wanted = [("sizes", PACKED_BATCH_DIMS * 8, "int64"), ("text", ctx.b * (ctx.s + 1) * 8, "int64")]
    return wanted, max(1, ctx.par.chunks_per_rank), PACKED_BATCH_SOURCE


def norm_params(ctx: Context, stage: int) -> int:
    """Parameters replicated across TP whose gradients sequence parallelism leaves partial: layer norms
    (and q/k norms), MLA's latent norms and its two down-projections (TELinear parallel_mode "duplicated"
    sets sequence_parallel on its weights: megatron/core/extensions/transformer_engine.py TELinear), MoE
    routers, the final norm (last stage) and the MTP modules' three norms (on the MTP rank)."""
    m = ctx.model
    per_layer = 2 * m.norm_params() + (2 * m.head_size if m.qk_norm else 0)
    if m.mla:
        per_layer += sum(n for _, n, split in m.mla.projections(m.hidden_size, m.num_attention_heads) if not split)
    total = per_layer * len(ctx.stage_layers[stage]) + ctx.moe_layers(stage) * m.hidden_size * (
        m.moe.num_experts if m.moe else 0
    )
    return (
        total
        + (m.norm_params() if ctx.is_last(stage) else 0)
        + (3 * m.mtp_layers * m.norm_params() if ctx.holds_mtp(stage) else 0)
    )


def zero_read(par) -> int:
    """What this rule reads of the layout's ZeRO stage, as the least stage that reads the same: under SP, for a
    flavour whose optimizer reduces the norm weights' partial gradients on read, whether FSDP2 (ZeRO-2/3) reduces
    them in its post-backward instead (``_norm_grads``): 2, else 0. The layout search builds one activation-rules
    template per value (the other activation rules read no ZeRO stage)."""
    on_read = par.sequence_parallel and par.flavour.norm_grad_reduction == "on_read"
    return 2 if on_read and par.zero_stage >= 2 else 0


def _norm_grads(ctx: Context, stage: int) -> list[Call]:
    """Sequence parallelism leaves the gradients of TP-replicated weights partial.

    Megatron all-reduces them once per iteration (finalize_model_grads.py
    _allreduce_non_tensor_model_parallel_grads). Plain DTensor leaves them Partial and the optimizer
    reduces each when AdamW reads it (3 reads per weight: reference/pytorch/tp2_sp.json). Under FSDP2
    (our torch ZeRO-2/3) the post-backward hook redistributes every Partial gradient to the parameter's
    TP placement (Replicate) before its reduce-scatter (torch/distributed/fsdp/_fully_shard/_fsdp_param.py
    FSDPParam._get_grad_inner_tensor, torch 2.4+): one all-reduce per weight and micro-batch in backward,
    and the optimizer then sees plain replicated gradients and issues none.
    """
    if not ctx.par.sp:
        return []
    if ctx.flavour.norm_grad_reduction == "on_read":
        m = ctx.model
        weights = 2 * len(ctx.stage_layers[stage]) + (1 if ctx.is_last(stage) else 0)
        fsdp2 = zero_read(ctx.par) >= 2
        return [
            Call(
                name="tp.norm_weight_grads",
                op=Op.ALLREDUCE,
                phase="backward" if fsdp2 else "optimizer",
                message_bytes=m.norm_params() * ctx.grad_bytes,
                calls_per_iteration=weights * (ctx.passes if fsdp2 else 3),
                group=TP,
                source=FSDP2_TP
                if fsdp2
                else ctx.flavour.tp_source + " (partial gradients reduced when AdamW reads them)",
                dtype=ctx.grad_dtype,
            )
        ]
    return [
        Call(
            name="tp.sp_param_grads",
            op=Op.ALLREDUCE,
            phase="optimizer",
            message_bytes=norm_params(ctx, stage) * ctx.grad_bytes,
            calls_per_iteration=1,
            group=TP,
            source=M + "megatron/core/distributed/finalize_model_grads.py _allreduce_non_tensor_model_parallel_grads",
            dtype=ctx.grad_dtype,
        )
    ]
