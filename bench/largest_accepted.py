"""The largest plan the service accepts on each network, with its time and peak memory (docs/hardening.md).

For each network the cluster doubles until the request is refused up front (the router budget, or the work
estimate of planner/estimate.py against COMMPLAN_MAX_WORK at their defaults); the largest accepted one is
then planned in a fresh process, as the service answers it (estimate, plan, JSON), and timed cold (first
plan: cluster, schedules, placements built) and warm (price cache emptied), with its peak RSS over the
resident set after imports beside it.

    PYTHONPATH=. .venv/bin/python bench/largest_accepted.py
"""

from __future__ import annotations

import json
import subprocess
import sys

LLAMA8B_TP8 = {"tp": 8, "zero_stage": 1}
NETWORKS = {
    # name: (cluster block without num_nodes, devices per node, first num_nodes tried)
    "npu-mesh-8 (full mesh, fat-tree)": ({"preset": "npu-mesh-8"}, 8, 64),
    "tpu-torus": ({"preset": "tpu-torus"}, 1, 64),
    "dragonfly (DGX H100 nodes)": (
        {"preset": "dgx-h100", "network": {"topology": "dragonfly", "group_size": 8}},
        8,
        16,
    ),
    "hypercube (DGX H100 nodes)": ({"preset": "dgx-h100", "network": {"topology": "hypercube"}}, 8, 16),
}


def body(cluster: dict, nodes: int, per_node: int) -> dict:
    devices = nodes * per_node
    return {
        "model": {"preset": "llama3-8b"},
        "workload": {"micro_batch_size": 1, "global_batch_size": 2 * devices // 8},
        "parallel": LLAMA8B_TP8,
        "cluster": cluster | {"num_nodes": nodes},
    }


def accepted(request: dict) -> tuple[bool, str]:
    from app.routers.plan import bounded_inputs
    from app.schemas.plan import PlanRequest
    from app.settings import Settings
    from planner import SpecError

    settings = Settings.from_env()
    try:
        _, est = bounded_inputs(PlanRequest.model_validate(request), settings)
    except SpecError as err:
        return False, str(err)[:200]
    return True, f"{est.units:,} units"


MEASURE = """
import json, resource, sys, time
from app.routers.plan import plan_of
from app.schemas.plan import PlanRequest
from app.serialize import plan_json
from app.settings import Settings
import planner.plan as pm
request, settings = PlanRequest.model_validate(json.loads(sys.argv[1])), Settings.from_env()
with open("/proc/self/statm") as statm:
    base = int(statm.read().split()[1]) * resource.getpagesize() / 2**20
start = time.perf_counter(); cpu = time.process_time()
answer = plan_json(plan_of(request, settings))
cold, cold_cpu = time.perf_counter() - start, time.process_time() - cpu
pm._PRICES.clear()
start = time.perf_counter(); cpu = time.process_time()
plan_json(plan_of(request, settings))
warm, warm_cpu = time.perf_counter() - start, time.process_time() - cpu
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"cold_s": cold, "cold_cpu_s": cold_cpu, "warm_s": warm, "warm_cpu_s": warm_cpu,
                  "peak_mib": peak, "base_mib": base, "answer_mb": len(answer) / 1e6}))
"""


def measure(request: dict) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", MEASURE, json.dumps(request)], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout)


def main() -> None:
    for name, (cluster, per_node, nodes) in NETWORKS.items():
        best, why = None, ""
        while nodes <= (1 << 17) // per_node:
            ok, why = accepted(body(cluster, nodes, per_node))
            if not ok:
                break
            best, nodes = nodes, nodes * 2
        if best is None:
            print(f"{name}: nothing accepted ({why})")
            continue
        request = body(cluster, best, per_node)
        m, units = measure(request), accepted(request)[1]
        print(
            f"{name}: {best * per_node:,} devices ({best:,} nodes) accepted, {units}; "
            f"cold {m['cold_s']:.2f} s ({m['cold_cpu_s']:.2f} s CPU), warm {m['warm_s'] * 1e3:.0f} ms "
            f"({m['warm_cpu_s'] * 1e3:.0f} ms CPU), peak RSS {m['peak_mib']:.0f} MiB "
            f"({m['base_mib']:.0f} after imports), answer {m['answer_mb']:.2f} MB; "
            f"twice that: {why}",
            flush=True,
        )


if __name__ == "__main__":
    main()
