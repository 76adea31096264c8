"""Quantities every traffic rule needs, derived once from the specs (notation of DESIGN.md §5)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from .model import ModelSpec
from .parallel import ParallelSpec, stage_layer_counts
from .workload import DTYPE_BYTES, WorkloadSpec

DEFAULT_GRAD_DTYPE = {
    # Megatron-LM turns on accumulate_allreduce_grads_in_fp32 with --bf16 (megatron/training/arguments.py):
    # main grads and their reduction are fp32.
    "megatron": "fp32",
    "torch": None,  # DDP/FSDP2 reduce in the parameter dtype unless a MixedPrecisionPolicy says otherwise
    "deepspeed": None,  # DeepSpeed communication_data_type defaults to the model dtype
}


@dataclass(frozen=True)
class Context:
    # Derived quantities are cached properties: the specs are frozen, and the rules, the step time and the
    # memory model ask for them thousands of times per plan.
    model: ModelSpec
    work: WorkloadSpec
    par: ParallelSpec
    devices_per_node: int | None = None  # the cluster's; DeepEP dispatch needs it to split its two legs

    @cached_property
    def training(self) -> bool:
        return self.work.training

    @property
    def flavour(self) -> str:
        return self.par.framework

    # ---- batch and sequence ------------------------------------------------------------------------
    @cached_property
    def micro_batches(self) -> int:
        """m = B / (b x dp) for training; one pass for inference."""
        if not self.training:
            return 1
        return self.work.global_batch_size // (self.work.micro_batch_size * self.par.dp)

    @cached_property
    def b(self) -> int:
        return self.work.micro_batch_size if self.training else self.work.batch_size // self.par.dp

    @cached_property
    def s(self) -> int:
        """Tokens per sequence in one pass: the training sequence, the prompt, or 1 when decoding."""
        if self.training:
            return self.work.seq_length or self.model.seq_length
        if self.work.phase == "decode":
            return 1
        return self.work.context_length or self.model.seq_length

    @cached_property
    def s_cp(self) -> int:
        return self.s // self.par.cp

    @cached_property
    def x(self) -> int:
        return DTYPE_BYTES[self.work.activation_dtype]

    @cached_property
    def activation(self) -> int:
        """A = b x s/c x h x x: the TP unit (one layer's activations on one CP rank)."""
        return self.b * self.s_cp * self.model.hidden_size * self.x

    @cached_property
    def tokens_local(self) -> int:
        """Tokens a rank holds between layers: sequence-parallel ranks hold 1/tp of them."""
        return self.b * self.s_cp // (self.par.tp if self.par.sp else 1)

    # ---- dtypes ------------------------------------------------------------------------------------
    @cached_property
    def grad_dtype(self) -> str:
        return self.work.grad_reduce_dtype or DEFAULT_GRAD_DTYPE[self.flavour] or self.work.param_dtype

    @cached_property
    def grad_bytes(self) -> int:
        return DTYPE_BYTES[self.grad_dtype]

    @cached_property
    def param_bytes(self) -> int:
        return DTYPE_BYTES[self.work.param_dtype]

    @cached_property
    def dispatch_bytes(self) -> int:
        return DTYPE_BYTES[self.work.moe_dispatch_dtype or self.work.activation_dtype]

    # ---- layers per pipeline rank ------------------------------------------------------------------
    @cached_property
    def stage_layers(self) -> list[list[int]]:
        """Global layer indices each pipeline rank holds, the MTP modules' transformer blocks (layers
        num_layers, num_layers + 1, ...) on the last rank after its decoder layers when training (Megatron-Core
        gpt_model.py: the MTP block runs on the post-process stage)."""
        layers = self._decoder_stage_layers
        if not self.model.mtp_layers or not self.training:  # inference runs the main model (no speculation)
            return layers
        mtp = list(range(self.model.num_layers, self.model.num_layers + self.model.mtp_layers))
        return [*layers[:-1], layers[-1] + mtp]

    @cached_property
    def _decoder_stage_layers(self) -> list[list[int]]:
        """Decoder layers per pipeline rank: contiguous blocks, or with v virtual stages the
        chunks s, s + p, s + 2p, ... (Megatron's interleaved assignment)."""
        p, v = self.par.pp, self.par.chunks_per_rank
        if v == 1:
            counts = stage_layer_counts(self.par, self.model.num_layers)
            starts = [sum(counts[:s]) for s in range(p)]
            return [list(range(start, start + n)) for start, n in zip(starts, counts, strict=True)]
        per_chunk = self.model.num_layers // (p * v)
        return [[(chunk * p + s) * per_chunk + i for chunk in range(v) for i in range(per_chunk)] for s in range(p)]

    def moe_layers(self, stage: int) -> int:
        return self._moe_layers[stage]

    @cached_property
    def _moe_layers(self) -> tuple[int, ...]:
        # asked for per stage by several rules, the step time and the memory model
        return tuple(sum(self.model.is_moe_layer(i) for i in layers) for layers in self.stage_layers)

    def dense_layers(self, stage: int) -> int:
        return len(self.stage_layers[stage]) - self.moe_layers(stage)

    def is_first(self, stage: int) -> bool:
        return stage == 0

    def is_last(self, stage: int) -> bool:
        return stage == self.par.pp - 1

    @property
    def forward_passes(self) -> int:
        """Forward passes of a layer per micro-batch whose communication happens: 2 with full recompute."""
        return 2 if self.training and self.work.activation_recompute == "full" else 1
