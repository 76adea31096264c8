"""Kernel constants fitted on a profiler trace, handed back as ``cluster.calibration.kernels`` (issue 20): accepted
by /v1/plan, /v1/plan/batch, /v1/search and /v1/serve, bounded, each out-of-range value a 422 naming the field."""

import copy
from dataclasses import replace

import pytest

from app.convert import plan_inputs
from app.schemas.plan import PlanRequest
from app.settings import Settings
from planner import Context
from planner.compute import stage_compute
from planner.kernels import EFFICIENCY
from planner.spread import job_pace, slowest_part

PLAN = {
    "model": {"preset": "llama3-8b"},
    "workload": {"kind": "training", "micro_batch_size": 1, "global_batch_size": 16},
    "parallel": {"tp": 1, "pp": 1, "dp": 8, "zero_stage": 1},
    "cluster": {"preset": "dgx-a100", "num_nodes": 1},
    "options": {"timeline": False},
}
HALF = {"gemm_ceiling": {"bf16": 0.43}}  # half the A100's measured bf16 ceiling (0.86, kernels.GEMM_CEILING)


def with_kernels(body: dict, kernels: dict) -> dict:
    out = copy.deepcopy(body)
    out["cluster"]["calibration"] = {"kernels": kernels}
    return out


def ok(response) -> dict:
    assert response.status_code == 200, response.text
    return response.json()


def test_a_gemm_ceiling_moves_the_gemms_and_only_them(api):
    """Half the bf16 ceiling: every compute-bound bf16 GEMM takes twice as long (the 8 us fixed cost does not
    scale: 1.998x over the layer's GEMMs); the plan's compute is the pure function's with those constants,
    m x (forward + backward) + Adam (m = 16 / (1 x 8) = 2)."""
    before = ok(api.post("/v1/plan", json=PLAN))["step"]["compute_s"]
    after = ok(api.post("/v1/plan", json=with_kernels(PLAN, HALF)))["step"]["compute_s"]
    model, work, par, cluster, _ = plan_inputs(PlanRequest.model_validate(PLAN), Settings())
    ctx = Context(model, work, par)
    k = job_pace(ctx, cluster.gpu)  # the plan's compute at the slowest of its 8 GPUs' pace (spread15)
    default = stage_compute(ctx, 0, slowest_part(cluster.gpu, k), EFFICIENCY)
    halved = stage_compute(ctx, 0, slowest_part(cluster.gpu, k), replace(EFFICIENCY, gemm_ceilings=(("bf16", 0.43),)))
    gemm = default.forward.gemm_s + default.backward.gemm_s
    assert (halved.forward.gemm_s + halved.backward.gemm_s) / gemm == pytest.approx(2.0, abs=0.005)
    assert halved.optimizer_s == default.optimizer_s and halved.forward.attention_s == default.forward.attention_s
    expected = 2 * (halved.forward.total_s + halved.backward.total_s) + halved.optimizer_s
    assert after == pytest.approx(expected, rel=1e-12)
    assert before == pytest.approx(2 * (default.forward.total_s + default.backward.total_s) + default.optimizer_s)
    # GEMMs share (embedding lookup, final norm and the optimizer step: not; 1.7310 before small9 charged
    # Megatron-Core's whole-gradient-buffer zeroing, kernels.grad_buffer_bytes)
    # 1.7271 -> 1.7282 (mend15f): the pace now slows the clock-bound GEMMs alone, not the norms or the optimizer
    assert after / before == pytest.approx(1.7282, abs=1e-3)


def test_batch_search_and_serve_take_the_constants(api):
    batch = ok(api.post("/v1/plan/batch", json={"requests": [PLAN, with_kernels(PLAN, HALF)]}))["results"]
    single = ok(api.post("/v1/plan", json=with_kernels(PLAN, HALF)))["step"]["time_s"]
    assert batch[1]["plan"]["step"]["time_s"] == single > batch[0]["plan"]["step"]["time_s"]

    search = {
        "model": {"preset": "llama3-8b", "seq_length": 2048, "num_layers": 8},
        "workload": {"kind": "training", "global_batch_size": 16},
        "cluster": {"preset": "dgx-a100", "num_nodes": 1},
        "constraints": {"framework": "megatron", "zero_stage": 1, "activation_recompute": "none", "tp": [1]},
        "top_k": 1,
    }
    plain = ok(api.post("/v1/search", json=search))["results"][0]
    slow = ok(api.post("/v1/search", json=with_kernels(search, HALF)))["results"][0]
    assert slow["step"]["compute_s"] > 1.5 * plain["step"]["compute_s"]
    # the search's estimate is /v1/plan's with the same constants
    request = {
        "model": search["model"],
        "workload": search["workload"] | {k: slow[k] for k in ("micro_batch_size", "activation_recompute")},
        "parallel": slow["parallel"],
        "cluster": with_kernels(search, HALF)["cluster"],
    }
    assert ok(api.post("/v1/plan", json=request))["step"]["time_s"] == slow["step"]["time_s"]

    serve = {
        "model": {"preset": "llama3-8b"},
        "cluster": {"preset": "dgx-a100", "num_nodes": 1},
        "engine": "vllm",
        "traffic": {"input_tokens": 2000, "output_tokens": 100, "concurrency": 16},
        "deployment": {"pools": [{"role": "both", "workers": 1, "tp": 8}]},
    }
    fast, slow = (ok(api.post("/v1/serve", json=b)) for b in (serve, with_kernels(serve, HALF)))
    assert slow["ttft_s"] > 1.3 * fast["ttft_s"] and slow["tpot_s"] >= fast["tpot_s"]


@pytest.mark.parametrize(
    ("kernels", "loc", "words"),
    [
        ({"hbm": 1.5}, "hbm", "less than or equal to 1"),
        ({"hbm": 0.01}, "hbm", "greater than or equal to 0.05"),
        ({"gemm_fixed_s": -1e-6}, "gemm_fixed_s", "greater than or equal to 0"),
        ({"kernel_s": 0.01}, "kernel_s", "less than or equal to 0.001"),
        ({"gemm_ceiling": {"bf16": 1.2}}, "gemm_ceiling.bf16", "less than or equal to 1"),
        ({"gemm_ceiling": {"int4": 0.5}}, "gemm_ceiling.int4", "unknown GEMM dtype; known: bf16, fp16, fp32"),
        ({"moe_skew": 0.5}, "moe_skew", "Extra inputs are not permitted"),
    ],
)
def test_out_of_range_constants_are_422s_naming_the_field(api, kernels, loc, words):
    r = api.post("/v1/plan", json=with_kernels(PLAN, kernels))
    assert r.status_code == 422, r.text
    (err,) = r.json()["detail"]
    assert ".".join(map(str, err["loc"][1:])) == f"cluster.calibration.kernels.{loc}" and words in err["msg"]


def test_a_cluster_without_a_gpu_is_named(api):
    body = with_kernels(PLAN, {"hbm": 0.7})
    body["cluster"] = {"num_nodes": 1, "devices_per_node": 8, "calibration": body["cluster"]["calibration"]}
    r = api.post("/v1/plan", json=body)
    assert r.status_code == 422, r.text
    err = r.json()["detail"][0]
    assert err["loc"][1:] == ["cluster", "calibration", "kernels"] and "no GPU spec" in err["msg"]


def test_serve_search_takes_the_constants(api):
    """A third of H100's bf16 GEMM ceiling: the best deployment serves fewer tokens per GPU, and each answer's
    request keeps the constants."""
    body = {
        "model": {"preset": "llama3-8b"},
        "cluster": {"preset": "dgx-h100", "num_nodes": 1},
        "traffic": {"input_tokens": 2000, "output_tokens": 200, "concurrency": 32},
        "engines": ["vllm"],
        "sla": {"ttft_s": 10.0, "tpot_s": 1.0},
        "top_k": 1,
    }
    slow_kernels = {"gemm_ceiling": {"bf16": 0.28}}
    fast, slow = (
        ok(api.post("/v1/serve/search", json=b))["results"][0] for b in (body, with_kernels(body, slow_kernels))
    )
    per_gpu = "output_tokens_per_s_per_gpu"
    assert slow["answer"]["throughput"][per_gpu] < fast["answer"]["throughput"][per_gpu]
    assert slow["request"]["cluster"]["calibration"] == {"kernels": slow_kernels}
