"""The accuracy tables of README.md and docs/step-time.md, computed (never typed in):

- per kernel class, predicted against NVIDIA's measured aiconfigurator kernel tables (bench/kernel_fit.py);
- per kernel class and whole eager layers, predicted against this project's own H200 tables (bench/h200_tables.py;
  runs 1-2 the constants are fitted on, run 3's layers held out);
- every published run, all held out: no constant of the kernel model is fitted on a run (bench/step_validation.py);
- leave one source out: the GEMM constants refitted without one GPU's table (kernel_fit.leave_one_source_out),
  and per publication of runs, which is the leave-one-out error itself since nothing is fitted on runs.

    PYTHONPATH=. python bench/accuracy_tables.py           # print the block
    PYTHONPATH=. python bench/accuracy_tables.py --write   # rewrite it between the markers of docs/step-time.md
    PYTHONPATH=. python bench/accuracy_tables.py --write --readme   # and of README.md

tests/planner/test_accuracy_tables.py checks that the committed blocks are what this prints.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from statistics import median

sys.path.insert(0, str(Path(__file__).resolve().parent))

import h200_tables
import kernel_fit
import step_validation

ROOT = Path(__file__).resolve().parent.parent
# docs/step-time.md holds the tables; README.md a copy of them (``--write --readme`` rewrites it too: README.md's
# owner copies the block in, tests/planner/test_accuracy_tables.py compares the docs' block)
FILES = (ROOT / "docs" / "step-time.md",)
README = ROOT / "README.md"
BEGIN, END = "<!-- accuracy-tables:begin (bench/accuracy_tables.py --write) -->", "<!-- accuracy-tables:end -->"
GPU_OF = {"a100_sxm": "A100", "h100_sxm": "H100", "b200_sxm": "B200"}
# the per-tensor fp8 rows keep the dynamic amax and quantize they time, compared with the model's GEMM plus them
# (kernel_fit.table, kernels.dynamic_quantize_s: mend14b)
DTYPE_CLASS = {"bf16": "bf16 GEMMs", "fp8": "fp8 GEMMs (per-tensor, with the amax + quantize its rows time)",
               "fp8_block": "fp8 GEMMs (1x128 blocks)", "nvfp4": "nvfp4 GEMMs"}  # fmt: skip


def _pct(x: float) -> str:
    return f"{x * 100:.1f}%"


def _signed(x: float) -> str:
    return f"{x * 100:+.1f}%".replace("-", "−")


def kernel_classes() -> list[str]:
    """Kernel class x GPU: median |predicted / measured - 1| (count)."""
    cells: dict[str, dict[str, str]] = {}
    for r in kernel_fit.table(kernel_fit.load()):
        cells.setdefault(DTYPE_CLASS[r["dtype"]], {})[GPU_OF[r["system"]]] = f"{_pct(r['median_abs'])} ({r['n']})"
    for r in kernel_fit.attention_table():
        cells.setdefault("attention forward (causal, d 128)", {})[GPU_OF[r["system"]]] = (
            f"{_pct(r['median_abs'])} ({r['n']})"
        )
    for r in kernel_fit.moe_table():
        name = "MoE forward, balanced routing (nothing fitted)" if r["distribution"] == "balanced" else None
        if name:
            cells.setdefault(name, {})["H100"] = f"{_pct(r['median_abs'])} ({r['n']})"
    out = ["| kernel class: median abs error (shapes) | A100 | H100 | B200 |", "|---|---|---|---|"]
    for name, row in cells.items():
        out.append(f"| {name} | " + " | ".join(row.get(g, "") for g in ("A100", "H100", "B200")) + " |")
    return out


# the H200 classes shown, pooled: label -> class names of bench/h200_tables.py
H200_ROWS = {
    "bf16 GEMMs (fwd, dgrad, wgrad)": ("GEMM bf16 fwd", "GEMM bf16 dgrad", "GEMM bf16 wgrad"),
    "bf16 decode GEMMs, m 1-256 (eager, CUDA graph)": (
        "GEMM bf16 decode (m 1-256)",
        "GEMM bf16 decode_graph (m 1-256)",
    ),
    "fp8 GEMMs (torch._scaled_mm tensorwise)": ("GEMM fp8 tensorwise",),
    "grouped expert GEMMs (torch._grouped_mm)": tuple(
        f"grouped _grouped_mm {g} ({s})" for g in ("coarse", "fine") for s in ("uniform", "zipf 1.2")
    ),
    "expert GEMMs one per expert (loop)": tuple(
        f"grouped loop {g} ({s})" for g in ("coarse", "fine") for s in ("uniform", "zipf 1.2")
    ),
    "attention cuDNN, causal d 128 (fwd, bwd)": ("attention cudnn fwd", "attention cudnn bwd"),
    "attention FlashAttention-2, causal d 128 (fwd, bwd)": ("attention flash2 fwd", "attention flash2 bwd"),
    "copies >= 128 MiB (HBM)": ("copy >= 128 MiB eager",),
}


def h200() -> list[str]:
    """This project's H200 tables: per kernel class (runs 1-2, each row at its logged clock) and the whole eager
    layers at the clock the tables' short bursts hold in the model's units (h200_tables.burst_clock_mhz; run 2: the
    fit set; run 3: held out)."""
    errors: dict[str, list[float]] = {}
    for rows in (
        h200_tables.gemm_rows(),
        h200_tables.grouped_rows(),
        h200_tables.attention_rows(),
        h200_tables.memory_rows(),
    ):
        for cls, _, predicted, measured in rows:
            errors.setdefault(cls, []).append(predicted / measured - 1)
    out = [
        "| H200, this project's measurement (bench/h200_tables.py) | rows | median abs error | signed median |",
        "|---|---|---|---|",
    ]
    for label, classes in H200_ROWS.items():
        pooled = [e for c in classes for e in errors[c]]
        out.append(f"| {label} | {len(pooled)} | {_pct(median(abs(e) for e in pooled))} | {_signed(median(pooled))} |")
    for run, label in (("run2", "fit set"), (h200_tables.HELDOUT_RUN, "held out")):
        table = h200_tables.layer_table(run)
        for key, what in (("fwd_err", "forward"), ("step_err", "forward + backward")):
            e = [r[key] for r in table]
            out.append(
                f"| whole eager layers, {what} ({label}, {run}; worst {_signed(max(e, key=abs))}) | {len(e)} | "
                f"{_pct(median(abs(x) for x in e))} | {_signed(median(e))} |"
            )
    return out


def published_runs() -> tuple[list[str], list[dict]]:
    data = step_validation.load()
    rows = [step_validation.predict(c, data) for c in data["cases"]]
    out = [
        "| published runs (all held out) | runs | median abs error | signed median | range |",
        "|---|---|---|---|---|",
    ]
    for label, group in step_validation.summary_groups(rows, data):
        if label.startswith("split") or label.startswith("source"):
            continue
        out.append(_run_row(label, group))
    return out, rows


def _run_row(label: str, group: list[dict]) -> str:
    errors = [r["error"] for r in group]
    return (
        f"| {label} | {len(errors)} | {_pct(median(abs(e) for e in errors))} | {_signed(median(errors))} | "
        f"{_signed(min(errors))} to {_signed(max(errors))} |"
    )


def leave_one_source_out(rows: list[dict]) -> list[str]:
    data = step_validation.load()
    out = [
        "| left out (source) | what is refitted without it | its median abs error | signed median |",
        "|---|---|---|---|",
    ]
    for r in kernel_fit.leave_one_source_out(kernel_fit.load()):
        fitted = f"GEMM k0 / fill / fixed: {r['k0']:g} / {r['fill']:g} / {r['fixed_us']:g} us"
        out.append(f"| {GPU_OF[r['left_out']]} GEMM table ({r['left_out']}) | {fitted} | {_pct(r['median_abs'])} | |")
    for label, group in step_validation.summary_groups(rows, data):
        if label.startswith("source"):
            errors = [r["error"] for r in group]
            name = f"runs of {label.removeprefix('source: ')} ({len(errors)})"
            out.append(
                f"| {name} | nothing (no constant is fitted on a run) | {_pct(median(abs(e) for e in errors))} | "
                f"{_signed(median(errors))} |"
            )
    return out


def block() -> str:
    runs, rows = published_runs()
    parts = [kernel_classes(), h200(), runs, leave_one_source_out(rows)]
    return "\n\n".join("\n".join(p) for p in parts)


def replace_block(text: str, new: str) -> str:
    pattern = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.S)
    if not pattern.search(text):
        raise SystemExit(f"no {BEGIN} ... {END} block")
    return pattern.sub(lambda _: f"{BEGIN}\n{new}\n{END}", text)


def committed(path: Path) -> str:
    """The block as committed in ``path`` (between the markers)."""
    text = path.read_text()
    return text[text.index(BEGIN) + len(BEGIN) : text.index(END)].strip()


def main() -> None:
    new = block()
    if "--write" in sys.argv:
        for path in FILES + ((README,) if "--readme" in sys.argv else ()):
            path.write_text(replace_block(path.read_text(), new))
    print(new)


if __name__ == "__main__":
    main()
