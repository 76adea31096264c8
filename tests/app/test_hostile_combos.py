"""Semantic fuzzing of the newest fields in combination (round 10, hostile10; docs/hardening.md "Round 10:
combinations"). Schemathesis (test_schemathesis.py) covers shapes; these draw VALID-shaped, mostly coherent
requests that a demanding user or a scheduler sends: every model preset (MLA, MTP, sliding windows, MoE), every
pipeline schedule with uneven stages and explicit layouts, recompute granularity / method / layers / modules,
activation offload, FP8 / FP4 recipes per GPU, fp8 parameter gathers and attention, every MoE dispatcher, the
overlap switches, packed documents, norm kernels, CP with each cp_comm, sequences of 1, odd and 1M tokens, one
micro-batch, every cluster preset, custom tori / dragonflies / hypercubes / meshes, one GPU and 131,072, the three
serving engines aggregated and disaggregated with tiny and huge SLAs, searches of small spaces and calibrations
of a trace and of nccl-tests logs.

Every answer is a 200 that makes sense (every number finite and >= 0, the step at least its compute, every
timeline event inside the step, memory above the states it holds, MFU within its bound and said when above 1),
a 422 naming the field (``loc``) and the rule (``msg``), or a 503; never a 500. Derandomized, a fixed number of
examples per endpoint, about 40 s on two busy cores."""

from __future__ import annotations

import gzip
import json
import math
import re
from pathlib import Path

import hypothesis
import pytest
from hypothesis import strategies as st

from collectives.topology import PRESETS, cluster_preset
from planner import MODEL_PRESETS
from planner.invariants import MFU_CEILING
from planner.kernels import causal_keys, square_keys

REF = Path(__file__).resolve().parents[1] / "reference"
SAMPLED = json.loads(gzip.decompress((REF / "traces" / "hta_sampled_rank-0.json.gz").read_bytes()))
LOGS = [p.read_text() for p in sorted((REF / "nccl_logs").glob("*.txt"))[:4]]

# layers, kv heads, routed experts of every model preset; devices per node of every cluster preset
MODELS = {n: (m.num_layers, m.kv_heads, m.moe.num_experts if m.moe else 0) for n, m in MODEL_PRESETS.items()}
CLUSTERS = {name: cluster_preset(name).devices_per_node for name in PRESETS}
BLACKWELL = {"dgx-b200", "dgx-b300", "gb300-nvl72", "gb200-nvl72"}
SCHEDULES = ["1f1b", "interleaved", "gpipe", "zb-h1", "zbv", "dualpipe", "dualpipev"]
MODULES = ["core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts"]
OVERLAPS = [
    "overlap_grad_reduce",
    "overlap_param_gather",
    "fsdp_prefetch",
    "cp_ring_overlap",
    "tp_comm_overlap",
    "overlap_p2p",
    "overlap_moe_expert_parallel_comm",
    "moe_shared_expert_overlap",
]
NETWORKS = [
    None,
    None,
    None,
    {"topology": "dragonfly", "group_size": 4},
    {"topology": "hypercube"},
    {"topology": "torus", "dims": [2, 2, 2]},
]
GPUS = [
    "a100-sxm4-80gb",
    "h100-sxm5-80gb",
    "h100-nvl-94gb",
    "gh200-96gb",
    "h20-96gb",
    "b200-180gb",
    "gb200-186gb",
    "ascend-910b",
    "tpu-v4",
]
SETTINGS = hypothesis.settings(
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[hypothesis.HealthCheck.function_scoped_fixture, hypothesis.HealthCheck.too_slow],
)


def fuzz(examples: int) -> hypothesis.settings:
    return hypothesis.settings(SETTINGS, max_examples=examples)


class Picker:
    """pick(seq) draws one element (shrinks toward the first); coin(n) is true one time in n."""

    def __init__(self, data):
        self.data = data

    def __call__(self, seq):
        return self.data.draw(st.sampled_from(list(seq)))

    def coin(self, n: int = 3) -> bool:
        return self([False] * (n - 1) + [True])


def _divisors(n: int, cands) -> list[int]:
    return [c for c in cands if n % c == 0] or [1]


def _cluster(pick: Picker) -> tuple[dict, int]:
    name = pick(CLUSTERS)
    per = CLUSTERS[name]
    nodes = pick([1, 2, 4, 8, 16] * 3 + [2048, 16384])  # one in 8.5 at scale: 16,384 GPUs and 131,072
    nodes = pick([1, 2]) if per == 72 else pick([8, 16]) if per == 1 else nodes
    cluster = {"preset": name, "num_nodes": nodes}
    network = pick(NETWORKS) if per == 8 and nodes <= 16 else None
    if network:
        cluster |= {"network": network, "num_nodes": 8}
    return cluster, per * cluster["num_nodes"]


def _training(pick: Picker, cluster: dict, layers: int, pp: int, dp: int, seq, experts: int) -> dict:
    mbs = pick([1, 2])
    work = {"kind": "training", "micro_batch_size": mbs, "global_batch_size": mbs * dp * pick([1, 2, 8, 32])}
    if seq:
        work["seq_length"] = seq
    recompute = pick(["none", "none", "selective", "full"])
    work["activation_recompute"] = recompute
    if recompute == "full" and pick.coin():
        work |= {"recompute_method": pick(["uniform", "block"]), "recompute_num_layers": pick([1, 3, layers // pp])}
    elif recompute == "selective" and pick.coin():
        work["recompute_modules"] = sorted({pick(MODULES) for _ in range(pick([1, 2, 3]))})
    elif recompute == "none" and pp == 1 and pick.coin(5):
        work["cpu_offloading_num_layers"] = pick([0, 1, layers // 2])
    if pick.coin():
        blackwell = ["mxfp8", "nvfp4"] if cluster["preset"] in BLACKWELL else []
        work["fp8_recipe"] = pick(["delayed", "tensorwise", "blockwise", *blackwell])
        if pick.coin(4):
            work["fp8_param_gather"] = True
        if pick.coin(4) and work["fp8_recipe"] in ("delayed", "tensorwise", "mxfp8"):
            work["fp8_dot_product_attention"] = True
            if pick.coin():
                work["fp8_dpa_backward"] = pick([True, False])
    if pick.coin(8):
        work["norm_kernel"] = pick(["fused", "ops", "apex"])
    if pick.coin(5):
        s = seq or 4096
        work["document_lengths"] = pick([[s], [s // 2, s - s // 2] if s > 1 else [1], [s - 1, 1] if s > 1 else [1]])
        if pick.coin():
            work["document_packing"] = "dp_balanced"
    if experts and pick.coin(10):
        work["activation_func_fp8_input_store"] = True
    if experts and pick.coin(5):
        work["moe_dispatch_dtype"] = "fp8"
    return work


def _pipeline(pick: Picker, par: dict, layers: int, pp: int) -> None:
    if layers % pp:
        first = pick([1, 2, 3, 5])
        lasts = [x for x in range(1, 12) if pp > 2 and layers - first - x > 0 and (layers - first - x) % (pp - 2) == 0]
        par |= {"first_stage_layers": first, "last_stage_layers": pick(lasts or [layers - first])}
    schedule = par["pipeline_schedule"] = pick(SCHEDULES)
    if schedule == "interleaved":
        par["virtual_pipeline_stages"] = pick([2, 3, 4])
    elif schedule in ("zbv", "dualpipev") and pick.coin(2):
        par["virtual_pipeline_stages"] = 2
    if pick.coin(8):  # an explicit Megatron layout, the layers spread as evenly as they go
        par.pop("first_stage_layers", None), par.pop("last_stage_layers", None)
        v = pick([1, 2])
        par["pipeline_schedule"] = "interleaved" if v == 2 else "1f1b"
        n = pp * v
        stages = ["t" * (layers // n + (i < layers % n)) for i in range(n)]
        stages[0], stages[-1] = "E" + stages[0], stages[-1] + "L"
        par["pipeline_layout"] = "|".join(stages)
        if v == 2:
            par["virtual_pipeline_stages"] = 2


def plan_body(pick: Picker) -> dict:
    """A /v1/plan request, coherent enough that about half are answered (the rest: 422s naming a rule)."""
    name = pick(MODELS)
    layers, kv, experts = MODELS[name]
    model = {"preset": name}
    if pick.coin(6):
        model["mtp_layers"] = pick([1, 2])
    if pick.coin(6):
        model["sliding_window"] = pick([1, 128, 4096])
    cluster, devices = _cluster(pick)
    tp = pick(_divisors(min(kv, devices), [1, 2, 4, 8]))
    cp = pick([1, 1, 2, 4]) if devices % (2 * tp) == 0 else 1
    pp = pick(_divisors(devices // (tp * cp), [1, 1, 2, 4, 8]))
    dp = devices // (tp * cp * pp)
    par = {"tp": tp, "cp": cp, "pp": pp}
    seq = pick([None, None, 2 * cp, 4096 + 6 * cp, 1 << 20, 3 if cp == 1 else 6 * cp])
    if pick.coin(5):
        work = {"kind": "inference", "phase": pick(["prefill", "decode"]), "batch_size": pick([1, dp, 64 * dp])}
        if pick.coin():
            work["context_length"] = pick([1, 3, 4096, 1 << 20])
    else:
        work = _training(pick, cluster, layers, pp, dp, seq, experts)
    if experts:
        par["ep"] = pick([e for e in [1, 2, 4, 8, 16, 64] if experts % e == 0 and (cp * dp) % e == 0])
        if pick.coin():
            par["ep_dispatch"] = pick(["alltoall", "allgather", "deepep", "hybridep"])
        if tp > 1 and par["ep"] > 1:
            par["sequence_parallel"] = True  # Megatron's rule for MoE with tp and ep
    if pp > 1:
        _pipeline(pick, par, layers, pp)
    if pick.coin():
        par["zero_stage"] = pick([0, 1, 2, 3])
    if cp > 1 and pick.coin():
        par["cp_comm"] = pick(["p2p", "all_gather", "a2a"])
    if pick.coin(6):
        par["framework"] = pick(["torch", "deepspeed", "megatron-lm-2021"])
    body = {"model": model, "workload": work, "parallel": par, "cluster": cluster}
    if pick.coin(3):
        body["options"] = {"overlap": {k: pick([True, False]) for k in {pick(OVERLAPS) for _ in range(3)}}}
    return body


def custom_cluster(pick: Picker) -> tuple[dict, int]:
    """A cluster given field by field: any fabric, a torus / dragonfly / hypercube / fat tree of odd sizes, the
    slowest and fastest links, NCCL versions and channel pins."""
    per, nodes = pick([1, 2, 3, 4, 8, 16]), pick([1, 2, 3, 4, 8, 9])
    intra = {
        "fabric": pick(["full_mesh", "ring", "switch"]),
        "bandwidth_GBps": pick([0.001, 50, 900]),
        "latency_s": pick([0, 1e-6, 1.0]),
    }
    cluster = {"num_nodes": nodes, "devices_per_node": per, "gpu": pick(GPUS), "nics_per_node": pick([1, per])}
    cluster |= {
        "intra": intra if per > 1 else {"fabric": "none"},
        "nic_bandwidth_GBps": pick([0.001, 12.5, 50]),
        "nic_latency_s": pick([0, 5e-6]),
    }
    topology = pick(["fat_tree", "torus", "dragonfly", "hypercube"])
    network = {"topology": topology}
    if topology == "torus":
        network["dims"] = pick([[nodes], [1, nodes], [nodes, 1, 1]])
    elif topology == "dragonfly":
        network["group_size"] = pick([1, 2, nodes])
    else:
        network |= {
            "nodes_per_leaf": pick([1, 2, 32]),
            "oversubscription": pick([1, 3.5, 1024]),
            "rail_optimized": pick([True, False]),
            "in_network_reduction": pick([True, False]),
        }
        network["topology"] = topology if topology == "hypercube" else "fat_tree"
    cluster["network"] = network
    if pick.coin():
        cluster["nccl_version"] = pick(["2.18", "2.30", "2.21.5"])
    if pick.coin():
        cluster["nccl_env"] = {"NCCL_MAX_NCHANNELS": pick([1, 32]), "NCCL_NVLS_ENABLE": pick([0, 1, 2])}
    return cluster, per * nodes


def custom_plan_body(pick: Picker) -> dict:
    body = plan_body(pick)
    cluster, devices = custom_cluster(pick)
    tp = body["parallel"]["tp"] if devices % body["parallel"]["tp"] == 0 else 1
    keep = ("ep_dispatch", "zero_stage", "sequence_parallel", "framework")
    body["parallel"] = {"tp": tp} | {k: v for k, v in body["parallel"].items() if k in keep}
    if "ep_dispatch" in body["parallel"]:
        body["parallel"]["ep"] = pick([1, 2])
    work = body["workload"]
    if work["kind"] == "training":
        work["global_batch_size"] = work["micro_batch_size"] * devices // tp * pick([1, 4])
        work.pop("cpu_offloading_num_layers", None)
    else:
        work["batch_size"] = devices
    return body | {"cluster": cluster}


# ---- serving -------------------------------------------------------------------------------------------------


SERVE_DISPATCH = ["alltoall", "allgather", "deepep", "deepep_ll", "agrs", "dp_gather", "agrs_quant"]


def _pool(pick: Picker, role: str, kv: int, experts: int) -> dict:
    pool = {"role": role, "workers": pick([1, 2, 3]), "tp": pick(_divisors(kv, [1, 2, 4, 8]))}
    if pick.coin(5):
        pool["pp"] = pick([2, 4])
    if experts and pick.coin(2):
        pool |= {
            "dp": pick([1, 2, 4, 8]),
            "ep": pick([e for e in [1, 2, 4, 8, 16] if experts % e == 0]),
            "attention_dp": pick([True, False]),
        }
        if pick.coin():
            pool["ep_dispatch"] = pick(SERVE_DISPATCH)
    if pick.coin(5):
        pool["max_batch_tokens"] = pick([1, 64, 8192, 1 << 20])
    return pool


def _traffic(pick: Picker) -> dict:
    traffic = {"input_tokens": pick([1, 2, 1000, 131072, 1 << 21]), "output_tokens": pick([1, 2, 200, 1 << 21])}
    if pick.coin(2):
        return traffic | {"request_rate": pick([1e-6, 0.5, 10.0, 1e6])}
    return traffic | {"concurrency": pick([1, 64, 4096, 1 << 22])}


def _serve_options(pick: Picker, cluster: str, experts: int) -> dict:
    options = {}
    if pick.coin(2):
        options["weight_dtype"] = pick(["bf16", "fp8"] + ["nvfp4"] * (cluster in BLACKWELL) + ["mxfp4"] * bool(experts))
    if pick.coin(4):
        options["kv_dtype"] = pick(["bf16", "fp8"])
    if pick.coin(4):
        # a rate in [0, 1] or the mean tokens a step, each past its range too (review r13b #1)
        field, values = pick([("acceptance", [0.0, 0.5, 0.99, 1.0, 2.5]), ("tokens_per_step", [1.0, 2.5, 17.0])])
        options["mtp"] = {"draft_tokens": pick([1, 3, 16]), field: pick(values)}
    for name in ("cuda_graphs", "chunked_prefill"):
        if pick.coin(5):
            options[name] = False
    if pick.coin(5):
        options["two_batch_overlap"] = True
    if experts and pick.coin(5):
        options["redundant_experts"] = pick([1, 32, 4096])
    if pick.coin(6):
        options |= {"prefill_time_scale": pick([0.05, 20]), "decode_time_scale": pick([0.05, 20])}
    return options


def serve_body(pick: Picker) -> dict:
    name = pick(MODELS)
    _, kv, experts = MODELS[name]
    cluster = pick([c for c, per in CLUSTERS.items() if per == 8] + ["gb200-nvl72", "gh200"])
    roles = pick([["both"], ["prefill", "decode"]])
    body = {
        "model": {"preset": name},
        "cluster": {"preset": cluster, "num_nodes": pick([1, 2, 4, 16])},
        "engine": pick(["vllm", "sglang", "trtllm"]),
        "traffic": _traffic(pick),
        "deployment": {"pools": [_pool(pick, role, kv, experts) for role in roles]},
    }
    if pick.coin(6):
        body["model"]["sliding_window"] = pick([1, 128])
    return body | {"options": _serve_options(pick, cluster, experts)}


def serve_search_body(pick: Picker) -> dict:
    name = pick(["llama3-8b", "mixtral-8x7b", "qwen3-30b-a3b", "gpt-oss-20b"])
    cluster = pick(["dgx-h100", "dgx-b200", "dgx-a100", "hgx-h20"])
    body = {
        "model": {"preset": name},
        "cluster": {"preset": cluster, "num_nodes": 1},
        "traffic": _traffic(pick),
        "engines": [pick(["vllm", "sglang", "trtllm"])],
        "top_k": pick([1, 3]),
        "modes": pick([["aggregated"], ["disaggregated"]]),
    }
    if pick.coin(2):
        body["sla"] = {"ttft_s": pick([1e-6, 0.01, 3600]), "tpot_s": pick([1e-6, 0.001, 60])}
    return body | {"options": _serve_options(pick, cluster, MODELS[name][2])}


# ---- the checks ----------------------------------------------------------------------------------------------


def _numbers(value, path=""):
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _numbers(item, f"{path}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _numbers(item, f"{path}[{i}]")
    elif isinstance(value, int | float) and not isinstance(value, bool):
        yield path, value


def check_answer(response, body) -> dict | None:
    """200 (returned, checked for finite non-negative numbers), 422 naming a field and a rule, or 503."""
    assert response.status_code in (200, 422, 503), (response.status_code, response.text[:2000], json.dumps(body))
    if response.status_code == 422:
        for err in response.json()["detail"]:
            assert err["loc"] and err["loc"][0] == "body" and len(err["loc"]) >= 2 and err["msg"], (err, body)
        return None
    if response.status_code == 503:
        return None
    answer = response.json()
    for path, value in _numbers(answer):
        # -1: a timeline block's micro-batch that is per-iteration work (PlanOut's TimelineEvent)
        per_iteration = path.endswith(".microbatch") and value == -1
        assert math.isfinite(value) and (value >= 0 or per_iteration), (path, value, body)
    return answer


def check_plan(plan: dict, body) -> None:
    """A plan's own figures agree: the step holds its compute and every timeline event, MFU is within its bound
    and said when above 1, a stage's peak memory holds its parameters, gradients and optimizer states."""
    check_words(plan, body)
    step = plan["step"]
    if step:
        total = step["time_s"]
        slack = total * (1 + 1e-9) + 1e-12
        assert total > 0 and step["compute_s"] <= slack and step["bubble_s"] <= slack, (step, body)
        assert 0 <= step["mfu"] <= MFU_CEILING, (step["mfu"], body)
        if step["mfu"] > 1:
            assert any("above 100%" in w for w in plan["warnings"]), (plan["warnings"], body)
        compute = {}
        for ev in step.get("timeline", []):
            assert 0 <= ev["start_s"] <= ev["end_s"] <= slack, (ev, total, body)
            if ev["stream"] == "compute":
                compute[ev["stage"]] = compute.get(ev["stage"], 0.0) + ev["end_s"] - ev["start_s"]
        assert all(c <= slack for c in compute.values()), (compute, total, body)
    for stage in (plan["memory"] or {}).get("per_stage", []):
        held = stage["params_bytes"] + stage["grads_bytes"] + stage["optimizer_bytes"]
        assert stage["peak_bytes"] >= held > 0, (stage, body)


def post_and_check(api, path: str, body: dict, check) -> None:
    answer = check_answer(api.post(path, json=body), body)
    if answer is not None:
        check(answer, body)


SCIENTIFIC = re.compile(r"\d[eE][+-]?\d")  # 1e+06, 3.3e+04: people read human numbers (planner/words.py)


def check_words(answer: dict, body) -> None:
    said = [w for w in answer["warnings"] if SCIENTIFIC.search(w)]
    assert not said, (said, body)


def check_serve(answer: dict, body) -> None:
    check_words(answer, body)
    assert answer["tpot_s"] > 0 and answer["gpus"] >= 1, (answer["tpot_s"], body)
    assert answer["ttft_s"] is None or answer["ttft_s"] > 0, body
    for pool in answer["pools"]:
        assert pool["step_s"] > 0 and pool["memory_peak_bytes"] > 0, (pool["role"], body)


# ---- the fuzzers ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("make", [plan_body, custom_plan_body])
@fuzz(130)
@hypothesis.given(data=st.data())
def test_plans_of_combined_fields_make_sense(api, make, data):
    """plan_body: every preset, at scale one time in 8.5; custom_plan_body: clusters given field by field."""
    post_and_check(api, "/v1/plan", make(Picker(data)), check_plan)


@fuzz(12)
@hypothesis.given(data=st.data())
def test_batches_of_combined_plans_answer_item_by_item(api, data):
    pick = Picker(data)
    body = {"requests": [plan_body(pick) for _ in range(pick([1, 3, 5]))]}
    answer = check_answer(api.post("/v1/plan/batch", json=body), body)
    assert answer is not None, body
    for item, request in zip(answer["results"], body["requests"], strict=True):
        if item["ok"]:
            check_plan(item["plan"], request)
        else:
            assert item["error"]["status"] in (422, 503) and item["error"]["detail"][0]["loc"], (item, request)


@fuzz(120)
@hypothesis.given(data=st.data())
def test_serving_deployments_make_sense(api, data):
    post_and_check(api, "/v1/serve", serve_body(Picker(data)), check_serve)


@fuzz(8)
@hypothesis.given(data=st.data())
def test_serving_searches_with_tiny_and_huge_slas_make_sense(api, data):
    body = serve_search_body(Picker(data))
    answer = check_answer(api.post("/v1/serve/search", json=body), body)
    if answer is not None:
        for result in answer["results"]:
            assert result["meets_sla"], body
            check_serve(result["answer"], body)


@fuzz(8)
@hypothesis.given(data=st.data())
def test_small_searches_of_combined_fields_make_sense(api, data):
    """A search whose every dimension is pinned but one or two: the newest constraints over a handful of layouts."""
    pick = Picker(data)
    name = pick(["llama3-8b", "mixtral-8x7b", "deepseek-v3", "gpt-oss-20b"])
    constraints = {
        "tp": 8,
        "cp": 1,
        "pp": pick([1, 2]),
        "zero_stage": 1,
        "micro_batch_size": 1,
        "pipeline_schedule": pick([["1f1b"], ["1f1b", "zb-h1"], ["dualpipev"]]),
        "activation_recompute": pick(["none", ["selective", "full"]]),
        "memory_headroom": pick([0.0, 0.05, 0.99]),
    }
    if MODELS[name][2]:
        constraints |= {"ep": pick([1, 2]), "ep_dispatch": pick([["alltoall"], ["deepep", "hybridep"]])}
    cluster, nodes = pick([("dgx-h100", 2), ("dgx-h100", 4), ("gb200-nvl72", 1)])
    body = {
        "model": {"preset": name},
        "workload": {"global_batch_size": pick([1, 16, 64])},
        "top_k": 3,
        "cluster": {"preset": cluster, "num_nodes": nodes},
        "constraints": constraints,
    }
    answer = check_answer(api.post("/v1/search", json=body), body)
    if answer is not None:
        for result in answer["results"]:
            assert result["step"]["time_s"] > 0 and 0 <= result["step"]["mfu"] <= MFU_CEILING, (result, body)


@fuzz(6)
@hypothesis.given(data=st.data())
def test_calibrations_on_combined_clusters_make_sense(api, data):
    """A profiler trace (compared with a drawn plan's ledger) or nccl-tests logs, on a drawn cluster."""
    pick = Picker(data)
    plan = plan_body(pick)
    body = {"cluster": plan["cluster"]}
    if pick.coin(2):
        body["trace"] = SAMPLED
        if pick.coin(2):
            body["compare"] = {k: plan[k] for k in ("model", "workload", "parallel")}
        if pick.coin(2):
            body["trace_steps"] = pick([1, 3, 100_000])
    else:
        body["logs"] = [{"text": pick(LOGS)} | ({"nodes": pick([1, 2, 64])} if pick.coin(2) else {})]
    check_answer(api.post("/v1/calibrate", json=body), {k: v for k, v in body.items() if k != "trace"})


# ---- what the fuzzers found (docs/hardening.md, Round 10), each by its input --------------------------------

LLAMA8 = {"model": {"preset": "llama3-8b"}, "parallel": {"tp": 8}, "cluster": {"preset": "dgx-h100"}}


def test_a_sliding_window_counts_its_band_in_the_mfu(api):
    """Llama-3 8B with sliding_window 4096 at 131,072 tokens: MFU 1.70 and a 500, since the model FLOPs counted
    every layer's whole square. A sliding layer counts its band, 2·causal_keys(n, w) - 1 keys a query (NeMo's
    flops_formulas.py gpt_oss counts the band's nonzero pairs), equal to PaLM's n at w = n."""
    assert square_keys(8, None) == square_keys(8, 8) == square_keys(8, 100) == 8
    assert square_keys(10, 2) == pytest.approx(2 * (3 + 8 * 2) / 10 - 1) == pytest.approx(2.8)
    assert square_keys(131072, 4096) == pytest.approx(2 * causal_keys(131072, 4096) - 1)
    body = LLAMA8 | {
        "model": {"preset": "llama3-8b", "sliding_window": 4096},
        "workload": {"kind": "training", "micro_batch_size": 1, "global_batch_size": 8, "seq_length": 131072},
    }
    r = api.post("/v1/plan", json=body)
    assert r.status_code == 200, r.text
    full = api.post("/v1/plan", json=body | {"model": {"preset": "llama3-8b"}}).json()["step"]
    windowed = r.json()["step"]
    assert windowed["time_s"] < full["time_s"] / 2  # the window's kernels do a fraction of the work
    assert 0 < windowed["mfu"] < 1


def test_fp8_weights_on_a_gpu_without_the_recipe_name_the_serving_field(api):
    """fp8 weights on an A100 (blockwise by default, sm 9.0): /v1/serve was a 422 at workload.fp8_recipe, a field
    no serving request has, and /v1/serve/search a 200 rejecting all 66 candidates as "no deployment fits"."""
    serve = {
        "model": {"preset": "mixtral-8x7b"},
        "cluster": {"preset": "pcie-server", "num_nodes": 1},
        "engine": "sglang",
        "deployment": {"pools": [{"role": "both", "tp": 8}]},
        "traffic": {"input_tokens": 8192, "output_tokens": 200, "concurrency": 1},
        "options": {"weight_dtype": "fp8"},
    }
    search = {
        "model": {"preset": "llama3-8b"},
        "cluster": {"preset": "dgx-a100", "num_nodes": 1},
        "traffic": serve["traffic"],
        "options": {"weight_dtype": "fp8"},
    }
    for path, body in (("/v1/serve", serve), ("/v1/serve/search", search)):
        r = api.post(path, json=body)
        assert r.status_code == 422, (path, r.text)
        (err,) = r.json()["detail"]
        assert err["loc"] == ["body", "options", "fp8_recipe"] and ">= 9.0" in err["msg"] and "8.0" in err["msg"]
    ok = api.post("/v1/serve", json=serve | {"cluster": {"preset": "dgx-h100"}})
    assert ok.status_code == 200, ok.text


def test_an_overlapped_parameter_gather_is_drawn_inside_the_step(api):
    """Llama-3 405B, ZeRO-1 with overlap_param_gather on 64 H200: the gather was drawn whole after the optimizer,
    ending at 14.72 s in a 13.29 s step. Its exposed part follows the optimizer, its hidden rest (overlapped) the
    step's start; the two add up to the gather."""
    body = {
        "model": {"preset": "llama3-405b"},
        "cluster": {"preset": "dgx-h200", "num_nodes": 8},
        "workload": {
            "kind": "training",
            "micro_batch_size": 1,
            "global_batch_size": 32,
            "seq_length": 4102,
            "activation_recompute": "selective",
        },
        "parallel": {"tp": 4, "zero_stage": 1},
        "options": {"overlap": {"overlap_param_gather": True}},
    }
    plan = api.post("/v1/plan", json=body).json()
    step = plan["step"]
    gathers = [ev for ev in step["timeline"] if ev["name"] == "param_gather"]
    exposed, hidden = sorted(gathers, key=lambda ev: ev.get("overlapped", False))
    assert not exposed.get("overlapped") and hidden["overlapped"] and hidden["start_s"] == 0
    assert exposed["end_s"] <= step["time_s"] * (1 + 1e-9)
    whole = api.post("/v1/plan", json=body | {"options": {"overlap": {"overlap_param_gather": False}}}).json()
    (alone,) = [ev for ev in whole["step"]["timeline"] if ev["name"] == "param_gather"]
    duration = sum(ev["end_s"] - ev["start_s"] for ev in gathers)
    assert duration == pytest.approx(alone["end_s"] - alone["start_s"], rel=1e-6)
    check_plan(plan, body)


def test_a_long_prefill_on_an_a100_answers_an_mfu_above_one_and_says_why(api):
    """Llama-3 8B prefill of 262,144 tokens on an A100: MFU 1.12 under PaLM's count (causal attention's whole
    square, twice what FlashAttention computes) was a 500 against the invariant's old bound of 1."""
    body = LLAMA8 | {
        "workload": {"kind": "inference", "phase": "prefill", "batch_size": 1, "context_length": 262144},
        "cluster": {"preset": "dgx-a100"},
    }
    r = api.post("/v1/plan", json=body)
    assert r.status_code == 200, r.text
    plan = r.json()
    assert 1 < plan["step"]["mfu"] <= MFU_CEILING
    (said,) = [w for w in plan["warnings"] if "above 100%" in w]
    assert "262,144 keys" in said and "twice" in said
    short = api.post("/v1/plan", json=body | {"workload": body["workload"] | {"context_length": 8192}}).json()
    assert short["step"]["mfu"] < 1 and not any("above 100%" in w for w in short["warnings"])


def test_deepep_legs_of_fp8_rows_split_evenly_over_their_ranks(api):
    """vLLM, GPT-OSS 20B with fp8 weights, DeepEP over dp 4 x tp 2 = ep 8: three dispatched rows of 2,972 B (2,880
    fp8 elements and 23 fp32 scales) made an 8,916 B NVLink leg that no all-to-all schedule splits over 8 ranks, a
    422 at body.algorithm (no such field). Each leg's send buffer is in equal blocks (ledger.equal_blocks)."""
    body = {"model": {"preset": "gpt-oss-20b"}, "cluster": {"preset": "dgx-h100", "num_nodes": 2}, "engine": "vllm",
            "deployment": {"pools": [{"tp": 2, "dp": 4, "ep": 8, "attention_dp": True, "ep_dispatch": "deepep"}]},
            "traffic": {"input_tokens": 4096, "output_tokens": 512, "concurrency": 256},
            "options": {"weight_dtype": "fp8"}}  # fmt: skip
    r = api.post("/v1/serve", json=body)
    assert r.status_code == 200, r.text
    legs = [c for pool in r.json()["pools"] for c in pool["calls"] + pool["prefill_calls"] if c["op"] == "alltoall"]
    assert legs and all(c["message_bytes"] % c["group_size"] == 0 for c in legs)
    assert any(c["name"] == "ep.dispatch.nvlink" and c["dtype"] == "fp8" for c in legs)


def test_serving_warnings_write_rates_as_people_read_them(api):
    """DeepSeek-V3 on 32 H200 at a million requests a second: the warnings said "1e+06 requests/s" and "at most
    3.3e+04 requests/s"; they write 1,000,000 and 33,012 (planner/words.py human_number: never scientific notation,
    thousands separated)."""
    body = {"model": {"preset": "deepseek-v3"}, "cluster": {"preset": "dgx-h200", "num_nodes": 4}, "engine": "sglang",
            "deployment": {"pools": [{"role": "prefill", "tp": 8, "ep": 8},
                                     {"role": "decode", "workers": 2, "dp": 8, "ep": 8, "attention_dp": True}]},
            "traffic": {"input_tokens": 1, "output_tokens": 1, "request_rate": 1e6},
            "options": {"weight_dtype": "fp8"}}  # fmt: skip
    warnings = api.post("/v1/serve", json=body).json()["warnings"]
    assert any(w.startswith("1,000,000 requests/s need more sequences") for w in warnings), warnings
    assert any("asked 1,000,000" in w for w in warnings) and not any(SCIENTIFIC.search(w) for w in warnings)


def test_a_serving_search_at_the_lightest_rate_rejects_no_deployment_for_its_pareto_loads(api):
    """Qwen3-30B-A3B, TensorRT-LLM disaggregated on 8 H100 at 1e-6 requests/s: the Pareto front's half load (5e-7)
    is below what a request may ask for, and every deployment that answered at full load was also counted
    "rejected: must be in [1e-6, 1e6] requests/s, got 5e-07". Lighter loads than the floor are not tried."""
    body = {"model": {"preset": "qwen3-30b-a3b"}, "cluster": {"preset": "dgx-h100", "num_nodes": 1},
            "traffic": {"input_tokens": 131072, "output_tokens": 200, "request_rate": 1e-6}, "engines": ["trtllm"],
            "modes": ["disaggregated"], "sla": {"ttft_s": 1e-6, "tpot_s": 1e-6}, "top_k": 3}  # fmt: skip
    r = api.post("/v1/serve/search", json=body)
    assert r.status_code == 200, r.text
    answer = r.json()
    assert not any("requests/s, got" in reason for reason in answer["rejected"]), answer["rejected"]
    assert answer["evaluated"] >= 1 and all(p["request"]["traffic"]["request_rate"] >= 1e-6 for p in answer["pareto"])
