"""Pricing constants, each with where it comes from. One set for every cluster: nothing is fitted per
measurement. The calibration test (tests/collectives/test_calibration.py) prices every record of
tests/reference/nccl/measurements.json with these and reports the error; README shows the table.

Time of one call = base latency of the algorithm family
                 + sum over step classes of [ repeat x (step overhead + longest path latency)
                                             + max over links of bytes / (capacity x efficiency) ].
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Calibration:
    # Achievable fraction of a link's rated bandwidth, by link kind.
    efficiency: dict[str, float] = field(
        default_factory=lambda: {
            # NVLink: nccl-tests ring allreduce busbw on 8 x A100 reaches 230-235 GB/s of 300 GB/s (0.78) at
            # 2-8 GiB (reference/nccl, two independent sources); H100 ring ~360 of 450.
            "nvlink": 0.78,
            "hccs": 0.78,
            "pcie": 0.80,  # PCIe Gen4/5 x16 DMA: 25-26 of 32 GB/s, 50-52 of 64 GB/s measured by bandwidthTest
            # NIC: NCCL maintainers' rule of thumb, ~24 GB/s per 200G HDR (0.96) and 46-49 per 400G NDR (0.95)
            "nic": 0.95,
            "leaf_uplink": 0.95,
            "spine_downlink": 0.95,
            "network_link": 0.90,
            "on-chip": 1.0,
        }
    )
    # NVLink SHARP: 8 x H100 allreduce reaches busbw 466-480 GB/s (reference/nccl), i.e. algbw ~270 GB/s
    # with each GPU moving M up and M down over 450 GB/s links: 0.60 of the link rate. Applied to the
    # device ports of an NVLS switch only; InfiniBand SHARP (streaming aggregation) is taken at the NICs'
    # own efficiency, for want of a measurement in reference/nccl to calibrate it on.
    in_network_efficiency: float = 0.60
    # Per step: NCCL's per-hop latency for the LL128/Simple protocols on NVLink is ~1-2 us
    # (src/graph/tuning.cc hwLat); 1.8 us matches the ~42 us of 14-step 8 x A100 ring allreduce at 2-64 KiB.
    step_overhead_s: float = 1.8e-6
    # Kernel launch and set-up per call, NCCL baseLat (tuning.cc): ~6.8 us ring, ~6.6 us tree. NVLS pays
    # for the multicast set-up: the 8 x H100 NVLS allreduce floor of ~25 us at 1 KiB.
    base_latency_s: dict[str, float] = field(
        default_factory=lambda: {
            "ring": 6.8e-6,
            "double_binary_tree": 6.6e-6,
            "in_network": 20.0e-6,
        }
    )
    default_base_latency_s: float = 6.8e-6

    def base_latency(self, algorithm: str) -> float:
        return self.base_latency_s.get(algorithm, self.default_base_latency_s)


DEFAULT = Calibration()


# The clusters behind the records of tests/reference/nccl/measurements.json, from each record's own
# description of its interconnect. EFA (AWS) has a far longer per-message latency than InfiniBand: the
# aws-ofi-nccl plugin over SRD, ~15 us one way (AWS EFA documentation); that is a property of the NIC,
# used for every EFA record alike. The EFA records are p4de (EFA without RDMA write), where aws-ofi-nccl
# runs its SENDRECV protocol (src/platform-aws.cpp): network kind "efa_sendrecv".
EFA_LATENCY_S = 15e-6


def cluster_for_record(record: dict):
    """A ClusterSpec for one measurement record (see the table in the README)."""
    from dataclasses import replace

    from .gpu import GPUS
    from .presets import dgx_a100, dgx_h100
    from .spec import ClusterSpec, IntraNode, Network

    nodes, gpus = record["nodes"], record["gpus"]
    text = record["interconnect"]
    gpu = GPUS["h100-sxm5-80gb"] if "H100" in record.get("gpu", "") else GPUS["a100-sxm4-80gb"]
    if gpus == nodes:  # one GPU per node: the NIC is all there is
        nic = 50.0 if "NDR" in text or "400" in text else 25.0
        return ClusterSpec(
            "1gpu-per-node",
            nodes,
            1,
            IntraNode("none", 1.0, 0.0),
            nics_per_node=1,
            nic_bandwidth_GBps=nic,
            pcie_bandwidth_GBps=64.0 if nic > 25 else 32.0,
            network=Network("fat_tree"),
            gpu=gpu,
        )
    base = dgx_h100(nodes) if "NVLink4" in text else dgx_a100(nodes)
    # nccl-tests runs use NCCL's defaults: no CollNet/SHARP plugin unless the record says so
    base = replace(base, network=replace(base.network, in_network_reduction=False))
    if "EFA" in text:
        return replace(
            base,
            nics_per_node=4,
            nic_bandwidth_GBps=12.5,
            nic_latency_s=EFA_LATENCY_S,
            network=replace(base.network, rail_optimized=False, kind="efa_sendrecv"),
        )
    if "4x" in text and "200" in text:
        return replace(base, nics_per_node=4, nic_bandwidth_GBps=25.0)
    return base
