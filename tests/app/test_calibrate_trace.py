"""POST /v1/calibrate with a torch.profiler trace (`trace`, `trace_steps`, `compare`) and `commplan calibrate
--trace`: the kernels by class, the compute constants fitted for the cluster's GPU with every kernel before and
after, the collectives against a plan's ledger; a malformed or truncated trace is a 422 naming what is wrong."""

import base64
import gzip
import json
from pathlib import Path

import pytest

from app.cli import main
from app.settings import Settings
from planner.kernels import EFFICIENCY

from .conftest import Api

TRACES = Path(__file__).resolve().parents[1] / "reference" / "traces"
CONTROL = (TRACES / "hta_trace_diff_control.json.gz").read_bytes()
SAMPLED = json.loads(gzip.decompress((TRACES / "hta_sampled_rank-0.json.gz").read_bytes()))
COMPARE = {"model": {"preset": "llama3-8b"}, "workload": {"micro_batch_size": 1, "global_batch_size": 8},
           "parallel": {"dp": 8, "zero_stage": 0}}  # fmt: skip


@pytest.fixture(scope="module")
def control():
    """The 1.8 MB gzipped trace as base64 text (35 MB as JSON is above the 8 MiB body limit). It takes ~2.5 CPU
    seconds (parse 2.0, fit 0.4): the deadline is raised so that a loaded test machine does not turn it into a 503."""
    api = Api(Settings(deadline_s=120.0))
    body = {"cluster": {"preset": "dgx-a100"}, "trace": base64.b64encode(CONTROL).decode(), "compare": COMPARE}
    response = api.post("/v1/calibrate", json=body)
    api.close()
    assert response.status_code == 200, response.text
    return response.json()


def test_a_gzipped_trace_calibrates_over_http(control):
    # nothing of the nccl-tests part without logs
    assert control["rows"] == [] and control["constants"] == {} and control["median_error_before"] is None
    trace = control["trace"]
    assert control["cluster"] == {"preset": "dgx-a100", "calibration": {"kernels": trace["constants"]}}
    assert (trace["device"], trace["sms"], trace["steps"], trace["rank"], trace["world_size"]) == (
        "NVIDIA A100-PG509-200",
        108,
        6,
        3,
        8,
    )
    kinds = {k["kind"]: k for k in trace["kernels"]}
    assert kinds["gemm"]["count"] == 2388 and kinds["nccl"]["per_step"] == 10  # README: jq counts
    assert set(trace["constants"]) == {"gemm_ceiling", "gemm_fixed_s", "hbm", "kernel_s", "host_launch_s"}
    host = trace["host"]  # the A100 host's gaps where the GPU waited for it (tests/planner/test_trace_fit_host.py)
    assert (host["launches"], host["host_bound"], host["gaps"]) == (8568, 2333, 1936)
    assert host["host_launch_s"] == trace["constants"]["host_launch_s"] == 35e-6
    assert trace["median_error_after"]["memory"] < 0.8 * trace["median_error_before"]["memory"]
    row = next(r for r in trace["rows"] if r["op"] == "aten::mm" and r["shape"] == [100, 256, 1024, 1])
    assert row["count"] == 78 and row["dtype"] == "tf32" and row["measured_s"] > 0
    # the compare block's plan: DDP's gradient allreduce against the trace's 3 allreduces a step
    by_op = {r["op"]: r for r in trace["collectives"]}
    assert by_op["allreduce"]["trace_calls_per_step"] == 3 and by_op["allreduce"]["plan_calls_per_iteration"] >= 1
    assert by_op["sendrecv"]["plan_calls_per_iteration"] == 0 and trace["stage"] == 0
    assert by_op["allreduce"]["message_bytes"] is None  # this trace records no sizes


def test_a_trace_as_json_and_as_text_and_trace_steps(api):
    body = {"cluster": {"preset": "dgx-a100"}, "trace": SAMPLED}
    as_json = api.post("/v1/calibrate", json=body).json()["trace"]
    as_text = api.post("/v1/calibrate", json=body | {"trace": json.dumps(SAMPLED)}).json()["trace"]
    assert as_json == as_text
    assert as_json["steps"] == 2 and as_json["collectives"][0]["op"] == "sendrecv"
    assert as_json["collectives"][0]["trace_calls_per_step"] == 5  # 10 SendRecv kernels over 2 steps
    assert as_json["collectives"][0]["plan_calls_per_iteration"] == 0  # no compare: the trace's side alone
    # no deviceProperties: said
    assert "the trace has no deviceProperties: its GPU is taken to be the cluster's" in as_json["warnings"]
    steps = api.post("/v1/calibrate", json=body | {"trace_steps": 10}).json()["trace"]
    assert steps["steps"] == 10 and steps["collectives"][0]["trace_calls_per_step"] == 1


def test_logs_and_a_trace_together(api):
    log = (Path(__file__).resolve().parents[1] / "reference" / "nccl_logs" / "sample_h100_2node.txt").read_text()
    got = api.post("/v1/calibrate", json={"cluster": {"preset": "dgx-h100"}, "logs": [{"text": log}], "trace": SAMPLED})
    body = got.json()
    assert got.status_code == 200 and body["rows"] and body["median_error_after"] is not None
    assert body["trace"]["steps"] == 2


def _loc_msg(response):
    assert response.status_code == 422, response.text
    (err,) = response.json()["detail"]
    return err["loc"], err["msg"]


def test_bad_traces_are_422s_naming_what_is_wrong(api):
    cluster = {"preset": "dgx-a100"}
    text = json.dumps(SAMPLED)
    loc, msg = _loc_msg(api.post("/v1/calibrate", json={"cluster": cluster, "trace": text[: len(text) // 3]}))
    assert loc[-1] == "trace" and "not JSON" in msg and "truncated" in msg
    cut = base64.b64encode(CONTROL[:100_000]).decode()
    loc, msg = _loc_msg(api.post("/v1/calibrate", json={"cluster": cluster, "trace": cut}))
    assert loc[-1] == "trace" and "ends early" in msg
    loc, msg = _loc_msg(api.post("/v1/calibrate", json={"cluster": cluster, "trace": "H4sI!!not base64"}))
    assert loc[-1] == "trace" and "not base64" in msg
    loc, msg = _loc_msg(api.post("/v1/calibrate", json={"cluster": cluster, "trace": {"traceEvents": 5}}))
    assert list(loc[-2:]) == ["trace", "traceEvents"] and "not a list" in msg
    no_kernels = {"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 1}]}
    loc, msg = _loc_msg(api.post("/v1/calibrate", json={"cluster": cluster, "trace": no_kernels}))
    assert "no GPU kernel events" in msg
    loc, msg = _loc_msg(api.post("/v1/calibrate", json={"cluster": cluster}))
    assert "give nccl-tests logs" in msg
    log = {"text": "# nccl-tests"}
    loc, msg = _loc_msg(api.post("/v1/calibrate", json={"cluster": cluster, "logs": [log], "compare": COMPARE}))
    assert "compare needs a trace" in msg
    loc, msg = _loc_msg(api.post("/v1/calibrate", json={"cluster": cluster, "trace": SAMPLED, "trace_steps": 0}))
    assert loc[-1] == "trace_steps"
    bad = COMPARE | {"parallel": {"dp": 3}}
    loc, msg = _loc_msg(api.post("/v1/calibrate", json={"cluster": cluster, "trace": SAMPLED, "compare": bad}))
    assert loc[1] == "compare" and "8" in msg


def test_a_trace_over_the_body_limit_is_a_413(small_limits):
    response = small_limits.post("/v1/calibrate", json={"cluster": {"preset": "dgx-a100"}, "trace": SAMPLED})
    assert response.status_code == 413


def test_the_cli_calibrates_a_trace(capsys, tmp_path):
    compare = tmp_path / "compare.json"
    compare.write_text(json.dumps(COMPARE))
    trace = str(TRACES / "hta_trace_diff_control.json.gz")
    assert main(["calibrate", "--trace", trace, "--cluster", "dgx-a100", "--compare", str(compare)]) == 0
    out = capsys.readouterr().out
    assert "NVIDIA A100-PG509-200, 6 steps, 109,123 events" in out
    assert "aten::mm" in out and "memory: median |error| 49.0% before" in out
    assert "allreduce" in out and "sendrecv" in out
    assert 'post the "cluster" of --format json (its calibration.kernels) to /v1/plan' in out
    assert main(["calibrate", "--trace", trace, "--cluster", "dgx-a100", "--format", "json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["trace"]["kernels"][0]["kind"] == "gemm"
    # the cluster to plan with: the preset and the fitted compute constants (`commplan plan` takes it as it is)
    assert got["cluster"] == {"preset": "dgx-a100", "calibration": {"kernels": got["trace"]["constants"]}}
    bad = tmp_path / "bad.json"
    bad.write_text('{"traceEvents": [')
    assert main(["calibrate", "--trace", str(bad), "--cluster", "dgx-a100"]) == 2
    assert "trace: not JSON" in capsys.readouterr().err


def test_the_fitted_constants_plan_as_the_answer_hands_them_on(api, control):
    """Round trip (issue 20): calibrate from the committed HTA trace -> its answer's cluster carries the fitted
    constants (cluster.calibration.kernels) -> /v1/plan with that cluster. The trace fitted the A100's memory-bound
    kernels at hbm = 0.675 of dgx-a100's 2,039 GB/s (the traced part is the 40 GB A100, 1,555 GB/s: 0.885 of its own
    peak; the default 0.877 is the H200's measured copies): Adam's step, 34 B per
    parameter read and written at hbm x 2,039 GB/s, takes exactly 0.877 / 0.675 = 1.299x as long; the whole
    compute moves by less (bf16 GEMMs and
    attention keep their constants: the trace's GEMMs were tf32/fp32)."""
    constants = control["trace"]["constants"]
    assert control["cluster"]["calibration"]["kernels"] == constants
    assert constants["hbm"] == 0.675 and constants["kernel_s"] == 4e-6 and constants["gemm_ceiling"]["tf32"] == 0.6247
    body = {
        "model": {"preset": "llama3-8b"},
        "workload": {"micro_batch_size": 1, "global_batch_size": 16},
        "parallel": {"tp": 1, "pp": 1, "dp": 8, "zero_stage": 1},
        "cluster": {"preset": "dgx-a100", "num_nodes": 1},
    }

    def step(cluster):
        r = api.post("/v1/plan", json=body | {"cluster": cluster})
        assert r.status_code == 200, r.text
        answer = r.json()
        (adam,) = [e for e in answer["step"]["timeline"] if e["name"] == "optimizer"]
        return answer, answer["step"]["compute_s"], adam["end_s"] - adam["start_s"]

    _, before, adam_before = step(body["cluster"])
    answer, after, adam_after = step(control["cluster"] | {"num_nodes": 1})
    assert adam_after / adam_before == pytest.approx(EFFICIENCY.hbm / 0.675, rel=1e-9)
    assert 1.0 < after / before < EFFICIENCY.hbm / 0.675
    answered = {k: v for k, v in answer["cluster"]["calibration"]["kernels"].items() if v is not None}
    assert answered == constants  # the answered cluster keeps them (the absent ones as null)
    _, same, _ = step(answer["cluster"])
    assert same == after


def test_a_cluster_with_constants_recalibrates_over_them(api):
    """A cluster that already carries kernel constants: the trace's fit replaces what it measured (hbm, the
    tf32/fp32 ceilings) and keeps a given ceiling for a dtype the trace did not run (bf16)."""
    cluster = {"preset": "dgx-a100", "calibration": {"kernels": {"gemm_ceiling": {"bf16": 0.7}, "hbm": 0.5}}}
    got = api.post("/v1/calibrate", json={"cluster": cluster, "trace": SAMPLED})
    assert got.status_code == 200, got.text
    body = got.json()
    kernels, fitted = body["cluster"]["calibration"]["kernels"], body["trace"]["constants"]
    assert kernels["gemm_ceiling"] == {"bf16": 0.7} | fitted["gemm_ceiling"] and kernels["hbm"] == fitted["hbm"]
    assert set(fitted["gemm_ceiling"]) == {"fp32", "tf32"}


def test_a_gzip_bomb_is_a_422_in_the_pages_units(api, monkeypatch):
    """A small gzipped trace that unpacks past the limit (app/schemas/calibrate.py MAX_TRACE_BYTES, 256 MiB; 1,000
    bytes here) is refused naming the limit exactly and in human units (it said "268435456 bytes" on the page)."""
    monkeypatch.setattr("app.calibration.MAX_TRACE_BYTES", 1000)
    bomb = base64.b64encode(gzip.compress(b'{"traceEvents": [' + b" " * 5000 + b"]}")).decode()
    loc, msg = _loc_msg(api.post("/v1/calibrate", json={"cluster": {"preset": "dgx-a100"}, "trace": bomb}))
    assert loc[-1] == "trace" and msg == "the gzipped trace unpacks to more than 1,000 bytes (1.00 KB, the limit)"
