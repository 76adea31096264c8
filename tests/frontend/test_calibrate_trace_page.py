"""The page's calibration view with a real torch.profiler trace (issue 20 item 4): the H200 Llama-3 8B layer's
.json.gz chosen in "or a torch.profiler trace", fitted on the form's H200 cluster, its constants shown, then
planned with: the compute moves as over HTTP (tests/app/test_calibrate_h200_trace.py). Megatron-Core's MoE layer
trace gives the host's time per launch, which the MoE plan then runs its synced layers at
(tests/app/test_calibrate_host_launch.py)."""

from pathlib import Path

import pytest
from playwright.sync_api import expect

from .test_page import browser, open_page, page, url_state, wait_until  # noqa: F401  (the page tests' browser and helpers)

pytestmark = pytest.mark.browser
H200 = Path(__file__).resolve().parents[1] / "reference" / "kernels" / "h200"
TRACE = H200 / "trace_llama3_8b.tp1.s4096.json.gz"
MEGATRON = H200 / "trace_megatron_qwen3_30b.ep8_alltoall_T8192.json.gz"
REQUEST = {
    "model": {"preset": "llama3-8b"},
    "workload": {"kind": "training", "micro_batch_size": 1, "global_batch_size": 8, "seq_length": 4096},
    "parallel": {"tp": 1, "pp": 1, "dp": 8, "framework": "torch"},
    "cluster": {"preset": "dgx-h200", "num_nodes": 1},
    "options": {"algorithm": "auto"},
}


def trace_summary(page, trace: Path):  # noqa: F811
    """The trace chosen in "or a torch.profiler trace" and fitted: the summary the page shows of it."""
    page.set_input_files("#calib-trace", str(trace))
    page.click("#calib-run")
    summary = page.locator("#calib-trace-summary")
    expect(summary).to_be_visible(timeout=30_000)
    return summary


def test_a_profiler_trace_calibrates_on_the_page_then_plans(page):  # noqa: F811
    open_page(page, url_state(REQUEST))
    before = page.evaluate("window.commplan.state.plan.step.compute_s")
    summary = trace_summary(page, TRACE)
    expect(summary).to_contain_text("Trace (NVIDIA H200, 3 steps (its kernels repeat so often))")
    expect(summary).to_contain_text("clock 0.963")
    expect(summary).to_contain_text("attention_ceiling.cudnn_fwd 0.721")
    expect(summary).to_contain_text("attention_ceiling.cudnn_bwd 0.576")
    expect(summary).to_contain_text("hbm 0.95")
    assert "Kernels of no class" not in summary.inner_text()
    # GPU-bound: too few launches found the GPU idle to read the host's time per launch
    expect(summary).to_contain_text("Host: 7 of 189 launches found the GPU idle, 5 gaps read (too few")
    page.click("#calib-use")
    expect(page.locator("#calib-active")).to_contain_text("kernels.clock 0.963", timeout=20_000)
    kernels = page.evaluate("window.commplan.state.request.cluster.calibration.kernels")
    assert kernels["clock"] == pytest.approx(0.9627) and kernels["hbm"] == 0.95
    wait_until(page, f"window.commplan.state.plan && window.commplan.state.plan.step.compute_s < {before}")
    after = page.evaluate("window.commplan.state.plan.step.compute_s")
    # as POST /v1/plan with the returned cluster (tests/app/test_calibrate_h200_trace.py: 0.843; 0.884 before sus12,
    # when "before" ran at the read clock 0.852, not the H200's 0.798 by throughput)
    assert after / before == pytest.approx(0.843, abs=0.01)


MOE_REQUEST = {
    "model": {"preset": "qwen3-30b-a3b"},
    "workload": {"kind": "training", "micro_batch_size": 1, "global_batch_size": 64, "seq_length": 4096},
    "parallel": {"dp": 8, "ep": 8},
    "cluster": {"preset": "dgx-h200", "num_nodes": 1},
    "options": {"algorithm": "auto"},
}


def test_a_host_bound_trace_gives_the_host_cost_per_launch_on_the_page(page):  # noqa: F811
    open_page(page, url_state(MOE_REQUEST))
    before = page.evaluate("window.commplan.state.plan.step.compute_s")
    summary = trace_summary(page, MEGATRON)
    expect(summary).to_contain_text("Fitted compute constants: host_launch_s 32.6 µs;")
    expect(summary).to_contain_text(
        "Host: 750 of 876 launches found the GPU idle, 699 gaps read, median 32.6 µs a launch."
    )
    page.click("#calib-use")
    expect(page.locator("#calib-active")).to_contain_text("kernels.host_launch_s 32.6 µs", timeout=20_000)
    kernels = page.evaluate("window.commplan.state.request.cluster.calibration.kernels")
    assert kernels == {"host_launch_s": 32.565e-6}
    wait_until(page, f"window.commplan.state.plan && window.commplan.state.plan.step.compute_s < {before}")
    after = page.evaluate("window.commplan.state.plan.step.compute_s")
    # as POST /v1/plan with the returned cluster (tests/app/test_calibrate_host_launch.py; 2.452 / 2.703 before sus12,
    # 2.527 / 2.708 before spread15 ran the GPU-bound time at the slowest of the 8 H200s' pace, x 1.021 on its clock)
    assert after / before == pytest.approx(2.552 / 2.710, abs=0.005)
