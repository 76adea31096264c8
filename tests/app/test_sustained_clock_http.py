"""The H200's own sustained clock over HTTP (sus12): no request field carries GPUSpec.sustained_clock, so the answered
cluster names the preset whose measured clock the GPU carries, and that block pasted back plans the same step; the
same GPU given field by field without it takes its generation's clock (the H100's, 0.825 against 0.798: faster)."""

import pytest

from planner.kernels import SUSTAINED_CLOCK

BODY = {
    "model": {"preset": "llama3-8b"},
    "workload": {"kind": "training", "micro_batch_size": 1, "global_batch_size": 32},
    "parallel": {"tp": 8, "pp": 1, "dp": 2},
    "cluster": {"preset": "dgx-h200", "num_nodes": 2},
}


def test_the_answered_cluster_carries_the_h200s_measured_clock_back(api):
    first = api.post("/v1/plan", json=BODY)
    assert first.status_code == 200, first.text
    answered = first.json()["cluster"]
    assert answered["gpu"]["preset"] == "h200-sxm-141gb"
    again = api.post("/v1/plan", json=BODY | {"cluster": answered})
    assert again.status_code == 200, again.text
    assert again.json()["step"]["time_s"] == first.json()["step"]["time_s"]

    # without the preset the same fields are a GPU of no measurement: Hopper's generation clock (the H100's), higher
    bare = answered | {"gpu": {k: v for k, v in answered["gpu"].items() if k != "preset"}}
    generic = api.post("/v1/plan", json=BODY | {"cluster": bare})
    assert generic.status_code == 200, generic.text
    assert SUSTAINED_CLOCK[90] == 0.825
    faster, slower = generic.json()["step"], first.json()["step"]
    assert faster["time_s"] < slower["time_s"]
    # compute-bound kernels scale with the clock: the compute shrinks by at most 0.798 / 0.825
    assert faster["compute_s"] / slower["compute_s"] == pytest.approx(0.798 / 0.825, abs=0.02)
