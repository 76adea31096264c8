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
q, k, v and their gradients, unless the attention itself runs in fp8 (workload.fp8_dot_product_attention: Megatron
--fp8-dot-product-attention, the recipe's fp8_dpa; recipes.dpa_recipe). Then (TransformerEngine d0067d0da
attention/dot_product_attention/context_parallel.py; the same structure at v2.9, l. 1360 and 2122):
- p2p: the forward quantizes q, k, v before the ring (``combine_and_quantize``; ``if not fp8_recipe.mxfp8(): q, k, v
  = [q_fp8._data, ...]``, l. 1523-1532) and sends ``torch.cat((k.view(-1), v.view(-1)))`` of that uint8 data
  (l. 1690): K/V at 1 B an element (delayed, tensorwise; MXFP8 attention keeps them bf16). The backward sends the
  saved fp8 K/V c-1 times (``if ctx.fp8: if i < cp_size - 1: flash_attn_p2p_communicate(... send_tensor[0] ...)``,
  l. 2466-2476) and no dK/dV per step: at the last step one ``all_to_all_single(dkv_send_buffer, dkv_recv_buffer)``
  of a (cp, *kv.shape) uint8 buffer (l. 2477-2484, ``buffer_dtype = torch.uint8``, every fp8 recipe MXFP8 included):
  one all-to-all of c x K/V elements x 1 B per attention call (``cp.attn.dkv``, op alltoall);
- all_gather: k and v gathered as their fp8 data (AttnFuncWithCPAndKVAllGather: ``q, k, v = [q_fp8._data, ...]``
  before ``gather_along_first_dim``; not MXFP8), dK, dV reduce-scattered in the nominal dtype;
- a2a (Ulysses): q, k, v cross in fp8 only when they arrive quantized (``is_input_fp8``: fp8 MHA, not modelled):
  bf16.

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
from ..recipes import dpa_recipe
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
        else m.kv_heads_per_rank(t) * m.head_size
    )
    return ctx.b * ctx.s_cp * per_token * ctx.hidden_bytes


def v_bytes(ctx: Context) -> int:
    m, t = ctx.model, ctx.par.tp
    per_token = (m.num_attention_heads // t) * m.mla.v_head_dim if m.mla else m.kv_heads_per_rank(t) * m.head_size
    return ctx.b * ctx.s_cp * per_token * ctx.hidden_bytes


def kv_bytes(ctx: Context) -> int:
    return k_bytes(ctx) + v_bytes(ctx)


def _kv_wire(ctx: Context) -> tuple[int, str]:
    """(bytes, dtype) of K and V as TE's CP attention exchanges them: fp8 data, 1 B an element, when the attention
    runs in fp8 with a recipe that quantizes them (recipes.dpa_recipe, Recipe.dpa_quantized_kv; module docstring);
    the hidden states' width otherwise."""
    recipe = dpa_recipe(ctx)
    if recipe is not None and recipe.dpa_quantized_kv:
        return kv_bytes(ctx) // ctx.hidden_bytes, "fp8"
    return kv_bytes(ctx), ctx.hidden_dtype


def q_bytes(ctx: Context) -> int:
    return ctx.b * ctx.s_cp * (ctx.model.num_attention_heads // ctx.par.tp) * ctx.model.head_size * ctx.hidden_bytes


def calls(ctx: Context) -> list[Call]:
    if ctx.par.cp == 1:
        return []
    out = []
    # every call of a stage depends on its number of layers and of those whose attention re-runs alone
    for first, stages in stage_classes(range(ctx.par.pp), lambda stage: _layer_counts(ctx, stage)).items():
        layers, again = _layer_counts(ctx, first)
        out += [c.on(stages) for c in _attention(ctx, layers * ctx.passes, "forward")]
        if not ctx.training:
            continue
        out += [c.on(stages) for c in _attention(ctx, layers * ctx.passes, "backward")]
        if again:  # layers re-run whole, or selective with core_attn: the attention's exchange re-runs
            out += [
                recomputed(c, "attention recompute").on(stages) for c in _attention(ctx, again * ctx.passes, "forward")
            ]
    return out


def _layer_counts(ctx: Context, stage: int) -> tuple[int, int]:
    """(layers, layers whose core attention re-runs in the backward: recompute.rerun_layers)."""
    return len(ctx.stage_layers[stage]), rerun_layers(ctx, stage).attention if ctx.training else 0


def _cp(
    ctx: Context, *, name: str, op: Op, phase: str, message: int, count: int, pairs=None, dtype: str = "",
    source: str = "",
) -> Call:  # fmt: skip
    group, source = Group(("cp",), pairs=pairs), source or (ULYSSES if op == Op.ALLTOALL else SOURCE)
    return rule_call(
        name=name, op=op, phase=phase, message=message, count=count, group=group, source=source,
        dtype=dtype or ctx.hidden_dtype,
    )  # fmt: skip


FP8_DPA = "TransformerEngine d0067d0da context_parallel.py AttnFuncWithCPAndKVP2P (fp8 attention, fp8_dpa)"


def _ring_sends(ctx: Context, layers: int, phase: str, *names: str) -> list[Call]:
    """The p2p ring's exchanges: each named one is c-1 KV-sized sends per layer to the ring's next rank. Under fp8
    attention (recipes.dpa_recipe) the K/V go as fp8 data (_kv_wire) and the dK/dV (``cp.attn.dkv``) as one uint8
    all-to-all of c x K/V elements per attention call at the backward's last step (module docstring)."""
    c, (message, dtype) = ctx.par.cp, _kv_wire(ctx)
    count = (c - 1) * layers
    out = []
    for name in names:
        if name == "cp.attn.dkv" and dpa_recipe(ctx) is not None:
            elements = kv_bytes(ctx) // ctx.hidden_bytes
            out.append(_cp(ctx, name=name, op=Op.ALLTOALL, phase=phase, message=c * elements, count=layers,
                           dtype="uint8", source=FP8_DPA + ": dkv all_to_all_single"))  # fmt: skip
        elif name == "cp.attn.dkv":
            out.append(_cp(ctx, name=name, op=Op.SENDRECV, phase=phase, message=kv_bytes(ctx), count=count,
                           pairs="ring"))  # fmt: skip
        else:
            out.append(_cp(ctx, name=name, op=Op.SENDRECV, phase=phase, message=message, count=count, pairs="ring",
                           dtype=dtype))  # fmt: skip
    return out


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
        # the K/V gathers in fp8 under fp8 attention (_kv_wire); dK/dV reduce-scattered in the nominal dtype
        wire = {Op.ALLGATHER: _kv_wire(ctx), Op.REDUCESCATTER: (kv_bytes(ctx), ctx.hidden_dtype)}
        return [
            _cp(ctx, name=name, op=op, phase=phase, message=ctx.par.cp * wire[op][0], count=layers, dtype=wire[op][1])
            for name, op in what.gathers
        ]
    return [
        _cp(ctx, name=f"cp.attn.{tensor}", op=Op.ALLTOALL, phase=phase, message=size(ctx), count=layers)
        for tensor, size in what.alltoalls
    ]
