"""POST /v1/serve over HTTP as users call it (CONTRACT v1.2), and `commplan serve-plan`."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LLAMA = json.loads((ROOT / "examples/serve-llama3-70b.json").read_text())
DSV3 = json.loads((ROOT / "examples/serve-deepseek-v3-disagg.json").read_text())


def test_aggregated_answer_has_the_contract(api):
    r = api.post("/v1/serve", json=LLAMA)
    assert r.status_code == 200, r.text
    d = r.json()
    assert d["gpus"] == 16 and d["fits"] is True and d["kv_transfer"] is None
    assert set(d["throughput"]) == {
        "input_tokens_per_s", "output_tokens_per_s", "output_tokens_per_s_per_gpu", "tokens_per_s_per_user",
    }  # fmt: skip
    assert d["kv_cache"]["bytes_per_token"] == 327_680
    (pool,) = d["pools"]
    assert pool["role"] == "both" and pool["gpus"] == 16 and pool["batch"] == 32
    # the decode step's calls in /v1/plan's shape: TP all-reduces of one token per sequence
    names = {c["name"] for c in pool["calls"]}
    assert any(c["parallelism"] == "tp" and c["op"] == "allreduce" for c in pool["calls"]), names
    assert all({"message_bytes", "time_s", "placement", "source"} <= set(c) for c in pool["calls"])
    assert d["throughput"]["output_tokens_per_s"] == pytest.approx(d["request_rate"] * 200)
    assert 0 < d["ttft_s"] < 10 and 0 < d["tpot_s"] < 1


def test_disaggregated_answer_prices_the_kv_transfer(api):
    r = api.post("/v1/serve", json=DSV3)
    assert r.status_code == 200, r.text
    d = r.json()
    assert d["gpus"] == 96 and [p["role"] for p in d["pools"]] == ["prefill", "decode"]
    kv = d["kv_transfer"]
    assert kv["bytes_per_request"] == 2000 * 70_272
    assert kv["time_s"] >= kv["bytes_per_request"] / 50e9 and "nic" in kv["bottleneck"]
    assert kv["links"] and kv["links"][0]["label"] == kv["bottleneck"]
    ep = [c for c in d["pools"][1]["calls"] if c["parallelism"] == "ep"]
    # SGLang's DP attention without DeepEP gathers the tokens before the MoE and scatters after
    assert {c["op"] for c in ep} >= {"allgather", "reducescatter"}


def test_disaggregated_ttft_over_http_never_falls_as_concurrency_grows(api):
    """The closed loop over HTTP (tests/planner/test_serving.py has it by hand): one prompt is a pass of one prompt
    per attention rank, not the 128-prompt pass that made TTFT 3.2 s at concurrency 1, and TTFT grows with load
    (it read 10.7 s at 128 and 3.2 s at 256 before)."""
    answers = {}
    for c in (1, 128, 256, 512):
        r = api.post("/v1/serve", json={**DSV3, "traffic": {**DSV3["traffic"], "concurrency": c}})
        assert r.status_code == 200, r.text
        answers[c] = r.json()
    ttfts = [answers[c]["ttft_s"] for c in sorted(answers)]
    # never falls (values equal in exact arithmetic may differ in the last bit of a float sum)
    assert all(b >= a * (1 - 1e-12) for a, b in itertools.pairwise(ttfts)), ttfts
    assert answers[1]["pools"][0]["batch"] == 32 and answers[512]["pools"][0]["batch"] == 128
    assert answers[1]["ttft_s"] < answers[512]["pools"][0]["step_s"] / 2
    # the load binds up to 256 (below what the pools serve), the prefill pool at 512 (review: it said prefill)
    assert [answers[c]["bottleneck"] for c in sorted(answers)] == ["concurrency"] * 3 + ["prefill"]


def test_deepep_dispatch_over_http(api):
    body = json.loads(json.dumps(DSV3))
    for pool in body["deployment"]["pools"]:
        pool["ep_dispatch"] = "deepep"
    r = api.post("/v1/serve", json=body)
    assert r.status_code == 200, r.text
    prefill, decode = ({c["name"] for c in p["calls"]} for p in r.json()["pools"])
    # SGLang's --deepep-mode auto: normal kernels (RDMA then NVLink legs) in prefill, low-latency in decode
    assert {"ep.dispatch.rdma", "ep.dispatch.nvlink"} <= prefill
    assert {"ep.dispatch.ll", "ep.combine.ll"} <= decode


@pytest.mark.parametrize(
    ("change", "loc", "words"),
    [
        ({"traffic": {"input_tokens": 0, "output_tokens": 10, "concurrency": 1}}, ["traffic", "input_tokens"], ""),
        ({"traffic": {"input_tokens": 10, "output_tokens": 10}}, ["traffic"], "exactly one of"),
        ({"deployment": {"pools": [{"tp": 3}]}}, ["deployment", "pools", "0"], "must fill whole nodes"),
        ({"deployment": {"pools": [{"tp": 8, "workers": 3}]}}, ["deployment", "pools"], "the cluster has 16"),
        ({"engine": "tgi"}, ["engine"], ""),
        ({"deployment": {"pools": [{"tp": 8, "ep": 8}]}}, ["deployment", "pools", "0", "ep"], "needs an MoE model"),
        (
            {"options": {"mtp": {"draft_tokens": 1, "acceptance": 3.0}}},
            ["options", "mtp", "acceptance"],
            "rate in [0, 1]",
        ),
        (
            {"options": {"mtp": {"draft_tokens": 1, "tokens_per_step": 3.0}}},
            ["options", "mtp", "tokens_per_step"],
            "1 + draft",
        ),
        # was a 500 (layouts3 found it with schemathesis): the overlap splits MoE layers only
        ({"engine": "sglang", "options": {"two_batch_overlap": True}}, ["options", "two_batch_overlap"], "dense"),
    ],
)
def test_bad_deployments_are_422_naming_the_field(api, change, loc, words):
    r = api.post("/v1/serve", json=LLAMA | change)
    assert r.status_code == 422, r.text
    err = r.json()["detail"][0]
    assert err["loc"][1 : 1 + len(loc)] == loc, err
    assert words in err["msg"]


def test_missing_the_sla_is_an_answer_not_an_error(api):
    body = LLAMA | {"traffic": {"input_tokens": 8000, "output_tokens": 10, "request_rate": 500.0}}
    r = api.post("/v1/serve", json=body)
    assert r.status_code == 200
    assert r.json()["ttft_s"] is None and any("saturated" in w for w in r.json()["warnings"])


def test_cli_serve_plan():
    out = subprocess.run(
        [sys.executable, "-m", "app.cli", "serve-plan", str(ROOT / "examples/serve-deepseek-v3-disagg.json")],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "KV transfer 141 MB per request" in out.stdout and "GPUs 96" in out.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "app.cli", "serve-plan", "-"], input=json.dumps(LLAMA | {"engine": "tgi"}),
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert bad.returncode != 0 and "engine" in bad.stderr
    launch = subprocess.run(
        [sys.executable, "-m", "app.cli", "serve-plan", str(ROOT / "examples/serve-llama3-70b.json"), "--format",
         "launch", "--model-path", "$(touch PWNED)"],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert launch.returncode == 0, launch.stderr
    assert launch.stdout.count("vllm serve '$(touch PWNED)' --tensor-parallel-size 8") == 2


def test_serve_search_over_http_round_trips_its_winner(api):
    body = {
        "model": {"preset": "llama3-70b"},
        "cluster": {"preset": "dgx-h100", "num_nodes": 2},
        "traffic": {"input_tokens": 2000, "output_tokens": 200, "concurrency": 128},
        "engines": ["vllm", "sglang"],
        "sla": {"ttft_s": 3.0, "tpot_s": 0.06},
        "top_k": 3,
    }
    r = api.post("/v1/serve/search", json=body)
    assert r.status_code == 200, r.text
    d = r.json()
    assert 1 <= len(d["results"]) <= 3 and d["pareto"] and d["candidates"] >= d["evaluated"] // 3
    best = d["results"][0]
    assert best["meets_sla"] and best["answer"]["tpot_s"] <= 0.06
    again = api.post("/v1/serve", json=best["request"]).json()
    assert again["throughput"] == best["answer"]["throughput"]


def test_serve_search_over_its_limit_is_refused_up_front():
    body = {
        "model": {"preset": "llama3-8b"},
        "cluster": {"preset": "dgx-h100", "num_nodes": 8},
        "traffic": {"input_tokens": 100, "output_tokens": 100, "concurrency": 8},
    }
    from app.settings import Settings

    from .conftest import Api

    tight = Api(Settings(max_serve_candidates=10))
    try:
        r = tight.post("/v1/serve/search", json=body)
    finally:
        tight.close()
    assert r.status_code == 422
    assert "COMMPLAN_MAX_SERVE_CANDIDATES" in r.json()["detail"][0]["msg"]


def test_plan_with_deepep_low_latency_over_http(api):
    body = {
        "model": {"preset": "deepseek-v3"},
        "workload": {"kind": "inference", "phase": "decode", "batch_size": 2048, "context_length": 4096,
                     "moe_dispatch_dtype": "fp8"},
        "parallel": {"tp": 1, "dp": 16, "ep": 16, "ep_dispatch": "deepep_ll"},
        "cluster": {"preset": "hgx-h800", "num_nodes": 2},
    }  # fmt: skip
    r = api.post("/v1/plan", json=body)
    assert r.status_code == 200, r.text
    ep = {c["name"]: c for c in r.json()["calls"] if c["parallelism"] == "ep"}
    assert ep["ep.dispatch.ll"]["message_bytes"] == 7_569_408
    assert 100e-6 < ep["ep.dispatch.ll"]["time_s"] < 136e-6  # DeepEP's table: 118 us at EP 16
    training = body | {"workload": {"kind": "training", "micro_batch_size": 1, "global_batch_size": 16}}
    bad = api.post("/v1/plan", json=training)
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"][-1] == "ep_dispatch"


ROUTERS = {  # what each engine's disaggregated router runs with the hosts left at their default
    "trtllm": ["trtllm-serve", "disaggregated", "-c", "disagg_config.yaml"],
    "vllm": ["python3", "toy_proxy_server.py", "--host", "0.0.0.0", "--port", "8000", "--prefiller-hosts", "localhost",
             "--prefiller-ports", "8001", "--decoder-hosts", "localhost", "--decoder-ports", "8002"],
    "sglang": ["python3", "-m", "sglang_router.launch_router", "--pd-disaggregation", "--prefill",
               "http://localhost:8001", "--decode", "http://localhost:8002", "--host", "0.0.0.0", "--port", "8000"],
}  # fmt: skip
HOSTILE = ["$(touch PWNED)", "x; touch PWNED #", "`touch PWNED`", "a'b\"c", "--tp-size 99", "x && touch PWNED"]


@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
def test_launch_export_runs_only_the_launcher(api, tmp_path, engine):
    """Every argument is quoted: the script, run with dummy launchers first on PATH, starts exactly the engine
    with the model path as one argument, whatever it holds, and nothing else."""
    body = json.loads(json.dumps(DSV3)) | {"engine": engine}
    for pool in body["deployment"]["pools"]:
        pool["ep_dispatch"] = "deepep_ll" if engine != "vllm" else "alltoall"
    body["options"]["mtp"] = {"draft_tokens": 1, "tokens_per_step": 1.8}
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "argv.log"
    for name in ("vllm", "python3", "trtllm-serve", "mpirun", "srun"):
        dummy = bin_dir / name
        # each run writes its own file: the script starts the workers in the background, side by side
        dummy.write_text(f'#!/bin/sh\nprintf "%s\\0" "{name}" "$@" > "{log}.$$"\n')
        dummy.chmod(0o755)
    for path in HOSTILE:
        r = api.post("/v1/serve/export", params={"model_path": path}, json=body)
        assert r.status_code == 200, r.text
        assert r.headers["content-type"].startswith("text/x-shellscript")
        script = tmp_path / "serve.sh"
        script.write_text(r.text)
        assert subprocess.run(["sh", "-n", str(script)]).returncode == 0
        for old in tmp_path.glob("argv.log.*"):
            old.unlink()
        env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "NODE_RANK": "0", "MASTER_ADDR": "10.0.0.1", "DP_START_RANK": "0"}
        env |= {"HOSTFILE_PREFILL_0": "p.hosts", "HOSTFILE_DECODE_0": "d.hosts"}  # TensorRT-LLM's MPI workers
        done = subprocess.run(["sh", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr
        assert not (tmp_path / "PWNED").exists()
        runs = [f.read_text().split("\0")[:-1] for f in tmp_path.glob("argv.log.*")]
        # the router between the two, no model path in it: the hosts default to localhost, the servers' ports
        # are 8001 (prefill) and 8002 (decode)
        router = [argv for argv in runs if path not in argv]
        assert router == [ROUTERS[engine]]
        runs.remove(router[0])
        assert len(runs) == 2  # one prefill worker, one decode worker
        for argv in runs:
            assert path in argv  # the model path arrives whole, as one argument
            launcher = {
                "vllm": ["vllm", "serve"],
                "sglang": ["python3", "-m", "sglang.launch_server"],
                # both workers span nodes: one MPI job each (no Slurm here: mpirun)
                "trtllm": ["mpirun", "-np", argv[2], "--map-by", "ppr:8:node", "--hostfile", argv[6]],
            }[engine]
            assert argv[: len(launcher)] == launcher
            if engine == "trtllm":
                assert argv[len(launcher) : len(launcher) + 3] == ["trtllm-llmapi-launch", "trtllm-serve", path]
    bad = api.post("/v1/serve/export", params={"model_path": "x\ntouch PWNED"}, json=body)
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["query", "model_path"]


def test_vllm_multi_node_workers_start_headless_beside_their_head(api, tmp_path):
    """docs.vllm.ai serving/data_parallel_deployment: every node of a multi-node DP worker but the head runs
    `vllm serve ... --headless` with its --data-parallel-start-rank. The script switches the flag on where HEADLESS
    is set and not empty, and never passes the variable's value."""
    body = json.loads(json.dumps(DSV3)) | {"engine": "vllm"}
    text = api.post("/v1/serve/export", params={"model_path": "m"}, json=body).text
    decode = [line for line in text.splitlines() if line.startswith("vllm") and "DP_START_RANK" in line]
    assert decode and all(line.endswith("${HEADLESS:+--headless} &") for line in decode)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "vllm").write_text(f'#!/bin/sh\nprintf "%s\\0" "$@" > "{tmp_path}/argv.$$"\n')
    (bin_dir / "vllm").chmod(0o755)
    script = tmp_path / "serve.sh"
    script.write_text(text)
    for headless in ("", "1", "--headless; touch PWNED"):
        for old in tmp_path.glob("argv.*"):
            old.unlink()
        env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "MASTER_ADDR": "10.0.0.1", "DP_START_RANK": "8"}
        env |= {"HEADLESS": headless} if headless else {}
        done = subprocess.run(["sh", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr
        runs = [f.read_text().split("\0")[:-1] for f in tmp_path.glob("argv.*")]
        multi = [argv for argv in runs if "--data-parallel-start-rank" in argv]
        assert multi and all(("--headless" in argv) == bool(headless) for argv in multi)
        assert all(argv.count("--headless") <= 1 and "PWNED" not in " ".join(argv) for argv in runs)
        assert not (tmp_path / "PWNED").exists()


def test_trtllm_multi_node_workers_and_disaggregated_router(api, tmp_path):
    """TensorRT-LLM (examples/disaggregated/README.md and examples/llm-api/llm_mgmn_trtllm_serve.sh at
    c3c3d76e28c5): a worker over several nodes is one MPI job of trtllm-llmapi-launch, srun inside Slurm and
    mpirun over the worker's hostfile outside it; a disaggregated deployment's servers carry the cache transceiver's
    backend, each its own port, and trtllm-serve disaggregated routes between them by the hosts given."""
    import yaml

    body = json.loads(json.dumps(DSV3)) | {"engine": "trtllm"}
    body["deployment"]["pools"][0] |= {"workers": 2, "dp": 16, "ep": 16}  # 2 x 16 GPUs prefill, 64 decode
    text = api.post("/v1/serve/export", params={"model_path": "m"}, json=body).text
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("srun", "mpirun", "trtllm-serve"):
        (bin_dir / name).write_text(f'#!/bin/sh\nprintf "%s\\0" "{name}" "$@" > "{tmp_path}/argv.$$"\n')
        (bin_dir / name).chmod(0o755)
    script = tmp_path / "serve.sh"
    script.write_text(text)
    assert subprocess.run(["sh", "-n", str(script)]).returncode == 0
    hostfiles = {"HOSTFILE_PREFILL_0": "p0", "HOSTFILE_PREFILL_1": "p1", "HOSTFILE_DECODE_0": "d0"}
    hosts = {"CTX_HOST_0": "node-a", "CTX_HOST_1": "10.0.0.3", "GEN_HOST_0": "node-c.cluster"}
    for slurm in ("", "4242"):
        for old in tmp_path.glob("argv.*"):
            old.unlink()
        env = {"PATH": f"{bin_dir}:/usr/bin:/bin"} | hostfiles | hosts | ({"SLURM_JOB_ID": slurm} if slurm else {})
        done = subprocess.run(["sh", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr
        runs = sorted(f.read_text().split("\0")[:-1] for f in tmp_path.glob("argv.*"))
        workers = [argv for argv in runs if "trtllm-llmapi-launch" in argv]
        if slurm:
            assert sorted(argv[:5] for argv in workers) == [["srun", "-N", n, "--ntasks-per-node=8", "--mpi=pmix"]
                                                            for n in ("2", "2", "8")]  # fmt: skip
        else:
            assert sorted((argv[:3], argv[6]) for argv in workers) == [
                (["mpirun", "-np", "16"], "p0"), (["mpirun", "-np", "16"], "p1"), (["mpirun", "-np", "64"], "d0")
            ]  # fmt: skip
        ports = sorted(argv[argv.index("--port") + 1] for argv in workers)
        assert ports == ["8001", "8002", "8003"]
        assert ["trtllm-serve", "disaggregated", "-c", "disagg_config.yaml"] in runs
    config = yaml.safe_load((tmp_path / "disagg_config.yaml").read_text())
    assert config["context_servers"] == {"num_instances": 2, "urls": ["node-a:8001", "10.0.0.3:8002"]}
    assert config["generation_servers"] == {"num_instances": 1, "urls": ["node-c.cluster:8003"]}
    prefill = yaml.safe_load((tmp_path / "extra-llm-api-prefill.yml").read_text())
    decode = yaml.safe_load((tmp_path / "extra-llm-api-decode.yml").read_text())
    assert prefill["cache_transceiver_config"] == decode["cache_transceiver_config"] == {"backend": "DEFAULT"}
    assert prefill["disable_overlap_scheduler"] is True and "disable_overlap_scheduler" not in decode
    # a host that is not a host name stops the script before anything starts or the config is written
    for bad in ("a b", "$(touch PWNED)", "x;touch PWNED", "h\nport: 1"):
        for old in [*tmp_path.glob("argv.*"), tmp_path / "disagg_config.yaml"]:
            old.unlink(missing_ok=True)
        env = {"PATH": f"{bin_dir}:/usr/bin:/bin"} | hostfiles | hosts | {"GEN_HOST_0": bad}
        done = subprocess.run(["sh", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30)
        assert done.returncode == 2 and "GEN_HOST_0 is not a host name" in done.stderr
        assert not list(tmp_path.glob("argv.*")) and not (tmp_path / "disagg_config.yaml").exists()
        assert not (tmp_path / "PWNED").exists()
    # an aggregated TensorRT-LLM deployment has no router and no transceiver
    agg = api.post("/v1/serve/export", params={"model_path": "m"}, json=LLAMA | {"engine": "trtllm"}).text
    assert "disaggregated" not in agg and "cache_transceiver_config" not in agg and "--port" not in agg


def test_launch_export_flags_by_engine(api):
    body = json.loads(json.dumps(DSV3)) | {"engine": "sglang"}
    for pool in body["deployment"]["pools"]:
        pool["ep_dispatch"] = "deepep"
    text = api.post("/v1/serve/export", params={"model_path": "deepseek-ai/DeepSeek-V3"}, json=body).text
    prefill, decode = [line for line in text.splitlines() if line.startswith("python3 -m sglang.launch_server")]
    # DP attention: --tp-size is the worker's GPUs, --dp-size its attention ranks (server_args.py)
    assert "--tp-size 32 --dp-size 32 --enable-dp-attention" in prefill and "--ep-size 32" in prefill
    assert "--moe-a2a-backend deepep --deepep-mode auto" in decode and "--disaggregation-mode decode" in decode
    assert '--node-rank "${NODE_RANK}"' in decode  # a 64-GPU worker spans 8 nodes


def test_engine_exchanges_and_options_over_http(api):
    """The engines' own MoE exchanges, two-batch overlap and EPLB's redundant experts, by field, over HTTP."""
    body = json.loads(json.dumps(DSV3)) | {"engine": "vllm"}
    r = api.post("/v1/serve", json=body)
    assert r.status_code == 200, r.text
    decode = {c["name"]: c for c in r.json()["pools"][1]["calls"] if c["parallelism"] == "ep"}
    assert set(decode) == {"ep.agrs.gather", "ep.agrs.combine"}  # vLLM's default: hidden + router logits
    tokens = decode["ep.agrs.combine"]["message_bytes"] // (7168 * 2)
    assert decode["ep.agrs.gather"]["message_bytes"] == tokens * (7168 + 256) * 2
    # vLLM's per-step DP metadata all-reduce (dp_utils.py _run_ar): 4 int32 per DP rank, prefill DP32, decode DP64
    syncs = [{c["name"]: c for c in p["calls"]}["dp.step_sync"] for p in r.json()["pools"]]
    assert [c["message_bytes"] for c in syncs] == [4 * 4 * 32, 4 * 4 * 64]
    assert all(c["op"] == "allreduce" and c["calls_per_iteration"] == 1 and c["time_s"] > 0 for c in syncs)
    body["deployment"]["pools"][1]["ep_dispatch"] = "deepep_ll"
    plain = api.post("/v1/serve", json=body).json()
    body["options"] |= {"two_batch_overlap": True, "redundant_experts": 64}
    r = api.post("/v1/serve", json=body)
    assert r.status_code == 200, r.text
    # vLLM splits a step only from dbo_prefill_token_threshold 512 / dbo_decode_token_threshold 32 tokens per rank
    # (ubatch_utils.py check_ubatch_thresholds): the prefill pass (4 prompts of 2,000 tokens per rank) runs its
    # exchanges once per half; the decode step (under 32 sequences per rank at this load) is not split
    pools = r.json()["pools"]
    assert pools[1]["batch"] < 32 * 64
    ll = {c["name"]: c for c in pools[1]["calls"]}["ep.dispatch.ll"]
    before = {c["name"]: c for c in plain["pools"][1]["calls"]}["ep.dispatch.ll"]
    assert ll["calls_per_iteration"] == before["calls_per_iteration"]
    gather = {c["name"]: c for c in pools[0]["calls"]}["ep.agrs.gather"]
    before = {c["name"]: c for c in plain["pools"][0]["calls"]}["ep.agrs.gather"]
    assert gather["calls_per_iteration"] == 2 * before["calls_per_iteration"]
    # each half gathers 32 ranks x 2 prompts x 2,000 tokens of hidden 7168 and 256 + 64 router logits, bf16
    assert gather["message_bytes"] == 32 * 2 * 2000 * (7168 + 320) * 2
    script = api.post("/v1/serve/export", json=body).text
    assert "--enable-dbo" in script and "num_redundant_experts" in script
    bad = api.post("/v1/serve", json=body | {"engine": "trtllm"})
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"][-1] == "two_batch_overlap"
    body["options"] |= {"two_batch_overlap": False, "redundant_experts": 10}
    bad = api.post("/v1/serve", json=body)
    assert bad.status_code == 422 and "266 expert slots do not divide" in bad.json()["detail"][0]["msg"]
    body["deployment"]["pools"][0]["ep_dispatch"] = "flex"
    assert api.post("/v1/serve", json=body).status_code == 422


@pytest.mark.parametrize(("dispatch", "names"), [
    ("agrs", {"ep.agrs.gather", "ep.agrs.combine"}),
    ("dp_gather", {"ep.dp_gather.max_len", "ep.dp_scatter.max_len"}),
    ("agrs_quant", {"ep.agrs.gather", "ep.agrs.combine"}),
    ("replicated", set()),
])  # fmt: skip
def test_plan_takes_the_engine_exchanges_over_http(api, dispatch, names):
    body = {
        "model": {"preset": "deepseek-v3"},
        "workload": {"kind": "inference", "phase": "decode", "batch_size": 256, "context_length": 1000},
        "parallel": {"tp": 1, "dp": 16, "ep": 16, "ep_dispatch": dispatch},
        "cluster": {"preset": "dgx-h100", "num_nodes": 2},
    }
    r = api.post("/v1/plan", json=body)
    assert r.status_code == 200, r.text
    assert {c["name"] for c in r.json()["calls"] if c["parallelism"] == "ep"} == names


def test_disaggregated_kv_transfer_is_visible_on_the_topology(api):
    """Issue 22, "done when": a disaggregated plan's KV transfer drawn on the topology over HTTP, as the page does
    it: POST /v1/topology with the answer's cluster, the transfer's devices (prefill worker 0's 32 GPUs and the
    decode worker it feeds, 64) and its links; the busiest link the transfer names is an edge of that view,
    coloured with the transfer's own utilisation."""
    d = api.post("/v1/serve", json=DSV3).json()
    kv = d["kv_transfer"]
    assert len(kv["devices"]) == 32 + 64 and kv["links"] and kv["bytes_per_request"] == 70_272 * 2000
    use = [{"id": link["id"], "utilisation": link["utilisation"]} for link in kv["links"]]
    r = api.post("/v1/topology", json={"cluster": d["cluster"], "devices": kv["devices"], "utilisation": use})
    assert r.status_code == 200, r.text
    view = r.json()
    busiest = kv["links"][0]
    (edge,) = [e for e in view["edges"] if busiest["id"] in e["links"]]
    assert edge["utilisation"] == pytest.approx(busiest["utilisation"])
    assert kv["bottleneck"] == busiest["label"]


def test_trtllm_fused_all_reduce_over_http(api):
    """TensorRT-LLM's block all-reduces over HTTP (planner/serving/fused_allreduce.py): Llama-3 70B TP8 at 16
    sequences per worker runs its one-shot kernel (the table's ONESHOT at 16 tokens of hidden 8192 on SM90):
    7 x M bytes out of each rank, and a faster step than vLLM's (its own 1-stage kernel, the same bytes, and the add
    and norm kernels)."""
    body = json.loads(json.dumps(LLAMA)) | {"engine": "trtllm"}
    body["traffic"]["concurrency"] = 16
    d = api.post("/v1/serve", json=body).json()
    rows = {c["name"]: c for c in d["pools"][0]["calls"]}
    for block in ("tp.attn.out_proj", "tp.mlp.down_proj"):
        row = rows[block]
        assert row["algorithm"] == "trtllm_oneshot" and "strategy ONESHOT" in row["source"]
        assert row["bytes_sent_per_rank"] == 7 * row["message_bytes"]
        assert row["message_bytes"] == d["pools"][0]["batch"] * 8192 * 2
    # the vocab-parallel embedding's all-reduce goes through the same op unfused (embedding.py, Fusion=NONE):
    # the one-shot kernel too at these 8 tokens per worker, not NCCL's ring
    emb = rows["tp.embedding"]
    assert emb["algorithm"] == "trtllm_oneshot" and "AllReduceFusionOp::NONE" in emb["source"]
    assert emb["bytes_sent_per_rank"] == 7 * emb["message_bytes"] and emb["calls_per_iteration"] == 1
    vllm = api.post("/v1/serve", json=body | {"engine": "vllm"}).json()
    assert vllm["pools"][0]["batch"] == d["pools"][0]["batch"]
    assert {c["algorithm"] for c in vllm["pools"][0]["calls"] if c["op"] == "allreduce"} == {"vllm_custom_oneshot"}
    assert d["pools"][0]["step_s"] < vllm["pools"][0]["step_s"]


def test_vllm_and_sglang_custom_all_reduce_over_http(api):
    """vLLM's and SGLang's own TP all-reduce over HTTP (planner/serving/fused_allreduce.py CustomAllReduce): Llama-3
    70B TP8, two workers: at 16 requests 8 sequences per worker, 131,072 bytes per all-reduce (under vLLM's 256 KiB
    cap with symmetric memory on H100): both engines' 1-stage custom kernel on every TP all-reduce, (tp - 1) x M out
    of each rank; at 256 requests, 128 sequences (2 MiB): vLLM's symmetric-memory multimem and SGLang's 2-stage
    custom kernel (under its 8 MiB cap)."""
    body = json.loads(json.dumps(LLAMA)) | {"engine": "vllm"}
    expected = {(16, "vllm"): "vllm_custom_oneshot", (16, "sglang"): "sglang_custom_oneshot",
                (256, "vllm"): "vllm_symm_mem_multimem", (256, "sglang"): "sglang_custom_twoshot"}  # fmt: skip
    for (concurrency, name), algorithm in expected.items():
        body["traffic"]["concurrency"] = concurrency
        r = api.post("/v1/serve", json=body | {"engine": name})
        assert r.status_code == 200, r.text
        pool = r.json()["pools"][0]
        rows = [c for c in pool["calls"] if c["op"] == "allreduce"]
        assert pool["batch"] == concurrency // 2 and len(rows) == 3  # the two block outputs and the embedding's
        for row in rows:
            assert row["message_bytes"] == pool["batch"] * 8192 * 2
            assert row["algorithm"] == algorithm, (concurrency, name, row)
            if algorithm.endswith("oneshot"):
                assert row["bytes_sent_per_rank"] == 7 * row["message_bytes"]
                assert "custom_all_reduce.py" in row["source"]


def test_plan_serving_always_runs_a_deployments_rules(api, monkeypatch):
    """plan_serving runs check_deployment itself (a ``checked`` flag that let a caller skip it saved ~8 us of a
    ~94 ms plan: review B3), so one /v1/serve runs the weight-format rule twice, in the cost guard and in the
    plan, and no caller plans unchecked inputs. The rule itself is recipes.check_recipe_gpu's (one home with
    training's workload.fp8_recipe): nvfp4 on H100 is a 422 at options.weight_dtype naming compute capability 10.0."""
    import planner.serving.deployment as deployment

    calls = []
    real = deployment.check_weight_format
    monkeypatch.setattr(deployment, "check_weight_format", lambda *a: calls.append(a) or real(*a))
    r = api.post("/v1/serve", json=LLAMA)
    assert r.status_code == 200, r.text
    assert len(calls) == 2  # the cost guard's worker_inputs and plan_serving
    r = api.post("/v1/serve", json={**LLAMA, "options": {**LLAMA.get("options", {}), "weight_dtype": "nvfp4"}})
    assert r.status_code == 422
    (err,) = r.json()["detail"]
    assert err["loc"][-2:] == ["options", "weight_dtype"] or ".".join(map(str, err["loc"])).endswith(
        "options.weight_dtype"
    ), err
    assert "nvfp4 weights need compute capability >= 10.0" in err["msg"] and err["msg"].endswith("use fp8 or bf16")


def test_serving_exports_are_one_registry(api):
    """The serving exports were listed in four places (launch.WRITERS, the route's _EXPORTS, ServeExportFormat,
    the CLI's choices: review); now planner/serving/launch.py EXPORTS, which the route (its query's values, media
    type and file name), the CLI's --format and the docs read."""
    from app.cli import SERVE_FORMATS
    from planner.serving.launch import EXPORTS

    spec = api.get("/openapi.json").json()["paths"]["/v1/serve/export"]["post"]
    (param,) = [p for p in spec["parameters"] if p["name"] == "format"]
    assert param["schema"]["enum"] == list(EXPORTS) and set(EXPORTS) == {"launch", "dynamo"}
    assert {f.media_type for f in EXPORTS.values()} <= set(spec["responses"]["200"]["content"])
    assert tuple(SERVE_FORMATS) == ("table", "json", *EXPORTS) and "dynamo" in SERVE_FORMATS
    body = {**LLAMA, "engine": "vllm"}
    for name, export in EXPORTS.items():
        r = api.post(f"/v1/serve/export?format={name}", json=body)
        assert r.status_code == 200, r.text
        assert r.headers["content-type"].startswith(export.media_type)
        assert r.headers["content-disposition"] == f'attachment; filename="serve-vllm{export.suffix}"'
    docs = (ROOT / "docs/serving.md").read_text() + (ROOT / "docs/CONTRACT.md").read_text()
    assert all(f"format={name}" in docs or f"--format {name}" in docs for name in EXPORTS)
