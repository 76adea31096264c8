"""Review r13b's page findings, mended (mend13d, docs/page.md and docs/serving.md): the timeline's "Zoom to" range is
the chart's own (a rank's chunk passes under interleaved, V and DualPipe schedules), the layout-product refusal marks
the control of either side changed last (Nodes too), and the Serve card's MTP acceptance is a rate, 1 included, the
mean tokens a step its own box."""

from __future__ import annotations

import httpx
import pytest
from playwright.sync_api import expect

from tests.frontend.test_page import LLAMA, browser, open_page, page, url_state, wait_until  # noqa: F401
from tests.frontend.test_round13_user import serve_dsv3, serve_replan

pytestmark = pytest.mark.browser

MARKED = "[...document.querySelectorAll('[aria-invalid]')].map((e) => e.id)"


def _interleaved(schedule: str, **extra) -> dict:
    """Llama-3-8B at 8 layers, TP2 PP4 DP2 on two DGX H100s, global batch 32 of micro-batch 1: m = 16."""
    return {
        "model": {"preset": "llama3-8b", "num_layers": 8},
        "workload": {"kind": "training", "micro_batch_size": 1, "global_batch_size": 32},
        "parallel": {"tp": 2, "pp": 4, "dp": 2, "zero_stage": 1, "pipeline_schedule": schedule, **extra},
        "cluster": {"preset": "dgx-h100", "num_nodes": 2},
    }


@pytest.mark.parametrize(
    ("request_", "drawn", "note"),
    [
        # interleaved v = 2: the timeline numbers a rank's 16 x 2 chunk passes 0 to 31 (review r13b #2: "numbered 0 to
        # 15" beside a zoom to 20 that worked)
        (
            _interleaved("interleaved", virtual_pipeline_stages=2),
            32,
            "no micro-batch 40 in this step: they are numbered 0 to 31, one a chunk pass: 16 micro-batches × 2 chunks "
            "a rank",
        ),
        # 1F1B: one chunk, the micro-batches themselves
        (_interleaved("1f1b"), 16, "no micro-batch 40 in this step: they are numbered 0 to 15"),
    ],
    ids=["interleaved-v2", "1f1b"],
)
def test_the_zoom_range_is_the_one_the_chart_draws(page, request_, drawn, note):  # noqa: F811
    open_page(page, url_state(request_))
    expect(page.locator("#timeline-card")).to_be_visible(timeout=30_000)
    wait_until(page, "() => window.commplan.state.plan && window.commplan.state.plan.step.timeline.length > 0")
    events = page.evaluate("window.commplan.state.plan.step.timeline")
    compute = [e for e in events if e["stream"] == "compute" and e["microbatches"] == 1]
    assert max(e["microbatch"] for e in compute) + 1 == drawn  # the server's own numbering, the chart's
    assert page.evaluate("window.commplan.state.plan.num_microbatches") == 16
    page.fill("#timeline-mb", str(drawn - 1))
    page.click("#timeline-zoom")
    expect(page.locator("#timeline-zoom-note")).to_contain_text(f"micro-batch {drawn - 1}: ")
    page.fill("#timeline-mb", "40")
    page.click("#timeline-zoom")
    expect(page.locator("#timeline-zoom-note")).to_have_text(note)
    expect(page.locator("#timeline-mb")).to_have_attribute("max", str(drawn - 1))


def test_the_layout_product_refusal_marks_nodes_when_nodes_changed(page):  # noqa: F811
    """The 70B scenario (TP8 PP4 DP16 on 64 DGX H100 nodes): Nodes 64 -> 32 is refused with 256 devices and marks
    Nodes, "Go to Nodes" (it marked TP, the factor typed by no one); a factor typed after it is the one marked, a
    cluster preset switched after that the preset; a link that cannot be planned, no edit on it, marks DP, the box the
    first fix button sets."""
    open_page(page, url_state(LLAMA))
    errors = page.locator("#form-errors")
    page.fill("#nodes", "32")
    expect(errors).to_contain_text("tp*cp*pp*dp = 8*1*4*16 = 512 but the cluster has 256 devices", timeout=15_000)
    assert page.evaluate(MARKED) == ["nodes"]
    expect(errors.locator("button.link", has_text="Go to")).to_have_text("Go to Nodes")
    expect(errors.locator("button.fix").first).to_have_text("DP 8")
    page.fill("#pp", "8")  # 8*1*8*16 = 1024 against 256: the factor now
    expect(errors).to_contain_text("= 1024 but the cluster has 256 devices", timeout=15_000)
    assert page.evaluate(MARKED) == ["pp"]
    # a switch of preset rewrites Nodes (256 DGX GPUs: 4 GB200 NVL72 racks, 288): the preset is the change marked
    page.select_option("#cluster-preset", "gb200-nvl72")
    expect(errors).to_contain_text("= 1024 but the cluster has 288 devices", timeout=15_000)
    assert page.evaluate(MARKED) == ["cluster-preset"]
    expect(errors.locator("button.link", has_text="Go to")).to_have_text("Go to Cluster preset")
    # a link with a bad product, no edit on this page: DP, the box the first fix button sets
    bad = {**LLAMA, "parallel": {**LLAMA["parallel"], "dp": 8}}
    with page.expect_event("load", timeout=30_000):  # a new hash: the page loads itself (main.js hashchange)
        page.goto(page.base + "/" + url_state(bad))
    expect(errors).to_contain_text("= 256 but the cluster has 512 devices", timeout=15_000)
    assert page.evaluate(MARKED) == ["dp"]


def test_the_serve_card_prices_an_acceptance_of_one_as_every_draft_kept(page):  # noqa: F811
    """DeepSeek-V3 with 1 draft token: a rate of 1 in the acceptance box is 2 tokens a step, the same TPOT as 2 in the
    tokens-per-step box and within 0.1 % of 0.999 (it was 54.0 ms against 26.1 ms); 1.5 in the rate box is refused at
    that box, the message naming tokens_per_step; the tokens box comes back from the link."""
    open_page(page, url_state(LLAMA))
    serve_dsv3(page)

    def tpot(fields: dict[str, str]) -> float | None:
        for box in ("acceptance", "tokens"):
            page.fill(f"#serve-mtp-{box}", fields.get(box, ""))
        page.fill("#serve-mtp-draft", "1")
        serve_replan(page)
        answer = page.evaluate("window.commplan.state.serve")
        return answer and answer["tpot_s"]

    near = tpot({"acceptance": "0.999"})
    one = tpot({"acceptance": "1"})
    assert page.evaluate("window.commplan.serveBody().options.mtp") == {"draft_tokens": 1, "acceptance": 1}
    two = tpot({"tokens": "2"})
    body = page.evaluate("window.commplan.serveBody()")
    assert body["options"]["mtp"] == {"draft_tokens": 1, "tokens_per_step": 2}
    assert one == two == httpx.post(page.base + "/v1/serve", json=body, timeout=60).json()["tpot_s"]
    assert one == pytest.approx(near, rel=1e-3)
    link = page.url
    assert tpot({"acceptance": "1.5"}) is None
    expect(page.locator("#serve-status")).to_contain_text(
        "MTP acceptance rate (options.mtp.acceptance): is a per-draft-token rate in [0, 1] (1: every draft accepted), "
        "got 1.5; a mean of 1.5 tokens a step is options.mtp.tokens_per_step"
    )
    expect(page.locator("#serve-mtp-acceptance")).to_have_attribute("aria-invalid", "true")
    open_page(page, "#s=" + link.split("#s=")[1])
    wait_until(page, "() => window.commplan && window.commplan.state.serve", timeout=60_000)
    expect(page.locator("#serve-mtp-tokens")).to_have_value("2")
    expect(page.locator("#serve-mtp-acceptance")).to_have_value("")
