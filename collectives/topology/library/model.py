"""NCCL's cost model (src/graph/tuning.cc:ncclTopoTuneModel and ncclTopoGetAlgoTime, v2.30.7-1) for one
communicator: for every enabled (algorithm, protocol) a latency and a bandwidth, and
``time = latency + bytes / (1000 x bandwidth)`` us, the cheapest pair winning as NCCL's tuner picks.

A pipelined algorithm is one rate: NCCL's bandwidth is the slowest resource's (channels x per-channel speed,
capped per algorithm), never a sum of phases.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...primitives import Op
from . import tables as T
from .calibration import LibraryCalibration
from .graphs import Graph, Shape, collnet_graph, nvls_graph, ring_graph, tree_graph

NCCL_FUNCS = (Op.ALLREDUCE, Op.ALLGATHER, Op.REDUCESCATTER, Op.BROADCAST, Op.REDUCE)


@dataclass(frozen=True)
class Features:
    """What the cluster lets NCCL use (tuning.cc algoEnable rules) and the CPU that sets llMaxBw."""

    nvls: bool = True  # NCCL_NVLS_ENABLE and an NVLS-capable switch
    collnet: bool = False  # SHARP/CollNet plugin (config.collnetEnable)
    cpu_vendor: str = "intel"
    network_kind: str = "ib"
    nvlink: bool = True  # the intra path is NVLink (intraHw NVLINK, LL128 allowed); False: PCIe


@dataclass(frozen=True)
class Candidate:
    """One (algorithm, protocol) for one communicator: NCCL's own latency and bandwidth (what its tuner
    compares), and what a run achieves: the calibrated constants and, for ring and tree, the channels NCCL
    really launches at this size (enqueue.cc:topoGetAlgoInfo lowers them for small messages)."""

    algorithm: str
    protocol: str
    latency_us: float  # NCCL's modelled latency
    bw: float  # NCCL's "bandwidths" entry: algorithm bandwidth in GB/s (busBw converted)
    bus_bw: float  # before conversion, GB/s
    channels: int
    kind: str  # resource kind whose efficiency applies
    efficiency: float = 1.0  # calibrated: achieved / modelled bandwidth
    latency_scale: float = 1.0  # calibrated: achieved / modelled latency
    channel_bytes: int = 0  # bytes per channel below which NCCL launches fewer channels (0: never)
    corrected_sizes: int = 0  # allreduce sizes (log2(bytes / 64) below this) taking treeCorrectionFactor
    achieved_ratio: float = 1.0  # what runs / what NCCL's model says, where our model departs from NCCL's

    def model_time_s(self, nbytes: int, op: Op) -> float:
        """tuning.cc:ncclTopoGetAlgoTime (one operation): what NCCL's tuner ranks the pairs by."""
        return (self.latency_us + nbytes / (1000.0 * self._bw(nbytes, op))) * 1e-6

    def time_s(self, nbytes: int, op: Op) -> float:
        """The time a run takes: calibrated latency and bandwidth on the channels NCCL launches."""
        bw = self._bw(nbytes, op) * self.efficiency * self.achieved_ratio * self.channels_used(nbytes) / self.channels
        return self.latency_s + nbytes / (1e9 * bw)

    @property
    def latency_s(self) -> float:
        return self.latency_us * self.latency_scale * 1e-6

    def channels_used(self, nbytes: int) -> int:
        """enqueue.cc:topoGetAlgoInfo (v2.30.7-1), ring/tree: ``while (nBytes < nc * nt * threadThreshold)
        nc--`` down to 1 channel; NVLS and CollNet keep theirs."""
        if not self.channel_bytes or nbytes >= self.channels * self.channel_bytes:
            return self.channels
        return max(1, min(self.channels, nbytes // self.channel_bytes))

    def _bw(self, nbytes: int, op: Op) -> float:
        bw = self.bw
        log_size = int(math.log2(nbytes >> 6)) if nbytes >> 6 else -1
        if op is Op.ALLREDUCE and 0 <= log_size < self.corrected_sizes:
            bw *= T.TREE_CORRECTION[T.PROTOCOLS.index(self.protocol)][log_size]  # ncclTopoGetAlgoTime
        return bw


def graphs_for(shape: Shape) -> dict[str, Graph | None]:
    ring = ring_graph(shape)
    return {
        "ring": ring,
        "tree": tree_graph(shape, ring),
        "pat": ring,
        "nvls": nvls_graph(shape),
        "nvls_tree": nvls_graph(shape) if shape.nodes > 1 else None,
        "collnet_direct": collnet_graph(shape) if shape.nodes > 1 else None,
        "collnet_chain": tree_graph(shape, ring) if shape.nodes > 1 else None,
    }


def why_unavailable(algorithm: str, op: Op, shape: Shape, feat: Features) -> str:
    """The rule that keeps ``algorithm`` from running, or '' (tuning.cc:ncclTopoTuneModel v2.30.7-1): the
    op's rules, then the NVLS, CollNet and span rules, in that order."""
    return (
        _op_rule(algorithm, op)
        or _nvls_rule(algorithm, shape, feat)
        or _collnet_rule(algorithm, shape, feat)
        or _span_rule(algorithm, op, shape)
    )


def _op_rule(algorithm: str, op: Op) -> str:
    if op not in NCCL_FUNCS:
        return f"NCCL's tuner prices {', '.join(o.value for o in NCCL_FUNCS)} only"
    if op in (Op.BROADCAST, Op.REDUCE) and algorithm != "ring":
        return "broadcast and reduce run on ring only"
    if op in (Op.ALLGATHER, Op.REDUCESCATTER) and algorithm not in ("pat", "ring", "nvls", "collnet_direct"):
        return "allgather/reducescatter run on ring, PAT, NVLS or CollNetDirect only"
    if op is Op.ALLREDUCE and algorithm == "pat":
        return "PAT implements allgather and reducescatter only"
    return ""


def _nvls_rule(algorithm: str, shape: Shape, feat: Features) -> str:
    if algorithm in ("nvls", "nvls_tree"):
        if not feat.nvls or shape.sm < 90 or not shape.nvswitch:
            return f"{algorithm} needs an NVLink switch with NVLS (SHARP) enabled and SM90+ (got sm {shape.sm})"
        if shape.ppn < 2:
            return f"{algorithm} needs at least 2 channels (2 GPUs per node)"
    if algorithm == "nvls_tree" and shape.nodes == 1:
        return "NVLSTree is disabled on a single node"
    if algorithm == "nvls" and shape.nodes > 1 and not feat.collnet:
        return "NVLS across nodes needs CollNet (SHARP) in the network"
    return ""


def _collnet_rule(algorithm: str, shape: Shape, feat: Features) -> str:
    if algorithm not in ("collnet_direct", "collnet_chain"):
        return ""
    if not feat.collnet:
        return f"{algorithm} needs CollNet (SHARP) in the network"
    if shape.nodes == 1:
        return f"{algorithm} needs more than one node"
    if algorithm == "collnet_direct" and not shape.nvswitch:
        return "CollNetDirect needs an NVSwitch system"
    return ""


def _span_rule(algorithm: str, op: Op, shape: Shape) -> str:
    if algorithm in ("nvls", "collnet_direct") and op in (Op.ALLGATHER, Op.REDUCESCATTER) and shape.nodes > 1:
        return f"{algorithm} allgather/reducescatter across nodes needs a CollNet plugin with iallgather/ireducescatter"
    if algorithm == "pat" and shape.ppn != 1:
        return "PAT runs with 1 GPU per node only (NCCL_PAT_ENABLE default)"
    return ""


# Protocols a network's own NCCL set-up enables across nodes, where it restricts them. Google's GPUDirect-TCPXO
# profile (GoogleCloudPlatform/container-engine-accelerators gpudirect-tcpxo: nccl-env-profile.sh, sourced by
# a3-mega workloads, and its nccl-env-profile-simple.sh since the Aug 2025 release) sets NCCL_PROTO=Simple with
# NCCL_ALGO=Ring,Tree and NCCL_NVLS_ENABLE=0; LL is never enabled. Its opt-in LL128/NVLSTree profile hands the
# choice to Google's tuner plugin (a3plus_tuner_config), which is not NCCL's model and is not modelled here.
NETWORK_PROTOCOLS = {"tcpxo": ("Simple",)}


def why_no_protocol(algorithm: str, protocol: str, shape: Shape, feat: Features) -> str:
    if algorithm in ("nvls", "nvls_tree", "collnet_direct", "collnet_chain", "pat") and protocol != "Simple":
        return f"{algorithm} runs with the Simple protocol only"
    allowed = NETWORK_PROTOCOLS.get(feat.network_kind)
    if shape.nodes > 1 and allowed and protocol not in allowed:
        return f"{feat.network_kind} networks run {' and '.join(allowed)} only (the provider's NCCL_PROTO profile)"
    if protocol == "LL128" and shape.ppn > 1 and not feat.nvlink:
        return "LL128 is enabled only over NVLink paths (typeIntra <= PATH_NVB)"
    if protocol == "LL128" and shape.sm < 70:
        return "LL128 needs SM70+"
    return ""


def candidates(op: Op, shape: Shape, feat: Features, cal: LibraryCalibration) -> list[Candidate]:
    """Every enabled (algorithm, protocol) with NCCL's latency and bandwidth for this communicator."""
    graphs = graphs_for(shape)
    out = []
    for a in T.ALGORITHMS:
        g = graphs.get(a)
        if g is None or why_unavailable(a, op, shape, feat):
            continue
        for p in T.PROTOCOLS:
            if why_no_protocol(a, p, shape, feat):
                continue
            c = _candidate(op, a, p, g, shape, feat, cal)
            if c is not None:
                out.append(c)
    return out


def _kind(a: str, shape: Shape, feat: Features) -> str:
    if shape.nodes > 1:
        return "nic"
    if a == "nvls":
        return "in_network"
    return "nvlink" if feat.nvlink else "pcie"


def _candidate(op, a, p, g: Graph, shape: Shape, feat: Features, cal: LibraryCalibration) -> Candidate | None:
    nodes, n = shape.nodes, shape.num_ranks
    ppn = n / nodes
    pi = T.PROTOCOLS.index(p)
    nsteps = 2 * (n - 1) if op is Op.ALLREDUCE else n - 1 if op in (Op.ALLGATHER, Op.REDUCESCATTER) else n
    collnet = a in ("collnet_direct", "collnet_chain")
    bw = g.bw_intra if nodes <= 2 or collnet else g.bw_inter
    achieved = 1.0
    if a in ("nvls", "nvls_tree"):
        if g.channels < 2:  # tuning.cc: "NVLS/NVLStree needs at least 2 channels" (one NIC per node: one head)
            return None
        bw = _nvls_channel_bw(op, a, g, g.bw_intra, shape, ppn)
        achieved = _nvls_channel_bw(op, a, g, max(g.bw_intra, _node_nvls_speed(shape)), shape, ppn) / bw
    bus = _bus(op, a, p, g, shape, feat, g.channels * bw, ppn)
    if bus <= 0:
        return None
    kind = _kind(a, shape, feat)
    algbw = bus
    if not (a != "ring" and op in (Op.ALLGATHER, Op.REDUCESCATTER)):
        algbw = bus * (n / nsteps if a in ("ring", "nvls", "nvls_tree") else 0.5)
    lat = _latency(op, a, p, pi, n, nodes, nsteps, shape, feat, cal)
    if a == "ring" and p == "Simple" and nodes > 1 and op is Op.ALLREDUCE:
        lat *= T.RING_PLATEAU if shape.sm >= 80 else 1.9  # ncclTopoGetAlgoTime plateau (large sizes)
    scale = cal.latency_multiplier("inter_node" if nodes > 1 else "intra_node", shape.sm)
    return Candidate(
        a, p, lat, algbw, bus, g.channels, kind, cal.eff(kind), scale, _channel_bytes(a, p, n, g),
        _corrected_sizes(a, shape, feat), achieved,
    )  # fmt: skip


def _bus(op: Op, a: str, p: str, g: Graph, shape: Shape, feat: Features, bus: float, ppn: float) -> float:
    """NCCL's busBw of (a, p) from channels x per-channel bandwidth ``bus``: the LL, LL128, tree, PAT and
    CollNetDirect factors and caps of tuning.cc:ncclTopoTuneModel (v2.30.7-1)."""
    nodes = shape.nodes
    cc, nc = T.cc_class(shape.sm), T.node_class(nodes)
    index1 = cc if nodes == 1 else (1 if feat.cpu_vendor == "amd" else 0)
    ll_max = T.LL_MAX_BW[index1][nc]
    if a == "ring" and p == "LL":
        bus = min(ll_max, bus * T.RING_LL_FACTOR)
    if a == "ring" and p == "LL128":
        bus = min(bus * T.LL128_FACTOR, g.channels * T.per_channel_cap("ring_ll128", cc, nc, shape.version))
    if a == "tree" and op is Op.ALLREDUCE:
        bus = min(bus * T.TREE_FACTOR, g.channels * T.PER_CH_MAX_TREE_BW[cc][nc])
    if a == "tree" and p == "LL":
        bus = min(bus * T.TREE_LL_FACTOR, ll_max)
    if a == "tree" and p == "LL128":
        f = T.TREE_LL128_FACTOR_ONE_NODE if nodes == 1 else 120.0 / 128.0
        bus = min(bus * f, g.channels * T.PER_CH_MAX_TREE_LL128_BW[cc][nc])
    if a == "pat":
        bus *= T.PAT_FACTOR
    if a == "collnet_direct":
        if op in (Op.ALLGATHER, Op.REDUCESCATTER):
            bus = ppn * min(g.bw_intra, g.bw_inter * 0.9)
        else:
            factor = ppn / g.channels
            factor -= (factor - 1) / 2
            bus /= factor
            if shape.sm >= 90:
                bus *= T.COLLNET_HOPPER_FACTOR
    return bus


def _nvls_channel_bw(op: Op, a: str, g: Graph, intra_speed: float, shape: Shape, ppn: float) -> float:
    """tuning.cc:ncclTopoTuneModel NVLS / NVLSTree busBw per channel (v2.30.7-1): the NVSwitch part (speed x
    nvlsEfficiency x (c - 1)/c, x 2 for allreduce's two pipelined operations), the network part (bwInter, x 2
    for NVLSTree on two nodes) and NVLSTree's per-channel cap, the smallest."""
    cc, nc = T.cc_class(shape.sm), T.node_class(shape.nodes)
    intra = intra_speed * T.NVLS_EFFICIENCY[cc] * (g.channels - 1) / g.channels
    intra *= 2.0 if op is Op.ALLREDUCE else (ppn - 1) / ppn
    inter = g.bw_inter * (2 if shape.nodes <= 2 and a == "nvls_tree" else 1)
    cap = T.per_channel_cap("nvls_tree", cc, nc, shape.version) if a == "nvls_tree" else math.inf
    return min(intra, inter, cap)


def _node_nvls_speed(shape: Shape) -> float:
    """What the NVSwitch part of a multi-node NVLS call runs at: the node's own one-node NVLS speed. NCCL's
    multi-node search ties bwIntra to the NIC path's speed (pass 1 tries bwIntra = bwInter from the inter
    array; pass 2 raises bwIntra only with a bwInter the NIC cannot carry, search.cc v2.30.7-1), so its model
    prices the in-node NVLS of a B200 with 400G NICs at 48 GB/s a channel where the node alone runs 80; the
    tuner's pick keeps NCCL's figure, the time this one (docs/pricing.md). Hopper: 40 either way."""
    if shape.nodes == 1:
        return 0.0
    node = nvls_graph(Shape(shape.sm, 1, shape.ppn, shape.gpu_bw, shape.nvswitch, 1, 0.0, shape.version))
    return node.bw_intra if node else 0.0


def _corrected_sizes(a: str, shape: Shape, feat: Features) -> int:
    """tuning.cc:ncclTopoGetAlgoTime: which allreduce sizes take treeCorrectionFactor (v2.30.7-1)."""
    if a == "tree":
        return T.TREE_CORRECTED_SIZES
    if (
        a == "nvls_tree"
        and shape.sm >= 100
        and feat.cpu_vendor in T.X86_VENDORS
        and T.at_least(shape.version, T.NVLS_TREE_CORRECTION_SINCE)
    ):
        return T.NVLS_TREE_CORRECTED_SIZES
    return 0


def _channel_bytes(a: str, p: str, n: int, g: Graph) -> int:
    """nt x threadThreshold: the bytes one channel must have before NCCL adds another (enqueue.cc
    topoGetAlgoInfo; tuning.cc threadThresholds LL 8 (x nRanks for ring), LL128 8, Simple 64 bytes per
    thread; maxThreads LL 512, LL128 640, Simple 512, or 256 for a ring whose nChannels x bwIntra is within
    PCI_BW 12 GB/s; comm.h, device.h, v2.30.7-1)."""
    if a not in ("ring", "tree"):
        return 0
    threads = {"LL": 512, "LL128": 640, "Simple": 512}[p]
    if a == "ring" and p == "Simple" and g.channels * g.bw_intra <= 12.0:
        threads = 256
    threshold = {"LL": 8, "LL128": 8, "Simple": 64}[p] * (n if a == "ring" and p == "LL" else 1)
    return threads * threshold


def _latency(op, a, p, pi, n, nodes, nsteps, shape: Shape, feat: Features, cal: LibraryCalibration) -> float:
    """tuning.cc:ncclTopoTuneModel latencies (v2.30.7-1), us."""
    ppn = n // nodes
    intra_hw = "nvlink" if feat.nvlink else "pci"
    lat = T.BASE_LATENCY_US[a][pi]
    intra = T.HW_LATENCY_US[intra_hw][a][pi]
    inter = T.HW_LATENCY_US["net"]["tree" if ppn == 1 else a][pi]  # ppn 1: the tree's network latency
    plugin = cal.net_latency_us(feat.network_kind)
    inter += plugin * (2 if p == "Simple" else 1)  # graph latencyInter, twice for Simple (flush)
    if a == "ring":
        hw = T.HW_LATENCY_US["net" if nodes > 1 else intra_hw]["ring"][pi]
        if op in (Op.REDUCE, Op.BROADCAST):
            return lat + hw  # sameChannels graphs (the usual case)
        overhead = T.NET_OVERHEAD_US.get(feat.cpu_vendor, 1.0) * (3 if p == "Simple" else 1) if nodes > 1 else 0.0
        intra = max(intra, overhead)
        n_inter = 0 if nodes == 1 else 2 * (nodes - 1) if op is Op.ALLREDUCE else nodes - 1
        return lat + (nsteps - n_inter) * intra + n_inter * inter
    log_nodes = int(math.log2(nodes))
    if a == "tree":
        return lat + (2 * ((ppn - 1) * intra + log_nodes * inter) if op is Op.ALLREDUCE else 0.0)
    if a == "collnet_direct":
        return lat + 2 * (min(1, ppn - 1) * intra + (ppn - 1) * 0.4) + inter
    if a == "collnet_chain":
        return lat + 2 * (ppn - 1) * intra + inter
    if a == "nvls":
        return intra + (inter if nodes > 1 else 0.0)
    if a == "nvls_tree":
        return lat + intra + 2 * log_nodes * inter
    return lat + log_nodes * (inter / 3.5) + n * 2.8  # pat


def best(op: Op, nbytes: int, cands: list[Candidate]) -> Candidate | None:
    """ncclTopoGetAlgoTime over every candidate, NCCL's own smallest time winning (enqueue.cc
    topoGetAlgoInfo): the pick is NCCL's, whatever the calibration."""
    return min(cands, key=lambda c: c.model_time_s(nbytes, op), default=None)
