"""Context parallelism traffic, per attention layer and micro-batch (Megatron cp_comm_type; the
implementations are TransformerEngine's attention.py: AttnFuncWithCPAndKVP2P, ...KVAllGather, ...QKVOA2A).

- p2p (ring attention; Liu et al. 2023): c-1 steps forward, each passing the K,V chunk to the next rank;
  backward passes K,V again and the accumulated dK,dV, c-1 steps each.
  KV bytes = 2·b·(s/c)·(kv_heads/t)·head_dim·x (MLA: the per-head K of nope+rope dims and V).
- all_gather: K,V all-gathered before attention (c x KV), backward re-gathers them and reduce-scatters dK,dV.
- a2a (Ulysses; Jacobs et al. 2023): all-to-all of q, k, v to head-sharding and of the output back, the
  same four in backward.
Core-attention recompute (selective) or full recompute re-runs the forward exchange in backward.
"""

from __future__ import annotations

from collectives import Op

from ..context import Context
from ..layout import Group
from ..ledger import Call, recomputed

SOURCE = "TransformerEngine attention.py (AttnFuncWithCP*); Megatron-Core cp_comm_type"


def kv_bytes(ctx: Context) -> int:
    m, t = ctx.model, ctx.par.tp
    per_token = (
        (m.num_attention_heads // t) * (m.mla.qk_nope_head_dim + m.mla.qk_rope_head_dim + m.mla.v_head_dim)
        if m.mla
        else 2 * (m.kv_heads // t) * m.head_size
    )
    return ctx.b * ctx.s_cp * per_token * ctx.x


def q_bytes(ctx: Context) -> int:
    return ctx.b * ctx.s_cp * (ctx.model.num_attention_heads // ctx.par.tp) * ctx.model.head_size * ctx.x


def calls(ctx: Context) -> list[Call]:
    if ctx.par.cp == 1:
        return []
    out = []
    for stage in range(ctx.par.pp):
        layers = len(ctx.stage_layers[stage]) * ctx.micro_batches
        forward = _forward(ctx, layers)
        out += [c.at(stage) for c in forward]
        if not ctx.training:
            continue
        out += [c.at(stage) for c in _backward(ctx, layers)]
        if ctx.work.activation_recompute != "none":  # both selective (core attention) and full re-run it
            out += [recomputed(c, "attention recompute").at(stage) for c in forward]
    return out


def _call(ctx, name, op, phase, message, count, pairs=None) -> Call:
    return Call(
        name, "cp", op, phase, message, count, Group(("cp",), pairs=pairs), SOURCE, dtype=ctx.work.activation_dtype
    )


def _forward(ctx: Context, layers: int) -> list[Call]:
    c, kv = ctx.par.cp, kv_bytes(ctx)
    if ctx.par.cp_comm == "p2p":
        return [_call(ctx, "cp.attn.kv", Op.SENDRECV, "forward", kv, (c - 1) * layers, "ring")]
    if ctx.par.cp_comm == "all_gather":
        return [_call(ctx, "cp.attn.kv_gather", Op.ALLGATHER, "forward", c * kv, layers)]
    q = q_bytes(ctx)
    return [
        _call(ctx, "cp.attn.q", Op.ALLTOALL, "forward", q, layers),
        _call(ctx, "cp.attn.kv", Op.ALLTOALL, "forward", kv, layers),
        _call(ctx, "cp.attn.out", Op.ALLTOALL, "forward", q, layers),
    ]


def _backward(ctx: Context, layers: int) -> list[Call]:
    c, kv = ctx.par.cp, kv_bytes(ctx)
    if ctx.par.cp_comm == "p2p":
        return [
            _call(ctx, "cp.attn.kv.bwd", Op.SENDRECV, "backward", kv, (c - 1) * layers, "ring"),
            _call(ctx, "cp.attn.dkv", Op.SENDRECV, "backward", kv, (c - 1) * layers, "ring"),
        ]
    if ctx.par.cp_comm == "all_gather":
        return [
            _call(ctx, "cp.attn.kv_gather.bwd", Op.ALLGATHER, "backward", c * kv, layers),
            _call(ctx, "cp.attn.dkv", Op.REDUCESCATTER, "backward", c * kv, layers),
        ]
    q = q_bytes(ctx)
    return [
        _call(ctx, "cp.attn.dout", Op.ALLTOALL, "backward", q, layers),
        _call(ctx, "cp.attn.dq", Op.ALLTOALL, "backward", q, layers),
        _call(ctx, "cp.attn.dkv", Op.ALLTOALL, "backward", kv, layers),
    ]
