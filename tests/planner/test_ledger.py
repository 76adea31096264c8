"""The ledger's building blocks: stage classes, per-stage parameter lists shared between plans."""

from planner import Context, ParallelSpec, WorkloadSpec, model_preset
from planner.ledger import fill_buckets, stage_classes
from planner.params import alike_stages, stage_params, total
from planner.rules import ledger


def test_stage_classes_group_alike_stages_under_their_first():
    counts = [7, 8, 8, 8, 7, 9]
    assert stage_classes(range(6), counts.__getitem__) == {0: (0, 4), 1: (1, 2, 3), 5: (5,)}


def test_fill_buckets_closes_on_the_rules_own_test():
    """Megatron and DDP close a bucket once it reaches the cap (>=), DeepSpeed once past it (>): at a total equal
    to the cap the two differ; the last partial bucket is kept, an empty one is not; DDP's first limit is read for
    the first bucket only (the index is the count of buckets closed)."""
    sizes = [4, 6, 5, 5, 3]
    assert fill_buckets(sizes, lambda total, _: total >= 10) == [10, 10, 3]
    assert fill_buckets(sizes, lambda total, _: total > 10) == [15, 8]
    assert fill_buckets([5, 5], lambda total, _: total >= 10) == [10]
    assert fill_buckets([], lambda total, _: True) == []
    limits = [3, 10]
    assert fill_buckets(sizes, lambda total, i: total >= limits[min(i, 1)]) == [4, 11, 8]


def test_stage_params_are_tuples_shared_across_workloads():
    """The parameters depend on model and layout only: two workloads get the very same tuples."""
    model, par = model_preset("llama3-70b"), ParallelSpec(tp=8, pp=4, dp=2)
    train = Context(model, WorkloadSpec(global_batch_size=8), par)
    serve = Context(model, WorkloadSpec(kind="inference", batch_size=2), par)
    dense, expert = stage_params(train, 1)
    assert stage_params(serve, 1) is stage_params(train, 1)
    assert isinstance(dense, tuple) and expert == ()
    # Llama-3 70B: 80 layers over 4 stages; one layer of a TP-8 rank holds 1/8 of its 856M matrix
    # parameters plus two replicated norms of 8192
    assert total(dense) == 20 * model.layer_params(0) // 8 + 20 * 2 * 8192 - 20 * 2 * 8192 // 8


def test_emitting_a_class_once_lists_every_stage_of_it():
    """Llama-3 405B with 7-layer end stages: the TP block calls of the 14 middle stages are one row."""
    model = model_preset("llama3-405b")
    par = ParallelSpec(tp=8, pp=16, dp=1, sequence_parallel=True, first_stage_layers=7, last_stage_layers=7)
    calls = ledger(Context(model, WorkloadSpec(global_batch_size=16), par))
    qkv = [c for c in calls if c.name == "tp.attn.qkv"]
    assert [c.stages for c in qkv] == [(0, 15), tuple(range(1, 15))]
    assert [c.calls_per_iteration for c in qkv] == [7 * 16, 8 * 16]


def test_alike_stages_hold_the_same_parameters_but_for_layer_numbers():
    model = model_preset("llama3-405b")
    ends = dict(first_stage_layers=7, last_stage_layers=7)
    par = ParallelSpec(tp=8, pp=16, dp=2, zero_stage=1, sequence_parallel=True, **ends)
    ctx = Context(model, WorkloadSpec(global_batch_size=32), par)
    # the embedding stage, the 14 middle stages of 8 layers, the head stage
    assert alike_stages(ctx) == {0: (0,), 1: tuple(range(1, 15)), 15: (15,)}
    grads = [c for c in ledger(ctx) if c.name == "dp.grads"]
    assert [c.stages for c in grads] == [(0,), tuple(range(1, 15)), (15,)]
    middle = [total(p) for p in stage_params(ctx, 1)]
    assert grads[1].message_bytes >= middle[0] * 4  # fp32 gradients, padded to lcm(dp, 128) elements
    assert grads[1].message_bytes - middle[0] * 4 < 128 * 4
