"""Calibration of a serving deployment from benchmark outputs (planner/serving/calibrate.py): the parser on the
engines' printed blocks (tests/reference/serving/, provenance in bench_outputs.md) and the fit recovering known
factors from runs the planner itself produced."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from collectives.topology import cluster_preset
from planner import MODEL_PRESETS, SpecError
from planner.serving import Pool, ServeOptions, Traffic, engine, plan_serving
from planner.serving.calibrate import calibrate_serving, parse_bench

REF = Path(__file__).parents[1] / "reference/serving"
LLAMA8B = MODEL_PRESETS["llama3-8b"]


def test_parses_vllm_bench_serve_as_its_docs_print_it():
    run = parse_bench((REF / "vllm-bench-serve-docs.txt").read_text())
    assert run.tool == "vllm bench serve" and run.requests == 10
    assert (run.input_tokens, run.output_tokens) == (round(1369 / 10), round(2212 / 10)) == (137, 221)
    assert run.ttft_s == pytest.approx(0.07154) and run.tpot_s == pytest.approx(0.00791)
    assert run.output_tokens_per_s == 382.89
    # no --request-rate, no --max-concurrency: every request sent at once, planned as that many in the system
    assert run.concurrency is None and run.request_rate is None and run.traffic.concurrency == 10


def test_parses_sglang_bench_serving_labels():
    run = parse_bench((REF / "sglang-bench-serving-format.txt").read_text())
    assert run.tool == "sglang.bench_serving" and run.concurrency == 64 and run.request_rate is None
    assert (run.input_tokens, run.output_tokens) == (1024, 200)
    assert run.ttft_s == pytest.approx(0.42) and run.tpot_s == pytest.approx(0.0475)  # mean ITL: no TPOT line


@pytest.mark.parametrize(
    ("text", "words"),
    [("Throughput: 3 requests/s", "no 'Serving Benchmark Result' block"),
     ("== Serving Benchmark Result ==\nSuccessful requests: 10\n", "no 'Total input tokens' line"),
     ("== Serving Benchmark Result ==\nSuccessful requests: 0\n", "nothing was measured")],
)  # fmt: skip
def test_bad_blocks_name_what_is_missing(text, words):
    with pytest.raises(SpecError) as err:
        parse_bench(text, "runs.0.text")
    assert err.value.field == "runs.0.text" and words in err.value.rule


def _printed(ttft: float, tpot: float, traffic: Traffic, out_rate: float, requests: int = 100) -> str:
    """A block as vllm bench serve prints it, for a closed loop at the traffic's concurrency."""
    return (
        "============ Serving Benchmark Result ============\n"
        f"Successful requests:                     {requests}\n"
        f"Maximum request concurrency:             {traffic.concurrency}\n"
        f"Total input tokens:                      {requests * traffic.input_tokens}\n"
        f"Total generated tokens:                  {requests * traffic.output_tokens}\n"
        f"Output token throughput (tok/s):         {out_rate:.2f}\n"
        f"Mean TTFT (ms):                          {ttft * 1e3:.4f}\n"
        f"Mean TPOT (ms):                          {tpot * 1e3:.4f}\n"
    )


def test_fit_recovers_known_step_factors():
    """Runs produced by the planner with prefill 1.6x and decode 0.7x slower/faster: the fit finds both factors,
    and after it every run's TTFT and TPOT match; before, they were off by tens of percent."""
    cluster, pools, traits = cluster_preset("dgx-h100", 1), (Pool(workers=2, tp=4),), engine("vllm")
    truth = ServeOptions(prefill_time_scale=1.6, decode_time_scale=0.7)
    runs = []
    for traffic in (Traffic(2000, 200, concurrency=16), Traffic(500, 500, concurrency=64),
                    Traffic(4000, 100, concurrency=8)):  # fmt: skip
        measured = plan_serving(LLAMA8B, cluster, traits, traffic, pools, truth)
        runs.append(parse_bench(_printed(measured.ttft_s, measured.tpot_s, traffic, measured.output_tokens_per_s)))
    fit = calibrate_serving(LLAMA8B, cluster, traits, pools, ServeOptions(), runs)
    assert fit.prefill_time_scale == pytest.approx(1.6, rel=0.02)
    assert fit.decode_time_scale == pytest.approx(0.7, rel=0.02)
    assert fit.median_error_before > 0.2 and fit.median_error_after < 0.01
    assert [r["traffic"]["concurrency"] for r in fit.rows] == [16, 64, 8]
    again = plan_serving(LLAMA8B, cluster, traits, Traffic(2000, 200, concurrency=16), pools,
                         replace(ServeOptions(), prefill_time_scale=fit.prefill_time_scale,
                                 decode_time_scale=fit.decode_time_scale))  # fmt: skip
    assert again.tpot_s == pytest.approx(runs[0].tpot_s, rel=0.01)
