"""The page's calibration view with two more public traces (traces14; tests/reference/traces/README.md): HTA's
nccl_data ResNet trace (torch 2.x, NCCL 2.17.1, 2 ranks) shows its convolutions as a class of their own and each
collective with its recorded size, group and bus bandwidth; Kineto's 2021 ResNet-50 sample, in the profiler's old
category names, reads (it was a 422)."""

from pathlib import Path

import pytest
from playwright.sync_api import expect

from .test_calibrate_trace_page import REQUEST, trace_summary
from .test_page import browser, open_page, page, url_state  # noqa: F401  (the page tests' browser and helpers)

pytestmark = pytest.mark.browser
TRACES = Path(__file__).resolve().parents[1] / "reference" / "traces"


def test_the_page_shows_convolutions_and_each_collective_by_size(page):  # noqa: F811
    open_page(page, url_state(REQUEST | {"cluster": {"preset": "dgx-a100", "num_nodes": 1}}))
    summary = trace_summary(page, TRACES / "hta_nccl_data.json.gz")
    expect(summary).to_contain_text("Trace (NVIDIA A100-PG509-200, 3 steps)")
    expect(summary).to_contain_text("conv 200/step 13.7 ms (24.8%)")
    # the AllReduce of 8,196,000 B over 2 ranks: 3.94 ms a call, busbw factor 2(n-1)/n = 1 (tests/app)
    expect(summary).to_contain_text("allreduce 8.20 MB ×2: 1.00/step at 3.94 ms (2.08 GB/s bus)")
    expect(summary).to_contain_text("broadcast 424 B ×2: 1.00/step at 7.78 µs (54.5 MB/s bus)")


def test_a_trace_in_the_old_category_names_reads_on_the_page(page):  # noqa: F811
    open_page(page, url_state(REQUEST | {"cluster": {"preset": "dgx-a100", "num_nodes": 1}}))
    summary = trace_summary(page, TRACES / "kineto_resnet50_2steps.json.gz")
    expect(summary).to_contain_text("Trace (Tesla V100-DGXS-32GB, 2 steps)")
    expect(summary).to_contain_text("conv 321/step")
