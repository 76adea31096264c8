"""planner/invariants.py's fast path (speed5): calls and stages whose values are all plainly good pass without
naming each value; any other value is still refused with its dotted path, as before."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from planner.invariants import InvariantError, check_calls, check_memory

PRICE = dict(time_s=1e-3, algbw_GBps=100.0, busbw_GBps=175.0, bytes_sent_per_rank=2**20, bytes_received_per_rank=2**20)
CALL = dict(message_bytes=2**21, calls_per_iteration=4)


def _priced(price: dict | None = None, call: dict | None = None) -> SimpleNamespace:
    return SimpleNamespace(
        price=SimpleNamespace(**(PRICE | (price or {}))), call=SimpleNamespace(**(CALL | (call or {})))
    )


def test_good_calls_pass_and_an_int_time_is_a_time():
    check_calls([_priced(), _priced({"time_s": 0.0, "algbw_GBps": 0.0}), _priced({"time_s": 2})])


@pytest.mark.parametrize(
    ("price", "call", "path"),
    [
        ({"time_s": math.nan}, None, "calls.1.time_s"),
        ({"time_s": math.inf}, None, "calls.1.time_s"),
        ({"algbw_GBps": -1.0}, None, "calls.1.algbw_GBps"),
        ({"busbw_GBps": True}, None, "calls.1.busbw_GBps"),
        ({"busbw_GBps": "7"}, None, "calls.1.busbw_GBps"),
        ({"bytes_sent_per_rank": -8}, None, "calls.1.bytes_sent_per_rank"),
        ({"bytes_received_per_rank": -1}, None, "calls.1.bytes_received_per_rank"),
        (None, {"message_bytes": -2}, "calls.1.message_bytes"),
        (None, {"calls_per_iteration": -1}, "calls.1.calls_per_iteration"),
    ],
)
def test_a_bad_value_is_named_by_its_path(price, call, path):
    with pytest.raises(InvariantError) as err:
        check_calls([_priced(), _priced(price, call)])
    assert err.value.where == path


STAGE = dict(params_bytes=4, grads_bytes=3, optimizer_bytes=2, activations_bytes=1, buffers_bytes=0, peak_bytes=10)


@pytest.mark.parametrize("bad", [True, -1, 2.0])
def test_a_bad_stage_part_is_named_by_its_path(bad):
    good, wrong = SimpleNamespace(**STAGE), SimpleNamespace(**(STAGE | {"grads_bytes": bad}))
    check_memory(SimpleNamespace(capacity_bytes=10, per_stage=[good], fits=True))
    with pytest.raises(InvariantError) as err:
        check_memory(SimpleNamespace(capacity_bytes=10, per_stage=[good, wrong], fits=True))
    assert err.value.where == "memory.per_stage.1.grads_bytes"
