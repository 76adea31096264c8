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

from dataclasses import replace

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
    """The B200 Qwen3-30B row's layer (alltoall dispatcher, 16 local experts): graphed, the pre-MLP norm (1), the
    router (1), its top-k and aux-loss kernels (8) and the preprocess (11) are one replay forward, 117 -> 97 host
    launches; the norm's, the router's dgrad and wgrad and the top-k's backward (1 + 1 + 1 + 8) one replay backward,
    152 -> 142. The kernels' count and GPU time do not change."""
    plain, gpu = _row(QWEN_B200, cuda_graph_scope=())
    graphed, _ = _row(QWEN_B200, cuda_graph_scope=SCOPE)
    a, b = layer_kernels(plain, True, gpu), layer_kernels(graphed, True, gpu)
    for pa, pb, launches in ((a.forward, b.forward, (117, 97)), (a.backward, b.backward, (152, 142))):
        assert (sum(host_launches(k) for k in pa), sum(host_launches(k) for k in pb)) == launches
        assert sum(k.count for k in pa) == sum(k.count for k in pb) == launches[0]
        assert sum(gpu_seconds(k) for k in pb) == pytest.approx(sum(gpu_seconds(k) for k in pa), rel=1e-12)
    # the router graph without the preprocess: 10 launches -> 1 forward, the preprocess's 11 stay
    router, _ = _row(QWEN_B200, cuda_graph_scope=("moe_router",))
    assert sum(host_launches(k) for k in layer_kernels(router, True, gpu).forward) == 117 - 9


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


def test_the_host_bound_forward_saves_the_graphs_launches_at_the_hosts_cost():
    """The row's forward is host-bound (97-117 launches at 38.2 us against ~1.25 ms of GPU): the graphed forward's
    span is shorter by about the 20 launches it no longer makes (764 us), less the permute's launches the host can no
    longer queue before its wait (3 x 38.2 us), within one launch."""
    plain, gpu = _row(QWEN_B200, cuda_graph_scope=())
    graphed, _ = _row(QWEN_B200, cuda_graph_scope=SCOPE)
    c = EFFICIENCY.host_launch_s
    spans = [layer_pass(x, layer_kernels(x, True, gpu), EFFICIENCY).total_s for x in (plain, graphed)]
    assert spans[0] - spans[1] == pytest.approx(20 * c - 3 * c, abs=c)


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


def test_the_recipes_layouts_replace_the_tables_where_nvidias_next_tables_agree():
    """The three 25.11 rows entered at their recipes' layouts (Megatron-Bridge r0.2.0 workload_base_configs.py), each
    corroborated by a later NVIDIA table that measured that layout: GPT-OSS B200 EP64 (26.02: 8047 tokens/s/GPU at
    EP64, 26.04: 13045 at EP8; this row 8213), GPT-OSS H100 MBS 1 (26.02: 5993 at MBS 1; the table's GA 2 does not
    fit MBS 4 at PP4 DP16), Qwen3-30B H100 MBS 1 VP 12 (26.02: 5113 at PP2 VP12 MBS 1; this row 5275; the table's MBS 2
    VP 24 are its 25.09 tokendrop row's, 10494)."""
    got = {
        name: (c["parallel"].get("ep"), c["parallel"].get("virtual_pipeline_stages"), c["workload"]["micro_batch_size"])
        for name, c in CASES.items()
        if name.startswith("Megatron-Bridge")
        and ("GPT-OSS-120B BF16, 64 B200" in name or "H100" in name)
        and ("GPT-OSS" in name or "Qwen3" in name)
    }
    assert got == {
        "Megatron-Bridge GPT-OSS-120B BF16, 64 B200": (64, None, 4),
        "Megatron-Bridge GPT-OSS-120B BF16, 64 H100": (8, None, 1),
        "Megatron-Bridge Qwen3-30B-A3B FP8-CS, 16 H100": (8, 12, 1),
    }
    scoped = sorted(n for n, c in CASES.items() if c["workload"].get("cuda_graph_scope"))
    assert scoped == [
        "Megatron-Bridge DeepSeek-V3 BF16, 256 GB200",
        "Megatron-Bridge Qwen3-30B-A3B MXFP8, 8 B200",
        "Megatron-Bridge Qwen3-30B-A3B MXFP8, 8 GB200",
    ]
    # what they read now (docs/step-time.md, outliers15): all within 12%
    errors = {n: step_validation.predict(CASES[n], DATA)["error"] for n in (*got, QWEN_B200)}
    assert {n: round(e, 3) for n, e in errors.items()} == {
        "Megatron-Bridge GPT-OSS-120B BF16, 64 B200": -0.083,
        "Megatron-Bridge GPT-OSS-120B BF16, 64 H100": -0.087,
        "Megatron-Bridge Qwen3-30B-A3B FP8-CS, 16 H100": 0.110,
        QWEN_B200: 0.111,
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
