"""Compute of one micro-batch on one rank of a pipeline stage: the layer's kernels (planner/kernels.py) summed by
class, and the head and the optimizer step.

Each layer is the list of kernels ``kernels.layer_kernels`` gives (GEMMs by shape, attention as its kernel,
memory-bound kernels by bytes, each with its fixed cost); the forward sums its forward kernels, the backward its
backward kernels plus what recompute runs again (full: the whole forward; selective: core attention). The first
stage adds the input embedding's lookup and its dense weight gradient (training), the last stage the LM head and
the cross entropy; the step adds Adam over the local parameters.

FLOPs (a multiply-add = 2 FLOPs) are the kernels' own: causal attention counts the half a flash kernel computes;
unfused attention the whole square. ``docs/step-time.md`` gives the constants' fit (on kernel tables) and the
error table against published iteration times.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from collectives.topology.gpu import GPUSpec

from ._errors import SpecError
from .context import Context
from .host import free_running, synced_period
from .kernels import (
    EFFICIENCY,
    FLASH_BWD,
    MLA_UP_PROJ_KERNELS,
    Efficiency,
    Kernel,
    LayerKernels,
    attention_flops,
    cast_s,
    check_kernel_options,
    combined_pair_launches,
    dense_peak,
    efficiency,
    embedding_kernels,
    final_norm_kernels,
    flops_keys,
    full_rerun,
    gemm_dtype,
    gemm_kernels,
    gpu_seconds,
    grad_buffer_bytes,
    graphed_pre_mlp_norm,
    host_launches,
    host_sync,
    kv_cache_bytes_per_layer,
    launch,
    layer_kernels,
    layer_kernels_key,
    loss_chain,
    loss_vocab,
    memo_by,
    memory_kernel,
    moe_block,
    mtp_module_kernels,
    mtp_runs_bf16,
    one_kernel_loss_bytes,
    optimizer_bytes,
    per_layer,
    per_tokens,
    queue_launch_s,
    rerun_stops_at_last_save,
    step_weight_cast_bytes,
    te_weight_cache,
    vocab_shard,
)
from .recompute import layer_counts


@dataclass(frozen=True)
class PassTime:
    """Seconds of one forward or backward of one micro-batch on one rank, by kernel class, and its FLOPs."""

    gemm_s: float = 0.0
    attention_s: float = 0.0
    elementwise_s: float = 0.0
    flops: float = 0.0
    fp8_cast_s: float = 0.0  # TransformerEngine's casts of GEMM operands to fp8 (0 unless fp8)
    # the GPU idle waiting for the host's launches (a layer whose forward syncs: host_pass_time); 0 elsewhere
    host_s: float = 0.0

    @property
    def total_s(self) -> float:
        return self.gemm_s + self.attention_s + self.elementwise_s + self.fp8_cast_s + self.host_s

    def __add__(self, o: PassTime) -> PassTime:
        return PassTime(
            self.gemm_s + o.gemm_s,
            self.attention_s + o.attention_s,
            self.elementwise_s + o.elementwise_s,
            self.flops + o.flops,
            self.fp8_cast_s + o.fp8_cast_s,
            self.host_s + o.host_s,
        )

    def scaled(self, k: float) -> PassTime:
        return PassTime(
            self.gemm_s * k,
            self.attention_s * k,
            self.elementwise_s * k,
            self.flops * k,
            self.fp8_cast_s * k,
            self.host_s * k,
        )


def pass_time(kernels: tuple[Kernel, ...] | list[Kernel]) -> PassTime:
    """Kernels summed by class: gemm, attention, memory (elementwise), cast."""
    by = {"gemm": 0.0, "attention": 0.0, "memory": 0.0, "cast": 0.0}
    flops = 0.0
    for k in kernels:
        by[k.kind] += k.time_s
        flops += k.flops
    return PassTime(by["gemm"], by["attention"], by["memory"], flops, by["cast"])


def host_pass_time(kernels: tuple[Kernel, ...], sync: tuple[int, int] | None, host_s: float) -> PassTime:
    """One pass of a layer whose forward syncs the host with the GPU (kernels.host_sync), as the two queues of
    planner/host.py run it: the kernels' own GPU time by class (kernels.gpu_seconds, no host floor) and, as
    ``host_s``, the GPU's wait for the host's launches at ``host_s`` seconds each: the steady-state period from
    one sync to the next (host.synced_period; ``sync``: kernels.host_sync's index and queued groups) or, for a pass
    without one (the backward: the host's lead builds up layer over layer), the slower queue (host.free_running)."""
    by = {"gemm": 0.0, "attention": 0.0, "memory": 0.0, "cast": 0.0}
    flops = 0.0
    launches = []
    for k in kernels:
        g = gpu_seconds(k)
        by[k.kind] += g
        flops += k.flops
        launches.append(launch(k, host_s))
    span = free_running(launches) if sync is None else synced_period(launches, *sync)
    busy = sum(by.values())
    return PassTime(by["gemm"], by["attention"], by["memory"], flops, by["cast"], max(0.0, span - busy))


def layer_pass(
    ctx: Context, lk: LayerKernels, eff: Efficiency, backward: bool = False, kernels: tuple | None = None
) -> PassTime:
    """The forward (or the backward, or ``kernels``: a forward's re-run) of a layer's kernels ``lk``: summed
    (pass_time, each kernel at least its host floor), or, where the forward syncs (kernels.host_sync), through the
    host's queue (host_pass_time; a re-run without the sync runs free). The one home of the choice: the forward, the
    backward and full recompute's rerun read it."""
    if kernels is None:
        kernels = lk.backward if backward else lk.forward
    sync = host_sync(ctx, lk.forward)  # None under CUDA graphs too: no host queue then
    if sync is None:
        return pass_time(kernels)
    if backward:
        sync = None
    elif kernels is not lk.forward:
        sync = host_sync(ctx, kernels)
    return host_pass_time(kernels, sync, queue_launch_s(ctx, eff))


def combined_pair(ctx: Context, lk: LayerKernels, eff: Efficiency) -> tuple[PassTime, PassTime] | None:
    """An MoE layer's (forward, backward) where Megatron's combined 1F1B runs the backward of one micro-batch and
    the forward of the next as one pair from one host thread (kernels.combined_pair_launches, --overlap-moe-expert-
    parallel-comm): the pair's steady-state period through the host's queue, from the forward's count wait around
    to it (host.synced_period), with the other micro-batch's mlp backward enqueued between the copy and the wait.
    The class sums stay each pass's own GPU time (layer_pass); the GPU's wait for the host, the period less both
    passes' GPU time, is split between them in proportion to their launches. None where layer_pass's per-pass rule
    stays (no count sync: CUDA graphs, torchtitan, a capacity factor; or a layer that does not split into nodes)."""
    both = _pair_and_passes(ctx, lk, eff)
    return None if both is None else both[0]


def _pair_and_passes(
    ctx: Context, lk: LayerKernels, eff: Efficiency
) -> tuple[tuple[PassTime, PassTime], tuple[PassTime, PassTime]] | None:
    """combined_pair's (forward, backward) and layer_pass's, which it starts from: one pricing of each pass for
    combined_pair and _combined_delta_of."""
    pair = combined_pair_launches(ctx, lk)
    if pair is None:
        return None
    kernels, copy, queued = pair
    c = queue_launch_s(ctx, eff)
    period = synced_period([launch(k, c) for k in kernels], copy, queued)
    fwd, bwd = layer_pass(ctx, lk, eff), layer_pass(ctx, lk, eff, backward=True)
    wait = max(0.0, period - (fwd.total_s - fwd.host_s) - (bwd.total_s - bwd.host_s))
    f_n, b_n = (sum(host_launches(k) for k in p) for p in (lk.forward, lk.backward))
    paired = replace(fwd, host_s=wait * f_n / (f_n + b_n)), replace(bwd, host_s=wait * b_n / (f_n + b_n))
    return paired, (fwd, bwd)


def combined_pair_delta(
    ctx: Context, stage: int, gpu: GPUSpec, eff: Efficiency | None = None
) -> tuple[PassTime, PassTime]:
    """What Megatron's combined 1F1B (combined_pair) changes in one micro-batch's forward and backward on a rank of
    ``stage``: per MoE layer, the pair's host waits less the per-pass rule's (layer_pass), times the stage's MoE
    layers. stage_pass_compute adds it to the stage's passes where ``paired`` (step.paired_passes: the switch
    overlap_moe_expert_parallel_comm on, training). Only the host wait moves."""
    eff = efficiency(gpu, eff)
    fwd = bwd = 0.0
    for c, which in _layer_sets(ctx, stage):
        count = sum(n for (moe, _), n in layer_counts(ctx, stage, which).items() if moe)
        if count:
            f, b = per_layer(_COMBINED_DELTA, _combined_delta_of, c, True, gpu, eff)
            fwd, bwd = fwd + f * count, bwd + b * count
    return PassTime(host_s=fwd), PassTime(host_s=bwd)


_COMBINED_DELTA: dict = {}


def _combined_delta_of(ctx: Context, moe: bool, gpu: GPUSpec, eff: Efficiency) -> tuple[float, float]:
    both = _pair_and_passes(ctx, layer_kernels(ctx, moe, gpu, eff), eff)
    if both is None:
        return 0.0, 0.0
    (f_pair, b_pair), (fwd, bwd) = both
    return f_pair.host_s - fwd.host_s, b_pair.host_s - bwd.host_s


@dataclass(frozen=True)
class StageCompute:
    """One micro-batch on one rank of a stage: forward, backward (with recompute), and the optimizer step."""

    forward: PassTime
    backward: PassTime
    attention_fwd_s: float  # core attention forward alone: the window CP ring exchanges hide behind
    optimizer_s: float
    recompute_s: float = 0.0  # the part of ``backward`` that re-runs the forward (stage_recompute_s)


def check_gpu(gpu: GPUSpec | None, dtype: str, ctx: Context | None = None) -> GPUSpec:
    """The step time needs a peak rate for the compute dtype and the HBM bandwidth; memory needs capacity; with
    ``ctx``, the kernel options (attention kernel, fp8 recipe) must exist on the GPU."""
    if gpu is None:
        raise SpecError("cluster.gpu", "the cluster has no GPU spec (peak_tflops, hbm_bytes, hbm_GBps)")
    peak = gpu.peak_tflops.get(dtype) or (gpu.peak_tflops.get("bf16") if dtype == "fp8" else 0)
    if not peak or peak <= 0:
        raise SpecError(f"cluster.gpu.peak_tflops.{dtype}", f"GPU {gpu.name!r} has no dense peak rate for {dtype}")
    if gpu.hbm_GBps <= 0:
        raise SpecError("cluster.gpu.hbm_GBps", f"GPU {gpu.name!r} has no HBM bandwidth (needed for memory-bound work)")
    if gpu.hbm_bytes <= 0:
        raise SpecError("cluster.gpu.hbm_bytes", f"GPU {gpu.name!r} has no HBM capacity")
    if ctx is not None:
        check_kernel_options(ctx, gpu)
    return gpu


def layer_forward(ctx: Context, moe: bool, gpu: GPUSpec, eff: Efficiency | None = None) -> tuple[PassTime, float]:
    """Forward of one layer, one micro-batch, one rank; and the core-attention part alone (seconds). Memoised
    by value (kernels.per_layer: it reads what the layer's kernels read)."""
    return per_layer(_LAYER_FORWARD, _layer_forward, ctx, moe, gpu, efficiency(gpu, eff))


_LAYER_FORWARD: dict = {}


def _layer_forward(ctx: Context, moe: bool, gpu: GPUSpec, eff: Efficiency) -> tuple[PassTime, float]:
    fwd = layer_pass(ctx, layer_kernels(ctx, moe, gpu, eff), eff)
    return fwd, fwd.attention_s


def layer_attention_flops(ctx: Context) -> float:
    """FLOPs the core-attention kernels execute: flash skips the masked half; unfused computes the whole square."""
    unfused = ctx.work.attention_kernel == "unfused" and ctx.s > 1
    return attention_flops(ctx) * (2 if unfused else 1)


def layer_backward(
    ctx: Context,
    layer: PassTime,
    gpu: GPUSpec,
    eff,
    recompute: str,
    modules=("core_attn",),
    moe: bool | None = None,
) -> PassTime:
    """One layer's backward: its backward kernels, plus what recompute runs again (full: the whole forward;
    selective: the forward of each of ``modules``, planner/recompute.py). ``layer`` (the forward) tells a dense
    from an MoE layer's kernels when ``moe`` is not given."""
    if moe is None:
        moe = _is_moe(ctx, layer, gpu, eff)
    lk = layer_kernels(ctx, moe, gpu, eff)
    back = layer_pass(ctx, lk, eff, backward=True)
    redo = _layer_recompute(ctx, lk, layer, gpu, eff, recompute, modules, moe)
    return back if redo is None else back + redo


def _layer_recompute(ctx: Context, lk, layer: PassTime, gpu: GPUSpec, eff, recompute: str, modules, moe: bool):
    """What one layer's backward re-runs of its forward (the one home of the rule; None: nothing): full, the
    whole forward; selective, the forward of each of ``modules``."""
    if recompute == "full":  # the layer's forward, less what a re-run that stops at its last save leaves out
        return layer_pass(ctx, lk, eff, kernels=full_rerun(ctx, lk.forward, moe))
    if recompute == "selective":
        return recompute_modules_forward(ctx, lk, layer, gpu, eff, frozenset(modules), moe)
    return None


def stage_recompute_s(ctx: Context, stage: int, gpu: GPUSpec, eff: Efficiency = EFFICIENCY) -> float:
    """Seconds of one micro-batch's backward on one rank of ``stage`` that re-run the forward (activation
    recompute; part of ``stage_compute(...).backward``, which adds it per layer): the timeline's recompute
    blocks. Memoised by value per layer kind, as the backward is."""
    total = 0.0
    for c, which in _layer_sets(ctx, stage):
        for (moe, plan), count in layer_counts(ctx, stage, which).items():
            if plan.kind != "none":
                total += count * per_layer(_LAYER_RECOMPUTE, _recompute_of, c, moe, gpu, eff, plan.kind, plan.modules)
    if mtp_depths(ctx) and ctx.holds_mtp(stage):  # each MTP module's checkpoint re-runs its norms and eh_proj
        total += mtp_depths(ctx) * pass_time(mtp_module_kernels(ctx, gpu, eff).recompute).total_s
    return total


def recompute_modules_forward(ctx: Context, lk, layer: PassTime, gpu: GPUSpec, eff, modules: frozenset, moe: bool):
    """The forward selective recompute re-runs (Megatron --recompute-modules): core attention as its kernels
    ran; the GEMM modules (mlp, moe, shared_experts, mla_up_proj) at their share of the layer's GEMM time (their
    active parameters over the layer's); layernorm and moe_act as memory-bound kernels reading and writing
    their tensors. torchtitan's per-op SAC ("op") re-runs k, o and w3 (w2 without a gate) and every
    elementwise op; under torch.compile not o (per_op_sac_reruns_out_proj). Where the layer runs through the host's
    queue (kernels.host_sync), the "moe" re-run also waits for the host as its own kernels (kernels.moe_block,
    their sync included) run through it: layer_pass's host_s of them."""
    mdl = ctx.model
    gemm_flops = layer.flops - pass_time(lk.attention).flops
    if "op" in modules:
        q, kv, ffn = mdl.num_attention_heads * mdl.head_size, mdl.kv_heads * mdl.head_size, mdl.ffn_hidden_size
        widths = {"qkv": q + 2 * kv, "attn_out": q, "fc1": (2 if mdl.gated_mlp else 1) * ffn}  # x h: the weights
        h = mdl.hidden_size
        redo = h * sum(widths[name] * part for name, part in per_op_sac_shares(ctx).items())
        share = redo / (mdl.attention_params() + mdl.mlp_params(mdl.ffn_hidden_size))
        return PassTime(gemm_s=layer.gemm_s * share, elementwise_s=layer.elementwise_s, flops=gemm_flops * share)
    out = pass_time(lk.attention) if "core_attn" in modules else PassTime()
    shares = {"mlp": 0.0 if moe else mdl.mlp_params(mdl.ffn_hidden_size)}
    if moe and mdl.moe:
        m = mdl.moe
        shares["moe"] = m.top_k * (m.capacity_factor or 1.0) * mdl.expert_params() + mdl.moe_dense_params()
        shares["shared_experts"] = mdl.mlp_params(m.shared_ffn) if m.shared_ffn else 0.0
    if mdl.mla:
        a = mdl.mla
        shares["mla_up_proj"] = mdl.num_attention_heads * (
            a.q_lora_rank * (a.qk_nope_head_dim + a.qk_rope_head_dim)
            + a.kv_lora_rank * (a.qk_nope_head_dim + a.v_head_dim)
        )
    active = mdl.attention_params() + (
        shares.get("moe", 0.0) if moe and mdl.moe else mdl.mlp_params(mdl.ffn_hidden_size)
    )
    picked = sum(v for k, v in shares.items() if k in modules and not (k == "shared_experts" and "moe" in modules))
    if picked:
        out = out + PassTime(gemm_s=layer.gemm_s * picked / active, flops=gemm_flops * picked / active)
    if "moe" in modules and moe and mdl.moe:  # the re-run's host launches and its count sync (review r8c F5)
        out = out + PassTime(host_s=layer_pass(ctx, lk, eff, kernels=moe_block(lk.forward)).host_s)
    x, t = max(ctx.x, 2), ctx.par.tp
    tokens = ctx.b * ctx.s_cp
    kernels = []
    if "layernorm" in modules:  # two norms (one under a moe_router graph), each reading and writing b·s·h (/t, SP)
        norms = 1 if graphed_pre_mlp_norm(ctx, moe) else 2
        kernels.append(
            memory_kernel(
                "layernorm.recompute",
                norms * 2 * tokens * mdl.hidden_size * x / (t if ctx.par.sp else 1),
                gpu,
                eff,
                norms,
            )
        )
    if "mla_up_proj" in modules and mdl.mla:  # the checkpointed qkv_up_proj_and_rope_apply's memory-bound kernels
        kernels.extend(k for k in lk.forward if k.name in MLA_UP_PROJ_KERNELS)
    if "moe_act" in modules and moe and mdl.moe:  # SwiGLU over the expert rows: read gate and up, write one
        m = mdl.moe
        act = 3 if mdl.gated_mlp else 2
        rows = tokens * m.top_k * (m.capacity_factor or 1.0)
        kernels.append(memory_kernel("moe_act.recompute", rows * act * m.expert_ffn_hidden_size * x / t, gpu, eff))
        # the checkpoint re-runs the activation function whole: an eager GLU clamp inside it too (kernels.GLU_CLAMP)
        kernels.extend(k for k in lk.forward if k.name == "expert_act_clamp")
    return out + pass_time(kernels) if kernels else out


def per_op_sac_reruns_out_proj(ctx: Context) -> bool:
    """Whether torchtitan's per-op SAC re-runs the attention's output projection (o, the 4th mm: its policy
    saves every odd mm, parallelize_llama.py _custom_policy at 820504e / 9dec370). Eager, yes: the re-run replays
    the block in order (torch/utils/checkpoint.py _CachedTorchDispatchMode calls every PREFER_RECOMPUTE op again)
    until the last saved tensor, w2's input. Under torch.compile, no: the min-cut partitioner
    (torch/_functorch/partitioners.py) forces the PREFER_RECOMPUTE nodes onto the backward's side but extracts
    only the nodes the backward needs, and o's output feeds only the reduce-scatter (saved: _save_list) or, without
    SP, the all-reduce and the residual add, whose backward reads no values."""
    return not rerun_stops_at_last_save(ctx)


def per_op_sac_shares(ctx: Context) -> dict[str, float]:
    """The share of each dense-block GEMM (kernels' names) that torchtitan's per-op SAC re-runs (its policy saves
    every odd mm: parallelize_llama.py _custom_policy at 820504e / 9dec370): k alone of the fused q, k, v (its
    kv_heads x head_dim of qkv's width), o unless compiled (per_op_sac_reruns_out_proj), w3 alone of the gated
    w1, w3 (half of fc1; without a gate the whole ffn-wide matrix). One home for recompute_modules_forward's
    re-run GEMM time and the async-TP re-issues' shares (rules/tensor.py _async_tp_fused_gemms)."""
    m = ctx.model
    q, kv = m.num_attention_heads, m.kv_heads
    return {
        "qkv": kv / (q + 2 * kv),
        "attn_out": 1.0 if per_op_sac_reruns_out_proj(ctx) else 0.0,
        "fc1": 0.5 if m.gated_mlp else 1.0,
    }


def _is_moe(ctx: Context, layer: PassTime, gpu: GPUSpec, eff: Efficiency) -> bool:
    """Whether ``layer`` is the forward of an MoE layer of this model (the two kinds' forwards differ)."""
    if ctx.model.moe is None:
        return False
    return layer_pass(ctx, layer_kernels(ctx, True, gpu, eff), eff) == layer


def head_backward(ctx: Context, head: PassTime, gpu: GPUSpec, eff: Efficiency) -> PassTime:
    """The LM head and loss backward: 2x the forward GEMMs; the loss's backward kernels when Megatron runs it as
    torch ops (kernels.UNFUSED_CROSS_ENTROPY), else 2x the forward's elementwise work."""
    elementwise = 2 * head.elementwise_s
    chain = loss_chain(ctx)
    if chain is not None:
        (nbytes, launches) = chain[1]
        elementwise = memory_kernel("cross_entropy.bwd", nbytes * _logits(ctx), gpu, eff, launches).time_s
    return PassTime(2 * head.gemm_s, 0.0, elementwise, 2 * head.flops)


def _logits(ctx: Context) -> float:
    """Logits one rank's loss reads per micro-batch (training): tokens x the vocabulary it holds (loss_vocab)."""
    return ctx.b * ctx.s_cp * loss_vocab(ctx)


def compute_dtype(ctx: Context) -> str:
    """The tensor-core dtype the matmuls run in: the recipe's (workload.fp8_recipe, planner/recipes.py), fp8 when
    activations are fp8, bf16 for 2-byte types, else fp32."""
    if ctx.work.recipe is not None:
        return ctx.work.recipe.gemm_dtype
    return "fp8" if ctx.work.activation_dtype == "fp8" else "bf16" if ctx.x <= 2 else "fp32"


def stage_compute(
    ctx: Context, stage: int, gpu: GPUSpec, eff: Efficiency | None = None, paired: bool = False
) -> StageCompute:
    """Forward and backward of one micro-batch on one rank of ``stage``, plus its optimizer step; ``paired``: the
    forward and backward run as Megatron's combined 1F1B pair (stage_pass_compute)."""
    return _stage_compute(ctx, stage, gpu, efficiency(gpu, eff), paired and ctx.training)


@lru_cache(maxsize=4096)
def _stage_compute(ctx: Context, stage: int, gpu: GPUSpec, eff: Efficiency, paired: bool) -> StageCompute:
    fwd, bwd, attn = stage_pass_compute(ctx, stage, gpu, eff, paired)
    if not ctx.training:
        return StageCompute(fwd, bwd, attn, 0.0)
    return StageCompute(fwd, bwd, attn, optimizer_s(ctx, stage, gpu, eff), stage_recompute_s(ctx, stage, gpu, eff))


def stage_pass_compute(
    ctx: Context, stage: int, gpu: GPUSpec, eff: Efficiency | None = None, paired: bool = False
) -> tuple[PassTime, PassTime, float]:
    """``stage_compute`` without the optimizer step: (forward, backward with recompute, core-attention forward
    seconds) of one micro-batch on one rank of ``stage``. Memoised by value (the stage-pass cache): on
    ``stage_pass_key`` (everything it reads of the context: the layer's kernels' key, the stage's layers by kind,
    what each re-runs, its head, embedding, final norm and MTP blocks), the GPU and the constants, so layouts
    that differ in dp, ZeRO, the schedule or pp with alike stages share an entry, the plan (stage_compute) and the
    search (step_model) alike. Bounded: cleared past STAGE_PASSES_KEPT entries.

    ``paired`` (step.paired_passes: overlap_moe_expert_parallel_comm on, in training): the forward and the backward
    run as Megatron's combined 1F1B pair, whose host wait replaces the per-pass rule's (combined_pair_delta, added
    here so that the plan, the search's step time and its bounds read one compute); resolved against ctx.training
    and part of the key."""
    eff = efficiency(gpu, eff)
    paired = paired and ctx.training
    key = (layer_kernels_key(ctx), _stage_layers_key(ctx, stage), gpu, eff, paired)  # stage_pass_key's, nested
    return memo_by(_STAGE_PASSES, key, STAGE_PASSES_KEPT, _stage_pass_compute, ctx, stage, gpu, eff, paired)


# (layer_kernels_key, the stage's layers: stage_pass_key's two parts, gpu, eff, paired) -> (forward, backward,
# core attention forward seconds)
_STAGE_PASSES: dict = {}
STAGE_PASSES_KEPT = 1 << 16  # entries before the stage-pass cache is cleared (as the search's MEMO_KEPT; <1 KB each)


def _stage_pass_compute(
    ctx: Context, stage: int, gpu: GPUSpec, eff: Efficiency, paired: bool = False
) -> tuple[PassTime, PassTime, float]:
    fwd, bwd, attn = PassTime(), PassTime(), 0.0
    _, _, last, holds_mtp, first, final_norm = ctx.stage_roles[stage]
    for c, which in _layer_sets(ctx, stage):
        plans = layer_counts(ctx, stage, which)  # (MoE, what it re-runs) -> layers: the forward's counts too
        for moe in (False, True):
            count = sum(n for (m, _), n in plans.items() if m == moe)
            if not count:
                continue
            layer, attn_s = layer_forward(c, moe, gpu, eff)
            fwd = fwd + layer.scaled(count)
            attn += attn_s * count
        for (moe, plan), count in plans.items():  # what each re-runs (recompute.py)
            bwd = bwd + _layer_backward(c, moe, gpu, eff, plan).scaled(count)
    if ctx.training and first:  # the input embedding's lookup and its dense weight gradient
        emb, emb_bwd = embedding_pass(ctx, gpu, eff)
        fwd, bwd = fwd + emb, bwd + emb_bwd
    mtp = mtp_depths(ctx)
    if mtp and holds_mtp:  # each module's norms and eh_proj (its layer is counted above)
        module, module_bwd = per_layer(_MTP, _mtp_of, ctx, None, gpu, eff)
        fwd, bwd = fwd + module.scaled(mtp), bwd + module_bwd.scaled(mtp)
    if final_norm:  # the decoder's final norm (kernels.final_norm_kernels), once a micro-batch
        norm, norm_bwd = per_tokens(_FINAL_NORM, _final_norm_of, ctx, None, gpu, eff)
        fwd, bwd = fwd + norm, (bwd + norm_bwd if ctx.training else bwd)
    if last:  # the main head and, per MTP depth, the shared output layer and its loss again
        head, head_bwd = per_tokens(_HEAD, _head_of, ctx, None, gpu, eff)
        fwd, bwd = fwd + head.scaled(1 + mtp), bwd + head_bwd.scaled(1 + mtp)
    if paired:  # the combined 1F1B pair's host wait in place of the per-pass rule's (combined_pair_delta)
        f_pair, b_pair = combined_pair_delta(ctx, stage, gpu, eff)
        if f_pair.host_s or b_pair.host_s:
            fwd, bwd = fwd + f_pair, bwd + b_pair
    return fwd, bwd, attn


def _layer_backward(ctx: Context, moe: bool, gpu: GPUSpec, eff: Efficiency, plan) -> PassTime:
    """One layer's backward with what ``plan`` (recompute.layer_counts' LayerRecompute) re-runs, memoised by value."""
    return per_layer(_LAYER_BACKWARD, _backward_of, ctx, moe, gpu, eff, plan.kind, plan.modules)


def layer_s(ctx: Context, moe: bool, plan, gpu: GPUSpec, eff: Efficiency | None = None) -> float:
    """One layer's forward plus its backward with what ``plan`` (recompute.layer_counts' LayerRecompute) re-runs,
    seconds: the per-layer terms ``stage_pass_compute`` sums, as totals."""
    eff = efficiency(gpu, eff)
    return layer_forward(ctx, moe, gpu, eff)[0].total_s + _layer_backward(ctx, moe, gpu, eff, plan).total_s


def stage_layers_s(ctx: Context, stage: int, gpu: GPUSpec, eff: Efficiency | None = None) -> float:
    """Seconds of the stage's decoder layers alone, one micro-batch on one rank: ``layer_s`` of each layer
    (recompute.layer_counts without the MTP blocks), the terms ``stage_pass_compute`` sums first. Its forward +
    backward adds to them the embedding, the final norm, the LM head, the MTP blocks and modules (PassTimes of
    non-negative parts) and, for the combined 1F1B pair only, ``combined_pair_delta``: so this is never above that
    pass's total but for the pair (the layout search's cheapest compute bound: it reads no embedding, head or
    memory)."""
    return layers_s(layer_counts(ctx, stage, "decoder"), lambda moe, plan: layer_s(ctx, moe, plan, gpu, eff))


def layers_s(counts: dict, layer) -> float:
    """``stage_layers_s`` from its parts: recompute.layer_counts' (MoE, plan) -> layers, and ``layer`` (MoE, plan)
    -> ``layer_s`` (the layout search memoises each part on what it reads)."""
    return sum(count * layer(moe, plan) for (moe, plan), count in counts.items())


def embedding_pass(ctx: Context, gpu: GPUSpec, eff: Efficiency | None = None) -> tuple[PassTime, PassTime]:
    """The input embedding's forward and backward, one micro-batch on the rank holding it (training;
    kernels.embedding_kernels): the first stage's own term, beside its layers (stage_pass_compute) and in its
    embedding chunk's share (step.chunk_shares)."""
    return per_tokens(_EMBEDDING, _embedding_of, ctx, None, gpu, efficiency(gpu, eff))


def _embedding_of(ctx: Context, _moe, gpu: GPUSpec, eff: Efficiency) -> tuple[PassTime, PassTime]:
    lk = embedding_kernels(ctx, gpu, eff)
    return pass_time(lk.forward), pass_time(lk.backward)


def _final_norm_of(ctx: Context, _moe, gpu: GPUSpec, eff: Efficiency) -> tuple[PassTime, PassTime]:
    f, b = final_norm_kernels(ctx, gpu, eff)
    return pass_time(f), pass_time(b)


def _layer_sets(ctx: Context, stage: int) -> tuple[tuple[Context, str], ...]:
    """The contexts ``stage``'s transformer layers run in, each with the layer set (recompute.layer_counts) it
    covers: all in ``ctx``, or the decoder's in ``ctx`` and the MTP blocks' at bf16 (mtp_bf16_context)."""
    bf16 = mtp_bf16_context(ctx) if ctx.holds_mtp(stage) else None
    return ((ctx, "all"),) if bf16 is None else ((ctx, "decoder"), (bf16, "mtp"))


def mtp_depths(ctx: Context) -> int:
    """MTP modules that run: training only (inference runs the main model). Megatron-LM d98e8a6 gpt_model.py
    ``_postprocess`` -> multi_token_prediction.py ``process_mtp_loss``: each depth's hidden states go through the
    shared ``output_layer`` and ``compute_language_model_loss`` on the post-process (loss) stage."""
    return ctx.model.mtp_layers if ctx.training else 0


def mtp_bf16_context(ctx: Context) -> Context | None:
    """The context the MTP blocks' transformer layers run in when it is not the decoder's: under a recipe the
    MTP modules do not enter (kernels.mtp_runs_bf16), the same workload without the recipe: bf16 GEMMs and no
    quantizing casts, as the module's own kernels (kernels.mtp_module_kernels). None when the MTP layers run as
    the decoder's."""
    if not mtp_depths(ctx) or not mtp_runs_bf16(ctx):
        return None
    return _recipe_free(ctx.model, ctx.work, ctx.par)


@lru_cache(maxsize=256)
def _recipe_free(model, work, par) -> Context:
    # fp8 activations would make the recipe-free GEMMs per-tensor fp8 (kernels.gemm_dtype): the MTP blocks
    # run bf16, so the activations go back to bf16 with the recipe
    act = "bf16" if work.activation_dtype == "fp8" else work.activation_dtype
    free = replace(work, fp8_recipe=None, fp8_param_gather=False, fp8_precompute_scale=False, activation_dtype=act)
    return Context(model, free, par)


def _mtp_of(ctx: Context, _moe, gpu: GPUSpec, eff: Efficiency) -> tuple[PassTime, PassTime]:
    """One MTP module's own forward, and its backward with what its checkpoint re-runs (kernels.mtp_module_kernels)."""
    lk = mtp_module_kernels(ctx, gpu, eff)
    return pass_time(lk.forward), pass_time(lk.backward) + pass_time(lk.recompute)


_LAYER_BACKWARD: dict = {}
_LAYER_RECOMPUTE: dict = {}
_HEAD: dict = {}
_FINAL_NORM: dict = {}
_MTP: dict = {}
_EMBEDDING: dict = {}


def _recompute_of(ctx: Context, moe: bool, gpu: GPUSpec, eff: Efficiency, kind: str, modules: frozenset) -> float:
    """One layer's recompute seconds (``_layer_recompute`` of its own forward), memoised in stage_recompute_s."""
    layer = layer_forward(ctx, moe, gpu, eff)[0]
    redo = _layer_recompute(ctx, layer_kernels(ctx, moe, gpu, eff), layer, gpu, eff, kind, modules, moe)
    return 0.0 if redo is None else redo.total_s


def _backward_of(ctx: Context, moe: bool, gpu: GPUSpec, eff: Efficiency, kind: str, modules: frozenset) -> PassTime:
    """layer_backward of the layer's own forward (memoised by value in stage_pass_compute: it reads what the
    layer's kernels read, and the recompute)."""
    return layer_backward(ctx, layer_forward(ctx, moe, gpu, eff)[0], gpu, eff, kind, modules, moe)


def _head_of(ctx: Context, _moe, gpu: GPUSpec, eff: Efficiency) -> tuple[PassTime, PassTime]:
    head = _head(ctx, gpu, eff)
    return head, head_backward(ctx, head, gpu, eff)


def head_kernels(ctx: Context, gpu: GPUSpec, eff: Efficiency | None = None) -> tuple[Kernel, ...]:
    """The final norm, the LM head GEMM and the cross entropy over the logits (training). Under fp8 the head
    stays bf16: Megatron-Core's output layer is a plain ColumnParallelLinear outside TransformerEngine's fp8
    autocast, which wraps the transformer block only (transformer_block.py get_fp8_context)."""
    eff = efficiency(gpu, eff)
    mdl = ctx.model
    # inference samples from the last position of each sequence only (vLLM LogitsProcessor)
    T, V = (ctx.b * ctx.s_cp if ctx.training else ctx.b), vocab_shard(ctx)
    dtype = "bf16" if ctx.x <= 2 or ctx.work.activation_dtype == "fp8" else "fp32"
    g = gemm_kernels("lm_head", T, V, mdl.hidden_size, dtype, gpu, eff)[0]
    if not ctx.training:
        return (g,)
    chain = loss_chain(ctx)
    logits = T * loss_vocab(ctx)
    if chain is not None:
        nbytes, launches = chain[0]
        return g, memory_kernel("cross_entropy", nbytes * logits, gpu, eff, launches)
    return g, memory_kernel("cross_entropy", one_kernel_loss_bytes(ctx) * logits, gpu, eff)


def _head(ctx: Context, gpu: GPUSpec, eff: Efficiency) -> PassTime:
    return pass_time(head_kernels(ctx, gpu, eff))


def optimizer_s(ctx: Context, stage: int, gpu: GPUSpec, eff: Efficiency | None = None) -> float:
    """Adam over the parameters this rank updates: all of them, or 1/dp of them with a sharded optimizer; and, where
    the framework zeroes its whole gradient buffer every iteration (kernels.grad_buffer_bytes: Megatron-Core's
    zero_grad_buffer), that pass over every local parameter, sharded or not; and TransformerEngine's quantizing casts
    of the linear weights, which run once a step (kernels.step_weight_cast_bytes: the first micro-batch's cached
    casts, or the optimizer's cast of fp8 primary weights)."""
    from .memory import param_totals

    dense, expert, _ = param_totals(ctx, stage)
    par = ctx.par
    shard_dense = par.dp * par.cp if par.zero_stage >= 1 else 1
    shard_expert = par.expert_dp if par.zero_stage >= 1 else 1
    local = dense / shard_dense + expert / shard_expert
    nbytes = local * optimizer_bytes(ctx) + (dense + expert) * grad_buffer_bytes(ctx)
    eff = efficiency(gpu, eff)
    # TransformerEngine's weight casts, once a step (kernels.step_weight_cast_bytes), at the measured cast rate
    return nbytes / (gpu.hbm_GBps * 1e9 * eff.hbm) + cast_s(step_weight_cast_bytes(ctx, stage, gpu), gpu, eff)


# ---- model FLOPs (the MFU definition) --------------------------------------------------------------------


@lru_cache(maxsize=1024)
def model_flops_per_token(ctx: Context) -> float:
    """PaLM (Chowdhery et al. 2022, Appendix B) and Llama 3 (Dubey et al. 2024 §3.3) count model FLOPs per
    token as 6·N + 12·L·H·Q·T for training (2·N + 4·L·H·Q·T for a forward pass): N the active parameters in
    matmuls (the input embedding lookup excluded, the LM head included), L layers, H query heads, Q head
    dim, T the sequence. Recompute is not counted (model, not hardware, FLOPs).

    MTP (training) counts as Megatron-LM d98e8a6 megatron/training/training.py num_floating_point_operations
    counts it: its transformer layers join the layers (``num_layers = args.num_layers + mtp_num_layers``, so
    their attention too), its norms and eh_proj (``3 * hidden_size + 2 * hidden_size * hidden_size`` per depth:
    in active_params through ModelSpec.mtp_params) and the logits once per depth more (``* (mtp_num_layers +
    1)  # MTP + final logit``)."""
    mdl = ctx.model
    mtp = mtp_depths(ctx)
    # inference runs the main model only (mtp_depths): its MTP modules' parameters are not counted either; they were,
    # and Mixtral 8x22B cut to 1 layer with 3 MTP layers answered a prefill MFU of 2.4, an invariant 500 (hostile15)
    counted = mdl if mtp or not mdl.mtp_layers else replace(mdl, mtp_layers=0)
    n = counted.active_params() - mdl.vocab_size * mdl.hidden_size
    if mdl.tied_embeddings:
        n += mdl.vocab_size * mdl.hidden_size  # the tied table still runs as the LM head
    n += mtp * mdl.vocab_size * mdl.hidden_size  # each MTP depth's logits through the shared output layer
    if not ctx.training and ctx.s > 1:
        # a prefill samples from each sequence's last position only (vLLM LogitsProcessor; head_kernels runs the LM
        # head on b rows): its FLOPs are counted once a sequence, 1/s a token, as the kernels run them. Counted on
        # every position, a 2-layer model of vocabulary 2^24 answered MFU 5.6, a 500 (hostile15)
        n -= (1 + mtp) * mdl.vocab_size * mdl.hidden_size * (1 - 1 / ctx.s)
    if mdl.learned_position_embeddings:
        n -= mdl.seq_length * mdl.hidden_size
    q = (mdl.mla.qk_nope_head_dim + mdl.mla.qk_rope_head_dim) if mdl.mla else mdl.head_size
    attn = 2 * (mdl.num_layers + mtp) * mdl.num_attention_heads * q * flops_keys(ctx)  # packed documents: sum(L²)/s
    return (6.0 * n + 6.0 * attn) if ctx.training else (2.0 * n + 2.0 * attn)


__all__ = [
    "EFFICIENCY",
    "FLASH_BWD",
    "Efficiency",
    "LayerKernels",
    "PassTime",
    "StageCompute",
    "check_gpu",
    "compute_dtype",
    "dense_peak",
    "embedding_pass",
    "kv_cache_bytes_per_layer",
    "layer_forward",
    "layer_forward_key",
    "layer_kernels",
    "layer_s",
    "layers_s",
    "model_flops_per_token",
    "optimizer_key",
    "optimizer_s",
    "stage_compute",
    "stage_compute_key",
    "stage_layers_s",
    "stage_pass_compute",
    "stage_pass_key",
    "stage_recompute_s",
]


def stage_compute_key(ctx: Context, stage: int) -> tuple:
    """The value key of everything ``stage_compute`` reads of the context: ``stage_pass_key`` (model,
    workload, then plain values of the layout and the stage alone) and ``optimizer_key``. Equal keys give
    equal StageCompute on one GPU (tests/planner/test_search_speed.py); the layout search memoises
    stage_pass_compute and optimizer_s on the two parts."""
    return (*stage_pass_key(ctx, stage), *optimizer_key(ctx, stage))


def stage_pass_key(ctx: Context, stage: int) -> tuple:
    """The value key of everything ``stage_pass_compute`` reads: ``layer_forward_key`` (the degrees the kernels'
    shapes read, dp where it splits the batch (inference), the framework and cp_comm), the stage's dense and
    MoE layers, what each re-runs (recompute.layer_counts, in the order they are summed), its head and its
    embedding. It
    holds no parameter count nor sharding: layouts differing in dp, pp (alike stages) or ZeRO share it. The
    stage-pass cache (stage_pass_compute) keys on its two parts nested, the layer key as one hashed object."""
    return (*layer_forward_key(ctx), *_stage_layers_key(ctx, stage))


def _stage_layers_key(ctx: Context, stage: int) -> tuple:
    """What ``stage_pass_compute`` reads of the stage past a layer's kernels' key (stage_pass_key's second part):
    its dense and MoE layers, what each re-runs (recompute.layer_counts, in the order they are summed), whether it
    holds the loss, the MTP modules, the embedding and the final norm (Context.stage_roles; with MTP the final
    norm is not the loss's stage: memory.holds_final_norm)."""
    dense, moe, last, mtp, first, norm = ctx.stage_roles[stage]
    return (dense, moe, tuple(layer_counts(ctx, stage).items()), last, mtp, first, norm)


def optimizer_key(ctx: Context, stage: int) -> tuple:
    """The value key of what ``optimizer_s`` reads past the GPU (training; () for inference, whose step has
    none): the parameters the rank updates (param_totals), what shards them and the bytes a parameter's step
    moves (kernels.optimizer_bytes: the flavour's optimizer and the workload's implementation)."""
    from .memory import param_totals

    if not ctx.training:
        return ()
    par = ctx.par
    dense, expert, _ = param_totals(ctx, stage)
    shards = (par.dp * par.cp, par.expert_dp) if par.zero_stage >= 1 else (1, 1)
    return (dense, expert, *shards, optimizer_bytes(ctx), grad_buffer_bytes(ctx), *_weight_cast_key(ctx))


def _weight_cast_key(ctx: Context) -> tuple:
    """What kernels.step_weight_cast_bytes reads past the parameter counts, their shards and the GPU (the search's
    optimizer memo is one GPU's): whether TE caches the weights' casts, the GEMM dtype, the recipe, fp8 primary
    weights."""
    return te_weight_cache(ctx), gemm_dtype(ctx), ctx.work.fp8_recipe, ctx.work.fp8_param_gather


def layer_forward_key(ctx: Context) -> tuple:
    """The value key of everything ``layer_forward`` reads of the context: the layer's kernels' own
    (kernels.layer_kernels_key: model, workload, then the degrees the kernels' shapes read, dp where it splits
    the batch (inference), the framework and cp_comm); the first entries of stage_compute_key. The layout
    search memoises step.chunk_shares on it."""
    return layer_kernels_key(ctx)
