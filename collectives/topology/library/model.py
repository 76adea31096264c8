"""NCCL's cost model (src/graph/tuning.cc:ncclTopoTuneModel and ncclTopoGetAlgoTime, v2.30.7-1) for one
communicator: for every enabled (algorithm, protocol) a latency and a bandwidth, and
``time = latency + bytes / (1000 x bandwidth)`` us, the cheapest pair winning as NCCL's tuner picks.

A pipelined algorithm is one rate: NCCL's bandwidth is the slowest resource's (channels x per-channel speed,
capped per algorithm), never a sum of phases.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache

from ...primitives import Op
from . import tables as T
from .calibration import LibraryCalibration
from .graphs import Graph, Shape, collnet_graph, nvls_graph, ring_graph, tree_graph

NCCL_FUNCS = (Op.ALLREDUCE, Op.ALLGATHER, Op.REDUCESCATTER, Op.BROADCAST, Op.REDUCE)


@dataclass(frozen=True)
class Features:
    """What the cluster lets NCCL use (tuning.cc algoEnable rules), the CPU that sets llMaxBw, and the NCCL
    environment the job sets (ClusterSpec.nccl_env)."""

    nvls: bool = True  # an NVLS-capable switch and NCCL_NVLS_ENABLE != 0
    collnet: bool = False  # a SHARP plugin in the network and NCCL_COLLNET_ENABLE=1 (config.collnetEnable)
    cpu_vendor: str = "intel"
    network_kind: str = "ib"
    nvlink: bool = True  # the intra path is NVLink (intraHw NVLINK, LL128 allowed); False: PCIe
    min_channels: int = 0  # NCCL_MIN_NCHANNELS (0: not set)
    max_channels: int = 0  # NCCL_MAX_NCHANNELS (0: not set, MAXCHANNELS)


# Networks whose NCCL plugin is a GPUDirect-TCPX(O) "unpack" device (netDeviceType NCCL_NET_DEVICE_UNPACK):
# connect.cc ncclTopoPostset doubles their channels across nodes up to 16 (NCCL_UNPACK_DOUBLE_NCHANNELS=1).
UNPACK_NETWORKS = ("tcpx", "tcpxo")


def comm_channels(shape: Shape, feat: Features, ring: Graph, knobs: bool = True) -> int:
    """comm->nChannels, the channels ring and tree launch (connect.cc:ncclTopoPostset, v2.30.7-1 lines 465-506;
    the same steps since v2.18.6-1 lines 391-420): the search's channels duplicated (x2, at most MAXCHANNELS);
    doubled again on SM90+ across nodes when the ring's bwIntra > 45 GB/s and fewer than 16; doubled across
    nodes on an unpack (TCPX/TCPXO) network when fewer than 16; then NCCL_MAX_NCHANNELS, then NCCL_MIN_NCHANNELS
    (copyChannels duplicates up to the minimum). ``knobs=False``: what NCCL runs without the two variables."""
    most = T.max_channels(shape.version)
    n = min(most, 2 * ring.channels)
    if shape.sm >= 90 and shape.nodes > 1 and ring.bw_intra > 45.0 and n < 16:
        n = min(most, 2 * n)
    if feat.network_kind in UNPACK_NETWORKS and shape.nodes > 1 and n < 16:
        n = min(most, 2 * n)
    if knobs:
        n = min(n, feat.max_channels or most)
        n = max(n, min(feat.min_channels, most))
    return n


@dataclass(frozen=True)
class Candidate:
    """One (algorithm, protocol) for one communicator: NCCL's own latency and bandwidth (what its tuner
    compares), and what a run achieves: the calibrated constants and, for ring and tree, the channels NCCL
    really launches at this size (enqueue.cc:topoGetAlgoInfo lowers them for small messages)."""

    algorithm: str
    protocol: str
    latency_us: float  # NCCL's modelled latency (before the ring plateau)
    bw: float  # NCCL's "bandwidths" entry: algorithm bandwidth in GB/s (busBw converted)
    bus_bw: float  # before conversion, GB/s
    channels: int  # the search graph's channels (NCCL's bandwidth model counts these)
    kind: str  # resource kind whose efficiency applies
    efficiency: float = 1.0  # calibrated: achieved / modelled bandwidth
    latency_scale: float = 1.0  # calibrated: achieved / modelled latency
    channel_bytes: int = 0  # bytes per channel below which NCCL launches fewer channels (0: never)
    corrected_sizes: int = 0  # allreduce sizes (log2(bytes / 64) below this) taking treeCorrectionFactor
    achieved_ratio: float = 1.0  # what runs / what NCCL's model says, where our model departs from NCCL's
    runtime_channels: int = 0  # comm->nChannels with the knobs (0: the graph's channels)
    default_channels: int = 0  # comm->nChannels without NCCL_MIN/MAX_NCHANNELS (0: runtime_channels)
    cap_headroom: float = 1.0  # link-bound busBw / per-channel-capped busBw: what more channels can lift
    plateau: float = 1.0  # ncclTopoGetAlgoTime's ring plateau factor on the latency
    plateau_bytes: int = 0  # from these bytes on (64 x comm->nChannels x nRanks)
    run_latency_us: float = 0.0  # the latency a run takes before calibration: the newest tables' (0: latency_us)
    fill_hops: int = 0  # store-and-forward hops a chunk crosses, the first included (0: no pipeline fill)
    chunk_bytes: int = 0  # the chunk before the size rules (tables.nvls_tree_pipeline; tree: the Simple step)
    chunk_slots: int = 0  # NVLS(Tree): nvlsChannels x nHeads chunks in flight (0: one per launched channel)
    hop_rates: tuple = ()  # ((hops, GB/s per search channel), ...) where hops run at their own link's speed
    window_us: float = 0.0  # a network slot's turn-over latency, us (0: no step window; tables.py "step window")
    window_rate: float = 0.0  # GB/s a search channel's network connection carries (the graph's bwInter)
    window_shape: tuple = ()  # (nodes, GPUs per node) for the chunk rule

    def _latency_us(self, nbytes: int, run: bool = False) -> float:
        lat = (self.run_latency_us or self.latency_us) if run else self.latency_us
        return lat * (self.plateau if nbytes >= self.plateau_bytes else 1.0)

    def model_time_s(self, nbytes: int, op: Op) -> float:
        """tuning.cc:ncclTopoGetAlgoTime (one operation): what NCCL's tuner ranks the pairs by."""
        return (self._latency_us(nbytes) + nbytes / (1000.0 * self._bw(nbytes, op))) * 1e-6

    def time_s(self, nbytes: int, op: Op) -> float:
        """The time a run takes: calibrated latency and bandwidth on the channels NCCL launches."""
        bw = self._bw(nbytes, op) * self.efficiency * self.achieved_ratio * self.channel_share(nbytes)
        return self.latency_s_at(nbytes) + max(nbytes / (1e9 * bw), self.window_s(nbytes)) + self.fill_s(nbytes)

    def window_s(self, nbytes: int) -> float:
        """The network step window (tables.py, "step window"): each launched channel's connection carries
        s = nbytes / (channels x chunk) chunks, at most NCCL_STEPS of them in flight, a slot turning over in its
        wire time plus ``window_us``: max(s x wire time, s / NCCL_STEPS x turn-over). 0 where not modelled."""
        if not self.window_us or nbytes <= 0:
            return 0.0
        used = self.channels_used(nbytes)
        ll128 = self.protocol == "LL128"
        chunk = T.tree_ll128_chunk(nbytes, used, *self.window_shape) if ll128 else T.LL_STEP_DATA_BYTES
        steps = math.ceil(nbytes / (used * chunk))
        wire = nbytes / (used * steps) / (T.LL128_DATA if ll128 else 0.5)  # a step's bytes with LL(128)'s flags
        rate = self.window_rate * min(1.0, self.channels / used) * self.efficiency * 1e9
        slot_s = wire / rate
        return max(steps * slot_s, (steps - 1) / T.NCCL_STEPS * (slot_s + self.window_us * 1e-6))

    def fill_s(self, nbytes: int) -> float:
        """The Simple pipeline's fill (tables.py, "chunk pipeline"): a chunk of c = min(chunk, bytes / slots)
        crosses ``fill_hops`` store-and-forward hops one after another, each taking c at its own speed: the
        slot's share of the achieved bus bandwidth (busBw / slots) where the stages are balanced (NVLS, NVLSTree:
        NCCL's bandwidth is the min of the NVSwitch and network parts), or its link's per-channel speed
        (``hop_rates``: tree, NVLink chain hops and network hops, a search channel's speed shared by the
        channels launched on it). The first hop is the bandwidth term's own. NCCL's ncclTopoGetAlgoTime has no
        such term; it is what mid sizes across nodes measure beyond it (docs/pricing.md)."""
        if not self.fill_hops:
            return 0.0
        if self.chunk_slots:
            slots = self.chunk_slots
            chunk = T.CHUNK_RULES[self.algorithm](nbytes, self.chunk_bytes, slots)
        else:
            slots, chunk = self.channels_used(nbytes), self.chunk_bytes
        c = min(chunk, nbytes / slots)
        slot_s = c * slots / (1e9 * self.bus_bw * self.efficiency * self.achieved_ratio * self.channel_share(nbytes))
        if not self.hop_rates:
            return (self.fill_hops - 1) * slot_s
        shared = (self.runtime_channels or self.channels) / self.channels  # launched channels per search channel
        hops_s = sum(h * c * shared / (1e9 * rate * self.efficiency) for h, rate in self.hop_rates)
        return max(0.0, hops_s - slot_s)

    def latency_s_at(self, nbytes: int) -> float:
        return self._latency_us(nbytes, run=True) * self.latency_scale * 1e-6

    @property
    def latency_s(self) -> float:
        return (self.run_latency_us or self.latency_us) * self.latency_scale * 1e-6

    def channels_used(self, nbytes: int) -> int:
        """enqueue.cc:topoGetAlgoInfo (v2.30.7-1 lines 2070-2097), ring/tree: from comm->nChannels, ``while
        (nBytes < nc * nt * threadThreshold) nc--`` down to 1 channel; NVLS and CollNet keep theirs."""
        start = self.runtime_channels or self.channels
        if not self.channel_bytes or nbytes >= start * self.channel_bytes:
            return start
        return max(1, min(start, nbytes // self.channel_bytes))

    def channel_share(self, nbytes: int) -> float:
        """The bandwidth the launched channels reach, as a share of NCCL's model. NCCL's bandwidth counts the
        search graph's channels (``channels``); comm->nChannels duplicates them (connect.cc), and a message too
        small for all of them runs on fewer: below the graph's count the bandwidth falls in proportion (so
        does NCCL_MAX_NCHANNELS under it). Channels beyond NCCL's default (NCCL_MIN_NCHANNELS) lift only what
        the per-channel protocol caps held back (``cap_headroom``: LL128, tree), never the links."""
        used = self.channels_used(nbytes)
        default = self.default_channels or used
        share = min(1.0, min(used, default) / self.channels)
        if used > default:
            share *= min(used / default, self.cap_headroom)
        return share

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


@lru_cache(maxsize=1024)
def _calibration_free(shape: Shape, feat: Features) -> tuple[dict[str, Graph | None], tuple[int, int], float, Shape]:
    """What ``candidates`` reads that no calibration changes: the graphs, the channels launched (with and without
    the NCCL_MIN/MAX_NCHANNELS knobs), the node's NVLS speed and the newest tag's shape. A pure function of its
    two frozen arguments, cached by value and bounded: a calibration fit prices one shape under a thousand
    calibrations (collectives/topology/fit.py), and this part was a third of each new one's cost. Read only."""
    graphs = graphs_for(shape)
    ring = graphs["ring"]
    launched = (comm_channels(shape, feat, ring), comm_channels(shape, feat, ring, knobs=False))
    node_speed = _node_nvls_speed(shape) if graphs.get("nvls") else 0.0
    last = T.SUPPORTED_VERSIONS[-1]
    newest = shape if shape.version == last else replace(shape, version=last)
    return graphs, launched, node_speed, newest


def why_unavailable(algorithm: str, op: Op, shape: Shape, feat: Features) -> str:
    """The rule that keeps ``algorithm`` from running, or '' (tuning.cc:ncclTopoTuneModel of the tag
    ``shape.version``): the op's rules, then the NVLS, CollNet and span rules, in that order."""
    return (
        _op_rule(algorithm, op, shape.version)
        or _nvls_rule(algorithm, shape, feat)
        or _collnet_rule(algorithm, shape, feat)
        or _span_rule(algorithm, op, shape)
    )


def _op_rule(algorithm: str, op: Op, version: str = "2.30") -> str:
    vt = T.tables(version)
    if op not in NCCL_FUNCS:
        return f"NCCL's tuner prices {', '.join(o.value for o in NCCL_FUNCS)} only"
    if op in (Op.BROADCAST, Op.REDUCE) and algorithm != "ring":
        return "broadcast and reduce run on ring only"
    if algorithm == "pat" and not vt.pat_factor:
        return f"PAT arrived in NCCL 2.23 (tuning.cc v2.23.4-1 ncclPatEnable); this is NCCL {version}"
    if op in (Op.ALLGATHER, Op.REDUCESCATTER) and algorithm not in vt.ag_rs_algorithms:
        names = ", ".join(vt.ag_rs_algorithms)
        return f"allgather/reducescatter run on {names} only in NCCL {version} (tuning.cc ncclTopoTuneModel)"
    if op is Op.ALLREDUCE and algorithm == "pat":
        return "PAT implements allgather and reducescatter only"
    return ""


def _nvls_rule(algorithm: str, shape: Shape, feat: Features) -> str:
    vt = T.tables(shape.version)
    if algorithm in ("nvls", "nvls_tree"):
        if not feat.nvls or shape.sm < 90 or not shape.nvswitch:
            return f"{algorithm} needs an NVLink switch with NVLS (SHARP) enabled and SM90+ (got sm {shape.sm})"
        if shape.ppn < vt.nvls_min_gpus:
            return (
                f"{algorithm} needs {vt.nvls_min_gpus}+ GPUs per node in NCCL {shape.version} (nvls.cc ncclNvlsInit: "
                f"gpuCount {'<= 2' if vt.nvls_min_gpus == 3 else '< 2'} turns NVLS off), got {shape.ppn}"
            )
        if shape.nodes > 1 and not vt.nvls_multi_node:
            return f"NCCL 2.20 turns NVLS off on more than one node (nvls.cc v2.20.5-1 line 240), got {shape.nodes}"
    if algorithm == "nvls_tree" and shape.nodes == 1:
        return "NVLSTree is disabled on a single node (the group spans 1)"
    if algorithm == "nvls" and shape.nodes > 1 and not feat.collnet:
        return "NVLS across nodes needs CollNet (SHARP) in the network"
    return ""


def _collnet_rule(algorithm: str, shape: Shape, feat: Features) -> str:
    if algorithm not in ("collnet_direct", "collnet_chain"):
        return ""
    if not feat.collnet:
        return f"{algorithm} needs CollNet (SHARP) in the network"
    if shape.nodes == 1:
        return f"{algorithm} needs more than one node, got 1"
    if algorithm == "collnet_direct" and not shape.nvswitch:
        return "CollNetDirect needs an NVSwitch system"
    return ""


def _span_rule(algorithm: str, op: Op, shape: Shape) -> str:
    if algorithm in ("nvls", "collnet_direct") and op in (Op.ALLGATHER, Op.REDUCESCATTER) and shape.nodes > 1:
        return f"{algorithm} allgather/reducescatter across nodes needs a CollNet plugin with iallgather/ireducescatter"
    if algorithm == "pat" and shape.ppn != 1:
        return f"PAT runs with 1 GPU per node only (NCCL_PAT_ENABLE default), got {shape.ppn}"
    return ""


# Protocols a network's own NCCL set-up enables across nodes, where it restricts them. Google's GPUDirect-TCPXO
# profile (GoogleCloudPlatform/container-engine-accelerators gpudirect-tcpxo: nccl-env-profile.sh, sourced by
# a3-mega workloads, and its nccl-env-profile-simple.sh since the Aug 2025 release) sets NCCL_PROTO=Simple with
# NCCL_ALGO=Ring,Tree and NCCL_NVLS_ENABLE=0; LL is never enabled. Its opt-in LL128/NVLSTree profile hands the
# choice to Google's tuner plugin (a3plus_tuner_config), which is not NCCL's model and is not modelled here.
# GPUDirect-TCPX (a3-high) likewise: Google's TCPX run script sets NCCL_PROTO=Simple (presets.gcp_a3_high).
NETWORK_PROTOCOLS = {"tcpxo": ("Simple",), "tcpx": ("Simple",)}


def why_no_protocol(algorithm: str, protocol: str, shape: Shape, feat: Features) -> str:
    if algorithm in ("nvls", "nvls_tree", "collnet_direct", "collnet_chain", "pat") and protocol != "Simple":
        return f"{algorithm} runs with the Simple protocol only"
    allowed = NETWORK_PROTOCOLS.get(feat.network_kind)
    if shape.nodes > 1 and allowed and protocol not in allowed:
        return f"{feat.network_kind} networks run {' and '.join(allowed)} only (the provider's NCCL_PROTO profile)"
    if protocol == "LL128" and shape.ppn > 1 and not feat.nvlink:
        return "LL128 is enabled only over NVLink paths (typeIntra <= PATH_NVB)"
    if protocol == "LL128" and shape.sm < 70:
        return f"LL128 needs SM70+, got sm {shape.sm}"
    sms = T.tables(shape.version).ll128_sms
    if protocol == "LL128" and sms and shape.sm not in sms:
        return f"NCCL {shape.version} enables LL128 by default on SM {', '.join(map(str, sms))} only (got {shape.sm})"
    return ""


def candidates(op: Op, shape: Shape, feat: Features, cal: LibraryCalibration) -> list[Candidate]:
    """Every enabled (algorithm, protocol) with NCCL's latency and bandwidth for this communicator."""
    graphs, launched, node_speed, newest = _calibration_free(shape, feat)
    out = []
    for a in T.ALGORITHMS:
        g = graphs.get(a)
        if g is None or why_unavailable(a, op, shape, feat):
            continue
        for p in T.PROTOCOLS:
            if why_no_protocol(a, p, shape, feat):
                continue
            c = _candidate(op, a, p, g, shape, feat, cal, launched, node_speed, newest)
            if c is not None:
                out.append(c)
    return out


def _kind(a: str, shape: Shape, feat: Features) -> str:
    if shape.nodes > 1:
        return "nic"
    if a == "nvls":
        return "in_network"
    return "nvlink" if feat.nvlink else "pcie"


def _candidate(
    op, a, p, g: Graph, shape: Shape, feat: Features, cal: LibraryCalibration, launched, node_speed, newest: Shape
) -> Candidate | None:
    """NCCL's (latency, bandwidth) of (a, p) with the tables of the tag ``shape.version``: what that NCCL's
    tuner ranks. The time a run takes reads the newest tag's latency and bandwidth rules on the same graph
    (``run_latency_us``, ``achieved``):
    the older tables' caps were NCCL's guesses at the hardware, and the newer ones correct them (Blackwell's
    ring LL128 cap 73.4 GB/s a channel in v2.25-v2.27, 40 since; NVLSTree bounded by bwInter before v2.28,
    where 2 x 8 B200 on NCCL 2.26.2 measure 680-700 GB/s against the 320 that bound gives)."""
    nodes, n = shape.nodes, shape.num_ranks
    pi = T.PROTOCOLS.index(p)
    nsteps = 2 * (n - 1) if op is Op.ALLREDUCE else n - 1 if op in (Op.ALLGATHER, Op.REDUCESCATTER) else n
    if a in ("nvls", "nvls_tree") and g.channels < 2:  # tuning.cc: "NVLS/NVLStree needs at least 2 channels"
        return None
    algbw, bus, uncapped = _algbw(op, a, p, g, shape, feat, nsteps, g.bw_intra)
    if bus <= 0:
        return None
    speed = max(g.bw_intra, node_speed) if a in ("nvls", "nvls_tree") else g.bw_intra
    achieved = _algbw(op, a, p, g, newest, feat, nsteps, speed)[0] / algbw
    kind = _kind(a, shape, feat)
    run_lat, scale = _latencies(op, a, p, pi, n, nodes, nsteps, newest, feat, cal)
    lat = run_lat if newest is shape else _latency(op, a, p, pi, n, nodes, nsteps, shape, feat, cal)
    plateau, plateau_bytes = 1.0, 0
    runtime, default = launched if a in ("ring", "tree") else (0, 0)
    if a == "ring" and p == "Simple" and nodes > 1 and op is Op.ALLREDUCE:
        plateau = T.RING_PLATEAU if shape.sm >= 80 else 1.9  # ncclTopoGetAlgoTime
        plateau_bytes = T.RING_PLATEAU_BYTES * runtime * n
    return Candidate(
        a, p, lat, algbw, bus, g.channels, kind, cal.eff(kind), scale, _channel_bytes(a, p, n, g),
        _corrected_sizes(a, shape, feat), achieved, runtime,
        default, uncapped / bus, plateau, plateau_bytes,
        run_lat,
        *_pipeline(op, a, p, g, shape),
        *_window(op, a, p, g, shape, feat, cal, cal.latency_multiplier("inter_node", shape.sm)),
    )  # fmt: skip


def _window(op, a, p, g: Graph, shape: Shape, feat: Features, cal: LibraryCalibration, scale: float):
    """(window_us, window_rate, window_shape) of the network step window (tables.py, "step window"): Tree
    allreduce with LL or LL128 across nodes, whose chunks cross the network one slot each (Simple's tree is
    the store-and-forward fill, _pipeline; the ring's per-step latency is already NCCL's). The turn-over is
    tables.WINDOW_ONE_WAYS one-way network latencies: NCCL's per-hop NET latency for the pair (hwLat, newest
    tag) plus the plugin's, as the latency term scales it."""
    if a != "tree" or p == "Simple" or shape.nodes < 2 or op is not Op.ALLREDUCE or not T.WINDOW_ONE_WAYS:
        return 0.0, 0.0, ()
    pi = T.PROTOCOLS.index(p)
    one_way = T.HW_LATENCY_US["net"]["tree"][pi] * scale + cal.net_latency_us(feat.network_kind)
    return T.WINDOW_ONE_WAYS * one_way, g.bw_inter, (shape.nodes, shape.num_ranks / shape.nodes)


def _pipeline(op: Op, a: str, p: str, g: Graph, shape: Shape) -> tuple[int, int, int, tuple]:
    """(fill_hops, chunk_bytes, chunk_slots, hop_rates) of the Simple protocol's store-and-forward pipeline
    (tables.py, "chunk pipeline"):
    - Tree allreduce (ncclPatternTreeUpDown): a chunk goes up the node's chain and the tree, then down again,
      2 (ppn - 1) NVLink hops at the tree graph's bwIntra and 2 log2(nNodes) network hops at its bwInter per
      channel (all_reduce.h runTreeUpDown; the chain inside a node, graph/trees.cc), in Simple steps of 512 KiB
      (enqueue.cc calcCollChunking: chunkSteps 1 but for ring, v2.30.7-1 lines 2222-2225), one chunk in flight
      per launched channel;
    - NVLSTree allreduce (ncclPatternNvlsTree, all_reduce.h v2.30.7-1 lines 527-640): scatter into the NVLS
      reduction, up the tree over the network (log2(nNodes) hops), down again, NVLS broadcast and gather:
      2 log2(nNodes) + 2 hops at the balanced slot speed, nvlsChannels x nHeads chunks in flight;
    - NVLS allreduce on one node: 1 + tables.NVLS_ONE_NODE_FILL_HOPS (fitted), nvlsChannels x nHeads chunks.
    LL and LL128 forward each line as its flag arrives inside a node: no fill. Ring moves every rank's slice
    each step, so NCCL's 2 (n - 1) / n already counts its steps: no fill."""
    if op is not Op.ALLREDUCE or p != "Simple":
        return 0, 0, 0, ()
    log_nodes = math.ceil(math.log2(shape.nodes))
    if a == "tree":
        hops = ((2 * (shape.ppn - 1), g.bw_intra), (2 * log_nodes, g.bw_inter))
        return sum(h for h, _ in hops), T.SIMPLE_STEP_BYTES, 0, tuple(h for h in hops if h[0])
    if a == "nvls_tree":
        channels, chunk = T.nvls_tree_pipeline(shape.sm, shape.nodes, shape.ppn, shape.net_bw, shape.version)
        return 2 * log_nodes + 2, chunk, channels * g.channels, ()
    if a == "nvls" and shape.nodes == 1:
        channels = T.nvls_channels(shape.sm, 1, shape.version)
        return 1 + T.NVLS_ONE_NODE_FILL_HOPS, T.NVLS_CHUNK_BYTES, channels * g.channels, ()
    return 0, 0, 0, ()


def _algbw(op, a, p, g: Graph, shape: Shape, feat: Features, nsteps: int, intra_speed: float):
    """(algorithm bandwidth, busBw, busBw without per-channel caps) of (a, p) under the tables of
    ``shape.version``, the NVSwitch part at ``intra_speed`` for NVLS/NVLSTree."""
    nodes, n = shape.nodes, shape.num_ranks
    ppn = n / nodes
    collnet = a in ("collnet_direct", "collnet_chain")
    bw = g.bw_intra if nodes <= 2 or collnet else g.bw_inter
    if a in ("nvls", "nvls_tree"):
        bw = _nvls_channel_bw(op, a, g, intra_speed, shape, ppn)
    bus, uncapped = _bus(op, a, p, g, shape, feat, g.channels * bw, ppn)
    algbw = bus
    if not (a != "ring" and op in (Op.ALLGATHER, Op.REDUCESCATTER)):
        algbw = bus * _bus_to_alg(op, a, n, nodes, nsteps, T.tables(shape.version))
    return algbw, bus, uncapped


def _bus_to_alg(op: Op, a: str, n: int, nodes: int, nsteps: int, vt: T.VersionTables) -> float:
    """tuning.cc "Convert bus BW to algorithm BW": ring (and NVLS/NVLSTree since v2.28) nRanks / nsteps; NVLS
    and NVLSTree 5/6 before v2.28 (v2.18: NVLSTree .70 nNodes / (2 (nNodes - 1))); the rest .5."""
    if a == "ring" or (a in ("nvls", "nvls_tree") and vt.nvls_bw == "efficiency"):
        return n / nsteps
    if a == "nvls_tree" and vt.nvls_bw == "v2.18":
        return 0.70 * nodes / (2 * (nodes - 1))
    if a in ("nvls", "nvls_tree"):
        return 5.0 / 6.0
    return 0.5


def _bus(op: Op, a: str, p: str, g: Graph, shape: Shape, feat: Features, bus: float, ppn: float):
    """(NCCL's busBw of (a, p), the same without its per-channel caps) from channels x per-channel bandwidth
    ``bus``: the LL, LL128, tree, PAT and CollNetDirect factors and caps of tuning.cc:ncclTopoTuneModel, with the
    tables of the tag ``shape.version`` (tables.VersionTables)."""
    nodes = shape.nodes
    vt = T.tables(shape.version)
    cc, nc = min(T.cc_class(shape.sm), vt.cc_rows - 1), T.node_class(nodes)
    index1 = cc if nodes == 1 else (1 if feat.cpu_vendor == "amd" else 0)
    ll_max = vt.ll_max_bw[index1][nc]
    uncapped = bus
    if a == "ring" and p == "LL":
        one_node_copy = nodes == 1 and op not in (Op.ALLREDUCE, Op.REDUCE)
        factor = vt.ring_ll_factor if vt.ring_ll_factor == 0.5 or not one_node_copy else 1.0 / 3.0
        bus = uncapped = min(ll_max, bus * factor)
    if a == "ring" and p == "LL128":
        uncapped = bus * (vt.ring_ll128_ppn1 if ppn < 2 else T.LL128_FACTOR)
        bus = min(uncapped, g.channels * vt.ring_ll128[cc][nc])
    if a == "tree" and op is Op.ALLREDUCE:
        uncapped = bus * T.TREE_FACTOR
        bus = min(uncapped, g.channels * vt.tree[cc][nc])
    if a == "tree" and p == "LL":
        bus = uncapped = min(bus * T.TREE_LL_FACTOR, ll_max)
    if a == "tree" and p == "LL128":
        f = T.TREE_LL128_FACTOR_ONE_NODE if nodes == 1 else 120.0 / 128.0
        uncapped *= f
        bus = min(bus * f, g.channels * vt.tree_ll128[cc][nc])
    if a == "pat":
        bus = uncapped = bus * vt.pat_factor
    if a == "collnet_direct":
        if op in (Op.ALLGATHER, Op.REDUCESCATTER):
            bus = ppn * min(g.bw_intra, g.bw_inter * 0.9)
        else:
            factor = ppn / g.channels
            factor -= (factor - 1) / 2
            bus /= factor
            if shape.sm >= 90:
                bus *= T.COLLNET_HOPPER_FACTOR
        uncapped = bus
    return bus, max(bus, uncapped)


def _nvls_channel_bw(op: Op, a: str, g: Graph, intra_speed: float, shape: Shape, ppn: float) -> float:
    """NCCL's NVLS / NVLSTree busBw per channel (tuning.cc:ncclTopoTuneModel).

    v2.28+ (v2.30.7-1 lines 300-318): the NVSwitch part (speed x nvlsEfficiency x (c - 1)/c, x 2 for
    allreduce's two pipelined operations, else x (ppn - 1)/ppn), the network part (bwInter, x 2 for NVLSTree on
    two nodes) and NVLSTree's per-channel cap, the smallest. v2.19-v2.27 (v2.27.7-1 lines 266-275): NVLS
    allreduce min(bwIntra, bwInter), allgather/reducescatter min(bwIntra (ppn - 1)/ppn, 0.9 bwInter); NVLSTree
    min(bwIntra, bwInter, or bwInter / 2 on 3+ nodes). v2.18 (v2.18.6-1 line 174): bwIntra (bwInter on 3+
    nodes), no bound."""
    vt = T.tables(shape.version)
    cc, nc = T.cc_class(shape.sm), T.node_class(shape.nodes)
    if vt.nvls_bw == "v2.18":
        return intra_speed if shape.nodes <= 2 else g.bw_inter
    if vt.nvls_bw == "min":
        if a == "nvls_tree":
            return min(intra_speed, g.bw_inter if shape.nodes <= 2 else g.bw_inter / 2)
        if op is Op.ALLREDUCE:
            return min(intra_speed, g.bw_inter)
        return min(intra_speed * (ppn - 1) / ppn, g.bw_inter * 0.9)
    intra = intra_speed * T.NVLS_EFFICIENCY[cc] * (g.channels - 1) / g.channels
    intra *= 2.0 if op is Op.ALLREDUCE else (ppn - 1) / ppn
    inter = g.bw_inter * (2 if shape.nodes <= 2 and a == "nvls_tree" else 1)
    cap = vt.nvls_tree[cc][nc] if a == "nvls_tree" else math.inf
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
    """tuning.cc:ncclTopoTuneModel latencies, us, with the tables and rules of the tag ``shape.version``."""
    return _latencies(op, a, p, pi, n, nodes, nsteps, shape, feat, cal)[0]


def _latencies(op, a, p, pi, n, nodes, nsteps, shape: Shape, feat: Features, cal) -> tuple[float, float]:
    """(NCCL's latency, us, and the factor that calibrates it). NCCL's (tuning.cc:ncclTopoTuneModel, v2.30.7-1
    lines 384-435) is a sum of terms, each priced by what it crosses:
    - the NVLink domain's: the base latency (baseLatencies) and the intra-node hops (hwLatencies[NVLINK or PCI],
      intraLat), in a one-node call and in the intra-node legs of a multi-node call alike, times the GPU
      generation's ``intra_node`` scale (calibration.py);
    - the network's: NCCL's per-hop network latency (hwLatencies[NET]), the ring's per-step network overhead
      (getNetOverhead) and PAT's per-rank part, times ``inter_node``;
    - the plugin's: graph->latencyInter on each network hop (twice for Simple), a calibrated latency itself.
    A ring step across nodes costs NCCL max(intraLat, netOverhead) (line 410); calibrated, the larger of the
    two priced each at its own scale, and a network hop no less than the NVLink hop (below). So an NVLink hop
    costs the same whether the call stays in one NVLink
    domain (an MNNVL clique is one node to NCCL: topo.cc ncclTopoGetSystem fuses the clique's topologies,
    v2.27.7-1 lines 1387-1422, and init.cc counts nNodes by the rings' first ranks, lines 927-940) or crosses
    the network. On one node every term is the domain's: the factor is its scale, exactly."""
    raw, priced = _latency_terms(op, a, p, pi, n, nodes, nsteps, shape, feat, cal)
    if nodes == 1 or raw <= 0:
        return raw, cal.latency_multiplier("intra_node", shape.sm)
    return raw, priced / raw


def _latency_terms(op, a, p, pi, n, nodes, nsteps, shape: Shape, feat: Features, cal) -> tuple[float, float]:
    """(NCCL's latency, the calibrated one), us: _latencies's sum, term by term."""
    local_s = cal.latency_multiplier("intra_node", shape.sm)
    net_s = cal.latency_multiplier("inter_node", shape.sm)
    vt = T.tables(shape.version)
    ppn = n // nodes
    intra_hw = "nvlink" if feat.nvlink else "pci"
    lat = vt.base_latency[a][pi]
    intra = vt.hw_latency[intra_hw][a][pi]
    net = vt.hw_latency["net"]
    inter = net["tree" if ppn == 1 and vt.ppn1_tree_net_latency else a][pi]  # ppn 1: the tree's (v2.23+)
    plugin = cal.net_latency_us(feat.network_kind) * (2 if p == "Simple" else 1)  # latencyInter, twice: flush
    # one network hop: (NCCL's, calibrated). NCCL's NET latencies exceed its NVLink ones for every point-to-point
    # algorithm and protocol (hwLatencies above); calibrated, a network hop is never cheaper than the NVLink hop
    # it stands in for (ring, tree, CollNet; NVLS's intraLat is the whole switch operation, not a hop)
    floor = intra * local_s if a in ("ring", "tree", "collnet_direct", "collnet_chain") else 0.0
    hop = (inter + plugin, max(inter * net_s + plugin, floor))

    def terms(local: float, hops: float = 0.0, network: float = 0.0) -> tuple[float, float]:
        return local + hops * hop[0] + network, local * local_s + hops * hop[1] + network * net_s

    if a == "ring":
        if op in (Op.REDUCE, Op.BROADCAST):  # sameChannels graphs (the usual case): one ring hop
            hw = vt.hw_latency["net" if nodes > 1 else intra_hw]["ring"][pi]
            return terms(lat, network=hw) if nodes > 1 else terms(lat + hw)
        overhead = T.NET_OVERHEAD_US.get(feat.cpu_vendor, 1.0) * (3 if p == "Simple" else 1) if nodes > 1 else 0.0
        n_inter = _inter_steps(op, nodes, vt)
        steps = nsteps - n_inter
        raw, priced = terms(lat, n_inter)
        step = max(intra * local_s, overhead * net_s)
        return raw + steps * max(intra, overhead), priced + steps * step
    log_nodes = int(math.log2(nodes))
    if a == "tree":
        return terms(lat + 2 * (ppn - 1) * intra, 2 * log_nodes) if op is Op.ALLREDUCE else terms(lat)
    if a == "collnet_direct":
        return terms(lat + 2 * (min(1, ppn - 1) * intra + (ppn - 1) * vt.collnet_arity_us), 1)
    if a == "collnet_chain":
        return terms(lat + 2 * (ppn - 1) * intra, 1)
    if vt.nvls_latency == "v2.18" and a in ("nvls", "nvls_tree"):  # v2.18.6-1 lines 235-238: NET hwLat, no plugin
        hops = (1 if a == "nvls" else 2 * (nodes - 1)) if nodes > 1 else 0
        return terms(lat, network=hops * net[a][pi])
    if a == "nvls":  # NCCL's NVLS latency is intraLat alone (line 425), no base
        return terms(intra, 1 if nodes > 1 else 0)
    if a == "nvls_tree":
        return terms(lat + intra, 2 * log_nodes)
    # pat: ppn 1 only, every rank on its own node; log2(nNodes) x interLat / 3.5 + nRanks x 2.8 (lines 431-433)
    return terms(lat, log_nodes / 3.5, n * 2.8)


def _inter_steps(op: Op, nodes: int, vt: T.VersionTables) -> int:
    """The ring's network steps: allreduce 2 (nNodes - 1), allgather/reducescatter nNodes - 1 (v2.23+); before
    v2.23 allreduce counted 2 nNodes (tuning.cc v2.22.3-1 line 159)."""
    if nodes == 1:
        return 0
    if op is Op.ALLREDUCE:
        return 2 * nodes if vt.legacy_inter_steps else 2 * (nodes - 1)
    return nodes - 1


def best(op: Op, nbytes: int, cands: list[Candidate]) -> Candidate | None:
    """ncclTopoGetAlgoTime over every candidate, NCCL's own smallest time winning (enqueue.cc
    topoGetAlgoInfo): the pick is NCCL's, whatever the calibration."""
    return min(cands, key=lambda c: c.model_time_s(nbytes, op), default=None)
