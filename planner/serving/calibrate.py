"""Calibration of a serving deployment from the user's own benchmark runs: the summary blocks `vllm bench serve`
and `python -m sglang.bench_serving` print, parsed for their traffic (requests, tokens in and out, concurrency or
request rate) and what they measured (mean TTFT, mean TPOT, output tokens/s); two constants out, the same shape as
the nccl-tests calibration (rows before and after, the constants, the options to plan with).

The two constants scale the planner's own step times (ServeOptions.prefill_time_scale, decode_time_scale): what
the kernel model and the priced calls miss on the user's GPUs and engine version, as one factor per phase, never
per run. Fit: alternating geometric means of measured over predicted TPOT (decode) and TTFT (prefill), replanning
with the deployment's own batching model after each (TPOT moves with prefill stealing, TTFT with the queue), a few
rounds; each factor is kept within [0.05, 20].

Where the printed block comes from (the labels parsed):
- vLLM: vllm/benchmarks/serve.py (docs/benchmarking/cli.md shows one): "Successful requests", "Maximum request
  concurrency" (when set), "Request rate configured (RPS)" (when finite), "Total input tokens", "Total generated
  tokens", "Output token throughput (tok/s)", "Mean TTFT (ms)", "Mean TPOT (ms)".
- SGLang: python/sglang/bench_serving.py: the same token and latency labels, with "Max request concurrency" and
  "Traffic request rate" ("not set" / "inf" when unbounded); where a version prints no TPOT, the mean
  inter-token latency stands for it (equal without speculative decoding).
A run with neither a concurrency nor a finite rate sent every request at once: planned as a concurrency of all its
requests (a closed loop with everything in the system, an approximation of a burst that drains).
"""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass, field, replace

from .._errors import SpecError
from .deployment import plan_serving
from .spec import Traffic, validate_traffic

HEADER = "Serving Benchmark Result"
SCALE_RANGE = (0.05, 20.0)
ROUNDS = 6
_LINE = re.compile(r"^\s*([A-Za-z][^:\n]*?):\s+(\S+)", re.MULTILINE)


@dataclass(frozen=True)
class BenchRun:
    tool: str  # "vllm bench serve" or "sglang.bench_serving"
    requests: int
    input_tokens: int  # mean per request
    output_tokens: int
    ttft_s: float  # mean
    tpot_s: float  # mean
    output_tokens_per_s: float
    concurrency: int | None
    request_rate: float | None

    @property
    def traffic(self) -> Traffic:
        if self.concurrency is None and self.request_rate is None:
            return Traffic(self.input_tokens, self.output_tokens, concurrency=self.requests)
        return Traffic(self.input_tokens, self.output_tokens, self.concurrency, self.request_rate)


def parse_bench(text: str, where: str = "text") -> BenchRun:
    """The first summary block of ``text`` (a benchmark's printed output); a 422 at ``where`` naming what is
    missing otherwise."""
    start = text.find(HEADER)
    if start < 0:
        raise SpecError(where, f"no '{HEADER}' block (the summary vllm bench serve or sglang.bench_serving prints)")
    values = {k.strip(): v for k, v in _LINE.findall(text[start:])}
    tool = "sglang.bench_serving" if "Backend" in values or "Traffic request rate" in values else "vllm bench serve"

    def number(*labels: str) -> float:
        for label in labels:
            if label in values:
                try:
                    value = float(values[label].split("/")[0].replace(",", ""))
                except ValueError:
                    raise SpecError(where, f"'{label}' is {values[label]!r}, not a number") from None
                if not 0 <= value < 1e15:
                    raise SpecError(where, f"'{label}' is {values[label]!r}: not a count or time a run can measure")
                return value
        raise SpecError(where, f"the summary block has no '{labels[0]}' line")

    requests = int(number("Successful requests"))
    if requests < 1:
        raise SpecError(where, f"'Successful requests' is {requests}: nothing was measured")

    concurrency = _optional(values, ("Maximum request concurrency", "Max request concurrency"), where)
    rate = _optional(values, ("Request rate configured (RPS)", "Traffic request rate"), where)
    run = BenchRun(
        tool=tool,
        requests=requests,
        input_tokens=_per_request(number, "Total input tokens", values, requests, where),
        output_tokens=_per_request(number, "Total generated tokens", values, requests, where),
        ttft_s=number("Mean TTFT (ms)", "Median TTFT (ms)") / 1e3,
        tpot_s=number("Mean TPOT (ms)", "Median TPOT (ms)", "Mean ITL (ms)") / 1e3,
        output_tokens_per_s=number("Output token throughput (tok/s)"),
        concurrency=int(concurrency) if concurrency is not None else None,
        request_rate=rate if concurrency is None else None,
    )
    try:  # the traffic it stands for must be one /v1/serve takes
        validate_traffic(run.traffic)
    except SpecError as err:
        raise SpecError(where, f"{err.field}: {err.rule}") from None
    return run


def _per_request(number, label: str, values: dict, requests: int, where: str) -> int:
    """Tokens a request, on average: at least one, as /v1/serve's traffic takes (a run printing 0 tokens in or out
    was planned as 1 a request, silently, before hostile11)."""
    total = number(label)
    if total < requests:
        raise SpecError(where, f"'{label}' is {values[label]!r} over {requests} requests: under one token a request")
    return round(total / requests)


def _optional(values: dict, labels: tuple[str, ...], where: str) -> float | None:
    for label in labels:
        raw = values.get(label)
        if raw is None or raw.lower() in ("not", "inf", "none"):
            continue
        try:
            value = float(raw)
        except ValueError:
            raise SpecError(where, f"'{label}' is {raw!r}, not a number") from None
        return value if math.isfinite(value) and 0 < value < 1e9 else None
    return None


@dataclass
class ServeCalibration:
    prefill_time_scale: float
    decode_time_scale: float
    rows: list[dict]
    median_error_before: float
    median_error_after: float
    warnings: list[str] = field(default_factory=list)  # a factor held at a bound of SCALE_RANGE, said (hostile11)


def calibrate_serving(model, cluster, traits, pools, options, runs: list[BenchRun]) -> ServeCalibration:
    """The two step-time factors that bring the deployment's predicted TTFT and TPOT closest to ``runs``."""
    before = [_predict(model, cluster, traits, pools, options, run) for run in runs]
    p = d = 1.0
    for _ in range(ROUNDS):
        scaled = replace(options, prefill_time_scale=p, decode_time_scale=d)
        plans = [_predict(model, cluster, traits, pools, scaled, run) for run in runs]
        d = _clamp(d * _gmean([r.tpot_s / pl.tpot_s for r, pl in zip(runs, plans, strict=True) if pl.tpot_s]))
        ttfts = [r.ttft_s / pl.ttft_s for r, pl in zip(runs, plans, strict=True) if pl.ttft_s]
        p = _clamp(p * _gmean(ttfts)) if ttfts else p
    after_options = replace(options, prefill_time_scale=p, decode_time_scale=d)
    after = [_predict(model, cluster, traits, pools, after_options, run) for run in runs]
    rows = [_row(run, b, a) for run, b, a in zip(runs, before, after, strict=True)]
    held = [_held(name, x) for name, x in (("prefill_time_scale", p), ("decode_time_scale", d)) if x in SCALE_RANGE]
    return ServeCalibration(p, d, rows, _median_error(rows, "before"), _median_error(rows, "after"), held)


def _held(name: str, x: float) -> str:
    """What a factor held at a bound of SCALE_RANGE means: the runs ask for more than a step-time factor explains (a
    measured TTFT of 1e-300 ms was fitted as 0.05 without a word before)."""
    low, high = SCALE_RANGE
    return (
        f"{name} is held at its bound {x:g} (factors are kept within {low:g} to {high:g}): the runs measured "
        f"{'faster' if x == low else 'slower'} than any step-time factor in that range explains; check the runs' "
        "deployment and units"
    )


def _predict(model, cluster, traits, pools, options, run: BenchRun):
    return plan_serving(model, cluster, traits, run.traffic, pools, options)


def _row(run: BenchRun, before, after) -> dict:
    measured = {"ttft_s": run.ttft_s, "tpot_s": run.tpot_s, "output_tokens_per_s": run.output_tokens_per_s}

    def side(plan) -> dict:
        got = {"ttft_s": plan.ttft_s, "tpot_s": plan.tpot_s, "output_tokens_per_s": plan.output_tokens_per_s}
        errors = {k: (v / measured[k] - 1 if v is not None and measured[k] else None) for k, v in got.items()}
        return got | {"errors": errors}

    traffic = {"input_tokens": run.input_tokens, "output_tokens": run.output_tokens, "concurrency": run.concurrency,
               "request_rate": run.request_rate, "requests": run.requests}  # fmt: skip
    return {"tool": run.tool, "traffic": traffic, "measured": measured, "before": side(before), "after": side(after)}


def _median_error(rows: list[dict], side: str) -> float:
    """Median |error| over every run's TTFT and TPOT."""
    errors = [abs(r[side]["errors"][k]) for r in rows for k in ("ttft_s", "tpot_s") if r[side]["errors"][k] is not None]
    return statistics.median(errors) if errors else 0.0


def _gmean(ratios: list[float]) -> float:
    ratios = [r for r in ratios if r > 0 and math.isfinite(r)]
    return math.exp(sum(math.log(r) for r in ratios) / len(ratios)) if ratios else 1.0


def _clamp(x: float) -> float:
    return min(SCALE_RANGE[1], max(SCALE_RANGE[0], x))


__all__ = ["BenchRun", "ServeCalibration", "calibrate_serving", "parse_bench"]
