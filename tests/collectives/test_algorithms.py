"""Every algorithm, executed: right answer, and the bytes and steps its closed form promises."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import collectives as c
from collectives.algorithms import Request, implementations
from collectives.algorithms._base import floor_pow2, pipeline_chunks
from collectives.schedule import compress

IMPLS = [(i.algorithm, i.op.value) for i in implementations()]


def granularity(algorithm: str, op: str, n: int) -> int:
    """The message unit (elements) at which the algorithm's chunks are all equal: closed forms are exact
    for multiples of it; between multiples the bytes lie between the two neighbouring closed forms."""
    if op == "sendrecv" or (op in ("broadcast", "reduce") and algorithm != "ring"):
        return 1
    if op == "broadcast":
        return 1
    if algorithm == "halving_doubling" and op == "allreduce":
        return floor_pow2(n)
    if algorithm == "double_binary_tree":
        return 2 * pipeline_chunks(1)
    if algorithm in ("recursive_doubling", "binomial_tree", "in_network", "swing") and op == "allreduce":
        return 1
    return n


def local_size_for(algorithm: str, n: int) -> int:
    """Hierarchical needs a node size that divides n: take the largest of 4, 2, 1 that does."""
    if algorithm != "hierarchical":
        return 1
    return next(g for g in (4, 2, 1) if n % g == 0)


def supported(algorithm: str, op: str, n: int) -> bool:
    if op == "sendrecv":
        return n == 2
    impl = c.lookup(algorithm, c.parse_op(op))
    return impl.check(Request(impl.op, n, n, 4, 0, local_size_for(algorithm, n))) is None


def run(algorithm, op, n, count, dtype="int32", reduction="sum", root=0):
    return c.verify(
        op,
        algorithm,
        n,
        count,
        dtype,
        seed=n * 1000 + count,
        reduction=reduction,
        root=root,
        local_size=local_size_for(algorithm, n),
    )


@pytest.mark.parametrize(("algorithm", "op"), IMPLS)
def test_executed_equals_reference_and_closed_form_for_n_up_to_64(algorithm, op):
    checked = 0
    for n in range(1, 65):
        if not supported(algorithm, op, n):
            continue
        for multiple in (0, 1, 3):
            count = granularity(algorithm, op, n) * multiple
            v = run(algorithm, op, n, count)
            assert v.ok, (n, count, v.max_abs_error)
            assert v.steps == v.expected_steps, (n, count)
            assert v.bytes_sent_per_rank == v.expected_bytes_sent_per_rank, (n, count)
            assert v.bytes_received_per_rank == v.expected_bytes_received_per_rank, (n, count)
            checked += 1
    assert checked >= 3


@pytest.mark.parametrize(("algorithm", "op"), IMPLS)
@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 40), count=st.integers(0, 300), root=st.integers(0, 39), data=st.data())
def test_any_count_is_exact_and_bytes_bracketed_by_closed_forms(algorithm, op, n, count, root, data):
    if not supported(algorithm, op, n):
        return
    if op == "alltoall":
        count -= count % n
    root = root % n if op in ("broadcast", "reduce", "gather", "scatter") else 0
    dtype = data.draw(st.sampled_from(["int32", "float32", "float64", "int64"]))
    v = run(algorithm, op, n, count, dtype=dtype, root=root)
    assert v.ok, (n, count, v.max_abs_error, v.tolerance)
    assert v.steps == v.expected_steps
    unit = granularity(algorithm, op, n)
    low, high = count - count % unit, count - count % unit + (unit if count % unit else 0)
    itemsize = np.dtype(dtype).itemsize
    ls = local_size_for(algorithm, n)
    below = c.closed_form(op, algorithm, n, low * itemsize, local_size=ls)
    above = c.closed_form(op, algorithm, n, high * itemsize, local_size=ls)
    assert below.bytes_sent <= v.bytes_sent_per_rank <= above.bytes_sent
    assert below.bytes_received <= v.bytes_received_per_rank <= above.bytes_received


@pytest.mark.parametrize("reduction", ["sum", "max", "min", "avg"])
@pytest.mark.parametrize(("algorithm", "op"), [i for i in IMPLS if i[1] in ("allreduce", "reducescatter", "reduce")])
def test_every_reduction(algorithm, op, reduction):
    for n in (1, 2, 5, 8):
        if supported(algorithm, op, n):
            assert run(algorithm, op, n, 8 * n, dtype="float64", reduction=reduction).ok


@pytest.mark.parametrize(("algorithm", "op"), IMPLS)
def test_step_classes_agree_with_the_executed_steps(algorithm, op):
    """The compressed view used for pricing carries exactly the executed steps' traffic."""
    for n in (1, 2, 3, 4, 6, 8, 12, 16):
        if not supported(algorithm, op, n):
            continue
        count = 5 * granularity(algorithm, op, n) + (1 if op != "alltoall" else 0)
        s = c.build_schedule(op, algorithm, n, count, 4, local_size=local_size_for(algorithm, n))
        assert _per_pair(s.step_classes()) == _per_pair(compress(s.steps(), s.slot_bytes))
        assert s.num_steps == sum(k.repeat for k in compress(s.steps(), s.slot_bytes))


def _per_pair(classes) -> dict:
    totals: dict = {}
    for k in (k.expanded() for k in classes):
        for src, dst, nbytes in zip(k.src.tolist(), k.dst.tolist(), k.nbytes.tolist(), strict=True):
            totals[(src, dst)] = totals.get((src, dst), 0) + nbytes
    return {pair: b for pair, b in totals.items() if b}


def test_ring_allreduce_meets_the_bandwidth_lower_bound():
    """Patarasuk & Yuan 2009: no allreduce sends less than 2(n-1)/n M per rank; the ring attains it."""
    for n in (2, 3, 8, 64):
        m = 1 << 20
        assert c.closed_form("allreduce", "ring", n, m).bytes_sent == 2 * (n - 1) * m // n
        for algorithm in ("halving_doubling", "recursive_doubling", "double_binary_tree", "binomial_tree"):
            assert c.closed_form("allreduce", algorithm, n, m).bytes_sent >= 2 * (n - 1) * m // n


def test_textbook_values():
    m = 1 << 20
    assert c.closed_form("allreduce", "recursive_doubling", 8, m) == c.Cost(3, 3 * m, 3 * m)
    assert c.closed_form("allreduce", "halving_doubling", 8, m) == c.Cost(6, 7 * m // 4, 7 * m // 4)
    # non-power-of-two: fold 2 extra ranks of 6 into the 4-rank core (+2 steps, +M)
    assert c.closed_form("allreduce", "halving_doubling", 6, m) == c.Cost(6, 3 * m // 2 + m, 3 * m // 2 + m)
    assert c.closed_form("alltoall", "bruck", 8, m) == c.Cost(3, 3 * m // 2, 3 * m // 2)
    assert c.closed_form("allreduce", "in_network", 64, m) == c.Cost(2, m, m)
    assert c.closed_form("allreduce", "swing", 16, m) == c.Cost(4, 4 * m, 4 * m)
    # hierarchical 4 nodes x 8: intra 2*7/8 M, inter 2*3/(4*8) M
    assert c.closed_form("allreduce", "hierarchical", 32, m, local_size=8).bytes_sent == 7 * m // 4 + 3 * m // 16


def test_alpha_beta_time_and_lower_bound():
    ring = c.closed_form("allreduce", "ring", 8, 1 << 20)
    alpha, beta = 5e-6, 1 / 100e9
    assert ring.time(alpha, beta) == pytest.approx(14 * alpha + 2 * 7 / 8 * (1 << 20) * beta)
    assert c.allreduce_lower_bound(8, 1 << 20) == ring.bytes_sent
    # halving-doubling: same bandwidth term, fewer latency terms: faster when alpha dominates
    hd = c.closed_form("allreduce", "halving_doubling", 8, 1 << 20)
    assert hd.time(1e-3, beta) < ring.time(1e-3, beta)


@pytest.mark.parametrize("algorithm,op", IMPLS)
def test_a_schedule_names_the_pair_it_is_registered_as(algorithm, op):
    """Each builder writes its algorithm's name into the Schedule itself: it must be the registered one (the
    pricer, /verify and the answers report it), and the op and group the request's."""
    n = 8
    impl = c.algorithms.lookup(algorithm, c.Op(op))
    req = Request(c.Op(op), n, 64, 4, root=3 if op != "sendrecv" else 0, local_size=local_size_for(algorithm, n))
    if op == "sendrecv":
        req = Request(c.Op(op), 2, 64, 4)
    schedule = impl.build(req)
    assert (schedule.algorithm, schedule.op, schedule.num_ranks) == (algorithm, c.Op(op), req.num_ranks)
    assert (schedule.count, schedule.itemsize) == (64, 4)
