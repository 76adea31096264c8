"""NCCL's topology search (src/graph/search.cc:ncclTopoCompute, v2.30.7-1), reduced to the quantities the
tuner reads: per algorithm graph, the number of channels and the per-channel speed inside the node
(``bw_intra``) and across it (``bw_inter``).

What NCCL sees of one communicator is a :class:`Shape`: GPUs per node, nodes, each GPU's NVLink (or PCIe)
bandwidth, and the NICs the communicator's GPUs reach with their per-NIC path speed. The search tries speeds
from a descending array, at each speed builds as many channels as the links allow (every channel takes its
speed from every link it crosses), keeps the best channels x speed, duplicates channels, then tries faster
speeds with that channel count. Channel feasibility is computed in closed form per pattern instead of
NCCL's path-by-path recursion (documented per function).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from . import tables as T

EPS = 1e-9


@dataclass(frozen=True)
class Shape:
    sm: int
    nodes: int
    ppn: int  # GPUs of the communicator per node
    gpu_bw: float  # one GPU's bandwidth to its peers: NVLink links x NCCL link speed, or NCCL PCIe bw
    nvswitch: bool
    nets: int  # NICs (after fusion) the communicator's GPUs use on one node
    net_bw: float  # per NIC, NCCL's figure (Gb/s / 8000), capped by the PCIe path
    version: str = "2.30"
    ranks: int = 0  # the communicator's ranks (0: ppn x nodes); uneven groups have fewer

    @property
    def num_ranks(self) -> int:
        return self.ranks or self.ppn * self.nodes


@dataclass(frozen=True)
class Graph:
    channels: int
    bw_intra: float
    bw_inter: float

    @property
    def bus_bw(self) -> float:
        return self.channels * self.bw_intra


def _ring_capacity(shape: Shape, speed: float) -> int:
    """Channels a ring (or chain/tree) pattern fits at ``speed``. Inside a node each GPU forwards every
    channel over its NVLink, except on the channels it hands to the NIC (ppn/(ppn-1) of its bandwidth is
    usable); across nodes every channel enters and leaves through one NIC (search.cc ncclTopoSearchRecGpu
    with bwInter on the NET links)."""
    if shape.ppn > 1:
        share = shape.ppn / (shape.ppn - 1) if shape.nodes > 1 else 1.0
        fit = math.floor(shape.gpu_bw * share / speed + EPS)
    else:
        fit = T.MAX_RING_CHANNELS
    if shape.nodes > 1:
        fit = min(fit, shape.nets * math.floor(shape.net_bw / speed + EPS))
    return min(fit, T.MAX_RING_CHANNELS)


def _max_bw(shape: Shape) -> float:
    """search.cc:ncclTopoSearchInit system->maxBw: the best single path, GPU-GPU inside a node, GPU-NET across."""
    return shape.net_bw if shape.nodes > 1 else shape.gpu_bw


def ring_graph(shape: Shape) -> Graph:
    """search.cc:ncclTopoCompute for NCCL_TOPO_PATTERN_RING (v2.30.7-1): pass 1 walks the speed array down
    from the first speed <= maxBw, keeping the best channels x speed, and stops once the next speed is below
    0.49 of the best; ncclTopoDupChannels doubles the channels at half speed; pass 2 raises the speed while
    the same channel count still fits."""
    arr = T.speeds(shape.sm, shape.nodes > 1, shape.version)
    i = next((k for k, s in enumerate(arr) if s <= _max_bw(shape) + EPS), len(arr) - 1)
    best: tuple[int, float] | None = None
    while True:
        n = _ring_capacity(shape, arr[i])
        if n and (best is None or n * arr[i] > best[0] * best[1] + EPS):
            best = (n, arr[i])
        if i == len(arr) - 1 or (best is not None and arr[i + 1] / best[1] <= 0.49):
            break
        i += 1
    if best is None:
        return Graph(1, 0.1, 0.1)  # search.cc: "falling back to simple order", bwIntra 0.1
    n, s = _dup_channels(shape.sm, *best)
    k = next((k for k, v in enumerate(arr) if v <= s + EPS), len(arr) - 1)
    while k > 0 and _ring_capacity(shape, arr[k - 1]) >= n:
        k -= 1
        s = arr[k]
    return Graph(n, s, s)


def _dup_channels(sm: int, n: int, s: float) -> tuple[int, float]:
    """search.cc:ncclTopoDupChannels (v2.30.7-1): no duplication below 25 GB/s per channel, nor on SM > 80
    below 50 GB/s with more than 4 channels; else min(2n, maxChannels) channels at speed / DIVUP(new, n)."""
    if s < 25.0 or (sm > 80 and s < 50.0 and n > 4):
        return n, s
    dup = min(2 * n, T.MAX_RING_CHANNELS)
    return dup, s / -(-dup // n)


def tree_graph(shape: Shape, ring: Graph) -> Graph:
    """init.cc: the tree search is bound to the ring's channel count (min = max = ring nChannels); pass 2
    of search.cc then raises bwIntra for trees while bwIntra < 2 x bwInter and the intra chain still fits."""
    if shape.nodes == 1:
        return ring
    arr = T.speeds(shape.sm, True, shape.version)
    intra = ring.bw_intra
    k = next((k for k, v in enumerate(arr) if v <= intra + EPS), len(arr) - 1)
    while k > 0 and intra < 2 * ring.bw_inter and (shape.ppn == 1 or ring.channels * arr[k - 1] <= shape.gpu_bw + EPS):
        k -= 1
        intra = arr[k]
    return Graph(ring.channels, intra, ring.bw_inter)


def nvls_graph(shape: Shape) -> Graph | None:
    """NVLS heads: one channel per GPU of the node up to NCCL_MAX_NVLS_ARITY (search.cc: maxChannels =
    min(NCCL_MAX_NVLS_ARITY, ngpus), and on one node minChannels = maxChannels), needing an NVSwitch and SM90+
    (search.cc:ncclTopoCompute v2.30.7-1). Every channel is charged on every GPU's NVSwitch link, twice on its
    head's (:func:`_nvls_speed`); across nodes each head also owns one NIC of its own (search.cc
    ncclTopoSearchRecNet: an NVLS channel per NIC, no GPU heading two), see :func:`_nvls_across_nodes`."""
    if not shape.nvswitch or shape.sm < 90 or shape.ppn < 2:
        return None
    heads = min(shape.ppn, T.MAX_NVLS_ARITY)
    if shape.nodes > 1:
        return _nvls_across_nodes(shape, min(heads, shape.nets))
    speed = _nvls_speed(shape, heads)
    return Graph(heads, speed, _raised_inter(shape, speed, math.inf)) if speed else None


def _heads_fit(shape: Shape, heads: int, speed: float) -> bool:
    """ncclTopoSearchTryNvls: a GPU heading one of ``heads`` channels carries (heads + 1) x speed on its
    NVSwitch link, each way."""
    return (heads + 1) * speed <= shape.gpu_bw + EPS


def _nvls_across_nodes(shape: Shape, max_heads: int) -> Graph | None:
    """search.cc:ncclTopoCompute pass 1 with the inter speed array (v2.30.7-1): from the first speed within
    maxBw (the GPU-NIC path) down, the channels that fit at each speed (a NIC each, the NVSwitch links
    charged as on one node); NCCL keeps the graph with more channels, or more channels x speed, stops at
    maxChannels ("PERFECT") or once the next speed is below 0.49 of the kept one. Pass 2 raises bwInter
    while below 2 x bwIntra and within the NIC. DGX H100, 2 nodes: 9 x 48 and 9 x 42 exceed 18 x 20.6, so
    8 x 40, bwInter 48; HGX H800 (8 NVLinks, 8 x 20.6): 8 x 17.5, bwInter raised while below 35, to 40."""
    if max_heads < 1:
        return None
    arr = T.speeds(shape.sm, True, shape.version)
    i = next((k for k, v in enumerate(arr) if v <= _max_bw(shape) + EPS), len(arr) - 1)
    best: tuple[int, float] | None = None
    while True:
        heads_fit = math.floor((shape.gpu_bw + EPS) / arr[i]) - 1  # the most that _heads_fit allows
        c = max(0, min(max_heads, heads_fit)) if arr[i] <= shape.net_bw + EPS else 0
        if c and (best is None or c > best[0] or c * arr[i] > best[0] * best[1] + EPS):
            best = (c, arr[i])
        if (best and best[0] == max_heads) or i == len(arr) - 1 or (best and arr[i + 1] / best[1] <= 0.49):
            break
        i += 1
    if best is None:
        return None
    channels, speed = best
    return Graph(channels, speed, _raised_inter(shape, speed, shape.net_bw))


def _nvls_speed(shape: Shape, heads: int) -> float | None:
    """The per-channel speed of one node's NVLS graph (search.cc v2.30.7-1; the same since v2.18):
    ncclTopoSearchTryNvls takes every channel's speed on every GPU's NVSwitch link, each way, and twice on its
    head GPU's, so a GPU heading one of ``heads`` channels carries (heads + 1) x speed; ncclTopoCompute starts
    at the first speed within maxBw (the GPU's link) whose heads x speed is within totalBw x n / (n - 1) (the
    allowance for non-ring patterns) and walks the intra speed array down until that fits. DGX H100:
    9 x 40 <= 18 x 20.6, so 8 x 40; GB200 NVL72: 32 heads, 33 x 20 <= 18 x 40.1, so 32 x 20. None: no speed
    fits, and NCCL finds no NVLS graph."""
    arr = T.speeds(shape.sm, False, shape.version)
    total = shape.gpu_bw * shape.ppn / (shape.ppn - 1)
    first = next((i for i, v in enumerate(arr) if v <= shape.gpu_bw + EPS and v * heads <= total + EPS), len(arr))
    return next((v for v in arr[first:] if _heads_fit(shape, heads, v)), None)


def _raised_inter(shape: Shape, speed: float, limit: float) -> float:
    """search.cc:ncclTopoCompute pass 2 for NVLS (v2.30.7-1): bwInter steps up the speed array while it is
    below 2 x bwIntra and the search still succeeds; the NVSwitch paths are charged bwIntra, so only the NIC
    (``limit``; none on one node) can stop it. DGX H100 one node: 40 -> 60 (the "8 x 60" NCCL logs); NVL72:
    20 -> 40. The one-node tuning takes min(NVLS bus bandwidth, bwInter)."""
    arr = T.speeds(shape.sm, shape.nodes > 1, shape.version)
    i = next((k for k, v in enumerate(arr) if v <= speed + EPS), len(arr) - 1)
    inter = speed
    while i > 0 and inter < 2 * speed - EPS and arr[i - 1] <= limit + EPS:
        i -= 1
        inter = arr[i]
    return inter


def collnet_graph(shape: Shape) -> Graph:
    """CollNet (SHARP) heads: one per NIC the node's GPUs use, at most NCCL_MAX_DIRECT_ARITY + 1 = 8
    (search.cc:ncclTopoCompute, device.h v2.30.7-1), at the ring's inter-node speed."""
    ring = ring_graph(shape)
    return Graph(min(max(1, shape.nets), T.MAX_DIRECT_ARITY + 1), ring.bw_inter, ring.bw_inter)
