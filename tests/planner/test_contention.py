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


@pytest.mark.parametrize("schedule", [{}, {"pipeline_schedule": "interleaved", "virtual_pipeline_stages": 2}])
def test_pipeline_sends_inside_an_nvl72_rack_go_over_nvlink(schedule):
    """Issue 23 item 3: Llama 3 405B TP8 PP9 DP2 on two GB200 NVL72 racks (72 GPUs each). A stage holds 16
    consecutive ranks (tp 8 x dp 2, order tp-cp-ep-dp-pp), so stage s sends from ranks 16s..16s+15 to
    16(s+1)..: stages 0-2 and 5-7 stay in one rack, 3 (48-63 -> 64-79) and 4 (64-79 -> 80-95) cross to rack 1.
    Inside a rack the send goes over NVLink (900 GB/s), across it over one 400G NIC (50 GB/s): 33,554,432 B
    (b s h / tp x bf16 = 8192 x 16384 / 8 x 2) takes >= 671 us on the NIC and < 80 us on NVLink. A row
    never lists stages whose prices differ: every stage of a row priced alone gives the row's price."""
    from collectives import Op
    from planner.layout import layout_for
    from planner.plan import _price_op, cluster_for

    model, cluster_spec = model_preset("llama3-405b"), cluster_preset("gb200-nvl72", 2)
    par = ParallelSpec(tp=8, pp=9, dp=2, zero_stage=1, sequence_parallel=True, **schedule)
    plan = build_plan(model, WorkloadSpec(global_batch_size=36), par, cluster_spec)
    rows = {(c.call.name, c.call.stages): c for c in plan.calls if c.call.name.startswith("pp.activation")}
    message = 8192 * 16384 // 8 * 2
    nic, nvlink = message / 50e9, message / 900e9
    if not schedule:
        assert set(rows) == {
            ("pp.activation", (0, 1, 2, 5, 6, 7)),
            ("pp.activation", (3, 4)),
            ("pp.activation_grad", (1, 2, 3, 6, 7, 8)),  # the gradient of stage s + 1's input goes back to s
            ("pp.activation_grad", (4, 5)),
        }
    for (name, stages), row in rows.items():
        assert row.call.message_bytes == message
        crosses = any(s in ((3, 4) if name == "pp.activation" else (4, 5)) for s in stages)
        wraps = 8 if name == "pp.activation" else 0  # interleaved: 8 -> 0 (pp+1) and 0 -> 8 (pp-1), across racks
        if not schedule or wraps not in stages:
            assert row.price.bottleneck["kind"] == ("nic" if crosses else "nvlink"), (name, stages)
            assert (row.price.time_s >= nic) if crosses else (nvlink <= row.price.time_s < 2.2 * nvlink), stages
        elif schedule:
            assert stages == (wraps,) and row.price.bottleneck["kind"] == "nic" and row.price.time_s >= nic
    layout, cluster = layout_for(par), cluster_for(cluster_spec)
    for row in rows.values():
        for s in row.call.stages:
            alone = _price_op(Op.SENDRECV, message, layout.placement(row.call.group, (s,)), cluster, Options())
            assert alone.time_s == pytest.approx(row.price.time_s, rel=1e-9), (row.call.name, row.call.stages, s)


@pytest.mark.parametrize(
    ("model", "cluster", "par", "batch", "kinds"),
    [
        # stage 4 (ranks 64-79) straddles the two racks: its EP all-to-alls and DP groups go over the NICs
        ("deepseek-v3", cluster_preset("gb200-nvl72", 2),
         ParallelSpec(tp=1, pp=9, ep=16, dp=16, zero_stage=1, first_stage_layers=6, last_stage_layers=6), 144,
         {"dp", "embedding", "ep", "pp"}),
        ("mixtral-8x7b", cluster_preset("gb200-nvl72", 2),
         ParallelSpec(tp=2, cp=2, pp=4, dp=9, ep=4, expert_tp=1, zero_stage=1, sequence_parallel=True), 36,
         {"cp", "dp", "edp", "ep", "pp", "tp"}),
        ("llama3-70b", cluster_preset("dgx-h100", 4), ParallelSpec(tp=4, cp=2, pp=2, dp=2, zero_stage=3), 16,
         {"cp", "dp", "pp", "tp"}),
    ],
    ids=["deepseek-ep16-pp9-two-racks", "mixtral-tp-cp-ep-pp-two-racks", "70b-zero3-cp"],
)  # fmt: skip
def test_every_row_of_every_call_kind_is_one_price(model, cluster, par, batch, kinds):
    """Issue 23 item 3 for every call kind (TP, CP, EP, expert DP, DP, PP, embedding): each stage a row lists,
    priced alone, gives the row's price; so a row never merges stages whose prices differ. On the two racks the
    EP all-to-alls of the straddling stage 4 are a row of their own, on the NICs, and the others on NVLink."""
    from planner.layout import layout_for
    from planner.plan import _price_op, cluster_for

    plan = build_plan(model_preset(model), WorkloadSpec(global_batch_size=batch), par, cluster)
    layout, priced = layout_for(par), cluster_for(cluster)
    assert {row.call.name.split(".")[0] for row in plan.calls} == kinds
    for row in plan.calls:
        for s in row.call.stages:
            alone = _price_op(row.call.op, row.call.message_bytes, layout.placement(row.call.group, (s,)), priced,
                              Options())  # fmt: skip
            assert alone.time_s == pytest.approx(row.price.time_s, rel=1e-9), (row.call.name, row.call.stages, s)
    if model == "deepseek-v3":
        dispatch = {row.call.stages: row.price for row in plan.calls if row.call.name == "ep.dispatch"}
        assert dispatch[(4,)].bottleneck["kind"] == "nic"
        assert all(p.bottleneck["kind"] == "nvlink" for stages, p in dispatch.items() if stages != (4,))
        assert dispatch[(4,)].time_s > 5 * dispatch[(1, 2, 3, 5, 6, 7, 8)].time_s
