"""Review r15d's findings on the page (docs/page.md, mend15e): a drawn KV transfer that stayed after a replan and
over a deployment without one (its link saying drawn); the serving tables cut between 601 and 1,024 px; a work-budget
fix that did not fix; blank-box notes wrong for DP and unsaid for the Serve card's pools; refusals naming COMMPLAN_*
settings with raw numbers; a label's hint in a sentence; Plan serving clickable while it plans; -1e400 said too large.
Each test reads the API's own answer for the numbers it checks."""

from __future__ import annotations

import base64
import json
import re

import pytest
from playwright.sync_api import expect

# the shared page fixtures (browser, page) and helpers of the page tests
from tests.frontend.test_page import LLAMA, browser, make_page, open_page, page, url_state, wait_until  # noqa: F401
from tests.frontend.test_round15_user import REFERENCE, api, fmt, serve_idle

pytestmark = pytest.mark.browser


def link_state(page) -> dict:  # noqa: F811
    """The page's link (#s=), decoded (frontend/js/state.js saveUrl)."""
    raw = page.url.split("#s=")[1]
    return json.loads(base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)))


def open_serving(page, scenario="dsv3-pd"):  # noqa: F811
    open_page(page, url_state(LLAMA))
    page.select_option("#serve-scenario", scenario)
    expect(page.locator("#serve-results")).to_be_visible(timeout=60_000)
    serve_idle(page)


def test_a_drawn_transfer_follows_a_replan_and_goes_with_it(page):  # noqa: F811
    """Drawn at 2,000 input tokens (141 MB, 3.47 ms), planned again at 8,000 (562 MB, 12.3 ms): the detail kept the
    old transfer, and a vLLM deployment without one kept DeepSeek's, its link still saying drawn."""
    open_serving(page)
    page.click("#serve-draw")
    expect(page.locator("#detail-title")).to_have_text("Serving: the KV transfer", timeout=30_000)
    page.fill("#serve-isl", "8000")
    page.click("#serve-run")
    answer = api(page, "/v1/serve", page.evaluate("window.commplan.serveBody()"))
    assert answer.status_code == 200, answer.text
    moved = answer.json()["kv_transfer"]
    text = page.locator("#detail-text")
    expect(text).to_contain_text(
        f"KV cache: {fmt(page, 'fmtBytes', moved['bytes_per_request'])} per request", timeout=60_000
    )
    expect(text).to_contain_text(f"{fmt(page, 'fmtTime', moved['time_s'])} a request")
    assert link_state(page)["v"]["drawn"] is True
    page.select_option("#serve-scenario", "llama70b-vllm")
    expect(page.locator("#detail-title")).to_contain_text("Selected call:", timeout=60_000)
    serve_idle(page)
    assert api(page, "/v1/serve", page.evaluate("window.commplan.serveBody()")).json()["kv_transfer"] is None
    assert page.evaluate("window.commplan.state.serveCard.drawn") is False
    assert link_state(page)["v"]["drawn"] is False
    expect(text).not_to_contain_text("KV cache:")


@pytest.mark.parametrize("width", [640, 768, 1024])
def test_the_serving_tables_fit_their_frame_at_every_width(make_page, width):  # noqa: F811
    """The fold of the SLA and pools tables applied under 600 px only: at 768 px the SLA table was 753 px in a 695 px
    frame, at 640 in 567 (TPOT cut), and the two-column page at 1,024 gives it 599. Folded by the frame's width."""
    pg = make_page({"width": width, "height": 900})
    open_serving(pg)
    pg.fill("#serve-sla-ttft", "30000")
    pg.fill("#serve-sla-tpot", "100")
    pg.click("#serve-search-run")
    wait_until(
        pg, "() => !document.getElementById('serve-search-status').textContent.startsWith('Searching')", timeout=120_000
    )
    rows = pg.locator("#serve-search-table tbody tr")
    assert rows.first.is_visible(), pg.locator("#serve-search-status").inner_text()
    best = pg.evaluate("window.commplan.state.serveSearch.results[0]")
    expect(rows.first.locator("td").nth(6)).to_have_text(fmt(pg, "fmtTime", best["answer"]["tpot_s"]))
    for frame, headers in (
        ("#serve-search-table-wrap", ("TTFT", "TPOT")),
        ("#serve-pools", ("Step", "Tokens/s", "Memory")),
    ):
        wrap = pg.locator(frame).locator("xpath=ancestor-or-self::div[contains(@class, 'table-wrap')][1]")
        width_, inside = wrap.evaluate("w => [w.scrollWidth, w.clientWidth]")
        assert width_ <= inside, (width, frame, width_, inside)
        right = wrap.evaluate("w => w.getBoundingClientRect().right")
        for header in headers:
            cell = pg.locator(f"{frame} th", has_text=header).first
            assert cell.evaluate("c => c.getBoundingClientRect().right") <= right + 0.5, (width, frame, header)
    engine = {"sglang": "SGLang", "vllm": "vLLM", "trtllm": "TensorRT-LLM"}[best["engine"]]
    expect(rows.first.locator("td").nth(2)).to_contain_text(engine)


def test_two_costly_settings_are_fixed_together(page):  # noqa: F811
    """Candidates "every algorithm" and Contention "full" on 16,384 GPUs: a button each, and Contention alone was
    refused again (its estimate still over the budget); only Contention had no Go to. One fix resets both, if the API
    plans it; each marked control has its Go to."""
    open_page(page)
    page.select_option("#scenario", "llama405b-16k")
    expect(page.locator("#status")).to_contain_text("16,384 devices", timeout=60_000)
    request = page.evaluate("window.commplan.state.request")
    both = {**request, "options": {**request["options"], "candidates": "all", "contention": "full"}}
    refused = api(page, "/v1/plan", both)
    assert refused.status_code == 422, refused.text
    units = re.search(r"estimated work ([\d,]+) units", refused.json()["detail"][0]["msg"]).group(1)
    # the API's estimate: contention alone reset is still over the budget, so it is no fix to offer
    alone = api(page, "/v1/plan", {**both, "options": {**both["options"], "contention": "neighbourhood"}})
    assert alone.status_code == 422 and "over this service's budget" in alone.json()["detail"][0]["msg"], alone.text
    page.evaluate("document.querySelectorAll('#more-settings details').forEach((d) => { d.open = true; })")
    page.select_option("#f-candidates", "all")
    errors = page.locator("#form-errors")
    expect(errors).to_contain_text("work budget", timeout=60_000)
    page.select_option("#f-contention", "full")
    expect(errors).to_contain_text(f"an estimated {units} units", timeout=60_000)
    expect(errors).to_contain_text("Candidates: what the library picks from and Contention: neighbourhood cost less.")
    assert sorted(page.eval_on_selector_all("[aria-invalid=true]", "els => els.map(e => e.id)")) == [
        "f-candidates",
        "f-contention",
    ]
    fixes = errors.locator("button.fix")
    expect(fixes).to_have_count(1)
    expect(fixes).to_have_text("Candidates: what the library picks from and Contention: neighbourhood")
    page.evaluate("document.querySelectorAll('#more-settings details').forEach((d) => { d.open = false; })")
    errors.get_by_role("button", name="Go to Contention").click()
    expect(page.locator("#f-contention")).to_be_focused()
    expect(errors.get_by_role("button", name="Go to Candidates")).to_be_visible()
    fixed = {**both, "options": {k: v for k, v in both["options"].items() if k not in ("candidates", "contention")}}
    assert api(page, "/v1/plan", fixed).status_code == 200
    fixes.click()
    expect(page.locator("#status")).to_contain_text("16,384 devices", timeout=60_000)
    expect(errors).to_be_hidden()
    assert page.locator("#f-candidates").input_value() == page.locator("#f-contention").input_value() == ""


def test_a_budget_fix_still_over_is_not_offered(page):  # noqa: F811
    """The fix is offered once the API plans the request it makes: here the API is made to refuse that request for
    the budget (the 16,384-GPU refusal's own message), and the card says so, with no button."""
    open_page(page)
    page.select_option("#scenario", "llama405b-16k")
    expect(page.locator("#status")).to_contain_text("16,384 devices", timeout=60_000)
    request = page.evaluate("window.commplan.state.request")
    refused = api(page, "/v1/plan", {**request, "options": {**request["options"], "candidates": "all"}})
    assert refused.status_code == 422, refused.text
    units = re.search(r"estimated work ([\d,]+) units", refused.json()["detail"][0]["msg"]).group(1)
    page.route(
        "**/v1/plan?summary=true",
        lambda route: route.fulfill(status=422, content_type="application/json", body=refused.text),
    )
    page.evaluate("document.querySelectorAll('#more-settings details').forEach((d) => { d.open = true; })")
    page.select_option("#f-candidates", "all")
    errors = page.locator("#form-errors")
    expect(errors).to_contain_text(
        f"With that reset it is still {units} units: fewer ranks per group (fewer nodes) cost less.", timeout=60_000
    )
    expect(errors.locator("button.fix")).to_have_count(0)


def test_blank_notes_for_dp_and_the_pools(page):  # noqa: F811
    """DP blank is "the rest", not a default: "dp omitted, but ... 3*1*4 = 12 (DP is blank: the default was planned)".
    A pool's blank box was sent as 1 unsaid: "ep 32 on a worker of tp*dp = 1*1 = 1 ranks" for an emptied DP."""
    open_page(page, url_state(LLAMA))
    page.fill("#dp", "")
    wait_until(page, "() => window.commplan.state.plan && !window.commplan.state.request.parallel.dp", timeout=30_000)
    page.fill("#tp", "3")
    request = page.evaluate("window.commplan.state.request")
    refused = api(page, "/v1/plan", {**request, "parallel": {**request["parallel"], "tp": 3}})
    assert refused.status_code == 422, refused.text
    msg = refused.json()["detail"][0]["msg"]
    errors = page.locator("#form-errors")
    expect(errors).to_contain_text(msg, timeout=30_000)
    expect(errors).not_to_contain_text("is blank")
    page.fill("#tp", "8")
    expect(errors).to_be_hidden(timeout=30_000)  # planned again: the Serve card's answer is not replanned under it
    page.select_option("#serve-scenario", "dsv3-pd")
    expect(page.locator("#serve-results")).to_be_visible(timeout=60_000)
    serve_idle(page)
    page.fill("#serve-p-dp", "")
    page.click("#serve-run")
    refused = api(page, "/v1/serve", page.evaluate("window.commplan.serveBody()"))
    assert refused.status_code == 422, refused.text
    status = page.locator("#serve-status")
    expect(status).to_contain_text(refused.json()["detail"][0]["msg"], timeout=30_000)
    expect(status).to_contain_text("(Prefill pool DP is blank: 1 was planned)")
    expect(page.locator("#serve-p-dp")).to_have_attribute("aria-invalid", "true")


def test_refusals_say_the_servers_limits_in_words(page):  # noqa: F811
    """Nodes 20000: "... = 160000 devices; this service prices at most 131072 (COMMPLAN_MAX_DEVICES)"; Nodes 1e9:
    "less than or equal to 131072, got 1000000000". The router's and the Serve card's budgets share the rewrite."""
    open_page(page, url_state(LLAMA))
    errors = page.locator("#form-errors")
    for nodes in (20000, 1_000_000_000):
        cluster = {**LLAMA["cluster"], "num_nodes": nodes}
        refused = api(page, "/v1/plan", {**LLAMA, "cluster": cluster})
        assert refused.status_code == 422, refused.text
        numbers = [int(n) for n in re.findall(r"(?<![\w.,])\d{5,}(?![\w.])", refused.json()["detail"][0]["msg"])]
        assert numbers, refused.text
        page.fill("#nodes", str(nodes))
        expect(errors).to_contain_text("cluster", timeout=30_000)
        for n in numbers:
            expect(errors).to_contain_text(f"{n:,}")
        expect(errors).not_to_contain_text("COMMPLAN_")
    said = page.evaluate(
        "async (m) => (await import('/static/js/refusals.js')).plainLimits(m)",
        "torus routing of 2000000 pairs, over the budget of 1,000,000 (COMMPLAN_MAX_ROUTER_PAIRS: a torus of 1,000 "
        "routers); ratio 0.0123456 at 0005973a84f7",
    )
    assert said == (
        "torus routing of 2,000,000 pairs, over the budget of 1,000,000 (this server's limit: a torus of 1,000 "
        "routers); ratio 0.0123456 at 0005973a84f7"
    )


def test_plan_serving_is_disabled_while_it_plans(page):  # noqa: F811
    """style.css said "Plan serving" looked disabled while it ran; it was never disabled, a second click replanned."""
    open_serving(page, "llama70b-vllm")

    held = []  # the answer held back until the button is checked (a route left pending, continued below)
    page.route("**/v1/serve", lambda route: held.append(route))
    page.click("#serve-run")
    wait_until(page, "() => document.getElementById('serve-run').disabled", timeout=30_000)
    assert page.locator("#serve-run").evaluate("b => getComputedStyle(b).opacity") == "0.5"
    for route in held:
        route.continue_()
    expect(page.locator("#serve-run")).to_be_enabled(timeout=60_000)
    expect(page.locator("#serve-status")).to_have_text("")


def test_a_negative_number_past_float64_is_said_too_large_in_magnitude(page):  # noqa: F811
    """ "hidden_size": -1e400 is negative infinity, and read "a number too large for a 64-bit float"."""
    config = json.loads((REFERENCE / "hf_configs" / "llama-3.1-8b-instruct.json").read_text())
    open_page(page, url_state(LLAMA))
    page.check("#model-source-hf")
    page.fill("#hf-config", json.dumps(config)[:-1] + ', "hidden_size": -1e400}')
    errors = page.locator("#form-errors")
    expect(errors).to_contain_text(
        "config.json's hidden_size is a number too large in magnitude for a 64-bit float", timeout=30_000
    )
    assert page.evaluate("document.getElementById('hf-config').getAttribute('aria-invalid')") == "true"
