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
        ({"preset": "dgx-h100", "nccl_version": "2.17.3"}, {}, ["cluster", "nccl_version"], "2.18 to 2.30"),
        ({"preset": "dgx-h100", "nccl_version": "2.31"}, {}, ["cluster", "nccl_version"], "2.18 to 2.30"),
        (
            {"preset": "dgx-h100", "nccl_env": {"NCCL_MAX_NCHANNELS": 65}},
            {},
            ["cluster", "nccl_env", "NCCL_MAX_NCHANNELS"],
            "1..64 (MAXCHANNELS of NCCL 2.30",
        ),
        (  # device.h MAXCHANNELS was 32 before v2.26
            {"preset": "dgx-h100", "nccl_version": "2.24.3", "nccl_env": {"NCCL_MIN_NCHANNELS": 33}},
            {},
            ["cluster", "nccl_env", "NCCL_MIN_NCHANNELS"],
            "1..32 (MAXCHANNELS of NCCL 2.24",
        ),
        (
            {"preset": "dgx-h100", "nccl_env": {"NCCL_NVLS_ENABLE": 3}},
            {},
            ["cluster", "nccl_env", "NCCL_NVLS_ENABLE"],
            "2",
        ),
        ({"preset": "dgx-h100", "nccl_env": {"NCCL_COLLNET": 1}}, {}, ["cluster", "nccl_env", "NCCL_COLLNET"], "Extra"),
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
    # 12 search channels, launched as comm->nChannels = 24 (connect.cc:ncclTopoPostset duplicates them)
    assert (r["nccl_algorithm"], r["channels"]) == ("Ring", 24) and 330 < r["busbw_GBps"] < 360
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


def _price(api, cluster, size, group_size=16, **options):
    body = {"op": "allreduce", "message_bytes": size, "cluster": cluster, "group_size": group_size} | options
    r = api.post("/v1/collectives/price", json=body)
    assert r.status_code == 200, r.text
    return r.json()


TWO = {"preset": "dgx-h100", "num_nodes": 2}


def test_collnet_is_off_unless_nccl_collnet_enable(api):
    """init.cc: config.collnetEnable defaults to 0 (v2.30.7-1 lines 2146-2203; v2.18.6-1 lines 861-866), and
    tuning.cc disables CollNetDirect/Chain and multi-node NVLS without it (v2.30.7-1 lines 504-507): the SHARP
    capable dgx-h100 preset prices a 1 MiB allreduce on two nodes with Tree/LL128 (16 channels); with
    NCCL_COLLNET_ENABLE=1, NVLS across nodes (SHARP) wins."""
    off = _price(api, TWO, 1 << 20)
    on = _price(api, TWO | {"nccl_env": {"NCCL_COLLNET_ENABLE": 1}}, 1 << 20)
    assert (off["nccl_algorithm"], off["protocol"], off["channels"]) == ("Tree", "LL128", 16)
    assert on["nccl_algorithm"] == "NVLS" and on["time_s"] < off["time_s"]


def test_nvls_enable_zero_turns_nvls_off(api):
    """transport/nvls.cc ncclNvlsInit (v2.30.7-1 line 262): NCCL_NVLS_ENABLE=0 returns before NVLS support;
    1 GiB on one DGX H100 falls back from NVLS (466.7 GB/s; 468.5 before the one-node NVLS fill and the in_network
    efficiency refit, nccl2) to Ring/Simple (339)."""
    one = {"preset": "dgx-h100"}
    nvls = _price(api, one, 1 << 30, group_size=8)
    ring = _price(api, one | {"nccl_env": {"NCCL_NVLS_ENABLE": 0}}, 1 << 30, group_size=8)
    assert (nvls["nccl_algorithm"], ring["nccl_algorithm"], ring["protocol"]) == ("NVLS", "Ring", "Simple")
    assert nvls["busbw_GBps"] == pytest.approx(466.66, rel=1e-3) and ring["busbw_GBps"] == pytest.approx(
        339.48, rel=1e-3
    )


def test_channel_knobs(api):
    """connect.cc:ncclTopoPostset (v2.30.7-1 lines 496-506): comm->nChannels = min(NCCL_MAX_NCHANNELS, 16) on two
    DGX H100, then at least NCCL_MIN_NCHANNELS. Ring/LL128 at 1 GiB: 16 channels 280 GB/s; 4 channels 141 (the
    bandwidth falls with the channels below the search's 8... x 2); 32 channels 336: more channels lift only the
    per-channel LL128 cap (perChMaxRingLL128Bws 36.7 GB/s a search channel), never the NIC-bound busBw (276, 139,
    331 with the nic efficiency 0.95 before nccl2's refit to 0.97; 280, 141, 336 since the ring's NVLink steps take
    the NVLink domain's latency scale across nodes too, nvl5)."""
    pin = {"nccl_algo": "Ring", "nccl_proto": "LL128"}
    runs = [
        _price(api, TWO | {"nccl_env": env}, 1 << 30, **pin)
        for env in ({}, {"NCCL_MAX_NCHANNELS": 4}, {"NCCL_MIN_NCHANNELS": 32})
    ]
    assert [r["channels"] for r in runs] == [16, 4, 32]
    assert [round(r["busbw_GBps"]) for r in runs] == [280, 141, 336]


def test_nccl_versions_change_what_nccl_picks(api):
    """PAT arrived in v2.23 (tuning.cc v2.23.4-1 ncclPatEnable) with busBw x .85, .75 from v2.24 (line 256):
    a 1 MiB allgather over 4 nodes of one A100 runs PAT on 2.23 and Ring/LL128 on 2.30; 2.20 has no PAT."""
    one_gpu = {"preset": "dgx-a100", "num_nodes": 4, "devices_per_node": 1, "nics_per_node": 1}
    picks = {
        v: _price(api, one_gpu | {"nccl_version": v}, 1 << 20, group_size=4, op="allgather")["nccl_algorithm"]
        for v in ("2.20.5", "2.23.4", "2.30.7")
    }
    assert picks == {"2.20.5": "Ring", "2.23.4": "PAT", "2.30.7": "Ring"}


def test_nccl_env_round_trips_in_the_plan_cluster_block(api):
    cluster = TWO | {"nccl_version": "2.21", "nccl_env": {"NCCL_MAX_NCHANNELS": 8, "NCCL_COLLNET_ENABLE": 1}}
    body = plan(api, cluster).json()
    env = {k: v for k, v in body["cluster"]["nccl_env"].items() if v is not None}
    assert env == {"NCCL_MAX_NCHANNELS": 8, "NCCL_COLLNET_ENABLE": 1}
    again = plan(api, body["cluster"]).json()
    assert [c["time_s"] for c in again["calls"]] == [c["time_s"] for c in body["calls"]]
    assert body["cluster"]["nccl_version"] == "2.21"


def test_tcpx_network_kind_and_a3_high_over_http(api):
    """GCP a3-high (GPUDirect-TCPX): Simple only across nodes and 12 channels (its preset's NCCL_MIN/MAX);
    `network.kind: tcpx` on any cluster restricts the protocol the same way."""
    r = _price(api, {"preset": "gcp-a3-high", "num_nodes": 2}, 1 << 20)
    assert (r["protocol"], r["channels"]) == ("Simple", 12)
    r = _price(api, TWO | {"network": {"kind": "tcpx"}}, 1 << 20)
    assert r["protocol"] == "Simple"
