"""Issue 20 (small9): Megatron-Core's optimizer step by hand.

Megatron-LM f2e5db402c (July 2024, the weak-scaling table's code) and d98e8a6 run the same step:
megatron/core/optimizer/optimizer.py MixedPrecisionOptimizer.step = clip_grad_norm (multi_tensor_l2norm reads each
fp32 gradient of the shard: 4 B), FusedAdam (read master, gradient, exp_avg, exp_avg_sq; write three: 28 B), the
master's copy into the bf16 parameter (distrib_optimizer.py _copy_main_params_to_model_params: read 4, write 2),
and the train step's zero_grad_buffer (training.py) zeroes the WHOLE local fp32 gradient buffer every iteration,
not only the optimizer's 1/dp shard (param_and_grad_buffer.py reset: ``self.grad_data.zero_()``).
"""

from dataclasses import replace

import pytest

from collectives.topology.gpu import GPUS
from planner import ParallelSpec, WorkloadSpec, model_preset
from planner.compute import optimizer_key, optimizer_s
from planner.context import Context
from planner.kernels import ADAM_BYTES, efficiency, grad_buffer_bytes, optimizer_bytes
from planner.memory import param_totals

H100 = GPUS["h100-sxm5-80gb"]


def ctx_of(framework="megatron", zero=1, dp=8, tp=1, **work):
    model = replace(model_preset("llama3-8b"), num_layers=4)
    par = ParallelSpec(tp=tp, dp=dp, zero_stage=zero, framework=framework)
    return Context(model, WorkloadSpec(micro_batch_size=1, global_batch_size=8 * dp, **work), par)


def test_megatron_core_bytes_by_hand():
    """bf16 parameters, fp32 main gradients: 4 + 28 + 4 + 2 = 38 B a shard parameter, 4 B a local parameter."""
    ctx = ctx_of()
    assert optimizer_bytes(ctx) == 38
    assert grad_buffer_bytes(ctx) == 4
    # gradients reduced in bf16: the buffer is bf16, its zeroing 2 B a parameter
    assert grad_buffer_bytes(ctx_of(grad_reduce_dtype="bf16")) == 2


@pytest.mark.parametrize("zero, dp", [(1, 16), (1, 8), (0, 8), (1, 1)])
def test_megatron_core_step_seconds(zero, dp):
    """The step's seconds: the shard's 38 B a parameter plus the whole local buffer's 4 B, at the HBM rate. With
    the distributed optimizer over dp > 9 the zeroing (4 B x all) outweighs the shard's update (38 B x 1/dp): at the
    weak-scaling table's dp 48, 4 against 0.79 B a local parameter."""
    ctx = ctx_of(zero=zero, dp=dp)
    dense, expert, _ = param_totals(ctx, 0)
    assert expert == 0
    shard = dense / (dp if zero >= 1 else 1)
    rate = H100.hbm_GBps * 1e9 * efficiency(H100, None).hbm
    assert optimizer_s(ctx, 0, H100) == pytest.approx((38 * shard + 4 * dense) / rate, rel=1e-12)
    if zero >= 1:
        assert (4 * dense > 38 * shard) == (dp > 9)


@pytest.mark.parametrize("framework", ["deepspeed", "torch", "megatron-lm-2021"])
def test_other_flavours_keep_their_step(framework):
    """DeepSpeed keeps one fused Adam over the shard (ADAM_BYTES), torch its AdamW and clipping, Megatron-LM 2021
    its Float16Optimizer passes: none charges Megatron-Core's buffer zeroing."""
    ctx = ctx_of(framework=framework, zero=1 if framework != "megatron-lm-2021" else 0)
    assert grad_buffer_bytes(ctx) == 0
    if framework == "deepspeed":
        assert optimizer_bytes(ctx) == ADAM_BYTES


def test_optimizer_key_reads_the_buffer_pass():
    """Two layouts whose optimizer step differs only in the buffer's dtype do not share the search's cached step."""
    assert optimizer_key(ctx_of(), 0) != optimizer_key(ctx_of(grad_reduce_dtype="bf16"), 0)
    assert optimizer_s(ctx_of(grad_reduce_dtype="bf16"), 0, H100) < optimizer_s(ctx_of(), 0, H100)
