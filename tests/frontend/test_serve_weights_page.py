"""The Serve card's weight formats in a real browser (frontend/js/serve.js WEIGHT_FORMATS, options.weight_dtype of
POST /v1/serve): nvfp4 and mxfp4 are offered with what they need in their tooltips; mxfp4 on GPT-OSS reaches the
request and the cards show the server's answer; a format the engine or GPU lacks shows the server's 422 reason;
the choice is kept in the URL; at 1440 and 390."""

from __future__ import annotations

import base64
import json

import httpx
import pytest
from playwright.sync_api import expect

from tests.frontend.test_page import LLAMA, VIEWPORTS, browser, make_page, open_page, overflow, url_state  # noqa: F401

pytestmark = pytest.mark.browser


@VIEWPORTS
def test_serve_weight_formats(make_page, browser, viewport):  # noqa: F811
    page = make_page(viewport)
    open_page(page, url_state({**LLAMA, "cluster": {"preset": "dgx-h100", "num_nodes": 1}, "parallel": {"tp": 8}}))
    values = page.locator("#serve-weights option").evaluate_all("os => os.map((o) => o.value)")
    assert values == ["bf16", "fp8", "nvfp4", "mxfp4"], values
    mxfp4 = (
        "MXFP4 experts (GPT-OSS): the MoE experts at 0.53125 B a weight (E2M1 + one E8M0 scale per 32), dequantized to "
        "bf16 math; the rest bf16; vLLM and SGLang, MoE models, compute capability 8.0+"
    )
    nvfp4 = (
        "NVFP4 checkpoint: every linear weight 0.5625 B (E2M1 + one E4M3 scale per 16), fp4 GEMMs; Blackwell (fp4 "
        "tensor cores) only"
    )
    expect(page.locator("#serve-weights option[value=mxfp4]")).to_have_attribute("title", mxfp4)
    expect(page.locator("#serve-weights option[value=nvfp4]")).to_have_attribute("title", nvfp4)
    for name, value in {"model": "gpt-oss-120b", "engine": "vllm", "weights": "mxfp4"}.items():
        page.select_option(f"#serve-{name}", value)
    fields = {"nodes": "1", "concurrency": "64", "a-tp": "1", "a-workers": "1", "a-dp": "1", "a-ep": "1"}
    for name, value in fields.items():
        page.fill(f"#serve-{name}", value)
    page.click("#serve-run")
    expect(page.locator("#serve-results")).to_be_visible(timeout=60_000)
    body = page.evaluate("window.commplan.serveBody()")
    assert body["options"] == {"weight_dtype": "mxfp4"}, body["options"]
    want = httpx.post(page.base + "/v1/serve", json=body, timeout=60).json()
    assert want["fits"]
    tpot = page.evaluate(f"window.commplan.fmtTime({want['tpot_s']})")
    expect(page.locator("#serve-cards [data-card=tpot] .metric")).to_have_text(tpot, timeout=30_000)
    expect(page.locator("#serve-status")).to_have_text("")
    assert overflow(page) == 0
    # TensorRT-LLM's MXFP4 path is not priced: the server's 422 reason, in words
    page.select_option("#serve-engine", "trtllm")
    page.click("#serve-run")
    expect(page.locator("#serve-status")).to_contain_text("not priced for TensorRT-LLM", timeout=30_000)
    # nvfp4 needs Blackwell: on H100 the reason names the compute capability
    page.select_option("#serve-weights", "nvfp4")
    page.click("#serve-run")
    expect(page.locator("#serve-status")).to_contain_text("compute capability >= 10.0", timeout=30_000)
    page.select_option("#serve-weights", "mxfp4")
    saved = json.loads(base64.urlsafe_b64decode(page.url.split("#s=")[1] + "==="))
    assert saved["o"] == {"weight_dtype": "mxfp4"}, saved
    fresh = browser.new_context(viewport=viewport).new_page()
    try:
        fresh.goto(page.url)
        expect(fresh.locator("#ledger tbody tr").first).to_be_visible(timeout=20_000)
        expect(fresh.locator("#serve-weights")).to_have_value("mxfp4")
    finally:
        fresh.context.close()
