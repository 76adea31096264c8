"""Every schedule's closed forms on a grid of (pp, m, v) and uneven stages, pinned bit for bit: the digest was
recorded on main at 9c24664, before the schedule facts moved into planner/pipeline.py's traits table. A change to
any bubble, in-flight count, warm-up count or timeline block of any schedule changes the digest (an intended
formula change re-records it, and says why). Re-recorded by bubble11: ZBV's, DualPipe's and DualPipeV's bubbles
from their own orders (pipeline.py _bubble_zbv, _bubble_dualpipev, _bubble_dualpipe) moved their 495 rows at p >= 2
(DualPipe p >= 3): times, bubbles, drain leads and timeline blocks, nothing else; ZB-H1's moved only at m < p
(72 rows: each missing micro-batch's min(W, B - W)), its max(F, B - W, F + B - 2W) being F + B - 2W on this grid
(diffed against main at 67d207f). Re-recorded by vsched12: the four schedules' pipelines at these unequal ranks (and
rank 0's own chunk split) from their orders' list schedules (planner/pipeline_jitter.py order_span) moved 126 rows,
only where the order runs (the schedule's own v, DualPipe(V)'s even m >= 2p): ZB-H1 54 (-6.10% to -0.46% of the
time), ZBV 60 (-5.48% to +1.38%), DualPipeV 9 (-3.34% to -2.14%), DualPipe 3 (-5.30% to -5.20%); no other schedule's
row moved (diffed against main at 62a660b). Re-recorded by dualpipe13 (DualPipe's own layout, pipeline.StageMap
MIRRORED: each rank's two chunks whole stages, one a micro-batch): DualPipe's 225 rows moved and no other schedule's
(diffed against main at bf53d25): its in-flight counts halve (PP + 1 stages' activations in units of the rank's two
stages), and where its order runs with rank 0's own fill and drain (pp 2 and 4, m 8, v 2: 6 rows) those are the
stages each direction runs, time +1.9% to +2.1%. Re-recorded by mend13a (review r13a #1): DualPipe's in-flight counts
by chunk follow its order, pp - r micro-batches of stage r and r + 1 of stage pp - 1 - r (in_flight_chunks; min with
m / 2), where they were (PP + 1)/2 of each: 201 DualPipe rows moved in those values only, every time, busy, bubble and
drain-lead value and every other schedule's row bit for bit (diffed against main at 2ed45fa)."""

import hashlib

import pytest

from planner._errors import SpecError
from planner.parallel import SCHEDULES
from planner.pipeline import (
    SCHEDULE_TRAITS,
    Schedule,
    ScheduleTraits,
    StagePass,
    drain_leads,
    in_flight,
    in_flight_chunks,
    pipeline_time,
    register,
    timeline,
    warmup_microbatches,
)

KINDS = ("gpipe", "1f1b", "interleaved", "zb-h1", "zbv", "dualpipe", "dualpipev")
RECORDED = "f02eff2602e6a6bf92bab089b80c821086339401ef467a6fe5196b5ac396ede3"


def _passes(p: int) -> list[StagePass]:
    """Uneven stages (the last slowest), a weight-gradient share, and rank 0 with its own fill/drain."""
    out = [StagePass(1.0 + 0.125 * s, 2.0 + 0.25 * s, weight_s=0.5 + 0.0625 * s) for s in range(p)]
    out[0] = StagePass(1.5, 2.5, fill_s=0.75, drain_s=1.25, weight_s=0.375)
    return out


def _grid() -> str:
    rows = []
    for kind in KINDS:
        for p in (1, 2, 3, 4, 8):
            for m in (1, 2, 5, 8, 33):
                for v in (1, 2, 3):
                    for c, overlap in ((0.0, False), (0.03125, False), (0.03125, True)):
                        sched = Schedule(kind, p, m, v, c, overlap)
                        passes = _passes(p)
                        t = pipeline_time(passes, sched)
                        vals = [t.time_s, *t.busy_s, *t.bubble_s, *drain_leads(passes, sched)]
                        for s in range(p):
                            vals += [warmup_microbatches(sched, s), in_flight(sched, s), *in_flight_chunks(sched, s)]
                        if v == 1 and m <= 8:
                            for e in timeline(passes, sched, 0.5):
                                vals += [e["stage"], e["microbatch"], e["microbatches"], e["start_s"], e["end_s"]]
                                rows.append(e["name"])
                        rows.append(f"{kind} {p} {m} {v} {c} {overlap}: " + " ".join(float(x).hex() for x in vals))
    return "\n".join(rows)


def test_every_schedule_on_the_grid_is_unchanged():
    assert hashlib.sha256(_grid().encode()).hexdigest() == RECORDED


def test_the_grid_tells_schedules_apart():
    """The digest is of distinct answers: no two schedules give the same values on this grid."""
    lines = [r.split(": ", 1) for r in _grid().splitlines() if ": " in r]
    by_kind: dict[str, list[str]] = {}
    for head, vals in lines:
        by_kind.setdefault(head.split()[0], []).append(vals)
    assert len({tuple(v) for v in by_kind.values()}) == len(KINDS)


def test_every_schedule_the_planner_takes_has_its_traits():
    assert tuple(SCHEDULE_TRAITS) == SCHEDULES
    assert SCHEDULES == ("1f1b", "interleaved", "gpipe", "zb-h1", "zbv", "dualpipe", "dualpipev")


def test_a_toy_schedule_is_one_entry():
    """A schedule registered here, in the test only, is read by every function: no bubble, three warm-up
    forwards and two micro-batches held per rank, per chunk alike."""
    toy = register(ScheduleTraits("toy", lambda others, s: 0.0, lambda s, stage: 3, lambda s, stage: 2.0))
    try:
        sched = Schedule("toy", 4, 8, 2)
        passes = [StagePass(1.0, 2.0)] * 3 + [StagePass(1.5, 2.5)]
        assert sched.traits is toy
        assert pipeline_time(passes, sched).time_s == 8 * 4.0  # m·t_max and nothing else
        assert [warmup_microbatches(sched, s) for s in range(4)] == [3] * 4
        assert in_flight_chunks(sched, 1) == (2.0, 2.0)
    finally:
        del SCHEDULE_TRAITS["toy"]


def test_an_unknown_schedule_is_a_spec_error():
    with pytest.raises(SpecError) as err:
        in_flight(Schedule("zb-h2", 4, 8), 0)
    assert err.value.field == "parallel.pipeline_schedule" and "'zb-h2'" in str(err.value)
    assert "known: 1f1b, interleaved, gpipe, zb-h1, zbv, dualpipe, dualpipev" in str(err.value)
