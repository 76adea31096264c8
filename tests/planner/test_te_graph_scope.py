"""Megatron-Core's partial TransformerEngine CUDA graphs of an MoE layer (workload.cuda_graph_scope, outliers15;
docs/step-time.md "The runs more than 20% off, round 15 (outliers15)"), and the three Megatron-Bridge 25.11 rows
entered at their recipes' layouts.

Sources: Megatron-LM cba6b0ed0f (the Megatron-Bridge 25.11 submodule) transformer_layer.py l. 790-797 (a moe_router
graph holds the pre-MLP norm, the router and the in-line shared experts), moe_layer.py l. 296-306 (moe_preprocess:
the graph returns after the dispatcher's preprocess), token_dispatcher.py l. 445-451 (with moe_preprocess graphed the
counts go to the host at "before_ep_alltoall", after the permutation), transformer_config.py l. 1596-1674 (the
scope's rules); Megatron-Bridge r0.2.0 (046518960) scripts/performance/configs/*/workload_base_configs.py.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from bench import step_validation
from planner import ParallelSpec, WorkloadSpec, build_plan, model_preset
from planner._errors import SpecError
from planner.compute import layer_pass
from planner.context import Context
from planner.kernels import COUNT_SYNC, EFFICIENCY, gpu_seconds, host_launches, host_sync, layer_kernels
from planner.workload import validate_workload

DATA = step_validation.load()
CASES = {c["name"]: c for c in DATA["cases"]}
QWEN_B200 = "Megatron-Bridge Qwen3-30B-A3B MXFP8, 8 B200"
SCOPE = ("moe_router", "moe_preprocess")


def _row(name: str, **work):
    spec, w, par, cluster, _ = step_validation.case_inputs(CASES[name], DATA)
    return Context(spec, replace(w, **work), par), cluster.gpu


def test_a_graph_is_one_launch_each_way_and_keeps_its_gpu_time():
    """The B200 Qwen3-30B row's layer (alltoall dispatcher, 16 local experts), as Megatron-LM cba6b0ed0f captures it
    (mend15c, review r15b finding 4): the forward graph holds the pre-MLP norm (1), the router (1), its top-k and
    aux-loss kernels (8), the preprocess's 7 kernels and permutation 1 (3: token_dispatcher.py l. 600-653, the permute
    at l. 641-653) as one replay; the preprocess's 4 copies of the counts stay host launches (made at
    "before_ep_alltoall" in token_dispatch, l. 655-672, after the replay); TE v2.9 graph.py l. 650-655 copies the
    layer's input in first (1): 117 - (1 + 1 + 8 + 11 + 3) + 1 + 4 + 1 = 99. Backward: the norm's, the router's dgrad
    and wgrad, the top-k's (8) and the permute's (3) backward are one replay, after TE's copies of the 3 incoming
    gradients (permuted rows and probs, residual: graph.py l. 668-673, moe_utils.py l. 1063-1068): 152 - 14 + 1 + 3 =
    142. The captured kernels' GPU time does not change; the copies add theirs."""
    plain, gpu = _row(QWEN_B200, cuda_graph_scope=())
    graphed, _ = _row(QWEN_B200, cuda_graph_scope=SCOPE)
    a, b = layer_kernels(plain, True, gpu), layer_kernels(graphed, True, gpu)
    for pa, pb, launches, copy in ((a.forward, b.forward, (117, 99), "graph_input_copy"),
                                   (a.backward, b.backward, (152, 142), "graph_grad_copy")):  # fmt: skip
        assert (sum(host_launches(k) for k in pa), sum(host_launches(k) for k in pb)) == launches
        copies = [k for k in pb if k.name == copy]
        assert len(copies) == 1
        assert sum(k.count for k in pb) == sum(k.count for k in pa) + copies[0].count
        own = sum(gpu_seconds(k) for k in pb) - gpu_seconds(copies[0])
        assert own == pytest.approx(sum(gpu_seconds(k) for k in pa), rel=1e-12)
    by_name = {k.name: k for k in b.forward}
    assert (by_name["dispatch_preprocess"].count, host_launches(by_name["dispatch_preprocess"])) == (11, 4)
    assert host_launches(by_name["permute"]) == 0 and host_launches(by_name["pre_mlp_norm"]) == 1
    assert [k.count for k in b.backward if k.name == "graph_grad_copy"] == [3]
    # the copies' bytes: read and write of the layer input (T x h) forward; of the permuted rows (T x k x h), their
    # probs (T x k) and the residual (T x h) backward, in bf16 (T = 4096 tokens, h 2048, top-8)
    T, h, k = 4096, 2048, 8
    assert by_name["graph_input_copy"].bytes == 2 * T * h * 2
    assert next(x for x in b.backward if x.name == "graph_grad_copy").bytes == 2 * T * (k * h + k + h) * 2
    # the router graph without the preprocess: 10 launches -> 1 replay and the input copy; its 2 gradients (hidden
    # states, probs: the routing map is bool) backward
    router, _ = _row(QWEN_B200, cuda_graph_scope=("moe_router",))
    lk = layer_kernels(router, True, gpu)
    assert sum(host_launches(k) for k in lk.forward) == 117 - 10 + 1 + 1
    assert sum(host_launches(k) for k in lk.backward) == 152 - 11 + 1 + 2


def test_a_graphed_preprocess_moves_the_count_copy_after_the_permutation():
    """Without the graph the alltoall dispatcher copies the counts before the permutation and waits before the
    all-to-all, the permute's launches queued in between (host_sync: 1 queued group); with it the copy and the wait
    are both "before_ep_alltoall": the sync follows the permute and nothing is queued past it."""
    for scope, queued in (((), 1), (("moe_router",), 1), (SCOPE, 0)):
        ctx, gpu = _row(QWEN_B200, cuda_graph_scope=scope)
        fwd = layer_kernels(ctx, True, gpu).forward
        at, q = host_sync(ctx, fwd)
        assert fwd[at].name == COUNT_SYNC and q == queued
        assert fwd[at - 1].name == ("permute" if scope == SCOPE else "dispatch_preprocess")


@pytest.mark.parametrize("dispatch", ["allgather", "hybridep", "deepep"])
def test_only_the_alltoall_dispatcher_moves_its_count_copy_or_graphs_its_permute(dispatch):
    """``cuda_dtoh_point`` is MoEAlltoAllTokenDispatcher's alone (token_dispatcher.py cba6b0ed0f l. 445-451); the
    allgather dispatcher permutes after its all-gather (l. 253-261, 304), the flex ones' preprocess is metadata (l.
    1426-1450): under the preprocess graph their count sync stays where it was and their permute keeps its launches
    (review r15b finding 5)."""
    from planner.kernels import graphed_preprocess

    syncs, launches = [], []
    for scope in (("moe_router",), SCOPE):
        ctx, gpu = _row(QWEN_B200, cuda_graph_scope=scope)
        ctx = Context(ctx.model, ctx.work, replace(ctx.par, ep_dispatch=dispatch))
        fwd = layer_kernels(ctx, True, gpu).forward
        assert not graphed_preprocess(ctx)
        at = next((i for i, k in enumerate(fwd) if k.name == COUNT_SYNC), None)
        syncs.append(None if at is None else fwd[at - 1].name)
        launches.append(sum(host_launches(k) for k in fwd if k.name == "permute"))
    assert syncs[0] == syncs[1] and launches[0] == launches[1]


def test_the_host_bound_forward_saves_the_graphs_launches_at_the_hosts_cost():
    """The row's forward is host-bound (99-117 launches at 38.2 us against ~1.25 ms of GPU a pass), the same 83
    launches after the count wait either way: the graphed forward makes 18 launches fewer before its wait (34 -> 16: a
    replay, the layer input's copy and the 4 count copies, against 24 captured kernel launches) and its span is shorter
    by those launches' host time less the GPU work now on its critical path: the permute, which the wait drains
    instead of running behind the host, and TE's input copy (within one launch)."""
    c = EFFICIENCY.host_launch_s
    spans, before, gpu_s = [], [], {}
    for scope in ((), SCOPE):
        ctx, gpu = _row(QWEN_B200, cuda_graph_scope=scope)
        fwd = layer_kernels(ctx, True, gpu).forward
        at, queued = host_sync(ctx, fwd)
        before.append(sum(host_launches(k) for k in fwd[: at + 1 + queued]))
        assert sum(host_launches(k) for k in fwd[at + 1 + queued :]) == 83
        spans.append(layer_pass(ctx, layer_kernels(ctx, True, gpu), EFFICIENCY).total_s)
        gpu_s.update({k.name: gpu_seconds(k) for k in fwd if k.name in ("permute", "graph_input_copy")})
    assert before == [34, 16]
    moved = gpu_s["permute"] + gpu_s["graph_input_copy"]
    assert spans[0] - spans[1] == pytest.approx(18 * c - moved, abs=c)


def test_the_scope_rules_are_megatrons():
    base = dict(micro_batch_size=1, global_batch_size=8, activation_dtype="bf16")
    for work, words in (
        (dict(cuda_graph_scope=("attn",)), "attn"),
        (dict(cuda_graph_scope=("moe_preprocess",)), "only with moe_router"),
        (dict(cuda_graph_scope=SCOPE, cuda_graphs=True), "cuda_graphs"),
        (dict(cuda_graph_scope=SCOPE, activation_recompute="selective", recompute_modules=("moe",)), "'moe'"),
    ):
        with pytest.raises(SpecError) as e:
            validate_workload(WorkloadSpec(**(base | work)))
        assert e.value.field == "workload.cuda_graph_scope" and words in str(e.value)
    dense = (model_preset("llama3-8b"), WorkloadSpec(**base, cuda_graph_scope=SCOPE), ParallelSpec(dp=8))
    with pytest.raises(SpecError, match="no MoE layers"):
        build_plan(*dense, step_validation.cluster_preset("dgx-h100", 1))


def test_the_scope_over_http_and_its_422():
    client = TestClient(create_app())
    body = {
        "model": {"preset": "qwen3-30b-a3b"},
        "workload": {"kind": "training", "micro_batch_size": 1, "global_batch_size": 8, "seq_length": 4096,
                     "cuda_graph_scope": list(SCOPE)},
        "parallel": {"dp": 8, "ep": 8},
        "cluster": {"preset": "dgx-h100", "num_nodes": 1},
    }  # fmt: skip
    r = client.post("/v1/plan", json=body)
    assert r.status_code == 200, r.text
    rows = {a["field"]: a["value"] for a in r.json()["assumptions"]}
    assert rows["workload.cuda_graph_scope"] == "moe_router, moe_preprocess"
    body["workload"]["cuda_graph_scope"] = ["moe_preprocess"]
    r = client.post("/v1/plan", json=body)
    assert r.status_code == 422
    assert r.json()["detail"][0]["loc"][-1] == "cuda_graph_scope" and "only with moe_router" in r.text


SOURCES = json.loads((Path(step_validation.__file__).parents[1] / "tests/reference/step_times/"
                      "megatron_bridge_25_11_sources.json").read_text())  # fmt: skip


def _entered(case: dict) -> dict:
    """A published.json row's columns as the planner reads them (step_validation.case_inputs)."""
    spec, work, par, _, options = step_validation.case_inputs(case, DATA)
    scope = list(work.cuda_graph_scope) or None
    return {
        "tp": par.tp, "pp": par.pp, "cp": par.cp, "ep": par.ep,
        "vp": par.virtual_pipeline_stages if par.virtual_pipeline_stages != 1 else None,
        "mbs": work.micro_batch_size, "gbs": work.global_batch_size, "seq": work.seq_length or spec.seq_length,
        "cuda_graph_scope": scope, "full_iteration": bool(work.cuda_graphs), "hybridep": par.ep_dispatch == "hybridep",
        "moe_a2a_overlap": bool(options.overlap.overlap_moe_expert_parallel_comm),
        "recompute_modules": list(work.recompute_modules) if work.recompute_modules else None,
    }  # fmt: skip


def test_the_25_11_rows_follow_one_rule_from_the_recorded_sources():
    """Every Megatron-Bridge 25.11 row (13) as the file's rule enters it (published.json notes, mend15c, review r15b
    findings 1, 2 and 10), checked against a recorded excerpt of the sources (megatron_bridge_25_11_sources.json: the
    25.11 table at 5776a6d90b and the r0.2.0 configs at 046518960), not against the file itself: layout, micro-batch
    and flags from the config, GBS and sequence from the table; a row where the two differ carries 'disputed'."""
    rows = SOURCES["rows"]
    assert len(rows) == 13 and {r["case"] for r in rows} == {
        n for n in CASES if n.startswith("Megatron-Bridge") and "26.08" not in n
    }
    layout = ("tp", "pp", "cp", "vp", "ep", "mbs")
    differ = []
    for r in rows:
        table, config = r["table"], r["config"]
        norm = {k: (v if not (k == "vp" and v == 1) else None) for k, v in config.items()}
        te = config["cuda_graph_impl"] == "transformer_engine"
        want = {k: norm[k] for k in layout} | {
            "gbs": table["gbs"], "seq": table["seq"],
            "cuda_graph_scope": config["cuda_graph_scope"] if te else None,
            "full_iteration": config["cuda_graph_scope"] == "full_iteration",
            "hybridep": config["moe_flex_dispatcher_backend"] == "hybridep",
            "moe_a2a_overlap": config["moe_a2a_overlap"], "recompute_modules": config["recompute_modules"],
        }  # fmt: skip
        case = CASES[r["case"]]
        assert _entered(case) == want, r["case"]
        tab = {k: (v if not (k == "vp" and v == 1) else None) for k, v in table.items()}
        conflict = [k for k in (*layout, "gbs") if tab[k] != norm[k]]
        assert ("disputed" in case) == bool(conflict), r["case"]
        if conflict:
            differ.append((r["case"].removeprefix("Megatron-Bridge "), tuple(conflict)))
    assert sorted(differ) == [
        ("DeepSeek-V3 BF16, 256 GB200", ("gbs",)),
        ("GPT-OSS-120B BF16, 64 B200", ("ep",)),
        ("GPT-OSS-120B BF16, 64 GB200", ("mbs", "gbs")),
        ("GPT-OSS-120B BF16, 64 H100", ("mbs",)),
        ("Qwen3-30B-A3B FP8-CS, 16 H100", ("vp", "mbs")),
    ]
    # the Qwen3 H100 row's conflicting history (finding 1): MBS 2 on the release branch until 8aed9a229
    history = SOURCES["history"]["QWEN3_30B_A3B_H100_FP8_CS_BASE_CONFIG"]
    assert [history[c]["mbs"] for c in ("87aa39ce7", "34641780a", "8aed9a229")] == [2, 2, 1]
    assert "87aa39ce7" in CASES["Megatron-Bridge Qwen3-30B-A3B FP8-CS, 16 H100"]["disputed"]


def test_the_re_entered_rows_errors():
    """What the rows entered by the rule read (docs/step-time.md, "Review r15b's findings (mend15c)")."""
    names = ("GPT-OSS-120B BF16, 64 B200", "GPT-OSS-120B BF16, 64 H100", "GPT-OSS-120B BF16, 64 GB200",
             "Qwen3-30B-A3B FP8-CS, 16 H100", "Qwen3-30B-A3B MXFP8, 8 B200")  # fmt: skip
    errors = {n: step_validation.predict(CASES[f"Megatron-Bridge {n}"], DATA)["error"] for n in names}
    # spread15 (merged after mend15c): every step at the pace of its slowest GPU (planner/spread.py): -8.3 -> -6.9,
    # -8.7 -> -6.0, -12.0 -> -9.2, +11.0 -> +12.3, +11.2 -> +12.1; mend15f: the slowest part at clock / pace, its
    # memory-bound kernels (norms, activations, casts, the optimizer step, the MoE permutes) not slowed: -6.9 -> -7.5,
    # -6.0 -> -7.5, -9.2 -> -10.3, +12.3 -> +11.1, +12.1 -> +11.3
    assert {n: round(e, 3) for n, e in errors.items()} == {
        "GPT-OSS-120B BF16, 64 B200": -0.075,
        "GPT-OSS-120B BF16, 64 H100": -0.075,
        "GPT-OSS-120B BF16, 64 GB200": -0.103,
        "Qwen3-30B-A3B FP8-CS, 16 H100": 0.111,
        "Qwen3-30B-A3B MXFP8, 8 B200": 0.113,
    }


def test_a_dense_layer_of_an_moe_model_is_not_graphed():
    """DeepSeek-V3's first three layers are dense: Megatron graphs the router only in an MoE layer
    (transformer_layer.py l. 790), so a dense layer's kernels keep their launches under the scope."""
    spec = model_preset("deepseek-v3")
    work = dict(micro_batch_size=1, global_batch_size=8, seq_length=4096)
    par = ParallelSpec(dp=8, ep=8)
    plain, graphed = (Context(spec, WorkloadSpec(**work, cuda_graph_scope=s), par) for s in ((), SCOPE))
    gpu = step_validation.cluster_preset("dgx-b200", 1).gpu
    assert layer_kernels(graphed, False, gpu) == layer_kernels(plain, False, gpu)
    assert layer_kernels(graphed, True, gpu) != layer_kernels(plain, True, gpu)


# ---- review r15b's findings 3, 6, 7, 8, 10 (mend15c) -------------------------------------------------------------

QWEN_H100 = {
    "model": {"preset": "qwen3-30b-a3b"},
    "parallel": {"dp": 8, "ep": 8},
    "cluster": {"preset": "dgx-h100", "num_nodes": 1},
}
GRAPHED = {"kind": "training", "micro_batch_size": 1, "global_batch_size": 64, "seq_length": 4096,
           "cuda_graph_scope": list(SCOPE)}  # fmt: skip


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        ({"activation_recompute": "full"}, "full activation recompute"),
        ({"cpu_offloading_num_layers": 2}, "CPU offloading (cpu_offloading_num_layers 2)"),
        ({"cuda_graph_scope": ["moe_router", "moe_router"]}, "lists 'moe_router' 2 times"),
    ],
)
def test_megatrons_refusals_beside_a_graph_are_422s(extra, words):
    """Megatron-LM cba6b0ed0f transformer_config.py l. 1645-1649 ("Full-layer CUDA graphs not supported with
    activation recomputation"; arguments.py l. 1255-1257 asserts recompute_granularity != 'full') and l. 1572-1573
    ("CUDA graphs not supported with CPU offloading"); a repeated scope is refused (one graph per scope)."""
    r = TestClient(create_app()).post("/v1/plan", json=QWEN_H100 | {"workload": GRAPHED | extra})
    assert r.status_code == 422, r.text
    detail = r.json()["detail"][0]
    assert detail["loc"][-1] == "cuda_graph_scope" and words in detail["msg"]


def test_megatron_lm_2021_runs_no_te_graphs():
    """The gate is the flavour's trait (Flavour.te_graph_scopes), not its fp8 recipes: Megatron-LM of 2021-22 has
    neither TE nor --cuda-graph-scope, though it inherits Megatron-Core's te_fp8_recipes (review r15b finding 8)."""
    body = QWEN_H100 | {"workload": GRAPHED, "parallel": {"dp": 8, "ep": 8, "framework": "megatron-lm-2021"}}
    r = TestClient(create_app()).post("/v1/plan", json=body)
    assert r.status_code == 422
    assert "framework 'megatron-lm-2021' runs none" in r.json()["detail"][0]["msg"]


def test_the_search_prunes_what_megatron_refuses_beside_a_graph():
    """A search with the scope and no framework constraint answers 200 with Megatron-Core's layouts only, the torch
    and deepspeed ones pruned under workload.cuda_graph_scope (not a 422 naming a framework the user never chose:
    finding 7); full recompute is pruned too (finding 3: before, it ranked first at 3.83-4.00 s)."""
    body = {
        "model": {"preset": "qwen3-30b-a3b"},
        "workload": {k: v for k, v in GRAPHED.items() if k != "micro_batch_size"},
        "cluster": {"preset": "dgx-h100", "num_nodes": 1},
        "constraints": {"tp": [1], "pp": [1], "ep": [8]},
        "top_k": 4,
    }
    r = TestClient(create_app()).post("/v1/search", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["results"] and {x["parallel"]["framework"] for x in out["results"]} == {"megatron"}
    assert all(x["activation_recompute"] != "full" for x in out["results"])
    assert out["pruned"]["workload.cuda_graph_scope"] > 0


def test_layernorm_recompute_under_a_router_graph_reruns_the_input_norm_only():
    """transformer_layer.py cba6b0ed0f l. 386-397: an MoE layer's pre-MLP norm is not recomputed when moe_router is
    in the scope (transformer_config.py l. 1690-1698 warns so): the rerun is one norm, half the two norms' time,
    and the MLP input (b·s·h bf16: 16.8 MB a layer at micro-batch 1, seq 4096) stays in memory (finding 6)."""
    from planner.memory import freed_activations

    spec = model_preset("qwen3-30b-a3b")
    cluster = step_validation.cluster_preset("dgx-h100", 1)
    selective = dict(activation_recompute="selective", recompute_modules=("layernorm",))
    rerun, freed = [], []
    for scope in ((), ("moe_router",)):
        work = dict(micro_batch_size=1, global_batch_size=64, seq_length=4096, cuda_graph_scope=scope)
        steps = [build_plan(spec, WorkloadSpec(**work, **rc), ParallelSpec(dp=8, ep=8), cluster).step.time_s
                 for rc in ({}, selective)]  # fmt: skip
        rerun.append(steps[1] - steps[0])
        ctx = Context(spec, WorkloadSpec(**work, **selective), ParallelSpec(dp=8, ep=8))
        a = freed_activations(ctx, True, frozenset({"layernorm"}))
        freed.append(a.split + a.replicated)
    assert rerun[1] == pytest.approx(rerun[0] / 2, rel=0.02)
    assert freed[0] - freed[1] == 4096 * 2048 * 2
