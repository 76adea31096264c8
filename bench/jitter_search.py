"""A search with packing, in-process, one worker (review r10a #2's /tmp/r10a_search.py and r10a_search405.py):
`PYTHONPATH=. python bench/jitter_search.py 70b|405b 0|1` prints wall and CPU seconds and the top 3 layouts' step
times (a 2,000-length corpus of 256-8,192 tokens, seed 0)."""

import os
import random
import sys
import time

os.cpu_count = lambda: 1
os.environ["COMMPLAN_DEADLINE_S"] = "600"

from fastapi.testclient import TestClient  # noqa: E402

from app.main import create_app  # noqa: E402
from app.settings import Settings  # noqa: E402
from planner import pipeline_jitter as pj  # noqa: E402

SEARCHES = {
    "70b": {"model": {"preset": "llama3-70b"}, "workload": {"kind": "training", "global_batch_size": 512,
            "seq_length": 8192}, "cluster": {"preset": "dgx-h100", "num_nodes": 8}},
    "405b": {"model": {"preset": "llama3-405b"}, "workload": {"kind": "training", "global_batch_size": 2048,
             "seq_length": 8192}, "cluster": {"preset": "dgx-h100", "num_nodes": 128}},
}  # fmt: skip

if __name__ == "__main__":
    client = TestClient(create_app(Settings.from_env()), raise_server_exceptions=False)
    which, pack = sys.argv[1], sys.argv[2] == "1"
    random.seed(0)
    lengths = [random.choice([256, 512, 1024, 2048, 4096, 8192]) for _ in range(2000)]
    body = SEARCHES[which] | {"constraints": {"framework": "megatron"}, "top_k": 3}
    if pack:
        body["workload"] = body["workload"] | {"document_lengths": lengths, "document_packing": "dp_balanced"}
    wall, cpu = time.perf_counter(), time.process_time()
    r = client.post("/v1/search", json=body)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    d = r.json()
    caches = {k: len(getattr(pj, k)) for k in ("_NODE_CACHE", "_GRAPHS") if hasattr(pj, k)}
    print(
        which,
        "pack",
        pack,
        r.status_code,
        f"wall {wall:.1f} s, CPU {cpu:.1f} s",
        caches,
        {k: d.get(k) for k in ("space_size", "evaluated", "feasible")} if r.status_code == 200 else r.text[:300],
    )
    for x in d.get("results", [])[:3]:
        p = x["parallel"]
        print(
            " ",
            {k: p[k] for k in ("tp", "pp", "dp", "cp", "virtual_pipeline_stages", "pipeline_schedule")},
            f"{x['step']['time_s']:.4f} s",
        )
