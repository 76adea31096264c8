"""Rank layout and communication groups, with Megatron-Core's RankGenerator semantics.

The order string (default ``tp-cp-ep-dp-pp``) names the dimensions fastest first: with tp = 8 the eight
ranks of a TP group are consecutive and share a node. Dense groups use (tp, cp, dp, pp) with ep = 1; the
expert grid re-partitions the same ranks as (expert_tp, ep, expert_dp, pp) with cp = 1
(megatron/core/parallel_state.py, ``RankGenerator`` and ``generate_masked_orthogonal_rank_groups``).

A group of several dimensions lists its ranks with the fastest dimension varying fastest, as Megatron
does. Groups come out as one (groups x size) numpy array built by a reshape and a transpose of
``arange(world)``: O(world) work and memory, 16,384 ranks in microseconds.

Placements depend on the parallel layout alone: :func:`layout_for` keeps one :class:`RankLayout` per
layout (the last ``LAYOUT_CACHE``), whose placements are memoised read-only arrays shared by every plan.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from .parallel import ParallelSpec
from .pipeline import StageMap


@dataclass(frozen=True)
class Group:
    """Which ranks talk: ``dims`` of the dense or the expert grid, restricted to pipeline ``stages``.

    ``pairs`` turns the groups into point-to-point pairs: ``"pp+1"`` / ``"pp-1"`` pair each stage with the
    next / previous one (wrapping round for interleaved schedules), ``"ring"`` pairs every member of a
    group with its successor (ring attention), ``"ends"`` keeps the first and last stage of each pipeline
    (Megatron's embedding group). ``mirror``: the stage map whose two copies the group spans (DualPipe's
    ``pipeline.MIRRORED``): each stage's groups joined by the same groups of the rank holding the stage's other copy
    (its twin, pp - 1 - s: ``StageMap.rank`` of copy 1's virtual stage pp + s), the twins' groups once, the lower
    rank's members first (Context.param_copies; rules/data.py). The map travels with the group, so a layout built for
    another schedule (the search's per-shape layout) places it alike.
    """

    dims: tuple[str, ...]
    expert: bool = False
    pairs: str | None = None
    # the inner size of a split dimension: dp -> (dp_rep, dp_shard) for hybrid sharding, ep -> (ep_node,
    # ep_local) for DeepEP's two legs (inter-node RDMA among same-index GPUs, NVLink inside a node)
    split: int | None = None
    mirror: StageMap | None = None


SPLITS = {"dp": ("dp_rep", "dp_shard"), "ep": ("ep_node", "ep_local")}


def _split_dim(dims: tuple[str, ...]) -> str:
    return "ep" if any(d.startswith("ep_") for d in dims) else "dp"


# layouts whose placements are kept: a placement of a 16,384-rank layout is at most 128 KiB and a plan asks
# for a few dozen, so 8 layouts hold tens of MB at most
LAYOUT_CACHE = 8


class RankLayout:
    def __init__(self, par: ParallelSpec):
        self.par = par
        self._memo: dict = {}
        self.order = par.order.split("-")  # fastest first
        self.world = par.world_size
        self.sizes = {
            False: {"tp": par.tp, "cp": par.cp, "ep": 1, "dp": par.dp, "pp": par.pp},
            True: {"tp": par.etp, "cp": 1, "ep": par.ep, "dp": par.expert_dp, "pp": par.pp},
        }

    def _grid(self, expert: bool, split: int | None, split_dim: str = "dp"):
        """arange(world) shaped slowest-first, and the axis names; ``split`` cuts ``split_dim`` into
        (outer, inner) with the inner part faster (SPLITS names them)."""
        names, shape = [], []
        for dim in reversed(self.order):
            size = self.sizes[expert][dim]
            if dim == split_dim and split:
                names += list(SPLITS[dim])
                shape += [size // split, split]
            else:
                names.append(dim)
                shape.append(size)
        return np.arange(self.world).reshape(shape), names

    def groups(self, dims: tuple[str, ...], expert: bool = False, stages=None, split: int | None = None) -> np.ndarray:
        """(number of groups) x (group size) array of global ranks."""
        grid, names = self._grid(expert, split, _split_dim(dims))
        inside = [names.index(d) for d in names if d in dims]  # keeps slowest-first, so fastest ends last
        outside = [i for i in range(len(names)) if i not in inside]
        if stages is not None and "pp" not in dims:
            pp_axis = names.index("pp")
            grid = np.take(grid, np.asarray(stages), axis=pp_axis)
        arranged = np.transpose(grid, outside + inside)
        size = int(np.prod([grid.shape[i] for i in inside])) if inside else 1
        return arranged.reshape(-1, size)

    def stride(self, dim: str, expert: bool = False) -> int:
        """Ranks between neighbours along ``dim``: the product of the faster dimensions' sizes."""
        faster = self.order[: self.order.index(dim)]
        return int(np.prod([self.sizes[expert][d] for d in faster]))

    def stage_of(self, ranks: np.ndarray) -> np.ndarray:
        by_stage = self.groups(("pp",))
        stage = np.empty(self.world, dtype=np.int64)
        stage[by_stage] = np.arange(self.par.pp)[None, :]
        return stage[ranks]

    def placement(self, group: Group, stages) -> np.ndarray:
        """The rank matrix that prices a call issued by ``stages``: collectives get their groups in those
        stages; point-to-point calls get (sender, receiver) rows. Memoised: a plan asks for the same
        groups many times, and plans of one layout share them: read-only."""
        key = (group, tuple(stages))
        placement = self._memo.get(key)
        if placement is None:
            placement = self._memo[key] = self._placement(group, stages)
            placement.flags.writeable = False
        return placement

    def _placement(self, group: Group, stages) -> np.ndarray:
        if group.pairs in ("pp+1", "pp-1"):
            chains = self.groups(("pp",), group.expert)
            step = 1 if group.pairs == "pp+1" else -1
            stages = np.asarray(stages)
            senders = chains[:, stages]
            receivers = chains[:, (stages + step) % self.par.pp]
            return np.stack([senders.ravel(), receivers.ravel()], axis=1)
        if group.pairs == "ends":  # the embedding group: first and last stage of every pipeline
            return self.groups(("pp",), group.expert)[:, [0, self.par.pp - 1]]
        if group.mirror:
            return self._mirrored(group, stages)
        members = self.groups(group.dims, group.expert, stages, group.split)
        if group.pairs == "ring":
            return np.stack([members.ravel(), np.roll(members, -1, axis=1).ravel()], axis=1)
        return members

    def _mirrored(self, group: Group, stages) -> np.ndarray:
        """A ``mirror`` group's rows: each twin pair's groups once (both twins issue the one call), the lower rank's
        ``dims`` group, then its twin's at the same coordinates (np.take keeps the other axes' order)."""
        p = self.par.pp
        lower = sorted({min(s, twin(group.mirror, s, p)) for s in stages})
        own = self.groups(group.dims, group.expert, lower, group.split)
        twins = self.groups(group.dims, group.expert, [twin(group.mirror, s, p) for s in lower], group.split)
        return np.hstack([own, twins])


def twin(stage_map: StageMap, stage: int, p: int) -> int:
    """The pipeline rank holding ``stage``'s other copy under ``stage_map`` (DualPipe: copy 1's stage s is virtual stage
    p + s, on rank p - 1 - s; StageMap.rank, the one home); ``stage`` itself with one copy."""
    return stage_map.rank(p + stage, p) if stage_map.copies > 1 else stage


@lru_cache(maxsize=LAYOUT_CACHE)
def layout_for(par: ParallelSpec) -> RankLayout:
    """The rank layout of ``par``, reused while it is among the last ``LAYOUT_CACHE`` used."""
    return RankLayout(par)
