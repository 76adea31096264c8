"""Dump the JSON answers of a broad set of requests, to prove a change to the wire writer byte-identical.

Every cluster preset x several models x several layouts x option sets (contention full, schedule pricing,
a custom device map, no timeline, more links per call, pinned NCCL algorithm), the two 16k / 2k-GPU bench
plans, and batches (good items, a bad one, a repeated one) go through the app in-process (ASGI), as a
client posts them. Each line of the output is one request's status, body length and SHA-256; invalid
combinations are kept (their 422 bodies are answers too). Run it before and after a change and compare:

    python bench/dump_plans.py /tmp/before.jsonl
    python bench/dump_plans.py /tmp/after.jsonl
    cmp /tmp/before.jsonl /tmp/after.jsonl

``--limit N`` dumps the first N requests only (a quick look); ``--bodies DIR`` also writes every body.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from itertools import product
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.app.conftest import Api

MODELS = ("llama3-8b", "llama3-70b", "mixtral-8x7b", "deepseek-v3", "qwen3-30b-a3b")
LAYOUTS = (
    {"tp": 8, "pp": 4, "zero_stage": 1, "sequence_parallel": True},
    {"tp": 8, "zero_stage": 1, "sequence_parallel": True},
    {"framework": "torch", "zero_stage": 3},
    {"framework": "torch", "zero_stage": 0},
    {"tp": 4, "pp": 2, "cp": 2, "zero_stage": 1},
    {"ep": 8, "zero_stage": 1},
    {"tp": 2, "pp": 4, "virtual_pipeline_stages": 2, "pipeline_schedule": "interleaved"},
    {"framework": "deepspeed", "zero_stage": 2},
    {"framework": "deepspeed", "zero_stage": 3, "tp": 2},
    {"tp": 2, "pp": 2, "ep": 4, "expert_tp": 1, "zero_stage": 1},
    {"tp": 4, "cp": 2, "cp_comm": "a2a"},
    {"pp": 8, "pipeline_schedule": "gpipe"},
    {"framework": "torch", "zero_stage": 3, "hybrid_shard_size": 8},
)
WORKLOADS = (
    {"kind": "training", "micro_batch_size": 1, "global_batch_size": 256},
    {"preset": "pretrain-recompute"},
    {"kind": "inference", "phase": "prefill", "batch_size": 8, "context_length": 4096},
    {"kind": "inference", "phase": "decode", "batch_size": 64, "context_length": 8192},
)
OPTIONS = (
    {},
    {"contention": "full"},
    {"pricing": "schedule"},
    {"timeline": False, "links_per_call": 12},
    {"nccl_algo": "Ring", "overlap": {"overlap_grad_reduce": True, "overlap_param_gather": True}},
)
DEVICES = 64  # each cluster sized to about this many devices
CUSTOM_CLUSTERS = (  # integers in float fields, a GPU given by fields or by name, calibration, network overrides
    {"preset": "dgx-h100", "num_nodes": 2, "nic_bandwidth_GBps": 400, "intra": {"bandwidth_GBps": 900}},
    {"preset": "dgx-h100", "num_nodes": 2, "gpu": {"name": "x", "peak_tflops": {"bf16": 1000}, "hbm_bytes": 8 << 33,
                                                   "hbm_GBps": 3000, "sm": 90, "nvlink_links": 18}},
    {"preset": "dgx-h100", "num_nodes": 2,
     "calibration": {"efficiency": {"nvlink": 1}, "latency_scale": {"intra_node": 2}}},
    {"preset": "dgx-a100", "num_nodes": 4, "gpu": "h100-sxm5-80gb",
     "network": {"oversubscription": 2, "nodes_per_leaf": 1}},
    {"preset": "tpu-torus", "num_nodes": 16, "network": {"dims": [4, 4]}},
)  # fmt: skip


def cluster_block(name: str, preset: dict) -> dict:
    per_node = preset.get("devices_per_node") or 1
    return {"preset": name, "num_nodes": max(1, DEVICES // per_node)}


def devices_of(preset: dict, block: dict) -> int:
    return (preset.get("devices_per_node") or 1) * block["num_nodes"]


def requests(api: Api) -> list[tuple[str, dict]]:
    """(endpoint, body) in a fixed order."""
    clusters = api.get("/v1/presets/clusters").json()
    out = []
    for (name, preset), model, (li, layout), opts in product(
        sorted(clusters.items()), MODELS, enumerate(LAYOUTS), OPTIONS
    ):
        cluster = cluster_block(name, preset)
        body = {
            "model": {"preset": model},
            "workload": WORKLOADS[li % len(WORKLOADS)],
            "parallel": layout,
            "cluster": cluster,
            "options": opts,
        }
        out.append(("/v1/plan", body))
        if not opts and li % 3 == 0:  # a custom map: ranks reversed on the devices
            n = devices_of(preset, cluster)
            out.append(("/v1/plan", {**body, "options": {"device_map": list(range(n))[::-1]}}))
    for cluster, model in product(CUSTOM_CLUSTERS, MODELS[:3]):
        layout = {"tp": 4, "zero_stage": 1}
        body = {"model": {"preset": model}, "workload": WORKLOADS[0], "parallel": layout, "cluster": cluster}
        out.append(("/v1/plan", body))
    out += big_plans()
    good = [body for _, body in out[:40]]
    out.append(("/v1/plan/batch", {"requests": [*good[:6], {"model": {"preset": "nope"}}, good[0]]}))
    out.append(("/v1/plan/batch", {"requests": good[6:20]}))
    return out


def big_plans() -> list[tuple[str, dict]]:
    """The two plans bench/test_bench_plan.py times, and variants of them."""
    llama = {
        "model": {"preset": "llama3-405b"},
        "workload": {"kind": "training", "micro_batch_size": 1, "global_batch_size": 2048},
        "parallel": {"tp": 8, "pp": 16, "dp": 128, "zero_stage": 1, "sequence_parallel": True,
                     "first_stage_layers": 7, "last_stage_layers": 7},
        "cluster": {"preset": "dgx-h100", "num_nodes": 2048},
    }  # fmt: skip
    deepseek = {
        "model": {"preset": "deepseek-v3"},
        "workload": {"kind": "training", "micro_batch_size": 1, "global_batch_size": 15360},
        "parallel": {"pp": 16, "dp": 128, "ep": 64, "zero_stage": 1, "first_stage_layers": 3, "last_stage_layers": 2},
        "cluster": {"preset": "dgx-h100", "num_nodes": 256},
    }
    out = []
    for body in (llama, deepseek):
        out.append(("/v1/plan", body))
        out.append(("/v1/plan", {**body, "options": {"pricing": "schedule"}}))
        out.append(("/v1/plan", {**body, "options": {"links_per_call": 16, "timeline": False}}))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--bodies", type=Path, default=None)
    args = parser.parse_args()
    api = Api()
    try:
        todo = requests(api)[: args.limit]
        if args.bodies:
            args.bodies.mkdir(parents=True, exist_ok=True)
        with args.out.open("w") as f:
            for i, (url, body) in enumerate(todo):
                answer = api.post(url, json=body)
                digest = hashlib.sha256(answer.content).hexdigest()
                f.write(json.dumps({"i": i, "url": url, "status": answer.status_code, "bytes": len(answer.content),
                                    "sha256": digest}) + "\n")  # fmt: skip
                if args.bodies:
                    (args.bodies / f"{i:05d}.json").write_bytes(answer.content)
    finally:
        api.close()
    print(f"{len(todo)} requests -> {args.out}")


if __name__ == "__main__":
    main()
