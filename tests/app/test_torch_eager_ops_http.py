"""titan7's request fields over HTTP: workload.norm_kernel ("ops": torchtitan's eager RMSNorm op chain) and
workload.loss_parallel (torch's loss parallelism), their answers and their 422s."""

import copy

import pytest

BODY = {
    "model": {"preset": "llama3-8b"},
    "workload": {"kind": "training", "micro_batch_size": 1, "global_batch_size": 64},
    "parallel": {"tp": 1, "pp": 1, "dp": 8, "framework": "torch"},
    "cluster": {"preset": "dgx-h100", "num_nodes": 1},
    "options": {"timeline": False},
}


def _body(workload=None, **parallel):
    b = copy.deepcopy(BODY)
    b["workload"] |= workload or {}
    b["parallel"] |= parallel
    return b


def _post(api, b, status=200):
    r = api.post("/v1/plan", json=b)
    assert r.status_code == status, r.text
    return r.json()


def test_norm_kernel_ops_over_http(api):
    """Llama 3 8B, 32 layers x 2 norms + the final norm over 8,192 x 4,096 per micro-batch, 8 micro-batches: the op
    chain adds (36 + 92) - (4 + 8) B an element and (8 + 16) - (1 + 1) launches of 5 us, at 0.877 of 3,350 GB/s;
    the part of those bytes that runs beside FSDP2's hidden gathers shares HBM with them (planner/contention.py),
    so the difference is at least the closed form and at most 1% over it."""
    fused = _post(api, _body())["step"]["compute_s"]
    ops = _post(api, _body({"norm_kernel": "ops"}))["step"]["compute_s"]
    n = 8192 * 4096
    per_norm = (36 + 92 - 4 - 8) * n / (3350e9 * 0.877) + (8 + 16 - 1 - 1) * 5e-6
    assert 8 * 65 * per_norm * (1 - 1e-9) <= ops - fused <= 8 * 65 * per_norm * 1.01
    assert _post(api, _body({"norm_kernel": "fused"}))["step"]["compute_s"] == fused


def test_norm_kernel_refusals_over_http(api):
    r = _post(api, _body({"norm_kernel": "ops"}, framework="megatron"), 422)
    first = r["detail"][0]
    assert ".".join(map(str, first["loc"][1:])) == "workload.norm_kernel" and "'megatron'" in first["msg"]
    r = _post(api, _body({"norm_kernel": "triton"}), 422)
    assert "norm_kernel" in [str(p) for p in r["detail"][0]["loc"]]


def test_loss_parallel_over_http(api):
    """tp 8 with SP: the logits' all-gather (8,192 x 128,256 bf16) gives way to 3 fp32 all-reduces of 8,192 values."""
    body = _body({"global_batch_size": 8}, tp=8, dp=1, sequence_parallel=True)
    plain = {c["name"]: c for c in _post(api, body)["calls"]}
    body["workload"]["loss_parallel"] = True
    lp = {c["name"]: c for c in _post(api, body)["calls"]}
    assert "tp.lm_head.logits" in plain and "tp.cross_entropy" not in plain
    assert "tp.lm_head.logits" not in lp
    ce = lp["tp.cross_entropy"]
    assert ce["message_bytes"] == 8192 * 4 and ce["op"] == "allreduce" and "loss.py" in ce["source"]
    r = _post(api, _body({"loss_parallel": True}, framework="megatron"), 422)
    first = r["detail"][0]
    assert ".".join(map(str, first["loc"][1:])) == "workload.loss_parallel" and "always" in first["msg"]
    r = _post(api, _body({"kind": "inference", "loss_parallel": True, "micro_batch_size": None,
                          "global_batch_size": None}), 422)  # fmt: skip
    assert "loss_parallel" in r["detail"][0]["msg"] or "loss_parallel" in str(r["detail"][0]["loc"])


def test_optimizer_implementation_over_http(api):
    """Llama 3 8B (8,030,261,248 parameters) under FSDP2 on 8 ranks: foreach AdamW reads and writes 80 - 28 = 52 B
    more a local parameter than the fused one, once a step, at 0.877 of 3,350 GB/s."""
    base = _body({"global_batch_size": 8}, zero_stage=3)
    fused = _post(api, base)["step"]["compute_s"]
    base["workload"]["optimizer_implementation"] = "foreach"
    foreach = _post(api, base)["step"]["compute_s"]
    assert foreach - fused == pytest.approx(8030261248 / 8 * 52 / (3350e9 * 0.877), rel=1e-6)
    r = _post(api, _body({"optimizer_implementation": "foreach"}, framework="megatron"), 422)
    assert ".".join(map(str, r["detail"][0]["loc"][1:])) == "workload.optimizer_implementation"
    r = _post(api, _body({"optimizer_implementation": "sgd"}), 422)
    assert "optimizer_implementation" in [str(p) for p in r["detail"][0]["loc"]]


def test_the_torch_switches_are_listed_in_assumptions(api):
    """The plan's assumptions name the three torch switches as resolved: loss parallelism (tp > 1 only), the AdamW
    implementation, the norm kernel (eager frameworks only); Megatron's plan lists none of them."""
    body = _body({"global_batch_size": 8}, tp=8, dp=1, sequence_parallel=True)
    rows = {r["field"]: r for r in _post(api, body)["assumptions"]}
    lp = rows["workload.loss_parallel"]
    assert lp["value"] == "off" and "disable_loss_parallel" in lp["source"]
    assert rows["workload.optimizer_implementation"]["value"] == "fused"
    assert rows["workload.norm_kernel"]["value"] == "fused"
    body["workload"] |= {"loss_parallel": True, "optimizer_implementation": "foreach", "norm_kernel": "ops"}
    rows = {r["field"]: r for r in _post(api, body)["assumptions"]}
    assert [rows[f]["value"] for f in ("workload.loss_parallel", "workload.optimizer_implementation",
                                       "workload.norm_kernel")] == ["on", "foreach", "ops"]  # fmt: skip
    body["workload"]["torch_compile"] = True  # Inductor fuses the chain inside the blocks
    assert {r["field"]: r for r in _post(api, body)["assumptions"]}["workload.norm_kernel"]["value"] == "fused"
    tp1 = {r["field"] for r in _post(api, _body())["assumptions"]}
    assert "workload.loss_parallel" not in tp1 and "workload.optimizer_implementation" in tp1
    megatron = {r["field"] for r in _post(api, _body(framework="megatron"))["assumptions"]}
    assert not megatron & {"workload.loss_parallel", "workload.optimizer_implementation", "workload.norm_kernel"}


def test_norm_kernel_ops_refused_for_a_layernorm_model_over_http(api):
    """The op chain is RMSNorm's (kernels.RMSNORM_OPS); a LayerNorm model has none to price: a 422 naming the field."""
    b = _body({"norm_kernel": "ops"})
    b["model"] = {"preset": "llama3-8b", "norm": "layernorm"}
    first = _post(api, b, 422)["detail"][0]
    assert ".".join(map(str, first["loc"][1:])) == "workload.norm_kernel" and "'layernorm'" in first["msg"]
    b["workload"]["norm_kernel"] = "fused"
    assert _post(api, b)["step"]["compute_s"] > 0
