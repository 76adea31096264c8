"""Pricing on the neighbourhood of one group equals pricing every group, for the layouts rank orders make."""

import pytest

from collectives.topology import cluster_preset
from planner import Options, ParallelSpec, WorkloadSpec, build_plan, model_preset


@pytest.mark.parametrize(
    ("cluster", "par"),
    [
        (cluster_preset("dgx-h100", 64), ParallelSpec(tp=8, pp=4, dp=16, zero_stage=1, sequence_parallel=True)),
        (cluster_preset("pcie-server", 32), ParallelSpec(tp=4, pp=2, dp=32, zero_stage=0)),
        (cluster_preset("dgx-a100", 40), ParallelSpec(tp=4, cp=2, pp=4, dp=10, zero_stage=3, sequence_parallel=True)),
    ],
)
def test_neighbourhood_equals_full(cluster, par):
    model = model_preset("llama3-8b")
    work = WorkloadSpec(global_batch_size=par.dp * 4)
    quick = build_plan(model, work, par, cluster).to_dict()
    full = build_plan(model, work, par, cluster, Options(contention="full")).to_dict()
    for a, b in zip(quick["calls"], full["calls"], strict=True):
        assert a["name"] == b["name"]
        assert a["time_s"] == pytest.approx(b["time_s"], rel=1e-9), a["name"]
