"""Round 11, a demanding user's walk (docs/page.md, user11): what the page said wrong or left out, each fixed and
held here. The serving KV transfer card said the request's KV ("197 MB per request from 8 ranks") but not what
the transfer moves (`kv_transfer.wire_bytes`, twice that where a pool's tp passes the KV heads); the topology's
heading said "first group highlighted" over the KV transfer's drawing, and the emptied explorer kept "Time against
message size on this call's groups." with no call."""

from __future__ import annotations

import httpx
import pytest
from playwright.sync_api import expect

from tests.frontend.test_page import LLAMA, browser, open_page, page, url_state, wait_until  # noqa: F401

pytestmark = pytest.mark.browser

# Qwen3-30B-A3B (4 KV heads) served by SGLang, prefill TP 8 -> decode TP 4 on 2 DGX H100: the prefill ranks hold
# each KV head twice and SGLang sends every copy (docs/serving.md "KV heads replicated past TP"): 196.6 MB of KV,
# 393.2 MB on the wire from 8 ranks
QWEN3 = {
    "model": {"preset": "qwen3-30b-a3b"},
    "cluster": {"preset": "dgx-h100", "num_nodes": 2},
    "engine": "sglang",
    "traffic": {"input_tokens": 2000, "output_tokens": 200, "concurrency": 64},
    "options": {"weight_dtype": "bf16"},
    "deployment": {"pools": [{"role": "prefill", "workers": 1, "tp": 8}, {"role": "decode", "workers": 1, "tp": 4}]},
}


def fill_qwen3(page):  # noqa: F811
    page.select_option("#serve-model", "qwen3-30b-a3b")
    page.fill("#serve-nodes", "2")
    page.select_option("#serve-engine", "sglang")
    page.select_option("#serve-mode", "disaggregated")
    for prefix, tp in (("serve-p", "8"), ("serve-d", "4")):
        page.fill(f"#{prefix}-workers", "1")
        page.fill(f"#{prefix}-tp", tp)
        page.fill(f"#{prefix}-dp", "1")
        page.fill(f"#{prefix}-ep", "1")
    page.fill("#serve-isl", "2000")
    page.fill("#serve-osl", "200")
    page.select_option("#serve-load", "concurrency")
    page.fill("#serve-concurrency", "64")
    page.click("#serve-run")


def test_the_kv_transfer_card_says_what_goes_on_the_wire(page):  # noqa: F811
    """The card and the drawn transfer's sentence give the request's KV and the wire bytes, the server's own
    numbers: 2x for Qwen3 at prefill TP 8 -> decode TP 4 (SGLang fills every copy), said as replicated heads; the
    same bytes, without that phrase, for DeepSeek-V3's MLA latent."""
    open_page(page, url_state(LLAMA))
    fill_qwen3(page)
    card = page.locator('[data-card="kv-transfer"] .hint')
    expect(card).to_contain_text("on the wire", timeout=60_000)
    served = httpx.post(page.base + "/v1/serve", json=QWEN3, timeout=60).json()["kv_transfer"]
    shown = page.evaluate("window.commplan.state.serve.kv_transfer")
    assert {k: shown[k] for k in ("bytes_per_request", "wire_bytes", "senders")} == {
        k: served[k] for k in ("bytes_per_request", "wire_bytes", "senders")
    }
    assert (served["bytes_per_request"], served["wire_bytes"], served["senders"]) == (196_608_000, 393_216_000, 8)
    want = page.evaluate(
        "(k) => [window.commplan.fmtBytes(k.bytes_per_request), window.commplan.fmtBytes(k.wire_bytes)]", served
    )
    assert want == ["197 MB", "393 MB"]
    text = card.inner_text()
    assert f"{want[0]} per request, {want[1]} on the wire from 8 ranks (replicated KV heads" in text, text
    # drawn on the topology: the card's sentence says it too, the heading names the transfer, the explorer is empty
    page.click("#serve-draw")
    expect(page.locator("#detail-title")).to_have_text("Serving: the KV transfer", timeout=30_000)
    expect(page.locator("#detail-text")).to_contain_text(f"{want[1]} on the wire from 8 ranks")
    hint = page.locator("#topology-hint")
    expect(hint).to_have_text("(the transfer's devices highlighted; links coloured by utilisation)")
    expect(page.locator("#explorer-hint")).to_be_hidden()
    # a ledger row brings a call, its heading and its explorer hint back
    page.locator("#ledger tbody tr", has_text="dp.grads").first.click()
    expect(hint).to_have_text("(first group highlighted; links coloured by utilisation)")
    expect(page.locator("#explorer-hint")).to_be_visible()
    # DeepSeek-V3's latent moves once from one attention rank: the wire is the KV, no copies named
    page.select_option("#serve-scenario", "dsv3-pd")
    expect(card).to_contain_text("from 1 rank", timeout=60_000)
    k = page.evaluate("window.commplan.state.serve.kv_transfer")
    assert k["wire_bytes"] == k["bytes_per_request"] == 140_544_000  # 70,272 B/token x 2,000 tokens
    assert card.inner_text().startswith("141 MB per request, 141 MB on the wire from 1 rank; busiest link ")
    assert "replicated" not in card.inner_text()


# the controls a newcomer sets first: the form's workload, layout and cluster, the search's and the serving card's
# own; each said nothing on hover (the model fields, More settings and the calibration card already did)
EXPLAINED = [
    "scenario", "kind", "micro-batch", "global-batch", "recompute", "tp", "pp", "dp", "cp", "ep", "zero", "sp",
    "schedule", "vpp", "framework", "first-layers", "last-layers", "nodes", "algorithm", "search-topk",
    "search-framework", "serve-scenario", "serve-model", "serve-nodes", "serve-engine", "serve-mode", "serve-isl",
    "serve-osl", "serve-load", "serve-concurrency", "serve-weights", "serve-kv", "serve-sla-ttft", "serve-sla-tpot",
    *(f"serve-{pool}-{f}" for pool in "apd" for f in ("workers", "tp", "dp", "ep", "adp", "dispatch")),
]  # fmt: skip


def test_every_first_control_says_what_it_does(page):  # noqa: F811
    """Each control above has a title of its own words (at least five); the KV cache's blank option said "as the
    weights" while fp8 weights keep a bf16 cache (planner/serving/spec.py ServeOptions.kv): it names bf16, and the
    DeepSeek-V3 scenario's fp8 weights with it hold 70.3 KB a token, (512 + 64) x 61 layers x 2 B."""
    open_page(page, url_state(LLAMA))
    titles = page.evaluate("(ids) => ids.map((id) => [id, document.getElementById(id).title])", EXPLAINED)
    missing = [i for i, t in titles if len(t.split()) < 5]
    assert not missing, missing
    assert len({t for _, t in titles}) >= len(titles) - 2 * 6  # the three pools share their six titles
    assert page.locator("#serve-kv option[value='']").inner_text() == "default (bf16)"
    page.select_option("#serve-scenario", "dsv3-pd")
    expect(page.locator('[data-card="kv"] .hint')).to_contain_text("70.3 KB per token", timeout=60_000)
    assert page.evaluate("window.commplan.serveBody().options") == {"weight_dtype": "fp8", "two_batch_overlap": True}
    assert page.evaluate("window.commplan.state.serve.kv_cache.bytes_per_token") == (512 + 64) * 61 * 2


@pytest.mark.parametrize("box", ["sp", "search-framework", "serve-p-adp"])
def test_a_check_box_sits_beside_its_words(page, box):  # noqa: F811
    """A check field's box was as wide as its field (inputs are width 100%), drawn in the middle of it: 40-70 px
    from its words ("Keep the framework"), and a pool's "Attention-DP" floated mid-field (.check centres its
    items). Now the box is its own width at the field's left edge and the words follow it."""
    open_page(page, url_state(LLAMA))
    page.select_option("#serve-mode", "disaggregated")  # the prefill pool's fields on show
    gap = page.evaluate(
        """(id) => { const box = document.getElementById(id), r = box.getBoundingClientRect();
          const field = box.closest('.field').getBoundingClientRect();
          const range = document.createRange(); range.selectNodeContents(box.parentElement);
          const words = [...range.getClientRects()].filter((q) => q.left >= r.right - 1);
          return [r.width, Math.min(...words.map((q) => q.left)) - r.right, r.left - field.left]; }""",
        box,
    )
    assert gap[0] < 24 and 0 <= gap[1] < 12 and 0 <= gap[2] < 8, gap


# the DeepSeek-V3 training scenario (frontend/js/form.js SCENARIOS "dsv3"): 16 stages, 240 micro-batches, 79 lanes
DSV3 = {
    "model": {"preset": "deepseek-v3"},
    "workload": {"kind": "training", "micro_batch_size": 1, "global_batch_size": 15360},
    "parallel": {"tp": 2, "pp": 16, "dp": 64, "ep": 64, "zero_stage": 1, "sequence_parallel": True,
                 "first_stage_layers": 3, "last_stage_layers": 2},
    "cluster": {"preset": "dgx-h100", "num_nodes": 256},
    "options": {"algorithm": "auto", "links_per_call": 24},
}  # fmt: skip


def test_every_lane_of_a_big_timeline_is_drawn(page):  # noqa: F811
    """DeepSeek-V3's timeline is 25,578 blocks on 79 lanes; past ECharts' progressive threshold (3,000) its custom
    series drew the first chunks and stopped: two lanes had blocks, 77 read idle for the whole step. Every lane
    with blocks now has pixels of a block's colour on its centre line of the chart's canvas."""
    open_page(page, url_state(DSV3))
    expect(page.locator("#timeline-note")).to_contain_text("79 lanes", timeout=60_000)
    page.wait_for_timeout(500)
    drawn = page.evaluate(
        """() => {
          const c = window.commplan.state.charts.timeline, lanes = c.getOption().yAxis[0].data.length;
          const events = c.getOption().series[1].data, busy = new Set(events.map((d) => d.value[0]));
          const canvas = document.querySelector('#timeline canvas'), ctx = canvas.getContext('2d');
          const ratio = canvas.width / canvas.clientWidth, grid = c.getModel().getComponent('grid', 0).coordinateSystem;
          const r = grid.getRect(), out = [];
          for (let lane = 0; lane < lanes; lane++) {
            const y = Math.round(c.convertToPixel({ gridIndex: 0 }, [0, lane])[1] * ratio);
            const row = ctx.getImageData(Math.round(r.x * ratio), y, Math.round(r.width * ratio), 1).data;
            let coloured = 0;  // neither the idle grey (#e9eef4) nor the background
            for (let i = 0; i < row.length; i += 4) {
              const [R, G, B] = [row[i], row[i + 1], row[i + 2]];
              const idle = Math.abs(R - 0xe9) < 6 && Math.abs(G - 0xee) < 6 && Math.abs(B - 0xf4) < 6;
              if (!idle && R + G + B < 700) coloured++;
            }
            out.push([lane, busy.has(lane), coloured]);
          }
          return [events.length, out]; }"""
    )
    count, lanes = drawn
    assert count > 3000 and len(lanes) == 79, (count, len(lanes))
    blank = [lane for lane, busy, coloured in lanes if busy and coloured == 0]
    assert not blank, blank
    # and each lane at least 14 px apart, so its 11 px label does not print over the next (they were 8 px apart)
    step = page.evaluate(
        """() => { const c = window.commplan.state.charts.timeline;
          return c.convertToPixel({ gridIndex: 0 }, [0, 1])[1] - c.convertToPixel({ gridIndex: 0 }, [0, 0])[1]; }"""
    )
    assert step >= 14, step


def test_a_refused_deployment_names_and_marks_the_cards_own_control(page):  # noqa: F811
    """A 422 on a pool's field read as its path alone ("deployment.pools.0.ep: ...") and fp8 weights on an A100 as
    "options.fp8_recipe: ...", a field the card has no control for; each now names the card's control (the pool's
    legend and label; the weights select) beside the path, and marks it until the next plan."""
    open_page(page, url_state(LLAMA))
    page.select_option("#serve-scenario", "dsv3-pd")
    expect(page.locator("#serve-results")).to_be_visible(timeout=60_000)
    page.fill("#serve-p-ep", "7")
    page.click("#serve-run")
    status = page.locator("#serve-status")
    lead = "Cannot plan this deployment: "
    expect(status).to_have_text(
        f"{lead}Prefill pool EP (deployment.pools.0.ep): num_experts 256 is not divisible by ep 7", timeout=30_000
    )
    assert page.locator("#serve-card [aria-invalid=true]").evaluate_all("els => els.map((e) => e.id)") == ["serve-p-ep"]
    page.fill("#serve-p-ep", "32")
    page.click("#serve-run")
    expect(status).to_have_text("", timeout=30_000)
    assert page.locator("#serve-card [aria-invalid=true]").count() == 0
    # fp8 weights on the form's A100s: the weights select, whose default recipe (blockwise) needs sm 9.0
    a100 = {**LLAMA, "cluster": {"preset": "dgx-a100", "num_nodes": 64}}
    open_page(page, url_state(a100))
    assert page.evaluate("window.commplan.state.request.cluster.preset") == "dgx-a100"
    page.select_option("#serve-model", "llama3-8b")
    page.fill("#serve-nodes", "1")
    page.select_option("#serve-engine", "vllm")
    page.select_option("#serve-mode", "aggregated")
    page.fill("#serve-a-tp", "8")
    page.select_option("#serve-weights", "fp8")
    page.click("#serve-run")
    want = "Weights (options.fp8_recipe): fp8 weights under fp8_recipe 'blockwise' need compute capability >= 9.0"
    expect(status).to_contain_text(f"{lead}{want}", timeout=30_000)
    assert page.locator("#serve-card [aria-invalid=true]").evaluate_all("els => els.map((e) => e.id)") == [
        "serve-weights"
    ]


def test_a_link_opened_over_the_page_plans_what_it_holds(page):  # noqa: F811
    """A shared link opened in a tab already on the page differs only in its hash: the browser does not load the
    page again, and the page kept its own plan (the 70B on H100s under a link to A100s). It plans the link's."""
    open_page(page, url_state(LLAMA))
    assert page.evaluate("window.commplan.state.request.cluster.preset") == "dgx-h100"
    a100 = {**LLAMA, "cluster": {"preset": "dgx-a100", "num_nodes": 64}}
    with page.expect_event("load", timeout=30_000):  # the hash changes, then the page loads it as a new visit
        page.goto(page.base + "/" + url_state(a100))
    wait_until(page, "window.commplan && window.commplan.state.plan && window.commplan.state.plan.world_size > 0")
    expect(page.locator("#cluster-preset")).to_have_value("dgx-a100")
    expect(page.locator("#status")).to_contain_text("512 devices")
    assert page.evaluate("window.commplan.state.plan.cluster.gpu.name").startswith("A100")


def test_keep_the_framework_of_a_flavour_the_search_does_not_propose(page):  # noqa: F811
    """The form on Megatron-LM 2021-22 (a plan flavour only) with "Keep the framework" ticked, the default: the search
    failed with two pydantic union errors run together; it now names the box, says why and which are searched, and
    marks the box."""
    request = {**LLAMA, "parallel": {**LLAMA["parallel"], "framework": "megatron-lm-2021"}}
    open_page(page, url_state(request))
    page.click("#search-run")
    expect(page.locator("#search-status")).to_have_text(
        "Search failed: Keep the framework (constraints.framework): Value error, framework 'megatron-lm-2021' is a "
        "flavour the search does not propose (Megatron-LM 2021-22: a plan of a run of its time); searched: megatron, "
        "torch, deepspeed",
        timeout=30_000,
    )
    expect(page.locator("#search-framework")).to_have_attribute("aria-invalid", "true")


def test_a_headroom_of_100_percent_is_refused_in_percent(page):  # noqa: F811
    """The headroom box is a percent, the request's field a fraction: 100 read "Input should be less than 1, got 1.0"
    beside a box holding 100 (r11b); the refusal now speaks the box's unit and marks it."""
    open_page(page, url_state(LLAMA))
    page.fill("#search-headroom", "100")
    page.click("#search-run")
    expect(page.locator("#search-status")).to_contain_text(
        "(constraints.memory_headroom): must be at least 0% and under 100% of the device's memory, got 100%",
        timeout=30_000,
    )
    expect(page.locator("#search-headroom")).to_have_attribute("aria-invalid", "true")
