"""Issue 21: the MTP module's own activations and the shape exchange of an MTP on a middle rank, byte by byte.

Megatron-LM d98e8a6 megatron/core/transformer/multi_token_prediction.py: each module looks the shifted tokens up
in the shared embedding, normalises them (enorm) and the previous depth's hidden states (hnorm), concatenates
the two into eh_proj's [s, b, 2h] input, runs one transformer layer and a final norm; the loss's rank scores it
with the shared output layer (process_mtp_loss) and keeps the fp32 softmax of its logits for the backward
(tensor_parallel/cross_entropy.py). Under full recompute by the uniform method the module is one checkpoint
keeping its two inputs, and it needs recompute_num_layers 1; under block it is not recomputed.
"""

from dataclasses import replace

import pytest

from planner import ParallelSpec, WorkloadSpec, model_preset
from planner._errors import SpecError
from planner.context import Context
from planner.memory import chunk_activations, layer_activations, stage_activation_bytes
from planner.parallel import validate_parallel
from planner.pipeline import Schedule
from planner.recompute import chunk_plans
from planner.rules import pipeline

H, S, V = 7168, 4096, 129280  # DeepSeek-V3: hidden, sequence, vocabulary (129,280 = 1,010 x 128: no padding)
ROW = 1 * S * H * 2  # one [s, b, h] bf16 activation of a micro-batch, 58,720,256 B


def dense_v3(mtp: int = 1, layers: int = 4):
    """DeepSeek-V3's MLA block as a small dense model (its MoE left out), with ``mtp`` MTP modules."""
    return replace(model_preset("deepseek-v3"), num_layers=layers, mtp_layers=mtp, moe=None)


def ctx_of(model, tp=1, sp=False, pp=1, **work):
    par = ParallelSpec(tp=tp, pp=pp, dp=1, sequence_parallel=sp)
    return Context(model, WorkloadSpec(micro_batch_size=1, global_batch_size=8, seq_length=S, **work), par)


def test_mtp_module_bytes_by_hand_tp2_sp():
    """pp 1, tp 2 with SP, no recompute: the module adds its block (a decoder layer's activations), enorm,
    hnorm and final-norm inputs (3 rows), eh_proj's 2h-wide input (2 rows), all split over tp by SP, and on the
    loss's rank the output layer's input (1 row / tp) and the fp32 logits 4·s·V/tp."""
    with_mtp, without = ctx_of(dense_v3(1), tp=2, sp=True), ctx_of(dense_v3(0), tp=2, sp=True)
    sched = Schedule("1f1b", 1, 8)
    block = layer_activations(with_mtp, False).per_rank(2, True, True)
    module = (3 + 2) * ROW // 2  # 146,800,640 B
    loss = ROW // 2 + 4 * S * V // 2  # 29,360,128 + 1,059,061,760 B
    added = stage_activation_bytes(with_mtp, 0, sched) - stage_activation_bytes(without, 0, sched)
    assert added == pytest.approx(block + module + loss, abs=2)
    assert module + loss == 1_235_222_528


def test_mtp_under_full_recompute_keeps_the_checkpoint_inputs():
    """Full recompute, uniform, one layer per group: each decoder layer keeps its input (1 row); the MTP module
    is its own checkpoint (multi_token_prediction.py _checkpointed_forward) keeping hidden_states and
    decoder_input (2 rows), its layer nothing more; the backward rebuilds one module whole (block + module)."""
    c = ctx_of(dense_v3(1), activation_recompute="full", recompute_method="uniform", recompute_num_layers=1)
    plans = chunk_plans(c, 0)[0]
    assert [p.keeps_input for p in plans] == [True] * 4 + [False]  # layers 0-3, then the MTP block (layer 4)
    acts = chunk_activations(c, 0)
    assert acts.per_chunk == (4 * ROW + 2 * ROW + ROW,)  # + the final norm's input (memory.head_chunk_bytes)
    block = layer_activations(c, False).per_rank(1, False, True)
    assert acts.working == pytest.approx(block + 5 * ROW)
    # the main logits and head input (memory.head_input_bytes), then the module's head input and logits
    assert acts.logits == 4 * S * V + ROW + ROW + 4 * S * V


def test_mtp_under_block_recompute_is_not_recomputed():
    """Block: the first recompute_num_layers decoder layers re-run; Megatron skips the MTP module ("recompute_method
    == 'block' is not supported for MTP yet. Skipping recompute.") so its block keeps everything."""
    c = ctx_of(dense_v3(1), activation_recompute="full", recompute_method="block", recompute_num_layers=4)
    plans = chunk_plans(c, 0)[0]
    assert [p.full for p in plans] == [True] * 4 + [False]
    block = layer_activations(c, False).per_rank(1, False, True)
    assert chunk_activations(c, 0).per_chunk == pytest.approx((4 * ROW + block + 5 * ROW + ROW,))


def test_uniform_recompute_of_more_layers_with_mtp_is_refused():
    """multi_token_prediction.py asserts recompute_num_layers == 1 for MTP recompute (uniform)."""
    c = ctx_of(dense_v3(1), activation_recompute="full", recompute_method="uniform", recompute_num_layers=2)
    with pytest.raises(SpecError) as e:
        validate_parallel(c.par, c.model, c.work, 1)
    assert e.value.field == "workload.recompute_num_layers" and "got 2" in str(e.value)
    validate_parallel(c.par, replace(c.model, mtp_layers=0), c.work, 1)  # fine without MTP
    block = replace(c.work, recompute_method="block")
    validate_parallel(c.par, c.model, block, 1)  # block skips the MTP module: any count


def _middle(**work):
    """PP4 x 2 chunks, the MTP in the last chunk of rank 2 (virtual stage 6), the loss alone on rank 3."""
    par = ParallelSpec(tp=2, pp=4, dp=2, sequence_parallel=True, virtual_pipeline_stages=2,
                       pipeline_schedule="interleaved", pipeline_layout="Et|t|t|t|t|t|m|L")  # fmt: skip
    return Context(dense_v3(1, 6), WorkloadSpec(global_batch_size=8, seq_length=S, **work), par)


def test_mtp_on_a_middle_rank_holds_its_module_per_micro_batch_in_flight():
    ctx = _middle()
    acts = chunk_activations(ctx, 2)
    block = layer_activations(ctx, False).per_rank(2, True, True)
    # rank 2: chunk 0 holds layer 2, chunk 1 the MTP block and its module (5 rows / tp)
    assert acts.per_chunk == pytest.approx((block, block + 5 * ROW // 2))
    assert acts.logits == 0
    last = chunk_activations(ctx, 3)
    assert last.logits == 2 * 4 * S * V // 2 + 2 * ROW // 2  # main and MTP logits and head inputs


def test_final_norm_with_mtp_sits_with_the_last_decoder_layer():
    """transformer_block.py has_final_layernorm_in_this_stage: with MTP layers the final norm is built in the
    block holding layer num_layers (here layer 5, virtual stage 5 = rank 1's chunk 1), not on the loss's rank;
    the output layer's input (saved before its SP gather: the shard) goes with the loss's logits (rank 3)."""
    ctx = _middle()
    block = layer_activations(ctx, False).per_rank(2, True, True)
    assert chunk_activations(ctx, 1).per_chunk == pytest.approx((block, block + ROW // 2))  # layers 1 and 5
    assert chunk_activations(ctx, 3).per_chunk == pytest.approx((block, 0.0))  # layer 3; the loss alone
    assert chunk_activations(ctx, 0).per_chunk == pytest.approx((block, block))  # layers 0 and 4


def test_shape_exchange_of_an_mtp_on_a_middle_rank():
    """pipeline_parallel_layer_layout.py sets mtp_standalone when the MTP is not on the last rank, and then
    p2p_communication.py _communicate sends every tensor's shape (3 int64) before it, on every rank."""
    ctx = _middle()
    rows = pipeline.calls(ctx)
    sends = [c for c in rows if c.name.startswith("pp.activation")]
    shapes = [c for c in rows if c.name.startswith("pp.shape")]
    assert {c.message_bytes for c in shapes} == {24} and {c.dtype for c in shapes} == {"int64"}
    for stage in range(4):  # one shape per tensor sent, to the same peer, both directions
        for phase in ("forward", "backward"):
            want: dict = {}
            for c in sends:
                if c.stages == (stage,) and c.phase == phase:
                    want[c.group.pairs] = want.get(c.group.pairs, 0) + c.calls_per_iteration
            got = {c.group.pairs: c.calls_per_iteration for c in shapes if c.stages == (stage,) and c.phase == phase}
            assert got == want and want, (stage, phase)
    # m = 4 micro-batches; rank 0 sends forward from both chunks (to rank 1): 2 x 4 shapes
    assert [c.calls_per_iteration for c in shapes if c.stages == (0,) and c.phase == "forward"] == [8]
    # the MTP on the last rank (the default layout): no shape exchange
    plain = Context(ctx.model, ctx.work, replace(ctx.par, pipeline_layout="Et|t|t|t|t|t|,|mL"))
    assert not [c for c in pipeline.calls(plain) if c.name.startswith("pp.shape")]


def test_layout_with_mtp_outside_the_last_chunk_of_its_rank_is_refused():
    """validate_layer_layout: "the MTP should be always in the last virtual pipeline stage of that rank"."""
    bad = ParallelSpec(tp=1, pp=4, dp=1, virtual_pipeline_stages=2, pipeline_schedule="interleaved",
                       pipeline_layout="Et|tt|ttt|m||||L")  # fmt: skip
    with pytest.raises(SpecError) as e:
        validate_parallel(bad, dense_v3(1, 6), WorkloadSpec(global_batch_size=8), 4)
    assert e.value.field == "parallel.pipeline_layout" and "virtual stage 3, chunk 0 of rank 3" in str(e.value)
    assert "rank's last chunk (virtual stage 7)" in str(e.value)


def test_full_recompute_reissues_eh_proj_gathers():
    """The uniform checkpoint re-runs _concat_embeddings in the backward: eh_proj's SP input all-gather (2A)
    and its output gather (A) once more per module and micro-batch; block recompute skips the module."""
    from planner.rules import tensor

    def rows(**work):
        c = ctx_of(dense_v3(1), tp=2, sp=True, **work)
        return {x.name: (x.op.value, x.phase, x.message_bytes, x.calls_per_iteration)
                for x in tensor.calls(c) if x.name.startswith("tp.mtp.eh_proj")}  # fmt: skip

    a = S * H * 2  # A: the whole [s, b, h] activation a TP gather returns, 58,720,256 B
    full = rows(activation_recompute="full")
    assert full["tp.mtp.eh_proj.recompute"] == ("allgather", "backward", 2 * a, 8)
    assert full["tp.mtp.eh_proj.gather.recompute"] == ("allgather", "backward", a, 8)
    block = rows(activation_recompute="full", recompute_method="block", recompute_num_layers=1)
    assert not [n for n in block if n.endswith(".recompute")] and len(block) == 5


def test_mtp_fp8_amax_reductions():
    """The MTP module's two autocast regions (eh_proj's, the block's) each reduce their amaxes under delayed
    scaling: 3 fp32 per fp8 GEMM forward, 2 backward, over tp x cp x dp; current scaling with SP reduces
    eh_proj's input amax over TP once more per module; nvfp4 leaves the module in bf16 (no calls)."""
    from planner.rules import fp8

    def rows(recipe: str, **work):
        par = ParallelSpec(tp=2, pp=1, dp=2, sequence_parallel=True)
        c = Context(dense_v3(1), WorkloadSpec(global_batch_size=8, seq_length=S, fp8_recipe=recipe, **work), par)
        return {x.name: (x.message_bytes, x.calls_per_iteration) for x in fp8.calls(c)}, c

    delayed, c = rows("delayed")
    m = c.micro_batches
    assert m == 4 and fp8.gemms(c, 4) == 7  # MLA's five linears (q down/up, kv down/up, proj) + fc1, fc2
    assert delayed["fp8.amax.mtp.eh_proj"] == (3 * 4, m) and delayed["fp8.amax.mtp.eh_proj.bwd"] == (2 * 4, m)
    assert delayed["fp8.amax.mtp"] == (3 * 7 * 4, m) and delayed["fp8.amax.mtp.bwd"] == (2 * 7 * 4, m)
    assert delayed["fp8.amax"] == (3 * 4 * 7 * 4, m)  # the decoder's 4 layers, one region per chunk
    current, _ = rows("tensorwise")
    # column-parallel inputs per layer: MLA's q and kv up-projections and fc1 (3), 5 layers, + eh_proj
    assert current["fp8.tp_amax"] == (4, (5 * 3 + 1) * m)
    assert "fp8.amax.mtp" not in current
    uniform, _ = rows("tensorwise", activation_recompute="full")  # every layer and the module's eh_proj again
    assert uniform["fp8.tp_amax.recompute"] == (4, (5 * 3 + 1) * m)
    fp4, _ = rows("nvfp4")
    assert fp4["fp8.tp_amax"] == (4, 4 * 3 * m)  # the decoder's layers only


def test_nvfp4_selective_recompute_leaves_the_mtp_block_out_of_the_tp_amax_reruns():
    """Selective recompute of ``mlp`` and ``mla_up_proj`` under SP re-runs each layer's column-parallel linears
    in the backward: fc1 (1) and MLA's q and kv up-projections (2), 3 input-amax reductions over TP per layer
    and micro-batch. Under tensorwise the MTP block (layer 4) re-runs its three too: 5 x 3; under nvfp4 it runs
    in bf16 (multi_token_prediction.py "currently ignoring FP4 in MTP layers"): the decoder's 4 x 3 only,
    as its first run counts (fp8._quantized_layer, one cut-off for both)."""
    from planner.rules import fp8

    def rerun(recipe: str) -> tuple[int, int]:
        par = ParallelSpec(tp=2, pp=1, dp=2, sequence_parallel=True)
        work = WorkloadSpec(
            global_batch_size=8,
            seq_length=S,
            fp8_recipe=recipe,
            activation_recompute="selective",
            recompute_modules=("mlp", "mla_up_proj"),
        )
        rows = {x.name: x.calls_per_iteration for x in fp8.calls(Context(dense_v3(1), work, par))}
        return rows["fp8.tp_amax"], rows["fp8.tp_amax.recompute"]

    m = 4  # micro-batches: 8 / (1 x dp 2)
    assert rerun("tensorwise") == ((5 * 3 + 1) * m, 5 * 3 * m)  # + eh_proj's first run
    assert rerun("nvfp4") == (4 * 3 * m, 4 * 3 * m)  # was 5 x 3 x m: the bf16 MTP block counted


def test_nvfp4_mtp_block_saves_its_tensors_at_bf16():
    """Under nvfp4 the decoder's TE linears save nvfp4 copies of their inputs (Recipe.saved_input_bytes) while the MTP
    block runs outside the fp4 context (Megatron-LM d98e8a6 multi_token_prediction.py l. 1386-1402, "currently
    ignoring FP4 in MTP layers"): its layer saves what a bf16 layer does (compute.mtp_bf16_context), the decoder's
    four theirs at nvfp4 width. No recompute, tp 1, one chunk: 4 decoder layers + the bf16 block + the module's own
    5 rows (memory.mtp_module_bytes; eh_proj not quantized under fp4) + the final norm's input."""
    from planner.compute import mtp_bf16_context
    from planner.memory import mtp_module_bytes

    c = ctx_of(dense_v3(1), fp8_recipe="nvfp4")
    bf16 = mtp_bf16_context(c)
    assert bf16 is not None and bf16.work.fp8_recipe is None
    decoder = layer_activations(c, False).per_rank(1, False, True)
    block = layer_activations(bf16, False).per_rank(1, False, True)
    assert block > decoder  # the nvfp4 copies are narrower than the bf16 inputs
    assert mtp_module_bytes(c) == 5 * ROW
    acts = chunk_activations(c, 0)
    assert acts.per_chunk[0] == pytest.approx(4 * decoder + block + 5 * ROW + ROW, abs=4)
    # under a recipe the MTP block enters (tensorwise fp8), it saves as the decoder does: 5 layers alike
    t = ctx_of(dense_v3(1), fp8_recipe="tensorwise")
    assert mtp_bf16_context(t) is None
    layer = layer_activations(t, False).per_rank(1, False, True)
    assert chunk_activations(t, 0).per_chunk[0] == pytest.approx(5 * layer + mtp_module_bytes(t) + ROW, abs=4)
