"""DeepEP's normal kernels on a GB200 NVL72 rack (issue 21, layouts3 item 2; rules/deepep.py).

DeepEP 4e38d1d csrc/kernels/configs.cuh ``NUM_MAX_NVL_PEERS 8``; csrc/deep_ep.cpp splits the EP group into
``rdma_rank = rank / 8`` groups of 8 NVLink peers and the inter-group leg is an IBGDA put (internode.cu), so an
EP group of 16-64 inside one 72-GPU NVLink domain still runs an RDMA leg over the NICs between groups of 8.
HybridEP takes the whole NVLink domain. 64 GPUs of the rack (DeepSeek-V3's 256 experts divide 64, not 72):
the gb200-nvl72 preset with 64 devices and 64 NICs in its one NVLink domain.

Hand-checked bytes, DeepSeek-V3 (top-8, node limit 4, h 7168, bf16 rows of 14,336 B), b 1, s 4096, tp 1:
4,096 tokens per rank. EP 16 = 2 groups of 8: nodes per token 2 (1 - (1/2)^8) = 1.9921875, RDMA rows
round(4096 x 1.9921875) = 8,160, 8,160 x 14,336 = 116,981,760 B per rank per MoE layer.
"""

from dataclasses import replace

import pytest

from collectives.topology import cluster_preset
from planner import MODEL_PRESETS, ParallelSpec, SpecError, WorkloadSpec, build_plan
from planner.context import Context
from planner.plan import Options, nvlink_view
from planner.rules.deepep import NUM_MAX_NVL_PEERS, ep_per_node, legs

DSV3 = MODEL_PRESETS["deepseek-v3"]
RACK = replace(cluster_preset("gb200-nvl72", 1), devices_per_node=64, nics_per_node=64)
WORK = WorkloadSpec(micro_batch_size=1, global_batch_size=64, seq_length=4096)
ROW = 7168 * 2


def ctx(ep, dispatch="deepep", model=DSV3, per_node=64):
    return Context(model, WORK, ParallelSpec(dp=64, ep=ep, ep_dispatch=dispatch), per_node)


def test_deepep_sees_at_most_8_nvlink_peers_hybridep_the_domain():
    assert NUM_MAX_NVL_PEERS == 8
    assert [ep_per_node(ctx(ep)) for ep in (4, 8, 16, 32, 64)] == [4, 8, 8, 8, 8]
    assert [ep_per_node(ctx(ep, "hybridep")) for ep in (8, 16, 64)] == [8, 16, 64]
    dispatch, _ = legs(ctx(16), 4096, ROW, ROW)
    assert [(leg, message) for leg, _, message in dispatch] == [("rdma", 8160 * ROW), ("nvlink", dispatch[1][2])]
    assert 8160 * ROW == 116_981_760
    hybrid, _ = legs(ctx(16, "hybridep"), 4096, ROW, ROW)
    assert [leg for leg, _, _ in hybrid] == ["nvlink"]  # one NVLink domain: no RDMA leg


def test_the_rdma_leg_is_priced_on_the_nics_inside_the_rack():
    """EP 16 on the rack: the RDMA leg's group is 2 GPUs 8 apart, joined by NVLink (900 GB/s) in the graph,
    but DeepEP sends through their 50 GB/s NICs: half of 116,981,760 B leaves each rank, >= 1.17 ms."""
    par = ParallelSpec(dp=64, ep=16, ep_dispatch="deepep")
    plan = build_plan(DSV3, WORK, par, RACK, Options(timeline=False))
    rows = {pc.call.name: pc for pc in plan.calls}
    rdma, nvlink = rows["ep.dispatch.rdma"], rows["ep.dispatch.nvlink"]
    assert rdma.call.message_bytes == 116_981_760 and rdma.call.nvlink_peers == 8 and nvlink.call.nvlink_peers == 0
    assert rdma.price.bottleneck["kind"] == "nic" and nvlink.price.bottleneck["kind"] == "nvlink"
    assert rdma.price.time_s >= 116_981_760 / 2 / 50e9
    # the same call through NVLink would be an order of magnitude faster: HybridEP (whole domain) moves more
    # bytes (one copy per target GPU) in less time
    hybrid = build_plan(DSV3, WORK, replace(par, ep_dispatch="hybridep"), RACK, Options(timeline=False))
    fast = {pc.call.name: pc for pc in hybrid.calls}["ep.dispatch.nvlink"]
    assert fast.price.time_s < rdma.price.time_s / 2
    # on DGX H100 nodes of 8 the view is the cluster itself
    assert nvlink_view(cluster_preset("dgx-h100", 2), 8) is None
    view = nvlink_view(RACK, 8)
    assert (view.num_nodes, view.devices_per_node, view.nics_per_node) == (8, 8, 8)


def test_deepeps_rank_rules_are_422s():
    """csrc/deep_ep.cpp: ``num_ranks < 8 or num_ranks % 8 == 0``; normal mode ``num_ranks <= 8 x 20``."""
    sixty = replace(DSV3, moe=replace(DSV3.moe, num_experts=60, node_limit=None))
    with pytest.raises(SpecError) as err:
        ep_per_node(Context(sixty, WORK, ParallelSpec(dp=60, ep=12, ep_dispatch="deepep"), 60))
    assert err.value.field == "parallel.ep_dispatch" and "multiple of 8" in err.value.rule and "ep 12" in err.value.rule
    with pytest.raises(SpecError) as err:
        ep_per_node(Context(DSV3, WORK, ParallelSpec(dp=256, ep=256, ep_dispatch="deepep"), 8))
    assert "8 x 20 = 160" in err.value.rule
    ep_per_node(Context(sixty, WORK, ParallelSpec(dp=60, ep=12, ep_dispatch="hybridep"), 60))  # HybridEP: no limit


def test_the_rdma_legs_links_are_drawn_on_the_racks_as_built():
    """The RDMA leg is priced on nodes of 8 (nvlink_view), but its links are reported as the cluster's own
    (planner/kernel_view.py), so the page colours the edges POST /v1/topology draws. Two NVL72 racks (144 GPUs,
    one NIC each, rail-optimised: NIC r of both racks on leaf r), EP 16 over GPUs 0-15 of rack 0: the RDMA group
    of GPU 0 is GPUs 0 and 8, whose NICs are rack 0's NICs 0 and 8 on leaves 0 and 8 (in the view: node 1's
    NIC 0 on leaf 0)."""
    from collectives.topology import cluster_for
    from planner.kernel_view import NOT_DRAWN

    racks = cluster_preset("gb200-nvl72", 2)
    model = replace(DSV3, num_layers=4)
    par = ParallelSpec(dp=144, ep=16, ep_dispatch="deepep")
    work = replace(WORK, global_batch_size=144)
    plan = build_plan(model, work, par, racks, Options(timeline=False, links_per_call=512))
    real, view = cluster_for(racks), cluster_for(nvlink_view(racks, 8))
    rdma = {pc.call.name: pc for pc in plan.calls}["ep.dispatch.rdma"]
    assert rdma.group_devices == [0, 8]
    labels = {link["label"]: link for link in rdma.links}
    for link in rdma.links:  # every link is the real cluster's, labelled as the cluster labels it
        assert link["id"] != NOT_DRAWN and real.describe_link(link["id"])["label"] == link["label"]
    assert {"node 0 nic 8 -> leaf 8", "leaf 8 -> node 0 nic 8", "node 0 gpu 8 -> nic 8"} <= labels.keys()
    # rail-optimised with one unit: NIC j of each rack on leaf j (the view's rails are 0-7 only)
    rails = [tuple(int(x) for x in label.replace("node ", "").replace(" nic ", " ").replace(" -> leaf ", " ").split())
             for label in labels if label.startswith("node ") and "-> leaf" in label]  # fmt: skip
    assert rails and all(nic == leaf for _, nic, leaf in rails) and max(leaf for *_, leaf in rails) >= 8
    # NIC links map one to one: the bytes the NICs carry are the view's
    on_view = [link for link in rdma.price.links if view.describe_link(link["id"])["family"] == "nic_up"]
    drawn = [link for link in rdma.links if link["family"] == "nic_up"]
    assert sum(link["bytes"] for link in drawn) == sum(link["bytes"] for link in on_view) > 0
    # the NVLink leg is priced on the cluster itself: its links were the cluster's all along
    nvlink = {pc.call.name: pc for pc in plan.calls}["ep.dispatch.nvlink"]
    assert nvlink.links == [real.describe_link(x["id"]) | {k: x[k] for k in ("bytes", "busy_s", "utilisation")}
                            for x in nvlink.price.links]  # fmt: skip
    # one rack is one node: its graph has no NICs, so the RDMA leg's links name no drawn edge
    one = build_plan(model, WORK, ParallelSpec(dp=64, ep=16, ep_dispatch="deepep"), RACK, Options(timeline=False))
    lone = {pc.call.name: pc for pc in one.calls}["ep.dispatch.rdma"]
    assert lone.links and all(link["id"] == NOT_DRAWN for link in lone.links)
    assert lone.links[0]["label"].endswith("(as DeepEP sees the cluster)")
