"""The dtype of every activation-sized call under fp8 training (dtype7; docs/frameworks.md "Bytes on the wire under
fp8 recipes"). Hand-checked on Llama3-8B (h 4,096), one 4,096-token micro-batch, tp 2 with sequence parallelism,
pp 2: one layer's activations are A = 4,096 x 4,096 elements = 16,777,216, 33,554,432 B in bf16.

Megatron-Core + TransformerEngine v2.9: the p2p, the all-reduces and reduce-scatters, the embedding's, the LM
head's and CP's exchanges carry bf16 (Megatron-LM config.pipeline_dtype = params_dtype; GEMM outputs and dgrads are
bf16; the output layer and the embedding run outside TE's recipes); the all-gather of a column-parallel linear's
input, its wgrad re-gather and a row-parallel linear's grad output are quantized first (module/linear.py,
layernorm_linear.py, base.py grad_output_preprocess; distributed.py gather_along_first_dim with the quantizer), with
the block scales beside the data (mxfp8 1 B per 32, blockwise 4 B per 128, nvfp4 1 B per 16 at 0.5 B an element)
and both the rowwise and the columnwise copy of a grad output under a block recipe."""

from __future__ import annotations

import pytest

from planner import ParallelSpec, WorkloadSpec, model_preset
from planner.context import Context
from planner.rules import ledger

LLAMA = model_preset("llama3-8b")
ELEMENTS = 4096 * 4096  # b x s x h of one micro-batch (the gathered tensor)
BF16 = 2 * ELEMENTS  # 33,554,432 B


def calls(recipe="delayed", act="fp8", sp=True, cp=1, framework="megatron", kind="training", tp=2, pp=2):
    if kind == "training":
        work = WorkloadSpec(
            micro_batch_size=1, global_batch_size=8, seq_length=4096, activation_dtype=act, fp8_recipe=recipe
        )
        par = ParallelSpec(tp=tp, pp=pp, dp=2, cp=cp, sequence_parallel=sp, framework=framework)
    else:
        work = WorkloadSpec(kind="inference", batch_size=1, context_length=4096, activation_dtype=act)
        par = ParallelSpec(tp=tp, pp=1, dp=1, framework=framework)
    ctx = Context(LLAMA, work, par)
    return {
        c.name: (c.message_bytes, c.dtype)
        for c in ledger(ctx)
        if c.name.startswith(("tp.", "pp.", "cp.")) and not c.name.startswith(("tp.data", "tp.sp_param", "tp.norm"))
    }


def test_delayed_scaling_with_sp_and_pp_by_call_kind():
    """fp8 delayed (per-tensor: the scale is not sent, _all_gather_fp8 "identical across ranks"): the four gathers of
    a linear's input or grad output at 1 B an element, 16,777,216 B; everything else bf16; the pipeline's tensor is
    the sequence-parallel shard, A / tp = 16,777,216 B of bf16 (not the 8,388,608 B of fp8 the planner sent before)."""
    fp8 = (ELEMENTS, "fp8")
    bf16 = (BF16, "bf16")
    assert calls() == {
        "tp.attn.qkv": fp8,
        "tp.attn.out_proj": bf16,
        "tp.mlp.up_proj": fp8,
        "tp.mlp.down_proj": bf16,
        "tp.attn.qkv.dgrad": bf16,
        "tp.attn.out_proj.dgrad": fp8,
        "tp.mlp.up_proj.dgrad": bf16,
        "tp.mlp.down_proj.dgrad": fp8,
        "tp.attn.qkv.wgrad_gather": fp8,
        "tp.mlp.up_proj.wgrad_gather": fp8,
        "tp.embedding": bf16,
        "tp.embedding.dgrad": bf16,
        "tp.lm_head.input": bf16,
        "tp.lm_head.dgrad": bf16,
        "tp.lm_head.wgrad_gather": bf16,
        "tp.cross_entropy": (4096 * 4, "fp32"),
        "pp.activation": (BF16 // 2, "bf16"),
        "pp.activation_grad": (BF16 // 2, "bf16"),
    }
    # fp8 activations without a recipe are TE's default, delayed; tensorwise (current scaling) gathers alike
    assert calls(recipe=None) == calls() == calls(recipe="tensorwise")


@pytest.mark.parametrize(
    ("recipe", "forward", "grad_output"),
    [
        # 1 B + 1 E8M0 scale per 32 elements; the grad output's rowwise and columnwise copies
        ("mxfp8", 16_777_216 + 524_288, 2 * (16_777_216 + 524_288)),
        # 1 B + 1 fp32 scale per 128 elements (1x128 tiles, the compact all-gather layout)
        ("blockwise", 16_777_216 + 524_288, 2 * (16_777_216 + 524_288)),
        # 0.5 B + 1 E4M3 scale per 16 elements
        ("nvfp4", 8_388_608 + 1_048_576, 2 * (8_388_608 + 1_048_576)),
    ],
)
def test_block_recipes_gather_their_scales_beside_the_data(recipe, forward, grad_output):
    got = calls(recipe=recipe)
    dtype = "fp4" if recipe == "nvfp4" else "fp8"
    for name in ("tp.attn.qkv", "tp.mlp.up_proj", "tp.attn.qkv.wgrad_gather", "tp.mlp.up_proj.wgrad_gather"):
        assert got[name] == (forward, dtype), name
    for name in ("tp.attn.out_proj.dgrad", "tp.mlp.down_proj.dgrad"):
        assert got[name] == (grad_output, dtype), name
    for name in ("tp.attn.out_proj", "tp.mlp.down_proj", "tp.attn.qkv.dgrad", "tp.lm_head.input", "pp.activation"):
        assert got[name][1] == "bf16", name


def test_without_sp_the_all_reduces_and_cp_exchanges_are_bf16():
    """tp 2 without SP: the row-parallel outputs' and column-parallel input gradients' all-reduces of A in bf16;
    CP 2 (p2p ring): K and V of 2,048 tokens x 4 KV heads x 128 x 2 B = 2,097,152 B each (TE's CP attention
    exchanges bf16; fp8 DPA is not modelled)."""
    got = calls(sp=False, cp=2)
    half = BF16 // 2  # A on one CP rank: 2,048 tokens
    for name in ("tp.attn.out_proj", "tp.mlp.down_proj", "tp.attn.qkv.dgrad", "tp.mlp.up_proj.dgrad", "tp.embedding"):
        assert got[name] == (half, "bf16"), name
    assert got["cp.attn.kv"] == (2 * 2048 * 4 * 128 * 2, "bf16")
    assert got["pp.activation"] == (half, "bf16")


def test_bf16_runs_and_inference_are_unchanged():
    """A bf16 run moves 2 B everywhere; inference keeps its activation dtype (fp8 serving all-reduces 1 B)."""
    bf16 = calls(recipe=None, act="bf16")
    assert bf16["tp.attn.qkv"] == bf16["tp.attn.out_proj.dgrad"] == (BF16, "bf16")
    assert bf16["pp.activation"] == (BF16 // 2, "bf16")
    serving = calls(kind="inference", act="fp8", recipe=None)
    assert serving["tp.attn.out_proj"] == (ELEMENTS, "fp8")


def test_torchtitan_float8_tp_gathers_inputs_in_fp8_and_grad_outputs_in_bf16():
    """torchtitan apply_tp with float8 tensorwise: PrepareFloat8ModuleInput casts the attention's and the MLP's input
    before the all-gather (torchao float8_tensor_parallel.py), one gather each; Float8RowwiseParallel's output gradient
    is gathered in bf16. The LM head gathers bf16 logits (the output layer is not converted)."""
    got = calls(recipe="tensorwise", framework="torch")
    assert got["tp.attn.qkv"] == got["tp.mlp.up_proj"] == (ELEMENTS, "fp8")
    assert got["tp.attn.out_proj.dgrad"] == got["tp.mlp.down_proj.dgrad"] == (BF16, "bf16")
    assert got["tp.lm_head.logits"] == (4096 * LLAMA.vocab_size * 2, "bf16")
    assert got["pp.activation"] == (BF16 // 2, "bf16")
    # bf16 activations with the tensorwise recipe are regular TP (recipes.check_float8_tp): bf16 gathers
    assert calls(recipe="tensorwise", act="bf16", framework="torch")["tp.attn.qkv"] == (BF16, "bf16")


@pytest.mark.parametrize(
    ("recipe", "wire"),
    [
        # 2h = 8,192 elements a token x 4,096 tokens = 33,554,432 elements
        ("delayed", (33_554_432, "fp8")),  # per-tensor: 1 B an element, no scale
        ("mxfp8", (33_554_432 + 33_554_432 // 32, "fp8")),  # 1 B + 1 B per 32: 34,603,008 B
        ("nvfp4", (2 * 33_554_432, "bf16")),  # MTP ignores FP4: bf16, 67,108,864 B
    ],
)
def test_mtp_eh_proj_input_gathers_follow_the_mtp_cut_off(recipe, wire):
    """Llama3-8B with one MTP module, tp 2 + SP, pp 1: eh_proj is TE's column-parallel linear over the
    concatenated [embedding, hidden] (2h = 8,192 a token), run in the module's fp8 context (Megatron-LM d98e8a6
    multi_token_prediction.py _proj_and_transformer_layer: get_fp8_context when config.fp8, "currently ignoring FP4
    in MTP layers"): its SP input gather and wgrad re-gather are quantized under fp8 recipes and bf16 under nvfp4;
    its output gather and the gradients' calls stay bf16 (A = 33,554,432 B, the 2h gradient 67,108,864 B)."""
    from dataclasses import replace

    work = WorkloadSpec(micro_batch_size=1, global_batch_size=8, seq_length=4096, fp8_recipe=recipe)
    ctx = Context(replace(LLAMA, mtp_layers=1), work, ParallelSpec(tp=2, pp=1, dp=4, sequence_parallel=True))
    eh = {c.name: (c.message_bytes, c.dtype) for c in ledger(ctx) if c.name.startswith("tp.mtp.eh_proj")}
    assert eh == {
        "tp.mtp.eh_proj": wire,
        "tp.mtp.eh_proj.wgrad_gather": wire,
        "tp.mtp.eh_proj.gather": (BF16, "bf16"),
        "tp.mtp.eh_proj.scatter.dgrad": (BF16, "bf16"),
        "tp.mtp.eh_proj.dgrad": (2 * BF16, "bf16"),
    }


def test_nvfp4_mtp_block_gathers_in_bf16_beside_the_decoders_fp4():
    """Llama3-8B with one MTP module, nvfp4, tp 2 + SP, pp 2, 4 micro-batches: stage 1 holds 16 decoder layers and the
    MTP block (Context.chunks). Megatron-LM d98e8a6 multi_token_prediction.py _proj_and_transformer_layer enters
    get_fp8_context only ``if self.config.fp8`` ("TODO: currently ignoring FP4 in MTP layers"), so the block's linears
    run bf16: its quantized gathers carry bf16 (4,096 x 4,096 x 2 = 33,554,432 B) where the decoder's carry nvfp4
    (16,777,216 x (0.5 + 1/16) = 9,437,184 B input, both copies 18,874,368 B for a grad output). Before, all 17 layers
    gathered at nvfp4 (68 calls of 9,437,184 B): the MTP block's 4 x 6 gathers were 6 x 4 x 24,117,248 B short."""
    from dataclasses import replace

    work = WorkloadSpec(micro_batch_size=1, global_batch_size=8, seq_length=4096, fp8_recipe="nvfp4")
    ctx = Context(replace(LLAMA, mtp_layers=1), work, ParallelSpec(tp=2, pp=2, dp=2, sequence_parallel=True))
    rows = {(c.name, c.stages): (c.message_bytes, c.dtype, c.calls_per_iteration) for c in ledger(ctx)}
    fp4_in, fp4_grad, bf16 = (9_437_184, "fp4"), (18_874_368, "fp4"), (BF16, "bf16")
    for name in ("attn.qkv", "mlp.up_proj", "attn.qkv.wgrad_gather", "mlp.up_proj.wgrad_gather"):
        assert rows["tp." + name, (0, 1)] == (*fp4_in, 64)  # 16 decoder layers x 4 micro-batches, both stages
        assert rows["tp.mtp." + name, (1,)] == (*bf16, 4)  # the MTP block on stage 1 only
    for name in ("attn.out_proj.dgrad", "mlp.down_proj.dgrad"):
        assert rows["tp." + name, (0, 1)] == (*fp4_grad, 64)
        assert rows["tp.mtp." + name, (1,)] == (*bf16, 4)
    # calls alike in the block and the decoder (bf16 reduce-scatters) stay one row: 17 layers on stage 1
    assert rows["tp.attn.out_proj", (1,)] == (*bf16, 68)
    assert rows["tp.mlp.up_proj.dgrad", (1,)] == (*bf16, 68)
    # an fp8 recipe runs the block quantized like the decoder: one row, 68 calls on stage 1
    ctx8 = replace(ctx, work=replace(work, fp8_recipe="mxfp8"))
    assert not [c for c in ledger(ctx8) if c.name.startswith(("tp.mtp.attn", "tp.mtp.mlp"))]
    # full recompute re-issues the block's forward gathers in bf16 too
    full = replace(work, activation_recompute="full", recompute_method="uniform", recompute_num_layers=1)
    again = {c.name: (c.message_bytes, c.dtype, c.calls_per_iteration) for c in ledger(replace(ctx, work=full))}
    assert again["tp.mtp.attn.qkv.recompute"] == (*bf16, 4)
    assert again["tp.mtp.mlp.up_proj.recompute"] == (*bf16, 4)


SHORT = 1000 * 4096  # a 1,000-token micro-batch of Llama3-8B: the tp-2 shard holds 500 rows of 4,096


@pytest.mark.parametrize(
    ("recipe", "forward", "grad_output"),
    [
        # 500 rows: not a multiple of 128, 32 or 16, so every block recipe's quantizer refuses the shard
        ("blockwise", (2 * SHORT, "bf16"), (2 * SHORT, "bf16")),  # Float8BlockQuantizer: every gather falls back
        ("mxfp8", (SHORT + SHORT // 32, "fp8"), (2 * SHORT, "bf16")),  # inputs quantized first: only grad outputs
        ("nvfp4", (SHORT // 2 + SHORT // 16, "fp4"), (2 * SHORT, "bf16")),
        ("delayed", (SHORT, "fp8"), (SHORT, "fp8")),  # per-tensor: no block, never falls back
    ],
)
def test_a_shard_the_block_cannot_quantize_is_gathered_in_bf16(recipe, forward, grad_output):
    """TransformerEngine (5fd5c35, v2.14 on; d0067d0da) gathers a shard its quantizer cannot quantize (is_quantizable:
    the product of the leading dimensions and the last dimension multiples of the block) in bf16 and quantizes the
    gathered tensor: Llama3-8B at s 1,000, tp 2 + SP: 1,000 x 4,096 x 2 = 8,192,000 B, where mxfp8 would send
    4,096,000 x (1 + 1/32) = 4,224,000 B (a grad output's two copies 8,448,000 B) and nvfp4 2,304,000 B. MXFP8 and
    NVFP4 quantize a column-parallel input before its gather (linear.py input_quantizer(inputmat)), which then needs
    no fallback; Float8BlockQuantizer's gather tests the shard whatever it holds."""
    work = WorkloadSpec(micro_batch_size=1, global_batch_size=8, seq_length=1000, fp8_recipe=recipe)
    ctx = Context(LLAMA, work, ParallelSpec(tp=2, pp=1, dp=4, sequence_parallel=True))
    rows = {c.name: (c.message_bytes, c.dtype) for c in ledger(ctx)}
    for name in ("tp.attn.qkv", "tp.mlp.up_proj", "tp.attn.qkv.wgrad_gather", "tp.mlp.up_proj.wgrad_gather"):
        assert rows[name] == forward, name
    for name in ("tp.attn.out_proj.dgrad", "tp.mlp.down_proj.dgrad"):
        assert rows[name] == grad_output, name


def test_blockwise_gathers_of_a_hidden_size_not_a_multiple_of_128_fall_back():
    """GPT-OSS 20B's hidden size 2,880 = 22.5 x 128: under blockwise (1x128 tiles) no SP shard of its hidden states
    can be quantized, so its attention input, wgrad re-gather and grad output gather in bf16, 4,096 x 2,880 x 2 =
    23,592,960 B; mxfp8's 32-element blocks fit (2,880 = 90 x 32): 11,796,480 x (1 + 1/32) = 12,165,120 B."""
    gpt_oss = model_preset("gpt-oss-20b")
    for recipe, wire in (("blockwise", (23_592_960, "bf16")), ("mxfp8", (12_165_120, "fp8"))):
        work = WorkloadSpec(micro_batch_size=1, global_batch_size=8, seq_length=4096, fp8_recipe=recipe)
        ctx = Context(gpt_oss, work, ParallelSpec(tp=2, pp=1, dp=4, sequence_parallel=True))
        rows = {c.name: (c.message_bytes, c.dtype) for c in ledger(ctx)}
        assert rows["tp.attn.qkv"] == rows["tp.attn.qkv.wgrad_gather"] == wire
    assert rows["tp.attn.out_proj.dgrad"] == (2 * 12_165_120, "fp8")  # mxfp8's two copies of the grad output


KV = 2 * 4096 * 8 * 128  # K and V of one CP rank's 4,096 tokens (s 8,192, cp 2), 8 KV heads x 128: 8,388,608 elements


@pytest.mark.parametrize(
    ("recipe", "comm", "want"),
    [
        # bf16 attention: the ring's K/V and dK/dV sends at 2 B
        (None, "p2p", {"cp.attn.kv": ("sendrecv", 2 * KV, "bf16", 64),
                       "cp.attn.kv.bwd": ("sendrecv", 2 * KV, "bf16", 64),
                       "cp.attn.dkv": ("sendrecv", 2 * KV, "bf16", 64)}),
        # fp8 attention, per-tensor: K/V as their fp8 data, dK/dV as one uint8 all-to-all of cp x KV per call
        ("delayed", "p2p", {"cp.attn.kv": ("sendrecv", KV, "fp8", 64), "cp.attn.kv.bwd": ("sendrecv", KV, "fp8", 64),
                            "cp.attn.dkv": ("alltoall", 2 * KV, "uint8", 64)}),
        ("tensorwise", "p2p", {"cp.attn.kv": ("sendrecv", KV, "fp8", 64),
                               "cp.attn.kv.bwd": ("sendrecv", KV, "fp8", 64),
                               "cp.attn.dkv": ("alltoall", 2 * KV, "uint8", 64)}),
        # MXFP8 attention keeps K/V in bf16 on the ring; its dK/dV still go by the uint8 all-to-all
        ("mxfp8", "p2p", {"cp.attn.kv": ("sendrecv", 2 * KV, "bf16", 64),
                          "cp.attn.kv.bwd": ("sendrecv", 2 * KV, "bf16", 64),
                          "cp.attn.dkv": ("alltoall", 2 * KV, "uint8", 64)}),
        # all-gather CP: the K/V gathers in fp8, dK/dV reduce-scattered in bf16
        ("delayed", "all_gather", {"cp.attn.kv_gather": ("allgather", 2 * KV, "fp8", 64),
                                   "cp.attn.kv_gather.bwd": ("allgather", 2 * KV, "fp8", 64),
                                   "cp.attn.dkv": ("reducescatter", 2 * 2 * KV, "bf16", 64)}),
    ],
)  # fmt: skip
def test_fp8_dot_product_attention_changes_the_cp_wire(recipe, comm, want):
    """Megatron --fp8-dot-product-attention (TE fp8_dpa), Llama3-8B at s 8,192, cp 2, dp 4: 2 micro-batches x 32
    layers = 64 attention calls. TransformerEngine d0067d0da context_parallel.py
    AttnFuncWithCPAndKVP2P sends ``torch.cat((k.view(-1), v.view(-1)))`` of the fp8 data (l. 1690), re-sends it
    c-1 times in the backward and exchanges the dK/dV partials by one ``all_to_all_single`` of a (cp, *kv.shape)
    uint8 buffer at the last step (l. 2466-2484); AttnFuncWithCPAndKVAllGather gathers k and v as fp8 data."""
    work = WorkloadSpec(micro_batch_size=1, global_batch_size=8, seq_length=8192, fp8_recipe=recipe,
                        fp8_dot_product_attention=recipe is not None)  # fmt: skip
    ctx = Context(LLAMA, work, ParallelSpec(tp=1, pp=1, dp=4, cp=2, cp_comm=comm))
    got = {c.name: (c.op.value, c.message_bytes, c.dtype, c.calls_per_iteration) for c in ledger(ctx)
           if c.name.startswith("cp.")}  # fmt: skip
    assert got == want
    if recipe:  # the recipe without fp8 attention exchanges bf16, as before
        plain = Context(LLAMA, replace_work(work, fp8_dot_product_attention=False), ctx.par)
        assert {c.name: c.dtype for c in ledger(plain) if c.name.startswith("cp.")} == dict.fromkeys(want, "bf16")


def replace_work(work, **changes):
    from dataclasses import replace

    return replace(work, **changes)
