"""A ring: device i of a node links to i+1 and i-1 (both directions) with ``bandwidth_GBps``. A transfer goes
the shorter way round, split evenly when both ways are equally short."""

from __future__ import annotations

import numpy as np

from ..loads import _ones_if_none
from . import register
from ._base import FabricModel, Families


@register
class Ring(FabricModel):
    name = "ring"
    summary = "devices of a node on a bidirectional ring"

    def families(self) -> Families:
        n, intra = self.spec.num_devices, self.intra
        return [("ring", intra.link_name, n * 2, intra.bandwidth_GBps, intra.latency_s)]

    def endpoints(self, family: str, i: int) -> tuple[tuple, tuple]:
        if family != "ring":
            return super().endpoints(family, i)
        d, dev = self.per_node, i // 2
        return ("device", dev), ("device", dev - dev % d + (dev % d + (1 if i % 2 == 0 else -1)) % d)

    def route(self, loads, start, src, dst, nbytes) -> float:
        d = self.per_node
        local_src, local_dst = src % d, dst % d
        nbytes = _ones_if_none(nbytes, src)
        forward = (local_dst - local_src) % d
        backward = (local_src - local_dst) % d
        base = start("ring") + (src - local_src) * 2
        for direction, hops, share in ((0, forward, forward <= backward), (1, backward, backward <= forward)):
            weight = np.where(forward == backward, 0.5, 1.0) * share
            step = 1 if direction == 0 else -1
            for h in range(int(hops.max(initial=0))):
                live = (h < hops) & (weight > 0)
                at = (local_src[live] + step * h) % d
                loads.add(base[live] + at * 2 + direction, nbytes[live] * weight[live])
        return float(np.minimum(forward, backward).max(initial=0)) * self.intra.latency_s
