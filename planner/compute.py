"""Compute of one micro-batch on one rank of a pipeline stage: FLOPs by kernel class, and their time.

FLOPs (a multiply-add = 2 FLOPs), per layer, per micro-batch of b sequences of s tokens, on one rank of a
tp x cp group; T = b·s/cp tokens on the rank:

- attention projections: 2·T·h·(q + 2·kv + q)/t with q = heads·head_dim, kv = kv_heads·head_dim (GQA);
  MLA (DeepSeek-V3 report §2.1.1): the low-rank q/kv down- and up-projections and the output projection;
- core attention, causal, with flash attention: 4·b·s²·heads·head_dim / 2 / (t·cp) (QKᵀ and PV; the
  causal mask halves the work and FlashAttention skips the masked blocks; load-balanced ring attention
  gives every CP rank 1/cp of it);
- MLP: 2·T·h·ffn·(3 gated | 2)/t; MoE: every token runs top-k experts, so a rank does
  2·T·k·P_expert/t on its local experts under uniform routing (x capacity factor when tokens are padded),
  plus the router (2·T·h·E) and the shared experts like a dense MLP;
- LM head (last stage): 2·T·h·V/t; the embedding lookup does no matmul.

Backward = 2x forward for GEMMs (data and weight gradients); FlashAttention's backward re-computes QKᵀ, so
it is 2.5x its forward (Dao 2023, FlashAttention-2 §3.1: 5 matmuls backward vs 2 forward). Selective
recompute re-runs core attention, full recompute the whole layer forward, inside the backward.

Time per kernel class (a roofline with achieved fractions):

- GEMM m x n x k: max(2mnk / (peak·E_GEMM), bytes / (HBM·E_HBM)) + KERNEL_S, bytes = (mk + kn + mn)·x;
  the GEMM efficiency thus falls for thin shapes (large tp, small micro-batches, decode);
- flash attention: FLOPs / (peak·E_ATTN);
- elementwise kernels (norms, rotary, SwiGLU, residual adds, bias/dropout) are memory-bound:
  ELEMENTWISE bytes / (HBM·E_HBM);
- optimizer step (Adam): ADAM_BYTES per local parameter / (HBM·E_HBM).

The few constants live in ``EFFICIENCY`` with their sources; ``docs/step-time.md`` gives the fit and the
error table against published iteration times.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from collectives.topology.gpu import GPUSpec

from ._errors import SpecError
from .context import Context
from .recompute import layer_counts


@dataclass(frozen=True)
class Efficiency:
    """Achieved fractions of the GPU's published peaks (see docs/step-time.md for the calibration)."""

    gemm: float  # large bf16 GEMM / dense peak
    attention_fwd: float  # flash attention forward / dense peak
    attention_bwd: float  # flash attention backward / dense peak
    hbm: float  # achieved / peak HBM bandwidth for streaming kernels
    kernel_s: float  # fixed cost per GEMM launch (launch + tail), seconds
    gemm_k0: float = 0.0  # main-loop amortisation: a GEMM runs at gemm·k/(k + k0)


EFFICIENCY = Efficiency(
    # Large bf16 cuBLAS GEMMs reach ~75-85% of the dense peak on A100 and H100 (NVIDIA Deep Learning Performance
    # guide, "Matrix Multiplication Background"); Megatron's 52-57% MFU on A100 with bubbles and TP communication
    # (Korthikanti et al. 2022 Table 5) implies >= 0.7. Fitted: ONE global value, least squares in log error over
    # the 11 runs marked "fit" in tests/reference/step_times/published.json (Korthikanti 2022, Llama 3), never per
    # case; 0.83 and 0.84 tie (rms 0.028), 0.83 has the smaller bias. The held-out runs never informed it.
    gemm=0.83,
    # FlashAttention-2 (Dao 2023) measured on H100 SXM5: up to 335 TFLOP/s forward + backward (34% of peak; §4.1,
    # Fig. 7), forward faster than backward; the default for sm90 and newer (ATTENTION_BY_SM for others).
    attention_fwd=0.38,
    attention_bwd=0.32,
    # STREAM-like copies reach ~85-90% of HBM peak on A100/H100 (NVIDIA nvbandwidth / BabelStream results).
    hbm=0.85,
    # CUDA kernel launch + wave tail ~ 5 us (CUDA C++ best-practices guide: launch overhead of a few us).
    kernel_s=5e-6,
    # cuBLAS/CUTLASS tiles iterate over k in blocks of 32-64 with a prologue and epilogue of about two blocks: a
    # GEMM with k = 128 runs at half the rate of a long one (NVIDIA matmul guide: throughput grows with K).
    gemm_k0=128.0,
)

# FlashAttention-2 (Dao 2023, Fig. 4-6): A100 80GB, causal, head dim 128, seq 2k-16k: forward ~60-70%, backward
# ~50-60% of the 312 TFLOP/s peak. (fwd, bwd) fractions by compute capability x 10.
ATTENTION_BY_SM = {80: (0.60, 0.50)}

# Tensor-core clock sustained under long GEMM loads, as a fraction of the clock the dense peak is quoted at.
# A100 SXM4: the 312 TFLOP/s peak is quoted at its 1,410 MHz boost clock, which it holds at 400 W (1.0).
# H100 SXM5: the 989 TFLOP/s peak is quoted at the 1,980 MHz maximum boost; at the 700 W limit large GEMMs run
# at about 1,750-1,800 MHz (NVIDIA H100 datasheet clocks; nvidia-smi under cuBLAS load), 0.9. Unknown parts: 1.0.
# The flash-attention fractions above were measured on the parts themselves, so they are not scaled again.
SUSTAINED_CLOCK_BY_SM = {90: 0.90}

# Elementwise traffic per token per layer in forward, in units of x-byte vectors, counted kernel by kernel for
# a Megatron-Core / TransformerEngine layer: two norms (read + write h each: 4h), two residual adds (read 2h,
# write h each: 6h), rotary on q and k (read + write: 2(q + kv)), the gated activation (read 2·ffn, write
# ffn: 3·ffn) or GeLU (read + write ffn: 2·ffn). Backward moves about twice that.
ELEMENTWISE_H = 10  # norms + residual adds, in h-vectors (split over tp with sequence parallelism)
# Adam step per local parameter (megatron/core/optimizer, apex FusedAdam): read fp32 grad (4), read/write fp32
# master weight, m and v (24), write bf16 weight (2), zero the grad (4) = 34 bytes.
ADAM_BYTES = 34
FLASH_BWD = 2.5  # FlashAttention-2 §3.1.2: backward = 5 matmuls of the 2 the forward does

# Unfused core attention (Megatron-LM 2021-2022 CoreAttention: baddbmm QK^T, FusedScaleMaskSoftmax, dropout, bmm
# PV; Korthikanti et al. 2022 Table 2 lists the s x s tensors it keeps). Bytes per attention score moved by the
# memory-bound kernels between the two batched GEMMs (whose own operand traffic the GEMM roofline counts):
# softmax reads and writes the scores (2 + 2 at 2 bytes); dropout reads them, writes its output and a 1-byte mask
# (2 + 2 + 1). Backward: dropout reads the gradient and the mask and writes the gradient (2 + 1 + 2), softmax
# reads its output and the gradient and writes the gradient (2 + 2 + 2).
UNFUSED_SOFTMAX_BYTES = (4, 6)  # (forward, backward) per score, 2-byte scores
UNFUSED_DROPOUT_BYTES = (5, 5)

# FP8 training (TransformerEngine recipes, Megatron-Core --fp8-format): only the linear layers' GEMMs run in fp8.
# Norms, residuals, activations and core attention stay in bf16 (TE's fp8 dot-product attention is off by
# default: NVTE_FP8_DPA=0, Megatron-Core --fp8-dot-product-attention false).
# Achieved fp8 / bf16 GEMM rate on Hopper: up to 1.75x for large matmuls, at least 1.25x for most others (NVIDIA
# technical blog "Boosting Matrix Multiplication Speed and Flexibility with NVIDIA cuBLAS 12.9", 2025, measured
# with its channel- and block-scaled fp8; TE's per-tensor scaling does no more work per tile) rather than the 2x
# of the datasheet peaks. The large-matmul figure is used: the k0 amortisation already slows thin shapes.
FP8_GEMM_SPEEDUP = 1.75
# TE casts each GEMM operand to fp8 before the GEMM (cast_transpose: read bf16 2 B, write fp8 1 B and the
# transposed fp8 copy 1 B that Hopper's TN-only fp8 GEMM needs for the weight gradient): 4 bytes per element of
# the forward's input and weight; the backward casts the output gradient (m x n) the same way. Summed over a
# layer's GEMMs the backward's casts equal the forward's within a third (T·h·(8 + 28/t) vs T·h·(8 + 20/t) for a
# GPT layer), so the backward is charged the forward's cast time.
FP8_CAST_BYTES = 4


@dataclass(frozen=True)
class PassTime:
    """Seconds of one forward or backward of one micro-batch on one rank, by kernel class, and its FLOPs."""

    gemm_s: float = 0.0
    attention_s: float = 0.0
    elementwise_s: float = 0.0
    flops: float = 0.0
    fp8_cast_s: float = 0.0  # TransformerEngine's casts of GEMM operands to fp8 (0 unless fp8)

    @property
    def total_s(self) -> float:
        return self.gemm_s + self.attention_s + self.elementwise_s + self.fp8_cast_s

    def __add__(self, o: PassTime) -> PassTime:
        return PassTime(
            self.gemm_s + o.gemm_s,
            self.attention_s + o.attention_s,
            self.elementwise_s + o.elementwise_s,
            self.flops + o.flops,
            self.fp8_cast_s + o.fp8_cast_s,
        )

    def scaled(self, k: float) -> PassTime:
        return PassTime(
            self.gemm_s * k, self.attention_s * k, self.elementwise_s * k, self.flops * k, self.fp8_cast_s * k
        )


@dataclass(frozen=True)
class StageCompute:
    """One micro-batch on one rank of a stage: forward, backward (with recompute), and the optimizer step."""

    forward: PassTime
    backward: PassTime
    attention_fwd_s: float  # core attention forward alone: the window CP ring exchanges hide behind
    optimizer_s: float


def check_gpu(gpu: GPUSpec | None, dtype: str) -> GPUSpec:
    """The step time needs a peak rate for the compute dtype and the HBM bandwidth; memory needs capacity."""
    if gpu is None:
        raise SpecError("cluster.gpu", "the cluster has no GPU spec (peak_tflops, hbm_bytes, hbm_GBps)")
    peak = gpu.peak_tflops.get(dtype) or (gpu.peak_tflops.get("bf16") if dtype == "fp8" else 0)
    if not peak or peak <= 0:
        raise SpecError(f"cluster.gpu.peak_tflops.{dtype}", f"GPU {gpu.name!r} has no dense peak rate for {dtype}")
    if gpu.hbm_GBps <= 0:
        raise SpecError("cluster.gpu.hbm_GBps", f"GPU {gpu.name!r} has no HBM bandwidth (needed for memory-bound work)")
    if gpu.hbm_bytes <= 0:
        raise SpecError("cluster.gpu.hbm_bytes", f"GPU {gpu.name!r} has no HBM capacity")
    return gpu


def gemm_s(m: float, n: float, k: float, x: int, peak: float, hbm: float, eff: Efficiency = EFFICIENCY) -> float:
    """One GEMM (m x k) @ (k x n): roofline of compute and operand traffic, plus a launch cost."""
    if m <= 0 or n <= 0 or k <= 0:
        return 0.0
    flops = 2.0 * m * n * k
    traffic = (m * k + k * n + m * n) * x
    rate = peak * eff.gemm * k / (k + eff.gemm_k0)
    return max(flops / rate, traffic / (hbm * eff.hbm)) + eff.kernel_s


def _gemm_shapes(ctx: Context, moe: bool) -> list[tuple[float, float, float]]:
    """(m, n, k) of the forward GEMMs of one layer on one rank (each shape once per occurrence)."""
    mdl, par = ctx.model, ctx.par
    t, T, h = par.tp, ctx.b * ctx.s_cp, mdl.hidden_size
    shapes: list[tuple[float, float, float]] = []
    if mdl.mla:
        a, heads = mdl.mla, mdl.num_attention_heads
        qk = a.qk_nope_head_dim + a.qk_rope_head_dim
        if a.q_lora_rank:
            shapes += [(T, a.q_lora_rank, h), (T, heads * qk / t, a.q_lora_rank)]
        else:
            shapes.append((T, heads * qk / t, h))
        shapes += [
            (T, a.kv_lora_rank + a.qk_rope_head_dim, h),
            (T, heads * (a.qk_nope_head_dim + a.v_head_dim) / t, a.kv_lora_rank),
        ]
        shapes.append((T, h, heads * a.v_head_dim / t))
    else:
        q = mdl.num_attention_heads * mdl.head_size
        kv = mdl.kv_heads * mdl.head_size
        shapes += [(T, (q + 2 * kv) / t, h), (T, h, q / t)]
    gate = 2 if mdl.gated_mlp else 1
    if not moe:
        f = mdl.ffn_hidden_size
        return [*shapes, (T, gate * f / t, h), (T, h, f / t)]
    m = mdl.moe
    shapes.append((T / (t if par.sp else 1), m.num_experts, h))  # router (replicated weights, local tokens)
    if m.shared_ffn:
        shapes += [(T, gate * m.shared_ffn / t, h), (T, h, m.shared_ffn / t)]
    # routed experts: tokens reaching one local expert under uniform routing (token_dispatcher.py: tokens of
    # the etp x ep ranks, k copies each, spread over E experts); each expert's ffn split over expert_tp
    etp, ep, f = par.etp, par.ep, m.expert_ffn_hidden_size
    rows = (T / t) * etp * ep * m.top_k / m.num_experts * (m.capacity_factor or 1.0)
    local = m.num_experts // ep  # the local experts run as one grouped GEMM over all their rows
    return [*shapes, (rows * local, gate * f / etp, h), (rows * local, h, f / etp)]


def _attention_flops(ctx: Context) -> float:
    """Causal core attention forward on one rank: QKᵀ and PV, half the s x s square."""
    mdl = ctx.model
    heads = mdl.num_attention_heads / ctx.par.tp
    if mdl.mla:
        qk, v = mdl.mla.qk_nope_head_dim + mdl.mla.qk_rope_head_dim, mdl.mla.v_head_dim
    else:
        qk = v = mdl.head_size
    s_kv = _kv_length(ctx)
    causal = 0.5 if s_kv == ctx.s else 1.0  # decode attends to the whole cache
    return 2.0 * ctx.b * ctx.s_cp * s_kv * heads * (qk + v) * causal


def layer_attention_flops(ctx: Context) -> float:
    """FLOPs the core-attention kernels execute: flash skips the masked half; unfused computes the whole square."""
    unfused = ctx.work.attention_kernel == "unfused" and ctx.s > 1
    return _attention_flops(ctx) * (2 if unfused else 1)


def _kv_length(ctx: Context) -> int:
    """Keys each query attends to: the sequence (training, prefill) or the cache (decode)."""
    if not ctx.training and ctx.work.phase == "decode":
        return ctx.work.context_length or ctx.model.seq_length
    return ctx.s


def _elementwise_bytes(ctx: Context, moe: bool) -> float:
    mdl, par = ctx.model, ctx.par
    T, t, x = ctx.b * ctx.s_cp, par.tp, ctx.x
    h = mdl.hidden_size
    q = mdl.num_attention_heads * mdl.head_size
    kv = mdl.kv_heads * mdl.head_size
    if moe:
        m = mdl.moe
        ffn_rows = (m.top_k * m.expert_ffn_hidden_size * (m.capacity_factor or 1.0) + m.shared_ffn) / t
    else:
        ffn_rows = mdl.ffn_hidden_size / t
    act = 3 if mdl.gated_mlp else 2
    x = 2 if x < 2 else x  # fp8 recipes keep the tensors between kernels in bf16
    return T * x * (ELEMENTWISE_H * h / (t if par.sp else 1) + 2 * (q + kv) / t + act * ffn_rows)


def layer_forward(ctx: Context, moe: bool, gpu: GPUSpec, eff: Efficiency = EFFICIENCY) -> tuple[PassTime, float]:
    """Forward of one layer, one micro-batch, one rank; and the core-attention part alone (seconds)."""
    hbm, peak = gpu.hbm_GBps * 1e9, gemm_peak(ctx, gpu)
    shapes = _gemm_shapes(ctx, moe)
    gemm_t = sum(gemm_s(m, n, k, ctx.x, peak, hbm, eff) for m, n, k in shapes)
    gemm_f = sum(2.0 * m * n * k for m, n, k in shapes)
    attn_f = _attention_flops(ctx)
    if ctx.s == 1:
        attn_t = _decode_attention_s(ctx, gpu, eff)
    elif ctx.work.attention_kernel == "unfused":
        attn_t, attn_f = unfused_attention(ctx, gpu, eff)[0], layer_attention_flops(ctx)
    else:
        attn_t = attn_f / (gpu.peak(attention_dtype(ctx)) * attention_efficiency(gpu, eff)[0])
    elem_t = _elementwise_bytes(ctx, moe) / (hbm * eff.hbm)
    return PassTime(gemm_t, attn_t, elem_t, gemm_f + attn_f, _fp8_cast_s(ctx, shapes, hbm, eff)), attn_t


def gemm_peak(ctx: Context, gpu: GPUSpec, dtype: str | None = None) -> float:
    """FLOP/s a long GEMM is measured against: the dense peak of its dtype at the sustained clock; fp8 at
    FP8_GEMM_SPEEDUP x the bf16 peak (what cuBLAS achieves), not the datasheet's 2x."""
    dtype = dtype or compute_dtype(ctx)
    peak = gpu.peak("bf16") * FP8_GEMM_SPEEDUP if dtype == "fp8" else gpu.peak(dtype)
    return peak * SUSTAINED_CLOCK_BY_SM.get(gpu.sm, 1.0)


def attention_dtype(ctx: Context) -> str:
    """Core attention runs in bf16 under fp8 recipes (TE's fp8 dot-product attention is off by default)."""
    dtype = compute_dtype(ctx)
    return "bf16" if dtype in ("fp8", "fp4") else dtype  # fp4 recipes too (TE NVFP4 attention stays bf16)


def _fp8_cast_s(ctx: Context, shapes: list[tuple[float, float, float]], hbm: float, eff: Efficiency) -> float:
    """TE's cast of each forward GEMM's input (m x k) and weight (k x n) to fp8, with the transposed copy."""
    if compute_dtype(ctx) != "fp8":
        return 0.0
    elements = sum(m * k + k * n for m, n, k in shapes)
    return elements * FP8_CAST_BYTES / (hbm * eff.hbm)


def unfused_attention(ctx: Context, gpu: GPUSpec, eff: Efficiency = EFFICIENCY) -> tuple[float, float]:
    """(forward, backward) seconds of Megatron-LM's pre-flash core attention on one rank: per head, QK^T
    (s x d @ d x s) and PV (s x s @ s x d) as GEMMs over the whole square (the causal mask is applied to the
    scores, not skipped), and the memory-bound softmax (and dropout, for GPT recipes) over the b·(a/t)·s² scores.
    Backward: each GEMM twice (both operands' gradients) and the softmax/dropout backward kernels."""
    from .memory import has_dropout

    mdl = ctx.model
    heads, d, s_q, s_k = ctx.b * mdl.num_attention_heads / ctx.par.tp, mdl.head_size, ctx.s_cp, ctx.s
    hbm, peak, x = gpu.hbm_GBps * 1e9, gemm_peak(ctx, gpu, attention_dtype(ctx)), 2  # bf16 under fp8 recipes
    gemms = heads * (gemm_s(s_q, s_k, d, x, peak, hbm, eff) + gemm_s(s_q, d, s_k, x, peak, hbm, eff))
    dropout = UNFUSED_DROPOUT_BYTES if has_dropout(ctx) else (0, 0)
    per_score = [a + b for a, b in zip(UNFUSED_SOFTMAX_BYTES, dropout, strict=True)]
    scores = heads * s_q * s_k
    fwd, bwd = (scores * n / (hbm * eff.hbm) for n in per_score)
    return gemms + fwd, 2 * gemms + bwd


def attention_efficiency(gpu: GPUSpec, eff: Efficiency = EFFICIENCY) -> tuple[float, float]:
    """(forward, backward) achieved fraction of peak for flash attention on this GPU generation."""
    return ATTENTION_BY_SM.get(gpu.sm, (eff.attention_fwd, eff.attention_bwd))


def _decode_attention_s(ctx: Context, gpu: GPUSpec, eff: Efficiency) -> float:
    """Decode attention reads the layer's KV cache once (memory-bound)."""
    return kv_cache_bytes_per_layer(ctx) / (gpu.hbm_GBps * 1e9 * eff.hbm)


def kv_cache_bytes_per_layer(ctx: Context) -> int:
    """K and V of every cached token of the rank's sequences: 2·b·ctx·kv_heads·head_dim/t·x (MLA: the
    compressed latent kv_lora_rank + rope dims, not split by tp)."""
    mdl = ctx.model
    length = _kv_length(ctx) // ctx.par.cp
    if mdl.mla:
        return ctx.b * length * (mdl.mla.kv_lora_rank + mdl.mla.qk_rope_head_dim) * ctx.x
    return 2 * ctx.b * length * mdl.kv_heads * mdl.head_size // ctx.par.tp * ctx.x


def compute_dtype(ctx: Context) -> str:
    """The tensor-core dtype the matmuls run in: the recipe's (workload.fp8_recipe, planner/recipes.py), fp8 when
    activations are fp8, bf16 for 2-byte types, else fp32."""
    if ctx.work.recipe is not None:
        return ctx.work.recipe.gemm_dtype
    return "fp8" if ctx.work.activation_dtype == "fp8" else "bf16" if ctx.x <= 2 else "fp32"


def stage_compute(ctx: Context, stage: int, gpu: GPUSpec, eff: Efficiency = EFFICIENCY) -> StageCompute:
    """Forward and backward of one micro-batch on one rank of ``stage``, plus its optimizer step."""
    return _stage_compute(ctx, stage, gpu, eff)


def layer_backward(
    ctx: Context, layer: PassTime, gpu: GPUSpec, eff, recompute: str, modules=("core_attn",), moe: bool = False
) -> PassTime:
    """One layer's backward from its forward: 2x the GEMMs and elementwise work, flash attention's backward
    at FLASH_BWD x its forward FLOPs and its own efficiency, plus what recompute runs again (full: the
    whole forward; selective: the forward of each of ``modules``, planner/recompute.py)."""
    a_fwd, a_bwd = attention_efficiency(gpu, eff)
    if ctx.s == 1:
        attention = 0.0
    elif ctx.work.attention_kernel == "unfused":
        attention = unfused_attention(ctx, gpu, eff)[1]
    else:
        attention = FLASH_BWD * layer.attention_s * a_fwd / a_bwd
    back = PassTime(2 * layer.gemm_s, attention, 2 * layer.elementwise_s, 2 * layer.flops, layer.fp8_cast_s)
    if recompute == "full":
        return back + layer
    if recompute == "selective":
        return back + recompute_modules_forward(ctx, layer, gpu, eff, frozenset(modules), moe)
    return back


def recompute_modules_forward(ctx: Context, layer: PassTime, gpu: GPUSpec, eff, modules: frozenset, moe: bool):
    """The forward selective recompute re-runs (Megatron --recompute-modules): core attention as it ran;
    the GEMM modules (mlp, moe, shared_experts, mla_up_proj) at their share of the layer's GEMM FLOPs (their
    active parameters over the layer's); layernorm and moe_act memory-bound, reading and writing their
    tensors at the achievable HBM bandwidth."""
    out = PassTime()
    mdl = ctx.model
    if "op" in modules:  # torchtitan per-op SAC: k, o and w3 (w2 without a gate) and every elementwise op
        hd = mdl.head_size
        redo = mdl.hidden_size * (mdl.kv_heads * hd + mdl.num_attention_heads * hd + mdl.ffn_hidden_size)
        share = redo / (mdl.attention_params() + mdl.mlp_params(mdl.ffn_hidden_size))
        gemm_flops = layer.flops - layer_attention_flops(ctx)
        return PassTime(gemm_s=layer.gemm_s * share, elementwise_s=layer.elementwise_s, flops=gemm_flops * share)
    if "core_attn" in modules:
        out = out + PassTime(attention_s=layer.attention_s, flops=layer_attention_flops(ctx))
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
        gemm_flops = layer.flops - layer_attention_flops(ctx)
        out = out + PassTime(gemm_s=layer.gemm_s * picked / active, flops=gemm_flops * picked / active)
    x, t = max(ctx.x, 2), ctx.par.tp
    tokens = ctx.b * ctx.s_cp
    moved = 0.0
    if "layernorm" in modules:  # two norms, each reading and writing b·s·h (/t with SP)
        moved += 2 * 2 * tokens * mdl.hidden_size * x / (t if ctx.par.sp else 1)
    if "moe_act" in modules and moe and mdl.moe:  # SwiGLU over the expert rows: read gate and up, write one
        m = mdl.moe
        act = 3 if mdl.gated_mlp else 2
        moved += tokens * act * m.top_k * (m.capacity_factor or 1.0) * m.expert_ffn_hidden_size * x / t
    if moved:
        out = out + PassTime(elementwise_s=moved / (gpu.hbm_GBps * 1e9 * eff.hbm))
    return out


def head_backward(head: PassTime) -> PassTime:
    """The LM head and loss backward: 2x the forward GEMMs and elementwise work."""
    return PassTime(2 * head.gemm_s, 0.0, 2 * head.elementwise_s, 2 * head.flops)


@lru_cache(maxsize=4096)
def _stage_compute(ctx: Context, stage: int, gpu: GPUSpec, eff: Efficiency) -> StageCompute:
    dense_n, moe_n = ctx.dense_layers(stage), ctx.moe_layers(stage)
    fwd, bwd, attn = PassTime(), PassTime(), 0.0
    layers = {}
    for moe, count in ((False, dense_n), (True, moe_n)):
        if not count:
            continue
        layer, attn_s = layers[moe] = layer_forward(ctx, moe, gpu, eff)
        fwd = fwd + layer.scaled(count)
        attn += attn_s * count
    for (moe, plan), count in layer_counts(ctx, stage).items():  # what each layer re-runs (recompute.py)
        bwd = bwd + layer_backward(ctx, layers[moe][0], gpu, eff, plan.kind, plan.modules, moe).scaled(count)
    if ctx.is_last(stage):
        head = _head(ctx, gpu, eff)
        fwd, bwd = fwd + head, bwd + head_backward(head)
    return StageCompute(fwd, bwd, attn, optimizer_s(ctx, stage, gpu, eff) if ctx.training else 0.0)


def _head(ctx: Context, gpu: GPUSpec, eff: Efficiency) -> PassTime:
    """LM head GEMM and the fp32 softmax cross-entropy over the logits (read + write, fp32). Under fp8 the head
    stays bf16: Megatron-Core's output layer is a plain ColumnParallelLinear outside TransformerEngine's fp8
    autocast, which wraps the transformer block only (transformer_block.py get_fp8_context)."""
    mdl, t = ctx.model, ctx.par.tp
    # inference samples from the last position of each sequence only (vLLM LogitsProcessor)
    T, V = (ctx.b * ctx.s_cp if ctx.training else ctx.b), mdl.padded_vocab(t) // t
    hbm = gpu.hbm_GBps * 1e9
    dtype = attention_dtype(ctx)  # the compute dtype, bf16 under fp8
    g = gemm_s(T, V, mdl.hidden_size, max(ctx.x, 2), gemm_peak(ctx, gpu, dtype), hbm, eff)
    loss = (2 * 4 * T * V if ctx.training else 0) / (hbm * eff.hbm)
    return PassTime(g, 0.0, loss, 2.0 * T * V * mdl.hidden_size)


def optimizer_s(ctx: Context, stage: int, gpu: GPUSpec, eff: Efficiency = EFFICIENCY) -> float:
    """Adam over the parameters this rank updates: all of them, or 1/dp of them with a sharded optimizer."""
    from .memory import param_totals

    dense, expert, _ = param_totals(ctx, stage)
    par = ctx.par
    shard_dense = par.dp * par.cp if par.zero_stage >= 1 else 1
    shard_expert = par.expert_dp if par.zero_stage >= 1 else 1
    local = dense / shard_dense + expert / shard_expert
    return local * ADAM_BYTES / (gpu.hbm_GBps * 1e9 * eff.hbm)


# ---- model FLOPs (the MFU definition) --------------------------------------------------------------------


@lru_cache(maxsize=1024)
def model_flops_per_token(ctx: Context) -> float:
    """PaLM (Chowdhery et al. 2022, Appendix B) and Llama 3 (Dubey et al. 2024 §3.3) count model FLOPs per
    token as 6·N + 12·L·H·Q·T for training (2·N + 4·L·H·Q·T for a forward pass): N the active parameters in
    matmuls (the input embedding lookup excluded, the LM head included), L layers, H query heads, Q head
    dim, T the sequence. Recompute is not counted (model, not hardware, FLOPs)."""
    mdl = ctx.model
    n = mdl.active_params() - mdl.vocab_size * mdl.hidden_size
    if mdl.tied_embeddings:
        n += mdl.vocab_size * mdl.hidden_size  # the tied table still runs as the LM head
    if mdl.learned_position_embeddings:
        n -= mdl.seq_length * mdl.hidden_size
    q = (mdl.mla.qk_nope_head_dim + mdl.mla.qk_rope_head_dim) if mdl.mla else mdl.head_size
    attn = 2 * mdl.num_layers * mdl.num_attention_heads * q * _kv_length(ctx)
    return (6.0 * n + 6.0 * attn) if ctx.training else (2.0 * n + 2.0 * attn)


__all__ = [
    "EFFICIENCY",
    "Efficiency",
    "PassTime",
    "StageCompute",
    "check_gpu",
    "compute_dtype",
    "gemm_s",
    "kv_cache_bytes_per_layer",
    "layer_forward",
    "model_flops_per_token",
    "optimizer_s",
    "stage_compute",
]
