"""Cluster block of a request: a preset with overrides, or every field given."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BaseModel, Field

from collectives.topology import fabrics, networks
from collectives.topology.gpu import GPU_VARIABILITY, VARIABILITY_RANGE
from planner._errors import got
from planner.kernels import ATTENTION_CEILING_KEYS, GEMM_DTYPES, KERNEL_CONSTANTS

from .base import Strict, optional_positive

Bandwidth = Field(default=None, ge=1e-3, le=1e6, description="GB/s = 1e9 bytes/s per direction; at least 1 MB/s")
Latency = Field(default=None, ge=0, le=1.0, description="seconds")
# A device's dense TFLOP/s per dtype: 1 GFLOP/s (a CPU core) up to 1 EFLOP/s, far above any accelerator (GB300
# dense FP4 is 15 PFLOP/s, NVIDIA's datasheet). 5e-324 TFLOP/s was accepted and made every time infinite.
# 0 is "this dtype is not supported" (a preset's fp32 on a TPU-like chip; the planner names the missing
# figure if the plan needs it), as the plan's own cluster block writes it back.
TFLOPS_RANGE = (1e-3, 1e6)
HBM_GBPS_RANGE = (1e-3, 1e6)  # 1 MB/s, as every bandwidth here, to 1 PB/s (B200's HBM3e: 8 TB/s)


def _zero_or_in(low: float, high: float):
    """0 (not given: the planner names the missing figure) or a value in [low, high]."""

    def check(value: float) -> float:
        if value != 0 and not low <= value <= high:
            raise ValueError(f"must be 0 (not given) or within [{got(low)}, {high:,.0f}], got {got(value)}")
        return value

    return AfterValidator(check)


def plugin(what: str, registry) -> Field:
    """A plug-in's name: checked against its registry when the cluster is built (a 422 listing the names)."""
    where = f"collectives/topology/{registry.__name__.rsplit('.', 1)[-1]}/"
    names = ", ".join(registry.names())
    return Field(default=None, max_length=64, description=f"a registered {what} ({where}): {names}")


Tflops = Annotated[float, Field(ge=0, le=TFLOPS_RANGE[1]), _zero_or_in(*TFLOPS_RANGE)]


class IntraIn(Strict):
    fabric: str | None = plugin("fabric", fabrics)
    bandwidth_GBps: float | None = Bandwidth
    latency_s: float | None = Latency
    in_network_reduction: bool | None = Field(default=None, description="NVLink SHARP (NVLS) in the switch")
    link_name: str | None = Field(default=None, max_length=32)


class NetworkIn(Strict):
    topology: str | None = plugin("network", networks)
    rail_optimized: bool | None = None
    nodes_per_leaf: int | None = Field(default=None, ge=1, le=1 << 16)
    num_spines: int | None = Field(default=None, ge=1, le=1 << 12)
    oversubscription: float | None = Field(default=None, ge=1, le=1024)
    dims: list[Annotated[int, Field(ge=1, le=1 << 17)]] | None = Field(default=None, min_length=1, max_length=6)
    group_size: int | None = Field(default=None, ge=1, le=1 << 12)
    link_bandwidth_GBps: float | None = Bandwidth
    switch_latency_s: float | None = Latency
    in_network_reduction: bool | None = Field(default=None, description="SHARP in the switches (NCCL CollNet)")
    kind: str | None = Field(
        default=None,
        max_length=16,
        description="network kind: ib, roce, efa, efa_sendrecv, tcpx, tcpxo (per-hop latency)",
    )


class GPUIn(Strict):
    """A GPU given field by field (or name one of GET /v1/presets/clusters' GPUs with a string)."""

    name: str = Field(default="custom", max_length=64)
    peak_tflops: dict[str, Tflops] = Field(
        default_factory=dict,
        max_length=16,
        description="dense TFLOP/s per dtype: fp32, tf32, bf16, fp16, fp8; each 0 (none) or within [1e-3, 1e6]",
    )
    hbm_bytes: int = Field(default=0, ge=0, le=1 << 50)
    hbm_GBps: Annotated[float, _zero_or_in(*HBM_GBPS_RANGE)] = Field(
        default=0.0, ge=0, le=HBM_GBPS_RANGE[1], description="0: not given; else within [1e-3, 1e6]"
    )
    sm: int = Field(default=0, ge=0, le=1000, description="compute capability x 10 (80, 90, 100); 0: not NVIDIA")
    nvlink_links: int = Field(default=0, ge=0, le=64)
    preset: str | None = Field(
        default=None, max_length=64, description="a GPU name (gpu.py GPUS) to start from; the fields given here win"
    )
    sms: int | None = Field(default=None, ge=1, le=4096, description="streaming multiprocessors (GEMM tiles fill them)")
    tdp_w: float | None = optional_positive(10000, "default power limit, W")
    min_power_w: float | None = optional_positive(10000, "lowest power limit, W")
    power_limit_w: float | None = optional_positive(
        10000,
        "configured power limit (nvidia-smi -pl), W; within min_power_w..tdp_w; lowers the sustained "
        "tensor-core clock (gpu.py clock_scale). Alone, it applies to the cluster preset's GPU",
    )
    variability: float | None = Field(
        default=None,
        ge=VARIABILITY_RANGE[0],
        le=VARIABILITY_RANGE[1],
        description=f"GPU-to-GPU spread of sustained throughput, a robust sigma as a fraction of the median part's "
        f"time; within [{VARIABILITY_RANGE[0]:g}, {VARIABILITY_RANGE[1]:g}]; absent: {GPU_VARIABILITY:g} (Sinha et "
        "al. SC'22 arXiv v3's 8% average spread, read as 4·IQR / median, / (4 x 1.349)); 0 turns it off. A "
        "synchronous job runs at its slowest GPU's pace: that part's clock / (1 + sigma x E[max of N normals]), "
        "which slows compute-bound kernels, not memory-bound ones. Alone, it applies to the "
        "cluster preset's GPU",
    )


def _kernel_constant(name: str, description: str):
    low, high = KERNEL_CONSTANTS[name]
    return Annotated[float, Field(ge=low, le=high, description=f"{description}; within [{low:g}, {high:g}]")]


class KernelsIn(Strict):
    """Kernel constants a profiler trace fitted for the cluster's GPU: POST /v1/calibrate's ``trace.constants``,
    the same names (planner/kernels.py KERNEL_CONSTANTS); absent names keep the defaults."""

    gemm_ceiling: dict[str, _kernel_constant("gemm_ceiling", "a large GEMM's fraction of the dense peak")] | None = (
        Field(default=None, max_length=len(GEMM_DTYPES), description=f"by GEMM dtype: {', '.join(GEMM_DTYPES)}")
    )
    gemm_fixed_s: _kernel_constant("gemm_fixed_s", "fixed cost of one GEMM, s") | None = None
    hbm: _kernel_constant("hbm", "achieved / datasheet HBM bandwidth of memory-bound kernels") | None = None
    kernel_s: _kernel_constant("kernel_s", "fixed cost of a memory-bound or attention kernel, s") | None = None
    host_launch_s: (
        _kernel_constant(
            "host_launch_s",
            "the host's time per kernel launch in a layer that syncs with the GPU (Megatron-Core's MoE count "
            "sync): the two queues of planner/host.py; absent: 38.2 us, Megatron-Core's own MoE layer measured",
        )
        | None
    ) = None
    clock: (
        _kernel_constant(
            "clock",
            "the tensor clock the trace ran at, a fraction of the datasheet clock at the cluster's power limit "
            "(replaces the sustained clock and the power-limit scale)",
        )
        | None
    ) = None
    attention_ceiling: (
        dict[str, _kernel_constant("attention_ceiling", "a fused attention kernel's fraction of the bf16 peak")] | None
    ) = Field(
        default=None,
        max_length=len(ATTENTION_CEILING_KEYS),
        description=f"by kernel and pass: {', '.join(ATTENTION_CEILING_KEYS)}",
    )


class CalibrationIn(Strict):
    """Fitted constants (POST /v1/calibrate returns them in its cluster); absent names keep the defaults."""

    kernels: KernelsIn | None = Field(
        default=None, description="compute constants fitted on a profiler trace for the cluster's GPU"
    )

    efficiency: dict[str, float] | None = Field(default=None, description="link kind -> fraction of its rate")
    latency_scale: dict[str, float] | None = Field(
        default=None, description="intra_node / inter_node, or a generation's (intra_node:hopper) -> multiplier"
    )
    network_latency_s: dict[str, float] | None = Field(default=None, description="ib/roce/efa/tcpx/tcpxo -> s per hop")


class NcclEnvIn(Strict):
    """NCCL environment variables the job sets, by NCCL's names; absent: NCCL's default (docs/pricing.md)."""

    NCCL_MIN_NCHANNELS: int | None = Field(
        default=None, ge=0, le=1024, description="channels ring/tree run at least; 1..MAXCHANNELS (32 before 2.26, 64)"
    )
    NCCL_MAX_NCHANNELS: int | None = Field(
        default=None, ge=0, le=1024, description="channels ring/tree run at most; 1..MAXCHANNELS (32 before 2.26, 64)"
    )
    NCCL_NVLS_ENABLE: int | None = Field(default=None, ge=0, le=2, description="0 off, 1 on, 2 auto (default)")
    NCCL_COLLNET_ENABLE: int | None = Field(
        default=None, ge=0, le=1, description="1: CollNet (SHARP) where network.in_network_reduction; default 0"
    )


class ClusterIn(Strict):
    preset: str | None = Field(default=None, description="a name from GET /v1/presets/clusters")
    num_nodes: int | None = Field(default=None, ge=1, le=1 << 17)
    devices_per_node: int | None = Field(default=None, ge=1, le=1024)
    intra: IntraIn | None = None
    nics_per_node: int | None = Field(default=None, ge=1, le=1024)
    nic_bandwidth_GBps: float | None = Bandwidth
    nic_latency_s: float | None = Latency
    pcie_bandwidth_GBps: float | None = Bandwidth
    network: NetworkIn | None = None
    name: str | None = Field(default=None, max_length=64)
    gpu: str | GPUIn | None = Field(default=None, description="a GPU name (gpu.py GPUS) or its fields")
    nccl_version: str | None = Field(
        default=None, max_length=16, description="2.18 to 2.30, or major.minor.patch (NCCL's tuning tables of that tag)"
    )
    nccl_env: NcclEnvIn | None = None
    cpu_vendor: str | None = Field(default=None, max_length=16, description="intel, amd or arm")
    calibration: CalibrationIn | None = None


class LinkOut(BaseModel):
    """One directed link and what it carried during one call (all concurrent groups)."""

    id: int
    family: str
    index: int = Field(description="position within its family (device, NIC or leaf number)")
    kind: str
    label: str
    capacity_GBps: float
    bytes: int = Field(description="over one call, all concurrent groups")
    busy_s: float
    utilisation: float = Field(description="busy time / call time")
