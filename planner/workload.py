"""What one iteration is: a training step, or one inference prefill pass or decode step."""

from __future__ import annotations

from dataclasses import dataclass

from ._errors import SpecError
from .recipes import Recipe, recipe_of, validate_recipe

DTYPE_BYTES = {"fp32": 4, "float32": 4, "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2, "fp8": 1}
RECOMPUTE = ("none", "selective", "full")
# Core-attention kernels: "flash" (the framework's default fused kernel for the GPU: planner/kernels.py
# DEFAULT_ATTENTION), "flash2" (FlashAttention-2), "flash3" (FlashAttention-3, Hopper only), "cudnn"
# (TransformerEngine / cuDNN fused attention) or "unfused" (Megatron-LM before FlashAttention, 2021-2022: QK^T and
# PV as batched GEMMs around FusedScaleMaskSoftmax and dropout, the s x s scores written to HBM).
ATTENTION_KERNELS = ("flash", "flash2", "flash3", "cudnn", "unfused")


@dataclass(frozen=True)
class WorkloadSpec:
    kind: str = "training"  # training | inference
    # training
    micro_batch_size: int = 1
    global_batch_size: int = 1
    activation_recompute: str = "none"  # none | selective (core attention) | full (whole layer)
    seq_length: int | None = None  # CONTRACT v1.1: the training sequence; wins over the model's seq_length
    # Megatron --create-attention-mask-in-dataloader (default on: Megatron-LM d98e8a6 arguments.py:3332
    # store_false): the b x 1 x s x s bool mask is built by the loader and broadcast over TP with the batch
    attention_mask_in_dataloader: bool = True
    attention_kernel: str = "flash"  # ATTENTION_KERNELS
    # Kernel launch and fusion: None = the framework's default (Megatron-Core, torchtitan and DeepSpeed: no CUDA
    # graphs, no torch.compile; Megatron's TransformerEngine fuses its elementwise kernels anyway)
    cuda_graphs: bool | None = None
    torch_compile: bool | None = None
    # inference
    phase: str = "prefill"  # prefill | decode
    batch_size: int = 1  # sequences across all data-parallel replicas
    context_length: int | None = None  # prompt length (prefill) or KV length (decode); default seq_length
    # dtypes
    param_dtype: str = "bf16"
    activation_dtype: str = "bf16"
    grad_reduce_dtype: str | None = None  # None: the framework's default (megatron fp32, others = params)
    moe_dispatch_dtype: str | None = None  # None: activation dtype; "fp8" for DeepSeek-style dispatch
    # low-precision training (planner/recipes.py): delayed | tensorwise | blockwise | mxfp8 | nvfp4; None: the
    # GEMMs run in the activation dtype. fp8_param_gather: Megatron --fp8-param-gather (fp8 primary weights,
    # the distributed optimizer's parameter all-gather in fp8)
    fp8_recipe: str | None = None
    fp8_param_gather: bool = False

    @property
    def training(self) -> bool:
        return self.kind == "training"

    @property
    def recipe(self) -> Recipe | None:
        return recipe_of(self.fp8_recipe)


def validate_workload(w: WorkloadSpec) -> None:
    if w.kind not in ("training", "inference"):
        raise SpecError("workload.kind", f"must be 'training' or 'inference', got {w.kind!r}")
    for name in ("param_dtype", "activation_dtype", "grad_reduce_dtype", "moe_dispatch_dtype"):
        value = getattr(w, name)
        if value is not None and value not in DTYPE_BYTES:
            raise SpecError(f"workload.{name}", f"unknown dtype {value!r}; known: {', '.join(DTYPE_BYTES)}")
    validate_recipe(w.fp8_recipe, w.fp8_param_gather)
    if w.attention_kernel not in ATTENTION_KERNELS:
        raise SpecError(
            "workload.attention_kernel",
            f"must be one of {', '.join(ATTENTION_KERNELS)}, got {w.attention_kernel!r}",
        )
    if w.training:
        _at_least_one("workload.micro_batch_size", w.micro_batch_size)
        _at_least_one("workload.global_batch_size", w.global_batch_size)
        if w.seq_length is not None:
            _at_least_one("workload.seq_length", w.seq_length)
        if w.activation_recompute not in RECOMPUTE:
            raise SpecError(
                "workload.activation_recompute",
                f"must be one of {', '.join(RECOMPUTE)}, got {w.activation_recompute!r}",
            )
        return
    if w.phase not in ("prefill", "decode"):
        raise SpecError("workload.phase", f"must be 'prefill' or 'decode', got {w.phase!r}")
    _at_least_one("workload.batch_size", w.batch_size)
    if w.context_length is not None:
        _at_least_one("workload.context_length", w.context_length)


def _at_least_one(field: str, value: int) -> None:
    if value < 1:
        raise SpecError(field, f"must be >= 1, got {value}")
