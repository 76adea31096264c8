"""Predicted vs published iteration times (tests/reference/step_times/published.json).

    PYTHONPATH=. python bench/step_validation.py        # prints the table of docs/step-time.md

Each case is planned as published (model, layout, workload, cluster preset) with the default options; the
prediction is the plan's ``step.time_s``. Where the source gives TFLOP/s per GPU instead of a time, the
measured time is derived with the planner's own model-FLOPs definition, so the comparison is on throughput.
"""

from __future__ import annotations

import json
from pathlib import Path

from collectives.topology import cluster_preset
from planner import ModelSpec, Options, Overlap, ParallelSpec, WorkloadSpec, build_plan
from planner.compute import model_flops_per_token
from planner.context import Context

DATA = Path(__file__).resolve().parent.parent / "tests" / "reference" / "step_times" / "published.json"


def load() -> dict:
    return json.loads(DATA.read_text())


def case_inputs(case: dict, data: dict):
    model = dict(data["models"][case["model"]])
    if "seq_length" in case:
        model["seq_length"] = case["seq_length"]
    spec = ModelSpec(**model, name=case["model"])
    par = ParallelSpec(**case["parallel"])
    work = WorkloadSpec(**case["workload"])
    cluster = cluster_preset(case["cluster"], case["nodes"])
    options = Options(overlap=Overlap(**case.get("overlap", {})), timeline=False)
    return spec, work, par, cluster, options


def measured_time(case: dict, data: dict) -> float:
    if "measured_time_s" in case:
        return case["measured_time_s"]
    spec, work, par, _, _ = case_inputs(case, data)
    tokens = work.global_batch_size * spec.seq_length
    flops = model_flops_per_token(Context(spec, work, par)) * tokens
    return flops / (par.world_size * case["measured_tflops_per_gpu"] * 1e12)


def predict(case: dict, data: dict) -> dict:
    plan = build_plan(*case_inputs(case, data))
    step = plan.step
    measured = measured_time(case, data)
    return {
        "name": case["name"],
        "predicted_s": step.time_s,
        "measured_s": measured,
        "error": step.time_s / measured - 1,
        "mfu": step.mfu,
        "compute_s": step.compute_s,
        "exposed_comm_s": step.exposed_comm_s,
        "bubble_s": step.bubble_s,
        "fits": plan.memory.fits,
        "source": case["source"],
    }


def main() -> None:
    data = load()
    rows = [predict(c, data) for c in data["cases"]]
    print("| case | measured (s) | predicted (s) | error | MFU | compute / exposed comm / bubble (s) | source |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['name']} | {r['measured_s']:.2f} | {r['predicted_s']:.2f} | {r['error']:+.1%} | {r['mfu']:.1%} | "
            f"{r['compute_s']:.2f} / {r['exposed_comm_s']:.2f} / {r['bubble_s']:.2f} | {r['source']} |"
        )
    errors = sorted(abs(r["error"]) for r in rows)
    print(f"\nmedian |error| {errors[len(errors) // 2]:.1%}, max {errors[-1]:.1%} over {len(rows)} runs")


if __name__ == "__main__":
    main()
