"""The search driver: walk the space in chunks of shapes (on both cores for long searches), keep the best
screened layouts, re-evaluate them with ``build_plan`` and return the top k.

Long searches run their chunks in worker processes Progress is reported between
chunks; ``cancelled()`` is polled as well and stops the search: pending chunks are cancelled and the
workers terminated.
"""

from __future__ import annotations

import concurrent.futures as cf
import gc
import multiprocessing
import os
import signal
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from .._errors import SpecError
from ..plan import Plan, build_plan
from .evaluate import Outcome, Problem, evaluate_shapes, kth, space_of
from .space import MEMORY, Layout, Pruned, Shape

MAX_LAYOUTS = 2_000_000  # default size limit (COMMPLAN_MAX_SEARCH_LAYOUTS in the service)
IN_PROCESS_BELOW = 20_000  # layouts: below this, worker start-up costs more than it saves
CHUNK_LAYOUTS = 6_000  # target layouts per chunk: progress every ~0.3 s, and balanced cores
PROGRESS_EVERY_S = 0.25


class Cancelled(Exception):
    """The caller went away (the HTTP client disconnected)."""


@dataclass
class Ranked:
    layout: Layout
    plan: Plan  # the layout through build_plan: step and memory as /v1/plan answers them

    @property
    def time_s(self) -> float:
        return step_time(self.plan)


@dataclass
class SearchResult:
    space_size: int
    outcome: Outcome
    results: list[Ranked]
    elapsed_s: float
    workers: int = 1
    pruned: Pruned = field(default_factory=Pruned)


def step_time(plan: Plan) -> float:
    """The plan's step time; the communication of its busiest stage where no step model applies."""
    return plan.step.time_s if plan.step else plan.totals.time_s


def fits(plan: Plan, headroom: float) -> bool:
    if not plan.memory:
        return True
    limit = plan.memory.capacity_bytes * (1 - headroom)
    return all(s.peak_bytes <= limit for s in plan.memory.per_stage)


def chunks(shapes: list[Shape], cost: Callable[[Shape], int], target: int) -> list[list[Shape]]:
    out, current, weight = [], [], 0
    for shape in shapes:
        current.append(shape)
        weight += cost(shape)
        if weight >= target:
            out.append(current)
            current, weight = [], 0
    if current:
        out.append(current)
    return out


def lanes(shapes: list[Shape], cost: Callable[[Shape], int], target: int, workers: int) -> list[list[list[Shape]]]:
    """The chunks of ``shapes`` dealt to ``workers`` lanes, one lane a worker process: the shapes of one tp in one
    lane (the process memos shared across shapes all key on tp: a layer's kernels and the floors' layer sums on
    (tp, cp, ...), the data-parallel templates and their cp x dp curves on (tp, pp, cp x dp), the tensor groups'
    curves on tp), the tp groups largest first, each to the lane with the least work so far (list scheduling).
    Dealt to any free process instead, both processes built most of those memos each (docs/search.md, speed11b)."""
    groups: dict[int, list[Shape]] = {}
    for shape in shapes:
        groups.setdefault(shape.tp, []).append(shape)
    out: list[list[list[Shape]]] = [[] for _ in range(workers)]
    load = [0] * workers
    weighed = [(sum(cost(s) for s in group), group) for group in groups.values()]
    for weight, group in sorted(weighed, key=lambda item: -item[0]):  # stable: equal weights keep the walk's order
        lane = load.index(min(load))
        out[lane] += chunks(group, cost, target)
        load[lane] += weight
    return out


def search(
    problem: Problem,
    progress: Callable[[dict], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
    workers: int | None = None,
    max_layouts: int = MAX_LAYOUTS,
) -> SearchResult:
    start = time.perf_counter()
    space = space_of(problem)
    size = space.checked_size(max_layouts)
    total = Outcome()
    shapes = list(space.shapes(total.pruned))  # what the rules refuse up front: total.pruned.up_front, not in size

    def cost(shape: Shape) -> int:
        return space.variants_per_shape(shape.tp, shape.pp) * len(space.micro_batches(shape.dp)) * len(space.recomputes)

    work = sum(cost(s) for s in shapes)
    workers = workers or os.cpu_count() or 1
    parts = chunks(shapes, cost, CHUNK_LAYOUTS)
    last = [0.0]

    def report(force: bool = False) -> None:
        now = time.perf_counter()
        if progress and (force or now - last[0] >= PROGRESS_EVERY_S):
            last[0] = now
            progress(_progress(total, size, now - start))

    report(force=True)
    if work < IN_PROCESS_BELOW or workers == 1 or len(parts) == 1:
        workers = 1

    def job(part: list[Shape]) -> tuple:  # each chunk is bounded by the k-th best known when it is handed out
        return evaluate_shapes, (problem, part, kth(total, problem.top_k))

    merge = lambda out: total.merge(out, problem.keep)  # noqa: E731
    if workers == 1:  # in the walk's order
        _run((job(part) for part in parts), merge, report, cancelled)
    else:
        _in_lanes(workers, lanes(shapes, cost, CHUNK_LAYOUTS, workers), job, merge, report, cancelled)
    report(force=True)
    results = _exact(problem, total)
    return SearchResult(size, total, results, time.perf_counter() - start, workers, total.pruned)


def _run(jobs, merge, report, cancelled) -> None:
    """Runs ``jobs`` ((function, args), drawn lazily so that each sees the latest results) in this process, merging
    each result as it comes."""
    for fn, args in jobs:
        if cancelled and cancelled():
            raise Cancelled()
        merge(fn(*args))
        report()


_POOL: dict = {}


def _pool(workers: int) -> cf.ProcessPoolExecutor:
    pool = _POOL.get(workers)
    if pool is None:
        # fork: a worker starts in milliseconds with the planner already imported, and runs only the pure
        # chunk function (no locks of the server's threads are taken in it)
        pool = _POOL[workers] = cf.ProcessPoolExecutor(
            workers, mp_context=multiprocessing.get_context("fork"), initializer=_worker_start
        )
    return pool


# The garbage collector's youngest generation in a search worker, which screens layouts for a long time: collected
# every this many net new container objects, not CPython's 700 (the gc module's docs, gc.set_threshold). Screening
# builds contexts, keys and priced rows that live about as long as their shape, so at 700 the collector ran over
# them again and again: Llama 3 405B on 16,384 H100, megatron tp 8 (19,536 layouts, measured in one process
# with this threshold set) ran 634 collections, 0.74 of 6.48 CPU s; at 10,000, 27 collections, 0.22 of 5.36 CPU s,
# the same answer; the whole 405B space on 2 processes peaked at 264 MiB against 261 MiB. Cycles are still
# collected, a few thousand objects later; the older generations keep their thresholds. Only forked pool workers
# take it (_worker_start): an in-process search keeps its process's own threshold (700 from the command line, the
# service's app/main.py GC_YOUNG_SERVICE), which concurrent plan threads share.
GC_YOUNG_THRESHOLD = 10_000


def young_threshold(young: int = GC_YOUNG_THRESHOLD) -> None:
    """This process's young generation collected every ``young`` net new objects."""
    gc.set_threshold(young, *gc.get_threshold()[1:])


# The middle generation in a search worker: collected every this many young collections, not CPython's 10. What
# survives a young collection there is mostly memo entries that live as long as their shape's lane or the search, so
# at 10 the middle collections walked them again and again: GPT-3 175B on 1,024 A100, whole space (speed11b,
# 2026-11-27 01:31, load 1.2-2.4, 2 processes, three runs each in turn) 19.30-19.43 -> 18.51-18.84 CPU s of the
# workers, the largest worker's peak 179 -> 187 MiB; in one process the collector took 1.75 -> 1.14 of ~18 CPU s
# (25 -> 3 middle collections, 2 -> 0 old ones). The shape evaluators' reference cycles are freed at the next middle
# collection, up to 100 x 10,000 objects later. The oldest generation keeps the parent's threshold.
GC_MIDDLE_THRESHOLD = 100


def _worker_start() -> None:
    """A forked worker's start: the signals it answers (``_plain_signals``) and its collector (``young_threshold``,
    then GC_MIDDLE_THRESHOLD)."""
    _plain_signals()
    young_threshold()
    young, _, old = gc.get_threshold()
    gc.set_threshold(young, GC_MIDDLE_THRESHOLD, old)


def _plain_signals() -> None:
    """A forked worker inherits the server's handlers: uvicorn's SIGTERM handler only flags a server the worker
    does not run, so a SIGTERM sent to the service's process group would leave it computing. SIGTERM ends it
    again; SIGINT (a terminal's Ctrl-C reaches the whole process group) is left to the parent, which stops its
    pool."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _drop_pool(workers: int) -> None:
    pool = _POOL.pop(workers, None)
    if pool is None:
        return
    for proc in list(getattr(pool, "_processes", {}).values()):  # kill our own workers, by handle: a worker
        proc.kill()  # still starting has the inherited handlers (_plain_signals), which may ignore SIGTERM
    pool.shutdown(wait=False, cancel_futures=True)


class _Lanes:
    """Queues of chunks, one a worker: a lane's own next chunk, else the last chunk of the lane with the most left."""

    def __init__(self, lanes: list[list]):
        self.queues = [deque(lane) for lane in lanes]

    def next(self, lane: int):
        if self.queues[lane]:
            return self.queues[lane].popleft()
        most = max(self.queues, key=len)
        return most.pop() if most else None


def _submit(workers: int, fn, args) -> cf.Future:
    try:
        return _pool(workers).submit(fn, *args)
    except cf.process.BrokenProcessPool:  # left broken by an earlier search: a fresh pool
        _drop_pool(workers)
        return _pool(workers).submit(fn, *args)


def _in_lanes(workers: int, lanes: list[list], job, merge, report, cancelled) -> None:
    """The chunks of ``lanes`` on the pool, ``job(chunk)`` drawn when it is handed out so that it bounds against what
    earlier ones found. One chunk a worker at a time: a lane's next chunk is handed out when its last one comes back,
    so the worker that ran it, the one free then, takes it and its process's memos serve it (``_Lanes`` says which
    chunk)."""
    queues, pending = _Lanes(lanes), {}  # future -> lane

    def hand_out(lane: int) -> None:
        part = queues.next(lane)
        if part is not None:
            pending[_submit(workers, *job(part))] = lane

    for lane in range(len(lanes)):
        hand_out(lane)
    while pending:
        done, _ = cf.wait(pending, timeout=PROGRESS_EVERY_S, return_when=cf.FIRST_COMPLETED)
        free = [pending.pop(future) for future in done]
        try:
            for future in done:
                merge(future.result())
        except cf.process.BrokenProcessPool:
            _drop_pool(workers)
            raise _stopped() from None
        if cancelled and cancelled():
            _drop_pool(workers)
            raise Cancelled()
        for lane in free:
            hand_out(lane)
        report()


def _stopped() -> SpecError:
    return SpecError(
        "constraints",
        "a search worker was stopped (out of memory on this machine?); narrow the space with "
        "constraints (fewer cp / dp-heavy shapes, e.g. a minimum tp)",
    )


def _exact(problem: Problem, total: Outcome) -> list[Ranked]:
    """The best screened layouts through ``build_plan``: the step and memory blocks /v1/plan answers."""
    ranked = []
    for _, _, layout in total.best:
        plan = build_plan(
            problem.model, layout.workload(problem.work), layout.parallel, problem.cluster, problem.options
        )
        if not fits(plan, problem.constraints.memory_headroom):  # the screen and the plan disagree: trust the plan
            total.feasible -= 1
            total.pruned.add(MEMORY, 1)
            continue
        ranked.append(Ranked(layout, plan))
    ranked.sort(key=lambda r: r.time_s)
    return ranked[: problem.top_k]


def _progress(total: Outcome, size: int, elapsed: float) -> dict:
    best = None
    if total.best:
        score, _, layout = total.best[0]
        best = {"step_time_s": score, "layout": layout}  # the app writes the layout (app/serialize.py)
    return {
        "done": total.done,
        "total": size,
        "evaluated": total.evaluated,
        "feasible": total.feasible,
        "bounded": total.bounded,
        "bounded_before_memory": total.bounded_before_memory,
        "elapsed_s": elapsed,
        "best": best,
    }


__all__ = ["MAX_LAYOUTS", "Cancelled", "Ranked", "SearchResult", "search", "step_time"]
