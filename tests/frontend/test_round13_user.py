"""Round 13, a demanding user's walk (docs/page.md, user13): what the page showed as if it ran, what it left unsaid,
and where it lost the user's cluster, each fixed and held here. A serving deployment that does not fit (DeepSeek-V3 on
8 GPUs) showed "250 tokens/s per GPU" as a result; the SLA search dropped every TensorRT-LLM deployment (the card's
two-batch overlap) without a word; 512 DGX GPUs switched to GB200 NVL72 racks (504) and back came back as 504."""

from __future__ import annotations

import json

import httpx
import pytest
from playwright.sync_api import expect

from tests.frontend.test_page import LLAMA, browser, open_page, page, url_state, wait_until  # noqa: F401

pytestmark = pytest.mark.browser


def serve_dsv3(page):  # noqa: F811
    page.select_option("#serve-scenario", "dsv3-pd")
    expect(page.locator("#serve-results")).to_be_visible(timeout=60_000)
    wait_until(page, "() => document.getElementById('serve-status').textContent === ''", timeout=60_000)


def serve_replan(page):  # noqa: F811
    """Run the Serve card again and wait for its answer or its refusal ("Cannot ...")."""
    page.evaluate("window.commplan.state.serve = null")
    page.click("#serve-run")
    wait_until(
        page,
        "() => window.commplan.state.serve || document.getElementById('serve-status').textContent.startsWith('Cannot')",
    )


def test_a_deployment_that_does_not_fit_is_not_shown_as_running(page):  # noqa: F811
    """The card's figures of a deployment that does not fit (DeepSeek-V3 on one TP8 worker: the server's own peak
    per GPU over the H100's 85.5 GB) and of a saturated request rate (TTFT unbounded: the tokens/s are the traffic's,
    asked) come under a verdict that says so, greyed; a deployment that runs has no verdict. Before: "Tokens/s per GPU
    250, 2.00 K output tokens/s on 8 GPUs" as a result, the reason in the warnings below."""
    open_page(page, url_state(LLAMA))
    serve_dsv3(page)
    expect(page.locator("#serve-verdict")).to_be_hidden()
    # a disaggregated deployment's KV cache is its decode workers' (20,095 before mend14e left out the MTP weights)
    expect(page.locator('[data-card="kv"] .hint')).to_have_text("70.3 KB per token; 20,317 requests per decode worker")
    page.select_option("#serve-mode", "aggregated")
    for box, value in (("#serve-a-workers", "1"), ("#serve-a-tp", "8"), ("#serve-a-dp", "1"), ("#serve-a-ep", "1")):
        page.fill(box, value)
    page.uncheck("#serve-a-adp")
    page.select_option("#serve-a-dispatch", "")
    page.select_option("#serve-tbo", "")
    page.select_option("#serve-load", "rate")
    page.fill("#serve-concurrency", "20")
    page.evaluate("window.commplan.state.serve = null")
    page.click("#serve-run")
    wait_until(page, "() => window.commplan.state.serve", timeout=60_000)
    # DeepSeek-V3 (671 B parameters, fp8 weights: 671 GB, every expert split over the 8 ranks without EP as the
    # engines run it: 84 GB a GPU; mend14b, it read 600-700 GB with whole experts) on one TP8 worker of 80 GB H100s at
    # 20 requests/s: it does not fit, and 20 requests/s need 219% of the worker's time for prefill alone (saturated)
    body = page.evaluate("window.commplan.serveBody()")
    assert (body["model"], body["cluster"]["num_nodes"], body["options"]) == (
        {"preset": "deepseek-v3"},
        12,
        {"weight_dtype": "fp8"},
    )
    assert body["traffic"] == {"input_tokens": 2000, "output_tokens": 100, "request_rate": 20}
    assert body["deployment"]["pools"] == [
        {"role": "both", "workers": 1, "tp": 8, "pp": 1, "dp": 1, "ep": 1, "attention_dp": False}
    ]
    answer = httpx.post(page.base + "/v1/serve", json=body, timeout=60).json()
    assert answer["fits"] is False and answer["ttft_s"] is None
    peak = answer["pools"][0]["memory_peak_bytes"]
    assert 671e9 / 8 < peak < 95e9 and answer["cluster"]["gpu"]["hbm_bytes"] == 85_520_809_984 < peak
    verdict = page.locator("#serve-verdict")
    expect(verdict).to_be_visible()
    expect(verdict).to_contain_text(
        f"Does not fit: the pool needs {peak / 1e9:.1f} GB per GPU, over the 85.5 GB a GPU holds"
    )
    # mend13c: the answer is what it serves (saturated), and the verdict names both rates
    assert answer["saturated"] is True and answer["request_rate"] < 20
    expect(verdict).to_contain_text("Saturated: 20.0 requests/s is more than it serves, ")
    expect(page.locator('[data-card="per-gpu"] .hint')).to_contain_text(
        "output tokens/s on 8 GPUs (does not fit) (saturated: what it serves)"
    )
    assert page.locator("#serve-cards").evaluate("(e) => e.classList.contains('unrunnable')")
    # back to a deployment that runs: no verdict, the figures not greyed
    page.select_option("#serve-scenario", "llama70b-vllm")
    wait_until(page, "() => window.commplan.state.serve && window.commplan.state.serve.fits", timeout=60_000)
    expect(verdict).to_be_hidden()
    assert not page.locator("#serve-cards").evaluate("(e) => e.classList.contains('unrunnable')")


def test_the_sla_search_says_what_it_did_not_plan(page):  # noqa: F811
    """DeepSeek-V3's scenario runs with two-batch overlap on, which TensorRT-LLM has no switch for: the search
    refuses every TensorRT-LLM deployment. The status names each reason with its count, the server's `rejected`, its
    words cut at a word, no parenthesis left open. Before: "768 deployments tried ...; 108 of those plans fit." and
    nothing on the 732 not planned."""
    open_page(page, url_state(LLAMA))
    serve_dsv3(page)
    page.click("#serve-search-run")
    expect(page.locator("#serve-search-results")).to_be_visible(timeout=120_000)
    rejected = page.evaluate("window.commplan.state.serveSearch.rejected")
    trt = [reason for reason in rejected if reason.startswith("TensorRT-LLM has no two-batch overlap switch")]
    assert len(trt) == 1 and trt[0].endswith(" …") and "(" not in trt[0], rejected
    assert rejected[trt[0]] == page.evaluate("window.commplan.state.serveSearch.candidates") // 3
    status = page.locator("#serve-search-status")
    expect(status).to_contain_text("Not planned (deployments): ")
    for reason, n in rejected.items():
        expect(status).to_contain_text(f"{reason} ({n:,})")


def test_a_cluster_switch_and_back_keeps_the_devices(page):  # noqa: F811
    """512 DGX H100 GPUs (the 70B scenario's 64 nodes) switched to GB200 NVL72 racks round to 7 racks (504 GPUs);
    switched back, the 512 asked come back (64 nodes) and the layout plans again, through another preset too; a
    node count typed after the rounding is the new count. Before: back on DGX read 63 nodes, "tp*cp*pp*dp = 512 but
    the cluster has 504 devices"."""
    open_page(page, url_state(LLAMA))
    page.select_option("#cluster-preset", "gb200-nvl72")
    expect(page.locator("#nodes")).to_have_value("7")
    expect(page.locator("#cluster-switch-note")).to_have_text(
        "512 devices are not a whole number of 72-device nodes: 7 nodes give 504."
    )
    page.select_option("#cluster-preset", "dgx-a100")
    expect(page.locator("#nodes")).to_have_value("64")
    expect(page.locator("#cluster-switch-note")).to_have_text("Kept 512 devices: 64 nodes of 8.")
    page.select_option("#cluster-preset", "gb200-nvl72")
    page.select_option("#cluster-preset", "dgx-h100")
    expect(page.locator("#nodes")).to_have_value("64")
    wait_until(
        page,
        "() => window.commplan.state.request.cluster.num_nodes === 64 && "
        "window.commplan.state.request.cluster.preset === 'dgx-h100' && "
        "!document.getElementById('results').classList.contains('stale')",
    )
    expect(page.locator("#form-errors")).to_be_hidden()
    # a count typed after a rounding switch is the user's: 8 racks are 576 GPUs, 72 DGX nodes
    page.select_option("#cluster-preset", "gb200-nvl72")
    page.fill("#nodes", "8")
    page.select_option("#cluster-preset", "dgx-h100")
    expect(page.locator("#nodes")).to_have_value("72")


def test_the_layout_product_refusal_marks_the_factor_changed(page):  # noqa: F811
    """tp*cp*pp*dp against the cluster (loc `parallel`) marks the factor the user changed and goes to it: CP 2 on the
    70B scenario's 512 GPUs marks CP, a TP of 4 marks TP, each with the DP that fits. Before: TP marked and "Go to
    TP" after a change of CP."""
    open_page(page, url_state(LLAMA))
    errors = page.locator("#form-errors")
    for box, value, sent, dp in (("cp", "2", "8*2*4*16 = 1024", "DP 8"), ("tp", "4", "4*1*4*16 = 256", "DP 32")):
        page.fill("#cp", "1")
        page.fill(f"#{box}", value)
        expect(errors).to_contain_text(f"tp*cp*pp*dp = {sent} but the cluster has 512 devices", timeout=10_000)
        assert page.evaluate("[...document.querySelectorAll('[aria-invalid]')].map((e) => e.id)") == [box]
        go = errors.locator("button.link", has_text="Go to")
        expect(go).to_have_text(f"Go to {box.upper()}")
        expect(errors.locator("button.fix").first).to_have_text(dp)
        go.click()
        expect(page.locator(f"#{box}")).to_be_focused()


def test_the_memory_legend_draws_the_peak_as_the_chart_does(page):  # noqa: F811
    """The legend's "peak" diamond is the marks' colour (ECharts draws a legend icon in the series' colour): it was the
    palette's blue beside dark diamonds."""
    open_page(page, url_state(LLAMA))
    wait_until(page, "() => window.commplan.state.charts.memory")
    legend, mark = page.evaluate(
        "(() => { const s = window.commplan.state.charts.memory.getModel().getSeriesByName('peak')[0].getData();"
        " return [s.getVisual('style').fill, s.getItemVisual(0, 'style').fill]; })()"
    )
    assert legend == mark == "#15202b"


def test_the_kv_transfer_leaves_no_empty_explorer(page):  # noqa: F811
    """Drawing the KV transfer empties the explorer: no blank plot above its note (it kept a 320 px empty chart), and
    a ledger row brings the plot back at its width."""
    open_page(page, url_state(LLAMA))
    serve_dsv3(page)
    page.click("#serve-draw")
    expect(page.locator("#detail-title")).to_have_text("Serving: the KV transfer")
    expect(page.locator("#explorer")).to_be_hidden()
    expect(page.locator("#explorer-note")).to_contain_text("Select a ledger row to explore one.")
    page.locator("#ledger tbody tr").first.click()
    expect(page.locator("#explorer")).to_be_visible()
    wait_until(page, "() => document.getElementById('explorer').dataset.call")
    width = page.evaluate(
        "[document.getElementById('explorer').clientWidth, document.querySelector('#explorer canvas').width]"
    )
    assert width[0] > 300 and width[1] >= width[0], width


def test_a_pipelined_deployment_loads_as_listed(page):  # noqa: F811
    """Llama-3 405B (810 GB of bf16 weights) on 2 DGX H100 nodes at 64 concurrent under 60 s / 1 s: a worker needs
    both nodes, TP8 PP2, so the listed deployments are pipelined. Loaded, the card holds every pool's PP and plans the
    listed deployment: its GPUs, tokens/s per GPU and TPOT as the row. Before: the card had no PP, so it planned the
    pools without it (Llama-3 70B on 64 nodes: the listed "decode 3× TP8 PP16", 400 GPUs and 10.9 tokens/s per GPU,
    planned as 40 GPUs at 111). mend13c: Llama-3 70B on 8 nodes, the round's case, now ranks a 16-GPU deployment
    without PP first (197.9 tokens/s per GPU against the PP4 one's), so the pipelined case is a model that needs it."""
    open_page(
        page,
        url_state({**LLAMA, "model": {"preset": "llama3-405b"}, "parallel": {**LLAMA["parallel"], "pp": 2, "dp": 32}}),
    )
    for box, value in (("#serve-nodes", "2"), ("#serve-sla-ttft", "60000"), ("#serve-sla-tpot", "1000")):
        page.fill(box, value)
    page.click("#serve-search-run")
    expect(page.locator("#serve-search-table-wrap")).to_be_visible(timeout=120_000)
    # the sizes searched are said, and where they come from (mend13c: whole nodes from one up to the cluster)
    search = page.evaluate("window.commplan.state.serveSearch")
    sizes = search["deployment_gpus"]
    assert sizes["most"] == 16 and sizes["fewest"] < 16, sizes
    expect(page.locator("#serve-search-status")).to_contain_text(
        f"deployments tried, each using {sizes['fewest']} to 16 GPUs of the cluster's 16 (2 nodes; the Nodes box sets "
        "them), each at up to 3 loads"
    )
    best = search["results"][0]
    pools = best["request"]["deployment"]["pools"]
    assert [p["pp"] for p in pools] == [2], pools
    first = page.locator("#serve-search-table tbody tr").first
    expect(first).to_contain_text("both 1× TP8 PP2 (16 GPUs)")
    page.evaluate("window.commplan.state.serve = null")
    first.click()
    wait_until(page, "() => window.commplan.state.serve", timeout=60_000)
    assert page.evaluate("window.commplan.serveBody().deployment.pools") == pools
    expect(page.locator("#serve-a-pp")).to_have_value("2")
    served = page.evaluate("window.commplan.state.serve")
    listed = best["answer"]
    assert served["gpus"] == listed["gpus"] == sum(p["workers"] * p["tp"] * p["pp"] * p["dp"] for p in pools) == 16
    assert served["throughput"] == listed["throughput"] and served["tpot_s"] == listed["tpot_s"]


def test_a_call_new_in_the_compared_layout_is_its_whole_time(page):  # noqa: F811
    """The 70B scenario (no CP) against its search's best (TP2 PP8 DP16 CP2): cp.attn.kv is absent from A, so its
    difference is B's whole time, "+21.2 ms (new)", as the rows' order already counted it. Before: "–"."""
    open_page(page, url_state(LLAMA))
    page.click("#search-run")
    expect(page.locator("#search-table tbody tr").first).to_be_visible(timeout=120_000)
    assert page.evaluate("window.commplan.state.search.results[0].parallel.cp") == 2
    page.locator("#search-table tbody tr").first.locator("input").check()
    page.click("#compare-run")
    expect(page.locator("#compare-body")).to_contain_text("Ledger differences", timeout=30_000)
    rows = page.locator("#compare-body table").nth(1).locator("tbody tr")
    cells = [[rows.nth(i).locator("td").nth(k).inner_text() for k in range(4)] for i in range(rows.count())]
    new = [c for c in cells if c[1] == "absent"]
    assert any(c[0] == "cp.attn.kv" for c in new), cells
    for name, _, b, d in new:
        assert d == f"+{b} (new)", (name, b, d)
    assert all(d != "–" for *_, d in cells), cells


def test_a_micro_batch_past_the_step_says_the_range(page):  # noqa: F811
    """The 70B scenario's 64 micro-batches are numbered 0 to 63: Zoom to it on 64 says so (it said "no micro-batch 64
    in this step" alone), and 63 zooms to its span."""
    open_page(page, url_state(LLAMA))
    page.fill("#timeline-mb", "64")
    page.click("#timeline-zoom")
    expect(page.locator("#timeline-zoom-note")).to_have_text(
        "no micro-batch 64 in this step: they are numbered 0 to 63"
    )
    page.fill("#timeline-mb", "63")
    page.click("#timeline-zoom")
    expect(page.locator("#timeline-zoom-note")).to_contain_text("micro-batch 63: ")


def test_a_long_context_config_says_the_sequence_planned(page):  # noqa: F811
    """A pasted Llama-3.1-8B-shaped config.json advertises 131,072 positions; the plan runs the planner's 8,192 (the
    file's positions capped). The facts say the sequence planned and the file's positions, until Sequence length is
    set. Before: no word of the sequence, and Assumptions named config.json as the source of 8,192."""
    open_page(page, url_state(LLAMA))
    config = {"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32}
    config |= {"num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256}
    page.check("#model-source-hf")
    page.fill("#hf-config", json.dumps(config | {"max_position_embeddings": 131072}))
    facts = page.locator("#model-facts")
    expect(facts).to_contain_text(
        "8.03B parameters, 8,192 tokens a sequence (its max_position_embeddings is 131,072: set Sequence length "
        "to plan more).",
        timeout=20_000,
    )
    assert page.evaluate("window.commplan.state.plan.step.time_s") > 0
    page.fill("#seq-length", "16384")
    expect(facts).to_contain_text("8.03B parameters, 16,384 tokens a sequence.", timeout=20_000)


def test_the_ledger_is_one_tab_stop(page):  # noqa: F811
    """Keyboard only: Tab enters the ledger on one row and the next Tab leaves it for the search (every one of the 70B
    plan's 35 rows was a tab stop); the arrows, Home and End move in it, Enter selects, and the selected row is the
    stop from then on."""
    open_page(page, url_state(LLAMA))
    rows = page.locator("#ledger tbody tr")
    assert rows.count() > 30
    assert (
        page.evaluate("[...document.querySelectorAll('#ledger tbody tr')].filter((r) => r.tabIndex === 0).length") == 1
    )
    page.locator("#ledger thead button:visible").last.focus()
    page.keyboard.press("Tab")
    expect(rows.first).to_be_focused()
    page.keyboard.press("Tab")
    expect(page.locator("#search-topk")).to_be_focused()
    rows.first.focus()
    page.keyboard.press("End")
    expect(rows.last).to_be_focused()
    page.keyboard.press("ArrowUp")
    expect(rows.nth(rows.count() - 2)).to_be_focused()
    page.keyboard.press("Enter")
    name = rows.nth(rows.count() - 2).get_attribute("data-name")
    expect(page.locator("#detail-title")).to_contain_text(f"Selected call: {name} ")
    page.locator("#ledger thead button:visible").last.focus()
    page.keyboard.press("Tab")
    expect(rows.nth(rows.count() - 2)).to_be_focused()


def test_pools_over_the_cluster_mark_the_nodes(page):  # noqa: F811
    """DeepSeek-V3's pools (32 + 64 GPUs) on 4 nodes (32 GPUs): the refusal names and marks the card's Nodes box, with
    the numbers. Before: "deployment.pools: the pools use 1x32 + 1x64 = 96 GPUs; the cluster has 32", nothing
    marked."""
    open_page(page, url_state(LLAMA))
    serve_dsv3(page)
    page.fill("#serve-nodes", "4")
    page.click("#serve-run")
    expect(page.locator("#serve-status")).to_have_text(
        # the label without its hint (review r15d #7, mend15e)
        "Cannot plan this deployment: Nodes (deployment.pools): the pools use 1x32 + 1x64 = 96 "
        "GPUs; the cluster has 32",
        timeout=30_000,
    )
    expect(page.locator("#serve-nodes")).to_have_attribute("aria-invalid", "true")
    page.fill("#serve-nodes", "12")
    page.click("#serve-run")
    expect(page.locator("#serve-status")).to_have_text("", timeout=30_000)
    expect(page.locator("#serve-nodes")).not_to_have_attribute("aria-invalid", "true")


def test_fields_only_starts_from_the_preset_on_show(page):  # noqa: F811
    """Fields only, nothing typed: the preset's fields fill the boxes, opened, and plan the same step as the preset
    (Llama-3 70B, 70.55B parameters, 8,192 tokens); a typed field is the user's from then on. Before: an empty model,
    "model.num_layers: required when neither preset nor hf_config is given (missing: num_layers, ...)"."""
    open_page(page, url_state(LLAMA))
    step, params = page.evaluate("[window.commplan.state.plan.step.time_s, window.commplan.state.plan.params_total]")
    page.check("#model-source-fields")
    wait_until(
        page,
        "() => window.commplan.state.request.model.num_layers === 80 && !window.commplan.state.request.model.preset",
    )
    wait_until(page, "() => !document.getElementById('results').classList.contains('stale')")
    expect(page.locator("#form-errors")).to_be_hidden()
    assert page.evaluate("[window.commplan.state.plan.step.time_s, window.commplan.state.plan.params_total]") == [
        step,
        params,
    ]
    assert page.evaluate("document.getElementById('model-fields').open")
    expect(page.locator("#seq-length")).to_have_value("8192")
    expect(page.locator("#model-facts")).to_contain_text(
        "Read from the fields: 80 layers, hidden 8,192, 64 heads / 8 KV"
    )
    page.fill("#m-num-layers", "40")
    wait_until(page, "() => window.commplan.state.request.model.num_layers === 40")


def test_the_serve_card_sets_mtp_cuda_graphs_and_chunked_prefill(page):  # noqa: F811
    """DeepSeek-V3 served with its multi-token prediction (1 draft token, 80% accepted: 1.8 tokens a step) from the
    card: the request carries options.mtp and the TPOT falls as the server answers it; a draft count without its
    acceptance is refused at the acceptance box; CUDA graphs off is sent and slows the decode step; the options come
    back from the link. Before: the card had no control for options.mtp, cuda_graphs or chunked_prefill."""
    open_page(page, url_state(LLAMA))
    serve_dsv3(page)
    base = page.evaluate("window.commplan.state.serve.tpot_s")

    page.fill("#serve-mtp-draft", "1")
    page.fill("#serve-mtp-acceptance", "0.8")
    serve_replan(page)
    body = page.evaluate("window.commplan.serveBody()")
    assert body["options"]["mtp"] == {"draft_tokens": 1, "acceptance": 0.8}
    answer = httpx.post(page.base + "/v1/serve", json=body, timeout=60).json()
    assert page.evaluate("window.commplan.state.serve.tpot_s") == answer["tpot_s"] < base / 1.5
    link = page.url
    page.fill("#serve-mtp-acceptance", "")
    serve_replan(page)
    expect(page.locator("#serve-status")).to_contain_text(
        "MTP acceptance rate (options.mtp.acceptance): give exactly one of acceptance"
    )
    expect(page.locator("#serve-mtp-acceptance")).to_have_attribute("aria-invalid", "true")
    page.fill("#serve-mtp-draft", "")
    page.select_option("#serve-cuda-graphs", "false")
    page.select_option("#serve-chunked", "false")
    serve_replan(page)
    options = page.evaluate("window.commplan.serveBody().options")
    assert options["cuda_graphs"] is False and options["chunked_prefill"] is False and "mtp" not in options
    assert page.evaluate("window.commplan.state.serve.tpot_s") > base
    open_page(page, "#s=" + link.split("#s=")[1])  # the page loads itself on a new hash (main.js hashchange)
    wait_until(page, "() => window.commplan && window.commplan.state.serve", timeout=60_000)
    expect(page.locator("#serve-mtp-draft")).to_have_value("1")
    expect(page.locator("#serve-mtp-acceptance")).to_have_value("0.8")


def test_back_to_a_scenario_names_it(page):  # noqa: F811
    """Two scenarios picked, then Back: the form and the select say the first again; Forward the second; a change of
    a field leaves the select blank (the form is no scenario), and Back names the scenario it was made on. Before:
    Back restored the scenario's form under "— pick a scenario —"."""
    open_page(page, url_state(LLAMA))
    for sc, model in (("fsdp-a100", "llama3-8b"), ("gpt3-a100", "gpt3-175b")):
        page.select_option("#scenario", sc)
        wait_until(
            page, f"() => window.commplan.state.plan && window.commplan.state.request.model.preset === '{model}'"
        )
        wait_until(page, "() => !document.getElementById('results').classList.contains('stale')")
    page.go_back()
    wait_until(page, "() => window.commplan.state.request.model.preset === 'llama3-8b'")
    expect(page.locator("#scenario")).to_have_value("fsdp-a100")
    page.go_forward()
    wait_until(page, "() => window.commplan.state.request.model.preset === 'gpt3-175b'")
    expect(page.locator("#scenario")).to_have_value("gpt3-a100")
    page.fill("#global-batch", "768")
    wait_until(page, "() => window.commplan.state.request.workload.global_batch_size === 768")
    expect(page.locator("#scenario")).to_have_value("")
    page.go_back()
    wait_until(page, "() => window.commplan.state.request.workload.global_batch_size === 1536")
    expect(page.locator("#scenario")).to_have_value("gpt3-a100")
