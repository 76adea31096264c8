"""The model's dropout fields on the page (bias10): the preset's probability as the placeholder, a typed one in the
request and the server's plan for it, the link keeping it, a probability of 1 the server's 422 on its input."""

from __future__ import annotations

import httpx
import pytest
from playwright.sync_api import expect

from tests.frontend.test_model_fields_page import GPT_OSS, planned
from tests.frontend.test_page import browser, make_page, open_page, url_state  # noqa: F401

pytestmark = pytest.mark.browser


def test_dropout_fields_reach_the_plan_and_the_link(make_page):  # noqa: F811
    page = make_page()
    open_page(page, url_state(GPT_OSS))
    page.click("#model-fields > summary")
    # gpt-oss-20b trains with no dropout (Megatron-Bridge's GPTOSSProvider): the preset's 0 is the placeholder
    expect(page.locator("#m-hidden-dropout")).to_have_attribute("placeholder", "0")
    before = page.evaluate("window.commplan.state.plan")
    page.fill("#m-hidden-dropout", "0.1")
    request = planned(page, lambda r: r["model"].get("hidden_dropout") == 0.1)
    assert request["model"] == {"preset": "gpt-oss-20b", "hidden_dropout": 0.1}
    plan = page.evaluate("window.commplan.state.plan")
    want = httpx.post(page.base + "/v1/plan", json=request, timeout=60).json()
    assert plan["step"]["time_s"] == pytest.approx(want["step"]["time_s"])
    # the bias-dropout-adds' masks and the embedding's dropout: longer, and the saved masks: more memory
    assert plan["step"]["compute_s"] > before["step"]["compute_s"]

    page.fill("#m-attention-dropout", "1")
    expect(page.locator("#m-attention-dropout")).to_have_attribute("aria-invalid", "true", timeout=30_000)
    expect(page.locator("#form-errors")).to_contain_text("less than 1")
    page.fill("#m-attention-dropout", "")
    request = planned(page, lambda r: "attention_dropout" not in r["model"] and "hidden_dropout" in r["model"])

    # the link keeps the typed probability
    again = make_page()
    open_page(again, url_state(request))
    expect(again.locator("#m-hidden-dropout")).to_have_value("0.1")
    assert planned(again, lambda r: "hidden_dropout" in r["model"])["model"] == request["model"]
