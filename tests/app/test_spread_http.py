"""cluster.gpu.variability over HTTP (spread15, planner/spread.py): the default and its Assumption row, 0 turns the
slowest-GPU pace off exactly, the answer's step.spread_s, the response's cluster block carries a given value back,
and out-of-range values are a 422 naming the field, the rule and the numbers."""

from __future__ import annotations

import copy
import math

import pytest

from collectives.topology.gpu import GPU_VARIABILITY
from planner.spread import pace

SMALL = {
    "model": {"preset": "llama3-8b"},
    "workload": {"kind": "training", "micro_batch_size": 1, "global_batch_size": 32},
    "parallel": {"tp": 8, "dp": 4},
    "cluster": {"preset": "dgx-h100", "num_nodes": 4},
}


def _plan(api, variability=None) -> dict:
    body = copy.deepcopy(SMALL)
    if variability is not None:
        body["cluster"]["gpu"] = {"variability": variability}
    response = api.post("/v1/plan", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def test_default_off_and_given(api):
    default, off, given = _plan(api), _plan(api, 0), _plan(api, 0.05)
    k_default, k_given = pace(GPU_VARIABILITY, 32), pace(0.05, 32)
    assert off["step"]["spread_s"] == 0.0
    # the GPU-bound compute G of the median part grows by k exactly (the host's waits do not): spread_s = G (k - 1)
    assert default["step"]["spread_s"] > 0.0
    assert default["step"]["compute_s"] - default["step"]["spread_s"] == pytest.approx(off["step"]["compute_s"])
    assert given["step"]["compute_s"] - given["step"]["spread_s"] == pytest.approx(off["step"]["compute_s"])
    ratio = given["step"]["spread_s"] / default["step"]["spread_s"]
    assert ratio == pytest.approx((k_given - 1) / (k_default - 1), rel=1e-9) == pytest.approx(0.05 / GPU_VARIABILITY)
    assert off["step"]["time_s"] < default["step"]["time_s"] < given["step"]["time_s"]
    # the default is written null in the response's cluster block (as power_limit_w), a given value is carried back
    assert default["cluster"]["gpu"]["variability"] is None
    assert given["cluster"]["gpu"]["variability"] == 0.05
    assert off["cluster"]["gpu"]["variability"] == 0.0
    rows = {r["field"]: r for r in default["assumptions"]}
    row = rows["cluster.gpu.variability"]
    assert row["value"] == f"1.48% sigma; the slowest of 32 GPUs: +{k_default - 1:.2%} compute-bound time"
    assert "Sinha et al. SC'22" in row["source"] and "1.48%" in row["source"]
    assert not math.isnan(default["step"]["spread_s"])


@pytest.mark.parametrize("value, words", [(0.3, "less than or equal to 0.2"), (-0.01, "greater than or equal to 0")])
def test_out_of_range_is_a_422(api, value, words):
    body = copy.deepcopy(SMALL)
    body["cluster"]["gpu"] = {"variability": value}
    response = api.post("/v1/plan", json=body)
    assert response.status_code == 422, response.text
    text = response.text
    assert "variability" in text and words in text and str(value) in text
