"""A full mesh: every pair of devices of a node has a direct link of ``bandwidth_GBps`` (8-NPU boards, HCCS).
Link (d, j) is device d's link to the node's device j. HCCL also runs its direct (mesh) algorithms there."""

from __future__ import annotations

from typing import ClassVar

from ...primitives import Op
from . import register
from ._base import FabricModel, Families


@register
class FullMesh(FabricModel):
    name = "full_mesh"
    summary = "a direct link between every pair of devices (8-NPU boards)"
    extra_candidates: ClassVar[dict] = {
        Op.ALLREDUCE: ("direct",),
        Op.REDUCESCATTER: ("direct",),
        Op.ALLGATHER: ("direct",),
    }

    def families(self) -> Families:
        n, intra = self.spec.num_devices, self.intra
        return [("mesh", intra.link_name, n * self.per_node, intra.bandwidth_GBps, intra.latency_s)]

    def endpoints(self, family: str, i: int) -> tuple[tuple, tuple]:
        if family != "mesh":
            return super().endpoints(family, i)
        d = self.per_node
        return ("device", i // d), ("device", (i // d) - (i // d) % d + i % d)

    def route(self, loads, start, src, dst, nbytes) -> float:
        loads.add(start("mesh") + src * self.per_node + dst % self.per_node, nbytes)
        return self.intra.latency_s
