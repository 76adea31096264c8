"""Issue 21 (embed7): how many micro-batches' logits the loss's rank holds (pipeline.losses_in_flight), by hand.

The loss's rank keeps, per micro-batch whose loss backward has not run, the fp32 softmax the vocab-parallel
cross-entropy saves (4·b·s·V/t) and the output layer's input (memory._logits). Where each loss's backward follows
its forward (1F1B and ZB-H1: no warm-up forward on the last stage; interleaved: the last rank's warm-up runs chunks
0..v-2 only; DualPipe(V), ZBV) that is one micro-batch, even where the loss chunk's layers hold several; under
GPipe (torch ScheduleGPipe._step_microbatches: every forward's loss kept until the backward loop) all m.
"""

from dataclasses import replace

import pytest

from planner import ParallelSpec, WorkloadSpec, model_preset
from planner.context import Context
from planner.memory import chunk_activations, held_activation_bytes, stage_activation_bytes
from planner.pipeline import Schedule, in_flight_chunks, losses_in_flight

S, B, M = 4096, 1, 8  # sequence, micro-batch, micro-batches
H, V = 4096, 128256  # Llama 3 8B


def ctx_of(schedule="1f1b", pp=2, v=None, tp=1):
    model = replace(model_preset("llama3-8b"), num_layers=8)
    par = ParallelSpec(tp=tp, pp=pp, dp=1, pipeline_schedule=schedule, virtual_pipeline_stages=v)
    return Context(model, WorkloadSpec(micro_batch_size=B, global_batch_size=B * M, seq_length=S), par)


def test_logits_bytes_by_hand():
    """One micro-batch's loss on the last rank, tp 1: the fp32 softmax over [s, V] and the head's bf16 input."""
    ctx = ctx_of()
    assert chunk_activations(ctx, 1).logits == 4 * S * V + 2 * S * H  # 2,134,900,736 B
    assert chunk_activations(ctx, 0).logits == 0


@pytest.mark.parametrize(
    "kind, pp, v, held",
    [("1f1b", 2, 1, 1), ("zb-h1", 2, 1, 1), ("interleaved", 2, 2, 1), ("zbv", 2, 2, 1), ("dualpipev", 2, 2, 1),
     ("gpipe", 2, 1, M)],
)  # fmt: skip
def test_losses_in_flight_per_schedule(kind, pp, v, held):
    assert losses_in_flight(Schedule(kind, pp, M, v)) == held


def test_gpipe_holds_every_micro_batch_logits():
    """GPipe, pp 2, m 8: the last rank holds 8 micro-batches of its layers and 8 losses (17.1 GB of logits);
    1F1B's last rank one of each."""
    logits = 4 * S * V + 2 * S * H
    for kind, held in (("gpipe", M), ("1f1b", 1)):
        ctx = ctx_of(kind)
        sched = Schedule(kind, 2, M)
        parts = chunk_activations(ctx, 1)
        assert in_flight_chunks(sched, 1) == (float(held),)
        layers = held_activation_bytes(parts, in_flight_chunks(sched, 1), 0)  # without the logits
        assert stage_activation_bytes(ctx, 1, sched) == layers + held * logits


def test_interleaved_loss_chunk_holds_one():
    """Interleaved pp 2, v 2, m 8: the last rank's warm-up forwards (v-1)·p = 2 run chunk 0 (get_model_chunk_id),
    so the loss chunk holds one micro-batch and so do the logits."""
    ctx = ctx_of("interleaved", v=2)
    sched = Schedule("interleaved", 2, M, 2)
    assert in_flight_chunks(sched, 1) == (2.0, 1.0)
    parts = chunk_activations(ctx, 1)
    assert stage_activation_bytes(ctx, 1, sched) == held_activation_bytes(parts, (2.0, 1.0), 0) + parts.logits
