"""What every answer of the planner obeys, checked before it leaves (issue 26 item 5).

Input bounds (app/schemas) keep numbers physical; these are the output's side: every time finite and
non-negative, 0 <= MFU <= MFU_CEILING (2), throughput finite, every byte count a non-negative integer, and ``fits`` the
comparison of the bytes it summarises. A violation is a bug in the planner, never bad input: it raises
:class:`InvariantError`, which the service answers as a logged 500 (and a test as a failure), never as a
silent null in a 200.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

# the step's parts are each on the critical path; a part may exceed the whole by rounding only
REL_TOL = 1e-9
# The MFU's model FLOPs (compute.model_flops_per_token: PaLM Appendix B, Llama 3) count causal attention's whole
# T x T square, at most twice the query-key pairs its kernels compute (causal: T(T+1)/2; windows and packed
# documents alike, kernels.square_keys), and every other term as run; the kernels run at most at the peak. So
# MFU <= 2, and above 1 only where attention dominates a long context (hostile10: Llama-3 8B prefill of 262,144
# tokens on an A100, 1.14, was a 500 under the old bound of 1; the plan says why in a warning).
MFU_CEILING = 2.0


class InvariantError(RuntimeError):
    """An answer that cannot be: ``where`` names the value (dotted path), ``rule`` what it broke."""

    def __init__(self, where: str, rule: str):
        super().__init__(f"{where}: {rule}")
        self.where, self.rule = where, rule


def _time(where: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise InvariantError(where, f"{value!r} is not a finite non-negative time")
    return float(value)


def _bytes(where: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvariantError(where, f"{value!r} is not a non-negative integer byte count")
    return value


def check_step(step, where: str = "step") -> None:
    """A StepTime: finite non-negative times, each part at most the step, 0 <= MFU <= MFU_CEILING, finite
    throughput."""
    if step is None:
        return
    total = _time(f"{where}.time_s", step.time_s)
    for name in ("compute_s", "exposed_comm_s", "bubble_s"):
        part = _time(f"{where}.{name}", getattr(step, name))
        if part > total * (1 + REL_TOL) + 1e-15:
            raise InvariantError(f"{where}.{name}", f"{part!r} s is longer than the step's {total!r} s")
    if total <= 0:
        raise InvariantError(f"{where}.time_s", "a step of 0 s")
    mfu = step.mfu
    if not (isinstance(mfu, int | float) and math.isfinite(mfu) and 0 <= mfu <= MFU_CEILING):
        raise InvariantError(f"{where}.mfu", f"{mfu!r} is not in [0, {MFU_CEILING:g}]")
    _time(f"{where}.tokens_per_s", step.tokens_per_s)  # finite and non-negative, as a rate


def check_memory(memory, where: str = "memory") -> None:
    """A Memory: non-negative integer bytes, peaks that sum their parts, ``fits`` their comparison."""
    if memory is None:
        return
    capacity = _bytes(f"{where}.capacity_bytes", memory.capacity_bytes)
    if not memory.per_stage:
        raise InvariantError(f"{where}.per_stage", "no stage")
    parts = ("params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes", "buffers_bytes")
    for i, s in enumerate(memory.per_stage):
        values = [getattr(s, name) for name in parts]
        if not all(type(v) is int and v >= 0 for v in values):  # named one by one only when one is not
            values = [_bytes(f"{where}.per_stage.{i}.{name}", v) for name, v in zip(parts, values, strict=True)]
        total = sum(values)
        if s.peak_bytes != total:
            raise InvariantError(f"{where}.per_stage.{i}.peak_bytes", f"{s.peak_bytes} is not the sum {total}")
    fits = all(s.peak_bytes <= capacity for s in memory.per_stage)
    if memory.fits is not fits:
        raise InvariantError(f"{where}.fits", f"{memory.fits} but the peaks against {capacity} B say {fits}")


def check_calls(calls: Iterable, where: str = "calls") -> None:
    """PricedCalls: finite non-negative times and bandwidths, non-negative integer bytes and counts. A call
    whose values are all plainly good (finite non-negative floats, non-negative ints) passes without naming
    each value's path (some 300 strings a 16,384-GPU plan); any other is checked value by value, by name."""
    for i, pc in enumerate(calls):
        p, c = pc.price, pc.call
        times = (p.time_s, p.algbw_GBps, p.busbw_GBps)
        counts = (int(p.bytes_sent_per_rank), int(p.bytes_received_per_rank), int(c.message_bytes),
                  int(c.calls_per_iteration))  # fmt: skip
        if all(type(t) is float and 0.0 <= t < math.inf for t in times) and all(n >= 0 for n in counts):
            continue
        for name, value in zip(("time_s", "algbw_GBps", "busbw_GBps"), times, strict=True):
            _time(f"{where}.{i}.{name}", value)
        names = ("bytes_sent_per_rank", "bytes_received_per_rank", "message_bytes", "calls_per_iteration")
        for name, value in zip(names, counts, strict=True):
            _bytes(f"{where}.{i}.{name}", value)


def check_exploration(exploration, where: str = "series") -> None:
    """An Exploration: per algorithm, one time and one bus bandwidth per size, each finite and non-negative,
    or None where the algorithm does not run at that size."""
    n = len(exploration.sizes)
    for i, s in enumerate(exploration.series):
        if len(s.time_s) != n or len(s.busbw_GBps) != n:
            raise InvariantError(f"{where}.{i}", f"{len(s.time_s)} times for {n} sizes")
        for j, (t, bw) in enumerate(zip(s.time_s, s.busbw_GBps, strict=True)):
            if t is not None:
                _time(f"{where}.{i}.time_s.{j}", t)
            if bw is not None:
                _time(f"{where}.{i}.busbw_GBps.{j}", bw)


def check_plan(plan) -> None:
    """Every invariant of a Plan (the calls, the totals, the step, the memory)."""
    check_calls(plan.calls)
    _time("totals.time_s", plan.totals.time_s)
    for i, s in enumerate(plan.totals.per_stage):
        _time(f"totals.per_stage.{i}.time_s", s.time_s)
    check_step(plan.step)
    check_memory(plan.memory)


__all__ = ["InvariantError", "check_calls", "check_exploration", "check_memory", "check_plan", "check_step"]
