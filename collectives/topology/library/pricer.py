"""The ``library`` pricer: NCCL's own cost model (model.py) on our cluster graph, with our contention.

1. What NCCL sees of the call is read from group 0 of the placement (:func:`shape_of`): GPUs per node, nodes,
   the GPU's NVLink bandwidth from its sm and link count, and the NICs its GPUs drive (a GPU with several
   NICs sees them fused into one, topo.cc:ncclTopoMakeVNics), each capped by NCCL's PCIe figure.
2. NCCL's tuner gives every enabled (algorithm, protocol) a latency and a bandwidth; the cheapest at this
   size wins, or the pinned pair (NCCL_ALGO / NCCL_PROTO). For a fixed pair the time is NCCL's latency plus
   bytes over its bandwidth, with the Simple pipeline fill and the network step window (model.py), which
   follow NCCL's chunk rules and so are not linear in bytes: every size is priced exactly.
3. Contention, which NCCL's per-communicator model cannot see: every concurrent group of the call spreads its
   inter-node bytes evenly over the NICs its GPUs drive on each node (NCCL's channels are spread over the
   node's NICs, one channel per NIC rail, so no single NIC carries a flat ring's traffic), and on a fat-tree
   the bytes of a node-to-node hop that leaves a leaf unit also cross that leaf's spine bundle. The
   bandwidth term is multiplied by the worst ratio, over group 0's NICs and leaf bundles, of the busy time
   with every group running to group 0's own busy time on its NIC (1 when nothing is shared).
4. The executable schedule that moves the same bytes (``SCHEDULE_OF``) gives the exact bytes per rank and
   is what ``verify`` proves.
"""

from __future__ import annotations

from collections import OrderedDict
from functools import lru_cache

import numpy as np

from ..._errors import CollectiveError
from ...algorithms import Request, lookup, validate
from ...primitives import Op, busbw_factor
from ..cluster import Cluster
from ..pricing import Price
from ..spec import nccl_minor
from . import pins
from . import tables as T
from .calibration import DEFAULT_LIBRARY, LibraryCalibration
from .graphs import Shape
from .model import NCCL_FUNCS, Candidate, Features, best, candidates, why_no_protocol, why_unavailable
from .pins import NCCL_NAMES

# NCCL algorithm -> our executable schedule moving the same bytes per rank (PAT's allgather/reducescatter
# sends (n-1)/n of the message per rank, as the ring does; NVLSTree and CollNet reduce inside the node, then
# across nodes: the two-level schedule).
SCHEDULE_OF = {
    "ring": "ring",
    "tree": "double_binary_tree",
    "nvls": "in_network",
    "nvls_tree": "hierarchical",
    "collnet_direct": "hierarchical",
    "collnet_chain": "hierarchical",
    "pat": "ring",
}


def is_nvidia(cluster: Cluster) -> bool:
    """NCCL's model applies: an NVIDIA GPU (sm > 0) on NVLink/PCIe inside the node."""
    s = cluster.spec
    return bool(s.gpu and s.gpu.sm > 0) and s.intra.link_name in ("nvlink", "pcie") and cluster.fabric.library_model


def normalise_algo(text: str) -> str:
    """Validate an NCCL_ALGO value (pins.py); returns it unchanged ('auto' for empty)."""
    pins.parse(text, "algo")
    return text.strip() or "auto"


def normalise_proto(text: str) -> str:
    """Validate an NCCL_PROTO value (pins.py)."""
    pins.parse(text, "proto")
    return text.strip() or "auto"


def shape_of(cluster: Cluster, group: np.ndarray) -> Shape:
    s = cluster.spec
    sm = s.gpu.sm if s.gpu else 0
    nodes, counts = np.unique(cluster.node_of(group), return_counts=True)
    ppn = int(counts.max())
    nvswitch = s.intra.link_name == "nvlink" and cluster.fabric.switched
    if nvswitch:
        per_link = 50.0 if sm >= 100 else 25.0  # NVLink5 / NVLink3-4 GB/s per link per direction
        links = (s.gpu.nvlink_links if s.gpu and s.gpu.nvlink_links else 0) or round(s.intra.bandwidth_GBps / per_link)
        gpu_bw = links * T.nvlink_bw(sm)
    else:
        gpu_bw = T.pci_bw(s.intra.bandwidth_GBps if cluster.fabric.connects_devices else s.pcie_bandwidth_GBps)
    nets, net_bw = 1, 0.0
    if len(nodes) > 1:
        first = group[cluster.node_of(group) == nodes[0]]
        nets = len(np.unique(cluster.nic_of(first)))
        fused = max(1, s.nics_per_node // s.devices_per_node)
        net_bw = min(fused * s.nic_bandwidth_GBps, T.pci_bw(s.pcie_bandwidth_GBps))
    return Shape(
        sm,
        len(nodes),
        ppn,
        gpu_bw,
        nvswitch,
        nets,
        net_bw,
        nccl_minor(s.nccl_version),
        len(group),
    )


def features_of(cluster: Cluster) -> Features:
    """NVLS where the switch has it and NCCL_NVLS_ENABLE is not 0 (transport/nvls.cc ncclNvlsInit); CollNet
    only where the network has a SHARP plugin and NCCL_COLLNET_ENABLE=1 (init.cc: config.collnetEnable defaults
    to 0, v2.30.7-1 lines 2146-2203; v2.18.6-1 lines 861-866 the same through collNetSupport)."""
    s = cluster.spec
    found = _FEATURES.get(s)  # a pure function of the spec, asked once per priced call: memoised
    if found is None:
        env = s.nccl_env
        found = _FEATURES[s] = Features(
            nvls=s.intra.in_network_reduction and env.NCCL_NVLS_ENABLE != 0,
            collnet=s.network.in_network_reduction and env.NCCL_COLLNET_ENABLE == 1,
            cpu_vendor=s.cpu_vendor,
            network_kind=s.network.kind,
            nvlink=s.intra.link_name == "nvlink",
            min_channels=env.NCCL_MIN_NCHANNELS,
            max_channels=env.NCCL_MAX_NCHANNELS,
        )
        if len(_FEATURES) > 64:
            _FEATURES.popitem(last=False)
    return found


_FEATURES: OrderedDict = OrderedDict()  # ClusterSpec -> its Features


_CANDS: OrderedDict = OrderedDict()


def _candidates(op: Op, shape: Shape, feat: Features, cal: LibraryCalibration, algo: str, proto: str):
    key = (op, shape, feat, cal, algo, proto)
    got = _CANDS.get(key)
    if got is None:
        algos, protos = pins.enabled(pins.parse(algo, "algo"), op), pins.enabled(pins.parse(proto, "proto"), op)
        got = [
            c
            for c in candidates(op, shape, feat, cal)
            if (algos is None or c.algorithm in algos) and (protos is None or c.protocol in protos)
        ]
        if not got:
            raise CollectiveError(*_why_none(op, shape, feat, algos, protos))
        _CANDS[key] = got
        if len(_CANDS) > 4096:
            _CANDS.popitem(last=False)
    return got


def _why_none(op, shape, feat, algos, protos) -> tuple[str, str]:
    """NCCL fails a call no enabled (algorithm, protocol) can run; say which rule stops each pinned one."""
    if algos is not None:
        reasons = [
            f"{NCCL_NAMES[a]}: {why_unavailable(a, op, shape, feat) or _proto_rule(a, protos, shape, feat)}"
            for a in sorted(algos)
        ]
        return "nccl_algo", f"no enabled algorithm can run {op.value} here ({'; '.join(reasons)})"
    runnable = [a for a in T.ALGORITHMS if not why_unavailable(a, op, shape, feat)]
    rules = sorted({why_no_protocol(a, p, shape, feat) for a in runnable for p in protos} - {""})
    because = f" ({'; '.join(rules)})" if rules else ""
    return "nccl_proto", f"no NCCL algorithm runs {op.value} with protocol {', '.join(sorted(protos))} here{because}"


def _proto_rule(algo, protos, shape, feat) -> str:
    rules = [why_no_protocol(algo, p, shape, feat) for p in sorted(protos or T.PROTOCOLS)]
    return "; ".join(r for r in rules if r) or "not with the enabled protocols"


def choose(
    op: Op, nbytes: int, cluster: Cluster, group: np.ndarray, cal=DEFAULT_LIBRARY, algo="auto", proto="auto"
) -> Candidate:
    """NCCL's pick (or the pinned pair) for one call of ``nbytes`` on a communicator shaped like ``group``."""
    cands = _candidates(op, shape_of(cluster, group), features_of(cluster), cal, algo, proto)
    return best(op, nbytes, cands)


def price_library(
    op: Op,
    nbytes: int,
    placement: np.ndarray,
    cluster: Cluster,
    cal=DEFAULT_LIBRARY,
    algo: str = "auto",
    proto: str = "auto",
    top_links: int = 5,
) -> Price:
    if not isinstance(cal, LibraryCalibration):
        cal = cluster.spec.calibration if isinstance(cluster.spec.calibration, LibraryCalibration) else DEFAULT_LIBRARY
    if op not in NCCL_FUNCS:
        raise CollectiveError("op", f"NCCL's tuner does not price {op.value}")
    n = placement.shape[1]
    shape, (ratio, loaded) = _placement_part(cluster, placement)
    cand, lat_s, bw_s, (schedule, sent, received, steps), channels = _tuned(
        op, nbytes, shape, features_of(cluster), cal, algo, proto
    )
    time = lat_s + bw_s * ratio if n > 1 else 0.0
    algbw = nbytes / time / 1e9 if time else 0.0
    factor = busbw_factor(op, n)
    links = []
    for link, units in loaded[:top_links] if time else ():
        carried = sent if units < 0 else int(units * nbytes * factor)
        d = cluster.describe_link(link)  # a copy: this price's own
        busy = carried / (d["capacity_GBps"] * 1e9)
        d.update(bytes=carried, busy_s=busy, utilisation=min(1.0, busy / time))
        links.append(d)
    nodes = shape.nodes
    return Price(
        algorithm=schedule,
        time_s=time,
        algbw_GBps=algbw,
        busbw_GBps=algbw * factor,
        bytes_sent_per_rank=sent,
        bytes_received_per_rank=received,
        steps=steps,
        bottleneck=links[0] if links else {},
        links=links,
        span="intra_node" if nodes == 1 else "inter_node",
        nodes_per_group=nodes,
        protocol=cand.protocol,
        nccl_algorithm=NCCL_NAMES[cand.algorithm],
        channels=channels,
    )


# NCCL's answer for a call by the closed form's own inputs: the operation, the bytes, the communicator's shape
# as NCCL sees it (Shape: GPUs per node, nodes, NICs, link speeds, version, ranks), the cluster's Features, the
# calibration and the pins. It does not depend on where the groups sit (contention and links are the placement's
# part, _placement_part), so calls of equal bytes on groups of one shape share it, within a plan (a stage class
# priced apart, an other placement alike to NCCL) and across plans (an other layout or model on the same kind of
# groups; the plan's own price cache is keyed by placement). Bounded, first in first out; the values are
# immutable (the Candidate is frozen).
TUNED_CACHE = 8192
_TUNED: OrderedDict = OrderedDict()


def _tuned(op: Op, nbytes: int, shape: Shape, feat: Features, cal: LibraryCalibration, algo: str, proto: str):
    """(NCCL's pick, its latency and its bandwidth term in seconds before contention, the executable schedule's
    (name, bytes sent, bytes received, steps), the channels launched) for ``nbytes`` of ``op`` on a
    communicator of ``shape``: tuning.cc's pick (model.best) and the run's time (Candidate.time_s)."""
    key = (op, nbytes, shape, feat, cal, algo, proto)
    got = _TUNED.get(key)
    if got is None:
        cand = best(op, nbytes, _candidates(op, shape, feat, cal, algo, proto))
        lat_s = cand.latency_s_at(nbytes)
        bw_s = cand.time_s(nbytes, op) - lat_s
        name = SCHEDULE_OF[cand.algorithm]
        if cand.algorithm == "nvls" and shape.nodes > 1:
            name = "hierarchical"  # NVLS inside each node, SHARP across: never the full message through every NIC
        local = shape.ppn if shape.nodes > 1 else 1
        schedule = _schedule_bytes(name, op, shape.num_ranks, nbytes, local)
        got = _TUNED[key] = (cand, lat_s, bw_s, schedule, cand.channels_used(nbytes))
        if len(_TUNED) > TUNED_CACHE:
            _TUNED.popitem(last=False)
    return got


@lru_cache(maxsize=8192)
def _schedule_bytes(name: str, op: Op, n: int, nbytes: int, local: int) -> tuple[str, int, int, int]:
    """The busiest rank's bytes sent and received and the steps of the executable schedule, from its
    closed form (algorithms/_base.py Cost, which ``verify`` checks against the executed schedule): O(1)
    for 131,072 ranks. Falls back to ring where the named schedule does not fit the shape. Cached by value
    and bounded: no calibration changes it, and a calibration fit (fit.py) asks it for the same call under
    each of its ~1,000 calibrations, each a new _TUNED entry."""
    for candidate in (name, "ring", "binomial_tree"):
        try:
            impl = lookup(candidate, op)
            req = Request(op, n, nbytes, 1, 0, max(local, 1))
            validate(impl, req)
        except CollectiveError:
            continue
        cost = impl.cost(req)
        return candidate, int(cost.bytes_sent), int(cost.bytes_received), int(cost.steps)
    return name, 0, 0, 0


_CONTENTION: OrderedDict = OrderedDict()
CONTENTION_CACHE = 1024  # placements whose contention pass is kept (planner/estimate.py BatchWork reads it)


def _placement_part(cluster: Cluster, placement: np.ndarray):
    """What depends on the placement only, memoised: NCCL's view of group 0 and the contention."""
    key = (cluster.spec, placement.shape, placement.tobytes())
    got = _CONTENTION.get(key)
    if got is None:
        from ..select import check_group

        check_group(placement)
        got = _CONTENTION[key] = (shape_of(cluster, placement[0]), _contention(cluster, placement))
        if len(_CONTENTION) > CONTENTION_CACHE:
            _CONTENTION.popitem(last=False)
    return got


def contention(cluster: Cluster, placement: np.ndarray) -> tuple[float, tuple[tuple[int, float], ...]]:
    """(slow-down of the bandwidth term, group 0's loaded links busiest first with their bytes per bus byte)
    for all groups of ``placement`` running at once; see the module docstring, point 3."""
    return _placement_part(cluster, placement)[1]


def _contention(cluster: Cluster, placement: np.ndarray) -> tuple[float, tuple[tuple[int, float], ...]]:
    """(slow-down, group 0's loaded links busiest first as (link id, bytes per bus byte; -1 = the bytes each
    rank sends))."""
    spec = cluster.spec
    g, n = placement.shape
    node = cluster.node_of(placement)
    if (node == node[:, :1]).all():  # one node per group: its GPUs' ports belong to it alone
        fam = cluster.families.get("dev_up")
        return 1.0, tuple((fam.start + int(d), -1.0) for d in placement[0]) if fam else ()
    nic = cluster.nic_of(placement)
    num_nics = spec.num_nodes * spec.nics_per_node
    gid = np.repeat(np.arange(g), n)
    pairs = np.unique(gid * num_nics + nic.ravel())  # (group, NIC) used
    pg, pn = pairs // num_nics, pairs % num_nics
    pnode = pn // spec.nics_per_node
    gn = pg * spec.num_nodes + pnode
    _, inv, cnt = np.unique(gn, return_inverse=True, return_counts=True)
    weight = 1.0 / cnt[inv]  # each group-node's bytes spread evenly over its NICs
    load = np.bincount(pn, weight, minlength=num_nics)
    own = pg == 0
    ratios = load[pn[own]] / weight[own]
    start = cluster.families["nic_up"].start
    links = [(start + int(i), float(u), float(r)) for i, u, r in zip(pn[own], load[pn[own]], ratios, strict=True)]
    links += cluster.network.ring_links(cluster, placement, pg, pn, weight)  # a fat-tree's leaf bundles
    links.sort(key=lambda x: -x[2])
    worst = max(1.0, links[0][2])
    return worst, tuple((i, u) for i, u, _ in links)
