"""The what-if page in a real browser: Debian's Chromium driven by Playwright against the real server."""

import csv
import io
import re
from pathlib import Path

import pytest
from playwright.sync_api import expect, sync_playwright

pytestmark = pytest.mark.browser
CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
# Headless flags of this workplace: no sandbox as root, and no background traffic to hosts we cannot reach.
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]


@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: run scripts/install-browser.sh (make test does)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser, server):
    context = browser.new_context(viewport={"width": 1440, "height": 1000}, accept_downloads=True)
    pg = context.new_page()
    errors = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.base = server
    yield pg
    context.close()
    assert not errors, errors


def open_page(page, url=""):
    page.goto(page.base + "/" + url)
    expect(page.locator("#ledger tbody tr").first).to_be_visible(timeout=20_000)


def test_first_visit_shows_the_plan(page):
    open_page(page)
    expect(page.locator("#status")).to_contain_text("512 devices")
    assert page.locator("#ledger tbody tr").count() >= 20
    expect(page.locator("#summary")).to_contain_text("Communication per iteration")
    for chart in ("#chart canvas", "#topology canvas", "#explorer canvas"):
        box = page.locator(chart).first.bounding_box()
        assert box and box["width"] > 100 and box["height"] > 100, chart
    expect(page.locator("#detail-text")).to_contain_text("busiest link")
    expect(page.locator("#explorer-note")).to_contain_text("priced together")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "page.png"), full_page=True)


def test_pick_a_scenario(page):
    open_page(page)
    page.select_option("#scenario", "dsv3")
    expect(page.locator("#status")).to_contain_text("2048 devices", timeout=20_000)
    expect(page.locator("#ledger tbody")).to_contain_text("ep.dispatch")


def test_invalid_config_names_the_rule(page):
    open_page(page)
    page.fill("#tp", "16")
    expect(page.locator("#form-errors")).to_contain_text(
        "tp*cp*pp*dp = 16*1*4*16 = 1024 but the cluster has 512", timeout=10_000
    )
    page.fill("#dp", "")  # dp = the rest: 512 / (16*4) = 8; now the model's rule fails
    expect(page.locator("#form-errors")).to_contain_text("num_kv_heads 8 is not divisible by tp 16", timeout=10_000)
    expect(page.locator("#tp")).to_have_attribute("aria-invalid", "true")
    page.fill("#tp", "8")
    expect(page.locator("#form-errors")).to_be_empty(timeout=10_000)


def test_url_restores_the_whole_state(page, browser):
    open_page(page)
    page.fill("#pp", "8")
    page.fill("#dp", "")
    page.fill("#global-batch", "256")
    expect(page.locator("#status")).to_contain_text("32 micro-batches", timeout=20_000)
    page.locator("#ledger tbody tr", has_text="pp.activation").first.click()
    expect(page.locator("#detail-title")).to_contain_text("pp.activation")
    url = page.url
    assert "#s=" in url
    fresh = browser.new_page()
    fresh.goto(url)
    expect(fresh.locator("#ledger tbody tr").first).to_be_visible(timeout=20_000)
    expect(fresh.locator("#pp")).to_have_value("8")
    expect(fresh.locator("#global-batch")).to_have_value("256")
    expect(fresh.locator("#detail-title")).to_contain_text("pp.activation")
    fresh.close()


def test_step_view_runs_the_real_schedule(page):
    open_page(page)
    page.select_option("#step-op", "allreduce")
    page.select_option("#step-alg", "ring")
    page.fill("#step-n", "4")
    page.fill("#step-count", "8")
    page.click("#step-load")
    expect(page.locator("#step-label")).to_have_text("start (0 / 6)")
    for _ in range(6):
        page.click("#step-next")
    expect(page.locator("#step-label")).to_have_text("step 6 / 6")
    cells = page.locator("#step-grid tbody td").all_inner_texts()
    assert len(cells) == 16 and all(c == "0–3" for c in cells)
    page.click("#step-prev")
    expect(page.locator("#step-transfers li")).to_have_count(4)


def test_sort_filter_and_csv(page):
    open_page(page)
    page.get_by_role("button", name=re.compile("^Message")).click()
    first = page.locator("#ledger tbody tr").first.inner_text()
    assert "dp." in first  # the largest message: the gradient reduce-scatter
    page.fill("#filter-text", "pp.")
    expect(page.locator("#ledger tbody tr")).to_have_count(2)
    with page.expect_download() as download:
        page.click("#download")
    rows = list(csv.reader(io.StringIO(Path(download.value.path()).read_text())))
    assert rows[0][0] == "Call" and len(rows) == 3


def test_keyboard_selects_rows(page):
    open_page(page)
    row = page.locator("#ledger tbody tr", has_text="dp.grads").first
    row.focus()
    page.keyboard.press("Enter")
    expect(page.locator("#detail-title")).to_contain_text("dp.grads")
    expect(page.locator("#topology-note")).to_contain_text("Edge colour")


def test_server_unreachable_is_said(page):
    open_page(page)
    page.route("**/v1/plan", lambda route: route.abort())
    page.fill("#micro-batch", "2")
    expect(page.locator("#banner")).to_contain_text("Cannot reach the commplan server", timeout=10_000)


def test_narrow_window_stacks_form_over_results(browser, server):
    narrow = browser.new_page(viewport={"width": 600, "height": 900})
    narrow.goto(server + "/")
    expect(narrow.locator("#ledger tbody tr").first).to_be_visible(timeout=20_000)
    form, results = narrow.locator("#config").bounding_box(), narrow.locator("#results").bounding_box()
    assert results["y"] >= form["y"] + form["height"] - 1
    assert form["width"] <= 600
    narrow.close()
