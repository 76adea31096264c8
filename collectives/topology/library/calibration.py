"""The global constants the library pricer reads on top of NCCL's own model: one frozen set for every
cluster, never fitted per record (fitted on tests/reference/nccl/measurements.json, see docs/pricing.md).

- ``efficiency[kind]``: achieved / NCCL-modelled bus bandwidth, by the resource that bounds the algorithm:
  ``nvlink`` (ring/tree inside a node), ``nvls`` (NVLink SHARP inside a node), ``pcie`` (PCIe-only
  GPUs), ``nic`` (anything that crosses nodes).
- ``latency_scale[span]``: multiplies NCCL's modelled latency, ``intra_node`` or ``inter_node``.
- ``net_latency_us[kind]``: the network plugin's per-hop latency (NCCL's graph->latencyInter, added to the
  per-hop network latency and twice for Simple, tuning.cc:ncclTopoTuneModel v2.30.7-1), by network kind.
"""

from __future__ import annotations

from dataclasses import dataclass, field

NETWORK_KINDS = ("ib", "roce", "efa", "tcpxo")


@dataclass(frozen=True)
class LibraryCalibration:
    efficiency: dict[str, float] = field(
        default_factory=lambda: {"nvlink": 0.96, "nvls": 0.96, "pcie": 0.90, "nic": 0.92}
    )
    # Fitted (docs/pricing.md): measured latency is ~2.75x NCCL's table latency at 64 KiB-64 MiB, one scalar
    # for both spans (the research notes' "2-3x"); efficiencies fitted on >= 64 MiB rows.
    latency_scale: dict[str, float] = field(default_factory=lambda: {"intra_node": 2.75, "inter_node": 2.75})
    net_latency_us: dict[str, float] = field(
        default_factory=lambda: {
            "ib": 0.0,  # NCCL's NET hwLat tables are InfiniBand's; the IB plugin reports no extra latency
            "roce": 1.0,  # RoCE: switch buffering and PFC, ~1 us over IB (assumed; calibrate from logs)
            "efa": 25.0,  # AWS EFA/SRD through aws-ofi-nccl; fitted on the p4de records (AWS quotes ~15 us one way)
            "tcpxo": 20.0,  # GCP TCPXO (GPUDirect-TCPX over TCP), assumed; calibrate from logs
        }
    )

    def eff(self, kind: str) -> float:
        return self.efficiency.get(kind, 1.0)

    def __hash__(self) -> int:  # frozen with dict fields: hash their items (used as a cache key)
        return hash(tuple(tuple(sorted(d.items())) for d in (self.efficiency, self.latency_scale, self.net_latency_us)))


DEFAULT_LIBRARY = LibraryCalibration()
