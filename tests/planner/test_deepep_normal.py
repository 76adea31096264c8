"""DeepEP's normal kernels (parallel.ep_dispatch "deepep", rules/deepep.py: an RDMA leg to one GPU per target node,
then NVLink forwarding) against DeepEP's own published H800 table (tests/reference/deepep/normal_h800.json). The
table gives bandwidths over the bytes DeepEP's tests count; times follow from those bytes. Nothing is fitted.

What it shows (docs/serving.md): each leg alone is priced within 20% of DeepEP's time (the legs run as a pipeline
in DeepEP's kernels, so the slower leg sets the time), and the step model charges each kernel its slower leg
(Call.kernel, step.stream_totals); charging the two calls one after the other was 26-60% over DeepEP's times on
two nodes and more."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from collectives.topology import cluster_preset
from planner import MODEL_PRESETS, ParallelSpec, WorkloadSpec, build_plan
from planner.plan import Options
from planner.rules.deepep import distinct
from planner.step import stream_totals

TABLE = json.loads((Path(__file__).parents[1] / "reference/deepep/normal_h800.json").read_text())
DSV3 = MODEL_PRESETS["deepseek-v3"]
TOKENS, H, K = 4096, 7168, 8
FP8_ROW, BF16_ROW = H * (1 + 4 / 128), H * 2


def _plan(ep: int):
    work = WorkloadSpec(kind="inference", phase="prefill", batch_size=ep, context_length=TOKENS,
                        moe_dispatch_dtype="fp8")  # fmt: skip
    par = ParallelSpec(dp=ep, ep=ep, ep_dispatch="deepep")
    return build_plan(DSV3, work, par, cluster_preset("hgx-h800", max(1, ep // 8)), Options(timeline=False))


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


def test_times_against_deepeps_table():
    slowest_leg, serial = [], []
    for row in TABLE["rows"]:
        legs = _legs(row["ep"])
        for kind, key, row_bytes in (("dispatch", "dispatch_GBps", FP8_ROW), ("combine", "combine_GBps", BF16_ROW)):
            measured = _deepep_rows(row["ep"]) * row_bytes / (row[key] * 1e9)
            times = [pc.price.time_s for name, pc in legs.items() if name.startswith(f"ep.{kind}.")]
            slowest_leg.append(max(times) / measured - 1)
            serial.append(sum(times) / measured - 1)
    assert all(abs(e) <= 0.20 for e in slowest_leg), slowest_leg
    assert statistics.median(abs(e) for e in slowest_leg) <= 0.12
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
