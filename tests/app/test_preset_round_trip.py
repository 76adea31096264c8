"""A model preset read from GET /v1/presets/models posts back as it is (hostile13 found every one a 422 at its
descriptive keys): the descriptive keys are kept, the derived counts are checked against the fields."""

from __future__ import annotations

import pytest

from planner import MODEL_PRESETS

BODY = {
    "cluster": {"preset": "dgx-h100", "num_nodes": 2},
    "parallel": {"tp": 1, "pp": 1},
    "workload": {"kind": "training", "micro_batch_size": 1, "global_batch_size": 16, "seq_length": 1024},
}


@pytest.fixture(scope="module")
def presets(api):
    return api.get("/v1/presets/models").json()


@pytest.mark.parametrize("name", ["llama3-8b", "mixtral-8x7b", "deepseek-v3", "gpt-oss-20b"])
def test_a_preset_as_read_plans_as_the_preset_itself(api, presets, name):
    read = presets[name]
    assert read["params_total"] == MODEL_PRESETS[name].total_params()
    as_read = api.post("/v1/plan", json=BODY | {"model": read})
    by_name = api.post("/v1/plan", json=BODY | {"model": {"preset": name}})
    assert as_read.status_code == by_name.status_code
    if by_name.status_code == 200:  # the same plan: the descriptive keys change nothing priced
        assert as_read.json()["step"]["time_s"] == by_name.json()["step"]["time_s"]
        assert as_read.json()["params_total"] == read["params_total"]


def test_a_derived_count_that_the_fields_do_not_give_is_a_422_with_both_numbers(api, presets):
    edited = presets["llama3-8b"] | {"num_layers": 16}  # the count left as read: 8,030,261,248
    r = api.post("/v1/plan", json=BODY | {"model": edited})
    assert r.status_code == 422
    (err,) = r.json()["detail"]
    assert err["loc"] == ["body", "model", "params_total"]
    assert "4,540,469,248" in err["msg"] and "8,030,261,248" in err["msg"]
    dropped = {k: v for k, v in edited.items() if k not in ("params_total", "params_active")}
    assert api.post("/v1/plan", json=BODY | {"model": dropped}).status_code == 200
