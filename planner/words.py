"""How the planner and the CLI write numbers and deployments for people: the one home of the human units (issue 14:
3 significant digits, decimal prefixes, never scientific notation; frontend/js/format.js writes the same, compared
in tests/frontend/test_page.py) and of a serving pool's name. The serving search's sentences (planner/serving/
search.py) and every CLI table use these; app/cli.py imports this module when it first writes a number, so that
`commplan --help` loads no planner."""

from __future__ import annotations

import math
from collections.abc import Mapping

# Human units (issue 14): 3 significant digits, decimal prefixes (1 GB = 1e9 B, as GB/s), never scientific notation.
BYTE_UNITS = (("PB", 1e15), ("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3), ("B", 1.0))
TIME_UNITS = (("s", 1.0), ("ms", 1e-3), ("us", 1e-6), ("ns", 1e-9))
# from 1,000 s on (a saturated prefill pass read "24500 s", a TTFT "3140000000 s"); a year is 365.25 days
LONG_UNITS = (("years", 365.25 * 86400), ("days", 86400.0), ("h", 3600.0), ("min", 60.0))


NOT_FINITE, INFINITE = "not a number", "infinite"  # sig3's words for NaN and inf


def sig3(x: float, digits: int = 3) -> str:
    """3 (or ``digits``) significant digits as a plain decimal: 1530 -> '1530', 0.01234 -> '0.0123', 0.9996 ->
    '1.00'; never an exponent (sig3(1e-06, 4) -> '0.000001000'); a value that is not finite in words (review r14d #2:
    an infinite fitted clock raised OverflowError here, a 500 from /v1/calibrate)."""
    if not math.isfinite(x):
        return NOT_FINITE if math.isnan(x) else f"{'minus ' if x < 0 else ''}{INFINITE}"
    v = float(f"{x:.{digits}g}")
    if v == 0:
        return "0"
    return f"{v:.{max(0, digits - 1 - math.floor(math.log10(abs(v))))}f}"


def _human(x: float, units: tuple[tuple[str, float], ...]) -> str:
    """In the largest unit that shows the value, rounded to 3 digits, as at least 1 (999.6 ms -> 1.00 s)."""
    for unit, scale in units:
        if abs(float(f"{x / scale:.3g}")) >= 1:
            return f"{sig3(x / scale)} {unit}"
    unit, scale = units[-1]
    return f"{sig3(x / scale)} {unit}"


RATE_UNITS = (("TB/s", 1e12), ("GB/s", 1e9), ("MB/s", 1e6), ("KB/s", 1e3), ("B/s", 1.0))


def _below(x: float, unit: str, zero: str) -> str:
    """A value under the resolution shown: '< 1 ns' if positive, else zero (never '0.00000178 ns' of noise)."""
    return f"< 1 {unit}" if x > 0 else zero


def human_bytes(n: float) -> str:
    return f"{round(n)} B" if abs(n) < 999.5 else _human(n, BYTE_UNITS)


def human_seconds(s: float) -> str:
    """frontend/js/format.js fmtTime, with 'us' for 'µs' (tests/frontend/test_page.py compares them)."""
    if s == 0:
        return "0 s"
    if not math.isfinite(s):
        return sig3(s)
    if abs(s) >= 999.5:
        return _human(s, LONG_UNITS)
    return _below(s, "ns", "0 s") if abs(s) < 0.9995e-9 else _human(s, TIME_UNITS)


def human_rate(gbps: float) -> str:
    """A bandwidth given in GB/s, in the unit that shows it (0.000186 GB/s -> '186 KB/s'); format.js fmtBw."""
    if gbps == 0:
        return "0 GB/s"
    return _below(gbps, "B/s", "0 GB/s") if abs(gbps) < 0.9995e-9 else _human(gbps * 1e9, RATE_UNITS)


def human_percent(x: float) -> str:
    """A fraction as a percentage, 3 digits, '< 0.01%' under the resolution; format.js fmtPct."""
    if x == 0 or abs(100 * x) < 0.009995:
        return "< 0.01%" if x > 0 else "0%"
    return f"{sig3(100 * x)}%"


def human_number(x: float) -> str:
    """A count or a rate in a sentence: 3 significant digits below 1,000, a whole number with thousands separators
    from there on ("0.0473", "33,012", "1,000,000": it read "1000000 requests/s" in the serving warnings)."""
    return f"{x:,.0f}" if abs(x) >= 999.5 else sig3(x)


def human_capacity(n: int) -> str:
    """Memory capacity: decimal GB as everywhere, with GiB beside it (format.js fmtCapacity)."""
    return f"{human_bytes(n)} ({sig3(n / 2**30)} GiB)"


def duration(s: float | None, why: str = "") -> str:
    """A time that may be unbounded (a saturated queue's TTFT: None): human_seconds, or 'unbounded' (with ``why``
    in parentheses after it)."""
    if s is None:
        return f"unbounded ({why})" if why else "unbounded"
    return human_seconds(s)


def load_name(concurrency: int | None, request_rate: float | None) -> str:
    """A serving load as a person reads it: "concurrency 2,048" or "2.50 requests/s"."""
    return f"concurrency {concurrency:,}" if concurrency is not None else f"{sig3(request_rate)} requests/s"


POOL_DIMS = ("tp", "pp", "dp", "ep")


def pool_name(role: str, workers: int, dims: Mapping[str, int], attention_dp: bool = False) -> str:
    """A serving pool as the page names it: "prefill 4× TP2", "decode 1× DP32 EP32 attention-DP", "both 8× TP1"
    (workers ×, then each parallel size above 1, TP1 when none is; it read "prefill 4x2": workers by GPUs, which a
    newcomer took for TP4 x 2). ``dims``: the pool's sizes by name (POOL_DIMS; absent: 1)."""
    sizes = " ".join(f"{k.upper()}{dims.get(k, 1)}" for k in POOL_DIMS if dims.get(k, 1) > 1) or "TP1"
    return f"{role} {workers}× {sizes}" + (" attention-DP" if attention_dp else "")


__all__ = [
    "duration",
    "human_bytes",
    "human_capacity",
    "human_number",
    "human_percent",
    "human_rate",
    "human_seconds",
    "load_name",
    "pool_name",
    "sig3",
]
