"""POST /v1/calibrate and `commplan calibrate --trace` round-tripped on the H200 LLM training traces
(tests/reference/kernels/h200: torch.profiler, PyTorch 2.11, a dense Llama-3 8B layer and a Qwen3-235B MoE layer,
3 steps each): the trace as JSON (gunzipped, 0.79 and 1.69 MB: under the 8 MiB body limit), as base64 of its
.json.gz (the form for a trace over the limit, and what the CLI sends), the returned cluster planned with, and
the broken traces a user may send."""

import base64
import copy
import gzip
import json
from pathlib import Path

import pytest

from app.cli import main
from app.settings import Settings
from collectives.topology.gpu import gpu_preset
from planner.kernels import clock_fraction

from .conftest import Api

H200_DIR = Path(__file__).resolve().parents[1] / "reference" / "kernels" / "h200"
DENSE_GZ = (H200_DIR / "trace_llama3_8b.tp1.s4096.json.gz").read_bytes()
MOE_GZ = (H200_DIR / "trace_qwen3_235b.ep1.s2048.json.gz").read_bytes()
DENSE = json.loads(gzip.decompress(DENSE_GZ))
MOE = json.loads(gzip.decompress(MOE_GZ))
CLUSTER = {"preset": "dgx-h200", "num_nodes": 1}
PLAN = {
    "model": {"preset": "llama3-8b"},
    "workload": {"micro_batch_size": 1, "global_batch_size": 8, "seq_length": 4096},
    "parallel": {"tp": 1, "pp": 1, "dp": 8, "framework": "torch"},
    "options": {"timeline": False},
}


@pytest.fixture(scope="module")
def dense(api):
    got = api.post("/v1/calibrate", json={"cluster": CLUSTER, "trace": DENSE})
    assert got.status_code == 200, got.text
    return got.json()


def test_the_dense_trace_calibrates_over_http(dense):
    trace = dense["trace"]
    assert (trace["device"], trace["sms"], trace["steps"], trace["steps_from"]) == ("NVIDIA H200", 132, 3, "repeats")
    kinds = {k["kind"]: k for k in trace["kernels"]}
    assert kinds["gemm"]["per_step"] == 12 and kinds["attention"]["per_step"] == 6 and trace["unclassified"] == []
    constants = trace["constants"]
    assert constants["clock"] == pytest.approx(0.963, abs=0.005)
    assert constants["attention_ceiling"] == pytest.approx({"cudnn_fwd": 0.721, "cudnn_bwd": 0.576}, abs=0.005)
    assert (constants["hbm"], constants["kernel_s"], constants["gemm_fixed_s"]) == (0.95, 1e-6, 1e-6)
    assert dense["cluster"] == CLUSTER | {"calibration": {"kernels": constants}}
    # GPU-bound: 7 of its 189 launches found the GPU idle (5 gaps), too few to read the host's cost per launch
    host = trace["host"]
    assert (host["launches"], host["host_bound"], host["gaps"], host["host_launch_s"]) == (189, 7, 5, None)
    assert "host_launch_s" not in constants and any("GPU-bound" in w for w in trace["warnings"])
    # every kernel group before and after: the GEMM rows median 15.4% -> 1.4%
    assert trace["median_error_before"]["gemm"] > 0.15 and trace["median_error_after"]["gemm"] < 0.02
    row = next(r for r in trace["rows"] if r["kind"] == "attention" and r["op"] == "aten::_cudnn_attention_forward")
    assert row["shape"] == [1, 32, 4096, 4096, 128] and row["count"] == 3
    assert row["after_s"] == pytest.approx(row["measured_s"], rel=0.02) and row["before_s"] > 1.4 * row["measured_s"]
    assert any("H200 SXM 141GB's own GPUSpec.sustained_clock 0.798" in w for w in trace["warnings"])


def test_the_moe_trace_calibrates_and_its_gzip_base64_form_answers_the_same(api):
    as_json = api.post("/v1/calibrate", json={"cluster": CLUSTER, "trace": MOE})
    as_gzip = api.post("/v1/calibrate", json={"cluster": CLUSTER, "trace": base64.b64encode(MOE_GZ).decode()})
    assert as_json.status_code == as_gzip.status_code == 200, as_json.text
    assert as_json.json() == as_gzip.json()
    trace = as_json.json()["trace"]
    grouped = [r for r in trace["rows"] if r["kind"] == "grouped_gemm"]
    assert len(grouped) == 6 and {tuple(r["shape"][3:]) for r in grouped} == {(128,)}
    assert trace["unclassified"] == [] and trace["steps"] == 3
    assert set(trace["constants"]) == {"clock", "gemm_fixed_s", "attention_ceiling", "hbm", "kernel_s", "host_launch_s"}
    # eager routing after its syncs runs at the host's pace: 71 gaps, a median 26.1 us (the moehost replay's 26.6 us
    # over the routing windows' activities, memsets and copies among them: tests/planner/test_moe_kernels.py)
    assert (trace["host"]["gaps"], trace["constants"]["host_launch_s"]) == (71, 26.114e-6)


def test_a_cluster_with_attention_constants_recalibrates_over_them(api):
    """The trace refits cuDNN's ceilings and keeps a given FlashAttention-2 one (a kernel the trace did not run)."""
    given = {"attention_ceiling": {"flash2_fwd": 0.3, "cudnn_fwd": 0.5}, "clock": 0.8}
    cluster = CLUSTER | {"calibration": {"kernels": given}}
    got = api.post("/v1/calibrate", json={"cluster": cluster, "trace": DENSE})
    assert got.status_code == 200, got.text
    kernels, fitted = got.json()["cluster"]["calibration"]["kernels"], got.json()["trace"]["constants"]
    assert kernels["attention_ceiling"] == {"flash2_fwd": 0.3} | fitted["attention_ceiling"]
    assert kernels["clock"] == fitted["clock"] == pytest.approx(0.963, abs=0.005)  # refitted from the given 0.8
    # "before" is the request cluster's constants: its clock 0.8 makes the GEMMs slower than the defaults do
    assert got.json()["trace"]["median_error_before"]["gemm"] > 0.2


def _compute_s(api, cluster):
    r = api.post("/v1/plan", json=PLAN | {"cluster": cluster})
    assert r.status_code == 200, r.text
    return r.json()["step"]["compute_s"]


def test_planning_with_the_returned_cluster_moves_the_step_as_the_constants_say(api, dense):
    """The answer's cluster as it is -> /v1/plan (torch eager, Llama-3 8B, seq 4,096 on 8 H200): every fitted
    constant makes this H200 faster (clock 0.963 against the sustained 0.798, cuDNN attention 0.72/0.58 against
    0.55/0.42, hbm 0.95 against 0.877, 1 us kernels), so the compute falls; the clock alone moves it by less than
    0.798 / 0.963 = 0.829, the ratio a purely compute-bound step would take, and more than nothing."""
    before = _compute_s(api, CLUSTER)
    after = _compute_s(api, dense["cluster"])
    clock = dense["trace"]["constants"]["clock"]
    only_clock = _compute_s(api, CLUSTER | {"calibration": {"kernels": {"clock": clock}}})
    assert after < only_clock < before
    assert clock_fraction(gpu_preset("h200-sxm-141gb")) / clock < only_clock / before < 0.97
    # measured: 0.875 with the clock alone, 0.843 with all (0.917 and 0.884 from the sustained 0.852 before sus12:
    # "before" is slower by the compute-bound share x 0.852 / 0.798); the layer's own kernels move to 0.789
    # (test_trace_fit_h200): the whole step adds the LM head, the optimizer (at hbm: 0.877 / 0.95 = 0.923) and the
    # eager host floor (cpu_op_s), which no fitted constant moves
    assert 0.80 < after / before < 0.90


def test_a_clock_or_an_attention_ceiling_out_of_range_is_a_422(api):
    for kernels, field in (
        ({"clock": 1.5}, "clock"),
        ({"attention_ceiling": {"cudnn_fwd": 1.2}}, "cudnn_fwd"),
        ({"attention_ceiling": {"xformers_fwd": 0.5}}, "xformers_fwd"),
    ):
        r = api.post("/v1/plan", json=PLAN | {"cluster": CLUSTER | {"calibration": {"kernels": kernels}}})
        assert r.status_code == 422, r.text
        assert field in json.dumps(r.json()["detail"])


def _loc_msg(response):
    assert response.status_code == 422, response.text
    (err,) = response.json()["detail"]
    return err["loc"], err["msg"]


def test_broken_h200_traces_are_422s_naming_what_is_wrong(api):
    text = json.dumps(DENSE)
    half = {"cluster": CLUSTER, "trace": text[: len(text) // 2]}
    loc, msg = _loc_msg(api.post("/v1/calibrate", json=half))
    assert loc[-1] == "trace" and "not JSON" in msg and "truncated" in msg
    cut_gzip = base64.b64encode(DENSE_GZ[: len(DENSE_GZ) // 2]).decode()
    loc, msg = _loc_msg(api.post("/v1/calibrate", json={"cluster": CLUSTER, "trace": cut_gzip}))
    assert loc[-1] == "trace" and "ends early" in msg
    # a CPU-only run: torch.profiler with activities=[CPU] writes the operators and no GPU activity
    cpu_only = copy.deepcopy(DENSE)
    cpu_only["traceEvents"] = [e for e in DENSE["traceEvents"] if e.get("cat") in ("cpu_op", "user_annotation")]
    loc, msg = _loc_msg(api.post("/v1/calibrate", json={"cluster": CLUSTER, "trace": cpu_only}))
    assert loc[-1] == "trace" and "no GPU kernel events" in msg and "1,095 CPU operators" in msg
    assert "CPU-only run" in msg
    # GPU memsets but no kernel: still no kernel to fit
    no_kernels = {"traceEvents": [e for e in DENSE["traceEvents"] if e.get("cat") != "kernel"]}
    loc, msg = _loc_msg(api.post("/v1/calibrate", json={"cluster": CLUSTER, "trace": no_kernels}))
    assert "no GPU kernel events" in msg
    # a kernel event without its duration
    broken = copy.deepcopy(DENSE)
    i, event = next((i, e) for i, e in enumerate(broken["traceEvents"]) if e.get("cat") == "kernel")
    del event["dur"]
    loc, msg = _loc_msg(api.post("/v1/calibrate", json={"cluster": CLUSTER, "trace": broken}))
    assert loc[-1] == f"traceEvents[{i}]" and "numeric ts and dur" in msg


def test_a_trace_over_the_body_limit_is_a_413_and_fits_as_gzip_base64():
    """With the body limit below the trace as JSON (0.79 MB) but above its gzip as base64 (79 kB): the JSON is a
    413, the .json.gz as base64 text in ``trace`` calibrates (what `commplan calibrate --trace` sends)."""
    api = Api(Settings(max_body_bytes=200_000))
    try:
        assert api.post("/v1/calibrate", json={"cluster": CLUSTER, "trace": DENSE}).status_code == 413
        body = {"cluster": CLUSTER, "trace": base64.b64encode(DENSE_GZ).decode()}
        got = api.post("/v1/calibrate", json=body)
        assert got.status_code == 200, got.text
        assert got.json()["trace"]["constants"]["clock"] == pytest.approx(0.963, abs=0.005)
    finally:
        api.close()


def test_the_cli_calibrates_the_h200_trace_and_its_cluster_plans(capsys, tmp_path):
    path = str(H200_DIR / "trace_llama3_8b.tp1.s4096.json.gz")
    assert main(["calibrate", "--trace", path, "--cluster", "dgx-h200"]) == 0
    out = capsys.readouterr().out
    assert "NVIDIA H200, 3 steps" in out and "aten::_cudnn_attention_backward" in out
    assert "clock = 0.9627" in out and "attention_ceiling" in out
    assert main(["calibrate", "--trace", path, "--cluster", "dgx-h200", "--format", "json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["cluster"] == {"preset": "dgx-h200", "calibration": {"kernels": got["trace"]["constants"]}}
    half = tmp_path / "half.json"
    half.write_text(json.dumps(DENSE)[:300_000])
    assert main(["calibrate", "--trace", str(half), "--cluster", "dgx-h200"]) == 2
    assert "trace: not JSON" in capsys.readouterr().err
