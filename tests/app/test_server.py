"""The real service: uvicorn on a loopback port, spoken to over TCP with httpx, and the CLI."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import free_port

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


SEARCH = {
    "model": {"preset": "llama3-70b"},
    "workload": {"global_batch_size": 1024},
    "cluster": {"preset": "dgx-h100", "num_nodes": 64},
    "constraints": {"framework": "megatron"},
}


def _service(**env) -> tuple[subprocess.Popen, str]:
    """`commplan serve` on a free loopback port with ``env`` added to this one's; (process, base URL)."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "serve", "--host", "127.0.0.1", "--port", str(port)],
                            cwd=ROOT, env=dict(os.environ, **env), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)  # fmt: skip
    return proc, f"http://127.0.0.1:{port}"


@pytest.mark.parametrize("mode", ["1", "2"], ids=["pool (the default)", "a fork per request"])
def test_search_workers_outlive_neither_their_search_nor_the_service(tmp_path, mode):
    """A search runs in a pool worker (or a process forked for it: app/runner.py), which forks the search's worker
    pool; the group is killed once the answer is in (a pool worker with children retires), so no worker is left
    behind (they used to stay, and a terminated service orphaned them, still holding its port: they ignore
    SIGTERM, uvicorn's handler copied into them). The pool's other workers, forked at start-up, stay."""
    if (os.cpu_count() or 1) < 2:
        pytest.skip("the search runs in-process on one core: no workers to leave")
    proc, base = _service(COMMPLAN_WORK_IN_PROCESS=mode)
    seen: set[int] = set()
    try:
        wait_for(base)
        pool = set(descendants_of(proc.pid))
        assert len(pool) == ((os.cpu_count() or 1) if mode == "1" else 0), pool  # COMMPLAN_WORKER_PROCESSES
        body = SEARCH
        answer: dict = {}
        search = threading.Thread(
            target=lambda: answer.update(httpx.post(f"{base}/v1/search", json=body, timeout=120).json())
        )
        search.start()
        while search.is_alive():
            seen.update(descendants_of(proc.pid))
            time.sleep(0.05)
        assert answer["workers"] >= 2  # the pool ran
        assert len(seen - pool) >= 2, seen  # the search's process (mode 2) and its workers
        time.sleep(0.5)
        ran = [pid for pid in pool if not alive(pid)]  # the pool worker the search ran in retired
        assert len(ran) == (1 if mode == "1" else 0), (pool, ran)
        assert not [pid for pid in seen - pool if alive(pid)], "search processes outlived their search"
    finally:
        proc.terminate()
        proc.wait(timeout=15)
    left = [pid for pid in seen if alive(pid)]
    for pid in left:  # so that a failure here leaves nothing behind either
        os.kill(pid, signal.SIGKILL)
    assert not left, f"search processes {left} outlived the service"
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{base}/healthz", timeout=2)  # the port is closed, not held by an orphan


def test_a_terminated_service_leaves_no_search_workers(tmp_path):
    """In thread mode the search forks its worker pool from the server; terminating the server used to orphan
    them (they ignore SIGTERM, uvicorn's handler copied into them), still holding the port."""
    if (os.cpu_count() or 1) < 2:
        pytest.skip("the search runs in-process on one core: no workers to leave")
    proc, base = _service(COMMPLAN_WORK_IN_PROCESS="0")
    try:
        wait_for(base)
        result = httpx.post(f"{base}/v1/search", json=SEARCH, timeout=120).json()
        assert result["workers"] >= 2  # the pool ran
        workers = children_of(proc.pid)
        assert len(workers) >= 2, workers
    finally:
        proc.terminate()
        proc.wait(timeout=15)
    left = [pid for pid in workers if alive(pid)]
    for pid in left:  # so that a failure here leaves nothing behind either
        os.kill(pid, signal.SIGKILL)
    assert not left, f"search workers {left} outlived the service"
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{base}/healthz", timeout=2)  # the port is closed, not held by an orphan


def descendants_of(pid: int) -> list[int]:
    out, todo = [], children_of(pid)
    while todo:
        child = todo.pop()
        out.append(child)
        todo += children_of(child)
    return out


def children_of(pid: int) -> list[int]:
    out = subprocess.run(["ps", "--ppid", str(pid), "-o", "pid="], capture_output=True, text=True).stdout
    return [int(x) for x in out.split()]


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] not in ("Z", "X")  # a zombie has exited: only its entry is left


def wait_for(base: str) -> None:
    """Until the server answers: httpx retries a refused connection with backoff (0.5 s, 1 s, 2 s, ...)."""
    with httpx.Client(transport=httpx.HTTPTransport(retries=7)) as client:
        assert client.get(f"{base}/healthz", timeout=5).status_code == 200
