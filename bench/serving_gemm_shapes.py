"""The dense decode steps' GEMMs against NVIDIA's measured GEMM tables (issue 22's dense bias; for planner/kernels.py).

For each dense validation row (bench/serving_validation.py DENSE, TensorRT-LLM FP8 on H100/H200), the decode step's
GEMM kernels as planner/kernels.py prices them, beside the time aiconfigurator's measured table gives for the same
shape (log-linear interpolation over its m, n, k grid; TensorRT-LLM's torch-flow per-tensor FP8 GEMMs), both at the
tables' burst clock (bench/kernel_fit.py ``burst``). The tables are not in the repository (aiconfigurator at
095f58a51c4c, aic-core/src/aiconfigurator_core/systems/data/<system>/gemm/trtllm/1.2.0rc5/gemm_perf.parquet, 50-60k
rows each): pass the two files.

    PYTHONPATH=. python bench/serving_gemm_shapes.py H100_PARQUET H200_PARQUET
"""

from __future__ import annotations

import bisect
import math
import sys
from collections import defaultdict

from bench.kernel_fit import burst
from bench.serving_validation import DENSE, DENSE_OPTIONS, REQUESTS
from collectives.topology import cluster_preset
from planner import MODEL_PRESETS
from planner.kernels import EFFICIENCY, gemm_time, layer_kernels
from planner.serving import Pool, Traffic, engine, plan_serving
from planner.serving.deployment import _context, _worker


def load(path: str, dtype: str = "fp8") -> dict[tuple[int, int, int], float]:
    import pyarrow.parquet as pq

    t = pq.read_table(path).to_pydict()
    out = {}
    for i, d in enumerate(t["gemm_dtype"]):
        if d == dtype and t["kernel_source"][i] == "torch_flow":
            out[(t["m"][i], t["n"][i], t["k"][i])] = t["latency"][i] * 1e-3
    return out


def _bracket(axis: list[int], v: float) -> tuple[int, int, float]:
    i = min(max(bisect.bisect_left(axis, v), 1), len(axis) - 1)
    lo, hi = axis[i - 1], axis[i]
    w = (math.log(v) - math.log(lo)) / (math.log(hi) - math.log(lo)) if hi != lo else 0.0
    return lo, hi, min(max(w, 0.0), 1.0)


def measured(table: dict, m: float, n: float, k: float) -> float:
    """Log-linear interpolation of the measured latency over the table's m, n, k grid."""
    axes = [sorted({key[i] for key in table}) for i in range(3)]
    (m0, m1, wm), (n0, n1, wn), (k0, k1, wk) = (_bracket(a, v) for a, v in zip(axes, (m, n, k), strict=True))
    total = 0.0
    for mm, a in ((m0, 1 - wm), (m1, wm)):
        for nn, b in ((n0, 1 - wn), (n1, wn)):
            for kk, c in ((k0, 1 - wk), (k1, wk)):
                if a * b * c:
                    total += a * b * c * math.log(table[(mm, nn, kk)])
    return math.exp(total)


def rows(tables: dict[str, dict]) -> list[dict]:
    out = []
    for model, cluster, tp, traffic_rows in DENSE:
        nodes = cluster_preset(cluster, 1)
        gpu, table = burst(nodes.gpu), tables[cluster]
        for isl, osl in traffic_rows:
            plan = plan_serving(MODEL_PRESETS[model], nodes, engine("trtllm"), Traffic(isl, osl, REQUESTS[(isl, osl)]),
                                (Pool(tp=tp),), DENSE_OPTIONS)  # fmt: skip
            batch = plan.pools[0].batch
            w = _worker(MODEL_PRESETS[model], nodes, engine("trtllm"), Pool(tp=tp), 0)
            ctx = _context(MODEL_PRESETS[model], DENSE_OPTIONS, "decode", batch, isl + osl // 2, w.decode_par, w)
            layers = MODEL_PRESETS[model].num_layers
            for kn in layer_kernels(ctx, False, nodes.gpu).forward:
                if kn.kind != "gemm":
                    continue
                m, n, k, _ = kn.shape
                planned = gemm_time((float(m),), float(n), float(k), kn.dtype, gpu, EFFICIENCY)
                meas = measured(table, m, n, k)
                out.append({"row": f"{model} {cluster.removeprefix('dgx-').upper()} TP{tp} {isl}/{osl}",
                            "gemm": kn.name, "m": m, "n": n, "k": k, "planned_s": planned, "measured_s": meas,
                            "in_step_s": kn.time_s,
                            "layers": layers, "step_s": plan.pools[0].step_s})  # fmt: skip
    return out


if __name__ == "__main__":
    h100, h200 = sys.argv[1:3]
    found = rows({"dgx-h100": load(h100), "dgx-h200": load(h200)})
    by_row = defaultdict(list)
    for r in found:
        by_row[r["row"]].append(r)
        print(f"{r['row']:34s} {r['gemm']:22s} m {r['m']:5.0f} n {r['n']:6.0f} k {r['k']:6.0f}  planned "
              f"{r['planned_s'] * 1e6:8.1f} us  measured {r['measured_s'] * 1e6:8.1f} us  "
              f"({r['planned_s'] / r['measured_s'] - 1:+.0%})")  # fmt: skip
    for name, rs in by_row.items():
        extra = sum((r["planned_s"] - r["measured_s"]) * r["layers"] for r in rs)
        sustained = sum((r["in_step_s"] - r["measured_s"]) * r["layers"] for r in rs)
        print(
            f"{name:34s} decode step {rs[0]['step_s'] * 1e3:7.1f} ms; GEMMs planned - measured "
            f"{extra * 1e3:+6.1f} ms ({extra / rs[0]['step_s']:+.0%} of the step) at the burst clock, "
            f"{sustained * 1e3:+6.1f} ms ({sustained / rs[0]['step_s']:+.0%}) as the step prices them "
            f"(sustained clock, per-kernel floor)"
        )
