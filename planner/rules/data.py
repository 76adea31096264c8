"""Data parallelism and ZeRO traffic (Rajbhandari et al. 2020, "ZeRO", §5: 2Ψ per rank for DP, ZeRO-1 and
ZeRO-2, 3Ψ for ZeRO-3, Ψ = parameters).

- ZeRO-0 (DDP; megatron/core/distributed/distributed_data_parallel.py, torch DistributedDataParallel):
  gradients all-reduced once per iteration in buckets (DDP skips the other micro-batches with no_sync).
- ZeRO-1 (Megatron distributed optimizer, optimizer/distrib_optimizer.py): reduce-scatter of the gradient
  buckets once per iteration, all-gather of the updated parameter buckets. Megatron pads each bucket to
  a multiple of lcm(dp, 128) elements (param_and_grad_buffer.py).
- ZeRO-2 (DeepSpeed stage 2, FSDP SHARD_GRAD_OP): gradients are partitioned every backward, so the
  reduce-scatter runs every micro-batch; one parameter all-gather per iteration.
- ZeRO-3 (DeepSpeed stage 3, FSDP): per micro-batch and per unit (a transformer layer; the embedding,
  final norm and head form the root unit) an all-gather of the parameters in forward, again in backward,
  and a reduce-scatter of the gradients. PyTorch FSDP2 (fully_shard per block + root) does not reshard the
  root after forward, so the root is not re-gathered in backward; with reshard_after_forward=False (our
  ZeRO-2 for the torch flavour) no unit is, but parameters are still re-gathered every micro-batch
  (reference/pytorch/fsdp2_*.json). Hybrid sharding (HSDP) shards inside groups of hybrid_shard_size and
  all-reduces the sharded gradients across the replicas.
Dense parameters reduce over the data x context parallel group, expert parameters over the expert
data-parallel group. Megatron also all-reduces the loss for reporting (2 fp32 values, last stage) and
the gradient norm in the step (_megatron_step). The DeepSpeed flavour is DeepSpeed's own (rules/deepspeed.py):
all-reduced buckets, not the paper's reduce-scatter.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import lcm

from collectives import Op

from ..context import Context
from ..layout import Group
from ..ledger import Call
from ..params import Param, alike_stages, stage_params
from ..recipes import quantized
from . import deepspeed

DDP_TORCH_BUCKET_BYTES = 25 * 2**20  # DistributedDataParallel(bucket_cap_mb=25)
ZERO_PAPER = "Rajbhandari et al. 2020 (ZeRO) §5"
SOURCES = {
    0: {
        "megatron": "megatron/core/distributed/distributed_data_parallel.py",
        "torch": "torch DistributedDataParallel (Reducer buckets)",
    },
    1: {
        "megatron": "megatron/core/optimizer/distrib_optimizer.py",
        "torch": ZERO_PAPER,
    },
    2: {
        "megatron": "DeepSpeed ZeRO stage 2 semantics; " + ZERO_PAPER,
        "torch": "FSDP2 reshard_after_forward=False",
    },
    3: {
        "megatron": "DeepSpeed ZeRO stage 3 / Megatron-FSDP semantics; " + ZERO_PAPER,
        "torch": "FSDP2 fully_shard",
    },
}


def calls(ctx: Context) -> list[Call]:
    if not ctx.training:
        return []
    out: list[Call] = []
    alike = alike_stages(ctx)  # the buffers' calls depend on the parameter sizes and names alone
    for stage in range(ctx.par.pp):
        if stage in alike:  # the first stage of its class: the class's calls, on all its stages
            out += [c.on(alike[stage]) for c in _stage_buffers(ctx, stage)]
        if ctx.is_last(stage) and ctx.flavour == "megatron" and ctx.par.dp * ctx.par.cp > 1:
            out.append(
                Call(
                    name="dp.loss_report",
                    op=Op.ALLREDUCE,
                    phase="forward",
                    message_bytes=8,
                    calls_per_iteration=ctx.micro_batches,
                    group=Group(("cp", "dp")),
                    source="megatron pretrain_gpt.py loss_func (loss and token count)",
                    stages=(stage,),
                    dtype="fp32",
                )
            )
    return out


def _stage_buffers(ctx: Context, stage: int) -> list[Call]:
    """The gradient and parameter traffic of one rank of ``stage``: its dense and expert buffers, and
    Megatron's optimizer-step reductions."""
    dense, expert = stage_params(ctx, stage)
    out = []
    if ctx.par.dp * ctx.par.cp > 1:
        out += _buffer(ctx, dense, Group(("cp", "dp")), "dp", ctx.par.dp * ctx.par.cp)
    if expert and ctx.par.expert_dp > 1:
        out += _buffer(ctx, expert, Group(("dp",), expert=True), "edp", ctx.par.expert_dp)
    if ctx.flavour == "megatron":
        out += _megatron_step(ctx)
    return out


def _megatron_step(ctx: Context) -> list[Call]:
    """The optimizer step's 1-element reductions (Megatron-LM core_r0.13):
    - gradient norm for clipping (--clip-grad, default 1.0): megatron/core/optimizer/clip_grads.py
      get_grad_norm_fp32 all-reduces the squared norm (fp32) over the optimizer's grad-stats group: the
      model-parallel group (tp x pp) with the plain optimizer, every rank with the distributed optimizer
      (distrib_optimizer.py get_grad_stats_parallel_group returns None, "reduced over all ranks");
    - with fp16 the found-inf flag before unscaling, over the same group (optimizer.py
      _unscale_main_grads_and_check_for_nan; bf16 has no loss scaler).
    The dense and expert optimizers of a ChainedOptimizer share the group, so the norm is reduced once."""
    par = ctx.par
    dims = ("tp", "cp", "dp", "pp") if par.zero_stage >= 1 else ("tp", "pp")
    size = par.world_size if par.zero_stage >= 1 else par.tp * par.pp
    if size == 1:
        return []
    where = "Megatron-LM d98e8a6 megatron/core/optimizer/"
    wanted = [("grad_norm", where + "clip_grads.py:132 get_grad_norm_fp32; distrib_optimizer.py:796")]
    if ctx.work.param_dtype == "fp16":
        wanted.insert(0, ("found_inf", where + "optimizer.py _unscale_main_grads_and_check_for_nan"))
    return [
        Call(
            name=f"dp.{name}",
            op=Op.ALLREDUCE,
            phase="optimizer",
            message_bytes=4,
            calls_per_iteration=1,
            group=Group(dims),
            source=source,
            dtype="fp32",
        )
        for name, source in wanted
    ]


def _buffer(ctx: Context, params: Sequence[Param], group: Group, kind: str, size: int) -> list[Call]:
    if ctx.flavour == "deepspeed":
        return deepspeed.calls(ctx, params, group, kind, size)
    stage = ctx.par.zero_stage
    if stage == 3 or (stage == 2 and ctx.flavour == "torch"):
        return _sharded_units(ctx, params, group, kind, size)
    if ctx.work.fp8_param_gather and stage <= 1:
        # --fp8-param-gather: the TE linear weights live in their own uint8 buffer (param_and_grad_buffer.py
        # groups buffers by parameter dtype), bucketed and gathered apart from the bf16 rest
        low = [p for p in params if quantized(p.name)]
        high = [p for p in params if not quantized(p.name)]
        return _bucketed(ctx, high, group, kind, size) + _bucketed(ctx, low, group, kind, size, ctx.work.recipe)
    return _bucketed(ctx, params, group, kind, size)


def _bucketed(ctx: Context, params: Sequence[Param], group: Group, kind: str, size: int, recipe=None) -> list[Call]:
    """The buckets of one buffer; ``recipe``: the buffer of fp8 (fp4) primary weights, whose all-gather
    moves Recipe.element_bytes per element (``{kind}.params.fp8``)."""
    stage = ctx.par.zero_stage
    if not params:
        return []
    source = SOURCES[stage][ctx.flavour]
    buckets = _buckets(ctx, params, size)
    gbytes, pbytes, m = ctx.grad_bytes, ctx.param_bytes, ctx.micro_batches
    out = []
    for numel, count in _counted(buckets):
        if stage == 0:
            out.append(
                _call(
                    name=f"{kind}.grads",
                    op=Op.ALLREDUCE,
                    phase="backward",
                    message=numel * gbytes,
                    count=count,
                    group=group,
                    source=source,
                    dtype=ctx.grad_dtype,
                )
            )
            continue
        reduce_count = count * (m if stage == 2 else 1)
        out += [
            _call(
                name=f"{kind}.grads",
                op=Op.REDUCESCATTER,
                phase="backward",
                message=numel * gbytes,
                count=reduce_count,
                group=group,
                source=source,
                dtype=ctx.grad_dtype,
            ),
            _call(
                name=f"{kind}.params" + (".fp8" if recipe else ""),
                op=Op.ALLGATHER,
                phase="optimizer",
                message=int(numel * recipe.element_bytes) if recipe else numel * pbytes,
                count=count,
                group=group,
                source=source
                + (f"; --fp8-param-gather ({recipe.name}: {recipe.element_bytes:g} B/element)" if recipe else ""),
                dtype=recipe.gemm_dtype if recipe else ctx.work.param_dtype,
            ),
        ]
    return out


def _call(*, name: str, op: Op, phase: str, message: int, count: int, group: Group, source: str, dtype: str) -> Call:
    return Call(
        name=name,
        op=op,
        phase=phase,
        message_bytes=message,
        calls_per_iteration=count,
        group=group,
        source=source,
        dtype=dtype,
    )


def _buckets(ctx: Context, params: Sequence[Param], dp_size: int) -> list[int]:
    """Gradient buckets in elements: parameters taken in reverse registration order, a bucket closing
    once it reaches the cap (torch Reducer and Megatron's _ParamAndGradBuffer use the same rule)."""
    cap = _cap_elements(ctx)
    buckets, current = [], 0
    for p in reversed(params):
        current += p.numel
        if current >= cap:
            buckets.append(current)
            current = 0
    if current:
        buckets.append(current)
    if ctx.flavour == "megatron" and ctx.par.zero_stage >= 1:
        pad = lcm(dp_size, 128)
        buckets = [-(-b // pad) * pad for b in buckets]
    return buckets


def _cap_elements(ctx: Context) -> float:
    if ctx.par.dp_bucket_bytes is not None:
        return max(1, ctx.par.dp_bucket_bytes // ctx.grad_bytes)
    if ctx.flavour == "torch":
        return DDP_TORCH_BUCKET_BYTES / ctx.grad_bytes
    return float("inf")  # Megatron without --overlap-grad-reduce: one bucket per buffer


def _counted(sizes: list[int]) -> list[tuple[int, int]]:
    """Equal buckets as one row with a count, in first-seen order."""
    counts: dict[int, int] = {}
    for s in sizes:
        counts[s] = counts.get(s, 0) + 1
    return list(counts.items())


def _sharded_units(ctx: Context, params: Sequence[Param], group: Group, kind: str, size: int) -> list[Call]:
    """ZeRO-3 / FSDP: per micro-batch and unit, all-gather forward (and backward), reduce-scatter."""
    units: dict[str, int] = {}
    for p in params:
        units[p.unit] = units.get(p.unit, 0) + p.numel
    torch, m = ctx.flavour == "torch", ctx.micro_batches
    regather_backward = ctx.par.zero_stage == 3
    hs = ctx.par.hybrid_shard_size
    shard_group = (
        Group(tuple(d for d in ("cp", "dp_shard") if d != "cp" or ctx.par.cp > 1), group.expert, split=hs)
        if hs
        else group
    )
    source = SOURCES[ctx.par.zero_stage][ctx.flavour]
    out = []
    by_size: dict[tuple[int, bool], int] = {}
    for unit, numel in units.items():
        again = regather_backward and not (torch and unit == "root")
        by_size[(numel, again)] = by_size.get((numel, again), 0) + 1
    for (numel, again), count in by_size.items():
        out.append(
            _call(
                name=f"{kind}.params",
                op=Op.ALLGATHER,
                phase="forward",
                message=numel * ctx.param_bytes,
                count=count * m,
                group=shard_group,
                source=source,
                dtype=ctx.work.param_dtype,
            )
        )
        if again:
            out.append(
                _call(
                    name=f"{kind}.params.bwd",
                    op=Op.ALLGATHER,
                    phase="backward",
                    message=numel * ctx.param_bytes,
                    count=count * m,
                    group=shard_group,
                    source=source,
                    dtype=ctx.work.param_dtype,
                )
            )
        out.append(
            _call(
                name=f"{kind}.grads",
                op=Op.REDUCESCATTER,
                phase="backward",
                message=numel * ctx.grad_bytes,
                count=count * m,
                group=shard_group,
                source=source,
                dtype=ctx.grad_dtype,
            )
        )
        replicas_count = (ctx.par.expert_dp if group.expert else ctx.par.dp) // hs if hs else 1
        if replicas_count > 1:
            replicas = Group(("dp_rep",), group.expert, split=hs)
            out.append(
                _call(
                    name=f"{kind}.grads.replicas",
                    op=Op.ALLREDUCE,
                    phase="backward",
                    message=numel * ctx.grad_bytes // hs,
                    count=count * m,
                    group=replicas,
                    source=source + " (HSDP replicate all-reduce)",
                    dtype=ctx.grad_dtype,
                )
            )
    return out
