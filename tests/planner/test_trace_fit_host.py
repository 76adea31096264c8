"""The host's time per kernel launch read off a torch.profiler trace (planner/trace_fit.py host_launch, issue 20
item 4): the median gap between consecutive launches of one thread where each kernel found the GPU idle, on traces
built here from Kineto's field names (closed forms) and on the committed real traces: Megatron-Core's own MoE layer
on the H200 (host-bound), the H200 eager layers (the dense one GPU-bound) and HTA's public A100 trace."""

import gzip
import json
from pathlib import Path
from statistics import median

import pytest

from collectives.topology.gpu import GPUS
from planner.kernels import EFFICIENCY
from planner.profile_trace import LAUNCH_CALL, WAIT_CALL, load_trace
from planner.trace_fit import HOST_BOUND_LAG_S, MIN_HOST_GAPS, fit_trace, host_bound, host_gaps, host_launch

H200_DIR = Path(__file__).resolve().parents[1] / "reference" / "kernels" / "h200"
TRACES = Path(__file__).resolve().parents[1] / "reference" / "traces"
H200 = GPUS["h200-sxm-141gb"]
MEGATRON = "trace_megatron_qwen3_30b.ep8_alltoall_T8192.json.gz"


def _h200(name):
    return load_trace((H200_DIR / name).read_bytes())


def _launching(period_us, kernel_us, n=30, lag_us=2.0, extra=()):
    """n launches on one host thread every ``period_us`` (each call 3 us), each kernel starting ``lag_us`` after its
    call returns or when the GPU's previous kernel ends, whichever is later; ``extra`` events added as they are."""
    events, gpu_free = [], 0.0
    for i in range(n):
        t = 1000.0 + period_us * i
        start = max(t + 3 + lag_us, gpu_free)
        gpu_free = start + kernel_us
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": t,
                       "dur": 3, "args": {"correlation": i + 1}})  # fmt: skip
        events.append({"ph": "X", "cat": "kernel", "name": "vectorized_elementwise_kernel", "pid": 0, "tid": 7,
                       "ts": start, "dur": kernel_us, "args": {"correlation": i + 1}})  # fmt: skip
    return load_trace({"traceEvents": events + list(extra)})


def test_a_host_bound_thread_gives_its_launch_period():
    """Every kernel (5 us) starts 2 us after its call returns: the GPU waits for each launch, and the host's time per
    launch is the period between calls, 40 us, over the 29 gaps of 30 launches."""
    host = host_launch(_launching(40, 5))
    assert (host.launches, host.host_bound, host.gaps) == (30, 30, 29)
    assert host.host_launch_s == host.mean_s == pytest.approx(40e-6)
    assert host.quartiles_s == pytest.approx((40e-6, 40e-6))


def test_a_gpu_bound_trace_gives_none():
    """Kernels of 100 us launched every 40 us queue up: only the first finds the GPU idle, no gap is read."""
    trace = _launching(40, 100)
    host = host_launch(trace)
    assert (host.launches, host.host_bound, host.gaps, host.host_launch_s) == (30, 1, 0, None)
    fit = fit_trace(trace, H200)
    assert "host_launch_s" not in fit.constants and fit.efficiency.host_launch_s == EFFICIENCY.host_launch_s
    assert any(f"at least {MIN_HOST_GAPS} gaps" in w and "GPU-bound" in w for w in fit.warnings)


def test_the_lag_that_says_the_gpu_waited():
    """A kernel that starts within HOST_BOUND_LAG_S (5 us) of its call's return found the GPU idle; later, it was
    queued behind work."""
    assert host_launch(_launching(40, 5, lag_us=4.9)).gaps == 29
    assert host_launch(_launching(40, 5, lag_us=5.1)).host_bound == 0
    assert HOST_BOUND_LAG_S == 5e-6


def test_gaps_over_a_wait_or_another_threads_launch_are_left_out():
    """A cudaStreamSynchronize between launches 10 and 11 (its wait is the GPU's time, not the host's), and a launch
    of another thread between 20 and 21 (the two threads' gaps interleave): 27 gaps, each still 40 us. Memsets and a
    CUDA graph's replay are no kernel launches: they count neither as launches nor as waits."""
    sync = {"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamSynchronize", "pid": 1, "tid": 1, "ts": 1405, "dur": 1}
    other = [
        {"ph": "X", "cat": "cuda_runtime", "name": "cuLaunchKernelEx", "pid": 1, "tid": 2, "ts": 1810, "dur": 3,
         "args": {"correlation": 99}},
        {"ph": "X", "cat": "kernel", "name": "nvjet_tst", "pid": 0, "tid": 8, "ts": 1815, "dur": 5,
         "args": {"correlation": 99}},
    ]  # fmt: skip
    not_launches = [
        {"ph": "X", "cat": "cuda_runtime", "name": name, "pid": 1, "tid": 1, "ts": 1205 + 40 * i, "dur": 1,
         "args": {"correlation": 200 + i}}
        for i, name in enumerate(("cudaMemsetAsync", "cudaGraphLaunch", "cudaStreamWaitEvent", "cudaEventQuery"))
    ]  # fmt: skip
    trace = _launching(40, 5, extra=[sync, *other, *not_launches])
    host = host_launch(trace)
    assert (host.launches, host.host_bound, host.gaps) == (31, 31, 27)
    assert host.host_launch_s == host.mean_s == pytest.approx(40e-6)
    assert [launch.after_wait for launch in trace.launches].count(True) == 1


def test_launch_and_wait_calls_by_name():
    """CUPTI's names, runtime and driver API, with the suffixes some builds print."""
    launches = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
                "cudaLaunchKernel_v7000", "cudaLaunchKernel_ptsz", "cudaLaunchCooperativeKernel")  # fmt: skip
    assert all(LAUNCH_CALL.match(n) for n in launches)
    assert not any(LAUNCH_CALL.match(n) for n in ("cudaGraphLaunch", "cudaLaunchHostFunc", "cudaMemsetAsync"))
    waits = ("cudaStreamSynchronize", "cudaEventSynchronize", "cudaDeviceSynchronize", "cuCtxSynchronize",
             "cudaMemcpyAsync", "cudaMemcpy", "cuMemcpyDtoHAsync_v2")  # fmt: skip
    assert all(WAIT_CALL.match(n) for n in waits)
    assert not any(WAIT_CALL.match(n) for n in ("cudaStreamWaitEvent", "cudaEventQuery", "cudaMemcpyPeerAsync"))


def test_a_host_slower_than_the_range_is_clipped_and_said():
    """2 ms between launches is above host_launch_s's 1 ms bound (KERNEL_CONSTANTS): clipped, with a warning."""
    fit = fit_trace(_launching(2000, 5), H200)
    assert fit.host.host_launch_s == pytest.approx(2e-3)
    assert fit.constants["host_launch_s"] == fit.efficiency.host_launch_s == 1e-3
    assert "host_launch_s = 2.00 ms is outside 0 s .. 1.00 ms: clipped" in fit.warnings  # human units, never 0.002


# ---- the committed traces -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def megatron():
    return _h200(MEGATRON)


def test_megatron_cores_moe_layer_gives_its_hosts_time_per_launch(megatron):
    """tests/reference/kernels/h200/trace_megatron_qwen3_30b.ep8_alltoall_T8192 (torch.profiler, 2 steps of Megatron-
    Core 0.19.2's 16-expert Qwen3 MoE layer at 8,192 tokens, H200): 750 of its 876 kernel launches found the GPU
    idle; 699 gaps between them (the count syncs' and copies' gaps left out) have a median 32.6 us (quartiles 25.0 and
    46.6, mean 47.6: a few gaps hold the dispatcher's Python). The moehost replay's median over every GPU activity's
    launch, memsets and copies among them, is 31.4 us (tests/planner/test_moe_kernels.py); the same row measured
    without the profiler spends 36.5 us of host per kernel launch (megatron_moe_h200.json: host_s / launches, a
    mean), and host_launch_s, the median of the 47 host-bound rows, is 38.2 us: the trace's median is 15% below it."""
    host = host_launch(megatron)
    assert (host.launches, host.host_bound, host.gaps) == (876, 750, 699)
    assert round(host.host_launch_s * 1e6, 1) == 32.6
    assert [round(q * 1e6, 1) for q in host.quartiles_s] == [25.0, 46.6] and round(host.mean_s * 1e6, 1) == 47.6
    rows = json.loads((H200_DIR / "megatron_moe_h200.json").read_text())
    row = next(
        dict(zip(rows["columns"], r, strict=True))
        for r in rows["rows"]
        if r[:4] == ["qwen3_30b.ep8", "alltoall", "mlp", 8192]
    )
    assert round(row["host_s"] / row["launches"] * 1e6, 1) == 36.5
    assert host.host_launch_s / EFFICIENCY.host_launch_s - 1 == pytest.approx(-0.148, abs=0.001)
    fit = fit_trace(megatron, H200)
    assert fit.constants["host_launch_s"] == fit.efficiency.host_launch_s == host.host_launch_s
    assert any("(32.6 us, the median of 699 gaps) was read with the profiler on" in w for w in fit.warnings)


def test_the_gaps_do_not_hang_on_the_lag_chosen(megatron, monkeypatch):
    """80% of the Megatron trace's kernels start 1.4-2.6 us after their call returns; at 10 us instead of 5 the
    median moves 0.3% (712 gaps)."""
    lags = sorted(x.kernel_start_s - x.end_s for x in megatron.launches)
    assert lags[len(lags) // 10] > 1.3e-6 and lags[8 * len(lags) // 10] < 2.7e-6
    at_5 = host_launch(megatron).host_launch_s
    monkeypatch.setattr("planner.trace_fit.HOST_BOUND_LAG_S", 10e-6)
    wider = host_launch(megatron)
    assert wider.gaps == 712 and wider.host_launch_s / at_5 - 1 == pytest.approx(-0.003, abs=0.001)


def test_the_eager_h200_traces():
    """The dense Llama-3 8B layer is GPU-bound: 7 of 189 launches found the GPU idle, 5 gaps: no constant. The eager
    Qwen3-235B MoE layer is host-bound after its routing syncs: 71 gaps, median 26.1 us, near the 26.6 us the moehost
    test reads over those windows' activities (profiled eager PyTorch: tiny ops 15.6-17.4 us there)."""
    dense, moe = (
        host_launch(_h200("trace_llama3_8b.tp1.s4096.json.gz")),
        host_launch(_h200("trace_qwen3_235b.ep1.s2048.json.gz")),
    )
    assert (dense.launches, dense.host_bound, dense.gaps, dense.host_launch_s) == (189, 7, 5, None)
    assert (moe.launches, moe.host_bound, moe.gaps) == (480, 89, 71)
    assert round(moe.host_launch_s * 1e6, 1) == 26.1


def test_htas_public_a100_trace():
    """tests/reference/traces/hta_trace_diff_control (A100, PyTorch, integer-us timestamps): 2,333 of 8,568 launches
    host-bound, 1,936 gaps, median 35 us; hta_sampled_rank-0: 195 gaps, median 74 us, its quartiles 33-218 us (long
    host work between its launches)."""
    control = host_launch(load_trace((TRACES / "hta_trace_diff_control.json.gz").read_bytes()))
    assert (control.launches, control.host_bound, control.gaps, control.host_launch_s) == (8568, 2333, 1936, 35e-6)
    sampled = host_launch(load_trace((TRACES / "hta_sampled_rank-0.json.gz").read_bytes()))
    assert (sampled.gaps, sampled.host_launch_s, sampled.quartiles_s) == (195, 74e-6, (33e-6, 218e-6))


def test_the_gaps_are_the_launches_own(megatron):
    """Each gap read is between two host-bound launches of one thread, none after a wait: recomputed from the raw
    events, the same median."""
    events = json.loads(gzip.decompress((H200_DIR / MEGATRON).read_bytes()))["traceEvents"]
    calls = sorted(
        (e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver") and e.get("ph") == "X"),
        key=lambda e: e["ts"],
    )
    started = {e["args"]["correlation"]: e["ts"] for e in events if e.get("cat") == "kernel"}
    gaps, waited = [], {}
    previous = None
    for c in calls:
        thread = c["tid"]
        if WAIT_CALL.match(c["name"]):
            waited[thread] = True
            continue
        if not LAUNCH_CALL.match(c["name"]) or c["args"]["correlation"] not in started:
            continue
        bound = started[c["args"]["correlation"]] - (c["ts"] + c["dur"]) <= 5.0
        if previous is not None and previous[0] == thread and previous[2] and bound and not waited.get(thread):
            gaps.append(c["ts"] - previous[1])
        previous, waited[thread] = (thread, c["ts"], bound), False
    assert len(gaps) == 699 and median(gaps) == pytest.approx(host_launch(megatron).host_launch_s * 1e6, abs=1e-3)
    assert len(host_gaps(megatron.launches)) == 699 and sum(map(host_bound, megatron.launches)) == 750
