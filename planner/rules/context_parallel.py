"""Context parallelism traffic, per attention layer and micro-batch (Megatron cp_comm_type; the
implementations are TransformerEngine's attention.py: AttnFuncWithCPAndKVP2P, ...KVAllGather, ...QKVOA2A).

- p2p (ring attention; Liu et al. 2023): c-1 steps forward, each passing the K,V chunk to the next rank;
  backward passes K,V again and the accumulated dK,dV, c-1 steps each.
  KV bytes = 2·b·(s/c)·(kv_heads/t)·head_dim·x (MLA: the per-head K of nope+rope dims and V).
- all_gather: K,V all-gathered before attention (c x KV), backward re-gathers them and reduce-scatters dK,dV.
- a2a (Ulysses; Jacobs et al. 2023): TE's flash_attn_a2a_communicate issues one all_to_all_single per
  tensor (transformer_engine/pytorch/attention.py, TE 1.x/2.x: ``for i in range(len(a2a_inputs) + 2)``):
  q, k and v separately to head-sharding, the output back; backward: dout, then dq, dk, dv.
  It needs the KV heads of one TP rank divisible by cp (validated in planner/parallel.py).
Core-attention recompute (selective) or full recompute re-runs the forward exchange in backward.
x is the hidden states' width (Context.hidden_bytes): under an fp8 recipe TE's CP attention exchanges the bf16
q, k, v and their gradients (the fp8 path, fp8 DPA with fp8_dpa / NVTE_FP8_DPA_BWD, is not modelled).

PyTorch's context_parallel (a flavour with Flavour.cp_rotate_methods; parallel.cp_rotate_method) is its own ring
attention: torch/distributed/tensor/experimental/_context_parallel/_attention.py (pytorch bbd719e6)
_templated_ring_attention runs c SDPA steps per attention call, K and V concatenated into one flat buffer of
kv_bytes per rank, rotated by the rotater of ``_cp_options.rotate_method``:

- ``allgather`` (_AllGatherRotater, the default): "We only need to perform allgather once": one all_gather_tensor
  of the buffer per attention call (message c x kv_bytes), each step taking its chunk;
- ``alltoall`` (_AllToAllRotater): c-1 exchanges, each ft_c.permute_tensor(buffer, dsts=[1, .., c-1, 0]): an
  all_to_all_single whose only non-empty split goes to the ring's next rank, so on the wire a send of kv_bytes to
  the next rank and a receive from the previous (NCCL skips empty peers): a ring send/recv here.

The backward (_templated_ring_attention_backward) rotates K/V again with the same rotater, and the K/V gradients
always with the all-to-all rotater (dkv_rotater = ..._RotateMethod.ALL_TO_ALL), once per step, c times, in fp32
(accum_dtype float32: _cp_options.convert_to_f32 True): c sends of the (k + v) elements x 4 B. Load balancing
(enable_load_balance, True by default: each rank holds chunks r and 2c-1-r of the sequence) changes which half of
q or of k/v each step computes, not what is sent.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from collectives import Op

from ..context import Context
from ..layout import Group
from ..ledger import Call, recomputed, rule_call, stage_classes
from ..recompute import rerun_layers

SOURCE = "TransformerEngine attention.py (AttnFuncWithCP*); Megatron-Core cp_comm_type"
TORCH_CP = "torch/distributed/tensor/experimental/_context_parallel/_attention.py (pytorch bbd719e6) "
TORCH_SOURCES = {
    "allgather": TORCH_CP + "_AllGatherRotater: one all_gather_tensor of the K/V buffer per attention call",
    "alltoall": TORCH_CP + "_AllToAllRotater: c-1 permute_tensor (all_to_all_single to the next rank) per call",
    "dkv": TORCH_CP + "_templated_ring_attention_backward dkv_rotater (ALL_TO_ALL, fp32): c permute_tensor per call",
}
ULYSSES = "TransformerEngine attention.py AttnFuncWithCPAndQKVOA2A / flash_attn_a2a_communicate (one a2a per tensor)"


def k_bytes(ctx: Context) -> int:
    m, t = ctx.model, ctx.par.tp
    per_token = (
        (m.num_attention_heads // t) * (m.mla.qk_nope_head_dim + m.mla.qk_rope_head_dim)
        if m.mla
        else (m.kv_heads // t) * m.head_size
    )
    return ctx.b * ctx.s_cp * per_token * ctx.hidden_bytes


def v_bytes(ctx: Context) -> int:
    m, t = ctx.model, ctx.par.tp
    per_token = (m.num_attention_heads // t) * m.mla.v_head_dim if m.mla else (m.kv_heads // t) * m.head_size
    return ctx.b * ctx.s_cp * per_token * ctx.hidden_bytes


def kv_bytes(ctx: Context) -> int:
    return k_bytes(ctx) + v_bytes(ctx)


def q_bytes(ctx: Context) -> int:
    return ctx.b * ctx.s_cp * (ctx.model.num_attention_heads // ctx.par.tp) * ctx.model.head_size * ctx.hidden_bytes


def calls(ctx: Context) -> list[Call]:
    if ctx.par.cp == 1:
        return []
    out = []
    # every call of a stage depends on its number of layers and of those whose attention re-runs alone
    for first, stages in stage_classes(range(ctx.par.pp), lambda stage: _layer_counts(ctx, stage)).items():
        layers, again = _layer_counts(ctx, first)
        out += [c.on(stages) for c in _attention(ctx, layers * ctx.micro_batches, "forward")]
        if not ctx.training:
            continue
        out += [c.on(stages) for c in _attention(ctx, layers * ctx.micro_batches, "backward")]
        if again:  # layers re-run whole, or selective with core_attn: the attention's exchange re-runs
            out += [
                recomputed(c, "attention recompute").on(stages)
                for c in _attention(ctx, again * ctx.micro_batches, "forward")
            ]
    return out


def _layer_counts(ctx: Context, stage: int) -> tuple[int, int]:
    """(layers, layers whose core attention re-runs in the backward: recompute.rerun_layers)."""
    return len(ctx.stage_layers[stage]), rerun_layers(ctx, stage).attention if ctx.training else 0


def _cp(ctx: Context, *, name: str, op: Op, phase: str, message: int, count: int, pairs=None) -> Call:
    group, source = Group(("cp",), pairs=pairs), ULYSSES if op == Op.ALLTOALL else SOURCE
    return rule_call(
        name=name, op=op, phase=phase, message=message, count=count, group=group, source=source,
        dtype=ctx.hidden_dtype,
    )  # fmt: skip


def _ring_sends(ctx: Context, layers: int, phase: str, *names: str) -> list[Call]:
    """The p2p ring's exchanges: each named one is c-1 KV-sized sends per layer to the ring's next rank."""
    count = (ctx.par.cp - 1) * layers
    return [
        _cp(ctx, name=name, op=Op.SENDRECV, phase=phase, message=kv_bytes(ctx), count=count, pairs="ring")
        for name in names
    ]


def rotate_method(ctx: Context) -> str | None:
    """PyTorch's rotate method for this layout (parallel.cp_rotate_method, else the flavour's default); None under
    TransformerEngine's context parallelism (parallel.cp_comm)."""
    methods = ctx.flavour.cp_rotate_methods
    return (ctx.par.cp_rotate_method or methods[0]) if methods else None


def _torch_ring(ctx: Context, layers: int, phase: str, name: str, message: int, method: str, dtype: str) -> Call:
    """One rotation of torch's ring attention over ``layers`` attention calls (see the module's docstring)."""
    c = ctx.par.cp
    if method == "allgather":
        return rule_call(
            name=name + "_gather", op=Op.ALLGATHER, phase=phase, message=c * message, count=layers,
            group=Group(("cp",)), source=TORCH_SOURCES[method], dtype=dtype,
        )  # fmt: skip
    sends = c if name.endswith("dkv") else c - 1
    source = TORCH_SOURCES["dkv" if name.endswith("dkv") else method]
    return rule_call(
        name=name, op=Op.SENDRECV, phase=phase, message=message, count=sends * layers,
        group=Group(("cp",), pairs="ring"), source=source, dtype=dtype,
    )  # fmt: skip


def _torch_forward(ctx: Context, layers: int, method: str) -> list[Call]:
    return [_torch_ring(ctx, layers, "forward", "cp.ring.kv", kv_bytes(ctx), method, ctx.hidden_dtype)]


def _torch_backward(ctx: Context, layers: int, method: str) -> list[Call]:
    dkv = kv_bytes(ctx) // ctx.hidden_bytes * 4  # the fp32 accumulators of dK and dV (convert_to_f32)
    return [
        _torch_ring(ctx, layers, "backward", "cp.ring.kv.bwd", kv_bytes(ctx), method, ctx.hidden_dtype),
        _torch_ring(ctx, layers, "backward", "cp.ring.dkv", dkv, "alltoall", "fp32"),
    ]


class _Phase(NamedTuple):
    """What one phase of the attention exchanges, per CP method: torch's rotater, the p2p ring's sends, the
    all-gather path's (name, op) calls of c x KV each, the a2a (Ulysses) path's (tensor, bytes) calls."""

    torch: Callable[[Context, int, str], list[Call]]
    ring: tuple[str, ...]
    gathers: tuple[tuple[str, Op], ...]
    alltoalls: tuple[tuple[str, Callable[[Context], int]], ...]


_PHASES = {
    "forward": _Phase(
        _torch_forward, ("cp.attn.kv",), (("cp.attn.kv_gather", Op.ALLGATHER),),
        (("q", q_bytes), ("k", k_bytes), ("v", v_bytes), ("out", q_bytes)),
    ),
    "backward": _Phase(
        _torch_backward, ("cp.attn.kv.bwd", "cp.attn.dkv"),
        (("cp.attn.kv_gather.bwd", Op.ALLGATHER), ("cp.attn.dkv", Op.REDUCESCATTER)),
        (("dout", q_bytes), ("dq", q_bytes), ("dk", k_bytes), ("dv", v_bytes)),
    ),
}  # fmt: skip


def _attention(ctx: Context, layers: int, phase: str) -> list[Call]:
    """The attention's CP exchanges of one phase (``_PHASES``), by the run's CP method."""
    what = _PHASES[phase]
    method = rotate_method(ctx)
    if method:
        return what.torch(ctx, layers, method)
    if ctx.par.cp_comm == "p2p":
        return _ring_sends(ctx, layers, phase, *what.ring)
    if ctx.par.cp_comm == "all_gather":
        message = ctx.par.cp * kv_bytes(ctx)
        return [_cp(ctx, name=name, op=op, phase=phase, message=message, count=layers) for name, op in what.gathers]
    return [
        _cp(ctx, name=f"cp.attn.{tensor}", op=Op.ALLTOALL, phase=phase, message=size(ctx), count=layers)
        for tensor, size in what.alltoalls
    ]
