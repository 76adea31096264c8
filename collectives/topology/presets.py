"""Named clusters. Every figure is per direction, in GB/s (1e9 B/s); the sources are in each docstring or row note."""

from __future__ import annotations

from dataclasses import replace
from functools import partial

from .._errors import CollectiveError
from .gpu import GPUS
from .spec import ClusterSpec, IntraNode, NcclEnv, Network


def tpu_torus(num_nodes: int = 64, dims: tuple[int, ...] | None = None) -> ClusterSpec:
    """A TPU-v4-like 3-D torus: one chip per node, 6 inter-chip links of 50 GB/s per direction with
    wrap-around (TPU v4: 4x4x4 cubes joined by optical switches). Source: Jouppi et al., ISCA 2023."""
    dims = dims or _cube(num_nodes)
    return ClusterSpec(
        "tpu-torus",
        num_nodes,
        1,
        IntraNode("none", 1.0, 0.0, False, "on-chip"),
        nics_per_node=1,
        nic_bandwidth_GBps=600.0,
        nic_latency_s=0.5e-6,
        pcie_bandwidth_GBps=600.0,
        network=Network("torus", dims=dims, link_bandwidth_GBps=50.0, switch_latency_s=1.0e-6),
        device="TPU v4-like",
        gpu=GPUS["tpu-v4"],
        description=f"{' x '.join(map(str, dims))} 3-D torus, 50 GB/s links",
        sources=("Jouppi et al., TPU v4, ISCA 2023",),
    )


def _node_cluster(
    name: str,
    num_nodes: int = 1,
    *,
    gpu: str,
    intra_GBps: float,
    nics: int,
    nic_GBps: float,
    description: str,
    sources: tuple[str, ...],
    per_node: int = 8,
    fabric: str = "switch",
    intra_latency_s: float = 0.7e-6,
    nvls: bool = True,
    link: str = "nvlink",
    pcie_GBps: float = 64.0,
    kind: str = "ib",
    rail: bool = True,
    leaf: int = 32,
    spines: int = 16,
    sharp: bool = False,
    device: str | None = None,
    nccl_env: NcclEnv | None = None,
    cpu_vendor: str = "intel",
) -> ClusterSpec:
    """Nodes of ``per_node`` devices on an intra-node ``fabric`` (NVSwitch unless said: ``intra_GBps`` per device
    per direction, ``nvls``), ``nics`` NICs of ``nic_GBps`` on PCIe Gen5 x16 (64 GB/s unless ``pcie_GBps``), a
    rail-optimised (or not) fat-tree of ``leaf`` nodes per leaf unit and ``spines`` spines, SHARP in its switches
    when ``sharp``. ``device``: the label, the GPU's name unless given."""
    return ClusterSpec(
        name,
        num_nodes,
        per_node,
        IntraNode(fabric, intra_GBps, intra_latency_s, nvls, link),
        nics_per_node=nics,
        nic_bandwidth_GBps=nic_GBps,
        pcie_bandwidth_GBps=pcie_GBps,
        network=Network(
            "fat_tree", rail_optimized=rail, nodes_per_leaf=leaf, num_spines=spines, in_network_reduction=sharp,
            kind=kind,
        ),
        device=device or GPUS[gpu].name,
        gpu=GPUS[gpu],
        description=description,
        sources=tuple(sources),
        cpu_vendor=cpu_vendor,
        nccl_env=nccl_env or NcclEnv(),
    )  # fmt: skip


# Clusters of fat-tree nodes, one row each: what the node has (GPU, intra-node GB/s per GPU per direction, NICs x
# GB/s per NIC, and what differs from _node_cluster's HGX-style node), the description and the sources; the comment
# above a row says more.
# fmt: off
_ROWS = {
    # NVIDIA DGX A100: 8 A100 on NVSwitch, 12 NVLink3 links x 25 GB/s = 300 GB/s per GPU per direction; 8 ConnectX-6
    # HDR 200 Gb/s NICs (25 GB/s), one per GPU, PCIe Gen4 x16 (32 GB/s); SuperPOD rail-optimised fat-tree, 20 nodes
    # per scalable unit. No NVLink SHARP on A100. Sources: DGX A100 system architecture white paper (2020); DGX
    # SuperPOD A100 reference architecture.
    "dgx-a100": dict(gpu="a100-sxm4-80gb", intra_GBps=300.0, nvls=False, nics=8, nic_GBps=25.0, pcie_GBps=32.0,
                     leaf=20, spines=8,
                     description="DGX A100: 8 GPUs on NVSwitch (300 GB/s), 8 x 200G HDR, rail-optimised fat-tree",
                     sources=("DGX A100 system architecture white paper",
                              "DGX SuperPOD A100 reference architecture")),
    # NVIDIA DGX H100: 8 H100 on four third-generation NVSwitch chips, 18 NVLink4 links x 25 GB/s = 450 GB/s per GPU
    # per direction, NVLink SHARP (NVLS) in the switches; 8 ConnectX-7 NDR 400 Gb/s NICs (50 GB/s), PCIe Gen5 x16
    # (64 GB/s); SuperPOD rail-optimised fat-tree, 32 nodes per scalable unit, SHARP-capable Quantum-2 switches.
    # Sources: DGX H100 user guide; DGX SuperPOD H100 reference architecture.
    "dgx-h100": dict(gpu="h100-sxm5-80gb", device="H100 SXM 80GB", intra_GBps=450.0, nics=8, nic_GBps=50.0,
                     sharp=True,
                     description="DGX H100: 8 GPUs on NVSwitch (450 GB/s, NVLS), 8 x 400G NDR, rail-optimised fat-tree",
                     sources=("DGX H100 user guide", "DGX SuperPOD H100 reference architecture")),
    # NVIDIA GB200 NVL72: one NVLink domain of 72 Blackwell GPUs, 18 NVLink5 links x 50 GB/s = 900 GB/s per GPU per
    # direction through 9 NVLink switch trays (NVLS capable); one ConnectX-7 400 Gb/s NIC per GPU; 36 Grace CPUs
    # (Arm Neoverse V2), one per two GPUs, are the hosts (NCCL reads an Arm CPU; planner/kernels.py HOST_CPUS its
    # host time per op). Source: NVIDIA GB200 NVL72 product brief.
    "gb200-nvl72": dict(gpu="gb200-186gb", device="B200 (GB200)", per_node=72, intra_GBps=900.0, nics=72,
                        nic_GBps=50.0, leaf=8, sharp=True, cpu_vendor="arm",
                        description="GB200 NVL72: 72 GPUs in one NVLink domain (900 GB/s, NVLS), 400G per GPU",
                        sources=("NVIDIA GB200 NVL72 product brief",)),
    # An 8-NPU board with a full mesh: every NPU has a direct 56 GB/s link to each of the other 7 (Huawei Ascend
    # 910B HCCS: 7 x 56 GB/s = 392 GB/s per chip), 8 x 200G RoCE ports (25 GB/s). A group of k NPUs on the board can
    # use only k-1 of the 7 links. Source: Ascend 910B / Atlas 800T A2 hardware description.
    "npu-mesh-8": dict(gpu="ascend-910b", fabric="full_mesh", intra_GBps=56.0, intra_latency_s=1.0e-6, nvls=False,
                       link="hccs", nics=8, nic_GBps=25.0, pcie_GBps=32.0, leaf=16, spines=8,
                       description="8-NPU full-mesh board (7 x 56 GB/s per NPU), 8 x 200G RoCE",
                       sources=("Atlas 800T A2 hardware description",)),
    # A traditional server: 8 GPUs behind PCIe Gen4 switches (32 GB/s each way per GPU), one 100 Gb/s NIC
    # (12.5 GB/s) shared by all eight, nodes on a plain (not rail-optimised) fat-tree.
    "pcie-server": dict(gpu="a100-pcie-80gb", intra_GBps=32.0, intra_latency_s=1.5e-6, nvls=False, link="pcie",
                        nics=1, nic_GBps=12.5, pcie_GBps=32.0, rail=False, spines=4,
                        description="8 PCIe GPUs, one shared 100G NIC, plain fat-tree",
                        sources=("PCIe Gen4 x16: 32 GB/s per direction",)),
    # Nodes of one NVIDIA GH200 Grace Hopper Superchip (H100 with 96 GB HBM3, NVLink-C2C to the Grace CPU), one
    # ConnectX-7 400 Gb/s InfiniBand NIC per superchip, as NVIDIA's MGX GH200 servers ship; the host CPU is Arm
    # (NCCL's per-step network overhead and llMaxBw read it). With one GPU per node NCCL runs PAT for
    # allgather/reducescatter (tuning.cc ncclPatEnable). Sources: NVIDIA GH200 Grace Hopper Superchip datasheet
    # (2023); NVIDIA MGX GH200 reference platform.
    "gh200": dict(gpu="gh200-96gb", per_node=1, fabric="none", intra_GBps=1.0, intra_latency_s=0.0, nvls=False,
                  nics=1, nic_GBps=50.0, rail=False, cpu_vendor="arm",
                  description="GH200 superchip nodes: 1 GPU each, 1 x 400G NDR IB, Arm host",
                  sources=("NVIDIA GH200 Grace Hopper Superchip datasheet (2023)",
                           "NVIDIA MGX GH200 reference platform")),
    # NVIDIA DGX H200: 8 H200 (141 GB HBM3e) on NVSwitch, 18 NVLink4 links = 450 GB/s per GPU per direction, NVLS;
    # 8 ConnectX-7 400 Gb/s InfiniBand NICs (50 GB/s), PCIe Gen5.
    "dgx-h200": dict(gpu="h200-sxm-141gb", intra_GBps=450.0, nics=8, nic_GBps=50.0,
                     description="DGX H200: 8 GPUs on NVSwitch (450 GB/s, NVLS), 8 x 400G IB",
                     sources=("NVIDIA DGX H200 datasheet (2024)",)),
    # NVIDIA DGX B200: 8 B200 on two fifth-generation NVSwitch chips, 18 NVLink5 links x 50 GB/s = 900 GB/s per GPU
    # per direction, NVLS; 8 ConnectX-7 400 Gb/s NICs (50 GB/s), PCIe Gen5.
    "dgx-b200": dict(gpu="b200-180gb", intra_GBps=900.0, nics=8, nic_GBps=50.0,
                     description="DGX B200: 8 GPUs on NVSwitch (900 GB/s, NVLS), 8 x 400G IB",
                     sources=("NVIDIA DGX B200 datasheet (2024)",)),
    # NVIDIA HGX H20: 8 H20 on NVSwitch, NVLink 900 GB/s bidirectional (18 NVLink4 links, 450 GB/s per direction);
    # 8 x 400 Gb/s RoCE NICs as Chinese cloud H20 servers ship them.
    "hgx-h20": dict(gpu="h20-96gb", intra_GBps=450.0, nics=8, nic_GBps=50.0, kind="roce",
                    description="HGX H20: 8 GPUs on NVSwitch (450 GB/s), 8 x 400G RoCE",
                    sources=("NVIDIA HGX H20 product brief (2024)", "Alibaba Cloud ebmgn8v instance family")),
    # HGX H800: 8 H800 on NVSwitch with 8 NVLink4 links per GPU (200 GB/s per direction, 400 GB/s bidirectional),
    # 8 x 400 Gb/s InfiniBand NICs (DeepSeek-V3 §3.1: H800 nodes, NVLink 160 GB/s achievable, 8 x 400G IB).
    "hgx-h800": dict(gpu="h800-sxm5-80gb", intra_GBps=200.0, nics=8, nic_GBps=50.0,
                     description="HGX H800: 8 GPUs on NVSwitch (8 NVLinks, 200 GB/s), 8 x 400G IB",
                     sources=("DeepSeek-V3 technical report, section 3.1",)),
    # AWS p5.48xlarge: 8 H100 on NVSwitch (450 GB/s, NVLS); 32 x 100 Gb/s EFA (3,200 Gb/s per instance), four NICs
    # per GPU, EFA/SRD through aws-ofi-nccl; not rail-optimised from NCCL's view. Network kind ``efa``: aws-ofi-nccl
    # runs its RDMA-write protocol on p5 (src/platform-aws.cpp default_protocol); p4d/p4de clusters are
    # ``efa_sendrecv``. Sources: AWS EC2 P5 instance documentation; aws/aws-ofi-nccl.
    "aws-p5": dict(gpu="h100-sxm5-80gb", intra_GBps=450.0, nics=32, nic_GBps=12.5, kind="efa", rail=False,
                   description="AWS p5.48xlarge: 8 H100, 32 x 100G EFA",
                   sources=("AWS EC2 P5 instance documentation",)),
    # Google Cloud a3-megagpu-8g: 8 H100 on NVSwitch (450 GB/s); 8 x 200 Gb/s NICs with GPUDirect-TCPXO (1,600 Gb/s
    # per VM). NVLS off and the Simple protocol only, as Google's TCPXO NCCL profile sets them (NCCL_NVLS_ENABLE=0,
    # NCCL_PROTO=Simple: library/model.py NETWORK_PROTOCOLS).
    "gcp-a3-mega": dict(gpu="h100-sxm5-80gb", intra_GBps=450.0, nics=8, nic_GBps=25.0, kind="tcpxo", nvls=False,
                        description="GCP a3-megagpu-8g: 8 H100, 8 x 200G TCPXO",
                        sources=("Google Cloud A3 Mega machine type documentation",
                                 "GoogleCloudPlatform/container-engine-accelerators gpudirect-tcpxo NCCL profile")),
    # Google Cloud a3-highgpu-8g: 8 H100 80GB on NVSwitch (450 GB/s); 4 x 200 Gb/s GPU NICs with GPUDirect-TCPX
    # (network kind ``tcpx``; 1,000 Gb/s per VM with the host NIC). Google's TCPX NCCL set-up (the
    # nccl-plugin-gpudirecttcpx image's run script, as Google's a3-high guide and dstack's "GCP A3 High" example run
    # it) sets NCCL_PROTO=Simple (library/model.py NETWORK_PROTOCOLS), NCCL_ALGO=Ring (NVLS is therefore never run:
    # off here) and NCCL_MIN_NCHANNELS = NCCL_MAX_NCHANNELS = 12 (``nccl_env``).
    "gcp-a3-high": dict(gpu="h100-sxm5-80gb", intra_GBps=450.0, nics=4, nic_GBps=25.0, kind="tcpx", nvls=False,
                        nccl_env=NcclEnv(NCCL_MIN_NCHANNELS=12, NCCL_MAX_NCHANNELS=12),
                        description="GCP a3-highgpu-8g: 8 H100, 4 x 200G GPUDirect-TCPX",
                        sources=("Google Cloud A3 machine types documentation",
                                 "Google Cloud: Maximize GPU network bandwidth with GPUDirect-TCPX",
                                 "dstack examples: GCP A3 High (GPUDirect-TCPX NCCL settings)")),
    # NVIDIA DGX B300: 8 B300 (288 GB HBM3e) on NVLink5 switches, 900 GB/s per GPU per direction (1.8 TB/s
    # bidirectional), NVLS; 8 single-port ConnectX-8 SuperNICs at 800 Gb/s (100 GB/s) on PCIe Gen6 x16 (128 GB/s).
    "dgx-b300": dict(gpu="b300-288gb", intra_GBps=900.0, nics=8, nic_GBps=100.0, pcie_GBps=128.0,
                     description="DGX B300: 8 GPUs on NVSwitch (900 GB/s, NVLS), 8 x 800G ConnectX-8",
                     sources=("NVIDIA DGX B300 datasheet (2025)",)),
    # Azure ND H100 v5: 8 H100 on NVSwitch (450 GB/s, NVLS); 8 x 400 Gb/s NDR InfiniBand, one per GPU (3.2 Tb/s
    # per VM).
    "azure-nd-h100-v5": dict(gpu="h100-sxm5-80gb", intra_GBps=450.0, nics=8, nic_GBps=50.0,
                             description="Azure ND H100 v5: 8 H100, 8 x 400G NDR IB",
                             sources=("Azure ND H100 v5 series documentation",)),
}
# fmt: on
_NODE = {name: partial(_node_cluster, name, **row) for name, row in _ROWS.items()}
dgx_a100, dgx_h100, gb200_nvl72, gh200 = (_NODE[name] for name in ("dgx-a100", "dgx-h100", "gb200-nvl72", "gh200"))


def gb300_nvl72(num_nodes: int = 1) -> ClusterSpec:
    """NVIDIA GB300 NVL72: GB200 NVL72's rack (one NVLink domain of 72 GPUs, 900 GB/s per GPU per direction
    through the NVLink switch trays, NVLS capable) with Blackwell Ultra GPUs, one ConnectX-8 800 Gb/s SuperNIC per
    GPU (PCIe Gen6) and Grace (Arm) hosts. SHARP-capable switches, but CollNet stays off unless
    NCCL_COLLNET_ENABLE=1 (``nccl_env``). Source: NVIDIA GB300 NVL72 product page (2025)."""
    return replace(
        gb200_nvl72(num_nodes),
        name="gb300-nvl72",
        nic_bandwidth_GBps=100.0,
        pcie_bandwidth_GBps=128.0,
        device=GPUS["gb300-288gb"].name,
        gpu=GPUS["gb300-288gb"],
        description="GB300 NVL72: 72 GPUs in one NVLink domain (900 GB/s, NVLS), 800G per GPU",
        sources=("NVIDIA GB300 NVL72 product page (2025)",),
        cpu_vendor="arm",
    )


def _cube(n: int) -> tuple[int, ...]:
    side = round(n ** (1 / 3))
    if side**3 == n:
        return (side, side, side)
    return (n,)


PRESETS = {
    "dgx-a100": _NODE["dgx-a100"],
    "dgx-h100": _NODE["dgx-h100"],
    "dgx-h200": _NODE["dgx-h200"],
    "dgx-b200": _NODE["dgx-b200"],
    "hgx-h20": _NODE["hgx-h20"],
    "hgx-h800": _NODE["hgx-h800"],
    "aws-p5": _NODE["aws-p5"],
    "gcp-a3-mega": _NODE["gcp-a3-mega"],
    "gcp-a3-high": _NODE["gcp-a3-high"],
    "gh200": _NODE["gh200"],
    "dgx-b300": _NODE["dgx-b300"],
    "gb300-nvl72": gb300_nvl72,
    "azure-nd-h100-v5": _NODE["azure-nd-h100-v5"],
    "gb200-nvl72": _NODE["gb200-nvl72"],
    "npu-mesh-8": _NODE["npu-mesh-8"],
    "tpu-torus": tpu_torus,
    "pcie-server": _NODE["pcie-server"],
}


def cluster_preset(name: str, num_nodes: int | None = None) -> ClusterSpec:
    maker = PRESETS.get(name)
    if maker is None:
        raise CollectiveError("preset", f"unknown cluster preset {name!r}; known: {', '.join(PRESETS)}")
    return maker() if num_nodes is None else maker(num_nodes)
