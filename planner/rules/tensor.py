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
the optimizer all-reduces as it reads them (3 reads per weight in AdamW: reference/pytorch/tp2_sp.json).
"""

from __future__ import annotations

from collectives import Op

from ..context import Context
from ..layout import Group
from ..ledger import Call, recomputed

TP = Group(("tp",))
MEGATRON_TP = "Megatron-LM SC'21 §3; megatron/core/tensor_parallel/mappings.py"
MEGATRON_SP = "Korthikanti et al. 2022 §4.2.2; megatron/core/tensor_parallel/layers.py (input re-gathered for wgrad)"
DTENSOR = "torch.distributed.tensor.parallel (ColwiseParallel/RowwiseParallel); reference/pytorch/tp2*.json"


def calls(ctx: Context) -> list[Call]:
    if ctx.par.tp == 1:
        return []
    out: list[Call] = []
    for stage in range(ctx.par.pp):
        out += [c.at(stage) for c in _blocks(ctx, stage)]
        if ctx.is_first(stage):
            out += [c.at(stage) for c in _embedding(ctx)]
        if ctx.is_last(stage):
            out += [c.at(stage) for c in _head(ctx)]
        if ctx.training:
            out += [c.at(stage) for c in _data_broadcast(ctx, stage) + _norm_grads(ctx, stage)]
    return out


def _mb(ctx: Context, name: str, op: Op, phase: str, count: int, source: str, message: int | None = None) -> Call:
    """A call issued ``count`` times per micro-batch."""
    return Call(
        name,
        "tp",
        op,
        phase,
        ctx.activation if message is None else message,
        count * ctx.micro_batches,
        TP,
        source,
        dtype=ctx.work.activation_dtype,
    )


def _block_counts(ctx: Context, stage: int) -> tuple[int, int]:
    """(attention blocks, tensor-parallel MLP blocks) on the stage. An MoE layer's routed experts move
    tokens by all-to-all (rules/expert.py); only its shared experts form a TP MLP."""
    moe = ctx.moe_layers(stage)
    shared = moe if ctx.model.moe and ctx.model.moe.shared_ffn else 0
    return ctx.dense_layers(stage) + moe, ctx.dense_layers(stage) + shared


def _blocks(ctx: Context, stage: int) -> list[Call]:
    attn, mlp = _block_counts(ctx, stage)
    forward = _forward(ctx, attn, mlp)
    out = list(forward)
    if ctx.training:
        out += _backward(ctx, attn, mlp)
        if ctx.forward_passes == 2:  # full recompute re-runs the forward, communication included
            out += [recomputed(c) for c in forward]
    return out


def _forward(ctx: Context, attn: int, mlp: int) -> list[Call]:
    src = MEGATRON_SP if ctx.par.sp else (MEGATRON_TP if ctx.flavour != "torch" else DTENSOR)
    if not ctx.par.sp:
        return [
            _mb(ctx, "tp.attn.out_proj", Op.ALLREDUCE, "forward", attn, src),
            _mb(ctx, "tp.mlp.down_proj", Op.ALLREDUCE, "forward", mlp, src),
        ]
    return [
        _mb(ctx, "tp.attn.qkv", Op.ALLGATHER, "forward", attn, src),
        _mb(ctx, "tp.attn.out_proj", Op.REDUCESCATTER, "forward", attn, src),
        _mb(ctx, "tp.mlp.up_proj", Op.ALLGATHER, "forward", mlp, src),
        _mb(ctx, "tp.mlp.down_proj", Op.REDUCESCATTER, "forward", mlp, src),
    ]


def _backward(ctx: Context, attn: int, mlp: int) -> list[Call]:
    torch = ctx.flavour == "torch"
    if not ctx.par.sp:
        # one all-reduce per column-parallel input gradient: fused QKV and fc1, or q,k,v and gate,up
        qkv, up = (3, 2 if ctx.model.gated_mlp else 1) if torch else (1, 1)
        src = DTENSOR if torch else MEGATRON_TP
        return [
            _mb(ctx, "tp.attn.qkv.dgrad", Op.ALLREDUCE, "backward", qkv * attn, src),
            _mb(ctx, "tp.mlp.up_proj.dgrad", Op.ALLREDUCE, "backward", up * mlp, src),
        ]
    src = DTENSOR if torch else MEGATRON_SP
    out = [
        _mb(ctx, "tp.attn.qkv.dgrad", Op.REDUCESCATTER, "backward", attn, src),
        _mb(ctx, "tp.attn.out_proj.dgrad", Op.ALLGATHER, "backward", attn, src),
        _mb(ctx, "tp.mlp.up_proj.dgrad", Op.REDUCESCATTER, "backward", mlp, src),
        _mb(ctx, "tp.mlp.down_proj.dgrad", Op.ALLGATHER, "backward", mlp, src),
    ]
    if not torch:
        out += [
            _mb(ctx, "tp.attn.qkv.wgrad_gather", Op.ALLGATHER, "backward", attn, src),
            _mb(ctx, "tp.mlp.up_proj.wgrad_gather", Op.ALLGATHER, "backward", mlp, src),
        ]
    return out


def _embedding(ctx: Context) -> list[Call]:
    """VocabParallelEmbedding: each rank looks up its vocabulary slice, the partial sums are all-reduced,
    or reduce-scattered into the sequence-parallel region (megatron/core/tensor_parallel/layers.py;
    LanguageModelEmbedding). With learned position embeddings Megatron all-reduces, then scatters
    locally; the scatter's backward all-gathers."""
    src = "megatron/core/tensor_parallel/layers.py VocabParallelEmbedding" if ctx.flavour != "torch" else DTENSOR
    if not ctx.par.sp:
        return [_mb(ctx, "tp.embedding", Op.ALLREDUCE, "forward", 1, src)]
    fwd_op = Op.ALLREDUCE if ctx.model.learned_position_embeddings and ctx.flavour != "torch" else Op.REDUCESCATTER
    out = [_mb(ctx, "tp.embedding", fwd_op, "forward", 1, src)]
    if ctx.training:
        out.append(_mb(ctx, "tp.embedding.dgrad", Op.ALLGATHER, "backward", 1, src))
    return out


def _head(ctx: Context) -> list[Call]:
    """The LM head is a column-parallel linear over the vocabulary. Megatron keeps the logits sharded and
    runs the vocab-parallel cross-entropy: 3 all-reduces of b·s/c fp32 values (max, predicted logit,
    sum of exponentials; megatron/core/tensor_parallel/cross_entropy.py). PyTorch gathers the logits
    (b·s/c·V·x) and computes the loss locally. Inference gathers the last position's logits for sampling
    (vLLM LogitsProcessor)."""
    m, model = ctx.model, ctx.model
    tokens = ctx.b * ctx.s_cp
    if not ctx.training:
        logits = ctx.b * m.padded_vocab(ctx.par.tp) * ctx.x
        return [
            _mb(ctx, "tp.lm_head.logits", Op.ALLGATHER, "forward", 1, "vLLM LogitsProcessor._gather_logits", logits)
        ]
    out = []
    if ctx.par.sp:
        src = DTENSOR if ctx.flavour == "torch" else MEGATRON_SP
        out += [
            _mb(ctx, "tp.lm_head.input", Op.ALLGATHER, "forward", 1, src),
            _mb(ctx, "tp.lm_head.dgrad", Op.REDUCESCATTER, "backward", 1, src),
        ]
        if ctx.flavour != "torch":
            out.append(_mb(ctx, "tp.lm_head.wgrad_gather", Op.ALLGATHER, "backward", 1, src))
    else:
        src = DTENSOR if ctx.flavour == "torch" else MEGATRON_TP
        out.append(_mb(ctx, "tp.lm_head.dgrad", Op.ALLREDUCE, "backward", 1, src))
    if ctx.flavour == "torch":
        logits = tokens * model.vocab_size * ctx.x
        out.append(_mb(ctx, "tp.lm_head.logits", Op.ALLGATHER, "forward", 1, DTENSOR, logits))
    else:
        out.append(
            _mb(
                ctx,
                "tp.cross_entropy",
                Op.ALLREDUCE,
                "forward",
                3,
                "megatron/core/tensor_parallel/cross_entropy.py (max, target logit, sum exp)",
                tokens * 4,
            )
        )
    return out


def _data_broadcast(ctx: Context, stage: int) -> list[Call]:
    """Megatron's rank 0 of each TP group loads the batch and broadcasts it: tokens and position ids to
    the first stage, labels and loss mask to the last (megatron/training/utils.py
    get_batch_on_this_tp_rank); the full sequence, before the context-parallel split."""
    if ctx.flavour == "torch":
        return []
    tokens = ctx.b * ctx.s
    wanted = []
    if ctx.is_first(stage):
        wanted += [("tokens", 8), ("position_ids", 8)]
    if ctx.is_last(stage):
        wanted += [("labels", 8), ("loss_mask", 4)]
    src = "megatron/training/utils.py get_batch_on_this_tp_rank"
    return [
        Call(
            f"tp.data.{name}",
            "tp",
            Op.BROADCAST,
            "forward",
            tokens * size,
            ctx.micro_batches,
            TP,
            src,
            dtype="int64" if size == 8 else "fp32",
        )
        for name, size in wanted
    ]


def norm_params(ctx: Context, stage: int) -> int:
    """Parameters replicated across TP whose gradients sequence parallelism leaves partial: layer norms
    (and q/k norms, MLA's latent norms), MoE routers, and the final norm on the last stage."""
    m = ctx.model
    per_layer = 2 * m.norm_params() + (2 * m.head_size if m.qk_norm else 0)
    if m.mla:
        per_layer += m.mla.q_lora_rank + m.mla.kv_lora_rank
    total = per_layer * len(ctx.stage_layers[stage]) + ctx.moe_layers(stage) * m.hidden_size * (
        m.moe.num_experts if m.moe else 0
    )
    return total + (m.norm_params() if ctx.is_last(stage) else 0)


def _norm_grads(ctx: Context, stage: int) -> list[Call]:
    if not ctx.par.sp:
        return []
    if ctx.flavour == "torch":
        m = ctx.model
        weights = 2 * len(ctx.stage_layers[stage]) + (1 if ctx.is_last(stage) else 0)
        return [
            Call(
                "tp.norm_weight_grads",
                "tp",
                Op.ALLREDUCE,
                "optimizer",
                m.norm_params() * ctx.grad_bytes,
                3 * weights,
                TP,
                DTENSOR + " (partial gradients reduced when AdamW reads them)",
                dtype=ctx.grad_dtype,
            )
        ]
    return [
        Call(
            "tp.sp_param_grads",
            "tp",
            Op.ALLREDUCE,
            "optimizer",
            norm_params(ctx, stage) * ctx.grad_bytes,
            1,
            TP,
            "megatron/core/distributed/finalize_model_grads.py _allreduce_non_tensor_model_parallel_grads",
            dtype=ctx.grad_dtype,
        )
    ]
