"""The serving planner (planner/serving): KV bytes and capacity by hand, the queueing model's invariants,
the KV transfer on the graph, and the layout rules named at the pool's fields."""

from __future__ import annotations

import itertools
import math

import pytest

from collectives.topology import cluster_preset
from planner import MODEL_PRESETS, SpecError
from planner.serving import MTP, Pool, ServeOptions, Traffic, engine, plan_serving

LLAMA8B, LLAMA70B, DSV3 = (MODEL_PRESETS[n] for n in ("llama3-8b", "llama3-70b", "deepseek-v3"))


def test_kv_bytes_per_token_by_hand():
    # Llama-3 70B: 80 layers x K and V x 8 kv heads x 128 x 2 bytes (docs/serving.md); DeepSeek-V3's MLA latent:
    # 61 layers x (512 + 64) x 2 bytes
    assert LLAMA70B.num_layers * LLAMA70B.kv_token_bytes(1, 2) == 80 * 2 * 8 * 128 * 2 == 327_680
    assert DSV3.num_layers * DSV3.kv_token_bytes(1, 2) == 61 * 576 * 2 == 70_272
    # past kv_heads ranks each keeps one replicated head (vLLM): tp 16 on 8 kv heads stores 1 head per rank
    assert LLAMA70B.kv_token_bytes(16, 2) == LLAMA70B.kv_token_bytes(8, 2) == 2 * 1 * 128 * 2
    # MLA's latent is whole on every tensor-parallel rank
    assert DSV3.kv_token_bytes(8, 1) == DSV3.kv_token_bytes(1, 1) == 576


def test_kv_capacity_by_hand():
    """Llama-3 8B on one H100 with vLLM: 0.9 x 80 GB, less 16.06 GB of bf16 weights and a few GB of activations
    and buffers, over 32 x 2 x 8 x 128 x 2 = 131,072 bytes per token."""
    cluster = cluster_preset("dgx-h100", 1)
    out = plan_serving(LLAMA8B, cluster, engine("vllm"), Traffic(1000, 1000, concurrency=8), (Pool(tp=1),))
    budget = 0.9 * cluster.gpu.hbm_bytes
    weights = LLAMA8B.total_params() * 2
    per_token = 32 * 2 * 8 * 128 * 2
    assert (budget - weights - 4e9) / per_token < out.kv_cache.capacity_tokens < (budget - weights) / per_token
    assert out.kv_cache.max_concurrency == out.kv_cache.capacity_tokens // 2000
    traffic = Traffic(1000, 1000, concurrency=8)
    fp8 = plan_serving(LLAMA8B, cluster, engine("vllm"), traffic, (Pool(tp=1),), ServeOptions(kv_dtype="fp8"))
    assert fp8.kv_cache.bytes_per_token * 2 == out.kv_cache.bytes_per_token
    assert 1.99 < fp8.kv_cache.capacity_tokens / out.kv_cache.capacity_tokens < 2.01


def test_trtllm_kv_fraction_is_of_the_free_memory():
    """TensorRT-LLM (_torch/pyexecutor/_util.py KvCacheCreator._cal_max_memory): KV = free_gpu_memory_fraction 0.9
    x (HBM - the profiling run's peak: weights, activations, buffers); vLLM's 0.9 is of the whole HBM, so its KV
    is F = 0.9 HBM - peak. By hand, the same worker's TensorRT-LLM KV memory is 0.9 (HBM - peak) = 0.9 (F + 0.1 HBM)
    (the two engines' peaks agree within 1%: the same weights, both prefill 8,192 tokens a pass)."""
    cluster = cluster_preset("dgx-h100", 1)
    traffic = Traffic(1000, 1000, concurrency=8)
    vllm = plan_serving(LLAMA8B, cluster, engine("vllm"), traffic, (Pool(tp=1),))
    trt = plan_serving(LLAMA8B, cluster, engine("trtllm"), traffic, (Pool(tp=1),))
    assert trt.kv_cache.bytes_per_token == vllm.kv_cache.bytes_per_token == 32 * 2 * 8 * 128 * 2
    per_token, hbm = vllm.kv_cache.bytes_per_token, cluster.gpu.hbm_bytes
    free_vllm = vllm.kv_cache.capacity_tokens * per_token
    expected = 0.9 * (free_vllm + 0.1 * hbm)
    assert trt.kv_cache.capacity_tokens * per_token == pytest.approx(expected, rel=0.01)


def test_mtp_tokens_per_step():
    # draft i is kept only if 1..i are: 1 + p + p^2 (Leviathan et al. 2023); a mean given as such is kept
    assert MTP(2, 0.8).tokens_per_step == pytest.approx(1 + 0.8 + 0.64)
    assert MTP(1, mean_tokens=1.8).tokens_per_step == 1.8
    # a rate of 1 is every draft kept, 1 + n tokens, and the rate's sum is continuous there (review r13b #1: 1.0 read
    # as one token a step priced TPOT at 54.0 ms against 26.1 ms at 0.999)
    assert MTP(3, 1.0).tokens_per_step == 4 and MTP(1, 1.0).tokens_per_step == 2
    assert MTP(3, 0.999999).tokens_per_step == pytest.approx(4, rel=1e-5)


def test_aggregated_littles_law_and_throughput():
    cluster = cluster_preset("dgx-h100", 2)
    traffic = Traffic(1000, 200, concurrency=64)
    out = plan_serving(LLAMA70B, cluster, engine("vllm"), traffic, (Pool(workers=2, tp=8),))
    assert out.gpus == 16 and out.fits and out.kv_transfer is None
    # closed loop: every request is in prefill or decode, C = R (TTFT + OSL TPOT) (Little 1961)
    assert out.request_rate * (out.ttft_s + 200 * out.tpot_s) == pytest.approx(64, rel=1e-3)
    assert out.output_tokens_per_s == pytest.approx(out.request_rate * 200)
    assert out.output_tokens_per_s_per_gpu == pytest.approx(out.output_tokens_per_s / 16)
    assert out.tokens_per_s_per_user == pytest.approx(1 / out.tpot_s)
    (pool,) = out.pools
    assert pool.batch == 32  # 64 requests over 2 workers
    # prefill work steals time from decode: the time between tokens exceeds the bare decode step
    assert out.tpot_s > pool.step_s
    assert {c.call.parallelism for c in pool.calls} == {"tp"}


def test_aggregated_offline_load_is_bounded_by_prefill_and_queues():
    """An offline run (3,000 requests at once, far beyond the KV cache) of 2,048-token prompts and 128-token
    answers: the worker's time goes mostly to prefill, and it can serve no more than one prompt's share of the
    prefill pass per request (rate < max prompts per pass / pass time). Little's law holds over the requests it
    holds (b = R (TTFT_held + OSL TPOT)); the requests beyond them wait in the queue, C - b = R x their wait, which
    the TTFT adds. (The fixed-point iteration this replaces answered 3.4 x the prefill bound for 405B on 8 H200.)"""
    traffic = Traffic(2048, 128, concurrency=3000)
    out = plan_serving(LLAMA70B, cluster_preset("dgx-h100", 1), engine("trtllm"), traffic, (Pool(tp=8),),
                       ServeOptions(weight_dtype="fp8", kv_dtype="fp8"))  # fmt: skip
    (pool,) = out.pools
    n_pre = 8192 // 2048  # TensorRT-LLM's max_num_tokens 8192: four prompts a pass
    assert out.request_rate < n_pre / pool.prefill_s
    assert out.request_rate > 0.5 * n_pre / pool.prefill_s  # prefill-bound: most of the time is prefill
    assert pool.batch < 3000 and pool.batch == out.kv_cache.max_concurrency
    queued = (3000 - pool.batch) / out.request_rate
    held = out.ttft_s - queued
    assert out.request_rate * (held + 128 * out.tpot_s) == pytest.approx(pool.batch, rel=1e-6)
    assert queued > 10 * held > 0


def test_aggregated_closed_loop_is_the_disaggregated_ones_model_by_hand():
    """One closed-loop model for both modes (deployment._closed_loop, mean-value analysis bounds): a worker holding
    all of its N = C / W requests (no queue) serves R with N = R (a + k / (1 - R s)), a = t_p + t_d / 2, k = OSL
    t_d, s = t_p / n: the root of a s R^2 - (a + k + N s) R + N = 0 below 1 / s; TTFT = a exactly (no wait: the
    M/D/1 wait of an open queue was added here before: TTFT 0.397 s for a 0.333 s pass, now 0.340 s, and R 6.08 ->
    6.11 requests/s), and the load
    binds ("concurrency"). Disaggregated, s = 0: R = C / (t_p + transfer + OSL TPOT) below the pools' rates."""
    import math

    from planner.serving.deployment import _closed_loop

    cluster = cluster_preset("dgx-h100", 1)
    out = plan_serving(LLAMA70B, cluster, engine("vllm"), Traffic(1000, 500, concurrency=64), (Pool(tp=8),))
    (pool,) = out.pools
    n_pre = max(1, 8192 // 1000)  # vLLM's max_num_batched_tokens 8,192 (as _prefill takes it): eight prompts a pass
    t_p, t_d = pool.prefill_s, pool.step_s
    a, k, s, n = t_p + t_d / 2, 500 * t_d, t_p / n_pre, 64
    b = a + k + n * s
    rate = (b - math.sqrt(b * b - 4 * a * s * n)) / (2 * a * s)
    assert pool.batch == 64 and out.request_rate == pytest.approx(rate, rel=1e-9)
    assert out.ttft_s == pytest.approx(a, rel=1e-9)
    assert out.tpot_s == pytest.approx(t_d / (1 - rate * s), rel=1e-9)
    assert out.request_rate * (out.ttft_s + 500 * out.tpot_s) == pytest.approx(64, rel=1e-9)
    assert out.bottleneck == "concurrency"
    assert _closed_loop(10, 0.5, 1.5, 0.0, math.inf) == 10 / 2.0 and _closed_loop(10, 0.5, 1.5, 0.0, 3.0) == 3.0


def test_the_bottleneck_says_what_binds():
    """prefill when prefill takes most of an aggregated worker's time (2,048-token prompts, 128-token answers, 3,000
    at once); decode when the KV cache's batch binds (128/2,048); concurrency when the KV cache holds every request
    and the worker has time left (before: "decode" or "prefill", never the load)."""
    node, opts = cluster_preset("dgx-h100", 1), ServeOptions(weight_dtype="fp8", kv_dtype="fp8")

    def bound(isl, osl, c):
        return plan_serving(LLAMA70B, node, engine("trtllm"), Traffic(isl, osl, concurrency=c), (Pool(tp=8),), opts)

    assert bound(2048, 128, 3000).bottleneck == "prefill"
    offline = bound(128, 2048, 3000)
    assert offline.bottleneck == "decode" and offline.pools[0].batch == offline.kv_cache.max_concurrency
    light = bound(1000, 500, 4)
    assert light.bottleneck == "concurrency" and light.pools[0].batch == 4 < light.kv_cache.max_concurrency


def test_more_concurrency_more_throughput_slower_users():
    cluster = cluster_preset("dgx-h100", 1)
    run = lambda c: plan_serving(LLAMA70B, cluster, engine("vllm"), Traffic(1000, 500, concurrency=c), (Pool(tp=8),))  # noqa: E731
    low, high = run(4), run(64)
    assert high.output_tokens_per_s > 4 * low.output_tokens_per_s
    assert high.tokens_per_s_per_user < low.tokens_per_s_per_user


def test_request_rate_sets_the_batch_by_littles_law():
    cluster = cluster_preset("dgx-h100", 1)
    out = plan_serving(LLAMA70B, cluster, engine("vllm"), Traffic(500, 200, request_rate=2.0), (Pool(tp=8),))
    (pool,) = out.pools
    assert out.request_rate == 2.0
    # b = R (TTFT + OSL TPOT), within one sequence of rounding up
    assert pool.batch == pytest.approx(2.0 * (pool.prefill_s + 200 * pool.step_s), abs=1.5)
    over = plan_serving(LLAMA70B, cluster, engine("vllm"), Traffic(8000, 10, request_rate=500.0), (Pool(tp=8),))
    assert over.ttft_s is None and any("saturated" in w for w in over.warnings)


def test_disaggregated_kv_transfer_on_the_graph():
    cluster = cluster_preset("dgx-h100", 12)
    pools = (
        Pool("prefill", dp=32, ep=32, attention_dp=True),
        Pool("decode", dp=64, ep=64, attention_dp=True),
    )
    out = plan_serving(DSV3, cluster, engine("sglang"), Traffic(2000, 100, concurrency=2048), pools,
                       ServeOptions(weight_dtype="fp8", kv_dtype="bf16"))  # fmt: skip
    kv = out.kv_transfer
    assert out.gpus == 96
    assert kv.bytes_per_request == 2000 * 70_272
    # attention-DP with MLA: one rank holds a request's KV; it leaves through one 400G NIC (50 GB/s)
    assert kv.senders == 1
    assert kv.time_s >= kv.bytes_per_request / 50e9
    assert "nic" in kv.bottleneck
    assert [p.role for p in out.pools] == ["prefill", "decode"]
    assert out.pools[0].output_tokens_per_s == 0 and out.pools[1].input_tokens_per_s == 0


def test_kv_transfer_is_priced_once_per_split():
    """The KV transfer is keyed by what it depends on (deployment.kv_transfer): the same pools at another load, or
    planned for another engine (whose token dispatcher differs), get the very same priced transfer; another KV dtype
    gets its own, with half the bytes at fp8."""
    cluster = cluster_preset("dgx-h100", 12)
    pools = (Pool("prefill", dp=32, ep=32, attention_dp=True), Pool("decode", dp=64, ep=64, attention_dp=True))
    options = ServeOptions(weight_dtype="fp8", kv_dtype="bf16")
    plans = [plan_serving(DSV3, cluster, engine(name), Traffic(2000, 100, concurrency=c), pools, options)
             for name, c in (("sglang", 2048), ("sglang", 512), ("vllm", 2048))]  # fmt: skip
    assert plans[0].kv_transfer is plans[1].kv_transfer is plans[2].kv_transfer
    fp8 = plan_serving(DSV3, cluster, engine("sglang"), Traffic(2000, 100, concurrency=2048), pools,
                       ServeOptions(weight_dtype="fp8", kv_dtype="fp8"))  # fmt: skip
    assert fp8.kv_transfer.bytes_per_request * 2 == plans[0].kv_transfer.bytes_per_request


def test_disaggregated_ttft_grows_with_concurrency_and_a_lone_prompt_is_one_pass():
    """user5's pass: the prefill pool's pass held 128 prompts (its token budget) even at concurrency 1, so one
    2,000-token prompt waited 3.2 s, and TTFT went 10.7 s at 128, 3.2 s at 256, 8.9 s at 512 (the open-queue
    wait dropped at rho = 1). A closed loop holds C = R (TTFT + OSL TPOT) (Little's law) with R at most C over an
    unqueued request's time and at most the pools' rates: TTFT never falls as C grows, and a pass never holds
    more prompts than a worker can have waiting, ceil(C / W), one per attention rank at least."""
    cluster = cluster_preset("dgx-h100", 12)
    pools = (
        Pool("prefill", dp=32, ep=32, attention_dp=True),
        Pool("decode", dp=64, ep=64, attention_dp=True),
    )
    options = ServeOptions(weight_dtype="fp8", kv_dtype="bf16")
    runs = {c: plan_serving(DSV3, cluster, engine("sglang"), Traffic(2000, 100, concurrency=c), pools, options)
            for c in (1, 64, 128, 256, 512, 2048)}  # fmt: skip
    ttfts = [runs[c].ttft_s for c in sorted(runs)]
    # never falls (values equal in exact arithmetic may differ in the last bit of a float sum)
    assert all(b >= a * (1 - 1e-12) for a, b in itertools.pairwise(ttfts)), ttfts
    assert runs[1].pools[0].batch == 32  # one prompt per attention rank: the ranks step together
    assert runs[64].pools[0].batch == 64 and runs[512].pools[0].batch == 128  # then the token budget: 8,192 / 2,000
    assert runs[1].ttft_s == pytest.approx(runs[1].pools[0].step_s + runs[1].kv_transfer.time_s)
    assert runs[1].ttft_s < runs[512].pools[0].step_s / 2  # a lone prompt's pass, not a full one
    for c, out in runs.items():  # Little's law over the closed loop
        assert out.request_rate * (out.ttft_s + 100 * out.tpot_s) == pytest.approx(c, rel=1e-6)


def test_disaggregated_inside_one_node_moves_kv_over_nvlink():
    cluster = cluster_preset("dgx-h100", 1)
    pools = (Pool("prefill", workers=2, tp=2), Pool("decode", workers=1, tp=4))
    out = plan_serving(LLAMA8B, cluster, engine("vllm"), Traffic(4000, 200, concurrency=16), pools)
    kv = out.kv_transfer
    assert kv.bytes_per_request == 4000 * 32 * 2 * 8 * 128 * 2
    assert kv.senders == 2  # each TP rank of a prefill worker sends its 4 kv heads
    assert "nvlink" in kv.bottleneck.lower() or "gpu" in kv.bottleneck.lower()
    assert kv.time_s < kv.bytes_per_request / 50e9  # faster than any NIC


@pytest.mark.parametrize(
    ("model", "pools", "field", "words"),
    [
        (LLAMA70B, (Pool(tp=3),), "deployment.pools.0", "must fill whole nodes"),
        (LLAMA70B, (Pool(tp=16, dp=1),), "deployment.pools", "the cluster has 8"),
        (DSV3, (Pool(dp=8, ep=3, attention_dp=True),), "deployment.pools.0.ep", "not divisible by ep 3"),
        (LLAMA70B, (Pool(ep=8, tp=8),), "deployment.pools.0.ep", "needs an MoE model"),
        (LLAMA70B, (Pool("prefill", tp=8), Pool("prefill", tp=8)), "deployment.pools", "one 'prefill' and one"),
        (LLAMA70B, (Pool(tp=8, ep_dispatch="flex"),), "deployment.pools.0.ep_dispatch", "runs agrs, alltoall"),
    ],
)
def test_bad_deployments_name_the_field(model, pools, field, words):
    with pytest.raises(SpecError) as err:
        plan_serving(model, cluster_preset("dgx-h100", 1), engine("vllm"), Traffic(100, 100, concurrency=1), pools)
    assert err.value.field == field and words in err.value.rule


def test_a_model_too_big_for_its_pool_is_an_answer_that_does_not_fit():
    out = plan_serving(
        MODEL_PRESETS["llama3-405b"], cluster_preset("dgx-h100", 1), engine("vllm"), Traffic(100, 100, concurrency=1),
        (Pool(tp=2),),
    )  # fmt: skip
    assert not out.fits and out.kv_cache.capacity_tokens == 0
    assert any("does not fit" in w for w in out.warnings)
    assert math.isfinite(out.tpot_s)


# ---- the SLA search ---------------------------------------------------------------------------------------


def test_sla_search_ranks_by_tokens_per_gpu_and_keeps_its_promises():
    from planner.serving.search import MODES, SLA, candidates, pareto_front, search_serving

    cluster = cluster_preset("dgx-h100", 2)
    traffic = Traffic(2000, 200, concurrency=128)
    sla = SLA(ttft_s=3.0, tpot_s=0.06)
    out = search_serving(LLAMA70B, cluster, traffic, ("vllm",), MODES, sla)
    assert out.results, out.why
    per_gpu = [c.per_gpu for c in out.results]
    assert per_gpu == sorted(per_gpu, reverse=True)
    for c in out.results:
        assert c.meets_sla and c.plan.ttft_s <= 3.0 and c.plan.tpot_s <= 0.06 and c.plan.fits
        assert c.plan.gpus <= 16
        # the search's numbers are plan_serving's own for the same deployment (one model, many callers)
        again = plan_serving(LLAMA70B, cluster, engine("vllm"), c.traffic, c.pools)
        assert again.output_tokens_per_s_per_gpu == c.per_gpu and again.tpot_s == c.plan.tpot_s
    # the front: no point beaten on both axes by any deployment tried
    front = pareto_front(out.pareto)
    assert front == out.pareto
    assert len(candidates(LLAMA70B, cluster, traffic, ("vllm",), MODES)) > len({c.pools for c in out.results})
    assert "bound by" in out.why


def test_sla_search_that_nothing_meets_says_so():
    from planner.serving.search import SLA, search_serving

    out = search_serving(
        LLAMA70B, cluster_preset("dgx-h100", 1), Traffic(2000, 200, concurrency=64), ("vllm",), ("aggregated",),
        SLA(tpot_s=0.001),
    )  # fmt: skip
    assert out.results == [] and "no deployment meets the SLA" in out.why and out.pareto


def test_fp8_serving_casts_activations_only_and_decodes_in_cuda_graphs():
    """An engine loads the fp8 checkpoint as its only copy: a decode step casts the activations (m x k of each
    GEMM) and never the weights, and adds no TE weight copies to memory; decode runs in CUDA graphs. The activations'
    quantize is the engine's one rowwise copy (kernels.input_quantize_bytes: per-tensor 3 B, block-scaled 3.03125 B;
    bwcast14, the GEMM ceilings being the GEMM alone); over bf16 weights the weights are cast too, at the recipe's
    bytes."""
    from planner import ParallelSpec, WorkloadSpec
    from planner.context import Context
    from planner.kernels import cast_bytes_per_element, input_quantize_bytes, layer_kernels
    from planner.params import recipe_weight_bytes

    gpu = cluster_preset("dgx-h100", 1).gpu
    par = ParallelSpec(tp=8)
    common = dict(kind="inference", phase="decode", batch_size=16, context_length=1024, fp8_recipe="tensorwise")
    served = Context(LLAMA70B, WorkloadSpec(param_dtype="fp8", cuda_graphs=True, **common), par, devices_per_node=8)
    gemms = [k for k in layer_kernels(served, False, gpu).forward if k.kind == "gemm" and k.dtype != "bf16"]
    (cast,) = [k for k in layer_kernels(served, False, gpu).forward if k.kind == "cast"]
    activations = sum(k.shape[0] * k.shape[2] * k.shape[3] for k in gemms)
    assert input_quantize_bytes("tensorwise") == 3
    assert cast.bytes == pytest.approx(activations * 3)
    assert recipe_weight_bytes(served, 0) == 0
    # the same recipe over bf16 weights (training's master weights) casts the weights every step too
    bf16 = Context(LLAMA70B, WorkloadSpec(param_dtype="bf16", **common), par, devices_per_node=8)
    (cast_bf16,) = [k for k in layer_kernels(bf16, False, gpu).forward if k.kind == "cast"]
    assert cast_bf16.bytes > 10 * cast.bytes
    block = {**common, "fp8_recipe": "blockwise"}
    served = Context(LLAMA70B, WorkloadSpec(param_dtype="fp8", cuda_graphs=True, **block), par, devices_per_node=8)
    (cast,) = [k for k in layer_kernels(served, False, gpu).forward if k.kind == "cast"]
    assert cast.bytes == pytest.approx(activations * (2 + 1 + 4 / 128))
    bf16 = Context(LLAMA70B, WorkloadSpec(param_dtype="bf16", **block), par, devices_per_node=8)
    (both,) = [k for k in layer_kernels(bf16, False, gpu).forward if k.kind == "cast"]
    weight_elements = sum(k.shape[1] * k.shape[2] * k.shape[3] for k in gemms)
    assert both.bytes == pytest.approx(weight_elements * cast_bytes_per_element(bf16) + cast.bytes)
    # the serving planner's decode step asks for CUDA graphs and the fp8 recipe; its prefill runs eager
    out = plan_serving(LLAMA70B, cluster_preset("dgx-h100", 1), engine("vllm"), Traffic(1000, 100, concurrency=16),
                       (Pool(tp=8),), ServeOptions(weight_dtype="fp8"))  # fmt: skip
    eager = plan_serving(LLAMA70B, cluster_preset("dgx-h100", 1), engine("vllm"), Traffic(1000, 100, concurrency=16),
                         (Pool(tp=8),), ServeOptions(weight_dtype="fp8", cuda_graphs=False))  # fmt: skip
    assert out.pools[0].step_s < eager.pools[0].step_s
    assert out.pools[0].prefill_s == eager.pools[0].prefill_s


def test_kv_capacity_counts_sliding_window_layers_as_memory_does():
    """gpt-oss-120b alternates 128-token sliding-window layers with full ones (18 each). A request of 3,000 +
    1,000 tokens keeps 18 x 4,000 + 18 x 128 = 74,304 layer-tokens of KV (memory.kv_cache_bytes, vLLM's
    sliding-window manager frees what left the window), not 36 x 4,000: the same memory holds 1.94x the tokens
    of the model with every layer full."""
    from dataclasses import replace

    oss = MODEL_PRESETS["gpt-oss-120b"]
    full = replace(oss, sliding_window=None, full_attention_interval=None)
    cluster = cluster_preset("dgx-h100", 1)
    pools, traffic = (Pool(workers=2, tp=4, ep=4),), Traffic(3000, 1000, concurrency=8)
    windowed, every = (plan_serving(m, cluster, engine("vllm"), traffic, pools).kv_cache for m in (oss, full))
    assert windowed.capacity_tokens / every.capacity_tokens == pytest.approx(36 * 4000 / 74_304, rel=1e-4)
    assert windowed.max_concurrency == windowed.capacity_tokens // 4000
