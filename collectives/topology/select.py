"""Choose and price the algorithm of one call: the fastest valid candidate unless one is pinned.

Candidates (``auto``) are what the collective library of that fabric would consider, as NCCL's tuner
weighs ring, tree and NVLS/CollNet (src/graph/tuning.cc): ring, double binary tree, hierarchical
(NCCL's multi-node rings/trees cross each node once per rail, which the two-level schedule captures),
and in-network reduction where the switches can reduce; on a full-mesh board also the direct (mesh)
algorithms HCCL uses. ``candidates='all'`` tries every registered algorithm.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from .._errors import CollectiveError
from ..algorithms import Request, implementations, lookup, validate
from ..primitives import Op
from ..schedule import Schedule
from .calibration import DEFAULT, Calibration
from .cluster import Cluster
from .pricing import Evaluation, Price, evaluate, summarise

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
MESH_EXTRA = {Op.ALLREDUCE: ("direct",), Op.REDUCESCATTER: ("direct",), Op.ALLGATHER: ("direct",)}


def local_size(cluster: Cluster, placement: np.ndarray) -> int:
    """Ranks per node if every group is laid out node by node with the same count per node, else 0."""
    nodes = cluster.node_of(placement[0])
    changes = np.flatnonzero(np.diff(nodes)) + 1
    runs = np.diff(np.concatenate([[0], changes, [len(nodes)]]))
    if len(set(runs.tolist())) != 1 or len(np.unique(nodes)) != len(runs):
        return 0
    return int(runs[0])


@lru_cache(maxsize=4096)
def cached_schedule(algorithm: str, op: Op, n: int, count: int, local: int) -> Schedule:
    req = Request(op, n, count, 1, 0, max(local, 1))
    impl = lookup(algorithm, op)
    validate(impl, req)
    return impl.build(req)


def candidates(op: Op, cluster: Cluster, which: str = "library") -> tuple[str, ...]:
    if which == "all":
        return tuple(sorted({i.algorithm for i in implementations() if i.op is op}))
    extra = MESH_EXTRA.get(op, ()) if cluster.spec.intra.fabric == "full_mesh" else ()
    return LIBRARY_CANDIDATES[op] + extra


def price_call(
    op: Op,
    message_bytes: int,
    placement,
    cluster: Cluster,
    algorithm: str = "auto",
    calibration: Calibration | None = None,
    which: str = "library",
    top_links: int = 5,
) -> Price:
    """Price one call of ``op`` with ``message_bytes`` on every group in ``placement`` at once; the
    ``top_links`` busiest links are reported. ``calibration``: default the cluster's own (calibration_of)."""
    placement = np.atleast_2d(np.asarray(placement, dtype=np.int64))
    if calibration is None:
        calibration = calibration_of(cluster, placement)
    n = placement.shape[1]
    cluster.check_devices(placement)
    if len(np.unique(placement[0])) != n:
        raise CollectiveError("ranks", f"a group lists a device twice: {placement[0].tolist()[:16]}")
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


def calibration_of(cluster: Cluster, placement: np.ndarray) -> Calibration:
    """The constants fitted to the user's nccl-tests logs (ClusterSpec.calibration, POST /v1/calibrate) for
    this call's span, else the defaults. Kept on the cluster: Cluster.rate memoises by id(calibration), so
    a calibration must live as long as the cluster does."""
    constants = cluster.spec.calibration
    if constants is None:
        return DEFAULT
    nodes = cluster.node_of(placement[0])
    span = "intra_node" if (nodes == nodes[0]).all() else "inter_node"
    memo = cluster.__dict__.setdefault("_fitted_calibration", {})
    if span not in memo:
        from .fit import calibration_for  # fit.py prices through this module

        memo[span] = calibration_for(constants, span)
    return memo[span]


def _evaluate_one(name, op, message_bytes, placement, cluster, local, calibration, auto=False) -> Evaluation:
    if name == "hierarchical" and (local in (0, 1) or local == placement.shape[1]):
        raise CollectiveError("algorithm", "hierarchical needs a group spread evenly over several nodes")
    if auto and name == "double_binary_tree" and local == placement.shape[1]:
        # NCCL's tree is an inter-node algorithm: inside one node its "tree" is a chain (trees.cc)
        raise CollectiveError("algorithm", "the library's tree is only used across nodes")
    schedule = cached_schedule(name, op, placement.shape[1], message_bytes, local)
    return evaluate(schedule, placement, cluster, calibration)
