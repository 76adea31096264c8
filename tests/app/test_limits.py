"""The pieces of app/limits.py and planner/deadline.py on their own: the work model's closed forms, the
non-finite filter, the neighbourhood count, error-body sanitising and the cooperative deadline."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from app.errors import safe
from app.limits import (
    ALL_WEIGHT,
    ALLTOALL_WEIGHT,
    BLOCKED_WEIGHT,
    ROUTE_WEIGHT,
    SCHEDULE_WEIGHT,
    call_work,
    groups_priced,
    non_finite,
    router_work,
)
from collectives.topology import cluster_preset
from planner import deadline


def test_call_work_closed_forms():
    n, g = 1024, 4  # log2 1024 = 10
    base = SCHEDULE_WEIGHT * n * 10 + ROUTE_WEIGHT * g * n * 10
    assert call_work("allreduce", n, g) == base
    assert call_work("allgather", n, g, in_network=True) == base + BLOCKED_WEIGHT * n * n
    assert call_work("allgather", n, g, algorithm="ring", in_network=True) == base  # in-network not tried
    assert call_work("alltoall", n, g) == base + (ALLTOALL_WEIGHT + g) * n * n
    assert call_work("allreduce", n, g, candidates="all") == base + (ALL_WEIGHT + g) * n * n
    assert call_work("allreduce", n, g, sizes=14) == 14 * base
    assert call_work("sendrecv", 1, 100) == 0


def test_router_work_is_quadratic_in_routers():
    assert router_work(cluster_preset("tpu-torus", 512)) == 512**2
    assert router_work(cluster_preset("tpu-torus", 1)) == 0
    assert router_work(cluster_preset("dgx-h100", 4096)) == 0  # fat-tree: no search


def test_groups_priced_counts_the_neighbourhood():
    spec = cluster_preset("dgx-h100", 128)  # 32 nodes x 8 GPUs = 256 devices per leaf unit, 4 units
    tp = np.arange(1024).reshape(128, 8)  # TP groups: one node each
    assert groups_priced(tp, spec, exact=False) == 32  # the groups of group 0's unit
    assert groups_priced(tp, spec, exact=True) == 128
    dp = tp.T.copy()  # 8 groups, each across every node
    assert groups_priced(dp, spec, exact=False) == 8


@pytest.mark.parametrize(
    ("body", "bad"),
    [
        (b'{"a": NaN}', "NaN"),
        (b'{"a": [1, -Infinity]}', "-Infinity"),
        (b'{"a": 1e309}', "1e309"),
        (b'{"a": 1e308}', None),
        (b'{"a": "NaN and 1e999 inside a string"}', None),
        (b'{"a": 123456789e-300}', None),
        (b"not json NaN", None),  # FastAPI answers unreadable bodies itself
    ],
)
def test_non_finite_numbers_are_found(body, bad):
    assert non_finite(body) == bad


def test_safe_makes_every_error_encodable():
    value = {"\ud800": [float("nan"), float("inf"), "x\udfffy", 2**70, True, None, ("t",)]}
    encoded = json.dumps(safe(value), allow_nan=False, ensure_ascii=False).encode("utf-8")
    assert json.loads(encoded) == {"\\ud800": ["nan", "inf", "x\\udfffy", 2**70, True, None, ["t"]]}


def test_deadline_check_is_a_no_op_outside_a_request():
    assert deadline.current() is None
    deadline.check()


def test_deadline_check_raises_once_the_time_is_up():
    with deadline.bounded(deadline.Deadline(0.05)) as d:
        deadline.check()
        time.sleep(0.06)
        with pytest.raises(deadline.DeadlineExceeded) as caught:
            deadline.check()
        assert caught.value.reason == "deadline" and d.expired()
    assert deadline.current() is None


def test_deadline_cancel_names_the_reason():
    with deadline.bounded(deadline.Deadline(60)) as d:
        d.cancel("disconnected")
        with pytest.raises(deadline.DeadlineExceeded) as caught:
            deadline.check()
    assert caught.value.reason == "disconnected"
