"""Search throughput on Calculon's problem and the Llama-3 405B search (issue 12; docs/search.md).

    PYTHONPATH=. python bench/bench_search.py                 # GPT-3 175B, 1,024 A100, batch 1536, both cores
    PYTHONPATH=. python bench/bench_search.py --problem llama3-405b
    PYTHONPATH=. python bench/bench_search.py --workers 1 --constraints '{"framework": "megatron"}'

Prints the space, the counts, the wall time and layouts/s (evaluated = layouts valid under every rule whose
memory, and when they fit, step time or bound, were computed), against Calculon's measured rate on the same
problem here (156-232 configs/s, issue 12; Calculon is not installable from the package registry here: the
PyPI 'calculon' is an unrelated package).
"""

from __future__ import annotations

import argparse
import json
import time

from collectives.topology import cluster_preset
from planner import MODEL_PRESETS, WorkloadSpec
from planner.search import Constraints, Problem, search, space_of

CALCULON_RATE = (156, 232)  # configs/s, llm-optimal-execution on this machine (issue 12)
PROBLEMS = {
    # Calculon's own search problem (Isaev et al. SC'23): GPT-3 175B, 1,024 A100 80 GB, global batch 1536
    "gpt3-175b": ("gpt3-175b", WorkloadSpec(global_batch_size=1536), ("dgx-a100", 128)),
    # Llama 3 405B: 16,384 H100, global batch 2048 sequences of 8192 tokens (The Llama 3 Herd of Models)
    "llama3-405b": ("llama3-405b", WorkloadSpec(global_batch_size=2048), ("dgx-h100", 2048)),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--problem", choices=sorted(PROBLEMS), default="gpt3-175b")
    parser.add_argument("--workers", type=int, default=None, help="processes (default: every core)")
    parser.add_argument("--constraints", default="{}", help="JSON constraints, as in POST /v1/search")
    parser.add_argument("--top-k", type=int, default=10)
    parser.add_argument("--max-dp-group", type=int, default=0, help="largest cp x dp group searched (0: default)")
    args = parser.parse_args()
    model, work, (preset, nodes) = PROBLEMS[args.problem]
    allowed = json.loads(args.constraints)
    uneven = allowed.pop("uneven_stages", False)  # a flag of the search, not a dimension
    problem = Problem(
        MODEL_PRESETS[model], work, cluster_preset(preset, nodes),
        Constraints.of(allowed, max_dp_group=args.max_dp_group, uneven_stages=uneven), args.top_k,
    )  # fmt: skip
    print(f"{args.problem}: space of {space_of(problem).size()} layouts")
    start = time.perf_counter()
    result = search(problem, workers=args.workers)
    wall = time.perf_counter() - start
    out = result.outcome
    rate = out.evaluated / wall
    print(
        f"evaluated {out.evaluated}, feasible {out.feasible} (bounded {out.bounded}), pruned {out.pruned.counts}\n"
        f"{wall:.1f} s on {result.workers} process(es): {rate:.0f} layouts/s; Calculon {CALCULON_RATE[0]}-"
        f"{CALCULON_RATE[1]} configs/s: x{rate / CALCULON_RATE[1]:.1f}-x{rate / CALCULON_RATE[0]:.1f}"
    )
    for r in result.results[:5]:
        p = r.layout.parallel
        print(
            f"  {r.time_s:8.3f} s  tp{p.tp} cp{p.cp} pp{p.pp} v{p.virtual_pipeline_stages} dp{p.dp} zero{p.zero_stage} "
            f"sp{int(p.sequence_parallel)} {p.framework} mbs{r.layout.micro_batch_size} {r.layout.activation_recompute}"
        )


if __name__ == "__main__":
    main()
