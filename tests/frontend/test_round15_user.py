"""Round 15, the page as a demanding user finds it (docs/page.md, user15): a shared link of a serving scenario that came
back without its answer or its drawn KV transfer; the service's work budget said as "request: ... (COMMPLAN_MAX_WORK)"
with nothing marked; a refused profiler trace under the previous trace's analysis; 50 nccl-tests logs listing 100 runs;
blank boxes read as values never typed; a config.json with a byte-order mark or a number past float64; disabled buttons
that looked enabled. Each test reads the API's own answer for the numbers it checks."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import expect

# the shared page fixtures (browser, page) and helpers of the page tests
from tests.frontend.test_page import LLAMA, PHONE, browser, make_page, open_page, page, url_state, wait_until  # noqa: F401

pytestmark = pytest.mark.browser
REFERENCE = Path(__file__).resolve().parents[1] / "reference"
SAMPLE_LOG = REFERENCE / "nccl_logs" / "sample_h100_2node.txt"
TRACE = REFERENCE / "kernels" / "h200" / "trace_llama3_8b.tp1.s4096.json.gz"


def api(page, path: str, body: dict) -> httpx.Response:  # noqa: F811
    return httpx.post(page.base + path, json=body, timeout=300)


def fmt(page, name: str, value):  # noqa: F811
    """``value`` in the page's own formatter (frontend/js/format.js ``name``)."""
    return page.evaluate("async ([n, x]) => (await import('/static/js/format.js'))[n](x)", [name, value])


def serve_idle(page):  # noqa: F811
    wait_until(
        page, "() => !document.getElementById('serve-status').textContent.startsWith('Planning')", timeout=60_000
    )


def test_a_serving_scenarios_link_plans_it_and_draws_its_transfer(page, browser):  # noqa: F811
    """Picking *DeepSeek-V3 on 96 H100* planned it, but the scenario's change event reached the card's own listener
    before the answer and wrote `planned: false` into the link: opened elsewhere, the card came back without its TTFT,
    TPOT or KV transfer. The drawn transfer was not in the link either: it opened on the ledger's first call."""
    open_page(page, url_state(LLAMA))
    page.select_option("#serve-scenario", "dsv3-pd")
    expect(page.locator("#serve-results")).to_be_visible(timeout=60_000)
    serve_idle(page)
    page.click("#serve-draw")
    expect(page.locator("#detail-title")).to_have_text("Serving: the KV transfer", timeout=30_000)
    answer = api(page, "/v1/serve", page.evaluate("window.commplan.serveBody()"))
    assert answer.status_code == 200, answer.text
    ttft = fmt(page, "fmtTime", answer.json()["ttft_s"])
    expect(page.locator('#serve-cards [data-card="ttft"] .metric')).to_have_text(ttft)
    link = page.url
    other = browser.new_context(viewport={"width": 1440, "height": 900}).new_page()
    other.base = page.base
    try:
        other.goto(link)
        expect(other.locator("#serve-results")).to_be_visible(timeout=60_000)
        expect(other.locator('#serve-cards [data-card="ttft"] .metric')).to_have_text(ttft)
        expect(other.locator("#detail-title")).to_have_text("Serving: the KV transfer", timeout=30_000)
        transfer = answer.json()["kv_transfer"]
        expect(other.locator("#detail-text")).to_contain_text(f"the busiest link is {transfer['bottleneck']}")
        # a ledger row brings the training call back, and the link then says so
        other.locator("#ledger tbody tr").first.click()
        expect(other.locator("#detail-title")).to_contain_text("Selected call:")
        assert other.evaluate("window.commplan.state.serveCard.drawn") is False
    finally:
        other.context.close()


def test_the_work_budget_refusal_names_the_costly_setting_and_fixes_it(page):  # noqa: F811
    """Candidates "every algorithm" on Llama-3 405B's 16,384 GPUs: "request: estimated work 19,088,108,752 units is
    over this service's budget of 134,217,728 (COMMPLAN_MAX_WORK); ... allreduce on 1 groups of 16384 ranks ...",
    nothing marked, no way back but to find the control under More settings. Now in words, the Candidates select
    marked, its folded group opened by "Go to", and a fix button that plans."""
    open_page(page)
    page.select_option("#scenario", "llama405b-16k")
    expect(page.locator("#status")).to_contain_text("16,384 devices", timeout=60_000)
    request = {**page.evaluate("window.commplan.state.request")}
    request["options"] = {**request["options"], "candidates": "all"}
    refused = api(page, "/v1/plan", request)
    assert refused.status_code == 422, refused.text
    msg = refused.json()["detail"][0]["msg"]
    units, budget = re.match(r"estimated work ([\d,]+) units is over this service's budget of ([\d,]+)", msg).groups()
    page.evaluate("document.querySelectorAll('#more-settings details').forEach((d) => { d.open = true; })")
    page.select_option("#f-candidates", "all")
    errors = page.locator("#form-errors")
    expect(errors).to_contain_text(
        f"work budget: pricing this plan is an estimated {units} units of work, over the {budget} this server allows a "
        "request; the largest part: ",
        timeout=60_000,
    )
    expect(errors).to_contain_text("of 16,384 ranks")
    expect(errors).to_contain_text("Candidates: what the library picks from costs less.")
    expect(errors).not_to_contain_text("COMMPLAN_MAX_WORK")
    expect(errors).not_to_contain_text("1 groups")
    assert page.eval_on_selector_all("[aria-invalid=true]", "els => els.map(e => e.id)") == ["f-candidates"]
    # "Go to Candidates" opens its folded group: the select is on screen and focused
    page.evaluate("document.querySelectorAll('#more-settings details').forEach((d) => { d.open = false; })")
    errors.get_by_role("button", name="Go to Candidates").click()
    expect(page.locator("#f-candidates")).to_be_visible()
    expect(page.locator("#f-candidates")).to_be_focused()
    errors.locator("button.fix").click()
    expect(page.locator("#status")).to_contain_text("16,384 devices", timeout=60_000)
    expect(errors).to_be_hidden()
    assert page.locator("#f-candidates").input_value() == ""


def test_a_refused_trace_drops_the_last_fits_summary(page, tmp_path):  # noqa: F811
    """A truncated profiler trace was refused ("not JSON ... a truncated file?") under the previous trace's whole
    analysis, its fitted constants and warnings, as if read from the file just refused."""
    open_page(page, url_state(LLAMA))
    page.set_input_files("#calib-trace", str(TRACE))
    page.click("#calib-run")
    summary = page.locator("#calib-trace-summary")
    expect(summary).to_be_visible(timeout=60_000)
    raw = gzip.decompress(TRACE.read_bytes())
    cut = tmp_path / "trace_cut.json"
    cut.write_bytes(raw[: len(raw) // 2])
    refused = api(page, "/v1/calibrate", {"cluster": LLAMA["cluster"], "logs": [], "trace": cut.read_text()})
    assert refused.status_code == 422, refused.text
    page.set_input_files("#calib-trace", str(cut))
    page.click("#calib-run")
    expect(page.locator("#calib-status")).to_contain_text(
        f"Calibration failed: trace: {refused.json()['detail'][0]['msg']}", timeout=60_000
    )
    expect(summary).to_be_hidden()
    expect(page.locator("#calib-results")).to_be_hidden()


def test_fifty_logs_say_their_runs_once(page, tmp_path):  # noqa: F811
    """50 nccl-tests logs of one 2-node test (1,000 rows): the status listed 100 runs, "allreduce on 2 nodes × 8 (16
    rows, NVIDIA H100 80GB HBM3); allgather ..." over 40 lines of the card. Alike runs are said once with their count,
    their rows added; the table keeps every row."""
    text = SAMPLE_LOG.read_text()
    files = []
    for i in range(50):
        files.append(tmp_path / f"run{i:02d}.txt")
        files[-1].write_text(text)
    answer = api(
        page, "/v1/calibrate", {"cluster": LLAMA["cluster"], "logs": [{"text": text, "name": f.name} for f in files]}
    )
    assert answer.status_code == 200, answer.text
    body = answer.json()
    alike: dict[tuple, list[int]] = {}
    for r in body["runs"]:
        key = (r["op"], r["nodes"], r["ranks"] // r["nodes"], ", ".join(r["devices"]))
        alike.setdefault(key, []).append(r["rows"])
    said = [
        f"{op} on {nodes} nodes × {per} ({len(rows)} runs, {sum(rows):,} rows, {devices})"
        for (op, nodes, per, devices), rows in alike.items()
    ]
    open_page(page, url_state(LLAMA))
    page.set_input_files("#calib-files", [str(f) for f in files])
    page.click("#calib-run")
    status = page.locator("#calib-status")
    expect(status).to_contain_text(f"over {len(body['rows']):,} rows", timeout=60_000)
    expect(status).to_contain_text("Runs: " + "; ".join(said) + ".")
    assert len(body["runs"]) == 100 and len(said) == 2
    assert page.locator("#calib-table tbody tr").count() == len(body["rows"]) == 1000


def test_disabled_buttons_look_disabled(page):  # noqa: F811
    """A fit that keeps no constant leaves "Plan with these constants" disabled, and it looked as clickable as ever
    (only the search's two buttons were styled disabled). The answer here is the API's own, its constants emptied."""
    answer = api(
        page, "/v1/calibrate", {"cluster": LLAMA["cluster"], "logs": [{"text": SAMPLE_LOG.read_text(), "name": "a"}]}
    )
    assert answer.status_code == 200, answer.text
    kept_none = {**answer.json(), "constants": {}}
    kept_none["cluster"] = {**kept_none["cluster"], "calibration": {}}
    page.route(
        "**/v1/calibrate",
        lambda route: route.fulfill(status=200, content_type="application/json", body=json.dumps(kept_none)),
    )
    open_page(page, url_state(LLAMA))
    page.fill("#calib-text", SAMPLE_LOG.read_text())
    page.click("#calib-run")
    use = page.locator("#calib-use")
    expect(use).to_be_visible(timeout=30_000)
    expect(use).to_be_disabled()
    assert use.evaluate("b => getComputedStyle(b).opacity") == "0.5"
    assert page.locator("#calib-run").evaluate("b => getComputedStyle(b).opacity") == "1"


def test_blank_boxes_are_said_blank(page):  # noqa: F811
    """An emptied Global batch read "global_batch_size 1 is not divisible by micro_batch_size*dp = 1*16 = 16", a value
    never typed (the blank box is left out and the default planned); the Serve card's emptied Input tokens read "got
    null", and its emptied Concurrency marked nothing ("traffic: give exactly one of concurrency and request_rate")."""
    open_page(page, url_state(LLAMA))
    request = page.evaluate("window.commplan.state.request")
    workload = {k: v for k, v in request["workload"].items() if k != "global_batch_size"}
    refused = api(page, "/v1/plan", {**request, "workload": workload})
    assert refused.status_code == 422, refused.text
    msg = refused.json()["detail"][0]["msg"]
    page.fill("#global-batch", "")
    errors = page.locator("#form-errors")
    expect(errors).to_contain_text(f"{msg} (Global batch is blank: the default was planned)", timeout=30_000)
    page.fill("#global-batch", "1024")
    expect(errors).to_be_hidden(timeout=30_000)
    page.select_option("#serve-scenario", "llama70b-vllm")
    expect(page.locator("#serve-results")).to_be_visible(timeout=60_000)
    serve_idle(page)
    page.fill("#serve-isl", "")
    page.click("#serve-run")
    status = page.locator("#serve-status")
    expect(status).to_contain_text("Input tokens (traffic.input_tokens): ", timeout=30_000)
    expect(status).to_contain_text("and the box is blank")
    expect(status).not_to_contain_text("null")
    assert page.evaluate("document.getElementById('serve-isl').getAttribute('aria-invalid')") == "true"
    page.fill("#serve-isl", "1000")
    page.fill("#serve-concurrency", "")
    page.click("#serve-run")
    body = page.evaluate("window.commplan.serveBody()")
    refused = api(page, "/v1/serve", body)
    assert refused.status_code == 422 and refused.json()["detail"][0]["loc"] == ["body", "traffic"], refused.text
    expect(status).to_contain_text(refused.json()["detail"][0]["msg"], timeout=30_000)
    assert page.evaluate("document.getElementById('serve-concurrency').getAttribute('aria-invalid')") == "true"


def test_a_config_json_with_a_bom_or_a_number_past_float64(page):  # noqa: F811
    """A config.json saved with a byte-order mark was "not valid JSON: Unexpected token '\ufeff'" (the mark unseen);
    "hidden_size": 1e400 became Infinity, sent as null: "required field is missing (or null)"; on a field the server
    ignores (rope_theta) it was dropped unsaid."""
    config = json.loads((REFERENCE / "hf_configs" / "llama-3.1-8b-instruct.json").read_text())
    open_page(page, url_state(LLAMA))
    expected = api(page, "/v1/plan", {**LLAMA, "model": {"hf_config": config}})
    assert expected.status_code == 200, expected.text
    page.check("#model-source-hf")
    page.fill("#hf-config", "\ufeff" + json.dumps(config))
    wait_until(
        page, "() => window.commplan.state.plan && window.commplan.state.request.model.hf_config", timeout=30_000
    )
    wait_until(
        page, "(n) => window.commplan.state.plan.params_total === n", expected.json()["params_total"], timeout=30_000
    )
    for key in ("rope_theta", "hidden_size"):
        page.fill("#hf-config", json.dumps(config)[:-1] + f', "{key}": 1e400' + "}")
        errors = page.locator("#form-errors")
        expect(errors).to_contain_text(
            f"config.json's {key} is a number too large in magnitude for a 64-bit float", timeout=30_000
        )
        expect(errors).not_to_contain_text("null")
        assert page.evaluate("document.getElementById('hf-config').getAttribute('aria-invalid')") == "true"


def test_the_sla_table_and_the_pools_fit_a_phone(make_page):  # noqa: F811
    """At 390 px the SLA search's table was 753 px wide in its 341 px frame, TTFT and TPOT, the SLA's own columns,
    400 px to the right; the pools' table 598 px, its tokens/s and memory cut. The engine folds into the pools' cell,
    per user, a pool's batch and its calls per step go (as the ledger's wide columns do), and the cells are smaller."""
    phone = make_page(PHONE)
    open_page(phone, url_state(LLAMA))
    phone.select_option("#serve-scenario", "dsv3-pd")
    expect(phone.locator("#serve-results")).to_be_visible(timeout=60_000)
    serve_idle(phone)
    phone.fill("#serve-sla-ttft", "30000")
    phone.fill("#serve-sla-tpot", "100")
    phone.click("#serve-search-run")
    wait_until(
        phone,
        "() => !document.getElementById('serve-search-status').textContent.startsWith('Searching')",
        timeout=120_000,
    )
    rows = phone.locator("#serve-search-table tbody tr")
    assert rows.first.is_visible(), phone.locator("#serve-search-status").inner_text()
    best = phone.evaluate("window.commplan.state.serveSearch.results[0]")
    cells = rows.first.locator("td")
    expect(cells.nth(5)).to_have_text(fmt(phone, "fmtTime", best["answer"]["ttft_s"]))
    expect(cells.nth(6)).to_have_text(fmt(phone, "fmtTime", best["answer"]["tpot_s"]))
    for frame, headers in (("#serve-search-table-wrap", ("TTFT", "TPOT")), ("#serve-pools", ("Step", "Tokens/s"))):
        wrap = phone.locator(frame).locator("xpath=ancestor-or-self::div[contains(@class, 'table-wrap')][1]")
        width, inside = wrap.evaluate("w => [w.scrollWidth, w.clientWidth]")
        assert width <= inside, (frame, width, inside)
        right = wrap.evaluate("w => w.getBoundingClientRect().right")
        for header in headers:
            cell = phone.locator(f"{frame} th", has_text=header).first
            assert cell.evaluate("c => c.getBoundingClientRect().right") <= right + 0.5, (frame, header)
    # the engine still said, in the pools' cell
    engine = {"sglang": "SGLang", "vllm": "vLLM", "trtllm": "TensorRT-LLM"}[best["engine"]]
    expect(cells.nth(2)).to_contain_text(engine)


def test_a_serving_search_over_the_limit_marks_nodes(page):  # noqa: F811
    """DeepSeek-V3's SLA search on 2,048 nodes: "Search failed: cluster: 2,610 deployments to plan, above the limit of
    2,000 (COMMPLAN_MAX_SERVE_CANDIDATES); narrow engines or modes, or a smaller cluster": nothing marked, the
    operator's setting named, and engines or modes the card has no control for (it searches them all)."""
    open_page(page, url_state(LLAMA))
    page.select_option("#serve-scenario", "dsv3-pd")
    expect(page.locator("#serve-results")).to_be_visible(timeout=60_000)
    serve_idle(page)
    for box, value in (("#serve-nodes", "2048"), ("#serve-sla-ttft", "30000"), ("#serve-sla-tpot", "100")):
        page.fill(box, value)
    body = {k: v for k, v in page.evaluate("window.commplan.serveBody()").items() if k not in ("engine", "deployment")}
    refused = api(page, "/v1/serve/search", {**body, "sla": {"ttft_s": 30.0, "tpot_s": 0.1}, "top_k": 10})
    assert refused.status_code == 422, refused.text
    detail = refused.json()["detail"][0]
    assert detail["loc"] == ["body", "cluster"], detail
    asked, limit = re.match(r"([\d,]+) deployments to plan, above the limit of ([\d,]+)", detail["msg"]).groups()
    said = (
        f"Search failed: Nodes (cluster): {asked} deployments to plan, above the limit of {limit} "
        "this server plans in one search; the card searches every engine and mode: fewer nodes narrow it"
    )
    page.click("#serve-search-run")
    status = page.locator("#serve-search-status")
    expect(status).to_contain_text(said, timeout=60_000)
    expect(status).not_to_contain_text("COMMPLAN_")
    assert page.evaluate("document.getElementById('serve-nodes').getAttribute('aria-invalid')") == "true"
