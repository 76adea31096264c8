"""Dropout as the recipe sets it (docs/step-time.md "Dropout as configured (bias10)"): model.attention_dropout and
model.hidden_dropout, None keeping the inferred GPT-style rule, each read by its own kernels and saved tensors; the
presets' recipes; the config.json keys; bad probabilities named."""

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from collectives.topology import cluster_preset
from planner import ParallelSpec, SpecError, WorkloadSpec, from_hf_config, model_preset
from planner.context import Context
from planner.kernels import (
    DROPOUT_RNG_SM_CYCLES,
    FUSED_DROPOUT_SM_CYCLES,
    efficiency,
    embedding_kernels,
    hbm_s,
    layer_kernels,
    moe_block,
)
from planner.memory import dropout_probs, layer_activations
from planner.model import validate_model
from planner.presets import MODEL_PRESETS, PRESET_DROPOUT

H100 = cluster_preset("dgx-h100", 1).gpu
H200 = cluster_preset("dgx-h200", 1).gpu
GPT3 = replace(model_preset("gpt3-175b"), num_layers=2)
HF = Path(__file__).resolve().parents[1] / "reference" / "hf_configs"
B, S, H, T = 1, 2048, 12288, 8  # GPT-3 175B at tp 8 with SP


def ctx(model, training=True, **work):
    par = ParallelSpec(tp=T, dp=1, pp=1, sequence_parallel=True)
    kind = {} if training else {"kind": "inference"}
    return Context(model, WorkloadSpec(micro_batch_size=B, global_batch_size=8, **kind, **work), par)


def kernels(model, gpu=H100):
    lk = layer_kernels(ctx(model), False, gpu)
    return {k.name: k for k in lk.forward}, {k.name: k for k in lk.backward}


def test_none_is_the_inferred_rule_and_the_presets_carry_their_recipes():
    """None: Megatron-LM's 0.1 defaults for a GPT-style model (biases or learned positions), 0 for a Llama-style one;
    the presets say their recipes' values, each with a source; GPT-OSS's biases no longer imply dropout."""
    gpt = replace(GPT3, attention_dropout=None, hidden_dropout=None)
    assert gpt.dropout_probs() == (0.1, 0.1)
    assert replace(gpt, linear_bias=False, learned_position_embeddings=False).dropout_probs() == (0.0, 0.0)
    assert replace(gpt, hidden_dropout=0.0).dropout_probs() == (0.1, 0.0)
    for name, (attention, hidden, source) in PRESET_DROPOUT.items():
        assert MODEL_PRESETS[name].dropout_probs() == (attention, hidden) and source
    assert set(PRESET_DROPOUT) == set(MODEL_PRESETS)
    oss = model_preset("gpt-oss-120b")
    assert oss.linear_bias and oss.dropout_probs() == (0.0, 0.0)
    assert dropout_probs(ctx(GPT3)) == (0.1, 0.1) and dropout_probs(ctx(GPT3, training=False)) == (0.0, 0.0)


def test_saved_masks_by_hand():
    """Korthikanti et al. 2022 Table 2: each bias-dropout-add saves a 1-byte mask of b·s·h (two a layer), split over
    tp under SP: 2·b·s·h/t = 6,291,456 B at GPT-3's b 1, s 2,048, h 12,288, t 8; attention dropout saves its 1-byte
    mask and x-byte output per score: (2 + 1)·a·s²·b more of the s² scores than the softmax output alone."""
    full = layer_activations(ctx(GPT3), False)
    no_hidden = layer_activations(ctx(replace(GPT3, hidden_dropout=0.0)), False)
    no_attention = layer_activations(ctx(replace(GPT3, attention_dropout=0.0)), False)
    assert full.replicated - no_hidden.replicated == 2 * B * S * H
    assert full.per_rank(T, True, True) - no_hidden.per_rank(T, True, True) == 2 * B * S * H / T == 6_291_456
    assert (full.split, full.scores) == (no_hidden.split, no_hidden.scores)
    assert full.scores - no_attention.scores == 3 * 96 * B * S * S
    assert full.scores / no_attention.scores == pytest.approx(5 / 2)  # 5·a·s²·b against the softmax's 2
    assert (full.split, full.replicated) == (no_attention.split, no_attention.replicated)


def test_the_bias_dropout_add_by_hand():
    """With hidden dropout each of the layer's two bias-dropout-adds writes a 1-byte mask beside its 6 B (read x and
    the residual, write the sum), its backward reads it: on the t-sharded b·s·h/t = 3,145,728 elements, 7 B and
    2 x 6 + 1 = 13 B an element against 6 and 12. On the H100 its bytes outlast its Philox draws (7 B at the
    streaming rate against 0.42 SM-cycles an element on 132 SMs at 1,980 MHz); on the H200 the draws can set it."""
    n = B * S * H / T
    on_f, on_b = kernels(GPT3)
    off_f, off_b = kernels(replace(GPT3, hidden_dropout=0.0))
    assert (on_f["residual_add"].bytes, off_f["residual_add"].bytes) == (7 * n, 6 * n)
    assert (on_b["residual_add.bwd"].bytes, off_b["residual_add.bwd"].bytes) == (13 * n, 12 * n)
    eff = efficiency(H100, None)
    assert on_f["residual_add"].time_s - off_f["residual_add"].time_s == pytest.approx(hbm_s(n, H100, eff))
    draws = n * DROPOUT_RNG_SM_CYCLES / (132 * 1980e6)
    assert draws < hbm_s(7 * n, H100, eff)
    on200 = kernels(GPT3, H200)[0]["residual_add"]
    assert on200.time_s == pytest.approx(max(hbm_s(7 * n, H200, efficiency(H200, None)), draws) + on200.count
                                         * efficiency(H200, None).kernel_s)  # fmt: skip
    # the attention's kernels do not read the hidden dropout
    assert on_f["cudnn_fwd"].time_s == off_f["cudnn_fwd"].time_s


def test_a_probability_of_zero_launches_nothing():
    """Attention dropout 0: the fused kernel draws nothing (the drop9 extra, scores x FUSED_DROPOUT_SM_CYCLES / (SMs x
    clock), gone); hidden dropout 0: no embedding dropout pass, no mask in the bias-dropout-add."""
    on = kernels(GPT3, H200)[0]["cudnn_fwd"].time_s
    off = kernels(replace(GPT3, attention_dropout=0.0), H200)[0]["cudnn_fwd"].time_s
    scores = 12 * S * (S + 1) / 2
    assert on - off == pytest.approx(scores * FUSED_DROPOUT_SM_CYCLES["cudnn"][0] / (132 * 1980e6), rel=1e-9)
    names = {k.name for k in embedding_kernels(ctx(replace(GPT3, hidden_dropout=0.0)), H100).forward}
    assert "embedding.positions" in names and not any("dropout" in n for n in names)
    assert "embedding.dropout" in {k.name for k in embedding_kernels(ctx(GPT3), H100).forward}
    # both 0: a GPT-style model's layer saves what the dropout-free count says and launches no dropout anywhere
    off = replace(GPT3, attention_dropout=0.0, hidden_dropout=0.0)
    both, full = layer_activations(ctx(off), False), layer_activations(ctx(GPT3), False)
    assert (both.split, full.replicated - both.replicated, full.scores - both.scores) == (
        full.split, 2 * B * S * H, 3 * 96 * B * S * S)  # fmt: skip
    # the unfused attention's dropout kernel: UNFUSED_DROPOUT_BYTES' 5 B over the whole 12 x 2,048 x 2,048 square
    soft = [
        {k.name: k.bytes for k in layer_kernels(ctx(m, attention_kernel="unfused"), False, H100).forward}
        for m in (GPT3, off)
    ]
    assert soft[0]["softmax_dropout"] - soft[1]["softmax_dropout"] == 5 * 12 * S * S
    assert not any("dropout" in n for n in soft[1] if n != "softmax_dropout")


def test_hf_config_dropout_keys():
    """GPT-OSS's config.json: attention_dropout 0.0 read, hidden 0 (its modeling file has none); the other names
    transformers' configs use (attn_pdrop / resid_pdrop: GPT2Config) read too; a probability of 1 is named."""
    oss = json.loads((HF / "gpt-oss-120b.json").read_text())
    assert oss["attention_dropout"] == 0.0
    spec = from_hf_config(oss)
    assert (spec.attention_dropout, spec.hidden_dropout) == (0.0, 0.0)
    assert from_hf_config(oss | {"attention_dropout": 0.1}).dropout_probs() == (0.1, 0.0)
    assert from_hf_config(oss | {"resid_pdrop": 0.05}).dropout_probs() == (0.0, 0.05)
    no_key = {k: v for k, v in oss.items() if k != "attention_dropout"} | {"attn_pdrop": 0.2}
    assert from_hf_config(no_key).attention_dropout == 0.2
    with pytest.raises(SpecError) as err:
        from_hf_config(oss | {"attention_dropout": 1})
    assert err.value.field == "model.hf_config.attention_dropout" and "[0, 1)" in str(err.value)


@pytest.mark.parametrize("field", ["attention_dropout", "hidden_dropout"])
@pytest.mark.parametrize("value", [1.0, -0.1, math.nan])
def test_bad_probabilities_are_named(field, value):
    with pytest.raises(SpecError) as err:
        validate_model(replace(GPT3, **{field: value}))
    assert err.value.field == f"model.{field}" and "[0, 1)" in str(err.value)


def test_an_unfused_bias_dropout_add_runs_torchs_dropout_kernel():
    """GPT-OSS under Megatron runs its bias-dropout-add unfused (bias_dropout_fusion False): with a hidden dropout set
    the dropout is torch's own kernel, (2 x 2 + 1) B an element each way beside the add's unchanged 6 B; at the
    recipe's 0 there is none."""
    oss = replace(model_preset("gpt-oss-20b"), num_layers=2)
    c = Context(replace(oss, hidden_dropout=0.1), WorkloadSpec(micro_batch_size=1, global_batch_size=8),
                ParallelSpec(ep=8, dp=8))  # fmt: skip
    lk = layer_kernels(c, True, H100)
    fwd, bwd = {k.name: k for k in lk.forward}, {k.name: k for k in lk.backward}
    n = 1 * 4096 * 2880
    assert (fwd["residual_dropout"].bytes, bwd["residual_dropout.bwd"].bytes) == (5 * n, 5 * n)
    assert fwd["residual_add"].bytes == 6 * n
    # Megatron's "moe" recompute checkpoints the MoE layer only (recompute_mlp): not the bias-dropout-add after it
    block = [k.name for k in moe_block(lk.forward)]
    assert block[0] == "router" and "residual_dropout" not in block and "residual_add" not in block
    recipe = layer_kernels(replace(c, model=oss), True, H100)
    assert not any("dropout" in k.name for k in (*recipe.forward, *recipe.backward))
