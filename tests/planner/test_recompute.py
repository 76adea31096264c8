"""Recompute as configured (issue 21 item 3): Megatron's --recompute-method/-num-layers/-modules, memory and
step time both following (planner/recompute.py, memory.py, compute.py)."""

from dataclasses import replace

import pytest

from collectives.topology.gpu import GPUS
from planner import ParallelSpec, SpecError, WorkloadSpec
from planner.compute import layer_forward, stage_compute
from planner.context import Context
from planner.memory import layer_activations, stage_activation_bytes
from planner.parallel import validate_parallel
from planner.pipeline import Schedule
from planner.presets import model_preset
from planner.step import StageStep, _offload
from planner.workload import validate_workload

GPU = GPUS["h100-sxm5-80gb"]
SCHED = Schedule("1f1b", 1, 4)  # one stage: one micro-batch in flight


# the final norm's and the output layer's saved inputs on the loss's stage (memory.head_chunk_bytes): two
# [s, b, h] bf16 rows of Llama-3 8B at s 8192
HEAD_INPUTS = 2 * 8192 * 4096 * 2


def ctx_of(model="llama3-8b", **work):
    base = dict(micro_batch_size=1, global_batch_size=4)
    return Context(model_preset(model), WorkloadSpec(**(base | work)), ParallelSpec(dp=4))


def acts(ctx):
    return stage_activation_bytes(ctx, 0, SCHED)


def test_block_and_uniform_keep_what_megatron_keeps():
    """32 layers, b 1, s 8192, h 4096, bf16: a layer's input is 8192·4096·2 = 64 MiB; a whole layer's
    activations A. block N = 8: 8 inputs + 24 A, plus one layer rebuilt; uniform N = 4: 8 group inputs,
    plus a group of 4 rebuilt; without a method: every input, plus one layer."""
    none = ctx_of()
    layer = layer_activations(none, False).per_rank(1, False, True)
    logits = 4 * 8192 * none.model.padded_vocab(1) + HEAD_INPUTS
    one_input = 8192 * 4096 * 2
    assert acts(none) == pytest.approx(32 * layer + logits, abs=64)
    block = ctx_of(activation_recompute="full", recompute_method="block", recompute_num_layers=8)
    assert acts(block) == pytest.approx(8 * one_input + 24 * layer + layer + logits, abs=64)
    uniform = ctx_of(activation_recompute="full", recompute_method="uniform", recompute_num_layers=4)
    assert acts(uniform) == pytest.approx(8 * one_input + 4 * layer + logits, abs=64)
    full = ctx_of(activation_recompute="full")
    assert acts(full) == pytest.approx(32 * one_input + layer + logits, abs=64)


def test_block_recomputes_only_its_layers():
    """The backward re-runs the forward of the block's layers only: 8 of 32 here."""
    none = stage_compute(ctx_of(), 0, GPU)
    block = stage_compute(ctx_of(activation_recompute="full", recompute_method="block", recompute_num_layers=8), 0, GPU)
    full = stage_compute(ctx_of(activation_recompute="full"), 0, GPU)
    layer = layer_forward(ctx_of(), False, GPU)[0]
    assert block.backward.total_s == pytest.approx(none.backward.total_s + 8 * layer.total_s)
    assert full.backward.total_s == pytest.approx(none.backward.total_s + 32 * layer.total_s)
    assert block.forward.total_s == pytest.approx(none.forward.total_s)


def test_selective_modules_free_their_tensors_and_rerun_their_forward():
    """mlp frees a dense layer's MLP intermediates, sbx·(gate + 1)·ffn = 8192·2·3·14336 bytes per layer, and
    re-runs the MLP GEMMs: their share of the layer's GEMM FLOPs (MLP params over attention + MLP params)."""
    attn = ctx_of(activation_recompute="selective")
    mlp = ctx_of(activation_recompute="selective", recompute_modules=("core_attn", "mlp"))
    freed = 8192 * 2 * 3 * 14336
    assert acts(attn) - acts(mlp) == pytest.approx(32 * freed, abs=64)
    m = attn.model
    share = m.mlp_params(m.ffn_hidden_size) / (m.attention_params() + m.mlp_params(m.ffn_hidden_size))
    layer = layer_forward(attn, False, GPU)[0]
    extra = stage_compute(mlp, 0, GPU).backward.total_s - stage_compute(attn, 0, GPU).backward.total_s
    assert extra == pytest.approx(32 * share * layer.gemm_s)
    norms = ctx_of(activation_recompute="selective", recompute_modules=("layernorm",))
    assert acts(attn) - acts(norms) == pytest.approx(32 * 2 * 8192 * 4096 * 2, abs=64)  # the two norms' outputs


def test_moe_modules():
    """Mixtral: moe_act frees the experts' activation output, top-k·ffn per token; moe the whole block."""
    base = dict(micro_batch_size=1, global_batch_size=4)
    model = model_preset("mixtral-8x7b")

    def ctx(**w):
        return Context(model, WorkloadSpec(**(base | w)), ParallelSpec(dp=4))

    attn = ctx(activation_recompute="selective")
    act = ctx(activation_recompute="selective", recompute_modules=("core_attn", "moe_act"))
    s = model.seq_length
    assert acts(attn) - acts(act) == pytest.approx(32 * s * 2 * 2 * model.moe.expert_ffn_hidden_size, abs=64)
    whole = ctx(activation_recompute="selective", recompute_modules=("core_attn", "moe"))
    assert acts(whole) < acts(act)
    assert stage_compute(whole, 0, GPU).backward.total_s > stage_compute(act, 0, GPU).backward.total_s


@pytest.mark.parametrize(
    ("model", "work", "field", "words"),
    [
        (
            "llama3-8b",
            dict(activation_recompute="selective", recompute_modules=("moe_act",)),
            "workload.recompute_modules",
            "recompute module 'moe_act': the model has no MoE layers",
        ),
        (
            "llama3-8b",
            dict(activation_recompute="selective", recompute_modules=("mla_up_proj",)),
            "workload.recompute_modules",
            "no multi-head latent attention",
        ),
        (
            "mixtral-8x7b",
            dict(activation_recompute="selective", recompute_modules=("mlp",)),
            "workload.recompute_modules",
            "no dense MLP: all 32 layers are MoE",
        ),
        (
            "mixtral-8x7b",
            dict(activation_recompute="selective", recompute_modules=("shared_experts",)),
            "workload.recompute_modules",
            "no shared experts",
        ),
        (
            "llama3-8b",
            dict(activation_recompute="full", recompute_num_layers=33),
            "workload.recompute_num_layers",
            "recompute_num_layers 33 > num_layers 32",
        ),
    ],
)
def test_recompute_the_model_cannot_run(model, work, field, words):
    w = WorkloadSpec(micro_batch_size=1, global_batch_size=4, **work)
    with pytest.raises(SpecError) as err:
        validate_parallel(ParallelSpec(dp=4), model_preset(model), w, 4)
    assert err.value.field == field and words in err.value.rule


@pytest.mark.parametrize(
    ("work", "field", "words"),
    [
        (
            dict(activation_recompute="selective", recompute_method="block"),
            "workload.recompute_method",
            "goes with activation_recompute 'full'",
        ),
        (
            dict(activation_recompute="full", recompute_modules=("mlp",)),
            "workload.recompute_modules",
            "goes with activation_recompute 'selective'",
        ),
        (
            dict(activation_recompute="selective", recompute_modules=("attn",)),
            "workload.recompute_modules",
            "unknown module 'attn'",
        ),
    ],
)
def test_recompute_options_follow_megatrons_rules(work, field, words):
    with pytest.raises(SpecError) as err:
        validate_workload(replace(WorkloadSpec(), **work))
    assert err.value.field == field and words in err.value.rule


def torch_ctx(model="llama3-8b", **work):
    base = dict(micro_batch_size=1, global_batch_size=4, activation_recompute="selective")
    return Context(model_preset(model), WorkloadSpec(**(base | work)), ParallelSpec(dp=4, framework="torch"))


def test_torchtitan_per_op_checkpointing_keeps_every_other_mm():
    """Llama-3 8B block, b 1, s 8192, bf16, no TP: keeps its input (h), q (4096), v (1024), the attention
    output (4096) and its fp32 log-sum-exp (32 heads), w1 (14336) and w2 (h): 8192·2·(4096 + 1024 + 4096 +
    14336 + 2·4096) + 8192·32·4 bytes per layer; re-runs k, o and w3 (their share of the GEMMs) and every
    elementwise op."""
    op = torch_ctx(selective_ac_option="op")
    per_layer = 8192 * 2 * (4096 + 1024 + 4096 + 14336 + 2 * 4096) + 8192 * 32 * 4
    logits = 4 * 8192 * op.model.padded_vocab(1) + HEAD_INPUTS
    assert acts(op) == pytest.approx(32 * per_layer + logits, abs=64)
    none = stage_compute(torch_ctx(activation_recompute="none"), 0, GPU)
    layer = layer_forward(op, False, GPU)[0]
    m = op.model
    share = 4096 * (1024 + 4096 + 14336) / (m.attention_params() + m.mlp_params(m.ffn_hidden_size))
    extra = stage_compute(op, 0, GPU).backward.total_s - none.backward.total_s
    assert extra == pytest.approx(32 * (share * layer.gemm_s + layer.elementwise_s))


def test_torchtitan_layer_checkpointing_every_second_block():
    """selective_ac_option "2": blocks 2, 4, ..., 32 (1-based) checkpointed whole: 16 inputs, 16 full blocks,
    one block rebuilt at a time; their forward re-runs."""
    two = torch_ctx(selective_ac_option="2")
    none = torch_ctx(activation_recompute="none")
    layer = layer_activations(none, False).per_rank(1, False, True)
    logits = 4 * 8192 * none.model.padded_vocab(1) + HEAD_INPUTS
    assert acts(two) == pytest.approx(16 * 8192 * 4096 * 2 + 16 * layer + layer + logits, abs=64)
    fwd = layer_forward(none, False, GPU)[0]
    extra = stage_compute(two, 0, GPU).backward.total_s - stage_compute(none, 0, GPU).backward.total_s
    assert extra == pytest.approx(16 * fwd.total_s)


@pytest.mark.parametrize(
    ("model", "framework", "option", "words"),
    [
        ("llama3-8b", "megatron", "op", "is torchtitan's (framework torch), framework is 'megatron'"),
        ("mixtral-8x7b", "torch", "op", "modelled for dense layers"),
        ("llama3-8b", "torch", "every2", "must be 'op' or a positive int"),
    ],
)
def test_torch_checkpointing_options_that_cannot_run(model, framework, option, words):
    w = WorkloadSpec(
        micro_batch_size=1, global_batch_size=4, activation_recompute="selective", selective_ac_option=option
    )
    with pytest.raises(SpecError) as err:
        validate_workload(w)
        validate_parallel(ParallelSpec(dp=4, framework=framework), model_preset(model), w, 4)
    assert err.value.field == "workload.selective_ac_option" and words in err.value.rule


def test_cpu_offload_moves_activations_over_pcie():
    """Megatron --cpu-offloading-num-layers 8 (pp 1): eight layers' activations leave HBM; the copy of
    8·A bytes at the host link's 64 GB/s runs behind each pass, exposed only where it outlasts the pass."""
    none = ctx_of()
    off = ctx_of(cpu_offloading_num_layers=8)
    layer = layer_activations(none, False).per_rank(1, False, True)
    assert acts(none) - acts(off) == pytest.approx(8 * layer, abs=64)
    st = StageStep(0, stage_compute(off, 0, GPU))
    _offload(st, 8 * layer / 64e9)
    exposed = max(0.0, 8 * layer / 64e9 - st.compute.forward.total_s)
    assert st.fwd_comm_s == pytest.approx(exposed)
    slow = StageStep(0, stage_compute(off, 0, GPU))
    _offload(slow, 10.0)  # a transfer longer than both passes
    assert slow.fwd_comm_s == pytest.approx(10.0 - slow.compute.forward.total_s)
    assert slow.bwd_comm_s == pytest.approx(10.0 - slow.compute.backward.total_s)


@pytest.mark.parametrize(
    ("pp", "work", "words"),
    [
        (2, dict(cpu_offloading_num_layers=4), "no support for Pipeline parallelism with CPU offloading"),
        (1, dict(cpu_offloading_num_layers=32), "CPU offloading can be done only for layers less than 32, got 32"),
        (
            1,
            dict(cpu_offloading_num_layers=4, activation_recompute="full"),
            "does not work when activation recomputation",
        ),
    ],
)
def test_cpu_offload_as_megatron_allows_it(pp, work, words):
    w = WorkloadSpec(micro_batch_size=1, global_batch_size=4, **work)
    with pytest.raises(SpecError) as err:
        validate_parallel(ParallelSpec(pp=pp, dp=4), model_preset("llama3-8b"), w, 4 * pp)
    assert err.value.field == "workload.cpu_offloading_num_layers" and words in err.value.rule


def _recomputed(ctx, prefix):
    """calls_per_iteration of each recomputed call whose name starts with ``prefix``, per stage tuple."""
    from planner.rules import ledger

    return {
        (c.name, c.stages): c.calls_per_iteration
        for c in ledger(ctx)
        if c.name.startswith(prefix) and c.name.endswith(".recompute")
    }


def _pp_ctx(model="llama3-8b", par=None, **work):
    base = dict(micro_batch_size=1, global_batch_size=8, activation_recompute="full")
    par = par or ParallelSpec(tp=2, pp=4)  # 32 layers: 8 per stage; m = 8 micro-batches
    return Context(model_preset(model), WorkloadSpec(**(base | work)), par)


def test_block_recompute_reissues_only_its_layers_calls():
    """Megatron-LM d98e8a6 megatron/core/recompute.py, method block: per chunk, the first
    recompute_num_layers layers run under checkpoint (their forward and its TP calls run again in the
    backward), the others once. 8 layers per stage, block 3, m = 8: each of the two forward TP all-reduces
    (attention out_proj, MLP down_proj; no SP) is re-issued 3 x 8 = 24 times per stage, not 8 x 8 = 64."""
    block = _recomputed(_pp_ctx(recompute_method="block", recompute_num_layers=3), "tp.")
    assert block == {
        ("tp.attn.out_proj.recompute", (0, 1, 2, 3)): 24,
        ("tp.mlp.down_proj.recompute", (0, 1, 2, 3)): 24,
    }
    uniform = _recomputed(_pp_ctx(recompute_method="uniform", recompute_num_layers=3), "tp.")
    assert set(uniform.values()) == {8 * 8}  # uniform re-runs every layer (groups of 3, 3, 2)
    assert _recomputed(_pp_ctx(activation_recompute="selective"), "tp.") == {}
    # interleaved, 2 chunks of 4 layers per stage: block 3 of each chunk -> 6 layers x 8 micro-batches
    inter = ParallelSpec(tp=2, pp=4, virtual_pipeline_stages=2, pipeline_schedule="interleaved")
    v2 = _recomputed(_pp_ctx(par=inter, recompute_method="block", recompute_num_layers=3), "tp.")
    assert set(v2.values()) == {6 * 8}
    # block larger than a chunk: every layer of the chunk
    assert set(_recomputed(_pp_ctx(recompute_method="block", recompute_num_layers=9), "tp.").values()) == {64}
    # fp8 current scaling under SP: the qkv and fc1 amax all-reduces of the 3 re-run layers, 2 x 3 x 8
    sp = ParallelSpec(tp=2, pp=4, sequence_parallel=True)
    fp8 = _pp_ctx(par=sp, fp8_recipe="tensorwise", recompute_method="block", recompute_num_layers=3)
    assert _recomputed(fp8, "fp8.") == {("fp8.tp_amax.recompute", (0, 1, 2, 3)): 2 * 3 * 8}


def test_block_recompute_reissues_only_its_moe_layers_dispatch():
    """Mixtral 8x7B (32 MoE layers), ep 8 over pp 4: block 3 re-issues the dispatch and combine of 3 MoE
    layers per micro-batch; and sequence parallelism's four forward TP calls likewise."""
    par = ParallelSpec(tp=2, pp=4, ep=8, dp=8, sequence_parallel=True)
    ctx = _pp_ctx("mixtral-8x7b", par=par, global_batch_size=64, recompute_method="block", recompute_num_layers=3)
    m = ctx.micro_batches
    ep = _recomputed(ctx, "ep.")
    assert ep and set(ep.values()) == {3 * m}
    tp = _recomputed(ctx, "tp.")
    assert {name for name, _ in tp} == {"tp.attn.qkv.recompute", "tp.attn.out_proj.recompute"}
    assert set(tp.values()) == {3 * m}  # Mixtral's MoE layers have no TP MLP (no shared expert)


def test_context_parallel_exchange_reruns_with_core_attention_only():
    """CP's forward exchange is issued again where core attention re-runs: full recompute (block: its
    layers), selective with core_attn (the default module); not selective without it (mlp only)."""
    par = ParallelSpec(cp=2, pp=4)
    full = _recomputed(_pp_ctx(par=par), "cp.")
    block = _recomputed(_pp_ctx(par=par, recompute_method="block", recompute_num_layers=3), "cp.")
    attn = _recomputed(_pp_ctx(par=par, activation_recompute="selective"), "cp.")
    mlp = _recomputed(_pp_ctx(par=par, activation_recompute="selective", recompute_modules=("mlp",)), "cp.")
    assert full and {k: v * 3 // 8 for k, v in full.items()} == block
    assert attn == full
    assert mlp == {}
