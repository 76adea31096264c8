"""Named clusters. Every figure is per direction, in GB/s (1e9 B/s); the sources are in each docstring."""

from __future__ import annotations

from .._errors import CollectiveError
from .gpu import GPUS
from .spec import ClusterSpec, IntraNode, Network


def dgx_a100(num_nodes: int = 1) -> ClusterSpec:
    """NVIDIA DGX A100: 8 A100 on NVSwitch, 12 NVLink3 links x 25 GB/s = 300 GB/s per GPU per direction;
    8 ConnectX-6 HDR 200 Gb/s NICs (25 GB/s), one per GPU, PCIe Gen4 x16 (32 GB/s); SuperPOD rail-optimised
    fat-tree, 20 nodes per scalable unit. No NVLink SHARP on A100. Sources: DGX A100 system architecture
    white paper (2020); DGX SuperPOD A100 reference architecture."""
    return ClusterSpec(
        "dgx-a100",
        num_nodes,
        8,
        IntraNode("switch", 300.0, 0.7e-6, False, "nvlink"),
        nics_per_node=8,
        nic_bandwidth_GBps=25.0,
        pcie_bandwidth_GBps=32.0,
        network=Network("fat_tree", rail_optimized=True, nodes_per_leaf=20, num_spines=8),
        device="A100 SXM4 80GB",
        gpu=GPUS["a100-sxm4-80gb"],
        description="DGX A100: 8 GPUs on NVSwitch (300 GB/s), 8 x 200G HDR, rail-optimised fat-tree",
        sources=("DGX A100 system architecture white paper", "DGX SuperPOD A100 reference architecture"),
    )


def dgx_h100(num_nodes: int = 1) -> ClusterSpec:
    """NVIDIA DGX H100: 8 H100 on four third-generation NVSwitch chips, 18 NVLink4 links x 25 GB/s = 450 GB/s
    per GPU per direction, NVLink SHARP (NVLS) in the switches; 8 ConnectX-7 NDR 400 Gb/s NICs (50 GB/s),
    PCIe Gen5 x16 (64 GB/s); SuperPOD rail-optimised fat-tree, 32 nodes per scalable unit, SHARP-capable
    Quantum-2 switches. Sources: DGX H100 user guide; DGX SuperPOD H100 reference architecture."""
    return ClusterSpec(
        "dgx-h100",
        num_nodes,
        8,
        IntraNode("switch", 450.0, 0.7e-6, True, "nvlink"),
        nics_per_node=8,
        nic_bandwidth_GBps=50.0,
        pcie_bandwidth_GBps=64.0,
        network=Network("fat_tree", rail_optimized=True, nodes_per_leaf=32, num_spines=16, in_network_reduction=True),
        device="H100 SXM 80GB",
        gpu=GPUS["h100-sxm5-80gb"],
        description="DGX H100: 8 GPUs on NVSwitch (450 GB/s, NVLS), 8 x 400G NDR, rail-optimised fat-tree",
        sources=("DGX H100 user guide", "DGX SuperPOD H100 reference architecture"),
    )


def gb200_nvl72(num_nodes: int = 1) -> ClusterSpec:
    """NVIDIA GB200 NVL72: one NVLink domain of 72 Blackwell GPUs, 18 NVLink5 links x 50 GB/s = 900 GB/s per
    GPU per direction through 9 NVLink switch trays (NVLS capable); one ConnectX-7 400 Gb/s NIC per GPU.
    Source: NVIDIA GB200 NVL72 product brief."""
    return ClusterSpec(
        "gb200-nvl72",
        num_nodes,
        72,
        IntraNode("switch", 900.0, 0.7e-6, True, "nvlink"),
        nics_per_node=72,
        nic_bandwidth_GBps=50.0,
        pcie_bandwidth_GBps=64.0,
        network=Network("fat_tree", rail_optimized=True, nodes_per_leaf=8, num_spines=16, in_network_reduction=True),
        device="B200 (GB200)",
        gpu=GPUS["gb200-186gb"],
        description="GB200 NVL72: 72 GPUs in one NVLink domain (900 GB/s, NVLS), 400G per GPU",
        sources=("NVIDIA GB200 NVL72 product brief",),
    )


def npu_mesh_8(num_nodes: int = 1) -> ClusterSpec:
    """An 8-NPU board with a full mesh: every NPU has a direct 56 GB/s link to each of the other 7 (Huawei
    Ascend 910B HCCS: 7 x 56 GB/s = 392 GB/s per chip), 8 x 200G RoCE ports (25 GB/s). A group of k NPUs
    on the board can use only k-1 of the 7 links. Source: Ascend 910B / Atlas 800T A2 hardware description."""
    return ClusterSpec(
        "npu-mesh-8",
        num_nodes,
        8,
        IntraNode("full_mesh", 56.0, 1.0e-6, False, "hccs"),
        nics_per_node=8,
        nic_bandwidth_GBps=25.0,
        pcie_bandwidth_GBps=32.0,
        network=Network("fat_tree", rail_optimized=True, nodes_per_leaf=16, num_spines=8),
        device="Ascend 910B",
        gpu=GPUS["ascend-910b"],
        description="8-NPU full-mesh board (7 x 56 GB/s per NPU), 8 x 200G RoCE",
        sources=("Atlas 800T A2 hardware description",),
    )


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


def pcie_server(num_nodes: int = 1) -> ClusterSpec:
    """A traditional server: 8 GPUs behind PCIe Gen4 switches (32 GB/s each way per GPU), one 100 Gb/s NIC
    (12.5 GB/s) shared by all eight, nodes on a plain (not rail-optimised) fat-tree."""
    return ClusterSpec(
        "pcie-server",
        num_nodes,
        8,
        IntraNode("switch", 32.0, 1.5e-6, False, "pcie"),
        nics_per_node=1,
        nic_bandwidth_GBps=12.5,
        pcie_bandwidth_GBps=32.0,
        network=Network("fat_tree", rail_optimized=False, nodes_per_leaf=32, num_spines=4),
        device="A100 PCIe 80GB",
        gpu=GPUS["a100-pcie-80gb"],
        description="8 PCIe GPUs, one shared 100G NIC, plain fat-tree",
        sources=("PCIe Gen4 x16: 32 GB/s per direction",),
    )


def _cube(n: int) -> tuple[int, ...]:
    side = round(n ** (1 / 3))
    if side**3 == n:
        return (side, side, side)
    return (n,)


PRESETS = {
    "dgx-a100": dgx_a100,
    "dgx-h100": dgx_h100,
    "gb200-nvl72": gb200_nvl72,
    "npu-mesh-8": npu_mesh_8,
    "tpu-torus": tpu_torus,
    "pcie-server": pcie_server,
}


def cluster_preset(name: str, num_nodes: int | None = None) -> ClusterSpec:
    maker = PRESETS.get(name)
    if maker is None:
        raise CollectiveError("preset", f"unknown cluster preset {name!r}; known: {', '.join(PRESETS)}")
    return maker() if num_nodes is None else maker(num_nodes)
