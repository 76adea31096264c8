"""Adapter between the search and the step-time and memory models (planner/step.py, memory.py, compute.py).

The same functions ``build_plan`` calls, composed as ``step_time`` and ``memory`` compose them, with the
parts memoised on what they depend on, so that layouts which differ only in ZeRO stage, framework or
recompute share them. planner/compute.py and memory.py cache their per-stage parts on the whole Context
(every layout is a new key), and ``stage_compute`` and ``stage_memory`` recount each stage's parameters
inside; so the two thin assemblies (``_passes``: _stage_compute's forward/backward sums; ``_static``:
stage_memory's weight/gradient/optimizer/buffer sums; ``_optimizer``: optimizer_s) are restated here over
``param_totals`` of a canonical context, and tests/planner/test_search.py checks them equal to
``stage_compute`` and ``memory`` on layouts of every framework, ZeRO stage, recompute and MoE:

- per-stage compute (``stage_compute``: forward and backward of one micro-batch) does not read the ZeRO
  stage: keyed on the layout with zero_stage 0;
- the optimizer step (``optimizer_s``) and parameters, gradients and optimizer states (``stage_memory``)
  read neither micro-batch size, recompute nor sequence parallelism: keyed on the layout with those at
  their defaults;
- activations (``stage_activation_bytes``) do not read the ZeRO stage.

A lower bound prunes without changing the answer (branch and bound): ``_training`` in step.py takes
time = max over stages of (sync + optimizer + exposed gather) with sync >= stage 0's end >= the pipeline's
critical path, which only grows with the communication added to each pass; so the pipeline of the compute
alone (no sends, no exposed communication) plus the smallest optimizer step bounds the step time from
below. A layout whose bound is already slower than the k-th best so far cannot enter the top k and is not
timed further (counted as ``bounded``). Before timing, ``data_floor`` and ``refined_bound`` add the
variant's data-parallel calls to that path (docs/search.md, Branch and bound). tests/planner/test_search.py
checks screen == build_plan and bound <= step time.

The search re-evaluates its best layouts with ``build_plan`` itself, so the step and memory blocks it
answers are exactly /v1/plan's. Without a GPU spec there is no step time or memory: the screen ranks by the
communication of the busiest stage (``Plan.totals.time_s``) and every layout fits.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

import numpy as np

from collectives.topology import Cluster

from ..compute import (
    ADAM_BYTES,
    EFFICIENCY,
    PassTime,
    StageCompute,
    _head,
    head_backward,
    layer_backward,
    layer_forward,
    stage_compute,
)
from ..context import Context
from ..ledger import Call
from ..memory import (
    ADAM_STATE_BYTES,
    MASTER_BYTES,
    WORKSPACE_BYTES,
    ZERO3_UNITS_IN_FLIGHT,
    _comm_buffers,
    _shards,
    param_totals,
    stage_activation_bytes,
    stage_memory,
)
from ..model import ModelSpec
from ..parallel import ParallelSpec
from ..pipeline import Schedule, StagePass, in_flight, pipeline_time
from ..step import (
    Overlap,
    StageStep,
    _assign_calls,
    _drain_leads,
    _prefetch,
    _stream,
    _training,
    exposed_grad_reduce,
    exposed_param_gather,
    memory,
    schedule_of,
)
from ..workload import WorkloadSpec


class SplitContext(Context):
    """A Context whose per-stage dense and MoE layer counts come from a table shared by every layout with the
    same stage split (Context recounts them layer by layer on every call); same values, computed by
    Context.moe_layers once per split (dense = the stage's layers - MoE, as Context.dense_layers)."""

    def _split(self) -> list[tuple[int, int]]:
        mine = self.__dict__.get("_counts")
        if mine is not None:
            return mine
        par = self.par
        key = (id(self.model), par.pp, par.chunks_per_rank, par.first_stage_layers, par.last_stage_layers)
        found = _SPLITS.get(key)
        if found is None:
            moe = [Context.moe_layers(self, s) for s in range(par.pp)]
            counts = [(len(self.stage_layers[s]) - moe[s], moe[s]) for s in range(par.pp)]
            found = _SPLITS[key] = (self.model, counts)  # holding the model keeps its id from being reused
        self.__dict__["_counts"] = found[1]
        return found[1]

    def __hash__(self) -> int:
        """The dataclass hash, computed once: it walks the model, workload and layout specs, and
        compute.py's and memory.py's caches hash the context on every call."""
        found = self.__dict__.get("_hash")
        if found is None:
            found = self.__dict__["_hash"] = super().__hash__()
        return found

    def dense_layers(self, stage: int) -> int:
        return self._split()[stage][0]

    def moe_layers(self, stage: int) -> int:
        return self._split()[stage][1]


_SPLITS: dict = {}
# Per-stage parts shared across shapes and variants, keyed on what the step and memory functions read
# (``_passes``, ``_activation_bytes``); the layout part of a key is interned to a small int first, so that a
# stage's lookup hashes an int and not the workload.
_STAGE_PASSES: dict = {}  # (layer key, dense layers, MoE layers, last stage) -> (forward, backward, attention)
_LAYERS: dict = {}  # (layer key, MoE) -> (layer forward, attention forward, layer backward)
_STAGE_ACTS: dict = {}  # (layer key, dense layers, MoE layers, last stage, in flight) -> activation bytes
_INTERNED: dict = {}  # layer key -> (int, the objects whose ids it holds, kept alive with it)
_SERIAL = itertools.count()
INTERNED_KEPT = 16384  # layer keys (model, workload, tp, cp, SP, ...); the memos above go with them


def _interned(key: tuple, *held) -> int:
    found = _INTERNED.get(key)
    if found is None:
        if len(_INTERNED) >= INTERNED_KEPT:
            for memo in (_INTERNED, _STAGE_PASSES, _LAYERS, _STAGE_ACTS):
                memo.clear()
        found = _INTERNED[key] = (next(_SERIAL), held)
    return found[0]


_TOTALS: dict = {}
TOTALS_KEPT = 4096  # (model, tp, pp, virtual stages, framework, ...) entries of a few numbers per stage
REL_TOLERANCE = 1e-9  # the restated sums add the same terms in another order: rounding only


@dataclass(frozen=True)
class Priced:
    """What step_time reads of a PricedCall: the call, and the time of one call."""

    time_s: float


class RowCall:
    """The fields of a ledger Call that step.py and memory.py read, at one layout's b and m (a plain
    slotted object: built thousands of times a second, where dataclasses.replace would dominate)."""

    __slots__ = ("calls_per_iteration", "message_bytes", "name", "op", "parallelism", "phase", "stages")

    @classmethod
    def of(cls, call: Call, stages: tuple[int, ...], message_bytes: int, count: int) -> RowCall:
        row = cls()
        row.name, row.parallelism, row.op, row.phase = call.name, call.parallelism, call.op, call.phase
        row.stages, row.message_bytes, row.calls_per_iteration = stages, message_bytes, count
        return row


@dataclass(frozen=True)
class Row:
    call: RowCall
    price: Priced


class StepModel:
    def __init__(self, model: ModelSpec, work: WorkloadSpec, cluster: Cluster, headroom: float = 0.0, overlap=None):
        self.model, self.work, self.cluster, self.headroom = model, work, cluster, headroom
        self.overlap = overlap or Overlap()
        self.gpu = cluster.spec.gpu
        self.capacity = (self.gpu.hbm_bytes * (1 - headroom)) if self.gpu else None
        self.last_reason = ""
        self._compute: dict = {}
        self._optimizer_memo: dict = {}
        self.checked = False  # the restated compute checked against compute.stage_compute once per shape
        self.exact_only = False
        self.memory_checked = False
        self.memory_exact = False
        self.path_checked = False  # the restated critical path checked against step._training once per shape
        self.path_exact = False
        self._sum_memo: dict = {}
        self._works: dict = {}
        self._reads_zero: dict = {}
        self._static: dict = {}
        self._acts: dict = {}

    @property
    def timed(self) -> bool:
        return self.gpu is not None

    @staticmethod
    def _key(par: ParallelSpec, zero: bool = True, sp: bool = True, framework: bool = True) -> tuple:
        """A memo key of the layout's degrees, leaving out what a part ignores: the ZeRO stage, SP, or the
        framework (memory.py's activations never read it; parameter counts and compute's kernels do)."""
        return (
            par.tp, par.cp, par.pp, par.dp, par.ep, par.etp, par.virtual_pipeline_stages,
            par.pipeline_schedule, par.framework if framework else None, par.first_stage_layers, par.last_stage_layers,
            par.zero_stage if zero else 0, par.sequence_parallel if sp else False,
        )  # fmt: skip

    def _work(self, b: int, rc: str) -> WorkloadSpec:
        found = self._works.get((b, rc))
        if found is None:
            found = self._works[(b, rc)] = replace(self.work, micro_batch_size=b, activation_recompute=rc)
        return found

    # ---- parameters ------------------------------------------------------------------------------------
    def _params_ctx(self, par: ParallelSpec) -> Context:
        """A context with the fields parameter counts read (tp, pp, virtual stages, uneven ends, framework,
        dp/cp only for sharding): b, recompute, SP and ZeRO at their defaults, so param_totals' cache hits."""
        return SplitContext(self.model, self._work(1, "none"), replace(par, zero_stage=0, sequence_parallel=False))

    def _totals(self, par: ParallelSpec) -> list[tuple[int, int, int]]:
        """memory.param_totals per stage: (dense, expert, largest ZeRO-3 unit) parameters of one rank.
        They read the model, tp, ep, expert tp, the framework and the stage split only (params.py), so the
        memo is shared by every shape and variant with those (param_totals caches on the whole Context)."""
        key = (
            id(self.model), par.tp, par.pp, par.ep, par.etp, par.virtual_pipeline_stages,
            par.pipeline_schedule, par.framework, par.first_stage_layers, par.last_stage_layers,
        )  # fmt: skip
        found = _TOTALS.get(key)
        if found is None:
            pctx = self._params_ctx(par)
            found = _TOTALS[key] = (self.model, [param_totals(pctx, stage) for stage in range(par.pp)])
            if len(_TOTALS) > TOTALS_KEPT:
                _TOTALS.pop(next(iter(_TOTALS)))
        return found[1]  # holding the model keeps its id from being reused

    def _static_bytes(self, par: ParallelSpec) -> np.ndarray:
        """Per stage: parameters + gradients + optimizer states + fixed buffers, as stage_memory sums them
        (memory.py: x_param, grad bytes, 12 B/param Adam + master, sharded by ZeRO stage; workspace and the
        ZeRO-3 units in flight)."""
        key = self._key(par, sp=False)
        found = self._static.get(key)
        if found is None:
            ctx = SplitContext(self.model, self._work(1, "none"), replace(par, sequence_parallel=False))
            xp, z = ctx.param_bytes, par.zero_stage
            out = []
            for nd, ne, unit in self._totals(par):
                total = 0.0
                params = grads = opt = 0.0
                for count, is_expert in ((nd, False), (ne, True)):
                    if not count:
                        continue
                    shards = _shards(ctx, is_expert)
                    params += count * xp / (shards if z >= 3 else 1)
                    grads += count * ctx.grad_bytes / (shards if z >= 2 else 1)
                    opt += count * (ADAM_STATE_BYTES + (MASTER_BYTES if xp < 4 else 0)) / (shards if z >= 1 else 1)
                buffers = WORKSPACE_BYTES + (ZERO3_UNITS_IN_FLIGHT * unit * xp if z >= 3 else 0)
                total = int(params) + int(grads) + int(opt) + int(buffers)
                out.append(total)
            if not self.memory_checked:  # the restated sum must equal memory.stage_memory's parts
                self.memory_checked = True
                sched = schedule_of(ctx)
                parts = [stage_memory(ctx, st, sched, comm_buffer=0) for st in range(par.pp)]
                exact = [p.params_bytes + p.grads_bytes + p.optimizer_bytes + p.buffers_bytes for p in parts]
                self.memory_exact = exact != out  # drifted: screen with memory.memory itself (slower, exact)
            found = self._static[key] = np.array(out, dtype=np.int64)
        return found

    def _activation_bytes(self, par: ParallelSpec, b: int, rc: str) -> np.ndarray:
        key = (self._key(par, zero=False, framework=False), b, rc)
        found = self._acts.get(key)
        if found is None:
            ctx = SplitContext(self.model, self._work(b, rc), replace(par, zero_stage=0))
            sched = schedule_of(ctx)
            # what memory.stage_activation_bytes reads (b·s/cp tokens, tp, SP, the workload and the model;
            # of the stage: its layers, whether it holds the head, and its micro-batches in flight), so
            # stages and variants that agree on those share one call
            layer_key = _interned((id(self.model), ctx.work, par.tp, par.cp, par.sp), self.model)
            out = []
            for s in range(par.pp):
                stage_key = (layer_key, ctx.dense_layers(s), ctx.moe_layers(s), ctx.is_last(s), in_flight(sched, s))
                size = _STAGE_ACTS.get(stage_key)
                if size is None:
                    size = _STAGE_ACTS[stage_key] = stage_activation_bytes(ctx, s, sched)
                out.append(size)
            found = self._acts[key] = np.array(out, dtype=np.int64)
        return found

    def fits(self, par: ParallelSpec, b: int, rc: str, rows=None) -> bool:
        """Peak per stage = stage_memory's five parts; ``rows`` (needed for MoE only: the all-to-all
        buffers) are the layout's priced rows."""
        if not self.timed:
            return True
        peak = self._static_bytes(par) + self._activation_bytes(par, b, rc)
        if rows is not None:
            for stage, size in _comm_buffers(rows).items():
                peak[stage] += size
        if self.memory_exact:
            ctx = SplitContext(self.model, self._work(b, rc), par)
            peak = np.array([st.peak_bytes for st in memory(ctx, self.gpu, rows or ()).per_stage])
        worst = int(np.argmax(peak))
        if peak[worst] <= self.capacity:
            return True
        self.last_reason = self._reason(worst, peak[worst])
        return False

    # ---- step time ---------------------------------------------------------------------------------------
    def _passes(self, par: ParallelSpec, b: int, rc: str) -> list[tuple[PassTime, PassTime, float]]:
        """(forward, backward, core-attention forward) per stage, as compute._stage_compute sums them."""
        key = (self._key(par, zero=False), par.cp_comm, b, rc)
        found = self._compute.get(key)
        if found is None:
            ctx = SplitContext(self.model, self._work(b, rc), replace(par, zero_stage=0))
            # what compute.py's layer_forward, layer_backward and _head read of the layout (b·s/cp tokens,
            # tp, SP, the expert split, CP's exchange, and the framework: its fusion and default attention kernel,
            # planner/kernels.py) with b, recompute and the workload: not pp, dp, v or the schedule
            layer_key = _interned(
                (
                    id(self.model),
                    id(self.gpu),
                    ctx.work,
                    par.tp,
                    par.cp,
                    par.sp,
                    par.ep,
                    par.etp,
                    rc,
                    par.framework,
                    par.cp_comm,
                ),
                self.model,
                self.gpu,
            )
            found = []
            for stage in range(par.pp):
                dense, moe, last = ctx.dense_layers(stage), ctx.moe_layers(stage), ctx.is_last(stage)
                part = _STAGE_PASSES.get((layer_key, dense, moe, last))
                if part is None:
                    part = self._stage_passes(ctx, layer_key, dense, moe, last, rc)
                found.append(part)
            self._compute[key] = found
        return found

    def _stage_passes(self, ctx: Context, layer_key: int, dense: int, moe: int, last: bool, rc: str):
        """One stage of ``_passes``: its dense and MoE layers' passes scaled and summed, then the head, in
        compute._stage_compute's order (so the sums round alike); memoised across shapes and variants on
        what it reads (stages with the same layers, at any pp, dp or schedule, share it)."""
        eff = EFFICIENCY
        fwd, bwd, attn = PassTime(), PassTime(), 0.0
        for is_moe, count in ((False, dense), (True, moe)):
            if not count:
                continue
            layer, attn_s, back = self._layer(ctx, layer_key, is_moe, rc)
            fwd = fwd + layer.scaled(count)
            attn += attn_s * count
            bwd = bwd + back.scaled(count)
        if last:
            head = _head(ctx, self.gpu, eff)
            fwd = fwd + head
            bwd = bwd + head_backward(head)
        part = (fwd, bwd, attn)
        _STAGE_PASSES[(layer_key, dense, moe, last)] = part
        return part

    def _layer(self, ctx: Context, layer_key: int, moe: bool, rc: str) -> tuple[PassTime, float, PassTime]:
        """compute.layer_forward and layer_backward of one layer, memoised on ``layer_key``."""
        found = _LAYERS.get((layer_key, moe))
        if found is None:
            layer, attn_s = layer_forward(ctx, moe, self.gpu, EFFICIENCY)
            back = layer_backward(ctx, layer, self.gpu, EFFICIENCY, rc)
            found = _LAYERS[(layer_key, moe)] = (layer, attn_s, back)
        return found

    def _optimizer(self, par: ParallelSpec) -> list[float]:
        """compute.optimizer_s per stage: Adam's ADAM_BYTES per parameter the rank updates, at HBM speed."""
        key = self._key(par, sp=False)
        found = self._optimizer_memo.get(key)
        if found is None:
            found = []
            for dense, expert, _ in self._totals(par):
                shard_dense = par.dp * par.cp if par.zero_stage >= 1 else 1
                shard_expert = par.expert_dp if par.zero_stage >= 1 else 1
                local = dense / shard_dense + expert / shard_expert
                found.append(local * ADAM_BYTES / (self.gpu.hbm_GBps * 1e9 * EFFICIENCY.hbm))
            self._optimizer_memo[key] = found
        return found

    def _stage_compute(self, par: ParallelSpec, b: int, rc: str) -> list[StageCompute]:
        if self.exact_only:
            ctx = SplitContext(self.model, self._work(b, rc), par)
            return [stage_compute(ctx, s, self.gpu) for s in range(par.pp)]
        out = [
            StageCompute(f, bw, a, o)
            for (f, bw, a), o in zip(self._passes(par, b, rc), self._optimizer(par), strict=True)
        ]
        if not self.checked:  # the restated assembly must equal compute.py's, or the exact path is used
            self.checked = True
            ctx = SplitContext(self.model, self._work(b, rc), par)
            exact = [stage_compute(ctx, s, self.gpu) for s in range(par.pp)]
            if not all(_close(a, e) for a, e in zip(out, exact, strict=True)):
                self.exact_only = True
                return self._stage_compute(par, b, rc)
        return out

    def lower_bound(self, par: ParallelSpec, b: int, rc: str) -> float:
        """The pipeline of the compute alone plus the slowest optimizer step (module docstring): step._training
        takes max over stages of (sync + optimizer + gather) with sync >= that pipeline."""
        if not self.timed:
            return 0.0
        comp = self._stage_compute(par, b, rc)
        m = self.work.global_batch_size // (b * par.dp)
        passes = [StagePass(c.forward.total_s, c.backward.total_s) for c in comp]
        sched = Schedule(par.pipeline_schedule, par.pp, m, par.chunks_per_rank, 0.0, True)
        return pipeline_time(passes, sched).time_s + max(c.optimizer_s for c in comp)

    # ---- many layouts of one variant at once -------------------------------------------------------------
    def peaks(self, par: ParallelSpec, grid: tuple[tuple[int, str], ...]) -> np.ndarray:
        """(layouts x stages) peak bytes of the (b, recompute) pairs of ``grid`` without communication
        buffers (dense models): ``fits``'s sum, one array operation per variant."""
        return self._static_bytes(par)[None, :] + self._grid_acts(par, grid)

    def _grid_acts(self, par: ParallelSpec, grid) -> np.ndarray:
        key = (self._key(par, zero=False, framework=False), grid)
        found = self._acts.get(key)
        if found is None:
            found = self._acts[key] = np.stack([self._activation_bytes(par, b, rc) for b, rc in grid])
        return found

    def fits_many(self, par: ParallelSpec, grid) -> np.ndarray:
        """``fits`` for every (b, recompute) of ``grid`` (dense models, no communication buffer): a bool per
        pair; ``last_reason`` names the first that does not fit."""
        if not self.timed:
            return np.ones(len(grid), dtype=bool)
        if self.memory_exact:  # the restated sum drifted from memory.py: layout by layout, exactly
            return np.array([self.fits(par, b, rc) for b, rc in grid], dtype=bool)
        peak = self.peaks(par, grid)
        worst = peak.max(axis=1)
        ok = worst <= self.capacity
        if not ok.all():
            i = int(np.argmin(ok))
            stage = int(np.argmax(peak[i]))
            self.last_reason = self._reason(stage, peak[i, stage])
        return ok

    def _reason(self, stage: int, peak: float) -> str:
        return (
            f"stage {stage} needs {peak / 1e9:.1f} GB per device, above {self.capacity / 1e9:.1f} GB "
            f"({self.gpu.hbm_bytes / 1e9:.1f} GB x (1 - headroom {self.headroom:g}))"
        )

    def lower_bounds(self, par: ParallelSpec, grid) -> np.ndarray:
        """``lower_bound`` for every (b, recompute) of ``grid``: pipeline_time's closed form (p2p 0) over a
        (layouts x stages) array of pass times, plus the slowest optimizer step of the variant."""
        if not self.timed:
            return np.zeros(len(grid))
        totals, micro = self._grid_passes(par, grid)
        t_max = totals.max(axis=1)
        pipe = micro * t_max + (totals.sum(axis=1) - t_max) / max(1, par.chunks_per_rank)
        return pipe + max(self._optimizer(par))

    def _grid_passes(self, par: ParallelSpec, grid):
        key = ("passes", self._key(par, zero=False), par.cp_comm, grid)
        found = self._compute.get(key)
        if found is None:
            comp = [self._stage_compute(par, b, rc) for b, rc in grid]
            totals = np.array([[c.forward.total_s + c.backward.total_s for c in stages] for stages in comp])
            micro = np.array([self.work.global_batch_size // (b * par.dp) for b, _ in grid], dtype=np.float64)
            found = self._compute[key] = (totals, micro)
        return found

    def step_time(self, par: ParallelSpec, b: int, rc: str, parts) -> float:
        """step.step_time, composed as it composes it, on memoised compute and stream sums (no timeline,
        no MFU). ``parts``: [(rows, counts, times)] per ledger template."""
        if not self.timed:
            return float(sum(stage_matrix(r, par.pp) @ (n * t) for r, n, t in parts).max())
        ctx = SplitContext(self.model, self._work(b, rc), par)
        flags = self.overlap.resolved(ctx)
        stages = [StageStep(s, c) for s, c in enumerate(self._stage_compute(par, b, rc))]
        if self.path_exact:
            rows = [r for part in parts for r in part[0]]
            p2p = _assign_calls(ctx, rows, stages, flags)
            sched = schedule_of(ctx, p2p, bool(flags.overlap_p2p))
            return _training(ctx, stages, sched, self.gpu, flags, False).time_s
        p2p = self._assign(ctx, parts, stages, flags)
        sched = schedule_of(ctx, p2p, bool(flags.overlap_p2p))
        time = _critical_path(ctx, stages, sched, flags)
        if not self.path_checked:  # the restated assembly must equal step.py's on this shape's first layout
            self.path_checked = True
            rows = [r for part in parts for r in part[0]]
            check = [StageStep(s, c) for s, c in enumerate(self._stage_compute(par, b, rc))]
            exact_p2p = _assign_calls(ctx, rows, check, flags)
            exact = _training(ctx, check, schedule_of(ctx, exact_p2p, bool(flags.overlap_p2p)), self.gpu, flags, False)
            if abs(exact.time_s - time) > REL_TOLERANCE * exact.time_s:
                self.path_exact = True
                return exact.time_s
        return time

    def refined_bound(self, par: ParallelSpec, b: int, rc: str, data) -> float:
        """A lower bound of ``step_time`` from the data-parallel template's priced calls alone (``data``:
        one part as ``step_time`` takes them), tighter than ``lower_bound`` wherever the framework does not
        overlap them: Megatron's gradient all-reduce and parameter all-gather (overlap off by default),
        DeepSpeed below ZeRO-3, per-micro-batch ZeRO-2/3 traffic beyond its pass. The activation calls
        (TP, CP, pipeline sends) are left out: each only lengthens the path (``_critical_path``'s
        ``bound``); tests/planner/test_search.py checks bound <= step time over many layouts."""
        if not self.timed:
            return 0.0
        ctx = SplitContext(self.model, self._work(b, rc), par)
        flags = self.overlap.resolved(ctx)
        stages = [StageStep(s, c) for s, c in enumerate(self._stage_compute(par, b, rc))]
        self._assign(ctx, [data], stages, flags)
        return _critical_path(ctx, stages, schedule_of(ctx), flags, bound=True)

    def data_floor(self, par: ParallelSpec, m: int, data) -> float:
        """What the data-parallel calls (``data``: one part as ``step_time`` takes them) add to the
        compute-only ``lower_bound`` of any layout of the variant with m micro-batches: stage 0's exposed
        gradient reduction and tail (it drains last: lead 0), and the slowest stage's optimizer step with
        its exposed parameter gather in place of the slowest optimizer step (``_critical_path``). Overlapped
        reductions and gathers count as 0 (``_critical_path``'s ``bound``); at most ``refined_bound`` minus
        that bound."""
        if not self.timed:
            return 0.0
        ctx = SplitContext(self.model, self._work(1, "none"), par)
        flags = self.overlap.resolved(ctx)
        sums, _ = self._sums(data[0], m, par.zero_stage, par.pp)
        opt = np.array(self._optimizer(par))
        gathers = sums.get("param_gather")
        finish = opt + gathers[0] if gathers is not None and not flags.overlap_param_gather else opt
        first = sums["tail"][0, 0] if "tail" in sums else 0.0
        if "grad_reduce" in sums and not flags.overlap_grad_reduce:
            first += sums["grad_reduce"][0, 0]
        return float(first + finish.max() - opt.max())

    def _sums(self, rows, m: int, zero: int, p: int):
        """Per stream: (time, calls, bytes) per stage, and the longest pipeline send; step._assign_calls's
        first loop, memoised on the row list (rows of a template at one b are shared by many layouts)."""
        reads_zero = self._reads_zero.get(id(rows))
        if reads_zero is None:  # only data-parallel calls change stream with the ZeRO stage (step._stream)
            reads_zero = self._reads_zero[id(rows)] = any(r.call.parallelism in ("dp", "edp") for r in rows)
        key = (id(rows), m, zero if reads_zero else None)
        found = self._sum_memo.get(key)
        if found is None:
            lists: dict[str, tuple[list[float], list[float], list[float]]] = {}
            p2p = 0.0
            for row in rows:
                c, t = row.call, row.price.time_s
                stream = _stream(c, m, zero)
                if stream == "pp":
                    p2p = max(p2p, t)
                    continue
                cell = lists.get(stream)
                if cell is None:
                    cell = lists[stream] = ([0.0] * p, [0.0] * p, [0.0] * p)
                # plain floats, added in the same order as into an array (numpy's element-wise += is slow)
                times, counts, sizes = cell
                n = c.calls_per_iteration
                for s in c.stages:
                    times[s] += n * t
                    counts[s] += n
                    sizes[s] += float(n * c.message_bytes)
            acc = {stream: np.array(cell, dtype=np.float64) for stream, cell in lists.items()}
            found = self._sum_memo[key] = (rows, acc, p2p)  # holding rows keeps its id from being reused
        return found[1], found[2]

    def _assign(self, ctx: Context, parts, stages: list[StageStep], flags: Overlap) -> float:
        """step._assign_calls on the memoised sums: the stream totals per stage, then what each pass
        exposes (TP overlap behind GEMMs, CP ring behind attention, ZeRO-2/3 prefetch behind the pass)."""
        m, zero, p = ctx.micro_batches, ctx.par.zero_stage, len(stages)
        acc: dict[str, np.ndarray] = {}
        p2p = 0.0
        for rows, _, _ in parts:
            sums, send = self._sums(rows, m, zero, p)
            p2p = max(p2p, send)
            for stream, cell in sums.items():
                acc[stream] = acc[stream] + cell if stream in acc else cell
        none = np.zeros((3, p))
        # plain lists: the per-stage loop below reads single elements, which numpy indexing makes slow
        grad, gather = acc.get("grad_reduce", none).tolist(), acc.get("param_gather", none).tolist()
        tail = acc.get("tail", none)[0].tolist()
        prefetch = _prefetch(ctx, flags)
        passes = {
            phase: [
                (kind, (acc[f"{kind}.{phase}"][0] / m).tolist())
                for kind in ("tp", "ep", "cp", "cp.ring", "dp")
                if f"{kind}.{phase}" in acc
            ]
            for phase in ("forward", "backward")
        }
        for st in stages:
            i = st.stage
            st.grad_reduce_s, st.grad_buckets, st.grad_bytes = grad[0][i], int(grad[1][i]), int(grad[2][i])
            st.param_gather_s, st.param_units = gather[0][i], int(gather[1][i])
            st.param_bytes = int(gather[2][i])
            st.tail_s = tail[i]
            comp = st.compute
            for phase, pass_time in (("forward", comp.forward), ("backward", comp.backward)):
                exposed = 0.0
                for kind, per in passes[phase]:
                    t = per[i]
                    if not t:
                        continue
                    if kind == "tp" and flags.tp_comm_overlap:
                        t = max(0.0, t - pass_time.gemm_s)
                    elif kind == "cp.ring" and flags.cp_ring_overlap:
                        t = max(0.0, t - comp.attention_fwd_s * (1 if phase == "forward" else 2))
                    elif kind == "dp" and prefetch:
                        t = max(0.0, t - pass_time.total_s)
                    exposed += t
                if phase == "forward":
                    st.fwd_comm_s = exposed
                else:
                    st.bwd_comm_s = exposed
        return p2p


def _close(a: StageCompute, e: StageCompute) -> bool:
    values = (
        (a.forward.total_s, e.forward.total_s), (a.backward.total_s, e.backward.total_s),
        (a.forward.gemm_s, e.forward.gemm_s), (a.attention_fwd_s, e.attention_fwd_s), (a.optimizer_s, e.optimizer_s),
    )  # fmt: skip
    return all(abs(x - y) <= REL_TOLERANCE * max(abs(y), 1e-30) for x, y in values)


def _critical_path(
    ctx: Context, stages: list[StageStep], sched: Schedule, flags: Overlap, bound: bool = False
) -> float:
    """The time of step._training without its breakdown, timeline and MFU (which cost more than the time
    itself): the pipeline's critical path, each stage's exposed gradient reduction and tail, the sync,
    then the slowest optimizer step with its exposed parameter gather.

    ``bound``: a lower bound when ``stages`` hold only part of the communication (``refined_bound``): the
    overlapped gradient reduction and parameter gather count as 0 (their exposure max(t - pass / v, t /
    buckets) can fall when the passes lengthen or other calls add buckets); every other term only grows
    with more communication (pipe - lead_s grows by at least the lead's growth: the pipeline grows by the
    sum over stages of each pass's growth / v)."""
    passes = [StagePass(st.forward_s, st.backward_s) for st in stages]
    pipe = pipeline_time(passes, sched).time_s
    v = max(1, sched.chunks)
    sync = 0.0
    for st, p, lead in zip(stages, passes, _drain_leads(passes, sched), strict=True):
        exposed_dp = 0.0
        if st.grad_reduce_s and not (bound and flags.overlap_grad_reduce):
            exposed_dp = exposed_grad_reduce(ctx, st, p, v, flags)
        sync = max(sync, pipe - lead + exposed_dp + st.tail_s)
    finish = 0.0
    for st, p in zip(stages, passes, strict=True):
        gather = 0.0
        if st.param_gather_s and not (bound and flags.overlap_param_gather):
            gather = exposed_param_gather(ctx, st, p, v, flags)
        finish = max(finish, st.compute.optimizer_s + gather)
    return sync + finish


_INCIDENCE: dict = {}


def stage_matrix(rows, stages: int) -> np.ndarray:
    """(stages x rows) 0/1: which stages issue each call; memoised on the row list's identity."""
    key = (tuple(id(r) for r in rows), stages)
    found = _INCIDENCE.get(key)
    if found is None:
        found = np.zeros((stages, len(rows)))
        for i, row in enumerate(rows):
            found[list(row.call.stages), i] = 1.0
        if len(_INCIDENCE) > 4096:
            _INCIDENCE.clear()
        _INCIDENCE[key] = found
    return found


__all__ = ["Priced", "Row", "StepModel"]
