"""DeepSpeed's pipeline engine over HTTP (planner/flavours/deepspeed.py; tests/planner/test_deepspeed_pipeline.py):
the partitioned sends, the three TP gathers a micro-batch (``pp.gather_output`` the sender's own) and the four
blocking transfers a steady-state micro-batch waits on, in closed form on the answer's own ledger prices."""

from dataclasses import replace

import pytest

from planner import flavours
from planner.flavours.deepspeed import FLAVOUR as DEEPSPEED

A = 2048 * 12288 * 2  # the boundary tensor of one micro-batch: s x b x h x 2 B
BODY = {
    "model": {"preset": "gpt3-175b", "num_layers": 4},
    "workload": {"micro_batch_size": 1, "global_batch_size": 8, "activation_recompute": "full"},
    "parallel": {"tp": 8, "pp": 2, "dp": 1, "zero_stage": 1, "pipeline_schedule": "1f1b"},
    "cluster": {"preset": "dgx-a100", "num_nodes": 2},
}


@pytest.fixture
def batched():
    """DeepSpeed as if its transfers were batched into 1F1B's two exchanges a micro-batch."""
    flavours.register(replace(DEEPSPEED, name="ds-batched-http", pp_unbatched_transfers=False))
    yield "ds-batched-http"
    flavours.unregister("ds-batched-http")


def test_deepspeed_pipeline_over_http(api, batched):
    answers = {}
    for framework in ("deepspeed", batched):
        r = api.post("/v1/plan", json=BODY | {"parallel": BODY["parallel"] | {"framework": framework}})
        assert r.status_code == 200, r.text
        answers[framework] = r.json()
    calls = {c["name"]: c for c in answers["deepspeed"]["calls"] if c["name"].startswith("pp.")}
    assert sorted(calls) == ["pp.activation", "pp.activation_grad", "pp.gather", "pp.gather_grad", "pp.gather_output"]
    assert calls["pp.activation"]["message_bytes"] == A // 8
    assert calls["pp.gather_output"]["message_bytes"] == A and calls["pp.gather_output"]["phase"] == "backward"
    s, g = calls["pp.activation"]["time_s"], calls["pp.gather"]["time_s"]
    longer = answers["deepspeed"]["step"]["time_s"] - answers[batched]["step"]["time_s"]
    # m = 8 micro-batches x (4 s + 3 g, less 1F1B's 2 (s + g)): 8 (2 s + g)
    assert s > 1e-4 and g > 1e-4 and longer == pytest.approx(8 * (2 * s + g), rel=1e-6)


@pytest.mark.parametrize("schedule, extra", [("interleaved", {"virtual_pipeline_stages": 2}), ("gpipe", {})])
def test_deepspeed_runs_only_1f1b(api, schedule, extra):
    """DeepSpeed's PipelineEngine trains with schedule.TrainSchedule (1F1B) alone: another schedule is a 422 naming
    the field, the framework, the schedules it runs and the pp; the search never offers one (it prunes by the rule)."""
    parallel = BODY["parallel"] | {"framework": "deepspeed", "pipeline_schedule": schedule} | extra
    r = api.post("/v1/plan", json=BODY | {"parallel": parallel})
    assert r.status_code == 422, r.text
    (err,) = r.json()["detail"]
    assert err["loc"] == ["body", "parallel", "pipeline_schedule"]
    assert err["msg"] == f"framework 'deepspeed' runs only the 1f1b pipeline schedule(s), got '{schedule}' at pp 2"
    ok = api.post("/v1/plan", json=BODY | {"parallel": parallel | {"framework": "megatron"}})
    assert ok.status_code == 200 or schedule == "gpipe", ok.text
