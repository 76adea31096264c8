"""How much later a pipeline ends when its micro-batches differ in time (the check of planner/documents.py's wait,
review r9a finding 4; docwait10): Megatron's 1F1B and interleaved 1F1B orders run as a list schedule
(planner/pipeline_jitter.py, the planner's one home for it: pipeline.py's ScheduleTraits.order, each operation when
its rank and its input are free, p2p taken as free), micro-batch j taking t_j on every stage, the forward a third,
the backward the rest, split evenly over the v chunks; t_j ~ N(1, sigma). Prints, for fresh draws (seed 1, not the
planner's), E[makespan - uniform makespan] with its sampling error, beside the planner's cached answer
(pipeline_jitter.jitter: its fixed-seed draws, the control variate) and the flow shop's (p - 1)·sigma·E[max of m]
that documents.py used before docwait10. Never run by the tests.

    PYTHONPATH=. python bench/document_wait_sim.py 4 16 1000     # p, m, samples
"""

from __future__ import annotations

import sys

import numpy as np

from planner.documents import expected_max
from planner.pipeline import Schedule
from planner.pipeline_jitter import jitter, schedule_makespans


def main() -> None:
    p, m = int(sys.argv[1]), int(sys.argv[2])
    samples, sigma = int(sys.argv[3]) if len(sys.argv) > 3 else 300, 0.1
    rng = np.random.default_rng(1)
    for v in (1, 2, 4):
        kind = "1f1b" if v == 1 else "interleaved"
        spans, base = schedule_makespans(kind, p, v, 1 / 3, 1 + sigma * rng.standard_normal((m, samples)))
        assert abs(base - (m + (p - 1) / v)) < 1e-9
        extra = spans - base
        error = extra.std(ddof=1) / np.sqrt(samples)
        planner = sigma * jitter(Schedule(kind, p, m, v), 1 / 3, sigma).mean
        formula = (p - 1) * sigma * expected_max(m)
        print(
            f"p {p} m {m} v {v}: E[extra] {extra.mean():.4f} ± {error:.4f}, planner {planner:.4f}, "
            f"(p-1)·σ·E[max of m] {formula:.4f}"
        )


if __name__ == "__main__":
    main()
