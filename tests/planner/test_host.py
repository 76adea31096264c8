"""The host beside the GPU (planner/host.py, issue 20 moehost): the two queues' closed form against a step-by-step
simulation, its host- and GPU-bound limits, the per-kernel floor it replaces, and the steady state of a layer that
syncs once per forward."""

import random

import pytest

from planner.host import free_running, stream_span, synced_period


def simulate(launches, syncs=(), layers=1):
    """Two queues step by step (the module docstring's recurrence), launch by launch: host H += c, start
    S = max(H, E), end E = S + d; after a launch in ``syncs`` the host waits, H = max(H, E). ``layers`` repeats the
    list. Returns each layer's end (the GPU's end of its last launch, or the host's wait, whichever is later)."""
    host = end = 0.0
    ends = []
    for _ in range(layers):
        for i, (c, d, n) in enumerate(launches):
            for _ in range(n):
                host += c
                end = max(host, end) + d / n
            if i in syncs:
                host = max(host, end)
        ends.append(max(host, end))
    return ends


def drawn(rng, k=12):
    return [(rng.choice((0.0, 5e-6, 1e-5, 3e-5)), rng.choice((0.0, 2e-6, 1e-5, 4e-5, 3e-4)), rng.randint(1, 5))
            for _ in range(k)]  # fmt: skip


def test_the_span_is_the_simulated_end_of_the_last_kernel():
    rng = random.Random(20)
    for _ in range(300):
        launches = drawn(rng)
        assert stream_span(launches) == pytest.approx(simulate(launches)[0] if launches else 0.0, rel=1e-12, abs=1e-15)


def test_host_bound_gpu_bound_and_the_floor():
    # host-bound (every kernel shorter than its launch): the host's time and the last kernel
    tiny = [(1e-5, 2e-6, 1)] * 50
    assert stream_span(tiny) == pytest.approx(50 * 1e-5 + 2e-6)
    # GPU-bound from the first launch: one launch and the GPU's sum
    big = [(1e-5, 1e-3, 1)] * 50
    assert stream_span(big) == pytest.approx(1e-5 + 50e-3)
    # a group of n alike enters by its first or its last launch
    assert stream_span([(1e-5, 4 * 2e-6, 4)]) == pytest.approx(4e-5 + 2e-6)
    assert stream_span([(1e-5, 4 * 1e-3, 4)]) == pytest.approx(1e-5 + 4e-3)
    # the per-kernel floor sum max(d, c) is never below the span by more than one min(c, d)
    rng = random.Random(7)
    for _ in range(300):
        launches = drawn(rng)
        floor = sum(max(d, c * n) for c, d, n in launches)
        slack = max((min(c, d / n) for c, d, n in launches), default=0.0)
        assert stream_span(launches) <= floor + slack + 1e-15


def test_a_layer_that_syncs_once_runs_its_period_in_the_steady_state():
    rng = random.Random(21)
    for _ in range(200):
        launches = drawn(rng)
        sync = rng.randrange(len(launches))
        ends = simulate(launches, syncs=(sync,), layers=6)
        # from the second sync on, every layer takes the period
        period = synced_period(launches, sync)
        assert ends[-1] - ends[-2] == pytest.approx(period, rel=1e-9, abs=1e-15)


def test_launches_enqueued_before_the_wait_start_the_next_period_queued():
    """Megatron copies the counts to the host, permutes, then waits (token_dispatcher.py): the permute's kernels
    are on the queue when the host resumes. Simulated: the wait after launch ``sync + 1`` is for the GPU's end of
    launch ``sync`` (the event recorded after the copy)."""

    def run(launches, sync, layers=6):
        host = end = 0.0
        event = 0.0
        marks = []
        for _ in range(layers):
            for i, (c, d, n) in enumerate(launches):
                for _ in range(n):
                    host += c
                    end = max(host, end) + d / n
                if i == sync:
                    event = end
                if i == sync + 1:
                    host = max(host, event)
                    marks.append(host)
        return marks

    rng = random.Random(22)
    for _ in range(200):
        launches = drawn(rng)
        sync = rng.randrange(len(launches) - 1)
        marks = run(launches, sync)
        assert marks[-1] - marks[-2] == pytest.approx(synced_period(launches, sync, queued=1), rel=1e-9, abs=1e-15)


def test_a_pass_without_a_sync_runs_at_its_slower_queue():
    launches = [(1e-5, 3e-5, 2), (1e-5, 1e-6, 6)]
    assert free_running(launches) == pytest.approx(max(8 * 1e-5, 3.1e-5))
    # many such layers back to back: the simulation's rate per layer
    ends = simulate(launches, layers=40)
    assert (ends[-1] - ends[-11]) / 10 == pytest.approx(free_running(launches))
