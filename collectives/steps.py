"""The schedule view: every transfer of every step of an algorithm on a small group, and after each step which
ranks' data each slot holds (executed with rank r contributing 2^r, so a slot's value is the set of ranks it
sums). POST /v1/collectives/schedule answers it; the page animates it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._errors import CollectiveError
from .executor import execute
from .schedule import Schedule
from .verify import verify_inputs

MAX_VIEW_STEPS = 256  # steps the view shows at most
TRANSFER = ("src", "dst", "src_slot", "dst_slot", "bytes", "reduce")  # what a step's transfer says


@dataclass(frozen=True)
class StepView:
    transfers: list[dict]  # src, dst, src_slot, dst_slot, bytes, reduce (TRANSFER)
    holds: list[list[list[int]]]  # after the step: holds[holder][slot] = ranks whose data the slot contains


@dataclass(frozen=True)
class ScheduleView:
    """What executing ``schedule`` showed: the holds before the first step, then every step."""

    schedule: Schedule
    initial: list[list[list[int]]]
    steps: list[StepView]


def schedule_view(sched: Schedule) -> ScheduleView:
    """Execute ``sched`` with rank r contributing 2^r and record every step (at most MAX_VIEW_STEPS)."""
    if sched.num_steps > MAX_VIEW_STEPS:
        raise CollectiveError("num_ranks", f"{sched.num_steps} steps; the step view shows at most {MAX_VIEW_STEPS}")
    n = sched.num_ranks
    inputs = [np.full(len(x), 1 << r, dtype=np.int64) for r, x in enumerate(verify_inputs(sched.op, n, sched.count))]
    frames: list[StepView] = []
    initial: list = []
    slot_bytes = sched.slot_bytes

    def observe(step, state, transfers):
        holds = [
            [_ranks(state[h, s, 0]) if sched.layout.slot_elems[s] else [] for s in range(state.shape[1])]
            for h in range(state.shape[0])
        ]
        if step < 0:
            initial.extend(holds)
            return
        moved = [
            dict(zip(TRANSFER, (int(a), int(b), int(c), int(d), int(slot_bytes[c]), t.reduce), strict=True))
            for t in transfers
            for a, b, c, d in zip(t.src, t.dst, t.src_slot, t.dst_slot, strict=True)
        ]
        frames.append(StepView(moved, holds))

    execute(sched, inputs, observe=observe)
    return ScheduleView(sched, initial, frames)


def _ranks(mask) -> list[int]:
    mask = int(mask)
    return [r for r in range(mask.bit_length()) if mask >> r & 1]
