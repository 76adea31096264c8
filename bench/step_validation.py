"""Predicted vs published iteration times (tests/reference/step_times/published.json).

    PYTHONPATH=. python bench/step_validation.py        # prints the table of docs/step-time.md

Each case is planned as published (model, layout, workload, cluster preset) with the default options; the
prediction is the plan's ``step.time_s``. Where the source gives a rate instead of a time, the measured time is
derived with the source's own count: tokens/s per GPU (exact), hardware TFLOP/s per GPU under Narayanan et al.
2021 Eq. 3, or model TFLOP/s per GPU under the planner's model-FLOPs definition (the comparison is then on
throughput). Each case's ``split`` says whether the pre-kernel model's one GEMM efficiency was fitted on it ("fit")
or not ("held_out"). Since issue 20 no constant is fitted on a run: the kernel model's constants come from measured
kernel tables (bench/kernel_fit.py), so every run is held out and a leave-one-source-out table equals the per-source
table printed here. The medians are printed by split, dense and MoE, by source and by GPU, with the signed median
(bias). A case's model is its fields as published or a preset with the fields the run changes (``model_spec``); a
case may cut the cluster's node to ``gpus_per_node`` GPUs (a job of 8 or 64 GPUs inside one GB200 NVL72 NVLink
domain), and may give the GPU as the run's hardware had it (``gpu``: GPUSpec fields over the preset's GPU, and
``power_limit_w``, as a request's cluster.gpu block gives them: torchtitan's H100s of Meta's Grand Teton hosts, 96 GB
HBM2e at 2.4 TB/s under a 500 W limit).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from statistics import median

from collectives.topology import cluster_preset
from collectives.topology.gpu import with_power_limit
from planner import ModelSpec, Options, Overlap, ParallelSpec, WorkloadSpec, build_plan
from planner.compute import model_flops_per_token
from planner.context import Context
from planner.presets import model_preset

DATA = Path(__file__).resolve().parent.parent / "tests" / "reference" / "step_times" / "published.json"


def load() -> dict:
    return json.loads(DATA.read_text())


def model_spec(case: dict, data: dict) -> ModelSpec:
    """The case's model: its fields as published, or ``{"preset": name}`` (planner/presets.py) with the fields
    the run changes (``moe``: e.g. the routing a benchmark forces; others: ModelSpec's); ``seq_length`` as the case
    runs it."""
    model = dict(data["models"][case["model"]])
    if "preset" in model:
        spec = model_preset(model.pop("preset"))
        if "moe" in model:
            spec = replace(spec, moe=replace(spec.moe, **model.pop("moe")))
        spec = replace(spec, **model)  # what else the run changes (e.g. mtp_layers 0: trained without MTP)
    else:
        spec = ModelSpec(**model, name=case["model"])
    return replace(spec, seq_length=case["seq_length"]) if "seq_length" in case else spec


def _tuples(value):
    """JSON lists as the specs' tuples (recompute modules, a pipeline layout's stages)."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def case_inputs(case: dict, data: dict):
    spec = model_spec(case, data)
    par = ParallelSpec(**{k: _tuples(v) for k, v in case["parallel"].items()})
    work = WorkloadSpec(**{k: _tuples(v) for k, v in case["workload"].items()})
    cluster = cluster_preset(case["cluster"], case["nodes"])
    if "gpus_per_node" in case:  # a job on part of one NVLink domain (GB200 NVL72): the node cut to its GPUs
        n = case["gpus_per_node"]
        cluster = replace(cluster, devices_per_node=n, nics_per_node=min(cluster.nics_per_node, n))
    if "gpu" in case:  # the run's GPU as its source describes it (app/convert.py _gpu does the same for a request)
        fields = dict(case["gpu"])
        limit = fields.pop("power_limit_w", None)
        cluster = replace(cluster, gpu=with_power_limit(replace(cluster.gpu, **fields), limit))
    options = Options(overlap=Overlap(**case.get("overlap", {})), timeline=False)
    return spec, work, par, cluster, options


def measured_time(case: dict, data: dict) -> float:
    """The published iteration time, or the time implied by the published rate under the source's own count."""
    if "measured_time_s" in case:
        return case["measured_time_s"]
    spec, work, par, _, _ = case_inputs(case, data)
    tokens = work.global_batch_size * spec.seq_length
    if "measured_tokens_per_s_per_gpu" in case:
        return tokens / (par.world_size * case["measured_tokens_per_s_per_gpu"])
    count = FLOPS_COUNTS[case.get("flops_count", "model")]
    return count(spec, work, par) / (par.world_size * case["measured_tflops_per_gpu"] * 1e12)


def planner_model_flops(spec, work, par) -> float:
    """The planner's model FLOPs of one iteration (PaLM Appendix B, as the Llama 3 paper counts its MFU)."""
    return model_flops_per_token(Context(spec, work, par)) * work.global_batch_size * spec.seq_length


def narayanan2021_eq3(spec, work, par) -> float:
    """Narayanan et al. 2021 Eq. 3: FLOPs of one iteration with full activation recompute, as Megatron's
    2021 papers count them (GPT, 4h MLP): 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h))."""
    s, layers, h, v = spec.seq_length, spec.num_layers, spec.hidden_size, spec.vocab_size
    return 96.0 * work.global_batch_size * s * layers * h * h * (1 + s / (6 * h) + v / (16 * layers * h))


def megatron_2024(spec, work, par) -> float:
    """Megatron-LM f2e5db402c (July 2024) training.py num_floating_point_operations: 12·B·s·l·h²·((1 + g/a +
    s/h)·q/h + ffn/h·(3/2 if gated) + V_padded/(2·l·h)), q = heads·head_dim, g the query groups."""
    s, layers, h, a = spec.seq_length, spec.num_layers, spec.hidden_size, spec.num_attention_heads
    q_ratio = a * spec.head_size / h
    attention = (1 + spec.kv_heads / a + s / h) * q_ratio
    mlp = spec.ffn_hidden_size / h * (1.5 if spec.gated_mlp else 1)
    logit = spec.padded_vocab(par.tp) / (2 * layers * h)
    return 12.0 * work.global_batch_size * s * layers * h * h * (attention + mlp + logit)


FLOPS_COUNTS = {"model": planner_model_flops, "narayanan2021_eq3": narayanan2021_eq3, "megatron_2024": megatron_2024}


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
        "split": case["split"],
        "source": case["source"],
    }


def main() -> None:
    data = load()
    rows = [predict(c, data) for c in data["cases"]]
    print(
        "| case | split | measured (s) | predicted (s) | error | MFU | compute / exposed comm / bubble (s) | source |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['name']} | {r['split']} | {r['measured_s']:.2f} | {r['predicted_s']:.2f} | {r['error']:+.1%} | "
            f"{r['mfu']:.1%} | "
            f"{r['compute_s']:.2f} / {r['exposed_comm_s']:.2f} / {r['bubble_s']:.2f} | {r['source']} |"
        )
    print()
    print("| runs | count | median abs error | signed median | max abs error |")
    print("|---|---|---|---|---|")
    for label, group in summary_groups(rows, data):
        errors = [r["error"] for r in group]
        print(
            f"| {label} | {len(errors)} | {median(abs(e) for e in errors):.1%} | {median(errors):+.1%} | "
            f"{max(abs(e) for e in errors):.1%} |"
        )


def source_of(row: dict) -> str:
    """The publication a run comes from (the text before its first comma or table reference)."""
    return row["source"].split(" (")[0].split(" Table")[0].split(",")[0].split(" 24.07")[0].strip()


def summary_groups(rows: list[dict], data: dict) -> list[tuple[str, list[dict]]]:
    clusters = {c["name"]: c["cluster"] for c in data["cases"]}
    moe = {c["name"] for c in data["cases"] if model_spec(c, data).moe is not None}
    groups = [
        ("all", rows),
        ("split 'fit' (the pre-kernel model's fit runs)", [r for r in rows if r["split"] == "fit"]),
        ("split 'held_out'", [r for r in rows if r["split"] == "held_out"]),
        ("dense models", [r for r in rows if r["name"] not in moe]),
        ("MoE models", [r for r in rows if r["name"] in moe]),
    ]
    for cluster in sorted({clusters[r["name"]] for r in rows}):
        groups.append((f"on {cluster}", [r for r in rows if clusters[r["name"]] == cluster]))
    for source in sorted({source_of(r) for r in rows}):
        groups.append((f"source: {source}", [r for r in rows if source_of(r) == source]))
    return groups


if __name__ == "__main__":
    main()
