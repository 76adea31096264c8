"""DeepSpeed's pipeline engine as it runs (planner/flavours/deepspeed.py; step.unbatched_wait; rules/pipeline.py
_regathers), against its source: deepspeed/runtime/pipe/schedule.py TrainSchedule and pipe/engine.py at edaa722 (the
flavour's DeepSpeed 0.19.6) and cd7967d6b (2021-10-09, the engine of MT-NLG's time; the same but for the order of
the two transfers inside a step).

- The TrainSchedule, replayed instruction by instruction with each transfer blocking both ends (p2p.send/recv:
  dist.send, or dist.broadcast over a 2-rank group), takes exactly 1F1B's (m + p - 1)(F + B) when transfers are
  free: its even/odd alternation adds no bubble. Each transfer of c seconds adds 4 c a steady-state micro-batch
  (RecvActivation, SendGrad, SendActivation, RecvGrad each on the path), where 1F1B's batched exchanges add 2 c.
- With TP, each rank sends its 1/t partition (pipe_partitioned, grad_partitioned: runtime/config.py defaults True),
  the receiver all-gathers it (PartitionedTensor.full), and the sender re-gathers its own output before the backward.
"""

from dataclasses import replace

import pytest

from collectives.topology import cluster_preset
from planner import Options, ParallelSpec, WorkloadSpec, build_plan, model_preset
from planner.flavours.deepspeed import FLAVOUR as DEEPSPEED
from planner.pipeline import Schedule, StagePass, pipeline_time, steady_wait
from tests.flavour_variants import flavour_variant


def _train_schedule(m: int, p: int, s: int, edaa722: bool) -> list[tuple[str, int]]:
    """TrainSchedule.steps() for stage s, reduced to its transfers and passes (schedule.py _step_to_micro_batch and
    its four id maps, transcribed). cd7967d6b orders a forward step RecvActivation, SendGrad and a backward step
    SendActivation, RecvGrad; edaa722 SendGrad, RecvActivation and RecvGrad, SendActivation."""
    out, prev = [], -1

    def valid(mb):
        return 0 <= mb < m

    for k in range(2 * (m + p - 1)):
        if k % 2 == 0 and s % 2 == 0:
            mb, fwd = k // 2 - s // 2, True
        elif k % 2 == 1 and s % 2 == 1:
            mb, fwd = (k - 1) // 2 - s // 2, True
        elif k % 2 == 0:
            mb, fwd = k // 2 - p + (s + 1) // 2, False
        else:
            mb, fwd = (k - 1) // 2 - p + 1 + s // 2, False
        if fwd and s > 0:
            cmds = [("recv_act", mb, valid(mb)), ("send_grad", prev, valid(prev))]
        elif not fwd and s < p - 1:
            cmds = [("send_act", prev, valid(prev)), ("recv_grad", mb, valid(mb))]
        else:
            cmds = []
        if edaa722:
            cmds.reverse()
        out += [(name, x) for name, x, ok in cmds if ok]
        if valid(mb):
            out.append(("F" if fwd else "B", mb))
        prev = mb
    return out


_PARTNER = {"send_act": (1, "recv_act"), "recv_act": (-1, "send_act"), "send_grad": (-1, "recv_grad")}
_PARTNER["recv_grad"] = (1, "send_grad")


def _replay(m: int, p: int, f: float, b: float, c: float, edaa722: bool = True) -> float:
    """Every stage runs its instructions in order on one stream; a transfer starts when both ends reach it and
    holds both for c seconds. Returns the last stage's end."""
    progs = [_train_schedule(m, p, s, edaa722) for s in range(p)]
    pc, t = [0] * p, [0.0] * p
    while any(pc[s] < len(progs[s]) for s in range(p)):
        moved = False
        for s in range(p):
            while pc[s] < len(progs[s]):
                op, mb = progs[s][pc[s]]
                if op in ("F", "B"):
                    t[s] += f if op == "F" else b
                    pc[s] += 1
                    moved = True
                    continue
                step, want = _PARTNER[op]
                q = s + step
                if pc[q] < len(progs[q]) and progs[q][pc[q]] == (want, mb):
                    t[s] = t[q] = max(t[s], t[q]) + c
                    pc[s] += 1
                    pc[q] += 1
                    moved = True
                    continue
                break
        assert moved, "deadlock"
    return max(t)


@pytest.mark.parametrize("edaa722", [True, False])
@pytest.mark.parametrize(("m", "p", "f", "b"), [(8, 4, 1.0, 2.0), (16, 4, 1.0, 3.0), (240, 35, 1.0, 3.0), (7, 5, 2, 3)])
def test_train_schedule_is_1f1b_when_transfers_are_free(m, p, f, b, edaa722):
    """The alternation of forward and backward steps between even and odd stages costs nothing: the replay ends at
    (m + p - 1)(F + B), what the planner's 1F1B gives (MT-NLG's 240 micro-batches on 35 stages included)."""
    planned = pipeline_time([StagePass(f, b)] * p, Schedule("1f1b", p, m)).time_s
    assert _replay(m, p, f, b, 0.0, edaa722) == pytest.approx(planned) == pytest.approx((m + p - 1) * (f + b))


@pytest.mark.parametrize("edaa722", [True, False])
def test_each_transfer_blocks_its_micro_batch(edaa722):
    """In the steady state a micro-batch takes F + B + 4 c (its four transfers one after another), where the
    planner's 1F1B takes F + B + 2 c: the slope of the replay over m is 4 c, steady_wait's unbatched_s."""
    p, f, b, c = 4, 1.0, 3.0, 0.05
    slope = (_replay(80, p, f, b, c, edaa722) - _replay(40, p, f, b, c, edaa722)) / 40
    assert slope == pytest.approx(f + b + 4 * c)
    assert steady_wait(Schedule("1f1b", p, 40, 1, c, False, 0.0, 4 * c)) == pytest.approx(4 * c)
    assert steady_wait(Schedule("1f1b", p, 40, 1, c)) == pytest.approx(2 * c)


# GPT-3 175B's width on 4 layers, TP8 x PP2 on two DGX A100 (the boundary crosses the nodes' NICs), 8 micro-batches
GPT = replace(model_preset("gpt3-175b"), num_layers=4)
WORK = WorkloadSpec(micro_batch_size=1, global_batch_size=8, activation_recompute="full")
A = 2048 * 12288 * 2  # one micro-batch's boundary tensor, s x b x h x 2 B


def _plan(framework: str):
    par = ParallelSpec(tp=8, pp=2, dp=1, pipeline_schedule="1f1b", framework=framework, zero_stage=1)
    return build_plan(GPT, WORK, par, cluster_preset("dgx-a100", 2), Options(timeline=False))


def _rows(plan):
    return {(pc.call.name, pc.call.stages): pc for pc in plan.calls if pc.call.name.startswith("pp.")}


@pytest.fixture
def batched():
    """DeepSpeed with Megatron-Core's 1F1B exchanges: its partitioned sends and gathers kept, its transfers batched."""
    with flavour_variant(DEEPSPEED, "ds-batched", pp_unbatched_transfers=False) as name:
        yield name


def test_deepspeed_partitions_and_gathers():
    """Per micro-batch (8): stage 0 sends A/8 forward and re-gathers its A before the backward; stage 1 gathers the
    received A and sends A/8 back, which stage 0 gathers: each gather's message the whole A (its output)."""
    rows = _rows(_plan("deepspeed"))
    got = {
        k: (c.call.op.value, c.call.phase, c.call.message_bytes, c.call.calls_per_iteration) for k, c in rows.items()
    }
    assert got == {
        ("pp.activation", (0,)): ("sendrecv", "forward", A // 8, 8),
        ("pp.gather", (1,)): ("allgather", "forward", A, 8),
        ("pp.activation_grad", (1,)): ("sendrecv", "backward", A // 8, 8),
        ("pp.gather_grad", (0,)): ("allgather", "backward", A, 8),
        ("pp.gather_output", (0,)): ("allgather", "backward", A, 8),
    }
    assert all(rows[k].call.group.dims == ("tp",) for k in rows if "gather" in k[0])
    # Megatron-Core sends the whole tensor and gathers nothing
    core = {k: pc.call.message_bytes for k, pc in _rows(_plan("megatron")).items()}
    assert core == {("pp.activation", (0,)): A, ("pp.activation_grad", (1,)): A}


def test_deepspeed_waits_on_four_transfers_and_three_gathers(batched):
    """The same ledger, priced the same; the steady state waits 4 s + 3 g a micro-batch against the batched 2 (s + g)
    (s the A/8 send, g one TP gather of A, both the ledger's own prices): the step is 8 (2 s + g) longer, and the
    fill's 2 (p - 1)(s + g) is the same in both."""
    ds, one = _plan("deepspeed"), _plan(batched)
    rows = _rows(ds)
    s, g = rows["pp.activation", (0,)].price.time_s, rows["pp.gather", (1,)].price.time_s
    assert s > 1e-4 and g > 1e-4  # 6.3 MB over an HDR NIC; a 50 MB all-gather over NVLink
    assert {k: pc.price.time_s for k, pc in rows.items()} == {k: pc.price.time_s for k, pc in _rows(one).items()}
    assert ds.step.time_s - one.step.time_s == pytest.approx(8 * (4 * s + 3 * g - 2 * (s + g)), rel=1e-9)


def test_unbatched_wait_is_per_chunk():
    """DeepSpeed runs no interleaved schedule, but the planner accepts one under the flavour: each of the v chunks'
    forward and backward then carries its own four transfers, v times the 1F1B wait (as the two-way exchange is)."""
    c, x = 0.01, 0.07
    assert steady_wait(Schedule("interleaved", 4, 8, 3, c, False, 0.0, x)) == pytest.approx(3 * x)
    assert steady_wait(Schedule("interleaved", 4, 8, 3, c, True, 0.0, x)) == 0.0
