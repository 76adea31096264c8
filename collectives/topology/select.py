"""Choose and price the algorithm of one call: the fastest valid candidate unless one is pinned.

Candidates (``auto``) are what the collective library of that fabric would consider, as NCCL's tuner
weighs ring, tree and NVLS/CollNet (src/graph/tuning.cc): ring, double binary tree, hierarchical
(NCCL's multi-node rings/trees cross each node once per rail, which the two-level schedule captures),
and in-network reduction where the switches can reduce; on a full-mesh board also the direct (mesh)
algorithms HCCL uses. ``candidates='all'`` tries every registered algorithm.
"""

from __future__ import annotations

from collections import OrderedDict
from functools import lru_cache

import numpy as np

from .._errors import CollectiveError
from ..algorithms import Request, implementations, lookup, validate
from ..primitives import Op
from ..schedule import Schedule
from .calibration import DEFAULT, Calibration
from .cluster import Cluster
from .library import is_nvidia, normalise_algo, normalise_proto, price_library
from .library.graphs import Shape
from .library.model import NCCL_FUNCS, Features
from .library.p2p import P2P_OPS, p2p_ctas
from .library.pricer import features_of, shape_of
from .pricing import Evaluation, Price, evaluate, local_size, summarise

LIBRARY_CANDIDATES: dict[Op, tuple[str, ...]] = {
    Op.ALLREDUCE: ("ring", "double_binary_tree", "hierarchical", "in_network"),
    Op.REDUCESCATTER: ("ring", "hierarchical", "in_network"),
    Op.ALLGATHER: ("ring", "hierarchical", "in_network"),
    Op.ALLTOALL: ("direct", "hierarchical"),
    Op.BROADCAST: ("ring",),
    Op.REDUCE: ("binomial_tree",),
    Op.GATHER: ("direct",),
    Op.SCATTER: ("direct",),
    Op.SENDRECV: ("direct",),
}


@lru_cache(maxsize=4096)
def cached_schedule(algorithm: str, op: Op, n: int, count: int, local: int) -> Schedule:
    req = Request(op, n, count, 1, 0, max(local, 1))
    impl = lookup(algorithm, op)
    validate(impl, req)
    return impl.build(req)


def candidates(op: Op, cluster: Cluster, which: str = "library") -> tuple[str, ...]:
    if which == "all":
        return tuple(sorted({i.algorithm for i in implementations() if i.op is op}))
    return LIBRARY_CANDIDATES[op] + cluster.fabric.extra_candidates.get(op, ())  # a mesh's direct algorithms


PRICINGS = ("auto", "library", "schedule")


def resolve_pricing(pricing: str, cluster: Cluster, op: Op | None = None) -> str:
    """``auto``: NCCL's model (``library``) on NVIDIA clusters for the collectives NCCL's tuner prices, the
    step-by-step ``schedule`` pricer elsewhere (NPU full mesh, TPU torus, all-to-all and point-to-point)."""
    if pricing not in PRICINGS:
        raise CollectiveError("options.pricing", f"must be one of {', '.join(PRICINGS)}, got {pricing!r}")
    if pricing == "auto":
        pricing = "library" if is_nvidia(cluster) else "schedule"
    elif pricing == "library" and not is_nvidia(cluster):
        s = cluster.spec
        raise CollectiveError(
            "pricing",
            f"library pricing is NCCL's model: it needs an NVIDIA GPU (gpu.sm > 0, got "
            f"{s.gpu.sm if s.gpu else 'no GPU'}) on an NVLink/PCIe switch or one GPU per node (got intra "
            f"{s.intra.fabric}/{s.intra.link_name}); use pricing 'schedule'",
        )
    if pricing == "library" and op is not None and op not in NCCL_FUNCS:
        return "schedule"
    return pricing


def check_group(placement: np.ndarray) -> None:
    if len(np.unique(placement[0])) != placement.shape[1]:
        raise CollectiveError("ranks", f"a group lists a device twice: {placement[0].tolist()[:16]}")


def check_concurrent_groups(groups, op: Op) -> None:
    """The groups of one call (rows of a placement, or lists) are disjoint, as a communicator split
    (ncclCommSplit, a process group per color) puts each rank in one group: a device in two groups was priced as
    if each group had it to itself (the same 8 GPUs twice gave the time of 8 others alongside, hostile11).
    Point-to-point pairs may share a device (a pipeline stage sends on and receives at once); the first group's
    own duplicates are ``check_group``'s. Every caller passes here (the HTTP route, the planner, Python): one sort
    where all is well (7.5 us for 128 groups of 8, 38 us for 512 of 16; np.unique took 58 and 574 us)."""
    if op == Op.SENDRECV or len(groups) < 2:
        return
    flat = np.fromiter((d for g in groups for d in g), dtype=np.int64) if not isinstance(groups, np.ndarray) else groups
    ordered = np.sort(flat, axis=None)
    if not (ordered[1:] == ordered[:-1]).any():
        return
    seen: dict[int, int] = {}
    for i, group in enumerate(np.asarray(g).tolist() for g in groups):
        if i and len(set(group)) != len(group):
            raise CollectiveError("concurrent_groups", f"group {i} lists a device twice: {group[:16]}")
        for device in group:
            first = seen.setdefault(device, i)
            if first != i:
                raise CollectiveError(
                    "concurrent_groups",
                    f"device {device} is in group {first} and group {i}: the groups of one call are disjoint",
                )


def price_call(
    op: Op,
    message_bytes: int,
    placement,
    cluster: Cluster,
    algorithm: str = "auto",
    calibration=DEFAULT,
    which: str = "library",
    top_links: int = 5,
    pricing: str = "schedule",
    nccl_algo: str = "auto",
    nccl_proto: str = "auto",
) -> Price:
    """Price one call of ``op`` with ``message_bytes`` on every group in ``placement`` at once; the
    ``top_links`` busiest links are reported. ``pricing='library'`` (or ``'auto'`` on an NVIDIA cluster)
    uses NCCL's model (library/), with ``nccl_algo`` / ``nccl_proto`` pinning like NCCL_ALGO / NCCL_PROTO
    and ``calibration`` a :class:`LibraryCalibration`; ``'schedule'`` prices the named schedule step by step."""
    placement = np.atleast_2d(np.asarray(placement, dtype=np.int64))
    n = placement.shape[1]
    cluster.check_devices(placement)
    check_concurrent_groups(placement, op)
    # one rank: NCCL returns at once (tuning.cc: nRanks <= 1); the schedule pricer prices the empty schedule
    if resolve_pricing(pricing, cluster, op) == "library" and algorithm == "auto" and n > 1:
        # the library checks the placement (devices listed twice) once per placement, memoised
        return price_library(
            op,
            message_bytes,
            placement,
            cluster,
            calibration,
            normalise_algo(nccl_algo),
            normalise_proto(nccl_proto),
            top_links,
        )
    check_group(placement)
    price = _price_schedule(op, message_bytes, placement, cluster, algorithm, calibration, which, top_links)
    # NCCL runs a send/recv or all-to-all on its p2p channels, one CTA each: what the call holds beside the
    # compute (planner/contention.py), whichever pricer gave its time
    price.channels = nccl_p2p_ctas(op, message_bytes, placement, cluster, pricing)
    return price


def nccl_p2p_ctas(op: Op, message_bytes: int, placement: np.ndarray, cluster: Cluster, pricing: str = "auto") -> int:
    """The CTAs of NCCL's p2p kernel (library/p2p.py) for a send/recv or all-to-all on ``placement``'s groups,
    where NCCL runs it (an NVIDIA cluster, pricing other than ``schedule`` by name); 0 otherwise."""
    if op not in P2P_OPS or placement.shape[1] < 2 or pricing == "schedule" or not is_nvidia(cluster):
        return 0
    return p2p_ctas(op, message_bytes, *_p2p_part(cluster, placement))


_P2P_PART: OrderedDict = OrderedDict()


def _p2p_part(cluster: Cluster, placement: np.ndarray) -> tuple[Shape, Features]:
    """NCCL's view of the communicator of the first group spanning the most nodes (the one whose path sets a
    point-to-point call's time, its slowest link, whose channels the call's kernel is taken to hold) and the
    cluster's features: what depends on the placement only, memoised per placement as the library pricer's
    ``_placement_part`` (a search prices thousands of message sizes on one placement)."""
    key = (cluster.spec, placement.shape, placement.tobytes())
    got = _P2P_PART.get(key)
    if got is None:
        group = placement[0]
        if placement.shape[0] > 1:
            nodes = np.sort(cluster.node_of(placement), axis=1)
            group = placement[int(np.argmax((np.diff(nodes, axis=1) != 0).sum(axis=1)))]
        got = _P2P_PART[key] = (shape_of(cluster, group), features_of(cluster))
        if len(_P2P_PART) > 1024:
            _P2P_PART.popitem(last=False)
    return got


def _price_schedule(op, message_bytes, placement, cluster, algorithm, calibration, which, top_links) -> Price:
    """The schedule pricer's price: the named schedule, or the fastest of the candidates."""
    n = placement.shape[1]
    if not isinstance(calibration, Calibration):
        calibration = DEFAULT
    local = local_size(cluster, placement)
    if algorithm != "auto":
        ev = _evaluate_one(algorithm, op, message_bytes, placement, cluster, local, calibration)
        return summarise(ev, cluster, top_links)
    best, reasons = None, []
    for name in candidates(op, cluster, which):
        try:
            ev = _evaluate_one(name, op, message_bytes, placement, cluster, local, calibration, auto=True)
        except CollectiveError as err:
            reasons.append(str(err))
            continue
        if best is None or ev.time_s < best.time_s:
            best = ev
    if best is None:
        raise CollectiveError("algorithm", f"no algorithm can run {op.value} on {n} ranks here: {'; '.join(reasons)}")
    return summarise(best, cluster, top_links)


def _evaluate_one(name, op, message_bytes, placement, cluster, local, calibration, auto=False) -> Evaluation:
    if name == "hierarchical" and (local in (0, 1) or local == placement.shape[1]):
        raise CollectiveError(
            "algorithm",
            f"hierarchical needs a group spread evenly over several nodes; got {placement.shape[1]} ranks, "
            + (f"{local} per node" if local else "unevenly over nodes"),
        )
    if auto and name == "double_binary_tree" and local == placement.shape[1]:
        # NCCL's tree is an inter-node algorithm: inside one node its "tree" is a chain (trees.cc)
        raise CollectiveError(
            "algorithm", f"the library's tree is only used across nodes; the {local} ranks sit in one node"
        )
    schedule = cached_schedule(name, op, placement.shape[1], message_bytes, local)
    return evaluate(schedule, placement, cluster, calibration)
