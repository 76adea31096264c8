"""Accelerator specifications: what a device can compute and hold, as vendors publish it.

Peak rates are **dense** tensor-core rates (no 2:4 sparsity) in TFLOP/s = 1e12 FLOP/s per device; HBM
bandwidth in GB/s = 1e9 B/s; capacity in bytes as the driver reports it (``nvidia-smi --query-gpu=
memory.total``) where we know that figure, otherwise the vendor's decimal GB. The step-time model divides
FLOPs by ``peak_tflops[dtype]`` x an achieved efficiency; the memory model compares against
``hbm_bytes``. ``sm`` is the CUDA compute capability x 10 (80 Ampere, 90 Hopper, 100 Blackwell): NCCL's
tuning tables are keyed by it (src/graph/tuning.cc). ``nvlink_links`` is the NVLink count per GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .._errors import CollectiveError

MIB = 1 << 20
GB = 10**9
DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8")


@dataclass(frozen=True)
class GPUSpec:
    name: str
    peak_tflops: dict[str, float] = field(default_factory=dict)  # dense, per dtype
    hbm_bytes: int = 0
    hbm_GBps: float = 0.0
    sm: int = 0  # compute capability x 10; 0 = not an NVIDIA GPU (NCCL's tables do not apply)
    nvlink_links: int = 0
    source: str = ""

    def peak(self, dtype: str) -> float:
        """Peak dense FLOP/s for ``dtype``; fp8 falls back to bf16 on parts without fp8 tensor cores."""
        tflops = self.peak_tflops.get(dtype) or (self.peak_tflops.get("bf16") if dtype == "fp8" else None)
        if not tflops:
            raise CollectiveError(
                "cluster.gpu.peak_tflops", f"GPU {self.name!r} has no peak rate for {dtype}; give peak_tflops.{dtype}"
            )
        return tflops * 1e12

    def __hash__(self) -> int:  # frozen, but the dict field needs a hash of its items
        return hash((self.name, tuple(sorted(self.peak_tflops.items())), self.hbm_bytes, self.hbm_GBps, self.sm))


def _gpu(name, bf16, fp8, tf32, fp32, hbm_bytes, hbm_GBps, sm, links, source) -> GPUSpec:
    peaks = {"bf16": bf16, "fp16": bf16, "tf32": tf32, "fp32": fp32}
    if fp8:
        peaks["fp8"] = fp8
    return GPUSpec(name, peaks, hbm_bytes, hbm_GBps, sm, links, source)


# name: bf16 (= fp16), fp8, tf32, fp32 dense TFLOP/s; HBM bytes; HBM GB/s; sm; NVLink links per GPU; source
# (one GPU per row, kept as a table)
# fmt: off
GPUS: dict[str, GPUSpec] = {
    "a100-sxm4-80gb": _gpu(
        "A100 SXM4 80GB", 312.0, 0.0, 156.0, 19.5, 81920 * MIB, 2039.0, 80, 12,
        "NVIDIA A100 Tensor Core GPU datasheet (2021): 312 TF bf16 dense, 2,039 GB/s HBM2e; nvidia-smi 81920 MiB",
    ),
    "a100-pcie-80gb": _gpu(
        "A100 PCIe 80GB", 312.0, 0.0, 156.0, 19.5, 81920 * MIB, 1935.0, 80, 0,
        "NVIDIA A100 Tensor Core GPU datasheet (2021): PCIe 80GB, 1,935 GB/s",
    ),
    "h100-sxm5-80gb": _gpu(
        "H100 SXM5 80GB", 989.4, 1978.9, 494.7, 66.9, 81559 * MIB, 3350.0, 90, 18,
        "NVIDIA H100 Tensor Core GPU datasheet (2023): 989 TF bf16 / 1,979 TF fp8 dense, 3.35 TB/s HBM3; "
        "nvidia-smi 81559 MiB",
    ),
    "h800-sxm5-80gb": _gpu(
        "H800 SXM5 80GB", 989.4, 1978.9, 494.7, 66.9, 81559 * MIB, 3350.0, 90, 8,
        "NVIDIA H800 (export variant of H100 SXM5): same tensor cores and HBM3, 8 NVLink links (400 GB/s); "
        "DeepSeek-V3 technical report §3.1",
    ),
    "h200-sxm-141gb": _gpu(
        "H200 SXM 141GB", 989.4, 1978.9, 494.7, 66.9, 143771 * MIB, 4800.0, 90, 18,
        "NVIDIA H200 Tensor Core GPU datasheet (2024): H100 compute, 141 GB HBM3e at 4.8 TB/s; nvidia-smi 143771 MiB",
    ),
    "h20-96gb": _gpu(
        "H20 96GB", 148.0, 296.0, 74.0, 44.0, 96 * GB, 4000.0, 90, 18,
        "NVIDIA HGX H20 product brief (2024): 148 TF bf16 / 296 TF fp8 dense, 96 GB HBM3 at 4.0 TB/s, "
        "NVLink 900 GB/s bidirectional",
    ),
    "b200-180gb": _gpu(
        "B200 180GB", 2250.0, 4500.0, 1100.0, 75.0, 180 * GB, 8000.0, 100, 18,
        "NVIDIA DGX B200 datasheet (2024): 72 PF fp8 training (sparse) per 8 GPUs = 4.5 PF dense fp8, "
        "2.25 PF bf16 per GPU; 1,440 GB HBM3e, 64 TB/s per system",
    ),
    "gb200-186gb": _gpu(
        "B200 in GB200 NVL72", 2500.0, 5000.0, 1250.0, 80.0, 186 * GB, 8000.0, 100, 18,
        "NVIDIA GB200 NVL72 datasheet (2024): 360 PF bf16 and 720 PF fp8 sparse per 72 GPUs "
        "(2.5 / 5 PF dense per GPU), 13.4 TB HBM3e at 576 TB/s per rack",
    ),
    "ascend-910b": _gpu(
        "Ascend 910B", 313.0, 0.0, 0.0, 0.0, 64 * GB, 1600.0, 0, 0,
        "Huawei Atlas 800T A2 training server brief: 313 TF fp16 per NPU, 64 GB HBM2e at 1.6 TB/s",
    ),
    "tpu-v4": _gpu(
        "TPU v4", 275.0, 0.0, 0.0, 0.0, 32 * (1 << 30), 1200.0, 0, 0,
        "Jouppi et al., TPU v4, ISCA 2023, Table 1: 275 TF bf16, 32 GiB HBM2 at 1,200 GB/s",
    ),
}
# fmt: on


def gpu_preset(name: str) -> GPUSpec:
    gpu = GPUS.get(name)
    if gpu is None:
        raise CollectiveError("cluster.gpu", f"unknown GPU {name!r}; known: {', '.join(GPUS)}")
    return gpu
