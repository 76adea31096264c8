"""Evaluate the layouts of one shape: validity, ledger from templates, prices from curves, memory, step time.

This is the pure per-chunk function of the search and of sweeps: ``evaluate_shape(problem, shape)`` reads
nothing but its arguments and returns counts and the best layouts of that shape.

Work is shared down the tree of space.py: per shape one rank layout and one set of price curves; per
(virtual stages, schedule, SP, framework, recompute) one activation-ledger template and per (virtual stages,
schedule, ZeRO, framework) one data-parallel template; per layout only array arithmetic over the template's
calls (messages x b, counts x m, time from the curve) and the step and memory models.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field, replace

import numpy as np

from collectives.topology import ClusterSpec, cluster_for
from collectives.topology.select import cached_schedule, resolve_pricing

from .. import flavours
from .._errors import SpecError
from ..context import device_sms
from ..layout import RankLayout
from ..ledger import kernel_time
from ..model import ModelSpec
from ..parallel import ParallelSpec, _fits_workload
from ..plan import Options, price_classes, priced_cluster
from ..workload import WorkloadSpec
from . import templates
from .prices import Pricer, shared_curves
from .space import MAX_DP_GROUP, MEMORY, Constraints, Layout, Pruned, Shape, Space, Variant, recompute_fields
from .step_model import Part, Priced, Row, RowCall, StepModel


@dataclass(frozen=True)
class Problem:
    """A search problem: what every worker needs, small enough to pickle per chunk."""

    model: ModelSpec
    work: WorkloadSpec
    cluster: ClusterSpec
    constraints: Constraints = field(default_factory=Constraints)
    top_k: int = 10
    options: Options = field(default_factory=Options)

    @property
    def keep(self) -> int:
        """Candidates kept per chunk and re-evaluated exactly at the end: top_k plus a margin, so that the
        screen's rounding (interpolated prices, ~1e-6 relative) cannot drop a true top-k layout."""
        return self.top_k + max(8, self.top_k // 2)


@dataclass
class Outcome:
    """What a chunk of the space yields; outcomes merge (the sweep and the search add them up)."""

    done: int = 0  # layouts handled, pruned or not (progress)
    evaluated: int = 0  # layouts valid under every rule: memory (and step when they fit) computed
    feasible: int = 0
    bounded: int = 0  # feasible layouts whose lower bound (compute, then data-parallel) was slower than the k-th best
    # evaluated layouts whose cheapest bound (StepModel.layer_floors: their layers' compute alone) was slower than the
    # k-th best before their memory was computed: neither feasible nor pruned by memory (docs/search.md, speed11)
    bounded_before_memory: int = 0
    pruned: Pruned = field(default_factory=Pruned)
    best: list[tuple[float, tuple, Layout]] = field(default_factory=list)  # (screened step s, tiebreak, layout)

    def merge(self, other: Outcome, keep: int) -> None:
        self.done += other.done
        self.evaluated += other.evaluated
        self.feasible += other.feasible
        self.bounded += other.bounded
        self.bounded_before_memory += other.bounded_before_memory
        self.pruned.merge(other.pruned)
        self.best = heapq.nsmallest(keep, self.best + other.best, key=_rank)


SCHEDULES_KEPT = 128  # executable schedules kept between shapes (collectives' own cache holds up to 4096)
_SPACES: dict = {}


def space_of(problem: Problem) -> Space:
    key = (problem.model, problem.work, problem.cluster, problem.constraints)
    space = _SPACES.get(key)
    if space is None:
        cluster = cluster_for(problem.cluster)
        constraints = problem.constraints
        if not constraints.max_dp_group:
            constraints = replace(constraints, max_dp_group=default_dp_group(cluster))
        space = _SPACES[key] = Space(
            problem.model, problem.work, cluster.num_devices, constraints, cluster.spec.devices_per_node
        )
        if len(_SPACES) > 8:
            _SPACES.pop(next(iter(_SPACES)))
    return space


def default_dp_group(cluster) -> int:
    """The largest cp x dp group searched when the request sets none: every group where NCCL's model prices
    the data-parallel collectives (closed form, milliseconds at 8,192 ranks), MAX_DP_GROUP where the schedule
    pricer builds them step by step (space.py says what that costs)."""
    return cluster.num_devices if resolve_pricing("auto", cluster) == "library" else MAX_DP_GROUP


_DATA_TEMPLATES: dict = {}
DATA_TEMPLATES_KEPT = 8192  # (model, tp, pp, v, schedule, framework, ZeRO, cp x dp, ...) templates of a few calls


def data_template(
    model: ModelSpec, work: WorkloadSpec, par: ParallelSpec, m: int | None = None
) -> templates.Template | None:
    """The data-parallel template of a layout (None where it refused: the layout is built exactly), shared
    by every shape with the same cp x dp. The data-parallel rule (planner/rules/data.py, deepspeed.py) reads
    cp and dp only as their product (the gradient group cp x dp, its padding and bucket sizes; expert_dp =
    tp·cp·dp / (ep·expert_tp)), the micro-batch count (fixed by the template's global batch) and, for
    hybrid sharding only, dp and cp apart; parameters per stage do not read them (params.py ``_holding``).
    Its groups are symbolic (``Group(("cp", "dp"))``), placed per shape when priced. So the many cp values
    of one (tp, pp) (cp x dp = devices / (tp·pp)) share one template, built on the first of them; tests/
    planner/test_search_speed.py checks shared == built on each shape's own layout. With ``m``: the rule's
    ledger at m micro-batches (``templates.at_count``), for a layout whose linear template refused (FSDP2
    inside a pipeline), shared likewise by (cp x dp, m): the rule reads no micro-batch size."""
    par = replace(par, sequence_parallel=False)  # the rule does not read it (templates.py)
    shared = par if par.hybrid_shard_size else replace(par, cp=1, dp=par.cp * par.dp)
    key = (id(model), work, shared, m)
    found = _DATA_TEMPLATES.get(key)
    if found is None:
        rules = templates.DATA_RULES
        built = _build(rules, model, work, par) if m is None else templates.at_count(rules, model, work, par, m)
        # holding the model keeps its id from being reused
        found = _DATA_TEMPLATES[key] = (model, built)
        if len(_DATA_TEMPLATES) > DATA_TEMPLATES_KEPT:
            _DATA_TEMPLATES.pop(next(iter(_DATA_TEMPLATES)))
    return found[1]


def _build(
    rules, model: ModelSpec, work: WorkloadSpec, par: ParallelSpec, per_node: int | None = None, sms: int = 0
) -> templates.Template | None:
    try:
        return templates.build(rules, model, work, par, per_node, sms)
    except templates.NotLinear:
        return None


def batch_rule(space: Space, variant: Variant, b: int, par: ParallelSpec | None = None) -> SpecError | None:
    """planner/parallel.py's workload rules (``_fits_workload``) at micro-batch size b, once the variant
    (``par``: its layout) passed ``validate_parallel`` at b = 1: the error it raises, or None."""
    try:
        _fits_workload(par or variant.parallel(), space.model, space.work_at(b))
    except SpecError as err:
        return err
    return None


class ShapeEvaluator:
    """Everything shared by the layouts of one shape."""

    def __init__(self, problem: Problem, shape: Shape, threshold: float = math.inf):
        self.problem, self.shape = problem, shape
        self.threshold = threshold  # the k-th best step time found elsewhere so far (branch and bound)
        self.space = space_of(problem)
        self.cluster = cluster_for(problem.cluster)
        self._sms = device_sms(problem.cluster)  # DeepEP's low-latency grid (rules/expert.py ll_sms)
        # the default schedule (one chunk per rank): the placements read only the degrees and the order
        base = Variant(shape, 1, ParallelSpec.pipeline_schedule, 0, False, flavours.DEFAULT).parallel()
        self.layout = RankLayout(base)  # placements depend on the degrees and the order only
        self.pricer = Pricer(self.cluster, problem.options, shared_curves(self.cluster, problem.options))
        # the problem's overlap switches, as _exact's build_plan reads them (a screen without them ranks other layouts)
        self.step_model = StepModel(
            problem.model, problem.work, self.cluster, problem.constraints.memory_headroom, problem.options.overlap
        )
        self._templates: dict = {}
        self._act_zero: dict = {}  # (SP, framework, ZeRO) -> templates.activation_zero
        self._curves: dict = {}
        self._priced_memo: dict = {}
        self._classes_memo: dict = {}
        self.variants = list(self.space.variants(shape))
        self._parallels: dict[int, ParallelSpec] = {}

    # ---- ledger ----------------------------------------------------------------------------------------
    def template(self, rules, variant: Variant, recompute: str, m: int | None = None) -> templates.Template | None:
        """The activation template reads the ZeRO stage only as ``templates.activation_zero``, the data-parallel one
        neither SP nor recompute. Where the
        data-parallel template refused (not linear in m: FSDP2 inside a pipeline), with ``m`` the rule's ledger
        at m micro-batches (``data_template``), without it None."""
        act = rules is templates.ACTIVATION_RULES
        zero = self._activation_zero(variant) if act else variant.zero_stage
        key = (
            act, variant.virtual_pipeline_stages, variant.pipeline_schedule, variant.framework,
            variant.end_stage_layers, variant.sequence_parallel if act else None, zero, recompute,
            variant.ep_dispatch, variant.last_stage_layers, variant.pipeline_layout,
        )  # fmt: skip
        if key not in self._templates:
            par, model = variant.parallel(), self.problem.model
            work = replace(self.problem.work, **recompute_fields(recompute))
            if act:
                per_node = self.cluster.spec.devices_per_node  # DeepEP's legs (rules/deepep.py)
                self._templates[key] = _build(rules, model, work, replace(par, zero_stage=zero), per_node, self._sms)
            else:
                self._templates[key] = data_template(model, work, par)
        found = self._templates[key]
        if found is None and m is not None and not act:
            at_m = (*key, m)
            found = self._templates.get(at_m)
            if found is None:
                work = replace(self.problem.work, **recompute_fields(recompute))
                found = self._templates[at_m] = data_template(self.problem.model, work, variant.parallel(), m)
        return found

    def classes(self, tpl: templates.Template) -> list[tuple[int, tuple[int, ...], object]]:
        """(call index, stages, price curve) per row the plan prices: a call's stages split where their
        groups sit differently on the cluster, as ``planner.plan._price_by_stage`` splits them."""
        key = id(tpl)
        if key not in self._curves:
            rows = []
            for i, call in enumerate(tpl.calls):
                pricer = self._pricer_for(call)  # DeepEP's RDMA leg: on the NICs (plan.priced_cluster)
                for members in self._stage_classes(call):
                    placement = self.layout.placement(call.group, members)
                    rows.append((i, members, pricer.curve(call.op, placement)))
            self._curves[key] = (tpl, rows)  # holding tpl keeps its id from being reused
        return self._curves[key][1]

    def _pricer_for(self, call) -> Pricer:
        """The shape's pricer, or one on the cluster as a kernel of fewer NVLink peers sees it (plan.priced_cluster)."""
        cluster = priced_cluster(call, self.cluster)
        if cluster is self.cluster:
            return self.pricer
        views = self.__dict__.setdefault("_view_pricers", {})
        if cluster.spec not in views:
            views[cluster.spec] = Pricer(cluster, self.problem.options, shared_curves(cluster, self.problem.options))
        return views[cluster.spec]

    def _stage_classes(self, call) -> list[tuple[int, ...]]:
        """planner.plan.price_classes, memoised per shape on what it reads of the call."""
        key = (call.stages, call.group)
        found = self._classes_memo.get(key)
        if found is None:
            found = self._classes_memo[key] = price_classes(call, self.layout, self.cluster, self.problem.options)
        return found

    def calls(self, variant: Variant, b: int, recompute: str):
        """The Parts of one layout, one per template (activation rules, data-parallel rule; rows: what
        step_time reads of a priced call); one exact part when a template refused."""
        m = self.problem.work.global_batch_size // (b * self.shape.dp)
        parts = []
        for rules, rc in ((templates.ACTIVATION_RULES, recompute), (templates.DATA_RULES, "none")):
            tpl = self.template(rules, variant, rc, m)
            if tpl is None:
                work = replace(self.problem.work, micro_batch_size=b, **recompute_fields(recompute))
                tpl = templates.Template.fixed(
                    templates.exact(
                        self.problem.model, work, variant.parallel(), self.cluster.spec.devices_per_node, self._sms
                    )
                )
                return [self._rows(tpl, 1, 1)]
            parts.append(self._priced(tpl, b, m))
        return parts

    def _priced(self, tpl: templates.Template, b: int, m: int):
        """Rows of a template at micro-batch size b and count m: memoised, as every recompute and ZeRO
        variant of the shape reuses them."""
        key = (id(tpl), b if tpl.scales_with_b else None, m)  # data-parallel calls do not read b
        found = self._priced_memo.get(key)
        if found is None:
            found = self._priced_memo[key] = self._rows(tpl, b, m)
        return found

    def _rows(self, tpl: templates.Template, b: int, m: int) -> Part:
        msgs, counts = tpl.messages(b).tolist(), tpl.counts(m).tolist()
        rows, row_counts, times = [], [], []
        for i, members, curve in self.classes(tpl):
            t = kernel_time(tpl.calls[i], curve.time(msgs[i]))  # the call's own kernel's rate (plan._price)
            priced = Priced(t, *curve.detail(msgs[i]), curve)
            rows.append(Row(RowCall.of(tpl.calls[i], members, msgs[i], counts[i]), priced))
            row_counts.append(counts[i])
            times.append(t)
        return Part(rows, np.array(row_counts, dtype=np.float64), np.array(times))

    # ---- the walk ----------------------------------------------------------------------------------------
    def run(self) -> Outcome:
        out = Outcome()
        screened = self.screen(out)
        out.merge(self.time(screened), self.problem.keep)
        return out

    def screen(self, out: Outcome) -> Screened:
        """Count every layout of the shape (pruned by a rule, by memory, or feasible) into ``out`` and return
        the feasible ones with their lower bounds, sorted (validity per variant; memory and bounds as array
        operations over the variant's (b, recompute) pairs)."""
        space, model = self.space, self.step_model
        recomputes = space.recomputes
        bs = space.micro_batches(self.shape.dp)
        requests: list[tuple[ParallelSpec, tuple]] = []  # (layout, its fitting pairs): bounds priced together
        picks: list[tuple[int, int, int]] = []  # (variant index, b, recompute index)
        for index, variant in enumerate(self.variants):
            out.done += len(bs) * len(recomputes)
            err = space.check(variant, 1)
            if err is not None:
                out.pruned.add(err.field, len(bs) * len(recomputes), err.rule)
                continue
            grid, par = [], self.parallel(index)
            rules = [space.recompute_rule(par, rc) for rc in recomputes]  # opt-in recompute choices' own rules
            for b in bs:
                err = batch_rule(space, variant, b, par)
                if err is not None:
                    out.pruned.add(err.field, len(recomputes), err.rule)
                else:
                    grid += [(b, rc) for rc, rule in zip(recomputes, rules, strict=True) if rule is None]
                    for rule in filter(None, rules):
                        out.pruned.add(rule.field, 1, rule.rule)
            if not grid:
                continue
            grid = tuple(grid)
            out.evaluated += len(grid)
            if self.threshold < math.inf:  # its layers alone are slower than the k-th best: no memory to compute
                grid = self._floored(par, grid, out)
                if not grid:
                    continue
            ok = self._fits(variant, par, grid)
            fitting = tuple(pair for pair, fit in zip(grid, ok.tolist(), strict=True) if fit)
            out.pruned.add(MEMORY, len(grid) - len(fitting), model.last_reason)
            if not fitting:
                continue
            out.feasible += len(fitting)
            if self.threshold < math.inf:  # slower than the k-th best known: bounded whatever the order (time)
                fast = (model.busiest_bounds(par, fitting) <= self.threshold).tolist()
                if not all(fast):
                    out.bounded += len(fast) - sum(fast)
                    fitting = tuple(pair for pair, ok in zip(fitting, fast, strict=True) if ok)
                    if not fitting:
                        continue
            requests.append((par, fitting))
            picks += [(index, b, recomputes.index(rc)) for b, rc in fitting]
        # layouts whose pipeline may run its order keep their busiest-rank bound here, priced when timing reaches
        # them (``_InOrder``: vsearch13); the others their compute-only bound, as timing reads it
        later = [model.timed and model.orders_possible(par) for par, _ in requests]
        priced = iter(model.lower_bounds_many([req for req, lazy in zip(requests, later, strict=True) if not lazy]))
        bounds, known = [], []
        for (par, fitting), lazy in zip(requests, later, strict=True):
            bounds += (model.busiest_bounds(par, fitting) if lazy else next(priced)).tolist()
            known += [not lazy] * len(fitting)
        return Screened.of(self.shape, bounds, picks, self, known)

    def _floored(self, par: ParallelSpec, grid: tuple, out: Outcome) -> tuple:
        """The pairs of ``grid`` whose ``StepModel.layer_floors`` is within the threshold; the others are counted in
        ``bounded_before_memory``."""
        fast = self.step_model.floors_within(par, grid, self.threshold)
        if all(fast):
            return grid
        out.bounded_before_memory += len(fast) - sum(fast)
        return tuple(pair for pair, ok in zip(grid, fast, strict=True) if ok)

    def time(self, screened: Screened) -> Outcome:
        """Step times of the screened layouts, best bound first: once a bound is slower than the k-th best
        step time (this shape's or the threshold), every layout left is too (``bounded``)."""
        out = Outcome()
        keep, model, recomputes = self.problem.keep, self.step_model, self.space.recomputes
        heap: list = []  # (-screened step time, sequence, (score, sort key, layout)): the keep best so far
        walk = _InOrder(screened, self._price)
        for seq in range(len(screened)):
            bound = min(self.threshold, -heap[0][0] if len(heap) >= keep else math.inf)
            bound_s, index, b, r = walk.next(bound)
            if bound_s > bound:  # it cannot enter the top k, and neither can any after it (sorted)
                out.bounded += len(screened) - seq
                break
            if seq % WARM == 0:
                self._warm(walk.ahead((bound_s, index, b, r), WARM), bound)
            par, rc = self.parallel(index), recomputes[r]
            # its data-parallel calls alone make it too slow: first the part that only adds to the compute
            # bound (memoised per variant and micro-batch count), then the whole path with those calls
            if bound_s + self.data_floor(index, b) > bound or self.refined_bound(index, b, rc) > bound:
                out.bounded += 1
                continue
            score = model.step_time(par, b, rc, self.calls(self.variants[index], b, rc))
            layout = Layout.of(par, b, rc)
            heapq.heappush(heap, (-score, seq, (score, sort_key(layout), layout)))
            if len(heap) > keep:
                heapq.heappop(heap)
        out.best = sorted((item for _, _, item in heap), key=_rank)
        return out

    def _price(self, rows: list[tuple[int, int, int]]) -> list[float]:
        """The compute-only bounds (``StepModel.lower_bounds``, plus the optimizer step) of screened (variant index,
        b, recompute index) rows whose screen kept their busiest-rank bound, the same values the screen gives the
        others: a variant's rows as one grid, every pending order run together (``lower_bounds_many``)."""
        grids: dict[int, list] = {}
        for index, b, r in rows:
            grids.setdefault(index, []).append((b, self.space.recomputes[r]))
        requests = [(self.parallel(index), tuple(grid)) for index, grid in grids.items()]
        found = dict(zip(grids, self.step_model.lower_bounds_many(requests), strict=True))
        at = {index: iter(bounds.tolist()) for index, bounds in found.items()}
        return [next(at[index]) for index, _, _ in rows]

    def _warm(self, rows: list[tuple[float, int, int, int]], bound: float) -> None:
        """The next WARM screened layouts' data floors and refined bounds (those within ``bound`` now: a superset of
        those ``time`` asks for), their orders run together (StepModel.warm_paths; mend12a, review r12a #2)."""
        wanted = []
        for bound_s, index, b, r in rows:
            par = self.parallel(index)
            if bound_s > bound or not self.step_model.orders_possible(par):
                continue  # no order to run ahead: time() builds what it asks for, when it asks
            data = self._data_part(index, b)
            if data is None:
                continue
            m = self.problem.work.global_batch_size // (b * self.shape.dp)
            if ("floor", index, m) not in self._priced_memo:
                wanted.append((par, b, None, data))
            wanted.append((par, b, self.space.recomputes[r], data))
        self.step_model.warm_paths(wanted)

    def refined_bound(self, index: int, b: int, rc: str) -> float:
        """``StepModel.refined_bound`` on the variant's data-parallel template (built and priced once per
        variant and micro-batch count, as timing builds it); 0 where the template refused (the variant is
        then timed from its exact ledger)."""
        data = self._data_part(index, b)
        return 0.0 if data is None else self.step_model.refined_bound(self.parallel(index), b, rc, data)

    def data_floor(self, index: int, b: int) -> float:
        """``StepModel.data_floor``: what the data-parallel calls add to any compute-only bound."""
        m = self.problem.work.global_batch_size // (b * self.shape.dp)
        key = ("floor", index, m)
        found = self._priced_memo.get(key)
        if found is None:
            data = self._data_part(index, b)
            found = self._priced_memo[key] = (
                0.0 if data is None else self.step_model.data_floor(self.parallel(index), b, data)
            )
        return found

    def _data_part(self, index: int, b: int):
        m = self.problem.work.global_batch_size // (b * self.shape.dp)
        tpl = self.template(templates.DATA_RULES, self.variants[index], "none", m)
        if tpl is None:
            return None
        return self._priced(tpl, b, m)

    def _activation_zero(self, variant: Variant) -> int:
        """templates.activation_zero of the variant's layout, memoised on what it reads (SP, framework, ZeRO)."""
        key = (variant.sequence_parallel, variant.framework, variant.zero_stage)
        found = self._act_zero.get(key)
        if found is None:
            found = self._act_zero[key] = templates.activation_zero(variant.parallel())
        return found

    def parallel(self, index: int) -> ParallelSpec:
        found = self._parallels.get(index)
        if found is None:
            found = self._parallels[index] = self.variants[index].parallel()
        return found

    def _fits(self, variant: Variant, par, grid) -> np.ndarray:
        """Whether each (b, recompute) of the variant fits; MoE layouts add their all-to-all buffers, read
        off their priced calls, one by one."""
        model = self.step_model
        if not self.problem.model.moe:
            return model.fits_many(par, grid)
        ok = []
        for b, rc in grid:
            rows = [r for part in self.calls(variant, b, rc) for r in part.rows]
            ok.append(model.fits(par, b, rc, rows))
        return np.array(ok, dtype=bool)


@dataclass
class Screened:
    """The feasible layouts of one shape as the screen leaves them, sorted by lower bound: indices into
    the shape's variants and the space's recompute list, small to send between processes."""

    shape: Shape
    # seconds, ascending: the compute-only bound (StepModel.lower_bounds) where ``known``, else the busiest-rank
    # bound (StepModel.busiest_bounds, never above it), which timing replaces when it needs it (``_InOrder``)
    bounds: np.ndarray
    variants: np.ndarray  # index into Space.variants(shape)
    batches: np.ndarray  # micro-batch size
    recomputes: np.ndarray  # index into Space.recomputes
    # the evaluator that screened it, reused to time it in the same process (its compute, memory and
    # template memos); not sent between processes (a fresh one is built there)
    evaluator: ShapeEvaluator | None = field(default=None, repr=False, compare=False)
    known: np.ndarray | None = None  # whether ``bounds`` is the compute-only bound (None: all are)
    walk: np.ndarray | None = None  # each layout's place in the screen's walk (equal bounds keep it)

    @classmethod
    def of(
        cls, shape: Shape, bounds: list[float], picks: list[tuple[int, int, int]], evaluator=None, known=None
    ) -> Screened:
        order = np.argsort(np.array(bounds, dtype=np.float64), kind="stable")  # ties keep the walk's order
        cols = np.array(picks, dtype=np.int64).reshape(-1, 3)[order]
        bounds = np.array(bounds, dtype=np.float64)[order]
        if known is not None and all(known):
            known = None
        if known is not None:
            known = np.array(known, dtype=bool)[order]
        return cls(shape, bounds, cols[:, 0], cols[:, 1], cols[:, 2], evaluator, known, order)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "evaluator": None}

    def timer(self, problem: Problem, threshold: float) -> ShapeEvaluator:
        """The evaluator to time it with, bounded by ``threshold``: the screen's own when it is here."""
        evaluator = self.evaluator or ShapeEvaluator(problem, self.shape)
        evaluator.threshold = threshold
        return evaluator

    def __len__(self) -> int:
        return len(self.bounds)

    @property
    def best_bound(self) -> float:
        return float(self.bounds[0]) if len(self.bounds) else math.inf


# screened layouts whose compute-only bounds ``_InOrder`` prices at once where timing needs one: their orders run
# together (a sweep's columns); past the break the rest are never priced
PRICE_AHEAD = 32


class _InOrder:
    """A shape's screened layouts in the order of their compute-only bounds, ties in the screen's walk order (what
    ``Screened.of`` sorts them by where every bound is known), the bounds not known (``Screened.known``: layouts
    whose pipeline may run its order, review r12a #2, vsearch13) priced only when needed: the next one is the
    least known (bound, walk) unless a pending layout's busiest-rank bound is at most that bound (its own may then
    be less, or equal and earlier in the walk), when the next PRICE_AHEAD pending by that bound are priced. So a
    pending layout whose busiest-rank bound is above every bound timing reaches is never priced, and the layouts
    come in the same order, with the same bounds, as were every one priced in the screen: a busiest-rank bound is
    never above its compute-only bound (``StepModel.busiest_bounds``)."""

    def __init__(self, screened: Screened, price, ahead: int = 0) -> None:
        self.screened, self.price, self.seq, self.ahead_n = screened, price, 0, ahead or PRICE_AHEAD
        self.rows = self._rows(0, len(screened))  # all known: read as they are given (timing stops early)
        self.heap: list | None = None  # (bound, walk, row) of the priced layouts not yet given
        if screened.known is not None:
            self.rows = list(self.rows)
            walk, known = screened.walk.tolist(), screened.known.tolist()
            self.heap = [(self.rows[i][0], walk[i], i) for i in range(len(walk)) if known[i]]
            heapq.heapify(self.heap)
            self.pending = [i for i in range(len(walk)) if not known[i]]  # by busiest-rank bound, then walk
            self.walk = walk

    def next(self, bound: float) -> tuple[float, int, int, int]:
        """The next layout (bound, variant index, b, recompute index); an infinite bound where every one left is
        above ``bound`` (timing stops there; none is priced for it)."""
        if self.heap is None:
            self.seq += 1
            return next(self.rows)
        heap, pending = self.heap, self.pending
        while pending and (not heap or self.rows[pending[0]][0] <= heap[0][0]):
            if min(heap[0][0] if heap else math.inf, self.rows[pending[0]][0]) > bound:
                return (math.inf, -1, 0, 0)
            batch, self.pending = pending[: self.ahead_n], pending[self.ahead_n :]
            pending = self.pending
            rows = [self.rows[i][1:] for i in batch]
            for i, row, bound_s in zip(batch, rows, self.price(rows), strict=True):
                self.rows[i] = (bound_s, *row)
                heapq.heappush(heap, (bound_s, self.walk[i], i))
        return self.rows[heapq.heappop(heap)[2]]

    def ahead(self, row: tuple[float, int, int, int], count: int) -> list[tuple[float, int, int, int]]:
        """``row`` (the layout just given) and up to count - 1 after it: the next in order where all are priced,
        else the least priced ones (what timing asks for next, unless a pending layout comes before them)."""
        if self.heap is None:
            return list(self._rows(self.seq - 1, self.seq - 1 + count))
        return [row, *(self.rows[i] for _, _, i in heapq.nsmallest(count - 1, self.heap))]

    def _rows(self, start: int, end: int):
        """(bound, variant index, b, recompute index) of the screened layouts start..end - 1, as an iterator."""
        s = self.screened
        columns = (s.bounds, s.variants, s.batches, s.recomputes)
        return zip(*(x[start:end].tolist() for x in columns), strict=True)


def sort_key(layout: Layout) -> tuple:
    """Equal step times rank by a stable order of the layout: fewer pipeline stages, smaller tp, ..."""
    p, c = layout.parallel, layout.choice
    return (
        p.pp, p.tp, p.cp, p.ep, p.etp, p.virtual_pipeline_stages, p.pipeline_schedule, p.zero_stage,
        p.sequence_parallel, p.framework, layout.micro_batch_size, layout.activation_recompute,
        p.ep_dispatch, p.first_stage_layers or 0, c.method or "", c.num_layers or 0,
        p.last_stage_layers or 0, str(p.pipeline_layout or ""), c.modules or (), c.ac_option or "", c.offload,
    )  # fmt: skip


def _rank(item: tuple) -> tuple:
    return item[0], item[1]


def evaluate_shape(problem: Problem, shape: Shape, threshold: float = math.inf) -> Outcome:
    return ShapeEvaluator(problem, shape, threshold).run()


# screened layouts whose orders ``ShapeEvaluator.time`` runs together (their data floors' and refined bounds'; mend12a):
# 32 columns of a V at pp 40 (60k ops, 1,500 levels) sweep in about 15 ms, what 2-3 columns' loops cost (6 ms each),
# so a window wasted past the break costs little; 8 and 16 measured no better (docs/step-time.md "(mend12a)")
WARM = 32
BOUND_SLACK = 1e-5  # the screen's rounding against build_plan is ~1e-6 relative: a bound with room to spare


def kth(outcome: Outcome, k: int) -> float:
    """A step time no top-k layout is slower than: the k-th best screened so far, with slack for the
    screen's rounding (a layout whose lower bound exceeds it cannot enter the answer)."""
    return outcome.best[k - 1][0] * (1 + BOUND_SLACK) if len(outcome.best) >= k else math.inf


def evaluate_shapes(problem: Problem, shapes: list[Shape], threshold: float = math.inf) -> Outcome:
    """The pure per-chunk function: the outcome of a list of shapes (screen, then time best bound first).
    ``threshold``: the k-th best step time known when the chunk was handed out (layouts whose lower bound
    is slower are not timed)."""
    out, screened = screen_shapes(problem, shapes, threshold)
    out.merge(time_shapes(problem, screened, threshold), problem.keep)
    return out


def screen_shapes(problem: Problem, shapes: list[Shape], threshold: float = math.inf) -> tuple[Outcome, list[Screened]]:
    """Phase one of a search: every layout of the shapes counted, the feasible ones with their lower
    bounds (shapes with none left out); those whose cheaper bound (``StepModel.busiest_bounds``) is
    slower than ``threshold`` are counted as bounded there, as timing would count them."""
    out, screened = Outcome(), []
    for shape in shapes:
        found = ShapeEvaluator(problem, shape, threshold).screen(out)
        if len(found):
            screened.append(found)
    return out, screened


def time_shapes(problem: Problem, screened: list[Screened], threshold: float = math.inf) -> Outcome:
    """Phase two: step times of screened shapes, each bounded by the k-th best found so far (in this call or
    ``threshold``); a shape whose best bound is slower is counted as bounded without being timed. (Shapes
    are not reordered by their best bound: a low compute bound often hides heavy communication, and
    timing such a shape first leaves the threshold loose for the rest.)"""
    out = Outcome()
    for found in screened:
        limit = min(threshold, kth(out, problem.top_k))
        if found.best_bound > limit:
            out.bounded += len(found)
            found.evaluator = None  # its memos are not needed again
            continue
        out.merge(found.timer(problem, limit).time(found), problem.keep)
        found.evaluator = None
        if cached_schedule.cache_info().currsize > SCHEDULES_KEPT:
            # schedules of groups of thousands of ranks, at every size a curve priced, add up to gigabytes;
            # a new shape mostly needs new ones anyway
            cached_schedule.cache_clear()
    return out


__all__ = [
    "Outcome",
    "Problem",
    "Screened",
    "ShapeEvaluator",
    "batch_rule",
    "evaluate_shape",
    "evaluate_shapes",
    "screen_shapes",
    "space_of",
    "time_shapes",
]
