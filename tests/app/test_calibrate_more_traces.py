"""Every public trace of tests/reference/traces round-trips through POST /v1/calibrate as users send it (gzipped, as
base64 text; or the JSON itself) and `commplan calibrate --trace` (a file or a folder): the kernels per class, NCCL
calls and message bytes, steps and launches asserted are the trace's own, counted with jq in README.md."""

import base64
import gzip
import json
import shutil
from pathlib import Path

import pytest

from app.cli import main
from app.settings import Settings

from .conftest import Api

TRACES = Path(__file__).resolve().parents[1] / "reference" / "traces"

# file -> (device, steps, steps_from, rank, world_size, events, kernels by class, launch calls read)
EXPECTED = {
    "hta_nccl_data.json.gz": (
        "NVIDIA A100-PG509-200", 3, "ProfilerStep", 0, 2, 40573,
        {"gemm": 15, "conv": 600, "memory": 2064, "copy": 1074, "nccl": 21}, 2700,
    ),
    "hta_a100_cudagraph_rank0_2steps.json.gz": (
        "NVIDIA A100-SXM4-80GB", 2, "ProfilerStep", 0, 16, 26542,
        {"gemm": 36, "memory": 2036, "copy": 600, "nccl": 30, "other": 48}, 2096,
    ),
    "hta_mi250_minitoy_train_ROCm6_2_kineto.json.gz": (
        "AMD Radeon Graphics", 2, "ProfilerStep", None, None, 220, {"gemm": 2, "memory": 12, "copy": 2}, 14,
    ),
    "hta_triton_example.json.gz": ("NVIDIA A100-PG509-200", 1, "ProfilerStep", None, None, 71, {"memory": 1}, 1),
    "hta_inference_rank_1.json.gz": ("", 1, "none", 1, None, 54, {"gemm": 2, "memory": 2}, 4),
    "hta_alexnet.json.gz": (
        "NVIDIA A100-PG509-200", 1, "none", 0, None, 1408, {"gemm": 12, "conv": 18, "memory": 49, "copy": 19}, 79,
    ),
    "hta_step_based_gp100.json.gz": (
        "Quadro GP100", 5, "repeats", 0, None, 1344, {"gemm": 25, "memory": 105, "copy": 10}, 130,
    ),
    "hta_large_integer_rank-70.json.gz": ("", 1, "none", None, None, 2, {"nccl": 1}, 0),
    "kineto_resnet50_2steps.json.gz": (
        "Tesla V100-DGXS-32GB", 2, "ProfilerStep", None, None, 14906,
        {"gemm": 10, "conv": 642, "memory": 2272, "copy": 108}, 2924,
    ),
}  # fmt: skip


def _post(api: Api, trace, cluster: str = "dgx-a100"):
    return api.post("/v1/calibrate", json={"cluster": {"preset": cluster}, "trace": trace})


@pytest.fixture(scope="module")
def answers():
    """Each trace posted once (gzipped, base64), as the page and the CLI send it; the deadline raised so that a
    loaded machine does not turn a 0.3 CPU-s parse into a 503."""
    api = Api(Settings(deadline_s=120.0))
    out = {}
    for name in EXPECTED:
        response = _post(api, base64.b64encode((TRACES / name).read_bytes()).decode())
        assert response.status_code == 200, (name, response.text)
        out[name] = response.json()["trace"]
    api.close()
    return out


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_trace_round_trips_with_the_counts_jq_gives(answers, name):
    device, steps, steps_from, rank, world, events, kinds, launches = EXPECTED[name]
    trace = answers[name]
    assert (trace["device"], trace["steps"], trace["steps_from"]) == (device, steps, steps_from)
    assert (trace["rank"], trace["world_size"], trace["events"]) == (rank, world, events)
    assert {k["kind"]: k["count"] for k in trace["kernels"]} == kinds
    assert sum(k["share"] for k in trace["kernels"]) == pytest.approx(1.0)
    assert trace["host"]["launches"] == launches  # every kernel's launch call found (HIP's and cuLaunchKernel too)
    if "conv" in kinds:  # said: the plan models no convolution
        assert any(f"{kinds['conv']:,} kernels" in w and "convolutions" in w for w in trace["warnings"])
    if "other" not in kinds:
        assert trace["unclassified"] == []


def test_the_nccl_calls_carry_their_recorded_sizes(answers):
    """HTA's nccl_data trace (torch 2.x, NCCL 2.17.1, 2 ranks): Kineto copied c10d's Collective name, In msg nelems
    and dtype onto each kernel. jq: 15 AllReduce kernels of float, 5 sizes once a step each (3 steps), and 6
    Broadcasts of 53 longs (424 B) and 53,120 floats (212,480 B)."""
    rows = [
        (r["op"], r["message_bytes"], r["trace_calls_per_step"])
        for r in answers["hta_nccl_data.json.gz"]["collectives"]
    ]
    sizes = [8_196_000, 9_724_160, 26_255_360, 26_550_272, 31_502_336]  # In msg nelems x 4 (Float)
    assert rows == [("allreduce", b, 1.0) for b in sizes] + [("broadcast", 424, 1.0), ("broadcast", 212_480, 1.0)]
    assert sum(sizes) * 3 == 306_684_384  # jq: the 15 kernels' In msg nelems x 4, summed
    for r in answers["hta_nccl_data.json.gz"]["collectives"]:  # Group size 2: busbw factor 2(n-1)/n = 1 = broadcast's
        assert r["group_size"] == 2
        assert r["trace_busbw_GBps"] == pytest.approx(r["message_bytes"] / r["trace_s_per_call"] / 1e9, rel=1e-12)
    graph = answers["hta_a100_cudagraph_rank0_2steps.json.gz"]["collectives"]  # torch 2.0: no sizes recorded
    assert [(r["op"], r["message_bytes"], r["trace_calls_per_step"]) for r in graph] == [("sendrecv", None, 15.0)]
    assert graph[0]["group_size"] is None and graph[0]["trace_busbw_GBps"] is None


def test_the_fits_say_which_gpu_they_are_for(answers):
    """A V100 or MI250 trace fitted on dgx-a100 is said to be another GPU's; the MI250's two GEMMs with shapes are
    too few to fit, and the warning says that, not to record shapes (it did)."""
    for name, sms in (("kineto_resnet50_2steps.json.gz", 80), ("hta_mi250_minitoy_train_ROCm6_2_kineto.json.gz", 104)):
        warnings = answers[name]["warnings"]
        assert any("the constants are fitted for the cluster's GPU 'A100 SXM4 80GB'" in w for w in warnings)
        assert f"the trace's GPU has {sms} SMs, the cluster's A100 SXM4 80GB 108" in warnings
    (gemm,) = [
        w for w in answers["hta_mi250_minitoy_train_ROCm6_2_kineto.json.gz"]["warnings"] if "GEMM operators" in w
    ]
    assert gemm.startswith("2 GEMM operators with recorded shapes") and "record_shapes=True" not in gemm


def test_plain_json_and_text_read_as_the_gzip(api):
    """The same trace as the parsed JSON (Kineto's 2022 array-less object, HTA's inference_rank_1) and as its text."""
    text = gzip.decompress((TRACES / "hta_inference_rank_1.json.gz").read_bytes()).decode()
    as_b64 = _post(api, base64.b64encode((TRACES / "hta_inference_rank_1.json.gz").read_bytes()).decode()).json()
    assert _post(api, text).json() == as_b64 == _post(api, json.loads(text)).json()


def test_traces_without_kernels_are_422s_with_their_numbers(api):
    """HTA's CPU-only rank (gloo, 300 ranks): 30 events, 4 CPU operators; an empty event list; an empty text."""
    cpu = base64.b64encode((TRACES / "hta_cpu_only_rank-34.json.gz").read_bytes()).decode()
    for trace, words in (
        (cpu, "no GPU kernel events (ph 'X', cat 'kernel') among 30 events (4 CPU operators"),
        ({"traceEvents": []}, "among 0 events (no GPU activity"),
        ("", "not JSON: Expecting value at line 1 column 1 of 0 chars (the text ends there"),
        ('[{"ph": "E", "ts": 1}]', "an 'E' event with no open 'B'"),
    ):
        response = _post(api, trace)
        assert response.status_code == 422, response.text
        (err,) = response.json()["detail"]
        assert words in err["msg"] and err["loc"][1] == "trace", err


def test_the_cli_reads_a_trace_or_the_folder_of_one(capsys, tmp_path):
    """`commplan calibrate --trace` on the ResNet-50 file, on a folder holding it alone (tensorboard_trace_handler's
    dir_name), and refusing a folder of several ranks' files or of none, naming them (exit 2)."""
    resnet = TRACES / "kineto_resnet50_2steps.json.gz"
    assert main(["calibrate", "--trace", str(resnet), "--cluster", "dgx-a100"]) == 0
    out = capsys.readouterr().out
    assert (
        "Tesla V100-DGXS-32GB, 2 steps, 14,906 events" in out
        and "  conv          321.0 kernels/step  65.7 ms/step   65.3%" in out
    )
    one = tmp_path / "one"
    one.mkdir()
    shutil.copy(resnet, one / "worker0.1623143089861.pt.trace.json.gz")
    assert main(["calibrate", "--trace", str(one), "--cluster", "dgx-a100", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["trace"]["kernels"][1] == {
        "kind": "conv", "count": 642, "per_step": 321.0,
        "seconds_per_step": pytest.approx(0.0657, abs=5e-5), "share": pytest.approx(0.653, abs=5e-4),
    }  # fmt: skip
    shutil.copy(TRACES / "hta_alexnet.json.gz", one / "worker1.pt.trace.json.gz")
    assert main(["calibrate", "--trace", str(one), "--cluster", "dgx-a100"]) == 2
    err = capsys.readouterr().err
    assert "a folder of 2 trace files (worker0.1623143089861.pt.trace.json.gz, worker1.pt.trace.json.gz)" in err
    assert "give one rank's file to --trace" in err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["calibrate", "--trace", str(empty), "--cluster", "dgx-a100"]) == 2
    assert "a folder without trace files (*.json, *.json.gz)" in capsys.readouterr().err


def test_a_cut_real_trace_is_a_422_with_its_numbers(api):
    """nccl_data's 749,757-byte gzip cut at 300,000 bytes, and its 9,778,890-character JSON cut at 1,000,000 and sent
    as text (under the 8 MiB body): each refused naming where it ends."""
    raw = (TRACES / "hta_nccl_data.json.gz").read_bytes()
    response = _post(api, base64.b64encode(raw[:300_000]).decode())
    assert response.status_code == 422
    assert response.json()["detail"][0]["msg"] == "the gzip stream ends early after 300,000 bytes (a truncated file?)"
    text = gzip.decompress(raw).decode()
    assert len(text) == 9_778_890
    response = _post(api, text[:1_000_000])
    (err,) = response.json()["detail"]
    assert response.status_code == 422 and err["loc"][-1] == "trace"
    assert "of 1,000,000 chars (the text ends there: a truncated file?)" in err["msg"], err


def test_base64_of_the_json_itself_is_named(api):
    """An API user who base64-encodes the .json (not its gzip) is told what was sent and what is read."""
    text = gzip.decompress((TRACES / "hta_inference_rank_1.json.gz").read_bytes())
    response = _post(api, base64.b64encode(text).decode())
    (err,) = response.json()["detail"]
    assert response.status_code == 422 and err["loc"][-1] == "trace"
    assert err["msg"].startswith("starts as base64 of a JSON file ('ewo'): send the JSON itself"), err  # '{\\n'
