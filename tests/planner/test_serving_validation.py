"""The serving planner's held-out validation (bench/serving_validation.py; README "Accuracy", docs/serving.md):
nothing is fitted on these rows, so these are regression guards on the errors the docs state, with the published
numbers checked against their sources' tables."""

from __future__ import annotations

import pytest

from bench.serving_validation import DENSE, REQUESTS, dense_table, median_abs, table


@pytest.fixture(scope="module")
def lmsys() -> list[dict]:
    return table()


def test_two_batch_overlap_rows_within_target(lmsys):
    """LMSYS DeepSeek-V3 on 96 H100, as run (two-batch overlap on): prefill +13.4%, decode -7.4% (were +38.1% and
    +22.8% when the overlap hid every exchange); both within the 15% target."""
    on = {r["row"].split(",")[0]: r for r in lmsys if r["two_batch_overlap"]}
    assert on["DeepSeek-V3 prefill"]["published"] == 52_300 and on["DeepSeek-V3 decode"]["published"] == 22_300
    assert on["DeepSeek-V3 prefill"]["error"] == pytest.approx(0.134, abs=0.01)
    assert on["DeepSeek-V3 decode"]["error"] == pytest.approx(-0.074, abs=0.01)
    off = {r["row"].split(",")[0]: r for r in lmsys if not r["two_batch_overlap"]}
    gain = {k: on[k]["predicted"] / off[k]["predicted"] for k in on}
    # the overlap is worth 34% in prefill and 9% in decode here
    assert gain["DeepSeek-V3 prefill"] == pytest.approx(1.34, abs=0.02)
    assert gain["DeepSeek-V3 decode"] == pytest.approx(1.09, abs=0.02)


def test_dense_table_held_out():
    """TensorRT-LLM's perf-overview (v1.0 docs): 24 rows of Llama 3.3 70B and 3.1 405B on H100 and H200. Median
    |error| 12.7%, signed median -12.4%, worst -23.1%, one row over (+2.3%): still biased slow, stated. Was 17.5%
    (-16.6%) on this main before TensorRT-LLM's fused all-reduce (planner/serving/fused_allreduce.py: 14.0%) and
    its KV fraction taken of the free memory (_util.py KvCacheCreator._cal_max_memory: 12.7%)."""
    assert len(REQUESTS) == 6 and sum(len(rows) for *_, rows in DENSE) == 24
    assert DENSE[1][3][(128, 2048)] == 4336  # H200 TP1 (FP8), 128/2048, the doc's table
    rows = dense_table()
    assert median_abs(rows) == pytest.approx(0.127, abs=0.01)
    assert all(-0.25 < r["error"] < 0.03 for r in rows) and sum(r["error"] > 0 for r in rows) == 1
    assert all(r["batch"] <= REQUESTS[tuple(map(int, r["row"].split()[-1].split("/")))] for r in rows)
