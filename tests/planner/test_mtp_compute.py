"""Issue 21 (mtp6): the MTP modules in the step time, by hand.

Megatron-LM d98e8a6 megatron/core/transformer/multi_token_prediction.py: each depth normalises the shifted tokens'
embedding (enorm) and the previous hidden states (hnorm), concatenates them into [s, b, 2h], projects back to h
(eh_proj, a ColumnParallelLinear), runs one transformer layer and its final norm on the rank holding ``m``; the
loss's rank scores each depth with the shared output layer and its cross-entropy (gpt_model.py _postprocess ->
process_mtp_loss). The step time counts them (compute.stage_pass_compute); MFU counts their FLOPs as
megatron/training/training.py num_floating_point_operations does. With the MTP on a middle rank every pipeline
send is preceded by a 24-byte shape exchange (p2p_communication.py _communicate_shapes), waited on: its price
adds to each boundary crossing (step.stream_totals).
"""

from dataclasses import replace

import pytest

from collectives.topology import cluster_preset
from collectives.topology.gpu import GPUS
from planner import ParallelSpec, WorkloadSpec, build_plan, model_preset
from planner.compute import (
    embedding_pass,
    layer_backward,
    layer_forward,
    model_flops_per_token,
    stage_pass_compute,
    stage_recompute_s,
)
from planner.context import Context
from planner.kernels import gemm_time, gpu_efficiency, kv_length, mtp_module_kernels
from planner.pipeline import Schedule
from planner.rules.pipeline import SHAPE_CALLS
from planner.step import step_time, stream_totals

H100 = GPUS["h100-sxm5-80gb"]
H, S, V = 7168, 4096, 129280  # DeepSeek-V3: hidden, sequence, vocabulary (1,010 x 128: no padding)
T = S  # tokens of one micro-batch (b = 1)


def dense_v3(mtp: int = 1, layers: int = 4):
    """DeepSeek-V3's MLA block as a small dense model (its MoE left out), with ``mtp`` MTP modules."""
    return replace(model_preset("deepseek-v3"), num_layers=layers, mtp_layers=mtp, moe=None)


def ctx_of(model, tp=1, sp=False, pp=1, layout=None, **work):
    par = ParallelSpec(tp=tp, pp=pp, dp=1, sequence_parallel=sp, pipeline_layout=layout)
    return Context(model, WorkloadSpec(micro_batch_size=1, global_batch_size=8, seq_length=S, **work), par)


def test_module_kernels_by_hand_tp2_sp():
    """tp 2 with SP: enorm, hnorm and the final norm read and write [s/2, h] (4 B an element, fused), torch.cat
    reads two and writes one [s/2, 2h] bf16 tensor, eh_proj is a (T x 2h) @ (2h x h/2) GEMM on the gathered rows."""
    ctx = ctx_of(dense_v3(), tp=2, sp=True)
    lk = mtp_module_kernels(ctx, H100)
    names = [k.name for k in lk.forward]
    module = ["mtp.enorm", "mtp.hnorm", "mtp.concat", "mtp.eh_proj", "mtp.final_layernorm"]
    lookup = ["mtp.embedding." + n for n in ("roll_ids", "vocab_mask", "gather", "mask_output", "transpose", "sp_copy")]
    assert names == module + lookup
    memory = sum(k.bytes for k in lk.forward[:5] if k.kind == "memory")
    assert memory == 3 * 4 * (T / 2) * H + 4 * (T / 2) * H * 2  # 3 norms + the concat: 146,800,640 B
    # the shifted tokens' lookup (kernels._embedding_lookup) on all T tokens: ids rolled, the vocabulary-shard
    # mask, the gather (read + write a row), the masked rows zeroed, the transpose (read + write), the clone of the
    # reduce-scattered [s/2, b, h] shard (LanguageModelEmbedding: clone_scatter_output_in_embedding)
    row = T * H * 2
    assert [k.bytes for k in lk.forward[5:]] == [2 * 2 * 8 * T, 6 * 2 * 8 * T, 2 * row, row, 2 * row, 2 * row / 2]
    (g,) = (k for k in lk.forward if k.kind == "gemm")
    assert g.shape == (T, H / 2, 2 * H, 1) and g.flops == 2 * T * (H / 2) * (2 * H)
    assert g.time_s == pytest.approx(gemm_time((T,), H / 2, 2 * H, "bf16", H100, gpu_efficiency(H100)))
    assert lk.recompute == ()  # no recompute: nothing re-run


def test_recompute_as_megatron_checkpoints_the_module():
    """Full by the uniform method checkpoints each module whole (_checkpointed_forward): the backward re-runs its
    norms and eh_proj too; block and selective leave them alone."""
    full = ctx_of(dense_v3(), activation_recompute="full", recompute_method="uniform", recompute_num_layers=1)
    lk = mtp_module_kernels(full, H100)
    assert lk.recompute == lk.forward[:5]  # not the lookup: _get_embeddings runs before the checkpoint
    bare = ctx_of(dense_v3(0), activation_recompute="full", recompute_method="uniform", recompute_num_layers=1)
    module_s = sum(k.time_s for k in lk.recompute)
    layer_s = layer_forward(full, False, H100)[0].total_s
    # the MTP block re-runs as a layer under full recompute, and the module's own part beside it
    assert stage_recompute_s(full, 0, H100) - stage_recompute_s(bare, 0, H100) == pytest.approx(layer_s + module_s)
    block = ctx_of(dense_v3(), activation_recompute="full", recompute_method="block", recompute_num_layers=1)
    assert mtp_module_kernels(block, H100).recompute == ()
    assert mtp_module_kernels(ctx_of(dense_v3(), activation_recompute="selective"), H100).recompute == ()


def test_small_model_stage_flops_by_hand():
    """pp 1, no recompute: the one stage gains, per micro-batch, the MTP layer, eh_proj's 2·T·2h·h and a second
    LM head 2·T·V·h forward (the GEMMs' backward 2x each); inference runs no MTP."""
    with_mtp, without = (ctx_of(dense_v3(n), activation_recompute="none") for n in (1, 0))
    fwd1, bwd1, _ = stage_pass_compute(with_mtp, 0, H100)
    fwd0, bwd0, _ = stage_pass_compute(without, 0, H100)
    fwd = layer_forward(with_mtp, False, H100)[0]
    layer, layer_bwd = fwd.flops, layer_backward(with_mtp, fwd, H100, None, "none", moe=False).flops
    eh_proj, head = 2 * T * 2 * H * H, 2 * T * V * H  # 0.84e12 and 7.59e12
    assert fwd1.flops - fwd0.flops == pytest.approx(layer + eh_proj + head, rel=1e-12)
    # the GEMMs' backward twice their forward (dgrad, wgrad); the layer's own (flash backward 2.5x its core)
    assert bwd1.flops - bwd0.flops == pytest.approx(layer_bwd + 2 * (eh_proj + head), rel=1e-12)
    serve = replace(with_mtp.work, kind="inference")
    a = stage_pass_compute(Context(with_mtp.model, serve, with_mtp.par), 0, H100)[0]
    b = stage_pass_compute(Context(without.model, serve, without.par), 0, H100)[0]
    assert a == b


def test_module_on_its_rank_head_on_the_loss_rank():
    """Layout Et|t|ttm|L (pp 4): rank 2 holds the module, rank 3 the loss. Rank 2 gains the layer and eh_proj,
    rank 3 the second head, ranks 0 and 1 nothing (the same layout without m as the baseline)."""
    mid = ctx_of(dense_v3(), pp=4, layout="Et|t|ttm|L")
    bare = ctx_of(dense_v3(0), pp=4, layout="Et|t|tt|L")
    assert mid.holds_mtp(2) and mid.is_last(3) and not mid.holds_mtp(3)
    delta = [stage_pass_compute(mid, s, H100)[0].flops - stage_pass_compute(bare, s, H100)[0].flops for s in range(4)]
    layer = layer_forward(mid, False, H100)[0].flops
    assert delta[0] == delta[1] == 0
    assert delta[2] == pytest.approx(layer + 2 * T * 2 * H * H, rel=1e-12)
    assert delta[3] == pytest.approx(2 * T * V * H, rel=1e-12)


def test_mfu_numerator_counts_mtp_as_megatron():
    """training.py num_floating_point_operations (d98e8a6): the MTP layers join num_layers (their attention
    too), 3h + 2h² per depth for the norms and eh_proj, and the logits (mtp_num_layers + 1) times."""
    with_mtp, without = ctx_of(dense_v3()), ctx_of(dense_v3(0))
    m = with_mtp.model
    q = m.mla.qk_nope_head_dim + m.mla.qk_rope_head_dim  # 192
    block = m.layer_params(m.num_layers)
    per_token = 6 * (block + 3 * H + 2 * H * H + V * H) + 6 * 2 * 128 * q * kv_length(with_mtp)
    assert model_flops_per_token(with_mtp) - model_flops_per_token(without) == pytest.approx(per_token, rel=1e-12)
    serve = replace(with_mtp.work, kind="inference")
    assert model_flops_per_token(Context(m, serve, with_mtp.par)) < model_flops_per_token(with_mtp) / 2


def test_deepseek_v3_as_reported_by_hand():
    """DeepSeek-V3 on Megatron-Core's recipe layout (PP16 x 2 chunks in a V, tp 1; DualPipeV, the schedule that runs
    a 2·pp-chunk V: DualPipe's own layout takes pp stages since dualpipe13): the loss's rank 0 runs a second LM head
    per micro-batch, 2 x 4,096 x 129,280 x 7,168 = 7.59e12 FLOPs forward; the module's rank 1 ("m" in chunk 30)
    eh_proj's 2 x 4,096 x 14,336 x 7,168 = 0.84e12 beside its MoE layer."""
    mdl = model_preset("deepseek-v3")
    work = WorkloadSpec(
        micro_batch_size=1, global_batch_size=15360, seq_length=S, fp8_recipe="blockwise",
        moe_dispatch_dtype="fp8", activation_func_fp8_input_store=True, activation_recompute="selective",
        recompute_modules=("layernorm", "mla_up_proj", "moe_act"),
    )  # fmt: skip
    par = ParallelSpec(
        tp=1, pp=16, dp=128, ep=64, zero_stage=1, pipeline_schedule="dualpipev",
        pipeline_layout="Et*3|(tt|)*29,m|L", ep_dispatch="deepep",
    )  # fmt: skip
    h800 = GPUS["h800-sxm5-80gb"]
    ctx = Context(mdl, work, par)
    bare = Context(replace(mdl, mtp_layers=0), work, replace(par, pipeline_layout="Et*3|(tt|)*29,|L"))
    f = [stage_pass_compute(c, s, h800)[0].flops for c in (ctx, bare) for s in (0, 1)]
    assert f[0] - f[2] == pytest.approx(2 * 4096 * 129280 * 7168, rel=1e-12)  # 7.59e12
    moe_layer = layer_forward(ctx, True, h800)[0].flops
    assert f[1] - f[3] == pytest.approx(moe_layer + 2 * 4096 * 14336 * 7168, rel=1e-12)


MIDDLE = dict(tp=2, pp=4, dp=2, sequence_parallel=True, virtual_pipeline_stages=2, pipeline_schedule="interleaved")


def test_shape_exchange_adds_its_price_to_each_boundary():
    """tests/app/test_mtp_http.py's MIDDLE (the module on rank 2 of 4, interleaved): one boundary crossing is the
    largest tensor send plus the largest shape exchange, each at its ledger row's own price (the 24-byte
    p2p across nodes, about 11 us on dgx-h100); the step grows by at least the fill's 2(p - 1) crossings."""
    model = dense_v3(layers=6)
    work = WorkloadSpec(micro_batch_size=1, global_batch_size=8, seq_length=S)
    par = ParallelSpec(**MIDDLE, pipeline_layout="Et|t|t|t|t|t|m|L")
    plan = build_plan(model, work, par, cluster_preset("dgx-h100", 2))
    pp = [c for c in plan.calls if c.call.parallelism == "pp"]
    shapes = [c.price.time_s for c in pp if c.call.name in SHAPE_CALLS]
    sends = [c.price.time_s for c in pp if c.call.name not in SHAPE_CALLS]
    assert shapes and all(c.call.message_bytes == 24 for c in pp if c.call.name in SHAPE_CALLS)
    totals = stream_totals(plan.calls, 4, 0, 4)
    assert totals.shape_s == max(shapes) and totals.send_s == max(sends)
    assert totals.p2p_s == max(sends) + max(shapes)
    assert 5e-6 < max(shapes) < 50e-6  # a latency: tens of microseconds at most
    ctx = Context(model, work, par)
    without = [c for c in plan.calls if c.call.name not in SHAPE_CALLS]
    grown = plan.step.time_s - step_time(ctx, without, H100, with_timeline=False).time_s
    assert grown >= 2 * (par.pp - 1) * max(shapes) - 1e-12
    assert grown <= 2 * (Schedule("interleaved", 4, 4, 2).stages + ctx.micro_batches * 2) * max(shapes)


def test_shifted_token_lookup_backward_by_hand():
    """tp 1: the lookup's backward (kernels._embedding_lookup) runs the transpose's gradient (read + write a
    row), PyTorch's dense embedding backward (zero-fill the [V, h] bf16 gradient, read the T rows and sum them
    in, sort the ids: 4 int64 passes) and Megatron's DDP hook adding it into the fp32 main_grad (read 2 + 4,
    write 4 B a weight): 11.4 GB for DeepSeek-V3's vocabulary, the lookup's backward on H100 ~3.5 ms."""
    ctx = ctx_of(dense_v3())
    lk = mtp_module_kernels(ctx, H100)
    row, grad = T * H * 2, V * H
    back = {k.name: k.bytes for k in lk.backward if k.name.startswith("mtp.embedding")}
    assert back == {
        "mtp.embedding.transpose.bwd": 2 * row,
        "mtp.embedding.wgrad": grad * 2 + 2 * row + 4 * 8 * T,
        "mtp.embedding.main_grad": grad * (2 + 8),
    }
    assert sum(back.values()) == 11_355_160_576  # 11.12 GB of it the two [V, h] passes
    # bf16 gradient reduction: main_grad is bf16, the add reads 2 + 2 and writes 2 B (kernels._grad_accumulation's rule)
    bf16 = mtp_module_kernels(ctx_of(dense_v3(), grad_reduce_dtype="bf16"), H100)
    assert {k.name: k.bytes for k in bf16.backward}["mtp.embedding.main_grad"] == grad * (2 + 4)
    seconds = sum(k.time_s for k in lk.backward if k.name.startswith("mtp.embedding"))
    assert 0.0025 < seconds < 0.005, seconds


def test_nvfp4_runs_the_mtp_layer_in_bf16():
    """Megatron-LM d98e8a6 multi_token_prediction.py _proj_and_transformer_layer enters the quantization context
    only for fp8 ("currently ignoring FP4 in MTP layers"): under nvfp4 the MTP block's transformer layer runs
    bf16 GEMMs while the decoder's four run FP4 (compute.mtp_bf16_context); under an fp8 recipe all five run it."""
    B200 = GPUS["b200-180gb"]
    fp4 = ctx_of(dense_v3(), fp8_recipe="nvfp4")
    bf16 = ctx_of(dense_v3(), fp8_recipe=None)
    decoder, mtp_layer = layer_forward(fp4, False, B200)[0], layer_forward(bf16, False, B200)[0]
    assert mtp_layer.total_s > 1.2 * decoder.total_s  # bf16 GEMMs on B200 run at half FP4's peak or less
    plain = ctx_of(dense_v3(0), fp8_recipe="nvfp4")
    module = sum(k.time_s for k in mtp_module_kernels(fp4, B200).forward)
    embed = embedding_pass(fp4, B200)[0].total_s  # the input embedding (pp 1: on this rank)
    norm = _final_norm_s(plain, B200)  # the decoder's final norm, once (kernels.final_norm_kernels)
    head = stage_pass_compute(plain, 0, B200)[0].total_s - 4 * decoder.total_s - embed - norm  # the head, once
    fwd = stage_pass_compute(fp4, 0, B200)[0].total_s
    assert fwd == pytest.approx(4 * decoder.total_s + mtp_layer.total_s + module + 2 * head + embed + norm, rel=1e-9)
    mx = ctx_of(dense_v3(), fp8_recipe="mxfp8")  # an fp8 recipe: the MTP layer runs it as the decoder does
    mx_layer = layer_forward(mx, False, B200)[0].total_s
    mx_plain = stage_pass_compute(ctx_of(dense_v3(0), fp8_recipe="mxfp8"), 0, B200)[0].total_s
    mx_module = sum(k.time_s for k in mtp_module_kernels(mx, B200).forward)
    mx_head = mx_plain - 4 * mx_layer - embed - norm
    assert stage_pass_compute(mx, 0, B200)[0].total_s == pytest.approx(
        5 * mx_layer + mx_module + 2 * mx_head + embed + norm
    )


def test_mtp_bf16_context_leaves_fp8_activations():
    """Under nvfp4 with fp8 activations the MTP blocks still run bf16 GEMMs: the recipe-free context must not
    fall back to per-tensor fp8 (kernels.gemm_dtype: fp8 activations without a recipe), nor keep 1-byte x."""
    from planner.compute import mtp_bf16_context
    from planner.kernels import gemm_dtype

    ctx = ctx_of(dense_v3(), fp8_recipe="nvfp4", activation_dtype="fp8")
    bf16 = mtp_bf16_context(ctx)
    assert gemm_dtype(ctx) == "nvfp4"
    assert (gemm_dtype(bf16), bf16.x, bf16.work.fp8_recipe) == ("bf16", 2, None)


def test_mtp_forward_counts_each_layer_by_its_own_kind():
    """DeepSeek-V3 cut to 5 layers, 2 MTP blocks, an MoE layer every 2nd after the 3 dense ones (model.is_moe_layer
    for MTP layers too): layers 0-2 dense, 3 MoE, 4 dense, MTP 5 MoE, 6 dense. Under nvfp4 the decoder's
    4 dense + 1 MoE run FP4 and the MTP blocks' 1 MoE + 1 dense bf16, the forward as the backward counts them."""
    from planner.compute import mtp_bf16_context
    from planner.recompute import layer_counts

    v3 = model_preset("deepseek-v3")
    model = replace(v3, num_layers=5, mtp_layers=2, moe=replace(v3.moe, layer_freq=2, num_experts=16))
    B200 = GPUS["b200-180gb"]
    ctx = ctx_of(model, fp8_recipe="nvfp4")
    bf16 = mtp_bf16_context(ctx)

    def kinds(which):
        out = {False: 0, True: 0}
        for (moe, _), n in layer_counts(ctx, 0, which).items():
            out[moe] += n
        return out

    assert (kinds("decoder"), kinds("mtp")) == ({False: 4, True: 1}, {False: 1, True: 1})
    plain = ctx_of(replace(model, mtp_layers=0), fp8_recipe="nvfp4")
    d, m = (layer_forward(ctx, moe, B200)[0].total_s for moe in (False, True))
    bd, bm = (layer_forward(bf16, moe, B200)[0].total_s for moe in (False, True))
    embed = embedding_pass(ctx, B200)[0].total_s  # the input embedding, once (pp 1)
    norm = _final_norm_s(plain, B200)
    head = stage_pass_compute(plain, 0, B200)[0].total_s - 4 * d - m - embed - norm
    module = sum(k.time_s for k in mtp_module_kernels(ctx, B200).forward)
    fwd = stage_pass_compute(ctx, 0, B200)[0].total_s
    assert fwd == pytest.approx(4 * d + m + bd + bm + 2 * module + 3 * head + embed + norm, rel=1e-9)


def test_layer_counts_refuses_an_unknown_layer_set():
    """recompute.layer_counts' ``layers`` is one of LAYER_SETS; a misspelt one counted every layer silently."""
    from planner.recompute import LAYER_SETS, layer_counts

    ctx = ctx_of(dense_v3())
    assert sum(layer_counts(ctx, 0, "all").values()) == 5 and LAYER_SETS == ("all", "decoder", "mtp")
    with pytest.raises(ValueError, match="layers must be one of"):
        layer_counts(ctx, 0, "decoders")


def _final_norm_s(ctx, gpu) -> float:
    """The decoder's final norm's forward seconds (once a micro-batch, on the stage that holds it)."""
    from planner.kernels import efficiency, final_norm_kernels

    return sum(k.time_s for k in final_norm_kernels(ctx, gpu, efficiency(gpu, None))[0])
