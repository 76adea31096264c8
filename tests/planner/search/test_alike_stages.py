"""The screen reads one stage per class where stages are alike (docs/search.md, ninth round speed10): held_bytes
once per class of params.alike_stages, and the busiest-rank bound from one stage per distinct pass key. Each equals
what every stage gives."""

from __future__ import annotations

import itertools

import numpy as np

from collectives.topology import cluster_for, cluster_preset
from planner import MODEL_PRESETS, ParallelSpec, SpecError, WorkloadSpec
from planner.compute import optimizer_key
from planner.context import Context
from planner.memory import held_bytes
from planner.params import alike_stages
from planner.pipeline import busiest_rank_s
from planner.search.step_model import StepModel
from planner.step import StageStep, schedule_of, stage_passes


def _layouts(model):
    for tp, pp, zero, fw, v in itertools.product(
        (1, 8), (1, 4, 16), (0, 1, 3), ("megatron", "torch", "deepspeed"), (1, 2)
    ):
        if pp == 1 and v > 1:
            continue
        sched = "interleaved" if v > 1 else "1f1b"
        try:
            yield ParallelSpec(tp=tp, pp=pp, dp=8, zero_stage=zero, framework=fw, virtual_pipeline_stages=v,
                               pipeline_schedule=sched, ep=8 if model.moe else 1)  # fmt: skip
        except SpecError:
            continue


def test_held_bytes_are_equal_within_a_class_of_alike_stages():
    """Every stage's held_bytes and optimizer_key equal its class's first stage's (dense, MoE, MTP, an fp8 recipe's
    weight copies)."""
    checked = classes = 0
    for name, recipe in (("llama3-405b", None), ("gpt3-175b", None), ("deepseek-v3", None), ("llama3-70b", "mxfp8")):
        model = MODEL_PRESETS[name]
        for par in _layouts(model):
            ctx = Context(model, WorkloadSpec(global_batch_size=512, fp8_recipe=recipe), par)
            full = [held_bytes(ctx, s).total_bytes for s in range(par.pp)]
            keys = [optimizer_key(ctx, s) for s in range(par.pp)]
            alike = alike_stages(ctx)
            assert sorted(s for members in alike.values() for s in members) == list(range(par.pp))
            for first, members in alike.items():
                assert all(full[s] == full[first] and keys[s] == keys[first] for s in members)
            classes += len(alike) < par.pp
            checked += 1
    assert checked > 100 and classes > 50


def test_static_bytes_and_busiest_bounds_equal_every_stage():
    """StepModel's static bytes (once per class) equal held_bytes of every stage, and its busiest-rank bound (one
    stage per distinct pass key) equals pipeline.busiest_rank_s over every stage's passes."""
    model, cluster = MODEL_PRESETS["llama3-405b"], cluster_preset("dgx-h100", 16)
    work = WorkloadSpec(global_batch_size=512)
    sm = StepModel(model, work, cluster_for(cluster))
    checked = 0
    for par in _layouts(model):
        if par.tp * par.pp * par.dp > 128:
            continue
        ctx = Context(model, work, par)
        assert sm._static_bytes(par).tolist() == [held_bytes(ctx, s).total_bytes for s in range(par.pp)]
        grid = ((1, "none"), (1, "full"), (2, "selective"))
        got = sm.busiest_bounds(par, grid)
        for (b, rc), bound in zip(grid, got.tolist(), strict=True):
            comp = sm._stage_compute(par, b, rc)
            bctx = Context(model, WorkloadSpec(global_batch_size=512, micro_batch_size=b, activation_recompute=rc), par)
            passes = stage_passes(bctx, [StageStep(s, c) for s, c in enumerate(comp)], sm.gpu, (None,) * par.pp)
            want = busiest_rank_s(passes, schedule_of(bctx)) + max(c.optimizer_s for c in comp)
            assert bound == want
        checked += 1
    assert checked >= 10 and np.isfinite(got).all()


def test_efficiency_keeps_the_hash_of_its_fields():
    """kernels.Efficiency hashes once (every per-layer and stage-pass memo keys on it), to the value of its fields;
    a replaced copy hashes afresh, and equal copies hash alike."""
    import dataclasses

    from planner.kernels import gpu_efficiency

    eff = gpu_efficiency(cluster_for(cluster_preset("dgx-h100", 1)).spec.gpu)
    names = [f.name for f in dataclasses.fields(eff) if (f.compare if f.hash is None else f.hash)]
    assert hash(eff) == hash(tuple(getattr(eff, n) for n in names)) == hash(eff)
    other = dataclasses.replace(eff, gemm=eff.gemm / 2)
    assert other != eff and hash(other) == hash(tuple(getattr(other, n) for n in names))
    same = dataclasses.replace(eff, gemm=eff.gemm)
    assert same == eff and hash(same) == hash(eff) and {eff: 1}[same] == 1
