"""The kernel model's request fields over HTTP (issue 20): the GPU's power limit, the attention kernel, the fp8
recipe, CUDA graphs and torch.compile; what a GPU lacks is a 422 naming the field and the rule."""

import copy

import pytest

from collectives.topology.gpu import GPUS
from planner import ParallelSpec, WorkloadSpec, model_preset
from planner.compute import stage_compute
from planner.context import Context

BODY = {
    "model": {"preset": "llama3-8b"},
    "workload": {"kind": "training", "micro_batch_size": 1, "global_batch_size": 64},
    "parallel": {"tp": 1, "pp": 1, "dp": 8},
    "cluster": {"preset": "dgx-h100", "num_nodes": 1},
    "options": {"timeline": False},
}


def body(workload=None, gpu=None, framework=None):
    b = copy.deepcopy(BODY)
    b["workload"] |= workload or {}
    if gpu is not None:
        b["cluster"]["gpu"] = gpu
    if framework:
        b["parallel"]["framework"] = framework
    return b


def plan(api, b):
    r = api.post("/v1/plan", json=b)
    assert r.status_code == 200, r.text
    return r.json()


def error(api, b) -> tuple[str, str]:
    """(the field the 422 names, its message)."""
    r = api.post("/v1/plan", json=b)
    assert r.status_code == 422, r.text
    first = r.json()["detail"][0]
    return ".".join(str(p) for p in first["loc"][1:]), first["msg"]


def test_power_limit_slows_the_compute_by_the_cube_law(api):
    """H100 at 500 W: compute-bound kernels at 0.863x the clock; the step's compute grows, never shrinks."""
    full = plan(api, body())
    capped = plan(api, body(gpu={"power_limit_w": 500}))
    ratio = capped["step"]["compute_s"] / full["step"]["compute_s"]
    assert 1.05 < ratio < 1 / 0.863 + 1e-9
    assert capped["cluster"]["gpu"]["power_limit_w"] == 500
    again = plan(api, body() | {"cluster": capped["cluster"]})  # the answered cluster block rebuilds the limit
    assert again["step"]["time_s"] == pytest.approx(capped["step"]["time_s"])
    named = plan(api, body(gpu={"preset": "h100-sxm5-80gb", "power_limit_w": 500}))
    assert named["step"]["compute_s"] == pytest.approx(capped["step"]["compute_s"])


@pytest.mark.parametrize("watts", [150, 701])
def test_power_limit_outside_the_range_is_named(api, watts):
    field, msg = error(api, body(gpu={"power_limit_w": watts}))
    assert field == "cluster.gpu.power_limit_w" and "200-700 W" in msg


def test_unknown_gpu_is_named(api):
    field, msg = error(api, body(gpu={"preset": "z100", "power_limit_w": 300}))
    assert field == "cluster.gpu.preset" and "unknown GPU 'z100'" in msg


def test_new_gpus_plan(api):
    for name in ("gh200-144gb", "b300-288gb", "gb300-288gb", "h100-nvl-94gb"):
        assert plan(api, body(gpu=name))["step"]["time_s"] > 0


def test_flash3_on_ampere_and_mxfp8_on_hopper_are_named(api):
    a100 = body({"attention_kernel": "flash3"})
    a100["cluster"] = {"preset": "dgx-a100", "num_nodes": 1}
    field, msg = error(api, a100)
    assert field == "workload.attention_kernel" and "Hopper (sm90) only" in msg
    field, msg = error(api, body({"fp8_recipe": "mxfp8"}))
    assert field == "workload.fp8_recipe" and "compute capability >= 10.0" in msg
    b200 = body({"fp8_recipe": "mxfp8"})
    b200["cluster"] = {"preset": "dgx-b200", "num_nodes": 1}
    assert plan(api, b200)["step"]["time_s"] > 0


def test_kernel_options_change_the_step(api):
    """flash2 is slower than Hopper's default cuDNN attention; block-scaled fp8 GEMMs slower than per-tensor ones
    (the step need not be: per-tensor current scaling adds its amax pass to the casts, which stream at the H200's
    measured cast rate, kernels.CAST_HBM); eager PyTorch slower than torch.compile; CUDA graphs never slower."""
    t = {
        name: plan(api, b)["step"]["compute_s"]
        for name, b in {
            "cudnn": body(),
            "flash2": body({"attention_kernel": "flash2"}),
            "tensor": body({"fp8_recipe": "tensorwise"}),
            "block": body({"fp8_recipe": "blockwise"}),
            "eager": body(framework="torch"),
            "compiled": body({"torch_compile": True}, framework="torch"),
            "graphs": body({"cuda_graphs": True}),
        }.items()
    }
    assert t["flash2"] > t["cudnn"]
    assert t["block"] != t["tensor"]
    gemm = {}
    for recipe in ("tensorwise", "blockwise"):
        ctx = Context(
            model_preset("llama3-8b"), WorkloadSpec(global_batch_size=64, fp8_recipe=recipe), ParallelSpec(dp=8)
        )
        sc = stage_compute(ctx, 0, GPUS["h100-sxm5-80gb"])
        gemm[recipe] = sc.forward.gemm_s + sc.backward.gemm_s
    assert gemm["blockwise"] > gemm["tensorwise"]
    assert t["eager"] > t["compiled"]
    assert t["graphs"] <= t["cudnn"]


def test_unfused_gradient_accumulation_over_http(api):
    """workload.grad_accumulation_fusion false (Megatron-LM of 2021): per micro-batch and layer one add over the
    layer's 218,103,808 weights, 10 B each (bf16 gradient read, fp32 buffer read and written) at 0.877 of the H100's
    3,350 GB/s plus 4 launches of 5 us; 8 micro-batches (64 / (1 x 8)) of 32 layers."""
    fused = plan(api, body())["step"]["compute_s"]
    unfused = plan(api, body({"grad_accumulation_fusion": False}))
    per_layer = 218_103_808 * 10 / (3350e9 * 0.877) + 4 * 5e-6
    assert unfused["step"]["compute_s"] - fused == pytest.approx(8 * 32 * per_layer, rel=1e-9)
    assert plan(api, body({"grad_accumulation_fusion": True}))["step"]["compute_s"] == fused
    field, msg = error(api, body({"grad_accumulation_fusion": "no"}))
    assert field == "workload.grad_accumulation_fusion" and "boolean" in msg


def test_unknown_gpu_by_name_is_named(api):
    field, msg = error(api, body(gpu="z100"))
    assert field == "cluster.gpu" and "unknown GPU 'z100'; known: a100-sxm4-80gb" in msg


def test_search_and_serve_name_what_the_gpu_lacks(api):
    """The bad-input rules of issue 20 hold on /v1/search and /v1/serve too, with the same field and rule."""
    search = {
        "model": {"preset": "llama3-8b", "seq_length": 2048, "num_layers": 8},
        "workload": {"kind": "training", "global_batch_size": 16, "attention_kernel": "flash3"},
        "cluster": {"preset": "dgx-a100", "num_nodes": 1},
        "constraints": {"tp": [1]},
    }
    r = api.post("/v1/search", json=search)
    assert r.status_code == 422, r.text
    err = r.json()["detail"][0]
    assert err["loc"][1:] == ["workload", "attention_kernel"] and "Hopper (sm90) only" in err["msg"]
    r = api.post("/v1/search", json=search | {"cluster": {"preset": "dgx-h100", "num_nodes": 1,
                                                          "gpu": {"power_limit_w": 100}}})  # fmt: skip
    assert r.status_code == 422, r.text
    err = r.json()["detail"][0]
    assert err["loc"][1:] == ["cluster", "gpu", "power_limit_w"] and "200-700 W" in err["msg"]
    serve = {
        "model": {"preset": "llama3-8b"},
        "cluster": {"preset": "dgx-h100", "num_nodes": 1, "gpu": "z100"},
        "engine": "vllm",
        "traffic": {"input_tokens": 1000, "output_tokens": 100, "concurrency": 8},
        "deployment": {"pools": [{"role": "both", "workers": 1, "tp": 8}]},
    }
    r = api.post("/v1/serve", json=serve)
    assert r.status_code == 422, r.text
    err = r.json()["detail"][0]
    assert err["loc"][1:] == ["cluster", "gpu"] and "unknown GPU 'z100'" in err["msg"]


def test_the_loss_fusion_over_http(api):
    """workload.cross_entropy_fusion: Megatron's default (off) runs vocab_parallel_cross_entropy as torch ops, 38 B
    per logit in 6 kernels forward and 14 B in 2 backward, against the fused kernel's 8 B in one launch forward
    and twice that backward; Llama 3 8B's 8,192 x 128,256 logits per micro-batch (vocabulary padded to 128 x tp:
    128,256), 8 micro-batches, at 0.877 of the H100's 3,350 GB/s, 5 us a launch."""
    default = plan(api, body())["step"]["compute_s"]
    fused = plan(api, body({"cross_entropy_fusion": True}))["step"]["compute_s"]
    logits = 8192 * 128256
    per_micro = ((38 + 14) - (8 + 16)) * logits / (3350e9 * 0.877) + (6 + 2 - 1 - 2) * 5e-6
    assert default - fused == pytest.approx(8 * per_micro, rel=1e-9)
    torch = plan(api, body(framework="torch"))["step"]["compute_s"]  # eager: its own loss, the flag not read
    assert plan(api, body({"cross_entropy_fusion": False}, framework="torch"))["step"]["compute_s"] == torch


MOE_MXFP8 = {
    "model": {"preset": "qwen3-30b-a3b"},
    "workload": {
        "kind": "training",
        "micro_batch_size": 1,
        "global_batch_size": 64,
        "seq_length": 4096,
        "activation_dtype": "fp8",
        "fp8_recipe": "mxfp8",
    },
    "parallel": {"dp": 8, "ep": 8},
    "cluster": {"preset": "dgx-b200", "num_nodes": 1},
    "options": {"timeline": False},
}


def test_the_fused_grouped_mlp_over_http(api):
    """workload.fused_grouped_mlp (TE's CuTe MXFP8 grouped MLP of the Megatron-Bridge 26.08 recipes): the routed
    experts as grouped kernels without the per-expert launches, the count sync, the fp8 padding and the activation
    kernel; the step's compute is exactly the planner's with the switch (planner/kernels.py FUSED_GROUPED_MLP)."""
    from planner.compute import layer_pass
    from planner.kernels import EFFICIENCY, layer_kernels
    from planner.spread import paced_gpu

    answer = plan(api, MOE_MXFP8)
    per = answer["step"]["compute_s"]
    b = copy.deepcopy(MOE_MXFP8)
    b["workload"]["fused_grouped_mlp"] = True
    fused_answer = plan(api, b)
    fused = fused_answer["step"]["compute_s"]
    assert fused < per
    listed = [{r["field"]: r["value"] for r in a["assumptions"]}.get("workload.fused_grouped_mlp")
              for a in (answer, fused_answer)]  # fmt: skip
    assert listed == ["off", "on"]
    works = [WorkloadSpec(**(MOE_MXFP8["workload"] | {"fused_grouped_mlp": f})) for f in (False, True)]
    qwen3, b200 = model_preset("qwen3-30b-a3b"), GPUS["b200-180gb"]
    ctxs = [Context(qwen3, w, ParallelSpec(dp=8, ep=8)) for w in works]
    # the per-expert layer syncs for its counts: its passes run through the host's queue (compute.layer_pass)
    # on the slowest of the 8 GPUs, as the step times them (planner/spread.py; spread15/mend15f)
    per_layer = [
        sum(layer_pass(c, lk, EFFICIENCY, backward=b).total_s for b in (False, True))
        for c in ctxs
        for lk in [layer_kernels(c, True, paced_gpu(c, b200))]
    ]
    # 48 MoE layers, 8 micro-batches a step (64 / dp 8): the step's compute moves by the layers' difference
    assert per - fused == pytest.approx(48 * 8 * (per_layer[0] - per_layer[1]), rel=1e-6)


@pytest.mark.parametrize(
    ("workload", "says"),
    [
        ({"fp8_recipe": "tensorwise"}, "MXFP8 only"),
        ({"kind": "inference", "batch_size": 8}, "training workload"),
    ],
)
def test_the_fused_grouped_mlp_elsewhere_is_a_422_naming_it(api, workload, says):
    b = copy.deepcopy(MOE_MXFP8)
    b["workload"] |= {"fused_grouped_mlp": True} | workload
    if workload.get("kind") == "inference":
        for name in ("micro_batch_size", "global_batch_size"):
            b["workload"].pop(name)
    field, msg = error(api, b)
    assert field == "workload.fused_grouped_mlp" and says in msg


def test_the_scale_swizzle_over_http(api):
    """workload.scale_swizzle (moe11b): "gemm" (TE v2.9, the 25.11 stack: two swizzle launches a low-precision GEMM
    call) slows an MXFP8 plan against the default "quantize" (TE v2.18's GEMM-ready scales); the plan's assumptions
    name which; a value outside the two is a 422 naming the field."""
    answer = plan(api, MOE_MXFP8)
    b = copy.deepcopy(MOE_MXFP8)
    b["workload"]["scale_swizzle"] = "gemm"
    lazy = plan(api, b)
    assert lazy["step"]["compute_s"] > answer["step"]["compute_s"]
    listed = [{r["field"]: r["value"] for r in a["assumptions"]}.get("workload.scale_swizzle") for a in (answer, lazy)]
    assert listed == ["quantize", "gemm"]
    b["workload"]["scale_swizzle"] = "cublas"
    field, msg = error(api, b)
    assert field == "workload.scale_swizzle" and "quantize" in msg


def test_the_scale_swizzle_for_inference_is_a_422_naming_it(api):
    b = copy.deepcopy(MOE_MXFP8)
    for name in ("micro_batch_size", "global_batch_size"):
        b["workload"].pop(name)
    b["workload"] |= {"kind": "inference", "batch_size": 8, "scale_swizzle": "gemm"}
    field, msg = error(api, b)
    assert field == "workload.scale_swizzle" and "training workload" in msg
