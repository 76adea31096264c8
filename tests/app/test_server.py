"""The real service: uvicorn on a loopback port, spoken to over TCP with httpx, and the CLI."""

import json
import subprocess
import sys
from pathlib import Path

import httpx

from .conftest import LLAMA70B

ROOT = Path(__file__).resolve().parents[2]


def test_plan_over_tcp(server):
    with httpx.Client(base_url=server, timeout=30) as client:
        r = client.post("/v1/plan", json=LLAMA70B)
        assert r.status_code == 200
        assert r.json()["world_size"] == 512
        assert client.get("/").status_code == 200
        bad = client.post("/v1/plan", content=b"not json", headers={"content-type": "application/json"})
        assert bad.status_code == 422


def test_cli_plan_formats(tmp_path):
    request = tmp_path / "plan.json"
    request.write_text(json.dumps(LLAMA70B))

    def run(*args):
        command = [sys.executable, "-m", "app.cli", "plan", str(request), *args]
        return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)

    table = run()
    assert table.returncode == 0 and "tp.attn.qkv" in table.stdout and "micro-batches" in table.stdout
    as_json = json.loads(run("--format", "json").stdout)
    assert as_json["world_size"] == 512
    csv_lines = run("--format", "csv").stdout.splitlines()
    assert csv_lines[0].startswith("name,op,phase") and len(csv_lines) == len(as_json["calls"]) + 1
    request.write_text(json.dumps({**LLAMA70B, "parallel": {"tp": 16, "pp": 2, "dp": 16}}))
    failed = run()
    assert failed.returncode == 2 and "num_kv_heads 8 is not divisible by tp 16" in failed.stderr
