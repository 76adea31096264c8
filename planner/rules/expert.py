"""Expert parallelism traffic per MoE layer and micro-batch
(megatron/core/transformer/moe/token_dispatcher.py, MoEAlltoAllTokenDispatcher).

Each rank holds T = b·(s/c)/t tokens (sequence parallel shards them over TP). Dispatch sends every token to
its top-k experts: a per-rank send buffer of T·k·h elements (x capacity_factor when tokens are padded to a
fixed capacity; dropless otherwise); combine returns the expert outputs the same way. Under uniform routing
(e-1)/e of the buffer leaves the rank, which is what the executed all-to-all schedule counts. Backward runs
the two transposes (same sizes). Dropless routing first all-gathers every rank's per-expert token counts
over the expert-TP x EP group (E int64 per rank). With expert tensor parallelism (expert_tp > 1) the
received tokens are all-gathered over the expert-TP group before the experts and reduce-scattered after.
With ``parallel.ep_dispatch: "deepep"`` the two all-to-alls become DeepEP's node-limited RDMA + NVLink legs
(rules/deepep.py). With ``"allgather"`` (Megatron MoEAllGatherTokenDispatcher, --moe-token-dispatcher-type
allgather) every rank all-gathers the hidden states, the routing map (bool, T x E) and the probabilities
(T x E) of the whole expert-TP x EP group, keeps the tokens of its local experts, and reduce-scatters the
expert output back (token_combine); backward runs the conjugates for the hidden states and the probabilities
(the routing map has no gradient). No token counts and no separate expert-TP gather: the group is TP x EP.
The dispatch may use fp8 (DeepSeek-V3 §3.3), carrying one fp32 scale per 1x128 tile;
combine stays in the hidden states' dtype (Context.hidden_dtype: the activation dtype, bf16 when training under an
fp8 recipe, which quantizes inside TransformerEngine's modules after the dispatch). torchtitan's EP exchanges the
counts with an all-to-all instead of an all-gather.
"""

from __future__ import annotations

import math
from dataclasses import replace

from collectives import Op

from ..context import Context
from ..layout import Group
from ..ledger import Call, equal_blocks, recomputed, rule_call, stage_classes
from ..recompute import rerun_layers
from ..workload import DISPATCH_FORMATS
from . import deepep, engine_gather

M = "Megatron-LM d98e8a6 "
SOURCE = M + "megatron/core/transformer/moe/token_dispatcher.py (MoEAlltoAllTokenDispatcher)"
TORCHTITAN = "torchtitan/distributed/expert_parallel.py ExpertParallel._token_dispatch (all_to_all_single of counts)"
FP8_SCALES = "DeepSeek-V3 report §3.3: 1x128 tiles, one fp32 scale each"
FP8_TILE = 128
ROUTER_RECOMPUTE = (
    "recompute: aux loss only under torch.is_grad_enabled() (router.py TopKRouter.routing), so a checkpointed "
    "layer reduces its counts in the backward's re-run only (tensor_parallel/random.py CheckpointFunction)"
)


def calls(ctx: Context) -> list[Call]:
    moe = ctx.model.moe
    if moe is None:
        return []
    out = []
    # every call of a stage depends on its number of MoE layers and of those whose MoE block re-runs alone
    key = (lambda stage: (ctx.moe_layers(stage), rerun_layers(ctx, stage).routed)) if ctx.training else ctx.moe_layers
    for first, stages in stage_classes(range(ctx.par.pp), key).items():
        layers = ctx.moe_layers(first) * ctx.passes
        if layers == 0:
            continue
        out += [c.on(stages) for c in _router(ctx, first)]
        out += [c.on(stages) for c in _forward(ctx, layers)]
        if ctx.training:
            out += [c.on(stages) for c in _backward(ctx, layers)]
            # MoE layers re-run whole, or their MoE block (selective "moe"): recompute.rerun_layers
            again = rerun_layers(ctx, first)
            if again.routed:
                what = "activation recompute" if not again.moe_block else "selective recompute (moe; moe_layer.py)"
                out += [recomputed(c, what).on(stages) for c in _forward(ctx, again.routed * ctx.passes)]
    return out


def _router(ctx: Context, stage: int) -> list[Call]:
    """Megatron's router reductions (training only; megatron/core/transformer/moe/router.py, core_r0.13).

    - Load-balancing loss: the per-expert token counts are all-reduced over TP x CP before the loss
      (TopKRouter aux-loss path: reduce_from_tensor_model_parallel_region(tokens_per_expert, tp_cp_group)):
      E int64 per MoE layer and micro-batch (b x E with the sequence-wise loss).
    - DeepSeek-V3 expert bias (--moe-router-enable-expert-bias): once per iteration finalize_model_grads.py
      _update_router_expert_bias all-reduces the stacked local_tokens_per_expert of the stage's MoE layers
      (fp32) over TP x CP x DP, then nudges the biases (DeepSeek-V3 report §2.1.2).
    - Recompute moves the first: the aux losses apply only ``if self.training and torch.is_grad_enabled()``
      (router.py TopKRouter.routing), and a checkpoint runs its forward under ``torch.no_grad()`` and
      again under ``torch.enable_grad()`` in the backward (tensor_parallel/random.py CheckpointFunction).
      A MoE layer re-run whole (full recompute) or whose MoE block re-runs (selective ``moe``) therefore
      reduces its counts once, in the backward's re-run, not in the forward (recompute.Reruns.routed).
    Other flavours (torchtitan, DeepSpeed-MoE) compute their balance losses locally: nothing is listed.
    """
    moe, par = ctx.model.moe, ctx.par
    if not ctx.training or not ctx.flavour.router_reductions:
        return []
    out = []
    moe_layers = ctx.moe_layers(stage)
    if moe.load_balancing != "none" and par.tp * par.cp > 1:
        per = moe.num_experts * (ctx.b if moe.load_balancing == "seq_aux_loss" else 1)
        call = _ep(
            ctx,
            name="ep.router.tokens_per_expert",
            op=Op.ALLREDUCE,
            phase="forward",
            message=per * 8,
            count=moe_layers * ctx.passes,
            group=Group(("tp", "cp")),
            dtype="int64",
            source=M + "megatron/core/transformer/moe/router.py _apply_aux_loss -> moe_utils.py:269 (tp_cp_group)",
        )
        rerun = rerun_layers(ctx, stage).routed * ctx.passes
        moved = replace(recomputed(call, ROUTER_RECOMPUTE), calls_per_iteration=rerun)
        kept = replace(call, calls_per_iteration=call.calls_per_iteration - rerun)
        out += [c for c in (kept, moved) if c.calls_per_iteration]
    if moe.expert_bias and par.tp * par.cp * par.dp > 1:
        out.append(
            _ep(
                ctx,
                name="ep.router.expert_bias",
                op=Op.ALLREDUCE,
                phase="optimizer",
                message=moe_layers * moe.num_experts * 4,
                count=1,
                group=Group(("tp", "cp", "dp")),
                dtype="fp32",
                source=M + "megatron/core/distributed/finalize_model_grads.py:334 _update_router_expert_bias",
            )
        )
    return out


def _routed(ctx: Context) -> int:
    """Token-expert rows one rank sends (padded to capacity when a capacity factor is set)."""
    moe = ctx.model.moe
    rows = ctx.tokens_local * moe.top_k
    return round(rows * moe.capacity_factor) if moe.capacity_factor else rows


def _forward(ctx: Context, layers: int) -> list[Call]:
    moe, par = ctx.model.moe, ctx.par
    rows = _routed(ctx)
    out = []
    if ctx.par.ep_dispatch == "allgather":
        return _allgather(ctx, layers, "forward")
    if ctx.par.ep_dispatch in engine_gather.GATHER_DISPATCHES:  # the serving engines' own (inference only)
        return engine_gather.calls(ctx, layers)
    if _deepep(ctx):  # the layout notification travels inside DeepEP's kernels
        return deepep.calls(ctx, layers, ctx.tokens_local, dispatch_row_bytes(ctx), "forward") + _expert_tp(
            ctx, layers, rows, "forward"
        )
    low_latency = par.ep > 1 and par.ep_dispatch == "deepep_ll"
    if moe.capacity_factor is None and par.etp * par.ep > 1 and not low_latency:
        out.append(_token_counts(ctx, layers))
    if low_latency:
        return _low_latency(ctx, layers, rows) + _expert_tp(ctx, layers, rows, "forward")
    if par.ep > 1:
        out += _dispatch_combine(ctx, layers, rows) + _probs(ctx, layers, rows, "forward")
    out += _expert_tp(ctx, layers, rows, "forward")
    return out


def _probs(ctx: Context, layers: int, rows: int, phase: str) -> list[Call]:
    """The routed rows' probabilities in an all-to-all of their own (Flavour.dispatch_probs_alltoall: Megatron's
    token_dispatch, one value per routed row in the router's output dtype, the hidden states' (Context.hidden_dtype:
    bf16 in mixed precision and under fp8 recipes, fp32 in an fp32 run), and their gradient's all-to-all in the
    backward; training only."""
    if not ctx.training or not ctx.flavour.dispatch_probs_alltoall:
        return []
    width = ctx.hidden_bytes
    return [
        _ep(ctx, name="ep.dispatch.probs" + ("" if phase == "forward" else ".bwd"), op=Op.ALLTOALL, phase=phase,
            message=equal_blocks(rows * width, ctx.par.ep), count=layers, group=Group(("ep",), expert=True),
            source=SOURCE + " token_dispatch (permuted_probs)", dtype=ctx.hidden_dtype)
    ]  # fmt: skip


# DeepEP low-latency kernels (deepseek-ai/DeepEP, Buffer.low_latency_dispatch / low_latency_combine): every
# token goes straight to the rank of each of its k experts (no node-limited forwarding, no de-duplication: its
# README's per-rank bytes are tokens x k x row), NVLink inside a node and RDMA across (docs/legacy.md@0297fc80),
# with the per-rank counts inside the kernel (no layout all-gather). Priced as a direct all-to-all on the graph
# plus a fixed kernel time: launch, the receivers' flag polling and the FP8 cast inside the kernel. That time,
# 28 us, is the median gap between the graph's direct all-to-all and DeepEP's published H800 low-latency table
# (EP 8-256, 128 tokens, h 7168, top-8, FP8 dispatch / BF16 combine: 12 rows); fitted there, one global
# constant; tests/planner/test_deepep_ll.py holds the table and the error per row.
DEEPEP_LL_KERNEL_S = 28e-6
DEEPEP_LL_SOURCE = "DeepEP low-latency kernels (Buffer.low_latency_dispatch/combine; README, docs/legacy.md@0297fc80)"


def _low_latency(ctx: Context, layers: int, rows: int) -> list[Call]:
    calls = _dispatch_combine(ctx, layers, rows, ".ll", DEEPEP_LL_SOURCE)
    return [replace(c, fixed_s=DEEPEP_LL_KERNEL_S, sms=ll_sms(ctx)) for c in calls]


def ll_sms(ctx: Context) -> int:
    """The blocks DeepEP's low-latency dispatch and combine launch, not NCCL's channels (the contention model's
    Call.sms): ceil(E / ceil(E / S)) for E experts on S SMs (DeepEP 4e38d1d csrc/kernels/internode_ll.cu lines
    564-570 and 1205-1211: num_warp_groups = ceil_div(num_experts, num_device_sms), num_sms =
    ceil_div(num_experts, num_warp_groups); the combine the same), which is E where E <= S (256 experts: 128 of
    an H100's 132; 160: 80). E where the GPU's SM count is unknown (Context.device_sms 0)."""
    experts, sms = ctx.model.moe.num_experts, ctx.device_sms
    return -(-experts // -(-experts // sms)) if sms else experts


def _dispatch_combine(ctx: Context, layers: int, rows: int, suffix: str = "", source: str = SOURCE) -> list[Call]:
    """A MoE layer's forward all-to-alls over EP: the routed rows out (with their fp8 scales when the dispatch
    is fp8) and the expert outputs back at the hidden states' width (Context.hidden_bytes)."""
    group, scales = Group(("ep",), expert=True), "; " + FP8_SCALES if _fp8(ctx) else ""
    return [
        _ep(ctx, name="ep.dispatch" + suffix, op=Op.ALLTOALL, phase="forward",
            message=equal_blocks(rows * dispatch_row_bytes(ctx), ctx.par.ep), count=layers, group=group,
            source=source + scales, dtype=ctx.work.moe_dispatch_dtype),
        _ep(ctx, name="ep.combine" + suffix, op=Op.ALLTOALL, phase="forward",
            message=equal_blocks(rows * ctx.model.hidden_size * ctx.hidden_bytes, ctx.par.ep), count=layers,
            group=group,
            source=source),
    ]  # fmt: skip


def _deepep(ctx: Context) -> bool:
    """DeepEP's normal kernels or HybridEP: the same two legs (rules/deepep.py)."""
    return ctx.par.ep > 1 and ctx.par.ep_dispatch in deepep.BACKENDS


def _fp8(ctx: Context) -> bool:
    return ctx.work.moe_dispatch_dtype == "fp8"


def dispatch_row_bytes(ctx: Context) -> int:
    """Bytes of one dispatched token row: h elements, plus with fp8 one fp32 scale per 1x128 tile
    (DeepSeek-V3 report §3.3 fine-grained quantisation; DeepEP low-latency dispatch sends the same); a post-quant
    block format's packed row with its scales (workload.DISPATCH_FORMATS: nvfp4 h / 2 + h / 16)."""
    h = ctx.model.hidden_size
    if _fp8(ctx):
        return h * ctx.dispatch_bytes + -(-h // FP8_TILE) * 4
    if ctx.work.moe_dispatch_dtype in DISPATCH_FORMATS:  # a post-quant block format's row with its scales
        return math.ceil(h * DISPATCH_FORMATS[ctx.work.moe_dispatch_dtype])
    return h * ctx.dispatch_bytes


def _token_counts(ctx: Context, layers: int) -> Call:
    """Dropless routing first tells every rank how many tokens it will receive. Megatron all-gathers each
    rank's per-expert counts over expert-TP x EP (token_dispatcher.py preprocess, E int64 per rank);
    torchtitan exchanges them with all_to_all_single over EP (torchtitan/distributed/expert_parallel.py
    ExpertParallel._token_dispatch: num_tokens_per_expert, E int64 in)."""
    moe, par = ctx.model.moe, ctx.par
    if ctx.flavour.token_counts_alltoall:
        return _ep(
            ctx,
            name="ep.token_counts",
            op=Op.ALLTOALL,
            phase="forward",
            message=moe.num_experts * 8,
            count=layers,
            group=Group(("ep",), expert=True),
            source=TORCHTITAN,
            dtype="int64",
        )
    counts = par.etp * par.ep * moe.num_experts * 8
    group = Group(("tp", "ep"), expert=True)
    return _ep(
        ctx, name="ep.token_counts", op=Op.ALLGATHER, phase="forward", message=counts, count=layers, group=group,
        source=SOURCE + " preprocess", dtype="int64",
    )  # fmt: skip


def _ep(
    ctx: Context, *, name: str, op: Op, phase: str, message: int, count: int, group: Group, source: str = SOURCE,
    dtype: str | None = None,
) -> Call:  # fmt: skip
    return rule_call(
        name=name, op=op, phase=phase, message=message, count=count, group=group, source=source,
        dtype=dtype or ctx.hidden_dtype,
    )  # fmt: skip


def _expert_tp(ctx: Context, layers: int, rows: int, phase: str) -> list[Call]:
    etp = ctx.par.etp
    if etp == 1:
        return []
    message = etp * rows * ctx.model.hidden_size * ctx.hidden_bytes
    group = Group(("tp",), expert=True)
    first, second = (Op.ALLGATHER, Op.REDUCESCATTER) if phase == "forward" else (Op.REDUCESCATTER, Op.ALLGATHER)
    suffix = "" if phase == "forward" else ".bwd"
    source = SOURCE + " (expert TP)"
    named = ((f"ep.expert_tp.gather{suffix}", first), (f"ep.expert_tp.scatter{suffix}", second))
    return [
        _ep(ctx, name=name, op=op, phase=phase, message=message, count=layers, group=group, source=source)
        for name, op in named
    ]


def _allgather(ctx: Context, layers: int, phase: str) -> list[Call]:
    """MoEAllGatherTokenDispatcher (token_dispatcher.py): token_dispatch gathers routing_map, probs and the
    hidden states over tp_ep_group (gather_from_sequence_parallel_region); token_combine reduce-scatters
    the output (reduce_scatter_to_sequence_parallel_region). Backward: the hidden gather's gradient is a
    reduce-scatter, the combine's an all-gather, the probabilities' a reduce-scatter."""
    par, moe, h, x = ctx.par, ctx.model.moe, ctx.model.hidden_size, ctx.hidden_bytes
    n = par.etp * par.ep
    if n == 1:
        return []
    t = ctx.tokens_local
    group = Group(("tp", "ep"), expert=True)
    source = SOURCE.replace("MoEAlltoAllTokenDispatcher", "MoEAllGatherTokenDispatcher")
    hidden, probs = n * t * h * x, n * t * moe.num_experts * x

    def call(name: str, op: Op, message: int, dtype: str | None = None) -> Call:
        return _ep(ctx, name=name, op=op, phase=phase, message=message, count=layers, group=group, source=source,
                   dtype=dtype)  # fmt: skip

    if phase == "forward":
        return [
            call("ep.allgather.routing_map", Op.ALLGATHER, n * t * moe.num_experts, "bool"),
            call("ep.allgather.probs", Op.ALLGATHER, probs),
            call("ep.allgather.hidden", Op.ALLGATHER, hidden),
            call("ep.allgather.combine", Op.REDUCESCATTER, hidden),
        ]
    return [
        call("ep.allgather.combine.bwd", Op.ALLGATHER, hidden),
        call("ep.allgather.hidden.bwd", Op.REDUCESCATTER, hidden),
        call("ep.allgather.probs.bwd", Op.REDUCESCATTER, probs),
    ]


def _backward(ctx: Context, layers: int) -> list[Call]:
    rows = _routed(ctx)
    if ctx.par.ep_dispatch == "allgather":
        return _allgather(ctx, layers, "backward")
    out = []
    if _deepep(ctx):
        out += deepep.calls(ctx, layers, ctx.tokens_local, 0, "backward")
    elif ctx.par.ep > 1:
        message = rows * ctx.model.hidden_size * ctx.hidden_bytes
        group = Group(("ep",), expert=True)
        out += [
            _ep(ctx, name=name, op=Op.ALLTOALL, phase="backward", message=message, count=layers, group=group)
            for name in ("ep.combine.bwd", "ep.dispatch.bwd")
        ]
        out += _probs(ctx, layers, rows, "backward")
    return out + _expert_tp(ctx, layers, rows, "backward")
