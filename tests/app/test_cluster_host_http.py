"""The node's host CPU over HTTP (issue 20, grace9): a GB200 NVL72 cluster's Grace hosts (cpu_vendor arm) dispatch eager
PyTorch 2.61x slower per op than the x86 reference (planner/kernels.py HOST_CPUS, TransformerEngine issue 2053), which
moves exactly the host-priced parts of a plan (here torchtitan's synced MoE layer, whose own host cost per launch is
eager PyTorch's); a calibrated cluster.calibration.kernels.host_launch_s (the user's own host) replaces it as given."""

import copy

import pytest

from app.convert import plan_inputs
from app.schemas.plan import PlanRequest
from app.settings import Settings
from planner import Context, build_plan
from planner.compute import layer_pass
from planner.kernels import EFFICIENCY, gpu_efficiency, host_sync, layer_kernels, queue_launch_s

# Qwen3-30B-A3B under torchtitan, bf16, ep 8 on 8 GPUs of one GB200 NVL72 rack: its dispatcher's sync for the
# all-to-all's splits makes the MoE layer's forward run through the host's queue (planner/host.py)
GB200 = {
    "model": {"preset": "qwen3-30b-a3b"},
    "workload": {"kind": "training", "micro_batch_size": 1, "global_batch_size": 64, "seq_length": 4096},
    "parallel": {"dp": 8, "ep": 8, "framework": "torch"},
    "cluster": {"preset": "gb200-nvl72", "num_nodes": 1, "devices_per_node": 8, "nics_per_node": 8},
    "options": {"timeline": False},
}


def _with(body: dict, **cluster) -> dict:
    out = copy.deepcopy(body)
    out["cluster"] |= cluster
    return out


def _plan(api, body: dict) -> dict:
    r = api.post("/v1/plan", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def _planner(body: dict):
    """The request's inputs in-process: the context, the cluster and the pure functions' step compute."""
    inputs = plan_inputs(PlanRequest.model_validate(body), Settings())
    model, work, par, cluster, _ = inputs
    return Context(model, work, par), cluster, build_plan(*inputs).step.compute_s


def test_a_gb200_plan_runs_on_grace_hosts_and_an_x86_node_is_faster_by_the_host_factor(api):
    grace, xeon = _plan(api, GB200), _plan(api, _with(GB200, cpu_vendor="intel"))
    assert grace["cluster"]["cpu_vendor"] == "arm" and xeon["cluster"]["cpu_vendor"] == "intel"
    layers = {}
    for answer, body in ((grace, GB200), (xeon, _with(GB200, cpu_vendor="intel"))):
        ctx, cluster, compute = _planner(body)
        assert answer["step"]["compute_s"] == pytest.approx(compute)  # the pure functions' answer
        eff = gpu_efficiency(cluster.gpu)
        lk = layer_kernels(ctx, True, cluster.gpu)
        assert host_sync(ctx, lk.forward) is not None
        fwd = layer_pass(ctx, lk, eff)
        layers[cluster.cpu_vendor] = (sum(k.count for k in lk.forward), queue_launch_s(ctx, eff), fwd.total_s)
    (n, c, arm_s), (_, c_x86, x86_s) = layers["arm"], layers["intel"]
    assert c == pytest.approx(2.61 * c_x86) and c_x86 == 26.1e-6  # torch's own host per launch, on each host
    # Grace: host-bound, its launches x 68.1 us and the sync's own device-to-host copy (kernel_s)
    assert arm_s == pytest.approx(n * c + EFFICIENCY.kernel_s) and x86_s < arm_s
    assert grace["step"]["compute_s"] > xeon["step"]["compute_s"]


def test_a_calibrated_host_launch_overrides_the_grace_factor(api):
    """20 us a launch read off the user's own trace: the synced MoE layers run at it on the Grace rack as on an x86
    one (their passes are the same); the answer carries the constant back."""
    mine = {"calibration": {"kernels": {"host_launch_s": 2e-5}}}
    grace = _plan(api, _with(GB200, **mine))
    assert grace["cluster"]["calibration"]["kernels"]["host_launch_s"] == 2e-5
    passes = {}
    for vendor in ("arm", "intel"):
        ctx, cluster, compute = _planner(_with(GB200, cpu_vendor=vendor, **mine))
        eff = gpu_efficiency(cluster.gpu)
        assert eff.host_launch_s == 2e-5 and queue_launch_s(ctx, eff) == 2e-5
        lk = layer_kernels(ctx, True, cluster.gpu)
        passes[vendor] = (layer_pass(ctx, lk, eff), layer_pass(ctx, lk, eff, backward=True))
        if vendor == "arm":
            assert grace["step"]["compute_s"] == pytest.approx(compute)
    assert passes["arm"] == passes["intel"]
    assert grace["step"]["compute_s"] < _plan(api, GB200)["step"]["compute_s"]


def test_an_unknown_cpu_vendor_is_a_422_naming_the_field(api):
    r = api.post("/v1/plan", json=_with(GB200, cpu_vendor="sparc"))
    assert r.status_code == 422, r.text
    assert "cpu_vendor" in r.text and "arm" in r.text
