"""Execute ring allreduce on 1,024 ranks x 1M float32 elements and check the result (issue: < 10 s).

Run: .venv/bin/python bench/bench_execute.py [ranks] [count]
Peak memory is the executor's state, ranks x count x 4 bytes (4 GiB here), plus one step's transfers.
"""

from __future__ import annotations

import resource
import sys
import time

import numpy as np

import collectives as c


def main(ranks: int = 1024, count: int = 1 << 20) -> None:
    schedule = c.build_schedule("allreduce", "ring", ranks, count, 4)
    rng = np.random.default_rng(0)
    inputs = [rng.integers(-8, 8, count).astype(np.float32) for _ in range(ranks)]
    expected = np.sum(inputs, axis=0, dtype=np.float32)
    start = time.perf_counter()
    run = c.execute(schedule, inputs)
    elapsed = time.perf_counter() - start
    del inputs
    worst = max(float(np.abs(out - expected).max()) for out in run.outputs[:: max(1, ranks // 16)])
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(
        f"ring allreduce {ranks} ranks x {count} float32: {elapsed:.2f} s, {run.steps} steps, "
        f"{run.bytes_sent.max()} B sent per rank (closed form {2 * (ranks - 1) * count * 4 // ranks}), "
        f"max error {worst}, peak RSS {peak:.2f} GiB (inputs included)"
    )


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:]))
