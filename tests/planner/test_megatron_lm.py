"""Megatron-LM before Megatron-Core (planner/flavours/megatron_lm.py): the pipeline's scatter/gather (Narayanan et al.
2021 §4.1; megatron/p2p_communication.py at 6985e58): each TP rank sends 1/t of the boundary tensor and the
receiver all-gathers it over TP, and the step waits for both."""

from dataclasses import replace

import pytest

from collectives.topology import cluster_preset
from planner import Options, ParallelSpec, WorkloadSpec, build_plan, model_preset
from planner.compute import optimizer_s
from planner.context import Context

GPT3 = model_preset("gpt3-175b")
WORK = WorkloadSpec(micro_batch_size=1, global_batch_size=16, activation_recompute="full", attention_kernel="unfused")


def plan(framework, sp=False, model=GPT3):
    par = ParallelSpec(tp=8, pp=4, dp=1, sequence_parallel=sp, framework=framework)
    return build_plan(model, WORK, par, cluster_preset("dgx-a100", 4), Options(timeline=False))


def rows(p, prefix="pp."):
    return {(pc.call.name, pc.call.stages): pc for pc in p.calls if pc.call.name.startswith(prefix)}


def test_each_tp_rank_sends_its_eighth_and_the_receiver_gathers_the_whole():
    """GPT-3 175B, b 1, s 2,048, h 12,288, fp16/bf16: the boundary tensor is 2,048 x 12,288 x 2 = 50,331,648 B;
    Megatron-Core sends it whole from each TP rank, Megatron-LM of 2021 an eighth (6,291,456 B) and all-gathers
    the 50,331,648 B back on the receiving stage, once per send: 16 micro-batches, forward on stages 1-3 and the
    gradient's on stages 0-2."""
    core, old = rows(plan("megatron")), rows(plan("megatron-lm-2021"))
    assert {k: v.call.message_bytes for k, v in core.items()} == {
        ("pp.activation", (0, 1, 2)): 50_331_648,
        ("pp.activation_grad", (1, 2, 3)): 50_331_648,
    }
    assert {k: (v.call.op.value, v.call.message_bytes, v.call.calls_per_iteration) for k, v in old.items()} == {
        ("pp.activation", (0, 1, 2)): ("sendrecv", 6_291_456, 16),
        ("pp.activation_grad", (1, 2, 3)): ("sendrecv", 6_291_456, 16),
        ("pp.gather", (1, 2, 3)): ("allgather", 50_331_648, 16),
        ("pp.gather_grad", (0, 1, 2)): ("allgather", 50_331_648, 16),
    }
    assert old["pp.gather", (1, 2, 3)].call.group.dims == ("tp",)


def test_the_step_waits_for_the_send_and_the_gather():
    """One boundary crossing is the eighth's send plus the receiver's gather (step.StreamTotals.p2p_s): with a
    blocking p2p (1F1B, overlap_p2p off) the step differs from Megatron-Core's by exactly the crossings' difference,
    2·(m + p - 1)·Δ per 1F1B pipeline (the steady state's 2 per micro-batch and the fill and drain's), less the
    optimizer's own passes on the slowest stage and up to the batch broadcasts' difference. Without
    linear biases, so that the flavours' layers launch the same kernels."""
    unbiased = replace(GPT3, linear_bias=False)
    core, old = plan("megatron", model=unbiased), plan("megatron-lm-2021", model=unbiased)
    send = rows(core)["pp.activation", (0, 1, 2)].price.time_s
    eighth = rows(old)["pp.activation", (0, 1, 2)].price.time_s
    gather = rows(old)["pp.gather", (1, 2, 3)].price.time_s
    assert eighth + gather < send  # 6.3 MB over InfiniBand and 50 MB over NVLink beat 50 MB over InfiniBand
    delta = send - (eighth + gather)
    # and the optimizers differ: Megatron-LM's own passes (38 B a bf16 parameter: kernels.MEGATRON_LM_OPTIMIZER)
    # against Megatron-Core's (38 B and the whole fp32 gradient buffer zeroed, 4 B a local parameter:
    # kernels.grad_buffer_bytes), which the step pays once, on its slowest stage
    cluster = cluster_preset("dgx-a100", 4)
    slowest = [
        max(optimizer_s(Context(unbiased, WORK, p.parallel), s, cluster.gpu) for s in range(4)) for p in (core, old)
    ]
    assert slowest[0] > slowest[1]
    expected = 2 * (16 + 4 - 1) * delta - (slowest[1] - slowest[0])
    # and the batch broadcasts differ (2021's packed text on every stage, Megatron-Core's tensors on the ends): within
    # their time on a stage over the iteration
    data = sum(
        pc.price.time_s * pc.call.calls_per_iteration
        for p in (core, old)
        for pc in p.calls
        if pc.call.name.startswith("tp.data.") and 0 in pc.call.stages
    )
    assert 0 < data < 0.1 * expected
    assert core.step.time_s - old.step.time_s == pytest.approx(expected, abs=data)


def test_sequence_parallelism_already_sends_the_shard():
    """p2p_communication.py at 55ba1f7b96 skips the scatter/gather under sequence parallelism (the tensor is the
    sequence shard already): the same calls as Megatron-Core's."""
    core, old = rows(plan("megatron", sp=True)), rows(plan("megatron-lm-2021", sp=True))
    assert {k: v.call.message_bytes for k, v in old.items()} == {k: v.call.message_bytes for k, v in core.items()}
    assert not any(name.startswith("pp.gather") for name, _ in old)


def test_megatron_lms_own_linears_add_the_qkv_bias_and_reduce_the_bias_gradients():
    """GPT-3 175B at tp 8, one 2,048-token sequence: the QKV output is 2,048 x 4,608 (3 x 12,288 / 8); its bias add
    reads and writes it in 2-byte elements (37,748,736 B); the backward reduces the QKV (4,608 wide), dense (12,288),
    fc1 (6,144) and fc2 (12,288) bias gradients over the 2,048 tokens (2 x 2,048 x 35,328 = 144,703,488 B, 4
    kernels). Megatron-Core's TE linears launch neither; nothing else in the layer differs."""
    from planner.context import Context
    from planner.kernels import layer_kernels

    a100 = cluster_preset("dgx-a100", 1).gpu

    def kernels(framework):
        par = ParallelSpec(tp=8, dp=1, framework=framework)
        return layer_kernels(Context(GPT3, WORK, par), False, a100)

    core, old = kernels("megatron"), kernels("megatron-lm-2021")
    names = [k.name for k in old.forward]
    assert names[names.index("qkv") + 1] == "qkv_bias_add"
    add = next(k for k in old.forward if k.name == "qkv_bias_add")
    grads = next(k for k in old.backward if k.name == "bias_grads")
    assert add.bytes == 2 * 2 * 2048 * 4608 == 37_748_736
    assert grads.bytes == 2 * 2048 * (4608 + 12288 + 6144 + 12288) == 144_703_488 and grads.count == 4
    assert [k for k in old.forward if k.name != "qkv_bias_add"] == list(core.forward)
    assert [k for k in old.backward if k.name != "bias_grads"] == list(core.backward)
    assert "qkv_bias_add" in {k.name for k in old.recompute}  # full recompute reruns the forward


def test_every_stage_broadcasts_the_packed_text_once_a_chunk():
    """pretrain_gpt.py get_batch at 6985e58 runs in every stage's forward_step and broadcasts one key over TP
    (mpu/data.py broadcast_data): its sizes, 5 int64 (40 B), then "text", b x (s + 1) int64 = 2,049 x 8 = 16,392 B,
    once per micro-batch and model chunk (16 x 2 with two virtual stages); the labels, loss mask, attention mask and
    position ids are built on each rank. Megatron-Core broadcasts tokens and position ids to the first stage, labels
    and loss mask to the last, the attention mask to both."""
    old = rows(plan("megatron-lm-2021"), "tp.data.")
    assert {k: (v.call.op.value, v.call.message_bytes, v.call.calls_per_iteration) for k, v in old.items()} == {
        ("tp.data.sizes", (0, 1, 2, 3)): ("broadcast", 40, 16),
        ("tp.data.text", (0, 1, 2, 3)): ("broadcast", 16_392, 16),
    }
    assert all(v.call.group.dims == ("tp",) for v in old.values())
    core = rows(plan("megatron"), "tp.data.")
    assert {name for name, _ in core} == {"tp.data.tokens", "tp.data.position_ids", "tp.data.labels",
                                          "tp.data.loss_mask", "tp.data.attention_mask"}  # fmt: skip
    interleaved = ParallelSpec(
        tp=8, pp=4, dp=1, framework="megatron-lm-2021", pipeline_schedule="interleaved", virtual_pipeline_stages=2
    )
    chunked = build_plan(GPT3, WORK, interleaved, cluster_preset("dgx-a100", 4), Options(timeline=False))
    assert {v.call.calls_per_iteration for v in rows(chunked, "tp.data.").values()} == {32}
