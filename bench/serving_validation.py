"""The serving planner against published serving measurements (README and docs/serving.md, "Validation").

Held out: no constant is fitted on these rows. Each row plans the published deployment with the planner's own
functions (planner.serving) and compares the throughput:

- wide-EP DeepSeek-V3 (LMSYS, SGLang, 96 H100): one step of each pool, tokens/s per node, two-batch overlap on (as
  run) and off;
- dense Llama 3.3 70B and 3.1 405B (TensorRT-LLM's perf-overview tables, H100 and H200, FP8): an aggregated
  offline run (every request queued at once), total output tokens/s.

    PYTHONPATH=. python bench/serving_validation.py
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from collectives.topology import cluster_preset
from planner import MODEL_PRESETS
from planner.serving import Pool, ServeOptions, Traffic, engine, plan_serving
from planner.serving.deployment import _overlapped, _worker, served_model

LMSYS = "lmsys.org/blog/2025-05-05-large-scale-ep (SGLang, 12 x 8 H100, DeepEP, DeepGEMM, EPLB, two-batch overlap)"
# (name, phase, pool, sequences per attention rank, context, published tokens/s per node, source)
ROWS = (
    ("DeepSeek-V3 prefill, 4 nodes EP32, 2,000-token prompts, 16,384 tokens per GPU", "prefill",
     Pool("prefill", dp=32, ep=32, attention_dp=True, ep_dispatch="deepep", max_batch_tokens=16384), 8, 2000,
     52_300, LMSYS + ": 52.3k input tokens/s per node for 2,000-token input sequences"),
    ("DeepSeek-V3 decode, 9 nodes EP72, 256 sequences per GPU, 2,000-token prompts", "decode",
     Pool("decode", dp=72, ep=72, attention_dp=True, ep_dispatch="deepep"), 256, 2100,
     22_300, LMSYS + ": 22.3k output tokens/s per node for 2,000-token input sequences"),
)  # fmt: skip


def predict(phase: str, pool: Pool, per_rank: int, context: int, options: ServeOptions) -> tuple[float, float]:
    """(tokens/s per node, step seconds) of one step of the pool's worker as the serving planner plans it."""
    model = served_model(MODEL_PRESETS["deepseek-v3"], options)  # as plan_serving loads it: no MTP module
    cluster = cluster_preset("dgx-h100", 12)
    w = _worker(model, cluster, engine("sglang"), pool, 0)
    plan = _overlapped(model, w, options, phase, per_rank * pool.dp, context)
    tokens = per_rank * (context if phase == "prefill" else 1) * cluster.devices_per_node
    return tokens / plan.step.time_s, plan.step.time_s


TRTLLM = (
    "TensorRT-LLM docs/source/performance/perf-overview.md at 00f37686aa85 (the v1.0 docs' throughput tables, "
    "nvidia.github.io/TensorRT-LLM/performance/perf-overview.html): trtllm-bench throughput, PyTorch backend, "
    "requests at an infinite rate, Total Output Throughput (tokens/sec); nvidia/Llama-3.3-70B-Instruct-FP8 and "
    "nvidia/Llama-3.1-405B-Instruct-FP8 (ModelOpt)"
)
# the doc's $num_requests per (ISL, OSL)
REQUESTS = {(128, 2048): 3000, (500, 2000): 3000, (1000, 1000): 3000, (2048, 128): 3000, (2048, 2048): 1500,
            (5000, 500): 1500, (128, 128): 30000, (128, 4096): 1500, (1000, 2000): 1500,
            (20000, 2000): 1000}  # fmt: skip
# (model preset, cluster preset, tp, {(ISL, OSL): published total output tokens/s})
# the last four sequence lengths of each (128/128, 128/4096, 1000/2000, 20000/2000) were added by serve5, from the
# same tables
DENSE = (
    ("llama3-70b", "dgx-h100", 2, {(128, 2048): 6651, (500, 2000): 5222, (1000, 1000): 4205, (2048, 128): 762,
                                   (2048, 2048): 3082, (5000, 500): 898, (128, 128): 6378, (128, 4096): 4199,
                                   (1000, 2000): 4146, (20000, 2000): 437}),
    ("llama3-70b", "dgx-h200", 1, {(128, 2048): 4336, (500, 2000): 3666, (1000, 1000): 2909, (2048, 128): 442,
                                   (2048, 2048): 2003, (5000, 500): 566, (128, 128): 3803, (128, 4096): 2872,
                                   (1000, 2000): 2994, (20000, 2000): 283}),
    ("llama3-405b", "dgx-h100", 8, {(128, 2048): 4340, (500, 2000): 3994, (1000, 1000): 2919, (2048, 128): 453,
                                    (2048, 2048): 2296, (5000, 500): 610, (128, 128): 3627, (128, 4096): 3116,
                                    (1000, 2000): 2895, (20000, 2000): 345}),
    ("llama3-405b", "dgx-h200", 8, {(128, 2048): 5348, (500, 2000): 4724, (1000, 1000): 3330, (2048, 128): 456,
                                    (2048, 2048): 2948, (5000, 500): 650, (128, 128): 3814, (128, 4096): 4741,
                                    (1000, 2000): 3722, (20000, 2000): 505}),
)  # fmt: skip
# ModelOpt's FP8 recipe: per-tensor scales for the weights and activations. The KV cache is spelled fp8: the rows are
# trtllm-bench runs (the perf-overview), and TensorRT-LLM's docs/source/performance/perf-benchmarking.md quotes these
# checkpoints' hf_quant_config.json (nvidia/Llama-3.1-*-Instruct-FP8: "quant_algo": "FP8", "kv_cache_quant_algo":
# null, "full FP16 cache" under the engine's own "auto") and tabulates that trtllm-bench sets FP8 for a null
# kv_cache_quant_algo beside FP8 or NVFP4 weights. The Llama 3.3 70B FP8 checkpoint's own file was not read: the
# row's assumption is the same (a declared FP8 cache or trtllm-bench's choice give the same fp8 cache)
DENSE_OPTIONS = ServeOptions(weight_dtype="fp8", kv_dtype="fp8", fp8_recipe="tensorwise")


def dense_table() -> list[dict]:
    """The dense rows: TensorRT-LLM's defaults (max_num_tokens 8192, free_gpu_memory_fraction 0.9), one worker of
    the published TP on one node, every request of the run in the system at once."""
    out = []
    for model, cluster, tp, rows in DENSE:
        for (isl, osl), published in rows.items():
            traffic = Traffic(isl, osl, concurrency=REQUESTS[(isl, osl)])
            nodes = cluster_preset(cluster, 1)
            plan = plan_serving(MODEL_PRESETS[model], nodes, engine("trtllm"), traffic, (Pool(tp=tp),), DENSE_OPTIONS)
            predicted = plan.output_tokens_per_s
            out.append({"row": f"{model} {cluster.removeprefix('dgx-').upper()} TP{tp} {isl}/{osl}",
                        "predicted": predicted, "published": published, "error": predicted / published - 1,
                        "tpot_s": plan.tpot_s, "batch": plan.pools[0].batch, "source": TRTLLM})  # fmt: skip
    return out


FP4_REFERENCE = Path(__file__).resolve().parents[1] / "tests/reference/serving/trtllm_perf_overview_fp4.json"
# the perf-overview's NVFP4 tables' systems: DGX B200 (8 x B200 180GB) and GB200 NVL72 (GB200 192GB)
FP4_CLUSTERS = {"B200": "dgx-b200", "GB200": "gb200-nvl72"}
# ModelOpt's NVFP4 checkpoints: the transformer blocks' linear weights and activations in NVFP4 (model cards of
# nvidia/Llama-3.3-70B-Instruct-FP4 and nvidia/Llama-3.1-405B-Instruct-FP4), the KV cache spelled fp8 as the FP8
# rows': these checkpoints' hf_quant_config.json was not read here (ModelOpt's NVFP4 exports commonly declare
# kv_cache_quant_algo FP8); either way a trtllm-bench run gives them an FP8 cache (perf-benchmarking.md's table:
# NVFP4 + null -> FP8, bench/benchmark/utils/general.py _KV_CACHE_MAP), not the engine's "auto" default
# (engines.TRTLLM_KV_DEFAULT_RULE). The FP4 linears take TensorRT-LLM's FP8 context FMHA (TRTLLM_FP8_CONTEXT_FMHA)
FP4_OPTIONS = ServeOptions(weight_dtype="nvfp4", kv_dtype="fp8")


def fp4_table(options: ServeOptions = FP4_OPTIONS) -> list[dict]:
    """The 40 NVFP4 rows (tests/reference/serving/trtllm_perf_overview_fp4.json), held out like the FP8 rows: the
    same defaults (one worker of the published TP, every request at once), nvfp4 weights and GEMMs."""
    ref = json.loads(FP4_REFERENCE.read_text())
    out = []
    for name, rows in ref["tables"].items():
        model, system, tp = name.split()
        nodes = cluster_preset(FP4_CLUSTERS[system], 1)
        pool = Pool(tp=int(tp.removeprefix("TP")))
        for isl, osl, requests, published in rows:
            plan = plan_serving(MODEL_PRESETS[model], nodes, engine("trtllm"), Traffic(isl, osl, concurrency=requests),
                                (pool,), options)  # fmt: skip
            predicted = plan.output_tokens_per_s
            out.append({"row": f"{name} {isl}/{osl}", "predicted": predicted, "published": published,
                        "error": predicted / published - 1, "tpot_s": plan.tpot_s, "batch": plan.pools[0].batch,
                        "requests": requests, "source": ref["source"]})  # fmt: skip
    return out


def summary(rows: list[dict]) -> tuple[float, float, float]:
    """(median |error|, signed median, worst signed error) of a table's rows."""
    signed = sorted(r["error"] for r in rows)
    n = len(signed)
    return median_abs(rows), (signed[n // 2] + signed[(n - 1) // 2]) / 2, max(signed, key=abs)


def all_reduce_effect(names: tuple[str, ...] = ("vllm", "sglang")) -> list[dict]:
    """The dense rows' deployments as vLLM and SGLang would run them (their own defaults), each with the engine's own
    TP all-reduce (custom kernels, vLLM's symmetric memory: planner/serving/fused_allreduce.py) and with every
    all-reduce NCCL's: how much the engines' own kernels move the throughput. No published vLLM or SGLang row to
    compare with; the TensorRT-LLM rows above are the validation."""
    out = []
    for model, cluster, tp, rows in DENSE:
        if tp == 1:
            continue  # no all-reduce
        nodes = cluster_preset(cluster, 1)
        for isl, osl in rows:
            traffic = Traffic(isl, osl, concurrency=REQUESTS[(isl, osl)])
            for name in names:
                own = engine(name)
                plans = [plan_serving(MODEL_PRESETS[model], nodes, traits, traffic, (Pool(tp=tp),), DENSE_OPTIONS)
                         for traits in (own, replace(own, tp_allreduce=None))]  # fmt: skip
                kinds = sorted(
                    {pc.price.algorithm for pc in plans[0].pools[0].calls if pc.call.op.value == "allreduce"}
                )
                out.append({"row": f"{model} {cluster.removeprefix('dgx-').upper()} TP{tp} {isl}/{osl}", "engine": name,
                            "own": plans[0].output_tokens_per_s, "nccl": plans[1].output_tokens_per_s,
                            "gain": plans[0].output_tokens_per_s / plans[1].output_tokens_per_s - 1,
                            "tpot_own_s": plans[0].tpot_s, "tpot_nccl_s": plans[1].tpot_s,
                            "batch": plans[0].pools[0].batch, "kernels": kinds})  # fmt: skip
    return out


def median_abs(rows: list[dict]) -> float:
    errors = sorted(abs(r["error"]) for r in rows)
    n = len(errors)
    return (errors[n // 2] + errors[(n - 1) // 2]) / 2


def table() -> list[dict]:
    out = []
    for tbo in (True, False):
        # as LMSYS ran it: fp8 weights (block-scaled), 32 redundant experts (EPLB), two-batch overlap on
        options = ServeOptions(weight_dtype="fp8", two_batch_overlap=tbo, redundant_experts=32)
        for name, phase, pool, per_rank, context, published, source in ROWS:
            predicted, step = predict(phase, pool, per_rank, context, options)
            out.append({"row": name, "two_batch_overlap": tbo, "predicted": predicted, "published": published,
                        "error": predicted / published - 1, "step_s": step, "source": source})  # fmt: skip
    return out


if __name__ == "__main__":
    for r in table():
        tbo = "on " if r["two_batch_overlap"] else "off"
        print(
            f"{r['row']:80s} TBO {tbo} {r['predicted']:9,.0f} vs {r['published']:7,d} tokens/s per node "
            f"({r['error']:+.1%}), step {r['step_s'] * 1e3:,.1f} ms"
        )
    dense = dense_table()
    for r in dense:
        print(
            f"{r['row']:40s} {r['predicted']:7,.0f} vs {r['published']:6,d} output tokens/s ({r['error']:+.1%}), "
            f"batch {r['batch']}, TPOT {r['tpot_s'] * 1e3:,.1f} ms"
        )
    signed = sorted(r["error"] for r in dense)
    print(f"dense: median |error| {median_abs(dense):.1%}, signed median {signed[len(signed) // 2]:+.1%}, "
          f"worst {max(signed, key=abs):+.1%} over {len(dense)} rows")  # fmt: skip
    fp4 = fp4_table()
    for r in fp4:
        print(
            f"{r['row']:40s} {r['predicted']:7,.0f} vs {r['published']:6,d} output tokens/s ({r['error']:+.1%}), "
            f"batch {r['batch']}, TPOT {r['tpot_s'] * 1e3:,.1f} ms"
        )
    med, signed_med, worst = summary(fp4)
    print(f"nvfp4: median |error| {med:.1%}, signed median {signed_med:+.1%}, worst {worst:+.1%} over {len(fp4)} rows")
    for r in all_reduce_effect():
        print(
            f"{r['row']:40s} {r['engine']:7s} own all-reduce {r['own']:7,.0f} vs NCCL {r['nccl']:7,.0f} out tok/s "
            f"({r['gain']:+.1%}), TPOT {r['tpot_own_s'] * 1e3:,.1f} vs {r['tpot_nccl_s'] * 1e3:,.1f} ms, batch "
            f"{r['batch']}, {', '.join(r['kernels'])}"
        )
