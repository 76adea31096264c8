"""Could one sustained A100 clock explain the A100 rows' bias? A check, never a fit (docs/step-time.md, "The A100
rows (a100r13)").

    PYTHONPATH=. python bench/a100_clock_check.py

planner/kernels.py SUSTAINED_CLOCK has no Ampere entry: the A100 SXM4 runs its GEMMs at 1.0 of the 1,410 MHz its
datasheet peak is quoted at. No published log of an A100's tensor clock through a training step was found (what was
looked for: docs/step-time.md). This script asks the converse of a fit: for each of the 21 published A100 rows
(tests/reference/step_times/published.json), the clock fraction at which the model's step time equals the
measured one (the row's "break-even clock", by bisection on ``GPUSpec.sustained_clock``), each group's errors
at a few trial clocks, and the share of a layer's kernel time its unfused core attention takes. All three sources
ran DGX A100 80GB nodes at the default 400 W (the dgx-a100 preset's GPU; Narayanan et al. 2021 and Smith et al.
2022 name NVIDIA's Selene): a clock the hardware holds would give the three one break-even clock. The printed
spread is what the doc section reads; nothing here changes the model.
"""

from __future__ import annotations

from dataclasses import replace
from statistics import median

from bench.step_validation import case_inputs, load, measured_time
from collectives.topology.gpu import SustainedClock
from planner import build_plan
from planner.context import Context
from planner.kernels import layer_kernels

TRIAL_CLOCKS = (1.0, 0.95, 0.90)
# the three sources of the A100 rows, by how each row's name starts (published.json)
GROUPS = {"Korthikanti et al. 2022": "GPT-", "Narayanan et al. 2021": "SC'21", "Smith et al. 2022": "MT-NLG"}


def a100_cases(data: dict) -> list[dict]:
    return [c for c in data["cases"] if c["cluster"] == "dgx-a100"]


def group_of(case: dict) -> str:
    return next(g for g, prefix in GROUPS.items() if case["name"].startswith(prefix))


def step_at_clock(case: dict, data: dict, fraction: float) -> float:
    """The model's step time with the A100 held at ``fraction`` of 1,410 MHz (a trial, not a measurement)."""
    spec, work, par, cluster, options = case_inputs(case, data)
    trial = SustainedClock(fraction, 1.0, "bench/a100_clock_check.py trial clock (not a measurement)")
    cluster = replace(cluster, gpu=replace(cluster.gpu, sustained_clock=trial))
    return build_plan(spec, work, par, cluster, options).step.time_s


def attention_share(case: dict, data: dict) -> float:
    """The core attention's share of one layer's kernel time (forward, backward and what recompute reruns), as
    planner/kernels.py lists them (LayerKernels.attention, attention_bwd: the unfused baddbmm, softmax, dropout,
    bmm and their layout copies on these runs)."""
    spec, work, par, cluster, _ = case_inputs(case, data)
    kernels = layer_kernels(Context(spec, work, par), False, cluster.gpu)
    names = {k.name for k in kernels.attention + kernels.attention_bwd}
    every = kernels.forward + kernels.backward + kernels.recompute
    return sum(k.time_s for k in every if k.name in names) / sum(k.time_s for k in every)


def break_even_clock(case: dict, data: dict, low: float = 0.5, high: float = 1.2, steps: int = 20) -> float:
    """The clock fraction at which the step time equals the measured one (the step time falls as the clock
    rises), to (high - low) / 2**steps."""
    measured = measured_time(case, data)
    for _ in range(steps):
        mid = (low + high) / 2
        if step_at_clock(case, data, mid) > measured:
            low = mid
        else:
            high = mid
    return (low + high) / 2


def main() -> None:
    data = load()
    cases = a100_cases(data)
    heads = " | ".join(f"error at {c:.2f}" for c in TRIAL_CLOCKS)
    print(f"| run | attention share of a layer | {heads} | break-even clock |")
    print("|---|---|" + "---|" * (len(TRIAL_CLOCKS) + 1))
    rows = []
    for case in cases:
        measured = measured_time(case, data)
        errors = [step_at_clock(case, data, c) / measured - 1 for c in TRIAL_CLOCKS]
        clock = break_even_clock(case, data)
        rows.append((group_of(case), errors, clock))
        cells = " | ".join(f"{e:+.1%}" for e in errors)
        print(f"| {case['name']} | {attention_share(case, data):.3f} | {cells} | {clock:.3f} |")
    print()
    print(f"| source | runs | signed median at {' / '.join(f'{c:.2f}' for c in TRIAL_CLOCKS)} | break-even clocks |")
    print("|---|---|---|---|")
    for group in GROUPS:
        mine = [r for r in rows if r[0] == group]
        medians = " / ".join(f"{median(r[1][i] for r in mine):+.1%}" for i in range(len(TRIAL_CLOCKS)))
        clocks = [r[2] for r in mine]
        print(f"| {group} | {len(mine)} | {medians} | {min(clocks):.3f} .. {max(clocks):.3f} |")


if __name__ == "__main__":
    main()
