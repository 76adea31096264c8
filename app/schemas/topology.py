"""POST /v1/topology: the subgraph of a cluster that one group's traffic touches, for drawing."""

from __future__ import annotations

from pydantic import BaseModel, Field

from .base import MAX_DEVICES, DeviceId, Strict, with_example
from .cluster import ClusterIn

MAX_UTILISATION = 4096  # links coloured per request: far above the 64 a plan reports per call


class LinkUse(Strict):
    id: int = Field(ge=0, lt=1 << 40, description="a link id as a plan's placement.links reports it")
    utilisation: float = Field(ge=0, le=1e6, description="busy time / call time")


class TopologyRequest(Strict):
    model_config = with_example({"cluster": {"preset": "dgx-h100", "num_nodes": 4}, "devices": [0, 8, 16, 24]})
    cluster: ClusterIn = Field(description="a request's cluster block; a plan response's cluster block is one")
    devices: list[DeviceId] = Field(
        min_length=1, max_length=MAX_DEVICES, description="global device ids of one group (placement.group_devices)"
    )
    utilisation: list[LinkUse] | None = Field(
        default=None, max_length=MAX_UTILISATION, description="links to colour (placement.links); others are idle"
    )


class VertexOut(BaseModel):
    id: str
    kind: str = Field(description="gpu, node, switch, nic, leaf, spine, router; aggregated: node_box, rail")
    label: str
    node: int | None = Field(description="the node it belongs to; null for network switches")
    parent: str | None = Field(description="id of the node vertex it is drawn inside")
    member: bool = Field(description="a GPU of the group")
    members: int = Field(description="node_box: devices of the node in the group")


class EdgeOut(BaseModel):
    id: str
    source: str
    target: str
    links: list[int] = Field(description="link ids, as in placement.links (a bundle holds several)")
    label: str = Field(description="the link's label as placement.links gives it; a bundle's own")
    kind: str
    family: str
    capacity_GBps: float = Field(description="per link, per direction")
    utilisation: float = Field(description="the busiest of its links among those given")


class TopologyOut(BaseModel):
    aggregated: bool = Field(description="node boxes and rail bundles (the devices span more than 6 nodes)")
    nodes: int = Field(description="nodes the devices span")
    nodes_drawn: list[int]
    truncated: bool = Field(description="GPUs, node boxes or router links were left out to stay in bounds")
    vertices: list[VertexOut]
    edges: list[EdgeOut]
