"""Sweeps: many search problems (clusters x models x workloads) run chunk by chunk with the same pure function
as the search, ``planner.search.evaluate_shapes(problem, shapes)``, on local processes or on Ray.

Every problem's shapes are cut into chunks; chunks run anywhere (they read only their arguments), outcomes
merge per problem, and each problem's best layouts are re-evaluated with ``build_plan`` (as the search
does). One row per problem and rank: its label, the layout, step time, memory peak, feasible counts.
"""

from __future__ import annotations

import concurrent.futures as cf
import csv
import multiprocessing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .search import Outcome, Problem, evaluate_shapes, space_of
from .search.engine import CHUNK_LAYOUTS, _exact, chunks

ENGINES = ("local", "ray")


@dataclass(frozen=True)
class Task:
    label: str
    problem: Problem


def _tasks(tasks: list[Task]) -> list[tuple[int, list]]:
    out = []
    for i, task in enumerate(tasks):
        space = space_of(task.problem)
        outcome = Outcome()
        shapes = list(space.shapes(outcome.pruned))

        def cost(s, space=space):
            return space.variants_per_shape(s.tp, s.pp) * len(space.micro_batches(s.dp)) * len(space.recomputes)

        out += [(i, part) for part in chunks(shapes, cost, CHUNK_LAYOUTS)]
    return out


def run(
    tasks: list[Task],
    engine: str = "local",
    workers: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> list[dict]:
    """Rows of the sweep; ``progress(done_chunks, total_chunks)`` after each chunk."""
    parts = _tasks(tasks)
    merged = [Outcome() for _ in tasks]
    for task, out in zip(tasks, merged, strict=True):
        list(space_of(task.problem).shapes(out.pruned))  # the shapes pruned up front, counted once
    runner = {"local": _local, "ray": _ray}[engine]
    for done, (i, outcome) in enumerate(runner(tasks, parts, workers), 1):
        merged[i].merge(outcome, tasks[i].problem.keep)
        if progress:
            progress(done, len(parts))
    rows = []
    for task, out in zip(tasks, merged, strict=True):
        ranked = _exact(task.problem, out)
        base = {"label": task.label, "evaluated": out.evaluated, "feasible": out.feasible}
        if not ranked:
            rows.append(base | {"rank": 0})
        for rank, r in enumerate(ranked, 1):
            p = r.layout.parallel
            rows.append(
                base
                | {"rank": rank, "tp": p.tp, "cp": p.cp, "pp": p.pp, "dp": p.dp, "ep": p.ep,
                   "virtual_pipeline_stages": p.virtual_pipeline_stages, "pipeline_schedule": p.pipeline_schedule,
                   "first_stage_layers": p.first_stage_layers, "ep_dispatch": p.ep_dispatch, "zero_stage": p.zero_stage,
                   "sequence_parallel": p.sequence_parallel, "framework": p.framework,
                   "micro_batch_size": r.layout.micro_batch_size,
                   "activation_recompute": r.layout.activation_recompute,
                   "recompute_method": r.layout.choice.method, "recompute_num_layers": r.layout.choice.num_layers,
                   "step_time_s": r.time_s,
                   "peak_memory_bytes": r.plan.memory.peak_bytes if r.plan.memory else 0}
            )  # fmt: skip
    return rows


def _chunk(problem: Problem, shapes: list) -> Outcome:
    return evaluate_shapes(problem, shapes)


def _local(tasks, parts, workers):
    if workers == 1:
        for i, shapes in parts:
            yield i, _chunk(tasks[i].problem, shapes)
        return
    with cf.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
        futures = {pool.submit(_chunk, tasks[i].problem, shapes): i for i, shapes in parts}
        for future in cf.as_completed(futures):
            yield futures[future], future.result()


def _ray(tasks, parts, workers):
    """Each chunk a Ray task; the caller has connected (ray.init) to a cluster or lets this start a local one."""
    import ray

    if not ray.is_initialized():
        ray.init(num_cpus=workers)
    remote = ray.remote(_chunk)
    refs = {remote.remote(tasks[i].problem, shapes): i for i, shapes in parts}
    pending = list(refs)
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        yield refs[done[0]], ray.get(done[0])


def write(rows: list[dict], path: str) -> str:
    """Parquet when the path ends in .parquet (pyarrow), else CSV."""
    columns = sorted({k for r in rows for k in r}, key=lambda k: list(rows[0]).index(k) if k in rows[0] else 99)
    if path.endswith(".parquet"):
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist([{c: r.get(c) for c in columns} for r in rows]), path)
        return path
    with Path(path).open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    return path


__all__ = ["ENGINES", "Task", "run", "write"]
