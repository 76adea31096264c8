"""Run a schedule on numpy buffers: the proof that an algorithm computes its primitive.

State is one array of shape (ranks + virtual holders, slots, longest slot); slots shorter than the longest
are zero-padded and the padding never leaves a rank (outputs are read slot by slot at their true length).
Peak memory: ``holders x slots x ceil(count / slots) x itemsize`` bytes for the state plus one step's
transfers. Ring allreduce of 1,024 ranks x 1M float32 holds 4 GiB of state.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._errors import CollectiveError
from .primitives import REDUCE_UFUNC, Reduction
from .schedule import Schedule


@dataclass
class Execution:
    outputs: list[np.ndarray | None]
    bytes_sent: np.ndarray
    bytes_received: np.ndarray
    steps: int


def execute(
    schedule: Schedule, inputs: list[np.ndarray], reduction: Reduction = Reduction.SUM, observe=None
) -> Execution:
    """Execute ``schedule`` on ``inputs[r]`` (rank r's send buffer) and read every rank's output.

    ``observe(step, state, transfers)``, if given, sees the (holders x slots x width) state before the
    first step (step -1, no transfers) and after every step: the schedule view of the web page uses it."""
    n = schedule.num_ranks
    if len(inputs) != n:
        raise CollectiveError("inputs", f"need one buffer per rank: {len(inputs)} buffers for {n} ranks")
    layout = schedule.layout
    slot_elems = layout.slot_elems
    num_slots = len(slot_elems)
    width = int(slot_elems.max(initial=0))
    dtype = inputs[0].dtype
    state = np.zeros((n + schedule.num_virtual, num_slots, width), dtype=dtype)
    maps = _SlotMaps(slot_elems)
    for rank, buffer in enumerate(inputs):
        maps.load(state[rank], layout.input_slots(rank), buffer)

    flat = state.reshape(state.shape[0] * num_slots, width)
    ufunc = REDUCE_UFUNC[reduction]
    slot_bytes = slot_elems * schedule.itemsize
    holders = n + schedule.num_virtual
    sent = np.zeros(holders, dtype=np.int64)
    received = np.zeros(holders, dtype=np.int64)
    scratch = _Scratch(width, dtype)
    steps = 0
    if observe:
        observe(-1, state, ())
    for index, step in enumerate(schedule.steps()):
        # Read every source first: transfers of one step see the state before the step.
        staged = [(t, scratch.take(flat, t.src * num_slots + t.src_slot, i)) for i, t in enumerate(step.transfers)]
        wire = False
        for t, values in staged:
            _write(flat, t.dst * num_slots + t.dst_slot, values, t.reduce, ufunc, scratch)
            remote = t.src != t.dst
            if remote.any():
                wire = True
                np.add.at(sent, t.src[remote], slot_bytes[t.src_slot[remote]])
                np.add.at(received, t.dst[remote], slot_bytes[t.dst_slot[remote]])
        steps += wire
        if observe:
            observe(index, state, step.transfers)

    outputs = [maps.read(state[r], layout.output_slots(r)) for r in range(n)]
    if reduction is Reduction.AVG:
        outputs = [None if o is None else (o / n).astype(dtype) for o in outputs]
    return Execution(outputs, sent[:n], received[:n], steps)


class _Scratch:
    """Step buffers reused across steps: a fresh multi-megabyte array per step costs more in page faults
    than the copy itself."""

    def __init__(self, width: int, dtype):
        self.width, self.dtype, self.buffers = width, dtype, {}

    def get(self, rows: int, key) -> np.ndarray:
        buf = self.buffers.get(key)
        if buf is None or buf.shape[0] < rows:
            buf = self.buffers[key] = np.empty((rows, self.width), dtype=self.dtype)
        return buf[:rows]

    def take(self, flat: np.ndarray, rows: np.ndarray, index: int) -> np.ndarray:
        return np.take(flat, rows, axis=0, out=self.get(len(rows), ("staged", index)))


def _write(flat, target, values, reduce: bool, ufunc, scratch: _Scratch) -> None:
    if not reduce:
        flat[target] = values
    elif len(np.unique(target)) == len(target):
        current = np.take(flat, target, axis=0, out=scratch.get(len(target), "current"))
        ufunc(current, values, out=current)
        flat[target] = current
    else:
        # Several transfers reduce into one slot in the same step (a tree node hearing two children).
        ufunc.at(flat, target, values)


class _SlotMaps:
    """Vectorised copies between a flat buffer and a rank's padded (slots x width) state."""

    def __init__(self, slot_elems: np.ndarray):
        self.slot_elems = slot_elems
        self.width = int(slot_elems.max(initial=0))
        self.cache: dict[bytes, tuple] = {}

    def _map(self, slots: np.ndarray):
        key = slots.tobytes()
        if key not in self.cache:
            sizes = self.slot_elems[slots]
            starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
            column = np.arange(self.width)
            valid = column[None, :] < sizes[:, None]
            uniform = bool(valid.all()) and np.array_equal(slots, np.arange(len(slots)))
            self.cache[key] = (starts[:, None] + column[None, :], valid, int(sizes.sum()), uniform)
        return self.cache[key]

    def load(self, rank_state: np.ndarray, slots, buffer: np.ndarray) -> None:
        if slots is None or len(slots) == 0:
            return
        positions, valid, total, uniform = self._map(slots)
        if uniform:
            rank_state[: len(slots)] = buffer[:total].reshape(len(slots), self.width)
            return
        rows = rank_state[slots]
        rows[valid] = buffer[positions[valid]]
        rank_state[slots] = rows

    def read(self, rank_state: np.ndarray, slots) -> np.ndarray | None:
        if slots is None:
            return None
        if len(slots) == 0:
            return np.zeros(0, dtype=rank_state.dtype)
        _, valid, _, uniform = self._map(slots)
        if uniform:
            return rank_state[: len(slots)].reshape(-1)
        return rank_state[slots][valid]
