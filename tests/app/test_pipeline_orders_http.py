"""The schedules priced by their own order (vsched12) say so over HTTP: the plan's Assumptions row of
parallel.pipeline_schedule names how the bubble is found for ZB-H1, ZBV, DualPipe and DualPipeV, and DualPipe's row
says its own layout (dualpipe13, review r12a #3: planner/pipeline.py ScheduleTraits.layout_caveat); 1F1B says
neither. A DualPipe plan's per-stage memory shows that layout: ranks 0 and pp - 1 alike, each with one embedding and
one output layer."""

import pytest

from planner.pipeline import schedule_traits


def _plan(api, kind: str) -> dict:
    body = {
        "model": {"preset": "llama3-8b", "num_layers": 8},
        "workload": {"kind": "training", "micro_batch_size": 1, "global_batch_size": 16, "seq_length": 4096},
        "parallel": {"tp": 1, "pp": 4, "dp": 2, "pipeline_schedule": kind},
        "cluster": {"preset": "dgx-h100", "num_nodes": 1},
    }
    response = api.post("/v1/plan", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def _row(api, kind: str) -> str:
    (row,) = [a["source"] for a in _plan(api, kind)["assumptions"] if a["field"] == "parallel.pipeline_schedule"]
    return row


@pytest.mark.parametrize("kind", ["zb-h1", "zbv", "dualpipe", "dualpipev", "1f1b"])
def test_the_assumptions_say_how_the_bubble_is_found(api, kind):
    row = _row(api, kind)
    ordered = schedule_traits(kind).order_priced
    assert (f"the {kind} order run as a list schedule" in row) == ordered
    assert (schedule_traits("dualpipe").layout_caveat in row) == (kind == "dualpipe")
    if kind == "dualpipe":
        assert "rank r running stage r for direction 0 and stage pp - 1 - r for direction 1" in row
        assert "rank 0 runs the embedding and the head" not in row  # mend12a's caveat of the V layout, gone


def _memory(api, kind: str) -> list[dict]:
    return _plan(api, kind)["memory"]["per_stage"]


def test_dualpipe_memory_holds_each_stage_once_and_an_end_on_ranks_0_and_pp_minus_1(api):
    """Llama 3 8B cut to 8 layers, pp 4, tp 1: DualPipe's rank r holds stage r and stage 3 - r, two layers each, so
    every rank four layers (218,112,000 parameters each: q, k, v 4,096 x (4,096 + 2 x 1,024), o 4,096², the SwiGLU
    3 x 4,096 x 14,336, two norms) and ranks 0 and 3 the embedding and the output layer (128,256 x 4,096 each) and the
    final norm (4,096): mirror images, each stage's parameters, gradients and optimizer states held once. DualPipeV (a
    V of 8 one-layer chunks) keeps both ends on rank 0 and none on rank 3; mend12a's DualPipe had rank 0 hold them
    twice (57.9 against 52.6 GB on DeepSeek-V3)."""
    layer = 4096 * (4096 + 2 * 1024) + 4096 * 4096 + 3 * 4096 * 14336 + 2 * 4096
    ends = 2 * 128256 * 4096 + 4096
    assert layer == 218_112_000
    dual, v = _memory(api, "dualpipe"), _memory(api, "dualpipev")
    assert [s["param_count"] for s in dual] == [4 * layer + ends, 4 * layer, 4 * layer, 4 * layer + ends]
    assert [s["param_count"] for s in v] == [2 * layer + ends, 2 * layer, 2 * layer, 2 * layer]
    for key in ("params_bytes", "grads_bytes", "optimizer_bytes", "peak_bytes"):
        assert dual[0][key] == dual[3][key] and dual[1][key] == dual[2][key], key
    for s in dual:  # bf16 weights, fp32 gradients, each parameter once
        assert (s["params_bytes"], s["grads_bytes"]) == (2 * s["param_count"], 4 * s["param_count"])
    assert dual[0]["optimizer_bytes"] * dual[1]["param_count"] == dual[1]["optimizer_bytes"] * dual[0]["param_count"]


def test_dualpipe_timeline_runs_both_directions_from_time_0(api):
    """The timeline is DualPipe's own order as the step prices it (dualpipe13b: pipeline_jitter.order_blocks), not
    1F1B's shape from rank 0's fill: rank 3 (pp - 1) starts a direction-1 forward at time 0 as rank 0 starts direction
    0 (deepseek-ai/DualPipe dualpipe.py step(): the last rank feeds the second half of the micro-batches), every block
    one micro-batch with its direction: m 8 (16 sequences over dp 2), m / 2 = 4 forwards each way on every rank."""
    events = _plan(api, "dualpipe")["step"]["timeline"]
    blocks = [e for e in events if e["stream"] == "compute" and e["microbatch"] >= 0]
    for rank, way in ((0, 0), (3, 1)):
        first = min((e for e in blocks if e["stage"] == rank), key=lambda e: e["start_s"])
        assert (first["name"], first["start_s"], first["direction"]) == ("forward", 0.0, way)
    for rank in range(4):
        forwards = [e["direction"] for e in blocks if e["stage"] == rank and e["name"] == "forward"]
        assert sorted(forwards) == [0] * 4 + [1] * 4
    assert all(e["microbatches"] == 1 and e["direction"] in (0, 1) for e in blocks)
    assert all(e.get("direction") is None for e in _plan(api, "1f1b")["step"]["timeline"])
