"""Megatron-LM's MixedFusedLayerNorm before its persistent kernel (planner/kernels.py APEX_LAYER_NORM, apex_norm):
the persistent kernel's bytes times NVIDIA/apex PR #1037's A100 ratios, on a layer's norms by hand; which hidden
sizes fall back to it in Megatron-LM 55ba1f7b96 (persist_ln_hidden_sizes); the SC'21 runs state it."""

import json
from dataclasses import replace
from pathlib import Path

import pytest

from collectives.topology import cluster_preset
from planner import ParallelSpec, WorkloadSpec, model_preset
from planner._errors import SpecError
from planner.context import Context
from planner.kernels import APEX_LAYER_NORM, EFFICIENCY, apex_norm, hbm_s, layer_kernels
from planner.workload import validate_workload

A100 = cluster_preset("dgx-a100", 1).gpu
GPT3 = model_preset("gpt3-175b")  # hidden 12,288: one of persist_ln_hidden_sizes
WORK = WorkloadSpec(micro_batch_size=1, global_batch_size=8, activation_recompute="none")


def _ctx(model=GPT3, framework="megatron-lm-2021", **work):
    return Context(model, replace(WORK, **work), ParallelSpec(tp=8, framework=framework))


def _kernel(kernels, name):
    (k,) = [k for k in kernels if k.name == name]
    return k


def test_the_constants_are_the_published_a100_ratios():
    """PR #1037's GA100 table, B=32 S=512 hidden 1024 fp16: apex's kernels 0.0751 ms forward (895.8 GB/s over 4 B an
    element), 0.1762 ms backward (572.2 GB/s over 6 B); the persistent kernel 0.0535 / 0.0866 ms (1258.0 / 1163.4
    GB/s). As bytes at the persistent kernel's rate: 4 x 1258.0 / 895.8 and 6 x 1163.4 / 572.2."""
    (fwd, fn), (bwd, bn) = APEX_LAYER_NORM
    assert fwd == pytest.approx(5.6173, abs=1e-4) and bwd == pytest.approx(12.1992, abs=1e-4)
    assert (fn, bn) == (
        1,
        3,
    )  # cuApplyLayerNorm; cuComputePartGradGammaBeta, cuComputeGradGammaBeta, cuComputeGradInput
    # the same ratios in time: 0.0751 / 0.0535 and 0.1762 / 0.0866 within the table's rounding
    assert fwd / 4 == pytest.approx(0.0751 / 0.0535, rel=2e-3) and bwd / 6 == pytest.approx(0.1762 / 0.0866, rel=2e-3)


def test_a_layers_norms_under_apex_by_hand():
    """GPT-3's layer, b 1, s 2,048, TP 8 without SP: each norm runs over T x h = 2,048 x 12,288 elements on every
    TP rank; apex 5.6173 B an element forward in 1 kernel, 12.1992 B backward in 3, where the fused kernel moves
    4 and 8 B (one kernel each way)."""
    elements = 2048 * 12288
    apex = layer_kernels(_ctx(norm_kernel="apex"), False, A100)
    fused = layer_kernels(_ctx(), False, A100)
    (fwd, fn), (bwd, bn) = APEX_LAYER_NORM
    for name in ("input_norm", "pre_mlp_norm"):
        f, b = _kernel(apex.forward, name), _kernel(apex.backward, name + ".bwd")
        assert f.bytes == pytest.approx(fwd * elements) and f.count == fn
        assert b.bytes == pytest.approx(bwd * elements) and b.count == bn
        # bytes at the streaming rate plus each launch's fixed time (memory_kernel)
        assert f.time_s == pytest.approx(hbm_s(fwd * elements, A100, EFFICIENCY) + EFFICIENCY.kernel_s)
        assert b.time_s == pytest.approx(hbm_s(bwd * elements, A100, EFFICIENCY) + 3 * EFFICIENCY.kernel_s)
        assert _kernel(fused.forward, name).bytes == 4 * elements and _kernel(fused.backward, name + ".bwd").bytes == (
            8 * elements
        )
    # nothing else in the layer moves
    others = [k for k in apex.forward + apex.backward if "norm" not in k.name]
    assert others == [k for k in fused.forward + fused.backward if "norm" not in k.name]


def test_which_hidden_sizes_fall_back_to_apex():
    """Megatron-LM 55ba1f7b96 fused_layer_norm.py: the persistent kernel for the listed sizes, apex otherwise; the
    request's norm_kernel wins; other flavours never fall back."""
    assert not apex_norm(_ctx())  # 12,288 is listed
    odd = replace(GPT3, hidden_size=11264, num_attention_heads=88)  # not in persist_ln_hidden_sizes
    assert apex_norm(_ctx(odd)) and not apex_norm(_ctx(odd, norm_kernel="fused"))
    assert apex_norm(_ctx(norm_kernel="apex"))
    assert not apex_norm(_ctx(odd, framework="megatron")) and apex_norm(_ctx(framework="megatron", norm_kernel="apex"))


def test_an_unknown_norm_kernel_names_the_choices():
    with pytest.raises(SpecError) as err:
        validate_workload(replace(WORK, norm_kernel="legacy"))
    assert err.value.field == "workload.norm_kernel" and "apex" in str(err.value)


def test_the_2021_runs_state_the_kernel_of_their_code():
    """The SC'21 code (6985e58) has only MixedFusedLayerNorm's own kernels, and so had MT-NLG's Megatron when its
    throughput was published (2021-10-11; the persistent kernel merged 2021-11-10, a2fdcdf061); Korthikanti et al.'s
    55ba1f7b96 runs take the flavour's default (their hidden sizes 6,144-25,600 are all listed: the persistent one)."""
    data = json.loads((Path(__file__).resolve().parents[1] / "reference/step_times/published.json").read_text())
    for case in data["cases"]:
        if case["name"].startswith(("SC'21", "MT-NLG")):
            assert case["workload"]["norm_kernel"] == "apex"
        elif case["source"].startswith("Korthikanti"):
            assert "norm_kernel" not in case["workload"]
            assert data["models"][case["model"]].get("hidden_size", 0) in (0, 6144, 12288, 20480, 25600)
