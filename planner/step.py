"""Step time and memory of a plan: compute (compute.py), the pipeline schedule (pipeline.py), the priced
communication of the ledger (``PricedCall.price.time_s`` per call) and what overlaps what.

Public, pure and cheap (no JSON), for the plan and the layout search::

    step_time(ctx, priced_calls, gpu, overlap=Overlap(), with_timeline=True) -> StepTime
    memory(ctx, gpu, calls=()) -> Memory          (planner.memory.Memory: .fits, .per_stage, .warnings())

A call overlaps compute only where the framework overlaps it; each overlap is a named flag of ``Overlap``
whose ``None`` means the framework's default:

- ``overlap_grad_reduce``: DP/ZeRO-1 gradient buckets behind the last backward. Megatron False
  (DistributedDataParallelConfig); torch True (DDP/FSDP2 hooks); deepspeed overlap_comm (True at ZeRO-3 only).
- ``overlap_param_gather``: the ZeRO-1/2 parameter all-gather behind the next forward. Megatron False; torch
  True; deepspeed overlap_comm.
- ``fsdp_prefetch``: torch FSDP2's per-unit all-gather / reduce-scatter behind the unit's compute. True
  (implicit forward and backward prefetch). DeepSpeed's and Megatron's per-micro-batch ZeRO-2/3 traffic
  follows ``overlap_grad_reduce`` instead (DeepSpeed overlap_comm: on at ZeRO-3 only).
- ``cp_ring_overlap``: ring-attention KV exchanges behind the attention blocks. True (TransformerEngine
  AttnFuncWithCPAndKVP2P).
- ``tp_comm_overlap``: TP collectives behind the GEMMs. False (Megatron --tp-comm-overlap).
- ``overlap_p2p``: pipeline sends in the steady state. Megatron True for the interleaved schedule only
  (--overlap-p2p-communication), else False.
- ``overlap_moe_expert_parallel_comm``: Megatron-Core --overlap-moe-expert-parallel-comm (the combined 1F1B
  schedule, megatron/core/pipeline_parallel/combined_1f1b.py): a forward and a backward of two micro-batches
  run as a pair, the EP dispatch/combine of both exposed only beyond the pair's compute
  (overlap_forward_backward; DualPipe's F&B is the same overlap). Where the MoE layers wait for their token
  counts, the pair also runs through one host queue (paired_passes, compute.combined_pair: Megatron-LM
  core_v0.15.0 TransformerLayerSchedulePlan.run's node order). False, but True under the dualpipe and
  dualpipev schedules, which provide it. Not with the allgather dispatcher.
  Priced as the steady state for every micro-batch (warm-up and cool-down micro-batches also hide theirs:
  an under-estimate of the exposed time for few micro-batches).
- ``moe_shared_expert_overlap``: Megatron --moe-shared-expert-overlap: the shared experts compute while the
  routed tokens' all-to-all runs (megatron/core/transformer/moe/shared_experts.py, alltoall/flex
  dispatchers). False. The window is the shared experts' share of the pass's GEMM time (by FLOPs).

A hidden call is not free: its NCCL channels hold SMs and its copies take HBM, so the compute it hides behind
ends later (planner/contention.py: ``StageStep.slow_fwd_s`` / ``slow_bwd_s`` per pass, ``slow_dp_s`` for the
overlapped gradient reduction and parameter gather).

Everything else (TP, EP all-to-all, CP all-gather/all-to-all, the tied-embedding all-reduce, the loss
all-reduce) is on the critical path. Step time = the pipeline's critical path + the exposed gradient
reduction of the slowest stage (Megatron's gradient-norm all-reduce syncs the stages before the optimizer)
+ the optimizer step (memory-bound) + the exposed parameter all-gather.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, make_dataclass, replace

from collectives.topology.gpu import GPUSpec, PeerCopy, peer_copy
from collectives.topology.pricing import on_nvlink_switch

from ._errors import SpecError
from .compute import (
    PassTime,
    StageCompute,
    check_gpu,
    compute_dtype,
    embedding_pass,
    layer_forward,
    model_flops_per_token,
    stage_compute,
)
from .contention import (
    PP_OVERLAP_KERNELS,
    Share,
    hbm_bytes,
    kernels_share,
    ring_p2p_kernels,
    slowdown_s,
    window_rate,
)
from .context import Context
from .documents import document_wait_s
from .kernels import (
    async_tp_gemm_s,
    async_tp_split,
    efficiency,
    fsdp_copy_kernels,
    gemm_operand_bytes,
    reads_stored_operands,
    sp_layout_copy_kernels,
    userbuffers_split,
)
from .ledger import held_ctas
from .memory import Memory, memory_per_stage, offloaded_bytes
from .pipeline import (
    PipelineTime,
    Schedule,
    StagePass,
    caveats,
    drain_leads,
    pass_wait,
    pipeline_time,
    timeline,
)
from .pipeline_jitter import order_blocks, order_ends
from .recompute import layer_counts
from .rules.context_parallel import rotate_method
from .rules.pipeline import GATHER_CALLS, SHAPE_CALLS
from .rules.tensor import (
    async_tp_fused_gemms,
    async_tp_fused_names,
    async_tp_wgrad_reads,
    check_userbuffers,
    summed_dgrad_names,
    userbuffers_decoder_share,
    userbuffers_rows,
)
from .spread import compute_spread, job_pace, median_part, pass_spread, slowest_part
from .workload import selective_modules

HOST_LINK_GBPS = 64.0  # PCIe Gen5 x16 per direction (H100 SXM's host link), when the cluster is not given


# The overlap switches, one row each: the framework's default for a plan (module docstring), which a request's
# ``None`` means. ``Overlap``'s fields are these names in this order; app/schemas/plan.py ``OverlapIn`` and
# assumptions.SCHEMA_SOURCES describe each.
OVERLAP_DEFAULTS: dict[str, Callable[[Context], bool]] = {
    "overlap_grad_reduce": lambda ctx: ctx.flavour.overlaps(ctx.par),
    "overlap_param_gather": lambda ctx: ctx.flavour.overlaps(ctx.par),
    "fsdp_prefetch": lambda ctx: True,
    "cp_ring_overlap": lambda ctx: True,
    "tp_comm_overlap": lambda ctx: False,
    "overlap_p2p": lambda ctx: ctx.par.pipeline_schedule in ctx.flavour.overlap_p2p_schedules,
    # DualPipe(V) pairs each forward with another micro-batch's backward (DeepSeek-V3 report §3.2.1, Figure 4;
    # DualPipe README: "full overlap of forward and backward computation-communication phases"): the schedule
    # provides it (ScheduleTraits.overlaps_ep)
    "overlap_moe_expert_parallel_comm": lambda ctx: ctx.par.schedule.overlaps_ep,
    "moe_shared_expert_overlap": lambda ctx: False,
}
EP_OVERLAPS = ("overlap_moe_expert_parallel_comm", "moe_shared_expert_overlap")  # need an all-to-all to hide


def _resolved(self, ctx: Context) -> Overlap:
    """Every switch as this plan runs it: the request's value, else the framework's default."""
    for name in EP_OVERLAPS:
        if getattr(self, name) and ctx.par.ep_dispatch == "allgather":
            raise SpecError(
                f"options.overlap.{name}",
                "overlaps the EP all-to-all (alltoall or deepep dispatch); parallel.ep_dispatch is 'allgather'",
            )
    if self.moe_shared_expert_overlap and "shared_experts" in selective_modules(ctx.work):
        raise SpecError(
            "options.overlap.moe_shared_expert_overlap",
            "shared_experts recompute cannot work with --moe-shared-expert-overlap (Megatron-LM d98e8a6 "
            "transformer_config.py; workload.recompute_modules lists shared_experts)",
        )
    if self.overlap_p2p and ctx.flavour.pp_unbatched_transfers and ctx.par.pp > 1:
        raise SpecError(
            "options.overlap.overlap_p2p",
            f"framework {ctx.par.framework!r} issues every pipeline transfer as a blocking instruction of its own "
            f"(Flavour.pp_unbatched_transfers: DeepSpeed's TrainSchedule): it has no overlapped sends, got true at "
            f"pp {ctx.par.pp}",
        )
    given = {name: getattr(self, name) for name in OVERLAP_DEFAULTS}
    flags = Overlap(**{k: default(ctx) if given[k] is None else given[k] for k, default in OVERLAP_DEFAULTS.items()})
    if flags.tp_comm_overlap and ctx.flavour.userbuffers:
        check_userbuffers(ctx)
    if flags.tp_comm_overlap:
        _check_tp_overlap(ctx)
    return flags


def _check_tp_overlap(ctx: Context) -> None:
    """A flavour without TP overlap (Flavour.no_tp_comm_overlap: Megatron-LM 2021-22) refuses it; one whose TP
    overlap is a compiler pass (Flavour.async_tp_needs_compile) refuses it without torch.compile: a SpecError naming
    the fields and the framework's own message."""
    if ctx.flavour.no_tp_comm_overlap:
        raise SpecError(
            "options.overlap.tp_comm_overlap",
            f"framework {ctx.par.framework!r} has no TP communication overlap: {ctx.flavour.no_tp_comm_overlap}",
        )
    refusal = ctx.flavour.async_tp_needs_compile
    if refusal and ctx.par.tp > 1 and not ctx.work.torch_compile:
        raise SpecError(
            "options.overlap.tp_comm_overlap",
            f"async TP (tp_comm_overlap under {ctx.par.framework!r}, tp {ctx.par.tp}) is an Inductor pass and needs "
            f"workload.torch_compile true, got false: {refusal}",
        )


Overlap = make_dataclass(
    "Overlap",
    [(name, "bool | None", field(default=None)) for name in OVERLAP_DEFAULTS],
    frozen=True,
    namespace={
        "__module__": __name__,
        "__doc__": "Framework overlap switches (OVERLAP_DEFAULTS); None: the framework's default.",
        "resolved": _resolved,
    },
)
FRAMEWORK_OVERLAP = Overlap()  # every switch at the framework's default


@dataclass
class StageStep:
    """One rank of a stage, one iteration: where its time goes."""

    stage: int
    compute: StageCompute
    fwd_comm_s: float = 0.0  # exposed communication inside one forward (per micro-batch)
    bwd_comm_s: float = 0.0
    grad_reduce_s: float = 0.0  # end-of-backward gradient reduction (ZeRO 0/1), whole iteration
    grad_buckets: int = 0
    grad_bytes: int = 0
    param_bytes: int = 0
    param_gather_s: float = 0.0  # ZeRO-1/2 parameter all-gather, whole iteration
    param_units: int = 0
    tail_s: float = 0.0  # other per-iteration calls on the critical path (tied embeddings, loss)
    exposed_by_stream: dict = field(default_factory=dict)  # (stream, phase) -> exposed seconds per micro-batch
    hidden_by_stream: dict = field(default_factory=dict)  # (stream, phase) -> seconds behind compute per micro-batch
    # (kind, phase) -> exposed seconds per micro-batch of a kind reported on another kind's stream (_REPORTED_ON)
    exposed_by_kind: dict = field(default_factory=dict)
    exposed_dp_s: float = 0.0
    exposed_gather_s: float = 0.0
    # FSDP2 (prefetches_units): the first unit's all-gather and the last unit's reduce-scatter of each pass, which
    # no compute can hide (_fsdp_edges)
    first_gather_s: float = 0.0
    last_reduce_s: float = 0.0
    # what the slowest part's clock added to one forward, one backward and the optimizer step (planner/spread.py
    # compute_spread: stage_compute on the paced part less on the median part)
    spread: tuple[float, float, float] = (0.0, 0.0, 0.0)
    tp_unfused_s: float = 0.0  # backward TP left out of tp_comm_overlap, per micro-batch (_async_tp_unfused)
    # TP left on NCCL by userbuffers, per micro-batch, by phase (_userbuffers_fallback)
    tp_fallback_s: dict[str, float] = field(default_factory=dict)
    # what torch's fused async-TP ops leave exposed beyond their own GEMMs, per micro-batch (_async_tp_fused)
    tp_fused_fwd_s: float = 0.0
    tp_fused_bwd_s: float = 0.0
    # compute slowed by the communication hidden behind it (planner/contention.py), per micro-batch: how much later
    # each pass ends; and what the once-per-iteration DP streams hold while they run (critical_path)
    slow_fwd_s: float = 0.0
    slow_bwd_s: float = 0.0
    grad_share: Share = field(default_factory=Share)
    gather_share: Share = field(default_factory=Share)
    slow_dp_s: float = 0.0  # the last backward and first forward lengthened by the hidden DP reduction and gather

    @property
    def forward_s(self) -> float:
        return self.compute.forward.total_s + self.slow_fwd_s + self.fwd_comm_s

    def lengthen(self, phase: str, comm_s: float = 0.0, slow_s: float = 0.0) -> None:
        """One pass ("forward" or "backward") lengthened, per micro-batch: ``comm_s`` more exposed communication
        inside it, ``slow_s`` more compute slowdown (either negative to shorten it)."""
        if phase == "forward":
            self.fwd_comm_s += comm_s
            self.slow_fwd_s += slow_s
        else:
            self.bwd_comm_s += comm_s
            self.slow_bwd_s += slow_s

    @property
    def backward_s(self) -> float:
        return self.compute.backward.total_s + self.slow_bwd_s + self.bwd_comm_s


@dataclass
class StepTime:
    time_s: float
    compute_s: float
    exposed_comm_s: float
    bubble_s: float
    mfu: float
    tokens_per_s: float
    critical_stage: int
    stages: list[StageStep] = field(default_factory=list)
    timeline: list[dict] = field(default_factory=list)
    # what the plan should say about the pipeline's form for these passes (pipeline.caveats)
    warnings: list[str] = field(default_factory=list)
    # the part of compute_s the slowest GPU adds over the median part the kernel tables hold (planner/spread.py)
    spread_s: float = 0.0


def schedule_of(
    ctx: Context, p2p_s: float = 0.0, overlap_p2p: bool = False, two_way_s: float = 0.0, unbatched_s: float = 0.0
) -> Schedule:
    par = ctx.par
    return Schedule(
        par.pipeline_schedule,
        par.pp,
        ctx.micro_batches,
        par.chunks_per_rank,
        p2p_s,
        overlap_p2p,
        two_way_s,
        unbatched_s,
    )


def schedule_for(ctx: Context, totals: StreamTotals, overlap_p2p: bool) -> Schedule:
    """The schedule as the step runs it, from the iteration's stream totals: one boundary crossing
    (``StreamTotals.p2p_s``) and, where the flavour's schedule exchanges both ways at once once per chunk
    (``Flavour.two_way_exchange_schedules``), that exchange (``StreamTotals.two_way_s``; pipeline.steady_wait)."""
    two_way = ctx.par.pipeline_schedule in ctx.flavour.two_way_exchange_schedules
    unbatched = unbatched_wait(ctx, totals) if ctx.flavour.pp_unbatched_transfers else 0.0
    return schedule_of(ctx, totals.p2p_s, overlap_p2p, totals.two_way_s if two_way else 0.0, unbatched)


def unbatched_wait(ctx: Context, totals: StreamTotals) -> float:
    """What a steady-state micro-batch waits on its boundary transfers when each is a blocking instruction of its
    own (``Flavour.pp_unbatched_transfers``): DeepSpeed's TrainSchedule (deepspeed/runtime/pipe/schedule.py at
    edaa722, the same at cd7967d6b of October 2021 but for the order inside a step) gives a stage, per micro-batch, a
    forward step with RecvActivation and SendGrad and a backward step with SendActivation and RecvGrad, each a
    blocking p2p.send / p2p.recv (pipe/p2p.py: dist.send, or dist.broadcast over a 2-rank group), so four one-way
    transfers lie on its path where 1F1B's send_forward_recv_backward and send_backward_recv_forward batch them into
    two (tests/planner/test_deepspeed_pipeline.py replays the schedule: 4 c a micro-batch, no extra bubble). Each
    received partition is all-gathered over TP (PartitionedTensor.full), and with ``pp_regathers_output`` the
    stage's own output once more before its backward: 4 sends (with their shape exchanges, if any) and 2 or 3
    gathers."""
    gathers = 3 if ctx.flavour.pp_regathers_output else 2
    return 4 * (totals.send_s + totals.shape_s) + gathers * totals.gather_s


def memory(ctx: Context, gpu: GPUSpec, calls: Sequence = ()) -> Memory:
    """Memory per rank of each stage against the GPU's capacity (planner/memory.py)."""
    if gpu is None or gpu.hbm_bytes <= 0:
        check_gpu(gpu, "bf16")  # raises naming the missing figure
    return memory_per_stage(ctx, schedule_of(ctx), gpu.hbm_bytes, calls)


def step_time(
    ctx: Context,
    calls: Sequence,
    gpu: GPUSpec,
    overlap: Overlap = FRAMEWORK_OVERLAP,
    with_timeline: bool = True,
    host_GBps: float = HOST_LINK_GBPS,
) -> StepTime:
    """Critical path of one iteration (training step, prefill pass or decode step). ``calls`` are the plan's
    PricedCalls (anything with ``.call`` (ledger Call) and ``.price.time_s``); ``host_GBps`` the GPU's link
    to host memory per direction (the cluster's pcie_bandwidth_GBps), for CPU activation offload."""
    check_gpu(gpu, compute_dtype(ctx), ctx)
    flags = overlap.resolved(ctx)
    paired = paired_passes(ctx, flags)
    # the slowest GPU sets the pace (planner/spread.py): every kernel of the step is timed on that part (its clock
    # / k), the spread being what that adds over the median part the kernel tables hold
    gpu = slowest_part(gpu, job_pace(ctx, gpu))
    stages = [_paced_stage(ctx, s, gpu, paired) for s in range(ctx.par.pp)]
    totals = _assign_calls(ctx, calls, stages, flags, gpu)
    if ctx.training and ctx.work.cpu_offloading_num_layers:
        for st in stages:
            _offload(st, offloaded_bytes(ctx, st.stage) / (host_GBps * 1e9))
    sched = schedule_for(ctx, totals, bool(flags.overlap_p2p))
    if not ctx.training:
        return _inference(ctx, stages, sched, gpu, with_timeline)
    return _training(ctx, stages, sched, gpu, flags, with_timeline)


# ---- communication onto streams ------------------------------------------------------------------------


def _stream(call, m: int, zero: int) -> str:
    """Which stream a call runs on: a pass stream ("tp.forward", "cp.ring.backward", "dp.forward" for ZeRO-2/3
    per-unit calls, ...), once-per-iteration DP streams (grad_reduce, param_gather), "tail" (critical-path
    per-iteration calls), or "pp" (boundary sends)."""
    par, phase = call.parallelism, call.phase
    if par == "pp":
        return "pp"
    if par in ("dp", "edp"):
        if phase == "optimizer":  # the updated parameters' all-gather; norms and overflow checks are on the path
            return "param_gather" if call.op.value == "allgather" else "tail"
        per_unit = phase == "backward" or call.op.value != "allreduce"  # not the forward loss report
        if zero >= 2 and call.calls_per_iteration >= m and phase in ("forward", "backward") and per_unit:
            return "dp." + phase
        return "grad_reduce" if phase == "backward" else "tail"  # the loss report is on the path
    if par == "embedding" or phase == "optimizer":
        return "tail"  # once per iteration after the last backward (tied embeddings, SP norm-weight grads)
    kind = "cp.ring" if par == "cp" and call.op.value == "sendrecv" else par
    return f"{kind}.{'forward' if phase == 'forward' else 'backward'}"


@dataclass
class StreamTotals:
    """One iteration's communication per stream (``_stream``) and stage: seconds, calls and bytes; and the
    longest pipeline boundary send. The first half of placing calls on streams: it reads only the calls, the
    micro-batch count and the ZeRO stage, so a caller may sum it once for many layouts."""

    time: dict[str, list[float]] = field(default_factory=dict)
    count: dict[str, list[int]] = field(default_factory=dict)
    volume: dict[str, list[float]] = field(default_factory=dict)
    # the per-unit ZeRO-2/3 streams by collective ("dp.forward.allgather", "dp.backward.reducescatter", ...): calls,
    # bytes, and the longest single call per stage (FSDP2's first all-gather and last reduce-scatter: _fsdp_edges)
    unit_count: dict[str, list[int]] = field(default_factory=dict)
    unit_volume: dict[str, list[float]] = field(default_factory=dict)
    unit_largest: dict[str, list[float]] = field(default_factory=dict)
    # the TP all-gathers and reduce-scatters by "tp.<phase>.<op>.<ledger name>" (tp_key; only where the flavour
    # reads them: stream_totals' tp_rows): calls and bytes in unit_count / unit_volume (_unit_totals: DTensor's
    # sequence-parallel layout copies follow each, _sp_layout_copies) and their seconds here (_async_tp_fused;
    # the backward reduce-scatters an async-TP pass leaves unfused, _async_tp_unfused)
    tp_seconds: dict[str, list[float]] = field(default_factory=dict)
    # of those calls, the ones whose group sits behind one NVLink switch (collectives pricing.on_nvlink_switch): where
    # every call of a row does, torch's fused ops pull at the measured copy-engine rate (_async_tp_fused)
    tp_switched: dict[str, list[int]] = field(default_factory=dict)
    # what each stream's calls hold while they run (planner/contention.py): SM-seconds (NCCL channels x seconds)
    # and HBM bytes; and, on the TP streams, seconds by collective ("tp.forward.reducescatter", ...) for a TP overlap
    # that sets its own SMs (Flavour.tp_overlap_sms)
    sm_time: dict[str, list[float]] = field(default_factory=dict)
    hbm: dict[str, list[float]] = field(default_factory=dict)
    tp_ops: dict[str, list[float]] = field(default_factory=dict)
    send_s: float = 0.0  # the longest boundary send
    send_held: tuple[int, int] = (0, 0)  # its NCCL channels and HBM bytes (planner/contention.py)
    shape_s: float = 0.0  # the longest shape exchange before a send (rules/pipeline.py SHAPE_CALLS; 0: none)
    gather_s: float = 0.0  # the longest TP all-gather after a receive (rules/pipeline.py GATHER_CALLS; 0: none)

    @property
    def p2p_s(self) -> float:
        """One boundary crossing: with ``mtp_standalone`` Megatron sends the tensor's shape first, waits on it
        and synchronizes the device (p2p_communication.py _communicate_shapes), so its latency adds to the
        send's (the shape row's own price); else the send alone. Megatron-LM's scatter/gather adds the receiver's
        TP all-gather (rules/pipeline.py GATHER_CALLS)."""
        return self.send_s + self.shape_s + self.gather_s

    @property
    def two_way_s(self) -> float:
        """One crossing that sends both ways at once (pipeline.Schedule.two_way_s): the output to the next rank and
        the input gradient to the previous one leave through the same GPU's egress (its NIC, or NVLink), so the
        tensor send's time twice (its latency counted twice too: an upper bound by that latency); the shape
        exchange once; and, under scatter/gather, a TP all-gather per received tensor, one after the other
        (Megatron-LM 6985e58 p2p_communication.py _communicate: gather_split_1d_tensor for recv_prev, then
        recv_next)."""
        return self.p2p_s + self.send_s + self.gather_s

    def __add__(self, other: StreamTotals) -> StreamTotals:
        out = StreamTotals(
            send_s=max(self.send_s, other.send_s),
            send_held=self.send_held if self.send_s >= other.send_s else other.send_held,
            shape_s=max(self.shape_s, other.shape_s),
            gather_s=max(self.gather_s, other.gather_s),
        )
        for name in _SUMMED:
            mine, theirs, into = getattr(self, name), getattr(other, name), getattr(out, name)
            join = max if name == "unit_largest" else operator.add
            for stream in mine.keys() | theirs.keys():
                a, b = mine.get(stream), theirs.get(stream)
                into[stream] = a if b is None else b if a is None else [join(x, y) for x, y in zip(a, b, strict=True)]
        return out


# the SP input re-gathers for the weight gradients (rules/tensor.py "<layer>.wgrad_gather"): TransformerEngine's
# userbuffers run them as its "bulk" overlap (TE v2.9 pytorch/module/base.py initialize_ub: methods["bulk"] =
# qkv_dgrad, qkv_wgrad, fc1_dgrad, fc1_wgrad; the *_dgrad ones are all-gathers, layers_all_gather_overlap), an
# SM-kernel CommOverlap, not the ring exchange's copy engine: their TP op key is "allgather.bulk"
BULK_GATHER_SUFFIX = ".wgrad_gather"
_SUMMED = ("time", "count", "volume", "unit_count", "unit_volume", "unit_largest", "tp_seconds", "tp_switched")
_SUMMED += ("sm_time", "hbm", "tp_ops")  # what the calls hold beside the compute (planner/contention.py)


def stream_totals(
    calls: Sequence, m: int, zero: int, stages: int, tp_rows: bool = True, count_switched: bool = False
) -> StreamTotals:
    """Sums each call's time, count and bytes per stage into the stream it runs on (``_stream``); the legs of
    one kernel (``Call.kernel``) run concurrently, so a kernel adds its longest leg's time. ``tp_rows``: also the
    TP all-gathers and reduce-scatters by ledger row (tp_key; what torch's SP copies and async TP read,
    tp_rows_read); False skips that work for the flavours that read none. ``count_switched``: also count the row's calls
    behind one NVLink switch (tp_switched; only async TP's fused rows read it, fused_rows_priced: review r14c, 7)."""
    out = StreamTotals()
    acc, counts, volume = out.time, out.count, out.volume
    legs: dict[tuple, float] = {}  # (stream, kernel, stage) -> its longest leg's time
    held: dict[tuple, list[float]] = {}  # (stream, stages) -> [SM-seconds, HBM bytes]
    ops: dict[tuple, float] = {}  # (TP stream.op, stages) -> seconds
    for pc in calls:
        c, t = pc.call, pc.price.time_s
        stream = _stream(c, m, zero)
        if stream == "pp":
            _pp_send(out, pc, t)
            continue
        amount, n = c.calls_per_iteration * t, c.calls_per_iteration
        row = acc.setdefault(stream, [0.0] * stages)
        num = counts.setdefault(stream, [0] * stages)
        vol = volume.setdefault(stream, [0.0] * stages)
        _tally_holds(out, held, ops, pc, stream, amount, stages)
        if zero >= 2 and c.parallelism in ("dp", "edp") and c.op.value in _UNIT_OPS and c.phase in _PASSES:
            _unit_totals(out, f"dp.{c.phase}.{c.op.value}", c, t, stages, stream.startswith("dp."))
        if tp_rows and stream.startswith("tp.") and c.op.value in _UNIT_OPS:
            key = tp_key(c.phase, c.op.value, c.name)
            _unit_totals(out, key, c, t, stages, False)
            took = out.tp_seconds.setdefault(key, [0.0] * stages)
            switched = out.tp_switched.setdefault(key, [0] * stages)
            behind = n if count_switched and on_nvlink_switch(pc.price) else 0
            for s in c.stages:
                took[s] += amount
                switched[s] += behind
        for s in c.stages:
            num[s] += n
            vol[s] += n * c.message_bytes
            if c.kernel:
                key = (stream, c.kernel, s)
                legs[key] = max(legs.get(key, 0.0), amount)
            else:
                row[s] += amount
    for (stream, _, s), amount in legs.items():
        acc[stream][s] += amount
    _spread_holds(out, held, ops, stages)
    return out


def _pp_send(out: StreamTotals, pc, t: float) -> None:
    """A pipeline send: the largest of its kind (shape sends, scatter/gather's TP gathers, tensor sends); the
    longest tensor send's channels and HBM bytes (what it holds beside the compute: _pp_contention)."""
    name = pc.call.name
    if name in SHAPE_CALLS:
        out.shape_s = max(out.shape_s, t)
    elif name in GATHER_CALLS:
        out.gather_s = max(out.gather_s, t)
    elif t >= out.send_s:
        out.send_s = t
        out.send_held = (pc.price.channels, hbm_bytes(pc.price))


def _tally_holds(out: StreamTotals, held: dict, ops: dict, pc, stream: str, amount: float, stages: int) -> None:
    """What the call holds (planner/contention.py), summed per (stream, stages) and spread over the stages once
    (``_spread_holds``); the legs of one kernel run at once, so their bytes add and their NCCL channels add, while
    a kernel with its own SMs (``Call.sms``: DeepEP, HybridEP) holds them once over its longest leg. A call priced
    without a channel count or SMs of its own (the schedule pricer's off NCCL's fabrics) is left out, its SMs and
    its HBM bytes. TP calls also sum per op (TransformerEngine's SMs per op, ``tp_ops``) and the backward
    reduce-scatters per name."""
    c = pc.call
    own = c.sms
    channels = held_ctas(c, pc.price.channels)
    if channels:
        got = held.setdefault((stream, c.stages), [0.0, 0.0, {}])
        if own and c.kernel:  # one non-NCCL kernel's legs share its own SMs: held once, over its longest leg
            got[2][c.kernel] = max(got[2].get(c.kernel, 0.0), own * amount)
        else:
            got[0] += channels * amount
        got[1] += c.calls_per_iteration * hbm_bytes(pc.price)
    if stream.startswith("tp."):
        bulk = ".bulk" if c.name.endswith(BULK_GATHER_SUFFIX) else ""
        key = (f"{stream}.{c.op.value}{bulk}", c.stages)
        ops[key] = ops.get(key, 0.0) + amount


def _spread_holds(out: StreamTotals, held: dict, ops: dict, stages: int) -> None:
    """``_tally_holds``' sums over the stages each group of calls ran on."""
    for (stream, members), (sm_seconds, hbm, legs) in held.items():
        sms, moved = out.sm_time.setdefault(stream, [0.0] * stages), out.hbm.setdefault(stream, [0.0] * stages)
        sm_seconds += sum(legs.values())
        for s in members:
            sms[s] += sm_seconds
            moved[s] += hbm
    for (key, members), amount in ops.items():
        row = out.tp_ops.setdefault(key, [0.0] * stages)
        for s in members:
            row[s] += amount


_UNIT_OPS = ("allgather", "reducescatter")


def tp_key(phase: str, op: str, name: str) -> str:
    """The per-row TP tally's key, "tp.<phase>.<op>.<ledger name>" (the name may hold dots: split(".", 3))."""
    return f"tp.{phase}.{op}.{name}"


def tp_rows_read(ctx: Context, flags: Overlap | None = None) -> bool:
    """Whether the flavour reads the per-row TP tallies (stream_totals' tp_rows): torch's SP layout copies and
    its async TP (_sp_layout_copies, _async_tp_unfused, _async_tp_fused), and with ``flags``' tp_comm_overlap
    Megatron's userbuffers fallback (_userbuffers_fallback)."""
    ub = flags is not None and flags.tp_comm_overlap and ctx.flavour.userbuffers
    return ctx.flavour.sp_layout_copies or ctx.flavour.async_tp_single_matmul or bool(ub)


def fused_rows_priced(ctx: Context, flags: Overlap | None, gpu: GPUSpec | None) -> bool:
    """Whether async TP's fused rows are priced with the GPU's measured pull (assign_streams' _async_tp_fused, the
    only reader of StreamTotals.tp_switched): torch's async TP on (tp_comm_overlap) and a PeerCopy for the GPU."""
    on = flags is not None and flags.tp_comm_overlap and ctx.flavour.async_tp_single_matmul
    return bool(on) and gpu is not None and peer_copy(gpu) is not None


_PASSES = ("forward", "backward")


def _unit_totals(out: StreamTotals, key: str, c, t: float, stages: int, per_pass: bool) -> None:
    """A ZeRO-2/3 unit's gather or reduce-scatter in ``out``'s unit_* rows: its calls and bytes, whichever stream
    it runs on (FSDP2's copies follow every one), and, when it runs inside the passes (``per_pass``: the dp.*
    streams), the longest single call (the pass ends _fsdp_edges exposes)."""
    num = out.unit_count.setdefault(key, [0] * stages)
    vol = out.unit_volume.setdefault(key, [0.0] * stages)
    big = out.unit_largest.setdefault(key, [0.0] * stages)
    for s in c.stages:
        num[s] += c.calls_per_iteration
        vol[s] += c.calls_per_iteration * c.message_bytes
        if per_pass:
            big[s] = max(big[s], t)


# the kinds reported on another kind's stream: the CP ring's p2p on "cp", beside the CP all-gather (which never
# hides: _behind_overlap); _HIDING: per such stream, its one kind that hides behind compute (_totals_kind)
_REPORTED_ON = {"cp.ring": "cp"}
_HIDING = {stream: kind for kind, stream in _REPORTED_ON.items()}

# per pass: (kind, its stream key in StreamTotals, the stream it is reported on)
_PASS_STREAMS = {
    phase: tuple(
        (kind, f"{kind}.{phase}", _REPORTED_ON.get(kind, kind)) for kind in ("tp", "ep", "cp", "cp.ring", "dp")
    )
    for phase in ("forward", "backward")
}


def _totals_kind(stream: str) -> str:
    """The kind whose hidden time a reported stream's ``hidden_by_stream`` holds: its StreamTotals key's prefix."""
    return _HIDING.get(stream, stream)


def assign_streams(
    ctx: Context, totals: StreamTotals, stages: list[StageStep], flags: Overlap, gpu: GPUSpec | None = None
) -> None:
    """The second half: each stage's once-per-iteration DP streams and tail, and what each pass exposes
    (TP behind the GEMMs with tp_comm_overlap, the CP ring behind attention, ZeRO-2/3 prefetch behind the
    pass), written into ``stages``; with ``gpu``, FSDP2's copies on the compute stream join the passes
    (_fsdp_copies: without it, as in a lower bound, they are left out)."""
    zeros = [0.0] * len(stages)
    acc, counts, volume = totals.time, totals.count, totals.volume
    grad, grad_n, grad_v = (
        acc.get("grad_reduce", zeros),
        counts.get("grad_reduce", zeros),
        volume.get("grad_reduce", zeros),
    )
    gather, gather_n = acc.get("param_gather", zeros), counts.get("param_gather", zeros)
    gather_v, tail = volume.get("param_gather", zeros), acc.get("tail", zeros)
    prefetch = _prefetch(ctx, flags)
    if ctx.flavour.prefetches_units and prefetch:
        _fsdp_edges(ctx, totals, stages)
    if flags.tp_comm_overlap and ctx.flavour.userbuffers:
        _userbuffers_fallback(ctx, totals, stages)
    if flags.tp_comm_overlap and ctx.flavour.async_tp_single_matmul:
        _async_tp_unfused(ctx, totals, stages)
        if gpu is not None:
            _async_tp_fused(ctx, totals, stages, gpu)
    if ctx.flavour.fsdp_unit_copies and gpu is not None:
        _fsdp_copies(ctx, totals, stages, gpu)
    if ctx.flavour.sp_layout_copies and ctx.par.sp and gpu is not None:
        _sp_layout_copies(ctx, totals, stages, gpu, flags)
    if flags.tp_comm_overlap and ctx.flavour.async_tp_single_matmul and ctx.par.sp and gpu is not None:
        _split_gemms(ctx, stages, gpu, async_tp_split)
    ub_split = flags.tp_comm_overlap and ctx.flavour.userbuffers and ctx.par.sp and ctx.training
    if ub_split and userbuffers_rows(ctx) and gpu is not None:
        _split_gemms(ctx, stages, gpu, userbuffers_split)
    passes = {
        phase: [(kind, stream, acc[key]) for kind, key, stream in streams if key in acc]
        for phase, streams in _PASS_STREAMS.items()
    }
    for st in stages:
        i = st.stage
        st.grad_reduce_s, st.grad_buckets, st.grad_bytes = grad[i], grad_n[i], int(grad_v[i])
        st.param_bytes = int(gather_v[i])
        st.param_gather_s, st.param_units = gather[i], gather_n[i]
        st.tail_s = tail[i]
        st.fwd_comm_s = _pass_exposed(ctx, st, "forward", passes["forward"], flags, prefetch)
        st.bwd_comm_s = _pass_exposed(ctx, st, "backward", passes["backward"], flags, prefetch)
        if flags.overlap_moe_expert_parallel_comm:
            overlap_forward_backward(st)
    if gpu is not None:
        _stage_contention(ctx, totals, stages, flags, gpu)


def _stage_contention(
    ctx: Context, totals: StreamTotals, stages: list[StageStep], flags: Overlap, gpu: GPUSpec
) -> None:
    """``assign_streams``' last part, with a GPU: each stage's passes slowed by what the hidden communication
    holds (planner/contention.py), and the pipeline's overlapped sends."""
    # only the streams that hide somewhere (and the DP streams when they overlap) are asked what they hold
    keys = {f"{_totals_kind(k)}.{phase}" for st in stages for k, phase in st.hidden_by_stream}
    keys |= {
        k for k, on in (("grad_reduce", flags.overlap_grad_reduce), ("param_gather", flags.overlap_param_gather)) if on
    }
    holds = _holds(ctx, totals, flags, len(stages), keys, gpu)
    hbm_eff = efficiency(gpu, None).hbm
    for st in stages:
        _contention(st, holds, flags, gpu, hbm_eff)
    if flags.overlap_p2p and ctx.par.pp > 1:
        _pp_contention(ctx, totals, stages, gpu, hbm_eff)
    for st in stages:  # a host-bound pass's GPU idles host_s (compute.host_pass_time): slowed kernels fill it first
        if flags.overlap_moe_expert_parallel_comm:
            absorb_pair_slowdown(st)
            continue
        st.slow_fwd_s = max(0.0, st.slow_fwd_s - st.compute.forward.host_s)
        st.slow_bwd_s = max(0.0, st.slow_bwd_s - st.compute.backward.host_s)


def absorb_pair_slowdown(st: StageStep) -> None:
    """A forward and a backward run as one pair (the combined 1F1B): the GPU's idle of the pair, both passes'
    host_s (compute.combined_pair splits one wait between them by their launches, a bookkeeping split), takes the
    slowed kernels of either pass; what is left stays on each pass in proportion to its slowdown."""
    slow = st.slow_fwd_s + st.slow_bwd_s
    if slow:
        keep = max(0.0, slow - st.compute.forward.host_s - st.compute.backward.host_s) / slow
        st.slow_fwd_s, st.slow_bwd_s = st.slow_fwd_s * keep, st.slow_bwd_s * keep


def _pass_exposed(ctx: Context, st: StageStep, phase: str, rows: list, flags: Overlap, prefetch: bool) -> float:
    """A stage's communication exposed in one pass (per micro-batch), each stream's share recorded in
    ``st.exposed_by_stream``."""
    comp = st.compute
    pass_time = comp.forward if phase == "forward" else comp.backward
    exposed = 0.0
    for kind, stream, row in rows:
        t = row[st.stage] / ctx.passes
        if not t:
            continue
        left = _behind_overlap(ctx, st, kind, phase, t, pass_time, flags, prefetch)
        exposed += left
        key = (stream, phase)
        if left:
            st.exposed_by_stream[key] = st.exposed_by_stream.get(key, 0.0) + left
            if kind != stream:  # its own exposure too, for the contention (_contention): not its stream's sum
                st.exposed_by_kind[(kind, phase)] = left
        if t > left:
            st.hidden_by_stream[key] = st.hidden_by_stream.get(key, 0.0) + (t - left)
    return exposed


def _behind_overlap(ctx: Context, st: StageStep, kind: str, phase: str, t: float, pass_time, flags: Overlap,
                    prefetch: bool) -> float:  # fmt: skip
    """What of ``t`` seconds of ``kind`` traffic stays exposed: TP behind the GEMMs with tp_comm_overlap, the
    CP ring behind attention, ZeRO-2/3 prefetch behind the pass, EP behind the shared experts."""
    comp = st.compute
    if kind == "tp" and flags.tp_comm_overlap:
        left = min(t, st.tp_unfused_s) if phase == "backward" else 0.0
        left = min(t, left + st.tp_fallback_s.get(phase, 0.0))
        left = min(t, left + (st.tp_fused_fwd_s if phase == "forward" else st.tp_fused_bwd_s))
        return left + max(0.0, t - left - pass_time.gemm_s)
    if kind == "cp.ring" and flags.cp_ring_overlap:
        window = comp.attention_fwd_s * (1 if phase == "forward" else 2)
        return max(0.0, t - window)
    if kind == "dp" and prefetch:
        edge = st.first_gather_s if phase == "forward" else st.last_reduce_s
        return min(t, max(t - pass_time.total_s, edge))
    if kind == "ep" and flags.moe_shared_expert_overlap and not flags.overlap_moe_expert_parallel_comm:
        return max(0.0, t - pass_time.gemm_s * shared_expert_share(ctx, st.stage, comp))
    return t


def _fsdp_edges(ctx: Context, totals: StreamTotals, stages: list[StageStep]) -> None:
    """FSDP2's implicit prefetch hides a unit's all-gather behind the previous unit's compute and its
    reduce-scatter behind the next one's, but not the ends of a pass (torch/distributed/fsdp/_fully_shard/
    _fsdp_state.py _root_pre_forward: the root unit (embedding, final norm, head) is gathered before the forward's
    first kernel; _root_post_backward_final_callback waits for the last reduce-scatter before the optimizer). Per
    micro-batch, the forward waits for its first all-gather and the backward for its last reduce-scatter: taken
    as the pass's largest of each (the root unit's, the embedding's and the head's parameters, in the models
    here). Between micro-batches nothing hides the last reduce-scatter either: the next forward's all-gather runs
    on the same NCCL communicator (FSDP2's one process group for both), whose kernels run in the order issued."""
    zeros = [0.0] * len(stages)
    first = totals.unit_largest.get("dp.forward.allgather", zeros)
    last = totals.unit_largest.get("dp.backward.reducescatter", zeros)
    for st in stages:
        st.first_gather_s, st.last_reduce_s = first[st.stage], last[st.stage]


def _holds(
    ctx: Context, totals: StreamTotals, flags: Overlap, stages: int, wanted: set[str], gpu: GPUSpec
) -> dict[str, list[Share | None]]:
    """What the calls of each stream hold on average while they run, per stage (contention.Share; None where the
    stream holds nothing there): the priced calls' NCCL channels (p2p and all-to-all kernels included) or own
    SMs and HBM bytes over their seconds; a TP overlap whose framework sets its own SMs per collective
    (Flavour.tp_overlap_sms: TransformerEngine's userbuffers) holds those instead of NCCL's channels; the CP
    ring's exchange under TransformerEngine runs as one or two kernels at once (contention.ring_p2p_kernels);
    torch's ring attention rotates with one kernel (rules/context_parallel.py ``_torch_ring``). Only the streams
    in ``wanted``."""
    # under MLA, Megatron's userbuffers are off (rules/tensor.py userbuffers_rows): NCCL's channels
    ub = flags.tp_comm_overlap and (not ctx.flavour.userbuffers or bool(userbuffers_rows(ctx)))
    own = ctx.flavour.tp_overlap_sms if ub else ()
    te_ring = ring_p2p_kernels(gpu.sm, ctx.par.cp) if rotate_method(ctx) is None else 0
    keys = {k for k in wanted if k in totals.sm_time or (own and k.startswith("tp.") and k in totals.time)}
    out: dict[str, list[Share | None]] = {}
    zeros = [0.0] * stages
    for key in keys:
        seconds, sm, hbm = totals.time.get(key, zeros), totals.sm_time.get(key, zeros), totals.hbm.get(key, zeros)
        if own and key.startswith("tp."):
            by_op = [(n, totals.tp_ops.get(f"{key}.{op}", zeros)) for op, n in own]
            sm = [sum(n * row[s] for n, row in by_op) for s in range(stages)]
        if te_ring and key.startswith("cp.ring."):
            sm = [x * te_ring for x in sm]
        out[key] = [Share(a / t, b / t) if t and (a or b) else None for t, a, b in zip(seconds, sm, hbm, strict=True)]
    return out


def _compute_bound(p: PassTime) -> float:
    """The time share of a pass's compute-bound kernels (GEMMs, attention): the rest is memory-bound (the GPU's wait
    for the host, PassTime.host_s, is neither)."""
    total = p.total_s - p.host_s
    return (p.gemm_s + p.attention_s) / total if total > 0 else 1.0


def _contention(st: StageStep, holds: dict, flags: Overlap, gpu: GPUSpec, hbm_eff: float) -> None:
    """Each pass lengthened by the communication hidden behind it (planner/contention.py): per hidden stream, its
    calls' SMs and HBM traffic slow the compute they hide behind: the GEMMs for TP overlap and the shared experts,
    attention for the CP ring (compute-bound alone), the whole pass (its GEMM/attention and memory-bound shares)
    for FSDP prefetch and the combined forward-backward pair's all-to-alls. The once-per-iteration DP streams'
    holds are kept for critical_path. ``holds``: _holds's; ``hbm_eff``: the GPU's achievable share of its HBM
    bandwidth."""
    i = st.stage
    slow = {"forward": 0.0, "backward": 0.0}
    for (stream, phase), hidden in st.hidden_by_stream.items():
        if phase not in slow:
            continue
        kind = _totals_kind(stream)
        row = holds.get(f"{kind}.{phase}")
        share = row[i] if row else None
        if share is None:
            continue
        whole = st.compute.forward if phase == "forward" else st.compute.backward
        behind_kernels = kind in ("tp", "cp.ring") or (kind == "ep" and not flags.overlap_moe_expert_parallel_comm)
        rate = window_rate(gpu, hbm_eff, share, 1.0 if behind_kernels else _compute_bound(whole))
        exposed = (
            st.exposed_by_kind.get((kind, phase), 0.0)
            if kind != stream
            else st.exposed_by_stream.get((stream, phase), 0.0)
        )
        if kind == "tp":  # the rows userbuffers leave on NCCL run apart, serialised: they absorb no slowdown
            exposed = max(0.0, exposed - st.tp_fallback_s.get(phase, 0.0))
        slow[phase] += slowdown_s(hidden, exposed, rate)
    st.slow_fwd_s, st.slow_bwd_s = slow["forward"], slow["backward"]
    grad, gather = holds.get("grad_reduce"), holds.get("param_gather")
    st.grad_share = (grad[i] if grad else None) or _NOTHING
    st.gather_share = (gather[i] if gather else None) or _NOTHING


_NOTHING = Share()


def _pp_contention(ctx: Context, totals: StreamTotals, stages: list[StageStep], gpu: GPUSpec, hbm_eff: float) -> None:
    """Each pass lengthened by the pipeline sends hidden behind it under overlap_p2p (planner/contention.py):
    per micro-batch, every model chunk's pass runs beside one boundary send's time of a send and a recv kernel
    (contention.PP_OVERLAP_KERNELS), its whole mix of compute- and memory-bound work slowed."""
    channels, moved = totals.send_held
    t = totals.send_s
    if not t or not (channels or moved):
        return
    share = kernels_share(channels, PP_OVERLAP_KERNELS, moved, t)
    hidden = ctx.par.chunks_per_rank * t
    for st in stages:
        for phase in ("forward", "backward"):
            whole = st.compute.forward if phase == "forward" else st.compute.backward
            rate = window_rate(gpu, hbm_eff, share, _compute_bound(whole))
            st.lengthen(phase, slow_s=slowdown_s(min(hidden, whole.total_s - whole.host_s), 0.0, rate))


def _userbuffers_fallback(ctx: Context, totals: StreamTotals, stages: list[StageStep]) -> None:
    """The TP calls of a pass Megatron's --tp-comm-overlap leaves on NCCL (all but rules/tensor.py userbuffers_rows:
    MLA's, the MTP modules' and their inner layers' (userbuffers_decoder_share), the embedding's and the output
    layer's, any all-reduce), per micro-batch and phase: exposed as without the overlap."""
    carried, m = userbuffers_rows(ctx), ctx.passes
    # the decoder's share of a carried row the MTP blocks join (their inner layers run NCCL)
    shares = [userbuffers_decoder_share(ctx, s) if carried else {} for s in range(len(stages))]
    for phase in _PASSES:
        total = totals.time.get(f"tp.{phase}")
        if total is None:
            continue
        kept = [0.0] * len(stages)  # the carried rows' seconds (all-gathers and reduce-scatters: tp_seconds)
        for key, took in totals.tp_seconds.items():
            _, of, _, name = key.split(".", 3)
            if of == phase and name in carried:
                kept = [k + t * share.get(name, 1.0) for k, t, share in zip(kept, took, shares, strict=True)]
        for st in stages:
            st.tp_fallback_s[phase] = max(0.0, total[st.stage] - kept[st.stage]) / m


def _async_tp_unfused(ctx: Context, totals: StreamTotals, stages: list[StageStep]) -> None:
    """The backward reduce-scatters an async-TP pass that fuses only "reduce_scatter_tensor(A @ B)" cannot fuse
    (flavour trait async_tp_single_matmul): the column-parallel input gradients summed over separate linears
    (rules/tensor.py summed_dgrad_names)."""
    names = summed_dgrad_names(ctx)
    if not names:
        return
    m = ctx.passes
    for st in stages:
        seconds = (totals.tp_seconds.get(tp_key("backward", "reducescatter", n)) for n in names)
        st.tp_unfused_s = sum(row[st.stage] for row in seconds if row) / m


def _async_tp_fused(ctx: Context, totals: StreamTotals, stages: list[StageStep], gpu: GPUSpec) -> None:
    """The fused async-TP ops of torch hide their communication behind their own GEMM only: the op returns once every
    shard is copied and consumed (torch/distributed/_symmetric_memory/__init__.py _pipelined_all_gather_and_consume:
    the shard consumer runs per arriving shard, the local one first; _pipelined_produce_and_all2all: a chunk is
    sent once computed), and the next op on the compute stream waits for it. A fused call of c seconds with a GEMM
    of g (as split, kernels.async_tp_gemm_s, times its share: rules/tensor.py async_tp_fused_gemms) takes
    max(c + g/tp, g): the last shard's GEMM (or the first chunk's) cannot overlap the copies; c + g/tp - g of it is
    exposed. The communication c is what the op moves: tp - 1 copy-engine pulls of one peer's shard, one after
    another (fused_transfer_s), where the GPU's pull was measured (collectives peer_copy) and every call of the row
    sits where it was measured (PeerCopy.reaches: behind one NVLink switch, StreamTotals.tp_switched, on a board of
    the measured size); elsewhere the ledger's price of the call (NCCL's). Dense non-MLA models only (else {}: the
    pass-wide rule of _behind_overlap)."""
    fused = async_tp_fused_gemms(ctx)
    if not fused:
        return
    gemm = async_tp_gemm_s(ctx, gpu)
    t, m, pull = ctx.par.tp, ctx.passes, peer_copy(gpu)
    for st in stages:
        i = st.stage
        out = {"forward": 0.0, "backward": 0.0}
        for key, took in totals.tp_seconds.items():
            _, phase, _, name = key.split(".", 3)
            if name not in fused or not took[i]:
                continue
            kernel, share = fused[name]
            g = gemm.get(kernel, 0.0) * share
            calls = totals.unit_count[key][i]
            row = totals.tp_switched.get(key)
            switched = row is not None and row[i] == calls
            if pull is not None and pull.reaches(switched, ctx.devices_per_node):
                c = fused_transfer_s(totals.unit_volume[key][i] / calls, t, pull)
            else:
                c = took[i] / calls
            out[phase] += calls * fused_op_exposed_s(c, g, t) / m
        st.tp_fused_fwd_s, st.tp_fused_bwd_s = out["forward"], out["backward"]


def fused_transfer_s(message: float, tp: int, pull: PeerCopy) -> float:
    """What a fused all-gather-matmul or matmul-reduce-scatter of ``message`` bytes (the gathered output, the
    reduce-scattered input: the ledger's message) moves, in seconds: tp - 1 copy-engine pulls of one peer's
    message / tp, one after another (torch/distributed/_symmetric_memory/__init__.py: each step of
    _pipelined_all_gather_and_consume and _pipelined_produce_and_all2all ``copy_``s one remote rank's p2p buffer,
    a contiguous device copy, i.e. cudaMemcpyAsync on the copy engine; "cp" from different streams cannot
    overlap), at ``pull``'s measured rate after its measured per-copy latency (collectives/topology/gpu.py
    PEER_COPY)."""
    return pull.seconds(message / tp, tp - 1)


def fused_op_exposed_s(comm_s: float, gemm_s: float, tp: int) -> float:
    """What a fused all-gather-matmul or matmul-reduce-scatter of ``comm_s`` seconds of communication around
    ``gemm_s`` seconds of GEMM (in tp pieces) leaves exposed: it takes max(comm + gemm/tp, gemm)
    (_async_tp_fused)."""
    return max(0.0, comm_s + gemm_s / tp - gemm_s)


def _fsdp_copies(ctx: Context, totals: StreamTotals, stages: list[StageStep], gpu: GPUSpec) -> None:
    """FSDP2's copy-out after each all-gather and copy-in before each reduce-scatter run on the compute stream
    (kernels.fsdp_copy_kernels): their time joins the passes' memory-bound kernels, per micro-batch. A unit
    gathered or reduced fewer times than there are micro-batches (FSDP2 inside torch.distributed.pipelining:
    rules/data.py fsdp2_pipelined) has its copies spread evenly over the micro-batches' passes: the iteration's
    total is exact, where in the schedule they fall is not."""
    m, eff = ctx.passes, efficiency(gpu, None)
    zeros = [0] * len(stages)
    for st in stages:
        i = st.stage
        extra = []
        for phase in ("forward", "backward"):
            gathered = totals.unit_volume.get(f"dp.{phase}.allgather", zeros)[i] / m
            gathers = totals.unit_count.get(f"dp.{phase}.allgather", zeros)[i] / m
            reduced = totals.unit_volume.get(f"dp.{phase}.reducescatter", zeros)[i] / m
            reduces = totals.unit_count.get(f"dp.{phase}.reducescatter", zeros)[i] / m
            extra.append(
                fsdp_copy_kernels(gathered, gathers, reduced, reduces, ctx.param_bytes, ctx.grad_bytes, gpu, eff)
            )
        _into_passes(st, *extra)


def _paced_stage(ctx: Context, s: int, gpu: GPUSpec, paired: bool) -> StageStep:
    """Stage ``s``'s compute on the paced part ``gpu`` (spread.slowest_part) and what the pace added."""
    comp = stage_compute(ctx, s, gpu, paired=paired)
    if gpu.part_clock == 1.0:
        return StageStep(s, comp)
    return StageStep(s, comp, spread=compute_spread(comp, stage_compute(ctx, s, median_part(gpu), paired=paired)))


def _into_passes(st: StageStep, forward: Sequence, backward: Sequence) -> None:
    """Adds a stage's per-micro-batch memory-bound kernels on the compute stream (the FSDP2 and SP copies) into its
    forward and backward passes (timed on step_time's paced part: HBM-bound, the clock does not move them)."""
    fwd, bwd = (PassTime(elementwise_s=sum(k.time_s for k in ks)) for ks in (forward, backward))
    if fwd.elementwise_s or bwd.elementwise_s:
        c = st.compute
        st.compute = replace(c, forward=c.forward + fwd, backward=c.backward + bwd)


def _sp_layout_copies(ctx: Context, totals: StreamTotals, stages: list[StageStep], gpu: GPUSpec, flags) -> None:
    """DTensor's re-layout of each sequence-parallel all-gather's output and reduce-scatter's input on the compute
    stream (kernels.sp_layout_copy_kernels), per micro-batch into each stage's passes, beside the call. The
    all-gathers copy only when a dim before the sequence dim is larger than 1 (the micro-batch: b > 1; torch's
    _maybe_view_chunk_cat returns a view for b = 1). Under async TP the calls the micro-pipeline pass fuses
    (rules/tensor.py async_tp_fused_names) are re-laid inside the fused op instead (_fused_relayout). Left out
    without ``gpu``, as the FSDP2 copies are (the search's lower bounds)."""
    async_tp = flags.tp_comm_overlap and ctx.flavour.async_tp_single_matmul
    fused = async_tp_fused_names(ctx) if async_tp else ()
    gemms = async_tp_fused_gemms(ctx) if async_tp else {}
    m, eff, zeros = ctx.passes, efficiency(gpu, None), [0.0] * len(stages)
    for st in stages:
        i = st.stage
        extra = []
        for phase in ("forward", "backward"):
            sums = {"allgather": [0.0, 0.0], "reducescatter": [0.0, 0.0]}
            for key, moved in totals.unit_volume.items():
                if not key.startswith("tp."):
                    continue
                _, when, op, name = key.split(".", 3)
                calls = totals.unit_count.get(key, zeros)[i] / m
                if when != phase:
                    continue
                if name in fused:
                    nbytes, kernels = _fused_relayout(ctx, gpu, op, moved[i] / m, calls, gemms.get(name))
                    sums[op][0] += nbytes
                    sums[op][1] += kernels
                    continue
                if ctx.b == 1 and op == "allgather":
                    continue
                sums[op][0] += moved[i] / m
                sums[op][1] += calls
            if async_tp and phase == "backward":  # the weight gradients' copies of the fused gathers' outputs
                nbytes, copies = _strided_reads(ctx, totals, i, gpu)
                sums["allgather"] = [sums["allgather"][0] + nbytes, sums["allgather"][1] + copies]
            extra.append(sp_layout_copy_kernels(*sums["allgather"], *sums["reducescatter"], gpu, eff))
        _into_passes(st, *extra)


def _strided_reads(ctx: Context, totals: StreamTotals, i: int, gpu: GPUSpec) -> tuple[float, float]:
    """(bytes, calls) per micro-batch of stage ``i``'s fused all-gathers whose gathered output a weight gradient
    copies before reading it, in the backward pass. The fused op returns its gathered A as
    ``A_flat.view(*leading_dims, -1).flatten(0, 1).movedim(0, gather_dim)`` (torch/distributed/_symmetric_memory/
    __init__.py _fused_all_gather_matmul_impl ``unflatten``): [b, s, h] over memory laid [s, b, h]. The weight
    gradient's matmul flattens it to [b*s, h], which is no view of that memory when b > 1, so Inductor realizes a
    copy (torch/_inductor/ir.py View.create keeps a reindexing view of a non-contiguous input; ExternKernel.
    realize_input cannot make it a ReinterpretView and calls copy_input, a pointwise copy). Once a gather of the
    forward (its tensor saved or re-gathered) and once a grad output's gather (rules/tensor.py
    async_tp_wgrad_reads), where that GEMM reads its operands as stored (kernels.reads_stored_operands: bf16, not
    a float8 recipe's, whose casts already copy). Counted in the message units sp_layout_copy_kernels doubles
    (2 B moved a byte gathered: the copy DTensor's cat made in vanilla TP, here after the fused op)."""
    if ctx.b == 1:
        return 0.0, 0.0
    reads, m = async_tp_wgrad_reads(ctx), ctx.passes
    nbytes = calls = 0.0
    for name, wgrad in reads.items():
        if not reads_stored_operands(ctx, gpu, wgrad):
            continue
        for phase in ("forward", "backward"):
            key = tp_key(phase, "allgather", name)
            if key in totals.unit_volume:
                nbytes += totals.unit_volume[key][i] / m
                calls += totals.unit_count[key][i] / m
    return nbytes, calls


def _fused_relayout(ctx: Context, gpu: GPUSpec, op: str, moved: float, calls: float, gemm) -> tuple[float, float]:
    """(bytes, kernels) a fused async-TP op copies on the compute stream per pass. When the micro-batch is more than
    one sequence (b > 1: torch/distributed/_symmetric_memory/__init__.py moves the sequence dim to the front and
    flattens, a copy when b > 1): _fused_all_gather_matmul_impl ``A_shard.movedim(gather_dim, 0).flatten(0, -2)``,
    the rank's shard (the gathered message / tp); _fused_matmul_reduce_scatter_impl ``A.movedim(scatter_dim,
    0).flatten(0, -2)``, the matmul's whole input A (kernels.gemm_operand_bytes of its GEMM, times the share re-run;
    none where no GEMM is mapped: MoE, MLA). At any b, an all-gather also copies the rank's shard into its own
    symmetric p2p buffer before the first shard's GEMM, then waits at a barrier (_pipelined_multi_all_gather_and_
    consume ``copy_shard(dst=local_p2p_bufs, src=shard)``: "we are giving up the chance to overlap mv and b with
    the first shard_consumer"; asynctp14): one shard more, one kernel more a call. Counted in the message units
    sp_layout_copy_kernels doubles (read and written), one kernel a copy."""
    if op == "allgather":
        copies = 2 if ctx.b > 1 else 1
        return copies * moved / ctx.par.tp, copies * calls
    if gemm is None or ctx.b == 1:
        return 0.0, 0.0
    kernel, share = gemm
    return calls * share * gemm_operand_bytes(ctx, gpu, kernel), calls


def _split_gemms(ctx: Context, stages: list[StageStep], gpu: GPUSpec, split) -> None:
    """TP overlaps that run a GEMM as pieces: torch's async TP runs each fused GEMM as tp GEMMs of a rank's shard of
    rows and sums the reduce-scatter's partials on the compute stream (``split`` kernels.async_tp_split);
    TransformerEngine's userbuffers run theirs as ring-exchange and pipelined chunks (kernels.userbuffers_split).
    Per micro-batch, into each stage's passes, for every layer; a fully recomputed layer adds the share of what its
    re-run runs (kernels.full_rerun). Left out without ``gpu``, as the FSDP2 copies are (the search's lower
    bounds)."""
    median = median_part(gpu)  # the pieces' own spread (StageStep.spread), where step_time's part is paced
    for st in stages:
        fwd, bwd = _split_passes(ctx, st.stage, gpu, split)
        if median is not gpu:
            f_med, b_med = _split_passes(ctx, st.stage, median, split)
            f, b, o = st.spread
            st.spread = (f + pass_spread(fwd, f_med), b + pass_spread(bwd, b_med), o)
        c = st.compute
        st.compute = replace(c, forward=c.forward + fwd, backward=c.backward + bwd)


def _split_passes(ctx: Context, stage: int, gpu: GPUSpec, split) -> tuple[PassTime, PassTime]:
    """What ``split``'s pieces add to one forward and one backward of ``stage`` on ``gpu`` (_split_gemms)."""
    eff, fwd, bwd = efficiency(gpu, None), PassTime(), PassTime()
    for (moe, plan), count in layer_counts(ctx, stage).items():
        f_gemm, f_mem, b_gemm = split(ctx, moe, gpu, eff)
        fwd = fwd + PassTime(gemm_s=f_gemm, elementwise_s=f_mem).scaled(count)
        redo = PassTime()
        if plan.kind == "full":  # the re-run's share: full_rerun's GEMMs (torch's stops before fc2)
            r_gemm, r_mem, _ = split(ctx, moe, gpu, eff, True)
            redo = PassTime(gemm_s=r_gemm, elementwise_s=r_mem)
        bwd = bwd + (PassTime(gemm_s=b_gemm) + redo).scaled(count)
    return fwd, bwd


def _assign_calls(ctx: Context, calls: Sequence, stages: list[StageStep], flags: Overlap, gpu: GPUSpec) -> StreamTotals:
    """Sums each call's time per stage into the stream it runs on; returns the totals (the pipeline's sends)."""
    rows, switched = tp_rows_read(ctx, flags), fused_rows_priced(ctx, flags, gpu)
    totals = stream_totals(calls, ctx.passes, ctx.par.zero_stage, len(stages), rows, switched)
    assign_streams(ctx, totals, stages, flags, gpu)
    return totals


def paired_passes(ctx: Context, overlap: Overlap) -> bool:
    """Whether a micro-batch's forward and backward run as Megatron's combined 1F1B pair: the switch
    overlap_moe_expert_parallel_comm as ``overlap`` gives it (resolved or not: None is its OVERLAP_DEFAULTS row,
    as Overlap.resolved reads it, without that method's checks), in training. Megatron issues a layer's backward
    and the next micro-batch's forward as one pair from one host thread: where the MoE layers wait for their token
    counts, the host's queue of the pair replaces the per-pass rule's (compute.combined_pair_delta;
    docs/step-time.md "MoE host time", round 9). The stage compute carries it (compute.stage_compute's
    ``paired``), so that the plan (step_time) and the search (search/step_model.py: its step time and its bounds)
    read one compute."""
    on = overlap.overlap_moe_expert_parallel_comm
    if on is None:
        on = OVERLAP_DEFAULTS["overlap_moe_expert_parallel_comm"](ctx)
    return bool(on) and ctx.training


def overlap_forward_backward(st: StageStep) -> None:
    """A forward and a backward of two micro-batches run as one pair (Megatron's combined 1F1B A2A overlap;
    DualPipe's F&B, DeepSeek-V3 §3.2.1): the EP all-to-alls of both directions are exposed only beyond the
    pair's compute, the same fraction of each direction; the other streams stay as they were."""
    ep_f = st.exposed_by_stream.get(("ep", "forward"), 0.0)
    ep_b = st.exposed_by_stream.get(("ep", "backward"), 0.0)
    if not ep_f + ep_b:
        return
    window = st.compute.forward.total_s + st.compute.backward.total_s
    left = max(0.0, ep_f + ep_b - window) / (ep_f + ep_b)
    for phase, t in (("forward", ep_f), ("backward", ep_b)):
        st.lengthen(phase, comm_s=-(t * (1 - left)))
        if t * (1 - left):
            st.hidden_by_stream[("ep", phase)] = st.hidden_by_stream.get(("ep", phase), 0.0) + t * (1 - left)
        if t * left:
            st.exposed_by_stream[("ep", phase)] = t * left
        else:
            st.exposed_by_stream.pop(("ep", phase), None)


def shared_expert_share(ctx: Context, stage: int, comp: StageCompute) -> float:
    """The shared experts' share of the stage's forward FLOPs (backward alike): per MoE layer a TP-split MLP of
    shared_ffn over the b·s/c tokens (Megatron SharedExpertMLP), 2 FLOPs per multiply-add."""
    m = ctx.model
    if not m.moe or not m.moe.shared_ffn or not comp.forward.flops:
        return 0.0
    matrices = 3 if m.gated_mlp else 2
    flops = ctx.moe_layers(stage) * 2 * ctx.b * ctx.s_cp * m.hidden_size * m.moe.shared_ffn * matrices / ctx.par.tp
    return min(1.0, flops / comp.forward.flops)


def _offload(st: StageStep, transfer_s: float) -> None:
    """CPU activation offload: the copy to host in the forward and back in the backward run on their own
    stream behind the pass (TransformerEngine's offload handler); what outlasts the pass is exposed."""
    for phase, pass_time in (("forward", st.compute.forward), ("backward", st.compute.backward)):
        exposed = max(0.0, transfer_s - pass_time.total_s)
        if transfer_s > exposed:
            st.hidden_by_stream[("pcie", phase)] = transfer_s - exposed
        if exposed:
            st.exposed_by_stream[("pcie", phase)] = exposed
            st.lengthen(phase, comm_s=exposed)


def _prefetch(ctx: Context, flags: Overlap) -> bool:
    """Whether ZeRO-2/3 per-micro-batch traffic hides behind the pass: FSDP2 prefetches; DeepSpeed overlaps only
    with overlap_comm (its default: on at ZeRO-3 only); Megatron with overlap_grad_reduce."""
    return bool(flags.fsdp_prefetch if ctx.flavour.prefetches_units else flags.overlap_grad_reduce)


# ---- assembly -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CriticalPath:
    """The training step's critical path (``critical_path``)."""

    time_s: float
    pipeline: PipelineTime
    passes: list[StagePass]
    sync_s: float  # when the gradient-norm all-reduce syncs the stages
    finish_s: list[float]  # per stage: sync + optimizer + exposed parameter gather
    exposed_dp_s: list[float]  # per stage: exposed gradient reduction
    exposed_gather_s: list[float]
    # per stage: the last backward and first forward lengthened by the hidden DP reduction and gather (_dp_slowdown)
    slow_dp_s: list[float]


def critical_path(
    ctx: Context,
    stages: list[StageStep],
    sched: Schedule,
    gpu: GPUSpec,
    flags: Overlap,
    bound: bool = False,
    shares: Sequence | None = None,
) -> CriticalPath:
    """The pipeline's critical path, each stage's exposed gradient reduction and tail, the sync (Megatron's
    gradient-norm all-reduce over the model-parallel ranks, megatron/core/optimizer/clip_grads.py), then
    each stage's optimizer step and exposed parameter gather; the step ends with the slowest.

    ``bound``: a lower bound when ``stages`` hold only part of the communication (the layout search): the
    overlapped gradient reduction and parameter gather count as 0 (their exposure max(t - pass / v, t /
    buckets) can fall when the passes lengthen or other calls add buckets); every other term only grows
    with more communication (pipe - lead grows by at least the lead's growth: the pipeline grows by the
    sum over stages of each pass's growth / v). ``shares``: stage_passes's."""
    passes = stage_passes(ctx, stages, gpu, shares)
    pipe = pipeline_time(passes, sched)
    v = max(1, sched.chunks)  # the rank's chunks, which share its pass (StagePass.chunk_s; DualPipe's: a whole stage)
    dp, gathers, ends = [], [], []
    hbm_eff = 0.0 if bound else efficiency(gpu, None).hbm
    slows, late = [], []  # per stage: both slowdowns (reported), the first forward's (after the optimizer step)
    for st, p, lead in zip(stages, passes, drain_leads_of(passes, sched), strict=True):
        reduce = gather = 0.0
        if st.grad_reduce_s and not (bound and flags.overlap_grad_reduce):
            reduce = exposed_grad_reduce(ctx, st, p, v, flags)
        if st.param_gather_s and not (bound and flags.overlap_param_gather):
            gather = exposed_param_gather(ctx, st, p, v, flags)
        slow_reduce = slow_gather = 0.0
        if not bound:
            slow_reduce, slow_gather = _dp_slowdown(st, gpu, hbm_eff, reduce, gather, flags)
        dp.append(reduce)
        gathers.append(gather)
        slows.append(slow_reduce + slow_gather)
        late.append(slow_gather)
        ends.append(pipe.time_s - lead + reduce + slow_reduce + st.tail_s)
    sync = max(ends) + _document_wait_s(ctx, stages, sched)
    finish = [sync + st.compute.optimizer_s + g + slow for st, g, slow in zip(stages, gathers, late, strict=True)]
    return CriticalPath(max(finish), pipe, passes, sync, finish, dp, gathers, slows)


def _document_wait_s(ctx: Context, stages: list[StageStep], sched: Schedule) -> float:
    """The wait for the slowest packed micro-batch (planner/documents.py document_wait_s) over the stage with the
    most compute a micro-batch: its passes (the shares and scale ``sched``'s order runs), its core attention
    (forward and backward) and the rest of its token work, less the GPU's waits for the host (host_s: launches,
    not tokens)."""
    if ctx.work.document_packing is None or not ctx.training:
        return 0.0
    comp = max((st.compute for st in stages), key=lambda c: c.forward.total_s + c.backward.total_s)
    attention = comp.forward.attention_s + comp.backward.attention_s
    host = comp.forward.host_s + comp.backward.host_s
    token = comp.forward.total_s + comp.backward.total_s - attention - host
    # a micro-batch's share of the stage step (StageMap.passes: DualPipe's step is one micro-batch each way)
    share = sched.traits.stage_map.micro_batch_share
    passes = (comp.forward.total_s * share, comp.backward.total_s * share)
    token, attention = token * share, attention * share
    return document_wait_s(ctx, sched, passes, token, attention, comp.forward.gemm_s * share)  # stage_passes' W


def _dp_slowdown(
    st: StageStep, gpu: GPUSpec, hbm_eff: float, reduce: float, gather: float, flags: Overlap
) -> tuple[float, float]:
    """How much later the last backward and the first forward end for the gradient reduction and parameter gather
    hidden behind them (overlap_grad_reduce, overlap_param_gather; planner/contention.py), the whole pass's mix of
    compute-bound and memory-bound kernels beside the calls' SMs and HBM traffic; what of the call stayed exposed
    absorbs as much."""
    out = []
    for on, total, exposed, share, whole in (
        (flags.overlap_grad_reduce, st.grad_reduce_s, reduce, st.grad_share, st.compute.backward),
        (flags.overlap_param_gather, st.param_gather_s, gather, st.gather_share, st.compute.forward),
    ):
        if not on or total <= exposed or not (share.sms or share.hbm_Bps):
            out.append(0.0)
            continue
        rate = window_rate(gpu, hbm_eff, share, _compute_bound(whole))
        out.append(slowdown_s(total - exposed, exposed, rate))
    return out[0], out[1]


def _training(
    ctx: Context, stages: list[StageStep], sched: Schedule, gpu: GPUSpec, flags: Overlap, with_timeline: bool
) -> StepTime:
    path = critical_path(ctx, stages, sched, gpu, flags)
    for st, reduce, gather, slow in zip(stages, path.exposed_dp_s, path.exposed_gather_s, path.slow_dp_s, strict=True):
        st.exposed_dp_s, st.exposed_gather_s, st.slow_dp_s = reduce, gather, slow
    pipe, passes, sync, finish, time = path.pipeline, path.passes, path.sync_s, path.finish_s, path.time_s
    # the breakdown is reported for the stage that sets the pace: the most work per iteration
    crit = max(range(len(stages)), key=lambda s: (pipe.busy_s[s], finish[s]))
    st = stages[crit]
    # a rank's passes over its chunks (DualPipe's: one micro-batch each way, m / 2 of them; pipeline.StageMap.passes)
    runs = sched.passes
    # compute as it runs: slowed by the communication hidden behind it (planner/contention.py)
    passes_s = st.compute.forward.total_s + st.slow_fwd_s + st.compute.backward.total_s + st.slow_bwd_s
    compute = runs * passes_s + st.compute.optimizer_s + st.slow_dp_s
    exposed = (
        runs * (st.fwd_comm_s + st.bwd_comm_s + pass_wait(sched))
        + 2 * (sched.stages - 1) * sched.p2p_s
        + st.exposed_dp_s
        + st.tail_s
        + st.exposed_gather_s
    )
    exposed = min(exposed, time - compute)
    tokens = ctx.work.global_batch_size * ctx.s  # the workload's sequence when given (issue 20 item 6)
    events = _timeline(stages, passes, sched, pipe.time_s, sync, with_timeline)
    return StepTime(
        time,
        compute,
        exposed,
        max(0.0, time - compute - exposed),
        _mfu(ctx, tokens, time, gpu),
        tokens / time,
        crit,
        stages,
        events,
        caveats(passes, sched),
        runs * (st.spread[0] + st.spread[1]) + st.spread[2],
    )


def stage_passes(
    ctx: Context, stages: Sequence[StageStep], gpu: GPUSpec, shares: Sequence | None = None
) -> list[StagePass]:
    """Each rank's pass for the pipeline: forward and backward with their exposed communication, the
    forward of its first chunk and the backward of its last one at their real sizes (the layers each
    holds, the LM head and loss and the embedding with the chunks that have them; a chunk's share of the
    backward taken as its share of the forward), and W, the weight-gradient GEMMs the zero-bubble schedules
    defer: as many FLOPs as the forward GEMMs (Qi et al. 2024 §2), so the forward's GEMM time. ``shares``:
    chunk_shares of each stage, when the caller has them (the layout search memoises them on
    stage_compute_key and chunk_shares_key); None computes them. Under DualPipe (``StageMap.copies`` 2) a stage's
    step is one micro-batch each way, its first chunk the stage direction 0 runs and its last the one direction 1
    runs: the pass is half of it (a micro-batch's mean), the fill and drain those whole stages (dualpipe13)."""
    out = []
    copies = ctx.par.schedule.stage_map.copies  # the micro-batches a stage step (a pass over both chunks) carries
    for st in stages:
        share = chunk_shares(ctx, st, gpu) if shares is None else shares[st.stage]
        fwd, bwd = st.forward_s, st.backward_s
        fill = drain = None
        if share is not None:
            fill, drain = fwd * share[0], bwd * share[-1]
        out.append(StagePass.of_pass(fwd, bwd, fill, drain, st.compute.forward.gemm_s, copies))
    return out


def chunk_shares_key(ctx: Context, stage: int) -> tuple | None:
    """The value key of what ``chunk_shares`` reads of the stage's chunks beyond its compute (whose reads
    stage_compute_key names): each chunk's layer kinds (MoE or dense, in summing order) and whether it holds
    the loss; None with one chunk. Equal (stage_compute_key, chunk_shares_key) give equal shares: the embedding's
    share goes to the rank's first chunk, which holds it wherever the rank does (stage_compute_key's is_first)."""
    chunks = ctx.chunks[stage]
    if len(chunks) == 1:
        return None
    return tuple(zip(ctx.chunk_kinds[stage], (c.loss for c in chunks), strict=True))


def chunk_shares(ctx: Context, st: StageStep, gpu: GPUSpec) -> list[float] | None:
    """Each chunk's share of the rank's forward compute; None with one chunk."""
    chunks = ctx.chunks[st.stage]
    if len(chunks) == 1:
        return None
    kinds = ctx.chunk_kinds[st.stage]
    # ``gpu`` is the part the stage's forward was timed on (step_time's paced part; planner/spread.py)
    per_layer = {moe: layer_forward(ctx, moe, gpu)[0].total_s for moe in set().union(*kinds)}
    sums: dict = {}  # chunks of the same layer kinds take the same time
    for ks in kinds:
        if ks not in sums:
            sums[ks] = sum(per_layer[k] for k in ks)
    times = [sums[ks] for ks in kinds]
    embed = embedding_pass(ctx, gpu)[0].total_s if ctx.training and ctx.is_first(st.stage) else 0.0
    head = max(0.0, st.compute.forward.total_s - sum(times) - embed)  # the LM head and loss, where the loss is
    ends = ((head if c.loss else 0.0) + (embed if c.embedding else 0.0) for c in chunks)
    times = [t + e for t, e in zip(times, ends, strict=True)]
    total = sum(times)
    return [t / total for t in times] if total > 0 else None


def exposed_grad_reduce(ctx: Context, st: StageStep, p: StagePass, v: int, flags: Overlap) -> float:
    """The stage's gradient reduction left exposed after its last backward: all of it without
    overlap_grad_reduce; with it, what outlasts the last chunk's backward (one of v: StagePass.chunk_s), and never
    less than the last bucket, which starts only once that backward ends."""
    if not flags.overlap_grad_reduce:
        return st.grad_reduce_s
    last_bucket = st.grad_reduce_s / max(1, st.grad_buckets, _overlap_buckets(ctx, st.grad_bytes, ctx.grad_bytes))
    return max(st.grad_reduce_s - p.chunk_s(v)[1], last_bucket)


def exposed_param_gather(ctx: Context, st: StageStep, p: StagePass, v: int, flags: Overlap) -> float:
    """The stage's parameter all-gather left exposed after its optimizer step: all of it without
    overlap_param_gather; with it, what outlasts the first chunk's forward (one of v: StagePass.chunk_s), and never
    less than the first bucket, which the forward waits for."""
    if not flags.overlap_param_gather:
        return st.param_gather_s
    buckets = _overlap_buckets(ctx, st.param_bytes, ctx.param_bytes)
    first = st.param_gather_s / max(1, st.param_units, buckets)
    return max(st.param_gather_s - p.chunk_s(v)[0], first)


def _overlap_buckets(ctx: Context, total_bytes: int, elem_bytes: int) -> int:
    """Buckets the gradients fall into once overlap_grad_reduce is on: Megatron sizes them max(40M, 1M·dp)
    elements (megatron/core/distributed/distributed_data_parallel.py; with the overlap off it uses one bucket,
    as the ledger does), DDP 25 MiB (bucket_cap_mb), DeepSpeed reduce_bucket_size 5e8 elements."""
    elems = ctx.flavour.overlap_bucket_elements(ctx.par, ctx.grad_bytes)
    return -(-total_bytes // (elems * elem_bytes))


def _timeline(stages, passes, sched, pipe_end, sync, with_timeline) -> list[dict]:
    if not with_timeline:
        return []
    events, leads = _compute_blocks(passes, sched, pipe_end)
    events += _pass_comm_events(events, stages, sched)
    for st, lead in zip(stages, leads, strict=True):
        last = pipe_end - lead
        if st.grad_reduce_s:
            start = max(0.0, last + st.exposed_dp_s - st.grad_reduce_s)
            events.append(_ev(st.stage, "dp", "grad_reduce", start, start + st.grad_reduce_s))
        if st.tail_s:
            begin = last + st.exposed_dp_s
            events.append(_ev(st.stage, "dp", "embedding/loss", begin, begin + st.tail_s))
        end_opt = sync + st.compute.optimizer_s
        events.append(_ev(st.stage, "compute", "optimizer", sync, end_opt))
        if st.param_gather_s:
            # the exposed part after the optimizer step (exposed_param_gather), the rest hidden behind the next
            # iteration's first forward: in this one-step view the step's start. Drawn whole after the optimizer,
            # an overlapped gather ran past the step's end (hostile10: Llama-3 405B, ZeRO-1, overlap_param_gather,
            # the event ending 1.4 s after the step)
            exposed = min(st.param_gather_s, st.exposed_gather_s)
            events.append(_ev(st.stage, "dp", "param_gather", end_opt, end_opt + exposed))
            if st.param_gather_s > exposed:
                hidden = _ev(st.stage, "dp", "param_gather", 0.0, st.param_gather_s - exposed)
                events.append(hidden | {"overlapped": True})
    return events


def drain_leads_of(passes, sched: Schedule) -> list[float]:
    """How long before the pipeline's end each stage's last backward ends, where its gradient reduction's exposed part
    starts: for a schedule priced by its own order (ZB-H1, ZBV, DualPipe, DualPipeV; ``ScheduleTraits.orders_at``) the
    order's run, the makespan less the rank's end (pipeline_jitter.order_ends: DualPipe's ranks 0 and pp - 1 both end
    last, dualpipe13b), the sends the run leaves out added to every rank alike; else, or past its run, the closed form's
    fill and drain (pipeline.drain_leads). Each rank's end, pipe - lead, only grows with its passes (a max-plus run),
    as the search's bounds need (critical_path ``bound``)."""
    if sched.traits.orders_at(sched.stages):
        ends = order_ends(passes, sched)
        if ends is not None:
            makespan = max(ends)
            return [makespan - e for e in ends]
    return drain_leads(passes, sched)


def _compute_blocks(passes, sched: Schedule, pipe_end: float) -> tuple[list[dict], list[float]]:
    """The compute blocks and, per stage, how long before the pipeline's end its last backward ends (drain_leads_of,
    what the step prices): a schedule priced by its own order drawn from that order's run (pipeline_jitter.order_blocks:
    each rank's last block ends where the step has it; DualPipe's last rank starts direction 1 at time 0), the others
    from the closed form's warm-up, steady state and cool-down (pipeline.timeline)."""
    blocks = order_blocks(passes, sched, pipe_end) if sched.traits.orders_at(sched.stages) else None
    return (timeline(passes, sched) if blocks is None else blocks), drain_leads_of(passes, sched)


def _pass_comm_events(compute: list[dict], stages: list[StageStep], sched: Schedule) -> list[dict]:
    """What runs inside each compute block besides its kernels, on its own stream, summed over the block's
    micro-batches (one chunk of v each):

    - the exposed communication (tp, ep, cp, dp, pcie) at the block's end, one stream after another: the
      block's duration includes it, and the compute stream waits for it;
    - the communication hidden behind the block's compute (``"overlapped": true``), each stream's pieces one
      after another from the block's start, never past where the exposed part begins;
    - the recompute of a backward (stream "recompute", ``StageCompute.recompute_s``: part of the backward's
      compute, not added to it) from the block's start.

    Where inside a pass a call or the recompute runs is schematic: the step model gives each pass's amounts."""
    v = max(1, sched.chunks) * sched.traits.directions  # DualPipe's stage step holds two micro-batches' amounts
    out = []
    streams: dict[int, tuple] = {}  # per stage, its streams in drawing order (sorted once, not per block)
    for ev in compute:
        st = stages[ev["stage"]]
        redo = st.compute.recompute_s
        if not (st.exposed_by_stream or st.hidden_by_stream or redo):
            continue
        if ev["stage"] not in streams:
            streams[ev["stage"]] = (
                sorted(st.exposed_by_stream.items(), reverse=True),
                sorted(st.hidden_by_stream.items(), reverse=True),
            )
        exposed, hidden = streams[ev["stage"]]
        n = ev["microbatches"]
        phases = ("forward", "backward") if ev["name"] == "1f1b" else (ev["name"],)
        end = ev["end_s"]
        for (stream, phase), per_mb in exposed:
            if phase not in phases:
                continue
            dur = per_mb * n / v
            out.append({**ev, "stream": stream, "name": f"{stream} {phase}", "start_s": end - dur, "end_s": end})
            end -= dur
        begin = ev["start_s"]  # the block's compute runs from here to ``end``
        if redo and "backward" in phases:
            out.append({**ev, "stream": "recompute", "name": "recompute", "end_s": min(end, begin + redo * n / v)})
        cursor: dict[str, float] = {}
        for (stream, phase), per_mb in hidden:
            if phase not in phases:
                continue
            at = cursor.get(stream, begin)
            stop = cursor[stream] = min(end, at + per_mb * n / v)
            if stop > at:
                name = f"{stream} {phase}"
                out.append({**ev, "stream": stream, "name": name, "overlapped": True, "start_s": at, "end_s": stop})
    return out


def _ev(stage: int, stream: str, name: str, start: float, end: float) -> dict:
    return {
        "stage": stage,
        "stream": stream,
        "name": name,
        "microbatch": -1,
        "microbatches": 0,
        "start_s": start,
        "end_s": end,
    }


def _inference(ctx: Context, stages: list[StageStep], sched: Schedule, gpu: GPUSpec, with_timeline: bool) -> StepTime:
    """One prefill pass or one decode step: the batch flows through the stages once."""
    p2p = sched.p2p_s
    t, events = 0.0, []
    for st in stages:
        if st.stage:
            t += p2p
        if with_timeline:
            events.append(
                {
                    "stage": st.stage,
                    "stream": "compute",
                    "name": "forward",
                    "microbatch": 0,
                    "microbatches": 1,
                    "start_s": t,
                    "end_s": t + st.forward_s,
                }
            )
        t += st.forward_s
    compute = sum(st.compute.forward.total_s for st in stages)
    exposed = t - compute
    w = ctx.work
    tokens = w.batch_size if w.phase == "decode" else w.batch_size * (w.context_length or ctx.model.seq_length)
    crit = max(range(len(stages)), key=lambda s: stages[s].forward_s)
    spread = sum(st.spread[0] for st in stages)
    return StepTime(t, compute, exposed, 0.0, _mfu(ctx, tokens, t, gpu), tokens / t, crit, stages, events, [], spread)


def _mfu(ctx: Context, tokens: float, time_s: float, gpu: GPUSpec) -> float:
    """Model FLOPs (compute.model_flops_per_token: 6N + 12·L·H·Q·T, PaLM / Llama 3) over the cluster's dense
    peak in the compute dtype (bf16; fp8 with fp8 activations)."""
    peak = gpu.peak(compute_dtype(ctx))
    return model_flops_per_token(ctx) * tokens / (time_s * ctx.par.world_size * peak)


__all__ = [
    "CriticalPath",
    "Overlap",
    "StageStep",
    "StepTime",
    "StreamTotals",
    "assign_streams",
    "chunk_shares",
    "chunk_shares_key",
    "critical_path",
    "exposed_grad_reduce",
    "exposed_param_gather",
    "memory",
    "paired_passes",
    "schedule_for",
    "schedule_of",
    "step_time",
    "stream_totals",
    "unbatched_wait",
]
