"""CPU time and peak RSS of pipeline_jitter.jitter per (kind, p, v, m) at phi 0.33, rho 0.05 (review r10a #1's
table, /tmp/r10a_cost.py and r10a_big.py, with process time): `PYTHONPATH=. python bench/jitter_cost.py`."""

import resource
import sys
import time

from planner import pipeline_jitter as pj
from planner.pipeline import Schedule

CASES = [("1f1b", 16, 1, 128), ("interleaved", 16, 4, 128), ("interleaved", 64, 2, 4096), ("1f1b", 64, 1, 256),
         ("interleaved", 128, 2, 1024), ("1f1b", 128, 1, 512), ("1f1b", 256, 1, 1024),
         ("interleaved", 64, 16, 1024), ("1f1b", 512, 1, 2048)]  # fmt: skip

if __name__ == "__main__":
    for kind, p, v, m in CASES if len(sys.argv) < 2 else [(sys.argv[1], *map(int, sys.argv[2:5]))]:
        start = time.process_time()
        got = pj.jitter(Schedule(kind, p, m, v), 0.33, 0.05)
        cpu = time.process_time() - start
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        runs = pj.runs_at(p, v, m, pj.per_microbatch(kind, v), *pj.build_cells(kind))
        print(f"{kind} {p} {v} {m}: {runs} {got} {cpu:.2f} s CPU, max RSS {rss:.0f} MB", flush=True)
