"""Write tests/reference/kernels/aiconfigurator_gemm_parts.json: the GB200, B300 and GB300 GEMM tables of NVIDIA's
aiconfigurator (and the H200's, for the burst-clock comparison of docs/step-time.md) in the grid and format of
aiconfigurator_gemm.json (bench/kernel_fit.py ``rows``), which this reproduces row for row from the b200_sxm table.

    git -C <aiconfigurator clone> show 095f58a5:aic-core/src/aiconfigurator_core/systems/data/<system>/gemm/trtllm/\
1.3.0rc20/gemm_perf.parquet > <dir>/<system>.parquet          # b200_sxm gb200 b300_sxm gb300 h200_sxm
    <a venv with pyarrow>/bin/python bench/aiconfigurator_extract.py <dir>

Needs pyarrow (read here only, never by the product: the committed extract is JSON).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

REFERENCE = Path(__file__).resolve().parent.parent / "tests" / "reference" / "kernels"
COMMIT = "095f58a51c4ca8e61b66ec108d86f223f8d559ce"
VERSION = "1.3.0rc20"  # TensorRT-LLM, the b200_sxm and h100_sxm extract's version
# the compact grid of aiconfigurator_gemm.json
M = (256, 1024, 4096, 8192)
NK = (1024, 2048, 4096, 5120, 8192, 12288, 16384)
DTYPES = {"bfloat16": "bf16", "fp8": "fp8", "fp8_block": "fp8_block", "nvfp4": "nvfp4"}
SYSTEMS = {  # aiconfigurator system -> this project's preset (collectives/topology/gpu.py GPUS)
    "gb200": "gb200-186gb",
    "b300_sxm": "b300-288gb",
    "gb300": "gb300-288gb",
    "h200_sxm": "h200-sxm-141gb",
}


def table(path: Path) -> tuple[dict, str]:
    """{dtype: [[m, n, k, latency ms rounded to 5 decimals], ...] sorted} on the compact grid, and the device."""
    import pyarrow.parquet as pq  # bench-only dependency

    d = pq.read_table(path).to_pydict()
    out: dict = {}
    devices = set()
    for i, (m, n, k) in enumerate(zip(d["m"], d["n"], d["k"], strict=True)):
        dtype = DTYPES.get(d["gemm_dtype"][i])
        if dtype and m in M and n in NK and k in NK:
            out.setdefault(dtype, {}).setdefault((m, n, k), round(d["latency"][i], 5))
            devices.add(d["device"][i])
    (device,) = devices
    return {dt: [[*key, ms] for key, ms in sorted(rows.items())] for dt, rows in out.items()}, device


def at_shapes(path: Path, shapes: set) -> list:
    """[[m, n, k, latency ms], ...] of the bf16 rows of ``path`` at ``shapes``, sorted."""
    import pyarrow.parquet as pq  # bench-only dependency

    d = pq.read_table(path).to_pydict()
    found = {
        (m, n, k): round(d["latency"][i], 5)
        for i, (m, n, k) in enumerate(zip(d["m"], d["n"], d["k"], strict=True))
        if d["gemm_dtype"][i] == "bfloat16" and (m, n, k) in shapes
    }
    return [[*key, ms] for key, ms in sorted(found.items())]


def run2_shapes() -> set:
    """The (m, n, k) of this project's H200 bf16 GEMMs (tests/reference/kernels/h200/run2.json ``gemm_bf16``)."""
    section = json.loads((REFERENCE / "h200" / "run2.json").read_text())["sections"]["gemm_bf16"]
    at = [section["columns"].index(c) for c in ("m", "n", "k")]
    return {tuple(row[i] for i in at) for row in section["rows"]}


def main(folder: str) -> None:
    b200, _ = table(Path(folder) / "b200_sxm.parquet")
    committed = json.loads((REFERENCE / "aiconfigurator_gemm.json").read_text())["systems"]["b200_sxm"]["dtypes"]
    assert b200 == committed, "the grid does not reproduce aiconfigurator_gemm.json's b200_sxm rows"
    systems = {}
    for system, gpu in SYSTEMS.items():
        dtypes, device = table(Path(folder) / f"{system}.parquet")
        path = f"{system}/gemm/trtllm/{VERSION}/gemm_perf.parquet"
        systems[system] = {"gpu": gpu, "device": device, "path": path, "dtypes": dtypes}
    data = {
        "source": (
            f"github.com/ai-dynamo/aiconfigurator (Apache-2.0) at commit {COMMIT}, "
            "aic-core/src/aiconfigurator_core/systems/data/<system>/<path>: measured GEMM latency (ms) with "
            f"TensorRT-LLM {VERSION}'s torch flow (cuBLASLt; DeepGEMM for fp8_block) on one GPU; the compact grid of "
            "aiconfigurator_gemm.json (m in [256, 1024, 4096, 8192], n and k in [1024, 2048, 4096, 5120, 8192, "
            "12288, 16384]; bench/aiconfigurator_extract.py, which reproduces that file's b200_sxm rows exactly)"
        ),
        "columns": ["m", "n", "k", "latency_ms"],
        "systems": systems,
        # the H200 table's bf16 rows at the shapes of this project's own H200 GEMMs, wherever it has them
        "h200_sxm_at_run2_shapes": at_shapes(Path(folder) / "h200_sxm.parquet", run2_shapes()),
    }
    (REFERENCE / "aiconfigurator_gemm_parts.json").write_text(json.dumps(data, separators=(",", ":")))


if __name__ == "__main__":
    main(sys.argv[1])
