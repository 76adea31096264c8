"""Issue 21 (embed7): the main model's input embedding in the step time, by hand.

Megatron-LM d98e8a6 gpt_model.py ``_preprocess`` runs ``self.embedding(input_ids, position_ids)`` on the rank that
holds the embedding (the first stage): LanguageModelEmbedding over VocabParallelEmbedding (tensor_parallel/
layers.py: the vocabulary-shard mask with tp > 1, F.embedding, the masked rows zeroed; [b, s, h] -> [s, b, h]
made contiguous; under SP the clone of the scattered output, clone_scatter_output_in_embedding). Its backward is
PyTorch's dense embedding backward (aten/src/ATen/native/cuda/Embedding.cu embedding_dense_backward_cuda: a zero
[V/t, h] gradient, the T rows sorted and summed into it) and the DDP hook's main_grad add (distributed/
distributed_data_parallel.py ``param.main_grad.add_(param.grad.data)``, every micro-batch). The same function
(kernels._embedding_lookup) prices each MTP module's lookup (tests/planner/test_mtp_compute.py).
"""

from dataclasses import replace

import pytest

from collectives.topology.gpu import GPUS
from planner import ParallelSpec, WorkloadSpec, model_preset
from planner.compute import embedding_pass, layer_forward, stage_compute, stage_pass_compute
from planner.context import Context
from planner.kernels import EMBEDDING_BACKWARD_LAUNCHES, VOCAB_MASK_LAUNCHES, embedding_kernels
from planner.step import StageStep, chunk_shares

H100 = GPUS["h100-sxm5-80gb"]
S = 8192
H, V = 4096, 128256  # Llama 3 8B: hidden, vocabulary (1,002 x 128 and 501 x 256: no padding at tp 1 or 2)
T = S  # tokens of one micro-batch (b = 1)
ROW = T * H * 2  # one [s, b, h] bf16 activation


def llama8b(layers=4):
    return replace(model_preset("llama3-8b"), num_layers=layers)


def ctx_of(model, tp=1, sp=False, pp=1, v=None, framework="megatron", training=True, **work):
    par = ParallelSpec(
        tp=tp, pp=pp, dp=1, sequence_parallel=sp, framework=framework, virtual_pipeline_stages=v,
        pipeline_schedule="interleaved" if v else "1f1b",
    )  # fmt: skip
    if not training:
        work = {"kind": "inference", **work}
    work = {"seq_length": S, **work}
    return Context(model, WorkloadSpec(micro_batch_size=1, global_batch_size=8, **work), par)


def by_name(kernels):
    return {k.name: k.bytes for k in kernels}


def test_lookup_tp1_by_hand():
    """tp 1: F.embedding gathers T rows (read + write a row), the transpose reads and writes one; the backward
    runs the transpose's gradient, the dense embedding backward (zero the [V, h] bf16 gradient, read the T rows
    and sum them in, 4 int64 sort passes over the ids) and the fp32 main_grad add (read 2 + 4, write 4 B a
    weight): 6.6 GB a micro-batch for Llama 3 8B's vocabulary, ~2.6 ms on H100."""
    lk = embedding_kernels(ctx_of(llama8b()), H100)
    assert by_name(lk.forward) == {"embedding.gather": 2 * ROW, "embedding.transpose": 2 * ROW}
    grad = V * H
    assert by_name(lk.backward) == {
        "embedding.transpose.bwd": 2 * ROW,
        "embedding.wgrad": grad * 2 + 2 * ROW + 4 * 8 * T,
        "embedding.main_grad": grad * (2 + 8),
    }
    assert sum(by_name(lk.backward).values()) == 6_572_736_512  # 6.30 GB of it the two [V, h] passes
    assert [k.count for k in lk.backward] == [1, EMBEDDING_BACKWARD_LAUNCHES, 1]
    assert lk.recompute == ()  # the checkpoints wrap the transformer layers only
    seconds = sum(k.time_s for k in lk.backward)
    assert 0.002 < seconds < 0.004, seconds


def test_lookup_tp2_sp_masks_and_clones():
    """tp 2 with SP (rope: VocabParallelEmbedding reduce-scatters): the six int64 mask kernels over the ids, the
    gather, the masked rows zeroed (nonzero + index_put), the transpose, and the clone of the [s/2, b, h]
    shard; the [V/2, h] gradient."""
    lk = embedding_kernels(ctx_of(llama8b(), tp=2, sp=True), H100)
    assert [(k.name, k.bytes, k.count) for k in lk.forward] == [
        ("embedding.vocab_mask", 6 * 2 * 8 * T, VOCAB_MASK_LAUNCHES),
        ("embedding.gather", 2 * ROW, 1),
        ("embedding.mask_output", ROW, 2),
        ("embedding.transpose", 2 * ROW, 1),
        ("embedding.sp_copy", 2 * ROW / 2, 1),
    ]
    grad = V // 2 * H
    assert by_name(lk.backward) == {
        "embedding.transpose.bwd": 2 * ROW,
        "embedding.mask_output.bwd": ROW,
        "embedding.wgrad": grad * 2 + 2 * ROW + 4 * 8 * T,
        "embedding.main_grad": grad * (2 + 8),
    }


def test_learned_positions_and_dropout():
    """GPT (learned positions, hidden dropout 0.1), tp 2 with SP: the position lookup and its add (read 2 rows,
    write 1), the all-reduce's local scatter (a contiguous split) and its clone, the dropout over the shard (read
    and write 2 B, a 1 B mask an element); the backward adds the position table's own dense backward and
    main_grad add over [s, h]."""
    gpt = replace(model_preset("gpt3-175b"), num_layers=2)
    ctx = ctx_of(gpt, tp=2, sp=True, seq_length=2048)
    T_, h = 2048, gpt.hidden_size
    row = T_ * h * 2
    lk = embedding_kernels(ctx, H100)
    fwd = by_name(lk.forward)
    assert fwd["embedding.positions"] == 2 * row + 3 * row
    assert (fwd["embedding.sp_copy"], lk.forward[5].count) == (2 * row / 2, 2)
    assert fwd["embedding.dropout"] == row / 2 * 2.5
    back = by_name(lk.backward)
    vocab = gpt.padded_vocab(2) // 2
    assert back["embedding.wgrad"] == vocab * h * 2 + 2 * row + 32 * T_
    assert back["embedding.positions.wgrad"] == T_ * h * 2 + 2 * row + 32 * T_
    assert back["embedding.positions.main_grad"] == T_ * h * 10
    assert back["embedding.dropout.bwd"] == row / 2 * 2.5


def test_torch_models_keep_bsh():
    """torchtitan's Transformer keeps [b, s, h]: no transpose, no clone (Flavour.embedding_transposes)."""
    lk = embedding_kernels(ctx_of(llama8b(), framework="torch"), H100)
    assert [k.name for k in lk.forward] == ["embedding.gather"]
    assert [k.name for k in lk.backward] == ["embedding.wgrad", "embedding.main_grad"]


def test_first_stage_only_and_not_recomputed():
    """pp 2: stage 0 adds the lookup to its layers, stage 1 (the head's) does not; full recompute re-runs the
    layers, never the lookup; inference prices none."""
    ctx = ctx_of(llama8b(), pp=2)
    emb_f, emb_b = embedding_pass(ctx, H100)
    layer = layer_forward(ctx, False, H100)[0].total_s
    fwd0 = stage_pass_compute(ctx, 0, H100)[0].total_s
    assert fwd0 == pytest.approx(2 * layer + emb_f.total_s, rel=1e-12)
    assert emb_f.total_s > 0 and emb_b.total_s > 2 * emb_f.total_s
    full = ctx_of(llama8b(), pp=2, activation_recompute="full")
    assert stage_compute(full, 0, H100).recompute_s == pytest.approx(2 * layer_forward(full, False, H100)[0].total_s)
    inference = ctx_of(llama8b(), training=False)
    assert embedding_kernels(inference, H100).forward == ()
    assert ctx.is_first(0) and not ctx.is_first(1)
    fwd1 = stage_pass_compute(ctx, 1, H100)[0].total_s  # 2 layers and the head, no lookup
    head = stage_pass_compute(ctx_of(llama8b(), pp=1), 0, H100)[0].total_s - 4 * layer - emb_f.total_s
    assert fwd1 == pytest.approx(2 * layer + head, rel=1e-12)


def test_interleaved_embedding_chunk_share():
    """Interleaved pp 2, v 2: rank 0 holds chunks 0 (with the embedding) and 2; the embedding's forward goes to
    chunk 0's share, not to the loss's (step.chunk_shares)."""
    ctx = ctx_of(llama8b(), pp=2, v=2)
    c = stage_compute(ctx, 0, H100)
    layer = layer_forward(ctx, False, H100)[0].total_s
    emb = embedding_pass(ctx, H100)[0].total_s
    share = chunk_shares(ctx, StageStep(0, c), H100)
    assert share == pytest.approx([(layer + emb) / (2 * layer + emb), layer / (2 * layer + emb)], rel=1e-12)


def test_inference_runs_no_embedding_dropout():
    """In eval mode torch.nn.Dropout returns its input and launches nothing (memory.dropout_probs is training's only):
    a GPT lookup at inference (``_embedding_lookup``, which an MTP module's lookup runs in eval too) has its
    gathers and position add, no dropout pass (review r8a finding 5); its layers save no dropout masks either
    (memory.layer_activations equals the dropout-free count)."""
    from planner.kernels import _embedding_lookup, _Layer, efficiency
    from planner.memory import attention_dropout, hidden_dropout, layer_activations

    gpt = replace(model_preset("gpt3-175b"), num_layers=2)
    train, serve = ctx_of(gpt, tp=2, sp=True, seq_length=2048), ctx_of(gpt, tp=2, seq_length=2048, training=False)
    assert hidden_dropout(train) and attention_dropout(train)
    assert not hidden_dropout(serve) and not attention_dropout(serve)
    names = {}
    for which, ctx in (("train", train), ("serve", serve)):
        k = _Layer(ctx, H100, efficiency(H100, None))
        _embedding_lookup(k, 2048, "embedding")
        names[which] = by_name(k.fwd)
    assert "embedding.dropout" in names["train"]
    assert "embedding.positions" in names["serve"] and not any("dropout" in n for n in names["serve"])
    off = replace(gpt, attention_dropout=0.0, hidden_dropout=0.0)  # serving saves what a dropout-free model saves
    served = ctx_of(off, tp=2, seq_length=2048, training=False)
    assert layer_activations(serve, False) == layer_activations(served, False)
    assert layer_activations(train, False) != layer_activations(ctx_of(off, tp=2, sp=True, seq_length=2048), False)
