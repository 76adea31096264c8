"""Sweeps: the same chunk function locally and on a local Ray instance gives the same rows."""

from __future__ import annotations

from dataclasses import replace

import pytest

from collectives.topology import cluster_preset
from planner import MODEL_PRESETS, WorkloadSpec
from planner.search import Constraints, Problem, search
from planner.sweep import Task, run, write

ALLOWED = {"framework": "megatron", "zero_stage": 1, "activation_recompute": "none", "pp": [1, 2]}


def tasks():
    model = replace(MODEL_PRESETS["llama3-8b"], seq_length=2048, num_layers=8)
    return [
        Task(
            f"nodes={n}",
            Problem(
                model,
                WorkloadSpec(global_batch_size=16),
                cluster_preset("dgx-h100", n),
                Constraints.of(ALLOWED),
                top_k=2,
            ),
        )
        for n in (1, 2)
    ]


def test_local_sweep_matches_the_search_and_writes_csv(tmp_path):
    rows = run(tasks(), "local", workers=1)
    for task in tasks():
        best = search(task.problem, workers=1).results[0]
        row = next(r for r in rows if r["label"] == task.label and r["rank"] == 1)
        assert row["step_time_s"] == best.time_s
    assert write(rows, str(tmp_path / "sweep.csv")).endswith("sweep.csv")
    assert len((tmp_path / "sweep.csv").read_text().splitlines()) == len(rows) + 1


@pytest.mark.slow
def test_ray_sweep_equals_local(tmp_path):
    ray = pytest.importorskip("ray", reason="ray is not installed (pip install commplan[ray])")
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        on_ray = run(tasks(), "ray")
    finally:
        ray.shutdown()
    local = run(tasks(), "local", workers=1)
    assert on_ray == local
    pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    out = write(on_ray, str(tmp_path / "sweep.parquet"))
    assert pq.read_table(out).num_rows == len(on_ray)
