"""Exactness check for search speed-ups: the whole answer of several searches, to compare before and after.

    PYTHONPATH=. python bench/search_answers.py --out before.json          # on the old commit
    PYTHONPATH=. python bench/search_answers.py --out after.json           # on the new one
    PYTHONPATH=. python bench/search_answers.py --compare before.json after.json
    PYTHONPATH=. python bench/search_answers.py --compare before.json after.json --ignore bounded
    # against a main before speed11 (bounded_before_memory): also --ignore feasible --ignore memory
    #   --ignore bounded_before_memory

Each search runs in one process (chunks in order, so ``bounded`` is deterministic) and is written as
POST /v1/search answers it (app/serialize.py ``search_dict``: counts, pruning reasons and examples, and every
field of every result), less the wall-clock fields. ``--compare`` prints every difference and exits 1 if any.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from collectives.topology import cluster_preset
from planner import MODEL_PRESETS, WorkloadSpec
from planner.search import Constraints, Problem, search

# (label, model preset, workload, (cluster preset, nodes), constraints, top_k)
PROBLEMS = [
    (
        "gpt3-175b megatron tp4-8",
        "gpt3-175b",
        WorkloadSpec(global_batch_size=1536),
        ("dgx-a100", 128),
        {"framework": "megatron", "tp": [4, 8]},
        10,
    ),
    (
        "llama3-70b torch",
        "llama3-70b",
        WorkloadSpec(global_batch_size=1024),
        ("dgx-h100", 64),
        {"framework": "torch"},
        10,
    ),
    (
        "llama3-70b deepspeed zero3",
        "llama3-70b",
        WorkloadSpec(global_batch_size=1024),
        ("dgx-h100", 32),
        {"framework": "deepspeed", "zero_stage": 3},
        10,
    ),
    (
        "mixtral-8x7b megatron",
        "mixtral-8x7b",
        WorkloadSpec(global_batch_size=256),
        ("dgx-h100", 8),
        {"framework": "megatron"},
        10,
    ),
    (
        "deepseek-v3 megatron tp1-2",
        "deepseek-v3",
        WorkloadSpec(global_batch_size=1024),
        ("dgx-h100", 64),
        {"framework": "megatron", "tp": [1, 2], "zero_stage": [1]},
        5,
    ),
    ("llama3-8b one node", "llama3-8b", WorkloadSpec(global_batch_size=64), ("dgx-h100", 1), {}, 20),
    ("llama3-405b whole space", "llama3-405b", WorkloadSpec(global_batch_size=2048), ("dgx-h100", 2048), {}, 10),
    # issue 21's options: every schedule, uneven stages with virtual stages, recompute methods and layers
    (
        "llama3-70b schedules and recompute methods",
        "llama3-70b",
        WorkloadSpec(global_batch_size=1024),
        ("dgx-h100", 32),
        {
            "framework": "megatron",
            "tp": 8,
            "zero_stage": 1,
            "pipeline_schedule": ["1f1b", "interleaved", "zb-h1", "zbv", "dualpipe", "dualpipev"],
            "uneven_stages": True,
            "activation_recompute": ["selective", "full"],
            "recompute_method": ["uniform", "block"],
            "recompute_num_layers": [1, 2, 4],
        },
        10,
    ),
    (
        "mixtral-8x7b token dispatchers",
        "mixtral-8x7b",
        WorkloadSpec(global_batch_size=256),
        ("dgx-h100", 8),
        {
            "framework": "megatron",
            "tp": 1,
            "cp": 1,
            "pp": [1, 2, 4],
            "zero_stage": 1,
            "ep_dispatch": ["alltoall", "allgather", "deepep", "hybridep"],
        },
        10,
    ),
    # issue 21 (layouts3): selective module sets and explicit layout strings (80 layers over 8 virtual stages:
    # v 2 at pp 4, v 1 at pp 8)
    (
        "llama3-70b recompute modules and layout strings",
        "llama3-70b",
        WorkloadSpec(global_batch_size=1024),
        ("dgx-h100", 32),
        {
            "framework": "megatron",
            "tp": 8,
            "pp": [4, 8],
            "zero_stage": 1,
            "activation_recompute": ["selective", "full"],
            "recompute_modules": [["core_attn"], ["core_attn", "mlp"], ["layernorm", "mlp"]],
            "pipeline_layout": [
                "Et*9|t*10|t*10|t*10|t*10|t*10|t*10|t*11L",
                "Et*10|t*10|t*10|t*10|t*10|t*10|t*10|t*10L",
            ],
        },
        10,
    ),
    # torchtitan's selective checkpointing and Megatron's CPU offload (pp 1 only: pruned elsewhere by its rule)
    (
        "llama3-8b torch checkpointing and offload",
        "llama3-8b",
        WorkloadSpec(global_batch_size=64),
        ("dgx-h100", 1),
        {
            "framework": ["megatron", "torch"],
            "zero_stage": 1,
            "selective_ac_option": ["op", "2"],
            "cpu_offloading_num_layers": [0, 4],
        },
        20,
    ),
]
WALL_CLOCK = ("elapsed_s", "layouts_per_s", "workers")


def answers(only: str | None) -> dict:
    from app.serialize import search_dict  # the wire form: only app/ turns results into JSON

    out = {}
    for label, model, work, (preset, nodes), allowed, top_k in PROBLEMS:
        if only and only not in label:
            continue
        allowed = dict(allowed)
        uneven = allowed.pop("uneven_stages", False)
        constraints = Constraints.of(allowed, uneven_stages=uneven)
        problem = Problem(MODEL_PRESETS[model], work, cluster_preset(preset, nodes), constraints, top_k)
        start = time.perf_counter()
        body = search_dict(search(problem, workers=1))
        print(f"{label}: {time.perf_counter() - start:.1f} s, evaluated {body['evaluated']}", file=sys.stderr)
        out[label] = {k: v for k, v in body.items() if k not in WALL_CLOCK}
    return out


def differences(a, b, path: str = "") -> list[str]:
    """Every leaf where a and b differ (floats exactly: a speed-up must not move a single bit)."""
    if isinstance(a, dict) and isinstance(b, dict):
        keys = sorted(set(a) | set(b))
        return [d for k in keys for d in differences(a.get(k, "<absent>"), b.get(k, "<absent>"), f"{path}.{k}")]
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: {len(a)} items vs {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in differences(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: {a!r} vs {b!r}"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="write the answers here (JSON)")
    parser.add_argument("--only", help="run the problems whose label contains this")
    parser.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"))
    parser.add_argument(
        "--ignore",
        action="append",
        default=[],
        metavar="FIELD",
        help="a count to list but not fail on: 'bounded' counts the layouts a bound skipped, which a tighter bound "
        "raises without moving any answer; against a main before speed11 also 'feasible', 'memory' and "
        "'bounded_before_memory' (layouts the layers' floor skips before their memory is sized) (repeatable)",
    )
    args = parser.parse_args()
    if args.compare:
        before, after = (json.loads(Path(p).read_text()) for p in args.compare)
        diffs = differences(before, after)
        ignored = [d for d in diffs if d.split(": ", 1)[0].rsplit(".", 1)[-1] in args.ignore]
        for d in diffs:
            print(d + (" (ignored)" if d in ignored else ""))
        print(f"{len(before)} searches compared: {len(diffs) - len(ignored)} differences ({len(ignored)} ignored)")
        sys.exit(1 if len(diffs) > len(ignored) else 0)
    body = answers(args.only)
    if args.out:
        Path(args.out).write_text(json.dumps(body, indent=1, sort_keys=True))
    for label, ans in body.items():
        best = ans["results"][0] if ans["results"] else None
        print(
            f"{label}: evaluated {ans['evaluated']} feasible {ans['feasible']} bounded {ans['bounded']}; "
            f"best {best and best['step']['time_s']}"
        )


if __name__ == "__main__":
    main()
