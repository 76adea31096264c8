"""Serving splits MoE experts over the worker's ranks as each engine does (EngineTraits.experts; docs/serving.md
"Experts over tensor-parallel ranks (mend14b)"): expert TP = tp x dp / ep. Without expert parallelism every GPU of a
TP worker holds 1/tp of every expert (vLLM FusedMoEParallelConfig.make, SGLang moe_tp_size = tp_size // ep_size,
TensorRT-LLM Mapping moe_tp_size = tp_size), not every expert whole (user14: Mixtral 8x7B at TP2 read 94.5 GB a GPU).
Closed forms by hand from the Mixtral 8x7B config (mistralai/Mixtral-8x7B-v0.1 config.json: 32 layers, hidden 4096,
32 heads, 8 KV heads of 128, 8 experts of FFN 14336, top-2, vocabulary 32000, untied)."""

from __future__ import annotations

import pytest

from collectives.topology import cluster_preset
from planner import MODEL_PRESETS, SpecError
from planner.context import Context
from planner.kernels import layer_kernels
from planner.serving import Pool, ServeOptions, engine
from planner.serving.deployment import _step, _work, _worker

MIXTRAL = MODEL_PRESETS["mixtral-8x7b"]
H100 = cluster_preset("dgx-h100", 1)
L, H, KV, F, E, V = 32, 4096, 8 * 128, 14336, 8, 32000
ENGINES = ("vllm", "sglang", "trtllm")


def mixtral_params_per_gpu(tp: int, ep: int = 1) -> int:
    """One rank's parameters at attention TP ``tp`` with ``ep``-way EP and expert TP tp / ep: QKV and the output
    projection split over tp, E / ep local experts of 3 x h x F / etp each, the router (E x h) and the two norms
    replicated; embedding and LM head split over tp, the vocabulary padded to a multiple of 128 x tp (the planner's
    rule, DESIGN.md §4), the final norm replicated."""
    etp = tp // ep
    attention = H * (H + 2 * KV) + H * H
    experts = (E // ep) * 3 * H * F // etp
    layer = attention // tp + experts + E * H + 2 * H
    vocab = -(-V // (128 * tp)) * 128 * tp
    return L * layer + 2 * vocab * H // tp + H


def _decode(name: str, pool: Pool, batch: int = 64):
    w = _worker(MIXTRAL, H100, engine(name), pool, 0)
    plan = _step(MIXTRAL, w, ServeOptions(), "decode", batch, 1100)
    ctx = Context(MIXTRAL, _work(ServeOptions(), "decode", batch, 1100), w.par, devices_per_node=8)
    shapes = {k.name: k.shape for k in layer_kernels(ctx, True, H100.gpu).forward if k.name.startswith("experts")}
    return w, plan, shapes


@pytest.mark.parametrize("name", ENGINES)
@pytest.mark.parametrize("tp", [2, 4])
def test_mixtral_without_ep_splits_every_expert_over_tp(name, tp):
    """TP2: 23,352,053,760 parameters a GPU (46.7 GB in bf16, what POST /v1/plan holds at TP2), not the 94.5 GB of
    whole experts; TP4: 11,677,208,576. The expert GEMMs of a 64-sequence decode step: 64 x 2 / 8 = 16 rows an
    expert, all 8 experts local, fc1 2F / tp wide (gate and up), fc2 F / tp deep."""
    w, plan, shapes = _decode(name, Pool(tp=tp))
    assert (w.par.etp, w.par.ep, w.par.ep_dispatch) == (tp, 1, "replicated")
    stage = plan.memory.per_stage[0]
    assert stage.param_count == mixtral_params_per_gpu(tp) == {2: 23_352_053_760, 4: 11_677_208_576}[tp]
    assert stage.params_bytes == 2 * stage.param_count
    assert shapes["experts_fc1"] == (16, 2 * F // tp, H, E)
    assert shapes["experts_fc2"] == (16, H, F // tp, E)
    # the experts' partial outputs summed by one TP all-reduce a layer, the size of the attention's (b x h x 2 B)
    rows = {r.call.name: r.call for r in plan.calls if r.call.op.value == "allreduce"}
    moe, attn = rows["tp.mlp.down_proj"], rows["tp.attn.out_proj"]
    assert moe.calls_per_iteration == attn.calls_per_iteration == L
    assert moe.message_bytes == attn.message_bytes == 64 * H * 2


@pytest.mark.parametrize("name", ["sglang", "trtllm"])
def test_part_ep_part_expert_tp(name):
    """SGLang and TensorRT-LLM split tp x dp into ep x expert TP: TP4 EP2 holds 4 experts a GPU, each over 2
    ranks (fc1 2F / 2 wide); the same parameters a GPU as TP4 without EP."""
    w, plan, shapes = _decode(name, Pool(tp=4, ep=2))
    assert (w.par.etp, w.par.ep) == (2, 2)
    assert plan.memory.per_stage[0].param_count == mixtral_params_per_gpu(4, 2) == mixtral_params_per_gpu(4)
    assert shapes["experts_fc1"][1:] == (2 * F // 2, H, E // 2)


def test_vllm_expert_parallelism_is_all_ranks_or_none():
    """vLLM's --enable-expert-parallel makes EP = tp x dp (FusedMoEParallelConfig.make): TP4 EP2 is a 422 naming
    the rule; EP4 holds 2 whole experts a GPU."""
    with pytest.raises(SpecError) as err:
        _worker(MIXTRAL, H100, engine("vllm"), Pool(tp=4, ep=2), 0)
    assert err.value.field == "deployment.pools.0.ep" and "ep 1 or 4" in err.value.rule
    assert "FusedMoEParallelConfig.make" in err.value.rule
    w, plan, shapes = _decode("vllm", Pool(tp=4, ep=4))
    assert (w.par.etp, w.par.ep) == (1, 4) and shapes["experts_fc1"][1:] == (2 * F, H, 2)
    assert plan.memory.per_stage[0].param_count == mixtral_params_per_gpu(4, 4)


def test_attention_dp_without_ep_gathers_and_splits_experts_over_the_worker():
    """Attention DP 8 without EP: every expert over the 8 ranks (vLLM's (DP x TP) tensor-parallel expert group), the
    tokens gathered by the engine's own exchange (vLLM all_gatherv, TensorRT-LLM's post-quant all-gather, forced
    with MoE TP > 1); an all-to-all named for it is a 422 (it moves tokens to whole experts). With EP 8 the experts
    stay whole (DeepSeek-V3's wide-EP rows unchanged)."""
    for name, dispatch in (("vllm", "agrs"), ("sglang", "dp_gather"), ("trtllm", "agrs_quant")):
        w = _worker(MIXTRAL, H100, engine(name), Pool(dp=8, attention_dp=True), 0)
        assert (w.par.etp, w.par.ep, w.par.ep_dispatch) == (8, 1, dispatch)
        wide = _worker(MIXTRAL, H100, engine(name), Pool(dp=8, ep=8, attention_dp=True), 0)
        assert (wide.par.etp, wide.par.ep) == (1, 8)
    with pytest.raises(SpecError) as err:
        _worker(MIXTRAL, H100, engine("sglang"), Pool(dp=8, attention_dp=True, ep_dispatch="deepep"), 0)
    assert err.value.field == "deployment.pools.0.ep_dispatch" and "set ep to tp*dp = 8" in err.value.rule


def test_dense_models_keep_expert_tp_one():
    w = _worker(MODEL_PRESETS["llama3-8b"], H100, engine("vllm"), Pool(tp=4), 0)
    assert w.par.etp == 1 and w.par.ep_dispatch == "agrs"


def test_mtp_weights_only_with_speculative_decoding():
    """Review r14d #8: DeepSeek-V3 fp8 at TP8 held its MTP module (86,247,862,272 parameters a GPU) with no MTP asked;
    vLLM and SGLang load it only for speculative decoding (deployment.served_model). The hand count at TP8 is
    84,780,342,272 (routed experts 58 x 256 x 3 x 7168 x 2048 / 8, shared and dense FFN / 8, MLA's q_b / kv_b / o
    / 8 and the rest replicated, the router, 2 x 129,280 x 7168 / 8); the planner's 84,781,718,528 is within
    1,376,256 (0.0016%) of it, as r14d found."""
    from dataclasses import replace

    from planner.serving import MTP
    from planner.serving.deployment import plan_serving, served_model
    from planner.serving.spec import Traffic

    model = MODEL_PRESETS["deepseek-v3"]
    h200 = cluster_preset("dgx-h200", 1)
    plain, spec = ServeOptions(weight_dtype="fp8"), ServeOptions(weight_dtype="fp8", mtp=MTP(1, acceptance=0.85))
    counts = {}
    for name, options in (("plain", plain), ("mtp", spec)):
        served = served_model(model, options)
        worker = _worker(served, h200, engine("sglang"), Pool(tp=8), 0)
        counts[name] = _step(served, worker, options, "decode", 64, 1100).memory.per_stage[0].param_count
    assert counts == {"plain": 84_781_718_528, "mtp": 86_247_862_272}
    # over plan_serving: the preset served without MTP is the model without its MTP module, to the byte
    traffic, pools = Traffic(1000, 200, concurrency=64), (Pool("both", workers=1, tp=8),)
    a = plan_serving(model, h200, engine("vllm"), traffic, pools, plain)
    b = plan_serving(replace(model, mtp_layers=0), h200, engine("vllm"), traffic, pools, plain)
    assert a.pools[0].memory_peak_bytes == b.pools[0].memory_peak_bytes and a.tpot_s == b.tpot_s
    c = plan_serving(model, h200, engine("vllm"), traffic, pools, spec)
    assert c.pools[0].memory_peak_bytes > a.pools[0].memory_peak_bytes + 1.4e9
