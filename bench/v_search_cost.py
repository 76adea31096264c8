"""CPU time of a layout search restricted to the V / zero-bubble schedules (review r12a #2's case, mend12a): Llama3-70B,
gbs 2000, seq 8192, megatron, tp 8 on DGX H100 nodes, one worker. Prints CPU seconds, evaluated, bounded and the best
step times (to compare answers across commits: run it from each checkout, alternating).

    PYTHONPATH=. python bench/v_search_cost.py zbv,dualpipev 8,20,40 40
"""

from __future__ import annotations

import sys
import time

from collectives.topology import cluster_preset
from planner import WorkloadSpec, model_preset
from planner.search.engine import search
from planner.search.evaluate import Problem
from planner.search.space import Constraints


def main(schedules: str, pps: str, nodes: str) -> None:
    model = model_preset("llama3-70b")
    work = WorkloadSpec(global_batch_size=2000, seq_length=8192)
    pp = [int(x) for x in pps.split(",")]
    fixed = {"pipeline_schedule": schedules.split(","), "pp": pp, "framework": "megatron", "tp": 8}
    constraints = Constraints.of(fixed)
    start = time.process_time()
    result = search(Problem(model, work, cluster_preset("dgx-h100", int(nodes)), constraints, top_k=3), workers=1)
    spent = time.process_time() - start
    out = result.outcome
    print(f"{spent:.2f} s CPU, evaluated {out.evaluated}, bounded {out.bounded}", [round(x[0], 9) for x in out.best])


if __name__ == "__main__":
    main(*(sys.argv[1:4] if len(sys.argv) > 3 else ("zbv,dualpipev", "8,20,40", "40")))
