"""DeepEP's normal kernels (parallel.ep_dispatch "deepep", rules/deepep.py: an RDMA leg to one GPU per target node,
then NVLink forwarding) against DeepEP's own published H800 table (tests/reference/deepep/normal_h800.json). The
table gives bandwidths over the bytes DeepEP's tests count; times follow from those bytes. One constant is fitted on
these 8 rows (they are fit, not held out, since deepep14): rules/deepep.py ACHIEVED["deepep"], the fraction of its
legs' priced rate DeepEP's kernels achieve, the median over the rows of (the slower leg's price / DeepEP's time).

What it shows (docs/serving.md): NCCL's all-to-all rate on the legs' links put the slower leg 5-20% under DeepEP's
time at every EP size (0.80-0.94 of it); at 0.897 of that rate every row is within 10.3% (median 3.1%). The legs run
as a pipeline in DeepEP's kernels, so the slower leg sets the time, and the step model charges each kernel its slower
leg (Call.kernel, step.stream_totals); charging the two calls one after the other is 26-60% over DeepEP's times on
two nodes and more."""

from __future__ import annotations

import json
import statistics
from dataclasses import replace
from pathlib import Path

import pytest

from collectives.topology import cluster_preset
from planner import MODEL_PRESETS, ParallelSpec, WorkloadSpec, build_plan
from planner.ledger import kernel_time
from planner.plan import Options, price_calls
from planner.rules.deepep import ACHIEVED, distinct
from planner.step import stream_totals

TABLE = json.loads((Path(__file__).parents[1] / "reference/deepep/normal_h800.json").read_text())
DSV3 = MODEL_PRESETS["deepseek-v3"]
TOKENS, H, K = 4096, 7168, 8
FP8_ROW, BF16_ROW = H * (1 + 4 / 128), H * 2


def _par(ep: int) -> ParallelSpec:
    return ParallelSpec(dp=ep, ep=ep, ep_dispatch="deepep")


def _cluster(ep: int):
    return cluster_preset("hgx-h800", max(1, ep // 8))


def _plan(ep: int):
    work = WorkloadSpec(kind="inference", phase="prefill", batch_size=ep, context_length=TOKENS,
                        moe_dispatch_dtype="fp8")  # fmt: skip
    return build_plan(DSV3, work, _par(ep), _cluster(ep), Options(timeline=False))


def _at_nccls_rate(ep: int, pc) -> float:
    """The leg's price before ACHIEVED: the same call priced on its own (plan.price_calls) at achieved 1.0."""
    (row,) = price_calls([replace(pc.call, achieved=1.0)], _par(ep), _cluster(ep))
    return row.price.time_s


def _rows_vs_table() -> list[tuple[float, float, float]]:
    """(slower leg at NCCL's rate, slower leg as priced, DeepEP's time) per table row and kernel."""
    out = []
    for row in TABLE["rows"]:
        legs = _legs(row["ep"])
        for kind, key, row_bytes in (("dispatch", "dispatch_GBps", FP8_ROW), ("combine", "combine_GBps", BF16_ROW)):
            measured = _deepep_rows(row["ep"]) * row_bytes / (row[key] * 1e9)
            mine = [pc for name, pc in legs.items() if name.startswith(f"ep.{kind}.")]
            raw = max(_at_nccls_rate(row["ep"], pc) for pc in mine)
            out.append((raw, max(pc.price.time_s for pc in mine), measured))
    return out


def _legs(ep: int) -> dict:
    return {c.call.name: c for c in _plan(ep).calls if c.call.parallelism == "ep"}


def _deepep_rows(ep: int) -> float:
    """Rows DeepEP's test counts per rank: tokens x distinct target nodes (internode, node-limited to 4) or x
    distinct target GPUs (intranode), under its uniform random scores."""
    nodes = ep // 8
    return TOKENS * (distinct(8, K) if nodes == 1 else distinct(min(DSV3.moe.node_limit, nodes), K))


@pytest.mark.parametrize("row", TABLE["rows"], ids=lambda r: f"ep{r['ep']}")
def test_bytes_are_deepeps(row):
    legs = _legs(row["ep"])
    leg = "rdma" if row["kind"] == "internode" else "nvlink"
    rows = _deepep_rows(row["ep"])
    # fp8 rows: 7168 bytes and 56 fp32 scales, exactly DeepEP's (1 + 4/128) factor on bf16's 2 bytes
    assert legs[f"ep.dispatch.{leg}"].call.message_bytes == pytest.approx(rows * FP8_ROW, rel=1e-4)
    assert legs[f"ep.combine.{leg}"].call.message_bytes == pytest.approx(rows * BF16_ROW, rel=1e-4)


def test_the_fitted_constant_reproduces_from_the_table():
    """ACHIEVED["deepep"] is the median over the kept table's 8 rows of (the slower leg at NCCL's rate / DeepEP's
    time), to its 3 decimals; before it, every row was under DeepEP's time (a one-sided miss of 5.5-19.6%)."""
    rows = _rows_vs_table()
    ratios = [raw / measured for raw, _, measured in rows]
    assert len(ratios) == 8
    assert round(statistics.median(ratios), 3) == ACHIEVED["deepep"] == 0.897
    assert all(0.80 < r < 0.95 for r in ratios), ratios  # every row fast at NCCL's rate, by 5.5-19.6%
    errors = [priced / measured - 1 for _, priced, measured in rows]
    assert statistics.median(abs(e) for e in errors) == pytest.approx(0.0315, abs=5e-4)
    assert max(errors, key=abs) == pytest.approx(-0.1034, abs=5e-4)  # EP16 combine: the NVLink forwarding leg
    assert abs(statistics.median(errors)) < 0.01  # no bias left
    assert ACHIEVED["hybridep"] == 1.0  # not fitted: no HybridEP kernel table


def test_one_dispatch_in_closed_form():
    """EP8 (one node, the NVLink leg alone): 4,096 tokens to 8 (1 - (7/8)^8) = 5.253 distinct GPUs each, 21,509 rows
    of 7,168 fp8 bytes and 56 fp32 scales (7,392 B); the kernel's time is the leg's price at NCCL's rate over 0.897
    (ledger.kernel_time, no fixed time), and that is what the step charges (step.stream_totals)."""
    rows = round(TOKENS * 8 * (1 - (7 / 8) ** 8))
    assert rows == 21_509
    ep_calls = [pc for pc in _plan(8).calls if pc.call.parallelism == "ep"]
    (dispatch,) = [pc for pc in ep_calls if pc.call.name == "ep.dispatch.nvlink"]
    assert dispatch.call.message_bytes == rows * 7_392
    assert dispatch.call.achieved == 0.897 and dispatch.call.fixed_s == 0.0
    raw = _at_nccls_rate(8, dispatch)
    assert dispatch.price.time_s == pytest.approx(raw / 0.897, rel=1e-12)
    assert dispatch.price.time_s == pytest.approx(kernel_time(dispatch.call, raw), rel=1e-12)
    # DeepEP's 153 GB/s over those bytes is 1,039 us; the price at 0.897 of NCCL's rate: within 3.5%
    assert dispatch.price.time_s == pytest.approx(rows * 7_392 / 153e9, rel=0.035)
    charged = sum(row[0] for row in stream_totals([dispatch], 1, 0, 1).time.values())
    assert charged == pytest.approx(dispatch.price.time_s * dispatch.call.calls_per_iteration, rel=1e-12)


def test_times_against_deepeps_table():
    slowest_leg, serial = [], []
    for row in TABLE["rows"]:
        legs = _legs(row["ep"])
        for kind, key, row_bytes in (("dispatch", "dispatch_GBps", FP8_ROW), ("combine", "combine_GBps", BF16_ROW)):
            measured = _deepep_rows(row["ep"]) * row_bytes / (row[key] * 1e9)
            times = [pc.price.time_s for name, pc in legs.items() if name.startswith(f"ep.{kind}.")]
            slowest_leg.append(max(times) / measured - 1)
            serial.append(sum(times) / measured - 1)
    assert all(abs(e) <= 0.105 for e in slowest_leg), slowest_leg  # fit: 0.897 (ACHIEVED)
    assert statistics.median(abs(e) for e in slowest_leg) <= 0.035
    # the two calls in series would be over DeepEP's time wherever both legs exist: why the step does not add them
    assert all(e > 0.2 for e in serial[2:]), serial


@pytest.mark.parametrize("ep", sorted({r["ep"] for r in TABLE["rows"]}))
def test_the_step_charges_each_kernel_its_slower_leg(ep):
    """The EP stream of the step (step.stream_totals) holds, per MoE layer, max(RDMA, NVLink) for the dispatch
    and for the combine, not their sum; one leg (intranode) is charged as it is."""
    ep_calls = [pc for pc in _plan(ep).calls if pc.call.parallelism == "ep"]
    charged = sum(row[0] for row in stream_totals(ep_calls, 1, 0, 1).time.values())

    def kernel(kind: str) -> list[float]:
        mine = [pc for pc in ep_calls if pc.call.name.startswith(f"ep.{kind}.")]
        return [pc.call.calls_per_iteration * pc.price.time_s for pc in mine]

    assert charged == pytest.approx(max(kernel("dispatch")) + max(kernel("combine")), rel=1e-12)
    legs = len(kernel("dispatch"))
    assert legs == (1 if ep <= 8 else 2)
    if legs == 2:
        assert charged < sum(kernel("dispatch")) + sum(kernel("combine"))


def test_leave_one_row_out():
    """Review r14e finding 5: the constant is fitted on DeepEP's one H800 table, so the held-out error is by row: each
    row priced at the median of the other 7 rows' ratios (0.891 or 0.903). Median |error| 3.8% (in-sample 3.1%),
    worst -10.9% (EP16 combine; in-sample -10.3%). On other GPUs (H100, H200, B200, GB200) no DeepEP table was read:
    the constant is carried there unverified."""
    ratios = [raw / measured for raw, _, measured in _rows_vs_table()]
    held_out = [r / statistics.median(ratios[:i] + ratios[i + 1 :]) - 1 for i, r in enumerate(ratios)]
    expected = [-0.0396, -0.0132, -0.1057, -0.1093, +0.0343, +0.0134, +0.0601, +0.0366]  # EP8, 16, 32, 64 x legs
    assert held_out == pytest.approx(expected, abs=5e-4)
    assert statistics.median(abs(e) for e in held_out) == pytest.approx(0.0381, abs=5e-4)
