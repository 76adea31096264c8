"""One published MoE row's layer as the planner prices it, kernel by kernel, and the host bound it allows (host13).

    PYTHONPATH=. python bench/moe_host_row.py ["<published.json case name>"]

Prints, for the row's MoE layer (default: Megatron-Bridge 25.11 Qwen3-30B-A3B FP8-CS on 16 H100, host13's worst MoE
row, since outliers15 at its recipe's VP 12 and micro-batch 1):
each kernel group of the forward and the backward with its GPU time (``kernels.gpu_seconds``) and its host time at
the synced layer's cost a launch (``kernels.queue_launch_s``: Megatron-Core's measured 38.2 us); the layer pair of
Megatron's combined 1F1B (``kernels.combined_pair_launches``: the host's launches before the count wait, the GPU
work the wait needs) and its steady-state period (``host.synced_period``); the step's breakdown; what the measured
step allows a layer pair and a launch; and the cross-rank bound of a two-stage interleaved pipeline with one layer
a model chunk (``coupled_period``), which is what VP24 on PP2 (the table's) would add to the pair. docs/step-time.md
"The MoE rows' host time (host13)" holds the figures and the sources. Nothing here changes the model.
"""

from __future__ import annotations

import sys

from bench import step_validation
from planner import build_plan
from planner.compute import layer_pass
from planner.context import Context
from planner.host import synced_period
from planner.kernels import (
    combined_pair_launches,
    gpu_efficiency,
    gpu_seconds,
    host_launches,
    launch,
    layer_kernels,
    queue_launch_s,
)

ROW = "Megatron-Bridge Qwen3-30B-A3B FP8-CS, 16 H100"

# What the row's code runs per combined 1F1B step (one model chunk's forward of one micro-batch beside one chunk's
# backward of another) that the planner's layer lists do not charge, counted from the source at the 25.11 pins
# (Megatron-Bridge 5776a6d90b, its Megatron-LM submodule 92c8482e6d; see the doc section). Calls, not kernels: each is
# host work beside the layer's launches. (what, calls a combined step, source)
CHUNK_STEP_CALLS = (
    ("p2p isend/irecv (send_forward_recv_forward, send_backward_recv_backward)", 4,
     "pipeline_parallel/schedules.py l. 1595-1690 pp_post_forward / pp_post_backward with overlap_p2p_comm (Bridge "
     "comm_overlap.py l. 450-457: vp > 1 -> overlap_p2p_comm True, batch_p2p_comm False) -> p2p_communication.py "
     "_p2p_ops: one torch.distributed.isend / irecv each, no torch.cuda.synchronize (batch_p2p_sync needs "
     "batch_p2p_comm)"),
    ("p2p stream waits (recv_prev, recv_next, the previous sends)", 4,
     "schedules.py pp_pre_forward / pp_pre_backward / the send handles: Work.wait(), a stream wait, not a host block"),
    ("EP all-to-alls beside the kernels (dispatch, combine, the probs; forward and backward)", 6,
     "transformer/moe/token_dispatcher.py MoEAlltoAllTokenDispatcher token_dispatch / token_combine and the probs' "
     "all_to_all (moe9): NCCL calls on the communication stream, priced as communication, no host time"),
    ("schedule-node events (record + wait a node; 12 nodes a pair)", 24,
     "pipeline_parallel/utils.py ScheduleNode stream_acquire_context: event.wait + event.record, CUDA API calls"),
    ("autograd entries (one run_backward a backward node)", 5,
     "pipeline_parallel/utils.py ScheduleNode._backward: Variable._execution_engine.run_backward per node"),
    ("batch fetch and host-to-device copies (tokens + position_ids on the first stage, labels + loss_mask on the "
     "last)", 2,
     "Bridge training/gpt_step.py get_batch: is_pp_first_stage / is_pp_last_stage of the pp group, not the virtual "
     "stage, so with PP2 every chunk of both ranks runs next(data_iterator) and two .cuda(non_blocking=True)"),
    ("host syncs", 0,
     "none in combined_1f1b.py, model_chunk_schedule_plan.py or schedules.py's steady state; the pair's only wait is "
     "the dispatcher's count wait, already in the planner (expert_counts_sync)"),
)  # fmt: skip


def coupled_period(host_pre: float, host_post: float, gpu_pre: float, transfer: float) -> float:
    """Seconds a combined 1F1B step takes in the steady state of a two-stage interleaved pipeline with one layer a
    model chunk, when each step's only host block is its count wait (host.synced_period's pair).

    Megatron's interleaved schedule (schedules.py get_pp_rank_microbatches: warm-up (p - r - 1)·2 + (v - 1)·p, + 1
    under the EP overlap) puts rank 0's forward of chunk c + 1 and its backward of chunk c in the same steady-state
    slot s as rank 1's forward and backward of chunk c, and rank 1's slot s after rank 0's slot s - 2. A slot's inputs
    arrive as stream waits at its start (pp_pre_forward, pp_pre_backward); its outputs leave after the whole pair is
    enqueued (TransformerModelChunkSchedulePlan.run: post_forward on the communication stream, post_backward on the
    compute stream, after the layers). So a rank's host passes its count wait only once the peer's sends of the slot it
    needs have landed (``transfer``) and its GPU has run the work before the copy (``gpu_pre``); it then spends
    ``host_post`` to the end of the step, where it sends. Two slots hold two such hops:

        period = max(host_pre + host_post, transfer + gpu_pre + host_post)

    ``host_pre``: host seconds of the step up to the wait (including what it queues between the copy and the wait);
    ``host_post``: the rest of the step's host seconds."""
    return max(host_pre + host_post, transfer + gpu_pre + host_post)


def pair_split(launches, copy: int, queued: int, host_s: float) -> tuple[float, float, float]:
    """(host seconds up to the wait, host seconds after it, GPU seconds up to and including the count copy) of a
    combined 1F1B pair (kernels.combined_pair_launches: the host enqueues ``queued`` groups after the copy before it
    waits)."""
    wait = copy + queued
    pre = sum(host_launches(k) for k in launches[: wait + 1]) * host_s
    post = sum(host_launches(k) for k in launches[wait + 1 :]) * host_s
    gpu_pre = sum(gpu_seconds(k) for k in launches[: copy + 1])
    return pre, post, gpu_pre


def row(name: str = ROW):
    data = step_validation.load()
    case = next(c for c in data["cases"] if c["name"] == name)
    spec, work, par, cluster, options = step_validation.case_inputs(case, data)
    ctx = Context(spec, work, par)
    return case, data, ctx, cluster, options


def _table(title: str, kernels, c: float) -> None:
    launches = sum(host_launches(k) for k in kernels)  # the host's: a TE graph's kernels are one replay
    gpu = sum(gpu_seconds(k) for k in kernels)
    print(f"\n{title}: {launches} launches, GPU {gpu * 1e3:.3f} ms, host {launches * c * 1e3:.3f} ms\n")
    print("| kernel group | kind | launches | GPU (us) | host at the queue's cost (us) |")
    print("|---|---|---|---|---|")
    for k in kernels:
        n = host_launches(k)
        print(f"| {k.name} | {k.kind} | {n} | {gpu_seconds(k) * 1e6:,.1f} | {n * c * 1e6:,.1f} |")


def _per_layer_measured(ctx: Context, measured: float) -> tuple[int, int, float]:
    """(micro-batches a rank, layers a rank, measured seconds a layer's forward and backward)."""
    par = ctx.par
    m = ctx.work.global_batch_size // (ctx.work.micro_batch_size * par.dp)
    layers = ctx.model.num_layers // par.pp
    return m, layers, measured / (m * layers)


def _pair(ctx: Context, cluster, lk, c: float, measured: float) -> None:
    """The combined 1F1B pair: launches, GPU, host before and after the wait, the period, the measured bound and
    the interleaved pipeline's coupled period."""
    kernels, copy, queued = combined_pair_launches(ctx, lk)
    n = sum(host_launches(k) for k in kernels)
    g = sum(gpu_seconds(k) for k in kernels)
    period = synced_period([launch(k, c) for k in kernels], copy, queued)  # as compute._pair_and_passes
    pre, post, gpu_pre = pair_split(kernels, copy, queued, c)
    m, layers, per_pair = _per_layer_measured(ctx, measured)
    print(
        f"layer pair (combined 1F1B): {n} launches, GPU {g * 1e3:.3f} ms, host {n * c * 1e3:.3f} ms "
        f"(before the wait {pre * 1e3:.3f}, after {post * 1e3:.3f}), period {period * 1e3:.3f} ms"
    )
    print(
        f"measured: {m} micro-batches x {layers} layers a rank -> {per_pair * 1e3:.2f} ms a layer pair; "
        f"{per_pair / n * 1e6:.1f} us a launch if host-bound"
    )
    # the p2p of one micro-batch's hidden states in bf16 (Megatron's pipeline_dtype) over one NIC (PP2 on 2 nodes)
    hidden = ctx.model.hidden_size * ctx.work.micro_batch_size * (ctx.work.seq_length or ctx.model.seq_length) * 2
    transfer = hidden / (cluster.nic_bandwidth_GBps * 1e9)
    print(
        f"interleaved PP2, one layer a chunk: GPU before the copy {gpu_pre * 1e3:.3f} ms, p2p of {hidden / 1e6:.1f} MB "
        f"~{transfer * 1e3:.2f} ms: coupled period {coupled_period(pre, post, gpu_pre, transfer) * 1e3:.3f} ms"
    )


def _passes(ctx: Context, lk, eff, measured: float) -> None:
    """A layer without the combined 1F1B: each pass as compute.layer_pass prices it (the GPU's own time and its wait
    for the host)."""
    f, b = layer_pass(ctx, lk, eff), layer_pass(ctx, lk, eff, backward=True)
    m, layers, per_layer = _per_layer_measured(ctx, measured)
    n = sum(host_launches(k) for k in lk.forward) + sum(host_launches(k) for k in lk.backward)
    print(
        f"forward {f.total_s * 1e3:.3f} ms (host wait {f.host_s * 1e3:.3f}), backward {b.total_s * 1e3:.3f} ms "
        f"(host wait {b.host_s * 1e3:.3f}); measured: {m} micro-batches x {layers} layers a rank -> "
        f"{per_layer * 1e3:.2f} ms a layer, {per_layer / n * 1e6:.1f} us a launch if host-bound"
    )


def main(name: str = ROW) -> None:
    case, data, ctx, cluster, options = row(name)
    gpu = cluster.gpu
    eff = gpu_efficiency(gpu)
    lk = layer_kernels(ctx, True, gpu)
    c = queue_launch_s(ctx, eff)
    print(f"{name}: host per launch in a synced layer {c * 1e6:.1f} us")
    _table("MoE layer forward", lk.forward, c)
    _table("MoE layer backward", lk.backward, c)
    step = build_plan(*step_validation.case_inputs(case, data)).step
    measured = step_validation.measured_time(case, data)
    print(
        f"\nstep: predicted {step.time_s:.2f} s (compute {step.compute_s:.2f}, exposed comm "
        f"{step.exposed_comm_s:.3f}, bubble {step.bubble_s:.3f}); measured {measured:.2f} s"
    )
    paired = options.overlap.overlap_moe_expert_parallel_comm and combined_pair_launches(ctx, lk) is not None
    _pair(ctx, cluster, lk, c, measured) if paired else _passes(ctx, lk, eff, measured)
    print("\n| uncharged per combined step | calls | source |\n|---|---|---|")
    for what, calls, source in CHUNK_STEP_CALLS:
        print(f"| {what} | {calls} | {source} |")


if __name__ == "__main__":
    main(*sys.argv[1:])
