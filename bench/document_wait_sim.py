"""How much later a pipeline ends when its micro-batches differ in time (the check of planner/documents.py's bubble
term, review r9a finding 4): Megatron's 1F1B and interleaved 1F1B orders (Megatron-LM d98e8a6
pipeline_parallel/schedules.py: the warm-up forwards, planner/pipeline.py warmup_microbatches, then one forward one
backward, micro-batches in groups of p over the v chunks) run as a list schedule, each device in its own order, each
operation when its device and its input are free (p2p taken as free). A micro-batch j takes t_j on a stage, the
forward t_j/3 and the backward 2t_j/3, split evenly over the v chunks; t_j ~ N(1, sigma). Prints E[makespan - the
uniform makespan] (the uniform one checked against m + (p - 1)/v) beside documents.py's (p - 1)·sigma·E[max of m]
and that over v. Never run by the tests.

    PYTHONPATH=. python bench/document_wait_sim.py 4 16 1000     # p, m, samples
"""

from __future__ import annotations

import random
import statistics
import sys

from planner.documents import expected_max
from planner.pipeline import Schedule, warmup_microbatches


def device_order(p: int, v: int, m: int, d: int) -> list[tuple[str, int, int]]:
    """Device ``d``'s operations in Megatron's order: (F or B, micro-batch, chunk)."""

    def op(kind: str, k: int) -> tuple[str, int, int]:
        g, r = divmod(k, p * v)
        chunk = r // p if kind == "F" else v - 1 - r // p
        return kind, g * p + r % p, chunk

    n = m * v
    warm = warmup_microbatches(Schedule("1f1b" if v == 1 else "interleaved", p, m, v), d)
    ops = [op("F", k) for k in range(warm)]
    for k in range(n - warm):
        ops += [op("F", warm + k), op("B", k)]
    return ops + [op("B", k) for k in range(n - warm, n)]


def makespan(p: int, v: int, t: list[float]) -> float:
    """The schedule's end for micro-batch times ``t`` (each device runs its order; an operation waits for its
    input: the forward from the device before, chunk c - 1's last device on device 0; the backward from the device
    after, chunk c + 1's first device on the last, the last chunk's backward after its own forward)."""
    orders = [device_order(p, v, len(t), d) for d in range(p)]
    done: dict[tuple, float] = {}
    free, at = [0.0] * p, [0] * p
    while any(at[d] < len(orders[d]) for d in range(p)):
        moved = False
        for d in range(p):
            while at[d] < len(orders[d]):
                kind, j, c = orders[d][at[d]]
                if kind == "F":
                    dep = (d - 1, "F", j, c) if d else ((p - 1, "F", j, c - 1) if c else None)
                    dur = t[j] / 3 / v
                else:
                    dep = (d + 1, "B", j, c) if d < p - 1 else ((0, "B", j, c + 1) if c < v - 1 else (d, "F", j, c))
                    dur = 2 * t[j] / 3 / v
                if dep is not None and dep not in done:
                    break
                free[d] = done[(d, kind, j, c)] = max(free[d], done[dep] if dep else 0.0) + dur
                at[d] += 1
                moved = True
        if not moved:
            raise RuntimeError("the orders deadlock")
    return max(free)


def main() -> None:
    p, m = int(sys.argv[1]), int(sys.argv[2])
    samples, sigma = int(sys.argv[3]) if len(sys.argv) > 3 else 300, 0.1
    rng = random.Random(1)
    for v in (1, 2, 4):
        base = makespan(p, v, [1.0] * m)
        assert abs(base - (m + (p - 1) / v)) < 1e-9
        extra = statistics.mean(
            makespan(p, v, [rng.gauss(1.0, sigma) for _ in range(m)]) - base for _ in range(samples)
        )
        formula = (p - 1) * sigma * expected_max(m)
        print(f"p {p} m {m} v {v}: E[extra] {extra:.4f}, (p-1)·σ·E[max of m] {formula:.4f}, over v {formula / v:.4f}")


if __name__ == "__main__":
    main()
