"""The schedules priced by their own order (vsched12) say so over HTTP: the plan's Assumptions row of
parallel.pipeline_schedule names how the bubble is found for ZB-H1, ZBV, DualPipe and DualPipeV, and DualPipe's row
says its ends sit on rank 0 (review r12a #3, planner/pipeline.py ScheduleTraits.layout_caveat); 1F1B says neither."""

import pytest

from planner.pipeline import schedule_traits


def _row(api, kind: str) -> str:
    body = {
        "model": {"preset": "llama3-8b", "num_layers": 8},
        "workload": {"kind": "training", "micro_batch_size": 1, "global_batch_size": 16, "seq_length": 4096},
        "parallel": {"tp": 1, "pp": 4, "dp": 2, "pipeline_schedule": kind},
        "cluster": {"preset": "dgx-h100", "num_nodes": 1},
    }
    response = api.post("/v1/plan", json=body)
    assert response.status_code == 200, response.text
    (row,) = [a["source"] for a in response.json()["assumptions"] if a["field"] == "parallel.pipeline_schedule"]
    return row


@pytest.mark.parametrize("kind", ["zb-h1", "zbv", "dualpipe", "dualpipev", "1f1b"])
def test_the_assumptions_say_how_the_bubble_is_found(api, kind):
    row = _row(api, kind)
    ordered = schedule_traits(kind).order_priced
    assert (f"the {kind} order run as a list schedule" in row) == ordered
    assert (schedule_traits("dualpipe").layout_caveat in row) == (kind == "dualpipe")
    if kind == "dualpipe":
        assert "+11%" in row and "57.9 GB against 52.6 GB" in row
