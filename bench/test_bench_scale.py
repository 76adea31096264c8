"""Plans at the device limit as the service answers them (issue 19): Llama 3 405B, TP8 PP16 with stages
7 + 14x8 + 7 (Llama 3 paper §3.3), ZeRO-1 and sequence parallelism, on 16,384, 65,536 and 131,072 H100
(dgx-h100 preset). Each round runs what a POST /v1/plan worker runs: the request's inputs, the work estimate
(planner/estimate.py), the plan and its JSON answer, with the price cache emptied (as bench/test_bench_plan.py
does); clusters, schedules and placements stay warm as in a running service. Targets: p50 <= 150 ms at
131,072 GPUs and <= 80 ms at 65,536; memory O(groups + links) (``test_memory_grows_with_the_cluster``).

    PYTHONPATH=. .venv/bin/python -m pytest bench/test_bench_scale.py --benchmark-only \
        --benchmark-timer time.process_time    # CPU time: the figure that holds on a shared machine
"""

import json
import tracemalloc

import pytest

import planner.plan as plan_module
from app.routers.plan import plan_of
from app.schemas.plan import PlanRequest
from app.serialize import plan_json
from app.settings import Settings

PP16 = {"tp": 8, "pp": 16, "zero_stage": 1, "sequence_parallel": True, "first_stage_layers": 7, "last_stage_layers": 7}


def request(num_nodes: int) -> PlanRequest:
    return PlanRequest.model_validate(
        {
            "model": {"preset": "llama3-405b"},
            "workload": {"micro_batch_size": 1, "global_batch_size": 16384},
            "parallel": PP16,
            "cluster": {"preset": "dgx-h100", "num_nodes": num_nodes},
        }
    )


def answer(body: PlanRequest, settings: Settings) -> bytes:
    plan_module._PRICES.clear()
    return plan_json(plan_of(body, settings))


@pytest.mark.parametrize("num_nodes", [2048, 8192, 16384], ids=["16384-gpus", "65536-gpus", "131072-gpus"])
def test_plan_at_scale(benchmark, num_nodes):
    settings, body = Settings.from_env(), request(num_nodes)
    answer(body, settings)  # the cluster, its placements and schedules, as a running service has them
    result = json.loads(benchmark(answer, body, settings))
    assert result["world_size"] == 8 * num_nodes and result["step"]["time_s"] > 0


def test_memory_grows_with_the_cluster():
    """Peak traced memory of one warm answer: groups and links, not their product (about 32 bytes per
    device at 131,072 GPUs, most of it the answer's rank lists)."""
    settings, peaks = Settings.from_env(), {}
    for nodes in (2048, 16384):
        body = request(nodes)
        answer(body, settings)
        tracemalloc.start()
        answer(body, settings)
        peaks[nodes] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert peaks[16384] < 10 * peaks[2048]  # 8x the devices: at most linear
    assert peaks[16384] < 64 << 20
