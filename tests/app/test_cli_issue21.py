"""Issue 21's "done when" on the CLI (surface10): every option family of issue 21 through `commplan plan FILE`
(app.cli.main in-process, as tests/app/test_cli_fields.py runs it), one body per feature, each answer checked
against a value worked by hand or an invariant it must keep (a ledger row's bytes, a stage's parameters, a
bubble against 1F1B's), and each family's bad input refused alike by the CLI (exit 2, "field: rule" on stderr)
and by HTTP (422, the field in ``loc``). The hand-checked numbers repeat the HTTP tests named per case, so both
surfaces are held to the same figures. The audit table: docs/page.md "Issue 21's options on every surface"."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from .test_cli_fields import cli
from .test_models_http import MOE as TOY_MOE
from .test_models_http import moe_body as _moe_body

HF_DIR = Path(__file__).parents[1] / "reference" / "hf_configs"
H100x1 = {"preset": "dgx-h100", "num_nodes": 1}
H100x2 = {"preset": "dgx-h100", "num_nodes": 2}

# Llama-3 8B (Meta's config.json): per decoder layer q/k/v 4096 x (4096 + 2 x 1024), o 4096 x 4096, SwiGLU
# 3 x 4096 x 14336, two RMSNorms of 4096; embedding and (untied) LM head 128,256 x 4096, the final norm 4096
LAYER = 4096 * 6144 + 4096 * 4096 + 3 * 4096 * 14336 + 2 * 4096
EMB = 128256 * 4096
HEAD = EMB + 4096
assert LAYER == 218_112_000

SMALL = {  # Llama-3 8B on one DGX H100, PP4 DP2, m = 16 / 2 = 8 (tests/app/test_pipeline_layouts.py SMALL)
    "model": {"preset": "llama3-8b"},
    "workload": {"kind": "training", "micro_batch_size": 1, "global_batch_size": 16},
    "parallel": {"tp": 1, "pp": 4, "dp": 2},
    "cluster": H100x1,
    "options": {"timeline": False},
}
MIXTRAL_PP4 = {  # tests/app/test_pipeline_layouts.py MOE: Mixtral 8x7B, PP4 DP4 EP4 on two DGX H100
    "model": {"preset": "mixtral-8x7b"},
    "workload": {"kind": "training", "micro_batch_size": 1, "global_batch_size": 64},
    "parallel": {"tp": 1, "pp": 4, "dp": 4, "ep": 4, "zero_stage": 1},
    "cluster": H100x2,
    "options": {"timeline": False},
}
DP8 = {  # Llama-3 8B, one DGX H100, DP8, one micro-batch each
    "model": {"preset": "llama3-8b"},
    "workload": {"kind": "training", "micro_batch_size": 1, "global_batch_size": 8},
    "parallel": {"tp": 1, "pp": 1, "dp": 8},
    "cluster": H100x1,
    "options": {"timeline": False},
}
TOY_MLA = {  # tests/app/test_models_http.py test_mla_projections_under_tp_over_http
    "num_layers": 2, "hidden_size": 1024, "num_attention_heads": 8, "ffn_hidden_size": 4096,
    "vocab_size": 32000, "seq_length": 2048,
    "mla": {"q_lora_rank": 512, "kv_lora_rank": 256, "qk_nope_head_dim": 64, "qk_rope_head_dim": 32,
            "v_head_dim": 64},
}  # fmt: skip
LLAMA8B_FP8 = {  # tests/app/test_models_http.py LLAMA8B_FP8: m = 64 / 8 = 8
    "model": {"preset": "llama3-8b"},
    "workload": {"global_batch_size": 64, "fp8_recipe": "delayed"},
    "parallel": {"tp": 2, "dp": 8, "zero_stage": 1, "sequence_parallel": True},
    "cluster": H100x2,
    "options": {"timeline": False},
}
FP8_ATTN = {  # tests/app/test_fp8_attention_http.py BODY
    "model": {"preset": "llama3-8b"},
    "workload": {"kind": "training", "micro_batch_size": 1, "global_batch_size": 8, "seq_length": 8192,
                 "activation_dtype": "fp8", "fp8_recipe": "delayed"},
    "parallel": {"tp": 1, "pp": 1, "dp": 8},
    "cluster": H100x1,
    "options": {"timeline": False},
}  # fmt: skip


def edit(base: dict, **parts) -> dict:
    """``base`` with each part (``workload={...}``) updated, or replaced where given as ``model=...`` whole."""
    out = copy.deepcopy(base)
    for part, fields in parts.items():
        out[part] = out.get(part, {}) | fields if part != "model" or "preset" in fields else fields
    return out


def moe_body(parallel: dict, **workload) -> dict:
    """tests/app/test_models_http.py's MoE body (4 layers, 16 experts of 1024, top-2; ep 16 dp 16 on two DGX
    H100), without the timeline."""
    return _moe_body(parallel, **workload) | {"options": {"timeline": False}}


def rows(plan: dict, prefix: str) -> dict[str, dict]:
    return {c["name"]: c for c in plan["calls"] if c["name"].startswith(prefix)}


def said(plan: dict) -> dict[str, str]:
    return {a["field"]: a["value"] for a in plan["assumptions"]}


def params(plan: dict) -> list[int]:
    return [s["param_count"] for s in plan["memory"]["per_stage"]]


def acts(plan: dict) -> int:
    return plan["memory"]["per_stage"][0]["activations_bytes"]


Run = Callable[[dict], dict]


# ---- the checks, one per feature: (plan of the case's body, run another body by the CLI) ----------------------
def _first_last_virtual(p: dict, run: Run) -> None:
    """PP4 x 2 chunks, 6 layers on the first and the last rank: the middle ranks hold (32 - 12) / 2 = 10."""
    assert params(p) == [6 * LAYER + EMB, 10 * LAYER, 10 * LAYER, 6 * LAYER + HEAD]


LAYOUT = "E|t*5|t*5|t*5|t*5|t*5|t*5|t*2L"  # 8 chunks, chunk k on rank k % 4; E and the loss chunk of their own


def _layout_string(p: dict, run: Run) -> None:
    """Rank 0 holds chunks 0 (E alone) and 4 (5 layers), rank 3 chunks 3 (5) and 7 (2 layers and the loss)."""
    assert params(p) == [5 * LAYER + EMB, 10 * LAYER, 10 * LAYER, 7 * LAYER + HEAD]


def _layout_lists(p: dict, run: Run) -> None:
    """The list form of the same layout (layer names), the same stages."""
    _layout_string(p, run)


def _account_for_embedding(p: dict, run: Run) -> None:
    """31 layers + the embedding counted as one = 32 slots over PP4: 7 layers beside the embedding, then 8 each."""
    assert params(p) == [7 * LAYER + EMB, 8 * LAYER, 8 * LAYER, 8 * LAYER + HEAD]


def _torch_splits(p: dict, run: Run) -> None:
    """torch.distributed.pipelining split points 7, 16, 25: stages of 7, 9, 9 and 7 layers."""
    assert params(p) == [7 * LAYER + EMB, 9 * LAYER, 9 * LAYER, 7 * LAYER + HEAD]
    pp = next(c for c in p["calls"] if c["parallelism"] == "pp")
    assert "torch.distributed.pipelining" in pp["source"]


_ONE_F_ONE_B: dict = {}


def _baseline_1f1b(run: Run) -> dict:
    if not _ONE_F_ONE_B:
        _ONE_F_ONE_B.update(run(MIXTRAL_PP4)["step"])
    return _ONE_F_ONE_B


def _zero_bubble(p: dict, run: Run) -> None:
    """ZB-H1 and ZBV (Qi et al. 2024) split the backward: a smaller bubble than 1F1B's on the same layout."""
    assert p["step"]["bubble_s"] < _baseline_1f1b(run)["bubble_s"]


def _exposed_ep(step: dict) -> float:
    """The EP all-to-alls the timeline draws exposed, over every stage."""
    return sum(e["end_s"] - e["start_s"] for e in step["timeline"] if e["stream"] == "ep" and not e["overlapped"])


def _dualpipe(p: dict, run: Run) -> None:
    """DualPipe(V): a smaller bubble, and the EP all-to-all behind the other direction's compute. (Its exposed
    communication in all can be the larger: DualPipe sums its two copies' gradients over DP, dualpipe13b.)"""
    one = _baseline_1f1b(run)
    assert p["step"]["bubble_s"] < one["bubble_s"]
    drawn = {"timeline": True}  # the same plans with their timelines, where each stream's exposed part is drawn
    kind = said(p)["parallel.pipeline_schedule"]
    mine = run(edit(MIXTRAL_PP4, parallel={"pipeline_schedule": kind}, options=drawn))["step"]
    assert _exposed_ep(mine) < _exposed_ep(run(edit(MIXTRAL_PP4, options=drawn))["step"])


def _recompute_full(p: dict, run: Run) -> None:
    """Full recompute of every layer keeps the least; block over 16 of 32 layers keeps more; none the most."""
    block = run(edit(DP8, workload={"activation_recompute": "full", "recompute_method": "block",
                                    "recompute_num_layers": 16}))  # fmt: skip
    none = run(DP8)
    assert acts(p) < acts(block) < acts(none)
    assert said(block)["workload.recompute_method"] == "block" and said(block)["workload.recompute_num_layers"] == "16"


def _recompute_modules(p: dict, run: Run) -> None:
    """Megatron selective recompute of core_attn and mlp keeps less than core_attn alone (the default)."""
    default = run(edit(DP8, workload={"activation_recompute": "selective"}))
    assert acts(p) < acts(default)
    assert said(p)["workload.recompute_modules"] == "core_attn, mlp"


def _torch_sac(p: dict, run: Run) -> None:
    """torchtitan per-op selective checkpointing (every second matmul re-run) keeps less than flash alone."""
    default = run(edit(DP8, workload={"activation_recompute": "selective"}, parallel={"framework": "torch"}))
    assert acts(p) < acts(default)
    assert said(p)["workload.selective_ac_option"] == "op"


def _cpu_offload(p: dict, run: Run) -> None:
    """16 layers' activations to the host over PCIe: the device keeps less."""
    assert acts(p) < acts(run(DP8))


def _mla(p: dict, run: Run) -> None:
    """MLA under TP 2 + SP (test_models_http.py test_mla_projections_under_tp_over_http): q_down, kv_down and the
    latent norms whole on each rank, q_up, kv_up and the output projection halved; their grads all-reduced in
    fp32 once per iteration."""
    replicated = 1024 * 512 + 512 + 1024 * (256 + 32) + 256
    split = 512 * 8 * 96 + 256 * 8 * (64 + 64) + 8 * 64 * 1024
    layer = replicated + split // 2 + 2 * 1024 + 3 * 1024 * 4096 // 2
    assert params(p) == [2 * layer + 2 * 32000 * 1024 // 2 + 1024]
    assert rows(p, "tp.sp_param_grads")["tp.sp_param_grads"]["message_bytes"] == (2 * (replicated + 2048) + 1024) * 4


def _mtp(p: dict, run: Run) -> None:
    """DeepSeek-V3's MTP module (test_models_http.py test_deepseek_v3_mtp_layers_over_http): 11,610,067,968 more
    parameters, and the last stage's ledger one more MoE layer's all-to-alls (31 layers x 2 micro-batches)."""
    without = run(edit(p["_body"], model={"preset": "deepseek-v3", "mtp_layers": 0}))
    assert p["params_total"] - without["params_total"] == 11_610_067_968
    dispatch = {tuple(c["stages"]): c["calls_per_iteration"] for c in p["calls"] if c["name"] == "ep.dispatch"}
    assert dispatch[(1,)] == 31 * 2


def _gpt_oss_windows_and_sinks(p: dict, run: Run) -> None:
    """gpt-oss-20b: 20,914,757,184 parameters (model card 20.91B); the sinks are 64 per layer, windows none."""
    assert p["params_total"] == 20_914_757_184
    assert said(p)["model.sliding_window"] == "128"
    plain = run(edit(p["_body"], model={"preset": "gpt-oss-20b", "attention_sinks": False, "sliding_window": None,
                                        "full_attention_interval": None}))  # fmt: skip
    assert plain["params_total"] == 20_914_757_184 - 24 * 64
    assert plain["step"]["compute_s"] > p["step"]["compute_s"]  # every layer attends to the whole sequence


def _qk_norm(p: dict, run: Run) -> None:
    """Qwen3's QK-norm: one head_dim-wide weight for q and one for k per layer, 48 x 2 x 128."""
    off = run(edit(p["_body"], model={"preset": "qwen3-30b-a3b", "qk_norm": False}))
    assert p["params_total"] - off["params_total"] == 48 * 2 * 128


def _shared_experts(p: dict, run: Run) -> None:
    """One shared expert (SwiGLU of width 1 x 1024) in each of the 4 MoE layers, beside 16 fine-grained experts."""
    alone = run(moe_body({}))
    assert p["params_total"] - alone["params_total"] == 4 * 3 * 2048 * 1024


def _published_total(total: float) -> Callable[[dict, Run], None]:
    def check(p: dict, run: Run) -> None:
        assert p["params_total"] == pytest.approx(total, rel=0.01)

    check.__doc__ = f"the published parameter total, {total:,.0f}, within 1%"
    return check


def _delayed(p: dict, run: Run) -> None:
    """Delayed scaling: 3 fp8 tensors per GEMM forward and 2 backward, 4 GEMMs per layer, fp32 amaxes, once per
    micro-batch (test_models_http.py test_delayed_scaling_amax_reduction_by_hand)."""
    amax = rows(p, "fp8.amax")
    assert amax["fp8.amax"]["message_bytes"] == 3 * 4 * 32 * 4
    assert amax["fp8.amax.bwd"]["message_bytes"] == 2 * 4 * 32 * 4
    assert amax["fp8.amax"]["calls_per_iteration"] == 8


def _tensorwise(p: dict, run: Run) -> None:
    """Current scaling under SP: the qkv and fc1 inputs' amax all-reduced over TP in forward (32 x 2 x 8)."""
    amax = rows(p, "fp8.tp_amax")
    assert (amax["fp8.tp_amax"]["message_bytes"], amax["fp8.tp_amax"]["calls_per_iteration"]) == (4, 32 * 2 * 8)
    assert not rows(p, "fp8.amax")


def _blockwise(p: dict, run: Run) -> None:
    """Blockwise 1x128 / 128x128 scales from each tile's own amax: no amax reduction, faster than bf16."""
    assert not rows(p, "fp8.amax") and not rows(p, "fp8.tp_amax")
    assert said(p)["workload.fp8_recipe"] == "blockwise"


def _fp8_param_gather(p: dict, run: Run) -> None:
    """Llama-3 8B at tp 2: the TE linear weights, 3,489,660,928 elements per rank, gathered at 1 B each; the rest
    (embedding and head halves, 65 norms) in bf16 (test_models_http.py test_fp8_param_gather_bytes_by_hand)."""
    linear = 32 * (4096 * 6144 + 4096 * 4096 + 4096 * 28672 + 14336 * 4096) // 2
    rest = 2 * 128256 * 4096 // 2 + 65 * 4096
    gathers = rows(p, "dp.params")
    assert (gathers["dp.params.fp8"]["message_bytes"], gathers["dp.params.fp8"]["dtype"]) == (linear, "fp8")
    assert gathers["dp.params"]["message_bytes"] == 2 * rest


def _blackwell(p: dict, run: Run) -> None:
    """MXFP8 / NVFP4 on B200: the low-precision GEMMs shorten the step against bf16."""
    bf16 = run(edit(p["_body"], workload={"fp8_recipe": None}))
    assert p["step"]["time_s"] < bf16["step"]["time_s"]


def _allgather(p: dict, run: Run) -> None:
    """MoEAllGatherTokenDispatcher, tp 2 + SP, ep 8: the TP x EP group (16) gathers 16 x 2048 rows of h = 2048
    bf16 and reduce-scatters the output (test_models_http.py test_allgather_dispatcher_bytes_by_hand)."""
    ag = rows(p, "ep.allgather")
    assert ag["ep.allgather.hidden"]["message_bytes"] == 16 * 2048 * 2048 * 2
    assert (ag["ep.allgather.hidden"]["group_size"], ag["ep.allgather.combine"]["op"]) == (16, "reducescatter")
    assert not rows(p, "ep.dispatch")


def _alltoall(p: dict, run: Run) -> None:
    """The default dispatcher: each rank sends its 4,096 tokens x top-2 x h 2048 bf16 in one all-to-all."""
    dispatch = rows(p, "ep.dispatch")["ep.dispatch"]
    assert (dispatch["op"], dispatch["message_bytes"]) == ("alltoall", 4096 * 2 * 2048 * 2)


def _deepep(p: dict, run: Run) -> None:
    """DeepEP over 2 nodes of 8: 2(1 - 1/2^2) = 1.5 nodes per token on the RDMA leg, 8(1 - (7/8)^(2/1.5)) GPUs a
    node on the NVLink leg (test_models_http.py test_deepep_two_legs_over_http_by_hand)."""
    nodes = 2 * (1 - 0.5**2)
    gpus = 8 * (1 - (7 / 8) ** (2 / nodes))
    legs = rows(p, "ep.dispatch")
    assert legs["ep.dispatch.rdma"]["message_bytes"] == round(4096 * nodes) * 2048 * 2
    assert legs["ep.dispatch.nvlink"]["message_bytes"] == round(4096 * nodes * gpus) * 2048 * 2


def _hybridep(p: dict, run: Run) -> None:
    """HybridEP moves DeepEP's two legs (test_hybridep.py): the same bytes, HybridEP's source."""
    _deepep(p, run)
    assert all("HybridEP" in c["source"] for c in rows(p, "ep.dispatch").values())
    assert said(p)["parallel.ep_dispatch"] == "hybridep"


OVERLAP_BASE = moe_body({"pp": 2, "ep": 8, "dp": 8}, global_batch_size=64) | {
    "model": TOY_MOE | {"moe": TOY_MOE["moe"] | {"num_shared_experts": 1}}
}


def _overlaps(p: dict, run: Run) -> None:
    """The expert all-to-all behind another micro-batch's compute hides more than the shared experts behind the
    all-to-all, which hides some (test_models_http.py test_moe_overlap_switches_shorten_the_step)."""
    base = run(OVERLAP_BASE)["step"]
    shared = run(edit(OVERLAP_BASE, options={"overlap": {"moe_shared_expert_overlap": True}}))["step"]
    assert p["step"]["exposed_comm_s"] < shared["exposed_comm_s"] < base["exposed_comm_s"]


def _documents(p: dict, run: Run) -> None:
    """Packed documents 4096 + 2048 + 2048 in an 8,192 sequence: causal attention within each, less work, the
    same calls (test_document_masks_http.py)."""
    whole = run(edit(p["_body"], workload={"document_lengths": None}))
    assert p["step"]["compute_s"] < whole["step"]["compute_s"]
    assert [(c["name"], c["message_bytes"]) for c in p["calls"]] == [
        (c["name"], c["message_bytes"]) for c in whole["calls"]
    ]


def _dp_balanced(p: dict, run: Run) -> None:
    """Megatron's DpBalancedScheduler packs the corpus's lengths next-fit; the step waits for the slowest
    micro-batch across the DP ranks: the same compute on the critical rank, a longer step, the wait in the bubble
    (test_documents_packing_http.py)."""
    fixed = run(edit(p["_body"], workload={"document_lengths": [4096, 2048, 2048], "document_packing": None}))
    assert p["step"]["time_s"] > fixed["step"]["time_s"]
    grew = p["step"]["time_s"] - fixed["step"]["time_s"]
    assert p["step"]["bubble_s"] - fixed["step"]["bubble_s"] == pytest.approx(grew, rel=1e-9)


def _norm_kernel(p: dict, run: Run) -> None:
    """Megatron-LM 2021's non-persistent apex LayerNorm: slower norms, the same calls."""
    fused = run(edit(p["_body"], workload={"norm_kernel": "fused"}))
    assert p["step"]["compute_s"] > fused["step"]["compute_s"] and said(p)["workload.norm_kernel"] == "apex"


def _fp8_dpa_backward(p: dict, run: Run) -> None:
    """FP8 attention forward only (NVTE_FP8_DPA_BWD=0): slower than FP8 both ways, faster than bf16 attention."""
    both = run(edit(FP8_ATTN, workload={"fp8_dot_product_attention": True}))
    plain = run(FP8_ATTN)
    assert both["step"]["compute_s"] < p["step"]["compute_s"] < plain["step"]["compute_s"]
    assert said(p)["workload.fp8_dpa_backward"] == "off"


DSV3_PP2 = {  # test_models_http.py test_deepseek_v3_mtp_layers_over_http
    "model": {"preset": "deepseek-v3", "mtp_layers": 1},
    "workload": {"global_batch_size": 128},
    "parallel": {"pp": 2, "ep": 64, "dp": 64, "first_stage_layers": 31},
    "cluster": {"preset": "dgx-h100", "num_nodes": 16},
    "options": {"timeline": False},
}


def _model_body(model: dict, **parallel) -> dict:
    return {"model": model, "workload": {"global_batch_size": 64}, "parallel": {"dp": 16} | parallel,
            "cluster": H100x2, "options": {"timeline": False}}  # fmt: skip


def _hf(name: str) -> dict:
    return {"hf_config": json.loads((HF_DIR / name).read_text())}


LISTED = [["embedding"], *[["decoder"] * 5] * 6, ["decoder", "decoder", "loss"]]
DOCS = {"kind": "training", "micro_batch_size": 1, "global_batch_size": 8, "seq_length": 8192}

# (feature, body, check): issue 21's Build items 1-6 and the newer workload fields
CASES = [
    ("first-last-stage-layers-with-virtual-stages", edit(SMALL, parallel={
        "pipeline_schedule": "interleaved", "virtual_pipeline_stages": 2, "first_stage_layers": 6,
        "last_stage_layers": 6}), _first_last_virtual),
    ("pipeline-layout-string", edit(SMALL, parallel={"pipeline_schedule": "interleaved", "pipeline_layout": LAYOUT}),
     _layout_string),
    ("pipeline-layout-lists", edit(SMALL, parallel={"pipeline_schedule": "interleaved", "pipeline_layout": LISTED}),
     _layout_lists),
    ("account-for-embedding", edit(SMALL, model={"preset": "llama3-8b", "num_layers": 31},
                                   parallel={"account_for_embedding_in_pipeline_split": True}), _account_for_embedding),
    ("torch-split-points", edit(SMALL, parallel={"framework": "torch", "pipeline_split_points": [7, 16, 25]}),
     _torch_splits),
    ("zb-h1", edit(MIXTRAL_PP4, parallel={"pipeline_schedule": "zb-h1"}), _zero_bubble),
    ("zbv", edit(MIXTRAL_PP4, parallel={"pipeline_schedule": "zbv"}), _zero_bubble),
    ("dualpipe", edit(MIXTRAL_PP4, parallel={"pipeline_schedule": "dualpipe"}), _dualpipe),
    ("dualpipev", edit(MIXTRAL_PP4, parallel={"pipeline_schedule": "dualpipev"}), _dualpipe),
    ("recompute-full-uniform", edit(DP8, workload={"activation_recompute": "full", "recompute_method": "uniform",
                                                   "recompute_num_layers": 1}), _recompute_full),
    ("recompute-modules", edit(DP8, workload={"activation_recompute": "selective",
                                              "recompute_modules": ["core_attn", "mlp"]}), _recompute_modules),
    ("torch-per-op-sac", edit(DP8, workload={"activation_recompute": "selective", "selective_ac_option": "op"},
                              parallel={"framework": "torch"}), _torch_sac),
    ("cpu-offload", edit(DP8, workload={"cpu_offloading_num_layers": 16}), _cpu_offload),
    ("mla", {"model": TOY_MLA, "workload": {"global_batch_size": 16},
             "parallel": {"tp": 2, "dp": 8, "sequence_parallel": True}, "cluster": H100x2,
             "options": {"timeline": False}}, _mla),
    ("mtp", DSV3_PP2, _mtp),
    ("sliding-window-and-sinks", _model_body({"preset": "gpt-oss-20b"}), _gpt_oss_windows_and_sinks),
    ("qk-norm", _model_body({"preset": "qwen3-30b-a3b", "qk_norm": True}, ep=16), _qk_norm),
    ("shared-and-fine-grained-experts",
     moe_body({}) | {"model": TOY_MOE | {"moe": TOY_MOE["moe"] | {"num_shared_experts": 1}}}, _shared_experts),
    ("hf-DeepseekV3ForCausalLM", _model_body(_hf("deepseek-v3.json"), ep=16), _published_total(671.0e9 + 11.6e9)),
    ("hf-GptOssForCausalLM", _model_body(_hf("gpt-oss-20b.json")), _published_total(20.91e9)),
    ("hf-Qwen3MoeForCausalLM", _model_body(_hf("qwen3-30b-a3b.json"), ep=16), _published_total(30.5e9)),
    ("preset-deepseek-v3", _model_body({"preset": "deepseek-v3"}, ep=16), _published_total(671.0e9 + 11.6e9)),
    ("preset-gpt-oss-20b", _model_body({"preset": "gpt-oss-20b"}), _published_total(20.91e9)),
    ("preset-gpt-oss-120b", _model_body({"preset": "gpt-oss-120b"}), _published_total(116.83e9)),
    ("preset-qwen3-30b-a3b", _model_body({"preset": "qwen3-30b-a3b"}, ep=16), _published_total(30.5e9)),
    ("preset-qwen3-235b-a22b", _model_body({"preset": "qwen3-235b-a22b"}, ep=16), _published_total(235e9)),
    ("fp8-delayed", LLAMA8B_FP8, _delayed),
    ("fp8-tensorwise", edit(LLAMA8B_FP8, workload={"fp8_recipe": "tensorwise"}), _tensorwise),
    ("fp8-blockwise", edit(LLAMA8B_FP8, workload={"fp8_recipe": "blockwise"}), _blockwise),
    ("fp8-param-gather", edit(LLAMA8B_FP8, workload={"fp8_param_gather": True}), _fp8_param_gather),
    ("mxfp8-on-b200", edit(LLAMA8B_FP8, workload={"fp8_recipe": "mxfp8"}, cluster={"preset": "dgx-b200"}),
     _blackwell),
    ("nvfp4-on-b200", edit(LLAMA8B_FP8, workload={"fp8_recipe": "nvfp4"}, cluster={"preset": "dgx-b200"}),
     _blackwell),
    ("dispatcher-allgather", moe_body({"tp": 2, "ep": 8, "dp": 8, "sequence_parallel": True,
                                       "ep_dispatch": "allgather"}), _allgather),
    ("dispatcher-alltoall", moe_body({"ep_dispatch": "alltoall"}), _alltoall),
    ("dispatcher-deepep", moe_body({"ep_dispatch": "deepep"}), _deepep),
    ("dispatcher-hybridep", moe_body({"ep_dispatch": "hybridep"}), _hybridep),
    ("1f1b-a2a-overlap", edit(OVERLAP_BASE, options={"overlap": {"overlap_moe_expert_parallel_comm": True}}),
     _overlaps),
    ("document-lengths", edit(DP8, workload=DOCS | {"document_lengths": [4096, 2048, 2048]}), _documents),
    ("document-packing", edit(SMALL, workload=DOCS | {"global_batch_size": 32, "document_lengths": [4096, 2048, 2048],
                                                     "document_packing": "dp_balanced"}), _dp_balanced),
    ("norm-kernel-apex", edit(DP8, workload={"norm_kernel": "apex"}), _norm_kernel),
    ("fp8-dpa-backward", edit(FP8_ATTN, workload={"fp8_dot_product_attention": True, "fp8_dpa_backward": False}),
     _fp8_dpa_backward),
]  # fmt: skip


@pytest.mark.parametrize(("body", "check"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_every_issue21_option_by_cli(tmp_path, capsys, body, check):
    """``commplan plan FILE --format json`` on the feature's body: exit 0 and the feature's hand-checked value."""

    def run(b: dict) -> dict:
        b = {k: v for k, v in b.items() if k != "_body"}
        for part in ("workload", "model"):  # a None in an edit drops the field (the base's default)
            if isinstance(b.get(part), dict):
                b[part] = {k: v for k, v in b[part].items() if v is not None or part == "model"}
        rc, out, err = cli(tmp_path, b, capsys)
        assert (rc, err) == (0, ""), err
        plan = json.loads(out)
        plan["_body"] = b
        return plan

    check(run(body), run)


# ---- bad input: (feature, body, field, words), the same refusal on both surfaces -----------------------------
GPT_OSS_HF = _hf("gpt-oss-20b.json")["hf_config"]
REFUSALS = [
    ("layout-misses-layers", edit(SMALL, parallel={"pipeline_schedule": "interleaved",
                                                   "pipeline_layout": "Et|(t|)*29,|L"}),
     "parallel.pipeline_layout", "hold 30 decoder layers (t) but the model has 32"),
    ("layout-unknown-layer", edit(SMALL, parallel={"pipeline_layout": [["E", "t"], ["x"], ["t"], ["L"]]}),
     "parallel.pipeline_layout", "virtual stage 1 has 'x'"),
    ("first-stage-layers-vs-chunks", edit(SMALL, parallel={
        "pipeline_schedule": "interleaved", "virtual_pipeline_stages": 2, "first_stage_layers": 5,
        "last_stage_layers": 5}), "parallel.first_stage_layers", "5 must be divisible by the 2 chunks per rank"),
    ("account-for-with-first-last", edit(SMALL, parallel={"first_stage_layers": 6, "last_stage_layers": 6,
                                                          "account_for_loss_in_pipeline_split": True}),
     "parallel.account_for_embedding_in_pipeline_split", "not modelled together with first_stage_layers"),
    ("account-for-indivisible", edit(SMALL, parallel={"account_for_embedding_in_pipeline_split": True}),
     "parallel.pp", "num_layers 32 + 1 (embedding/loss counted as layers) is not divisible by pp 4"),
    ("split-points-not-rising", edit(SMALL, parallel={"framework": "torch", "pipeline_split_points": [9, 3, 25]}),
     "parallel.pipeline_split_points", "must rise strictly"),
    ("zbv-three-chunks", edit(SMALL, parallel={"pipeline_schedule": "zbv", "virtual_pipeline_stages": 3}),
     "parallel.virtual_pipeline_stages", "zbv runs exactly 2 chunks per rank, got virtual_pipeline_stages 3"),
    ("zb-h1-without-pipeline", edit(DP8, parallel={"pipeline_schedule": "zb-h1"}),
     "parallel.pipeline_schedule", "it needs pp >= 2, got pp 1"),
    ("dualpipe-few-microbatches", edit(SMALL, workload={"global_batch_size": 12},
                                       parallel={"pipeline_schedule": "dualpipe"}),
     "workload.global_batch_size", "needs an even number of micro-batches >= 2*pp = 8"),
    ("recompute-module-the-model-lacks", edit(DP8, workload={"activation_recompute": "selective",
                                                             "recompute_modules": ["mla_up_proj"]}),
     "workload.recompute_modules", "recompute module 'mla_up_proj': the model has no multi-head latent attention"),
    ("recompute-module-unknown", edit(DP8, workload={"activation_recompute": "selective",
                                                     "recompute_modules": ["attention"]}),
     "workload.recompute_modules.0", "Input should be 'core_attn'"),
    ("selective-ac-option-bad", edit(DP8, workload={"activation_recompute": "selective", "selective_ac_option": "x"},
                                     parallel={"framework": "torch"}),
     "workload.selective_ac_option", "must be 'op' or a positive int"),
    ("cpu-offload-with-recompute", edit(DP8, workload={"cpu_offloading_num_layers": 4, "activation_recompute": "full"}),
     "workload.cpu_offloading_num_layers", "does not work when activation recomputation is enabled"),
    ("cpu-offload-with-pp", edit(SMALL, workload={"cpu_offloading_num_layers": 4}),
     "workload.cpu_offloading_num_layers", "no support for Pipeline parallelism with CPU offloading"),
    ("mla-rank-zero", _model_body(TOY_MLA | {"mla": TOY_MLA["mla"] | {"kv_lora_rank": 0}}),
     "model.mla.kv_lora_rank", "greater than or equal to 1"),
    ("mtp-too-many", _model_body({"preset": "deepseek-v3", "mtp_layers": 65}, ep=16),
     "model.mtp_layers", "less than or equal to 64"),
    ("window-without-sliding", _model_body({"preset": "llama3-8b", "full_attention_interval": 2}),
     "model.full_attention_interval", "sliding_window"),
    ("sinks-not-a-bool", _model_body({"preset": "gpt-oss-20b", "attention_sinks": "yes"}),
     "model.attention_sinks", "Input should be a valid boolean"),
    ("qk-norm-not-a-bool", _model_body({"preset": "qwen3-30b-a3b", "qk_norm": "rms"}, ep=16),
     "model.qk_norm", "Input should be a valid boolean"),
    ("shared-experts-too-many", _model_body(TOY_MOE | {"moe": TOY_MOE["moe"] | {"num_shared_experts": 65}}, ep=16),
     "model.moe.num_shared_experts", "less than or equal to 64"),
    ("hf-gpt-oss-layer-types", _model_body({"hf_config": GPT_OSS_HF | {"layer_types": ["full_attention"]}}),
     "model.hf_config.layer_types", "got 1"),
    ("preset-unknown", _model_body({"preset": "gpt-oss-7b"}), "model.preset", "gpt-oss-20b"),
    ("mxfp8-on-hopper", edit(LLAMA8B_FP8, workload={"fp8_recipe": "mxfp8"}), "workload.fp8_recipe", "10.0"),
    ("fp8-recipe-unknown", edit(LLAMA8B_FP8, workload={"fp8_recipe": "hybrid"}), "workload.fp8_recipe",
     "Input should be 'delayed'"),
    ("fp8-param-gather-without-recipe", edit(LLAMA8B_FP8, workload={"fp8_recipe": None, "fp8_param_gather": True}),
     "workload.fp8_param_gather", "fp8_recipe"),
    ("deepep-low-latency-in-training", moe_body({"ep_dispatch": "deepep_ll"}), "parallel.ep_dispatch",
     "inference only"),
    ("hybridep-fp8-dispatch", moe_body({"ep_dispatch": "hybridep"}, moe_dispatch_dtype="fp8"),
     "workload.moe_dispatch_dtype", "does not support fp8 dispatch"),
    ("a2a-overlap-with-allgather", edit(OVERLAP_BASE, parallel={"ep_dispatch": "allgather"},
                                        options={"overlap": {"overlap_moe_expert_parallel_comm": True}}),
     "options.overlap.overlap_moe_expert_parallel_comm", "allgather"),
    ("documents-not-the-sequence", edit(DP8, workload=DOCS | {"document_lengths": [4096, 2048]}),
     "workload.document_lengths", "8192"),
    ("packing-unknown", edit(DP8, workload=DOCS | {"document_lengths": [4096], "document_packing": "first_fit"}),
     "workload.document_packing", "dp_balanced"),
    ("norm-ops-on-megatron", edit(DP8, workload={"norm_kernel": "ops"}), "workload.norm_kernel",
     "'ops' is an eager framework's RMSNorm op chain"),
    ("fp8-dpa-backward-alone", edit(FP8_ATTN, workload={"fp8_dpa_backward": False}), "workload.fp8_dpa_backward",
     "NVTE_FP8_DPA_BWD"),
]  # fmt: skip


def _clean(body: dict) -> dict:
    b = copy.deepcopy(body)
    b["workload"] = {k: v for k, v in b.get("workload", {}).items() if v is not None}
    return b


@pytest.mark.parametrize(("body", "field", "words"), [r[1:] for r in REFUSALS], ids=[r[0] for r in REFUSALS])
def test_every_issue21_refusal_on_the_cli_and_over_http(tmp_path, capsys, api, body, field, words):
    """The CLI exits 2 with "field: rule" on stderr and nothing on stdout; HTTP answers 422 naming the same field
    in ``loc`` with the same rule and numbers; never a 500, never a plan."""
    body = _clean(body)
    rc, out, err = cli(tmp_path, body, capsys)
    assert (rc, out) == (2, ""), err
    assert f"commplan: {field}: " in err and words in err, err
    r = api.post("/v1/plan", json=body)
    assert r.status_code == 422, r.text
    named = [d for d in r.json()["detail"] if ".".join(map(str, d["loc"][1:])) == field]
    assert named and any(words in d["msg"] for d in named), r.json()["detail"]
