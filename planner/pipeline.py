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

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from ._errors import SpecError

MAX_EVENTS = 256  # compute blocks in all; beyond, each stage's warm-up, steady state and cool-down are one block each


@dataclass(frozen=True)
class StagePass:
    """One micro-batch on one rank of a stage, seconds: forward and backward (whole stage, all chunks).

    ``fill_s`` / ``drain_s``: the forward of the rank's first chunk and the backward of its last one, what the
    pipeline's fill and drain wait for (None: an even share of the pass, ``chunk_s``);
    ``weight_s``: the weight-gradient part W of ``backward_s`` the zero-bubble schedules defer;
    ``copies``: the micro-batches one pass over the rank's chunks carries (``StageMap.copies``: DualPipe's 2, one
    each way, each micro-batch running one of its two stages; ``of_pass`` builds it), so forward_s and backward_s
    are a micro-batch's mean and ``pass_forward_s`` / ``pass_backward_s`` the pass over all the chunks."""

    forward_s: float
    backward_s: float
    fill_s: float | None = None
    drain_s: float | None = None
    weight_s: float = 0.0
    copies: int = 1

    @classmethod
    def of_pass(
        cls, forward_s: float, backward_s: float, fill_s: float | None, drain_s: float | None, weight_s: float,
        copies: int,
    ) -> StagePass:  # fmt: skip
        """From a rank's pass over all its chunks (a stage step: ``copies`` micro-batches, one each way): the
        per-micro-batch pass the schedule runs, the fill and drain kept at their chunks' whole sizes."""
        return cls(forward_s / copies, backward_s / copies, fill_s, drain_s, weight_s / copies, copies)

    @property
    def total_s(self) -> float:
        return self.forward_s + self.backward_s

    @property
    def pass_forward_s(self) -> float:
        """The forward of a pass over all the rank's chunks (``copies`` micro-batches' worth)."""
        return self.copies * self.forward_s

    @property
    def pass_backward_s(self) -> float:
        """The backward of a pass over all the rank's chunks."""
        return self.copies * self.backward_s

    def chunk_s(self, v: int) -> tuple[float, float]:
        """(forward, backward) of one of the rank's ``v`` chunks at an even share of the pass over them (DualPipe's
        chunk: a whole stage, twice the per-micro-batch mean over its two)."""
        return self.pass_forward_s / v, self.pass_backward_s / v

    def ends(self, v: int) -> tuple[float, float]:
        """(fill, drain): what this rank adds to the fill and to the drain of the 1F1B family: ``fill_s`` /
        ``drain_s``, or a chunk's even share (``chunk_s``)."""
        even = self.chunk_s(v)
        fill = even[0] if self.fill_s is None else self.fill_s
        drain = even[1] if self.drain_s is None else self.drain_s
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

    @property
    def passes(self) -> int:
        """A rank's passes over all its chunks in the step (``ScheduleTraits.passes``)."""
        return self.traits.passes(self.microbatches)


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


def own_passes(passes: Sequence[StagePass], sched: Schedule) -> Sequence[StagePass]:
    """The passes as ``sched`` runs them: each carrying the micro-batches its stage map's pass does
    (``StageMap.copies``; step.stage_passes builds them so with ``StagePass.of_pass``); a bare pass (copies 1) under
    DualPipe takes its 2, each chunk a whole stage, as the schedule runs it."""
    want = sched.traits.stage_map.copies
    if all(x.copies == want for x in passes):
        return passes
    return [replace(x, copies=want) for x in passes]


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


def pass_wait(sched: Schedule) -> float:
    """What each of a rank's passes over its chunks waits on its boundary exchanges: ``steady_wait`` for each
    micro-batch the pass carries (``StageMap.copies``: DualPipe's one each way)."""
    return sched.traits.stage_map.copies * steady_wait(sched)


def bubble_s(passes: Sequence[StagePass], sched: Schedule) -> float:
    """The fill and drain beyond m times the slowest rank, each rank r but the slowest adding its share:

    - gpipe, 1f1b, interleaved: its first chunk's forward and last chunk's backward (Narayanan et al. SC'21
      §2.2: (p-1)(F+B) for 1F1B, /v interleaved; chunks of their real sizes in an uneven layout);
    - zb-h1: max(F, B - W, F + B - 2W) (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", ICLR 2024, §3.1; the
      DualPipe README's table: ZB1P (PP-1)(F+B-2W), B the full backward; F and B - W where its order's chains are
      longer, and min(W, B - W) for each micro-batch short of p: ``_bubble_zb_h1``, bubble11);
    - zbv, dualpipe, dualpipev: the longest of a few chains their own orders run (torch's ScheduleZBVZeroBubble,
      deepseek-ai/DualPipe 3da1bbe step()), each rank's share summed (``_bubble_zbv``, ``_bubble_dualpipev``,
      ``_bubble_dualpipe``; bubble11): with equal ranks the list schedule's makespan to 1e-9 (W <= F <= B - W, every
      m; W <= F <= B at m >= 2p - 1), which the DualPipe README's (PP/2-1)(F&B + B - 3W) and (PP-1)(F&B + B - 3W)/2
      equal only at equal thirds.

    Where these four schedules' ranks or chunks differ, or their passes leave the forms' exact range (``by_order``),
    the order itself runs as a list schedule at each (rank, chunk, op)'s time (planner/pipeline_jitter.py
    ``order_span``; vsched12): the makespan beyond m times the slowest rank. The forms below price unequal ranks only
    where its runs are over pipeline_jitter.ORDER_OPS (a V beyond pp 48, ZB-H1 and DualPipe beyond pp 64, at m past
    one run; ``order_method`` says which).
    """
    traits = sched.traits
    if sched.stages == 1:
        return 0.0
    passes = own_passes(passes, sched)
    ordered = _order_bubble(passes, sched)
    if ordered is not None:
        return ordered
    crit = max(range(len(passes)), key=lambda r: passes[r].total_s)
    others = [x for r, x in enumerate(passes) if r != crit]
    return traits.bubble(others, sched)


def by_order(passes: Sequence[StagePass], sched: Schedule) -> bool:
    """Whether ``bubble_s`` runs ``sched``'s order rather than its closed form (vsched12, review r11a #3): a schedule
    priced by its order (``ScheduleTraits.order_priced``) whose ranks, or a rank's chunks, differ, or whose equal
    passes leave W <= F <= B - W, the range every form is exact in at every m (bubble11: ZBV's within 0.25·p passes
    outside it, DualPipe(V)'s a lower bound at F > B). The forms sum each other rank's share of a chain and take the
    chunks as halves: with DeepSeek-V3's rank 0 (its second chunk the head, loss and MTP, 0.70 of its forward)
    DualPipeV came out 7.6% over its own order and ranked behind ZBV (review r11a #3). DualPipe's two chunks are
    the stages its two directions run (``StageMap`` MIRRORED), even when each is the rank's mean pass."""
    if not sched.traits.orders_at(sched.stages):
        return False
    passes = own_passes(passes, sched)
    first = passes[0]
    if not first.weight_s <= first.forward_s <= first.backward_s - first.weight_s:
        return True
    v = max(1, sched.chunks)
    halves = v > 1  # a V or DualPipe's two stages: each rank's two chunks at their own sizes

    def parts(x: StagePass) -> tuple[float, ...]:
        return (x.forward_s, x.backward_s, x.weight_s, *(x.ends(v) if halves else ()))

    even = first.chunk_s(v)
    want = (*parts(first)[:3], *(even if halves else ()))
    close = math.isclose
    return not all(all(close(a, b, rel_tol=1e-12) for a, b in zip(parts(x), want, strict=True)) for x in passes)


def _order_bubble(passes: Sequence[StagePass], sched: Schedule) -> float | None:
    """The order's makespan beyond m times the slowest rank where ``by_order``; None where it is not, or where the
    order's runs are over pipeline_jitter.ORDER_OPS (the closed form then)."""
    if not by_order(passes, sched):
        return None
    from .pipeline_jitter import order_span  # it imports this module

    span = order_span(passes, sched)
    return None if span is None else max(0.0, span - sched.microbatches * max(x.total_s for x in passes))


def caveats(passes: Sequence[StagePass], sched: Schedule) -> list[str]:
    """The plan's warnings on ``bubble_s`` for these passes (``ScheduleTraits.caveat``): none where its form is
    exact."""
    caveat = sched.traits.caveat
    closed = sched.stages > 1 and _order_bubble(passes, sched) is None  # the closed form priced it
    said = caveat(passes, sched) if caveat is not None and closed else ""
    return [said] if said else []


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
    README table); DualPipe PP + 1 stages (DualPipe README table), (PP + 1)/2 of the rank's two (dualpipe13), by
    chunk pp - s of stage s and s + 1 of stage pp - 1 - s (``in_flight_chunks``, mend13a);
    DualPipeV, DualPipe on 2·pp half-size stages, 2·pp + 1 half-stages."""
    return sched.traits.in_flight(sched, stage)


def in_flight_chunks(sched: Schedule, stage: int) -> tuple[float, ...]:
    """Per chunk of ``stage`` (its order on the rank), how many micro-batches of it one rank holds at its
    peak: ``in_flight`` resolved by chunk, so that chunks of different sizes (an embedding-only or a
    loss-only chunk, first/last stages of other sizes) count what they hold. Interleaved: the first
    warm-up + 1 chunk forwards, forward k running chunk (k // p) % v (Megatron schedules.py
    get_model_chunk_id with microbatch_group_size_per_vp_stage = p); DualPipe by its order
    (``ScheduleTraits.held_by_chunk``, ``_held_dualpipe_chunks``); the other schedules hold their chunks alike."""
    v, p = max(1, sched.chunks), sched.stages
    if sched.traits.held_by_chunk is not None:
        return sched.traits.held_by_chunk(sched, stage)
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
    """max(F, B - W, F + B - 2W) per rank: Qi et al. 2024 §3.1's F + B - 2W (the DualPipe README table: ZB1P
    (PP-1)(F+B-2W)), which assumes W <= B - W and F <= B; past them the order's chain of forwards (F) or of input
    gradients (B - W) is the longer (bubble11: the longest path of sail-sg's zb-h1 order, 95212f7, traced as
    ``_bubble_zbv``'s). Below m = p (no steady state) the longest path holds one more min(W, B - W) for each
    missing micro-batch (at the others' mean). Equal to the order's list schedule to 1e-9 with equal ranks, p 2-12,
    every m (tests/planner/test_pipeline_bubbles.py). Ranks that split their passes differently: down to 0.17 of
    a mean pass a rank below the order (the longest path takes one rank's F, another's B - W; review r11a #4)."""
    missing = max(0, sched.stages - sched.microbatches) / len(others)
    short = missing * min(sum(x.weight_s for x in others), sum(x.backward_s - x.weight_s for x in others))
    return sum(max(x.forward_s, x.backward_s - x.weight_s, x.total_s - 2 * x.weight_s) for x in others) + short


def _chunk_parts(others: Sequence[StagePass], split: int) -> tuple[float, float, float, float, float]:
    """Sums over the other ranks of a chunk's forward f, input gradient i = (B - W) and weight gradient w (the pass
    cut in ``split`` chunks), and the means of f and i (the single chunk op the critical paths below count)."""
    f = sum(x.forward_s for x in others) / split
    w = sum(x.weight_s for x in others) / split
    i = sum(x.backward_s for x in others) / split - w
    n = max(1, len(others))
    return f, i, w, f / n, i / n


def _bubble_zbv(others: Sequence[StagePass], sched: Schedule) -> float:
    """The ScheduleZBVZeroBubble (PyTorch) order's own bubble from its critical paths (bubble11). The order is a list
    schedule: its makespan is its longest path, a sum of op times, so with f, i, w a chunk's forward, input and
    weight gradient (half the rank's F, B - W, W) every path is n_f·f + n_i·i + n_w·w and the makespan the
    largest such sum over the few paths that can be longest. Tracing the longest path of the order
    (tests/planner/test_pipeline_bubbles.py's event simulation, back-tracked at random F, W, p 2-6, m 2p-4p)
    gives, with P ranks all equal and m >= 2P - 1, four count vectors beyond m(F + B):

    - (P - 1)·i: one chunk input gradient a rank beyond its work (a chain of input gradients);
    - 2(P - 1)(i - w): that chain where the weight gradient cannot fill the input gradient's slot;
    - (2P - 3)f - (P - 2)i: the fill, the last rank's first op waiting for the chunk forwards down the first leg
      (sched11's bound m + (P - 1)F/2 at equal thirds, which torch's order reaches);
    - (2P - 3)f + i - 2(P - 1)w: that fill where the weight gradients run out before the turn.

    (The counts are what the trace gives; where each chain runs is our reading.)

    Below m = 2P - 1 (torch runs 2P - 1 micro-batches and drops the rest) only m - P weight gradients fill the
    second chain (``late``), the first holds 2P - 1 - m more input gradients less as many w (``early``), and below
    m = P, with no steady state, each missing micro-batch adds min(2f, f + i). Equal to the list schedule to 1e-9
    for every m >= 1 where W <= F <= B - W (the backward at least the forward plus its weight GEMMs: the planner's
    W is the forward's GEMMs), and for m >= 2P - 1 wherever W <= F <= B (tests/planner/test_pipeline_bubbles.py);
    elsewhere within 0.25·p passes of it (measured). Ranks of unequal passes: each chain's per-rank terms summed
    over the other ranks, its single f and i at their mean; exact when equal, above the order when one rank is
    slower (its slack absorbs the others' fill; the test states the band), and below it by up to 0.34 of a mean
    pass a rank where ranks split F, B, W differently (review r11a #4: the path mixes ranks' terms); past F > B - W
    the plan says so (``_caveat_zbv``). Qi et al. 2024 (ICLR) §6 give no closed form for ZBV; this replaces our
    earlier reading (F + B - 3W)/2 a rank, 0 at equal thirds, below what any ZBV order can reach."""
    f, i, w, mf, mi = _chunk_parts(others, 2)
    p = sched.stages
    m = sched.microbatches
    late = min(max(m - p, 0), p - 1)  # p - 1 from m = 2p - 1: the weight gradients that fill the second chain
    early = p - 1 - late  # the input gradients the first chain holds beyond p - 1, less as many w
    short = max(0, p - m) * min(2 * mf, mf + mi)  # below m = p, no steady state
    mw = w / (p - 1)
    chains = (i + early * (mi - mw), 2 * (i - late * mw), 2 * f - i - mf + mi, 2 * f - 2 * w - mf + mi)
    return max(0.0, *chains) + short


def _caveat_zbv(passes: Sequence[StagePass], sched: Schedule) -> str:
    """Where a rank's forward outlasts its input gradient (F > B - W), ``_bubble_zbv``'s third chain, (2P - 3)f -
    (P - 2)i, binds (it beats the first iff f > i) and, summed over unequal ranks, can shorten as a rank's backward
    slows: measured 5% under the order at p 32-64, m 8 (F 0.45, B 0.55, W 0.2), and the step falling 35.475 ->
    35.355 while the order rises 34.0 -> 35.035 (review r11a #5). The planner's passes keep (B - W)/F >= 1.24 (W is
    the forward's GEMMs); a kernel change that breaks it is said, not priced silently."""
    over = [r for r, x in enumerate(passes) if x.forward_s > x.backward_s - x.weight_s]
    if not over:
        return ""
    x = passes[over[0]]
    return (
        f"{sched.traits.label}: {len(over)} of {len(passes)} stages run a forward longer than the backward's input "
        f"gradient (stage {over[0]}: F {x.forward_s * 1e3:,.2f} ms > B - W {(x.backward_s - x.weight_s) * 1e3:,.2f} "
        "ms); the zero-bubble V's bubble (its fill chain) is exact only where F <= B - W, and there it may be "
        "under the order (5% measured at m < pp) or fall as a rank slows"
    )


def _dual_bubble(f: float, i: float, w: float, mf: float) -> float:
    """DualPipeV's order's bubble on P - 1 ranks' sums (``_bubble_dualpipev``)."""
    return max(0.0, 2 * f, 2 * f + i - w, f + 2 * i - w - mf)


def _bubble_dualpipe(others: Sequence[StagePass], sched: Schedule) -> float:
    """DualPipe's order (dualpipe.py step(), 3da1bbe) on p ranks runs as DualPipeV's on p/2 ranks with whole
    stages for chunks (each direction's half of the ranks is a V folded at the middle: the list schedules
    have the same longest paths, bubble11), so ``_bubble_dualpipev`` with f, i, w the rank's F, B - W,
    W and the others' sums scaled by (p/2 - 1)/(p - 1), the README's share."""
    p = sched.stages
    share = (p / 2 - 1) / (p - 1)
    f, i, w, mf, _ = _chunk_parts(others, 1)
    return _dual_bubble(share * f, share * i, share * w, mf)


def _bubble_dualpipev(others: Sequence[StagePass], sched: Schedule) -> float:
    """dualpipev.py step()'s order's own bubble from its critical paths (bubble11; derived as ``_bubble_zbv``'s,
    the longest path's count vectors). With f, i, w a chunk's forward, input and weight gradient (half the rank's
    F, B - W, W), P ranks all equal, the order ends at m(F + B) plus the largest of:

    - 2(P - 1)f: the chunk forwards down the V and back up (steps 1-2's fill);
    - (P - 1)(2f + i - w): that fill with each rank's steady F&B pair holding an input gradient beyond the weight
      gradient that step 3 fills;
    - (P - 1)(f + 2i - w) - f: the backward chain up the V (steps 5-6), the README's (PP - 1)(F&B + B - 3W)/2 less
      one chunk forward (our reading: the turn's first F0 and B1 run apart, dualpipe.py step 4).

    (The counts are what the trace gives; where each chain runs is our reading.) At equal thirds all three are the
    README's 2(P - 1)f; away from them the order's is the largest of the three,
    not the README form (F 0.3, W 0.2 of the pass: 1.5 against 1.65 at p 4). Equal to the list schedule to 1e-9
    for p 2-12, m 2p to 5p, W <= F <= B (tests/planner/test_pipeline_bubbles.py); at F > B a lower bound. Ranks
    of unequal passes sum each rank's share as ``_bubble_zbv`` does (down to 0.17 of a mean pass a rank below the
    order with per-rank splits, DualPipe's 0.28: review r11a #4)."""
    f, i, w, mf, _ = _chunk_parts(others, 2)
    return _dual_bubble(f, i, w, mf)


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


def _held_dualpipe(sched: Schedule, stage: int) -> float:
    """PP + 1 stages' activations (DualPipe README table), in units of the rank's two stages (``MIRRORED``: each of
    its chunks a whole stage) half as many; per chunk ``_held_dualpipe_chunks`` (what memory reads)."""
    return min(sched.stages + 1, sched.microbatches) / 2


def _held_dualpipe_chunks(sched: Schedule, stage: int) -> tuple[float, float]:
    """Per chunk of rank r (stage r, then stage pp - 1 - r: ``MIRRORED``), the micro-batches whose activations it
    holds at its peak: min(pp - r, m/2) of stage r and min(r + 1, m/2) of stage pp - 1 - r, PP + 1 in all (the DualPipe
    README table). deepseek-ai/DualPipe 3da1bbe dualpipe.py step() runs nF0 (step_1 = (pp/2 - h - 1)·2 forwards of
    the rank's first direction, h = min(r, pp - 1 - r) the half rank, l. 335) and nF0F1 (step_2 = h + 1 of each)
    before its first backward (steps 1-4, l. 358-395), so the direction the rank starts piles up and the other does
    not; counting ``_order_dual`` (a forward adds one, a full or input-gradient backward frees one) gives exactly these
    counts at the moment the total peaks, each chunk's own peak at that same moment, at every rank of p, m = 2/4, 4/8,
    4/20, 8/16, 8/32, 16/64 (tests/planner/test_dualpipe_layout.py; review r13a #1). So whatever the two stages
    weigh, the rank's peak is this pair. (dualpipe13 held (PP + 1)/2 of each: 8.5 of rank 0's stage 0 at pp 16, not 16.)
    """
    p, half, r = sched.stages, sched.microbatches // 2, stage
    return float(min(p - r, half)), float(min(r + 1, half))


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


# One rank's operations as a list schedule (planner/pipeline_jitter.py runs them over per-micro-batch times): op kinds,
# in the ``ScheduleTraits.order`` arrays. A forward's output and a backward's input gradient leave when the op ends,
# except OP_F_LATE, a forward whose send goes out with the next op's (dualpipe.py's ``send=False`` forwards followed
# by ``_send_forward`` after the next compute, and the forward of an F&B pair, whose sends follow both computes);
# OP_WAIT (no time) holds the rank until the input of the backward it names has come (an F&B pair receives both
# inputs before it computes: dualpipe.py ``_forward_backward_chunk``), OP_IDLE pads a rank's list (no time, no input).
OP_F, OP_B, OP_I, OP_W, OP_WAIT, OP_F_LATE, OP_IDLE = range(7)  # B: full backward; I: input-gradient only; W: weights
# One op of an order laid out from runs (``_Runs``) in pipeline_jitter's cells (~3 ns): 38-62 ns measured cold with
# ZB-H1, ZBV, DualPipe and DualPipeV at p 4-48 (guard14, docs/step-time.md "(guard14)"; 115-160 ns at sched11, the
# rank's fixed cost then counted in it), and a rank's fixed cost, its runs tiled and numbered (``_Runs.arrays``' ~30
# numpy calls): 52-74 us a rank (guard14, after its one cumulative count; 63-121 us before), ORDER_RANK_CELLS
OP_CELLS = 20
ORDER_RANK_CELLS = 20_000
# per op kind: a forward; a backward that sends its input gradient (B, I); one that waits for it too (OP_WAIT, which
# waits for the input of the backward it names). Tables read as IS_FORWARD[kind], not np.isin (10x its cost on a
# rank's few thousand ops: ``_Runs.arrays`` 0.31 -> 0.22 ms a rank; vsearch13); pipeline_jitter reads them too
IS_FORWARD = np.isin(np.arange(OP_IDLE + 1), (OP_F, OP_F_LATE))
SENDS_GRADIENT = np.isin(np.arange(OP_IDLE + 1), (OP_B, OP_I))
IS_GRADIENT = np.isin(np.arange(OP_IDLE + 1), (OP_B, OP_I, OP_WAIT))


def _order_megatron(sched: Schedule, stage: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Megatron's 1F1B and interleaved 1F1B on one rank (Megatron-LM d98e8a6 pipeline_parallel/schedules.py
    forward_backward_pipelining_with(out)_interleaving): the w warm-up chunk forwards (``warmup_microbatches``),
    then one forward one backward, then the cool-down backwards, so chunk forward k runs at position k (k < w) or
    2k - w, chunk backward k at w + 2k + 1 (k < n - w) or n + k, n = m·v; chunk forward k runs micro-batch
    (k // pv)·p + k % p on chunk (k // p) % v, chunk backward k the same micro-batch on chunk v - 1 - (k // p) % v
    (get_model_chunk_id, microbatch_group_size_per_vp_stage = p), chunk c of rank d being virtual stage c·p + d;
    v 1 is the plain 1F1B. Returns, in run order, (kind: OP_F or OP_B, micro-batch, virtual stage) arrays."""
    p, v = sched.stages, max(1, sched.chunks)
    n = sched.microbatches * v
    w = warmup_microbatches(sched, stage)
    k = np.arange(n)
    kind = np.full(2 * n, OP_F, dtype=np.intp)
    at = np.concatenate([np.where(k < w, k, 2 * k - w), np.where(k < n - w, w + 2 * k + 1, n + k)])
    kind[at[n:]] = OP_B
    group, r = np.divmod(k, p * v)
    mb, chunk = np.empty(2 * n, dtype=np.intp), np.empty(2 * n, dtype=np.intp)
    mb[at[:n]] = mb[at[n:]] = group * p + r % p
    chunk[at[:n]], chunk[at[n:]] = r // p, v - 1 - r // p
    return kind, mb, chunk * p + stage


# A rank's order is written as runs of a pattern repeated (``_Runs``): a handful of Python steps per rank, the ops
# themselves laid out by numpy (115-160 ns an op with pipeline_jitter's padding; op by op in Python 0.5-0.8 us).
F0, F1, FL0, FL1, B0, B1, I0, I1 = ((OP_F, 0), (OP_F, 1), (OP_F_LATE, 0), (OP_F_LATE, 1), (OP_B, 0), (OP_B, 1),
                                    (OP_I, 0), (OP_I, 1))  # fmt: skip
W0, W1, WQ = (OP_W, 0), (OP_W, 1), (OP_W, -1)  # a chunk's oldest deferred weight gradient; -1: the rank's oldest


def _pair(f: int, b: int) -> tuple[tuple[int, int], ...]:
    """An F&B pair (dualpipe.py ``_forward_backward_chunk``): both inputs received (OP_WAIT on the backward's), the
    forward and the full backward computed, both outputs sent after both."""
    return (OP_WAIT, b), (OP_F_LATE, f), (OP_B, b)


class _Runs:
    """One rank's ops as (pattern, times) runs of (kind, phase) pairs; ``arrays`` gives each op its micro-batch and
    virtual stage: a forward (F, F_LATE) the next of its phase's forwards, a backward (B, I) the next of its
    backwards, an OP_WAIT the backward after it; an OP_W the weight gradient of the oldest OP_I not yet popped, first
    in first out over the rank (dualpipe.py ``WeightGradStore``: "Assume FIFO") or within its phase (torch's
    ScheduleZBVZeroBubble counts each chunk's W apart); ``where``: (first micro-batch, virtual stage) of each phase."""

    def __init__(self, where: tuple[tuple[int, int], ...]) -> None:
        self.where = np.array(where, dtype=np.intp)
        self.runs: list[tuple[tuple, int]] = []

    def add(self, times: int, *pattern: tuple[int, int]) -> None:
        if times > 0 and pattern:
            self.runs.append((pattern, times))

    def weights(self) -> None:
        """The weight gradients still deferred, oldest first (dualpipe.py step 8, the quick ZB-H1's ``pop_all``): the
        runs' input gradients less their weight gradients, counted off the patterns (guard14: not tiled out)."""
        held = sum(times * sum((k == OP_I) - (k == OP_W) for k, _ in pattern) for pattern, times in self.runs)
        self.add(held, WQ)

    def arrays(self, m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        ops = np.concatenate([np.tile(np.array(p, dtype=np.intp), (t, 1)) for p, t in self.runs])
        kind, phase = ops[:, 0], ops[:, 1]
        # each forward (backward) numbered by its phase's forwards (backwards that send) before it: one cumulative
        # count over four columns (forward / backward x phase), read at the op's own column (guard14: one cumsum, not
        # four masked ones; the same numbers)
        group = np.where(IS_FORWARD[kind], 0, np.where(IS_GRADIENT[kind], 2, -4)) + phase  # < 0: a weight gradient
        counted = np.flatnonzero(IS_FORWARD[kind] | SENDS_GRADIENT[kind])
        onehot = np.zeros((len(kind), 4), dtype=np.intp)
        onehot[counted, group[counted]] = 1
        ahead = np.cumsum(onehot, axis=0) - onehot  # the column's counted ops before this one
        index = np.zeros(len(kind), dtype=np.intp)
        sel = np.flatnonzero(group >= 0)
        index[sel] = ahead[sel, group[sel]]
        deferred, popped = np.flatnonzero(kind == OP_I), np.flatnonzero(kind == OP_W)
        for ph in (-1, 0, 1):  # each W takes the (phase, index) of the I it pops
            queue = deferred if ph == -1 else deferred[phase[deferred] == ph]
            pops = popped[phase[popped] == ph]
            index[pops], phase[pops] = index[queue[: len(pops)]], phase[queue[: len(pops)]]
        first, stage = self.where[phase].T
        mb = first + index
        keep = mb < m
        return kind[keep].copy(), mb[keep], stage[keep]


def _order_zb_h1(sched: Schedule, stage: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ZB-H1 on one rank as sail-sg/zero-bubble-pipeline-parallelism's quick implementation runs it (branch
    zb-h1-quick-start, commit 95212f7, Megatron's schedules.py forward_backward_pipelining_without_interleaving
    with WeightGradStore): 1F1B's warm-up and pairs; rank r > 0 splits the backward (I, its W deferred) of its
    first r steady-state micro-batches, of its last, and of every cool-down one, and pops the oldest W after the
    last steady-state backward when i >= r and after cool-down backward i when (m - w) + i >= r; the rest at the
    end (``pop_all``); rank 0 never splits."""
    m, r = sched.microbatches, stage
    w = warmup_microbatches(sched, stage)
    rest = m - w
    runs = _Runs(((0, r),))
    runs.add(w, F0)
    if r == 0:
        runs.add(rest, F0, B0)
        runs.add(w, B0)
        return runs.arrays(m)
    runs.add(min(r, rest - 1), F0, I0)  # i < r, short of the last
    runs.add(rest - 1 - r, F0, B0)
    if rest > 0:  # the last steady-state micro-batch
        runs.add(1, F0, I0, *((WQ,) if rest - 1 >= r else ()))
    early = min(w, max(0, r - rest))  # cool-down backwards before (m - w) + i reaches r: no pop
    runs.add(early, I0)
    runs.add(w - early, I0, WQ)
    runs.weights()
    return runs.arrays(m)


def _order_zbv(sched: Schedule, stage: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ZBV (Qi et al. 2024 §6, the V with T_F = T_B = T_W) on one rank as torch.distributed.pipelining runs it
    (torch/distributed/pipelining/schedules.py ScheduleZBVZeroBubble._calculate_single_rank_operations, the stored
    PyTorch main beside ScheduleDualPipeV; not pinned to a release): chunk 0 is virtual stage r, chunk 1 stage
    2p - 1 - r; 2(p - r) - 1 chunk-0 forwards, r (F1, F0), p - r (F1, I1, W1), then (F0, I0, W0,
    F1, I1, W1) while chunk-0 forwards remain and (I0, W0, F1, I1, W1) until chunk 1's catch up, r (I0, I1), p - r
    (I0, W0), the r remaining W1 and W0 (torch's loops, their counts written out); run for n = max(2p - 1, m)
    micro-batches and those past m dropped, as torch does. Each chunk's W pops that chunk's oldest I."""
    p, m, r = sched.stages, sched.microbatches, stage
    n = max(2 * p - 1, m)
    runs = _Runs(((0, r), (0, 2 * p - 1 - r)))
    runs.add(2 * (p - r) - 1, F0)
    runs.add(r, F1, F0)
    runs.add(p - r, F1, I1, W1)
    runs.add(n - 2 * p + r + 1, F0, I0, W0, F1, I1, W1)
    runs.add(p - r - 1, I0, W0, F1, I1, W1)
    runs.add(r, I0, I1)
    runs.add(p - r, I0, W0)
    runs.add(r, W1)
    runs.add(r, W0)
    return runs.arrays(m)


def _order_dual(sched: Schedule, stage: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """DualPipe and DualPipeV on one rank, step() of deepseek-ai/DualPipe (3da1bbe) dualpipe.py and dualpipev.py:
    nF0; nF0F1 (F0's send after F1 except at the turn, the turn's last F1 sent after step 4's first F0); nB1W1F1
    (zero bubble); nF0B1F1B0 in F&B pairs (the turn's first F0 and B1 apart: "We don't overlap these two chunks to
    further reduce bubble size", DualPipe's middle rank sending the F0 after the B1); nB1F1B0; nB1B0 (the second
    half zero bubble from the half rank's parity); nWB0; nW. Phase 0 is the rank's early stage, phase 1 its late
    one. DualPipeV (one direction folded in a V): virtual stages r and 2p - 1 - r, every micro-batch through both,
    the turn at the last rank (its phase-0 output handed over in place). DualPipe: two directions of m/2
    micro-batches, direction 0 from rank 0 (stage r), direction 1 from rank p - 1 (stage p - 1 - r, micro-batches
    m/2 ..), a rank's phase 0 the direction whose early stage it holds (``phase ^= is_in_second_half``), the steps
    counted by the half rank min(r, p - 1 - r) over p/2 ranks, the turn at the middle ranks. Not modelled:
    dualpipev.py's ``_commit_and_wait_comm()``, which every compute call (and ``_weight_chunk``) runs first, waiting
    for every queued receive (step 3's W for the F1 input queued before it, step 2's F1 for the next F0's); with
    those waits added to the event simulation the makespan is the same with equal ranks (p 4/8/16, to 1e-12) and at
    most 0.10 passes longer with random unequal ranks (review r11a #6)."""
    p, m, r = sched.stages, sched.microbatches, stage
    v_shape = sched.traits.directions == 1
    if v_shape:
        ranks, h, turn, half, where = p, r, r == p - 1, m, ((0, r), (0, 2 * p - 1 - r))
    else:
        ranks, h, half, turn = p // 2, min(r, p - 1 - r), m // 2, r in (p // 2 - 1, p // 2)
        directions = ((0, r), (m // 2, p - 1 - r))
        where = directions if r < p // 2 else directions[::-1]
    rest, f0 = ranks - h - 1, F0 if turn else FL0
    runs = _Runs(where)
    runs.add(2 * rest, F0)  # step 1
    runs.add(h, f0, F1)  # step 2
    runs.add(1, f0, FL1 if turn else F1)
    runs.add(rest, I1, WQ, F1)  # step 3
    steady = half - 2 * ranks + h + 1  # step 4
    if turn:
        runs.add(1, FL0 if not v_shape else F0, B1, *_pair(1, 0))
    else:
        runs.add(1, *_pair(0, 1), *_pair(1, 0))
    runs.add(steady - 1, *_pair(0, 1), *_pair(1, 0))
    runs.add(rest, B1, *_pair(1, 0))  # step 5
    k = (h + 1) // 2  # step 6: zero bubble from i = k (B1 from i = k + 1 where h is even)
    runs.add(k, B1, B0)
    if h % 2 == 0:
        runs.add(1, B1, I0)
        runs.add(h - k, I1, I0)
    else:
        runs.add(h + 1 - k, I1, I0)
    runs.add(rest, WQ, I0)  # step 7
    runs.weights()  # step 8
    return runs.arrays(m)


@dataclass(frozen=True)
class StageMap:
    """How a schedule's model chunks sit on its ranks and which chunk an op of its order runs (dualpipe13, review r12a
    #3): the one home parallel.rank_of (the layout), pipeline_jitter's op cells and the step's passes
    (step.stage_passes, ``ScheduleTraits.passes``) read.

    - in order (Megatron's, ZB-H1): virtual stage k on rank k % pp as chunk k // pp;
    - ``folded`` (a V: ZBV, DualPipeV): stage k on rank k for k < pp, else 2·pp - 1 - k, one model in 2·pp stages, a
      micro-batch through both chunks of a rank;
    - ``copies`` 2 (DualPipe): the model split in pp stages and held twice, folded the same way: copy 0's stage r on
      rank r (chunk 0, direction 0), copy 1's stage r on rank pp - 1 - r (chunk 1, direction 1), so rank r runs stage
      r one way and pp - 1 - r the other (deepseek-ai/DualPipe 3da1bbe examples/example_dualpipe.py:
      ``local_full_modules = nn.Sequential(full_modules[rank], full_modules[pp_size - 1 - rank])``), each micro-batch
      one of the two: a rank's pass over both chunks is one micro-batch of each direction."""

    folded: bool = False
    copies: int = 1

    def rank(self, k: int, p: int) -> int:
        """The rank of chunk k (virtual stages in model order, copy by copy)."""
        if self.folded:
            return k if k < p else 2 * p - 1 - k
        return k % p

    def passes(self, m: int) -> int:
        """A rank's passes over all its chunks in a step of m micro-batches: a pass carries ``copies`` micro-batches,
        so m, or m / 2 with DualPipe's two copies (each micro-batch runs one of the rank's two stages; a pass over
        both is one micro-batch each way: dualpipe.py runs num_chunks // 2 micro-batches a direction). The one home of
        Context.passes and Schedule.passes (review r13a #7)."""
        return m // self.copies

    @property
    def micro_batch_share(self) -> float:
        """A micro-batch's share of a pass over the rank's chunks (a stage step): 1 / copies."""
        return 1 / self.copies

    def visits(self, v: int) -> int:
        """The chunks of its ``v`` one micro-batch runs on a rank: all v (Megatron's, a V's 2), DualPipe's 1 (the
        chunk of its direction)."""
        return max(1, v) // self.copies

    def copy_of(self, k: int, p: int) -> int:
        """Which copy of the model virtual stage k (model order, copy by copy) belongs to: 0, or k // pp with copies."""
        return k // p if self.copies > 1 else 0

    def op_chunk(self, rank: np.ndarray, stage: np.ndarray, p: int) -> np.ndarray:
        """The rank's chunk an order's op at (virtual) ``stage`` runs: stage // pp, or, with copies, the op's direction
        (its stage is the rank's own r one way, pp - 1 - r the other; pp is even)."""
        if self.copies > 1:
            return (stage != rank).astype(stage.dtype)
        return stage // p


IN_ORDER = StageMap()
FOLDED = StageMap(folded=True)
MIRRORED = StageMap(folded=True, copies=2)


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
    # how its chunks sit on the ranks (``StageMap``): folded, exactly 2 chunks per rank (virtual stage k on rank k,
    # then 2·pp - 1 - k): ZBV, DualPipeV, and DualPipe's two copies of the model (``v_shape``, ``directions``)
    stage_map: StageMap = IN_ORDER
    min_pp: int = 1  # the pipeline ranks it needs
    even_pp: str = ""  # where an even pp is required (the check's source), "" when any pp does
    title: str = ""  # its name in messages; "" is ``name``
    # the micro-batch count's rule: (name, m, pp) -> the 422's message, "" when m is fine
    microbatch_rule: Callable[[str, int, int], str] = _any_m
    # True: each forward runs beside another micro-batch's backward, hiding MoE's all-to-all behind the
    # other's compute (DeepSeek-V3 report §3.2.1, Figure 4): the default of overlap_moe_expert_parallel_comm
    overlaps_ep: bool = False
    # True: a stage runs all its forwards, then all its backwards (GPipe; torch ScheduleGPipe._step_microbatches)
    forwards_first: bool = False
    source: str = ""  # its p2p calls' source; "" is the framework's schedule file (Flavour.pp_source)
    # True: the layout search tries it when the constraints name no schedule (planner/search/space.py); the
    # others only when listed
    searched: bool = False
    # one rank's operations in the order it runs them, (kind: OP_F, OP_B, ..., micro-batch, virtual stage) arrays,
    # which planner/pipeline_jitter.py runs as a list schedule over per-micro-batch times; None: not written out
    # (GPipe: the flow shop is its exact form, planner/documents.py)
    order: Callable[[Schedule, int], tuple[np.ndarray, np.ndarray, np.ndarray]] | None = None
    # True: the order runs some backwards' weight gradients apart (OP_I, then OP_W later: the zero-bubble and DualPipe
    # orders), so the weight gradient's share of a pass moves its list schedule (planner/pipeline_jitter.py)
    splits_weights: bool = False
    # cells (planner/pipeline_jitter.py's work units, 2-5 ns) one op of ``order`` costs to write out, and one rank's
    # fixed cost: the Megatron order's own (``_MEGATRON``; 0 until guard14, "within the relaxation's charge"), OP_CELLS
    # and ORDER_RANK_CELLS for one laid out from runs (``_Runs``; docs/step-time.md "(sched11)", "(guard14)")
    order_op_cells: int = 0
    order_rank_cells: int = 0
    # True: where its ranks or chunks differ, ``bubble_s`` runs ``order`` as a list schedule at each (rank, chunk, op)'s
    # time (planner/pipeline_jitter.py order_span; vsched12), the closed form ``bubble`` where all are equal
    order_priced: bool = False
    # per chunk of a rank, the micro-batches it holds at its peak where its chunks differ by more than
    # ``chunk_order`` says (DualPipe: ``_held_dualpipe_chunks``, from its order); None: ``in_flight`` / ``chunk_order``
    held_by_chunk: Callable[[Schedule, int], tuple[float, ...]] | None = None
    # a warning on the plan where the passes leave the range ``bubble`` is exact in ("" when they do not)
    caveat: Callable[[Sequence[StagePass], Schedule], str] | None = None
    # (kind, v) orders planner/pipeline_jitter.py runs in turn, at the same (p, m), where this one's run is over its
    # work bound, before the flow shop: cheaper orders (no split weight gradients, 2-3x fewer ops, no build cells,
    # any m) whose packed-document wait is measured no less than this one's (review r11a #1: the flow shop was 3.6x
    # below ZB-H1's own at pp 512; the ratios in docs/step-time.md "(mend11a)")
    wait_stand_ins: tuple[tuple[str, int], ...] = ()
    # what the planner's layout of its stages leaves out of the schedule's own (the plan's Assumptions row; "" none)
    layout_caveat: str = ""

    @property
    def label(self) -> str:
        return self.title or self.name

    @property
    def v_shape(self) -> bool:
        """Exactly 2 chunks per rank folded in a V (``StageMap.folded``)."""
        return self.stage_map.folded

    @property
    def directions(self) -> int:
        """The micro-batches split over this many directions, each crossing a rank boundary once and running one
        copy of the model (DualPipe: 2, dualpipe.py num_chunks // 2; ``StageMap.copies``)."""
        return self.stage_map.copies

    def passes(self, m: int) -> int:
        """A rank's passes over all its chunks in a step of m micro-batches (``StageMap.passes``)."""
        return self.stage_map.passes(m)

    def orders_at(self, pp: int) -> bool:
        """Whether a pipeline of ``pp`` stages may be priced by running ``order`` (``order_priced``, the order written
        out, more than one stage): the one test ``by_order``, ``pipeline_jitter.span_work`` / ``order_method`` and the
        search's ``StepModel.orders_possible`` ask before anything of the passes."""
        return self.order_priced and self.order is not None and pp > 1

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


# past the work bound (``wait_stand_ins``): Megatron's 1F1B order, whose steady state has no slack, so its wait is the
# most of the written orders' (per sigma, p 4-128, m 2p-8p, rho 0.02-1.0, four (phi, omega); mend11a, docs/step-time.md:
# ZB-H1 0.64-1.005 of it, DualPipe 0.48-0.82, DualPipeV 0.20-0.78, ZBV 0.04-0.64, the interleaved v 2 0.07-0.69). Not
# the interleaved order for the V schedules (ZBV 0.67-1.34 of its wait, DualPipe(V) 2.0-4.4x), nor the flow shop for
# ZBV (up to 2.8x below ZBV's at rho 1)
_STAND_INS = (("1f1b", 1),)
# Megatron's two schedules: searched by default, run in Megatron's own order (schedules.py)
# (its order written out: 25 ns an op and 14 us a rank measured cold at p 8-64, v 1-4, guard14; in pipeline_jitter's
# ~3 ns cells)
_MEGATRON = {"searched": True, "order": _order_megatron, "order_op_cells": 8, "order_rank_cells": 4_700}
# parallel.py's SCHEDULES are these names, in this order
register(ScheduleTraits("1f1b", _bubble_1f1b, _warmup_1f1b, _held_warmup, **_MEGATRON))
register(
    ScheduleTraits(
        "interleaved",
        _bubble_1f1b,
        _warmup_interleaved,
        _held_interleaved,
        **_MEGATRON,
        chunk_order=True,
        interleaved=True,
        microbatch_rule=_m_divisible_by_pp,
        wait_stand_ins=_STAND_INS,
    )
)
# GPipe runs 1F1B's critical path (all forwards, then all backwards) and holds all m micro-batches
register(ScheduleTraits("gpipe", _bubble_1f1b, _warmup_all, _held_warmup, forwards_first=True))
_ZB = {"min_pp": 2, "source": ZB_DUALPIPE_SOURCE, "splits_weights": True, "order_op_cells": OP_CELLS,
       "order_rank_cells": ORDER_RANK_CELLS,
       "wait_stand_ins": _STAND_INS, "order_priced": True}  # fmt: skip
_DUALPIPE = {**_ZB, "stage_map": FOLDED, "microbatch_rule": _m_even_twice_pp, "overlaps_ep": True, "order": _order_dual}
# DualPipe's own layout (dualpipe13, review r12a #3): rank r runs stage r one way and pp - 1 - r the other of a pp-stage
# model held twice (``MIRRORED``); until round 13 it was laid out as DualPipeV's 2·pp-stage V, rank 0 carrying the
# embedding and the head, loss and MTP on every op (+11% pipeline on DeepSeek-V3 pp 8, docs/step-time.md "(mend12a)")
_DUALPIPE_LAYOUT = (
    "DualPipe's own layout (deepseek-ai/DualPipe examples/example_dualpipe.py): the model in pp stages held twice, "
    "rank r running stage r for direction 0 and stage pp - 1 - r for direction 1, so ranks 0 and pp - 1 each hold one "
    "embedding and one output layer and run each on half their micro-batches; the two copies' gradients are summed "
    "every step in one reduction over both copies' data-parallel ranks (ranks r and pp - 1 - r; assumed: the copy's "
    "buffer laid out as its twin's; ZeRO-3 / FSDP: each copy shards on its own and the reduced shards are all-reduced "
    "across the copies)"
)
register(ScheduleTraits("zb-h1", _bubble_zb_h1, _warmup_1f1b, _held_warmup, **_ZB, order=_order_zb_h1))
register(
    ScheduleTraits(
        "zbv", _bubble_zbv, _warmup_v, _held_zbv, **_ZB, stage_map=FOLDED, order=_order_zbv, caveat=_caveat_zbv
    )
)
register(
    ScheduleTraits(
        "dualpipe",
        _bubble_dualpipe,
        _warmup_v,
        _held_dualpipe,
        **{**_DUALPIPE, "stage_map": MIRRORED},
        even_pp="dualpipe.py: assert num_ranks % 2 == 0",
        held_by_chunk=_held_dualpipe_chunks,
        title="DualPipe",
        layout_caveat=_DUALPIPE_LAYOUT,
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
    "FOLDED",
    "IN_ORDER",
    "IS_FORWARD",
    "IS_GRADIENT",
    "MIRRORED",
    "OP_B",
    "OP_F",
    "OP_F_LATE",
    "OP_I",
    "OP_IDLE",
    "OP_W",
    "OP_WAIT",
    "SCHEDULE_TRAITS",
    "SENDS_GRADIENT",
    "ZB_DUALPIPE_SOURCE",
    "PipelineTime",
    "Schedule",
    "ScheduleTraits",
    "StageMap",
    "StagePass",
    "bubble_s",
    "busiest_rank_s",
    "by_order",
    "caveats",
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
