"""Review r14d's findings on mend14c over HTTP (mend14e): Megatron-LM 2021-22 has no --tp-comm-overlap (#4), the
userbuffers methods under frameworks without userbuffers (#4), tp_comm_overlap at tp 1 under Megatron d98e8a6 (#6)."""

from __future__ import annotations

import pytest

BODY = {
    "model": {"preset": "llama3-8b"},
    "cluster": {"preset": "dgx-h100"},
    "workload": {"micro_batch_size": 1, "global_batch_size": 64},
    "parallel": {"tp": 2, "sequence_parallel": True},
}


def _post(api, parallel=None, overlap=None, workload=None):
    body = {**BODY, "parallel": BODY["parallel"] | (parallel or {}), "workload": BODY["workload"] | (workload or {})}
    if overlap:
        body["options"] = {"overlap": overlap}
    return api.post("/v1/plan", json=body)


def _error(r) -> tuple[str, str]:
    assert r.status_code == 422, r.text
    (err,) = r.json()["detail"]
    return ".".join(map(str, err["loc"][1:])), err["msg"]


def test_megatron_lm_2021_has_no_tp_comm_overlap(api):
    """r14d #4: Llama-3 8B, tp 2 with SP under megatron-lm-2021 priced TE userbuffers (1.876 s -> 1.739 s) that its
    commits (6985e58, 55ba1f7b96) do not have. Now a 422 naming the framework and the commits; without it, a plan."""
    assert _post(api, {"framework": "megatron-lm-2021"}).status_code == 200
    field, msg = _error(_post(api, {"framework": "megatron-lm-2021"}, {"tp_comm_overlap": True}))
    assert field == "options.overlap.tp_comm_overlap"
    assert "'megatron-lm-2021'" in msg and "6985e58" in msg and "55ba1f7b96" in msg


@pytest.mark.parametrize("framework", ["megatron-lm-2021", "torch", "deepspeed"])
@pytest.mark.parametrize("name", ["userbuffers_proj_fprop", "userbuffers_fc2_fprop"])
def test_userbuffers_methods_refused_where_no_userbuffers_run(api, framework, name):
    """The userbuffers methods were silently ignored under torch and deepspeed (200, no assumption row): a 422 naming
    the field and the framework, as the other framework-only switches (parallel._framework_switches)."""
    field, msg = _error(_post(api, {"framework": framework}, workload={name: "pipeline"}))
    assert field == f"workload.{name}" and repr(framework) in msg and "userbuffers" in msg


def test_userbuffers_methods_still_read_by_megatron(api):
    ring = _post(api, None, {"tp_comm_overlap": True}, {"userbuffers_fc2_fprop": "ring_exchange"})
    pipe = _post(api, None, {"tp_comm_overlap": True})
    assert ring.status_code == pipe.status_code == 200
    rows = lambda r: {a["field"]: a["value"] for a in r.json()["assumptions"]}  # noqa: E731
    assert rows(ring)["workload.userbuffers_fc2_fprop"] == "ring_exchange"
    assert rows(pipe)["workload.userbuffers_fc2_fprop"] == rows(pipe)["workload.userbuffers_proj_fprop"] == "pipeline"


@pytest.mark.parametrize("sp", [True, False])
def test_tp_comm_overlap_at_tp_1_is_refused(api, sp):
    """r14d #6: Megatron d98e8a64dd turns SP off at tp 1 before it asserts SP under --tp-comm-overlap: a 422 at tp 1
    whatever sequence_parallel says (it answered 200)."""
    field, msg = _error(_post(api, {"tp": 1, "sequence_parallel": sp}, {"tp_comm_overlap": True}))
    assert field == "options.overlap.tp_comm_overlap" and "tp 1" in msg and "d98e8a64dd" in msg
