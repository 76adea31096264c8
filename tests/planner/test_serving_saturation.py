"""A request rate above what a deployment serves (mend13c; user13's "left alone": the plan answered the asked rate as
its throughput, with only a warning). The served rate is the deployment's capacity, the mean-value bound of
deployment._closed_loop; the plan says ``saturated``, TTFT is None, the tokens/s are the served rate's. Below capacity
nothing changes (the same numbers as before: docs/serving.md "Saturation and the search's sizes (mend13c)")."""

from __future__ import annotations

import pytest

from collectives.topology import cluster_preset
from planner import MODEL_PRESETS
from planner.serving import Pool, ServeOptions, Traffic, engine, plan_serving
from planner.serving.search import SLA

LLAMA70B, DSV3 = MODEL_PRESETS["llama3-70b"], MODEL_PRESETS["deepseek-v3"]
ISL, OSL = 1000, 200


def _aggregated(rate: float, workers: int = 2):
    cluster = cluster_preset("dgx-h100", 2)
    return plan_serving(LLAMA70B, cluster, engine("vllm"), Traffic(ISL, OSL, request_rate=rate),
                        (Pool(tp=8, workers=workers),))  # fmt: skip


def test_aggregated_at_twice_its_capacity_serves_its_capacity():
    """Llama-3 70B on 2 x TP8 (vLLM): the capacity is the closed loop's rate with each worker's KV cache full, the
    root of N = R (a + k / (1 - R s)) with N = max_conc, a = t_p + t_d / 2, k = OSL t_d, s = t_p / n (n prompts a
    pass: vLLM's 8,192-token budget over 1,000-token prompts). Asked twice that, the plan serves it exactly."""
    probe = _aggregated(1000.0)
    assert probe.saturated and probe.ttft_s is None
    capacity = probe.request_rate
    assert 0 < capacity < 1000.0
    over = _aggregated(2 * capacity)
    (pool,) = over.pools
    assert over.saturated and over.ttft_s is None
    assert over.request_rate == pytest.approx(capacity, rel=1e-12)  # served, not asked
    n = engine("vllm").max_batch_tokens // ISL
    t_p, t_d, held = pool.prefill_s, pool.step_s, over.kv_cache.max_concurrency
    assert pool.batch == held  # the queue never empties: every worker holds all its KV cache takes
    r_w, s = capacity / 2, t_p / n
    assert held == pytest.approx(r_w * (t_p + t_d / 2 + OSL * t_d / (1 - r_w * s)), rel=1e-9)  # Little's law, exact
    assert over.tpot_s == pytest.approx(t_d / (1 - r_w * s), rel=1e-12)
    assert over.output_tokens_per_s == pytest.approx(capacity * OSL, rel=1e-12)
    assert over.output_tokens_per_s_per_gpu == pytest.approx(capacity * OSL / 16, rel=1e-12)
    assert over.input_tokens_per_s == pytest.approx(capacity * ISL, rel=1e-12)
    assert any(w.startswith("saturated: ") and "requests/s are more than the deployment serves" in w
               for w in over.warnings)  # fmt: skip


def test_saturated_open_loop_is_the_closed_loop_past_the_kv_cache():
    """One home: an open loop past capacity serves what the closed loop serves at a concurrency past the KV cache
    (both hold max_conc requests a worker in _closed_loop's bound)."""
    over = _aggregated(1000.0)
    cluster = cluster_preset("dgx-h100", 2)
    closed = plan_serving(LLAMA70B, cluster, engine("vllm"), Traffic(ISL, OSL, concurrency=100_000),
                          (Pool(tp=8, workers=2),))  # fmt: skip
    assert closed.pools[0].batch == over.pools[0].batch == over.kv_cache.max_concurrency
    assert over.request_rate == pytest.approx(closed.request_rate, rel=1e-12)
    assert over.tpot_s == pytest.approx(closed.tpot_s, rel=1e-12)
    assert not closed.saturated  # a closed loop's queue is bounded


def test_below_capacity_the_asked_rate_is_served():
    capacity = _aggregated(1000.0).request_rate
    for fraction in (0.25, 0.5, 0.9):
        plan = _aggregated(capacity * fraction)
        assert not plan.saturated and plan.ttft_s is not None
        assert plan.request_rate == capacity * fraction
        assert not any(w.startswith("saturated") for w in plan.warnings)


def test_prefill_share_over_one_serves_the_capacity_too():
    """8,000-token prompts at 500 requests/s need far more than a worker's time for prefill alone: served is the
    capacity, below 1 / s, and the warning says the share."""
    cluster = cluster_preset("dgx-h100", 1)
    plan = plan_serving(LLAMA70B, cluster, engine("vllm"), Traffic(8000, 10, request_rate=500.0), (Pool(tp=8),))
    (pool,) = plan.pools
    s = pool.prefill_s / max(1, engine("vllm").max_batch_tokens // 8000)
    assert plan.saturated and plan.request_rate < 1 / s
    assert any("prefill alone needs" in w for w in plan.warnings)
    assert plan.bottleneck == "prefill"  # its prefill takes over half the worker's time at the served rate


DSV3_ISL, DSV3_OSL = 2000, 100


def _dsv3(rate: float, decode: Pool | None = None, osl: int = DSV3_OSL):
    """examples/serve-deepseek-v3-disagg.json's deployment (SGLang, 1 x DP32 prefill, 1 x DP64 decode) at a rate."""
    pools = (
        Pool("prefill", workers=1, dp=32, ep=32, attention_dp=True),
        decode or Pool("decode", workers=1, dp=64, ep=64, attention_dp=True),
    )
    return plan_serving(DSV3, cluster_preset("dgx-h100", 12), engine("sglang"),
                        Traffic(DSV3_ISL, osl, request_rate=rate), pools,
                        ServeOptions(weight_dtype="fp8", kv_dtype="bf16"))  # fmt: skip


def test_disaggregated_prefill_bound_serves_the_prefill_pools_rate():
    """Past the prefill pool's R_p = workers n dp / t_p the plan serves R_p (closed form from its own pool fields),
    the decode pool fed at that rate; twice R_p asked, the same served."""
    over = _dsv3(1000.0)
    pre, dec = over.pools
    r_p = pre.pool.workers * pre.batch / pre.step_s
    assert over.saturated and over.ttft_s is None and over.bottleneck == "prefill"
    assert over.request_rate == pytest.approx(r_p, rel=1e-12)
    twice = _dsv3(2 * r_p)
    assert twice.saturated and twice.request_rate == pytest.approx(r_p, rel=1e-12)
    assert over.output_tokens_per_s == pytest.approx(r_p * DSV3_OSL, rel=1e-12) == dec.output_tokens_per_s
    assert over.output_tokens_per_s_per_gpu == pytest.approx(r_p * DSV3_OSL / 96, rel=1e-12)
    # the decode pool holds what it is fed (Little's law on its side, rounded up), within its KV cache
    assert r_p * DSV3_OSL * over.tpot_s / dec.pool.workers <= dec.batch <= over.kv_cache.max_concurrency
    below = _dsv3(0.5 * r_p)
    assert not below.saturated and below.request_rate == 0.5 * r_p and below.ttft_s is not None


def test_disaggregated_decode_bound_serves_the_kv_caches_population():
    """A decode pool of one 16-GPU worker behind the 32-GPU prefill pool, 2,000-token outputs: its KV cache binds.
    The served rate is _closed_loop's bound over the decode pool's KV population, N = workers max_conc held from the
    prefill through the transfer to the last token: R = N / (t_p + transfer + OSL TPOT), at that batch."""
    small = Pool("decode", workers=1, dp=16, ep=16, attention_dp=True)
    over = _dsv3(1000.0, small, 2000)
    pre, dec = over.pools
    n = over.kv_cache.max_concurrency
    assert over.saturated and over.ttft_s is None and over.bottleneck == "decode"
    assert dec.batch == n
    expect = n / (pre.step_s + over.kv_transfer.time_s + 2000 * over.tpot_s)
    assert over.request_rate == pytest.approx(expect, rel=1e-12)
    assert over.request_rate < pre.pool.workers * pre.batch / pre.step_s  # below the prefill pool's R_p
    assert _dsv3(2 * expect, small, 2000).request_rate == pytest.approx(expect, rel=1e-12)


def test_a_saturated_deployment_meets_no_sla():
    over = _aggregated(1000.0)
    assert over.tpot_s < 10.0
    assert not SLA(tpot_s=10.0).met(over)  # a TPOT it keeps, but a queue without bound
    assert not SLA().met(over)
    assert SLA(tpot_s=10.0).met(_aggregated(0.1))


@pytest.mark.parametrize("decode_dp, osl", [(64, DSV3_OSL), (16, 2000)])
def test_the_cost_guard_bounds_the_steps_a_saturated_plan_makes(decode_dp, osl):
    """worker_inputs' ``plans`` (what the cost guard multiplies each pool's step estimate by) bounds the distinct step
    plans a saturated deployment makes: the Little's-law iterations and the two decode steps at capacity
    (SATURATED_STEPS), prefill- and decode-bound."""
    from planner.serving.deployment import _step, worker_inputs

    decode = Pool("decode", workers=1, dp=decode_dp, ep=decode_dp, attention_dp=True)
    pools = (Pool("prefill", workers=1, dp=32, ep=32, attention_dp=True), decode)
    traffic = Traffic(DSV3_ISL, osl, request_rate=1000.0)
    options = ServeOptions(weight_dtype="fp8", kv_dtype="bf16")
    cluster = cluster_preset("dgx-h100", 12)
    bound = sum(plans for *_, plans in worker_inputs(DSV3, cluster, engine("sglang"), traffic, pools, options))
    _step.cache_clear()
    plan = plan_serving(DSV3, cluster, engine("sglang"), traffic, pools, options)
    assert plan.saturated
    assert 3 <= _step.cache_info().misses <= bound
