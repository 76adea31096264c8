"""The fp8/fp4 rules read a recipe's traits (amax_history, tp_amax, cast_read_bytes), never its name: a toy recipe
that copies delayed scaling's traits under another name issues delayed scaling's amax all-reduces."""

from __future__ import annotations

from dataclasses import replace

import pytest

from planner import ParallelSpec, WorkloadSpec, model_preset
from planner.context import Context
from planner.recipes import RECIPES
from planner.rules import fp8


def _calls(recipe: str, sp: bool = True) -> list[tuple[str, int]]:
    par = ParallelSpec(tp=4, dp=2, sequence_parallel=sp)
    ctx = Context(model_preset("llama3-8b"), WorkloadSpec(global_batch_size=16, fp8_recipe=recipe), par)
    return sorted((c.name, c.calls_per_iteration) for c in fp8.calls(ctx))


def test_each_recipe_reduces_the_amaxes_its_scaling_needs():
    assert [n for n, _ in _calls("delayed")] and all("tp" not in n for n, _ in _calls("delayed"))
    assert _calls("tensorwise") and _calls("tensorwise", sp=False) == []  # current scaling: over TP under SP only
    assert _calls("blockwise") == [] == _calls("mxfp8")  # block scales are local
    assert RECIPES["tensorwise"].cast_bytes_per_element == 4 + 2 * 1.0  # reads the bf16 input twice
    assert RECIPES["delayed"].cast_bytes_per_element == 2 + 2 * 1.0


@pytest.mark.parametrize("like", ["delayed", "tensorwise", "blockwise"])
def test_a_recipe_under_another_name_plans_alike(monkeypatch, like):
    monkeypatch.setitem(RECIPES, "toy", replace(RECIPES[like], name="toy"))
    assert _calls("toy") == _calls(like)
    assert RECIPES["toy"].cast_bytes_per_element == RECIPES[like].cast_bytes_per_element
