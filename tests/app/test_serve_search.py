"""POST /v1/serve/search streamed as /v1/search streams (NDJSON progress, then the result), in a thread and in a
process of its own; `commplan serve-search`; the Python client's serve and serve_search."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.client import Client, CommplanError, ServeResult, ServeSearchResult
from app.main import create_app
from app.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
BODY = json.loads((ROOT / "examples/serve-search-llama3-70b.json").read_text())
SERVE = json.loads((ROOT / "examples/serve-llama3-70b.json").read_text())


def _stream(client: TestClient, body: dict, **kwargs) -> list[dict]:
    with client.stream("POST", "/v1/serve/search", json=body, **kwargs) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("application/x-ndjson")
        return [json.loads(line) for line in r.iter_lines() if line]


@pytest.mark.parametrize("in_process", [False, True])
def test_stream_sends_progress_lines_then_the_result(in_process):
    client = TestClient(create_app(Settings(work_in_process=in_process)))
    lines = _stream(client, BODY, params={"stream": "true"})
    progress, result = lines[:-1], lines[-1]
    assert progress and all(x["type"] == "progress" for x in progress) and result["type"] == "result"
    assert set(progress[0]) == {"type", "done", "total", "evaluated", "feasible", "elapsed_s", "best"}
    done = [x["done"] for x in progress]
    assert done == sorted(done) and done[-1] == progress[-1]["total"] == result["candidates"]
    assert progress[-1]["evaluated"] == result["evaluated"]
    best = progress[-1]["best"]
    top = result["results"][0]
    assert best["engine"] == top["engine"] and best["mode"] == top["mode"]
    assert best["output_tokens_per_s_per_gpu"] == top["answer"]["throughput"]["output_tokens_per_s_per_gpu"]
    plain = client.post("/v1/serve/search", json=BODY).json()  # the same answer without the stream
    assert plain["results"] == result["results"] and plain["why"] == result["why"]


def test_stream_by_accept_header_and_refusals_before_the_first_byte():
    client = TestClient(create_app())
    lines = _stream(client, BODY, headers={"Accept": "application/x-ndjson"})
    assert lines[-1]["type"] == "result"
    tight = TestClient(create_app(Settings(max_serve_candidates=5)))
    r = tight.post("/v1/serve/search", json=BODY, params={"stream": "true"})
    assert r.status_code == 422 and "COMMPLAN_MAX_SERVE_CANDIDATES" in r.json()["detail"][0]["msg"]
    r = client.post("/v1/serve/search", json=BODY | {"traffic": {"input_tokens": 0, "output_tokens": 1}},
                    params={"stream": "true"})  # fmt: skip
    assert r.status_code == 422 and r.json()["detail"][0]["loc"][-1] == "input_tokens"


def test_serve_search_cli_table_and_json():
    run = [sys.executable, "-m", "app.cli", "serve-search", str(ROOT / "examples/serve-search-llama3-70b.json")]
    table = subprocess.run(run, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert table.returncode == 0, table.stderr
    assert "tokens/s/GPU" in table.stdout and "Pareto front" in table.stdout and "bound by" in table.stdout
    assert "100.0%" in table.stderr  # progress on stderr, on its own line
    as_json = subprocess.run([*run, "--format", "json"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    d = json.loads(as_json.stdout)
    assert d["results"] and d["results"][0]["meets_sla"]
    bad = subprocess.run([*run[:-1], "-"], input=json.dumps(BODY | {"engines": ["nope"]}), capture_output=True,
                         text=True, cwd=ROOT, timeout=120)  # fmt: skip
    assert bad.returncode == 2 and "engines" in bad.stderr


def test_client_serve_and_serve_search():
    with Client(app=create_app()) as cp:
        one = cp.serve(SERVE)
        assert isinstance(one, ServeResult) and one.gpus == 16 and one.kv_cache.bytes_per_token == 327_680
        assert one.pools[0].calls and one.pools[0].calls[0].time_s > 0 and one.kv_transfer is None
        assert one.throughput.output_tokens_per_s == pytest.approx(one.request_rate * 200)
        found = cp.serve_search(BODY)
        assert isinstance(found, ServeSearchResult) and found.results and found.pareto
        again = cp.serve(found.results[0].request)
        assert again.throughput == found.results[0].answer.throughput
        with pytest.raises(CommplanError) as err:
            cp.serve(SERVE | {"engine": "tensorflow"})
        assert err.value.status == 422 and err.value.fields == ["engine"]


def test_calibrate_over_http_and_plan_with_its_options():
    """vLLM's documented bench serve output on a Llama 3.1 8B on one H100 worker: the constants, the rows before
    and after, and options that /v1/serve takes as they are; a block without its numbers is a 422 at runs.0.text."""
    body = {
        "model": {"preset": "llama3-8b"},
        "cluster": {"preset": "dgx-h100", "num_nodes": 1},
        "engine": "vllm",
        "deployment": {"pools": [{"role": "both", "workers": 1, "tp": 1}]},
        "runs": [{"text": (ROOT / "tests/reference/serving/vllm-bench-serve-docs.txt").read_text()}],
    }
    with Client(app=create_app()) as cp:
        d = cp.serve_calibrate(body)
        row = d["rows"][0]
        assert row["measured"] == {"ttft_s": 0.07154, "tpot_s": 0.00791, "output_tokens_per_s": 382.89}
        assert set(d["constants"]) == {"prefill_time_scale", "decode_time_scale"}
        assert d["median_error_after"] <= d["median_error_before"]
        assert row["after"]["tpot_s"] == pytest.approx(0.00791, rel=0.01)
        serve = {k: body[k] for k in ("model", "cluster", "engine", "deployment")}
        again = cp.serve(serve | {"traffic": {"input_tokens": 137, "output_tokens": 221, "concurrency": 10},
                                  "options": d["options"]})  # fmt: skip
        assert again.tpot_s == pytest.approx(row["after"]["tpot_s"])
        with pytest.raises(CommplanError) as err:
            cp.serve_calibrate(body | {"runs": [{"text": "============ Serving Benchmark Result ====\nfoo: 1"}]})
        assert err.value.status == 422 and err.value.fields == ["runs.0.text"]


HEAD = "============ Serving Benchmark Result ============\n"
GOOD = "Total input tokens: 10\nTotal generated tokens: 10\nMean TTFT (ms): 5\nMean TPOT (ms): 5\n" \
       "Output token throughput (tok/s): 9\n"  # fmt: skip


@pytest.mark.parametrize(
    ("text", "words"),
    [(HEAD + "Successful requests: nan\n", "not a count or time"),
     (HEAD + "Successful requests: 1e400\n", "not a count or time"),
     (HEAD + "Successful requests: 2\nTotal input tokens: 100000000000\n" + GOOD.split("\n", 1)[1],
      "input_tokens: must be between 1 and 2,097,152"),
     (HEAD + "Successful requests: 2\n" + GOOD + "Max request concurrency: 5000000\n",
      "concurrency: Input should be less than or equal to 4194304")],
)  # fmt: skip
def test_calibrate_refuses_numbers_no_run_measures(text, words):
    """Hostile or absurd benchmark blocks are 422s at runs.0.text naming the number, never a 500."""
    client = TestClient(create_app())
    body = {"model": {"preset": "llama3-8b"}, "cluster": {"preset": "dgx-h100", "num_nodes": 1},
            "deployment": {"pools": [{"role": "both", "workers": 1, "tp": 1}]}, "runs": [{"text": text}]}  # fmt: skip
    r = client.post("/v1/serve/calibrate", json=body)
    assert r.status_code == 422, r.text
    detail = r.json()["detail"][0]
    assert detail["loc"][-3:] == ["runs", 0, "text"] or detail["loc"][-1] == "text"
    assert words in detail["msg"]
