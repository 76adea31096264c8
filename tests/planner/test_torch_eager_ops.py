"""titan7 (issue 20): torch-native mechanisms the torchtitan rows ran, each from its source.

- torchtitan's RMSNorm of norm_type "rmsnorm" (torchtitan 9dec370 torchtitan/models/norms.py) as its eager op chain
  (workload.norm_kernel "ops", kernels.RMSNORM_OPS): 36 B an element in 8 kernels forward, 92 B in 16 backward;
- torch's loss parallelism (workload.loss_parallel; torch/distributed/tensor/parallel/loss.py): the logits stay
  sharded, 3 fp32 all-reduces of b·s values, and the loss's own kernels (kernels.LOSS_PARALLEL_CROSS_ENTROPY)
  when it runs eager (torchtitan 9dec370 compiles the blocks only: cross_entropy_fusion false).
"""

import sys
from dataclasses import replace
from pathlib import Path

import pytest

from collectives.topology import cluster_preset
from planner import Options, ParallelSpec, SpecError, WorkloadSpec, build_plan, model_preset
from planner.compute import head_kernels
from planner.context import Context
from planner.kernels import (
    EFFICIENCY,
    LOSS_PARALLEL_CROSS_ENTROPY,
    RMSNORM_OPS,
    layer_kernels,
    memory_kernel,
)

ROOT = Path(__file__).resolve().parents[2]
H100 = cluster_preset("dgx-h100", 1).gpu
MODEL = replace(model_preset("llama3-8b"), num_layers=2)


def _ctx(framework="torch", tp=1, **work):
    w = WorkloadSpec(micro_batch_size=1, global_batch_size=8 // (8 // tp) * 8, **work)
    return Context(MODEL, w, ParallelSpec(dp=8 // tp, tp=tp, sequence_parallel=tp > 1, framework=framework))


def _kernel(kernels, name):
    (k,) = [k for k in kernels if k.name == name]
    return k


def test_the_op_chain_norm_by_hand():
    """8,192 tokens x 4,096: forward 36 B an element in 8 launches, backward 92 B in 16, at 0.877 of the H100's
    3,350 GB/s and 5 us a launch (each launch at least the 10 us host dispatch: not binding at this size)."""
    assert RMSNORM_OPS == ((36, 8), (92, 16))
    n = 8192 * 4096
    rate = 3350e9 * 0.877
    lk = layer_kernels(_ctx(norm_kernel="ops"), False, H100)
    for name in ("input_norm", "pre_mlp_norm"):
        f, b = _kernel(lk.forward, name), _kernel(lk.backward, name + ".bwd")
        assert (f.bytes, f.count, b.bytes, b.count) == (36 * n, 8, 92 * n, 16)
        assert f.time_s == pytest.approx(36 * n / rate + 8 * 5e-6, rel=1e-12)
        assert b.time_s == pytest.approx(92 * n / rate + 16 * 5e-6, rel=1e-12)
    fused = layer_kernels(_ctx(), False, H100)
    assert _kernel(fused.forward, "input_norm").bytes == 4 * n and _kernel(fused.forward, "input_norm").count == 1
    # everything else of the layer is the same list
    same = [k for k in lk.forward if "norm" not in k.name]
    assert same == [k for k in fused.forward if "norm" not in k.name]


def test_the_op_chain_against_the_h200_measurement():
    """The same chain (x.float(), pow, mean, rsqrt, mul, cast, * w) measured on this project's H200
    (tests/reference/kernels/h200/run2.json memory_bound rms_norm_eager: 442 us at 8,192 x 4,096, 859 us at
    8,192 x 8,192): the byte model is a lower bound, 26-29% under (its reductions do not stream at copy speed)."""
    sys.path.insert(0, str(ROOT / "bench"))
    import h200_tables

    rows = {r["op"]: r for r in h200_tables.load("run2")["memory_bound"]}
    for hidden, measured in ((4096, 442e-6), (8192, 859e-6)):
        row = rows[f"rms_norm_eager.h{hidden}"]
        assert row["eager_s"] == pytest.approx(measured, rel=0.01)
        n = row["tensor_bytes"] / 2
        k = memory_kernel("norm", RMSNORM_OPS[0][0] * n, h200_tables.GPU, EFFICIENCY, RMSNORM_OPS[0][1])
        assert 0.70 < k.time_s / row["eager_s"] < 0.76


def test_compile_and_fusing_frameworks_keep_one_norm_kernel():
    """Inductor fuses the chain inside compiled blocks; Megatron's TE norm is fused: 'ops' is refused there."""
    lk = layer_kernels(_ctx(norm_kernel="ops", torch_compile=True), False, H100)
    assert _kernel(lk.forward, "input_norm").count == 1
    with pytest.raises(SpecError) as e:
        build_plan(MODEL, WorkloadSpec(global_batch_size=8, norm_kernel="ops"), ParallelSpec(dp=8),
                   cluster_preset("dgx-h100", 1))  # fmt: skip
    assert e.value.field == "workload.norm_kernel" and "'megatron'" in str(e.value)
    with pytest.raises(SpecError) as e:
        build_plan(MODEL, WorkloadSpec(global_batch_size=8, norm_kernel="triton"), ParallelSpec(dp=8),
                   cluster_preset("dgx-h100", 1))  # fmt: skip
    assert e.value.field == "workload.norm_kernel"


def _tp_plan(**work):
    w = WorkloadSpec(micro_batch_size=1, global_batch_size=1, **work)
    par = ParallelSpec(tp=8, sequence_parallel=True, framework="torch")
    return build_plan(MODEL, w, par, cluster_preset("dgx-h100", 1), Options(timeline=False))


def test_loss_parallel_ledger():
    """loss_parallel: no all-gather of the 8,192 x 128,256 bf16 logits (2.1 GB); instead loss.py's 3 fp32
    all-reduces of 8,192 values (amax, sum of exponentials, the target logit's _MaskPartial). Default (None): the
    flavour's, the logits gathered as the recorded DTensor steps ran."""
    plain = {pc.call.name: pc.call for pc in _tp_plan().calls}
    lp = {pc.call.name: pc.call for pc in _tp_plan(loss_parallel=True).calls}
    assert plain["tp.lm_head.logits"].message_bytes == 8192 * 128256 * 2 and "tp.cross_entropy" not in plain
    assert "tp.lm_head.logits" not in lp
    ce = lp["tp.cross_entropy"]
    assert (ce.op.value, ce.message_bytes, ce.calls_per_iteration, ce.dtype) == ("allreduce", 8192 * 4, 3, "fp32")
    assert "torch/distributed/tensor/parallel/loss.py" in ce.source
    assert {n for n in plain if n != "tp.lm_head.logits"} == {n for n in lp if n != "tp.cross_entropy"}
    assert _tp_plan(loss_parallel=False).step.time_s == _tp_plan().step.time_s


def test_loss_parallel_kernels_by_hand():
    """The eager vocab-parallel loss over the rank's 8,192 x 16,032 logits (torch's head keeps the checkpoint's
    128,256 unpadded, split 8 ways by DTensor: kernels.vocab_shard, titan8): 38 B a logit in 6 kernels forward, 38 B
    in 5 backward; torch.compile fuses it unless cross_entropy_fusion says the loss stayed eager (torchtitan
    9dec370); at tp 1 (no sharding) torch's own F.cross_entropy stays one kernel."""
    assert LOSS_PARALLEL_CROSS_ENTROPY == ((38, 6), (38, 5))
    logits = 8192 * (128256 // 8)
    ctx = _ctx(tp=8, loss_parallel=True)
    _, ce = head_kernels(ctx, H100)
    assert (ce.bytes, ce.count) == (38 * logits, 6)
    assert ce.time_s == pytest.approx(38 * logits / (3350e9 * 0.877) + 6 * 5e-6, rel=1e-12)
    compiled = head_kernels(_ctx(tp=8, loss_parallel=True, torch_compile=True), H100)[1]
    assert (compiled.bytes, compiled.count) == (8 * logits, 1)
    eager_loss = head_kernels(_ctx(tp=8, loss_parallel=True, torch_compile=True, cross_entropy_fusion=False), H100)[1]
    assert eager_loss == ce
    # without loss parallelism torch's eager loss is one F.cross_entropy kernel of 18 B a logit, compiled or not
    # when it stays eager
    one = head_kernels(_ctx(torch_compile=True, cross_entropy_fusion=False), H100)[1]
    assert (one.bytes, one.count) == (18 * 8192 * 128256, 1)  # tp 1: 128,256 padded to 128 is itself


def test_loss_parallel_is_torchs_switch():
    with pytest.raises(SpecError) as e:
        build_plan(MODEL, WorkloadSpec(global_batch_size=1, loss_parallel=False),
                   ParallelSpec(tp=8, sequence_parallel=True), cluster_preset("dgx-h100", 1))  # fmt: skip
    assert e.value.field == "workload.loss_parallel" and "always vocab-parallel" in str(e.value)


def test_torch_optimizer_step_by_hand():
    """FSDP2 over 8 ranks shards the 2-layer model's parameters 8 ways: torch.optim.AdamW fused 28 B or foreach 80 B
    a local fp32 parameter, each after torchtitan's clip_grad_norm_ (_foreach_norm 4 B + the unconditional
    _foreach_mul_ 8 B), at 0.877 of the H100's 3,350 GB/s; Megatron-Core's own
    step: 38 B and the buffer's zeroing."""
    from planner.compute import optimizer_s
    from planner.kernels import ADAM_BYTES, CLIP_GRAD_NORM_BYTES, TORCH_ADAMW_BYTES
    from planner.memory import param_totals

    assert TORCH_ADAMW_BYTES == {"fused": 28, "foreach": 80} and CLIP_GRAD_NORM_BYTES == 12 and ADAM_BYTES == 34
    rate = 3350e9 * 0.877
    for impl, nbytes in ((None, 40), ("fused", 40), ("foreach", 92)):
        work = WorkloadSpec(global_batch_size=8, optimizer_implementation=impl)
        ctx = Context(MODEL, work, ParallelSpec(dp=8, zero_stage=3, framework="torch"))
        dense, expert, _ = param_totals(ctx, 0)
        assert expert == 0
        assert optimizer_s(ctx, 0, H100) == pytest.approx(dense / 8 * nbytes / rate, rel=1e-12)
    megatron = Context(MODEL, WorkloadSpec(global_batch_size=8), ParallelSpec(dp=8, zero_stage=1))
    dense = param_totals(megatron, 0)[0]
    # Megatron-Core (small9: kernels.MEGATRON_CORE_OPTIMIZER): 38 B a shard parameter, and zero_grad_buffer's 4 B over
    # the whole local fp32 gradient buffer
    assert optimizer_s(megatron, 0, H100) == pytest.approx((dense / 8 * 38 + dense * 4) / rate, rel=1e-12)
    with pytest.raises(SpecError) as e:
        build_plan(MODEL, WorkloadSpec(global_batch_size=8, optimizer_implementation="foreach"), ParallelSpec(dp=8),
                   cluster_preset("dgx-h100", 1))  # fmt: skip
    assert e.value.field == "workload.optimizer_implementation" and "'megatron'" in str(e.value)


def test_gathered_logits_loss_runs_over_the_whole_vocabulary():
    """Without loss parallelism DTensor all-gathers the logits (ColwiseParallel output_layouts Replicate()) and
    every rank runs F.cross_entropy over all 128,256 columns: 18 B a logit over 8,192 x 128,256, forward; the
    backward (twice the forward's kernel time) over the same; loss parallelism keeps the rank's 16,032."""
    from planner.compute import head_backward, head_kernels
    from planner.kernels import loss_vocab

    gathered, sharded = _ctx(tp=8), _ctx(tp=8, loss_parallel=True)
    assert loss_vocab(gathered) == 128256 and loss_vocab(sharded) == 128256 // 8
    ce = head_kernels(gathered, H100)[1]
    assert (ce.bytes, ce.count) == (18 * 8192 * 128256, 1)
    assert loss_vocab(_ctx()) == 128256  # tp 1: the whole (128-padded) vocabulary either way
    from planner.compute import _head

    head = _head(gathered, H100, EFFICIENCY)
    assert head_backward(gathered, head, H100, EFFICIENCY).elementwise_s == pytest.approx(2 * ce.time_s, rel=1e-12)


def test_gathered_logits_are_held_over_the_whole_vocabulary():
    """memory.py's logits read the loss's vocabulary (kernels.loss_vocab), as the head's kernels do: the gathered
    loss keeps 4 B x 8,192 tokens x 128,256 columns on every rank, loss parallelism 4 x 8,192 x 16,032."""
    from planner.memory import chunk_activation_key, chunk_activations

    gathered, sharded = _ctx(tp=8), _ctx(tp=8, loss_parallel=True)
    held = {c: chunk_activations(c, 0).logits for c in (gathered, sharded)}
    assert held[gathered] - held[sharded] == 4 * 8192 * (128256 - 128256 // 8) == 3_677_356_032
    # the memo key reads the flavour's loss trait (its traits, not its name)
    from planner import flavours
    from planner.flavours.torch import FLAVOUR as TORCH

    try:
        flavours.register(replace(TORCH, name="toy-loss", vocab_parallel_loss=True))
        toy = Context(MODEL, gathered.work, replace(gathered.par, framework="toy-loss"))
        assert chunk_activation_key(toy, 0) != chunk_activation_key(gathered, 0)
    finally:
        flavours.unregister("toy-loss")
