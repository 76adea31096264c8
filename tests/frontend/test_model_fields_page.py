"""The model's own fields on the page (frontend/js/model.js, issue 21 item 7), in a real browser: each blank field
shows the preset's value; a typed field reaches POST /v1/plan as a model override and the plan changes to the
server's answer for that request; an edited MoE block is sent whole (the preset's values filling the rest); a bad
value is the server's 422 marked on its input; the edits survive the shareable URL; another preset clears them."""

from __future__ import annotations

import time

import httpx
import pytest
from playwright.sync_api import expect

from tests.frontend.test_page import LLAMA, VIEWPORTS, browser, make_page, open_page, overflow, url_state  # noqa: F401

pytestmark = pytest.mark.browser


def planned(page, test) -> dict:
    """Wait until the page has planned a request for which ``test(request)`` holds; the request."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        s = page.evaluate(
            "(() => { const s = window.commplan.state; return {r: s.request, stale: s.stale, plan: !!s.plan}; })()"
        )
        if s["r"] and not s["stale"] and s["plan"] and test(s["r"]):
            return s["r"]
        page.wait_for_timeout(100)
    raise AssertionError(f"no plan for the request wanted; last {s}")


@VIEWPORTS
def test_model_fields_edit_the_plan(make_page, viewport):  # noqa: F811
    page = make_page(viewport)
    open_page(page, url_state(LLAMA))
    page.click("#model-fields > summary")
    layers = page.locator("#m-num-layers")
    expect(layers).to_have_attribute("placeholder", "80")  # Llama-3 70B, from GET /v1/presets/models
    expect(page.locator("#m-num-kv-heads")).to_have_attribute("placeholder", "8")
    expect(page.locator("#m-moe-num-experts")).to_have_attribute("placeholder", "none")
    before = page.evaluate("window.commplan.state.plan")
    assert "num_layers" not in page.evaluate("window.commplan.state.request.model")

    layers.fill("40")
    planned(page, lambda r: r["model"].get("num_layers") == 40)
    request = page.evaluate("window.commplan.state.request")
    assert request["model"] == {"preset": "llama3-70b", "num_layers": 40}
    plan = page.evaluate("window.commplan.state.plan")
    want = httpx.post(page.base + "/v1/plan", json=request, timeout=60).json()
    assert plan["params_total"] == want["params_total"] < before["params_total"] / 1.9  # 70.6B -> 36.3B
    assert (
        plan["step"]["time_s"] == pytest.approx(want["step"]["time_s"])
        and plan["step"]["time_s"] < before["step"]["time_s"]
    )
    expect(page.locator("#model-fields-count")).to_have_text("(1 set)")

    # the link holds the edit: a fresh page shows it typed and plans it
    again = make_page(viewport)
    open_page(again, url_state(request))
    expect(again.locator("#m-num-layers")).to_have_value("40")
    planned(again, lambda r: r["model"].get("num_layers") == 40)

    # a bad value: the server's 422, on its input (the first page in front again: the fresh page above took the
    # front, and a background page's 250 ms plan timer may be throttled)
    page.bring_to_front()
    page.fill("#m-num-kv-heads", "3")
    expect(page.locator("#m-num-kv-heads")).to_have_attribute("aria-invalid", "true", timeout=30_000)
    expect(page.locator("#form-errors")).to_contain_text("not divisible by num_kv_heads 3")
    page.fill("#m-num-kv-heads", "")
    planned(page, lambda r: r["model"].get("num_layers") == 40 and "num_kv_heads" not in r["model"])

    # another preset: the edits over the last one go; an MoE field sends the whole block
    page.select_option("#model-preset", "mixtral-8x7b")
    expect(layers).to_have_value("")
    expect(layers).to_have_attribute("placeholder", "32")
    expect(page.locator("#m-moe-top-k")).to_have_attribute("placeholder", "2")
    planned(page, lambda r: r["model"] == {"preset": "mixtral-8x7b"})
    mixtral = page.evaluate("window.commplan.state.plan")
    page.fill("#m-moe-top-k", "4")
    planned(page, lambda r: r["model"].get("moe", {}).get("top_k") == 4)
    request = page.evaluate("window.commplan.state.request")
    preset = httpx.get(page.base + "/v1/presets/models", timeout=30).json()["mixtral-8x7b"]["moe"]
    assert request["model"]["moe"] == {**preset, "top_k": 4}
    plan = page.evaluate("window.commplan.state.plan")
    assert plan["params_total"] == mixtral["params_total"]  # the same experts, each token to two more of them
    assert plan["step"]["compute_s"] > mixtral["step"]["compute_s"]
    assert plan["step"]["time_s"] > mixtral["step"]["time_s"]
    # a list field (Qwen3's mlp_only_layers) and a choice
    page.fill("#m-moe-mlp-only-layers", "0, 1")
    page.select_option("#m-norm", "layernorm")
    request = planned(page, lambda r: r["model"].get("norm") == "layernorm")
    assert request["model"]["moe"]["mlp_only_layers"] == [0, 1] and request["model"]["moe"]["top_k"] == 4
    assert overflow(page) == 0


GPT_OSS = {
    "model": {"preset": "gpt-oss-20b"},
    "workload": {"kind": "training", "micro_batch_size": 1, "global_batch_size": 16},
    "parallel": {"ep": 8, "dp": 16, "zero_stage": 1},
    "cluster": {"preset": "dgx-h100", "num_nodes": 2},
    "options": {"algorithm": "auto", "links_per_call": 24},
}


def test_none_sends_an_explicit_null(make_page):  # noqa: F811
    """A nullable field's "none" box (embed7): ticked, the request sends null and the server clears the preset's
    value (app/convert.py NULLABLE): GPT-OSS 20B without its sliding window attends fully (a longer step), without
    YaRN runs plain RoPE; "No MoE" sends moe: null, a dense model. The plan is the server's answer for that
    request; the link keeps the nulls; another preset clears them. 1440 px."""
    page = make_page()
    open_page(page, url_state(GPT_OSS))
    page.click("#model-fields > summary")
    expect(page.locator("#m-sliding-window")).to_have_attribute("placeholder", "128")
    before = page.evaluate("window.commplan.state.plan")

    page.check("#m-sliding-window-none")
    expect(page.locator("#m-sliding-window")).to_be_disabled()
    # the preset's full_attention_interval 2 needs a window: the server's 422, marked on that field
    expect(page.locator("#m-full-attention-interval")).to_have_attribute("aria-invalid", "true", timeout=30_000)
    expect(page.locator("#form-errors")).to_contain_text("needs a sliding_window")
    page.check("#m-full-attention-interval-none")
    request = planned(page, lambda r: "full_attention_interval" in r["model"])
    nulls = {"sliding_window": None, "full_attention_interval": None}
    assert request["model"] == {"preset": "gpt-oss-20b", **nulls}
    plan = page.evaluate("window.commplan.state.plan")
    want = httpx.post(page.base + "/v1/plan", json=request, timeout=60).json()
    assert plan["step"]["time_s"] == pytest.approx(want["step"]["time_s"])
    assert plan["step"]["compute_s"] > before["step"]["compute_s"]  # every layer attends to all 4,096 keys
    assert plan["params_total"] == before["params_total"]

    page.check("#m-rope-scaling-none")
    request = planned(page, lambda r: "rope_scaling" in r["model"])
    assert request["model"] == {"preset": "gpt-oss-20b", **nulls, "rope_scaling": None}
    expect(page.locator("#model-fields-count")).to_have_text("(3 set)")
    page.uncheck("#m-rope-scaling-none")
    planned(page, lambda r: "rope_scaling" not in r["model"] and "sliding_window" in r["model"])

    # the link keeps the null: a fresh page shows the box ticked and plans the same request
    again = make_page()
    open_page(again, url_state(page.evaluate("window.commplan.state.request")))
    expect(again.locator("#m-sliding-window-none")).to_be_checked()
    expect(again.locator("#m-sliding-window")).to_be_disabled()
    planned(again, lambda r: r["model"] == {"preset": "gpt-oss-20b", **nulls})

    # the whole MoE block: a dense model, the block's own fields disabled
    page.fill("#ep", "1")  # EP needs experts (a 422 at parallel.ep otherwise)
    planned(page, lambda r: r["parallel"]["ep"] == 1)
    page.check("#m-moe-none")
    expect(page.locator("#m-moe-top-k")).to_be_disabled()
    request = planned(page, lambda r: r["model"].get("moe", 0) is None)
    assert request["model"] == {"preset": "gpt-oss-20b", **nulls, "moe": None}
    dense = page.evaluate("window.commplan.state.plan")
    assert dense["params_total"] == httpx.post(page.base + "/v1/plan", json=request, timeout=60).json()["params_total"]
    assert dense["params_total"] < before["params_total"] / 4  # 32 experts a layer gone (20.9B -> 2.4B)

    # another preset: the boxes go with the other edits
    page.select_option("#model-preset", "llama3-8b")
    expect(page.locator("#m-sliding-window-none")).not_to_be_checked()
    expect(page.locator("#m-moe-none")).not_to_be_checked()
    planned(page, lambda r: r["model"] == {"preset": "llama3-8b"})
    assert overflow(page) == 0
