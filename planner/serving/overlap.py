"""Two-batch overlap (SGLang ``--enable-two-batch-overlap``, vLLM ``--enable-dbo``) as the engines run it: the
batch splits in two halves, each MoE layer's operations are cut into stages at the engine's yield points, and the
two halves' stages alternate on the GPU's compute stream while the EP exchange one half launched runs on the
network.

What the step costs, per pipeline stage (``overlapped_step``):

- the dense layers, the LM head and every other part of the step outside the MoE layers run on the whole batch,
  as in the step without overlap (SGLang runs ``layers[first_k_dense_replace:]`` under TBO only:
  python/sglang/srt/models/deepseek_v2.py ``DeepseekV2Model.forward``; the operations strategy asserts
  ``layer.is_layer_sparse``);
- the MoE layers are simulated (``simulate``): the compute stream runs the stages in the executor's order
  (python/sglang/srt/two_batch_overlap.py ``_execute_two_batch_raw``: ``delta_stages`` stages of half A first,
  then one of A and one of B in turn); an ``*_a`` operation launches an exchange that starts when the compute
  stream reaches it and the network (one FIFO resource: the EP kernels of both halves share the NICs and the
  comm stream) is free, and takes the half batch's priced time; a ``*_b`` operation makes the compute stream
  wait for it. What no compute hides stays exposed: the first dispatch, the last combine, and every wait where
  the other half's compute between launch and wait is shorter than the exchange;
- each half's kernels are the planner's own at half the sequences (planner/kernels.py: the GEMMs at the smaller
  M, with their tile and wave quantization); where the dispatcher's kernels hold SMs while they run (DeepEP's
  normal kernels: ``Buffer.num_sms`` = 20, deep_ep/buffer.py at 04b06f7a), the GEMMs run on the SMs left
  (SGLang's prefill strategy sets ``deep_gemm_num_sms = multi_processor_count - DeepEPConfig.num_sms``), at the
  peak those SMs give. The low-latency kernels with their receive hook hold no SMs while the data is in flight
  (DeepEP README, "hook-based overlapping"), so decode GEMMs keep every SM.

Constants: none fitted. The stage lists are the engines' (``STRATEGIES``), the SM count DeepEP's default.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..compute import PassTime, layer_forward, pass_time
from ..context import Context
from ..kernels import Kernel, layer_kernels
from ..plan import Plan, PricedCall
from ..spread import median_part, paced_gpu, pass_spread
from ..step import StepTime

# ops of one MoE layer: compute segments (their kernels' seconds) and the EP exchange's launch (_a) and wait (_b)
COMPUTE_OPS = ("attn_prepare", "attn_core", "gate", "shared", "experts", "output")
EXCHANGES = ("dispatch", "combine")


@dataclass(frozen=True)
class OverlapStrategy:
    """One MoE layer's operations as the engine stages them (a stage ends at a yield), and how many stages the
    first half runs ahead of the second; when the engine splits a step at all (``min_tokens``, ``skip_dispatch``)."""

    stages: tuple[tuple[str, ...], ...]
    delta_stages: int
    source: str
    # the step splits only with at least this many tokens on the attention rank (vLLM's DBO thresholds); 0: always
    min_tokens: int = 0
    # EP dispatchers under which the engine does not split this phase (SGLang: no TBO for extend batches in DeepEP's
    # low-latency mode)
    skip_dispatch: tuple[str, ...] = ()
    threshold_source: str = ""

    def splits(self, tokens: int, dispatch: str) -> bool:
        """Whether the engine runs a step of ``tokens`` tokens per attention rank as two micro-batches."""
        return tokens >= max(1, self.min_tokens) and dispatch not in self.skip_dispatch


SGLANG_SOURCE = "sglang 0e02cef94b0e python/sglang/srt/batch_overlap/operations_strategy.py "
# _compute_moe_deepseek_blog_prefill: tbo_delta_stages 0; yields after dispatch_a and after combine_a. SGLang splits
# every batch it can (two_batch_overlap.py at 0099dee6aa65: "TODO: may smartly disable TBO when batch size is too
# small"): no size threshold; an extend batch is not split in DeepEP's low-latency mode (TboDPAttentionPreparer
# local_can_run_tbo)
SGLANG_TBO = "sglang 0099dee6aa65 python/sglang/srt/batch_overlap/two_batch_overlap.py "
SGLANG_PREFILL = OverlapStrategy(
    (("attn_prepare", "attn_core", "gate", "dispatch_a"), ("dispatch_b", "experts", "combine_a"),
     ("shared", "combine_b", "output")),
    0,
    SGLANG_SOURCE + "_compute_moe_deepseek_blog_prefill",
    skip_dispatch=("deepep_ll",),
    threshold_source=SGLANG_TBO + "TboDPAttentionPreparer.prepare_all_gather (no TBO for extend in low_latency)",
)  # fmt: skip
# _compute_moe_deepseek_blog_decode: tbo_delta_stages 2; six stages per layer
SGLANG_DECODE = OverlapStrategy(
    (("attn_prepare",), ("attn_core", "gate"), ("dispatch_a", "shared"), ("dispatch_b", "experts", "combine_a"),
     ("combine_b",), ("output",)),
    2,
    SGLANG_SOURCE + "_compute_moe_deepseek_blog_decode",
    threshold_source=SGLANG_TBO + "compute_split_seq_index (decode: bs // 2, no threshold)",
)  # fmt: skip
# vLLM's dual batch overlap: the two ubatch threads switch at dbo_yield, which the modular kernel calls after
# launching the dispatch (_prepare) and after launching the combine (_finalize, the shared experts run after that
# launch); the recv hooks wait for the exchanges (vllm/v1/worker/ubatching.py)
_VLLM_DBO_STAGES = (
    ("attn_prepare", "attn_core", "gate", "dispatch_a"), ("dispatch_b", "experts", "combine_a", "shared"),
    ("combine_b", "output"),
)  # fmt: skip
_VLLM_DBO_SOURCE = (
    "vllm 49a3522164d9 vllm/model_executor/layers/fused_moe/modular_kernel.py _prepare (prepare_async, "
    "dbo_register_recv_hook, dbo_yield) and _finalize (finalize_async, shared experts, dbo_yield)"
)
# vllm/v1/worker/ubatch_utils.py check_ubatch_thresholds: a uniform-decode batch splits at num_tokens >=
# dbo_decode_token_threshold, any batch with a prefill at num_tokens >= dbo_prefill_token_threshold (vllm/config/
# parallel.py: 32 and 512); the DP ranks agree first (coordinate_batch_across_dp): with equal batches, all or none
_VLLM_THRESHOLDS = (
    "vllm/v1/worker/ubatch_utils.py check_ubatch_thresholds; vllm/config/parallel.py dbo_*_token_threshold"
)
VLLM_DBO_PREFILL = OverlapStrategy(_VLLM_DBO_STAGES, 0, _VLLM_DBO_SOURCE, min_tokens=512,
                                   threshold_source=_VLLM_THRESHOLDS)  # fmt: skip
VLLM_DBO = OverlapStrategy(_VLLM_DBO_STAGES, 0, _VLLM_DBO_SOURCE, min_tokens=32, threshold_source=_VLLM_THRESHOLDS)

# the SMs an EP dispatcher's kernels hold while they run: DeepEP's normal (high-throughput) kernels launch
# Buffer.num_sms = 20 SMs (deep_ep/buffer.py at 04b06f7a; SGLang's DeepEPConfig.num_sms without --deepep-config);
# the low-latency kernels with the receive hook hold none while the data is in flight
COMM_SMS = {"deepep": 20}

# a layer's kernels by name -> the operation that runs them (planner/kernels.py names); a kernel not named here
# goes with the attention's projections before the core attention and with the output after it
_OPS = {
    "router": "gate",
    "router_topk": "gate",
    "shared_fc1": "shared",
    "shared_activation": "shared",
    "shared_fc2": "shared",
    "permute": "experts",
    "experts_fc1": "experts",
    "expert_activation": "experts",
    "experts_fc2": "experts",
    "unpermute": "experts",
    "fp8_cast": "output",
}
# the EP calls on the combine side of the experts (the rest of a layer's EP calls are its dispatch)
_COMBINE = ("ep.combine", "ep.agrs.combine", "ep.dp_scatter", "ep.allgather.combine")


def op_times(ctx: Context, gpu, comm_sms: int) -> dict[str, float]:
    """Seconds of each compute operation of one MoE layer's forward for ``ctx``'s batch on one rank, the GEMMs on
    the SMs the exchange's kernels leave (``comm_sms`` of ``gpu.sms``)."""
    kernels = layer_kernels(ctx, True, gpu).forward
    if comm_sms and gpu.sms > comm_sms:
        left = gpu.sms - comm_sms
        fewer = replace(gpu, sms=left, peak_tflops={k: v * left / gpu.sms for k, v in gpu.peak_tflops.items()})
        kernels = tuple(
            less if k.kind == "gemm" else k
            for k, less in zip(kernels, layer_kernels(ctx, True, fewer).forward, strict=True)
        )
    return _by_op(kernels, layer_kernels(ctx, True, gpu).attention)


def _by_op(kernels: tuple[Kernel, ...], core: tuple[Kernel, ...]) -> dict[str, float]:
    out = dict.fromkeys(COMPUTE_OPS, 0.0)
    core_names = {k.name for k in core}
    seen_core = seen_gate = False
    for k in kernels:
        op = _OPS.get(k.name)
        if k.name in core_names:
            seen_core = True
            op = "attn_core"
        elif op is None:
            op = "output" if seen_gate else "attn_core" if seen_core else "attn_prepare"
        seen_gate = seen_gate or op == "gate"
        out[op] += k.time_s
    return out


def exchange_times(calls: list[PricedCall], stage: int) -> dict[str, float]:
    """Seconds of one MoE layer's dispatch and combine on ``stage``: the EP forward calls of a step, per call
    (legs of one kernel run concurrently: the longest counts, as step.stream_totals charges them)."""
    legs: dict[tuple[str, str], float] = {}
    for pc in calls:
        c = pc.call
        if c.parallelism != "ep" or c.phase != "forward" or stage not in c.stages:
            continue
        side = "combine" if c.name.startswith(_COMBINE) else "dispatch"
        key = (side, c.kernel or c.name)
        legs[key] = max(legs.get(key, 0.0), pc.price.time_s)
    out = dict.fromkeys(EXCHANGES, 0.0)
    for (side, _), t in legs.items():
        out[side] += t
    return out


def simulate(strategy: OverlapStrategy, layers: int, compute: dict[str, float], exchange: dict[str, float]) -> float:
    """Seconds the compute stream takes to run ``layers`` MoE layers of two halves interleaved (module docstring):
    ``compute`` an operation's seconds for one half, ``exchange`` one half's dispatch and combine."""
    stages = strategy.stages * layers
    n, delta = len(stages), strategy.delta_stages
    order = [("a", i) for i in range(min(delta, n))]
    for i in range(n - delta):
        order += [("a", i + delta), ("b", i)]
    order += [("b", i) for i in range(max(0, n - delta), n)]
    t = net = 0.0
    pending: dict[tuple[str, str], float] = {}
    for half, i in order:
        for op in stages[i]:
            if op in compute:
                t += compute[op]
            elif op.endswith("_a"):
                kind = op[:-2]
                net = max(t, net) + exchange[kind]
                pending[(half, kind)] = net
            else:
                t = max(t, pending.pop((half, op[:-2])))
    return t


def overlapped_step(
    whole: Plan,
    halves: tuple[tuple[Plan, Context, float], ...],
    ctx_whole: Context,
    gpu,
    strategy: OverlapStrategy,
    dispatch: str,
) -> Plan:
    """``whole`` (the step on the whole batch) with its MoE layers run as two micro-batches under ``strategy``: the
    step time, its compute and exposed communication, and each stage's EP stream. ``halves`` are the micro-batches'
    steps as (plan, context, weight) whose weighted sum is one mean half, which the simulation runs twice: one entry
    of weight 1 where the halves are equal; the larger and the smaller at 1/2 each where the sequences do not split
    evenly; one whole prompt at 1/2 where a single prompt is cut into two chunks of half its tokens (the engines split
    prefill by tokens: vLLM ubatch_utils.py at the token midpoint, SGLang's two-chunk split)."""
    comm_sms = COMM_SMS.get(dispatch, 0)
    ops = dict.fromkeys(COMPUTE_OPS, 0.0)
    layer_half = PassTime()
    part = paced_gpu(ctx_whole, gpu)  # the slowest GPU, as the whole step's compute is timed on (planner/spread.py)
    median = median_part(part)
    spread_half = 0.0  # what the pace adds to one mean half's MoE layer as the simulation runs it (its ops)
    for _, ctx, weight in halves:
        paced_ops = op_times(ctx, part, comm_sms)
        for op, t in paced_ops.items():
            ops[op] += weight * t
        spread_half += weight * (sum(paced_ops.values()) - sum(op_times(ctx, median, comm_sms).values()))
        layer_half = layer_half + pass_time(layer_kernels(ctx, True, part).forward).scaled(weight)
    layer_whole = layer_forward(ctx_whole, True, part)[0]
    spread_whole = pass_spread(layer_whole, layer_forward(ctx_whole, True, median)[0])
    taxed = sum(ops.values()) - layer_half.total_s  # the GEMMs' extra seconds on fewer SMs, one half one layer
    stages, total, compute, moe_layers = [], 0.0, 0.0, 0
    p2p = whole.step.time_s - sum(st.forward_s for st in whole.step.stages)
    for st in whole.step.stages:
        moe = ctx_whole.moe_layers(st.stage)
        if not moe:
            stages.append(st)
            total += st.forward_s
            compute += st.compute.forward.total_s
            continue
        ep_whole = st.exposed_by_stream.get(("ep", "forward"), 0.0)
        exchange = dict.fromkeys(EXCHANGES, 0.0)
        for plan, _, weight in halves:
            for side, t in exchange_times(plan.calls, st.stage).items():
                exchange[side] += weight * t
        moe_layers += moe
        sim = simulate(strategy, moe, ops, exchange)
        forward = st.compute.forward + layer_half.scaled(2 * moe) + layer_whole.scaled(-moe)
        forward = forward + PassTime(gemm_s=2 * moe * taxed)
        exposed_ep = max(0.0, sim - 2 * moe * sum(ops.values()))
        by_stream = {**st.exposed_by_stream, ("ep", "forward"): exposed_ep}
        if not exposed_ep:
            by_stream.pop(("ep", "forward"))
        comm = st.fwd_comm_s - ep_whole + exposed_ep
        new = replace(st, compute=replace(st.compute, forward=forward), fwd_comm_s=comm, exposed_by_stream=by_stream)
        stages.append(new)
        total += new.forward_s
        compute += forward.total_s
    time_s = total + p2p
    step = whole.step
    new_step = StepTime(
        time_s, compute, time_s - compute, step.bubble_s, step.mfu * step.time_s / time_s,
        step.tokens_per_s * step.time_s / time_s, max(range(len(stages)), key=lambda s: stages[s].forward_s), stages,
        step.timeline, spread_s=max(0.0, step.spread_s + moe_layers * (2 * spread_half - spread_whole)),
    )  # fmt: skip
    # the MoE layers' exchanges run once per half (a half of weight 1 stands for both; a prompt cut into two chunks
    # is listed as one call of both chunks' bytes); every other call runs once on the whole batch
    calls = [pc for pc in whole.calls if pc.call.parallelism != "ep"] + [
        replace(pc, call=replace(pc.call, calls_per_iteration=round(2 * weight) * pc.call.calls_per_iteration))
        for plan, _, weight in halves
        for pc in plan.calls
        if pc.call.parallelism == "ep"
    ]
    return replace(whole, calls=calls, step=new_step)


__all__ = [
    "COMM_SMS",
    "SGLANG_DECODE",
    "SGLANG_PREFILL",
    "VLLM_DBO",
    "VLLM_DBO_PREFILL",
    "OverlapStrategy",
    "overlapped_step",
    "simulate",
]
