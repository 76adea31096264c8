"""TransformerEngine userbuffers' fallback under Megatron --tp-comm-overlap (issue 21, fp8a9; rules/tensor.py
userbuffers_rows, check_userbuffers; step.py _userbuffers_fallback). Megatron-LM d98e8a6 TELinear overlaps only
the linears named qkv, proj, fc1, fc2 and switches the shared config's tp_comm_overlap off at the first other name
(MLA's q_down_proj), so an MLA model's TP runs on NCCL, exposed; the embedding's and the output layer's collectives
are Megatron's own, never userbuffers. TE d0067d0da fill_userbuffers_buffer_for_all_gather gathers bf16, per-tensor
fp8 and MXFP8 (rows divisible by 128) only: a blockwise or nvfp4 gather, or an MXFP8 shard of other rows, raises
(a 422 here)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from collectives.topology import cluster_preset
from planner import Options, Overlap, ParallelSpec, SpecError, WorkloadSpec, build_plan, model_preset
from planner.context import Context
from planner.rules.tensor import USERBUFFERS_ROWS, check_userbuffers, userbuffers_rows

LLAMA, DSV3 = model_preset("llama3-70b"), model_preset("deepseek-v3")
WORK = WorkloadSpec(micro_batch_size=1, global_batch_size=16, seq_length=4096)
PAR = ParallelSpec(tp=8, dp=2, zero_stage=1, sequence_parallel=True)
ON = Options(overlap=Overlap(tp_comm_overlap=True))


def test_the_rows_userbuffers_carry():
    """The four TE linears' forward rows, their dgrad and wgrad re-gather conjugates and their re-issues; MLA none."""
    rows = userbuffers_rows(Context(LLAMA, WORK, PAR))
    assert len(rows) == 4 * 3 * 2 and set(USERBUFFERS_ROWS) <= rows
    assert "tp.attn.out_proj.dgrad" in rows and "tp.mlp.up_proj.wgrad_gather.recompute" in rows
    assert not {"tp.embedding", "tp.lm_head.input", "tp.lm_head.logits"} & rows
    assert userbuffers_rows(Context(DSV3, WORK, replace(PAR, ep=2))) == frozenset()


def test_the_rows_are_built_once():
    """Every _holds, fallback and check reads the rows: one module set, not a new one a call (review r9a finding 7)."""
    a, b = userbuffers_rows(Context(LLAMA, WORK, PAR)), userbuffers_rows(Context(LLAMA, WORK, replace(PAR, dp=1)))
    assert a is b


def _plans(model, par=PAR, work=WORK):
    cluster = cluster_preset("dgx-h100", 2)
    return build_plan(model, work, par, cluster).step, build_plan(model, work, par, cluster, ON).step


def test_the_embedding_and_head_stay_exposed_under_the_overlap():
    """Llama3-70B tp 8: with the overlap, what stays exposed of the TP in each pass is the fallback rows' seconds per
    micro-batch (the embedding's reduce-scatter, the head's gathers, the cross-entropy's all-reduces), no less."""
    off, on = _plans(LLAMA)
    assert on.exposed_comm_s < 0.5 * off.exposed_comm_s
    st = on.stages[0]
    assert st.tp_fallback_s["forward"] > 0 and st.tp_fallback_s["backward"] > 0
    assert st.fwd_comm_s >= st.tp_fallback_s["forward"] - 1e-12


def test_mla_falls_back_whole():
    """DeepSeek-V3 (4 layers, tp 8, ep 2): the overlap hides no TP row and holds no userbuffers SMs, so the step is
    the overlap's off to the bit (before fp8a9 it hid 42% of the exposed communication)."""
    small = replace(DSV3, num_layers=4, mtp_layers=0)
    off, on = _plans(small, replace(PAR, ep=2))
    assert (on.time_s, on.exposed_comm_s) == (off.time_s, off.exposed_comm_s)


@pytest.mark.parametrize(
    ("recipe", "seq", "words"),
    [
        ("blockwise", 4096, "'blockwise' raises 'Unsupported quantizer for Userbuffers'"),
        ("nvfp4", 4096, "'nvfp4' raises"),
        ("mxfp8", 4096 + 64 * 8, "divisible by 128, got micro_batch_size x sequence / (cp x tp) = 576"),
    ],
)
def test_a_gather_userbuffers_cannot_take_is_refused(recipe, seq, words):
    work = replace(WORK, activation_dtype="fp8", fp8_recipe=recipe, seq_length=seq)
    with pytest.raises(SpecError) as e:
        check_userbuffers(Context(LLAMA, work, PAR))
    assert e.value.field == "options.overlap.tp_comm_overlap" and words in str(e.value)


def test_what_userbuffers_take_plans():
    """Delayed and tensorwise (Float8 data), mxfp8 with 512 rows a shard, and any recipe under MLA (overlap off)."""
    for recipe, seq in (("delayed", 4096), ("tensorwise", 4096), ("mxfp8", 4096)):
        check_userbuffers(Context(LLAMA, replace(WORK, activation_dtype="fp8", fp8_recipe=recipe, seq_length=seq), PAR))
    work = replace(WORK, activation_dtype="fp8", fp8_recipe="blockwise")
    check_userbuffers(Context(DSV3, work, replace(PAR, ep=2)))


def test_mtp_inner_layers_run_nccl():
    """Llama3-70B with one MTP block, tp 8, pp 1, 8 micro-batches: Megatron-LM d98e8a6 builds the MTP layer's eh_proj
    (tp_comm_buffer_name "mtp_eh_proj", not one of the four) before its inner transformer layer, switching the shared
    config's overlap off, so of each carried row the inner layer joins (80 decoder calls + 1 a micro-batch: 648 in
    the ledger) 80/81 stays on userbuffers and 1/81 runs NCCL, exposed (docwait10; before it all 81 were hidden): the
    fallback grows by the carried rows' seconds / 81 a micro-batch. The row-parallel out_proj and down_proj gather
    nothing for wgrad: 10 rows."""
    from planner import step as step_module
    from planner.rules.tensor import userbuffers_decoder_share

    mtp = replace(LLAMA, mtp_layers=1)
    shares = userbuffers_decoder_share(Context(mtp, WORK, PAR), 0)
    rows = {r + end for r in USERBUFFERS_ROWS for end in ("", ".dgrad")} | {
        "tp.attn.qkv.wgrad_gather",
        "tp.mlp.up_proj.wgrad_gather",
    }
    assert set(shares) == rows and list(shares.values()) == pytest.approx([80 / 81] * len(rows), rel=1e-12)
    assert userbuffers_decoder_share(Context(LLAMA, WORK, PAR), 0) == {}
    cluster = cluster_preset("dgx-h100", 2)
    plan = build_plan(mtp, WORK, PAR, cluster, ON)
    original = step_module.userbuffers_decoder_share
    step_module.userbuffers_decoder_share = lambda ctx, stage: {}  # every carried row hidden, as before docwait10
    try:
        hidden = build_plan(mtp, WORK, PAR, cluster, ON).step
    finally:
        step_module.userbuffers_decoder_share = original
    for phase in ("forward", "backward"):
        carried = sum(
            c.call.calls_per_iteration * c.price.time_s
            for c in plan.calls
            if c.call.name in rows and c.call.phase == phase
        )
        assert carried > 0 and {c.call.calls_per_iteration for c in plan.calls if c.call.name in rows} == {648}
        grew = plan.step.stages[0].tp_fallback_s[phase] - hidden.stages[0].tp_fallback_s[phase]
        assert grew == pytest.approx(carried / 81 / 8, rel=1e-9), phase
    assert plan.step.time_s > hidden.time_s


def test_mtp_at_tp_1_under_the_overlap_plans():
    """tp 1 issues no TP call, so no share to take (was a ZeroDivisionError, a 500: the fresh-clone run of
    tests/app/test_hostile_combos.py found Mixtral with one MTP block, tp 1, tp_comm_overlap on, on a DGX A100).
    Since mend14e (review r14d #6) Megatron d98e8a64dd's assert is a 422 there, before any share is taken: SP is
    off at tp 1 and --tp-comm-overlap asserts it."""
    model = replace(model_preset("mixtral-8x7b"), mtp_layers=1)
    with pytest.raises(SpecError, match="got tp 1, where Megatron turns it off first"):
        build_plan(
            model,
            WorkloadSpec(micro_batch_size=1, global_batch_size=8),
            ParallelSpec(tp=1, dp=8),
            cluster_preset("dgx-a100", 1),
            Options(overlap=Overlap(overlap_grad_reduce=True, tp_comm_overlap=True)),
        )
