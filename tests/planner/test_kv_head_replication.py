"""KV heads replicated past TP (docs/serving.md, "KV heads replicated past TP (kvrep10)"): the serving engines run
tp > num_kv_heads by copying each KV head on tp / num_kv_heads ranks (vLLM, SGLang QKVParallelLinear; TensorRT-LLM
duplicate_kv_weight); the training frameworks keep tp | num_kv_heads. By hand on Qwen3-30B-A3B: 48 layers, 32 query
heads, 4 KV heads of 128, hidden 2048."""

from __future__ import annotations

from dataclasses import replace

import pytest

from collectives.topology import cluster_preset
from planner import MODEL_PRESETS, SpecError
from planner.context import Context
from planner.kernels import layer_kernels
from planner.parallel import ParallelSpec, kv_heads_rule, validate_parallel
from planner.params import stage_params
from planner.serving import Pool, Traffic, engine, plan_serving
from planner.serving.search import SLA, search_serving, worker_layouts
from planner.workload import WorkloadSpec

QWEN3, LLAMA8B, LLAMA70B = (MODEL_PRESETS[n] for n in ("qwen3-30b-a3b", "llama3-8b", "llama3-70b"))
DECODE = WorkloadSpec(kind="inference", phase="decode", batch_size=8, context_length=2048)


def test_kv_bytes_per_token_per_rank_by_hand():
    # at TP 8 each rank holds one of the 4 heads' copies: 48 layers x K and V x 1 head x 128 x 2 bytes
    assert QWEN3.kv_heads_per_rank(8) == QWEN3.kv_heads_per_rank(4) == 1 and QWEN3.kv_heads_per_rank(2) == 2
    assert QWEN3.num_layers * QWEN3.kv_token_bytes(8, 2) == 48 * 2 * 1 * 128 * 2 == 24_576
    assert QWEN3.num_layers * QWEN3.kv_token_bytes(2, 2) == 48 * 2 * 2 * 128 * 2
    # the model's own KV per token (no copies): 4 heads
    assert QWEN3.num_layers * QWEN3.kv_token_bytes(1, 2) == 48 * 2 * 4 * 128 * 2 == 98_304


def test_the_rule_keeps_training_and_lets_engines_replicate():
    assert kv_heads_rule(4, 8, True) is None and kv_heads_rule(4, 2, True) is None
    assert kv_heads_rule(4, 8, False) == "num_kv_heads 4 is not divisible by tp 8"  # Megatron, torchtitan, DeepSpeed
    broken = kv_heads_rule(4, 6, True)
    assert "tp 6" in broken and "num_kv_heads 4" in broken and "divide(tp_size, total_num_kv_heads)" in broken
    # the training path is unchanged: a framework's layout still refuses tp 8 on 4 KV heads
    with pytest.raises(SpecError, match="num_kv_heads 4 is not divisible by tp 8") as err:
        validate_parallel(ParallelSpec(tp=8, ep=8, expert_tp=1), QWEN3, DECODE, 8)
    assert err.value.field == "parallel.tp"
    validate_parallel(ParallelSpec(tp=8, ep=8, expert_tp=1, kv_head_replication=True), QWEN3, DECODE, 8)
    for name in ("vllm", "sglang", "trtllm"):
        assert engine(name).kv_head_replication


def test_qkv_weights_and_gemm_per_rank_hold_the_copies():
    """QKV per rank at TP 8: q 32 x 128 / 8 = 512 columns, K and V one head of 128 each (copied), so 2048 x (512 +
    2 x 128) = 1,572,864 weights; at TP 4 the 4 heads split, 2048 x (1024 + 256) = 2,621,440."""

    def qkv(tp: int) -> tuple[int, tuple, float]:
        par = ParallelSpec(tp=tp, ep=tp, expert_tp=1, kv_head_replication=True)
        ctx = Context(QWEN3, DECODE, par, 8)
        (weights,) = [p.numel for p in stage_params(ctx, 0)[0] if p.name == "layer.0.qkv"]
        kernels = {k.name: k for k in layer_kernels(ctx, True, cluster_preset("dgx-h100", 1).gpu).forward}
        return weights, kernels["qkv"].shape, kernels["decode_attention"].bytes

    (w8, shape8, read8), (w4, shape4, read4) = qkv(8), qkv(4)
    assert w8 == 2048 * (512 + 2 * 128) == 1_572_864
    assert w4 == 2048 * (1024 + 2 * 128) == 2_621_440
    assert shape8[1] == 512 + 2 * 128 and shape4[1] == 1024 + 2 * 128  # the GEMM's n: q / tp + K and V of one head
    # the decode attention reads the rank's one KV head: 8 sequences x 2,048 tokens x K and V x 128 x 2 bytes
    assert read8 == read4 == 8 * 2048 * 2 * 128 * 2


def test_kv_capacity_follows_the_replicated_layout():
    """Qwen3 at TP 8 EP 8 on one H100 node with vLLM: each rank keeps 24,576 B per token, so a worker holds its
    0.9 x 80 GB share less about 7.6 GB of bf16 weights per rank (30.5 B x 2 / 8) and the activations, over
    24,576 B; the 8 ranks together keep 2 x the model's 98,304 B per token (the copies)."""
    cluster = cluster_preset("dgx-h100", 1)
    out = plan_serving(QWEN3, cluster, engine("vllm"), Traffic(2000, 500, concurrency=64), (Pool(tp=8, ep=8),))
    assert out.fits and out.kv_cache.bytes_per_token == 98_304
    held = out.kv_cache.capacity_tokens * 24_576  # per rank
    share = 0.9 * cluster.gpu.hbm_bytes
    assert share - 7.7e9 - 6e9 < held < share - 7.5e9
    pools = (Pool(workers=2, tp=4, ep=4),)
    four = plan_serving(QWEN3, cluster, engine("vllm"), Traffic(2000, 500, concurrency=64), pools)
    # TP 4 also keeps one head per rank, with twice the weights per rank: fewer tokens per worker
    assert four.kv_cache.capacity_tokens < out.kv_cache.capacity_tokens


def test_a_tp_neither_dividing_nor_a_multiple_of_the_kv_heads_is_a_422():
    toy = replace(LLAMA8B, num_attention_heads=24, num_kv_heads=3, hidden_size=3072, name="toy")
    with pytest.raises(SpecError) as err:
        plan_serving(toy, cluster_preset("dgx-h100", 1), engine("sglang"), Traffic(1000, 100, concurrency=8),
                     (Pool(tp=8),))  # fmt: skip
    assert err.value.field == "deployment.pools.0.tp"
    assert "tp 8" in err.value.rule and "num_kv_heads 3" in err.value.rule


PAIRS = [(8, 8), (8, 4), (4, 8), (2, 8), (8, 2)]


@pytest.mark.parametrize(("p_tp", "d_tp"), PAIRS)
def test_kv_transfer_bytes_as_each_engine_moves_them(p_tp, d_tp):
    """A 2,000-token prompt's KV is 2,000 x 98,304 B. Every decode copy of a head is filled (each decode rank reads
    or receives its own heads); from a prefill pool that replicates into a smaller decode TP, SGLang sends every
    copy (send_kvcache_slice), TensorRT-LLM one per head (needSendCache); vLLM's NixlConnector refuses any layout
    with copies but a replicating prefill into a decode TP at least its own."""
    cluster = cluster_preset("dgx-h100", 2)
    pools = (Pool("prefill", tp=p_tp, ep=p_tp), Pool("decode", tp=d_tp, ep=d_tp))
    whole = 2000 * 98_304
    copies = max(p_tp, d_tp) // 4  # copies of each head on the larger side
    expected = {
        "sglang": whole * copies,
        "trtllm": whole * (copies if d_tp >= p_tp else max(1, d_tp // 4)),
        "vllm": whole * copies if 4 < p_tp <= d_tp else None,
    }
    for name, wire in expected.items():
        traits = engine(name)
        if wire is None:
            with pytest.raises(SpecError) as err:
                plan_serving(QWEN3, cluster, traits, Traffic(2000, 200, concurrency=32), pools)
            assert err.value.field == "deployment.pools.0.tp"
            assert f"prefill tp {p_tp} and decode tp {d_tp} over 4 KV heads" in err.value.rule
            assert "NixlConnector" in err.value.rule
            continue
        kv = plan_serving(QWEN3, cluster, traits, Traffic(2000, 200, concurrency=32), pools).kv_transfer
        assert kv.bytes_per_request == whole
        assert kv.wire_bytes == wire, name
    trt = plan_serving(QWEN3, cluster, engine("trtllm"), Traffic(2000, 200, concurrency=32), pools).kv_transfer
    # the prefill ranks that send: every rank unless it replicates into a smaller decode TP (one per head)
    assert trt.senders == (4 if p_tp > d_tp else p_tp)


def test_kv_transfer_without_copies_moves_the_kv_once():
    """No pool past the KV heads (Llama-3 70B, 8 KV heads, TP 8 -> TP 4): the transfer is the KV once, in 8 equal
    shares, for every engine alike."""
    cluster = cluster_preset("dgx-h100", 2)
    pools = (Pool("prefill", tp=8), Pool("decode", tp=4, workers=2))
    for name in ("vllm", "sglang", "trtllm"):
        kv = plan_serving(LLAMA70B, cluster, engine(name), Traffic(2000, 200, concurrency=32), pools).kv_transfer
        assert kv.wire_bytes == kv.bytes_per_request == 2000 * 327_680 and kv.senders == 8


def test_the_sla_search_plans_tp8_for_qwen3():
    """Qwen3-30B-A3B on one node: TP 8 is enumerated and planned (it was rejected, 'num_kv_heads 4 is not divisible
    by tp 8', before the engines' replication was modelled)."""
    assert any(p.tp == 8 for p in worker_layouts(QWEN3, 8, 8))
    cluster = cluster_preset("dgx-h100", 1)
    result = search_serving(QWEN3, cluster, Traffic(2000, 200, concurrency=32), ("sglang",), ("aggregated",),
                            SLA(ttft_s=30.0, tpot_s=1.0))  # fmt: skip
    assert not any("num_kv_heads" in why for why in result.rejected), result.rejected
    tp8 = [c for c in result.pareto + result.results if c.pools[0].tp == 8]
    assert tp8 and all(c.plan.kv_cache.bytes_per_token == 98_304 for c in tp8)
