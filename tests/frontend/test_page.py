"""The what-if page in a real browser: Debian's Chromium driven by Playwright against the real server, at
1440x900 and 390x844. Views whose server blocks may be absent (step timeline, memory, search) are also driven
from stubbed responses (route interception). Screenshots per view go to test-artifacts/ (gitignored)."""

from __future__ import annotations

import base64
import csv
import io
import json
import math
import re
import time
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import expect, sync_playwright

from app.schemas.search import reason_words

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
WIDE, PHONE = {"width": 1440, "height": 900}, {"width": 390, "height": 844}
VIEWPORTS = pytest.mark.parametrize("viewport", [WIDE, PHONE], ids=["1440", "390"])
XSS = '<img src=x onerror="window.__xss=(window.__xss||0)+1">'
LLAMA = {
    "model": {"preset": "llama3-70b"},
    "workload": {"kind": "training", "micro_batch_size": 1, "global_batch_size": 1024},
    "parallel": {"tp": 8, "pp": 4, "dp": 16, "zero_stage": 1, "sequence_parallel": True},
    "cluster": {"preset": "dgx-h100", "num_nodes": 64},
    "options": {"algorithm": "auto", "links_per_call": 24},
}


@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: run scripts/install-browser.sh (make test does)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


def new_page(browser, server, viewport=WIDE):
    context = browser.new_context(viewport=viewport, accept_downloads=True)
    pg = context.new_page()
    pg.errors = []
    pg.on("pageerror", lambda e: pg.errors.append(str(e)))
    pg.on(
        "console", lambda m: pg.errors.append(m.text) if m.type == "error" and "Failed to load" not in m.text else None
    )
    pg.base = server
    return pg


@pytest.fixture
def page(browser, server):
    pg = new_page(browser, server)
    yield pg
    pg.context.close()
    assert not pg.errors, pg.errors


@pytest.fixture
def make_page(browser, server):
    pages = []

    def make(viewport=WIDE):
        pg = new_page(browser, server, viewport)
        pages.append(pg)
        return pg

    yield make
    for pg in pages:
        pg.context.close()
        assert not pg.errors, pg.errors


def open_page(page, url=""):
    target = page.base + "/" + url
    if page.url.split("#")[0] == target.split("#")[0]:
        # the page already: a new hash makes it load itself again (main.js hashchange), the same URL needs a reload;
        # either way its old document must not answer the waits below
        with page.expect_event("load", timeout=30_000):
            page.reload() if page.url == target else page.goto(target)
    else:
        page.goto(target)
    expect(page.locator("#ledger tbody tr").first).to_be_visible(timeout=20_000)
    expect(page.locator("#results")).not_to_have_class(re.compile("stale"), timeout=10_000)


def wait_until(page, predicate: str, arg=None, timeout: float = 20_000):
    """Poll ``predicate`` (a JS expression or function, with ``arg``) every 100 ms until it is truthy; its last value.
    Not page.wait_for_function: its polling builds the predicate with new Function inside the page, which the page's
    CSP (no 'unsafe-eval') refuses whenever the first try is false (a slow plan under load); page.evaluate is not
    subject to the CSP."""
    deadline = time.monotonic() + timeout / 1000
    while True:
        value = page.evaluate(predicate, arg)
        if value or time.monotonic() > deadline:
            assert value, f"still false after {timeout / 1000:.0f} s: {predicate}"
            return value
        page.wait_for_timeout(100)


def shot(page, name):
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def shot_of(page, selector, name):
    ARTIFACTS.mkdir(exist_ok=True)
    page.locator(selector).screenshot(path=str(ARTIFACTS / f"{name}.png"))


def overflow(page) -> int:
    """How many px the document is wider than the window (0: no sideways scroll)."""
    return page.evaluate("document.documentElement.scrollWidth - window.innerWidth")


def url_state(request: dict, selected: dict | None = None) -> str:
    raw = json.dumps({"r": request, "c": selected}).encode()
    return "#s=" + base64.urlsafe_b64encode(raw).decode().rstrip("=")


# ---- stubs for the v1.1 blocks (step, memory) and the search -------------------------------------------------------
def step_block(pp: int, microbatches: int, fwd=0.004, bwd=0.008) -> dict:
    """A 1F1B-shaped timeline: compute events per stage, a pp stream and a dp stream."""
    events = []
    for s in range(pp):
        t = s * fwd
        for m in range(microbatches):
            events.append(
                {"stage": s, "stream": "compute", "name": f"F{m}", "microbatch": m, "start_s": t, "end_s": t + fwd}
            )
            events.append(
                {
                    "stage": s,
                    "stream": "pp",
                    "name": f"send F{m}",
                    "microbatch": m,
                    "start_s": t + fwd,
                    "end_s": t + fwd + 0.0005,
                }
            )
            t += fwd
        for m in range(microbatches):
            events.append(
                {"stage": s, "stream": "compute", "name": f"B{m}", "microbatch": m, "start_s": t, "end_s": t + bwd}
            )
            t += bwd
        events.append(
            {"stage": s, "stream": "dp", "name": "dp.grads", "microbatch": None, "start_s": t, "end_s": t + 0.18}
        )
    end = max(e["end_s"] for e in events)
    return {
        "time_s": end,
        "compute_s": microbatches * (fwd + bwd),
        "exposed_comm_s": 0.18,
        "bubble_s": (pp - 1) * (fwd + bwd),
        "mfu": 0.412,
        "tokens_per_s": 1_234_567.0,
        "timeline": events,
    }


def memory_block(pp: int, over_stage: int | None = 0) -> dict:
    cap = 80 * 10**9
    stages = []
    for s in range(pp):
        act = 70 * 10**9 if s == over_stage else 20 * 10**9 - s * 10**9
        parts = {
            "params_bytes": 4_400_000_000,
            "grads_bytes": 4_400_000_000,
            "optimizer_bytes": 3_300_000_000,
            "activations_bytes": act,
            "buffers_bytes": 1_000_000_000,
        }
        stages.append({"stage": s, "param_count": 2_200_000_000, **parts, "peak_bytes": sum(parts.values())})
    return {"capacity_bytes": cap, "fits": over_stage is None, "per_stage": stages}


def stub_plan_blocks(page, microbatches=64, over_stage=0, extra=None):
    """Answer /v1/plan with the real plan plus step and memory blocks."""

    def handle(route):
        response = route.fetch()
        body = response.json()
        if response.status == 200:
            pp = len(body["totals"]["per_stage"])
            body["step"] = step_block(pp, microbatches)
            body["memory"] = memory_block(pp, over_stage)
            if extra:
                extra(body)
        route.fulfill(response=response, json=body)

    page.route("**/v1/plan", handle)


def search_hit(tp, pp, dp, step_s, peak, mb=1, recompute="selective"):
    parallel = {
        "tp": tp,
        "pp": pp,
        "dp": dp,
        "cp": 1,
        "ep": 1,
        "zero_stage": 1,
        "sequence_parallel": True,
        "pipeline_schedule": "1f1b",
        "framework": "megatron",
    }
    per_stage = [
        {
            "stage": s,
            "param_count": 1,
            "params_bytes": 1,
            "grads_bytes": 1,
            "optimizer_bytes": 1,
            "activations_bytes": peak - 4,
            "buffers_bytes": 0,
            "peak_bytes": peak,
        }
        for s in range(pp)
    ]
    return {
        "parallel": parallel,
        "micro_batch_size": mb,
        "activation_recompute": recompute,
        "step": {
            "time_s": step_s,
            "compute_s": step_s * 0.8,
            "exposed_comm_s": step_s * 0.1,
            "bubble_s": step_s * 0.1,
            "mfu": 0.4,
            "tokens_per_s": 1e6,
            "timeline": [],
        },
        "memory": {"capacity_bytes": 80 * 10**9, "fits": True, "per_stage": per_stage},
    }


SEARCH_RESULTS = [
    search_hit(8, 4, 16, 9.10, 71 * 10**9),
    search_hit(8, 8, 8, 9.40, 52 * 10**9),
    search_hit(4, 8, 16, 9.90, 66 * 10**9),  # dominated: slower than #2 and bigger
    search_hit(8, 16, 4, 10.5, 38 * 10**9),
]


def stub_search(page, results=SEARCH_RESULTS, seen=None):
    lines = [
        {
            "type": "progress",
            "done": 1000,
            "total": 4000,
            "evaluated": 800,
            "feasible": 200,
            "elapsed_s": 0.3,
            "best": {
                "step_time_s": 9.4,
                "parallel": results[0]["parallel"],
                "micro_batch_size": 1,
                "activation_recompute": "none",
            },
        },
        {
            "type": "progress",
            "done": 4000,
            "total": 4000,
            "evaluated": 3100,
            "feasible": 900,
            "elapsed_s": 1.2,
            "best": None,
        },
        {
            "type": "result",
            "evaluated": 3100,
            "feasible": 900,
            "bounded": 0,
            "elapsed_s": 1.25,
            "space_size": 4000,  # evaluated + ruled out (not memory); feasible = evaluated - memory
            "pruned": {"memory": 2200, "parallel.tp": 900},
            "pruned_examples": {
                "memory": "stage 0 needs 90 GB",
                "parallel.tp": "num_kv_heads 8 is not divisible by tp 16",
            },
            # refused before the walk, outside space_size (counts12)
            "pruned_up_front": {"parallel.pipeline_schedule": 500},
            "pruned_up_front_examples": {
                "parallel.pipeline_schedule": "framework 'deepspeed' runs only the 1f1b pipeline schedule(s), got "
                "'interleaved' at pp 2"
            },
            "pruned_reasons": {
                k: reason_words(k) for k in ("memory", "parallel.tp", "parallel.pipeline_schedule")
            },  # the server's words
            "results": results,
        },
    ]

    def handle(route):
        if seen is not None:
            seen.append(route.request.post_data_json)
        text = "\n".join(json.dumps(x) for x in lines) + "\n"
        route.fulfill(status=200, content_type="application/x-ndjson", body=text)

    page.route("**/v1/search*", handle)


# ---- the page against the real server ----------------------------------------------------------------------------
def test_first_visit_shows_the_plan(page):
    open_page(page)
    expect(page.locator("#status")).to_contain_text("512 devices")
    assert page.locator("#ledger tbody tr").count() >= 20
    expect(page.locator("#summary")).to_contain_text("Stage 3 calls if serialised")
    expect(page.locator("#summary")).to_contain_text("not a step time")
    for chart in ("#chart canvas", "#topology canvas", "#explorer canvas"):
        box = page.locator(chart).first.bounding_box()
        assert box and box["width"] > 100 and box["height"] > 100, chart
    expect(page.locator("#detail-text")).to_contain_text("busiest link")
    expect(page.locator("#explorer-note")).to_contain_text("priced together", timeout=10_000)
    # "Not shown" lists exactly the curves without a price at any size (it used to list every curve with a note)
    explored = httpx.post(
        page.base + "/v1/plan/explore",
        json={"request": page.evaluate("window.commplan.state.request"), "call": "tp.attn.qkv", "stage": 0},
    ).json()
    missing = {s["algorithm"] for s in explored["series"] if all(t is None for t in s["time_s"])}
    assert missing and len(missing) < len(explored["series"])
    expect(page.locator("#explorer")).to_have_attribute("data-call", "tp.attn.qkv (stage 0)")
    # the groups priced are the neighbourhood of group 0, out of all the call's groups (it said "32 groups
    # priced together" of a call with 64)
    assert explored["groups_priced"] < explored["num_groups"]
    expect(page.locator("#explorer-note")).to_contain_text(
        f"{explored['groups_priced']} of its {explored['num_groups']} groups priced together"
    )
    not_shown = page.locator("#explorer-note").inner_text().partition("Not shown: ")[2]
    for s in explored["series"]:
        listed = re.search(rf"(^|; ){re.escape(s['algorithm'])}( \(|;|\.$)", not_shown) is not None
        assert listed == (s["algorithm"] in missing), (s["algorithm"], not_shown)
    # views of blocks the server does not send stay out of the way; those it sends are drawn
    blocks = page.evaluate("Object.keys(window.commplan.state.plan)")
    for block, card in (("step", "#timeline-card"), ("memory", "#memory-card")):
        if block in blocks:
            expect(page.locator(card)).to_be_visible()
            assert page.locator(f"{card} canvas").first.bounding_box()["height"] >= 180
        else:
            expect(page.locator(card)).to_be_hidden()
    shot(page, "page-1440")


def test_pick_a_scenario(page):
    open_page(page)
    page.select_option("#scenario", "dsv3")
    expect(page.locator("#status")).to_contain_text("2,048 devices", timeout=20_000)
    expect(page.locator("#ledger tbody")).to_contain_text("ep.dispatch")


@VIEWPORTS
def test_no_sideways_scroll_and_key_columns_fit(make_page, viewport):
    page = make_page(viewport)
    open_page(page)
    expect(page.locator("#explorer-note")).to_contain_text("priced together", timeout=10_000)
    assert overflow(page) <= 0
    wide_elements = page.evaluate(
        """() => [...document.querySelectorAll('body *')].filter((e) => {
             const r = e.getBoundingClientRect();
             return r.width > 0 && r.right > window.innerWidth + 1 && !e.closest('.table-wrap, .step-grid');
           }).map((e) => e.id || e.className || e.tagName).slice(0, 5)"""
    )
    assert wide_elements == []
    wrap = page.locator("#ledger").locator("xpath=..")
    sideways = wrap.evaluate("w => w.scrollWidth - w.clientWidth")
    headers = page.locator("#ledger thead th:visible").all_inner_texts()
    if viewport is WIDE:
        assert sideways <= 0  # every key column visible without scrolling
        for key in ("Call", "Message", "Time / call", "Time / iter"):
            assert any(h.startswith(key) for h in headers), headers
    else:
        assert sideways <= 0 and len(headers) >= 4
        for key in ("Call", "Op", "Message", "Time / iter"):
            assert any(h.startswith(key) for h in headers), headers
    shot(page, f"page-{viewport['width']}")


def test_1280_shows_key_columns(make_page):
    page = make_page({"width": 1280, "height": 800})
    open_page(page)
    wrap = page.locator("#ledger").locator("xpath=..")
    assert wrap.evaluate("w => w.scrollWidth - w.clientWidth") <= 0
    assert overflow(page) <= 0
    page.check("#all-columns")  # the rest on demand (then the table may scroll inside its frame)
    expect(page.locator("#ledger thead th", has_text="Busiest link")).to_be_visible()


@VIEWPORTS
def test_invalid_config_error_on_first_screen_and_results_marked_stale(make_page, viewport):
    page = make_page(viewport)
    open_page(page)
    page.fill("#tp", "16")
    errors = page.locator("#form-errors")
    expect(errors).to_contain_text("tp*cp*pp*dp = 16*1*4*16 = 1024 but the cluster has 512", timeout=10_000)
    box = errors.bounding_box()
    assert box["y"] + 40 < viewport["height"], box  # in the first screen
    expect(page.locator("#tp")).to_have_attribute("aria-invalid", "true")
    expect(page.locator("#results")).to_have_class(re.compile("stale"))
    expect(page.locator("#stale-badge")).to_contain_text("last valid configuration")
    opacity = page.locator("#summary").evaluate("e => Number(getComputedStyle(e).opacity)")
    assert opacity < 0.5
    shot(page, f"error-{viewport['width']}")
    page.fill("#dp", "")  # dp = the rest: 512 / (16*4) = 8; now the model's rule fails
    expect(errors).to_contain_text("num_kv_heads 8 is not divisible by tp 16", timeout=10_000)
    page.locator("#form-errors button.link").first.click()
    expect(page.locator("#tp")).to_be_focused()
    page.fill("#tp", "8")
    expect(errors).to_be_hidden(timeout=10_000)
    expect(page.locator("#results")).not_to_have_class(re.compile("stale"), timeout=10_000)
    expect(page.locator("#stale-badge")).to_be_hidden()


def test_pending_plan_is_dimmed_until_the_answer(page):
    open_page(page)

    def slow(route):
        time.sleep(1.0)
        route.continue_()

    page.route("**/v1/plan", slow)
    page.fill("#global-batch", "512")
    expect(page.locator("#stale-badge")).to_contain_text("replanning")
    expect(page.locator("#results")).to_have_class(re.compile("stale"))
    expect(page.locator("#status")).to_contain_text("32 micro-batches", timeout=20_000)
    expect(page.locator("#results")).not_to_have_class(re.compile("stale"))


def test_explorer_never_shows_another_calls_chart(page):
    """A slow answer for the first call arrives after the second was selected: it is dropped."""
    open_page(page)
    expect(page.locator("#explorer-note")).to_contain_text("priced together", timeout=10_000)

    def handle(route):
        if route.request.post_data_json["call"] == "dp.grads":
            time.sleep(1.5)
        route.continue_()

    page.route("**/v1/plan/explore", handle)
    page.locator("#ledger tbody tr", has_text="dp.grads").first.click()
    expect(page.locator("#explorer-title")).to_contain_text("dp.grads")
    assert page.locator("#explorer").get_attribute("data-call") == ""  # cleared while pricing
    page.locator("#ledger tbody tr", has_text="pp.activation").first.click()
    expect(page.locator("#explorer")).to_have_attribute("data-call", re.compile("^pp.activation"), timeout=10_000)
    page.wait_for_timeout(1800)  # the late dp.grads answer has arrived by now
    expect(page.locator("#explorer")).to_have_attribute("data-call", re.compile("^pp.activation"))
    expect(page.locator("#explorer-title")).to_contain_text("pp.activation")


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


def test_calibrate_from_an_nccl_tests_log_then_plan_with_it(page, reference):
    """A new user's own nccl-tests output: fitted on the form's cluster, every row shown in human units, then
    planned with; the constants survive a reload of the URL and a bad log names its file."""
    log = reference("nccl_logs/sample_h100_2node.txt")
    open_page(page)
    expect(page.locator("#calib-active")).to_contain_text("default constants")
    page.set_input_files("#calib-files", str(log))
    page.click("#calib-run")
    expect(page.locator("#calib-results")).to_be_visible(timeout=20_000)
    status = page.locator("#calib-status").inner_text()
    # the log's 20 rows (16 allreduce, 4 allgather) on 2 nodes; the fit moves the inter-node latency scale
    expect(page.locator("#calib-table tbody tr")).to_have_count(20)
    expect(page.locator("#calib-warnings")).to_be_hidden()  # an H100 log on an H100 cluster
    assert "latency_scale.inter_node" in status and "allreduce on 2 nodes × 8" in status, status
    before, after = (float(x) for x in re.findall(r"([\d.]+)% (?:with the defaults|fitted)", status))
    assert after < before
    first = page.locator("#calib-table tbody tr").first.locator("td").all_inner_texts()
    assert first[0] == f"{log.name}:40" and first[3] == "8 B" and re.fullmatch(r"\d+(\.\d+)? KB/s", first[4]), first
    assert not re.search(r"\de[-+]?\d", page.locator("#calib-card").inner_text())
    step_before = page.evaluate("window.commplan.state.plan.step.time_s")
    page.click("#calib-use")
    # since the nccl merge (09685a3: the log's NCCL 2.21.5 is priced with its own 2.21 tables) POST /v1/calibrate
    # also keeps the second bandwidth stage; since nccl2's merge (10880a0: the Simple pipeline fill) it keeps the
    # per-hop network latency too (median error 27.3% -> 2.9%): efficiency.nic 1.005, latency_scale.inter_node
    # 1.54 and network_latency_s.ib 1.23 ns, in the server's order (checked against POST /v1/calibrate); the card
    # writes seconds as every time on the page ("1.23 ns", it said "0.00123 µs"). Since nvl5 (NCCL's latency split
    # by term) a multi-node log fits one per-hop network latency: on IB, whose plugin adds none, the network's scale
    # (efficiency.nic 1.007, latency_scale.inter_node 1.22; median error 4.9% -> 2.8%, POST /v1/calibrate)
    active = page.locator("#calib-active")
    expect(active).to_contain_text("calibrated constants: efficiency.nic 1.01")
    expect(active).to_contain_text("latency_scale.inter_node 1.22")
    expect(page.locator("#results")).not_to_have_class(re.compile("stale"), timeout=20_000)
    calibration = page.evaluate("window.commplan.state.request.cluster.calibration")
    assert set(calibration) == {"efficiency", "latency_scale"}
    assert set(calibration["efficiency"]) == {"nic"} and set(calibration["latency_scale"]) == {"inter_node"}
    assert page.evaluate("window.commplan.state.plan.step.time_s") != step_before  # priced with the fit
    page.reload()
    expect(page.locator("#calib-active")).to_contain_text("calibrated constants", timeout=20_000)
    page.click("#calib-clear")
    expect(page.locator("#calib-active")).to_contain_text("default constants")
    page.set_input_files("#calib-files", [])
    page.fill("#calib-text", "# nothing here\nhello")
    page.click("#calib-run")
    bad_log = "pasted log (text): no nccl-tests result rows"
    expect(page.locator("#calib-status")).to_contain_text(bad_log, timeout=10_000)
    expect(page.locator("#calib-results")).to_be_hidden()
    # an A100 log fitted on this H100 cluster: said, with the file's name
    a100 = next(log.parent.glob("02_allreduce_2x8_*.txt"))
    page.fill("#calib-text", "")
    page.set_input_files("#calib-files", str(a100))
    page.click("#calib-run")
    warning = f"{a100.name}: ran on NVIDIA A100-SXM4-80GB, but the cluster's GPU is H100 SXM5 80GB"
    expect(page.locator("#calib-warnings")).to_contain_text(warning, timeout=20_000)


def test_calibrate_a_bare_table_with_the_op_and_ranks_fields(page, reference):
    """Issue 23 item 7: an all_gather table pasted without its banner ('none' redop, like alltoall's) is refused
    naming both tests; chosen in the Test field it is fitted as an allgather on 8 ranks (the Ranks field sent as
    each log's ranks: a wrong one is the parser's 422, naming the rows' sizes)."""
    text = reference("nccl_logs/12_allgather_1x8_github-com-nvidia-nccl-tests-issue-212-s.txt").read_text()
    bare = "\n".join(line for line in text.splitlines() if line[:1] == " " and line.split()[0].isdigit())
    open_page(page)
    page.fill("#calib-text", bare)
    page.fill("#calib-nodes", "1")
    page.click("#calib-run")
    expect(page.locator("#calib-status")).to_contain_text("all_gather_perf or alltoall_perf", timeout=20_000)
    page.select_option("#calib-op", "all_gather_perf")
    page.click("#calib-run")
    expect(page.locator("#calib-results")).to_be_visible(timeout=20_000)
    expect(page.locator("#calib-status")).to_contain_text("allgather on 1 node × 8")
    page.fill("#calib-ranks", "4")
    page.click("#calib-run")
    expect(page.locator("#calib-status")).to_contain_text("pasted log", timeout=20_000)
    expect(page.locator("#calib-results")).to_be_hidden()


def test_calibrate_from_a_profiler_trace(page, reference):
    """A gzipped torch.profiler trace (HTA's sampled rank 0, tests/reference/traces): sent as base64, its kernels
    by class, the fitted compute constants and its 10 SendRecv kernels over 2 steps shown."""
    trace = reference("traces/hta_sampled_rank-0.json.gz")
    open_page(page)
    page.set_input_files("#calib-trace", str(trace))
    page.click("#calib-run")
    summary = page.locator("#calib-trace-summary")
    expect(summary).to_be_visible(timeout=30_000)
    text = summary.inner_text()
    assert "GPU not recorded, 2 steps" in text and "sendrecv: 5.00/step" in text and "gemm_ceiling.tf32" in text, text
    assert not re.search(r"\de[-+]?\d", text)
    # no nccl-tests rows; the fitted compute constants plan as the answer's cluster carries them (issue 20)
    expect(page.locator("#calib-table")).to_be_hidden()
    expect(page.locator("#calib-use")).to_be_enabled()
    page.click("#calib-use")
    active = page.locator("#calib-active")
    # since calib5 the GEMM's fixed cost is fitted too and comes first, in the server's order
    expect(active).to_contain_text("calibrated constants: kernels.gemm_fixed_s 6.00 µs", timeout=20_000)
    # tf32 has no measured ceiling, so the fit sets its ceiling at the H100's sustained clock: 0.189 at 0.852, 0.194
    # at 0.825 (sus12: the trace pins clock x ceiling, x 1.03 where its GEMMs are compute-bound)
    expect(active).to_contain_text("kernels.gemm_ceiling.fp32 1.00, kernels.gemm_ceiling.tf32 0.194")
    calibration = page.evaluate("window.commplan.state.request.cluster.calibration")
    assert set(calibration) == {"kernels"}
    # since calib8 the host's time per launch too: 195 gaps between host-bound launches, a median 74 us
    assert set(calibration["kernels"]) == {"gemm_ceiling", "gemm_fixed_s", "hbm", "kernel_s", "host_launch_s"}
    assert calibration["kernels"]["host_launch_s"] == 74e-6
    assert "Host: 233 of 1,154 launches found the GPU idle, 195 gaps read, median 74.0 µs a launch." in text


def test_sort_and_filter(page):
    open_page(page)
    page.get_by_role("button", name=re.compile("^Message")).click()
    first = page.locator("#ledger tbody tr").first.inner_text()
    assert "dp." in first  # the largest message: the gradient reduce-scatter
    page.fill("#filter-text", "pp.")
    # pipeline sends are priced per stage class since the exports merge (38d3eae, bdb01aa): on 64 DGX nodes the
    # stage-1 send (node 16 -> 32) crosses into the next scalable unit's leaves (0.3 us more), so pp.activation
    # and pp.activation_grad are two rows each (stages 0,2 | 1 and 1,3 | 2), not one
    expect(page.locator("#ledger tbody tr")).to_have_count(4)
    names = page.locator("#ledger tbody tr").evaluate_all("(rows) => rows.map((r) => r.dataset.name)")
    assert sorted(names) == ["pp.activation"] * 2 + ["pp.activation_grad"] * 2, names


def test_keyboard_selects_rows(page):
    open_page(page)
    row = page.locator("#ledger tbody tr", has_text="dp.grads").first
    row.focus()
    page.keyboard.press("Enter")
    expect(page.locator("#detail-title")).to_contain_text("dp.grads")
    expect(page.locator("#topology-note")).to_contain_text("The first group spans 16 nodes")


def test_a_slow_start_says_loading_and_the_urls_calibration_at_once(page):
    """The page reads its URL before the server's lists come (main.js start()): a link's calibrated constants are
    said at once, and until /v1/presets/models answers the form says "Loading…" (it was blank: the CI flake of
    round 9 left it so for 20 s); once it answers, the form is filled and the plan priced with those constants."""
    held = []
    page.route("**/v1/presets/models", lambda route: held.append(route))
    calibration = {"efficiency": {"nic": 0.9}, "latency_scale": {"inter_node": 1.5}}
    request = {**LLAMA, "cluster": {**LLAMA["cluster"], "calibration": calibration}}
    page.goto(page.base + "/" + url_state(request))
    expect(page.locator("#calib-active")).to_have_text(
        "The plan is priced with calibrated constants: efficiency.nic 0.900, latency_scale.inter_node 1.50."
    )
    for select in ("#scenario", "#model-preset", "#cluster-preset"):
        expect(page.locator(select)).to_have_text("Loading…")
    expect(page.locator("#config")).to_have_attribute("aria-busy", "true")
    expect(page.locator("#status")).to_have_text("Loading…")
    for _ in range(100):  # the held GET reaches its handler while the page waits (Playwright's dispatch)
        if held:
            break
        page.wait_for_timeout(100)
    assert len(held) == 1
    expect(page.locator("#model-preset")).to_have_text("Loading…")  # still, with the models' GET held
    held[0].continue_()
    expect(page.locator("#ledger tbody tr").first).to_be_visible(timeout=20_000)
    expect(page.locator("#config")).to_have_attribute("aria-busy", "false")
    expect(page.locator("#model-preset")).to_have_value("llama3-70b")
    assert page.evaluate("window.commplan.state.request.cluster.calibration") == calibration
    expect(page.locator("#calib-active")).to_contain_text("latency_scale.inter_node 1.50")


def test_a_server_gone_at_start_is_said_in_the_form(page):
    page.route("**/v1/presets/clusters", lambda route: route.abort())
    page.goto(page.base + "/")
    expect(page.locator("#banner")).to_contain_text("Cannot reach the commplan server", timeout=10_000)
    expect(page.locator("#scenario")).to_have_text("not loaded: the server is unreachable")
    page.errors.clear()  # the aborted request logs a network error


def test_server_unreachable_is_said_and_results_marked_stale(page):
    open_page(page)
    page.route("**/v1/plan", lambda route: route.abort())
    page.fill("#micro-batch", "2")
    expect(page.locator("#banner")).to_contain_text("Cannot reach the commplan server", timeout=10_000)
    expect(page.locator("#stale-badge")).to_contain_text("could not be reached")
    page.errors.clear()  # the aborted request logs a network error


# ---- units ------------------------------------------------------------------------------------------------------
def test_human_units_everywhere(page):
    open_page(page)
    text = page.locator("body").inner_text()
    assert not re.search(r"\d(\.\d+)?e[-+]?\d", text), re.findall(r"\S*\de[-+]?\d\S*", text)[:5]
    assert "0.00 us" not in text and "0.00 µs" not in text
    cells = page.locator("#ledger tbody tr").first.locator("td").all_inner_texts()
    assert any(re.fullmatch(r"\d{1,3}(\.\d+)? (B|KB|MB|GB|TB)", c) for c in cells), cells
    assert any(re.fullmatch(r"\d{1,3}(\.\d+)? (ns|µs|ms|s)", c) for c in cells), cells
    got = page.evaluate(
        """async () => {
          const f = await import('/static/js/format.js');
          return [f.fmtBytes(8), f.fmtBytes(1.53e12), f.fmtBytes(999600), f.fmtBytes(134217728),
                  f.fmtTime(4.1e-5), f.fmtTime(0.9996), f.fmtTime(3.2e-10), f.axisTime(0), f.axisTime(2e-7),
                  f.axisBytes(0), f.fmtCount(1234567), f.fineAxisTime([8.14, 8.15])(8.142),
                  f.fineAxisTime([0.1, 2])(1.2345)];
        }"""
    )
    assert got == [
        *["8 B", "1.53 TB", "1.00 MB", "134 MB", "41.0 µs", "1.00 s", "< 1 ns", "0", "200 ns", "0", "1.23 M"],
        *["8.142 s", "1.23 s"],  # ticks 10 ms apart on an 8 s axis need 4 digits; a wide range keeps 3
    ]
    # the chart axes use the same formatters: read the live option of the by-parallelism chart
    labels = page.evaluate(
        """() => { const c = window.commplan.state.charts.chart; const f = c.getOption().yAxis[0].axisLabel.formatter;
                   return [0, 0.5, 1.5, 2e-4].map(f); }"""
    )
    assert labels == ["0", "500 ms", "1.5 s", "200 µs"]


# ---- exports ------------------------------------------------------------------------------------------------------
def test_export_buttons_download_every_format(page):
    open_page(page)
    texts = {}
    for fmt in ("json", "csv", "nccl-tests", "simai", "aicb", "trace"):
        with page.expect_download() as download:
            page.click(f"[data-export='{fmt}']")
        texts[fmt] = Path(download.value.path()).read_text()
        if fmt in ("simai", "aicb"):  # one rank of the busiest stage, said in the note
            expect(page.locator("#export-note")).to_contain_text("stage 3")
    plan = json.loads(texts["json"])
    assert plan["world_size"] == 512
    rows = list(csv.DictReader(io.StringIO(texts["csv"])))
    assert len(rows) == len(plan["calls"]) and rows[0]["stages (space-separated)"] == "0 1 2 3"
    assert rows[0]["num_groups"] == "64"
    assert texts["nccl-tests"].startswith("#!/bin/sh") and "mpirun -np" in texts["nccl-tests"]
    assert texts["simai"].startswith("HYBRID_TRANSFORMER_FWD_IN_BCKWD model_parallel_NPU_group: 8 ep: 1 pp: 4 ")
    assert texts["aicb"].splitlines()[0].startswith("comm_type,comm_group,comm_group_size,msg_size")
    assert texts["aicb"].rstrip().endswith("CommType.epoch_end,None,None,0,,None,None,,None,None,None,1")
    assert json.loads(texts["trace"])["displayTimeUnit"] == "ms"
    expect(page.locator("#export-note")).to_contain_text("ui.perfetto.dev")


# ---- security: nothing a user (or a server echoing a user) writes runs ----------------------------------------
def assert_no_script_ran(page):
    page.wait_for_timeout(500)
    assert page.evaluate("window.__xss") is None
    assert page.locator("img").count() == 0  # the payload was never parsed as markup


def test_xss_in_url_state_and_pasted_config(make_page):
    request = json.loads(json.dumps(LLAMA))
    request["model"]["preset"] = XSS
    request["cluster"] = {"preset": XSS, "num_nodes": 64, "name": XSS}
    request["options"]["algorithm"] = XSS
    page = make_page()
    page.goto(page.base + "/" + url_state(request, {"name": XSS, "stage": 0}))
    expect(page.locator("#form-errors")).to_be_visible(timeout=20_000)
    expect(page.locator("#form-errors")).to_contain_text("<img src=x")  # shown as text
    assert_no_script_ran(page)
    # a pasted config.json with the payload in keys and values
    page.select_option("#cluster-preset", "dgx-h100")
    page.check("#model-source-hf")
    page.fill("#hf-config", json.dumps({XSS: XSS, "num_hidden_layers": XSS, "hidden_size": 4096}))
    expect(page.locator("#form-errors")).to_contain_text("hf_config", timeout=10_000)
    page.fill("#hf-config", "{" + XSS)  # not JSON: the parser's message quotes it
    expect(page.locator("#form-errors")).to_contain_text("not valid JSON", timeout=10_000)
    assert_no_script_ran(page)
    page.errors.clear()  # 422s log as failed resources


def test_xss_in_every_string_the_server_echoes(make_page):
    """A server (or proxy) that echoes user strings into every field of the plan: all of them render as text."""

    def poison(body):
        body["cluster"]["name"] = XSS
        body["warnings"] = [XSS]
        for c in body["calls"]:
            c["name"] = XSS + c["name"]
            c["source"] = XSS
            c["algorithm"] = c["algorithm"]
            c["placement"]["bottleneck_link"] = XSS
            for link in c["placement"]["links"]:
                link["label"] = XSS
            c["op"] = XSS + c["op"]
        for e in body["step"]["timeline"]:
            e["name"] = XSS

    page = make_page()
    stub_plan_blocks(page, microbatches=8, extra=poison)
    refusal = {"detail": [{"loc": ["body"], "msg": XSS, "type": "x"}]}
    page.route("**/v1/plan/explore", lambda route: route.fulfill(status=422, json=refusal))
    stub_search(page, results=[{**SEARCH_RESULTS[0], "activation_recompute": XSS}])
    page.goto(page.base + "/")
    expect(page.locator("#ledger tbody tr").first).to_be_visible(timeout=20_000)
    expect(page.locator("#warnings")).to_contain_text("<img src=x")
    expect(page.locator("#explorer-note")).to_contain_text("<img src=x", timeout=10_000)
    page.click("#search-run")
    expect(page.locator("#search-table tbody")).to_contain_text("<img src=x", timeout=10_000)
    # chart tooltips are HTML in ECharts: show a tooltip on every item of every chart, each with a planted string
    shown = page.evaluate(
        """async () => {
          let found = 0;
          for (const [id, chart] of Object.entries(window.commplan.state.charts)) {
            const series = chart.getOption().series;
            for (let s = 0; s < series.length; s++) for (let i = 0; i < 4; i++) {
              chart.dispatchAction({ type: "showTip", seriesIndex: s, dataIndex: i });
              await new Promise((r) => setTimeout(r, 20));
              const tips = [...document.querySelectorAll(`#${id} > div`)].map((d) => d.textContent);
              if (tips.some((t) => t.includes("<img src=x"))) found++;
            }
          }
          return found;
        }"""
    )
    assert shown > 0  # tooltips did show the payload, as text
    assert_no_script_ran(page)
    page.errors.clear()


def test_strict_csp_script_src_self(make_page):
    """Under Content-Security-Policy script-src 'self' (no inline script) the page still plans and charts."""
    page = make_page()
    violations = []
    page.on("console", lambda m: violations.append(m.text) if "Content Security Policy" in m.text else None)

    def with_csp(route):
        response = route.fetch()
        policy = (
            "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
            "object-src 'none'; base-uri 'none'"
        )
        headers = {**response.headers, "content-security-policy": policy}
        route.fulfill(response=response, headers=headers)

    page.route(re.compile(r".*/(#.*)?$"), with_csp)
    open_page(page)
    expect(page.locator("#explorer-note")).to_contain_text("priced together", timeout=10_000)
    assert page.locator("#chart canvas").count() == 1
    assert violations == []


# ---- step, memory and search views from stubbed responses -----------------------------------------------------
@VIEWPORTS
def test_step_cards_timeline_and_memory_from_the_v11_blocks(make_page, viewport):
    page = make_page(viewport)
    stub_plan_blocks(page, microbatches=64, over_stage=0)
    open_page(page)
    summary = page.locator("#summary")
    for label in ("Step time", "MFU", "Tokens / s", "Exposed communication", "calls if serialised"):
        expect(summary).to_contain_text(label)
    expect(summary.locator("[data-card=mfu] .metric")).to_have_text("41.2%")
    expect(summary.locator("[data-card=tokens] .metric")).to_have_text("1.23 M")
    expect(summary.locator("[data-card=exposed] .metric")).to_have_text("180 ms")
    expect(page.locator("#timeline-card")).to_be_visible()
    expect(page.locator("#timeline-note")).to_contain_text("12 lanes")  # 4 stages x compute, pp, dp
    box = page.locator("#timeline canvas").first.bounding_box()
    assert box["height"] >= 180 and box["width"] > 300
    expect(page.locator("#memory-card")).to_be_visible()
    expect(page.locator("#memory-note")).to_contain_text("Does not fit: stage 0 peaks at 83.1 GB of 80.0 GB")
    expect(page.locator("#memory-note")).to_have_class(re.compile("bad"))
    # the memory bars of stage 0 carry the red outline; the capacity line is drawn
    option = page.evaluate("window.commplan.state.charts.memory.getOption()")
    assert option["series"][0]["data"][0]["itemStyle"]["borderColor"] == "#c0392b"
    assert option["series"][0]["data"][1]["itemStyle"] == {}
    assert option["series"][-1]["markLine"]["data"][0]["yAxis"] == 80 * 10**9
    assert overflow(page) <= 0
    w = viewport["width"]
    shot_of(page, "#summary", f"cards-{w}")
    shot_of(page, "#timeline-card", f"timeline-{w}")
    shot_of(page, "#memory-card", f"memory-{w}")


def test_memory_that_fits_is_said(make_page):
    page = make_page()
    stub_plan_blocks(page, microbatches=8, over_stage=None)
    open_page(page)
    expect(page.locator("#memory-note")).to_contain_text("Fits: the largest peak is 33.1 GB of 80.0 GB")


def test_timeline_aggregates_hundreds_of_microbatches(make_page):
    page = make_page()
    stub_plan_blocks(page, microbatches=1024)
    open_page(page)
    expect(page.locator("#timeline-note")).to_contain_text("drawn as one block", timeout=10_000)
    blocks = page.evaluate("window.commplan.state.charts.timeline.getOption().series[1].data.length")
    assert blocks < 4000


@VIEWPORTS
def test_find_a_layout_table_pareto_load_and_compare(make_page, viewport):
    page = make_page(viewport)
    stub_plan_blocks(page, microbatches=8, over_stage=None)
    sent = []
    stub_search(page, seen=sent)
    open_page(page)
    page.click("#search-run")
    expect(page.locator("#search-table tbody tr")).to_have_count(4, timeout=10_000)
    # the counts agree with the progress bar (4,000 of 4,000) and with each other, the reasons in words
    status = page.locator("#search-status").inner_text()
    assert status.startswith(
        "4,000 layouts in 1.25 s: 3,100 evaluated (memory and step time), 900 ruled out before "
        'timing (900 by the tensor-parallel size, e.g. "num_kv_heads 8 is not divisible by tp 16")'
    ), status
    assert "Of the evaluated, 900 fit and 2,200 need more memory than the device has less 5% headroom." in status
    assert (
        "\"); 500 more refused up front, not in the 4,000, by the pipeline schedule, e.g. \"framework 'deepspeed' "
        "runs only the 1f1b pipeline schedule(s), got 'interleaved' at pp 2\". Of the evaluated" in status
    )
    assert "parallel.tp" not in status and "memory 2" not in status
    assert page.locator("#search-bar").evaluate("e => parseFloat(e.style.width)") == 100
    body = sent[0]
    assert body["model"] == {"preset": "llama3-70b"} and body["workload"]["global_batch_size"] == 1024
    assert body["constraints"]["framework"] == "megatron" and body["top_k"] == 20
    # a 5% memory headroom by default, stated on the control
    assert body["constraints"]["memory_headroom"] == 0.05
    expect(page.locator("label[for=search-headroom]")).to_contain_text("default 5")
    # 0 is sent as 0 (the server's default would be 5%), and the status says no headroom
    page.fill("#search-headroom", "0")
    page.click("#search-run")
    expect(page.locator("#search-status")).to_contain_text("need more memory than the device has.", timeout=10_000)
    assert sent[-1]["constraints"]["memory_headroom"] == 0
    page.fill("#search-headroom", "5")
    front = page.evaluate("window.commplan.state.charts['search-chart'].getOption().series[1].data")
    assert front == [[38 * 10**9, 10.5], [52 * 10**9, 9.4], [71 * 10**9, 9.1]]  # #3 is dominated
    assert page.locator("#search-table tbody tr").nth(2).locator(".tag").count() == 0
    if viewport is WIDE:
        shot_of(page, "#search-card", "search-1440")
    # compare two results side by side
    page.locator("#search-table tbody tr").nth(0).locator("input").check()
    page.locator("#search-table tbody tr").nth(1).locator("input").check()
    page.click("#compare-run")
    expect(page.locator("#compare-body")).to_contain_text("Step time", timeout=20_000)
    expect(page.locator("#compare-body")).to_contain_text("Ledger differences")
    expect(page.locator("#compare-body .compare-legend")).to_contain_text(
        "A = #1 TP8 PP4 DP16 ZeRO-1 SP · B = #2 TP8 PP8 DP8 ZeRO-1 SP"
    )
    # MFU differences in percentage points ("MFU -0.309%" meant points), and no unchanged "+0 s" ledger rows
    mfu = page.locator("#compare-body tr", has=page.locator("th", has_text=re.compile("^MFU$"))).locator("td").nth(2)
    expect(mfu).to_have_text(re.compile(r"^([+−]\d[\d.]* pp|0 pp|< 0\.01 pp)$"))
    ledger = page.locator("#compare-body table").nth(1).locator("tbody tr")
    for i in range(ledger.count()):
        a, b, d = (ledger.nth(i).locator("td").nth(k).inner_text() for k in (1, 2, 3))
        assert a != b and d not in ("+0 s", "−0 s"), (a, b, d)
    assert overflow(page) <= 0
    shot_of(page, "#search-card", f"search-compare-{viewport['width']}")
    # a click loads the layout into the form and replans
    page.locator("#search-table tbody tr").nth(1).locator("td").nth(1).click()
    expect(page.locator("#pp")).to_have_value("8")
    expect(page.locator("#dp")).to_have_value("8")
    expect(page.locator("#status")).to_contain_text("512 devices", timeout=20_000)
    expect(page.locator("#results")).not_to_have_class(re.compile("stale"), timeout=10_000)


def test_search_progress_bar_moves_while_streaming(make_page):
    """A slow stream: the bar shows done/total and the best layout so far before the result arrives."""
    page = make_page()
    open_page(page)
    page.evaluate(
        """() => {
          const real = window.fetch;
          window.fetch = (url, init) => {
            if (!String(url).includes('/v1/search')) return real(url, init);
            const enc = new TextEncoder();
            const stream = new ReadableStream({ async start(c) {
              c.enqueue(enc.encode(JSON.stringify({type: 'progress', done: 250, total: 1000, evaluated: 200,
                feasible: 50, elapsed_s: 0.2, best: {step_time_s: 9.4, parallel: {tp: 8, pp: 8, dp: 8},
                micro_batch_size: 1, activation_recompute: 'none'}}) + '\\n'));
              await new Promise((r) => setTimeout(r, 1500));
              c.enqueue(enc.encode(JSON.stringify({type: 'result', evaluated: 10, feasible: 0, elapsed_s: 1.5,
                pruned: {}, results: []}) + '\\n'));
              c.close();
            }});
            return Promise.resolve(new Response(stream, {headers: {'content-type': 'application/x-ndjson'}}));
          };
        }"""
    )
    page.click("#search-run")
    expect(page.locator("#search-status")).to_contain_text("250 of 1,000 layouts")
    expect(page.locator("#search-status")).to_contain_text("best so far TP8 PP8 DP8, 9.40 s")
    assert page.locator("#search-bar").evaluate("e => parseFloat(e.style.width)") == 25
    expect(page.locator("#search-progress")).to_have_attribute("aria-valuenow", "25")
    expect(page.locator("#search-status")).to_contain_text("No layout fits", timeout=10_000)


def test_topology_of_a_group_over_many_nodes_is_aggregated(page):
    """dp.grads spans 16 nodes: node boxes and rail bundles; a click expands a node, the background goes back."""
    open_page(page)
    page.locator("#ledger tbody tr", has_text="dp.grads").first.click()
    note = page.locator("#topology-note")
    expect(note).to_contain_text("The first group spans 16 nodes")
    expect(note).to_contain_text("each rail gathers its NIC links")
    sel = page.evaluate("window.commplan.state.selected")
    call = page.evaluate(
        "(s) => window.commplan.state.plan.calls.find((c) => c.name === s.name && c.stages.includes(s.stage))", sel
    )
    devices = call["placement"]["group_devices"]  # 16 devices, one per node, stride 8
    nodes = sorted({d // 8 for d in devices})
    counts = page.evaluate(
        "(() => { const cy = window.commplan.state.cy; return [cy.nodes('.box').length, cy.nodes('.rail').length,"
        " cy.nodes('.box')[0].data('label'), cy.nodes('.rail')[0].data('label')]; })()"
    )
    # rail 0's bundle shows the busiest of its NIC links the plan reports (NIC index a*8 + 0 on node a)
    nic_links = [lk for lk in call["placement"]["links"] if lk["family"] in ("nic_up", "nic_down")]
    rail0 = max((lk["utilisation"] for lk in nic_links if lk["index"] % 8 == 0), default=0.0)
    assert rail0 > 0.5  # the gradient reduction across 16 nodes is NIC-bound: its rails are busy most of the call
    assert counts == [16, 8, f"node {nodes[0]}\n1/8", f"rail 0\n{math.floor(100 * rail0 + 0.5)}% busy"]
    shot_of(page, "#topology", "topology-aggregate-1440")
    page.evaluate(f"window.commplan.state.cy.getElementById('b{nodes[3]}').emit('tap')")
    expect(note).to_contain_text(f"Node {nodes[3]}, one of the 16 nodes")
    member = [d for d in devices if d // 8 == nodes[3]]
    assert page.evaluate("window.commplan.state.cy.nodes('.member').map((n) => n.id())") == [f"d{member[0]}"]
    page.evaluate("window.commplan.state.cy.emit('tap')")
    expect(note).to_contain_text("The first group spans 16 nodes")
    page.locator("#ledger tbody tr", has_text="tp.attn.qkv").first.click()  # one node: the detailed view
    expect(note).to_contain_text("Edge colour")


def test_topology_of_a_multi_node_call_is_the_servers_subgraph(page):
    """pp.activation joins 2 nodes: the page draws exactly the vertices and edges POST /v1/topology answers
    (one per directed link, with the plan's link ids), and the bottleneck NIC link in red (≥ 90% busy)."""
    open_page(page)
    # stage 0's send (node 0 -> 16, one scalable unit): since the exports merge (bdb01aa) pp sends are one row per
    # stage class, and the first row by time is stage 1's (node 16 -> 32, two units: 16 leaves, 128 edges)
    page.locator('#ledger tbody tr[data-name="pp.activation"][data-stage="0"]').click()
    expect(page.locator("#topology-note")).to_contain_text("Edge colour")
    sel = page.evaluate("window.commplan.state.selected")
    call = page.evaluate(
        "(s) => window.commplan.state.plan.calls.find((c) => c.name === s.name && c.stages.includes(s.stage))", sel
    )
    cluster = page.evaluate("window.commplan.state.plan.cluster")
    body = {"cluster": cluster, "devices": call["placement"]["group_devices"]}
    view = page.request.post(page.base + "/v1/topology", data=body).json()
    assert call["placement"]["nodes_per_group"] == 2 and not view["aggregated"]
    drawn = page.evaluate(
        "(() => { const cy = window.commplan.state.cy; return [cy.nodes().map((n) => n.id()).sort(),"
        " cy.edges().map((e) => [e.id(), e.source().id(), e.target().id()]).sort()]; })()"
    )
    assert drawn[0] == sorted(v["id"] for v in view["vertices"])
    assert drawn[1] == sorted([e["id"], e["source"], e["target"]] for e in view["edges"])
    assert len(view["edges"]) == 2 * 48 + 8 * 2  # 2 DGX nodes (see tests/collectives/test_view.py), 8 rail leaves
    bottleneck = call["placement"]["links"][0]
    assert bottleneck["utilisation"] >= 0.9 and bottleneck["family"] == "nic_up"
    (edge,) = [e for e in view["edges"] if e["links"] == [bottleneck["id"]]]
    assert edge["label"] == bottleneck["label"]
    colour = page.evaluate(
        "(id) => { const e = window.commplan.state.cy.getElementById(id);"
        " return [e.data('u'), e.style('line-color')]; }",
        edge["id"],
    )
    assert colour == [bottleneck["utilisation"], "rgb(192,57,43)"]  # utilColor(u >= 0.9) = #c0392b
    shot_of(page, "#topology", "topology-detail-1440")


@VIEWPORTS
def test_serve_view_plans_a_deployment_and_finds_one_under_an_sla(make_page, viewport):
    """The Serve card: the form's model and cluster served by a disaggregated deployment, its cards, pools and
    KV-transfer links; then the SLA search's table and Pareto chart, and a click that loads a result."""
    page = make_page(viewport)
    request = {**LLAMA, "cluster": {"preset": "dgx-h100", "num_nodes": 2}, "parallel": {"tp": 8, "dp": 2}}
    open_page(page, url_state(request))
    page.select_option("#serve-mode", "disaggregated")
    page.fill("#serve-p-tp", "4")
    page.fill("#serve-p-workers", "2")
    page.click("#serve-run")
    expect(page.locator("#serve-results")).to_be_visible(timeout=30_000)
    cards = page.locator("#serve-cards")
    for label in ("TTFT", "TPOT", "Tokens/s per GPU", "KV cache", "KV transfer"):
        expect(cards).to_contain_text(label)
    answer = httpx.post(page.base + "/v1/serve", json=page.evaluate("window.commplan.serveBody()")).json()
    expect(cards.locator("[data-card=tpot] .metric")).to_have_text(
        page.evaluate(f"window.commplan.fmtTime({answer['tpot_s']})")
    )
    assert page.locator("#serve-pools tbody tr").count() == 2
    expect(page.locator("#serve-links")).to_contain_text("nic")
    page.fill("#serve-sla-tpot", "60")
    page.click("#serve-search-run")
    expect(page.locator("#serve-search-results")).to_be_visible(timeout=60_000)
    assert page.locator("#serve-search-table tbody tr").count() >= 1
    assert page.locator("#serve-pareto canvas").first.bounding_box()["width"] > 150
    expect(page.locator("#serve-search-status")).to_contain_text("bound by")
    # the search streamed its progress (NDJSON, as Find a layout does): the last line says every deployment is done
    progress = page.evaluate("window.commplan.state.serveSearchProgress")
    assert progress["done"] == progress["total"] > 0 and progress["feasible"] >= 1
    expect(page.locator("#serve-search-status")).to_contain_text(f"{progress['total']:,} deployments tried")
    page.locator("#serve-search-table tbody tr").first.click()
    expect(page.locator("#serve-status")).to_have_text("", timeout=30_000)
    assert overflow(page) == 0
    text = page.locator("#serve-card").inner_text()
    assert not re.search(r"\de[+-]?\d", text), "scientific notation on the Serve card"
    shot_of(page, "#serve-card", f"serve-{viewport['width']}")


@VIEWPORTS
def test_serve_two_batch_overlap_and_redundant_experts(make_page, browser, viewport):
    """The Serve card's two-batch overlap and EPLB redundant-expert controls (options.two_batch_overlap,
    options.redundant_experts of POST /v1/serve): blank is the engine's default (off, 0), each change reaches the
    request, replans the answer on show (its TPOT and step time are the server's for that body, and differ from
    the default's: DeepSeek-V3 on SGLang, one TP1 DP32 EP32 worker with DeepEP on 32 H100) and is kept in the URL;
    a fresh page from that URL has the same options."""
    page = make_page(viewport)
    request = {**LLAMA, "cluster": {"preset": "dgx-h100", "num_nodes": 2}, "parallel": {"tp": 8, "dp": 2}}
    open_page(page, url_state(request))
    expect(page.locator("#serve-tbo option").first).to_have_text("default (off)")
    expect(page.locator("#serve-redundant")).to_have_attribute("placeholder", "default: 0")
    picks = {"model": "deepseek-v3", "engine": "sglang", "weights": "fp8", "a-dispatch": "deepep"}
    for name, value in picks.items():
        page.select_option(f"#serve-{name}", value)
    for name, value in {"nodes": "4", "concurrency": "256", "a-tp": "1", "a-dp": "32", "a-ep": "32"}.items():
        page.fill(f"#serve-{name}", value)
    page.check("#serve-a-adp")

    def answer_on_show(options: dict) -> dict:
        """The page's body carries exactly these options; its cards show the server's answer to that body."""
        body = page.evaluate("window.commplan.serveBody()")
        assert body["options"] == {"weight_dtype": "fp8", **options}, body["options"]
        want = httpx.post(page.base + "/v1/serve", json=body, timeout=60).json()
        tpot = page.evaluate(f"window.commplan.fmtTime({want['tpot_s']})")
        expect(page.locator("#serve-cards [data-card=tpot] .metric")).to_have_text(tpot, timeout=30_000)
        expect(page.locator("#serve-status")).to_have_text("", timeout=30_000)
        step = page.evaluate(f"window.commplan.fmtTime({want['pools'][0]['step_s']})")
        expect(page.locator("#serve-pools tbody tr").first).to_contain_text(step)
        return want

    page.click("#serve-run")
    expect(page.locator("#serve-results")).to_be_visible(timeout=30_000)
    default = answer_on_show({})
    page.select_option("#serve-tbo", "true")  # replans the answer on show
    tbo = answer_on_show({"two_batch_overlap": True})
    assert tbo["tpot_s"] != default["tpot_s"] and tbo["pools"][0]["step_s"] != default["pools"][0]["step_s"]
    page.fill("#serve-redundant", "32")
    page.locator("#serve-redundant").dispatch_event("change")
    both = answer_on_show({"two_batch_overlap": True, "redundant_experts": 32})
    assert both["tpot_s"] != tbo["tpot_s"]
    assert overflow(page) == 0
    # kept in the URL: a fresh page opens with the same options
    saved = json.loads(base64.urlsafe_b64decode(page.url.split("#s=")[1] + "==="))
    assert saved["o"] == {"weight_dtype": "fp8", "two_batch_overlap": True, "redundant_experts": 32}, saved
    fresh = browser.new_context(viewport=viewport).new_page()
    try:
        fresh.goto(page.url)
        expect(fresh.locator("#ledger tbody tr").first).to_be_visible(timeout=20_000)
        expect(fresh.locator("#serve-tbo")).to_have_value("true")
        expect(fresh.locator("#serve-redundant")).to_have_value("32")
        expect(fresh.locator("#serve-weights")).to_have_value("fp8")
    finally:
        fresh.context.close()
    shot_of(page, "#serve-card", f"serve-options-{viewport['width']}")


def test_serve_scenario_deepseek_on_96_gpus(page):
    """The user's path of the mission: switch to serving DeepSeek-V3 on 96 GPUs and see TTFT, TPOT, tokens/s
    per GPU, the KV cache and the KV transfer with the links it crosses."""
    open_page(page)
    page.select_option("#serve-scenario", "dsv3-pd")
    expect(page.locator("#serve-results")).to_be_visible(timeout=60_000)
    # the LMSYS run passed --enable-two-batch-overlap (sglang issue #6017's launch commands): the scenario too
    assert page.locator("#serve-tbo").input_value() == "true"
    assert page.evaluate("window.commplan.serveBody()")["options"]["two_batch_overlap"] is True
    cards = page.locator("#serve-cards")
    for label in ("TTFT", "TPOT", "Tokens/s per GPU", "KV cache", "KV transfer"):
        expect(cards).to_contain_text(label)
    expect(cards.locator("[data-card=kv-transfer]")).to_contain_text("141 MB per request")
    rows = page.locator("#serve-pools tbody tr")
    expect(rows).to_have_count(2)
    expect(rows.first).to_contain_text("prefill")
    expect(rows.first).to_contain_text("32")
    expect(page.locator("#serve-links")).to_contain_text("nic")


def test_every_scenario_fits_as_shipped(page):
    """Each built-in scenario plans without errors and its memory card says it fits (issue 25: DeepSeek-V3 needed
    126 GB of 85.5, Mixtral on the NPU mesh 94.4 of 64, FSDP Llama-3 8B 94.7 of 85.9)."""
    open_page(page)
    ids = page.evaluate("[...document.querySelectorAll('#scenario option')].map((o) => o.value).filter(Boolean)")
    assert {"dsv3", "mixtral-npu", "fsdp-a100"} <= set(ids) and len(ids) >= 7
    for sid in ids:
        page.select_option("#scenario", sid)
        want = page.evaluate(
            "(id) => import('/static/js/form.js').then((m) => m.SCENARIOS.find((s) => s.id === id).request)", sid
        )
        # the plan on show is this scenario's: its request's parallel block, answered and not stale
        wait_until(
            page,
            "([want]) => { const s = window.commplan.state; return !s.stale && s.plan && s.request"
            " && JSON.stringify(s.request.parallel) === JSON.stringify({...s.request.parallel, ...want.parallel})"
            " && s.request.model.preset === want.model.preset; }",
            arg=[want],
            timeout=30_000,
        )
        plan = page.evaluate("window.commplan.state.plan")
        assert plan["memory"]["fits"], sid
        peak = max(s["peak_bytes"] for s in plan["memory"]["per_stage"])
        assert peak < plan["memory"]["capacity_bytes"], sid
        expect(page.locator("#form-errors")).to_be_hidden()
        expect(page.locator("#memory-note")).to_contain_text("Fits:", timeout=10_000)


def test_cards_cannot_contradict_and_the_caption_is_the_prices_own(page):
    """Exposed communication (critical stage, with the pipeline sends it waits for) may exceed one stage's own
    calls serialised (5.55 s against 5.53 s here): the cards name what each sums, so neither reads as a bound on
    the other. The selected call's caption is its latency share: time less link bytes over link bandwidth."""
    open_page(page)
    plan = page.evaluate("window.commplan.state.plan")
    step, totals = plan["step"], plan["totals"]
    assert len(totals["per_stage"]) == 4
    comm = page.locator("#summary [data-card=comm]")
    expect(comm.locator(".metric-label")).to_have_text(f"Stage {totals['busiest_stage']} calls if serialised")
    expect(comm).to_contain_text("nor other stages' sends it waits for")
    expect(page.locator("#summary [data-card=exposed]")).to_contain_text("pipeline fill and drain sends it waits for")
    # what the exposed card adds beyond the stage's own calls is the pipeline's: without PP it is bounded
    if step["exposed_comm_s"] > totals["time_s"]:
        pp = sum(c["time_s"] * c["calls_per_iteration"] for c in plan["calls"] if c["parallelism"] == "pp")
        assert step["exposed_comm_s"] - totals["time_s"] <= pp

    def share(call):
        link = call["placement"]["links"][0]
        return 1 - link["bytes"] / (link["capacity_GBps"] * 1e9) / call["time_s"]

    calls = [c for c in plan["calls"] if c["placement"]["links"] and c["time_s"] > 0]
    big = next(c for c in calls if c["name"] == "tp.attn.qkv")
    small = min(calls, key=lambda c: c["message_bytes"])
    assert big["placement"]["links"][0]["utilisation"] < 0.8 and share(big) < 0.5  # was "latency dominates"
    assert share(small) >= 0.5
    for call, words in ((big, "bandwidth-bound"), (small, "latency dominates")):
        row = page.locator(f"#ledger tbody tr[data-name='{call['name']}']").first
        row.focus()
        page.keyboard.press("Enter")
        text = page.locator("#detail-text")
        expect(text).to_contain_text(words)
        pct = page.evaluate("(x) => import('/static/js/format.js').then((m) => m.fmtPct(x))", share(call))
        expect(text).to_contain_text(f"latency is {pct} of the call")


# every value the units rules have an edge at: tiny noise, rounding across a unit, zero, negatives, huge
FORMAT_CASES = {
    "time": [0, 1.78e-15, -1e-15, 3.2e-10, 9.99e-10, 1e-9, 1.2e-9, 4.1e-5, 0.000358888, 0.9996, 5.55, 1234.5,
             999.4, 24500.5, 1.5 * 86400, 3.14e9],
    "bytes": [0, 8, 999, 999_600, 1020, 134217728, 1.53e12],
    "rate": [0, 1.86e-4, 2e-13, 0.5, 1, 42.42, 450, 1.2e4],
    "percent": [0, 1e-9, 3.09e-3, 0.27612, 1, -0.00309],
}  # fmt: skip


def test_one_formatter_page_and_cli(page):
    """format.js (page) and app/cli.py (CLI, CSV-free tables) write the same strings for every unit, with no
    tiny-value noise ("bubble 0.00000178 ns", "0.000186 GB/s"), and memory capacity says GB and GiB."""
    from app.cli import human_bytes, human_capacity, human_percent, human_rate, human_seconds

    open_page(page)
    js = page.evaluate(
        """(cases) => import('/static/js/format.js').then((m) => ({
            time: cases.time.map(m.fmtTime), bytes: cases.bytes.map(m.fmtBytes), rate: cases.rate.map(m.fmtBw),
            percent: cases.percent.map(m.fmtPct), capacity: m.fmtCapacity(85520809984)}))""",
        FORMAT_CASES,
    )
    py = {
        "time": [human_seconds(x).replace(" us", " µs") for x in FORMAT_CASES["time"]],
        "bytes": [human_bytes(x) for x in FORMAT_CASES["bytes"]],
        "rate": [human_rate(x) for x in FORMAT_CASES["rate"]],
        "percent": [human_percent(x) for x in FORMAT_CASES["percent"]],
        "capacity": human_capacity(85520809984),
    }
    assert js == py
    assert py["time"][:4] == ["0 s", "< 1 ns", "0 s", "< 1 ns"] and py["rate"][1:3] == ["186 KB/s", "< 1 B/s"]
    # from 1,000 s on, minutes to years (round 11: "24500 s", a TTFT of "3140000000 s")
    assert py["time"][-5:] == ["20.6 min", "999 s", "6.81 h", "1.50 days", "99.5 years"], py["time"]
    assert py["capacity"] == "85.5 GB (79.6 GiB)" and py["percent"][1] == "< 0.01%"
    for text in [*js["time"], *js["bytes"], *js["rate"], *js["percent"]]:
        digits = re.sub(r"[^0-9]", "", text).lstrip("0")
        assert not re.search(r"\de[-+]?\d", text) and len(digits) <= 4, text
    expect(page.locator("#memory-note")).to_contain_text(re.compile(r"of \d+\.\d GB \(\d+\.\d GiB\) per device"))


def test_serve_draws_the_pools_and_the_kv_transfer_on_the_topology(page):
    """Disaggregated DeepSeek-V3 on 96 H100 (the scenario): the KV transfer's devices (the first prefill worker and
    the decode worker it feeds) drawn on the topology view, its links coloured by the transfer's utilisation."""
    open_page(page, url_state(LLAMA))
    page.select_option("#serve-scenario", "dsv3-pd")
    expect(page.locator("#serve-results")).to_be_visible(timeout=60_000)
    expect(page.locator("#serve-draw")).to_be_visible()
    page.click("#serve-draw")
    expect(page.locator("#topology-note")).to_contain_text("The KV transfer: GPUs 0-31 are the first prefill worker",
                                                            timeout=30_000)  # fmt: skip
    expect(page.locator("#topology-note")).to_contain_text("32-95 the decode worker it feeds")
    # the aggregate view (12 nodes): a box per node, the rails coloured by the transfer's busiest link
    assert page.evaluate("window.commplan.state.cy.nodes('.box').length") == 12
    busy = page.evaluate("Math.max(...window.commplan.state.cy.edges().map((e) => e.data('u')))")
    answer = httpx.post(page.base + "/v1/serve", json=page.evaluate("window.commplan.serveBody()")).json()
    assert busy == pytest.approx(max(link["utilisation"] for link in answer["kv_transfer"]["links"]))


# ---- issue 25 items 3 and 7, issue 21 item 7: every field a control, the assumptions, forms that help ------------
# request fields the form does not offer, and why (every other one of these blocks has a control)
NO_CONTROL = {
    "workload.preset": "the form is the workload",
    "parallel.preset": "the form is the layout",
    "parallel.zero_config": "DeepSpeed's own dictionary of names (docs/frameworks.md): a URL or the API",
    "parallel.ddp": "torch DDP switches object: a URL or the API",
    "options.device_map": "a permutation of every rank: a URL or the API",
    "options.links_per_call": "the page asks for 24 to colour the topology",
    "options.timeline": "the page draws the timeline",
    "cluster.calibration": "the Calibrate card fits and sets it (its efficiency, latency_scale, network_latency_s)",
    "cluster.gpu.peak_tflops": "a dict per dtype: bf16 and fp8 have controls (peak_tflops.bf16, .fp8); others: the API",
}


def test_every_request_field_has_a_control(page):
    """Each field of the workload, parallel, options and overlap blocks and of the cluster block with its
    intra, network, GPU and NCCL environment blocks (read from the server's OpenAPI) is a control of the form,
    or is listed above with its reason. The NCCL version is a select of exactly the versions the server
    prices (GET /v1/collectives/nccl-versions, from the library's VERSIONS table)."""
    open_page(page)
    schemas = httpx.get(page.base + "/openapi.json").json()["components"]["schemas"]
    blocks = {
        "workload": "WorkloadIn",
        "parallel": "ParallelIn",
        "options": "OptionsIn",
        "options.overlap": "OverlapIn",
        "cluster": "ClusterIn",
        "cluster.intra": "IntraIn",
        "cluster.network": "NetworkIn",
        "cluster.gpu": "GPUIn",
        "cluster.nccl_env": "NcclEnvIn",
    }
    fields = {f"{b}.{k}" for b, name in blocks.items() for k in schemas[name]["properties"]} - set(blocks)
    controls = set(page.evaluate("Object.keys(window.commplan.fields)"))
    missing = sorted(fields - controls - set(NO_CONTROL))
    assert not missing, missing
    for path in ("cluster.nccl_version", "cluster.devices_per_node", "options.nccl_algo", "options.nccl_proto"):
        assert path in controls, path
    for path in NO_CONTROL:  # a stated reason is for a field that exists
        block, _, name = path.rpartition(".")
        assert name in schemas[blocks[block]]["properties"], path
    from collectives.topology.library.tables import SUPPORTED_VERSIONS

    offered = page.eval_on_selector_all("#f-nccl-version option", "os => os.map((o) => o.value)")
    assert offered == ["", *SUPPORTED_VERSIONS], offered


def test_network_kind_and_cpu_vendor_selects_are_the_servers_lists(page):
    """The network-kind and CPU-vendor selects offer exactly what GET /v1/collectives/cluster-choices lists (the
    planner's NETWORK_KINDS and CPU_VENDORS, collectives/topology/spec.py): the page holds no copy of its own. A
    choice reaches the request and the plan's cluster block."""
    from collectives.topology.spec import CPU_VENDORS, NETWORK_KINDS

    open_page(page)
    choices = httpx.get(page.base + "/v1/collectives/cluster-choices").json()
    for select, key, planner in (
        ("#f-network-kind", "network_kinds", NETWORK_KINDS),
        ("#f-cpu-vendor", "cpu_vendors", CPU_VENDORS),
    ):
        offered = page.eval_on_selector_all(f"{select} option", "os => os.map((o) => o.value)")
        assert offered == ["", *choices[key]] == ["", *planner], offered
    source = httpx.get(page.base + "/static/js/controls.js").text
    assert "efa_sendrecv" not in source and '"amd"' not in source  # no second copy of the lists
    page.evaluate("document.querySelectorAll('details.group').forEach((d) => { d.open = true; })")
    page.select_option("#f-network-kind", "roce")
    page.select_option("#f-cpu-vendor", "amd")
    expect(page.locator("#results")).not_to_have_class(re.compile("stale"), timeout=20_000)
    wait_until(
        page,
        "() => { const c = window.commplan.state.plan && window.commplan.state.plan.cluster;"
        " return c && c.network.kind === 'roce' && c.cpu_vendor === 'amd'; }",
        timeout=20_000,
    )
    cluster = page.evaluate("window.commplan.state.request.cluster")
    assert cluster["network"]["kind"] == "roce" and cluster["cpu_vendor"] == "amd", cluster


@VIEWPORTS
def test_controls_reach_the_request_the_url_and_the_assumptions(make_page, browser, viewport):
    page = make_page(viewport)
    open_page(page)
    page.evaluate("document.querySelectorAll('details.group').forEach((d) => { d.open = true; })")
    page.evaluate("document.querySelector('#assumptions-card details').open = true")
    # before any choice each default names the value the plan resolved (Megatron: tp comm overlap off)
    expect(page.locator("#f-overlap-tp-comm-overlap option").first).to_have_text("default (off)")
    expect(page.locator("#f-grad-reduce-dtype option").first).to_have_text("default (fp32)")
    assert overflow(page) <= 0
    page.select_option("#f-overlap-tp-comm-overlap", "true")
    page.select_option("#f-overlap-overlap-grad-reduce", "true")
    page.select_option("#f-nccl-version", "2.29")
    page.fill("#f-nccl-proto", "Simple")
    expect(page.locator("#status")).to_contain_text("512 devices", timeout=20_000)
    expect(page.locator("#results")).not_to_have_class(re.compile("stale"), timeout=20_000)
    request = page.evaluate("window.commplan.state.request")
    assert request["options"]["overlap"] == {"tp_comm_overlap": True, "overlap_grad_reduce": True}
    assert request["cluster"]["nccl_version"] == "2.29" and request["options"]["nccl_proto"] == "Simple"
    rows = {
        r.locator("td").nth(0).inner_text(): [r.locator("td").nth(k).inner_text() for k in (1, 2)]
        for r in page.locator("#assumptions-table tbody tr").all()
    }
    assert rows["options.overlap.tp_comm_overlap"] == ["on", "set"]
    assert rows["options.overlap.overlap_param_gather"] == ["off", "default"]
    assert rows["cluster.nccl_version"] == ["2.29", "set"]
    assert rows["options.nccl_proto"] == ["Simple", "set"]
    assert rows["model.num_layers"] == ["80", "preset"] and rows["model.vocab_size"] == ["128,256", "preset"]
    plan = page.evaluate("window.commplan.state.plan")
    assert plan["cluster"]["nccl_version"] == "2.29"
    # no scientific notation, no digits beyond the resolution shown, exact counts with separators
    text = page.locator("body").inner_text()
    sci = r"(?<![0-9A-Za-z.])\d+(\.\d+)?e[-+]?\d+(?![0-9A-Za-z])"  # not a commit hash (d98e8a6)
    assert not re.search(sci, text), re.findall(r"\S*\de[-+]?\d\S*", text)[:5]
    assert not re.search(r"\d\.\d{5,}", text), re.findall(r"\S*\d\.\d{5,}\S*", text)[:5]
    assert not re.search(r"(?<![\d.,:#/-])\d{5,}(?![\d.,])", text), re.findall(r"\S*\d{5,}\S*", text)[:5]
    if viewport is WIDE:
        shot_of(page, "#config", "controls-1440")
        shot_of(page, "#assumptions-card", "assumptions-1440")
    assert overflow(page) <= 0
    # the URL holds every control
    fresh = browser.new_page(viewport=viewport)
    fresh.goto(page.url)
    expect(fresh.locator("#ledger tbody tr").first).to_be_visible(timeout=20_000)
    expect(fresh.locator("#f-overlap-tp-comm-overlap")).to_have_value("true")
    expect(fresh.locator("#f-nccl-version")).to_have_value("2.29")
    expect(fresh.locator("#f-nccl-proto")).to_have_value("Simple")
    expect(fresh.locator("#f-overlap-overlap-param-gather")).to_have_value("")
    fresh.close()


def test_cluster_controls_reach_the_request_and_the_plan(page):
    """Issue 25 item 5: the cluster's other fields have controls, each naming the value the plan's own cluster
    block holds (the preset's) until set; set ones reach the request, the plan's cluster and the URL."""
    open_page(page)
    page.evaluate("document.querySelectorAll('details.group').forEach((d) => { d.open = true; })")
    expect(page.locator("#f-intra-latency-s")).to_have_attribute("placeholder", "default: 700 ns")
    expect(page.locator("#f-pcie-bandwidth-GBps")).to_have_attribute("placeholder", "default: 64.0 GB/s")
    expect(page.locator("#f-network-kind option").first).to_have_text("default (ib)")
    expect(page.locator("#f-nccl-version option").first).to_have_text("default (2.30)")
    expect(page.locator("#f-gpu-sms")).to_have_attribute("placeholder", "default: 132")
    page.fill("#f-gpu-power-limit-w", "500")
    page.select_option("#f-nccl-env-NCCL-NVLS-ENABLE", "0")
    page.fill("#f-network-switch-latency-s", "0.0000005")
    page.select_option("#f-network-kind", "roce")
    page.locator("#f-network-kind").dispatch_event("change")
    expect(page.locator("#results")).not_to_have_class(re.compile("stale"), timeout=20_000)
    expect(page.locator("#form-errors")).to_be_hidden()
    cluster = page.evaluate("window.commplan.state.request.cluster")
    assert cluster["gpu"] == {"power_limit_w": 500} and cluster["nccl_env"] == {"NCCL_NVLS_ENABLE": 0}
    assert cluster["network"]["switch_latency_s"] == 5e-7 and cluster["network"]["kind"] == "roce"
    planned = page.evaluate("window.commplan.state.plan.cluster")
    assert planned["gpu"]["power_limit_w"] == 500 and planned["nccl_env"]["NCCL_NVLS_ENABLE"] == 0
    assert planned["network"]["kind"] == "roce" and planned["network"]["switch_latency_s"] == 5e-7
    assert overflow(page) <= 0


def test_a_bad_control_is_marked_and_named(page):
    # a version the select does not offer, from a link, is kept as given so the server names it
    page.goto(page.base + "/" + url_state({**LLAMA, "cluster": {**LLAMA["cluster"], "nccl_version": "1.0"}}))
    expect(page.locator("#form-errors")).to_contain_text("cluster.nccl_version", timeout=20_000)
    expect(page.locator("#f-nccl-version")).to_have_attribute("aria-invalid", "true")
    page.evaluate("document.querySelectorAll('details.group').forEach((d) => { d.open = true; })")
    page.fill("#f-gpu-power-limit-w", "50")  # below the H100's 200 W
    page.select_option("#f-nccl-version", "2.30")
    expect(page.locator("#form-errors")).to_contain_text("cluster.gpu.power_limit_w", timeout=20_000)
    expect(page.locator("#f-gpu-power-limit-w")).to_have_attribute("aria-invalid", "true")


@VIEWPORTS
def test_forms_help_cluster_switch_devices_per_node_nearest_values(make_page, viewport):
    page = make_page(viewport)
    open_page(page)
    expect(page.locator("#cluster-facts")).to_have_text("8 devices per node (H100 SXM 80GB) × 64 nodes = 512 devices")
    # a divisibility error offers the nearest valid values; one click applies it and plans
    page.fill("#global-batch", "1000")
    expect(page.locator("#form-errors")).to_contain_text("Nearest valid: global batch 992", timeout=20_000)
    expect(page.locator("#form-errors")).to_contain_text("global batch 1,008")
    if viewport is PHONE:
        box = page.locator("#form-errors button.fix").first.bounding_box()
        assert box and box["y"] + box["height"] <= viewport["height"]  # in the first screen
    page.locator("#form-errors button.fix", has_text="1,008").click()
    expect(page.locator("#global-batch")).to_have_value("1008")
    expect(page.locator("#form-errors")).to_be_hidden(timeout=20_000)
    # a cluster switch keeps the device count where it can, and says so when it cannot
    page.select_option("#cluster-preset", "dgx-a100")
    expect(page.locator("#cluster-switch-note")).to_have_text("Kept 512 devices: 64 nodes of 8.")
    expect(page.locator("#nodes")).to_have_value("64")
    page.select_option("#cluster-preset", "gb200-nvl72")
    expect(page.locator("#cluster-switch-note")).to_have_text(
        "512 devices are not a whole number of 72-device nodes: 7 nodes give 504."
    )
    expect(page.locator("#cluster-facts")).to_contain_text("72 devices per node")
    expect(page.locator("#form-errors")).to_contain_text("Nearest valid: 4 nodes, DP 9", timeout=20_000)
    page.locator("#form-errors button.fix", has_text="8 nodes, DP 18").click()
    expect(page.locator("#status")).to_contain_text("576 devices", timeout=20_000)
    assert overflow(page) <= 0


def test_hf_import_shows_what_the_server_read(page):
    open_page(page)
    config = {
        "model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
        "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256, "max_position_embeddings": 8192,
    }  # fmt: skip
    page.check("#model-source-hf")
    page.fill("#hf-config", json.dumps(config))
    expect(page.locator("#model-facts")).to_contain_text(
        "Read from config.json: 32 layers, hidden 4,096, 32 heads / 8 KV, FFN 14,336, vocabulary 128,256, "
        "8.03B parameters",
        timeout=20_000,
    )


def test_explorer_labels_its_pricers_and_whole_world_calls_are_one_group(page):
    open_page(page)
    expect(page.locator("#explorer-note")).to_contain_text("priced together", timeout=20_000)
    names = page.evaluate("window.commplan.state.charts['explorer'].getOption().series.map((s) => s.name)")
    assert any(n.endswith(" · NCCL model") for n in names) and any(n.endswith(" · schedule") for n in names), names
    expect(page.locator("#explorer-note")).to_contain_text("Solid: NCCL's cost model (what NCCL would run")
    # dp.grad_norm spans every rank: one group of 512, and the explorer says in words why it is not drawn
    page.locator("#ledger tbody tr", has_text="dp.grad_norm").first.click()
    expect(page.locator("#detail-text")).to_contain_text("over 512 ranks (one group,")
    expect(page.locator("#explorer-note")).to_contain_text("Not explored: pricing every algorithm", timeout=20_000)
    note = page.locator("#explorer-note").inner_text()
    assert "COMMPLAN_MAX_WORK" not in note and "one group of 512 ranks" in note, note


@VIEWPORTS
def test_timeline_per_microbatch_pp_lanes_overlap_and_zoom(make_page, viewport):
    """The real server aggregates the steady state of 64 micro-batches; the page draws each one (forward and
    backward per stage), a pp lane of pipeline waits, DP traffic split into overlapped and exposed, and zooms to
    one micro-batch."""
    page = make_page(viewport)
    request = {**LLAMA, "options": {**LLAMA["options"], "overlap": {"overlap_grad_reduce": True}}}
    open_page(page, url_state(request))
    expect(page.locator("#timeline-note")).to_contain_text("drawn per micro-batch")
    plan = page.evaluate("window.commplan.state.plan")
    m = plan["num_microbatches"]
    assert any(e["microbatches"] > 1 for e in plan["step"]["timeline"])  # the server aggregated
    data = page.evaluate("window.commplan.state.charts.timeline.getOption().series[1].data")
    lanes = page.evaluate("window.commplan.state.charts.timeline.getOption().yAxis[0].data")
    for stage in range(4):
        lane = lanes.index(f"s{stage} compute" if viewport is PHONE else f"stage {stage} · compute")
        for name in ("forward", "backward"):
            mbs = sorted(d["microbatch"] for d in data if d["value"][0] == lane and d["name"] == name)
            assert mbs == list(range(m)), (stage, name, mbs[:5])
    assert any(lab.endswith("pp") for lab in lanes)
    assert any(d["name"].endswith("(overlapped)") for d in data) and any(d["name"].endswith("(exposed)") for d in data)
    # the drawn per-micro-batch blocks of a stage add up to the server's aggregated blocks
    served = sum(e["end_s"] - e["start_s"] for e in plan["step"]["timeline"] if e["stage"] == 0 and e["stream"] == "tp")
    drawn = sum(d["value"][2] - d["value"][1] for d in data if d["value"][0] == lanes.index(lanes[0][:-7] + "tp"))
    assert math.isclose(served, drawn, rel_tol=1e-9), (served, drawn)
    page.fill("#timeline-mb", "10")
    page.click("#timeline-zoom")
    expect(page.locator("#timeline-zoom-note")).to_contain_text("micro-batch 10:")
    zoom = page.evaluate("window.commplan.state.charts.timeline.getOption().dataZoom[0]")
    assert 0 < zoom["startValue"] < zoom["endValue"] < plan["step"]["time_s"]
    assert overflow(page) <= 0
    shot_of(page, "#timeline-card", f"timeline-microbatch-{viewport['width']}")
    page.click("#timeline-all")
    expect(page.locator("#timeline-zoom-note")).to_have_text("")


def test_timeline_legend_names_every_colour_drawn(make_page):
    """A new user could not tell the timeline's blues apart (forward, backward, tp): a legend above the chart has
    one swatch per colour drawn, no more, named by what it is, the forward and backward passes by name."""
    page = make_page()
    request = {**LLAMA, "options": {**LLAMA["options"], "overlap": {"overlap_grad_reduce": True}}}
    open_page(page, url_state(request))
    expect(page.locator("#timeline-legend li").first).to_be_visible()
    series = page.evaluate("window.commplan.state.charts.timeline.getOption().series")
    drawn = {d["itemStyle"]["color"] for s in series[1:] for d in s["data"]} | {"#e9eef4"}  # and idle

    def rgb(hex_):
        return "rgb(" + ", ".join(str(int(hex_[i : i + 2], 16)) for i in (1, 3, 5)) + ")"

    items = page.eval_on_selector_all(
        "#timeline-legend li", "els => els.map(e => [e.querySelector('.swatch').style.backgroundColor, e.textContent])"
    )
    assert sorted(c for c, _ in items) == sorted(rgb(c) for c in drawn)  # each colour drawn, once
    names = {name for _, name in items}
    assert {"idle", "backward", "pipeline wait", "tp exposed", "dp overlapped"} <= names, names
    assert any(n.startswith("forward") for n in names), names


@VIEWPORTS
def test_timeline_recompute_blocks_and_hidden_pass_traffic(make_page, viewport):
    """Issue 25 Build, the rest of the timeline: full recompute and TP comm overlap on the 70B layout (64
    micro-batches, aggregated by the server). Every backward of every stage holds one recompute bar inside it,
    the bars add up to the server's recompute blocks; TP traffic is drawn in two parts, overlapped (light) and
    exposed (solid), which add up to the server's; the note says both."""
    page = make_page(viewport)
    request = {
        **LLAMA,
        "workload": {**LLAMA["workload"], "activation_recompute": "full"},
        "options": {**LLAMA["options"], "overlap": {"tp_comm_overlap": True}},
    }
    open_page(page, url_state(request))
    expect(page.locator("#timeline-note")).to_contain_text("recompute, the forward re-run")
    plan = page.evaluate("window.commplan.state.plan")
    m, served = plan["num_microbatches"], plan["step"]["timeline"]
    option = page.evaluate("window.commplan.state.charts.timeline.getOption()")
    lanes, data, redo = option["yAxis"][0]["data"], option["series"][1]["data"], option["series"][2]["data"]
    for stage in range(4):
        lane = lanes.index(f"s{stage} compute" if viewport is PHONE else f"stage {stage} · compute")
        backwards = {
            d["microbatch"]: d["value"][1:3] for d in data if d["value"][0] == lane and d["name"] == "backward"
        }
        bars = [d for d in redo if d["value"][0] == lane]
        assert sorted(d["microbatch"] for d in bars) == list(range(m)) == sorted(backwards)
        for d in bars:  # inside its own backward
            a, b = backwards[d["microbatch"]]
            assert a - 1e-12 <= d["value"][1] < d["value"][2] <= b + 1e-12
        want = sum(e["end_s"] - e["start_s"] for e in served if e["stage"] == stage and e["stream"] == "recompute")
        assert math.isclose(sum(d["value"][2] - d["value"][1] for d in bars), want, rel_tol=1e-9)
        tp = lanes.index(f"s{stage} tp" if viewport is PHONE else f"stage {stage} · tp")
        parts = {
            kind: [d for d in data if d["value"][0] == tp and d["name"].endswith(f"({kind})")]
            for kind in ("overlapped", "exposed")
        }
        assert parts["overlapped"], stage
        for kind, flag in (("overlapped", True), ("exposed", False)):
            want = sum(
                e["end_s"] - e["start_s"]
                for e in served
                if e["stage"] == stage and e["stream"] == "tp" and bool(e.get("overlapped")) == flag
            )
            assert math.isclose(
                sum(d["value"][2] - d["value"][1] for d in parts[kind]), want, rel_tol=1e-9, abs_tol=1e-12
            )
    colours = {d["itemStyle"]["color"] for d in data if d["name"].startswith("tp ")}
    assert len(colours) >= 1 and all(
        c != "#d63384" for c in {d["itemStyle"]["color"] for d in data if d["name"].endswith("(overlapped)")}
    )
    expect(page.locator("#timeline-note")).to_contain_text("overlapped")
    assert overflow(page) <= 0
    shot_of(page, "#timeline-card", f"timeline-recompute-{viewport['width']}")


@VIEWPORTS
def test_cosmetics_of_issue_25_item_9(make_page, viewport):
    page = make_page(viewport)
    open_page(page)
    # the step player's buttons stay on one line
    page.click("#step-load")
    expect(page.locator("#step-label")).not_to_have_text("–", timeout=10_000)
    tops = [page.locator(s).bounding_box()["y"] for s in ("#step-prev", "#step-next", "#step-play")]
    assert max(tops) - min(tops) < 4, tops
    # the Framework select shows its whole label ("Megatro" was cut)
    fits = page.evaluate(
        """() => { const s = document.getElementById('framework');
                   const c = document.createElement('canvas').getContext('2d');
                   c.font = getComputedStyle(s).font;
                   return c.measureText(s.selectedOptions[0].text).width + 24 <= s.clientWidth; }"""
    )
    assert fits
    # topology labels at least 9 px on screen (NIC and leaf labels were about 6 px)
    expect(page.locator("#topology-note")).not_to_have_text("", timeout=10_000)
    sizes = page.evaluate(
        """() => { const cy = window.commplan.state.cy; return cy.nodes().filter((n) => n.data('label'))
                   .map((n) => parseFloat(n.style('font-size')) * cy.zoom()); }"""
    )
    assert sizes and min(sizes) >= 8.99, min(sizes)
    # a call name in a card breaks after its dots and underscores, never mid-word
    metric = page.locator("[data-card=top] .metric")
    assert metric.locator("wbr").count() >= 1 and "." in metric.inner_text()
    assert page.locator(".metric").first.evaluate("e => getComputedStyle(e).overflowWrap") == "break-word"
    assert overflow(page) <= 0


# ---- found by a newcomer from a fresh clone (user4) ---------------------------------------------------------------
AXIS_LABELS = """(id) => { const c = window.commplan.state.charts[id], width = c.getWidth(), out = [];
  c.getZr().storage.getDisplayList(true).forEach((e) => {
    if (!e.style || typeof e.style.text !== 'string' || !/^[\\d.]+ [KMGTP]?B$/.test(e.style.text)) return;
    const r = e.getBoundingRect().clone(); if (e.transform) r.applyTransform(e.transform);
    out.push([e.style.text, r.x, r.x + r.width, width]); });
  return out; }"""


def assert_byte_labels_inside(page, chart_id):
    """Every byte label of the chart's x axis lies inside the chart (the last one, "10.0 GB" or "85.0 GB", was cut
    by the chart's right edge)."""
    labels = page.evaluate(AXIS_LABELS, chart_id)
    assert len(labels) >= 3, labels
    outside = [(text, round(x0), round(x1), w) for text, x0, x1, w in labels if x0 < 0 or x1 > w]
    assert outside == [], outside


@VIEWPORTS
def test_the_explorers_and_the_searchs_last_axis_label_is_not_cut(make_page, viewport):
    page = make_page(viewport)
    stub_search(page)
    open_page(page)
    expect(page.locator("#explorer-note")).to_contain_text("priced together", timeout=20_000)
    assert_byte_labels_inside(page, "explorer")
    page.click("#search-run")
    expect(page.locator("#search-table tbody tr")).to_have_count(4, timeout=10_000)
    assert_byte_labels_inside(page, "search-chart")


def test_search_results_that_differ_only_in_sequence_parallelism_are_told_apart(page):
    """Llama-3 70B on 64 nodes listed "TP2 PP8 DP8 CP4 ZeRO-1 v10" twice (15.4 s, 62.0 and 56.1 GB): the two
    differ in sequence parallelism, which the layout's name did not say. Likewise expert TP, a zero-bubble
    schedule and uneven stages."""
    sp_off, sp_on = search_hit(8, 4, 16, 9.1, 71 * 10**9), search_hit(8, 4, 16, 9.2, 62 * 10**9)
    sp_off["parallel"]["sequence_parallel"] = False
    zb = search_hit(8, 4, 16, 9.3, 60 * 10**9)
    zb["parallel"].update(pipeline_schedule="zb-h1", first_stage_layers=19, last_stage_layers=19)
    moe = search_hit(8, 4, 16, 9.4, 58 * 10**9)
    moe["parallel"].update(ep=8, expert_tp=2, sequence_parallel=False)
    stub_search(page, results=[sp_off, sp_on, zb, moe])
    open_page(page)
    page.click("#search-run")
    expect(page.locator("#search-table tbody tr")).to_have_count(4, timeout=10_000)
    names = [page.locator("#search-table tbody tr").nth(i).locator("td").nth(1).inner_text() for i in range(4)]
    assert [n.removesuffix("front").strip() for n in names] == [
        "TP8 PP4 DP16 ZeRO-1",
        "TP8 PP4 DP16 ZeRO-1 SP",
        "TP8 PP4 DP16 ZeRO-1 zb-h1 first 19 last 19 SP",
        "TP8 PP4 DP16 EP8 ETP2 ZeRO-1",
    ], names


def test_axis_ticks_are_round_numbers_without_trailing_zeros(page):
    """The explorer's axes read "1.00 KB ... 10.0 GB" and "1.00 µs ... 100 ms", the timeline's "3.00 s 6.00 s":
    a tick is a round number, written without the zeros of three significant digits."""
    open_page(page)
    got = page.evaluate(
        """async () => { const f = await import('/static/js/format.js');
          return [f.axisBytes(1e3), f.axisBytes(1e10), f.axisBytes(1.5e9), f.axisBytes(134e6), f.axisBytes(512),
                  f.axisTime(1e-6), f.axisTime(0.01), f.axisTime(3), f.axisTime(2.5), f.axisTime(0.125)]; }"""
    )
    assert got == ["1 KB", "10 GB", "1.5 GB", "134 MB", "512 B", "1 µs", "10 ms", "3 s", "2.5 s", "125 ms"]
    expect(page.locator("#explorer-note")).to_contain_text("priced together", timeout=20_000)
    ticks = page.evaluate(
        "() => { const c = window.commplan.state.charts.explorer, f = c.getOption().xAxis[0].axisLabel.formatter;"
        " return [1e3, 1e4, 1e9].map(f); }"
    )
    assert ticks == ["1 KB", "10 KB", "1 GB"]


def test_one_group_is_said_in_the_singular(page):
    """The KV transfer drawn on the topology (one group) said "coloured ... while the call runs on all 1 groups"."""
    open_page(page, url_state(LLAMA))
    page.select_option("#serve-scenario", "dsv3-pd")
    expect(page.locator("#serve-draw")).to_be_visible(timeout=60_000)
    page.click("#serve-draw")
    note = page.locator("#topology-note")
    expect(note).to_contain_text("The KV transfer", timeout=30_000)
    expect(note).to_contain_text("while the call runs on its one group")
    assert "all 1 groups" not in note.inner_text()


def test_a_phone_sees_the_answer_without_scrolling_past_the_form(make_page):
    """At 390 px the results sit below the whole form (one column): nothing of the plan showed until one scrolled
    past it (user5). The header now says the step time and MFU the summary cards show, in the first screen, and
    its button brings the results to the top; at 1440 px (two columns, results beside the form) it is hidden."""
    page = make_page(PHONE)
    open_page(page)
    line = page.locator("#see-result")
    expect(line).to_be_visible()
    step = page.evaluate("window.commplan.state.plan.step")
    time_s = page.evaluate("(s) => window.commplan.fmtTime(s)", step["time_s"])
    expect(page.locator("#see-result-text")).to_contain_text(f"Step time {time_s}, MFU ")
    expect(page.locator("[data-card=step]")).to_contain_text(time_s)
    box = line.bounding_box()
    assert box["y"] + box["height"] <= PHONE["height"], box  # in the first screen
    top = "document.getElementById('results').getBoundingClientRect().top"
    assert page.evaluate(top) > PHONE["height"]  # the results start below the first screen
    page.click("#see-result-go")
    wait_until(page, f"Math.abs({top}) < 2", timeout=5_000)
    wide = make_page(WIDE)
    open_page(wide)
    expect(wide.locator("#see-result")).to_be_hidden()


def test_a_call_on_several_rows_says_its_stages_on_a_phone(make_page):
    """At 390 px the Stages column is hidden, and Llama-3 70B's ledger showed three identical "dp.grads
    reducescatter" rows (stage 3, stage 0, stages 1,2); a name on several rows now says its stages there."""
    page = make_page(PHONE)
    open_page(page)
    rows = page.locator("#ledger tbody tr", has_text="dp.grads")
    stages = rows.evaluate_all("(rows) => rows.map((r) => r.dataset.stage)")
    assert len(stages) >= 2
    texts = [t.split("\n") for t in rows.locator("td:first-child").all_inner_texts()]
    assert len({tuple(t) for t in texts}) == len(texts), texts
    assert all(t[0] == "dp.grads" and re.fullmatch(r"stages? [\d,–]+", t[1]) for t in texts), texts
    # a name on one row only (tp.attn.qkv) stays one line; at 1440 px the Stages column says it and the note is hidden
    assert page.locator("#ledger tbody tr[data-name='tp.attn.qkv'] td:first-child").inner_text() == "tp.attn.qkv"
    wide = make_page(WIDE)
    open_page(wide)
    assert set(wide.locator("#ledger tbody tr", has_text="dp.grads").locator("td:first-child").all_inner_texts()) == {
        "dp.grads"
    }
