"""POST /v1/topology: the subgraph a group's traffic touches, built from the cluster's own link table
(collectives/topology/view.py), so the page draws the links pricing reports instead of re-deriving them."""

from __future__ import annotations

from fastapi import APIRouter

from collectives import CollectiveError
from collectives.topology.view import subgraph
from planner import SpecError
from planner.plan import cluster_for

from ..body import OffLoopBody
from ..convert import cluster_spec
from ..errors import relocate
from ..limits import check_router
from ..schemas.topology import TopologyOut, TopologyRequest
from ._bounded import bounded_post

router = APIRouter(prefix="/v1", tags=["topology"], route_class=OffLoopBody)


def _topology(body: TopologyRequest, settings) -> dict:
    spec = cluster_spec(body.cluster, settings)
    check_router(spec, settings.max_router_pairs)
    cluster = cluster_for(spec)
    for i, use in enumerate(body.utilisation or ()):
        if use.id >= cluster.num_links:
            raise SpecError(
                f"utilisation.{i}.id", f"no link {use.id}: the cluster has links 0..{cluster.num_links - 1}"
            )
    try:
        view = subgraph(cluster, body.devices, {u.id: u.utilisation for u in body.utilisation or ()})
    except CollectiveError as err:
        raise relocate(err) from None
    return {
        "aggregated": view.aggregated,
        "nodes": view.nodes,
        "nodes_drawn": list(view.nodes_drawn),
        "truncated": view.truncated,
        "vertices": [vars(v) for v in view.vertices],
        "edges": [vars(e) for e in view.edges],
    }


bounded_post(
    router,
    "/topology",
    TopologyRequest,
    TopologyOut,
    _topology,
    name="topology",
    summary="The cluster subgraph one group's traffic touches",
    description="Vertices (GPUs, switches, NICs, leaves, spines, routers) and edges carrying the link ids and "
    "labels a plan's placement.links reports. Over 6 nodes: node boxes and rail bundles, at most 128 boxes.",
)
