"""A switch: every device has ``bandwidth_GBps`` to a non-blocking switch (NVSwitch; the several switch chips
of a DGX are one logical switch because traffic is sprayed over all of them; a GB200 NVL72 rack is one such
domain of 72 GPUs; a PCIe switch when ``link_name`` is pcie). A transfer takes the source's up-link and the
destination's down-link, half the fabric latency each. With ``in_network_reduction`` the switch reduces
(NVLink SHARP, NCCL's NVLS)."""

from __future__ import annotations

from . import register
from ._base import FabricModel, Families


@register
class Switch(FabricModel):
    name = "switch"
    summary = "a non-blocking switch (NVSwitch, NVL72 racks, a PCIe switch); NVLS"
    switched = True
    library_model = True
    reduction_families = ("dev_up", "dev_down")

    def families(self) -> Families:
        n, intra = self.spec.num_devices, self.intra
        return [
            ("dev_up", intra.link_name, n, intra.bandwidth_GBps, intra.latency_s / 2),
            ("dev_down", intra.link_name, n, intra.bandwidth_GBps, intra.latency_s / 2),
        ]

    def endpoints(self, family: str, i: int) -> tuple[tuple, tuple]:
        switch = ("switch", i // self.per_node)
        if family == "dev_up":
            return ("device", i), switch
        if family == "dev_down":
            return switch, ("device", i)
        return super().endpoints(family, i)

    def route(self, loads, start, src, dst, nbytes) -> float:
        loads.add(start("dev_up") + src, nbytes)
        loads.add(start("dev_down") + dst, nbytes)
        return self.intra.latency_s

    @property
    def reduces(self) -> bool:
        return self.intra.in_network_reduction

    def route_reduction(self, loads, start, up, up_bytes, down, down_bytes) -> float:
        loads.add(start("dev_up") + up, up_bytes)
        loads.add(start("dev_down") + down, down_bytes)
        return self.intra.latency_s
