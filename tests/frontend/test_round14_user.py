"""Round 14, a demanding user's walk (docs/page.md, user14): what the page drew or said that the plan does not hold.
Rounding gaps between a step's passes drawn as pipeline waits (a whole pp lane on a plan with no pipeline); a training
plan that does not fit shown with its step time, MFU and tokens/s as a run; the SLA search's TTFT and TPOT pushed
out of view by the pools at 1440 px; an inference pass's calls said to be "outside the passes"."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import expect

from tests.frontend.test_page import (  # noqa: F401
    LLAMA,
    PHONE,
    browser,
    make_page,
    open_page,
    page,
    url_state,
    wait_until,
)

pytestmark = pytest.mark.browser

# Llama-3.1 405B at TP8 PP1 on one DGX H100: 1,024 micro-batches in one aggregated block, 982 GB a device
TOO_BIG = {
    **LLAMA,
    "model": {"preset": "llama3-405b"},
    "parallel": {"tp": 8, "pp": 1, "dp": 1, "zero_stage": 1, "sequence_parallel": True},
    "cluster": {"preset": "dgx-h100", "num_nodes": 1},
}
DECODE = {
    "model": {"preset": "llama3-70b"},
    "workload": {"kind": "inference", "phase": "decode", "batch_size": 64, "context_length": 8192},
    "parallel": {"tp": 8, "pp": 1, "dp": 1},
    "cluster": {"preset": "dgx-h100", "num_nodes": 1},
    "options": {"algorithm": "auto", "links_per_call": 24},
}
WAITS = """async () => { const m = await import('/static/js/timeline.js'), p = window.commplan.state.plan;
  return m.derive(m.expand(p.step.timeline).events).filter((e) => e.wait).map((e) => e.end_s - e.start_s); }"""


def api_plan(page, request: dict) -> dict:  # noqa: F811
    """The API's answer to the request the page sends (review r14c, 6: the page's numbers checked against it, not
    pinned planner numbers that any kernel constant moves)."""
    r = httpx.post(page.base + "/v1/plan", json=request, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


def fmt(page, name: str, value):  # noqa: F811
    """``value`` in the page's own formatter (frontend/js/format.js ``name``)."""
    return page.evaluate("async ([n, x]) => (await import('/static/js/format.js'))[n](x)", [name, value])


def lanes(page):  # noqa: F811
    return page.evaluate("window.commplan.state.charts.timeline.getOption().yAxis[0].data")


def test_rounding_gaps_are_not_pipeline_waits(page):  # noqa: F811
    """Passes laid at t + i x period end a float64 rounding (1e-16 to 1e-12 s) before the next starts; each such gap
    was drawn as a pipeline wait. At PP1 (no pipeline) that made a "stage 0 · pp" lane of 476 orange slivers, a
    "pipeline wait" legend entry and its sentence; on the 70B TP8 PP4 plan 5 of its 194 waits were 4e-16 to 4e-15 s."""
    open_page(page, url_state(TOO_BIG))
    assert page.evaluate(WAITS) == []
    assert lanes(page) == ["stage 0 · compute", "stage 0 · dp", "stage 0 · tp"]
    legend = page.eval_on_selector_all("#timeline-legend li", "els => els.map(e => e.textContent)")
    assert "pipeline wait" not in legend and "tp exposed" in legend, legend
    expect(page.locator("#timeline-note")).not_to_contain_text("Orange (pp lanes)")
    open_page(page, url_state(LLAMA))
    waits = page.evaluate(WAITS)
    # the fill and drain waits and the steady state's sends on 4 stages, none a rounding sliver (under 1 us)
    assert waits and min(waits) > 1e-6, (len(waits), min(waits))
    assert "stage 0 · pp" in lanes(page)


def test_a_training_plan_that_does_not_fit_is_not_shown_as_a_run(page):  # noqa: F811
    """Llama-3.1 405B on one DGX H100 read "Step time 1.40 h, MFU 55.2%, Tokens / s 1.66 K" in full colour, the
    reason in a warning above: the cards now stand under a verdict, greyed, as the Serve card's since round 13."""
    open_page(page, url_state(LLAMA))
    expect(page.locator("#plan-verdict")).to_be_hidden()
    open_page(page, url_state(TOO_BIG))
    api = api_plan(page, TOO_BIG)
    memory = api["memory"]
    assert page.evaluate("window.commplan.state.plan.memory") == memory
    peak, cap = memory["per_stage"][0]["peak_bytes"], memory["capacity_bytes"]
    assert memory["fits"] is False and peak > cap
    # the verdict in the API memory warning's words and unit (GB per rank, review r14c, 5), a phrase of that warning
    said = f"stage 0 needs {peak / 1e9:.1f} GB per rank > {cap / 1e9:.1f} GB capacity"
    assert any(said in w for w in api["warnings"]), api["warnings"]
    expect(page.locator("#plan-verdict")).to_have_text(
        f"Does not fit: {said}. The step time, MFU and tokens/s below are what it would do if it fit, not a run: see "
        "Memory per device."
    )
    colour = "el => getComputedStyle(el).color"
    muted = page.locator('[data-card="step"] .metric').evaluate(colour)
    assert muted == page.locator('[data-card="mfu"] .metric').evaluate(colour) == "rgb(74, 89, 104)"  # --muted
    assert page.locator('[data-card="sent"] .metric').evaluate(colour) == "rgb(21, 32, 43)"  # --ink: bytes hold
    expect(page.locator("#warnings")).not_to_contain_text("The plan does not fit in device memory")
    # two stages over of two: the worst named, and how many
    two = {**TOO_BIG, "parallel": {**TOO_BIG["parallel"], "pp": 2}, "cluster": {**TOO_BIG["cluster"], "num_nodes": 2}}
    open_page(page, url_state(two))
    memory = api_plan(page, two)["memory"]
    stages = memory["per_stage"]
    worst = max(stages, key=lambda st: st["peak_bytes"])
    assert len(stages) == 2 and all(st["peak_bytes"] > memory["capacity_bytes"] for st in stages)
    expect(page.locator("#plan-verdict")).to_contain_text(
        f"Does not fit: stage {worst['stage']} needs {worst['peak_bytes'] / 1e9:.1f} GB per rank > "
        f"{memory['capacity_bytes'] / 1e9:.1f} GB capacity (2 of 2 stages over)."
    )


def test_a_plan_that_does_not_fit_says_so_in_the_phone_s_first_line(make_page):  # noqa: F811
    """At 390 px the line over the form said "Step time 1.40 h, MFU 55.2%." for 982 GB a device of 85.5."""
    phone = make_page(PHONE)
    for request, tail in ((TOO_BIG, " Does not fit in memory."), (LLAMA, "")):
        open_page(phone, url_state(request))
        step = api_plan(phone, request)["step"]
        time_s, mfu = fmt(phone, "fmtTime", step["time_s"]), fmt(phone, "fmtPct", step["mfu"])
        expect(phone.locator("#see-result-text")).to_have_text(f"Step time {time_s}, MFU {mfu}.{tail}")


def test_the_sla_search_shows_ttft_and_tpot_in_its_frame(page):  # noqa: F811
    """DeepSeek-V3's deployments under a 30 s / 100 ms SLA: each row's pools on one line ("prefill 4× DP16 EP16
    attention-DP + decode 1× DP32 EP32 attention-DP (96 GPUs)") made the table 1,133 px wide in its 1,015 px frame at
    1440 px, TTFT and TPOT, the SLA's own columns, behind a sideways scroll."""
    open_page(page, url_state(LLAMA))
    page.select_option("#serve-scenario", "dsv3-pd")
    expect(page.locator("#serve-results")).to_be_visible(timeout=60_000)
    page.fill("#serve-sla-ttft", "30000")
    page.fill("#serve-sla-tpot", "100")
    page.click("#serve-search-run")
    expect(page.locator("#serve-search-table tbody tr").first).to_be_visible(timeout=60_000)
    wrap = page.locator("#serve-search-table-wrap")
    width, frame = wrap.evaluate("w => [w.scrollWidth, w.clientWidth]")
    assert width <= frame, (width, frame)
    right = wrap.evaluate("w => w.getBoundingClientRect().right")
    for header in ("TTFT", "TPOT"):
        cell = page.locator("#serve-search-table th", has_text=header)
        assert cell.evaluate("c => c.getBoundingClientRect().right") <= right + 0.5, header


def test_an_inference_pass_says_its_calls_are_inside_it(page):  # noqa: F811
    """The 70B decode step (TP8, 64 sequences) is one forward block of 27.7 ms, its 6.50 ms of TP calls inside it
    (planner/step.py _inference; the card: 6.50 ms exposed). The note said "tp 6.50 ms of calls: 0 s exposed, 0 s
    overlapped, 6.50 ms once per iteration (outside the passes)" and "1 events on 1 lanes"."""
    open_page(page, url_state(DECODE))
    wait_until(page, "window.commplan.state.plan.step.timeline.length === 1")
    tp = page.evaluate("window.commplan.state.plan.totals.by_parallelism.tp.time_s")
    assert tp == pytest.approx(page.evaluate("window.commplan.state.plan.step.exposed_comm_s"), rel=1e-9)
    api = api_plan(page, DECODE)
    block = api["step"]["timeline"][0]
    pass_s, tp_s = fmt(page, "fmtTime", block["end_s"] - block["start_s"]), fmt(page, "fmtTime", tp)
    assert tp == api["totals"]["by_parallelism"]["tp"]["time_s"] and len(api["step"]["timeline"]) == 1
    note = page.locator("#timeline-note")
    expect(note).to_contain_text(f"1 event on 1 lane over {pass_s}.")
    expect(note).to_contain_text(f"Stage 0: tp {tp_s} of calls, inside the compute blocks (not drawn apart).")
    expect(note).not_to_contain_text("outside the passes")
    expect(note).not_to_contain_text("Per pass, tp, cp and ep are drawn")


def test_the_model_facts_are_never_of_another_config(page):  # noqa: F811
    """The facts under a pasted config.json are the last plan's: after Kimi K2 planned, a pasted GLM-4.5 refused at
    the layout read "61 layers, ... 384 experts (top 8), 1026.41B parameters" under GLM-4.5's 92-layer text, and a
    refused Jamba "(its max_position_embeddings is 1,048,576 ...)" beside Kimi's layers."""
    configs = Path(__file__).resolve().parents[1] / "reference" / "hf_configs"
    request = {
        **LLAMA,
        "model": {"hf_config": json.loads((configs / "kimi-k2-instruct.json").read_text())},
        "parallel": {"tp": 8, "pp": 4, "dp": 16, "ep": 8, "zero_stage": 1, "sequence_parallel": True},
    }
    request["parallel"] = {**request["parallel"], "first_stage_layers": 16, "last_stage_layers": 15}
    open_page(page, url_state(request))
    facts = page.locator("#model-facts")
    expect(facts).to_contain_text("Read from config.json: 61 layers, hidden 7,168, 64 heads / 64 KV")
    expect(facts).to_contain_text("384 experts (top 8)")
    for name in ("glm-4.5.json", "jamba-v0.1.json"):
        page.fill("#hf-config", (configs / name).read_text())
        expect(page.locator("#form-errors")).to_be_visible()
        expect(facts).to_have_text("Not read: nothing was planned with this config.json (the message above says why).")
    # typed, not yet planned (read in the input event itself, before any answer): not the last plan's either
    typed = (
        (configs / "kimi-k2-instruct.json").read_text().replace('"num_hidden_layers": 61', '"num_hidden_layers": 60')
    )
    read = page.evaluate(
        """(text) => { const box = document.getElementById("hf-config"); box.value = text;
             box.dispatchEvent(new Event("input", { bubbles: true }));
             return document.getElementById("model-facts").textContent; }""",
        typed,
    )
    assert read == "Read when planned: layers, width and parameters appear here."


def test_enter_in_a_box_runs_its_card(page):  # noqa: F811
    """Keyboard only: a micro-batch typed and Enter, an SLA typed and Enter, the Serve card's concurrency typed and
    Enter did nothing; each now does what its card's button does."""
    open_page(page, url_state(LLAMA))
    page.fill("#timeline-mb", "10")
    page.press("#timeline-mb", "Enter")
    expect(page.locator("#timeline-zoom-note")).to_contain_text("micro-batch 10:")
    page.select_option("#serve-scenario", "dsv3-pd")
    expect(page.locator("#serve-results")).to_be_visible(timeout=60_000)
    wait_until(page, "() => document.getElementById('serve-status').textContent === ''", timeout=60_000)
    page.evaluate("window.commplan.state.serve = null")
    page.fill("#serve-concurrency", "256")
    page.press("#serve-concurrency", "Enter")
    wait_until(page, "window.commplan.state.serve", timeout=60_000)
    assert page.evaluate("window.commplan.serveBody().traffic.concurrency") == 256
    expect(page.locator('[data-card="ttft"] .metric')).not_to_have_text("14.7 s")  # 2,048 concurrent: 14.7 s
    page.fill("#serve-sla-ttft", "30000")
    page.fill("#serve-sla-tpot", "100")
    page.press("#serve-sla-tpot", "Enter")
    expect(page.locator("#serve-search-table tbody tr").first).to_be_visible(timeout=60_000)


def test_a_search_where_nothing_fits_says_what_would_help(page):  # noqa: F811
    """Llama-3.1 405B on one DGX H100: every layout sized needs more memory than a device holds. The search ended
    "... need more memory than the device has less 5% headroom. No layout fits." with no example and no way out."""
    open_page(page, url_state(TOO_BIG))
    page.click("#search-run")
    status = page.locator("#search-status")
    expect(status).to_contain_text("No layout fits", timeout=60_000)
    result = page.evaluate("window.commplan.state.search")
    assert result["results"] == [] and result["feasible"] == 0
    assert result["pruned"]["memory"] == result["evaluated"] - result["bounded_before_memory"] > 0
    expect(status).to_contain_text(
        "No layout fits: every layout sized needs more memory than a device holds, e.g. "
        f'"{result["pruned_examples"]["memory"]}"; more nodes, a GPU with more memory or a lower memory headroom '
        "would let some fit."
    )


def test_a_pool_refused_whole_is_named_and_marked(page):  # noqa: F811
    """DeepSeek-V3's serving scenario on a GB200 NVL72 form: its 32-GPU prefill worker neither fills nor divides a
    72-GPU rack. The card said "deployment.pools.0: a worker's tp*pp*dp = ..." (a path) and marked nothing."""
    gb200 = {
        **LLAMA,
        "workload": {**LLAMA["workload"], "global_batch_size": 1152},
        "parallel": {**LLAMA["parallel"], "dp": 18},
        "cluster": {"preset": "gb200-nvl72", "num_nodes": 8},
    }
    open_page(page, url_state(gb200))
    page.select_option("#serve-scenario", "dsv3-pd")
    status = page.locator("#serve-status")
    expect(status).to_have_text(
        "Cannot plan this deployment: Prefill pool (deployment.pools.0): a worker's tp*pp*dp = 1*1*32 = 32 GPUs must "
        "fill whole nodes of 72 or divide one",
        timeout=60_000,
    )
    expect(page.locator("#serve-p-tp")).to_have_attribute("aria-invalid", "true")


def test_a_nearest_valid_layout_keeps_the_global_batch_valid(page):  # noqa: F811
    """512 DGX H100 GPUs switched to GB200 NVL72 racks (504): the fixes offered were "4 nodes, DP 9" and "8 nodes,
    DP 18", and either led to "global_batch_size 1024 is not divisible by micro_batch_size*dp = 1*9 = 9". Each now
    moves the global batch to the nearest multiple too, and plans."""
    open_page(page, url_state(LLAMA))
    page.select_option("#cluster-preset", "gb200-nvl72")
    errors = page.locator("#form-errors")
    expect(errors).to_contain_text("but the cluster has 504 devices", timeout=20_000)
    fixes = errors.locator("button.fix")
    expect(fixes).to_have_text(["4 nodes, DP 9, global batch 1,026", "8 nodes, DP 18, global batch 1,026"])
    fixes.nth(1).click()
    expect(page.locator("#status")).to_contain_text("576 devices", timeout=20_000)
    expect(errors).to_be_hidden()
    request = page.evaluate("window.commplan.state.planned")
    assert (request["parallel"]["dp"], request["cluster"]["num_nodes"], request["workload"]["global_batch_size"]) == (
        18,
        8,
        1026,
    )


def test_a_serving_fit_s_errors_never_read_minus_zero(page):  # noqa: F811
    """One `vllm bench serve` run (the vLLM docs' sample) fitted on the Llama-3 70B serving scenario: two factors fit
    it exactly, and the row read "71.5 ms (-0.0%)" beside "+0.0%" (a -4e-9 error signed before rounding); the status
    gave a median of |errors| a sign, "+50.2% before"."""
    open_page(page, url_state(LLAMA))
    page.select_option("#serve-scenario", "llama70b-vllm")
    expect(page.locator("#serve-results")).to_be_visible(timeout=60_000)
    runs = Path(__file__).resolve().parents[1] / "reference" / "serving" / "vllm-bench-serve-docs.txt"
    page.fill("#serve-calib-text", runs.read_text())
    page.click("#serve-calib-run")
    expect(page.locator("#serve-calib-results")).to_be_visible(timeout=60_000)
    result = page.evaluate("window.commplan.state.serveCalibration")
    before = result["median_error_before"]
    expect(page.locator("#serve-calib-status")).to_contain_text(
        f"median |error| of TTFT and TPOT {100 * abs(before):.1f}% before, 0.0% after."
    )
    table = page.locator("#serve-calib-table").inner_text()
    assert "-0.0%" not in table and table.count("(+0.0%)") == 2, table
