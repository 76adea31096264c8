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
from ..flavours import Zero
from ..layout import Group, twin
from ..ledger import Call, fill_buckets
from ..ledger import rule_call as _call
from ..params import Param, alike_stages, stage_params
from ..recipes import float8_gathered, gathered_param_bytes, quantized
from . import deepspeed

# the stage's two copies' gradients summed every step (Context.param_copies)
COPIES_SOURCE = (
    "DualPipe's two copies summed: DeepSeek-V3 report §3.2.1; deepseek-ai/DualPipe 3da1bbe example_dualpipe.py:167-174"
)
DDP_FIRST_BUCKET_BYTES = 1024 * 1024  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES (torch 2.13)


def calls(ctx: Context) -> list[Call]:
    if not ctx.training:
        return []
    out: list[Call] = []
    classes = _classes(ctx)
    for stage in range(ctx.par.pp):
        for members in classes.get(stage, ()):  # the first stage of its class: the class's calls, on all its stages
            out += [c.on(members) for c in _stage_buffers(ctx, members[0])]
        if ctx.is_last(stage) and ctx.flavour.reports_loss and ctx.par.dp * ctx.par.cp > 1:
            out.append(
                Call(
                    name="dp.loss_report",
                    op=Op.ALLREDUCE,
                    phase="forward",
                    message_bytes=8,
                    calls_per_iteration=ctx.passes,
                    group=Group(("cp", "dp")),
                    source="megatron pretrain_gpt.py loss_func (loss and token count)",
                    stages=(stage,),
                    dtype="fp32",
                )
            )
    return out


def _classes(ctx: Context) -> dict[int, list[tuple[int, ...]]]:
    """The stages whose ranks issue the same data-parallel calls, by their first stage, whose parameters they are built
    from: alike parameter lists (the calls depend on the sizes and names alone), split by schedule.

    With two copies reduced over one group (DualPipe, Context.param_copies, flat buffers: Context.dp_ranks), twins r
    and pp - 1 - r issue one call, so both reduce the lower rank's buffer: the twin holds the same two stages in the
    other chunk order, and one reduction needs both buffers laid out alike element for element (assumed: the copy's
    buffer is laid out as its twin's; deepseek-ai/DualPipe's example sums module by module)."""
    alike = alike_stages(ctx)
    if ctx.param_copies == 1 or ctx.sharded_units:
        return {stage: _by_schedule(ctx, members) for stage, members in alike.items()}
    first = {s: lead for lead, members in alike.items() for s in members}
    pairs: dict[int, list[int]] = {}
    for s in range(ctx.par.pp):
        lower = min(s, twin(ctx.par.schedule.stage_map, s, ctx.par.pp))
        pairs.setdefault(first[lower], []).append(s)
    return {members[0]: [tuple(members)] for members in pairs.values()}


def _by_schedule(ctx: Context, stages: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Stages with alike parameters, split further where the pipeline schedule gives their units different
    gather counts (FSDP2 inside torch.distributed.pipelining: the warm-up depends on the stage)."""
    if not fsdp2_pipelined(ctx):
        return [stages]
    groups: dict[tuple, list[int]] = {}
    for s in stages:
        groups.setdefault(_gathers(ctx, s, root=False), []).append(s)
    return [tuple(g) for g in groups.values()]


def _stage_buffers(ctx: Context, stage: int) -> list[Call]:
    """The gradient and parameter traffic of one rank of ``stage``: its dense and expert buffers, and
    Megatron's optimizer-step reductions."""
    dense, expert = stage_params(ctx, stage)
    out = []
    # the copies' replicas in the group (Context.dp_ranks): the stage map whose copies it spans
    mirror = ctx.par.schedule.stage_map if ctx.param_copies > 1 and not ctx.sharded_units else None
    copies = ctx.param_copies > 1  # the copies' gradients are summed whatever dp is (example_dualpipe.py runs dp 1)
    if ctx.dp_ranks() > 1 or copies:
        out += _buffer(ctx, dense, Group(("cp", "dp"), mirror=mirror), "dp", ctx.dp_ranks(), stage)
    if expert and (ctx.dp_ranks(expert=True) > 1 or copies):
        out += _buffer(ctx, expert, Group(("dp",), expert=True, mirror=mirror), "edp", ctx.dp_ranks(True), stage)
    if ctx.flavour.optimizer_step_reductions:
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
        _call(name=f"dp.{name}", op=Op.ALLREDUCE, phase="optimizer", message=4, count=1, group=Group(dims),
              source=source, dtype="fp32")
        for name, source in wanted
    ]  # fmt: skip


def _buffer(ctx: Context, params: Sequence[Param], group: Group, kind: str, size: int, pp_stage: int) -> list[Call]:
    if ctx.flavour.zero is Zero.DEEPSPEED:
        return deepspeed.calls(ctx, params, group, kind, size)
    if ctx.sharded_units:
        return _sharded_units(ctx, params, group, kind, size, pp_stage)
    if ctx.work.fp8_param_gather and ctx.par.zero_stage <= 1:
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
    source = ctx.flavour.dp_sources[stage]
    buckets = _buckets(ctx, params, size)
    gbytes, pbytes, m = ctx.grad_bytes, ctx.param_bytes, ctx.passes
    out = ddp_used_map(ctx, params, group, kind)
    for numel, count in _counted(buckets):
        # ZeRO-0 all-reduces the bucket's gradients; ZeRO-1/2 reduce-scatter them (ZeRO-2 every micro-batch)
        # and all-gather the updated parameters
        grads = _call(
            name=f"{kind}.grads", op=Op.ALLREDUCE if stage == 0 else Op.REDUCESCATTER, phase="backward",
            message=numel * gbytes, count=count * (m if stage == 2 else 1), group=group, source=source,
            dtype=ctx.grad_dtype,
        )  # fmt: skip
        if stage == 0:
            out.append(grads)
            continue
        out += [
            grads,
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


def _buckets(ctx: Context, params: Sequence[Param], dp_size: int) -> list[int]:
    """Gradient buckets in elements: parameters taken in reverse registration order, a bucket closing
    once it reaches the cap (torch Reducer and Megatron's _ParamAndGradBuffer use the same rule); DDP's
    Reducer (ddp_buckets) has its own first bucket and keeps its initial layout with find_unused_parameters."""
    if ctx.flavour.ddp_switches and ctx.par.zero_stage == 0:
        return ddp_buckets(ctx, params)
    cap = _cap_elements(ctx)
    buckets = fill_buckets((p.numel for p in reversed(params)), lambda total, _: total >= cap)
    if ctx.flavour.bucket_pad_lcm_128 and ctx.par.zero_stage >= 1:
        pad = lcm(dp_size, 128)
        buckets = [-(-b // pad) * pad for b in buckets]
    return buckets


def _cap_elements(ctx: Context) -> float:
    if ctx.par.dp_bucket_bytes is not None:
        return max(1, ctx.par.dp_bucket_bytes // ctx.grad_bytes)
    if ctx.flavour.bucket_cap_bytes is not None:
        return ctx.flavour.bucket_cap_bytes / ctx.grad_bytes
    return float("inf")  # Megatron without --overlap-grad-reduce: one bucket per buffer


def ddp_buckets(ctx: Context, params: Sequence[Param]) -> list[int]:
    """DistributedDataParallel's steady-state buckets in elements (torch 2.13).

    Limits (torch/nn/parallel/distributed.py _BucketCapacityConfig.create / compute_bucket_size_limits, and
    reducer.cpp rebuild_buckets): [first, cap] with cap = bucket_cap_mb MiB (25 by default) and first =
    dist._DEFAULT_FIRST_BUCKET_BYTES (1 MiB) when bucket_cap_mb is DDP's default, else the cap itself.
    compute_bucket_assignment_by_size adds tensors in order and closes a bucket once it holds >= its limit,
    then moves to the next limit. The order: once rebuilt (plain DDP after step 0, static_graph after step 1),
    the order gradients became ready, the reverse of registration for a plain decoder; with
    find_unused_parameters (and no static graph) never rebuilt, so registration order (the initial
    assignment; its buckets are then reduced last first)."""
    cap_bytes, explicit = ddp_cap_bytes(ctx)
    limits = [cap_bytes] if explicit or cap_bytes <= DDP_FIRST_BUCKET_BYTES else [DDP_FIRST_BUCKET_BYTES, cap_bytes]
    ddp = ctx.par.ddp
    order = params if ddp.find_unused_parameters and not ddp.static_graph else list(reversed(params))
    last = len(limits) - 1
    return fill_buckets((p.numel for p in order), lambda total, i: total * ctx.grad_bytes >= limits[min(i, last)])


def ddp_cap_bytes(ctx: Context) -> tuple[int, bool]:
    """(bucket cap in bytes, whether the user gave it): bucket_cap_mb (int(mb x 2^20), distributed.py), the older
    dp_bucket_bytes, or DDP's default 25 MiB."""
    if ctx.par.ddp.bucket_cap_mb is not None:
        return int(ctx.par.ddp.bucket_cap_mb * 2**20), True
    if ctx.par.dp_bucket_bytes is not None:
        return ctx.par.dp_bucket_bytes, True
    return ctx.flavour.bucket_cap_bytes, False


def ddp_used_map(ctx: Context, params: Sequence[Param], group: Group, kind: str) -> list[Call]:
    """find_unused_parameters without static_graph: once the last bucket is ready, the Reducer all-reduces its
    int32 map of which parameter tensors this rank used (reducer.cpp mark_variable_ready ->
    all_reduce_local_used_map; local_used_map_ holds one int per tensor, initialize_local_used_map). Once per
    step: under no_sync the Reducer expects no hooks."""
    ddp = ctx.par.ddp
    if not (ctx.flavour.ddp_switches and ctx.par.zero_stage == 0 and ddp.find_unused_parameters):
        return []
    if ddp.static_graph:
        return []  # only the first iteration's delayed reduction sends the map (static_graph_first_iteration)
    return [
        _call(
            name=f"{kind}.used_parameters",
            op=Op.ALLREDUCE,
            phase="backward",
            message=4 * sum(p.tensors for p in params),
            count=1,
            group=group,
            source="torch 2.13 reducer.cpp Reducer::all_reduce_local_used_map (find_unused_parameters)",
            dtype="int32",
        )
    ]


def steady_state(ctx: Context) -> list[str]:
    """When the ledger's steady state starts, where a framework's first steps differ (plan warnings)."""
    if not (ctx.training and ctx.flavour.ddp_switches and ctx.par.zero_stage == 0 and ctx.par.dp * ctx.par.cp > 1):
        return []
    ddp = ctx.par.ddp
    notes = []
    if ddp.static_graph:
        notes.append(
            "DDP static_graph: step 0 reduces all gradients in one bucket after backward (with the used-parameter "
            "map), step 1 in one bucket, step 2 rebuilds the buckets (two int32 broadcasts) and uses them: the "
            "ledger is the steady state from step 2 on, without the rebuild broadcasts from step 3"
        )
    elif ddp.find_unused_parameters:
        notes.append(
            "DDP find_unused_parameters: the buckets are never rebuilt, every step from step 0 is the ledger's steady "
            "state (the initial bucket layout and the used-parameter all-reduce)"
        )
    else:
        notes.append(
            "DDP: step 0 reduces all gradients in one bucket; step 1 rebuilds the buckets (two int32 broadcasts): "
            "the ledger is the steady state from step 1 on, without the rebuild broadcasts from step 2"
        )
    if ddp.gradient_as_bucket_view:
        notes.append("DDP gradient_as_bucket_view: gradients alias the buckets; the calls do not change")
    return notes


def _counted(sizes: list[int]) -> list[tuple[int, int]]:
    """Equal buckets as one row with a count, in first-seen order."""
    counts: dict[int, int] = {}
    for s in sizes:
        counts[s] = counts.get(s, 0) + 1
    return list(counts.items())


def _sharded_units(ctx: Context, params: Sequence[Param], group: Group, kind: str, size: int, stage: int) -> list[Call]:
    """ZeRO-3 / FSDP: per unit, all-gathers in forward (and backward) and a reduce-scatter of its gradients:
    every micro-batch, or as torch.distributed.pipelining drives FSDP2 (fsdp2_pipelined)."""
    low = fsdp_float8_all_gather(ctx, group)
    units: dict[str, tuple[int, int, int]] = {}  # unit -> (elements, bytes gathered, float8 weights)
    for p in params:
        numel, gathered, fp8 = units.get(p.unit, (0, 0, 0))
        units[p.unit] = (numel + p.numel, gathered + gathered_param_bytes(ctx, p, group.expert),
                         fp8 + (low and quantized(p.name)))  # fmt: skip
    hs = ctx.par.hybrid_shard_size
    shard_group = (
        Group(tuple(d for d in ("cp", "dp_shard") if d != "cp" or ctx.par.cp > 1), group.expert, split=hs)
        if hs
        else group
    )
    source = ctx.flavour.dp_sources[ctx.par.zero_stage]
    reduces = ctx.passes
    if fsdp2_pipelined(ctx):
        source += " in torch.distributed.pipelining (stage.py backward_maybe_with_nosync, perform_reduce_grad)"
        reduces = 1
    out = []
    by_size: dict[tuple[int, int, int, int, int], int] = {}
    gathers = {root: _gathers(ctx, stage, root) for root in (False, True)}  # it reads a unit as the root or not
    for unit, sizes in units.items():
        key = (*sizes, *gathers[unit == "root"])
        by_size[key] = by_size.get(key, 0) + 1
    sharded = size > 1  # a copy of one rank (dp x cp 1 under DualPipe) gathers nothing: only the copies' sum
    for (numel, gathered, fp8, forward, backward), count in by_size.items():
        for name, phase, gathers in (
            (f"{kind}.params", "forward", forward),
            (f"{kind}.params.bwd", "backward", backward),
        ):
            if gathers and sharded:
                out.append(
                    _call(
                        name=name,
                        op=Op.ALLGATHER,
                        phase=phase,
                        message=gathered,
                        count=count * gathers,
                        group=shard_group,
                        source=source + (f"; {FSDP_FLOAT8} ({fp8} float8 weights at 1 B/element)" if fp8 else ""),
                        dtype=("uint8" if gathered != numel else "fp8") if fp8 else ctx.work.param_dtype,
                    )
                )
                if fp8 and not ctx.work.fp8_precompute_scale:
                    out.append(_float8_amax(name, phase, fp8 * count * gathers, shard_group))
        if sharded:
            out.append(
                _call(
                    name=f"{kind}.grads",
                    op=Op.REDUCESCATTER,
                    phase="backward",
                    message=numel * ctx.grad_bytes,
                    count=count * reduces,
                    group=shard_group,
                    source=source,
                    dtype=ctx.grad_dtype,
                )
            )
        out += _replicas(ctx, numel * ctx.grad_bytes // (hs or size), count * reduces, group.expert, kind, source)
    if low and ctx.work.fp8_precompute_scale and sharded:
        out += _precomputed_scales(ctx, sum(fp8 for _, _, fp8 in units.values()), shard_group)
    return out


def _replicas(ctx: Context, shard_bytes: int, count: int, expert: bool, kind: str, source: str) -> list[Call]:
    """The all-reduce of a unit's reduced gradient shard across the replicas that hold the same shard: HSDP's
    replicate groups (dp / hybrid_shard_size of them) and, under DualPipe, the stage's two copies (Context.param_copies:
    each copy shards its stages over its own dp x cp ranks, its gathers following its own order; the twins then sum
    the shards and each copy's optimizer steps its shard alike, as HSDP's replicas do)."""
    hs, copies = ctx.par.hybrid_shard_size, ctx.param_copies
    count_replicas = ((ctx.par.expert_dp if expert else ctx.par.dp) // hs if hs else 1) * copies
    if count_replicas == 1:
        return []
    replicas = Group(
        ("dp_rep",) if hs else (), expert, split=hs, mirror=ctx.par.schedule.stage_map if copies > 1 else None
    )
    where = " (HSDP replicate all-reduce)" if hs else ""
    if copies > 1:
        where += f" ({COPIES_SOURCE})"
    return [
        _call(name=f"{kind}.grads.replicas", op=Op.ALLREDUCE, phase="backward", message=shard_bytes,
              count=count, group=replicas, source=source + where, dtype=ctx.grad_dtype)
    ]  # fmt: skip


# torchao FSDP2 float8 all-gather (pytorch/ao 36027d82 torchao/float8/fsdp_utils.py): WeightWithDynamicFloat8CastTensor
# .fsdp_pre_all_gather casts the local shard to float8 before FSDP2 gathers it (1 B per element; FSDP2's
# foreach_all_gather packs a unit's mixed-dtype inputs into one uint8 buffer: torch/distributed/fsdp/_fully_shard/
# _fsdp_collectives.py)
FSDP_FLOAT8 = "torchao enable_fsdp_float8_all_gather"
FLOAT8_AMAX = (
    "torchao fsdp_utils.py fsdp_pre_all_gather -> float8_scaling_utils.hp_tensor_to_float8_dynamic(reduce_amax=True, "
    "device_mesh=mesh) -> float8_utils.tensor_to_amax: all_reduce(amax, 'MAX') of one fp32 per weight per gather"
)
PRECOMPUTE = (
    "torchao fsdp_utils.py precompute_float8_dynamic_scale_for_fsdp (after the optimizer step): torch._foreach_norm "
    "(ord=inf) of every float8 weight, stacked (Partial), clamp -> Replicate: one all-reduce of N fp32 per mesh "
    "dimension the weights are sharded on"
)


def fsdp_float8_all_gather(ctx: Context, group: Group) -> bool:
    """torchao's FSDP2 float8 all-gather applies to this buffer: a torchao flavour (Flavour.torchao_float8) with
    workload.fp8_param_gather, on the dense parameters (Float8Linear converts nn.Linear; the routed experts'
    grouped weights are not Float8Linear weights)."""
    return float8_gathered(ctx) and not group.expert


def _float8_amax(name: str, phase: str, count: int, group: Group) -> Call:
    """Without precomputed scales, each float8 weight's shard amax is all-reduced (MAX) before every gather."""
    return _call(
        name=name + ".amax", op=Op.ALLREDUCE, phase=phase, message=4, count=count, group=group, source=FLOAT8_AMAX,
        dtype="fp32",
    )  # fmt: skip


def _precomputed_scales(ctx: Context, weights: int, shard_group: Group) -> list[Call]:
    """precompute_float8_dynamic_scale_for_fsdp: once per step, the amaxes of the stage's ``weights`` float8 weights
    in one fp32 tensor, all-reduced over each mesh dimension the DTensor weights are sharded on: FSDP's shard group,
    the HSDP replicas and TP."""
    if not weights:
        return []
    par, hs = ctx.par, ctx.par.hybrid_shard_size
    groups = [("dp.fp8_scales", shard_group)]
    if hs and par.dp // hs > 1:
        groups.append(("dp.fp8_scales.replicas", Group(("dp_rep",), split=hs)))
    if par.tp > 1:
        groups.append(("tp.fp8_scales", Group(("tp",))))
    return [
        _call(name=name, op=Op.ALLREDUCE, phase="optimizer", message=4 * weights, count=1, group=group,
              source=PRECOMPUTE, dtype="fp32")
        for name, group in groups
    ]  # fmt: skip


def fsdp2_pipelined(ctx: Context) -> bool:
    """FSDP2 units inside torch.distributed.pipelining stages (the torch flavour's ZeRO-2/3 with pp > 1)."""
    return ctx.flavour.zero is Zero.FSDP2 and ctx.par.pp > 1 and ctx.par.zero_stage >= 2


def _gathers(ctx: Context, stage: int, root: bool) -> tuple[int, int]:
    """(forward, backward) all-gathers of one unit per iteration.

    Without a pipeline: every micro-batch gathers in forward, and ZeRO-3 again in backward except FSDP2's root,
    which is not resharded after forward (fully_shard's reshard_after_forward=None: False for the root).
    Inside torch.distributed.pipelining (torch 2.13): every backward but the step's reduction runs with
    set_reshard_after_backward(False) and set_requires_gradient_sync(False) (stage.py:844-847
    backward_maybe_with_nosync), and perform_reduce_grad (stage.py:1164-1177, called once after the last
    micro-batch: schedules.py:960 GPipe, :1177 1F1B) reduce-scatters and reshards. So a unit is gathered by its
    first pass of the step, and again only by a pass that follows a forward which resharded it: never with
    reshard_after_forward=False (our torch ZeRO-2) or for the root; with resharding (blocks at ZeRO-3), by
    every forward or backward that follows a forward in the stage's order (pipeline_passes)."""
    m, fsdp2 = ctx.passes, ctx.flavour.zero is Zero.FSDP2
    if not fsdp2_pipelined(ctx):
        again = ctx.par.zero_stage == 3 and not (fsdp2 and root)
        return m, m if again else 0
    if ctx.par.zero_stage == 2 or root:
        return 1, 0
    forward = backward = 0
    previous = None
    for chunk_passes in pipeline_passes(ctx, stage):
        previous = None
        for kind in chunk_passes:
            if previous is None or previous == "F":
                forward += kind == "F"
                backward += kind == "B"
            previous = kind
    return forward, backward


def pipeline_passes(ctx: Context, stage: int) -> list[str]:
    """The order of one stage's forward ("F") and backward ("B") passes in torch.distributed.pipelining
    (torch 2.13 schedules.py): GPipe all forwards then all backwards (ScheduleGPipe._step_microbatches);
    1F1B min(m, pp - stage) warm-up forwards, then backward/forward pairs, then the remaining backwards
    (Schedule1F1B._step_microbatches: warmup_chunks). One list per model chunk the rank holds; the interleaved
    schedule is taken in 1F1B's order (ScheduleInterleaved1F1B interleaves the chunks in rounds): its gather
    count per unit is still m + 1, as in any order whose last pass is a backward (every forward is followed
    by one pass, which gathers), only the split between the forward and backward phases is 1F1B's."""
    m, p = ctx.passes, ctx.par.pp
    warmup = m if ctx.par.schedule.forwards_first else min(m, p - stage)
    return [["F"] * warmup + ["B", "F"] * (m - warmup) + ["B"] * warmup]
