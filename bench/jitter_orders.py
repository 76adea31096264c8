"""The zero-bubble and DualPipe orders' packed-document wait (sched11, docs/step-time.md "Zero-bubble and DualPipe
orders for packed documents"): per sigma at rho 0.1, phi 1/3, omega 2/9, the order's mean / sd and its CPU time against
the flow shop's (p - 1)·E[max of m]; then the mean at 64, 16 and 8 draws against 256 on the same structure (the
sampling error of the work bound's fewer draws). `PYTHONPATH=. python bench/jitter_orders.py`."""

import time

from planner import pipeline_jitter as pj
from planner.documents import expected_max
from planner.pipeline import Schedule, schedule_traits

KINDS = ("1f1b", "zb-h1", "zbv", "dualpipe", "dualpipev")
FEW = [("1f1b", 16, 1, 64), ("1f1b", 32, 1, 128), ("1f1b", 64, 1, 256), ("1f1b", 128, 1, 512),
       ("interleaved", 16, 4, 64), ("interleaved", 32, 2, 128), ("interleaved", 64, 2, 256), ("zb-h1", 64, 1, 256),
       ("zbv", 32, 2, 128), ("dualpipe", 32, 2, 128), ("dualpipev", 32, 2, 128)]  # fmt: skip


def _v(kind: str) -> int:
    traits = schedule_traits(kind)
    return 2 if traits.v_shape else (2 if traits.interleaved else 1)


def _omega(kind: str) -> float:
    return 2 / 9 if schedule_traits(kind).splits_weights else 0.0


if __name__ == "__main__":
    print("p, m | flow | " + " | ".join(KINDS))
    for p, m in ((4, 16), (8, 32), (16, 64), (32, 128)):
        row = [f"{p}, {m}", f"{(p - 1) * expected_max(m):.2f}"]
        for kind in KINDS:
            pj._NODE_CACHE.clear()
            pj._GRAPHS.clear()
            start = time.process_time()
            got = pj.jitter(Schedule(kind, p, m, _v(kind)), 1 / 3, 0.1, _omega(kind))
            row.append(f"{got.mean:.2f} / {got.sd:.2f} ({(time.process_time() - start) * 1e3:.0f} ms)")
        print(" | ".join(row), flush=True)
    print("structure | 256 draws | 64 | 16 | 8 (mean per sigma, % of 256's)")
    for kind, p, v, m in FEW:
        means = [pj._node_moments(kind, p, v, m, [(1 / 3, 0.1)], d, _omega(kind))[0][0] for d in (256, 64, 16, 8)]
        shown = " | ".join(f"{a:.2f} ({(a - means[0]) / means[0] * 100:+.1f}%)" for a in means[1:])
        print(f"{kind} p {p} v {v} m {m} | {means[0]:.2f} | {shown}", flush=True)
