"""The stage-pass cache (planner/compute.py ``stage_pass_compute``, docs/search.md "stage-pass cache"): keyed on
the values the stage's passes read (stage_pass_key), bounded, and equal to the passes computed afresh; the
embedding, final norm and LM head keyed on tokens per rank (kernels.per_tokens); the interned keys
(context.ValueKey) equal and hash as their tuples."""

from __future__ import annotations

import pickle
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from collectives.topology import cluster_preset
from planner import MODEL_PRESETS, ParallelSpec, WorkloadSpec, compute, kernels
from planner.compute import stage_pass_compute, stage_pass_key
from planner.context import Context, ValueKey, interned_key
from planner.kernels import EFFICIENCY
from planner.parallel import validate_parallel

GPU = cluster_preset("dgx-h100", 4).gpu
MODELS = ["llama3-8b", "mixtral-8x7b", "gpt3-175b", "deepseek-v3"]


def _fresh(ctx: Context, stage: int) -> tuple:
    """The stage's passes computed afresh: every per-layer and token memo emptied first."""
    for memo in (
        kernels._LAYER_KERNELS, kernels._TOKEN_KERNELS, kernels._EMBEDDING_KERNELS, kernels._MTP_KERNELS,
        compute._LAYER_FORWARD, compute._LAYER_BACKWARD, compute._LAYER_RECOMPUTE, compute._HEAD,
        compute._FINAL_NORM, compute._MTP, compute._EMBEDDING,
    ):  # fmt: skip
        memo.clear()
    return compute._stage_pass_compute(ctx, stage, GPU, EFFICIENCY)


@st.composite
def contexts(draw, model: str | None = None):
    """A valid training context of an 8-layer model (4 for DeepSeek-V3: its 3 dense layers first), its layout,
    micro-batch size, recompute and framework drawn."""
    name = model or draw(st.sampled_from(MODELS))
    mdl = replace(MODEL_PRESETS[name], num_layers=4 if name == "deepseek-v3" else 8)
    if name == "deepseek-v3":
        mdl = replace(mdl, mtp_layers=draw(st.sampled_from([0, 1])))
    pp = draw(st.sampled_from([1, 2, 4]))
    tp = draw(st.sampled_from([1, 2, 4]))
    par = ParallelSpec(
        tp=tp,
        pp=pp,
        cp=draw(st.sampled_from([1, 2, 4])),
        dp=draw(st.sampled_from([1, 2, 4])),
        ep=draw(st.sampled_from([1, 2, 4])) if mdl.moe else 1,
        sequence_parallel=tp > 1 and draw(st.booleans()),
        zero_stage=draw(st.sampled_from([0, 1, 3])),
        framework=draw(st.sampled_from(["megatron", "torch", "deepspeed"])),
        cp_comm=draw(st.sampled_from(["p2p", "all_gather"])),
    )
    work = WorkloadSpec(
        global_batch_size=64,
        micro_batch_size=draw(st.sampled_from([1, 2, 4])),
        activation_recompute=draw(st.sampled_from(["none", "selective", "full"])),
    )
    return Context(mdl, work, par), draw(st.integers(0, pp - 1))


def _valid(ctx: Context) -> bool:
    try:
        validate_parallel(ctx.par, ctx.model, ctx.work, ctx.par.world_size)
        compute.check_gpu(GPU, compute.compute_dtype(ctx), ctx)
    except Exception:
        return False
    return True


SETTINGS = settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))


def test_cached_stage_passes_equal_fresh_ones_and_equal_keys_share_equal_values():
    """Over drawn layouts (four models, three frameworks, tp, cp, pp, dp, ep, SP, ZeRO, cp_comm, micro-batch,
    recompute, MTP): the cached passes equal the passes computed afresh with every memo emptied, field by
    field (floats to the bit); and two contexts with equal stage_pass_key get equal fresh passes (the key names
    all the passes read), while keys meet across layouts that differ (dp, ZeRO, pp)."""
    seen: dict = {}
    met = []

    @SETTINGS
    @given(contexts())
    def run(drawn):
        ctx, stage = drawn
        if not _valid(ctx):
            return
        cached = stage_pass_compute(ctx, stage, GPU)
        fresh = _fresh(ctx, stage)
        assert cached == fresh
        key = stage_pass_key(ctx, stage)
        if key in seen:
            other, value = seen[key]
            met.append(other != ctx.par)
            assert value == fresh
        seen[key] = (ctx.par, fresh)
        # another dp and ZeRO stage: the same key, the very cached entry
        moved = Context(
            ctx.model, ctx.work, replace(ctx.par, dp=2 * ctx.par.dp, zero_stage=(ctx.par.zero_stage + 1) % 4)
        )
        if _valid(moved):
            assert stage_pass_key(moved, stage) == key
            assert stage_pass_compute(moved, stage, GPU) is cached
            met.append(True)

    run()
    assert sum(met) > 10


@pytest.mark.parametrize(
    "change",
    [
        {"tp": 4},
        {"cp": 2},
        {"sequence_parallel": False},
        {"framework": "torch"},
        {"framework": "deepspeed"},
        {"cp_comm": "all_gather"},
        {"pp": 4},
        {"micro_batch_size": 2},
        {"activation_recompute": "full"},
        {"activation_recompute": "selective"},
        {"attention_kernel": "unfused"},
        {"fp8_recipe": "delayed"},
        {"seq_length": 4096},
    ],
)
def test_a_layout_differing_in_a_read_input_never_shares_an_entry(change):
    """Each input the passes read, changed alone from a base layout (the degrees, SP, the framework's traits,
    cp_comm, the stage's layers, micro-batch, recompute, the attention kernel, the recipe, the sequence): another
    stage-pass key, and the cached passes equal that layout's own fresh ones (never the base's entry)."""
    model = replace(MODEL_PRESETS["llama3-8b"], num_layers=8)
    base_par = ParallelSpec(tp=2, pp=2, cp=1, dp=2, sequence_parallel=True)
    base_work = WorkloadSpec(global_batch_size=64, micro_batch_size=1)
    par_fields = {"tp", "cp", "sequence_parallel", "framework", "cp_comm", "pp"}
    par = replace(base_par, **{k: v for k, v in change.items() if k in par_fields})
    work = replace(base_work, **{k: v for k, v in change.items() if k not in par_fields})
    base, other = Context(model, base_work, base_par), Context(model, work, par)
    assert _valid(base) and _valid(other)
    stage = 1
    assert stage_pass_key(base, stage) != stage_pass_key(other, stage)
    first = stage_pass_compute(base, stage, GPU)
    assert stage_pass_compute(other, stage, GPU) == _fresh(other, stage)
    assert stage_pass_compute(base, stage, GPU) == first == _fresh(base, stage)


def test_the_stage_pass_cache_and_the_key_table_stay_bounded(monkeypatch):
    """Past their bound the stage-pass cache and the interned keys are cleared, never grown without end (the
    service runs for days), and what they answer after a clear is still the fresh value."""
    from planner import context

    monkeypatch.setattr(compute, "STAGE_PASSES_KEPT", 3)
    monkeypatch.setattr(context, "KEYS_KEPT", 4)
    compute._STAGE_PASSES.clear()
    context._KEYS.clear()
    model = replace(MODEL_PRESETS["llama3-8b"], num_layers=8)
    sizes = []
    for b in (1, 2, 4, 8):
        for tp in (1, 2):
            ctx = Context(
                model, WorkloadSpec(global_batch_size=64, micro_batch_size=b), ParallelSpec(tp=tp, pp=2, dp=2)
            )
            for stage in (0, 1):
                assert stage_pass_compute(ctx, stage, GPU) == _fresh(ctx, stage)
                sizes.append((len(compute._STAGE_PASSES), len(context._KEYS)))
    assert max(s for s, _ in sizes) == 3 and max(k for _, k in sizes) == 4
    assert min(s for s, _ in sizes[1:]) < 3  # it was cleared on the way


def test_embedding_head_and_final_norm_shared_by_equal_tokens_per_rank():
    """The embedding, final norm and LM head read b and cp only through the tokens per rank b·s/cp: (b 2, cp 2)
    and (b 1, cp 1) share their token-keyed entries, equal to each one's own fresh passes; the layers' passes
    (core attention reads b and s/cp apart) differ in attention and stay apart."""
    model = replace(MODEL_PRESETS["llama3-8b"], num_layers=8)
    par = ParallelSpec(tp=2, pp=2, dp=2, sequence_parallel=True)
    one = Context(model, WorkloadSpec(global_batch_size=64, micro_batch_size=1), par)
    two = Context(model, WorkloadSpec(global_batch_size=64, micro_batch_size=2), replace(par, cp=2))
    assert one.token_kernels_key is two.token_kernels_key  # one interned object
    assert one.layer_kernels_key != two.layer_kernels_key
    for fn in (compute.embedding_pass,):
        assert fn(one, GPU) is fn(two, GPU)
    head = compute.per_tokens(compute._HEAD, compute._head_of, one, None, GPU, EFFICIENCY)
    assert compute.per_tokens(compute._HEAD, compute._head_of, two, None, GPU, EFFICIENCY) is head
    assert head == compute._head_of(two, None, GPU, EFFICIENCY)
    assert compute.embedding_pass(two, GPU) == compute._embedding_of(two, None, GPU, EFFICIENCY)
    for stage in (0, 1):
        a, b = stage_pass_compute(one, stage, GPU), stage_pass_compute(two, stage, GPU)
        assert (a, b) == (_fresh(one, stage), _fresh(two, stage))
        assert a[0].gemm_s == b[0].gemm_s and a[0].attention_s != b[0].attention_s


def test_a_flavour_differing_only_in_its_vocabulary_padding_gets_its_own_head():
    """kernels.kernel_traits holds hf_modules (vocab_shard: Megatron pads the vocabulary to 128 x tp, torch's
    modules keep it): a flavour registered again with only that trait changed gets its own LM head, not the
    memoised one."""
    from planner import flavours
    from planner.flavours.megatron import FLAVOUR as MEGATRON

    model = replace(MODEL_PRESETS["llama3-8b"], num_layers=8)  # vocabulary 128,256: padded at tp 8 to 128,512
    work = WorkloadSpec(global_batch_size=64)
    heads = []
    try:
        for hf in (False, True):
            flavours.register(replace(MEGATRON, name="toy-vocab", hf_modules=hf))
            ctx = Context(model, work, ParallelSpec(tp=8, pp=2, framework="toy-vocab"))
            heads.append(stage_pass_compute(ctx, 1, GPU))
            assert heads[-1] == _fresh(ctx, 1)
    finally:
        flavours.unregister("toy-vocab")
    assert heads[0][0].flops > heads[1][0].flops  # 128,512 / 8 rows against 128,256 / 8


def test_value_keys_equal_and_hash_as_their_tuples():
    """A ValueKey equals and hashes as the tuple of its items (a memo finds it either way), is one object per
    value (interned_key), and does not carry its kept hash to another process (pickled as its items)."""
    items = (MODEL_PRESETS["llama3-8b"], WorkloadSpec(global_batch_size=64), 2, None, ("a", 1.5))
    key = interned_key(items)
    assert isinstance(key, ValueKey) and key == items and hash(key) == hash(items)
    assert interned_key(tuple(items)) is key
    assert {items: 1}[key] == 1 and {key: 2}[items] == 2
    back = pickle.loads(pickle.dumps(key))
    assert back == key and type(back) is ValueKey and "_hash" not in back.__dict__


def test_the_specs_hash_as_their_fields_and_once():
    """WorkloadSpec, ModelSpec and ParallelSpec keep their hash (collectives._hashing.frozen_hash): the value is
    the dataclass's own (the hash of the tuple of its fields), a replaced spec hashes afresh, and equal specs
    built apart find each other's memo entries."""
    from dataclasses import fields

    for spec in (WorkloadSpec(global_batch_size=64), MODEL_PRESETS["mixtral-8x7b"], ParallelSpec(tp=2, ep=4)):
        assert hash(spec) == hash(tuple(getattr(spec, f.name) for f in fields(spec) if f.compare))
        assert vars(spec) == {f.name: getattr(spec, f.name) for f in fields(spec)}  # kept beside it, not in it
        first = fields(spec)[0].name
        moved = replace(spec, **{first: getattr(spec, first)})
        assert moved is not spec and moved == spec and {spec: 1}[moved] == 1
    work = WorkloadSpec(global_batch_size=64)
    assert hash(replace(work, micro_batch_size=2)) != hash(work)


def test_the_combined_pair_is_part_of_the_key():
    """``paired`` (step.paired_passes: Megatron's combined 1F1B) is in the stage-pass key (review r9a finding 1): on
    Qwen3-30B-A3B FP8-CS the paired passes are the per-pass ones plus compute.combined_pair_delta (the host waits
    only), each entry its own; a forward-only context (no pair without a backward) resolves it off, one entry."""
    from planner.compute import combined_pair_delta, stage_compute
    from tests.planner.test_moe_kernels import qwen3_fp8

    ctx = qwen3_fp8("tensorwise")
    alone, paired = stage_pass_compute(ctx, 0, GPU), stage_pass_compute(ctx, 0, GPU, paired=True)
    df, db = combined_pair_delta(ctx, 0, GPU)
    assert df.host_s < 0 < db.host_s  # the pair drains the forward's count wait, the backward waits its share
    assert paired == (alone[0] + df, alone[1] + db, alone[2])
    assert paired[0].gemm_s == alone[0].gemm_s and paired[1].attention_s == alone[1].attention_s
    assert stage_pass_compute(ctx, 0, GPU) is alone and compute._stage_pass_compute(ctx, 0, GPU, EFFICIENCY) == alone
    full = stage_compute(ctx, 0, GPU, paired=True)
    assert (full.forward, full.backward) == paired[:2] and full.optimizer_s == stage_compute(ctx, 0, GPU).optimizer_s
    serve = Context(ctx.model, replace(ctx.work, kind="inference"), ctx.par)
    assert not serve.training
    assert stage_pass_compute(serve, 0, GPU, paired=True) is stage_pass_compute(serve, 0, GPU)
