"""A bounded loopback load test against the real server: 32 clients for ~20 s (COMMPLAN_LOAD_S) mixing good,
bad and over-budget requests, plus a prober on /healthz. Zero transport errors, every answer its expected
status, and /healthz prompt while the heavy requests run. Prints the latency percentiles
(docs/hardening.md quotes a run)."""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from app import runner
from app.runner import pss_bytes, rss_bytes
from planner import SpecError
from planner.deadline import Deadline, DeadlineExceeded
from tests.app.prober import percentiles
from tests.conftest import free_port

DURATION = float(os.environ.get("COMMPLAN_LOAD_S", "20"))
CLIENTS = 32
SMALL = {"model": {"preset": "llama3-8b"}, "parallel": {"tp": 8}, "cluster": {"preset": "dgx-h100"}}
LARGE = {
    "model": {"preset": "llama3-70b"},
    "workload": {"micro_batch_size": 1, "global_batch_size": 1024},
    "parallel": {"tp": 8, "pp": 4, "zero_stage": 1},
    "cluster": {"preset": "dgx-h100", "num_nodes": 256},
}
TORUS = LARGE | {"cluster": {"preset": "tpu-torus", "num_nodes": 131072}}
# (method, path, body or raw text, expected status)
MIX = [
    ("GET", "/healthz", None, 200),
    ("HEAD", "/healthz", None, 200),
    ("POST", "/v1/plan", SMALL, 200),
    ("POST", "/v1/plan", LARGE, 200),
    ("POST", "/v1/plan", SMALL | {"parallel": {"tp": True}}, 422),
    ("POST", "/v1/plan", '{"model": {"preset": "llama3-8b", "seq_length": NaN}, "cluster": {}}', 422),
    ("POST", "/v1/plan", '{"model": {"preset": "\\ud800"}, "cluster": {"preset": "dgx-h100"}}', 422),
    ("POST", "/v1/plan", TORUS, 422),
    ("POST", "/v1/plan/batch", {"requests": [SMALL, SMALL], "x": 1}, 422),
    ("POST", "/v1/plan/batch", {"requests": [SMALL, LARGE]}, 200),
    (
        "POST",
        "/v1/collectives/price",
        {
            "op": "allreduce",
            "message_bytes": 1 << 30,
            "cluster": {"preset": "dgx-h100", "num_nodes": 16},
            "group_size": 128,
        },
        200,
    ),
    (
        "POST",
        "/v1/collectives/price",
        {"op": "allreduce", "message_bytes": 8, "cluster": {"preset": "dgx-h100"}, "ranks": [0, 2**64]},
        422,
    ),
    ("GET", "/v1/presets/models", None, 200),
]


def _request(client: httpx.Client, method: str, path: str, body):
    if body is None:
        return client.request(method, path)
    if isinstance(body, str):
        return client.post(
            path, content=body.encode("utf-8", "surrogatepass"), headers={"content-type": "application/json"}
        )
    return client.post(path, json=body)


@pytest.mark.slow
def test_mixed_load_keeps_every_connection_and_healthz_prompt(server):
    latencies: list[float] = []
    health: list[float] = []
    failures: list[str] = []
    lock = threading.Lock()
    stop = time.monotonic() + DURATION

    def client(seed: int) -> None:
        rng = random.Random(seed)
        with httpx.Client(base_url=server, timeout=30) as http:  # keep-alive: one connection per client
            while time.monotonic() < stop:
                method, path, body, expected = rng.choice(MIX)
                start = time.monotonic()
                try:
                    response = _request(http, method, path, body)
                except httpx.TransportError as err:
                    with lock:
                        failures.append(f"{method} {path}: {type(err).__name__}")
                    continue
                took = time.monotonic() - start
                with lock:
                    latencies.append(took)
                    if response.status_code != expected:
                        failures.append(f"{method} {path}: {response.status_code} {response.text[:120]}")

    def prober() -> None:
        with httpx.Client(base_url=server, timeout=10) as http:
            while time.monotonic() < stop:
                start = time.monotonic()
                try:
                    ok = http.get("/healthz").status_code == 200
                except httpx.TransportError as err:
                    ok = False
                    failures.append(f"healthz: {type(err).__name__}")
                health.append(time.monotonic() - start)
                if not ok:
                    failures.append("healthz not 200")
                time.sleep(0.1)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
    threads.append(threading.Thread(target=prober))
    for t in threads:
        t.start()
    for t in threads:
        t.join(DURATION + 60)
    assert not failures, failures[:10]
    latencies.sort()
    health.sort()
    p50, p99 = latencies[len(latencies) // 2], latencies[int(len(latencies) * 0.99)]
    h99 = health[int(len(health) * 0.99)]
    print(
        f"\n{len(latencies)} requests from {CLIENTS} clients in {DURATION:g} s: p50 {p50 * 1e3:.0f} ms, "
        f"p99 {p99 * 1e3:.0f} ms, max {latencies[-1] * 1e3:.0f} ms; /healthz p99 {h99 * 1e3:.0f} ms, "
        f"max {health[-1] * 1e3:.0f} ms"
    )
    assert len(latencies) > CLIENTS
    assert h99 < 1.0, f"/healthz p99 {h99:.2f} s while the heavy requests ran"


# ---- /healthz off the CPU-bound path and memory given back (issue 26 items 3 and 4) ---------------------------
ROOT = Path(__file__).resolve().parents[2]
EFA_LOG = next((ROOT / "tests/reference/nccl_logs").glob("02_allreduce_2x8_*.txt")).read_text()
EFA_CLUSTER = {"preset": "dgx-a100", "nics_per_node": 4, "nic_bandwidth_GBps": 12.5, "nic_latency_s": 15e-6,
               "network": {"kind": "efa"}}  # fmt: skip
# the calibrate row limit (app/schemas/calibrate.MAX_ROWS = 1,000): 34 copies of a 29-row run, 986 rows
CALIBRATE_AT_LIMIT = {"cluster": EFA_CLUSTER, "logs": [{"text": EFA_LOG * 34, "nodes": 2}]}
HEAVY = LARGE  # Llama-3 70B on 2,048 H100s: ~0.5-1 s of pure Python each
HEAVY_PHASE_S = 2.0  # the heavy requests are sent again until this long has passed: >= 50 probes at 20 ms a pair
MEDIUM = LARGE | {"cluster": {"preset": "dgx-h100", "num_nodes": 64}}
SEARCH = {
    "model": {"preset": "llama3-8b", "seq_length": 2048, "num_layers": 8},
    "workload": {"kind": "training", "global_batch_size": 16},
    "cluster": {"preset": "dgx-h100", "num_nodes": 1},
    "constraints": {"framework": "megatron", "zero_stage": 1, "activation_recompute": "none"},
    "top_k": 3,
}


@contextmanager
def serving(**env):
    """`commplan serve` on a free loopback port with COMMPLAN_* ``env``; yields (base URL, pid)."""
    port = free_port()
    environ = dict(os.environ, **{f"COMMPLAN_{k.upper()}": str(v) for k, v in env.items()})
    cmd = [sys.executable, "-m", "app.cli", "serve", "--host", "127.0.0.1", "--port", str(port)]
    # a session of its own, as a service started by its own shell or supervisor has: where the kernel shares the
    # CPUs out by session (CONFIG_SCHED_AUTOGROUP), the test's process and its threads do not count against it
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=environ, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    base = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(transport=httpx.HTTPTransport(retries=7)) as client:
            assert client.get(f"{base}/healthz", timeout=5).status_code == 200
        yield base, proc.pid
    finally:
        proc.terminate()
        proc.wait(15)


def rss_tree(pid: int, size=pss_bytes) -> int:
    """Bytes of a process and every descendant (its pool workers, a request's process, a search's workers): their
    proportional set sizes summed (a page k of them share counted 1/k; their RSS summed would count the pages a
    worker shares with the server once per worker), or with ``size=rss_bytes`` their resident sizes."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        total += size(p)
        out = subprocess.run(["ps", "--ppid", str(p), "-o", "pid="], capture_output=True, text=True).stdout
        todo += [int(x) for x in out.split()]
    return total


PROBER = Path(__file__).with_name("prober.py")
# issue 26 item 4: /healthz p99 under 0.2 s with eight heavy plans and a calibrate at its limit in flight, on top of
# what the same machine costs a process that does nothing (tests/app/prober.py's control, probed in the same
# seconds: its p99 was 18-72 ms at load 9-17 on this 2-core machine shared by eight sessions; docs/hardening.md
# "Where /healthz's late answers came from")
P99_LIMIT_S = 0.2


@contextmanager
def control_server():
    """tests/app/prober.py's control (a fixed 200 for every request) on a free port, in a session of its own."""
    port = free_port()
    cmd = [sys.executable, str(PROBER), "control", str(port)]
    proc = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(transport=httpx.HTTPTransport(retries=7)) as client:
            assert client.get(f"{base}/healthz", timeout=5).status_code == 200
        yield base
    finally:
        proc.kill()
        proc.wait(15)


@contextmanager
def probing(*urls: str):
    """A prober process (tests/app/prober.py) on each URL's /healthz in turn every 20 ms, started and probing
    before the body of the ``with`` runs; yields a dict that holds ``{url: [probe, ...]}`` once it has ended."""
    tmp = Path(tempfile.mkdtemp(prefix="commplan-probe-"))
    out, stop = tmp / "probes.json", tmp / "stop"
    cmd = [sys.executable, str(PROBER), "probe", str(out), str(stop), *urls]
    proc = subprocess.Popen(cmd, start_new_session=True)
    probes: dict = {}
    try:
        started = time.monotonic()
        while not (tmp / "probes.json.ready").exists():
            assert proc.poll() is None and time.monotonic() - started < 60, "the prober did not start"
            time.sleep(0.02)
        yield probes
    finally:
        stop.touch()
        proc.wait(60)
        probes.update(json.loads(out.read_text()))
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.mark.parametrize("in_process", [1, 0], ids=["pool (the server's default)", "thread"])
def test_healthz_p99_under_eight_heavy_requests_and_a_calibrate_at_its_limit(in_process):
    """Eight heavy plans and a calibrate at its 1,000-row limit in flight at once; a prober process of its own
    on /healthz every 20 ms and on the control in the same seconds. `commplan serve` computes each request in a
    long-lived worker process (app/runner.py's pool, COMMPLAN_WORK_IN_PROCESS=1), at most
    COMMPLAN_WORKER_PROCESSES at once (app/threads.py's gate); with COMMPLAN_WORK_IN_PROCESS=0 in a thread of the
    server's process, at most COMMPLAN_COMPUTE_THREADS at once, at a 1 ms switch interval (app/settings.py)."""
    answers: list[int] = []
    with (
        serving(work_slots=9, deadline_s=300, queue_s=300, work_in_process=in_process) as (base, _),
        control_server() as control,
        probing(base, control) as probes,
    ):
        start = time.monotonic()

        def heavy(path: str, body: dict) -> None:
            # each job sends its request again until the heavy phase has lasted HEAVY_PHASE_S: the plans got faster
            # (round 10: the phase took 0.7 s, 17 probes, on the fresh-clone run), and the p99 needs >= 20 probes
            while True:
                answers.append(httpx.post(base + path, json=body, timeout=300).status_code)
                if time.monotonic() - start >= HEAVY_PHASE_S:
                    return

        jobs = [threading.Thread(target=heavy, args=("/v1/plan", HEAVY)) for _ in range(8)]
        jobs.append(threading.Thread(target=heavy, args=("/v1/calibrate", CALIBRATE_AT_LIMIT)))
        for job in jobs:
            job.start()
        for job in jobs:
            job.join()
    assert len(answers) >= 9 and set(answers) == {200}, answers
    assert {p["status"] for p in probes[base] + probes[control]} == {200}
    server = percentiles([p["took"] for p in probes[base]])
    floor = percentiles([p["took"] for p in probes[control]])
    line = (f"/healthz under 9 heavy requests: {server['n']} probes, p50 {server['p50'] * 1e3:.1f} ms, "
            f"p95 {server['p95'] * 1e3:.1f} ms, p99 {server['p99'] * 1e3:.1f} ms, max {server['max'] * 1e3:.1f} ms; "
            f"control p50 {floor['p50'] * 1e3:.1f} ms, p99 {floor['p99'] * 1e3:.1f} ms, "
            f"max {floor['max'] * 1e3:.1f} ms; load {os.getloadavg()[0]:.1f}")  # fmt: skip
    print("\n" + line)
    if in_process:
        assert server["n"] >= 20, line
        assert server["p99"] < P99_LIMIT_S + floor["p99"], line
    else:
        # Thread mode (no longer the server's default) does NOT meet the p99 in every run: its event loop shares the
        # GIL with the computing threads, and a thread the OS preempts while it holds the GIL holds the loop with it
        # (docs/hardening.md "Round six"). With the compute gate, the collector's start-up freeze and large bodies
        # off the loop it held in 9 runs of 10 at load 3-5 and 9 of 10 at load 10-14 (round five); here the median
        # is held to 0.2 s and the p95 to 1 s.
        assert server["p50"] < P99_LIMIT_S + floor["p50"], line
        assert server["p95"] < 1.0, line


# issue 26 item 4: a search with top_k 1,000 (803 layouts fit): a 21 MB answer, and full collections of 33-157 ms of
# CPU during the search and 246-279 ms during its encoding over the 803 plans it keeps (docs/hardening.md "Round six")
SEARCH_TOP_1000 = SEARCH | {
    "model": {"preset": "llama3-8b"},
    "workload": {"kind": "training", "global_batch_size": 256},
    "cluster": {"preset": "dgx-h100", "num_nodes": 4},
    "top_k": 1000,
}


@pytest.mark.slow
def test_healthz_p99_while_a_search_answers_its_top_1000():
    """`commplan serve` as it starts by default (the pool): a search with top_k 1,000 runs, collects and encodes its
    21 MB answer in a worker process, so /healthz keeps the same p99 bound as under the heavy set above."""
    with (
        serving(deadline_s=300, queue_s=300) as (base, _),
        control_server() as control,
        probing(base, control) as probes,
    ):
        answer = httpx.post(base + "/v1/search", json=SEARCH_TOP_1000, timeout=300)
    assert answer.status_code == 200 and len(answer.json()["results"]) > 500
    server = percentiles([p["took"] for p in probes[base]])
    floor = percentiles([p["took"] for p in probes[control]])
    line = (f"/healthz during a top_k 1,000 search ({len(answer.content) / 1e6:.1f} MB): {server['n']} probes, "
            f"p50 {server['p50'] * 1e3:.1f} ms, p99 {server['p99'] * 1e3:.1f} ms, max {server['max'] * 1e3:.1f} ms; "
            f"control p99 {floor['p99'] * 1e3:.1f} ms; load {os.getloadavg()[0]:.1f}")  # fmt: skip
    print("\n" + line)
    assert server["n"] >= 20, line
    assert server["p99"] < P99_LIMIT_S + floor["p99"], line


@pytest.mark.parametrize("gate", ["compute_threads", "worker_processes"], ids=["thread", "pool"])
def test_a_request_queues_at_the_compute_gate_over_http(gate):
    """COMMPLAN_COMPUTE_THREADS=1 (thread mode) or COMMPLAN_WORKER_PROCESSES=1 (the pool) on a real server: while a
    plan that routes a 1,000-router torus computes (until its 3 s deadline), a small plan waits at the gate, holding
    a work slot and computing nothing, and answers once the slow one is stopped; /healthz answers at once meanwhile.
    With two at once the small plan answers at once."""
    slow = LARGE | {"cluster": {"preset": "tpu-torus", "num_nodes": 1000}, "parallel": {"tp": 8, "pp": 5},
                    "workload": {"micro_batch_size": 1, "global_batch_size": 1000}}  # fmt: skip
    took = {}
    for threads in (1, 2):
        # its routing is charged 1.3e9 units (mend15d: a router network's node pairs): both budgets lifted
        settings = {gate: threads, "work_slots": 4, "deadline_s": 3, "max_router_pairs": 1 << 40, "max_work": 1 << 40,
                    "work_in_process": int(gate == "worker_processes")}  # fmt: skip
        with serving(**settings) as (base, _), httpx.Client(base_url=base, timeout=30) as http:
            blocker = threading.Thread(target=lambda: httpx.post(base + "/v1/plan", json=slow, timeout=30))
            blocker.start()
            time.sleep(0.5)
            start = time.monotonic()
            assert http.get("/healthz").status_code == 200
            assert time.monotonic() - start < 1
            start = time.monotonic()
            assert http.post("/v1/plan", json=SMALL).status_code == 200
            took[threads] = time.monotonic() - start
            blocker.join(30)
    assert 1.5 < took[1] < 10, took  # queued until the slow plan's stop at 3 s (sent 0.5 s after it)
    assert took[2] < 1.5, took


@pytest.mark.slow
@pytest.mark.parametrize("in_process", [1, 0], ids=["pool (the server's default)", "thread"])
def test_memory_returns_to_its_warm_baseline_after_200_heavy_requests(in_process):
    """200 mixed heavy requests, four at a time: the server and its workers end within 300 MiB of the size they
    had once warm (no cache grows without bound; a pool worker retires past COMMPLAN_WORKER_GROWTH_MIB; the
    full-mesh and large-group prices that once kept 602 MiB are closed forms now)."""
    mix = [
        ("/v1/plan", MEDIUM),
        ("/v1/plan/export/csv", MEDIUM),
        ("/v1/plan/explore", {"request": MEDIUM, "call": "dp.grads"}),
        ("/v1/plan/batch", {"requests": [SMALL, MEDIUM]}),
        ("/v1/calibrate", {"cluster": EFA_CLUSTER, "logs": [{"text": EFA_LOG, "nodes": 2}]}),
        ("/v1/search", SEARCH),
    ]
    with serving(work_slots=4, deadline_s=300, queue_s=300, work_in_process=in_process) as (base, pid):
        with httpx.Client(base_url=base, timeout=300) as http:
            for path, body in mix:  # warm
                assert http.post(path, json=body).status_code == 200, path
        baseline, baseline_rss = rss_tree(pid), rss_tree(pid, rss_bytes)
        statuses: list[int] = []
        peak = [baseline]
        order = [mix[i % len(mix)] for i in range(200)]

        def client(k: int) -> None:
            with httpx.Client(base_url=base, timeout=300) as http:
                for path, body in order[k::4]:
                    statuses.append(http.post(path, json=body).status_code)
                    peak[0] = max(peak[0], rss_tree(pid))

        threads = [threading.Thread(target=client, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        time.sleep(1)
        after, after_rss = rss_tree(pid), rss_tree(pid, rss_bytes)
    print(
        f"\nPSS of the server and its workers: warm {baseline / 2**20:.0f} MiB, peak {peak[0] / 2**20:.0f} MiB, "
        f"after 200 {after / 2**20:.0f} MiB (RSS summed: {baseline_rss / 2**20:.0f}, {after_rss / 2**20:.0f} MiB)"
    )
    assert statuses == [200] * 200 or sorted(set(statuses)) == [200], sorted(set(statuses))
    assert after - baseline < 300 * 2**20, (baseline, after)


# ---- the runner itself (app/runner.py) -----------------------------------------------------------------------


async def _never() -> bool:
    return False


def _run(work, seconds: float = 30.0):
    return asyncio.run(runner.run(work, Deadline(seconds), _never))


def test_the_runner_answers_and_raises_as_the_work_did():
    assert _run(lambda: (b"body", ["omitted"])) == (b"body", ["omitted"])

    def spec():
        raise SpecError("cluster.num_nodes", "too many: 9 > 8")

    with pytest.raises(SpecError) as err:
        _run(spec)
    assert (err.value.field, err.value.rule) == ("cluster.num_nodes", "too many: 9 > 8")

    class Local(Exception):  # defined here: cannot be pickled by reference
        pass

    def local():
        raise Local("no pickle")

    with pytest.raises(runner.ChildFailed, match="Local: no pickle"):
        _run(local)
    with pytest.raises(runner.ChildFailed, match="without an answer"):
        _run(lambda: os._exit(3))


def test_the_runner_kills_the_work_at_its_deadline_and_gives_its_memory_back():
    before = rss_bytes()

    def hog():
        block = bytearray(400 << 20)  # 400 MiB, touched
        for i in range(0, len(block), 4096):
            block[i] = 1
        time.sleep(60)

    start, killed = time.monotonic(), runner.STATS.killed
    with pytest.raises(DeadlineExceeded):
        asyncio.run(runner.run(hog, Deadline(1.0), _never))
    assert time.monotonic() - start < 10 and runner.STATS.killed == killed + 1
    assert rss_bytes() - before < 50 << 20  # the 400 MiB were the child's
