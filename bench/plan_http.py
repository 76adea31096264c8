"""CPU time of one POST /v1/plan as the service answers it (issue 19 target: the Llama 3 405B / 16,384-GPU
plan p50 <= 10 ms): an in-process httpx client on the app (ASGI transport, the worker thread, request
validation, the work estimate, the plan and its JSON answer), the price cache emptied before each request as
bench/test_bench_plan.py does; clusters, schedules and placements stay warm as in a running service, and so
does the context and ledger memo (planner/plan.py ``_context``: a repeated plan's model, workload and layout);
``--cold`` empties that memo too, as for a plan of a new model, workload or layout. NCCL's closed-form
answers (collectives/topology/library/pricer.py ``_TUNED``, keyed by the bytes) are emptied with the price
cache unless ``--warm-nccl``, as when a plan of the same group shapes and sizes was answered before. The app
is started as a server starts it (its lifespan: the warm-up requests, then ``gc.freeze`` of the start-up's
objects, app/main.py); ``--no-lifespan`` skips that, as this script did before issue 19's sixth round.

    PYTHONPATH=. .venv/bin/python bench/plan_http.py [--rounds 60] [--nodes 2048] [--batch 2048] [--cold]

Prints the median and minimum CPU milliseconds per request (time.process_time: every thread of the process)
and the wall milliseconds. Whole-process figures: ``/usr/bin/time -v python bench/plan_http.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import time

import httpx

import planner.plan as plan_module
from app.main import create_app
from app.settings import Settings
from collectives.topology.library import pricer as nccl_pricer

# Llama 3 paper §3.3: 126 layers over 16 stages, one layer fewer on the first and the last
PP16 = {"tp": 8, "pp": 16, "zero_stage": 1, "sequence_parallel": True, "first_stage_layers": 7, "last_stage_layers": 7}


def body(nodes: int, batch: int) -> dict:
    return {
        "model": {"preset": "llama3-405b"},
        "workload": {"micro_batch_size": 1, "global_batch_size": batch},
        "parallel": PP16,
        "cluster": {"preset": "dgx-h100", "num_nodes": nodes},
    }


async def measure(
    rounds: int, nodes: int, batch: int, cold: bool = False, lifespan: bool = True, warm_nccl: bool = False
) -> tuple[list[float], list[float]]:
    app = create_app(Settings.from_env())
    async with app.router.lifespan_context(app) if lifespan else contextlib.nullcontext():
        return await _requests(app, rounds, body(nodes, batch), cold, warm_nccl)


async def _requests(
    app, rounds: int, request: dict, cold: bool, warm_nccl: bool = False
) -> tuple[list[float], list[float]]:
    cpu, wall = [], []
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://commplan.test") as client:
        for i in range(rounds + 2):  # two warm-up requests: clusters, schedules and placements
            plan_module._PRICES.clear()
            if not warm_nccl:
                nccl_pricer._TUNED.clear()
            if cold:
                plan_module._CONTEXTS.clear()
            c0, w0 = time.process_time(), time.perf_counter()
            answer = await client.post("/v1/plan", json=request)
            c1, w1 = time.process_time(), time.perf_counter()
            assert answer.status_code == 200, answer.text[:300]
            if i >= 2:
                cpu.append(c1 - c0)
                wall.append(w1 - w0)
    return cpu, wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--nodes", type=int, default=2048, help="dgx-h100 nodes (8 GPUs each)")
    parser.add_argument("--batch", type=int, default=2048, help="global batch size")
    parser.add_argument("--cold", action="store_true", help="empty the context and ledger memo before each request")
    parser.add_argument(
        "--no-lifespan", action="store_true", help="skip the app's start-up (warm-up requests, gc.freeze) as before"
    )
    parser.add_argument(
        "--warm-nccl", action="store_true", help="keep NCCL's closed-form answers between requests (a repeated plan)"
    )
    args = parser.parse_args()
    cpu, wall = asyncio.run(
        measure(args.rounds, args.nodes, args.batch, args.cold, not args.no_lifespan, args.warm_nccl)
    )
    ms = [1e3 * x for x in cpu]
    cold = (" (cold set-up)" if args.cold else "") + (" (no start-up)" if args.no_lifespan else "")
    cold += " (NCCL answers kept)" if args.warm_nccl else ""
    print(
        f"{args.nodes * 8} GPUs, {args.rounds} requests{cold}: CPU p50 {statistics.median(ms):.2f} ms, "
        f"min {min(ms):.2f} ms; wall p50 {1e3 * statistics.median(wall):.2f} ms"
    )


if __name__ == "__main__":
    main()
