"""``cluster.calibration.kernels.host_launch_s`` (issue 20, moehost): the host's time per kernel launch in a layer
that syncs with the GPU (Megatron-Core's MoE count sync; default 38.2 us, planner/kernels.py), run through the two
queues of planner/host.py. Over HTTP:
it moves exactly the synced MoE layers (the plan is the pure functions' with the constant), leaves a dense plan
alone, and a value outside 0..1 ms is a 422 naming the field."""

import copy
from dataclasses import replace

import pytest

from app.convert import plan_inputs
from app.schemas.plan import PlanRequest
from app.settings import Settings
from planner import Context
from planner.compute import layer_pass, stage_compute
from planner.kernels import EFFICIENCY, host_sync, layer_kernels
from planner.spread import paced_gpu
from tests.app.test_kernel_constants import PLAN as DENSE  # Llama-3 8B, dp 8 on one DGX A100
from tests.app.test_kernels_http import MOE_MXFP8 as MOE  # Qwen3-30B-A3B as the 25.11 B200 row runs it: MXFP8, ep 8


def with_host(body: dict, host_launch_s: float) -> dict:
    out = copy.deepcopy(body)
    out["cluster"]["calibration"] = {"kernels": {"host_launch_s": host_launch_s}}
    return out


def ok(response) -> dict:
    assert response.status_code == 200, response.text
    return response.json()


def test_a_faster_host_speeds_the_synced_moe_layers_as_the_pure_functions_say(api):
    """By default (38.2 us a launch, Megatron-Core's own layer measured) the B200 Qwen3 layer is host-bound (241
    launches a layer and micro-batch against 3.4 ms of GPU); at 10 us it is not: the plan's compute is stage_compute's
    with that constant (1.402 s against 3.716 s; 3.67 s before moe11b counted the dense linears' quantize launches as
    TransformerEngine 2.9 makes them), and the MoE layers' passes are the two queues'."""
    default = ok(api.post("/v1/plan", json=MOE))
    fast = ok(api.post("/v1/plan", json=with_host(MOE, 1e-5)))
    model, work, par, cluster, _ = plan_inputs(PlanRequest.model_validate(MOE), Settings())
    ctx = Context(model, work, par)
    gpu = paced_gpu(ctx, cluster.gpu)  # the slowest of the plan's 8 GPUs, as the step times it (planner/spread.py)
    quick = replace(EFFICIENCY, host_launch_s=1e-5)
    m = ctx.micro_batches
    for answer, eff in ((fast, quick), (default, EFFICIENCY)):
        comp = stage_compute(ctx, 0, gpu, eff)
        assert answer["step"]["compute_s"] == pytest.approx(
            m * (comp.forward.total_s + comp.backward.total_s) + comp.optimizer_s
        )
    # 1.44 / 3.66 before small9 charged Megatron-Core's whole-gradient-buffer zeroing (kernels.grad_buffer_bytes);
    # 3.67 before moe11b's dense quantize launches (planner/recipes.py, host-bound at 38.2 us a launch); 1.45 before
    # fp8audit14 cast the weights once a step (kernels.te_weight_cache), not in every micro-batch's passes; 1.41 before
    # bwcast14's GEMM ceilings as the GEMM alone (the MXFP8 GEMMs faster, the casts charged once)
    # 1.390 / 3.715 before spread15/mend15f timed the step on the slowest of the 8 GPUs (the fast host's layers
    # GPU-bound: their GEMMs and attention at clock / 1.0211, +0.8%); the host-bound default absorbs nearly all of it
    assert round(fast["step"]["compute_s"], 3) == 1.402 and round(default["step"]["compute_s"], 3) == 3.716
    lk = layer_kernels(ctx, True, gpu)
    assert host_sync(ctx, lk.forward) is not None
    fwd, bwd = (layer_pass(ctx, lk, EFFICIENCY, backward=b) for b in (False, True))
    host = EFFICIENCY.host_launch_s
    assert fwd.host_s > 0 and bwd.total_s == pytest.approx(sum(k.count for k in lk.backward) * host)
    assert fast["cluster"]["calibration"]["kernels"]["host_launch_s"] == 1e-5


def test_a_dense_plan_has_no_sync_and_does_not_move(api):
    assert ok(api.post("/v1/plan", json=with_host(DENSE, 1e-5)))["step"] == ok(api.post("/v1/plan", json=DENSE))["step"]


@pytest.mark.parametrize(
    ("value", "words"), [(2e-3, "less than or equal to 0.001"), (-1e-6, "greater than or equal to 0")]
)
def test_a_host_cost_outside_its_range_is_a_422_naming_the_field(api, value, words):
    r = api.post("/v1/plan", json=with_host(MOE, value))
    assert r.status_code == 422, r.text
    (err,) = r.json()["detail"]
    assert ".".join(map(str, err["loc"][1:])) == "cluster.calibration.kernels.host_launch_s" and words in err["msg"]
