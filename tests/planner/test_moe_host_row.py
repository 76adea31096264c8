"""The worst MoE row's layer, launch by launch, and the interleaved pipeline's cross-rank bound (host13;
docs/step-time.md "The MoE rows' host time (host13)", bench/moe_host_row.py).

The row: Megatron-Bridge 25.11 Qwen3-30B-A3B FP8-CS on 16 H100 (TP1 PP2 EP8, seq 4096, combined 1F1B EP overlap),
TransformerEngine v2.9 (70f536662a) under Megatron-LM 92c8482e6d (Bridge 5776a6d90b's submodule); since outliers15 at
its recipe's VP 12 and MBS 1 (Megatron-Bridge r0.2.0 qwen3 workload_base_configs.py; the table printed VP24, MBS 2).
"""

from __future__ import annotations

import pytest

from bench import moe_host_row, step_validation
from planner.host import synced_period
from planner.kernels import (
    COUNT_SYNC,
    combined_pair_launches,
    gpu_efficiency,
    gpu_seconds,
    layer_kernels,
    queue_launch_s,
)

CASE, DATA, CTX, CLUSTER, _ = moe_host_row.row()
GPU = CLUSTER.gpu
EFF = gpu_efficiency(GPU)
LK = layer_kernels(CTX, True, GPU)
C = queue_launch_s(CTX, EFF)


def launches(kernels, name=None) -> int:
    return sum(k.count for k in kernels if name is None or k.name == name)


def test_the_rows_launches_and_syncs_per_layer_are_the_sources():
    """Per MoE layer and micro-batch (moe8, moe9, moe11, moe11b counts from TE v2.9 and Megatron-LM 92c8482e6d): one
    cuBLAS launch a local expert for fc1 and fc2 forward, dgrad and wgrad (16 each at ep 8); current scaling's four
    launches a tensor for each of the 16 splits of the two grouped inputs (128) beside the dense linears' quantizes
    (qkv's norm output 3, linear_proj's input 4: 135 forward), the backward's output gradients likewise (140); the
    dispatcher's 11 preprocess launches; one count sync a forward, none a backward."""
    fwd, bwd = LK.forward, LK.backward
    assert [launches(fwd, n) for n in ("experts_fc1", "experts_fc2")] == [16, 16]
    assert [launches(bwd, f"experts_fc{i}.{g}") for i in (1, 2) for g in ("dgrad", "wgrad")] == [16] * 4
    assert (launches(fwd, "fp8_cast"), launches(bwd, "fp8_cast.bwd")) == (16 * 2 * 4 + 3 + 4, 16 * 2 * 4 + 12)
    assert launches(fwd, "dispatch_preprocess") == 11
    assert (launches(fwd, COUNT_SYNC), launches(bwd, COUNT_SYNC)) == (1, 0)
    assert (launches(fwd), launches(bwd)) == (210, 241)


def test_the_pair_is_host_bound_at_the_closed_form():
    """The combined 1F1B pair: 451 launches at Megatron-Core's measured 38.2 us is 17.2282 ms of host over 7.22 ms
    of GPU at micro-batch 1 (12.37 ms at the table's micro-batch 2, outliers15; 12.65 ms before fp8audit14: the weights
    no longer cast in every micro-batch), so its period is the host's
    time exactly (host.synced_period's host-bound case: the last groups the host enqueues before the wait carry no GPU
    time in the period)."""
    kernels, copy, queued = combined_pair_launches(CTX, LK)
    n = launches(kernels)
    assert n == 451
    assert pytest.approx(38.2e-6) == C
    gpu = sum(gpu_seconds(k) for k in kernels)
    period = synced_period([(C, gpu_seconds(k), k.count) for k in kernels], copy, queued)
    assert gpu == pytest.approx(7.223e-3, abs=5e-6) and gpu < n * C
    assert period == pytest.approx(n * 38.2e-6, rel=1e-12)


def test_what_the_measured_step_allows_a_layer_pair():
    """24.85 s over 64 micro-batches (its recipe's micro-batch 1) x 24 layers a rank: 16.18 ms a layer pair, 0.94x
    the pair's 17.23 ms; host-bound it would take 35.9 us a launch, below Megatron-Core's measured 38.2 us (at the
    table's micro-batch 2, 32 micro-batches: 32.35 ms, 1.88x, 71.7 us: the miss host13 could not place)."""
    measured = step_validation.measured_time(CASE, DATA)
    assert CTX.micro_batches == 64
    per_pair = measured / (64 * 24)
    assert per_pair == pytest.approx(16.18e-3, abs=5e-5)
    assert per_pair / (451 * C) == pytest.approx(0.939, abs=2e-3)
    assert per_pair / 451 == pytest.approx(35.9e-6, abs=1e-7)


def _simulated_slope(host_pre, host_post, gpu_pre, transfer, slots=400) -> float:
    """Two ranks, slot by slot: a rank's host passes its wait at max(its own host, the peer's send + transfer + the
    GPU before the copy) and ends the slot host_post later, sending then; rank 0's slot s needs rank 1's slot s,
    rank 1's slot s needs rank 0's slot s - 2 (coupled_period's docstring)."""
    a, b = [0.0, 0.0], [0.0, 0.0]
    for s in range(2, slots):
        b.append(max(b[s - 1] + host_pre, a[s - 2] + transfer + gpu_pre) + host_post)
        a.append(max(a[s - 1] + host_pre, b[s] + transfer + gpu_pre) + host_post)
    return (a[-1] - a[-101]) / 100


@pytest.mark.parametrize(
    ("pre", "post", "gpu_pre", "x", "period"),
    [(3.0, 5.0, 1.0, 0.5, 8.0), (1.0, 5.0, 2.0, 1.0, 8.0), (0.5, 2.0, 1.5, 1.0, 4.5), (4.0, 4.0, 4.0, 0.0, 8.0)],
)
def test_coupled_period_closed_form_and_simulation(pre, post, gpu_pre, x, period):
    """max(host, transfer + GPU before the copy + host after the wait), by hand and against the slot recurrence."""
    assert moe_host_row.coupled_period(pre, post, gpu_pre, x) == pytest.approx(period)
    assert _simulated_slope(pre, post, gpu_pre, x) == pytest.approx(period)


def test_the_interleaved_coupling_does_not_bind_on_the_row():
    """On the row the host spends 8.25 ms before the count wait, more than the p2p (16.8 MB at 50 GB/s, 0.34 ms) and
    the GPU work before the copy (0.93 ms): two layers a model chunk on PP2 (VP 12) do not lengthen the pair (nor did
    one at the table's VP 24 and micro-batch 2: 33.6 MB, 0.67 ms; 1.68 ms)."""
    kernels, copy, queued = combined_pair_launches(CTX, LK)
    pre, post, gpu_pre = moe_host_row.pair_split(kernels, copy, queued, C)
    assert pre + post == pytest.approx(451 * C)
    assert pre == pytest.approx(8.251e-3, abs=5e-6) and gpu_pre == pytest.approx(0.930e-3, abs=5e-6)
    transfer = 2048 * 1 * 4096 * 2 / 50e9
    assert moe_host_row.coupled_period(pre, post, gpu_pre, transfer) == pytest.approx(pre + post)


def test_the_uncharged_calls_hold_no_host_sync():
    """The per-step calls counted from source beside the layer's kernels: none blocks the host."""
    calls = {what: n for what, n, _ in moe_host_row.CHUNK_STEP_CALLS}
    assert calls["host syncs"] == 0
    assert sum(calls.values()) == 45
