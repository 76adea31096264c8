"""Each serving engine's own MoE exchange with data-parallel attention (planner/rules/engine_gather.py), two-batch
overlap and EPLB's redundant experts (planner/serving/deployment.py): bytes by hand from the engines' sources."""

from __future__ import annotations

from dataclasses import replace

import pytest

from collectives.topology import cluster_preset
from planner import MODEL_PRESETS, ParallelSpec, SpecError, WorkloadSpec, build_plan
from planner.compute import layer_forward
from planner.plan import Options
from planner.serving import Pool, ServeOptions, Traffic, engine, plan_serving
from planner.serving.deployment import (
    _context,
    _overlapped,
    _step,
    _work,
    _worker,
    served_model,
    with_redundant_experts,
)
from planner.serving.overlap import COMM_SMS, SGLANG_DECODE, SGLANG_PREFILL, exchange_times, op_times, simulate
from planner.spread import paced_gpu

DSV3, LLAMA8B = MODEL_PRESETS["deepseek-v3"], MODEL_PRESETS["llama3-8b"]
H, E, K, MOE_LAYERS = 7168, 256, 8, 58  # DeepSeek-V3: hidden, routed experts, top-k, 61 - 3 dense layers
TWO_NODES = cluster_preset("dgx-h100", 2)


def _ep_rows(calls) -> dict:
    return {pc.call.name: pc for pc in calls if pc.call.parallelism == "ep"}


def _plan(dispatch: str, phase: str, tp: int = 1, dp: int = 16, batch: int = 256, fp8: bool = False):
    work = WorkloadSpec(kind="inference", phase=phase, batch_size=batch, context_length=1000,
                        moe_dispatch_dtype="fp8" if fp8 else None)  # fmt: skip
    par = ParallelSpec(tp=tp, dp=dp, ep=tp * dp, expert_tp=1, ep_dispatch=dispatch)
    return build_plan(DSV3, work, par, TWO_NODES, Options(timeline=False))


def test_vllm_gathers_hidden_states_and_router_logits():
    """AgRsAll2AllManager.dispatch_router_logits: one all_gatherv over the DP group of [hidden, router logits];
    combine: one reduce_scatterv of the hidden states. 256 sequences over 16 ranks: 16 tokens each."""
    rows = _ep_rows(_plan("agrs", "decode").calls)
    assert set(rows) == {"ep.agrs.gather", "ep.agrs.combine"}
    gather, combine = rows["ep.agrs.gather"], rows["ep.agrs.combine"]
    assert gather.call.message_bytes == 16 * 16 * (H + E) * 2 == 3_801_088
    assert combine.call.message_bytes == 16 * 16 * H * 2
    assert gather.call.calls_per_iteration == combine.call.calls_per_iteration == MOE_LAYERS
    assert gather.group_size == 16 and gather.call.op.value == "allgather" and combine.call.op.value == "reducescatter"


def test_sglang_dp_attention_gather_chooses_max_len_in_decode_and_sum_len_in_prefill():
    """dp_attention.py: an extend batch over several ranks takes SUM_LEN (all-reduce of the summed buffer, then
    the all-reduce + dp_scatter after the experts); decode takes MAX_LEN (all_gather_into_tensor, then
    reduce_scatter_tensor)."""
    decode = _ep_rows(_plan("dp_gather", "decode").calls)
    assert {n: pc.call.op.value for n, pc in decode.items()} == {
        "ep.dp_gather.max_len": "allgather", "ep.dp_scatter.max_len": "reducescatter",
    }  # fmt: skip
    assert decode["ep.dp_gather.max_len"].call.message_bytes == 16 * 16 * H * 2
    prefill = _ep_rows(_plan("dp_gather", "prefill", batch=16).calls)  # one 1,000-token prompt per rank
    assert {n: pc.call.op.value for n, pc in prefill.items()} == {
        "ep.dp_gather.sum_len": "allreduce", "ep.dp_scatter.sum_len": "allreduce",
    }  # fmt: skip
    assert prefill["ep.dp_gather.sum_len"].call.message_bytes == 16 * 1000 * H * 2
    assert prefill["ep.dp_gather.sum_len"].group_size == 16


def test_sglang_attention_tp_scatters_before_the_gather():
    """Attention TP 2 inside 8 DP ranks (SGLang --tp-size 16 --dp-size 8): _dp_gather_via_all_gather first
    reduce-scatters the rank's tokens over attention TP, then all-gathers over the whole TP group; the scatter
    runs the mirror (dp_reduce_scatter_tensor)."""
    rows = _ep_rows(_plan("dp_gather", "decode", tp=2, dp=8).calls)
    local = 256 // 8 * H * 2  # 32 sequences per attention rank, replicated over its 2 TP ranks
    assert rows["ep.dp_gather.attn_tp_scatter"].call.message_bytes == local
    assert rows["ep.dp_gather.attn_tp_scatter"].group_size == 2
    assert (
        rows["ep.dp_gather.max_len"].call.message_bytes == 8 * local and rows["ep.dp_gather.max_len"].group_size == 16
    )
    assert rows["ep.dp_scatter.attn_tp_gather"].call.op.value == "allgather"


def test_trtllm_all_gather_is_post_quant():
    """AllGatherReduceScatter.dispatch: [fp8 hidden, one fp32 scale per 128, top-k slot ids int32, top-k
    weights fp32] in one all-gather; combine a bf16 reduce-scatter."""
    rows = _ep_rows(_plan("agrs_quant", "decode", fp8=True).calls)
    assert rows["ep.agrs.gather"].call.message_bytes == 256 * (H + H // 128 * 4 + K * 8) == 256 * 7456
    assert rows["ep.agrs.combine"].call.message_bytes == 256 * H * 2


@pytest.mark.parametrize("name", ["vllm", "sglang", "trtllm"])
def test_tensor_parallel_attention_issues_no_moe_collective(name):
    """dp 1: every EP rank holds every token; the experts' output is summed by the TP all-reduce (vLLM all2all
    kernels need dp > 1; TensorRT-LLM's factory returns None; SGLang gathers only with DP attention). TensorRT-LLM
    refuses a dispatcher asked for there (EngineTraits.moe_exchange_needs_attention_dp, review r15a #6)."""
    for dispatch in (None, "deepep"):
        pool = (Pool(workers=2, tp=8, ep=8, ep_dispatch=dispatch),)
        if dispatch and engine(name).moe_exchange_needs_attention_dp:
            with pytest.raises(SpecError, match="no MoE exchange without attention DP") as err:
                plan_serving(DSV3, TWO_NODES, engine(name), Traffic(1000, 100, concurrency=8), pool,
                             ServeOptions(weight_dtype="fp8"))  # fmt: skip
            assert err.value.field == "deployment.pools.0.ep_dispatch"
            continue
        out = plan_serving(DSV3, TWO_NODES, engine(name), Traffic(1000, 100, concurrency=8), pool,
                           ServeOptions(weight_dtype="fp8"))  # fmt: skip
        for calls in (out.pools[0].calls, out.pools[0].prefill_calls):
            assert not [pc for pc in calls if pc.call.parallelism == "ep"]
            assert any(pc.call.name == "tp.mlp.down_proj" for pc in calls)


def test_engines_default_exchanges():
    pool = (Pool(dp=16, ep=16, attention_dp=True),)
    names = {}
    for name in ("vllm", "sglang", "trtllm"):
        out = plan_serving(DSV3, TWO_NODES, engine(name), Traffic(1000, 100, concurrency=256), pool,
                           ServeOptions(weight_dtype="fp8"))  # fmt: skip
        names[name] = {pc.call.name for pc in out.pools[0].calls if pc.call.parallelism == "ep"}
    assert names["vllm"] == {"ep.agrs.gather", "ep.agrs.combine"}
    assert names["sglang"] == {"ep.dp_gather.max_len", "ep.dp_scatter.max_len"}
    assert {"ep.dispatch", "ep.combine"} <= names["trtllm"]


def test_engine_exchanges_are_inference_only():
    work = WorkloadSpec(kind="training", micro_batch_size=1, global_batch_size=16)
    for dispatch in ("agrs", "dp_gather", "agrs_quant", "replicated"):
        with pytest.raises(SpecError) as err:
            build_plan(DSV3, work, ParallelSpec(dp=16, ep=16, ep_dispatch=dispatch), TWO_NODES)
        assert err.value.field == "parallel.ep_dispatch" and "inference only" in err.value.rule


def test_two_batch_overlap_prefill_schedule_by_hand():
    """SGLang's prefill strategy (delta 0; yields after dispatch_a and combine_a), one layer, by hand: attention
    1 + 2, shared 1, experts 3; dispatch 2, combine 4 per half. A0 ends at 3 and launches its dispatch (net 3-5);
    B0 ends at 6 (dispatch 6-8); A1 waits to 5 < 6, experts to 9, combine 9-13; B1 experts 9-12, combine 13-17;
    A2 shared to 13, waits 13; B2 shared to 14, waits to 17. Compute alone is 14, in series 26."""
    ops = {"attn_prepare": 1.0, "attn_core": 2.0, "gate": 0.0, "shared": 1.0, "experts": 3.0, "output": 0.0}
    assert simulate(SGLANG_PREFILL, 1, ops, {"dispatch": 2.0, "combine": 4.0}) == 17.0
    assert simulate(SGLANG_PREFILL, 5, ops, {"dispatch": 0.0, "combine": 0.0}) == 5 * 14.0  # nothing to hide


def test_two_batch_overlap_decode_schedule_by_hand():
    """SGLang's decode strategy (delta 2, six stages a layer): A0 A1, then A2 B0, A3 B1, A4 B2, A5 B3, then B4
    B5. Attention 1 + 1, shared 1, experts 2, output 1; dispatch and combine 3. A's dispatch 2-5 hides behind
    A's shared and B0 (to 4): waits 1; A's combine 7-10 behind B1 (to 8): waits 2; B's dispatch 10-13 behind
    B's shared and A5 (to 12): waits 1; B's combine 15-18, nothing between: waits 3; B5 ends at 19 = 12 + 7."""
    ops = {"attn_prepare": 1.0, "attn_core": 1.0, "gate": 0.0, "shared": 1.0, "experts": 2.0, "output": 1.0}
    assert simulate(SGLANG_DECODE, 1, ops, {"dispatch": 3.0, "combine": 3.0}) == 19.0


def test_two_batch_overlap_hides_part_of_the_ep_exchange():
    """Two halves of 128 sequences per rank: the EP calls are the half step's, twice; the step is the whole
    step with its MoE layers (58, their compute and their exposed EP time) replaced by the simulated halves. It
    lies between the halves' compute alone and the halves in series."""
    pool = Pool(dp=16, ep=16, attention_dp=True, ep_dispatch="deepep")
    options = ServeOptions(weight_dtype="fp8", two_batch_overlap=True)
    served = served_model(DSV3, options)  # as plan_serving loads it: no MTP module without options.mtp (mend14e)
    w = _worker(served, TWO_NODES, engine("sglang"), pool, 0)
    half = _step(served, w, options, "decode", 128 * 16, 350)
    whole = _step(served, w, options, "decode", 256 * 16, 350)
    par = w.decode_par
    assert par.ep_dispatch == "deepep_ll"  # decode: the low-latency kernels, which hold no SMs in flight
    ctx_half = _context(served, options, "decode", 128 * 16, 350, par, w)
    ctx_whole = _context(served, options, "decode", 256 * 16, 350, par, w)
    # the step's kernels are timed on the slowest of its 16 GPUs (planner/spread.py; spread15 left this test on the
    # median part, failing on main at 227d02b; mend15f)
    gpu = paced_gpu(ctx_whole, TWO_NODES.gpu)
    ops, ex = op_times(ctx_half, gpu, 0), exchange_times(half.calls, 0)
    assert ex["dispatch"] == _ep_rows(half.calls)["ep.dispatch.ll"].price.time_s
    assert ex["combine"] == _ep_rows(half.calls)["ep.combine.ll"].price.time_s
    st = whole.step.stages[0]
    moe_whole = layer_forward(ctx_whole, True, gpu)[0].total_s
    sim = simulate(SGLANG_DECODE, MOE_LAYERS, ops, ex)
    expected = whole.step.time_s - MOE_LAYERS * moe_whole - st.exposed_by_stream[("ep", "forward")] + sim
    out = plan_serving(DSV3, TWO_NODES, engine("sglang"), Traffic(300, 100, concurrency=256 * 16), (pool,), options)
    p = out.pools[0]
    assert p.batch == 256 * 16
    assert p.step_s == pytest.approx(expected, rel=1e-9)
    compute = 2 * MOE_LAYERS * sum(ops.values())
    assert compute < sim < compute + 2 * MOE_LAYERS * (ex["dispatch"] + ex["combine"])
    # every exchange hidden (the previous model: twice the half step less its exposed EP time) is a lower bound
    hidden = 2 * (half.step.time_s - half.step.stages[0].exposed_by_stream[("ep", "forward")])
    assert p.step_s > hidden
    rows, half_rows = _ep_rows(p.calls), _ep_rows(half.calls)
    assert rows["ep.dispatch.ll"].call.calls_per_iteration == 2 * MOE_LAYERS
    assert rows["ep.dispatch.ll"].call.message_bytes == half_rows["ep.dispatch.ll"].call.message_bytes
    assert p.memory_peak_bytes >= whole.memory.peak_bytes  # both halves are in flight


@pytest.mark.parametrize(("name", "per_rank", "splits"), [
    ("vllm", 31, False),  # vLLM DBO: dbo_decode_token_threshold 32 (num_tokens >= threshold)
    ("vllm", 32, True),
    ("sglang", 8, True),  # SGLang: no threshold (two_batch_overlap.py "TODO: may smartly disable TBO ...")
    ("sglang", 1, False),  # one sequence per rank: a half would be empty
])  # fmt: skip
def test_two_batch_overlap_splits_where_the_engine_does(name, per_rank, splits):
    """The engines' own rules for running a decode step as two micro-batches (overlap.OverlapStrategy.splits):
    below vLLM's threshold the step is the whole batch's, calls and time alike."""
    pool = Pool(dp=16, ep=16, attention_dp=True, ep_dispatch="deepep_ll")
    on, off = ServeOptions(weight_dtype="fp8", two_batch_overlap=True), ServeOptions(weight_dtype="fp8")
    w = _worker(DSV3, TWO_NODES, engine(name), pool, 0)
    with_tbo, without = (_overlapped(DSV3, w, o, "decode", per_rank * 16, 350) for o in (on, off))
    rows, plain = _ep_rows(with_tbo.calls), _ep_rows(without.calls)
    assert (with_tbo.step.time_s != without.step.time_s) is splits
    assert rows["ep.dispatch.ll"].call.calls_per_iteration == (2 if splits else 1) * MOE_LAYERS
    assert plain["ep.dispatch.ll"].call.calls_per_iteration == MOE_LAYERS


def test_vllm_prefill_threshold_is_512_tokens_and_a_prompt_splits_in_two_chunks():
    """vLLM's dbo_prefill_token_threshold 512: a 500-token prefill pass is one batch; a 512-token one (one prompt)
    splits at the token midpoint (ubatch_utils.py): two chunks of 256 tokens, planned as the one-prompt step at weight
    1/2, so the layers' compute is the whole pass's and each exchange is listed once with both chunks' bytes."""
    on, off = ServeOptions(weight_dtype="fp8", two_batch_overlap=True), ServeOptions(weight_dtype="fp8")
    for isl, splits in ((500, False), (512, True)):
        pool = Pool(dp=16, ep=16, attention_dp=True, max_batch_tokens=isl)
        w = _worker(DSV3, TWO_NODES, engine("vllm"), pool, 0)
        with_tbo, without = (_overlapped(DSV3, w, o, "prefill", 16, isl) for o in (on, off))
        assert (with_tbo.step.time_s != without.step.time_s) is splits, isl
        if splits:
            assert with_tbo.step.compute_s == pytest.approx(without.step.compute_s, rel=1e-12)
            a, b = _ep_rows(with_tbo.calls), _ep_rows(without.calls)
            assert {k: r.call.calls_per_iteration for k, r in a.items()} == {
                k: r.call.calls_per_iteration for k, r in b.items()}  # fmt: skip


def test_uneven_halves_are_the_mean_of_the_larger_and_the_smaller():
    """Three sequences per rank split 2 + 1 (SGLang compute_split_seq_index: bs // 2): the simulated halves are
    their mean, so the MoE layers' compute is the whole step's less its MoE layers plus one of each half's, and each
    half's exchanges are listed once."""
    pool = Pool(dp=16, ep=16, attention_dp=True, ep_dispatch="deepep")
    on = ServeOptions(weight_dtype="fp8", two_batch_overlap=True)
    w = _worker(DSV3, TWO_NODES, engine("sglang"), pool, 0)
    step = _overlapped(DSV3, w, on, "decode", 3 * 16, 350)
    whole = _step(DSV3, w, on, "decode", 3 * 16, 350)
    gpu = paced_gpu(_context(DSV3, on, "decode", 3 * 16, 350, w.decode_par, w), TWO_NODES.gpu)  # the slowest part
    layer = {n: layer_forward(_context(DSV3, on, "decode", n * 16, 350, w.decode_par, w), True, gpu)[0]
             for n in (1, 2, 3)}  # fmt: skip
    # decode's low-latency kernels hold no SMs: no GEMM tax
    moe = MOE_LAYERS * (layer[2].total_s + layer[1].total_s - layer[3].total_s)
    assert step.step.compute_s == pytest.approx(whole.step.compute_s + moe, rel=1e-9)
    dispatch = [pc for pc in step.calls if pc.call.name == "ep.dispatch.ll"]
    assert sorted(pc.call.message_bytes for pc in dispatch) == sorted(
        _ep_rows(_step(DSV3, w, on, "decode", n * 16, 350).calls)["ep.dispatch.ll"].call.message_bytes
        for n in (1, 2))  # fmt: skip
    assert all(pc.call.calls_per_iteration == MOE_LAYERS for pc in dispatch)


def test_sglang_prefill_in_low_latency_mode_is_not_split():
    """SGLang does not run TBO on an extend batch in DeepEP's low-latency mode (TboDPAttentionPreparer
    local_can_run_tbo): a pool that asks for deepep_ll prefills as one batch."""
    pool = Pool(dp=16, ep=16, attention_dp=True, ep_dispatch="deepep_ll")
    on, off = ServeOptions(weight_dtype="fp8", two_batch_overlap=True), ServeOptions(weight_dtype="fp8")
    w = _worker(DSV3, TWO_NODES, engine("sglang"), pool, 0)
    assert _overlapped(DSV3, w, on, "prefill", 4 * 16, 2000).step.time_s == _overlapped(
        DSV3, w, off, "prefill", 4 * 16, 2000).step.time_s  # fmt: skip


def test_deepep_normal_kernels_take_their_sms_from_the_gemms():
    """Prefill under two-batch overlap: DeepEP's normal kernels hold Buffer.num_sms = 20 of the H100's 132 SMs, so
    the GEMMs run on 112 at 112/132 of the peak (SGLang deep_gemm_num_sms); the attention kernels and the
    memory-bound ones keep their time. The routed experts' GEMMs of 4 x 2,000 tokens are large: close to
    132/112 slower (wave quantization moves it by a few percent)."""
    pool = Pool(dp=16, ep=16, attention_dp=True, ep_dispatch="deepep")
    options = ServeOptions(weight_dtype="fp8", two_batch_overlap=True)
    w = _worker(DSV3, TWO_NODES, engine("sglang"), pool, 0)
    ctx = _context(DSV3, options, "prefill", 4 * 16, 2000, w.par, w)
    full, taxed = op_times(ctx, TWO_NODES.gpu, 0), op_times(ctx, TWO_NODES.gpu, COMM_SMS["deepep"])
    assert COMM_SMS["deepep"] == 20 and TWO_NODES.gpu.sms == 132
    assert taxed["experts"] / full["experts"] == pytest.approx(132 / 112, rel=0.06)
    assert taxed["experts"] > full["experts"]
    assert taxed["output"] == full["output"]  # the residual add and the casts are memory-bound


def test_two_batch_overlap_is_a_422_where_the_engine_has_none():
    with pytest.raises(SpecError) as err:
        plan_serving(DSV3, TWO_NODES, engine("trtllm"), Traffic(1000, 100, concurrency=64),
                     (Pool(dp=16, ep=16, attention_dp=True),), ServeOptions(two_batch_overlap=True))  # fmt: skip
    assert err.value.field == "options.two_batch_overlap" and "--enable-two-batch-overlap" in err.value.rule


def test_redundant_experts_cost_their_weights():
    """EPLB with 32 redundant experts over EP 16: 288 slots, 18 per rank instead of 16. Each rank holds two more
    experts' fp8 weights (3 matrices of 7168 x 2048, one byte each) in each MoE layer: DeepSeek-V3's 58 and its
    MTP module's one; the router grows by 32 columns of 7168 (the engines keep it 256 wide: a stated
    approximation, 0.2% of the added bytes)."""
    pool = Pool(dp=16, ep=16, attention_dp=True, ep_dispatch="deepep")
    options = ServeOptions(weight_dtype="fp8")
    params = []
    for r in (0, 32):
        model = with_redundant_experts(DSV3, r)
        w = _worker(model, TWO_NODES, engine("sglang"), pool, 0)
        params.append(_step(model, w, options, "decode", 16 * 16, 1050).memory.per_stage[0].params_bytes)
    assert params[1] - params[0] == (MOE_LAYERS + 1) * (2 * 3 * H * 2048 + H * 32)
    traffic = Traffic(1000, 100, concurrency=256)
    base, eplb = (plan_serving(DSV3, TWO_NODES, engine("sglang"), traffic, (pool,),
                               ServeOptions(weight_dtype="fp8", redundant_experts=r)) for r in (0, 32))  # fmt: skip
    assert eplb.kv_cache.capacity_tokens < base.kv_cache.capacity_tokens


@pytest.mark.parametrize(
    ("model", "redundant", "words"),
    [(DSV3, 10, "266 expert slots do not divide over pool 0's ep 16"), (LLAMA8B, 8, "need an MoE model")],
)
def test_redundant_experts_rules(model, redundant, words):
    pool = (Pool(dp=16, ep=16 if model.moe else 1, attention_dp=True),)
    with pytest.raises(SpecError) as err:
        plan_serving(model, TWO_NODES, engine("vllm"), Traffic(100, 100, concurrency=8), pool,
                     ServeOptions(redundant_experts=redundant))  # fmt: skip
    assert err.value.field == "options.redundant_experts" and words in err.value.rule


def test_ep72_all_to_all_blocks_are_equal():
    """EP 72 (LMSYS's decode pool, 288 expert slots with EPLB): 256 sequences x top-8 rows do not split evenly over
    72 ranks; the all-to-all's buffer is rounded up to equal blocks (at most 71 bytes) instead of failing to price."""
    model = with_redundant_experts(DSV3, 32)
    work = WorkloadSpec(kind="inference", phase="decode", batch_size=256 * 72, context_length=2100,
                        moe_dispatch_dtype="fp8")  # fmt: skip
    par = ParallelSpec(dp=72, ep=72, expert_tp=1, ep_dispatch="deepep_ll")
    rows = _ep_rows(build_plan(model, work, par, cluster_preset("dgx-h100", 9), Options(timeline=False)).calls)
    exact = 256 * K * (H + H // 128 * 4)
    assert rows["ep.dispatch.ll"].call.message_bytes == -(-exact // 72) * 72 < exact + 72


def test_vllm_dp_ranks_all_reduce_their_batch_metadata_each_step():
    """vllm/v1/worker/dp_utils.py _run_ar: a (4, dp) int32 tensor all-reduced over the DP group once per step:
    16 x 16 = 256 bytes among the 16 attention-DP ranks, one group (tp 1, pp 1). The host reads it before the
    forward: the step is the plan's step plus its price. SGLang issues none; neither does vLLM at dp 1."""
    options = ServeOptions(weight_dtype="fp8")
    pool = Pool(dp=16, ep=16, attention_dp=True)
    w = _worker(DSV3, TWO_NODES, engine("vllm"), pool, 0)
    step = _step(DSV3, w, options, "decode", 16 * 16, 1050)
    (sync,) = [pc for pc in step.calls if pc.call.name == "dp.step_sync"]
    assert sync.call.message_bytes == 4 * 4 * 16 == 256 and sync.call.calls_per_iteration == 1
    assert sync.call.op.value == "allreduce" and sync.group_size == 16 and sync.num_groups == 1
    assert "dp_utils.py _run_ar" in sync.call.source
    work = _work(options, "decode", 16 * 16, 1050, kernels=w.kernels)  # the engine's own kernels, as _step plans them
    bare = build_plan(DSV3, work, w.decode_par, w.cluster, Options(timeline=False))
    assert step.step.time_s == pytest.approx(bare.step.time_s + sync.price.time_s, rel=1e-12)
    assert step.step.stages[0].exposed_by_stream[("dp", "forward")] == pytest.approx(sync.price.time_s)
    assert 0 < sync.price.time_s < 1e-4  # a latency-bound 256-byte all-reduce across two nodes
    sglang = _step(DSV3, _worker(DSV3, TWO_NODES, engine("sglang"), pool, 0), options, "decode", 16 * 16, 1050)
    assert not [pc for pc in sglang.calls if pc.call.parallelism == "dp"]
    tp_only = _worker(DSV3, TWO_NODES, engine("vllm"), Pool(tp=16, ep=16), 0)
    assert not [pc for pc in _step(DSV3, tp_only, options, "decode", 16, 1050).calls if pc.call.parallelism == "dp"]


def test_trtllm_fuses_the_block_all_reduces_with_the_residual_and_norm():
    """TensorRT-LLM (allreduceOp.cpp AllReduceFusionOp::RESIDUAL_RMS_NORM): the all-reduces ending the attention
    and MLP blocks are its fused kernel, with the block output's bytes: 64 sequences x 8192 x 2 = 1 MiB, 80 of each
    for Llama-3 70B on TP8. The embedding's all-reduce is a plain one (Fusion=NONE). At 64 tokens of hidden 8192 on TP8
    TensorRT-LLM's strategy table picks NCCL (planner/serving/fused_allreduce.py): the price is NCCL's (the same
    engine without its own all-reduce), and the row says which strategy ran."""
    llama70b, one_node, options = MODEL_PRESETS["llama3-70b"], cluster_preset("dgx-h100", 1), ServeOptions()
    rows = {}
    for name, traits in (("trtllm", engine("trtllm")), ("nccl", replace(engine("trtllm"), tp_allreduce=None))):
        w = _worker(llama70b, one_node, traits, Pool(tp=8), 0)
        rows[name] = {pc.call.name: pc for pc in _step(llama70b, w, options, "decode", 64, 1000).calls}
    for block in ("tp.attn.out_proj", "tp.mlp.down_proj"):
        trt, nccl = rows["trtllm"][block], rows["nccl"][block]
        assert trt.call.message_bytes == nccl.call.message_bytes == 64 * 8192 * 2
        assert trt.call.calls_per_iteration == 80 and trt.call.op.value == "allreduce"
        assert "AllReduceFusionOp::RESIDUAL_RMS_NORM" in trt.call.source and "strategy NCCL" in trt.call.source
        assert "AllReduceFusionOp" not in nccl.call.source
        assert trt.price.time_s == nccl.price.time_s
    # the embedding's all-reduce is a plain one, through the same op (embedding.py Embedding.forward,
    # AllReduceFusionOp::NONE): that slice of the table runs TWOSHOT at 64 tokens of hidden 8192 on TP8 (SM90)
    emb = rows["trtllm"]["tp.embedding"]
    assert "AllReduceFusionOp::NONE" in emb.call.source and "RESIDUAL_RMS_NORM" not in emb.call.source
    assert emb.price.algorithm == "trtllm_twoshot" and emb.call.message_bytes == 64 * 8192 * 2
    assert emb.price.time_s < rows["nccl"]["tp.embedding"].price.time_s
