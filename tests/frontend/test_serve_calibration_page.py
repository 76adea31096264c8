"""The Serve card's calibration view in a real browser (frontend/js/serve.js, POST /v1/serve/calibrate): pasted
benchmark output split into runs, the fitted factors and every run before and after, then a plan with them that
stays in the URL; at 1440 and 390."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import expect

from tests.frontend.test_page import VIEWPORTS, browser, make_page, open_page, overflow, url_state  # noqa: F401

pytestmark = pytest.mark.browser
REFERENCE = Path(__file__).resolve().parents[1] / "reference" / "serving"
# vLLM's documented run (Llama 3.1 8B, 10 prompts at once) and a block in SGLang's print format (64 concurrent)
RUNS = [(REFERENCE / name).read_text() for name in ("vllm-bench-serve-docs.txt", "sglang-bench-serving-format.txt")]
REQUEST = {
    "model": {"preset": "llama3-8b"},
    "workload": {"kind": "training", "micro_batch_size": 1, "global_batch_size": 64},
    "parallel": {"tp": 8},
    "cluster": {"preset": "dgx-h100", "num_nodes": 1},
    "options": {"algorithm": "auto"},
}


@VIEWPORTS
def test_serve_calibration_fits_shows_and_plans_with_the_factors(make_page, browser, viewport):  # noqa: F811
    page = make_page(viewport)
    open_page(page, url_state(REQUEST))
    page.select_option("#serve-model", "llama3-8b")
    page.select_option("#serve-engine", "vllm")
    for name, value in {"nodes": "1", "a-tp": "1", "a-workers": "1"}.items():
        page.fill(f"#serve-{name}", value)
    page.fill("#serve-calib-text", "\n".join(RUNS))
    page.click("#serve-calib-run")
    expect(page.locator("#serve-calib-results")).to_be_visible(timeout=60_000)
    body = page.evaluate("window.commplan.serveBody()")
    body.pop("traffic")
    want = httpx.post(page.base + "/v1/serve/calibrate", json=body | {"runs": [{"text": t} for t in RUNS]},
                      timeout=120).json()  # fmt: skip
    c = want["constants"]
    expect(page.locator("#serve-calib-status")).to_contain_text(
        f"Prefill × {c['prefill_time_scale']:.3f}, decode × {c['decode_time_scale']:.3f}"
    )
    rows = page.locator("#serve-calib-table tbody tr")
    expect(rows).to_have_count(2)  # two "Serving Benchmark Result" blocks pasted as one text: two runs
    expect(rows.nth(0)).to_contain_text("vllm")
    expect(rows.nth(1)).to_contain_text("64 concurrent")
    measured = page.evaluate(f"window.commplan.fmtTime({want['rows'][0]['measured']['tpot_s']})")
    expect(rows.nth(0)).to_contain_text(measured)
    assert overflow(page) == 0
    # plan with them: the body carries the factors, the cards show the server's answer to it, the URL keeps them
    page.click("#serve-calib-use")
    expect(page.locator("#serve-calib-active")).to_contain_text(f"decode × {c['decode_time_scale']:.3f}")
    body = page.evaluate("window.commplan.serveBody()")
    assert body["options"]["prefill_time_scale"] == c["prefill_time_scale"]
    assert body["options"]["decode_time_scale"] == c["decode_time_scale"]
    answer = httpx.post(page.base + "/v1/serve", json=body, timeout=60).json()
    tpot = page.evaluate(f"window.commplan.fmtTime({answer['tpot_s']})")
    expect(page.locator("#serve-cards [data-card=tpot] .metric")).to_have_text(tpot, timeout=30_000)
    saved = json.loads(base64.urlsafe_b64decode(page.url.split("#s=")[1] + "==="))
    assert saved["o"]["decode_time_scale"] == c["decode_time_scale"], saved
    fresh = browser.new_context(viewport=viewport).new_page()
    try:
        fresh.goto(page.url)
        expect(fresh.locator("#serve-calib-active")).to_contain_text(f"prefill × {c['prefill_time_scale']:.3f}",
                                                                      timeout=20_000)  # fmt: skip
    finally:
        fresh.context.close()
    # back to the planner's own times
    page.click("#serve-calib-clear")
    assert "decode_time_scale" not in page.evaluate("window.commplan.serveBody()")["options"]
    expect(page.locator("#serve-calib-active")).to_have_text("")


def test_a_factor_held_at_its_bound_is_shown(make_page):  # noqa: F811
    """A run whose TTFT reads 1e-300 ms holds prefill_time_scale at 0.05: the status line says the service's warning."""
    page = make_page()
    open_page(page, url_state(REQUEST))
    page.select_option("#serve-model", "llama3-8b")
    page.select_option("#serve-engine", "vllm")
    for name, value in {"nodes": "1", "a-tp": "1", "a-workers": "1"}.items():
        page.fill(f"#serve-{name}", value)
    page.fill("#serve-calib-text", RUNS[0].replace("Mean TTFT (ms):", "Mean TTFT (ms): 1e-300 #"))
    page.click("#serve-calib-run")
    expect(page.locator("#serve-calib-status")).to_contain_text(
        "Warning: prefill_time_scale is held at its bound 0.05", timeout=60_000
    )
