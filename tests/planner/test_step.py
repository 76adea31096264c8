"""Step time (planner/step.py): published iteration times, the breakdown's invariants, overlap flags, inference,
per-stage prices and bad input."""

import itertools
import sys
from pathlib import Path
from statistics import median

import pytest

from app.serialize import plan_dict
from collectives.topology import cluster_preset
from collectives.topology.gpu import GPUS
from planner import (
    Context,
    Options,
    Overlap,
    ParallelSpec,
    SpecError,
    WorkloadSpec,
    build_plan,
    memory,
    model_preset,
    step_time,
)
from planner.compute import embedding_pass, model_flops_per_token
from planner.spread import paced_gpu

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import step_validation

DATA = step_validation.load()
CASES = {c["name"]: c for c in DATA["cases"]}

# Published runs and the tolerance each is held to (docs/step-time.md gives the table). Since issue 20 no constant
# is fitted on a run (the kernel model's come from measured kernel tables, bench/kernel_fit.py), so every run is
# held out: each within 20%, the median of all within 10%, the H100 runs (today's software) within 8% at the median
# and unbiased within 5%. Known misses, held to 30% and left unexplained in docs/step-time.md: MT-NLG 530B (-26% to
# -29%: the 2021 DeepSpeed-Megatron stack ran the same model on the same GPUs at 126 TFLOP/s where Megatron alone
# ran it at 163-180) and the small Megatron-Core models on H100 (-24%: GPT 1.7B and 7.1B in under a second a step).
TOLERANCE = dict.fromkeys(CASES, 0.20)
TOLERANCE |= {name: 0.30 for name in CASES if name.startswith("MT-NLG")}
TOLERANCE |= dict.fromkeys(("Megatron-Core GPT 1.7B, 48 H100", "Megatron-Core GPT 7.1B, 96 H100"), 0.30)
# The MoE runs of the Megatron-Bridge performance summaries (issue 20 item 1, held out, entered as published): known
# misses, each held to its recorded error +-3 points so that a change to the model that moves one shows here (and
# rewrites docs/step-time.md "MoE and Blackwell runs"); what each miss is and is not is read there by mechanism.
KNOWN_MISSES = {
    # moe8: TE quantizes each expert's split with its own launches (current scaling: amax, scale, cast) and
    # Megatron pads the dropless experts' rows for fp8 (planner/kernels.py expert_quantize_launches,
    # FP8_EXPERT_PADDING): -62.0% -> -56.6%, -57.6% -> -52.1%, -31.6% -> -24.9%, -27.6% -> -24.4%, -26.8% -> -24.3%
    # moe9 (docs/step-time.md "MoE (moe9)"): the Bridge rows' fused cross entropy as their providers set it, the
    # alltoall dispatcher's preprocess launches and probabilities' all-to-all, and the EP exchanges at the hidden
    # states' bf16 under fp8 recipes: -56.6% -> -57.8%, -52.1% -> -47.6%, -24.9% -> -20.2%; GPT-OSS B200 -51.7% ->
    # -51.9%, GB200 -17.9% -> -18.2%, 26.08 -24.7% -> -27.0%; DeepSeek-V3 B200 -24.3% (-23.4% after layouts6) -> -21.6%
    # (-55.0% on main after round eight's merges; gptoss8's weighted activation backward: -54.8%)
    # moehost (docs/step-time.md "MoE host time (moehost)"): a Megatron MoE layer that syncs for its counts runs
    # through the host's two queues at host_launch_s (38.2 us a launch, Megatron-Core's own layer measured on the
    # H200): -54.8% -> -48.6% here (its EP overlap's wait does not drain the queue: not modelled); the B200 Qwen3 row
    # -47.3% -> +10.8% and the GB200 one -19.7% -> -12.5% are within 20% and unpinned
    # (-50.0% once a host-bound forward's idle GPU absorbs the hidden all-to-alls' slowdown: step._stage_contention;
    # -52.0% under the combined 1F1B pair, qwen9)
    # moe11 (docs/step-time.md "TransformerEngine's grouped GEMM and the host (moe11)"): TE v2.8+ quantizes a tensor
    # under current scaling in four launches, not three (current_scaling.cu zero_amax_kernel before the amax): 64 more
    # launches a layer pair, host-bound at 38.2 us each: -52.0% -> -44.4%
    # moe11b (docs/step-time.md "Quantize launches, swizzles and combined 1F1B (moe11b)"): the dense linears' quantizes
    # as TE v2.9 launches them (the norm-fed qkv's 3 under current scaling, linear_proj's input 4; backward each output
    # gradient 4 and linear_proj's saved original input 4 again): +6 forward, +11 backward a layer: -44.4% -> -42.4%
    # outliers15 (docs/step-time.md "The runs more than 20% off, round 15"): entered at its recipe's micro-batch 1
    # and VP 12 (Megatron-Bridge r0.2.0 qwen3 workload_base_configs.py; the table's MBS 2 / VP 24 are its 25.09
    # tokendrop row's): -42.3% -> +11.0%, within 20%, unpinned
    # moe11b: the 25.11 stack's TE v2.9 swizzles MXFP8 scales at every GEMM call (2 launches a call, 24 a layer pair
    # of its MoE layer) and the dense linears' quantizes counted: host-bound at 38.2 us a launch, +10.8% -> +22.0%
    # (+12.0% without the swizzles): worse by the source, past the 20% all runs are held to, pinned here;
    # outliers15: its recipe's TE graphs of the router and the preprocess (workload.cuda_graph_scope; r0.2.0
    # qwen3 workload_base_configs.py), one replay for 21 launches forward and 11 backward, the counts copied after
    # the permutation: +22.0% -> +11.1%, within 20%, unpinned
    # GPT-OSS since gptoss (docs/step-time.md "GPT-OSS, by mechanism": d-64 attention, Megatron's unfused YaRN RoPE,
    # GLU clamp and per-expert fc2 bias; the 26.08 row with its recipe's fused grouped MLP): H100 -24.5% -> -9.1%, now
    # within the 20% all runs are held to; B200 -55.7% -> -51.7% (its table's EP8 against the recipe's EP64: -13.1% at
    # EP64), GB200 -34.1% -> -17.9% and 26.08 -24.4% -> -24.7% stay pinned; gptoss8 (a windowed layer's band of
    # tiles, the clamp's strided kernels at the H200's measured rate, the weighted activation's probs-gradient sum):
    # B200 -51.9% -> -47.3%, GB200 -18.0% -> -7.6%, 26.08 -24.6% -> -26.3% (the window only: its fused MLP clamps);
    # blackwell13 (the GB200's GEMMs at its own measured ceilings, collectives/topology/gpu.py gemm_table): GB200
    # -7.6% -> -7.2%, 26.08 -26.2% -> -24.3%; mend13b (those ceilings fitted on the compute-bound shapes: bf16 0.699 ->
    # 0.685, MXFP8 0.603 -> 0.614): GB200 -7.2% -> -6.5%, 26.08 -24.3% -> -24.7%; outliers15: the B200 row at its
    # recipe's EP64 (r0.2.0 gpt_oss workload_base_configs.py; NVIDIA's 26.02 table measures B200 EP64 at 8047
    # tokens/s/GPU, its 26.04 one EP8 at 13045; this row 8213): -47.3% -> -8.3%, within 20%, unpinned; mend15c (review
    # r15b finding 2, published.json's one rule for the 25.11 rows): the GB200 row at its r0.2.0 config's MBS 4, not
    # the table's MBS 1 (GBS 1280 and seq 8192 the table's): -6.5% -> -12.0% (its 'disputed' field holds the case
    # for MBS 1)
    # spread15 (merged after): the slowest of 64 GPUs sets the pace: -12.0% -> -9.2%, within 10%: unpinned
    # outliers15: both 26.08 rows with their recipes' fp8_dot_product_attention (perf_recipes/*/common.py at
    # 4ab94dfad), priced at the bf16 rate with TE's casts on Blackwell (no published FP8 rate): -27.2% (main at
    # 132db4c; pinned -24.7% since mend13b) -> -26.7%, the 26.08 Qwen3-30B row -5.2% -> -4.2%
    # spread15: the slowest of 64 GPUs sets the pace: -26.7% -> -24.2%
    "Megatron-Bridge 26.08 GPT-OSS-120B MXFP8, 64 GB200": -0.242,
    # DeepSeek-V3 MXFP8 256 B200: -31.0% -> -26.8% (mtp6: the MTP module's norms and eh_proj on its rank and the
    # shared output layer and cross-entropy once more on the loss's), -19.2% on main at 9532726, -16.0% since moehost's
    # host queue: within 20%, unpinned (-11.6% since moe11b's swizzles and dense quantize launches)
    # torchtitan's own H100 runs (titan, held out, entered as published: docs/step-time.md "Torch-native runs"),
    # every one too fast; recorded after FSDP2's compute-stream copies and pass-end gathers / reduce-scatters and
    # async TP's unfused backward reduce-scatters; dtype7: under float8 TP only the colwise inputs are gathered in fp8
    # (torchao Float8ColwiseParallel / PrepareFloat8ModuleInput), the reduce-scatters and the grad outputs' gathers
    # are bf16 (were 1 B), on main eab465a: 70B 2D -4.6% -> +4.3%, AsyncTP -7.9% -> -5.2%, 2025-06 70B TP -7.1% ->
    # +1.6%, AsyncTP -1.3% -> +1.7%, 8B TP -22.5% -> -14.3%, AsyncTP -24.7% -> -21.3%; DeepSeek-V3 (pp 16 p2p in
    # bf16) -21.6% -> -20.5%; titan8 (docs/step-time.md "Torch TP (titan8)"): DTensor's sequence-dim copies, the
    # compiled full AC's tail left out, per-op SAC's o not re-run under compile, async TP's fused ops hidden behind
    # their own GEMMs and re-laying their operands: 8B bf16 TP -16.9% -> -8.8%, AsyncTP -26.5% -> -18.6%, float8 TP
    # -14.2% -> -6.4%, AsyncTP -21.2% -> -10.9%, 70B bf16 TP -10.3% -> -9.0%, AsyncTP -16.6% -> -17.0%, float8 TP
    # +1.6% -> +3.7%, AsyncTP +1.7% -> +4.2%, 70B 2D +4.3% -> +6.5%, 2D + AsyncTP -5.1% -> -2.8%; sus12
    # (docs/step-time.md "Sustained clocks by throughput (sus12)"): the H100's clock 0.852 -> 0.825 and fp8 ratio
    # 0.892 -> 0.947, bf16 GEMM and attention time x 1.033, fp8 GEMM time x 0.973: the bf16 rows 1.5-2.5 points
    # slower (8B FSDP -3.3% -> -1.1%), the Float8 rows within a point either way (70B 2D +6.5% -> +6.0%); asynctp14
    # (docs/step-time.md "torch async TP's transfers (asynctp14)"): a weight gradient's copy of the fused gather's
    # strided output (bf16), the fused ops' transfers as copy-engine pulls at the H100's measured 395.05 GB/s (faster
    # than NCCL's price: every async row down), each gather's shard copied into its p2p buffer: 70B bf16 AsyncTP
    # -14.9% -> -13.0%, 8B bf16 -16.9% -> -13.8%, 70B float8 +3.9% -> +3.0%, 8B float8 -10.6% -> -12.4%, 70B 2D +
    # AsyncTP -3.2% -> -4.0%
    # Megatron-Core GPT 32B, 384 H100 (Megatron-Core 2024, held out): too slow, +18.4% -> +20.1% with sus12's H100
    # clock by throughput (its compute 0.73 -> 0.75 s beside 0.32 s of exposed DP/TP communication, the model's, not
    # explained here): past the 20% all runs are held to by 0.1 point, pinned
    "Megatron-Core GPT 32B, 384 H100": 0.254,
    "torchtitan Llama3.1-8B FSDP, 8 H100": 0.009,
    "torchtitan Llama3.1-8B FSDP + torch.compile, 8 H100": -0.037,
    "torchtitan Llama3.1-8B FSDP + torch.compile + Float8, 8 H100": 0.031,
    "torchtitan Llama3.1-8B FSDP, 128 H100": -0.015,
    "torchtitan Llama3.1-8B FSDP + torch.compile, 128 H100": -0.060,
    "torchtitan Llama3.1-8B FSDP + torch.compile + Float8, 128 H100": 0.009,
    "torchtitan Llama3.1-70B 2D (compile, Float8), 256 H100": 0.096,
    "torchtitan Llama3.1-70B 2D + AsyncTP (compile, Float8), 256 H100": -0.003,
    "torchtitan Llama3.1-70B bf16 TP (2025-06), 256 H100": -0.039,
    "torchtitan Llama3.1-70B bf16 AsyncTP (2025-06), 256 H100": -0.095,
    "torchtitan Llama3.1-70B Float8 tensorwise TP (2025-06), 256 H100": 0.068,
    "torchtitan Llama3.1-70B Float8 tensorwise AsyncTP (2025-06), 256 H100": 0.069,
    "torchtitan Llama3.1-8B bf16 TP (2025-06), 64 H100": -0.048,
    "torchtitan Llama3.1-8B bf16 AsyncTP (2025-06), 64 H100": -0.111,
    "torchtitan Llama3.1-8B Float8 tensorwise TP (2025-06), 64 H100": -0.039,
    "torchtitan Llama3.1-8B Float8 tensorwise AsyncTP (2025-06), 64 H100": -0.096,
    # spread15 (docs/step-time.md "The slowest GPU sets the pace (spread15)"): every row's GPU-bound time x (1 + sigma
    # E[max of its N GPUs]), sigma 1.48% (Sinha et al. SC'22): x 1.021 (8 GPUs) to x 1.059 (16,384); the pins
    # above re-recorded: torchtitan 128 H100 -5.1% / -9.4% / -2.7% -> -1.5% / -6.0% / +0.9%, 256 H100 70B 2D +6.0% ->
    # +9.6%, + AsyncTP -4.0% -> -0.3%, 2025-06 bf16 AsyncTP -13.0% -> -9.5%, Float8 TP / AsyncTP +3.3% / +3.0% -> +6.8%
    # / +6.9%; Megatron-Core GPT 32B +20.1% (+22.6% since bias14's userbuffers pieces) -> +25.4%
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_published_iteration_times(name):
    row = step_validation.predict(CASES[name], DATA)
    if name in KNOWN_MISSES:
        assert row["error"] == pytest.approx(KNOWN_MISSES[name], abs=0.03), row
        return
    assert abs(row["error"]) <= TOLERANCE[name], row
    if CASES[name]["cluster"] == "dgx-a100":  # these ran in 80 GB (see docs/step-time.md for Llama 3)
        assert row["fits"]


def test_runs_within_ten_percent_at_the_median_and_h100_unbiased():
    """Issue 11 item 6 and issue 20: no constant is fitted on these runs; the median of all within 10% (10.5% with
    the torchtitan rows), the DGX H100 runs (Llama 3, NeMo 24.07 FP8, Megatron-Core 2024, Megatron-Bridge; not
    torchtitan's Grand Teton H100s) within 8% and their signed median at its recorded -1.9%."""
    rows = {c["name"]: step_validation.predict(c, DATA)["error"] for c in DATA["cases"]}
    # 10.1% over the 71 runs since the 16 torchtitan rows came (8.9% over the 55 before them; 10.3% at e9f5c0a),
    # 8.5% with titan7's RMSNorm op chain, loss parallelism, optimizer and async-TP split: their torch-native bias
    # (-12.2% signed, -8.7% after titan7, -7.3% after overlap7 and dtype7's bf16 reduce-scatters under float8 TP,
    # -7.1% with the final norm priced: mend7; -6.8% after titan8's torch TP mechanisms; -5.4% with sus12's H100 clock
    # by throughput, the bf16 rows slower by x 0.852 / 0.825 on their GEMMs and attention) is reported, not hidden
    assert len(rows) >= 40 and median(abs(e) for e in rows.values()) <= 0.10
    torch = [e for name, e in rows.items() if CASES[name]["parallel"].get("framework") == "torch"]
    # spread15: -5.4% -> -2.7% with the slowest of each run's GPUs setting its pace (planner/spread.py)
    assert len(torch) == 16 and median(torch) == pytest.approx(-0.027, abs=0.01)
    h100 = [e for name, e in rows.items() if CASES[name]["cluster"] == "dgx-h100" and "gpu" not in CASES[name]]
    # fp8audit14: the FP8 rows' weight casts once a step, as TransformerEngine runs them, not in every micro-batch's
    # passes: the 12 NeMo 24.07 FP8 rows +3.7% -> -5.8% signed, now with the bf16 rows' bias (-4% to -11%), which they
    # had offset; the DGX H100 signed median -2.9% -> -5.8%, recorded here (not hidden) as the torch rows' is;
    # spread15's slowest-GPU pace (planner/spread.py, sigma 1.48% from Sinha et al. SC'22, not fitted on a run): -1.9%
    assert len(h100) >= 19 and median(abs(e) for e in h100) <= 0.08 and median(h100) == pytest.approx(-0.019, abs=0.01)


def test_measured_time_follows_each_sources_count():
    """Tokens/s per GPU give the time exactly; SC'21 TFLOP/s follow Narayanan et al. 2021 Eq. 3, which also
    reproduces MT-NLG's published 60.1 s from its 126 TFLOP/s (Smith et al. 2022 §3.4)."""
    nemo = CASES["NeMo LLAMA2-7B FP8, 8 H100"]
    assert step_validation.measured_time(nemo, DATA) == pytest.approx(128 * 4096 / (8 * 16934))
    spec = step_validation.case_inputs(CASES["MT-NLG 530B, 2,240 A100"], DATA)[0]
    flops = step_validation.narayanan2021_eq3(spec, WorkloadSpec(global_batch_size=1920), None)
    assert flops / (2240 * 126e12) == pytest.approx(60.1, rel=0.005)
    # Megatron's 2024 count for a GPT model (4h GeLU MLP, MHA) is 72·B·s·l·h²·(1 + s/6h + V/12lh)
    case = CASES["Megatron-Core GPT 16B, 192 H100"]
    spec, work, par, _, _ = step_validation.case_inputs(case, DATA)
    s, layers, h, v = spec.seq_length, spec.num_layers, spec.hidden_size, spec.padded_vocab(par.tp)
    closed = 72 * 192 * s * layers * h * h * (1 + s / (6 * h) + v / (12 * layers * h))
    assert step_validation.megatron_2024(spec, work, par) == pytest.approx(closed)


def plan_405b(**overrides):
    par = dict(tp=8, pp=16, dp=128, zero_stage=1, sequence_parallel=True, first_stage_layers=7, last_stage_layers=7)
    return build_plan(
        model_preset("llama3-405b"),
        WorkloadSpec(micro_batch_size=1, global_batch_size=2048),
        ParallelSpec(**par),
        cluster_preset("dgx-h100", 2048),
        Options(**overrides),
    )


def test_breakdown_adds_up_and_mfu_follows_its_definition():
    plan = plan_405b()
    step = plan.step
    assert step.time_s == pytest.approx(step.compute_s + step.exposed_comm_s + step.bubble_s)
    assert min(step.compute_s, step.exposed_comm_s, step.bubble_s) >= 0
    ctx = Context(model_preset("llama3-405b"), WorkloadSpec(micro_batch_size=1, global_batch_size=2048), ParallelSpec())
    tokens = 2048 * 8192
    peak = GPUS["h100-sxm5-80gb"].peak("bf16")
    assert step.mfu == pytest.approx(model_flops_per_token(ctx) * tokens / (step.time_s * 16384 * peak))
    assert step.tokens_per_s == pytest.approx(tokens / step.time_s)
    out = plan_dict(plan)["step"]
    assert set(out) >= {"time_s", "compute_s", "exposed_comm_s", "bubble_s", "mfu", "tokens_per_s", "timeline"}
    ev = out["timeline"][0]
    assert set(ev) >= {"stage", "stream", "name", "microbatch", "start_s", "end_s"}
    assert max(e["end_s"] for e in out["timeline"]) == pytest.approx(step.time_s)


def test_overlap_flags_hide_data_parallel_communication():
    """Megatron's defaults (no overlap) expose the gradient reduce-scatter and parameter all-gather."""
    plain = plan_405b().step
    hidden = plan_405b(overlap=Overlap(overlap_grad_reduce=True, overlap_param_gather=True)).step
    assert hidden.time_s < plain.time_s
    assert hidden.exposed_comm_s < plain.exposed_comm_s
    assert hidden.compute_s == pytest.approx(plain.compute_s)


def test_tp_comm_overlap_hides_tensor_parallel_collectives():
    args = (
        model_preset("llama3-70b"),
        WorkloadSpec(micro_batch_size=1, global_batch_size=16),
        ParallelSpec(tp=8, dp=2, zero_stage=1, sequence_parallel=True),
        cluster_preset("dgx-h100", 2),
    )
    off = build_plan(*args).step
    on = build_plan(*args, Options(overlap=Overlap(tp_comm_overlap=True))).step
    assert on.exposed_comm_s < 0.5 * off.exposed_comm_s


def test_interleaving_shrinks_the_bubble():
    work = WorkloadSpec(micro_batch_size=1, global_batch_size=64)
    cluster = cluster_preset("dgx-h100", 4)
    model = model_preset("llama3-70b")
    one = build_plan(model, work, ParallelSpec(tp=8, pp=4, zero_stage=1, sequence_parallel=True), cluster).step
    par = ParallelSpec(
        tp=8, pp=4, zero_stage=1, sequence_parallel=True, pipeline_schedule="interleaved", virtual_pipeline_stages=5
    )
    inter = build_plan(model, work, par, cluster).step
    assert inter.bubble_s < one.bubble_s
    assert inter.time_s < one.time_s


def test_decode_step_is_bounded_by_reading_weights_and_kv_cache():
    model = model_preset("llama3-70b")
    work = WorkloadSpec("inference", phase="decode", batch_size=32, context_length=8192)
    par = ParallelSpec(tp=8)
    plan = build_plan(model, work, par, cluster_preset("dgx-h100", 1))
    gpu = GPUS["h100-sxm5-80gb"]
    weights = plan.memory.per_stage[0].params_bytes
    kv = 2 * 32 * 8192 * model.kv_heads * model.head_size // 8 * 2 * model.num_layers
    assert plan.step.time_s > (weights + kv) / (gpu.hbm_GBps * 1e9)
    assert plan.step.tokens_per_s == pytest.approx(32 / plan.step.time_s)
    prefill = build_plan(model, WorkloadSpec("inference", batch_size=8, context_length=4096), par,
                         cluster_preset("dgx-h100", 1)).step  # fmt: skip
    assert prefill.time_s > plan.step.time_s


def test_pure_functions_match_the_plan():
    plan = plan_405b()
    ctx = Context(
        model_preset("llama3-405b"),
        WorkloadSpec(micro_batch_size=1, global_batch_size=2048),
        ParallelSpec(
            tp=8, pp=16, dp=128, zero_stage=1, sequence_parallel=True, first_stage_layers=7, last_stage_layers=7
        ),
    )
    gpu = GPUS["h100-sxm5-80gb"]
    assert step_time(ctx, plan.calls, gpu, with_timeline=False).time_s == pytest.approx(plan.step.time_s)
    assert memory(ctx, gpu, plan.calls).peak_bytes == plan.memory.peak_bytes


def test_per_stage_prices_split_rows_only_where_stages_differ():
    """Issue 9 item 5: two GB200 NVL72 racks, TP8 PP9 DP2: only stage 4's DP groups straddle the racks."""
    plan = build_plan(
        model_preset("llama3-70b"),
        WorkloadSpec(micro_batch_size=1, global_batch_size=36),
        ParallelSpec(tp=8, pp=9, dp=2, zero_stage=1, sequence_parallel=True, first_stage_layers=5,
                     last_stage_layers=5),
        cluster_preset("gb200-nvl72", 2),
    )  # fmt: skip
    grads = [pc for pc in plan.calls if pc.call.name == "dp.grads"]
    straddling = [pc for pc in grads if 4 in pc.call.stages]
    assert len(straddling) == 1 and straddling[0].call.stages == (4,)
    inside = [pc for pc in grads if 4 not in pc.call.stages]
    assert inside and all(pc.price.time_s < straddling[0].price.time_s for pc in inside)
    for name in {pc.call.name for pc in plan.calls}:
        rows = [pc for pc in plan.calls if pc.call.name == name and pc.call.phase == "backward"]
        stages = [s for pc in rows for s in pc.call.stages]
        assert len(stages) == len(set(stages))  # every stage in exactly one row of a call


def test_bad_input_names_the_numbers():
    with pytest.raises(SpecError) as err:
        build_plan(
            model_preset("llama3-8b"),
            WorkloadSpec(micro_batch_size=3, global_batch_size=100),
            ParallelSpec(tp=8),
            cluster_preset("dgx-h100", 1),
        )
    assert err.value.field == "workload.global_batch_size" and "100" in err.value.rule and "3" in err.value.rule


def test_gpu_spec_missing_a_figure_is_a_spec_error():
    from dataclasses import replace

    cluster = cluster_preset("dgx-h100", 1)
    broken = replace(cluster, gpu=replace(cluster.gpu, hbm_GBps=0.0))
    with pytest.raises(SpecError) as err:
        build_plan(model_preset("llama3-8b"), WorkloadSpec(global_batch_size=8), ParallelSpec(tp=8), broken)
    assert err.value.field == "cluster.gpu.hbm_GBps"
    no_gpu = build_plan(
        model_preset("llama3-8b"), WorkloadSpec(global_batch_size=8), ParallelSpec(tp=8), replace(cluster, gpu=None)
    )
    assert no_gpu.step is None and any("no GPU spec" in w for w in no_gpu.warnings)


def test_http_plan_has_step_and_memory_and_takes_the_flags():
    from tests.app.conftest import Api

    api = Api()
    body = {
        "model": {"preset": "llama3-8b"},
        "workload": {"micro_batch_size": 1, "global_batch_size": 32},
        "parallel": {"tp": 8, "zero_stage": 1, "sequence_parallel": True},
        "cluster": {"preset": "dgx-h100", "num_nodes": 2},
        "options": {"overlap": {"overlap_grad_reduce": True}, "timeline": False},
    }
    r = api.post("/v1/plan", json=body)
    assert r.status_code == 200, r.text
    plan = r.json()
    assert plan["step"]["timeline"] == [] and plan["step"]["time_s"] > 0
    assert plan["memory"]["fits"] is True
    assert set(plan["memory"]["per_stage"][0]) == {
        "stage", "param_count", "params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes",
        "buffers_bytes", "peak_bytes",
    }  # fmt: skip
    body["workload"]["global_batch_size"] = 31
    r = api.post("/v1/plan", json=body)
    assert r.status_code == 422 and "31" in r.text and "micro_batch_size*dp" in r.text
    body["options"]["overlap"] = {"no_such_flag": True}
    assert api.post("/v1/plan", json=body).status_code == 422


def test_every_call_lands_on_one_stream():
    """Per-iteration calls (optimizer phase) are not spread over micro-batches; pass calls are."""
    from planner.step import _stream

    plan = plan_405b()
    m = plan.num_microbatches
    for pc in plan.calls:
        stream = _stream(pc.call, m, 1)
        if pc.call.phase == "optimizer":
            assert stream == ("param_gather" if pc.call.name == "dp.params" else "tail"), pc.call.name
        elif pc.call.parallelism == "tp":
            assert stream == f"tp.{pc.call.phase}"


def test_timeline_draws_the_exposed_pass_communication():
    plan = plan_405b()
    m = plan.num_microbatches
    for st in plan.step.stages:
        tp = [e for e in plan.step.timeline if e["stage"] == st.stage and e["stream"] == "tp"]
        drawn = sum(e["end_s"] - e["start_s"] for e in tp)
        assert drawn == pytest.approx(m * (st.fwd_comm_s + st.bwd_comm_s), rel=1e-9)
        assert st.fwd_comm_s > 0  # TP collectives are exposed by default (tp_comm_overlap off)
        assert not any(e.get("overlapped") for e in tp)  # nothing hides them


def _70b(recompute="none", overlap=None, gbs=64, **workload):
    """Llama-3 70B TP8 SP PP4 DP2 on 8 DGX H100 nodes: 32 micro-batches, every block drawn one by one."""
    return build_plan(
        model_preset("llama3-70b"),
        WorkloadSpec(micro_batch_size=1, global_batch_size=gbs, activation_recompute=recompute, **workload),
        ParallelSpec(tp=8, pp=4, dp=2, zero_stage=1, sequence_parallel=True),
        cluster_preset("dgx-h100", 8),
        Options(overlap=overlap or Overlap()),
    )


def _spans(plan, stage, stream, overlapped=None):
    return [
        (e["start_s"], e["end_s"])
        for e in plan.step.timeline
        if e["stage"] == stage
        and e["stream"] == stream
        and (overlapped is None or bool(e.get("overlapped")) == overlapped)
    ]


def _inside(span, blocks):
    return any(a - 1e-12 <= span[0] and span[1] <= b + 1e-12 for a, b in blocks)


@pytest.mark.parametrize("gbs", [64, 1024], ids=["every-block", "aggregated"])
def test_recompute_blocks_are_the_backwards_rerun_of_the_forward(gbs):
    """Issue 25 Build: the timeline's recompute blocks. Full recompute re-runs each layer's forward, so on a
    stage without the LM head the recompute of one micro-batch is its forward's compute exactly, and the
    backward is longer than without recompute by exactly that; selective (core attention) by its own share.
    The recompute blocks sit inside the stage's backward (or aggregated 1F1B) blocks and add up to
    micro-batches x recompute_s (aggregated blocks hold their micro-batches' sum)."""
    none, full, sel = (_70b(rc, gbs=gbs) for rc in ("none", "full", "selective"))
    m = full.num_microbatches
    for stage in range(4):
        base, f, s = (p.step.stages[stage].compute for p in (none, full, sel))
        assert base.recompute_s == 0 and not _spans(none, stage, "recompute")
        assert f.backward.total_s - base.backward.total_s == pytest.approx(f.recompute_s, rel=1e-12)
        assert s.backward.total_s - base.backward.total_s == pytest.approx(s.recompute_s, rel=1e-12)
        assert 0 < s.recompute_s < f.recompute_s < f.backward.total_s
        if stage < 3:  # no LM head: the whole forward re-runs, but the embedding's lookup (stage 0, before the
            # layers' checkpoints: compute.embedding_pass)
            ctx = Context(model_preset("llama3-70b"), WorkloadSpec(micro_batch_size=1, global_batch_size=gbs),
                          ParallelSpec(tp=8, pp=4, dp=2, zero_stage=1, sequence_parallel=True))  # fmt: skip
            gpu = cluster_preset("dgx-h100", 8).gpu  # at the slowest of the 64 GPUs' pace, as the plan's passes
            embed = embedding_pass(ctx, paced_gpu(ctx, gpu))[0].total_s if stage == 0 else 0.0
            assert f.recompute_s == pytest.approx(f.forward.total_s - embed, rel=1e-12)
        for plan, c in ((full, f), (sel, s)):
            spans = _spans(plan, stage, "recompute")
            assert sum(b - a for a, b in spans) == pytest.approx(m * c.recompute_s, rel=1e-9)
            passes = [
                (e["start_s"], e["end_s"])
                for e in plan.step.timeline
                if e["stage"] == stage and e["stream"] == "compute" and e["name"] in ("backward", "1f1b")
            ]
            assert spans and all(_inside(sp, passes) for sp in spans)
    assert full.step.time_s > sel.step.time_s > none.step.time_s


def _disjoint(spans):
    spans = sorted(spans)
    return all(b[0] >= a[1] - 1e-12 for a, b in itertools.pairwise(spans))


@pytest.mark.parametrize("gbs", [64, 1024], ids=["every-block", "aggregated"])
def test_hidden_pass_communication_is_drawn_apart_from_the_exposed(gbs):
    """Issue 25 Build: TP/CP/EP lanes with overlapped and exposed parts told apart. With tp_comm_overlap the TP
    calls hide behind the GEMMs: the drawn overlapped TP plus the drawn exposed TP of a stage is the stage's TP
    calls serialised (stream_totals: m x per micro-batch), the overlapped pieces sit inside the stage's compute
    blocks, and no two pieces of one lane overlap (the trace's tracks stay nested or disjoint)."""
    from planner.step import stream_totals

    plan = _70b(overlap=Overlap(tp_comm_overlap=True), gbs=gbs)
    off = _70b(gbs=gbs)
    totals = stream_totals(plan.calls, plan.num_microbatches, 1, 4).time
    for st in plan.step.stages:
        i = st.stage
        calls = totals["tp.forward"][i] + totals["tp.backward"][i]
        hidden, exposed = _spans(plan, i, "tp", True), _spans(plan, i, "tp", False)
        assert hidden and sum(b - a for a, b in hidden) + sum(b - a for a, b in exposed) == pytest.approx(calls)
        blocks = [
            (e["start_s"], e["end_s"]) for e in plan.step.timeline if e["stage"] == i and e["stream"] == "compute"
        ]
        assert all(_inside(sp, blocks) for sp in hidden)
        assert _disjoint(hidden + exposed)
        # without the overlap all of it is exposed, none hidden
        assert not _spans(off, i, "tp", True)
        assert sum(b - a for a, b in _spans(off, i, "tp")) == pytest.approx(calls)
    assert plan.step.time_s < off.step.time_s


def test_cp_ring_exchanges_hidden_behind_attention_are_drawn_overlapped():
    """The CP ring's KV exchanges hide behind the attention blocks by default (cp_ring_overlap): what hides is
    drawn overlapped on the cp lane, what does not is exposed, and the two add up to the ring's calls."""
    from planner.step import stream_totals

    plan = build_plan(
        model_preset("llama3-70b"),
        WorkloadSpec(micro_batch_size=1, global_batch_size=64, seq_length=32768),
        ParallelSpec(tp=8, cp=4, pp=2, dp=1, zero_stage=1, sequence_parallel=True),
        cluster_preset("dgx-h100", 8),
    )
    totals = stream_totals(plan.calls, plan.num_microbatches, 1, 2).time
    for st in plan.step.stages:
        calls = sum(totals.get(f"cp.ring.{phase}", [0, 0])[st.stage] for phase in ("forward", "backward"))
        hidden, exposed = _spans(plan, st.stage, "cp", True), _spans(plan, st.stage, "cp", False)
        assert hidden and calls > 0
        assert sum(b - a for a, b in hidden + exposed) == pytest.approx(calls)
        assert _disjoint(hidden + exposed)


def test_a_large_bubble_is_a_warning():
    """Issue 11: a layout idling half of each step in the bubble came back without a word."""
    plan = plan_405b()  # 16 micro-batches over 16 stages, no interleaving
    assert any("pipeline bubble" in w and "16 micro-batches for 16 stages" in w for w in plan.warnings)


def test_deepspeed_zero2_reductions_hide_only_with_overlap_comm():
    args = (
        model_preset("llama3-8b"),
        WorkloadSpec(micro_batch_size=1, global_batch_size=64),
        ParallelSpec(dp=8, zero_stage=2, framework="deepspeed"),
        cluster_preset("dgx-h100", 1),
    )
    default = build_plan(*args).step
    overlapped = build_plan(*args, Options(overlap=Overlap(overlap_grad_reduce=True))).step
    assert default.exposed_comm_s > 5 * overlapped.exposed_comm_s
    fsdp = build_plan(*args[:2], ParallelSpec(dp=8, zero_stage=3, framework="torch"), args[3]).step
    assert fsdp.exposed_comm_s < default.exposed_comm_s  # FSDP2 prefetches by default


def test_a_host_bound_pass_absorbs_the_slowdown_of_what_it_hides():
    """Qwen3-30B-A3B on 16 H100 (Megatron-Bridge 25.11): each forward syncs for its token counts and waits for the
    host's launches (compute.host_pass_time), so its GPU idles host_s per micro-batch; the EP all-to-alls hidden under
    overlap_moe_expert_parallel_comm slow kernels that fill that idle first, so the pass is not lengthened. Under the
    combined 1F1B (compute.combined_pair) the backward of one micro-batch and the forward of the next share one host
    queue: each holds its share of the pair's wait (0.0515 s of host wait a micro-batch in the backward, which ran
    free before and was slowed 10.6 ms; 0.0247 s before moe11's fourth current-scaling launch; 0.0592 s since moe11b's
    dense quantize launches, +6 forward and +11 backward a layer; 0.0587 s since sus12: the H100's GEMMs and attention
    at 0.825 take longer, so the same host queue leaves the GPU 0.5 ms less to wait; 0.0623 s since fp8audit14: the
    weights' casts once a step, the output gradients' alone in the backward, leave the GPU less work under the same
    queue; 0.1283 s since outliers15 enters the row at its recipe's micro-batch 1 and VP 12: the same launches over
    half the tokens leave the GPU twice as idle; 0.1274 s since mend15f: the pass is timed on the job's slowest part,
    whose slower GEMMs fill 0.9 ms more of the same host queue, where spread15 had added k x the kernels on top of the
    median part's wait), and neither is lengthened."""
    st = build_plan(*step_validation.case_inputs(CASES["Megatron-Bridge Qwen3-30B-A3B FP8-CS, 16 H100"], DATA)).step
    stage = st.stages[0]
    assert stage.hidden_by_stream[("ep", "forward")] > 0 and stage.compute.forward.host_s > 0.02
    assert stage.slow_fwd_s == 0.0
    assert round(stage.compute.backward.host_s, 4) == 0.1274 and stage.slow_bwd_s == 0.0
