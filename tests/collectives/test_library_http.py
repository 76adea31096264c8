"""Library pricing over HTTP: options, per-call protocol, the new cluster fields and their 422s."""

from dataclasses import replace

import pytest

from app.convert import cluster_block, cluster_spec
from app.schemas.cluster import ClusterIn
from app.settings import Settings
from collectives.topology import PRESETS, cluster_preset
from tests.app.conftest import Api

PLAN = {
    "model": {"preset": "llama3-8b"},
    "workload": {"kind": "training", "micro_batch_size": 1, "global_batch_size": 16},
    "parallel": {"tp": 8, "pp": 1, "dp": 2},
}


@pytest.fixture(scope="module")
def api():
    return Api()


def plan(api, cluster, **options):
    return api.post("/v1/plan", json=PLAN | {"cluster": cluster, "options": options})


def test_plan_calls_report_protocol_and_nccl_algorithm(api):
    body = plan(api, {"preset": "dgx-h100", "num_nodes": 2}).json()
    tp = next(c for c in body["calls"] if c["parallelism"] == "tp")
    assert tp["protocol"] in ("LL", "LL128", "Simple") and tp["nccl_algorithm"] in ("Ring", "Tree", "NVLS")
    pinned = plan(api, {"preset": "dgx-h100", "num_nodes": 2}, nccl_algo="Ring", nccl_proto="Simple").json()
    assert {(c["nccl_algorithm"], c["protocol"]) for c in pinned["calls"] if c["op"] == "allreduce"} == {
        ("Ring", "Simple")
    }
    schedule = plan(api, {"preset": "dgx-h100", "num_nodes": 2}, pricing="schedule").json()
    assert all(c["protocol"] == "" for c in schedule["calls"])


@pytest.mark.parametrize(
    ("cluster", "options", "loc", "words"),
    [
        ({"preset": "dgx-h100", "gpu": "h42"}, {}, ["cluster", "gpu"], "unknown GPU"),
        (
            {"preset": "dgx-h100", "num_nodes": 2, "network": {"kind": "myrinet"}},
            {},
            ["cluster", "network", "kind"],
            "unknown network kind",
        ),
        ({"preset": "dgx-h100", "nccl_version": "2.18.5"}, {}, ["cluster", "nccl_version"], "unknown NCCL version"),
        ({"preset": "pcie-server", "num_nodes": 2}, {"nccl_algo": "NVLS"}, ["options", "nccl_algo"], "NVLink switch"),
        ({"preset": "dgx-a100", "num_nodes": 2}, {"nccl_algo": "NVLS"}, ["options", "nccl_algo"], "SM90"),
        ({"preset": "npu-mesh-8", "num_nodes": 2}, {"pricing": "library"}, ["options", "pricing"], "NVIDIA GPU"),
        (
            {"preset": "dgx-h100", "num_nodes": 2},
            {"nccl_algo": "ringo"},
            ["options", "nccl_algo"],
            "unknown NCCL algorithm",
        ),
        (
            {"preset": "dgx-h100", "num_nodes": 2},
            {"nccl_proto": "LL64"},
            ["options", "nccl_proto"],
            "unknown NCCL protocol",
        ),
    ],
)
def test_bad_input_is_a_422_naming_field_and_rule(api, cluster, options, loc, words):
    r = plan(api, cluster, **options)
    assert r.status_code == 422, r.text
    err = r.json()["detail"][0]
    assert err["loc"][1:] == loc and words in err["msg"]


def test_price_endpoint_library_and_pin(api):
    body = {"op": "allreduce", "message_bytes": 1 << 30, "cluster": {"preset": "dgx-h100"}, "group_size": 8}
    r = api.post("/v1/collectives/price", json=body).json()
    assert (r["nccl_algorithm"], r["protocol"], r["algorithm"]) == ("NVLS", "Simple", "in_network")
    r = api.post("/v1/collectives/price", json=body | {"nccl_algo": "Ring"}).json()
    assert (r["nccl_algorithm"], r["channels"]) == ("Ring", 12) and 330 < r["busbw_GBps"] < 360
    bad = api.post("/v1/collectives/price", json=body | {"cluster": {"preset": "dgx-a100"}, "nccl_algo": "NVLS"})
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["body", "nccl_algo"]


def test_gpu_given_by_fields():
    block = ClusterIn(
        preset="dgx-h100", gpu={"name": "X", "peak_tflops": {"bf16": 100.0}, "sm": 90, "nvlink_links": 18}
    )
    spec = cluster_spec(block, Settings())
    assert spec.gpu.sm == 90 and spec.gpu.peak("bf16") == 100e12


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_cluster_block_round_trips(name):
    spec = cluster_preset(name, 2)
    block = ClusterIn.model_validate(cluster_block(spec))
    again = cluster_spec(block, Settings())
    # everything that prices is rebuilt; the prose (description, sources, GPU source) stays with the preset
    prose = {"description": spec.description, "sources": spec.sources, "device": spec.device}
    assert replace(again, gpu=replace(again.gpu, source=spec.gpu.source), **prose) == spec


def test_explorer_plots_algorithm_x_protocol_curves(api):
    request = PLAN | {"cluster": {"preset": "dgx-h100", "num_nodes": 2}}
    r = api.post("/v1/plan/explore", json={"request": request, "call": "tp.attn.out_proj", "sizes": [1 << 10, 1 << 30]})
    assert r.status_code == 200, r.text
    body = r.json()
    names = [s["algorithm"] for s in body["series"]]
    assert {"NVLS/Simple", "Ring/LL", "Ring/LL128", "Ring/Simple"} <= set(names) and "ring" in names
    assert body["auto"][0].endswith("/LL") and body["auto"][-1] == "NVLS/Simple"
    nvls = body["series"][names.index("NVLS/Simple")]
    assert nvls["busbw_GBps"][-1] > 400  # NCCL's 480 x the fitted NVLS efficiency, less the latency
    request["options"] = {"pricing": "schedule"}
    plain = api.post("/v1/plan/explore", json={"request": request, "call": "tp.attn.out_proj"}).json()
    assert all("/" not in s["algorithm"] for s in plain["series"])


def test_plan_response_cluster_block_round_trips(api):
    first = plan(api, {"preset": "aws-p5", "num_nodes": 2}).json()
    block = first["cluster"]  # the response's cluster block is itself a request block (CONTRACT v1.1)
    again = plan(api, block).json()
    assert again["cluster"] == block
    assert [c["time_s"] for c in again["calls"]] == [c["time_s"] for c in first["calls"]]
