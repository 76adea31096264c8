"""Activation recompute as Megatron-Core configures it: which layers of a stage re-run their forward in the
backward, and what each keeps.

- ``activation_recompute`` is --recompute-granularity: ``none``, ``selective`` (the modules of
  ``recompute_modules``, default ["core_attn"]) or ``full`` (whole layers).
- ``full`` with ``recompute_method`` ``uniform`` and ``recompute_num_layers`` N: the layers of each model
  chunk in groups of N, each group keeping only its input and re-run whole in the backward; ``block``: the
  first N layers of each chunk re-run (each keeps its input), the others keep everything
  (megatron/core/transformer/transformer_block.py _checkpointed_forward). Without a method: uniform, N = 1.
- ``selective`` modules (megatron/core/transformer/transformer_config.py recompute_modules): each frees the
  tensors only it needs for its backward and re-runs its forward: core_attn (the s x s scores of unfused
  attention; with flash attention nothing is stored beyond its inputs, and the kernel re-runs), layernorm
  (the two norms' outputs, the QKV and FC1 inputs), mlp (a dense layer's MLP intermediates), moe_act (the
  experts' activation output, FC2's input), moe (the whole MoE block's intermediates and router logits),
  shared_experts (the shared experts' intermediates), mla_up_proj (MLA's up-projected Q, K and V).
- torch (torchtitan ``activation_checkpoint``, mode selective): ``selective_ac_option`` "N" checkpoints every
  N-th transformer block of the rank whole (its 1-based count); "op" saves the outputs of the compute ops
  (mm, scaled-dot-product attention, reduce-scatter, max) except every second mm, and re-runs the rest:
  in a Llama block's mm order q, k, v, o, w1, w3, w2 it keeps q, v, w1 and w2 and re-runs k, o, w3 and
  every elementwise op (torchtitan/distributed/activation_checkpoint.py _custom_policy).

memory.py asks ``chunk_plans`` what each layer keeps; compute.py asks ``layer_counts`` what each layer
re-runs; the traffic rules ask ``rerun_layers`` which layers re-issue their forward communication (a layer
re-run whole re-issues its TP, EP and FP8 amax calls; one that re-runs its core attention, its CP
exchange). A module the model does not have is a SpecError (workload.check_recompute_modules).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from .context import Context
from .workload import WorkloadSpec, selective_modules


@dataclass(frozen=True)
class LayerRecompute:
    """What one layer re-runs in the backward and keeps until then."""

    full: bool = False  # the whole forward re-runs
    keeps_input: bool = True  # full: whether this layer's input is the checkpoint (uniform: the group's first)
    modules: frozenset[str] = frozenset()  # selective: the modules re-run

    @property
    def kind(self) -> str:
        return "full" if self.full else "selective" if self.modules else "none"


def modules_of(work: WorkloadSpec) -> frozenset[str]:
    return frozenset(selective_modules(work))


def chunk_plans(ctx: Context, stage: int) -> tuple[tuple[LayerRecompute, ...], ...]:
    """Per chunk of ``stage``, per layer of the chunk, its LayerRecompute (module docstring). It reads the
    workload, the number of layers of each of the stage's chunks and how many of them are MTP blocks: memoised
    on those values."""
    return _chunk_plans(ctx.work, tuple(len(c.layers) for c in ctx.chunks[stage]), ctx.chunk_mtp[stage])


# An MTP module under full recompute (Megatron-LM d98e8a6 multi_token_prediction.py
# MultiTokenPredictionLayer._checkpointed_forward): uniform checkpoints the module's eh_proj, transformer layer
# and final norm as one (the checkpoint keeps its two inputs, memory.mtp_chunk_bytes), so its layer keeps no
# input of its own; block warns "not supported for MTP yet. Skipping recompute" and runs it plainly.
MTP_UNIFORM = LayerRecompute(full=True, keeps_input=False)


@lru_cache(maxsize=4096)
def _chunk_plans(
    work: WorkloadSpec, sizes: tuple[int, ...], mtps: tuple[int, ...]
) -> tuple[tuple[LayerRecompute, ...], ...]:
    out = []
    selective = modules_of(work)
    for n, k in zip(sizes, mtps, strict=True):
        if not work.training or work.activation_recompute == "none":
            out.append((LayerRecompute(),) * n)
        elif work.selective_ac_option is not None and work.selective_ac_option.isdigit():
            # torchtitan layer SAC: its 1-based count of the rank's blocks, every N-th checkpointed whole
            every, before = int(work.selective_ac_option), sum(sizes[: len(out)])
            out.append(tuple(LayerRecompute(full=(before + i + 1) % every == 0) for i in range(n)))
        elif work.activation_recompute == "selective":  # an MTP block is a TransformerLayer of the same config
            out.append((LayerRecompute(modules=selective),) * n)
        else:  # the decoder layers of the chunk (transformer_block.py), then its MTP blocks (module comment)
            group, decoders = work.recompute_num_layers or 1, n - k
            if work.recompute_method == "block":
                plans = [LayerRecompute(full=i < group) for i in range(decoders)] + [LayerRecompute()] * k
            else:
                plans = [LayerRecompute(full=True, keeps_input=i % group == 0) for i in range(decoders)]
                plans += [MTP_UNIFORM] * k
            out.append(tuple(plans))
    # one object per distinct plan across the chunks too (equal values, so the same answer): memory.chunk_activations
    # looks a layer's plan up by identity, once per distinct object
    same: dict = {}
    return tuple(tuple(same.setdefault(plan, plan) for plan in chunk) for chunk in out)


def mtp_checkpointed(work: WorkloadSpec) -> bool:
    """Whether Megatron checkpoints each MTP module whole: full recompute by the uniform method (module comment
    at MTP_UNIFORM)."""
    return work.training and work.activation_recompute == "full" and work.recompute_method != "block"


def working_layers(ctx: Context) -> int:
    """Layers whose full activations the backward rebuilds at once: a uniform group, or one layer."""
    w = ctx.work
    if ctx.training and w.activation_recompute == "selective" and (w.selective_ac_option or "").isdigit():
        return 1
    if not ctx.training or w.activation_recompute != "full":
        return 0
    return 1 if w.recompute_method == "block" else (w.recompute_num_layers or 1)


LAYER_SETS = ("all", "decoder", "mtp")  # which layers of a stage layer_counts counts


def layer_counts(ctx: Context, stage: int, layers: str = "all") -> dict[tuple[bool, LayerRecompute], int]:
    """(is MoE, what it re-runs) -> layers of ``stage``, for the compute of its backward. It reads the workload
    and the kinds (MoE or dense) of each chunk's layers in order (Context.chunk_kinds): memoised on those.
    ``layers`` "decoder" leaves the MTP blocks out (the last chunk_mtp layers of their chunk), "mtp" counts
    only them: what a rule asks when the MTP blocks run otherwise (bf16 under nvfp4: rules/fp8.py, compute.py)."""
    return _layer_counts(ctx.work, ctx.chunk_kinds[stage], ctx.chunk_mtp[stage], layers)


@lru_cache(maxsize=4096)
def _layer_counts(
    work: WorkloadSpec, kinds: tuple[tuple[bool, ...], ...], mtps: tuple[int, ...], layers: str
) -> dict[tuple[bool, LayerRecompute], int]:
    if layers not in LAYER_SETS:
        raise ValueError(f"layers must be one of {LAYER_SETS}, got {layers!r}")
    counts: dict[tuple[bool, LayerRecompute], int] = {}
    for chunk, plans, k in zip(kinds, _chunk_plans(work, tuple(len(k) for k in kinds), mtps), mtps, strict=True):
        n = len(chunk)  # its MTP blocks are its last k layers (Context.chunk_mtp)
        first, end = (n - k, n) if layers == "mtp" else (0, n - k if layers == "decoder" else n)
        for moe, plan in zip(chunk[first:end], plans[first:end], strict=True):
            key = (moe, LayerRecompute(plan.full, True, plan.modules))
            counts[key] = counts.get(key, 0) + 1
    return counts


@dataclass(frozen=True)
class Reruns:
    """Layers of a stage whose forward communication is issued again in the backward, per micro-batch."""

    dense: int = 0  # dense layers re-run whole
    moe: int = 0  # MoE layers re-run whole
    attention: int = 0  # layers whose core attention re-runs: re-run whole, or selective with core_attn
    mlp: int = 0  # dense layers whose MLP alone re-runs (selective ``mlp``)
    moe_block: int = 0  # MoE layers whose whole MoE block re-runs (selective ``moe``)
    shared: int = 0  # MoE layers whose shared experts have their own checkpoint (selective ``shared_experts``)
    up_proj: int = 0  # MLA layers whose q and kv up-projections re-run (selective ``mla_up_proj``)
    per_op: int = 0  # layers under torchtitan's per-op SAC (``selective_ac_option`` "op")

    @property
    def whole(self) -> int:
        return self.dense + self.moe

    @property
    def routed(self) -> int:
        """MoE layers whose router, token dispatch, experts and combine run inside a checkpoint: re-run whole,
        or selective ``moe``."""
        return self.moe + self.moe_block

    @property
    def shared_experts(self) -> int:
        """Re-runs of shared experts in the backward, per micro-batch: once with their MoE block, once in their
        own checkpoint; both when both are listed (the inner checkpoint's forward runs again inside the outer
        one's re-run, and its own backward re-runs it once more)."""
        return self.moe_block + self.shared


def rerun_layers(ctx: Context, stage: int, layers: str = "all") -> Reruns:
    """What ``stage`` re-runs, counted from ``layer_counts`` (the one home of which layer re-runs what):
    full recompute re-runs every layer (uniform) or the first recompute_num_layers of each chunk (block:
    Megatron-LM d98e8a6 megatron/core/recompute.py, ``use_checkpoint = layer_idx < recompute_num_layers``
    per chunk, the other layers run without checkpoint and issue their calls once); torch's layer SAC every
    N-th block; selective the core attention when listed (its CP exchange re-runs with it).

    Selective modules that wrap communication (Megatron-LM d98e8a6), each through
    ``tensor_parallel.checkpoint`` (tensor_parallel/random.py CheckpointFunction: the forward under
    ``torch.no_grad()``, re-run under ``torch.enable_grad()`` in the backward, collectives included):
    - ``mlp``: a dense layer's MLP (transformer_layer.py ``recompute_mlp = True`` only ``if not
      self.is_moe_layer``; ``_forward_mlp`` checkpoints ``self.mlp``): its fc1 and fc2 TP calls;
    - ``moe``: the whole MoE forward (moe_layer.py ``moe_layer_recompute``: ``custom_forward`` = shared
      experts, route, preprocess, dispatch, experts, combine): the router's aux-loss count reduction, the
      token counts, dispatch, expert-TP and combine, and the shared experts' TP calls;
    - ``shared_experts``: the shared experts alone (moe_layer.py ``shared_experts_compute``, only without
      --moe-shared-expert-overlap, which transformer_config.py refuses with it): their TP calls; with ``moe``
      too, the nested checkpoint re-runs them twice (``Reruns.shared_experts``).
    - ``mla_up_proj``: MLA's q and kv up-projections and RoPE (multi_latent_attention.py
      ``qkv_up_checkpoint``, a CheckpointWithoutOutput re-run before the core attention's backward), every
      layer's: the up-projections' sequence-parallel input gathers (rules/tensor.py).
    ``moe_act`` (the experts' activation, CheckpointWithoutOutput in experts.py), ``layernorm`` and
    ``core_attn`` wrap no TP/EP collective (core_attn: the CP exchange, counted in ``attention``).

    torchtitan's per-op SAC (``per_op``; torchtitan b5bcd76 distributed/activation_checkpoint.py SelectiveAC,
    early_stop=False) replays the whole block in the backward and re-runs every op its policy does not
    save: it saves the compute-intensive ops (but every second mm), reduce_scatter_tensor and all_to_all_single,
    so the functional all_gather_into_tensor (sequence parallelism's gather before the colwise linears) and
    all_reduce (a rowwise output without it) run again (torch/utils/checkpoint.py _CachedTorchDispatchMode:
    a _RECOMPUTE entry calls the op again); SDPA is saved, so no CP exchange re-runs. Recorded on 2 CPU ranks
    with gloo and DTensor (tests/reference/pytorch/sac_op_tp2.json).

    ``layers`` as layer_counts: "decoder" when the MTP blocks do not issue a rule's calls (rules/fp8.py: under
    nvfp4 the MTP modules stay bf16)."""
    dense = moe = attention = mlp = moe_block = shared = up_proj = per_op = 0
    for (is_moe, plan), count in layer_counts(ctx, stage, layers).items():
        if plan.full:
            moe, dense = (moe + count, dense) if is_moe else (moe, dense + count)
        elif is_moe:
            moe_block += count if "moe" in plan.modules else 0
            shared += count if "shared_experts" in plan.modules else 0
        elif "mlp" in plan.modules:
            mlp += count
        if plan.full or "core_attn" in plan.modules:
            attention += count
        if not plan.full and "mla_up_proj" in plan.modules and ctx.model.mla:
            up_proj += count
        if not plan.full and "op" in plan.modules:
            per_op += count
    return Reruns(dense, moe, attention, mlp, moe_block, shared, up_proj, per_op)


__all__ = [
    "LAYER_SETS",
    "LayerRecompute",
    "Reruns",
    "chunk_plans",
    "layer_counts",
    "modules_of",
    "mtp_checkpointed",
    "rerun_layers",
    "working_layers",
]
