"""The global constants the library pricer reads on top of NCCL's own model: one frozen set for every
cluster, never fitted per record (fitted on tests/reference/nccl/measurements.json, see docs/pricing.md).

- ``efficiency[kind]``: achieved / NCCL-modelled bus bandwidth, by the resource that bounds the algorithm:
  ``nvlink`` (ring/tree inside a node), ``in_network`` (NVLS: NVLink SHARP inside a node), ``pcie``
  (PCIe-only GPUs), ``nic`` (anything that crosses nodes).
- ``latency_scale[part]``: multiplies a part of NCCL's modelled latency (model.py _latencies): ``intra_node``
  the NVLink domain's terms (the base latency and the intra-node hops, in one-node calls and in the intra-node
  legs of multi-node calls alike), ``inter_node`` the network's (NET hwLat hops, the ring's per-step network
  overhead); a key ``<part>:<generation>`` (``intra_node:ampere``) holds one GPU generation's own value (the
  generations of NCCL's compCapIndex: volta, ampere, hopper, blackwell) and wins over the plain key for that
  generation.
  A plain span given in :meth:`LibraryCalibration.with_values` sets the span for every generation.
- ``network_latency_s[kind]``: the network plugin's per-hop latency in seconds (NCCL's graph->latencyInter,
  added to the per-hop network latency and twice for Simple, tuning.cc:ncclTopoTuneModel v2.30.7-1), by
  network kind (ib, roce, efa, efa_sendrecv, tcpxo).

The names match collectives/topology/fit.py's constants (``efficiency.<kind>``, ``latency_scale.<span>``,
``network_latency_s.<kind>``), so fitted values go in unchanged (:meth:`LibraryCalibration.with_values`).
A ClusterSpec may carry its own (``ClusterSpec.calibration``); the pricer uses it when the caller gives none.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..._hashing import kept_hash
from ..spec import NETWORK_KINDS  # noqa: F401  (re-exported: the kinds network_latency_s is keyed by)
from .tables import cc_class

SPANS = ("intra_node", "inter_node")
GENERATIONS = ("volta", "ampere", "hopper", "blackwell")  # tuning.cc compCapIndex 0-3 (tables.cc_class)


def generation(sm: int) -> str:
    return GENERATIONS[cc_class(sm)]


def latency_keys() -> tuple[str, ...]:
    """Every key latency_scale accepts: a span, or a span qualified by one GPU generation."""
    return SPANS + tuple(f"{s}:{g}" for s in SPANS for g in GENERATIONS)


@dataclass(frozen=True)
class LibraryCalibration:
    efficiency: dict[str, float] = field(
        default_factory=lambda: {"nvlink": 0.96, "in_network": 1.0, "pcie": 0.90, "nic": 0.97}
    )
    # Fitted by bench/library_table.py:fit on tests/reference/nccl (docs/pricing.md), with the channels NCCL
    # really launches at small sizes modelled (model.py Candidate.channels_used). Inside a node the measured
    # latency is a generation's multiple of NCCL's NVLink table (the research notes' "2-3x"): the one-node rows
    # below 64 MiB give 2.75 on A100 (27 rows, Azure ND A100 v4 and stas00's DGX A100, both NCCL 2.18-era) and
    # 1.75 on H100 (16 rows, Azure ND H100 v5, NCCL 2.18.5), each row priced with its own NCCL's tables where the
    # record names the version (tables.VERSIONS; Hopper's was 1.875 with v2.30's tables for every row); one
    # scale for both fits neither (2.75 prices the H100's 1 KiB all-reduce at 41 us where it takes 26 us). A
    # generation without one-node records in the fit set takes its nearest generation's value: Blackwell
    # Hopper's, Volta Ampere's (assumed).
    # The network's part: NCCL's NET table (1.0) where no multi-node rows fit it (Hopper, Blackwell, Volta);
    # Ampere 0.5, fitted on the 8-byte..64 KiB rows of 2- and 32-node A100 InfiniBand runs given their NVLink legs at
    # Ampere's 2.75 (nvl5; 1.0 when the whole latency of a multi-node call took one scale). Efficiencies: median
    # measured / modelled busbw at >= 64 MiB (in_network 1.002 with NCCL's own
    # one-node NVLS graph, graphs.py _nvls_speed; nvlink 0.962, nic 0.968; pcie assumed), refitted with the
    # Simple pipeline fill (model.py Candidate.fill_s; before it: in_network 0.995, nic 0.954).
    latency_scale: dict[str, float] = field(
        default_factory=lambda: {
            "intra_node:volta": 2.75,
            "intra_node:ampere": 2.75,
            "intra_node:hopper": 1.75,
            "intra_node:blackwell": 1.75,
            "inter_node": 1.0,
            "inter_node:ampere": 0.5,
        }
    )
    network_latency_s: dict[str, float] = field(
        default_factory=lambda: {
            "ib": 0.0,  # NCCL's NET hwLat tables are InfiniBand's; the IB plugin reports no extra latency
            "roce": 1.0e-6,  # RoCE: switch buffering and PFC, ~1 us over IB (assumed; calibrate from logs)
            # AWS EFA/SRD through aws-ofi-nccl, by the plugin's transport protocol (its platform table,
            # src/platform-aws.cpp default_protocol, aws-ofi-nccl v1.4.0-1383-g2daf7d30): RDMA write on p5,
            # p5e, p5en, p6-b200, p6-b300 ("efa"): AWS's ~15 us one-way EFA latency (AWS EFA documentation),
            # not fitted; SENDRECV on EFA without RDMA write, p3dn, p4d, p4de ("efa_sendrecv"): fitted on the
            # p4de records together with the network step window (tables.WINDOW_ONE_WAYS; 60 us since the NVLink
            # legs take the domain's scale, nvl5; 70 us before, 80 us before the window; the plugin itself
            # reports 75 us to NCCL's tuner for these platforms)
            "efa": 15.0e-6,
            "efa_sendrecv": 60.0e-6,
            "tcpxo": 20.0e-6,  # GCP TCPXO (GPUDirect-TCPXO, a3-mega), assumed; calibrate from logs
            "tcpx": 20.0e-6,  # GCP GPUDirect-TCPX (a3-high), assumed as TCPXO's; no public a3-high log in the sets
        }
    )

    def eff(self, kind: str) -> float:
        return self.efficiency.get(kind, 1.0)

    def latency_key(self, span: str, sm: int) -> str:
        """The latency_scale key a call of ``span`` on GPUs of compute capability ``sm`` reads."""
        key = f"{span}:{generation(sm)}"
        return key if key in self.latency_scale else span

    def latency_multiplier(self, span: str, sm: int) -> float:
        return self.latency_scale.get(self.latency_key(span, sm), 1.0)

    def net_latency_us(self, kind: str) -> float:
        return self.network_latency_s.get(kind, 0.0) * 1e6

    def with_values(self, efficiency=None, latency_scale=None, network_latency_s=None) -> LibraryCalibration:
        """These constants with some replaced (absent names keep their values; a plain span replaces that
        span's per-generation values too)."""
        scales = dict(latency_scale or {})
        kept = {k: v for k, v in self.latency_scale.items() if k.split(":")[0] not in scales}
        return LibraryCalibration(
            self.efficiency | dict(efficiency or {}),
            kept | scales,
            self.network_latency_s | dict(network_latency_s or {}),
        )

    def __hash__(self) -> int:
        """Frozen with dict fields: the hash of their sorted items (a key of the price caches, hashed some 17
        times a plan), computed once and kept beside the instance (..._hashing); equality stays the fields'."""
        return kept_hash(self, _calibration_hash)


def _calibration_hash(calibration: LibraryCalibration) -> int:
    items = (calibration.efficiency, calibration.latency_scale, calibration.network_latency_s)
    return hash(tuple(tuple(sorted(d.items())) for d in items))


DEFAULT_LIBRARY = LibraryCalibration()
