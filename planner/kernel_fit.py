"""How the kernel model's global constants are fitted on measured kernels: one home for the procedure that
bench/kernel_fit.py runs on NVIDIA's aiconfigurator tables and planner/trace_fit.py on a user's profiler trace.

A fit is a grid search over ``Efficiency`` candidates for the least rms log error, log(predicted / measured),
over the measured points. Where the points fall into classes that each have a ceiling of their own (a GPU's
GEMMs of one dtype), each class's median log error is taken out first: the class's ceiling is refitted with the
globals (``class_scales`` says by how much), so the grid chooses only the shape terms (k0, SM fill, fixed cost).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable, Sequence
from statistics import median
from typing import TypeVar

import numpy as np

from .kernels import Efficiency

P = TypeVar("P")


def log_errors(
    points: Iterable[P],
    eff: Efficiency,
    predict: Callable[[P, Efficiency], float],
    measured: Callable[[P], float],
    key: Callable[[P], Hashable] | None = None,
    same: Callable[[P], Hashable] | None = None,
) -> dict[Hashable, list[float]]:
    """log(predicted / measured) per point, by class (``key``; one class when None). Points with equal
    ``same`` (the inputs of the prediction: a trace repeats its kernels every step) are predicted once."""
    by: dict[Hashable, list[float]] = {}
    seen: dict = {}
    for p in points:
        if same is None:
            predicted = predict(p, eff)
        else:
            s = same(p)
            predicted = seen.get(s)
            if predicted is None:
                predicted = seen[s] = predict(p, eff)
        by.setdefault(key(p) if key else None, []).append(math.log(predicted / measured(p)))
    return by


def centred(by: dict[Hashable, list[float]]) -> list[float]:
    """Log errors with each class's median taken out (its ceiling refitted with the globals)."""
    out = []
    for logs in by.values():
        mid = median(logs)
        out.extend(x - mid for x in logs)
    return out


def class_scales(by: dict[Hashable, list[float]]) -> dict[Hashable, float]:
    """predicted / measured at each class's median: a class's ceiling times this is its refitted ceiling (the
    compute-bound time goes as 1 / ceiling)."""
    return {k: math.exp(median(logs)) for k, logs in by.items()}


def fit_grid(
    points: Sequence[P],
    grid: Iterable[Efficiency],
    predict: Callable[[P, Efficiency], float],
    measured: Callable[[P], float],
    key: Callable[[P], Hashable] | None = None,
    same: Callable[[P], Hashable] | None = None,
) -> tuple[float, Efficiency]:
    """The grid point with the least rms log error over ``points`` (each class centred when ``key`` is given):
    (rms, that Efficiency). Points with equal ``same`` are predicted once per grid point."""
    first: dict = {}
    index = np.empty(len(points), dtype=np.intp)
    for i, p in enumerate(points):
        index[i] = first.setdefault(same(p) if same else i, len(first))
    reps = [None] * len(first)
    for i, p in enumerate(points):
        reps[index[i]] = p
    log_measured = np.log([measured(p) for p in points])
    labels = [key(p) if key else None for p in points]
    classes = [np.array([lab == c for lab in labels]) for c in dict.fromkeys(labels)] if key else []
    scored = []
    for eff in grid:
        errors = np.log([predict(p, eff) for p in reps])[index] - log_measured
        for mask in classes:
            errors[mask] -= np.median(errors[mask])
        scored.append((float(np.sqrt(np.mean(errors * errors))), eff))
    return min(scored, key=lambda p: p[0])


__all__ = ["centred", "class_scales", "fit_grid", "log_errors"]
