"""The host beside the GPU: one stream of kernels launched one by one from Python, with syncs (issue 20, moehost).

Two queues. The host spends ``host_s`` on launch i (the Python and the dispatch before it) and then enqueues it: it
is on the queue at H_i = H_{i-1} + host_s_i. The GPU runs the queue in order: kernel i starts at
S_i = max(H_i, E_{i-1}) and ends at E_i = S_i + gpu_s_i. A device-to-host sync after kernel j makes the host wait
for the GPU: H_j := max(H_j, E_j), so the next launch finds an empty queue.

From an empty queue with host and GPU together at 0 (just after a sync), the GPU ends kernel n at

    E_n = max over i of ( H_i + gpu_s_i + ... + gpu_s_n )

(the longest path of the two chains: unroll E_n = max(H_n, E_{n-1}) + gpu_s_n; ``stream_span``). A launch group of
n alike (host c each, GPU d in all) enters with its first or its last launch, whichever is larger: the term is
linear in the launch's place. So:

- host-bound (every gpu_s_i <= host_s_i): E_n = H_n + gpu_s_n, the host's time and the last kernel;
- GPU-bound (the host ahead from the first launch on): E_n = host_s_1 + the GPU's sum;
- the per-kernel floor sum max(gpu_s_i, host_s_i) that kernels.py charges without CUDA graphs is never below
  E_n by more than one min(host_s_i, gpu_s_i) (term i of the max is at most that floor sum + min(c_i, d_i)):
  it is the lockstep bound, E_n the exact time.

A layer repeated with one sync each (Megatron-Core's alltoall dispatcher: the experts' counts to the host, then a
stream sync, once per MoE layer forward; token_dispatcher.py ``_maybe_dtoh_and_synchronize``) runs, in the steady
state, one ``synced_period``: the span of its kernels taken from just after the sync around to the sync (the host's
lead is thrown away at every sync, so each layer starts from an empty queue). A pass without a sync runs at its
slower queue: max(host, GPU) per layer (``free_running``), the host's lead carried from layer to layer.

Two micro-batches' passes interleaved on one host thread (Megatron's combined 1F1B: a layer's backward of one
micro-batch and its forward of the next, node by node; kernels.COMBINED_1F1B_ORDER) are one launch list with one sync:
its steady state is ``synced_period`` of the pair's launches in host order, ``queued`` the groups the host enqueues
between the copy and the wait (there, the other micro-batch's expert backward), so the wait need not drain the GPU
(compute.combined_pair).
"""

from __future__ import annotations

from collections.abc import Sequence

# (host seconds per launch, GPU seconds of the group, launches)
Launch = tuple[float, float, int]


def stream_span(launches: Sequence[Launch]) -> float:
    """Seconds from an empty queue, host and GPU together, to the GPU's end of the last launch (module docstring:
    max over i of H_i + the GPU's time from launch i on). ``launches``: (host_s per launch, gpu_s of the group,
    count) in launch order; a group's launches take gpu_s / count each."""
    span = 0.0
    after = 0.0  # GPU seconds of the groups after the current one
    host = sum(c * n for c, _, n in launches)  # H at the end of the current group
    for c, d, n in reversed(launches):
        if n <= 0:
            continue
        first = host - (n - 1) * c + d + after  # the group's first launch: H, then all its GPU time and the rest
        last = host + d / n + after  # its last launch: all its host time, then one launch's GPU time
        span = max(span, first, last)
        after += d
        host -= n * c
    return span


def synced_period(launches: Sequence[Launch], sync: int, queued: int = 0) -> float:
    """Seconds a layer takes in the steady state when every layer syncs once on launch ``sync`` (its index in
    ``launches``: the host waits until the GPU has run it): the span of the layer from the launch after the sync
    around to the sync. ``queued``: the launch groups after ``sync`` that the host enqueues before it waits (Megatron
    copies the counts to the host before permuting and waits after, token_dispatcher.py): the GPU finds them queued
    when the host resumes (no host time in the period's head) and the host spends their launches before the wait
    (at the period's end, with no GPU time)."""
    after = list(launches[sync + 1 :])
    head = [(0.0, d, n) for _, d, n in after[:queued]]
    tail = [(c, 0.0, n) for c, _, n in after[:queued]]
    return stream_span(head + after[queued:] + list(launches[: sync + 1]) + tail)


def free_running(launches: Sequence[Launch]) -> float:
    """Seconds a layer takes in the steady state of a pass without syncs: its slower queue, host or GPU."""
    return max(sum(c * n for c, _, n in launches), sum(d for _, d, _ in launches))
