"""POST /v1/serve/export over HTTP for the disaggregated deployments as vLLM, SGLang and Dynamo run them:
vLLM's NixlConnector proxy (vllm tests/v1/kv_connector/nixl_integration/toy_proxy_server.py at 030ea52effcb),
SGLang's PD router (docs/advanced_features/pd_disaggregation.md at 08edc506b2da) and `format=dynamo`, a
DynamoGraphDeployment as ai-dynamo/dynamo's components/backends/{vllm,sglang}/deploy/disagg*.yaml (416ff06e7fea)
write it. The YAML is parsed back with PyYAML (in the test venv; the app writes it without it)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
LLAMA = json.loads((ROOT / "examples/serve-llama3-70b.json").read_text())
DSV3 = json.loads((ROOT / "examples/serve-deepseek-v3-disagg.json").read_text())
HOSTILE = ["$(touch PWNED)", 'a"b: c', "x\\y #z", "--tp-size 99", "ü/モデル", "{a: [b]}", "- x"]


def _disagg(engine: str) -> dict:
    """DeepSeek-V3, two prefill workers of DP16 (2 nodes each) and one decode worker of DP64 (8 nodes)."""
    body = json.loads(json.dumps(DSV3)) | {"engine": engine}
    body["deployment"]["pools"][0] |= {"workers": 2, "dp": 16, "ep": 16}
    return body


def _run(script: Path, bin_dir: Path, tmp_path: Path, env: dict) -> tuple[subprocess.CompletedProcess, list]:
    for old in tmp_path.glob("argv.*"):
        old.unlink()
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "MASTER_ADDR": "10.0.0.1", "DP_START_RANK": "0", "NODE_RANK": "0"} | env
    done = subprocess.run(["sh", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30)
    return done, sorted(f.read_text().split("\0")[:-1] for f in tmp_path.glob("argv.*"))


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_disaggregated_launch_starts_each_server_on_its_port_and_the_router_over_them(api, tmp_path, engine):
    r = api.post("/v1/serve/export", params={"model_path": "m"}, json=_disagg(engine))
    assert r.status_code == 200, r.text
    assert r.headers["content-disposition"] == f'attachment; filename="serve-{engine}.sh"'
    script = tmp_path / "serve.sh"
    script.write_text(r.text)
    assert subprocess.run(["sh", "-n", str(script)]).returncode == 0
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("vllm", "python3"):
        (bin_dir / name).write_text(f'#!/bin/sh\nprintf "%s\\0" "{name}" "$@" > "{tmp_path}/argv.$$"\n')
        (bin_dir / name).chmod(0o755)
    hosts = {"CTX_HOST_0": "node-a", "CTX_HOST_1": "10.0.0.3", "GEN_HOST_0": "node-c.cluster"}
    done, runs = _run(script, bin_dir, tmp_path, hosts)
    assert done.returncode == 0, done.stderr
    servers = [argv for argv in runs if "m" in argv]
    (router,) = [argv for argv in runs if "m" not in argv]
    assert len(servers) == 3  # two prefill workers, one decode worker (each run once here: one node's line)
    ports = {argv[argv.index("--port") + 1]: argv for argv in servers}
    assert sorted(ports) == ["8001", "8002", "8003"]
    if engine == "vllm":
        kv = {json.loads(argv[argv.index("--kv-transfer-config") + 1])["kv_connector"] for argv in servers}
        assert kv == {"NixlConnector"}
        assert router == ["python3", "toy_proxy_server.py", "--host", "0.0.0.0", "--port", "8000",
                          "--prefiller-hosts", "node-a", "10.0.0.3", "--prefiller-ports", "8001", "8002",
                          "--decoder-hosts", "node-c.cluster", "--decoder-ports", "8003"]  # fmt: skip
    else:
        modes = {p: argv[argv.index("--disaggregation-mode") + 1] for p, argv in ports.items()}
        assert modes == {"8001": "prefill", "8002": "prefill", "8003": "decode"}
        assert all(argv[argv.index("--disaggregation-transfer-backend") + 1] == "nixl" for argv in servers)
        assert all(argv[argv.index("--host") + 1] == "0.0.0.0" for argv in servers)
        assert router == ["python3", "-m", "sglang_router.launch_router", "--pd-disaggregation",
                          "--prefill", "http://node-a:8001", "--prefill", "http://10.0.0.3:8002",
                          "--decode", "http://node-c.cluster:8003", "--host", "0.0.0.0", "--port", "8000"]  # fmt: skip
    # a host that is not a host name stops the script before any server or the router starts
    for bad in ("a b", "$(touch PWNED)", "x;touch PWNED", "h:1 --port 9"):
        done, runs = _run(script, bin_dir, tmp_path, hosts | {"CTX_HOST_1": bad})
        assert done.returncode == 2 and "CTX_HOST_1 is not a host name" in done.stderr
        assert runs == [] and not (tmp_path / "PWNED").exists()
    # an aggregated deployment has no router and no transfer flags
    agg = api.post("/v1/serve/export", params={"model_path": "m"}, json=LLAMA | {"engine": engine}).text
    assert "toy_proxy_server" not in agg and "sglang_router" not in agg and "--port" not in agg
    assert "kv-transfer-config" not in agg and "disaggregation" not in agg


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_dynamo_manifest_has_the_deployment_workers_gpus_and_args(api, engine):
    body = _disagg(engine)
    for path in ["deepseek-ai/DeepSeek-V3", *HOSTILE]:
        r = api.post("/v1/serve/export", params={"model_path": path, "format": "dynamo"}, json=body)
        assert r.status_code == 200, r.text
        assert r.headers["content-type"].startswith("application/yaml")
        assert r.headers["content-disposition"] == f'attachment; filename="serve-{engine}-dynamo.yaml"'
        doc = yaml.safe_load(r.text)
        assert (doc["apiVersion"], doc["kind"]) == ("nvidia.com/v1alpha1", "DynamoGraphDeployment")
        assert doc["spec"]["backendFramework"] == engine
        services = doc["spec"]["services"]
        stem = {"vllm": "Vllm", "sglang": "SGLang"}[engine]
        assert list(services) == ["Frontend", f"{stem}PrefillWorker", f"{stem}DecodeWorker"]
        assert services["Frontend"]["componentType"] == "frontend" and services["Frontend"]["replicas"] == 1
        prefill, decode = services[f"{stem}PrefillWorker"], services[f"{stem}DecodeWorker"]
        # replicas = the pool's workers; GPUs per worker (tp x pp x dp: 16 and 64) = per node x nodes
        for svc, role, replicas, gpus in ((prefill, "prefill", 2, 16), (decode, "decode", 1, 64)):
            assert (svc["componentType"], svc["subComponentType"], svc["replicas"]) == ("worker", role, replicas)
            assert int(svc["resources"]["limits"]["gpu"]) * svc["multinode"]["nodeCount"] == gpus
            assert svc["resources"]["limits"]["gpu"] == "8"
            main = svc["extraPodSpec"]["mainContainer"]
            assert main["command"] == ["python3", "-m", f"dynamo.{engine}"]
            args = main["args"]
            assert args[:2] == (["--model", path] if engine == "vllm" else ["--model-path", path])  # path whole
            # no per-node flags: the operator starts each node of a multinode worker
            assert not {"--nnodes", "--node-rank", "--data-parallel-size-local", "--headless"} & set(args)
            if engine == "vllm":
                assert args[args.index("--data-parallel-size") + 1] == str(gpus)
                assert "--enable-expert-parallel" in args and "--kv-transfer-config" not in args
                assert ("--is-prefill-worker" in args) == (role == "prefill")
            else:
                assert args[args.index("--tp-size") + 1] == args[args.index("--dp-size") + 1] == str(gpus)
                assert args[args.index("--ep-size") + 1] == str(gpus)
                assert args[args.index("--disaggregation-mode") + 1] == role
                assert args[args.index("--disaggregation-transfer-backend") + 1] == "nixl"
                assert "--skip-tokenizer-init" in args


def test_dynamo_manifest_of_an_aggregated_deployment_and_refusals(api):
    r = api.post("/v1/serve/export", params={"format": "dynamo"}, json=LLAMA | {"engine": "vllm"})
    assert r.status_code == 200, r.text
    services = yaml.safe_load(r.text)["spec"]["services"]
    assert list(services) == ["Frontend", "VllmWorker"]
    worker = services["VllmWorker"]
    assert worker["replicas"] == 2 and worker["resources"]["limits"]["gpu"] == "8" and "multinode" not in worker
    assert "subComponentType" not in worker
    args = worker["extraPodSpec"]["mainContainer"]["args"]
    assert args[args.index("--tensor-parallel-size") + 1] == "8" and "--is-prefill-worker" not in args
    # TensorRT-LLM's Dynamo worker reads its engine options from a file the manifest does not carry: a 422
    bad = api.post("/v1/serve/export", params={"format": "dynamo"}, json=_disagg("trtllm"))
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["body", "engine"]
    assert "has no Dynamo worker" in bad.json()["detail"][0]["msg"]
    bad = api.post("/v1/serve/export", params={"format": "helm"}, json=LLAMA)
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["query", "format"]
    bad = api.post("/v1/serve/export", params={"format": "dynamo", "model_path": "x\ny: 1"}, json=LLAMA)
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["query", "model_path"]
