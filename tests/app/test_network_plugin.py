"""A network is a plug-in (collectives/topology/networks/), and so is a fabric inside a node (fabrics/): toy
ones registered here, in the test only, are planned and priced on over HTTP like the built-in ones, a toy
network's work estimate guards the service, and an unregistered name is a 422 naming the field and every
registered name."""

from __future__ import annotations

import pytest

from app.settings import Settings
from collectives import CollectiveError
from collectives.topology import fabrics, networks
from collectives.topology.fabrics import FabricModel
from collectives.topology.networks import NetworkModel

from .conftest import Api

LLAMA8B = {
    "model": {"preset": "llama3-8b"},
    "workload": {"kind": "training", "micro_batch_size": 1, "global_batch_size": 64},
    "parallel": {"tp": 8, "dp": 4},
    "options": {"algorithm": "auto"},
}


class Star(NetworkModel):
    """Every NIC on one central crossbar: nothing but the NICs' own links between nodes, one switch hop.
    Its work estimate is 1,000 units per node, so the guard has something to refuse."""

    name = "toy_star"
    summary = "one crossbar for every NIC (test only)"
    fields = ("switch_latency_s",)

    @classmethod
    def work(cls, spec) -> int:
        return 1000 * spec.num_nodes

    @classmethod
    def work_rule(cls, spec) -> str:
        return f"a toy star of {spec.num_nodes} nodes costs 1000 x {spec.num_nodes} = {cls.work(spec):,} units"

    def attach(self, nic: int) -> tuple:
        return ("crossbar", 0)

    def route(self, loads, start, nic_src, nic_dst, node_src, node_dst, nbytes) -> float:
        return self.network.switch_latency_s  # the NICs' links are all it loads: Cluster adds those


@pytest.fixture
def star():
    networks.register(Star)
    yield Star
    networks.unregister(Star.name)


def cluster(topology: str, **network) -> dict:
    return {"preset": "dgx-h100", "num_nodes": 4, "network": {"topology": topology, **network}}


def test_a_toy_network_plans_over_http_as_its_twin_fat_tree(api, star):
    """A fat-tree with every NIC under one leaf (not rail-optimised, one unit) never crosses the spines:
    the same links and one switch hop, so every call prices exactly as on the star."""
    on_star = api.post("/v1/plan", json=LLAMA8B | {"cluster": cluster("toy_star")})
    assert on_star.status_code == 200, on_star.text
    twin = cluster("fat_tree", rail_optimized=False, nodes_per_leaf=4)
    on_tree = api.post("/v1/plan", json=LLAMA8B | {"cluster": twin}).json()
    star_calls, tree_calls = on_star.json()["calls"], on_tree["calls"]
    assert [c["name"] for c in star_calls] == [c["name"] for c in tree_calls]
    crossing = [c for c in star_calls if c["placement"]["nodes_per_group"] > 1]
    assert crossing, "the DP calls cross nodes"
    for s, t in zip(star_calls, tree_calls, strict=True):
        assert s["time_s"] == pytest.approx(t["time_s"], rel=1e-12), s["name"]
    assert on_star.json()["step"]["time_s"] == pytest.approx(on_tree["step"]["time_s"], rel=1e-12)
    # the NICs attach to the star's crossbar in the drawing (Cluster.endpoints asks the plug-in)
    body = {"cluster": on_star.json()["cluster"], "devices": crossing[0]["placement"]["group_devices"]}
    view = api.post("/v1/topology", json=body)
    assert view.status_code == 200, view.text
    assert "crossbar 0" in {v["label"] for v in view.json()["vertices"]}


def test_a_toy_networks_work_estimate_is_what_the_guard_charges(star):
    """The guard asks the plug-in: 4 nodes cost 4,000 units; a budget of 3,999 refuses, naming its rule."""
    tight = Api(Settings(max_router_pairs=3999))
    try:
        r = tight.post("/v1/plan", json=LLAMA8B | {"cluster": cluster("toy_star")})
        assert r.status_code == 422, r.text
        (err,) = r.json()["detail"]
        assert err["loc"] == ["body", "cluster", "num_nodes"]
        assert err["msg"].startswith("a toy star of 4 nodes costs 1000 x 4 = 4,000 units, over the budget of 3,999")
        assert tight.post("/v1/plan", json=LLAMA8B | {"cluster": cluster("fat_tree")}).status_code == 200
    finally:
        tight.close()


def test_an_unknown_network_is_a_422_listing_the_registered_ones(api, star):
    r = api.post("/v1/plan", json=LLAMA8B | {"cluster": cluster("slimfly")})
    assert r.status_code == 422
    (err,) = r.json()["detail"]
    assert err["loc"] == ["body", "cluster", "network", "topology"]
    assert err["msg"] == "unknown network 'slimfly'; known: dragonfly, fat_tree, hypercube, none, torus, toy_star"


def test_unregistered_the_toy_is_unknown_again(api):
    r = api.post("/v1/plan", json=LLAMA8B | {"cluster": cluster("toy_star")})
    assert r.status_code == 422
    known = "dragonfly, fat_tree, hypercube, none, torus"
    assert r.json()["detail"][0]["msg"] == f"unknown network 'toy_star'; known: {known}"


def test_a_name_registers_once_and_every_module_registers_itself():
    assert networks.names() == ("dragonfly", "fat_tree", "hypercube", "none", "torus")
    assert all(networks.network_type(n).name == n for n in networks.names())

    class Other(Star):
        name = "torus"

    with pytest.raises(CollectiveError, match="network 'torus' is registered already"):
        networks.register(Other)
    assert networks.network_type("torus").__name__ == "Torus"


class Bus(FabricModel):
    """Every device of a node on one shared bus of ``bandwidth_GBps`` (both directions together)."""

    name = "toy_bus"
    summary = "one shared bus per node (test only)"

    def families(self):
        intra = self.intra
        return [("bus", intra.link_name, self.spec.num_nodes, intra.bandwidth_GBps, intra.latency_s)]

    def endpoints(self, family, i):
        return ("switch", i), ("switch", i)

    def route(self, loads, start, src, dst, nbytes):
        loads.add(start("bus") + src // self.per_node, nbytes)
        return self.intra.latency_s


def test_a_toy_fabric_prices_over_http_with_its_own_links(api):
    """Ring allreduce of M on the 8 GPUs of a node on one bus: every byte of every step (2(n-1)/n M a rank,
    n ranks) crosses the bus, 2(n-1) M in all; unregistered, the name is a 422 listing the fabrics."""
    fabrics.register(Bus)
    try:
        m, n = 1 << 20, 8
        body = {"op": "allreduce", "message_bytes": m, "group_size": n, "algorithm": "ring", "pricing": "schedule",
                "cluster": {"preset": "dgx-h100", "intra": {"fabric": "toy_bus"}}}  # fmt: skip
        r = api.post("/v1/collectives/price", json=body)
        assert r.status_code == 200, r.text
        link = r.json()["bottleneck_link"]
        assert (link["family"], link["bytes"], link["label"]) == ("bus", 2 * (n - 1) * m, "node 0 switch -> switch")
    finally:
        fabrics.unregister(Bus.name)
    r = api.post("/v1/collectives/price", json=body)
    assert r.status_code == 422
    assert r.json()["detail"][0]["loc"] == ["body", "cluster", "intra", "fabric"]
    assert r.json()["detail"][0]["msg"] == "unknown fabric 'toy_bus'; known: full_mesh, none, ring, switch"
