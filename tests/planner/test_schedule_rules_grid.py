"""The schedule rules outside planner/pipeline.py (validation in planner/parallel.py, the step's EP overlap
default, the p2p ledger rule, torch's pass order, DualPipe's two copies of the model), pinned on a grid of (schedule,
framework, pp, v, m, layout): each bad request's SpecError field and message byte for byte, each good one's
plan (calls, prices, step time, memory). The digest is main's code at ee0d38e, before those facts moved into
the ScheduleTraits table (first recorded at 0813324; the moemech merge then moved MoE step times; the kern4
merge moved step and call times only: every error, call, byte count and memory peak is the same as at ddc1eb0; kern5's
torch._grouped_mm rows and k0 moved 128 of the 11,542 lines' step and call times, nothing else; kern6's
torchtitan fp32 score multiply moved the same 128 torch-flavour step lines, +0% to +1.0%, nothing else; nvl5's
NVLink domain latency scale on the intra-node legs of multi-node calls moved 314 lines' call and step times,
e.g. the 16-rank dp.grad_norm allreduce on two DGX H100 nodes 25.2 -> 36.6 us, nothing else; polish6's wording of
the interleaved schedule's micro-batch rule changed 8 error lines' text, same field, nothing else; titan's FSDP2
copies on the compute stream and pass-end gather / reduce-scatter moved the 128 torch-flavour step lines, +0% to
+16.7% (gpipe pp 4, m 3: 8 gathers of the 2.8 GB expert unit per forward, each copied out), nothing else;
layouts6's final-norm and output-layer saved inputs moved 309 memory lines, nothing else: the loss stage + one
[4096, 1, 4096] bf16 row / tp 4 (8,388,608 B) for the output layer's input and one per micro-batch in flight of
the final norm's chunk, e.g. 1F1B +16,777,216 B, interleaved with 4 in flight of the last chunk +41,943,040 B);
moe9's alltoall-dispatcher preprocess launches (11 a Megatron MoE layer forward at ep 2) moved 181 lines, every one
of them float times only (checked token by token against main at 907faca), nothing else; then its routed
probabilities' own all-to-all (token_dispatch's permuted_probs, forward and backward) added 362 call lines (181
ep.dispatch.probs and 181 ep.dispatch.probs.bwd, 2 B a routed row over the EP group) and moved float times, no
line removed and no other text changed; titan7's torch optimizer step (fused torch.optim.AdamW 28 B +
torchtitan's grad clipping 12 B a local parameter, for the fused Adam's 34) moved the 128 torch-flavour step
lines' compute, +0% to +10.7%, nothing else; and its loss over the whole vocabulary where torch gathers the
logits (tp > 1 without loss parallelism: 32,000 for Mixtral's 16,000 a rank at tp 2) moved 124 of them, step
+0.06% to +1.6% (exposed TP down as compute grew), nothing else. embed7's main embedding lookup on the first
stage moved 291 plans' step times (+0% to +0.67%, dualpipe pp 4 v 2 m 8 the most) and GPipe's losses in flight
(pipeline.losses_in_flight: every micro-batch's logits held) the 62 gpipe plans' last-stage memory by (m - 1) x
the loss's bytes (Megatron 140,509,184 B: the fp32 [4096, 8064] softmax + the head's [4096, 1, 4096] / 4 bf16
input; torch 165,675,008 B), nothing else (checked line by line against main at eab465a). p2psm's p2p SMs
(NCCL's p2p CTAs held beside the compute) moved 39 step lines, nothing else (checked line by line against main at
57f7644): the 15 Megatron interleaved plans under overlap_p2p +0.03% to +0.07% (a send and a recv kernel beside
each pass), the 24 Megatron dualpipe / dualpipev plans +0.46% to +0.51% (their EP all-to-alls hidden by the F&B
overlap hold 32 CTAs). titan8's DTensor
sequence-dim copies (torch's TP reduce-scatter inputs re-laid by torch.cat on the compute stream; at b 1 the
gathers are views) and torch's unpadded head (Mixtral's 32,000 / 4 = 8,000 columns a rank, not 8,064) moved the
128 torch-flavour step lines' float times only, step +0% to +0.54%, nothing else (checked line by line against
main at 57f7644 and again at c4def91). gptoss8's weighted
activation backward (Megatron's probs' gradient sum, a kernel of its own: kernels.WEIGHTED_ACT_GRAD) moved float
times only, 181 step lines of Mixtral's Megatron plans (checked token by token against main at 3f9aedf).
moehost's two queues for a Megatron MoE layer that syncs (planner/host.py) moved 181 step lines (ep 2: -1.5% to
-2.5%), float times only (checked token by token against main at 9532726), nothing else.
The lead's review-r8c fixes and tidy8's StageStep.lengthen moved 27 step lines by at most 2.7e-15 relative (the
same sums in another order), checked token by token against main at e9ad9cd.
small9's Megatron-Core optimizer step (38 B a shard parameter for the fused Adam's 34, and the whole local fp32
gradient buffer zeroed every iteration, 4 B a local parameter: kernels.grad_buffer_bytes) moved the 181 Megatron
plans' step lines, float times only (time and compute; bubble in 70, exposed communication in 2), step +0.62% to
+5.43%, nothing else (checked token by token against main at c36d7be).
bubble11's bubbles from the schedules' own orders (planner/pipeline.py) moved 80 step lines' time and bubble only
(checked token by token against main at 67d207f): ZBV 38 (+0.34% to +85.2%, the most at m 1 < pp 4, where no
steady state hides the V's fill), ZB-H1 18 at m < pp (+1.8% to +17.8%), DualPipeV 18 (-2.55% to -0.40%) and DualPipe
6 (-2.28% to -0.73%), nothing else.
vsched12's pipelines of ZB-H1, ZBV, DualPipe(V) at unequal ranks from their own orders at each rank's and chunk's
times (planner/pipeline_jitter.py order_span) moved 128 step lines (checked case by case against main at 62a660b):
time and bubble in 120 (ZB-H1 56, -2.03% to -0.04%; ZBV 38, -3.69% to +8.28%, the most at m 3 < pp 4; DualPipeV 18,
-3.72% to +0.77%; DualPipe 8, -3.26% to +0.87%), and DualPipe at pp 2: torch's 2 bubble 0 -> 2.5 ms (+0.16%, the
closed form's (pp/2 - 1) share is 0 there) and Megatron's 6 by one ulp (time and exposed), nothing else.
sus12's Hopper clock by throughput (the grid's DGX H100: SUSTAINED_CLOCK 0.852 -> 0.825, bf16 GEMM and attention
time x 1.033) moved the 309 step lines (181 Megatron, 128 torch) in their float times only (time, compute, exposed
communication, bubble), step -0.16% to +2.11% (exposed communication shrinks where compute hides more of it), no
call, byte or memory line, nothing else (checked token by token against main at 6f6eed1).
dualpipe13's DualPipe layout (pipeline.StageMap MIRRORED: the model in pp stages held twice, rank r running stage r
one way and pp - 1 - r the other; review r12a #3) moved the 30 dualpipe cases and no other (checked case by case
against main at bf53d25): its layouts and split points name one copy's pp stages, so 14 cases swap error and plan
(a 2-point split or 2-stage layout at pp 2, a 4-stage one at pp 4 now plan; the 2·pp-stage ones are refused naming
the rule) and 4 error texts reworded; its 12 plans put the embedding and the head's calls on ranks 0 and pp - 1 at
m / 2 each, reduce and gather both stages' gradients and parameters over DP (2x the bytes: the V held one), hold the
optimizer states of both and PP + 1 stages' activations, step +3.5% to +7.9% (Megatron) and +10% to +29% (torch at
ZeRO-3, FSDP2's gathers now per stage pass: the forward's doubled), peak memory +36% to +48%, nothing else.
mend13a (review r13a #1, #5) moved 14 dualpipe cases and no other case (checked case by case against main at 2ed45fa):
the activations in flight by DualPipe's order (rank r: pp - r micro-batches of stage r, r + 1 of stage pp - 1 - r)
moved all 14 plans' end-rank peaks (-4,194,304 B at pp 2, -12,582,912 B on ranks 0 and 3 at pp 4: the loss stage
held once, not 1.5 or 2.5 times), and Megatron's attention-mask broadcast, once per micro-batch a rank runs at an end
(m on ranks 0 and pp - 1, as 1F1B), doubled its 8 plans' tp.data.attention_mask count: step +0.014% to +0.030%,
exposed communication +0.34% to +0.65%; nothing else (torch broadcasts no batch).
dualpipe13b's two copies' gradient sum (rules/data.py: the twins' dp replicas in one reduction group, Group.mirror;
FSDP2's reduced shards all-reduced across the copies) moved the 20 dualpipe plans and no other (checked case by case
against main at 63eef51): Megatron's 14 step +37.6% to +75.0% (Mixtral's expert gradients, expert_dp 1, now summed in
fp32 over the twin pair across nodes), torch's 6 +3.4% to +17.2%, nothing else.
spread15/mend15f's pace of the slowest GPU (planner/spread.py: each plan's clock-bound kernels on the slowest of its
8·pp H100s, x 1.021 to x 1.030 on the clock at sigma 1.48%) moved the 311 plans' step lines (183 Megatron, 128 torch)
in their float times only, step -0.17% to +1.94% (the 10 torch ZB-H1 / ZBV plans at m 1 a little faster: their
FSDP2 gathers' exposed time and the order's bubble shrink as the compute hides more), no call, byte, memory or error
line, nothing else: the grid at cluster.gpu.variability 0 gives a272178e6e00... as recorded before (fixB, checked
line by line against main at 2c963f6).
Flipping
any one schedule's trait (stage_map, interleaved, min_pp, even_pp, microbatch_rule, overlaps_ep, forwards_first,
source) changes it or raises. An intended change re-records it and says why."""

import hashlib

from collectives.topology import cluster_preset
from planner import Options, ParallelSpec, SpecError, WorkloadSpec, build_plan
from planner.parallel import SCHEDULES
from planner.pipeline import MIRRORED, SCHEDULE_TRAITS, ScheduleTraits, register
from planner.presets import model_preset

RECORDED = "656d2a8204b88e40c711c56d83a91165b7372ef115ef192f95a1589f9286c012"
MODEL = model_preset("mixtral-8x7b")  # 32 layers, 8 experts: ep = 2 gives the EP overlap something to hide
LAYOUTS = (
    {},
    {"pipeline_split_points": (16,)},
    {"pipeline_split_points": (8, 16, 24)},
    {"pipeline_split_points": (4, 8, 12, 16, 20, 24, 28)},
    {"pipeline_layout": "Et*8|t*8|t*8|t*8L"},
    {"pipeline_layout": "Et*16|t*16L"},
)


def _cases():
    for sched in SCHEDULES:
        for framework in ("megatron", "torch"):
            for pp in (1, 2, 3, 4):
                for v in (1, 2, 3):
                    for m in (1, 3, 4, 8):
                        for layout in LAYOUTS if framework == "megatron" and m == 8 else LAYOUTS[:1]:
                            yield sched, framework, pp, v, m, layout


def _answer(sched, framework, pp, v, m, layout) -> str:
    # torch at ZeRO-3 (FSDP2 with pipelining): its gathers follow the schedule's pass order (rules/data.py)
    dp, ep, zero = (2, 2, 1) if framework == "megatron" else (2, 1, 3)
    par = dict(tp=4, pp=pp, dp=dp, ep=ep, sequence_parallel=True, zero_stage=zero, framework=framework)
    par["pipeline_schedule"] = sched
    try:
        plan = build_plan(
            MODEL,
            WorkloadSpec(micro_batch_size=1, global_batch_size=m * dp),
            ParallelSpec(**par, virtual_pipeline_stages=v, **layout),
            cluster_preset("dgx-h100", pp),  # 8 GPUs a node: tp 4 x dp 2 per stage
            Options(timeline=False),
        )
    except SpecError as err:
        return f"error {err.field}: {err}"
    rows = [f"plan {plan.world_size} {plan.num_microbatches} {plan.num_stages}"]
    for pc in plan.calls:
        c = pc.call
        rows.append(
            f"{c.name} {c.phase} {c.message_bytes} {c.calls_per_iteration} {c.stages} {c.source} "
            f"{pc.num_groups} {pc.group_size} {float(pc.price.time_s).hex()}"
        )
    s = plan.step
    rows.append(" ".join(float(x).hex() for x in (s.time_s, s.compute_s, s.exposed_comm_s, s.bubble_s)))
    rows.append(" ".join(str(st.peak_bytes) for st in plan.memory.per_stage))
    return "\n".join(rows)


def _grid() -> list[str]:
    return [f"{case}: {_answer(*case)}" for case in _cases()]


def test_schedule_rules_on_the_grid_are_unchanged():
    assert hashlib.sha256("\n".join(_grid()).encode()).hexdigest() == RECORDED


def test_the_grid_holds_errors_and_plans_of_every_schedule():
    """A digest that cannot fail is no pin: every schedule gives both 422s and plans here, and the bad ones
    name the rules this test guards (the field of each is in the message's line)."""
    grid = _grid()
    for sched in SCHEDULES:
        mine = [g for g in grid if g.startswith(f"('{sched}'")]
        assert any(": plan " in g for g in mine) and any(": error " in g for g in mine), sched
    errors = "\n".join(g for g in grid if ": error " in g)
    for field in (
        "parallel.pipeline_schedule",
        "parallel.pp",
        "parallel.virtual_pipeline_stages",
        "workload.global_batch_size",
        "parallel.pipeline_split_points",
        "parallel.pipeline_layout",
    ):
        assert f"error {field}:" in errors, field


def test_a_toy_schedule_is_one_entry_for_the_planner_too():
    """A schedule registered in the test only is validated, laid out and priced from its traits alone: a V
    (2 chunks per rank, DualPipe's two copies: ``MIRRORED``) that needs pp >= 4 and an even pp, and sends half its
    micro-batches each way."""
    zbv = SCHEDULE_TRAITS["zbv"]
    toy = ScheduleTraits(
        "toy-v",
        zbv.bubble,
        zbv.warmup,
        zbv.in_flight,
        stage_map=MIRRORED,
        min_pp=4,
        even_pp="toy.py: even ranks",
        title="Toy",
        overlaps_ep=True,
        source="toy.py",
    )
    register(toy)
    try:
        assert _answer("toy-v", "megatron", 2, 1, 8, {}) == (
            "error parallel.pipeline_schedule: parallel.pipeline_schedule: toy-v is a pipeline schedule: it needs "
            "pp >= 4, got pp 2"
        )
        assert _answer("toy-v", "megatron", 5, 1, 8, {}) == (
            "error parallel.pp: parallel.pp: Toy needs an even pp (toy.py: even ranks), got pp 5"
        )
        assert "runs exactly 2 chunks per rank" in _answer("toy-v", "megatron", 4, 3, 8, {})
        mine, theirs = _answer("toy-v", "megatron", 4, 1, 8, {}), _answer("zbv", "megatron", 4, 1, 8, {})
        assert mine.startswith("plan 32 8 4") and theirs.startswith("plan 32 8 4")
        sends = [r.split() for r in mine.splitlines() if r.startswith("pp.activation ")]
        zbv_sends = [r.split() for r in theirs.splitlines() if r.startswith("pp.activation ")]
        assert len(sends) == len(zbv_sends) > 0
        for row, zbv_row in zip(sends, zbv_sends, strict=True):
            assert int(row[3]) * 2 == int(zbv_row[3])  # calls per iteration: half of the micro-batches each way
            assert "toy.py" in row and "toy.py" not in zbv_row
        assert ParallelSpec(pp=4, pipeline_schedule="toy-v").chunks_per_rank == 2
    finally:
        del SCHEDULE_TRAITS["toy-v"]
