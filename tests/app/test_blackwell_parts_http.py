"""A GB200 plan over HTTP prices its GEMMs at the part's own measured ceilings (GPUSpec.gemm_table, issue 20)."""

import copy
from dataclasses import replace

import pytest

from collectives.topology.gpu import GPU_VARIABILITY, GPUS
from planner import ParallelSpec, WorkloadSpec, model_preset
from planner.compute import stage_compute
from planner.context import Context
from planner.spread import pace

BODY = {
    "model": {"preset": "llama3-8b"},
    "workload": {"kind": "training", "micro_batch_size": 1, "global_batch_size": 64},
    "parallel": {"tp": 1, "pp": 1, "dp": 8},
    "cluster": {"preset": "dgx-h100", "num_nodes": 1, "gpu": "gb200-186gb"},
    "options": {"timeline": False},
}


def plan(api, body):
    r = api.post("/v1/plan", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def test_a_gb200_plan_prices_its_gemms_at_its_own_ceiling(api):
    """Llama-3-8B, dp 8, 8 micro-batches: the GB200 preset against the same GPU given field by field (no measured
    table: Blackwell's GEMM_CEILING, 0.733 bf16). The step's compute differs by exactly 8 micro-batches x the
    stage's GEMM seconds at 0.685 against 0.733 and nothing else; those GEMMs take 1.069x (0.733 / 0.685 = 1.070, less
    the fixed cost's share) as long. The answered cluster names the preset, so pasting it back keeps the table."""
    own = plan(api, BODY)
    gpu = {k: v for k, v in own["cluster"]["gpu"].items() if k not in ("preset", "power_limit_w")}
    assert own["cluster"]["gpu"]["preset"] == "gb200-186gb"
    custom = copy.deepcopy(BODY)
    custom["cluster"]["gpu"] = gpu
    generation = plan(api, custom)
    ctx = Context(model_preset("llama3-8b"), WorkloadSpec(global_batch_size=64), ParallelSpec(dp=8))
    gemm = {}
    for name, g in (("own", GPUS["gb200-186gb"]), ("generation", replace(GPUS["gb200-186gb"], gemm_table=None))):
        sc = stage_compute(ctx, 0, g)
        gemm[name] = sc.forward.gemm_s + sc.backward.gemm_s
    assert 1.065 < gemm["own"] / gemm["generation"] < 0.733 / 0.685
    extra = own["step"]["compute_s"] - generation["step"]["compute_s"]
    # at the pace of the slowest of the 8 GPUs (planner/spread.py, spread15), as the plans' compute
    assert extra == pytest.approx(8 * (gemm["own"] - gemm["generation"]) * pace(GPU_VARIABILITY, 8), rel=1e-9)
    pasted = copy.deepcopy(BODY)
    pasted["cluster"] = own["cluster"]
    assert plan(api, pasted)["step"]["compute_s"] == pytest.approx(own["step"]["compute_s"], rel=1e-12)


def test_a_b300_prefills_nvfp4_faster_than_a_b200_as_its_table_measures(api):
    """Review r13a finding 3 (mend13b): Llama 3 70B, TP8, nvfp4 weights, 8,192 in / 200 out at concurrency 64 on the
    DGX B200 with the GPU swapped. The tables measure the B300's large nvfp4 GEMMs at 0.867 of the B200's time
    (m, n, k >= 4,096); with its nvfp4 ceiling fitted on every shape (0.246) the B300 answered a TTFT of 0.1633 s
    against the B200's 0.1578 (slower), on its compute-bound shapes (0.321) 0.1517 s: 0.961 of the B200's. serve14:
    TensorRT-LLM's FP8 context FMHA (an FP8 KV cache, nvfp4 linears) and no second input quantize beside the nvfp4
    GEMMs whose measured ceiling times it (serve14's skip, since replaced): the B200's 0.1578 -> 0.1553 -> 0.1468 s,
    the B300 0.959 of it. bwcast14: the nvfp4 ceilings the GEMM alone (B200 0.484, B300 0.373) and the one input
    quantize charged again: 0.1468 -> 0.1475 s, the B300 0.959 -> 0.966 of it (still faster, as its table); mend14a:
    the FP8 FMHA by its own fitted ceiling (0.1475 -> 0.1469 s); spread15: each step at the pace of the slowest of
    its 8 GPUs (planner/spread.py, GPU-bound time x 1.021): 0.1469 -> 0.1487 s; mend15f: the pace through the
    clock (the compute-bound kernels alone slow): 0.1487 -> 0.1480 s."""
    ttft = {}
    for gpu in ("b200-180gb", "b300-288gb"):
        body = {
            "model": {"preset": "llama3-70b"},
            "cluster": {"preset": "dgx-b200", "num_nodes": 1, "gpu": gpu},
            "engine": "trtllm",
            "traffic": {"input_tokens": 8192, "output_tokens": 200, "concurrency": 64},
            "deployment": {"pools": [{"role": "both", "tp": 8}]},
            "options": {"weight_dtype": "nvfp4", "kv_dtype": "fp8"},
        }
        r = api.post("/v1/serve", json=body)
        assert r.status_code == 200, r.text
        ttft[gpu] = r.json()["ttft_s"]
    assert ttft["b200-180gb"] == pytest.approx(0.1480, abs=5e-4)
    assert ttft["b300-288gb"] / ttft["b200-180gb"] == pytest.approx(0.966, abs=0.003)
