"""Pipeline schedules in closed form: GPipe, 1F1B (PipeDream-Flush), interleaved 1F1B (chunks of their real
sizes), zero-bubble ZB-H1 and ZBV, DualPipe and DualPipeV, per stage (``bubble_s`` gives each its bubble and
source; ``in_flight`` / ``in_flight_chunks`` its activations in flight).

Every stage s runs, per micro-batch, a forward of f_s and a backward of b_s seconds (compute plus the
communication that cannot overlap inside the pass); a boundary send costs c seconds. With m micro-batches,
p stages and v model chunks per stage (Narayanan et al. SC'21 §2.2):

    T = m·t_max + (Σ_s t_s - t_max)/v + 2·(p-1)·c      t_s = f_s + b_s, t_max = max_s t_s

(with even chunks; ``bubble_s`` replaces the middle term by each rank's own fill and drain, or by the
zero-bubble and DualPipe forms)

which is (m + p - 1)·t for equal stages without interleaving (bubble (p-1)/m) and m·t + (p-1)·t/v with v
chunks (bubble (p-1)/(v·m)), and lets the slowest stage set the steady-state pace. GPipe runs the same
critical path as 1F1B (all forwards, then all backwards); it only holds more activations. Without
``overlap_p2p`` (Megatron overlaps p2p only in the interleaved schedule: --overlap-p2p-communication,
megatron/training/arguments.py) each steady-state micro-batch also waits for its boundary transfers
(``steady_wait``): 1F1B's two one-way exchanges, or, where the framework's interleaved schedule exchanges both
ways at once once per chunk (``Schedule.two_way_s``), v of those.

A real schedule of 10^5 micro-batch events is never built: ``timeline`` lays the same closed form out as
blocks per stage, one per micro-batch for the warm-up and cool-down when they are few, and one aggregated
block each for the warm-up, the steady state and the cool-down when 2·m·v·p exceeds MAX_EVENTS
(``microbatch`` is the first micro-batch of a block, ``microbatches`` how many it holds).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ._errors import SpecError

MAX_EVENTS = 256  # compute blocks in all; beyond, each stage's warm-up, steady state and cool-down are one block each


@dataclass(frozen=True)
class StagePass:
    """One micro-batch on one rank of a stage, seconds: forward and backward (whole stage, all chunks).

    ``fill_s`` / ``drain_s``: the forward of the rank's first chunk and the backward of its last one, what the
    pipeline's fill and drain wait for (None: an even share, forward_s / v and backward_s / v);
    ``weight_s``: the weight-gradient part W of ``backward_s`` the zero-bubble schedules defer."""

    forward_s: float
    backward_s: float
    fill_s: float | None = None
    drain_s: float | None = None
    weight_s: float = 0.0

    @property
    def total_s(self) -> float:
        return self.forward_s + self.backward_s

    def ends(self, v: int) -> tuple[float, float]:
        """(fill, drain): what this rank adds to the fill and to the drain of the 1F1B family."""
        fill = self.forward_s / v if self.fill_s is None else self.fill_s
        drain = self.backward_s / v if self.drain_s is None else self.drain_s
        return fill, drain


@dataclass(frozen=True)
class Schedule:
    kind: str  # a SCHEDULE_TRAITS name: 1f1b | interleaved | gpipe | zb-h1 | zbv | dualpipe | dualpipev
    stages: int  # p
    microbatches: int  # m
    chunks: int = 1  # v: model chunks per stage (interleaved)
    p2p_s: float = 0.0  # one boundary send, seconds
    overlap_p2p: bool = False
    # one steady-state exchange that sends both ways at once, seconds: Megatron's interleaved schedule without
    # overlap_p2p runs one send_forward_backward_recv_forward_backward per chunk forward + backward (schedules.py
    # at 6985e58 and d98e8a6; step.py two_way_s); 0: two one-way exchanges a micro-batch (1F1B's pairs)
    two_way_s: float = 0.0
    # what one steady-state micro-batch waits on its transfers when each is a blocking instruction of its own
    # (DeepSpeed's TrainSchedule: four one-way transfers and the TP gathers after them; step.py unbatched_wait);
    # 0: the exchanges above
    unbatched_s: float = 0.0

    @property
    def traits(self) -> ScheduleTraits:
        return schedule_traits(self.kind)


@dataclass(frozen=True)
class PipelineTime:
    time_s: float  # start of the first forward to the end of the last backward
    busy_s: tuple[float, ...]  # per stage: m·(f_s + b_s)
    bubble_s: tuple[float, ...]  # per stage: time_s - busy_s (idle or waiting on a boundary)


def pipeline_time(passes: Sequence[StagePass], sched: Schedule) -> PipelineTime:
    """Closed-form critical path of the schedule (module docstring)."""
    m, p = sched.microbatches, sched.stages
    totals = [x.total_s for x in passes]
    t_max = max(totals)
    fill = 2 * (p - 1) * sched.p2p_s
    time = m * (t_max + steady_wait(sched)) + bubble_s(passes, sched) + fill
    busy = tuple(m * t for t in totals)
    return PipelineTime(time, busy, tuple(time - b for b in busy))


def busiest_rank_s(passes: Sequence[StagePass], sched: Schedule) -> float:
    """m times the slowest rank's pass: what ``pipeline_time`` is never below (it adds the bubble, the sends and
    the steady-state waits, each >= 0, to this product, so in floating point too). The layout search prunes on
    it before it computes the bubble."""
    return sched.microbatches * max(x.total_s for x in passes)


def steady_wait(sched: Schedule) -> float:
    """What each steady-state micro-batch waits on its boundary exchanges when they are not overlapped, seconds:
    1F1B's send_forward_recv_backward and send_backward_recv_forward, two one-way crossings (2·p2p_s; Megatron
    schedules.py forward_backward_pipelining_without_interleaving); a schedule that exchanges both ways at once
    once per chunk forward + backward (``two_way_s``, Megatron's interleaved: forward_backward_pipelining_with_
    interleaving's steady state, one send_forward_backward_recv_forward_backward per k) v of those; a schedule
    whose every transfer blocks on its own (``unbatched_s``: DeepSpeed's TrainSchedule, per chunk forward +
    backward) v of that wait."""
    if sched.overlap_p2p or sched.stages == 1:
        return 0.0
    if sched.unbatched_s:
        return max(1, sched.chunks) * sched.unbatched_s
    if sched.two_way_s:
        return max(1, sched.chunks) * sched.two_way_s
    return 2 * sched.p2p_s


def bubble_s(passes: Sequence[StagePass], sched: Schedule) -> float:
    """The fill and drain beyond m times the slowest rank, each rank r but the slowest adding its share:

    - gpipe, 1f1b, interleaved: its first chunk's forward and last chunk's backward (Narayanan et al. SC'21
      §2.2: (p-1)(F+B) for 1F1B, /v interleaved; chunks of their real sizes in an uneven layout);
    - zb-h1: F + B - 2W (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", ICLR 2024, §3.1; the DualPipe
      README's table: ZB1P (PP-1)(F+B-2W), B the full backward);
    - dualpipe: (PP/2-1)/(PP-1) of (F&B + B - 3W) (DualPipe README table; F&B, the overlapped forward and
      backward, is the rank's steady-state pass, its EP all-to-all hidden by step.py);
    - dualpipev, V-shaped with half-size chunks: (F&B + B - 3W)/2 per rank, DualPipe's bubble on 2·pp
      half-size stages (DualPipeV is DualPipe "cut in half"); zbv likewise (F + B - 3W)/2, our reading of
      Qi et al.'s V schedule (not a published closed form): zero when T_F = T_B = T_W as the sail-sg README
      table states, growing with the imbalance as ZB-H1's does.
    """
    traits = sched.traits
    if sched.stages == 1:
        return 0.0
    crit = max(range(len(passes)), key=lambda r: passes[r].total_s)
    others = [x for r, x in enumerate(passes) if r != crit]
    return traits.bubble(others, sched)


def warmup_microbatches(sched: Schedule, stage: int) -> int:
    """Forwards before the first backward on ``stage``: p - s - 1 (1F1B, ZB-H1); Megatron's interleaved
    schedule runs (p - s - 1)·2 + (v - 1)·p chunk forwards (schedules.py get_pp_rank_microbatches); the V
    schedules 2(p - s) - 1 chunk forwards, down the V and back up to the rank; GPipe all m."""
    return sched.traits.warmup(sched, stage)


def in_flight(sched: Schedule, stage: int) -> float:
    """Micro-batches whose activations one rank of ``stage`` holds at its peak, in units of a whole stage's
    layers: 1F1B min(p - s, m) (stage 0 holds p); interleaved (warm-up + 1) chunks of 1/v of the stage each,
    so stage 0 holds p·(1 + (p - 1)/(p·v)) (Korthikanti et al. 2022 §4.2.3, Megatron
    theoretical_memory_usage.py interleaved_schedule_memory_penalty); GPipe all m. ZB-H1 holds what 1F1B
    holds (Qi et al. 2024 §3.1); ZBV p on every rank (the V balances it; "1x" of 1F1B in the sail-sg
    README table); DualPipe PP + 1 of its stages (DualPipe README table); DualPipeV, DualPipe on 2·pp
    half-size stages, 2·pp + 1 half-stages."""
    return sched.traits.in_flight(sched, stage)


def in_flight_chunks(sched: Schedule, stage: int) -> tuple[float, ...]:
    """Per chunk of ``stage`` (its order on the rank), how many micro-batches of it one rank holds at its
    peak: ``in_flight`` resolved by chunk, so that chunks of different sizes (an embedding-only or a
    loss-only chunk, first/last stages of other sizes) count what they hold. Interleaved: the first
    warm-up + 1 chunk forwards, forward k running chunk (k // p) % v (Megatron schedules.py
    get_model_chunk_id with microbatch_group_size_per_vp_stage = p); the other schedules hold their
    chunks alike."""
    v, p = max(1, sched.chunks), sched.stages
    if not sched.traits.chunk_order:
        return (in_flight(sched, stage),) * v
    counts = [0] * v
    for k in range(min(warmup_microbatches(sched, stage) + 1, sched.microbatches * v)):
        counts[(k // p) % v] += 1
    return tuple(float(c) for c in counts)


def losses_in_flight(sched: Schedule) -> int:
    """Micro-batches whose loss the loss's rank holds at its peak: the logits (the fp32 softmax the vocab-parallel
    cross-entropy saves), the output layer's input and the MTP heads' (memory._logits). One where each loss's
    backward follows its forward before the next loss forward: 1F1B and ZB-H1 (the last stage runs no warm-up
    forward, ``p - s - 1 = 0``; Megatron schedules.py forward_backward_pipelining_without_interleaving), the
    interleaved schedule (the last rank's warm-up forwards run chunks 0..v-2 only, its first loss-chunk forward
    k = (v-1)p is followed by that micro-batch's backward: get_model_chunk_id), DualPipe(V) (dualpipe.py step():
    each loss-phase ``_forward_chunk(1)`` comes after the previous one's ``_backward_chunk(1)``, steps 2-5) and
    ZBV (the V's end, rank 0's second chunk, runs B right after F: our reading of Qi et al. 2024 §4). All m under
    a forwards-first schedule: torch.distributed.pipelining schedules.py ScheduleGPipe._step_microbatches
    computes each forward's loss (``_maybe_compute_loss``) and keeps its graph until the backward loop."""
    return sched.microbatches if sched.traits.forwards_first else 1


# Each schedule's facts, as functions of the schedule (p stages, m micro-batches, v chunks) the table below reads:
# its fill and drain beyond m times the slowest rank (``bubble_s``), its warm-up forwards, the micro-batches one
# rank holds at its peak. The sources are those of bubble_s, warmup_microbatches and in_flight.


def _bubble_1f1b(others: Sequence[StagePass], sched: Schedule) -> float:
    """Each other rank's first chunk's forward and last chunk's backward (Narayanan et al. SC'21 §2.2)."""
    v = max(1, sched.chunks)
    return sum(sum(x.ends(v)) for x in others)


def _bubble_zb_h1(others: Sequence[StagePass], sched: Schedule) -> float:
    """F + B - 2W per rank (Qi et al. 2024 §3.1; DualPipe README table: ZB1P (PP-1)(F+B-2W))."""
    return sum(max(0.0, x.total_s - 2 * x.weight_s) for x in others)


def _bubble_zbv(others: Sequence[StagePass], sched: Schedule) -> float:
    """(F + B - 3W)/2 per rank: our reading of Qi et al.'s V schedule (not a published closed form)."""
    return sum(max(0.0, x.total_s - 3 * x.weight_s) for x in others) / 2


def _bubble_dualpipe(others: Sequence[StagePass], sched: Schedule) -> float:
    """(PP/2-1)/(PP-1) of (F&B + B - 3W) per rank (DualPipe README table)."""
    p = sched.stages
    share = (p / 2 - 1) / (p - 1)
    return share * sum(max(0.0, x.total_s + x.backward_s - 3 * x.weight_s) for x in others)


def _bubble_dualpipev(others: Sequence[StagePass], sched: Schedule) -> float:
    """(F&B + B - 3W)/2 per rank: DualPipe's bubble on 2·pp half-size stages (DualPipeV, DualPipe cut in half)."""
    return sum(max(0.0, x.total_s + x.backward_s - 3 * x.weight_s) for x in others) / 2


def _warmup_all(sched: Schedule, stage: int) -> int:
    """GPipe: all m forwards before the first backward."""
    return sched.microbatches


def _warmup_1f1b(sched: Schedule, stage: int) -> int:
    """1F1B, ZB-H1: p - s - 1."""
    return min(sched.stages - stage - 1, sched.microbatches)


def _warmup_interleaved(sched: Schedule, stage: int) -> int:
    """Megatron's interleaved schedule: (p - s - 1)·2 + (v - 1)·p chunk forwards (schedules.py
    get_pp_rank_microbatches)."""
    p, m, v = sched.stages, sched.microbatches, max(1, sched.chunks)
    return min((p - stage - 1) * 2 + (v - 1) * p, m * v)


def _warmup_v(sched: Schedule, stage: int) -> int:
    """The V schedules: 2(p - s) - 1 chunk forwards, down the V and back up to the rank."""
    p, m, v = sched.stages, sched.microbatches, max(1, sched.chunks)
    return min(2 * (p - stage) - 1, m * v)


def _held_warmup(sched: Schedule, stage: int) -> int:
    """1F1B min(p - s, m), stage 0 p; GPipe all m; ZB-H1 what 1F1B holds (Qi et al. 2024 §3.1)."""
    return min(warmup_microbatches(sched, stage) + 1, sched.microbatches)


def _held_interleaved(sched: Schedule, stage: int) -> float:
    """(warm-up + 1) chunks of 1/v of the stage each (Korthikanti et al. 2022 §4.2.3, Megatron
    theoretical_memory_usage.py interleaved_schedule_memory_penalty)."""
    v, m = max(1, sched.chunks), sched.microbatches
    return min(warmup_microbatches(sched, stage) + 1, m * v) / v


def _held_zbv(sched: Schedule, stage: int) -> int:
    """p on every rank: the V balances it ("1x" of 1F1B in the sail-sg README table)."""
    return min(sched.stages, sched.microbatches)


def _held_dualpipe(sched: Schedule, stage: int) -> int:
    """PP + 1 of its stages (DualPipe README table)."""
    return min(sched.stages + 1, sched.microbatches)


def _held_dualpipev(sched: Schedule, stage: int) -> float:
    """DualPipe on 2·pp half-size stages: 2·pp + 1 half-stages."""
    return min(2 * sched.stages + 1, 2 * sched.microbatches) / 2


# Where the zero-bubble and DualPipe schedules' p2p calls come from (the ledger's source for them; 1F1B,
# interleaved and GPipe name the framework's own schedule file)
ZB_DUALPIPE_SOURCE = (
    "planner/pipeline.py (ZB: Qi et al. 2024; DualPipe: DeepSeek-V3 §3.2.1, deepseek-ai/DualPipe dualpipe.py)"
)


def _m_divisible_by_pp(name: str, m: int, p: int) -> str:
    """The interleaved schedule takes the micro-batches in groups of pp."""
    if m % p == 0:
        return ""
    return f"the interleaved schedule needs the number of micro-batches ({m}) to be a multiple of pp ({p})"


def _m_even_twice_pp(name: str, m: int, p: int) -> str:
    """DualPipe(V) splits the micro-batches between its two directions (dualpipe.py)."""
    if m % 2 or m < 2 * p:
        return (
            f"{name} needs an even number of micro-batches >= 2*pp = {2 * p} "
            f"(dualpipe.py: num_chunks % 2 == 0 and num_chunks >= num_ranks * 2), got {m}"
        )
    return ""


def _any_m(name: str, m: int, p: int) -> str:
    return ""


def _order_megatron(sched: Schedule, stage: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Megatron's 1F1B and interleaved 1F1B on one rank (Megatron-LM d98e8a6 pipeline_parallel/schedules.py
    forward_backward_pipelining_with(out)_interleaving): the w warm-up chunk forwards (``warmup_microbatches``),
    then one forward one backward, then the cool-down backwards, so chunk forward k runs at position k (k < w) or
    2k - w, chunk backward k at w + 2k + 1 (k < n - w) or n + k, n = m·v; chunk forward k runs micro-batch
    (k // pv)·p + k % p on chunk (k // p) % v, chunk backward k the same micro-batch on chunk v - 1 - (k // p) % v
    (get_model_chunk_id, microbatch_group_size_per_vp_stage = p); v 1 is the plain 1F1B. Returns, in run order,
    (backward?, micro-batch, chunk) arrays."""
    p, v = sched.stages, max(1, sched.chunks)
    n = sched.microbatches * v
    w = warmup_microbatches(sched, stage)
    k = np.arange(n)
    backward = np.zeros(2 * n, dtype=bool)
    at = np.concatenate([np.where(k < w, k, 2 * k - w), np.where(k < n - w, w + 2 * k + 1, n + k)])
    backward[at[n:]] = True
    group, r = np.divmod(k, p * v)
    mb, chunk = np.empty(2 * n, dtype=np.intp), np.empty(2 * n, dtype=np.intp)
    mb[at[:n]] = mb[at[n:]] = group * p + r % p
    chunk[at[:n]], chunk[at[n:]] = r // p, v - 1 - r // p
    return backward, mb, chunk


@dataclass(frozen=True)
class ScheduleTraits:
    """One pipeline schedule's facts, read by ``bubble_s``, ``warmup_microbatches``, ``in_flight`` and
    ``in_flight_chunks`` here, by the validation and layout of planner/parallel.py, the step's overlap defaults
    (planner/step.py) and the p2p and FSDP ledger rules (planner/rules/pipeline.py, data.py): a new schedule
    is one ``register`` call, never a comparison of its name."""

    name: str
    # the fill and drain beyond m times the slowest rank, of the other ranks' passes (p > 1)
    bubble: Callable[[Sequence[StagePass], Schedule], float]
    warmup: Callable[[Schedule, int], int]  # forwards (chunk forwards) before a stage's first backward
    in_flight: Callable[[Schedule, int], float]  # micro-batches a rank holds at its peak, in whole stages
    # True: a rank's chunks hold different counts, forward k running chunk (k // p) % v (Megatron schedules.py
    # get_model_chunk_id); False: every chunk holds ``in_flight``
    chunk_order: bool = False
    # True: virtual_pipeline_stages >= 2 chunks per rank, interleaved (virtual stage k on rank k % pp), which
    # needs pp >= 2 and v >= 2; False: one chunk per rank unless ``v_shape``
    interleaved: bool = False
    # True: exactly 2 chunks per rank folded in a V (virtual stage k on rank k, then 2·pp - 1 - k): ZBV, DualPipeV,
    # and DualPipe's two directions
    v_shape: bool = False
    min_pp: int = 1  # the pipeline ranks it needs
    even_pp: str = ""  # where an even pp is required (the check's source), "" when any pp does
    title: str = ""  # its name in messages; "" is ``name``
    # the micro-batch count's rule: (name, m, pp) -> the 422's message, "" when m is fine
    microbatch_rule: Callable[[str, int, int], str] = _any_m
    # True: each forward runs beside another micro-batch's backward, hiding MoE's all-to-all behind the
    # other's compute (DeepSeek-V3 report §3.2.1, Figure 4): the default of overlap_moe_expert_parallel_comm
    overlaps_ep: bool = False
    # the micro-batches split over this many directions, each crossing a rank boundary once (DualPipe: 2,
    # dualpipe.py num_chunks // 2)
    directions: int = 1
    # True: a stage runs all its forwards, then all its backwards (GPipe; torch ScheduleGPipe._step_microbatches)
    forwards_first: bool = False
    # copies of the parameters a rank trains, each with its gradients; the optimizer steps them as one (DualPipe:
    # 2, one per direction, DualPipe README table "Parameter 2x", DeepSeek-V3 report §3.2.1; DualPipeV: 1)
    param_copies: int = 1
    source: str = ""  # its p2p calls' source; "" is the framework's schedule file (Flavour.pp_source)
    # True: the layout search tries it when the constraints name no schedule (planner/search/space.py); the
    # others only when listed
    searched: bool = False
    # one rank's operations in the order it runs them, (backward?, micro-batch, chunk) arrays, which
    # planner/pipeline_jitter.py runs as a list schedule over per-micro-batch times; None: not written out here
    # (GPipe: the flow shop is its exact form; the zero-bubble and DualPipe orders split the backward or run two
    # directions: planner/documents.py keeps the flow shop for them)
    order: Callable[[Schedule, int], tuple[np.ndarray, np.ndarray, np.ndarray]] | None = None

    @property
    def label(self) -> str:
        return self.title or self.name

    def runs_chunks(self, v: int) -> bool:
        """Whether it runs ``v`` model chunks per rank: interleaved any v >= 2, a V exactly 2, the others 1."""
        return v >= 2 if self.interleaved else v == (2 if self.v_shape else 1)


SCHEDULE_TRAITS: dict[str, ScheduleTraits] = {}


def register(traits: ScheduleTraits) -> ScheduleTraits:
    SCHEDULE_TRAITS[traits.name] = traits
    return traits


def schedule_traits(kind: str) -> ScheduleTraits:
    traits = SCHEDULE_TRAITS.get(kind)
    if traits is None:
        known = ", ".join(SCHEDULE_TRAITS)
        raise SpecError("parallel.pipeline_schedule", f"unknown pipeline schedule {kind!r}; known: {known}")
    return traits


# parallel.py's SCHEDULES are these names, in this order
register(ScheduleTraits("1f1b", _bubble_1f1b, _warmup_1f1b, _held_warmup, searched=True, order=_order_megatron))
register(
    ScheduleTraits(
        "interleaved",
        _bubble_1f1b,
        _warmup_interleaved,
        _held_interleaved,
        chunk_order=True,
        interleaved=True,
        microbatch_rule=_m_divisible_by_pp,
        searched=True,
        order=_order_megatron,
    )
)
# GPipe runs 1F1B's critical path (all forwards, then all backwards) and holds all m micro-batches
register(ScheduleTraits("gpipe", _bubble_1f1b, _warmup_all, _held_warmup, forwards_first=True))
_ZB = {"min_pp": 2, "source": ZB_DUALPIPE_SOURCE}
_DUALPIPE = {**_ZB, "v_shape": True, "microbatch_rule": _m_even_twice_pp, "overlaps_ep": True}
register(ScheduleTraits("zb-h1", _bubble_zb_h1, _warmup_1f1b, _held_warmup, **_ZB))
register(ScheduleTraits("zbv", _bubble_zbv, _warmup_v, _held_zbv, **_ZB, v_shape=True))
register(
    ScheduleTraits(
        "dualpipe",
        _bubble_dualpipe,
        _warmup_v,
        _held_dualpipe,
        **_DUALPIPE,
        even_pp="dualpipe.py: assert num_ranks % 2 == 0",
        title="DualPipe",
        directions=2,
        param_copies=2,
    )
)
register(ScheduleTraits("dualpipev", _bubble_dualpipev, _warmup_v, _held_dualpipev, **_DUALPIPE))


def timeline(passes: Sequence[StagePass], sched: Schedule, start_s: float = 0.0) -> list[dict]:
    """Compute-stream blocks per stage consistent with ``pipeline_time``: warm-up forwards, the steady
    state (one forward + one backward per micro-batch at the slowest stage's pace), cool-down backwards.
    Each block: {stage, stream, name, microbatch (first), microbatches (count), start_s, end_s}."""
    total = pipeline_time(passes, sched).time_s
    p, m, v = sched.stages, sched.microbatches, max(1, sched.chunks)
    period = max(x.total_s for x in passes) + steady_wait(sched)
    events: list[dict] = []
    each = 2 * m * v * p <= MAX_EVENTS
    for s, (x, lead, tail) in enumerate(zip(passes, *_offsets(passes, sched, total), strict=True)):
        f, b = x.forward_s / v, x.backward_s / v  # one chunk
        warm = warmup_microbatches(sched, s)
        steady = m * v - warm
        t = start_s + lead
        t = _blocks(events, s, "forward", 0, warm, f, t, each)
        if steady:
            per = period / v
            if each:
                for i in range(steady):
                    events.append(_event(s, "forward", warm + i, 1, t + i * per, t + i * per + f))
                    events.append(_event(s, "backward", i, 1, t + i * per + f, t + i * per + f + b))
            else:
                events.append(_event(s, "1f1b", warm, steady, t, t + steady * per))
        end = start_s + total - tail
        _blocks(events, s, "backward", steady, warm, b, end - warm * b, each)
    return events


def drain_leads(passes: Sequence[StagePass], sched: Schedule) -> list[float]:
    """How long before the end of the pipeline each stage finishes its last backward."""
    return _offsets(passes, sched, pipeline_time(passes, sched).time_s)[1]


def _offsets(passes: Sequence[StagePass], sched: Schedule, total: float) -> tuple[list[float], list[float]]:
    """Per stage, when its first forward starts and how long before the end its last backward ends: the
    fill and drain of the stages above it (chunks of their real sizes, plus a send each), shrunk where a
    schedule's smaller bubble (zero-bubble, DualPipe) leaves the stage less idle time than that."""
    m, v = sched.microbatches, max(1, sched.chunks)
    period = max(x.total_s for x in passes) + steady_wait(sched)
    leads, tails, lead, tail = [], [], 0.0, 0.0
    for x in passes:
        leads.append(lead)
        tails.append(tail)
        fill, drain = x.ends(v)
        lead += fill + sched.p2p_s
        tail += drain + sched.p2p_s
    for s, x in enumerate(passes):
        warm = warmup_microbatches(sched, s)
        room = max(0.0, total - (m * v - warm) * period / v - warm * x.total_s / v)
        idle = leads[s] + tails[s]
        if idle > room:
            leads[s], tails[s] = leads[s] * room / idle, tails[s] * room / idle
    return leads, tails


def _blocks(events: list, stage: int, name: str, first: int, count: int, dur: float, t: float, each: bool) -> float:
    if count <= 0:
        return t
    if each:
        for i in range(count):
            events.append(_event(stage, name, first + i, 1, t + i * dur, t + (i + 1) * dur))
    else:
        events.append(_event(stage, name, first, count, t, t + count * dur))
    return t + count * dur


def _event(stage: int, name: str, mb: int, count: int, start: float, end: float) -> dict:
    return {
        "stage": stage,
        "stream": "compute",
        "name": name,
        "microbatch": mb,
        "microbatches": count,
        "start_s": start,
        "end_s": end,
    }


__all__ = [
    "SCHEDULE_TRAITS",
    "ZB_DUALPIPE_SOURCE",
    "PipelineTime",
    "Schedule",
    "ScheduleTraits",
    "StagePass",
    "bubble_s",
    "busiest_rank_s",
    "drain_leads",
    "in_flight",
    "in_flight_chunks",
    "losses_in_flight",
    "pipeline_time",
    "register",
    "schedule_traits",
    "steady_wait",
    "timeline",
    "warmup_microbatches",
]
