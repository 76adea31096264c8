"""The CTAs NCCL's point-to-point kernel launches for a send/recv or an all-to-all (issue 20, p2psm).

NCCL runs ncclSend / ncclRecv (and ncclAlltoAll, which enqueue.cc ncclEnqueueCheck turns into one send and one
recv per rank, v2.30.7-1 lines 3070-3077, unless a copy-engine path is asked for: NCCL_CTA_POLICY_ZERO with
symmetric registered windows, not the default) on its p2p channels, one CTA per channel: the kernel's grid is
the number of channels its plan touches (enqueue.cc ``grid = {countOneBits(plan->channelMask)}``, line 1756-1758;
addP2pToPlan sets one bit per channel a part runs on, line 1061). Each CTA holds its SM for the whole call, as a
collective's do (planner/contention.py). The chain, every step from NVIDIA/nccl v2.30.7-1 unless a row says which
tag differs:

============================  =====================================================================================
what                          rule (source)
============================  =====================================================================================
p2pnChannels                  pow2Up(min(comm->nChannels, NCCL_MAX_P2P_NCHANNELS = MAXCHANNELS)), at most
                              pow2Down(ncclDevMaxChannelsForArgsBytes(NCCL_WORK_ARGS_BYTES = INT64_MAX)), i.e.
                              MAXCHANNELS (graph/paths.cc ncclTopoComputeP2pChannels lines 978-991; the same since
                              v2.18.6-1 lines 703-724). comm->nChannels: the ring's launched channels after
                              ncclTopoPostset (init.cc line 1480; ncclTopoComputeP2pChannels runs at line 1500):
                              model.comm_channels.
channels per peer, NVLink     2 x max(1, path bw / ncclTopoNVLinkBw(sm)): 2 x the GPU's NVLink links through an
                              NVSwitch (paths.cc ncclTopoGetNchannels lines 931-935; v2.18.6-1 line 682)
channels per peer, PCIe       2 (paths.cc line 938)
channels per peer, network    v2.29+: max(NICs, ceil(NIC GB/s / NCCL_P2P_PER_CHANNEL_NET_BW = 14)) (paths.cc lines
                              942-949; v2.29.7-1 lines 856-861); v2.20-v2.28: max(NICs, 2 halved while 2 x nRanks >
                              4 x p2pnChannels) (v2.25.1-1 paths.cc lines 757-768); v2.18-v2.19:
                              NCCL_NCHANNELS_PER_NET_PEER = 2 (v2.18.6-1 line 667)
p2pnChannelsPerPeer           pow2Up of the least over the comm's peers (init.cc line 1448 takes the least over
                              ranks), at most p2pnChannels; across nodes from v2.29 halved while perPeer x
                              ceil(nRanks / 8) > p2pnChannels (paths.cc lines 993-1001; v2.29.7-1 line 905)
nChannelsMin of a plan        perPeer halved while nChannelsMin x nRanks > p2pnChannels (enqueue.cc
                              scheduleP2pTasksToPlan lines 1143-1146)
channels of one send (recv)   min(nChannelsMin, ceil(bytes / minPart)), doubled while the part exceeds maxPart and
                              the count is at most perPeer / 2 (enqueue.cc addP2pToPlan lines 919-926); minPart =
                              chunk / 8 in one node, chunk / 2 across nodes (v2.18-v2.19: chunk / 8 both); maxPart
                              = 32 x chunk in one node, chunk across nodes
chunk (comm->p2pChunkSize)    NCCL_P2P_NVL_CHUNKSIZE 512 KiB on all-NVLink nodes, NCCL_P2P_PCI_CHUNKSIZE 128 KiB,
                              NCCL_P2P_NET_CHUNKSIZE 128 KiB across nodes (x2 on ARM hosts with SM100+), never above
                              DEFAULT_BUFFSIZE 4 MiB / NCCL_STEPS 8 (init.cc computeBuffSizes lines 818-843)
a round's channels            parts 0.. of a peer's round r sit on (base(r) + part) mod p2pnChannels, base(r) =
                              bit-reverse of r in log2(p2pnChannels) bits in one node; across nodes r / groupSize x
                              ceil(groupSize / 8) + (r mod groupSize) / 8 first (NCCL_P2P_SCHEDULE_GROUP_SIZE 8),
                              so 8 consecutive rounds share their channels (include/channel.h
                              ncclP2pChannelBaseForRound, device.h ncclP2pChannelForPart; init.cc ncclP2pSchedule)
============================  =====================================================================================

A send and a recv of one round share their channels (nChannelsMax = max of the two: addP2pToPlan line 1048): a
grouped send/recv to one peer launches ``send_channels`` CTAs, an all-to-all over n ranks (n rounds, its own
included) the union of its rounds' channels. Not modelled: a plan split by its work budget (a group of more
rounds than one kernel's budget launches several kernels in turn, each with its own grid: the union is an upper
bound of what one holds at a time), NCCL_MAX_P2P_NCHANNELS / NCCL_NCHANNELS_PER_NET_PEER / chunk-size variables
(their defaults here), and comms split with shared resources (NCCL_COMM_SPLIT_SHARE_RESOURCES, off by default).
The per-version differences of enqueue.cc's base mapping before v2.22 (p2pChannels[] with mirrorBits) spread the
rounds alike and are taken as v2.30's.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import NamedTuple

from ...primitives import Op
from . import tables as T
from .graphs import Shape, ring_graph
from .model import Features, comm_channels

P2P_PER_BATCH = 8  # include/device.h NCCL_MAX_DEV_WORK_P2P_PER_BATCH (v2.30.7-1 line 391)
P2P_SCHEDULE_GROUP_SIZE = 8  # init.cc NCCL_P2P_SCHEDULE_GROUP_SIZE default = NCCL_MAX_DEV_WORK_P2P_PER_BATCH
P2P_PER_CHANNEL_NET_BW = 14  # graph/paths.cc NCCL_P2P_PER_CHANNEL_NET_BW, GB/s (v2.29+)
NCHANNELS_PER_NET_PEER = 2  # graph/paths.cc NCCL_NCHANNELS_PER_NET_PEER default before v2.20; the start after
P2P_NVL_CHUNK = 1 << 19  # init.cc NCCL_P2P_NVL_CHUNKSIZE
P2P_PCI_CHUNK = 1 << 17  # init.cc NCCL_P2P_PCI_CHUNKSIZE
P2P_NET_CHUNK = 1 << 17  # init.cc NCCL_P2P_NET_CHUNKSIZE
SIMPLE_STEP_CAP = (1 << 22) // 8  # DEFAULT_BUFFSIZE 4 MiB / NCCL_STEPS 8: the largest p2p chunk
EPS = 1e-9


def pow2_up(x: int) -> int:
    return 1 << max(0, (int(x) - 1).bit_length())


class P2pComm(NamedTuple):
    """What one rank's communicator fixes for its p2p calls (module table)."""

    channels: int  # comm->p2pnChannels
    per_peer: int  # comm->p2pnChannelsPerPeer
    ranks: int
    nodes: int
    group_size: int  # comm->p2pSchedGroupSize
    chunk: int  # comm->p2pChunkSize
    split_parts: bool  # minPart is chunk / 2 across nodes (v2.20+), else chunk / 8


def _net_per_peer(shape: Shape, p2p_raw: int) -> int:
    """ncclTopoGetNchannels for a peer on another node, by version (module table)."""
    if not T.at_least(shape.version, "2.20"):
        return NCHANNELS_PER_NET_PEER
    nics = 1  # the NICs at the best bandwidth of one GPU: a GPU with several sees them fused into one (pricer.py)
    if T.at_least(shape.version, "2.29"):
        return max(nics, math.ceil(int(shape.net_bw + EPS) / P2P_PER_CHANNEL_NET_BW))
    most = NCHANNELS_PER_NET_PEER
    while most * shape.num_ranks > 4 * p2p_raw and most > 1:
        most //= 2
    return max(nics, most)


def _intra_per_peer(shape: Shape) -> int:
    if shape.nvswitch:
        links = int(shape.gpu_bw / T.nvlink_bw(shape.sm) + EPS)
        return 2 * max(1, links)
    return 2


@lru_cache(maxsize=1024)
def p2p_comm(shape: Shape, feat: Features) -> P2pComm:
    """The communicator's p2p channels and channels per peer (module table); a function of its (hashable,
    frozen) arguments alone, memoised: every message size on one communicator asks it."""
    ring = ring_graph(shape)
    most = T.max_channels(shape.version)
    raw = min(comm_channels(shape, feat, ring), most)  # NCCL_MAX_P2P_NCHANNELS defaults to MAXCHANNELS
    channels = min(pow2_up(raw), most)
    peers = []
    if shape.ppn > 1:
        peers.append(_intra_per_peer(shape))
    if shape.nodes > 1:
        peers.append(_net_per_peer(shape, raw))
    least = min(peers) if peers else 1
    if not T.at_least(shape.version, "2.29"):
        least = min(least, raw)
    per_peer = pow2_up(least)
    n = shape.num_ranks
    if shape.nodes > 1 and T.at_least(shape.version, "2.29"):
        while per_peer * math.ceil(n / P2P_PER_BATCH) > channels and per_peer > 1:
            per_peer //= 2
    else:
        per_peer = min(per_peer, channels)
    if shape.nodes > 1:
        chunk = P2P_NET_CHUNK * (2 if feat.cpu_vendor == "arm" and shape.sm >= 100 else 1)
        # init.cc ncclP2pSchedule 894-897: gcd(8, localRanks) where localRanks % 8 or localRanks < 8, else 8,
        # which is that gcd too
        group = math.gcd(P2P_SCHEDULE_GROUP_SIZE, shape.ppn)
    else:
        chunk = P2P_NVL_CHUNK if shape.nvswitch or feat.nvlink else P2P_PCI_CHUNK
        group = shape.ppn
    return P2pComm(
        channels, per_peer, n, shape.nodes, group, min(chunk, SIMPLE_STEP_CAP), T.at_least(shape.version, "2.20")
    )


def min_channels(comm: P2pComm) -> int:
    """enqueue.cc scheduleP2pTasksToPlan nChannelsMin: one channel per operation where all ranks cannot fit."""
    low = comm.per_peer
    while low * comm.ranks > comm.channels and low > 1:
        low //= 2
    return low


def send_channels(comm: P2pComm, nbytes: int) -> int:
    """Channels of one send (or recv) of ``nbytes`` to one peer (enqueue.cc addP2pToPlan): 1 for an empty one."""
    if nbytes <= 0:
        return 1
    across = comm.nodes > 1
    min_part = comm.chunk // 2 if across and comm.split_parts else comm.chunk // 8
    max_part = comm.chunk if across else 32 * comm.chunk
    n = min(min_channels(comm), -(-nbytes // min_part))
    part = max(min_part, -(-nbytes // n))
    while part > max_part and n <= comm.per_peer // 2:
        n *= 2
        part = -(-nbytes // n)
    return n


def _reverse(x: int, bits: int) -> int:
    out = 0
    for _ in range(bits):
        out = (out << 1) | (x & 1)
        x >>= 1
    return out


def round_base(comm: P2pComm, r: int) -> int:
    """include/channel.h ncclP2pChannelBaseForRound: the first channel of round ``r``."""
    if comm.nodes > 1:
        g = comm.group_size
        base = (r // g) * -(-g // P2P_PER_BATCH) + (r % g) // P2P_PER_BATCH
    else:
        base = r
    bits = max(0, (comm.channels - 1).bit_length())
    return _reverse(base, bits) & (comm.channels - 1)


def grid(comm: P2pComm, rounds: int, per_round: int) -> int:
    """CTAs of one p2p kernel whose ``rounds`` rounds (0..rounds-1) each run on ``per_round`` channels: the
    popcount of the plan's channel mask."""
    mask, full = 0, (1 << comm.channels) - 1
    for r in range(rounds):
        base = round_base(comm, r)
        for part in range(per_round):
            mask |= 1 << ((base + part) & (comm.channels - 1))
        if mask == full:
            break
    return bin(mask).count("1")


@lru_cache(maxsize=4096)
def sendrecv_ctas(shape: Shape, feat: Features, nbytes: int) -> int:
    """One grouped send and recv of ``nbytes`` each with one peer (one round): its channels."""
    comm = p2p_comm(shape, feat)
    return grid(comm, 1, send_channels(comm, nbytes))


@lru_cache(maxsize=4096)
def alltoall_ctas(shape: Shape, feat: Features, nbytes: int) -> int:
    """An all-to-all whose per-rank send buffer is ``nbytes`` (nccl-tests' convention): a send and a recv of
    nbytes / n with every rank, itself included (torch all_to_all_single and ncclAlltoAll alike), one kernel."""
    comm = p2p_comm(shape, feat)
    n = shape.num_ranks
    return grid(comm, n, send_channels(comm, nbytes // max(n, 1)))


P2P_OPS = {Op.SENDRECV: sendrecv_ctas, Op.ALLTOALL: alltoall_ctas}


def p2p_ctas(op: Op, nbytes: int, shape: Shape, feat: Features) -> int:
    """The CTAs NCCL's p2p kernel holds for ``op`` (a send/recv or an all-to-all; 0 for other ops)."""
    rule = P2P_OPS.get(op)
    return rule(shape, feat, int(nbytes)) if rule is not None and shape.num_ranks > 1 else 0
