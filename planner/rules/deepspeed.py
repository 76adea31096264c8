"""ZeRO data parallelism as DeepSpeed runs it (Rajbhandari et al. 2020, "ZeRO"), read from DeepSpeed's source
(github.com/deepspeedai/DeepSpeed 0.19.6, commit edaa722; the recorded runs in tests/reference/deepspeed are
0.19.8) and matched rank by rank against those runs.

- ZeRO-0 (engine.py ``allreduce_gradients`` -> ``buffered_allreduce_fallback`` -> ``allreduce_no_retain``): at
  the accumulation boundary, gradients in registration order, a bucket closing once it holds *more* than
  MEMORY_OPT_ALLREDUCE_SIZE = 5e8 elements; one all-reduce per bucket.
- ZeRO-1/2 (stage_1_and_2.py): gradients go into an IPG bucket that is flushed *before* a parameter would make it
  exceed ``reduce_bucket_size`` (``reduce_independent_p_g_buckets_and_remove_grads``); a flush runs
  ``average_tensor`` -> ``allreduce_and_scatter``: one **all-reduce** of the bucket (use_multi_rank_bucket_allreduce,
  default on), not a reduce-scatter. A parameter larger than the bucket is reduced alone, its per-partition slices
  grouped until they exceed ``reduce_bucket_size``. ZeRO-1 reduces only at the accumulation boundary, walking the
  flat group in registration order (``reduce_gradients``); ZeRO-2 reduces every micro-batch from the backward
  hooks, in gradient order (reverse registration). Step: with fp16/bf16 an overflow check (``has_overflow``:
  1 uint8 all-reduce, check_grad_overflow defaults on for both), the gradient norm (``get_grad_norm_direct``: 1 fp32
  all-reduce per parameter group), then the updated partitions come back with one ``all_gather_into_tensor``
  per parameter group (runtime/utils.py ``all_gather_dp_groups``: allgather_bucket_size is unused when the
  backend has all_gather_into_tensor). The flat group is padded to a multiple of 2 x dp
  (nccl_start_alignment_factor = 2).
- ZeRO-3 (stage3.py, partitioned_param_coordinator.py, partition_parameters.py): parameters of at most
  ``stage3_param_persistence_threshold`` elements stay resident (parameter_offload.py
  ``mark_persistent_parameters``) and are all-gathered one by one after the step (``_post_step``). The others are
  fetched module by module (``fetch_sub_module``; containers own no parameters but prefetch too, module_tree):
  the module's own missing parameters in one call, then a
  prefetch of the next parameters of the recorded trace up to ``stage3_prefetch_bucket_size`` elements (and
  ``stage3_max_live_parameters``) in one coalesced call; after a module runs, a parameter is released unless the
  prefetcher already passed its next use or it recurs within ``stage3_max_reuse_distance`` elements
  (``__params_to_release``). Every call carries ceil(numel/dp) x dp elements per parameter. Gradients are
  reduce-scattered every micro-batch in buckets flushed before exceeding ``reduce_bucket_size``
  (``reduce_scatter_coalesced``: one reduce_scatter_tensor of the padded bucket). Step: with fp16 only an
  overflow check (``_overflow_check_and_loss_scale_update``), one fp64 gradient-norm all-reduce per sub-group of
  ``sub_group_size`` partition elements.

The model-parallel group (tp x pp, Megatron-DeepSpeed's mpu) gets the same 1-element reductions when tp*pp > 1.
A Linear's weight and bias count as one parameter (planner/params.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from itertools import accumulate

from collectives import Op

from ..context import Context
from ..layout import Group
from ..ledger import Call, fill_buckets, rule_call
from ..params import Param

DS = "DeepSpeed 0.19.6 "
MEMORY_OPT_ALLREDUCE_SIZE = 500_000_000  # deepspeed/runtime/constants.py, engine.allreduce_gradients default
NCCL_START_ALIGNMENT = 2  # stage_1_and_2.py nccl_start_alignment_factor: flat groups pad to 2 x dp elements
OVERFLOW_BYTES = 1  # has_overflow: a uint8 flag
NORM_BYTES = {1: 4, 2: 4, 3: 8}  # fp32 norm in stage_1_and_2.get_grad_norm_direct; fp64 in stage3 (.double())


def calls(ctx: Context, params: Sequence[Param], group: Group, kind: str, size: int) -> list[Call]:
    """The calls one rank issues for one parameter group reduced over ``group`` of ``size`` ranks."""
    numels = [p.numel for p in params]
    stage = ctx.par.zero_stage
    if stage == 0:
        return _zero0(ctx, numels, group, kind)
    out = _zero12(ctx, numels, group, kind, size) if stage in (1, 2) else _zero3(ctx, params, group, kind, size)
    return out + _step_checks(ctx, numels, group, kind, size)


def _call(
    *, name: str, op: Op, phase: str, elements: int, count: int, group: Group, source: str, dtype: str, itemsize: int
) -> Call:
    message = elements * itemsize
    return rule_call(
        name=name, op=op, phase=phase, message=message, count=count, group=group, source=DS + source, dtype=dtype
    )


def _rows(ctx: Context, sizes: list[int], **kw) -> list[Call]:
    """Equal sizes become one row with their count (times ``per``), first-seen order."""
    per = kw.pop("per", 1)
    counts: dict[int, int] = {}
    for s in sizes:
        counts[s] = counts.get(s, 0) + 1
    return [_call(elements=s, count=n * per, **kw) for s, n in counts.items()]


def _grads(ctx: Context, group: Group) -> dict:
    """The keywords of a gradient row (its group, dtype and bytes per element)."""
    return {"group": group, "dtype": ctx.grad_dtype, "itemsize": ctx.grad_bytes}


def _params(ctx: Context, group: Group) -> dict:
    """The keywords of a parameter row."""
    return {"group": group, "dtype": ctx.work.param_dtype, "itemsize": ctx.param_bytes}


def _padded(numel: int, ranks: int) -> int:
    return -(-numel // ranks) * ranks


# ---- ZeRO-0 -------------------------------------------------------------------------------------------------


def _zero0(ctx: Context, numels: list[int], group: Group, kind: str) -> list[Call]:
    # allreduce_no_retain: flush once past the size
    buckets = fill_buckets(numels, lambda total, _: total > MEMORY_OPT_ALLREDUCE_SIZE)
    grads = {"name": f"{kind}.grads", "op": Op.ALLREDUCE, "phase": "backward", **_grads(ctx, group)}
    return _rows(ctx, buckets, source="engine.py buffered_allreduce_fallback", **grads)


# ---- ZeRO-1/2 -----------------------------------------------------------------------------------------------


def _flat_partition(numels: list[int], ranks: int) -> int:
    """Elements per rank of the flat group: the total padded to 2 x dp, split evenly."""
    return _padded(sum(numels), NCCL_START_ALIGNMENT * ranks) // ranks


def _ipg_buckets(numels: list[int], order: list[int], cap: int) -> list[list[int]]:
    """Parameter indices per IPG flush: a bucket is flushed before a parameter would make it exceed ``cap``."""
    buckets: list[list[int]] = [[]]
    elements = 0
    for i in order:
        if elements + numels[i] > cap and buckets[-1]:
            buckets.append([])
            elements = 0
        buckets[-1].append(i)
        elements += numels[i]
    return [b for b in buckets if b]


def _allreduce_sizes(bucket: list[int], numels: list[int], starts: list[int], partition: int, cap: int) -> list[int]:
    """``allreduce_and_scatter``: the bucket's per-partition slices, grouped until they exceed ``cap``. Only an
    oversized single parameter gives more than one all-reduce."""
    slices = []
    for i in bucket:
        lo, hi = starts[i], starts[i] + numels[i]
        while lo < hi:
            end = min(hi, (lo // partition + 1) * partition)
            slices.append(end - lo)
            lo = end
    return fill_buckets(slices, lambda total, _: total > cap)


def _zero12(ctx: Context, numels: list[int], group: Group, kind: str, size: int) -> list[Call]:
    stage = ctx.par.zero_stage
    cap = _reduce_cap(ctx)
    starts = [0, *accumulate(numels)][:-1]
    partition = _flat_partition(numels, size)
    order = list(range(len(numels))) if stage == 1 else list(reversed(range(len(numels))))
    sizes = [s for b in _ipg_buckets(numels, order, cap) for s in _allreduce_sizes(b, numels, starts, partition, cap)]
    per, source = ctx.passes if stage == 2 else 1, "stage_1_and_2.py average_tensor -> allreduce_and_scatter"
    grads = _rows(ctx, sizes, per=per, name=f"{kind}.grads", op=Op.ALLREDUCE, phase="backward", source=source,
                  **_grads(ctx, group))  # fmt: skip
    source = "runtime/utils.py all_gather_into_tensor_dp_groups"
    gather = _call(name=f"{kind}.params", op=Op.ALLGATHER, phase="optimizer", elements=partition * size, count=1,
                   source=source, **_params(ctx, group))  # fmt: skip
    return [*grads, gather]


def _reduce_cap(ctx: Context) -> int:
    """reduce_bucket_size; a request's dp_bucket_bytes (the older, byte-denominated knob) converts to it."""
    zc = ctx.par.zero_config
    if ctx.par.dp_bucket_bytes is not None and zc.reduce_bucket_size == type(zc)().reduce_bucket_size:
        return max(1, ctx.par.dp_bucket_bytes // ctx.grad_bytes)
    return zc.reduce_bucket_size


# ---- ZeRO-3 -------------------------------------------------------------------------------------------------


def _zero3(ctx: Context, params: Sequence[Param], group: Group, kind: str, size: int) -> list[Call]:
    numels = [p.numel for p in params]
    zc, m = ctx.par.zero_config, ctx.passes
    persist = [n <= zc.stage3_param_persistence_threshold for n in numels]
    fetches = fetch_sizes(numels, persist, ctx.par.zero_config, size, module_tree(params))
    param = _params(ctx, group)
    out = []
    hpz = zc.zero_hpz_partition_size
    secondary = _sub_group(ctx, group, hpz) if hpz > 1 else group
    for phase, suffix in (("forward", ""), ("backward", ".bwd")):
        sizes = [s for p, s in fetches if p == phase]
        # hpZ: a parameter released after use keeps a secondary partition over its hpZ group
        # (partition_parameters.py:1769 _partition_param_sec, invalidated by the step: stage3.py:2846), and a
        # fetch of parameters that have one gathers over that group (partition_parameters.py:1571-1575): only the
        # first micro-batch's forward fetches over the whole data-parallel group
        primary = m if hpz == 1 else (1 if phase == "forward" else 0)
        for grp, ranks, count, where in ((group, size, primary, ""), (secondary, hpz, m - primary, ".hpz")):
            if count and sizes:
                out += _fetch_rows(ctx, sizes, count, grp, ranks, f"{kind}.params{suffix}{where}", phase, param)
    cap = _reduce_cap(ctx)
    buckets = _ipg_buckets(numels, list(reversed(range(len(numels)))), cap)
    if zc.zero_quantized_gradients and _nodes(ctx, size) > 1:
        out += _qgz(ctx, numels, buckets, group, kind, size)
    else:
        rs = [sum(_padded(numels[i], size) for i in b) for b in buckets]
        source = "stage3.py __avg_scatter_grads -> reduce_scatter_coalesced"
        out += _rows(ctx, rs, per=m, name=f"{kind}.grads", op=Op.REDUCESCATTER, phase="backward", source=source,
                     **_grads(ctx, group))  # fmt: skip
    resident = [_padded(n, size) for n, p in zip(numels, persist, strict=True) if p]
    out += _rows(
        ctx,
        resident,
        name=f"{kind}.params.persistent",
        op=Op.ALLGATHER,
        phase="optimizer",
        source="stage3.py _post_step (persistent parameters)",
        **param,
    )
    return out


def _sub_group(ctx: Context, group: Group, inner: int) -> Group:
    """Groups of ``inner`` consecutive data-parallel ranks (hpZ's groups._create_zero_param_parallel_group, qgZ's
    intra-node groups), as hybrid sharding's dp_shard."""
    dims = tuple(d for d in ("cp", "dp_shard") if d != "cp" or ctx.par.cp > 1)
    return Group(dims, group.expert, split=inner)


QWZ_TARGET_GROUP = 8000  # partition_parameters.py CUDAQuantizer.target_group_size


def qwz_groups(numel: int) -> int:
    """CUDAQuantizer.quantize's adaptive group count for a tensor of ``numel`` elements (partition_parameters.py
    :867-889, DeepSpeed 0.19.8): one fp32 scale per group (8-bit symmetric)."""
    groups = -(-numel // QWZ_TARGET_GROUP)
    while groups < numel and numel % (8 * groups):
        groups += 1
    while numel % (16 * groups) == 0 and numel / groups > QWZ_TARGET_GROUP:
        groups *= 2
    return groups


def _fetch_rows(ctx: Context, sizes: list[int], count: int, group: Group, ranks: int, name: str, phase: str, param):
    """All-gathers of fetched parameters, ``count`` times each; with qwZ (zero_quantized_weights) each is an int8
    all-gather of the same elements and an fp32 all-gather of the block scales (partition_parameters.py
    _all_gather_coalesced / _all_gather_sequential, quantize=True)."""
    source = "partitioned_param_coordinator.py fetch_sub_module"
    if not ctx.par.zero_config.zero_quantized_weights:
        return _rows(
            ctx, sizes, per=count, name=name, op=Op.ALLGATHER, phase=phase, source=source, **param | {"group": group}
        )
    q = {"group": group, "phase": phase, "op": Op.ALLGATHER, "per": count}
    return _rows(ctx, sizes, name=name, dtype="int8", itemsize=1, source=source + " (qwZ int8)", **q) + _rows(
        ctx,
        [qwz_groups(s // ranks) * ranks for s in sizes],
        name=name + ".scales",
        dtype="fp32",
        itemsize=4,
        source=source + " (qwZ scales, CUDAQuantizer)",
        **q,
    )


def _nodes(ctx: Context, size: int) -> int:
    """Nodes the data-parallel group spans (qgZ: global world // device_count, stage3.py:1924-1928)."""
    per_node = ctx.devices_per_node or size
    return max(1, size // min(size, per_node))


def _qgz(ctx: Context, numels: list[int], buckets: list[list[int]], group: Group, kind: str, size: int) -> list[Call]:
    """qgZ (zero_quantized_gradients, across nodes only): each gradient of a flushed bucket goes through
    all_to_all_quant_reduce (runtime/comm/coalesced_collectives.py:31-76): an int4 all-to-all of the whole
    tensor (numel/2 bytes, csrc/quantization/pt_binding.cpp ds_swizzle_quant) and of its fp32 scales (one per
    group, max(rows, cols, world) groups) inside the node, then of the node-reduced quarter (numel/(2·L) bytes,
    quantized_reduction) and its scales across nodes. A 1-D tensor, or one whose size does not divide by
    2·world, is reduce-scattered alone. Rows and columns are not in the parameter list: one dimension of a 2-D
    weight is taken as the hidden size."""
    local = min(size, ctx.devices_per_node or size)
    intra, inter = _sub_group(ctx, group, local), Group(("dp_rep",), group.expert, split=local)
    h, m = ctx.model.hidden_size, ctx.passes
    src = "runtime/comm/coalesced_collectives.py all_to_all_quant_reduce (qgZ)"
    rows: dict[tuple, int] = {}
    for bucket in buckets:
        for i in bucket:
            n = numels[i]
            if n <= h or n % (2 * size):  # 1-D (norms) or not divisible: reduce_scatter_coalesced([tensor])
                key = (f"{kind}.grads", Op.REDUCESCATTER, group, _padded(n, size) * ctx.grad_bytes, ctx.grad_dtype)
                rows[key] = rows.get(key, 0) + 1
                continue
            groups = max(h, n // h, size)
            for key in (
                (f"{kind}.grads.qgz_intra", Op.ALLTOALL, intra, n // 2, "int4"),
                (f"{kind}.grads.qgz_intra.scales", Op.ALLTOALL, intra, 4 * groups, "fp32"),
                (f"{kind}.grads.qgz_inter", Op.ALLTOALL, inter, n // (2 * local), "int4"),
                (f"{kind}.grads.qgz_inter.scales", Op.ALLTOALL, inter, 4 * (groups // local), "fp32"),
            ):
                rows[key] = rows.get(key, 0) + 1
    return [
        Call(
            name=name,
            op=op,
            phase="backward",
            message_bytes=message,
            calls_per_iteration=count * m,
            group=g,
            source=DS + src,
            dtype=dtype,
        )
        for (name, op, g, message, dtype), count in rows.items()
    ]


def fetch_sizes(
    numels: list[int], persist: list[bool], zc, ranks: int, tree: list | None = None
) -> list[tuple[str, int]]:
    """(phase, elements) of every parameter all-gather in one forward + backward of ZeRO-3, replaying
    PartitionedParameterCoordinator with a complete trace. ``tree`` is the module tree (a list is a container,
    an int a leaf module owning that parameter; default: leaves only, no containers), walked pre-order in
    forward and mirrored in backward (module_walk). Each call carries ceil(numel/ranks) x ranks elements per
    parameter; which parameters a call fetches does not depend on ``ranks`` (the coordinator counts unpadded
    numels), so that replay is memoised per (numels, persistence, config, tree) and shared by every
    data-parallel size (the layout search asks for the same stage at many cp x dp)."""
    plan = _fetch_plan(tuple(numels), tuple(persist), zc, _frozen(tree) if tree is not None else None)
    return [(phase, sum(_padded(numels[p], ranks) for p in fetched)) for phase, fetched in plan]


FETCH_PLANS_KEPT = 1024  # stages x tp x virtual stages x models a search sees; each plan is a few KB


def _frozen(tree) -> tuple | int:
    return tree if isinstance(tree, int) else tuple(_frozen(child) for child in tree)


@lru_cache(maxsize=FETCH_PLANS_KEPT)
def _fetch_plan(
    numels: tuple[int, ...], persist: tuple[bool, ...], zc, tree: tuple | None
) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """(phase, parameter indices) of every all-gather: the coordinator's replay (fetch_sizes)."""
    forward, order = _trace_order(len(numels), tree)
    replay = _Replay(numels, persist, zc, order)
    out: list[tuple[str, tuple[int, ...]]] = []
    for step, module in enumerate(order):
        phase = "forward" if step < len(forward) else "backward"
        missing = tuple(p for p in module if not replay.available[p])
        if missing:  # the module's own parameters, one call
            out.append((phase, missing))
            replay.gather(missing)
        replay.pass_trace(module, step)
        batch = replay.prefetch()
        if batch:
            out.append((phase, batch))
            replay.gather(batch)
        replay.release(module, step)
    return tuple(out)


def _trace_order(count: int, tree: tuple | None) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]]]:
    """(forward modules, forward + backward modules), each module the parameter indices it owns."""
    if tree is None:
        forward: list[tuple[int, ...]] = [(i,) for i in range(count)]
        return forward, forward + forward[::-1]
    forward = module_walk(tree, backward=False)
    return forward, forward + module_walk(tree, backward=True)


class _Replay:
    """PartitionedParameterCoordinator's state while the recorded trace replays: which parameters are gathered,
    the elements live, and how far the prefetcher has read the trace."""

    def __init__(self, numels: tuple[int, ...], persist: tuple[bool, ...], zc, order: list[tuple[int, ...]]):
        self.numels, self.persist, self.zc, self.order = numels, persist, zc, order
        sizes = [sum(numels[i] for i in m) for m in order]
        self.traversed = [0, *accumulate(sizes)]  # numel of the modules order[:k]
        self.next_use: list[dict[int, int]] = [{} for _ in order]
        last_seen: dict[int, int] = {}
        for step in reversed(range(len(order))):
            self.next_use[step] = {p: last_seen.get(p, len(order)) for p in order[step]}
            last_seen.update({p: step for p in order[step]})
        self.queue = [(step, p) for step, m in enumerate(order) for p in sorted(m)]  # the recorded parameter trace
        self.head = 0
        self.available = list(persist)
        self.recent = [-(10**18)] * len(numels)  # most recent trace step the prefetcher has passed, per parameter
        self.live = 0

    def gather(self, params: tuple[int, ...]) -> None:
        for p in params:
            self.available[p] = True
        self.live += sum(self.numels[p] for p in params)

    def _read(self) -> int:
        s, q = self.queue[self.head]
        self.recent[q] = max(self.recent[q], s)
        self.head += 1
        return q

    def pass_trace(self, module: tuple[int, ...], step: int) -> None:
        """The module's own trace entries leave the queue."""
        for _ in range(sum(1 for p in module if self.recent[p] < step)):
            self._read()

    def prefetch(self) -> tuple[int, ...]:
        """Parameters read ahead in the trace, up to the bucket size and the live limit (an ordered set)."""
        limit = min(self.zc.stage3_max_live_parameters - self.live, self.zc.stage3_prefetch_bucket_size)
        batch: dict[int, None] = {}
        prefetching = 0
        while self.head < len(self.queue) and prefetching < limit:
            q = self._read()
            if not self.available[q] and q not in batch:
                batch[q] = None
                prefetching += self.numels[q]
        return tuple(batch)

    def release(self, module: tuple[int, ...], step: int) -> None:
        """release_sub_module after the module ran (the coordinator's step id is now step + 1): a parameter
        not reused within stage3_max_reuse_distance is partitioned again."""
        for p in module:
            if self.persist[p] or self.recent[p] > step + 1:
                continue
            nxt, distance = self.next_use[step][p], self.zc.stage3_max_reuse_distance
            reused = nxt < len(self.order) and self.traversed[nxt] - self.traversed[step + 1] < distance
            if not reused:
                self.available[p], self.live = False, self.live - self.numels[p]


def module_walk(node, backward: bool) -> list[tuple[int, ...]]:
    """Module fetch order: a container fetches (nothing of its own) before its children; backward visits the
    children in reverse, a container's pre-backward hook on its outputs firing before its children's
    (parameter_offload.py _register_deepspeed_module: pre-forward, post-forward, pre-/post-backward hooks on
    every module)."""
    if isinstance(node, int):
        return [(node,)]
    children = reversed(node) if backward else node
    return [(), *[m for child in children for m in module_walk(child, backward)]]


def module_tree(params: Sequence[Param]) -> list:
    """The module tree of a Hugging-Face-style decoder from the parameter list: the model (root container)
    holds the embedding, one container per layer and the final norm and head; a layer holds its norms, an
    attention container (q, k, v, o and q/k norms) and an MLP container (gate/up/down, or router, shared
    experts and experts)."""
    root: list = []
    layer: list | None = None
    sub: tuple[str, list] | None = None
    current_unit = None
    for i, p in enumerate(params):
        if p.unit == "root":
            root.append(i)
            layer, current_unit = None, None
            continue
        if p.unit != current_unit:
            layer, current_unit, sub = [], p.unit, None
            root.append(layer)
        kind = _submodule(p.name[len(p.unit) + 1 :])
        if kind is None:
            layer.append(i)
            sub = None
            continue
        if sub is None or sub[0] != kind:
            sub = (kind, [])
            layer.append(sub[1])
        sub[1].append(i)
    return root


ATTENTION = ("q", "k", "v", "o", "qkv", "proj", "attention", "qk_norm")


def _submodule(local: str) -> str | None:
    head = local.split(".")[0]
    if head in ATTENTION:
        return "attention"
    if head in ("mlp", "shared", "router", "experts"):
        return "mlp"
    return None


def _sub_groups(numels: list[int], ranks: int, sub_group_size: int) -> int:
    """stage3._create_fp16_sub_groups: a sub-group closes once its partition elements reach sub_group_size."""
    parts = [-(-n // ranks) for n in numels]
    if sub_group_size >= sum(parts):
        return 1
    groups, current = 0, 0
    for i, part in enumerate(parts):
        current += part
        if current >= sub_group_size or i == len(parts) - 1:
            groups, current = groups + 1, 0
    return groups


# ---- the step's small reductions ----------------------------------------------------------------------------


def _step_checks(ctx: Context, numels: list[int], group: Group, kind: str, size: int) -> list[Call]:
    stage, dtype = ctx.par.zero_stage, ctx.work.param_dtype
    overflow = dtype == "fp16" if stage == 3 else dtype in ("fp16", "bf16")
    norms = _sub_groups(numels, size, ctx.par.zero_config.sub_group_size) if stage == 3 else 1
    groups = [group]
    if ctx.par.tp * ctx.par.pp > 1:
        groups.append(Group(("tp", "pp")))
    out = []
    home = "stage3.py" if stage == 3 else "stage_1_and_2.py"
    checks = [("overflow_check", 1, "uint8", OVERFLOW_BYTES, "has_overflow")] if overflow else []
    checks.append(("grad_norm", norms, "fp64" if stage == 3 else "fp32", NORM_BYTES[stage], "get_grad_norm_direct"))
    for g in groups:
        where = "" if g is group else ".model_parallel"
        out += [
            _call(name=f"{kind}.{what}{where}", op=Op.ALLREDUCE, phase="optimizer", elements=1, count=count, group=g,
                  dtype=dt, itemsize=nbytes, source=f"{home} {function}")
            for what, count, dt, nbytes, function in checks
        ]  # fmt: skip
    return out
