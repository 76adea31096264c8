"""The search's step time and memory: a cache over the planner's own pure functions, not a second model.

Every number comes from the functions ``build_plan`` calls (planner/compute.py ``stage_compute``,
memory.py ``held_bytes`` and ``stage_activation_bytes``, step.py ``stream_totals``, ``assign_streams`` and
``critical_path``, pipeline.py ``pipeline_time``); what is kept here is only where they are memoised:

- ``stage_compute`` on ``compute.stage_compute_key`` (the value key of everything it reads): stages with
  the same layers, parameters and sharding share one call across layouts, ZeRO stages 1-3, frameworks
  whose parameter counts agree, pipeline schedules and shapes;
- ``stage_activation_bytes`` as ``held_activation_bytes`` of ``chunk_activations`` (memoised on
  ``memory.chunk_activation_key``) and the schedule's micro-batches in flight (memoised on the schedule);
- ``held_bytes`` (weights, gradients, optimizer states, fixed buffers) per layout, shared by its
  micro-batch sizes and recompute choices (it reads neither: memory.py);
- the stream totals of a template's priced calls (``Part``), shared by every layout priced from them.

The memos are dicts keyed by values (the search's model, workload and GPU once per scope, then plain
values), each bounded: a scope's memos are dropped when more than SCOPES_KEPT scopes were seen, and a memo
is cleared when it passes MEMO_KEPT entries.

A lower bound prunes without changing the answer (branch and bound): ``critical_path`` takes time = max
over stages of (sync + optimizer + exposed gather) with sync >= stage 0's end >= the pipeline's critical
path, which only grows with the communication added to each pass; so the pipeline of the compute alone
(no sends, no exposed communication) plus the slowest optimizer step bounds the step time from below.
``refined_bound`` adds the data-parallel calls to that path (``critical_path(bound=True)``), and
``data_floor`` what they add to any layout of a variant (docs/search.md, Branch and bound).

The search re-evaluates its best layouts with ``build_plan`` itself, so the step and memory blocks it
answers are exactly /v1/plan's. Without a GPU spec there is no step time or memory: the screen ranks by the
communication of the busiest stage (``Plan.totals.time_s``) and every layout fits.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, fields, replace

import numpy as np

from collectives.topology import Cluster

from ..compute import (
    PassTime,
    StageCompute,
    layer_forward_key,
    layer_s,
    layers_s,
    optimizer_key,
    optimizer_s,
    stage_pass_compute,
    stage_pass_key,
)
from ..context import Context
from ..ledger import Call
from ..memory import (
    MAX_STAGE_BYTES,
    chunk_activation_key,
    chunk_activations,
    comm_buffers,
    held_activation_bytes,
    held_bytes,
)
from ..model import ModelSpec
from ..parallel import ParallelSpec, _split_key
from ..params import _holding, alike_stages
from ..pipeline import busiest_rank_s, by_order, in_flight_chunks, losses_in_flight, pipeline_time, schedule_traits
from ..pipeline_jitter import order_spans
from ..recompute import layer_counts
from ..spread import job_pace, slowest_part
from ..step import (
    Overlap,
    StageStep,
    StreamTotals,
    assign_streams,
    chunk_shares,
    chunk_shares_key,
    critical_path,
    paired_passes,
    schedule_for,
    schedule_of,
    stage_passes,
    stream_totals,
)
from ..workload import WorkloadSpec
from .space import recompute_fields

# A stage's activations or buffer past memory.MAX_STAGE_BYTES counts as this (it fits no device): the int64 arrays
# of the screen hold it, and the two with the static bytes (2^50 parameters x 16 B at most) sum inside int64; an
# iteration of 2^24 sequences of 2^22 tokens was a 500, OverflowError, before (hostile15)
BEYOND = MAX_STAGE_BYTES + 1

# Context's cached properties that read only the model, the layout's pipeline split (parallel._split_key) and
# whether it trains (fixed per scope): the chunks and layers each stage holds, their kinds, MTP blocks and roles
_SPLIT = ("chunks", "stage_layers", "_moe_layers", "chunk_kinds", "chunk_mtp", "stage_roles")
SCOPES_KEPT = 8  # (model, workload, GPU) scopes whose memos are kept
MEMO_KEPT = 1 << 16  # entries per memo before it is cleared
_SCOPES: dict = {}  # (model, workload, GPU) -> _Memos
_SERIAL = itertools.count()


class _Memos:
    """The value-keyed memos of one (model, workload, GPU): keys leave those out (the scope holds them).
    A layout's per-stage keys (a tuple of tuples) are interned to an int once per layout, so that a
    lookup per (micro-batch size, recompute) hashes small values; ids are never reused."""

    def __init__(self):
        # ((b, recompute), interned (stage_pass_key[2:], paired)) -> (fwd, bwd, attention s)
        self.compute: dict = {}
        self.optimizer: dict = {}  # optimizer_key -> optimizer_s (seconds)
        # ((b·s/cp, recompute), interned chunk_activation_key[3:]) -> ChunkActivations
        self.acts: dict = {}
        self.flights: dict = {}  # Schedule -> (interned id, pipeline.in_flight_chunks per stage)
        self.ids: dict = {}  # per-stage keys of a layout -> int
        self.splits: dict = {}  # parallel._split_key -> the _SPLIT properties of a context with that split
        self.lists: dict = {}  # ((b, recompute), compute id) -> [StageCompute]
        self.arrays: dict = {}  # ((b·s/cp, recompute), activation id, in-flight id) -> activation bytes per stage
        # ((b, recompute), interned layer_forward_key[2:], forward seconds, interned chunk_shares_key) -> shares
        self.shares: dict = {}
        self.share_lists: dict = {}  # ((b, recompute), passes id, chunks id) -> chunk shares per stage
        self.bounds: dict = {}  # ((b, recompute), passes id, chunks id, Schedule) -> pipeline of the compute alone
        # (b, recompute) -> the scope's workload at them: one object for every StepModel of the scope (a search
        # builds one per shape), so the planner's memos keyed on a workload meet it by identity
        self.works: dict = {}
        # params._holding(layout) -> params.alike_stages (its lru keeps 64 layouts; a search reads thousands)
        self.alike: dict = {}
        # (recompute, interned (chunk kinds, MTP blocks) of a stage) -> recompute.layer_counts(ctx, stage, "decoder")
        self.layers: dict = {}
        self.per_layer: dict = {}  # ((b, recompute), interned layer_forward_key[2:], MoE, LayerRecompute) -> layer_s

    def intern(self, keys: tuple) -> int:
        found = self.ids.get(keys)
        if found is None:
            found = self.put(self.ids, keys, next(_SERIAL))
        return found

    @staticmethod
    def put(memo: dict, key, value):
        if len(memo) >= MEMO_KEPT:
            memo.clear()
        memo[key] = value
        return value


def _alike(memos: _Memos, ctx: Context) -> dict[int, tuple[int, ...]]:
    """params.alike_stages of the context's layout, memoised in the scope on params._holding (what it reads of the
    layout: the model is the scope's)."""
    key = _holding(ctx.par)
    found = memos.alike.get(key)
    if found is None:
        found = memos.put(memos.alike, key, alike_stages(ctx))
    return found


def _memos(model: ModelSpec, work: WorkloadSpec, gpu) -> _Memos:
    key = (model, work, gpu)
    found = _SCOPES.get(key)
    if found is None:
        if len(_SCOPES) >= SCOPES_KEPT:
            _SCOPES.pop(next(iter(_SCOPES)))
        found = _SCOPES[key] = _Memos()
    return found


@dataclass(frozen=True)
class Priced:
    """What step_time reads of a PricedCall: the time of one call, what its kernel holds beside the compute
    (NCCL's channels, the bytes one rank sends and receives: planner/contention.py), and where its groups sit
    (``span`` and ``bottleneck``, read by collectives pricing.on_nvlink_switch) from its ``curve``
    (search/prices.py Curve.where)."""

    time_s: float
    channels: int = 0
    bytes_sent_per_rank: int = 0
    bytes_received_per_rank: int = 0
    curve: object = None

    @property
    def span(self) -> str:
        return self.curve.where()[0] if self.curve is not None else ""

    @property
    def bottleneck(self) -> dict:
        return self.curve.where()[1] if self.curve is not None else {}


class RowCall:
    """The fields of a ledger Call that step.py and memory.py read, at one layout's b and m (a plain
    slotted object: built thousands of times a second, where dataclasses.replace would dominate)."""

    __slots__ = (
        "calls_per_iteration", "kernel", "message_bytes", "name", "op", "parallelism", "phase", "sms", "stages",
    )  # fmt: skip

    @classmethod
    def of(cls, call: Call, stages: tuple[int, ...], message_bytes: int, count: int) -> RowCall:
        row = cls()
        row.name, row.parallelism, row.op, row.phase = call.name, call.parallelism, call.op, call.phase
        row.kernel = call.kernel  # the legs of one kernel run concurrently (step.stream_totals)
        row.sms = call.sms  # a non-NCCL kernel's own SMs (planner/contention.py)
        row.stages, row.message_bytes, row.calls_per_iteration = stages, message_bytes, count
        return row


@dataclass(frozen=True)
class Row:
    call: RowCall
    price: Priced


class Part:
    """The priced rows of one ledger template at one micro-batch size and count, with their stream totals
    (step.stream_totals) memoised per ZeRO stage and stage count: every layout priced from the rows shares
    them."""

    __slots__ = ("_busiest", "_totals", "counts", "rows", "times")

    def __init__(self, rows: list[Row], counts: np.ndarray, times: np.ndarray):
        self.rows, self.counts, self.times = rows, counts, times
        self._totals: dict = {}
        self._busiest: dict = {}

    def totals(self, m: int, zero: int, stages: int) -> StreamTotals:
        key = (m, zero, stages)
        found = self._totals.get(key)
        if found is None:
            found = self._totals[key] = stream_totals(self.rows, m, zero, stages)
        return found

    def per_stage(self, stages: int) -> np.ndarray:
        """Seconds of communication per stage and iteration (every call, whatever its stream)."""
        found = self._busiest.get(stages)
        if found is None:
            found = np.zeros(stages)
            for row, n, t in zip(self.rows, self.counts.tolist(), self.times.tolist(), strict=True):
                for s in row.call.stages:
                    found[s] += n * t
            self._busiest[stages] = found
        return found


class _Variant:
    """What the step model keeps of one layout (degrees, pipeline, ZeRO, SP, framework): its contexts and
    per-stage parts by (micro-batch size, recompute)."""

    __slots__ = (
        "act_id",
        "act_keys",
        "bounds",
        "chunk_keys",
        "chunks_id",
        "compute_id",
        "contexts",
        "distinct",
        "flights",
        "floor_keys",
        "layer_key",
        "optimizer",
        "pace",
        "paired",
        "par",
        "pass_id",
        "pass_keys",
        "s_cp",
        "scheds",
        "split",
        "static",
    )

    def __init__(self, par: ParallelSpec):
        self.par = par
        self.contexts: dict = {}
        # per stage: compute.stage_pass_key past the model and workload, and ``paired``, interned
        self.pass_keys: tuple | None = None
        self.distinct: tuple = ()  # the first stage of each distinct pass key (what busiest_bounds reads)
        # step.paired_passes of the StepModel's overlap: the passes run as combined 1F1B pairs (None: not asked yet)
        self.paired: bool | None = None
        self.pass_id: int | None = None
        self.optimizer: tuple = ()  # per stage: compute.optimizer_s
        self.pace = 1.0  # spread.job_pace: the slowest GPU's pace over the layout's world (set with compute_id)
        self.compute_id: int | None = None  # interned (passes, optimizer steps, pace)
        self.chunk_keys: tuple | None = None  # per stage: step.chunk_shares_key interned (None: every stage one chunk)
        self.chunks_id: int | None = None
        self.layer_key: int | None = None  # compute.layer_forward_key past the model and workload, interned
        # (interned (chunk kinds, MTP blocks), its first stage) per distinct pair: what stage_layers_s reads of a stage
        self.floor_keys: tuple | None = None
        self.scheds: dict = {}  # b -> step.schedule_of (it reads the layout and the micro-batch count)
        # per stage: memory.chunk_activation_key past the model, workload and tokens (b·s/cp), interned
        self.act_keys: tuple | None = None
        self.act_id: int | None = None
        self.s_cp = 0  # the layout's sequence per context-parallel rank: b·s_cp is memory.activation_tokens at b
        self.flights: dict = {}  # b -> (interned id, in-flight micro-batches per chunk per stage)
        self.static: np.ndarray | None = None
        self.bounds: dict = {}  # (b, recompute) -> compute-only lower bound
        self.split: dict | None = None  # Context's _SPLIT properties of its pipeline split


class StepModel:
    def __init__(self, model: ModelSpec, work: WorkloadSpec, cluster: Cluster, headroom: float = 0.0, overlap=None):
        self.model, self.work, self.cluster, self.headroom = model, work, cluster, headroom
        self.overlap = overlap or Overlap()
        self.gpu = cluster.spec.gpu
        self.capacity = (self.gpu.hbm_bytes * (1 - headroom)) if self.gpu else None
        self.last_reason = ""
        self._memos = _memos(model, work, self.gpu)
        self._works = self._memos.works
        self._variants: dict = {}
        self._scheds: dict = {}  # (schedule, pp, chunks per rank, dp, b) -> step.schedule_of (no sends)
        self._statics: dict = {}  # the layout's fields but SP -> memory.held_bytes per stage
        self._parts: dict = {}  # pace -> spread.slowest_part of the GPU at it: one object per pace, made once

    @property
    def timed(self) -> bool:
        return self.gpu is not None

    def _variant(self, par: ParallelSpec) -> _Variant:
        found = self._variants.get(par)
        if found is None:
            if len(self._variants) >= MEMO_KEPT:
                self._variants.clear()
            found = self._variants[par] = _Variant(par)
        return found

    def _work(self, b: int, rc: str) -> WorkloadSpec:
        found = self._works.get((b, rc))
        if found is None:
            found = self._works[(b, rc)] = replace(self.work, micro_batch_size=b, **recompute_fields(rc))
        return found

    def _ctx(self, v: _Variant, b: int, rc: str) -> Context:
        found = v.contexts.get((b, rc))
        if found is None:
            found = Context(self.model, self._work(b, rc), v.par)
            found.__dict__.update(self._split(v))  # what the layer split reads is the same for all of them
            v.contexts[(b, rc)] = found
        return found

    def _split(self, v: _Variant) -> dict:
        """Context's _SPLIT properties of the variant's layout: they read the model and whether it trains (the
        scope's) and the layout's pipeline split (parallel._split_key) only, so variants differing in ZeRO, SP,
        framework or the degrees share them (computed once per split, not once per variant)."""
        if v.split is None:
            memos, key = self._memos, _split_key(v.par)
            v.split = memos.splits.get(key)
            if v.split is None:
                ctx = Context(self.model, self.work, v.par)
                v.split = memos.put(memos.splits, key, {name: getattr(ctx, name) for name in _SPLIT})
        return v.split

    def _schedule(self, v: _Variant, b: int):
        """step.schedule_of without sends, per micro-batch size: it reads the layout's schedule, pp and chunks per
        rank, and ctx.passes (the workload, b and dp), so layouts alike in those (ZeRO, SP, framework,
        ...) share one, and a context is built only for the first of them."""
        found = v.scheds.get(b)
        if found is None:
            par = v.par
            key = (par.pipeline_schedule, par.pp, par.chunks_per_rank, par.dp, b)
            found = self._scheds.get(key)
            if found is None:
                found = _Memos.put(self._scheds, key, schedule_of(self._ctx(v, b, self.work.activation_recompute)))
            v.scheds[b] = found
        return found

    # ---- memory --------------------------------------------------------------------------------------------
    def _static_bytes(self, par: ParallelSpec) -> np.ndarray:
        """memory.held_bytes per stage (weights, gradients, optimizer states, fixed buffers): it reads neither
        the micro-batch size nor recompute, so the layout's own context at the workload's values serves all."""
        v = self._variant(par)
        if v.static is None:
            # nor sequence parallelism: a layout and its SP twin share one array (found by the twin's fields)
            twin = self._statics.get(_without_sp(par))
            if twin is None:
                ctx = self._ctx(v, self.work.micro_batch_size, self.work.activation_recompute)
                # once per class of alike stages (params.alike_stages: the same parameter sizes, names and units but
                # for the layer numbers, which is all held_bytes reads of a stage; rules/data.py prices their
                # buffers once per class likewise)
                twin = np.zeros(par.pp, dtype=np.int64)
                for first, members in _alike(self._memos, ctx).items():
                    twin[list(members)] = held_bytes(ctx, first).total_bytes
                _Memos.put(self._statics, _without_sp(par), twin)
            v.static = twin
        return v.static

    def _activation_bytes(self, par: ParallelSpec, b: int, rc: str) -> np.ndarray:
        return self._acts(self._variant(par), b, rc)

    def _acts(self, v: _Variant, b: int, rc: str) -> np.ndarray:
        """memory.stage_activation_bytes per stage: memory.held_activation_bytes of the stage's
        chunk_activations, memoised on memory.chunk_activation_key: the tokens per rank b·s/cp
        (memory.activation_tokens: it reads b and cp through them alone, so layouts whose b·s/cp agree share
        entries) and entries past the model, workload and tokens that read the layout and the stage's layer
        kinds alone (computed once per layout, shared by stages and pipelines alike); and the micro-batches in
        flight (pipeline.in_flight_chunks), memoised on the schedule (a value)."""
        memos = self._memos
        act_id, s_cp = self._act_id(v)
        flight = self._flight(v, b)
        tokens = (b * s_cp, rc)  # (memory.activation_tokens of the context at b, recompute)
        key = (tokens, act_id, flight[0])
        out = memos.arrays.get(key)
        if out is None:
            sizes = []
            losses = losses_in_flight(self._schedule(v, b))
            for s, (rest, counts) in enumerate(zip(v.act_keys, flight[1], strict=True)):
                parts = memos.acts.get((tokens, rest))
                if parts is None:
                    parts = memos.put(memos.acts, (tokens, rest), chunk_activations(self._ctx(v, b, rc), s))
                sizes.append(min(held_activation_bytes(parts, counts, losses), BEYOND))
            out = memos.put(memos.arrays, key, np.array(sizes, dtype=np.int64))
        return out

    def _act_id(self, v: _Variant) -> tuple[int, int]:
        """The interned memory.chunk_activation_key of every stage (past the model, workload and tokens), and the
        layout's s/cp (Context.s_cp: memory.activation_tokens at b is b·s_cp, training: the search's)."""
        if v.act_id is None:
            ctx = self._ctx(v, self.work.micro_batch_size, self.work.activation_recompute)
            v.s_cp = ctx.s_cp
            intern = self._memos.intern  # small ints in the per-(b, recompute) keys: cheap to hash
            v.act_keys = tuple(intern(("act", chunk_activation_key(ctx, s)[3:])) for s in range(v.par.pp))
            v.act_id = intern(("acts", v.act_keys))
        return v.act_id, v.s_cp

    def _flight(self, v: _Variant, b: int) -> tuple[int, tuple]:
        """(interned id, pipeline.in_flight_chunks per stage) of the variant's schedule at b."""
        flight = v.flights.get(b)
        if flight is None:
            memos, sched = self._memos, self._schedule(v, b)
            found = memos.flights.get(sched)
            if found is None:
                counts = tuple(in_flight_chunks(sched, s) for s in range(v.par.pp))
                held = ("flight", counts, losses_in_flight(sched))  # the logits' count too (memory.py)
                found = memos.put(memos.flights, sched, (memos.intern(held), counts))
            flight = v.flights[b] = found
        return flight

    def _act_matrix(self, v: _Variant, grid: tuple) -> np.ndarray:
        """``_acts`` of every (b, recompute) of ``grid``, one row each, memoised on the activation id, the
        grid (with the layout's s/cp: the tokens) and the in-flight ids at its micro-batch sizes (values): layouts
        differing in ZeRO or framework (neither read by chunk_activation_key or the schedule) share one matrix."""
        memos = self._memos
        flights = _per_batch(grid, lambda b: self._flight(v, b)[0])
        act_id, s_cp = self._act_id(v)
        key = ("matrix", act_id, s_cp, grid, flights)
        found = memos.arrays.get(key)
        if found is None:
            found = memos.put(memos.arrays, key, np.stack([self._acts(v, b, rc) for b, rc in grid]))
        return found

    def fits(self, par: ParallelSpec, b: int, rc: str, rows=None) -> bool:
        """Peak per stage = stage_memory's parts; ``rows`` (needed for MoE only: the all-to-all buffers) are
        the layout's priced rows."""
        if not self.timed:
            return True
        peak = self._static_bytes(par) + self._activation_bytes(par, b, rc)
        if rows is not None:
            for stage, size in comm_buffers(rows).items():
                peak[stage] += min(size, BEYOND)
        worst = int(np.argmax(peak))
        if peak[worst] <= self.capacity:
            return True
        self.last_reason = self._reason(worst, peak[worst])
        return False

    def fits_many(self, par: ParallelSpec, grid) -> np.ndarray:
        """``fits`` for every (b, recompute) of ``grid`` (dense models, no communication buffer): a bool per
        pair; ``last_reason`` names the first that does not fit."""
        if not self.timed:
            return np.ones(len(grid), dtype=bool)
        peak = self._static_bytes(par)[None, :] + self._act_matrix(self._variant(par), grid)
        ok = peak.max(axis=1) <= self.capacity
        if not ok.all():
            i = int(np.argmin(ok))
            stage = int(np.argmax(peak[i]))
            self.last_reason = self._reason(stage, peak[i, stage])
        return ok

    def _reason(self, stage: int, peak: float) -> str:
        need = f"{peak / 1e9:.1f} GB" if peak < BEYOND else f"over {MAX_STAGE_BYTES / 1e9:,.0f} GB"
        return (
            f"stage {stage} needs {need} per device, above {self.capacity / 1e9:.1f} GB "
            f"({self.gpu.hbm_bytes / 1e9:.1f} GB x (1 - headroom {self.headroom:g}))"
        )

    # ---- compute ---------------------------------------------------------------------------------------------
    def _stage_compute(self, par: ParallelSpec, b: int, rc: str) -> list[StageCompute]:
        return self._compute(self._variant(par), b, rc)

    def _compute(self, v: _Variant, b: int, rc: str) -> list[StageCompute]:
        """compute.stage_compute of every stage: its passes (compute.stage_pass_compute) memoised on
        compute.stage_pass_key, its optimizer step (compute.optimizer_s) on compute.optimizer_key (which reads
        neither b nor recompute); both keys' entries past the model and workload read the layout and the stage
        alone, so they are computed once per layout."""
        memos = self._memos
        self._keys(v)
        key = ((b, rc), v.compute_id)
        found = memos.lists.get(key)
        if found is None:
            found = memos.put(memos.lists, key, [self._stage(v, b, rc, s) for s in range(v.par.pp)])
        return found

    def _keys(self, v: _Variant) -> None:
        """The layout's interned pass keys, its distinct ones, and its optimizer steps (once per layout)."""
        memos = self._memos
        if v.compute_id is None:  # on the context held_bytes reads (param_totals is cached on it)
            ctx = self._ctx(v, self.work.micro_batch_size, self.work.activation_recompute)
            # the combined 1F1B pair (step.paired_passes) is part of the passes: the bounds read it as the step does
            self._paired(v)
            v.pass_keys = tuple(memos.intern(("pass", stage_pass_key(ctx, s)[2:], v.paired)) for s in range(v.par.pp))
            v.pace = job_pace(ctx, self.gpu)  # the slowest GPU's pace over the layout's world (planner/spread.py)
            # the passes' id carries the pace: every memo keyed on it (bounds, pipelines, shares) reads paced passes
            v.pass_id = memos.intern(("passes", v.pass_keys, v.pace))
            first: dict = {}
            for s, k in enumerate(v.pass_keys):
                first.setdefault(k, s)
            v.distinct = tuple(first.values())
            optimizer = [0.0] * v.par.pp
            # once per class of alike stages: optimizer_key reads the stage's parameter counts alone (param_totals)
            for first, members in _alike(self._memos, ctx).items():
                key = (optimizer_key(ctx, first), v.pace)  # on the paced part, as step.step_time's
                found = memos.optimizer.get(key)
                if found is None:
                    found = optimizer_s(ctx, first, self._paced(v)) if ctx.training else 0.0
                    memos.put(memos.optimizer, key, found)
                for s in members:
                    optimizer[s] = found
            v.optimizer = tuple(optimizer)
            v.compute_id = memos.intern(("compute", v.pass_id, v.optimizer))

    def _part(self, par: ParallelSpec):
        """The part the layout's kernels are timed on: the slowest of its world (spread.slowest_part at the layout's
        pace), as step.step_time times them."""
        v = self._variant(par)
        self._keys(v)
        return self._paced(v)

    def _paced(self, v: _Variant):
        """spread.slowest_part at the variant's pace, one GPUSpec per pace (not a new copy at every call)."""
        part = self._parts.get(v.pace)
        if part is None:
            part = self._parts[v.pace] = slowest_part(self.gpu, v.pace)
        return part

    def _paired(self, v: _Variant) -> bool:
        """step.paired_passes of the layout under the StepModel's overlap, once per layout (on _keys' context)."""
        if v.paired is None:
            ctx = self._ctx(v, self.work.micro_batch_size, self.work.activation_recompute)
            v.paired = paired_passes(ctx, self.overlap)
        return v.paired

    def _stage(self, v: _Variant, b: int, rc: str, s: int) -> StageCompute:
        """Stage s's compute.stage_compute: its passes memoised on its interned pass key, its optimizer step."""
        memos, rest = self._memos, v.pass_keys[s]
        part = memos.compute.get(((b, rc), rest, v.pace))
        if part is None:  # on the slowest part of the layout's world, as step.step_time (planner/spread.py)
            part = stage_pass_compute(self._ctx(v, b, rc), s, self._paced(v), paired=v.paired)
            memos.put(memos.compute, ((b, rc), rest, v.pace), part)
        # recompute_s (the backward's re-run share, compute.stage_recompute_s) stays 0.0: only the timeline
        # draws it (step._pass_comm_events), which the search never builds; the step time and its bounds do
        # not read it, and the reported layouts are build_plan's own
        return replace(StageCompute(*part, 0.0), optimizer_s=v.optimizer[s])

    # ---- bounds ----------------------------------------------------------------------------------------------
    def _shares(self, v: _Variant, b: int, rc: str) -> tuple | None:
        """step.chunk_shares of every stage (None with one chunk per stage). It reads layer_forward of the
        chunks' layer kinds, the stage's forward seconds and the chunks' kinds and loss: memoised on
        compute.layer_forward_key, that forward (a value) and step.chunk_shares_key (not the chunks' global
        layer indices), so stages, and layouts differing in pp, dp, ZeRO or parameters, share entries."""
        memos = self._memos
        comp = self._compute(v, b, rc)
        if v.chunks_id is None:
            ctx = self._ctx(v, self.work.micro_batch_size, self.work.activation_recompute)
            keys = tuple(chunk_shares_key(ctx, s) for s in range(v.par.pp))
            v.chunk_keys = None if all(k is None for k in keys) else keys
            v.chunks_id = -1 if v.chunk_keys is None else memos.intern(("chunks", keys))
            if v.chunk_keys is not None:
                v.chunk_keys = tuple(memos.intern(("chunk", k)) for k in keys)
            self._layer_id(v)
        if v.chunk_keys is None:
            return None
        key = ((b, rc), v.pass_id, v.chunks_id)
        found = memos.share_lists.get(key)
        if found is None:
            ctx, out = self._ctx(v, b, rc), []
            for s, chunks in enumerate(v.chunk_keys):
                part_key = ((b, rc), v.layer_key, comp[s].forward.total_s, chunks, v.pace)  # shares read the pace
                part = memos.shares.get(part_key)
                if part is None:
                    part = memos.put(memos.shares, part_key, chunk_shares(ctx, StageStep(s, comp[s]), self._paced(v)))
                out.append(part)
            found = memos.put(memos.share_lists, key, tuple(out))
        return found

    def lower_bound(self, par: ParallelSpec, b: int, rc: str) -> float:
        """The pipeline of the compute alone (pipeline.pipeline_time, no sends) plus the slowest optimizer
        step (module docstring); memoised per layout, and the pipeline on (b, recompute, passes id, chunks id,
        schedule), which layouts differing in dp, ZeRO (the optimizer step is added per layout) or framework
        switches share."""
        if not self.timed:
            return 0.0
        v = self._variant(par)
        found = v.bounds.get((b, rc))
        if found is None:
            found = v.bounds[(b, rc)] = self._pipe(v, b, rc) + max(v.optimizer)
        return found

    def _pipe(self, v: _Variant, b: int, rc: str) -> float:
        """pipeline.pipeline_time of step.stage_passes of the compute alone (chunk shares, deferred weight
        gradients), no sends: memoised on (b, recompute, passes id, chunks id, schedule)."""
        key, passes, sched = self._pipe_job(v, b, rc)
        if passes is None:
            return self._memos.bounds[key]
        return self._memos.put(self._memos.bounds, key, pipeline_time(passes, sched).time_s)

    def _pipe_job(self, v: _Variant, b: int, rc: str) -> tuple:
        """(``_pipe``'s memo key, the passes or None where it is memoised, the schedule)."""
        comp = self._compute(v, b, rc)
        shares = self._shares(v, b, rc)
        sched = self._schedule(v, b)
        key = ((b, rc), v.pass_id, v.chunks_id, sched)
        if key in self._memos.bounds:  # the passes do not read the optimizer step: layouts differing in ZeRO share it
            return key, None, sched
        passes = stage_passes(
            self._ctx(v, b, rc), [StageStep(s, c) for s, c in enumerate(comp)], self._paced(v), shares
        )
        return key, passes, sched

    def _layer_id(self, v: _Variant) -> int:
        """The variant's interned compute.layer_forward_key past the model and workload (what a layer's kernels read
        of the layout: at (b, recompute), with the scope's model and workload, the whole key)."""
        if v.layer_key is None:
            ctx = self._ctx(v, self.work.micro_batch_size, self.work.activation_recompute)
            v.layer_key = self._memos.intern(("layer", layer_forward_key(ctx)[2:]))
        return v.layer_key

    def layer_floors(self, par: ParallelSpec, grid) -> np.ndarray:
        """For every (b, recompute) of ``grid`` a bound no larger than ``busiest_bounds`` and cheaper still: m times
        the slowest stage's decoder layers alone (compute.stage_layers_s: no embedding, head, final norm, MTP
        module) plus the slowest optimizer step, shaved by FLOOR_SHAVE for the sums' order. It reads the layer's
        kernels' key, each stage's chunk kinds and MTP blocks and the micro-batch count, not the memory nor the
        stage's roles, so the search asks it before the memory screen (docs/search.md, speed11). Zeros where the
        passes run as the combined 1F1B pair (its delta may be negative: no bound) or without a GPU."""
        v = self._variant(par)
        if not self.timed or self._paired(v):
            return np.zeros(len(grid))
        self._keys(v)  # the layout's optimizer steps
        return self._layers_floor(v, grid) + max(v.optimizer)

    def floors_within(self, par: ParallelSpec, grid, threshold: float) -> list[bool]:
        """Whether each pair's ``layer_floors`` is within ``threshold``, the same answers. The optimizer step adds a
        non-negative term (a rounded sum of non-negatives is never below either), so a pair whose layers alone are
        above the threshold is above it with the step too: where every pair's are, the layout's optimizer steps
        and pass keys (``_keys``: its parameter counts per stage) are never computed (docs/search.md, speed11b)."""
        v = self._variant(par)
        if not self.timed or self._paired(v):
            return [threshold >= 0.0] * len(grid)  # the zeros layer_floors gives them
        layers = self._layers_floor(v, grid)
        if not (layers <= threshold).any():
            return [False] * len(grid)
        self._keys(v)
        return (layers + max(v.optimizer) <= threshold).tolist()

    def _layers_floor(self, v: _Variant, grid) -> np.ndarray:
        """``layer_floors`` without the optimizer step: m x the slowest stage's decoder layers x FLOOR_SHAVE per pair,
        memoised as one array on (layer key, the stages' interned chunk kinds, grid, micro-batch counts); timed
        layouts whose passes are not paired (the callers' zeros otherwise)."""
        memos = self._memos
        layer_id = self._layer_id(v)
        if v.floor_keys is None:  # one stage per distinct (chunk kinds, MTP blocks): all stage_layers_s reads of it
            split, first = self._split(v), {}
            for s, kinds in enumerate(zip(split["chunk_kinds"], split["chunk_mtp"], strict=True)):
                first.setdefault(memos.intern(("floor", kinds)), s)
            v.floor_keys = tuple(first.items())
        counts = _per_batch(grid, lambda b: self._schedule(v, b).microbatches)
        key = ("floors", layer_id, tuple(k for k, _ in v.floor_keys), grid, counts)
        floors = memos.arrays.get(key)
        if floors is None:
            out = []
            for b, rc in grid:

                def layer(moe: bool, plan, b=b, rc=rc) -> float:  # compute.layer_s, memoised
                    found = memos.per_layer.get(((b, rc), layer_id, moe, plan))
                    if found is None:
                        found = layer_s(self._ctx(v, b, rc), moe, plan, self.gpu)
                        memos.put(memos.per_layer, ((b, rc), layer_id, moe, plan), found)
                    return found

                worst = max(layers_s(self._layer_counts(v, b, rc, k, s), layer) for k, s in v.floor_keys)
                out.append(self._schedule(v, b).passes * worst * FLOOR_SHAVE)  # DualPipe: m / 2 of both stages
            floors = memos.put(memos.arrays, key, np.array(out, dtype=np.float64))
        return floors

    def _layer_counts(self, v: _Variant, b: int, rc: str, k: int, s: int) -> dict:
        """recompute.layer_counts(ctx, s, "decoder") (what compute.stage_layers_s sums) memoised on (recompute, the
        stage's interned chunk kinds and MTP blocks): all it reads (the workload's recompute, not b)."""
        memos = self._memos
        found = memos.layers.get((rc, k))
        if found is None:
            found = memos.put(memos.layers, (rc, k), layer_counts(self._ctx(v, b, rc), s, "decoder"))
        return found

    def busiest_bounds(self, par: ParallelSpec, grid) -> np.ndarray:
        """For every (b, recompute) of ``grid`` a bound no larger than ``lower_bound`` and cheaper (no chunk
        shares, no bubble): pipeline.busiest_rank_s of the compute alone plus the slowest optimizer step,
        memoised on (b, recompute, passes id, micro-batch count)."""
        if not self.timed:
            return np.zeros(len(grid))
        v, memos = self._variant(par), self._memos
        self._keys(v)  # the layout's passes id and optimizer steps
        counts = _per_batch(grid, lambda b: self._schedule(v, b).microbatches)
        # the whole grid's bounds as one array, on the values every entry's key reads (layouts differing in ZeRO,
        # dp at equal m, or framework switches share it)
        array_key = ("busiest", v.pass_id, grid, counts)
        bounds = memos.arrays.get(array_key)
        if bounds is None:
            out = []
            for b, rc in grid:
                m = self._schedule(v, b).microbatches
                key = ("busiest", b, rc, v.pass_id, m)
                found = memos.bounds.get(key)
                if found is None:  # the stages' compute only here (a hit needs none of it)
                    # one stage per distinct pass key: a stage's pass reads its passes alone (no shares, no
                    # optimizer step), so alike stages give equal passes and the slowest is among these
                    stages = [StageStep(s, self._stage(v, b, rc, s)) for s in v.distinct]
                    passes = stage_passes(self._ctx(v, b, rc), stages, self._paced(v), (None,) * v.par.pp)  # no shares
                    found = memos.put(memos.bounds, key, busiest_rank_s(passes, self._schedule(v, b)))
                out.append(found)
            bounds = memos.put(memos.arrays, array_key, np.array(out, dtype=np.float64))
        return bounds + max(v.optimizer)

    def lower_bounds(self, par: ParallelSpec, grid) -> np.ndarray:
        """``lower_bound`` for every (b, recompute) of ``grid``: the pipelines of the compute alone memoised as
        one array on (passes id, chunks id, grid, schedules), which layouts differing in ZeRO share, plus the
        layout's slowest optimizer step."""
        if not self.timed:
            return np.zeros(len(grid))
        v, memos = self._variant(par), self._memos
        self._compute(v, *grid[0])  # the layout's passes and optimizer ids
        self._shares(v, *grid[0])  # and its chunks id
        scheds = _per_batch(grid, lambda b: self._schedule(v, b))
        key = ("bounds", v.pass_id, v.chunks_id, grid, scheds)
        pipes = memos.arrays.get(key)
        if pipes is None:
            pipes = memos.put(memos.arrays, key, np.array([self._pipe(v, b, rc) for b, rc in grid], dtype=np.float64))
        return pipes + max(v.optimizer)

    @staticmethod
    def orders_possible(par: ParallelSpec) -> bool:
        """Whether a layout's pipeline may be priced by its schedule's order (``ScheduleTraits.orders_at``, as
        pipeline.by_order asks first): only those gain from running orders together (lower_bounds_many,
        warm_paths); the others keep the closed forms' memos, at no extra work (the README's searches: 1F1B and
        the interleaved schedule)."""
        return schedule_traits(par.pipeline_schedule).orders_at(par.pp)

    def lower_bounds_many(self, requests: list[tuple[ParallelSpec, tuple]]) -> list[np.ndarray]:
        """``lower_bounds`` of each (layout, grid), the same values: the pipelines not yet memoised are priced
        first, the orders they run (pipeline.by_order) as one pipeline_jitter.order_spans call, which runs the
        pending passes of one order structure as the columns of one sweep (mend12a, review r12a #2: one Python loop
        a layout made a V-schedule search 5-16x slower)."""
        if self.timed:
            jobs = []
            for par, grid in requests:
                if not self.orders_possible(par):
                    continue  # closed forms only: lower_bounds' own array memo, shared across ZeRO stages
                v = self._variant(par)
                jobs += [job for job in (self._pipe_job(v, b, rc) for b, rc in grid) if job[1] is not None]
            order_spans((passes, sched) for _, passes, sched in jobs if by_order(passes, sched))
            for key, passes, sched in jobs:
                if key not in self._memos.bounds:
                    self._memos.put(self._memos.bounds, key, pipeline_time(passes, sched).time_s)
        return [self.lower_bounds(par, grid) for par, grid in requests]

    def refined_bound(self, par: ParallelSpec, b: int, rc: str, data: Part) -> float:
        """A lower bound of ``step_time`` from the data-parallel template's priced calls alone (``data``),
        tighter than ``lower_bound`` wherever the framework does not overlap them: step.critical_path with
        ``bound`` (the activation calls, left out, only lengthen the path); tests/planner/test_search.py
        checks bound <= step time over many layouts."""
        if not self.timed:
            return 0.0
        ctx, stages, sched, flags, shares = self._refined_path(par, b, rc, data)
        return critical_path(ctx, stages, sched, self._part(par), flags, bound=True, shares=shares).time_s

    def _refined_path(self, par: ParallelSpec, b: int, rc: str, data: Part) -> tuple:
        """``refined_bound``'s critical_path arguments (context, stages, schedule, overlap, shares)."""
        v = self._variant(par)
        ctx = self._ctx(v, b, rc)
        flags = self.overlap.resolved(ctx)
        stages = [StageStep(s, c) for s, c in enumerate(self._compute(v, b, rc))]
        assign_streams(ctx, data.totals(ctx.passes, par.zero_stage, par.pp), stages, flags)
        return ctx, stages, self._schedule(v, b), flags, self._shares(v, b, rc)

    def _floor_path(self, par: ParallelSpec, b: int, data: Part) -> tuple:
        """``data_floor``'s critical_path arguments (context, stages, schedule, overlap, shares)."""
        v = self._variant(par)
        ctx = self._ctx(v, b, "none")
        flags = self.overlap.resolved(ctx)
        opt = [c.optimizer_s for c in self._compute(v, b, "none")]
        stages = [StageStep(s, StageCompute(PassTime(), PassTime(), 0.0, o)) for s, o in enumerate(opt)]
        assign_streams(ctx, data.totals(ctx.passes, par.zero_stage, par.pp), stages, flags)
        shares = self._shares(v, b, "none")  # passes of no time: any shares give fill = drain = 0.0
        return ctx, stages, self._schedule(v, b), flags, shares

    def warm_paths(self, wanted: list[tuple[ParallelSpec, int, str | None, Part]]) -> None:
        """Run the orders of many (layout, b, recompute, data part)'s ``refined_bound`` (``data_floor``'s where
        the recompute is None) together before they are asked for, the same values: their passes' orders
        (pipeline.by_order) go to one pipeline_jitter.order_spans call, which fills order_span's memo with the
        passes of one order structure as the columns of one sweep (mend12a, review r12a #2)."""
        if not self.timed:
            return
        jobs = []
        for par, b, rc, data in wanted:
            if not self.orders_possible(par):
                continue
            ctx, stages, sched, _, shares = (
                self._floor_path(par, b, data) if rc is None else self._refined_path(par, b, rc, data)
            )
            passes = stage_passes(ctx, stages, self._part(par), shares)
            if by_order(passes, sched):
                jobs.append((passes, sched))
        order_spans(jobs)

    def data_floor(self, par: ParallelSpec, b: int, data: Part) -> float:
        """What the data-parallel calls (``data``) add to the compute-only ``lower_bound`` of any layout of the
        variant with b's micro-batch count: step.critical_path(bound=True) of passes of no time, of which
        stage 0's exposed gradient reduction and tail (it drains last: lead 0) and the slowest stage's
        optimizer step with its exposed parameter gather, less the slowest optimizer step. At most
        ``refined_bound`` minus ``lower_bound``."""
        if not self.timed:
            return 0.0
        ctx, stages, sched, flags, shares = self._floor_path(par, b, data)
        path = critical_path(ctx, stages, sched, self._part(par), flags, bound=True, shares=shares)
        opt = [st.compute.optimizer_s for st in stages]
        # never below 0 (communication only adds): time - sync rounds the optimizer step by an ulp
        return max(0.0, path.exposed_dp_s[0] + stages[0].tail_s + (path.time_s - path.sync_s) - max(opt))

    # ---- step time -------------------------------------------------------------------------------------------
    def step_time(self, par: ParallelSpec, b: int, rc: str, parts: list[Part]) -> float:
        """step.step_time's training time (no breakdown, timeline or MFU): the memoised compute, the parts'
        stream totals placed on the stages (assign_streams), and critical_path."""
        if not self.timed:
            return float(sum(part.per_stage(par.pp) for part in parts).max())
        v = self._variant(par)
        ctx = self._ctx(v, b, rc)
        flags = self.overlap.resolved(ctx)
        stages = [StageStep(s, c) for s, c in enumerate(self._compute(v, b, rc))]
        m, zero = ctx.passes, par.zero_stage
        totals = parts[0].totals(m, zero, par.pp)
        for part in parts[1:]:
            totals = totals + part.totals(m, zero, par.pp)
        assign_streams(ctx, totals, stages, flags, self._paced(v))
        sched = schedule_for(ctx, totals, bool(flags.overlap_p2p))
        return critical_path(ctx, stages, sched, self._paced(v), flags, shares=self._shares(v, b, rc)).time_s


# layer_floors' shave: stage_layers_s sums the layers' totals, the pass their PassTimes' parts (another order of
# the same non-negative terms, a few ulps apart); 1e-9 relative keeps the floor below the pass in floating point
FLOOR_SHAVE = 1.0 - 1e-9
_SP_FREE = tuple(f.name for f in fields(ParallelSpec) if f.name != "sequence_parallel")


def _without_sp(par: ParallelSpec) -> tuple:
    """The layout's fields but sequence parallelism, as a key (memory.held_bytes does not read it)."""
    return tuple(getattr(par, name) for name in _SP_FREE)


def _per_batch(grid, fn) -> tuple:
    """``fn(b)`` once per run of equal micro-batch sizes b in ``grid`` ((b, recompute) pairs, b in runs), in order:
    the part of a grid-wide memo key that depends on b alone."""
    out, last = [], None
    for b, _ in grid:
        if b != last:
            out.append(fn(b))
            last = b
    return tuple(out)


__all__ = ["Part", "Priced", "Row", "StepModel"]
