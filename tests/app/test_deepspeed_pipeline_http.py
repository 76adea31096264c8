"""DeepSpeed's pipeline engine over HTTP (planner/flavours/deepspeed.py; tests/planner/test_deepspeed_pipeline.py):
the partitioned sends, the three TP gathers a micro-batch (``pp.gather_output`` the sender's own) and the four
blocking transfers a steady-state micro-batch waits on, in closed form on the answer's own ledger prices."""

import pytest

from planner.flavours.deepspeed import FLAVOUR as DEEPSPEED
from tests.flavour_variants import flavour_variant

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
    with flavour_variant(DEEPSPEED, "ds-batched-http", pp_unbatched_transfers=False) as name:
        yield name


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


@pytest.mark.parametrize("zero", [2, 3])
def test_deepspeed_pipeline_takes_zero_0_or_1(api, zero):
    """PipelineEngine.__init__ asserts ZeRO < 2 (deepspeed/runtime/pipe/engine.py at edaa722): ZeRO-2/3 beside pp > 1
    is a 422 at parallel.zero_stage; at pp 1 (no PipelineEngine) and at ZeRO-1 the plan is made."""
    parallel = BODY["parallel"] | {"framework": "deepspeed", "zero_stage": zero}
    r = api.post("/v1/plan", json=BODY | {"parallel": parallel})
    assert r.status_code == 422, r.text
    (err,) = r.json()["detail"]
    assert err["loc"] == ["body", "parallel", "zero_stage"]
    assert err["msg"] == (
        f"framework 'deepspeed' runs ZeRO stages up to 1 beside pipeline parallelism, got zero_stage {zero} at pp 2"
    )
    flat = BODY | {"parallel": parallel | {"pp": 1, "dp": 2}}
    assert api.post("/v1/plan", json=flat).status_code == 200
    assert api.post("/v1/plan", json=BODY | {"parallel": parallel | {"zero_stage": 1}}).status_code == 200


def test_deepspeed_has_no_overlapped_sends(api):
    """TrainSchedule's transfers block (pp_unbatched_transfers): overlap_p2p is a 422, not a silent 0 wait."""
    parallel = BODY["parallel"] | {"framework": "deepspeed"}
    body = BODY | {"parallel": parallel, "options": {"overlap": {"overlap_p2p": True}}}
    r = api.post("/v1/plan", json=body)
    assert r.status_code == 422, r.text
    (err,) = r.json()["detail"]
    assert err["loc"][-3:] == ["options", "overlap", "overlap_p2p"]
    assert "has no overlapped sends, got true at pp 2" in err["msg"]
    off = body | {"options": {"overlap": {"overlap_p2p": False}}}
    assert api.post("/v1/plan", json=off).status_code == 200
