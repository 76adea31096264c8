"""POST /v1/calibrate and `commplan calibrate`: logs in, constants, rows and a cluster for /v1/plan out;
malformed logs and oversized input are 422s naming the line or the limit."""

import json

import pytest

from app.cli import main
from app.schemas.calibrate import MAX_LOG_CHARS, MAX_LOGS, MAX_ROWS

from .conftest import LLAMA70B

LOGS = __import__("pathlib").Path(__file__).resolve().parents[1] / "reference" / "nccl_logs"
SAMPLE = (LOGS / "sample_h100_2node.txt").read_text()
EFA = next(LOGS.glob("02_allreduce_2x8_*.txt"))
EFA_CLUSTER = {"preset": "dgx-a100", "nics_per_node": 4, "nic_bandwidth_GBps": 12.5, "nic_latency_s": 15e-6,
               "network": {"rail_optimized": False, "kind": "efa"}}  # fmt: skip


@pytest.fixture(scope="module")
def efa(api):
    body = {"cluster": EFA_CLUSTER, "logs": [{"text": EFA.read_text(), "nodes": 2}]}
    response = api.post("/v1/calibrate", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def test_calibrate_answers_the_contract(efa):
    assert set(efa) >= {"cluster", "constants", "rows", "median_error_before", "median_error_after"}
    assert len(efa["rows"]) == 29
    row = efa["rows"][-1]
    assert set(row) >= {"op", "size_bytes", "nodes", "measured_busbw_GBps", "before_GBps", "after_GBps"}
    assert (row["op"], row["size_bytes"], row["nodes"]) == ("allreduce", 2147483648, 2)
    assert row["measured_busbw_GBps"] == pytest.approx(78.33, abs=0.01)
    # the EFA run: 13% before, 6% after (docs/calibration.md)
    assert efa["median_error_after"] < min(0.10, 0.6 * efa["median_error_before"])
    assert all(r["fitted"] for r in efa["rows"])
    assert efa["cluster"]["calibration"] == efa["constants"] and efa["constants"]
    run = {"log": 0, "op": "allreduce", "ranks": 16, "nodes": 2, "rows": 29, "nccl_version": None}
    run |= {"priced_as_nccl": "2.30", "nccl_algo": None, "devices": ["NVIDIA A100-SXM4-80GB"], "gpus_per_process": 1}
    assert efa["runs"] == [run]


def test_a_log_from_another_gpu_is_warned_about(api, efa):
    """The EFA log ran on A100s: fitted on its own cluster it raises nothing; fitted on dgx-h100 the fit drives
    the NIC efficiency to its floor and the inter-node latency scale to its ceiling, and both are said."""
    assert efa["warnings"] == []
    body = {"cluster": {"preset": "dgx-h100"}, "logs": [{"text": EFA.read_text(), "nodes": 2}]}
    got = api.post("/v1/calibrate", json=body).json()
    assert got["constants"]["efficiency"]["nic"] == pytest.approx(0.2)
    assert got["warnings"] == [
        "logs.0: ran on NVIDIA A100-SXM4-80GB, but the cluster's GPU is H100 SXM5 80GB: constants fitted on one GPU "
        "price another wrongly; calibrate the cluster the log ran on",
        "cluster.calibration.efficiency.nic = 0.2 sits at the end of its range [0.2, 1.5]: the logs do not fit this "
        "cluster; check its GPU, NICs, network kind and the node count",
        "cluster.calibration.latency_scale.inter_node = 6 sits at the end of its range [0.25, 6]: the logs do not fit "
        "this cluster; check its GPU, NICs, network kind and the node count",
    ]
    # the H100 sample on dgx-h100: nothing to say
    body = {"cluster": {"preset": "dgx-h100"}, "logs": [{"text": SAMPLE}]}
    assert api.post("/v1/calibrate", json=body).json()["warnings"] == []


def test_returned_cluster_plans_and_recalibrates_from_where_it_was(api, efa):
    plan = api.post("/v1/plan", json=LLAMA70B | {"cluster": efa["cluster"] | {"num_nodes": 64}})
    assert plan.status_code == 200, plan.text
    again = api.post("/v1/calibrate", json={"cluster": efa["cluster"], "logs": [{"text": EFA.read_text()}]})
    assert again.status_code == 200
    assert again.json()["median_error_before"] == pytest.approx(efa["median_error_after"], abs=0.005)


def test_sample_log_with_two_runs(api):
    response = api.post("/v1/calibrate", json={"cluster": {"preset": "dgx-h100"}, "logs": [{"text": SAMPLE}]})
    assert response.status_code == 200, response.text
    body = response.json()
    assert [(r["op"], r["ranks"], r["nodes"], r["nccl_version"]) for r in body["runs"]] == [
        ("allreduce", 16, 2, "2.21.5"), ("allgather", 16, 2, "2.21.5")]  # fmt: skip
    assert body["median_error_after"] <= body["median_error_before"]


@pytest.mark.parametrize(
    ("text", "loc", "needle"),
    [
        (SAMPLE.replace("35104  244.70", "35104  2x4.70"), ["logs", "0", "text"], "line 56: "),
        ("nothing here\n", ["logs", "0", "text"], "no nccl-tests result rows"),
        (
            SAMPLE.replace("all_reduce_perf", "hypercube_perf").split("+ srun", 2)[1],
            ["logs", "0", "op"],
            "hypercube_perf is not one of them",
        ),
    ],
)
def test_malformed_log_is_a_422_naming_the_line(api, text, loc, needle):
    response = api.post("/v1/calibrate", json={"cluster": {"preset": "dgx-h100"}, "logs": [{"text": text}]})
    assert response.status_code == 422, response.text
    (error,) = response.json()["detail"]
    assert error["loc"] == ["body", *loc] and needle in error["msg"], error


def test_bad_nodes_cluster_and_calibration_are_422s(api):
    alone = (  # what each process prints when the binary was built without MPI=1
        "# Collective test starting: all_reduce_perf\n# nThread 1 nGpus 1 minBytes 1048576 maxBytes 1048576\n"
        "#  Rank  0 Group  0 Pid  41 on  node1 device  0 [0000:18:00] NVIDIA H100 80GB HBM3\n"
        "  1048576  262144  float  sum  -1  5.100  205.60  0.00  0  5.00  209.72  0.00  0\n"
    )
    cases = [
        ({"cluster": {"preset": "dgx-h100"}, "logs": [{"text": alone}]},
         ["logs", "0", "text"], "a run of 1 rank moves no data"),
        ({"cluster": {"preset": "tpu-torus"}, "logs": [{"text": SAMPLE}]}, ["logs", "0", "nodes"],
         "torus 4 x 4 x 4 = 64 routers but the cluster has 2 nodes"),
        ({"cluster": {"preset": "dgx-h100"}, "logs": [{"text": SAMPLE, "nodes": 1}]}, ["logs", "0", "nodes"],
         "the rank lines name 2 hosts"),
        ({"cluster": {"preset": "dgx-h100"}, "logs": [{"text": SAMPLE, "nodes": 3}]}, ["logs", "0", "nodes"],
         "16 ranks on 3 nodes"),
        ({"cluster": {"preset": "dgx-h100"}, "logs": [{"text": SAMPLE, "algorithm": "warp"}]},
         ["logs", "0", "algorithm"], "unknown NCCL algorithm 'warp'"),
        ({"cluster": {"preset": "dgx-h100"}, "logs": [{"text": SAMPLE, "algorithm": "bcast:ring"}]},
         ["logs", "0", "algorithm"], "unknown function prefix"),
        ({"cluster": {"preset": "dgx-h100"}, "logs": [{"text": SAMPLE}], "network_kind": "slingshot"},
         ["network_kind"], "Input should be"),
        ({"cluster": {"preset": "dgx-h100", "calibration": {"efficiency": {"nvlink": 2}}}, "logs": [{"text": SAMPLE}]},
         ["cluster", "calibration", "efficiency", "nvlink"], "within [0.2, 1.5]"),
    ]  # fmt: skip
    for body, loc, needle in cases:
        response = api.post("/v1/calibrate", json=body)
        assert response.status_code == 422, response.text
        error = response.json()["detail"][0]
        assert error["loc"] == ["body", *loc] and needle in error["msg"], error
    cluster = {"preset": "dgx-h100", "num_nodes": 64, "calibration": {"latency_scale": {"rack": 2}}}
    plan = api.post("/v1/plan", json=LLAMA70B | {"cluster": cluster})
    assert plan.status_code == 422
    assert plan.json()["detail"][0]["loc"] == ["body", "cluster", "calibration", "latency_scale", "rack"]


def test_limits_are_422s_naming_them(api):
    too_many = api.post("/v1/calibrate", json={"cluster": {"preset": "dgx-h100"}, "logs": [{"text": "x"}] * 65})
    assert too_many.status_code == 422 and f"at most {MAX_LOGS}" in too_many.text
    row = (
        "     1048576        262144     float     sum      -1    50.00   20.97   36.70       0"
        + "  50.00  20.97  36.70  0\n"
    )
    log = {"text": row * (MAX_ROWS + 1), "op": "allreduce", "ranks": 8}
    rows = api.post("/v1/calibrate", json={"cluster": {"preset": "dgx-h100"}, "logs": [log]})
    assert rows.status_code == 422 and f"more than {MAX_ROWS} table rows (the limit)" in rows.text
    half = {"text": row * (MAX_ROWS // 2 + 1), "op": "allreduce", "ranks": 8, "nodes": 1}
    both = api.post("/v1/calibrate", json={"cluster": {"preset": "dgx-h100"}, "logs": [half, half]})
    assert both.status_code == 422, both.text
    assert both.json()["detail"][0]["loc"] == ["body", "logs", "1", "text"]
    assert f"hold {MAX_ROWS + 2} table rows; at most {MAX_ROWS} in all (the limit)" in both.text
    assert MAX_LOG_CHARS < 8 * 2**20  # a log at the limit fits the body limit, so the 422 is the log's own


def test_cli_table_and_json(capsys, tmp_path):
    path = tmp_path / "efa.txt"
    path.write_text(EFA.read_text())
    cluster = tmp_path / "unused"
    assert main(["calibrate", str(path), "--cluster", "dgx-h100", "--format", "json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert len(result["rows"]) == 29 and result["median_error_after"] <= result["median_error_before"]
    assert main(["calibrate", str(path), "--cluster", "dgx-h100"]) == 0
    out = capsys.readouterr().out
    assert "MB" in out and "GB/s" in out and "%" in out and "median |error|" in out
    assert "e-0" not in out and "e+0" not in out  # no scientific notation
    assert "efa.txt:55" in out  # rows name their file and line
    bad = tmp_path / "bad.txt"
    bad.write_text(SAMPLE.replace("35104  244.70", "35104  2x4.70"))
    assert main(["calibrate", str(bad), "--cluster", "dgx-h100"]) == 2
    assert f"{bad}: line 56: " in capsys.readouterr().err
    assert main(["calibrate", str(cluster), "--cluster", "dgx-h100"]) == 2


def test_price_and_plan_use_the_clusters_calibration(api):
    """Halving the NVLink efficiency doubles a ring's bandwidth term, exactly; twice the inter-node latency
    scale makes a plan's inter-node calls slower and leaves its intra-node calls alone."""
    call = {"op": "allgather", "nccl_algo": "Ring", "message_bytes": 1 << 30, "group_size": 8}

    def time(efficiency):  # the library default is 0.96; time = latency + bytes / (rate x efficiency)
        cluster = {"preset": "dgx-h100", "calibration": {"efficiency": {"nvlink": efficiency}}}
        return api.post("/v1/collectives/price", json=call | {"cluster": cluster}).json()["time_s"]

    plain, half, quarter = time(0.96), time(0.48), time(0.24)
    assert plain == api.post("/v1/collectives/price", json=call | {"cluster": {"preset": "dgx-h100"}}).json()["time_s"]
    assert quarter - half == pytest.approx(2 * (half - plain), rel=1e-9) and half > 1.9 * plain

    def plan(calibration):
        cluster = {"preset": "dgx-h100", "num_nodes": 64} | ({"calibration": calibration} if calibration else {})
        response = api.post("/v1/plan", json=LLAMA70B | {"cluster": cluster})
        assert response.status_code == 200, response.text
        return {c["name"]: c for c in response.json()["calls"]}

    before, after = plan(None), plan({"latency_scale": {"inter_node": 5.5}})  # library default 1.0
    library = {n: c for n, c in before.items() if c.get("protocol")}  # NCCL's model prices them
    assert {c["placement"]["span"] for c in library.values()} == {"intra_node", "inter_node"}
    for name, call in library.items():
        if call["placement"]["span"] == "inter_node":
            assert after[name]["time_s"] > call["time_s"], name
        else:
            assert after[name]["time_s"] == call["time_s"], name


def test_a_plans_cluster_request_carries_the_calibration_back(api, efa):
    """The plan's cluster block (a request block: spec_block) holds the fitted constants by the same names,
    and planning it again gives the same times."""
    first = api.post("/v1/plan", json=LLAMA70B | {"cluster": efa["cluster"] | {"num_nodes": 64}})
    assert first.status_code == 200, first.text
    block = first.json()["cluster"]
    for group, values in efa["constants"].items():
        for key, value in values.items():
            assert block["calibration"][group][key] == pytest.approx(value)
    again = api.post("/v1/plan", json=LLAMA70B | {"cluster": block})
    assert again.status_code == 200, again.text
    assert again.json()["totals"]["time_s"] == pytest.approx(first.json()["totals"]["time_s"], rel=1e-12)


# ---- issue 23 item 7: a bare table, its op given, -g N --------------------------------------------------------
def _bare(name: str) -> str:
    text = next(LOGS.glob(name)).read_text()
    return "\n".join(line for line in text.splitlines() if line[:1] == " " and line.split()[0].isdigit())


def test_a_bare_table_is_calibrated_over_http_with_its_op_read_or_given(api):
    """The Azure ND H100 v5 allreduce table pasted without its banner: allreduce on 8 ranks from its columns.
    The all_gather table (redop 'none', like alltoall) is a 422 naming both until its op is given."""
    h100 = {"cluster": {"preset": "dgx-h100"}, "logs": [{"text": _bare("00_allreduce_1x8_*.txt"), "nodes": 1}]}
    r = api.post("/v1/calibrate", json=h100)
    assert r.status_code == 200, r.text
    assert [(run["op"], run["ranks"], run["rows"]) for run in r.json()["runs"]] == [("allreduce", 8, 24)]
    gather = {"cluster": {"preset": "dgx-h100"}, "logs": [{"text": _bare("12_allgather_1x8_*.txt"), "nodes": 1}]}
    r = api.post("/v1/calibrate", json=gather)
    assert r.status_code == 422
    (error,) = r.json()["detail"]
    assert error["loc"] == ["body", "logs", "0", "op"] and "all_gather_perf or alltoall_perf" in error["msg"]
    gather["logs"][0]["op"] = "all_gather_perf"
    r = api.post("/v1/calibrate", json=gather)
    assert r.status_code == 200 and r.json()["runs"][0]["op"] == "allgather" and r.json()["runs"][0]["ranks"] == 8


def test_a_g_n_run_is_reported_and_warned_about(api):
    from tests.collectives.test_nccl_tests_parse import G4

    r = api.post("/v1/calibrate", json={"cluster": {"preset": "dgx-a100"}, "logs": [{"text": G4}]})
    assert r.status_code == 200, r.text
    (run,) = r.json()["runs"]
    assert (run["ranks"], run["nodes"], run["gpus_per_process"]) == (4, 1, 4)
    assert any("-g 4" in w and "one process per GPU" in w for w in r.json()["warnings"]), r.json()["warnings"]
    r = api.post("/v1/calibrate", json={"cluster": {"preset": "dgx-h100"}, "logs": [{"text": SAMPLE}]})
    assert all(run["gpus_per_process"] == 1 for run in r.json()["runs"])
    assert not any("-g " in w for w in r.json()["warnings"])


def test_a_g8_run_over_two_nodes_is_16_ranks_on_2_nodes(api):
    """The -g 8 fixture of two processes (one a node, 8 GPUs each; tests/collectives/nccl_logs.py G8) over HTTP,
    without nodes or ranks given: 16 ranks on 2 nodes, 8 GPUs a process, every row fitted, and the warning."""
    text = (LOGS / "g8_allreduce_2x8_aws-p4de.txt").read_text()
    r = api.post("/v1/calibrate", json={"cluster": EFA_CLUSTER, "logs": [{"text": text}]})
    assert r.status_code == 200, r.text
    (run,) = r.json()["runs"]
    assert (run["ranks"], run["nodes"], run["gpus_per_process"], run["rows"]) == (16, 2, 8, 29)
    assert any("-g 8" in w and "one process per GPU" in w for w in r.json()["warnings"]), r.json()["warnings"]


def test_cli_op_and_ranks(capsys, tmp_path):
    path = tmp_path / "bare_allgather.txt"
    path.write_text(_bare("12_allgather_1x8_*.txt"))
    assert main(["calibrate", str(path), "--cluster", "dgx-h100", "--nodes", "1", "--format", "json"]) == 2
    assert "all_gather_perf or alltoall_perf" in capsys.readouterr().err
    args = ["calibrate", str(path), "--cluster", "dgx-h100", "--nodes", "1", "--op", "all_gather_perf"]
    assert main([*args, "--ranks", "8", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["runs"][0]["op"] == "allgather"
