"""The CTAs NCCL's point-to-point kernel launches (collectives/topology/library/p2p.py, issue 20 p2psm): each count
below is worked by hand from NVIDIA/nccl v2.30.7-1 (graph/paths.cc ncclTopoGetNchannels /
ncclTopoComputeP2pChannels, enqueue.cc scheduleP2pTasksToPlan / addP2pToPlan, include/channel.h
ncclP2pChannelBaseForRound) and the older tags where the network rule differs."""

import math
from dataclasses import replace

import numpy as np
import pytest

from collectives import Op
from collectives.topology import cluster_for, cluster_preset
from collectives.topology.library import p2p
from collectives.topology.library import tables as T
from collectives.topology.library.graphs import Shape
from collectives.topology.library.model import Features, comm_channels, graphs_for
from collectives.topology.select import price_call

H100_NVLINK = 18 * T.nvlink_bw(90)  # 18 NVLink4 links through the NVSwitch, NCCL's 20.6 GB/s each
PAIR = Shape(90, 1, 2, H100_NVLINK, True, 1, 0.0)  # two H100s of one DGX node
EIGHT = Shape(90, 1, 8, H100_NVLINK, True, 1, 0.0)  # the whole node
ACROSS = Shape(90, 2, 1, H100_NVLINK, True, 1, 50.0)  # one H100 on each of two nodes, a 400G NIC each (50 GB/s)
FEAT = Features()
KIB, MIB = 1 << 10, 1 << 20


def test_a_pair_inside_an_h100_node():
    # comm->nChannels 24 (the ring search's 12, duplicated: model.comm_channels); p2pnChannels = pow2Up(24) = 32;
    # channels per NVLink peer 2 x 18 links = 36 -> pow2Up 64, at most p2pnChannels: 32; a plan's nChannelsMin
    # halves 32 while x 2 ranks > 32: 16. The NVLink chunk is 512 KiB: parts of 64 KiB to 16 MiB
    assert comm_channels(PAIR, FEAT, graphs_for(PAIR)["ring"]) == 24
    comm = p2p.p2p_comm(PAIR, FEAT)
    assert (comm.channels, comm.per_peer, comm.chunk) == (32, 32, 512 * KIB)
    assert p2p.min_channels(comm) == 16
    assert p2p.sendrecv_ctas(PAIR, FEAT, 64 * KIB) == 1  # ceil(64 KiB / 64 KiB)
    assert p2p.sendrecv_ctas(PAIR, FEAT, 1 * MIB) == 16  # min(16, 16 parts)
    assert p2p.sendrecv_ctas(PAIR, FEAT, 256 * MIB) == 16  # 16 MiB parts: not above 16 MiB
    # 1 GiB on 16 channels is 64 MiB a part: doubled once (16 <= 32 / 2), then 32 > 16 stops it
    assert p2p.sendrecv_ctas(PAIR, FEAT, 1024 * MIB) == 32
    assert p2p.sendrecv_ctas(PAIR, FEAT, 0) == 1  # an empty send still takes one channel


def test_an_all_to_all_over_the_node_is_the_union_of_its_rounds():
    # 8 ranks: nChannelsMin 32 -> 16 -> 8 -> 4 (4 x 8 <= 32). Round r starts at the 5-bit reverse of r:
    # 0, 16, 8, 24, 4, 20, 12, 28, so rounds of c channels (c <= 4) never overlap: 8 c CTAs
    comm = p2p.p2p_comm(EIGHT, FEAT)
    assert (comm.channels, p2p.min_channels(comm)) == (32, 4)
    assert [p2p.round_base(comm, r) for r in range(8)] == [0, 16, 8, 24, 4, 20, 12, 28]
    # 1 MiB a rank = 128 KiB a peer: min(4, 2 parts of 64 KiB) = 2 channels a round, 16 in all
    assert p2p.alltoall_ctas(EIGHT, FEAT, 1 * MIB) == 16
    # 256 MiB = 32 MiB a peer on 4 channels, 8 MiB a part: 4 a round, all 32 p2p channels
    assert p2p.alltoall_ctas(EIGHT, FEAT, 256 * MIB) == 32
    # a grouped send/recv to one peer of the same comm: its nChannelsMin is 4 (rank count 8)
    assert p2p.sendrecv_ctas(EIGHT, FEAT, 1 * MIB) == 4


def test_a_pair_across_nodes_by_version():
    # v2.30: a network peer gets max(1 NIC, ceil(50 / NCCL_P2P_PER_CHANNEL_NET_BW 14)) = 4 channels; comm->nChannels
    # 4 -> p2pnChannels 4; across nodes 4 x ceil(2 / 8) <= 4 keeps 4. nChannelsMin 2 (2 x 2 <= 4). The net chunk is
    # 128 KiB: parts of 64 KiB to 128 KiB, so 1 MiB starts on 2 channels (512 KiB a part) and doubles once to 4
    comm = p2p.p2p_comm(ACROSS, FEAT)
    assert (comm.channels, comm.per_peer, comm.chunk, p2p.min_channels(comm)) == (4, 4, 128 * KIB, 2)
    assert p2p.sendrecv_ctas(ACROSS, FEAT, 1 * MIB) == 4
    assert p2p.sendrecv_ctas(ACROSS, FEAT, 100 * KIB) == 2  # min(2, ceil(100 / 64)) = 2, 64 KiB parts
    # v2.20-v2.28: max(1 NIC, 2) (paths.cc v2.25.1-1): 2 channels a peer, so a send never doubles past 2
    old = replace(ACROSS, version="2.27")
    assert p2p.p2p_comm(old, FEAT).per_peer == 2
    assert p2p.sendrecv_ctas(old, FEAT, 1 * MIB) == 2
    # v2.18-v2.19: NCCL_NCHANNELS_PER_NET_PEER 2, and parts of chunk / 8 = 16 KiB to 128 KiB
    oldest = replace(ACROSS, version="2.18")
    assert p2p.p2p_comm(oldest, FEAT).per_peer == 2
    assert p2p.sendrecv_ctas(oldest, FEAT, 1 * MIB) == 2
    # a fused pair of 400G NICs per GPU (100 GB/s): ceil(100 / 14) = 8 channels a peer on v2.30, capped by the
    # comm's p2pnChannels
    wide = replace(ACROSS, net_bw=100.0)
    assert p2p.p2p_comm(wide, FEAT).per_peer == min(8, p2p.p2p_comm(wide, FEAT).channels)


def test_across_nodes_eight_rounds_share_their_channels():
    # 2 nodes x 8 GPUs: p2pSchedGroupSize 8, so rounds 0-7 share base 0 and 8-15 base reverse(1) (include/
    # channel.h): an all-to-all over 16 ranks touches 2 x c channels
    shape = Shape(90, 2, 8, H100_NVLINK, True, 8, 50.0)
    comm = p2p.p2p_comm(shape, FEAT)
    assert comm.group_size == 8
    assert {p2p.round_base(comm, r) for r in range(8)} == {0}
    assert p2p.round_base(comm, 8) == comm.channels // 2
    c = p2p.send_channels(comm, 64 * MIB // 16)
    assert p2p.alltoall_ctas(shape, FEAT, 64 * MIB) == min(comm.channels, 2 * c)


def test_price_call_sets_the_ctas_where_nccl_runs_the_call():
    cluster = cluster_for(cluster_preset("dgx-h100", 2))
    pair = np.array([[0, 1]])
    price = price_call(Op.SENDRECV, 1 * MIB, pair, cluster, pricing="auto")
    assert price.channels == p2p.sendrecv_ctas(PAIR, FEAT, 1 * MIB) == 16
    node = np.arange(8)[None, :]
    assert price_call(Op.ALLTOALL, 256 * MIB, node, cluster, pricing="auto").channels == 32
    # the channels are NCCL's: the schedule pricer asked for by name gives none
    assert price_call(Op.SENDRECV, 1 * MIB, pair, cluster, pricing="schedule").channels == 0
    # groups that sit differently: the call's kernel is taken from the group spanning the most nodes (whose path
    # sets the time), here the pair across the two nodes
    mixed = np.array([[0, 1], [7, 8]])
    assert price_call(Op.SENDRECV, 1 * MIB, mixed, cluster, pricing="auto").channels == 4


def test_no_ctas_off_nccl():
    tpu = cluster_for(cluster_preset("tpu-torus"))
    price = price_call(Op.SENDRECV, 1 * MIB, np.array([[0, 1]]), tpu, pricing="auto")
    assert price.channels == 0
    assert p2p.p2p_ctas(Op.ALLREDUCE, 1 * MIB, PAIR, FEAT) == 0
    assert p2p.p2p_ctas(Op.SENDRECV, 1 * MIB, replace(PAIR, ppn=1), FEAT) == 0  # one rank: nothing launched


@pytest.mark.parametrize("channels", [1, 2, 4, 8, 16, 32, 64])
def test_round_bases_cover_every_channel_once(channels):
    # bit reversal in log2(p2pnChannels) bits is a permutation of the channels (include/bitops.h reverseBits)
    comm = p2p.P2pComm(channels, channels, channels, 1, channels, 512 * KIB, True)
    assert sorted(p2p.round_base(comm, r) for r in range(channels)) == list(range(channels))


def test_a_measured_log_prints_the_same_p2p_channels():
    """Reference data: the AWS p5 nccl-tests log (tests/reference/nccl_heldout/aws_p5_2x8_allreduce.log, NCCL
    2.22.3, 2 nodes x 8 H100, EFA) prints on every rank "16 coll channels, ... 16 p2p channels, 2 p2p channels per
    peer" (init.cc's INFO line). The model of that 16-rank communicator: comm->nChannels 16, p2pnChannels
    pow2Up(16) = 16; per peer the least of NVLink's 36 and the network's max(1 fused NIC, 2) (v2.20-v2.28): 2."""
    from collectives.topology.library.pricer import features_of, shape_of
    from tests.collectives.heldout import HELDOUT, cluster_of, manifest

    (entry,) = (e for e in manifest() if e["file"] == "aws_p5_2x8_allreduce.log")
    lines = [line for line in (HELDOUT / entry["file"]).read_text().splitlines() if "p2p channels per peer" in line]
    assert len(lines) == 16 and all("16 p2p channels, 2 p2p channels per peer" in line for line in lines)
    cluster = cluster_of(entry)
    shape = shape_of(cluster, np.arange(16))
    assert shape.version == "2.22"
    comm = p2p.p2p_comm(shape, features_of(cluster))
    assert (comm.channels, comm.per_peer) == (16, 2)


@pytest.mark.parametrize("ppn", range(1, 19))
def test_the_schedule_group_is_ncclp2pschedules(ppn):
    # init.cc ncclP2pSchedule (v2.30.7-1 lines 894-897): groupSize 8, taken as gcd(8, localRanks) where
    # localRanks % 8 or localRanks < 8 (so 8 at 8, 16: the gcd as well)
    nccl = math.gcd(8, ppn) if ppn % 8 or ppn < 8 else 8
    assert p2p.p2p_comm(replace(ACROSS, ppn=ppn), FEAT).group_size == nccl


def test_a_placement_is_read_once_for_every_message_size(monkeypatch):
    """The widest group's shape is worked out once per placement (select._p2p_part), the communicator once per
    shape (p2p_comm, memoised): a search asks thousands of sizes on one placement (review r8a finding 4)."""
    from collectives.topology import select

    cluster = cluster_for(cluster_preset("dgx-h100", 2))
    # four pairs; only the third crosses the node boundary: its shape (2 nodes, 1 GPU each) is the one priced
    placement = np.array([[0, 1], [2, 3], [4, 12], [5, 6]])
    seen = []
    real = select.shape_of
    monkeypatch.setattr(select, "shape_of", lambda c, g: seen.append(g.tolist()) or real(c, g))
    select._P2P_PART.clear()
    ctas = [select.nccl_p2p_ctas(Op.SENDRECV, m, placement, cluster) for m in (64 * KIB, 1 * MIB, 3 * MIB)]
    assert seen == [[4, 12]]
    shape, feat = select._p2p_part(cluster, placement)
    assert (shape.nodes, shape.ppn) == (2, 1)
    assert ctas == [p2p.sendrecv_ctas(shape, feat, m) for m in (64 * KIB, 1 * MIB, 3 * MIB)]
    assert p2p.p2p_comm(shape, feat) is p2p.p2p_comm(shape, feat)
