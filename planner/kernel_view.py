"""A call priced on a kernel's own view of the cluster, drawn on the cluster as built.

DeepEP's normal kernels join at most 8 GPUs by NVLink (``Call.nvlink_peers``; DeepEP 4e38d1d
csrc/kernels/configs.cuh ``NUM_MAX_NVL_PEERS``), so their RDMA leg is priced on ``plan.nvlink_view``: the
cluster cut into nodes of 8 GPUs, each with its share of the node's NICs, under as many devices per leaf. The
view keeps the device numbers but not the link ids: a view link's id names another link (or none) of the
cluster the page draws (POST /v1/topology), so a call's ``links`` are translated here, link by link, through
the vertices they join (``Cluster.endpoints``):

- a GPU is itself; a view node's NVLink switch is the switch of the node that GPU sits in;
- a view NIC is the NIC its first GPU sends through on the real node (``Cluster.nic_of``'s rail rule);
- a network vertex the view's NICs attach to (a leaf) is every real vertex those NICs' real NICs attach to:
  on a rail-optimised GB200 NVL72 fabric (72 rails per scalable unit) the view's rail j of a unit is real
  rails j, j + 8, ..., j + 64, and its traffic is shared evenly among them (uniform routing, the RDMA leg's
  assumption: rules/deepep.py);
- any other vertex (the spines) is itself.

A view link with no such link in the real cluster (a single NVL72 rack is one node: its graph has no NICs,
while DeepEP's RDMA leg crosses them) keeps its view label with "(as DeepEP sees the cluster)" and id -1,
which names no drawn edge.
"""

from __future__ import annotations

import numpy as np

from collectives.topology import Cluster

NOT_DRAWN = -1  # the id of a link the drawn cluster does not have


def drawn_links(view: Cluster, real: Cluster, links: list[dict]) -> list[dict]:
    """``links`` (a price's busiest links on ``view``, each with bytes, busy_s and utilisation over the call)
    as links of ``real``, busiest first; a view link spread over several real links shares its bytes and busy
    time evenly, scaled by the capacities (busy_s = bytes / rate), and real links reached twice add up."""
    index = _endpoint_index(real)
    out: dict[int, dict] = {}
    missing = []
    for link in links:
        u, v = view.endpoints(link["id"])
        targets = [index[(a, b)] for a in _vertices(view, real, u) for b in _vertices(view, real, v) if (a, b) in index]
        if not targets:
            missing.append(link | {"id": NOT_DRAWN, "label": f"{link['label']} (as DeepEP sees the cluster)"})
            continue
        share = 1.0 / len(targets)
        for target in targets:
            d = real.describe_link(target)
            scale = share * link["capacity_GBps"] / d["capacity_GBps"]
            row = out.setdefault(target, d | {"bytes": 0, "busy_s": 0.0, "utilisation": 0.0})
            row["bytes"] += round(link["bytes"] * share)
            row["busy_s"] += link["busy_s"] * scale
            row["utilisation"] += link["utilisation"] * scale
    return sorted([*out.values(), *missing], key=lambda link: -link["busy_s"])


def _vertices(view: Cluster, real: Cluster, vertex: tuple) -> list[tuple]:
    kind = vertex[0]
    if kind == "device":
        return [vertex]
    if kind == "switch":
        return [("switch", vertex[1] * view.per_node // real.per_node)]
    if kind == "nic":
        return [_real_nic_vertex(real, _first_device(view, vertex[1], vertex[2]))]
    attached = _attached_nics(view, vertex)
    if attached.size == 0:
        return [vertex]
    k = view.spec.nics_per_node
    devices = [_first_device(view, int(g) // k, int(g) % k) for g in attached]
    real_nics = real.nic_of(np.asarray(devices, dtype=np.int64))
    return list(dict.fromkeys(real.network.attach(int(g)) for g in real_nics))


def _first_device(view: Cluster, node: int, nic: int) -> int:
    """The first GPU of view node ``node`` that sends through its NIC ``nic`` (NIC i·K/D of its node)."""
    k, d = view.spec.nics_per_node, view.per_node
    return node * d + (nic * d + k - 1) // k


def _real_nic_vertex(real: Cluster, device: int) -> tuple:
    k, d = real.spec.nics_per_node, real.per_node
    return ("nic", device // d, (device % d) * k // d)


def _attached_nics(view: Cluster, vertex: tuple) -> np.ndarray:
    """The view's global NIC indices attached to a network vertex (memoised per view)."""
    memo = view.__dict__.get("_attached_memo")
    if memo is None:
        memo = view.__dict__["_attached_memo"] = {}
        for g in range(view.num_nodes * view.spec.nics_per_node if view.num_nodes > 1 else 0):
            memo.setdefault(view.network.attach(g), []).append(g)
    return np.asarray(memo.get(vertex, ()), dtype=np.int64)


def _endpoint_index(real: Cluster) -> dict[tuple, int]:
    """(source vertex, target vertex) -> link id of every link of ``real`` (memoised per cluster: built once,
    the first time a kernel's view is drawn on it)."""
    memo = real.__dict__.get("_endpoint_index")
    if memo is None:
        memo = real.__dict__["_endpoint_index"] = {real.endpoints(link): link for link in range(real.num_links)}
    return memo


__all__ = ["NOT_DRAWN", "drawn_links"]
