"""What a fabric inside a node (one NVLink domain: a DGX's NVSwitch, a GB200 NVL72 rack's 72 GPUs, an NPU
board's full mesh) is to the rest of the system: one class per fabric, registered by name, built once per
cluster (``Cluster.fabric``), so nothing compares a fabric's name:

- **rules** (``validate``, a class method): every rule of the spec's ``intra`` block, CollectiveError naming
  the field;
- **link table** (``families``): its link families, as (name, kind, count, capacity GB/s, latency s), laid
  out so a device's link is index arithmetic on the device number; ``endpoints`` names link i's two vertices;
- **routing** (``route``): bytes per link for transfers between devices of one node, and the latency;
- **in-node reduction** (``reduces``, ``reduction_families``, ``route_reduction``): NVLink SHARP (NVLS);
- **symmetry** (``link_shifts``): how its families move when a placement moves by whole nodes;
- **what NCCL's model needs** (``library_model``, ``switched``, ``connects_devices``) and the extra
  algorithms a fabric's own library tries (``extra_candidates``, select.py).

An NVL72-style rack is the ``switch`` fabric with 72 devices per node (presets.gb200_nvl72): one NVLink
domain of 72 GPUs behind one logical NVSwitch.
"""

from __future__ import annotations

from typing import ClassVar

from ..._errors import CollectiveError

Families = list[tuple[str, str, int, float, float]]  # (name, kind, count, capacity_GBps, latency_s)


class FabricModel:
    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    connects_devices: ClassVar[bool] = True  # False: one device per node (spec.validate_cluster says so)
    switched: ClassVar[bool] = False  # devices reach each other through one switch (NVSwitch, a PCIe switch)
    library_model: ClassVar[bool] = False  # NCCL's topology search covers it (library/pricer.py is_nvidia)
    extra_candidates: ClassVar[dict] = {}  # Op -> algorithms the fabric's library also tries (select.py)
    reduction_families: ClassVar[tuple[str, ...]] = ()  # links that run at the NVLS efficiency when reducing

    def __init__(self, spec):
        self.spec, self.intra, self.per_node = spec, spec.intra, spec.devices_per_node

    @classmethod
    def validate(cls, spec) -> None:
        from ..spec import _bandwidth

        _bandwidth("intra.bandwidth_GBps", spec.intra.bandwidth_GBps)

    def families(self) -> Families:
        return []

    def endpoints(self, family: str, i: int) -> tuple[tuple, tuple]:
        raise CollectiveError("link", f"fabric {self.name!r} has no link family {family!r}")

    def route(self, loads, start, src, dst, nbytes) -> float:
        """Add the bytes of transfers src[i] -> dst[i] (devices of one node; ``nbytes`` None: one byte each)
        to ``loads`` (``start(family)``: the family's first link id); the longest path's latency."""
        raise CollectiveError("intra.fabric", f"devices of a node with fabric {self.name!r} cannot talk to each other")

    @property
    def reduces(self) -> bool:
        """Whether the node's switch reduces (NVLS: the in_network algorithm inside a node)."""
        return False

    def route_reduction(self, loads, start, up, up_bytes, down, down_bytes) -> float:
        """Devices ``up`` send their bytes to the reducing switch, devices ``down`` receive from it."""
        raise CollectiveError("algorithm", f"fabric {self.name!r} does not reduce")

    def link_shifts(self, devices: int) -> dict[str, int]:
        """How far each family's link ids move when a placement moves ``devices`` devices (whole nodes) on.
        A fabric lays its families out node by node with the same count per node (the convention every fabric
        keeps: a device's links are index arithmetic on its number), so each moves in proportion."""
        return {name: devices * size // self.spec.num_devices for name, _, size, _, _ in self.families()}
