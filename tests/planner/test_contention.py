"""Pricing on the neighbourhood of one group equals pricing every group, for the layouts rank orders make."""

import pytest

from app.serialize import plan_dict
from collectives.topology import cluster_preset
from planner import Options, ParallelSpec, WorkloadSpec, build_plan, model_preset


@pytest.mark.parametrize(
    ("cluster", "par"),
    [
        (cluster_preset("dgx-h100", 64), ParallelSpec(tp=8, pp=4, dp=16, zero_stage=1, sequence_parallel=True)),
        (cluster_preset("pcie-server", 32), ParallelSpec(tp=4, pp=2, dp=32, zero_stage=0)),
        (cluster_preset("dgx-a100", 40), ParallelSpec(tp=4, cp=2, pp=4, dp=10, zero_stage=3, sequence_parallel=True)),
        # stages 128 devices apart on 256-device units: odd stages are priced moved down by 16 nodes
        (cluster_preset("dgx-h100", 64), ParallelSpec(pp=4, dp=128, zero_stage=1)),
    ],
)
def test_neighbourhood_equals_full(cluster, par):
    model = model_preset("llama3-8b")
    work = WorkloadSpec(global_batch_size=par.dp * 4)
    quick = plan_dict(build_plan(model, work, par, cluster))
    full = plan_dict(build_plan(model, work, par, cluster, Options(contention="full")))
    for a, b in zip(quick["calls"], full["calls"], strict=True):
        assert a["name"] == b["name"]
        assert a["time_s"] == pytest.approx(b["time_s"], rel=1e-9), a["name"]


def test_custom_device_map_moves_groups_across_nodes():
    """Rank r on device device_map[r]: scattering each TP group over 8 nodes puts TP traffic on the NICs."""
    model, cluster = model_preset("llama3-8b"), cluster_preset("dgx-h100", 8)
    par = ParallelSpec(tp=8, dp=8)
    work = WorkloadSpec(global_batch_size=8)
    transposed = tuple(int((r % 8) * 8 + r // 8) for r in range(64))  # TP peers on different nodes
    plain = plan_dict(build_plan(model, work, par, cluster, Options(pricing="schedule")))
    moved = plan_dict(build_plan(model, work, par, cluster, Options(device_map=transposed, pricing="schedule")))
    qkv = lambda plan: next(c for c in plan["calls"] if c["name"] == "tp.attn.out_proj")  # noqa: E731
    assert qkv(plain)["placement"]["bottleneck"] == "nvlink" and qkv(plain)["placement"]["nodes_per_group"] == 1
    assert qkv(moved)["placement"]["bottleneck"] == "nic" and qkv(moved)["placement"]["nodes_per_group"] == 8
    assert qkv(moved)["placement"]["group_devices"] == [0, 8, 16, 24, 32, 40, 48, 56]
    assert qkv(moved)["time_s"] > 5 * qkv(plain)["time_s"]


def test_device_map_must_be_a_permutation():
    from planner import SpecError

    with pytest.raises(SpecError, match="must list each of the cluster's 8 devices once"):
        build_plan(
            model_preset("llama3-8b"),
            WorkloadSpec(),
            ParallelSpec(tp=8),
            cluster_preset("dgx-h100"),
            Options(device_map=(0, 0, 1, 2, 3, 4, 5, 6)),
        )
