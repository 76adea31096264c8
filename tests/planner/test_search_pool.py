"""The search's worker pool: a dropped pool (a cancelled or broken search) leaves no worker computing, even when
the parent runs a server whose SIGTERM handler only flags (uvicorn's, which forked workers inherit)."""

import gc
import os
import signal
import time

from planner.search import engine


def _spin(seconds: float) -> int:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass
    return os.getpid()


def _gone(pid: int) -> bool:
    """No running process ``pid``: none at all, or a zombie waiting to be reaped (Linux /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] in "ZX"
    except FileNotFoundError:
        return True


def test_a_dropped_pool_stops_its_busy_workers_at_once():
    previous = signal.signal(signal.SIGTERM, lambda *_: None)  # a server's handler that only flags
    try:
        pool = engine._pool(2)
        for _ in range(2):
            pool.submit(_spin, 20.0)
        deadline = time.monotonic() + 10
        while len(pool._processes) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)  # both workers busy
        workers = list(pool._processes.values())
        start = time.monotonic()
        engine._drop_pool(2)
        for proc in workers:
            proc.join(5)
        # stopped: exited, or reaped by another waiter (the executor's own thread may reap a worker first, and
        # Process.exitcode then stays None), never still spinning
        assert all(proc.exitcode == -signal.SIGKILL or _gone(proc.pid) for proc in workers)
        assert time.monotonic() - start < 5  # not the 20 s they were asked to spin
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_a_worker_collects_its_young_objects_every_10000_not_700():
    """A forked worker runs chunks of screening for a long time: its collector's young threshold is
    GC_YOUNG_THRESHOLD (engine.py: 634 collections -> 27 on a 405B slice), the middle one GC_MIDDLE_THRESHOLD (100:
    speed11b), the oldest as the parent's."""
    before = gc.get_threshold()
    engine._drop_pool(2)  # a pool forked before this test's parent threshold would prove nothing
    gc.set_threshold(700, *before[1:])  # CPython's default in the parent
    try:
        pool = engine._pool(2)
        assert pool.submit(gc.get_threshold).result(timeout=30) == (10_000, 100, before[2])
        assert engine.GC_MIDDLE_THRESHOLD == 100 and gc.get_threshold()[1] == before[1]
        assert engine.GC_YOUNG_THRESHOLD == 10_000 and gc.get_threshold()[0] == 700  # the parent's own kept
    finally:
        engine._drop_pool(2)
        gc.set_threshold(*before)


def test_lanes_keep_each_tp_in_one_lane_and_every_shape_once():
    """engine.lanes (speed11b): the chunks of each tp's shapes in one lane (the process memos key on tp), every shape
    exactly once in the walk's order within its tp, the lanes' work within the largest tp group's of each other."""
    from collectives.topology import cluster_preset
    from planner import MODEL_PRESETS, WorkloadSpec
    from planner.search import Problem
    from planner.search.evaluate import space_of
    from planner.search.space import Pruned

    problem = Problem(MODEL_PRESETS["gpt3-175b"], WorkloadSpec(global_batch_size=1536), cluster_preset("dgx-a100", 128))
    space = space_of(problem)
    shapes = list(space.shapes(Pruned()))

    def cost(shape):
        return space.variants_per_shape(shape.tp, shape.pp) * len(space.micro_batches(shape.dp))

    for workers in (2, 3):
        lanes = engine.lanes(shapes, cost, engine.CHUNK_LAYOUTS, workers)
        flat = [shape for lane in lanes for part in lane for shape in part]
        assert sorted(map(repr, flat)) == sorted(map(repr, shapes))
        tps = [{shape.tp for part in lane for shape in part} for lane in lanes]
        assert all(not (a & b) for i, a in enumerate(tps) for b in tps[i + 1 :])
        for tp in {s.tp for s in shapes}:  # within a tp, the walk's order
            assert [s for s in flat if s.tp == tp] == [s for s in shapes if s.tp == tp]
        loads = [sum(cost(s) for part in lane for s in part) for lane in lanes]
        biggest = max(sum(cost(s) for s in shapes if s.tp == tp) for tp in {s.tp for s in shapes})
        assert max(loads) - min(loads) <= biggest


def _chunk_sum(part: list[int]) -> tuple[int, int]:
    return os.getpid(), sum(part)


def test_in_lanes_runs_every_chunk_once_and_an_empty_lane_takes_from_the_fullest():
    """engine._in_lanes: every chunk handed out once and merged once, a lane left empty taking the other's last chunks
    (lane 1 has none of its own: without taking them, its worker would idle and the chunks still run, in order)."""
    merged = []
    lanes = [[[i] for i in range(12)], []]
    try:
        engine._in_lanes(2, lanes, lambda part: (_chunk_sum, (part,)), merged.append, lambda: None, None)
    finally:
        engine._drop_pool(2)  # not left for the interpreter's exit (its executor thread's weakref callback)
    assert sorted(total for _, total in merged) == list(range(12))
