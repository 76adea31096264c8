"""Serving speed targets (issue 22, "Fast"), timed in one process (imports excluded; an outside timer times the whole
process around it):

- one POST /v1/serve for DeepSeek-V3 on 96 H100 (examples/serve-deepseek-v3-disagg.json: SGLang prefill DP32 +
  decode DP64, DeepEP) <= 50 ms: the first answer in a fresh process (cold caches), the same request again (warm),
  and requests that differ in their traffic (new decode batches, the layouts' prefill plans cached);
- the SLA search over engines x modes x layouts for DeepSeek-V3 on 96 and 128 H100s <= 10 s.

Each figure is wall seconds and CPU seconds (time.process_time: user + sys of this process).

    PYTHONPATH=. python bench/serving_speed.py [serve|search]
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from fastapi.testclient import TestClient

ROOT = Path(__file__).resolve().parent.parent
SERVE = json.loads((ROOT / "examples" / "serve-deepseek-v3-disagg.json").read_text())


def timed(fn) -> tuple[float, float, object]:
    w, c = time.perf_counter(), time.process_time()
    out = fn()
    return time.perf_counter() - w, time.process_time() - c, out


def serve(client: TestClient) -> None:
    def post(body):
        r = client.post("/v1/serve", json=body)
        assert r.status_code == 200, r.text
        return r

    wall, cpu, _ = timed(lambda: post(SERVE))
    print(f"/v1/serve DeepSeek-V3 96 H100 cold: {wall * 1e3:.1f} ms wall, {cpu * 1e3:.1f} ms CPU")
    same = [timed(lambda: post(SERVE))[:2] for _ in range(10)]
    varied = []
    for c in range(1024, 4096, 256):  # new decode batches each time
        body = {**SERVE, "traffic": {**SERVE["traffic"], "concurrency": c}}
        varied.append(timed(lambda body=body: post(body))[:2])
    for name, runs in (("warm, same request", same), ("warm, new concurrency each", varied)):
        walls, cpus = sorted(r[0] for r in runs), sorted(r[1] for r in runs)
        mid = len(runs) // 2
        print(f"/v1/serve {name}: median {walls[mid] * 1e3:.1f} ms wall, {cpus[mid] * 1e3:.1f} ms CPU "
              f"(max {walls[-1] * 1e3:.1f} ms wall) over {len(runs)}")  # fmt: skip


def search(client: TestClient) -> None:
    for nodes in (12, 16):
        body = {
            "model": {"preset": "deepseek-v3"},
            "cluster": {"preset": "dgx-h100", "num_nodes": nodes},
            "traffic": {"input_tokens": 2000, "output_tokens": 100, "concurrency": 2048},
            "engines": ["vllm", "sglang", "trtllm"],
            "modes": ["aggregated", "disaggregated"],
            "sla": {"ttft_s": 5.0, "tpot_s": 0.1},
            "options": {"weight_dtype": "fp8"},
        }
        wall, cpu, r = timed(lambda body=body: client.post("/v1/serve/search", json=body))
        assert r.status_code == 200, r.text
        out = r.json()
        print(f"/v1/serve/search DeepSeek-V3 {nodes * 8} H100, 3 engines x 2 modes: {wall:.2f} s wall, {cpu:.2f} s "
              f"CPU; {out['candidates']} deployments, {out['evaluated']} plans, {len(out['results'])} meet the SLA; "
              f"{out['why']}")  # fmt: skip


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    from app.main import app

    which = sys.argv[1:] or ["serve", "search"]
    with TestClient(app) as client:
        for name in which:
            globals()[name](client)
