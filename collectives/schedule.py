"""Schedules: ordered steps of concurrent point-to-point transfers between buffer slots.

Every rank's buffer is cut into *slots* (``Layout.slot_elems``, the same cut on every rank). A transfer moves
the content of slot ``src_slot`` on rank ``src`` into slot ``dst_slot`` on rank ``dst``, either copying or
reducing (combining with what is there). All transfers of a step read the state *before* the step and write
after it, as concurrent sends and receives do. A transfer with ``src == dst`` is a local copy: it moves no
bytes over the wire and a step made only of local copies is not counted as a communication step.

Ranks are *positions in the group* (0..n-1, in the order the group is laid out); pricing maps them to
devices. In-network reduction adds ``num_virtual`` extra buffer holders after the n ranks (the switch).

Two views of the same schedule:

- :meth:`Schedule.steps` yields every step with vectorised transfer arrays: what the executor runs.
- :meth:`Schedule.step_classes` groups steps with the same (src, dst) pattern into a :class:`StepClass`
  with a repeat count and the bytes each transfer carries summed over the repeats: what counting and
  pricing use. Regular algorithms produce it in closed form (O(n) numpy work for a ring of any length);
  the others compress :meth:`steps`. Tests check the two views agree for every n up to 64.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from .primitives import Op


def _ints(values) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(values, dtype=np.int64).ravel())


@dataclass(frozen=True)
class Transfers:
    """A vectorised set of transfers of one step: entry i moves ``src_slot[i]`` of ``src[i]`` to
    ``dst_slot[i]`` of ``dst[i]``."""

    src: np.ndarray
    dst: np.ndarray
    src_slot: np.ndarray
    dst_slot: np.ndarray
    reduce: bool

    @classmethod
    def of(cls, src, dst, src_slot, dst_slot, reduce: bool) -> Transfers:
        arrays = np.broadcast_arrays(*(np.asarray(a, dtype=np.int64) for a in (src, dst, src_slot, dst_slot)))
        return cls(*(_ints(a) for a in arrays), reduce)

    def __len__(self) -> int:
        return len(self.src)


@dataclass(frozen=True)
class Step:
    transfers: tuple[Transfers, ...]

    @classmethod
    def of(cls, *transfers: Transfers) -> Step:
        return cls(tuple(t for t in transfers if len(t)))


@dataclass(frozen=True)
class StepClass:
    """``repeat`` steps that all carry transfers between the same (src, dst) pairs.

    ``nbytes[i]`` is what entry i carries summed over the ``repeat`` steps; local copies are left out.
    """

    repeat: int
    src: np.ndarray
    dst: np.ndarray
    nbytes: np.ndarray
    label: str = ""
    # An all-pairs class (a full mesh's step: every rank sends to every other rank at once) keeps n-long
    # vectors instead of its n(n-1) transfers: pair (i, j), i != j, carries out_bytes[i] + in_bytes[j] over
    # the repeats, for every i, j in the same block (``blocks[i] == blocks[j]``: the nodes or the rails of a
    # two-level all-to-all; one block: every pair). src, dst and nbytes are then empty; :meth:`expanded`
    # materialises them (tests).
    all_pairs: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    @classmethod
    def every_pair(
        cls, repeat: int, out_bytes: np.ndarray, in_bytes: np.ndarray, blocks=None, label: str = "all pairs"
    ):
        empty = np.zeros(0, dtype=np.int64)
        blocks = np.zeros(len(out_bytes), dtype=np.int64) if blocks is None else blocks
        return cls(repeat, empty, empty, empty, label, (_ints(out_bytes), _ints(in_bytes), _ints(blocks)))

    def expanded(self) -> StepClass:
        """The same class with every transfer listed (n(n-1) of them for an all-pairs class of one block)."""
        if self.all_pairs is None:
            return self
        out, into, blocks = self.all_pairs
        src, dst = np.nonzero((blocks[:, None] == blocks[None, :]) & ~np.eye(len(out), dtype=bool))
        return StepClass(self.repeat, _ints(src), _ints(dst), out[src] + into[dst], self.label)

    def block_sums(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per rank of an all-pairs class: its block's size, and the block's sums of out and in bytes."""
        out, into, blocks = self.all_pairs
        _, inverse, size = np.unique(blocks, return_inverse=True, return_counts=True)
        return size[inverse], np.bincount(inverse, out)[inverse], np.bincount(inverse, into)[inverse]

    def wire(self, holders: int) -> tuple[np.ndarray, np.ndarray]:
        """Bytes each holder sends and receives in this class, over its repeats."""
        sent = np.zeros(holders, dtype=np.int64)
        received = np.zeros(holders, dtype=np.int64)
        if self.all_pairs is not None:
            out, into, _ = self.all_pairs
            n = len(out)
            size, total_out, total_in = (np.rint(x).astype(np.int64) for x in self.block_sums())
            sent[:n] = (size - 1) * out + (total_in - into)
            received[:n] = (total_out - out) + (size - 1) * into
        else:
            np.add.at(sent, self.src, self.nbytes)
            np.add.at(received, self.dst, self.nbytes)
        return sent, received


@dataclass(frozen=True)
class Layout:
    """How the primitive's buffers map onto slots.

    ``input_slots(r)`` lists the slots rank r's send buffer fills, in buffer order (``None``: r has no
    input, as non-roots of broadcast); ``output_slots(r)`` the slots its result is read from (``None``:
    undefined, as non-roots of reduce).
    """

    slot_elems: np.ndarray
    input_slots: Callable[[int], np.ndarray | None]
    output_slots: Callable[[int], np.ndarray | None]


@dataclass
class Schedule:
    """``make_steps()`` yields the steps; ``make_classes(slot_bytes)``, where an algorithm knows its step
    classes in closed form, builds them directly (otherwise they are compressed from the steps)."""

    op: Op
    algorithm: str
    num_ranks: int
    count: int
    itemsize: int
    layout: Layout
    make_steps: Callable[[], Iterator[Step]]
    make_classes: Callable[[np.ndarray], list[StepClass]] | None = None
    num_virtual: int = 0
    root: int = 0
    _cached_classes: list[StepClass] | None = field(default=None, repr=False)
    _cached_wire: tuple[np.ndarray, np.ndarray] | None = field(default=None, repr=False, compare=False)

    @property
    def slot_bytes(self) -> np.ndarray:
        return self.layout.slot_elems * self.itemsize

    @property
    def message_bytes(self) -> int:
        return self.count * self.itemsize

    def steps(self) -> Iterator[Step]:
        return self.make_steps()

    def step_classes(self) -> list[StepClass]:
        if self._cached_classes is None:
            made = self.make_classes(self.slot_bytes) if self.make_classes else compress(self.steps(), self.slot_bytes)
            self._cached_classes = [c for c in made if c.repeat > 0]
        return self._cached_classes

    @property
    def num_steps(self) -> int:
        return sum(c.repeat for c in self.step_classes())

    def wire_bytes(self) -> tuple[np.ndarray, np.ndarray]:
        """Bytes each rank sends and receives over the whole schedule (virtual holders excluded); computed once
        per schedule (the pricers keep schedules by value: select.cached_schedule), read-only."""
        if self._cached_wire is None:
            sent, received = self._wire_bytes()
            sent.flags.writeable = received.flags.writeable = False
            self._cached_wire = (sent, received)
        return self._cached_wire

    def _wire_bytes(self) -> tuple[np.ndarray, np.ndarray]:
        holders = self.num_ranks + self.num_virtual
        sent = np.zeros(holders, dtype=np.int64)
        received = np.zeros(holders, dtype=np.int64)
        for c in self.step_classes():
            out, into = c.wire(holders)
            sent += out
            received += into
        return sent[: self.num_ranks], received[: self.num_ranks]


def compress(steps: Iterator[Step], slot_bytes: np.ndarray) -> list[StepClass]:
    """Group steps by their (src, dst) pattern; the generic way to get step classes from any schedule.
    Transfers of one step between the same two holders are summed (pricing sees links, not slots)."""
    classes: dict[bytes, list] = {}
    for step in steps:
        wire = [_wire_part(t, slot_bytes) for t in step.transfers]
        wire = [w for w in wire if len(w[0])]
        if not wire:
            continue
        src, dst, nbytes = _per_pair(
            np.concatenate([w[0] for w in wire]),
            np.concatenate([w[1] for w in wire]),
            np.concatenate([w[2] for w in wire]),
        )
        key = src.tobytes() + b"|" + dst.tobytes()
        if key in classes:
            classes[key][0] += 1
            classes[key][3] = classes[key][3] + nbytes
        else:
            classes[key] = [1, src, dst, nbytes]
    return [StepClass(repeat, src, dst, nbytes) for repeat, src, dst, nbytes in classes.values()]


def _per_pair(src: np.ndarray, dst: np.ndarray, nbytes: np.ndarray):
    span = int(max(src.max(), dst.max())) + 1
    pairs, inverse = np.unique(src * span + dst, return_inverse=True)
    return pairs // span, pairs % span, np.bincount(inverse, nbytes, len(pairs)).astype(np.int64)


def _wire_part(t: Transfers, slot_bytes: np.ndarray):
    remote = t.src != t.dst
    return t.src[remote], t.dst[remote], slot_bytes[t.src_slot[remote]]


def merge(classes: list[StepClass], label: str = "pipelined") -> list[StepClass]:
    """One class for a pipelined schedule: its steps overlap on different links, so it is charged every
    step's latency but only the busiest link's total bytes (the steady-state bound)."""
    if not classes:
        return []
    return [
        StepClass(
            sum(c.repeat for c in classes),
            np.concatenate([c.src for c in classes]),
            np.concatenate([c.dst for c in classes]),
            np.concatenate([c.nbytes for c in classes]),
            label,
        )
    ]
