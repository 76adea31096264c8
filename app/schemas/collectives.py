"""Collective pricing, verification and schedule-inspection schemas."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field

from .base import DeviceId, Strict, with_example
from .cluster import ClusterIn, LinkOut
from .read import From

OpName = Literal[
    "allreduce", "reducescatter", "allgather", "alltoall", "broadcast", "reduce", "gather", "scatter", "sendrecv"
]
DtypeName = Literal["float16", "float32", "float64", "int8", "uint8", "int32", "int64"]


class PriceRequest(Strict):
    model_config = with_example(
        {
            "op": "allreduce",
            "algorithm": "auto",
            "message_bytes": 1 << 30,
            "cluster": {"preset": "dgx-h100"},
            "group_size": 8,
        }
    )
    op: OpName
    algorithm: str = Field(default="auto", max_length=64)
    message_bytes: int = Field(ge=0, le=1 << 46, description="nccl-tests convention")
    cluster: ClusterIn
    ranks: list[DeviceId] | None = Field(
        default=None, min_length=1, max_length=1 << 17, description="global device ids of one group"
    )
    group_size: int | None = Field(default=None, ge=1, le=1 << 17, description="devices 0..group_size-1")
    concurrent_groups: list[list[DeviceId]] | None = Field(
        default=None, max_length=1 << 14, description="more groups running the same call at the same time"
    )
    candidates: Literal["library", "all"] = "library"
    pricing: Literal["auto", "library", "schedule"] = Field(
        default="auto", description="library: NCCL's cost model (default on NVIDIA clusters); schedule: step by step"
    )
    nccl_algo: str = Field(default="auto", max_length=32, description="pin like NCCL_ALGO: Ring, Tree, NVLS, ...")
    nccl_proto: str = Field(default="auto", max_length=16, description="pin like NCCL_PROTO: LL, LL128, Simple")


def _bottleneck_kind(price) -> str:
    return price.bottleneck.get("kind", "none")


def _bottleneck_link(price) -> dict | None:
    return price.bottleneck or None


# read off collectives.topology.Price (``reader``): the bottleneck's kind, and the link itself
class PriceOut(BaseModel):
    algorithm: str = Field(description="the executable schedule (verify proves it)")
    protocol: str = Field(default="", description="library pricing: NCCL protocol (LL, LL128, Simple)")
    nccl_algorithm: str = Field(default="", description="library pricing: NCCL algorithm")
    channels: int = Field(default=0, description="library pricing: NCCL channels")
    time_s: float
    algbw_GBps: float
    busbw_GBps: float
    bytes_sent_per_rank: int
    bytes_received_per_rank: int
    steps: int
    bottleneck: Annotated[str, From(derive=_bottleneck_kind)]
    bottleneck_link: Annotated[LinkOut | None, From(derive=_bottleneck_link)]
    links: list[LinkOut]
    span: str
    nodes_per_group: int


class VerifyRequest(Strict):
    model_config = with_example(
        {"op": "allreduce", "algorithm": "ring", "num_ranks": 8, "count": 1024, "dtype": "float32", "seed": 0}
    )
    op: OpName
    algorithm: str = Field(max_length=64)
    num_ranks: int = Field(ge=1, le=4096)
    count: int = Field(ge=0, le=1 << 26, description="message elements, nccl-tests convention")
    dtype: DtypeName = "float32"
    seed: int = Field(default=0, ge=0, le=2**32 - 1)
    reduction: Literal["sum", "max", "min", "avg"] = "sum"
    root: int = Field(default=0, ge=0, le=4096)
    local_size: int = Field(default=1, ge=1, le=4096, description="ranks per node, for hierarchical")


class VerifyOut(BaseModel):
    ok: bool
    max_abs_error: float
    tolerance: float
    steps: int
    expected_steps: int
    bytes_sent_per_rank: int = Field(description="measured on the executed schedule, busiest rank")
    bytes_received_per_rank: int
    expected_bytes_sent_per_rank: int = Field(description="closed form")
    expected_bytes_received_per_rank: int
    bytes_sent: list[int] = Field(description="per rank")
    bytes_received: list[int]


class AlgorithmOut(BaseModel):
    algorithm: str
    op: str
    formula: str
    source: str


class NcclVersionsOut(BaseModel):
    versions: list[str] = Field(
        description="the NCCL versions whose tuning tables are transcribed (collectives/topology/library/tables.py "
        "VERSIONS), oldest first: what cluster.nccl_version takes (a patch, 2.21.5-1, prices as its minor)"
    )
    default: str = Field(description="the version a cluster is priced with when nccl_version is left out")


class ClusterChoicesOut(BaseModel):
    network_kinds: list[str] = Field(
        description="what cluster.network.kind takes (collectives/topology/spec.py NETWORK_KINDS): the network "
        "plugin whose per-hop latency prices a message"
    )
    cpu_vendors: list[str] = Field(
        description="what cluster.cpu_vendor takes (collectives/topology/spec.py CPU_VENDORS): NCCL's llMaxBw "
        "across nodes and per-step net overhead depend on it"
    )


class ScheduleRequest(Strict):
    model_config = with_example({"op": "allreduce", "algorithm": "ring", "num_ranks": 4, "count": 8})
    op: OpName
    algorithm: str = Field(max_length=64)
    num_ranks: int = Field(ge=1, le=16)
    count: int = Field(ge=0, le=4096)
    root: int = Field(default=0, ge=0, le=16)
    local_size: int = Field(default=1, ge=1, le=16)


class TransferOut(BaseModel):
    src: int
    dst: int
    src_slot: int
    dst_slot: int
    bytes: int
    reduce: bool


class StepOut(BaseModel):
    transfers: list[TransferOut]
    holds: list[list[list[int]]] = Field(
        description="after the step: holds[rank][slot] = ranks whose data the slot contains"
    )


class ScheduleOut(BaseModel):
    op: str
    algorithm: str
    num_ranks: int
    num_virtual: int
    slot_bytes: list[int]
    initial: list[list[list[int]]]
    steps: list[StepOut]
    wire_steps: int
