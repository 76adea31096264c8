"""No warning or refusal of POST /v1/calibrate on the kept profiler traces shows a number in scientific notation
(user14: "kernel_s = 1e-06 is an end of its range (1e-06 .. 1e-05)" from the H200 Llama-3 8B trace, shown on the
page as is). Every constant a message prints goes through trace_fit.constant_text (seconds in human units, fractions
to 4 plain digits). Each trace is posted on an A100 cluster (another GPU's trace: the "fitted for" warnings) and on
its own GPU's (the H200 kernel traces on dgx-h200)."""

from __future__ import annotations

import base64
import re
from pathlib import Path

import pytest

from app.settings import Settings
from planner.trace_fit import constant_text

from .conftest import Api

REFERENCE = Path(__file__).resolve().parents[1] / "reference"
TRACES = sorted((REFERENCE / "traces").glob("*.json.gz")) + sorted((REFERENCE / "kernels").glob("*/trace*.json.gz"))
EXPONENT = re.compile(r"\d[eE][-+]?\d")  # 1e-06, 3.2565e-05, 1E+04


def _messages(answer) -> list[str]:
    """Every warning list's strings anywhere in the answer, and a refusal's messages."""
    out: list[str] = []
    if isinstance(answer, dict):
        for key, value in answer.items():
            if key == "warnings" and isinstance(value, list):
                out += [w for w in value if isinstance(w, str)]
            elif key in ("detail", "message", "rule", "msg") and isinstance(value, str):
                out.append(value)
            else:
                out += _messages(value)
    elif isinstance(answer, list):
        for item in answer:
            out += _messages(item)
    return out


@pytest.fixture(scope="module")
def answers() -> dict[tuple[str, str], tuple[int, list[str]]]:
    api = Api(Settings(deadline_s=120.0))  # a loaded machine must not turn a parse into a 503
    out = {}
    for path in TRACES:
        clusters = ("dgx-a100", "dgx-h200") if "h200" in path.parts else ("dgx-a100",)
        body = base64.b64encode(path.read_bytes()).decode()
        for cluster in clusters:
            r = api.post("/v1/calibrate", json={"cluster": {"preset": cluster}, "trace": body})
            out[path.name, cluster] = (r.status_code, _messages(r.json()))
    api.close()
    return out


def test_every_trace_answers_and_says_something(answers):
    assert len(TRACES) == 15 and len(answers) == len(TRACES) + 3
    assert all(code in (200, 422) for code, _ in answers.values()), answers
    assert sum(len(m) for _, m in answers.values()) > len(answers)  # warnings there to read (a test that can fail)


def test_no_message_prints_an_exponent(answers):
    shown = {key: [m for m in messages if EXPONENT.search(m)] for key, (_, messages) in answers.items()}
    assert {k: v for k, v in shown.items() if v} == {}


def test_constant_text_never_writes_an_exponent():
    """The one home of a constant's text: the ends of the per-kernel range in human units, fractions plain."""
    assert constant_text("kernel_s", 1e-6) == "1.00 us" and constant_text("kernel_s", 1e-5) == "10.0 us"
    assert constant_text("hbm", 1e-5) == "0.00001" and constant_text("hbm", 12345.6) == "12350"
    assert constant_text("hbm", 1.0) == "1" and constant_text("ceiling", {"fp32": 1.0, "tf32": 0.62474}) == (
        "fp32 1, tf32 0.6247"
    )
    assert not any(EXPONENT.search(constant_text("x", v)) for v in (3.2565e-05, 1e-9, 2.5e7, 0.05, 6.4))


def test_constant_text_of_extreme_values_in_words():
    """Review r14d #2: sig3 raised OverflowError on an infinite constant (a 500), and 1e-300 printed 302 characters.
    Not finite in words; past the shown range a bound in words, never an exponent nor a 300-digit decimal."""
    assert constant_text("clock", float("inf")) == "infinite" and constant_text("clock", float("nan")) == "not a number"
    assert constant_text("kernel_s", float("inf")) == "infinite"
    assert constant_text("gemm_ceiling", 1e-300) == "under 0.000001"
    assert constant_text("clock", 1e300) == "more than 1,000,000"
    assert constant_text("kernel_s", 1e300) == "more than 1,000 s" and constant_text("kernel_s", 1e-300) == "< 1 ns"
    assert constant_text("clock", 999_999.0) == "1000000" and constant_text("hbm", 2e-6) == "0.000002"


def test_gemm_durations_under_a_nanosecond_answer_with_the_fit_failed():
    """Review r14d #2's reproduction: the kept H200 Llama-3 8B trace with its 36 GEMM kernels' durations x 1e-9 made
    the clock fit run to inf (_fit_clock) and /v1/calibrate answer 500. Now a 200 whose warning says the clock fit
    failed and which bound it kept."""
    import gzip
    import json

    trace = json.loads(gzip.decompress((REFERENCE / "kernels/h200/trace_llama3_8b.tp1.s4096.json.gz").read_bytes()))
    scaled = 0
    for e in trace["traceEvents"]:
        if (e.get("cat") == "kernel" and "gemm" in e.get("name", "").lower()) or "nvjet" in e.get("name", ""):
            e["dur"] *= 1e-9
            scaled += 1
    assert scaled == 36
    api = Api(Settings(deadline_s=120.0))
    r = api.post("/v1/calibrate", json={"cluster": {"preset": "dgx-h200"}, "trace": json.dumps(trace)})
    api.close()
    assert r.status_code == 200, r.text
    messages = _messages(r.json())
    failed = [m for m in messages if m.startswith("the clock fit failed")]
    assert len(failed) == 1 and "clock = 1.2 kept" in failed[0] and "0.2 .. 1.2" in failed[0], messages
    assert not any(EXPONENT.search(m) for m in messages)
