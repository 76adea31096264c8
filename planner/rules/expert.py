"""Expert parallelism traffic per MoE layer and micro-batch
(megatron/core/transformer/moe/token_dispatcher.py, MoEAlltoAllTokenDispatcher).

Each rank holds T = b·(s/c)/t tokens (sequence parallel shards them over TP). Dispatch sends every token to
its top-k experts: a per-rank send buffer of T·k·h elements (x capacity_factor when tokens are padded to a
fixed capacity; dropless otherwise); combine returns the expert outputs the same way. Under uniform routing
(e-1)/e of the buffer leaves the rank, which is what the executed all-to-all schedule counts. Backward runs
the two transposes (same sizes). Dropless routing first all-gathers every rank's per-expert token counts
over the expert-TP x EP group (E int64 per rank). With expert tensor parallelism (expert_tp > 1) the
received tokens are all-gathered over the expert-TP group before the experts and reduce-scattered after.
The dispatch may use fp8 (DeepSeek-V3 §3.3); combine stays in the activation dtype.
"""

from __future__ import annotations

from collectives import Op

from ..context import Context
from ..layout import Group
from ..ledger import Call, recomputed

SOURCE = "megatron/core/transformer/moe/token_dispatcher.py (MoEAlltoAllTokenDispatcher)"


def calls(ctx: Context) -> list[Call]:
    moe = ctx.model.moe
    if moe is None:
        return []
    out = []
    for stage in range(ctx.par.pp):
        layers = ctx.moe_layers(stage) * ctx.micro_batches
        if layers == 0:
            continue
        forward = _forward(ctx, layers)
        out += [c.at(stage) for c in forward]
        if ctx.training:
            out += [c.at(stage) for c in _backward(ctx, layers)]
            if ctx.forward_passes == 2:
                out += [recomputed(c).at(stage) for c in forward]
    return out


def _routed(ctx: Context) -> int:
    """Token-expert rows one rank sends (padded to capacity when a capacity factor is set)."""
    moe = ctx.model.moe
    rows = ctx.tokens_local * moe.top_k
    return round(rows * moe.capacity_factor) if moe.capacity_factor else rows


def _forward(ctx: Context, layers: int) -> list[Call]:
    moe, par, h = ctx.model.moe, ctx.par, ctx.model.hidden_size
    rows = _routed(ctx)
    out = []
    if moe.capacity_factor is None and par.expert_tp * par.ep > 1:
        counts = par.expert_tp * par.ep * moe.num_experts * 8
        out.append(
            _call(
                ctx,
                "ep.token_counts",
                Op.ALLGATHER,
                "forward",
                counts,
                layers,
                Group(("tp", "ep"), expert=True),
                SOURCE + " preprocess",
                "int64",
            )
        )
    if par.ep > 1:
        group = Group(("ep",), expert=True)
        out += [
            _call(
                ctx,
                "ep.dispatch",
                Op.ALLTOALL,
                "forward",
                rows * h * ctx.dispatch_bytes,
                layers,
                group,
                dtype=ctx.work.moe_dispatch_dtype,
            ),
            _call(ctx, "ep.combine", Op.ALLTOALL, "forward", rows * h * ctx.x, layers, group),
        ]
    out += _expert_tp(ctx, layers, rows, "forward")
    return out


def _call(
    ctx: Context,
    name: str,
    op: Op,
    phase: str,
    message: int,
    layers: int,
    group: Group,
    source: str = SOURCE,
    dtype: str | None = None,
) -> Call:
    return Call(name, "ep", op, phase, message, layers, group, source, dtype=dtype or ctx.work.activation_dtype)


def _expert_tp(ctx: Context, layers: int, rows: int, phase: str) -> list[Call]:
    etp = ctx.par.expert_tp
    if etp == 1:
        return []
    message = etp * rows * ctx.model.hidden_size * ctx.x
    group = Group(("tp",), expert=True)
    first, second = (Op.ALLGATHER, Op.REDUCESCATTER) if phase == "forward" else (Op.REDUCESCATTER, Op.ALLGATHER)
    suffix = "" if phase == "forward" else ".bwd"
    source = SOURCE + " (expert TP)"
    return [
        _call(ctx, "ep.expert_tp.gather" + suffix, first, phase, message, layers, group, source),
        _call(ctx, "ep.expert_tp.scatter" + suffix, second, phase, message, layers, group, source),
    ]


def _backward(ctx: Context, layers: int) -> list[Call]:
    rows = _routed(ctx)
    out = []
    if ctx.par.ep > 1:
        message = rows * ctx.model.hidden_size * ctx.x
        group = Group(("ep",), expert=True)
        out += [
            _call(ctx, "ep.combine.bwd", Op.ALLTOALL, "backward", message, layers, group),
            _call(ctx, "ep.dispatch.bwd", Op.ALLTOALL, "backward", message, layers, group),
        ]
    return out + _expert_tp(ctx, layers, rows, "backward")
