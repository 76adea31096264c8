"""Selective recompute re-lists the calls of the modules it re-runs (issue 21, layouts3 item 1).

Megatron-LM d98e8a6: ``mlp`` (dense layers only: transformer_layer.py ``if not self.is_moe_layer``), ``moe``
(the whole MoE forward: moe_layer.py ``moe_layer_recompute``) and ``shared_experts`` (moe_layer.py
``shared_experts_compute``) each wrap their module in ``tensor_parallel.checkpoint``, whose backward re-runs
the forward with its collectives; ``moe_act`` and ``layernorm`` wrap none. The router's aux-loss count
all-reduce runs only under ``torch.is_grad_enabled()`` (router.py), so in a checkpointed layer it moves from
the forward (run under no_grad) to the backward's re-run: the same count, another phase.

Hand-checked numbers: b = 1, m = 8 micro-batches per iteration, pp 4.
- Llama-3 8B (32 layers: 8 per stage), s 8192, h 4096, bf16: the TP unit A = 1 x 8192 x 4096 x 2 =
  67,108,864 B; tp 2 with SP holds 8192 / 2 = 4096 tokens.
- Qwen2-57B-A14B (28 MoE layers: 7 per stage, one shared expert of ffn 20480, 64 experts top-8), s 4096,
  h 3584: A = 4096 x 3584 x 2 = 29,360,128 B; tp 2 with SP: 2048 tokens per rank, each sent to 8 experts:
  dispatch 2048 x 8 x 3584 x 2 = 117,440,512 B; the router's counts 64 experts x int64 = 512 B.
"""

import json
from pathlib import Path

import pytest

from planner import ParallelSpec, SpecError, WorkloadSpec
from planner.context import Context
from planner.presets import model_preset
from planner.rules import ledger
from planner.step import Overlap

A_8B = 1 * 8192 * 4096 * 2
A_QWEN = 1 * 4096 * 3584 * 2
DISPATCH_QWEN = 2048 * 8 * 3584 * 2


def ctx_of(model, par, **work):
    base = dict(micro_batch_size=1, global_batch_size=8 * par.dp, activation_recompute="selective")
    return Context(model_preset(model), WorkloadSpec(**(base | work)), par)


def rows(ctx, suffix=".recompute"):
    """name -> (op, phase, message bytes, calls per iteration) of the calls whose name ends with ``suffix``."""
    out = {}
    for c in ledger(ctx):
        if c.name.endswith(suffix):
            assert c.stages == (0, 1, 2, 3), c  # every stage alike here
            out[c.name] = (str(c.op.value), c.phase, c.message_bytes, c.calls_per_iteration)
    return out


def named(ctx, name):
    return [c for c in ledger(ctx) if c.name == name]


SP = ParallelSpec(tp=2, pp=4, sequence_parallel=True)
NO_SP = ParallelSpec(tp=2, pp=4)
QWEN = ParallelSpec(tp=2, pp=4, dp=4, ep=4, sequence_parallel=True)


def test_mlp_recompute_reissues_the_dense_mlps_tp_calls():
    """8 dense layers x 8 micro-batches = 64 re-runs of fc1's all-gather and fc2's reduce-scatter of A under
    SP; without SP fc2's all-reduce alone (fc1's input is whole). Attention's calls are not re-issued."""
    assert rows(ctx_of("llama3-8b", SP, recompute_modules=("mlp",))) == {
        "tp.mlp.up_proj.recompute": ("allgather", "backward", A_8B, 64),
        "tp.mlp.down_proj.recompute": ("reducescatter", "backward", A_8B, 64),
    }
    assert rows(ctx_of("llama3-8b", NO_SP, recompute_modules=("mlp",))) == {
        "tp.mlp.down_proj.recompute": ("allreduce", "backward", A_8B, 64),
    }
    # core_attn and layernorm wrap no TP call
    assert rows(ctx_of("llama3-8b", SP, recompute_modules=("core_attn", "layernorm"))) == {}


def test_mlp_recompute_reruns_only_dense_layers():
    """DeepSeek-V3's first 3 layers are dense: at pp 4 with its 61 layers (16 on stage 0), ``mlp`` re-runs
    those 3 MLPs on stage 0 and nothing on the MoE-only stages (transformer_layer.py: not on MoE layers)."""
    par = ParallelSpec(tp=2, pp=4, dp=8, ep=16, sequence_parallel=True, first_stage_layers=16)
    ctx = ctx_of("deepseek-v3", par, recompute_modules=("mlp",))
    again = {(c.name, c.stages): c.calls_per_iteration for c in ledger(ctx) if c.name.endswith(".recompute")}
    # DeepSeek-V3's shared expert is a TP MLP too, but ``mlp`` does not re-run it
    assert again == {("tp.mlp.up_proj.recompute", (0,)): 3 * 8, ("tp.mlp.down_proj.recompute", (0,)): 3 * 8}


def test_moe_recompute_reissues_the_whole_moe_block():
    """``moe``: per MoE layer and micro-batch (7 x 8 = 56) the token counts, dispatch, expert-TP gather and
    scatter and combine once more (and the routed rows' bf16 probabilities' own all-to-all, 2,048 x 8 x 2 B: moe9,
    token_dispatch's permuted_probs), the shared expert's fc1/fc2, and the router's count reduction moved."""
    ctx = ctx_of("qwen2-57b-a14b", QWEN, recompute_modules=("moe",))
    assert rows(ctx) == {
        "tp.mlp.up_proj.recompute": ("allgather", "backward", A_QWEN, 56),
        "tp.mlp.down_proj.recompute": ("reducescatter", "backward", A_QWEN, 56),
        "ep.router.tokens_per_expert.recompute": ("allreduce", "backward", 64 * 8, 56),
        "ep.token_counts.recompute": ("allgather", "backward", 2 * 4 * 64 * 8, 56),
        "ep.dispatch.recompute": ("alltoall", "backward", DISPATCH_QWEN, 56),
        "ep.dispatch.probs.recompute": ("alltoall", "backward", 2048 * 8 * 2, 56),
        "ep.combine.recompute": ("alltoall", "backward", DISPATCH_QWEN, 56),
        "ep.expert_tp.gather.recompute": ("allgather", "backward", 2 * DISPATCH_QWEN, 56),
        "ep.expert_tp.scatter.recompute": ("reducescatter", "backward", 2 * DISPATCH_QWEN, 56),
    }
    assert named(ctx, "ep.router.tokens_per_expert") == []  # no forward reduction left: moved, not added


def test_shared_experts_and_moe_act():
    """``shared_experts``: the shared expert's two TP calls alone; with ``moe`` too the nested checkpoint
    runs them twice more (the outer re-run runs the inner forward, the inner backward re-runs it again):
    2 x 56 = 112. ``moe_act`` re-runs an activation function, no collective."""
    shared = rows(ctx_of("qwen2-57b-a14b", QWEN, recompute_modules=("shared_experts",)))
    assert shared == {
        "tp.mlp.up_proj.recompute": ("allgather", "backward", A_QWEN, 56),
        "tp.mlp.down_proj.recompute": ("reducescatter", "backward", A_QWEN, 56),
    }
    both = rows(ctx_of("qwen2-57b-a14b", QWEN, recompute_modules=("moe", "shared_experts")))
    assert both["tp.mlp.up_proj.recompute"][3] == both["tp.mlp.down_proj.recompute"][3] == 112
    assert both["ep.dispatch.recompute"][3] == 56
    assert rows(ctx_of("qwen2-57b-a14b", QWEN, recompute_modules=("moe_act",))) == {}
    # Mixtral has no shared expert: ``moe`` re-lists EP calls and no TP MLP
    mixtral = rows(ctx_of("mixtral-8x7b", ParallelSpec(tp=2, pp=4, dp=4, ep=8), recompute_modules=("moe",)))
    assert not any(name.startswith("tp.") for name in mixtral) and "ep.dispatch.recompute" in mixtral


@pytest.mark.parametrize(
    ("work", "forward", "moved"),
    [
        ({"activation_recompute": "none"}, 56, 0),
        ({"activation_recompute": "full"}, 0, 56),
        # block 3 of each stage's 7 layers checkpointed: 3 x 8 move, 4 x 8 stay in the forward
        ({"activation_recompute": "full", "recompute_method": "block", "recompute_num_layers": 3}, 32, 24),
        ({"recompute_modules": ("core_attn",)}, 56, 0),
    ],
)
def test_router_count_reduction_moves_into_the_rerun(work, forward, moved):
    """Full recompute: the aux-loss reduction of a checkpointed layer is issued once, in the backward's
    re-run (router.py runs the aux loss only under torch.is_grad_enabled()); the total stays 56."""
    ctx = ctx_of("qwen2-57b-a14b", QWEN, **work)
    fwd = named(ctx, "ep.router.tokens_per_expert")
    again = named(ctx, "ep.router.tokens_per_expert.recompute")
    assert sum(c.calls_per_iteration for c in fwd) == forward
    assert sum(c.calls_per_iteration for c in again) == moved
    assert all(c.phase == "forward" for c in fwd) and all(c.phase == "backward" for c in again)


def test_shared_experts_recompute_refuses_the_shared_expert_overlap():
    """Megatron-LM d98e8a6 transformer_config.py: ``shared_experts recompute cannot work with
    --moe-shared-expert-overlap``."""
    ctx = ctx_of("qwen2-57b-a14b", QWEN, recompute_modules=("shared_experts",))
    with pytest.raises(SpecError) as err:
        Overlap(moe_shared_expert_overlap=True).resolved(ctx)
    assert err.value.field == "options.overlap.moe_shared_expert_overlap"
    assert "shared_experts recompute" in err.value.rule
    Overlap(moe_shared_expert_overlap=True).resolved(ctx_of("qwen2-57b-a14b", QWEN, recompute_modules=("moe",)))


def test_fp8_current_scaling_amax_reruns_with_the_modules():
    """Tensorwise (current) scaling under SP all-reduces each column-parallel input's amax over TP (rules/fp8.py);
    a selectively re-run module quantizes its inputs again under te_checkpoint: ``mlp`` one fc1 per dense layer
    (8 x 8 = 64), ``shared_experts`` one shared fc1 per MoE layer (7 x 8 = 56), ``core_attn`` none."""

    def amax(model, par, **work):
        found = named(ctx_of(model, par, fp8_recipe="tensorwise", **work), "fp8.tp_amax.recompute")
        return sum(c.calls_per_iteration for c in found)

    assert amax("llama3-8b", SP, recompute_modules=("mlp",)) == 64
    assert amax("llama3-8b", SP, recompute_modules=("core_attn",)) == 0
    assert amax("qwen2-57b-a14b", QWEN, recompute_modules=("shared_experts",)) == 56
    assert amax("qwen2-57b-a14b", QWEN, recompute_modules=("moe", "shared_experts")) == 112


def test_mla_up_proj_reruns_its_two_fp8_amaxes():
    """``mla_up_proj``: MLA's q and kv up-projections re-run (multi_latent_attention.py qkv_up_checkpoint),
    each re-quantizing its gathered input: 2 amax all-reduces per layer and micro-batch, DeepSeek-V3 at pp 4
    (16 layers on stage 0, 15 on stages 1-2, 15 and the MTP module's layer on stage 3, counted as the forward
    amax rule counts them) with m = 8: 2 x 16 x 8 = 256 and 2 x 15 x 8 = 240."""
    par = ParallelSpec(tp=2, pp=4, dp=8, ep=16, sequence_parallel=True, first_stage_layers=16)
    ctx = ctx_of("deepseek-v3", par, fp8_recipe="tensorwise", recompute_modules=("mla_up_proj",))
    again = {c.stages: c.calls_per_iteration for c in named(ctx, "fp8.tp_amax.recompute")}
    assert again == {(0, 3): 256, (1, 2): 240}


def test_mla_up_proj_re_gathers_the_latents_under_sequence_parallelism():
    """Selective ``mla_up_proj`` (Megatron-LM d98e8a6 multi_latent_attention.py ``qkv_up_checkpoint``, a
    CheckpointWithoutOutput round linear_q_up_proj, linear_kv_up_proj and RoPE): under SP the two
    column-parallel up-projections all-gather their latent inputs again in the backward; the RoPE key's
    gather runs before the checkpoint and is not re-issued. DeepSeek-V3 at 4 layers (3 dense, 1 MoE), tp 4
    with SP, pp 1, s 4096, b 1, m 8: q latent 1 x 4096 x 1536 x 2 = 12,582,912 B, kv latent 4096 x 512 x 2 =
    4,194,304 B, RoPE key 4096 x 64 x 2 = 524,288 B per gather, 1 layer per stage x 8 micro-batches = 8 each."""
    from dataclasses import replace

    v3 = replace(model_preset("deepseek-v3"), num_layers=4, mtp_layers=0)
    par = ParallelSpec(tp=4, pp=4, dp=2, ep=2, sequence_parallel=True)
    work = WorkloadSpec(micro_batch_size=1, global_batch_size=16, seq_length=4096,
                        activation_recompute="selective", recompute_modules=("mla_up_proj",))  # fmt: skip
    ctx = Context(v3, work, par)
    q, kv, rope = 4096 * 1536 * 2, 4096 * 512 * 2, 4096 * 64 * 2
    assert rows(ctx) == {
        "tp.attn.q_up.recompute": ("allgather", "backward", q, 8),
        "tp.attn.kv_up.recompute": ("allgather", "backward", kv, 8),
    }
    fwd = {c.name: (c.op.value, c.message_bytes, c.calls_per_iteration) for c in ledger(ctx) if c.phase == "forward"}
    # the attention's gathers are the latents and the RoPE key, not the hidden states (h 7168: 58,720,256 B)
    assert fwd["tp.attn.q_up"] == ("allgather", q, 8) and fwd["tp.attn.kv_up"] == ("allgather", kv, 8)
    assert fwd["tp.attn.k_pos_emb"] == ("allgather", rope, 8) and "tp.attn.qkv" not in fwd
    assert fwd["tp.attn.out_proj"] == ("reducescatter", 4096 * 7168 * 2, 8)
    bwd = {c.name: (c.op.value, c.phase, c.message_bytes, c.calls_per_iteration) for c in ledger(ctx)
           if c.name.startswith("tp.attn.")}  # fmt: skip
    assert bwd["tp.attn.k_pos_emb.dgrad"] == ("reducescatter", "backward", rope, 8)
    assert bwd["tp.attn.q_up.wgrad_gather"] == ("allgather", "backward", q, 8)
    assert "tp.attn.k_pos_emb.wgrad_gather" not in bwd  # not a linear's input
    # without SP the column-parallel forward is an identity: nothing to re-issue; the backward all-reduces
    # the two latents' input gradients, and nothing the RoPE key's
    plain = Context(v3, work, replace(par, sequence_parallel=False))
    assert rows(plain) == {}
    back = {c.name: c.message_bytes for c in ledger(plain) if c.name.startswith("tp.attn.") and c.phase == "backward"}
    assert back == {"tp.attn.q_up.dgrad": q, "tp.attn.kv_up.dgrad": kv}
    # without the module nothing is re-run
    assert rows(Context(v3, replace(work, recompute_modules=("core_attn",)), par)) == {}


SAC_RECORD = Path(__file__).parents[1] / "reference" / "pytorch" / "sac_op_tp2.json"
C10D = {
    "allgather": "c10d::allgather_into_tensor_coalesced_",
    "reducescatter": "c10d::reduce_scatter_tensor_coalesced_",
    "allreduce": "c10d::allreduce_",
}


@pytest.mark.parametrize("sp", [True, False])
@pytest.mark.parametrize("option", ["op", "full"])
def test_torch_checkpointing_reissues_what_the_recording_shows(sp, option):
    """tests/reference/pytorch/sac_op_tp2.json: per Llama block, what the backward issues beyond an unchecked
    block's is what the ledger re-lists per layer and micro-batch. Per-op SAC (torchtitan's policy saves
    reduce_scatter_tensor, not all_gather_into_tensor or all_reduce): with SP the 2 all-gathers again, without
    it the 2 rowwise all-reduces; a whole block (torchtitan FullAC, early_stop=False): every forward call."""
    runs = {(r["sequence_parallel"], r["mode"]): r["backward"] for r in json.loads(SAC_RECORD.read_text())["runs"]}
    mode = "op" if option == "op" else "full"
    again = {k: n - runs[sp, "none"].get(k, 0) for k, n in runs[sp, mode].items() if n != runs[sp, "none"].get(k, 0)}
    work = dict(selective_ac_option="op") if option == "op" else dict(activation_recompute="full")
    par = ParallelSpec(tp=2, pp=4, sequence_parallel=sp, framework="torch")
    ctx = ctx_of("llama3-8b", par, **work)
    listed = {}
    for name, (op, _, message, count) in rows(ctx).items():
        assert name.startswith("tp.") and message == A_8B and count == 8 * 8  # 8 layers x 8 micro-batches
        listed[C10D[op]] = listed.get(C10D[op], 0) + 1
    assert listed == again
    assert again == ({C10D["allgather"]: 2} if sp and option == "op" else
                     {C10D["allgather"]: 2, C10D["reducescatter"]: 2} if sp else {C10D["allreduce"]: 2})  # fmt: skip
