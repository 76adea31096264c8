"""Quantities every traffic rule needs, derived once from the specs (notation of DESIGN.md §5)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from fractions import Fraction
from functools import cached_property

from collectives._hashing import frozen_hash

from ._errors import SpecError
from .flavours import Flavour, Zero
from .model import ModelSpec
from .parallel import Chunk, ParallelSpec, pipeline_chunks, rank_of
from .recipes import Recipe, recipe_of
from .workload import DTYPE_BYTES, WorkloadSpec, weight_bytes


@dataclass(frozen=True)
class Context:
    # Derived quantities are cached properties: the specs are frozen, and the rules, the step time and the
    # memory model ask for them thousands of times per plan.
    model: ModelSpec
    work: WorkloadSpec
    par: ParallelSpec
    devices_per_node: int | None = None  # the cluster's; DeepEP dispatch needs it to split its two legs
    device_sms: int = 0  # the GPU's SMs (GPUSpec.sms; 0 unknown): DeepEP's low-latency grid reads it (rules/expert.py)

    __hash__ = frozen_hash  # the dataclass's hash, computed once (collectives/_hashing.py): memos key on the context

    @cached_property
    def training(self) -> bool:
        return self.work.training

    @cached_property
    def flavour(self) -> Flavour:
        """The framework's traits (planner/flavours/): what the rules read, never the framework's name."""
        return self.par.flavour

    @cached_property
    def layer_kernels_key(self) -> tuple:
        """The value key of what a layer's kernels read of this context (planner/kernels.py layer_kernels_key_of,
        the one list): the per-layer memos' key, built once per context."""
        from .kernels import layer_kernels_key_of  # kernels imports this module

        return interned_key(layer_kernels_key_of(self))

    @cached_property
    def token_kernels_key(self) -> tuple | None:
        """The value key of what a layer's kernels other than core attention read of this context, b and cp only
        through the tokens per rank b·s/cp (planner/kernels.py token_kernels_key; None: inference, decode): the
        token-keyed memos' key (kernels.per_tokens, the spliced layers), built once per context."""
        from .kernels import token_kernels_key  # kernels imports this module

        key = token_kernels_key(self)
        return None if key is None else interned_key(key)

    # ---- the data-parallel reduction ---------------------------------------------------------------
    @cached_property
    def param_copies(self) -> int:
        """Copies of each pipeline stage's parameters a data-parallel replica holds, whose gradients every step sums:
        the schedule's ``StageMap.copies`` when training (DualPipe 2: stage r on rank r and on rank pp - 1 - r;
        DeepSeek-V3 technical report §3.2.1, "requires keeping two copies of the model parameters";
        deepseek-ai/DualPipe 3da1bbe examples/example_dualpipe.py:167-174 adds rank pp - 1 - r's gradient of each
        module to rank r's), 1 otherwise."""
        return self.par.schedule.stage_map.copies if self.training else 1

    @cached_property
    def sharded_units(self) -> bool:
        """Whether the data-parallel rule shards by units (ZeRO-3 / FSDP, and FSDP2's ZeRO-2: rules/data.py
        _sharded_units) rather than reducing flat buffers (DDP, the distributed optimizer, ZeRO-1/2, DeepSpeed)."""
        z = self.par.zero_stage
        return self.flavour.zero is not Zero.DEEPSPEED and (z == 3 or (z == 2 and self.flavour.zero is Zero.FSDP2))

    def dp_ranks(self, expert: bool = False) -> int:
        """Ranks one flat gradient buffer is reduced (and its optimizer states sharded) over: dp x cp (expert_dp for
        expert parameters), times ``param_copies`` where buffers are flat: the copies' replicas join the group, as more
        data-parallel replicas of the rank pair's two stages (rules/data.py; memory._shards). Sharded units keep a
        copy's group (their gathers follow each copy's own order) and all-reduce the reduced shards across the copies
        (HSDP's replicate dimension)."""
        size = self.par.expert_dp if expert else self.par.dp * self.par.cp
        return size if self.sharded_units else size * self.param_copies

    # ---- batch and sequence ------------------------------------------------------------------------
    @cached_property
    def micro_batches(self) -> int:
        """m = B / (b x dp), the micro-batches of a step, for training (what the pipeline schedule runs, the plan's
        ``num_microbatches``); one for inference."""
        if not self.training:
            return 1
        return self.work.global_batch_size // (self.work.micro_batch_size * self.par.dp)

    @cached_property
    def passes(self) -> int:
        """A rank's passes over all its chunks in a step, what every per-pass call, compute and exposure is counted
        by: m, or m / 2 under DualPipe, whose pass over its two stages is one micro-batch each way
        (pipeline.StageMap.passes, review r13a #7); one pass for inference. A reader that counts micro-batches reads
        ``micro_batches``."""
        if not self.training:
            return 1
        return self.par.schedule.passes(self.micro_batches)

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
        """A = b x s/c x h x x: the TP unit (one layer's activations on one CP rank), at the hidden states' width
        (hidden_bytes: bf16 when training under an fp8 recipe). What the pipeline's p2p, the TP all-reduces and
        reduce-scatters, the embedding's and the LM head's calls carry; TE's quantized all-gathers of a linear's
        input are ``gemm_input``."""
        return self.b * self.s_cp * self.model.hidden_size * self.hidden_bytes

    @cached_property
    def tokens_local(self) -> int:
        """Tokens a rank holds between layers: sequence-parallel ranks hold 1/tp of them."""
        return self.b * self.s_cp // (self.par.tp if self.par.sp else 1)

    # ---- dtypes ------------------------------------------------------------------------------------
    @cached_property
    def grad_dtype(self) -> str:
        return self.work.grad_reduce_dtype or self.flavour.grad_reduce_dtype or self.work.param_dtype

    @cached_property
    def grad_bytes(self) -> int:
        return DTYPE_BYTES[self.grad_dtype]

    @cached_property
    def param_bytes(self) -> float:
        """Bytes of one weight element: an int, or a block-scaled inference format's fraction (workload.py
        WEIGHT_FORMAT_BYTES; the totals that multiply it round the product)."""
        return weight_bytes(self.work.param_dtype)

    @cached_property
    def kv_bytes(self) -> int:
        return DTYPE_BYTES[self.work.kv_dtype or self.work.activation_dtype]

    @cached_property
    def hidden_dtype(self) -> str:
        """The dtype of the hidden states an MoE dispatcher moves between a layer's modules: the activation dtype,
        but bf16 when training under an fp8 recipe, whose quantization happens inside TransformerEngine's GEMM
        modules (GroupedLinear quantizes each expert's split after the dispatch; Megatron-LM d98e8a6 / 92c8482e6d
        token_dispatcher.py has no fp8 path: the tokens and the experts' output cross the EP group as they are).
        Also the width of the pipeline's p2p, the TP all-reduces and reduce-scatters and CP's K/V (Context.activation;
        dtype7); TE's quantized gathers of a linear's input are gemm_input."""
        dtype = self.work.activation_dtype
        return "bf16" if self.training and DTYPE_BYTES[dtype] < 2 else dtype

    @cached_property
    def hidden_bytes(self) -> int:
        return DTYPE_BYTES[self.hidden_dtype]

    @cached_property
    def gather_recipe(self) -> Recipe | None:
        """The recipe TransformerEngine quantizes a linear's input with before its sequence-parallel all-gather
        (TransformerEngine v2.9 module/linear.py l. 175-207 and layernorm_linear.py l. 234-268: the input quantized,
        the quantizer set rowwise, then distributed.py gather_along_first_dim(..., quantizer)); the grad output's
        all-gather of a row-parallel linear likewise (module/base.py grad_output_preprocess l. 1160-1192). Training
        with ``workload.fp8_recipe``, or fp8 activations without one (TE's default DelayedScaling), under a flavour
        that gathers quantized (Flavour.quantized_tp_gathers); under a torchao flavour, torchtitan's float8 TP: fp8
        activations and a recipe with float8_all_gather (tensorwise; recipes.check_float8_tp): torchao
        float8_tensor_parallel.py Float8ColwiseParallel / PrepareFloat8ModuleInput cast the input to float8 before
        its redistribute. None otherwise (bf16 gathers)."""
        if not self.training:
            return None
        fp8 = DTYPE_BYTES[self.work.activation_dtype] < 2
        recipe = self.work.recipe or (recipe_of("delayed") if fp8 else None)
        if recipe is None:
            return None
        if self.flavour.torchao_float8:
            return recipe if fp8 and recipe.float8_all_gather else None
        return recipe if self.flavour.quantized_tp_gathers else None

    def gemm_input(self, elements: int, *, grad_output: bool = False, width: int = 0) -> tuple[int, str]:
        """(bytes, dtype label) TE all-gathers for ``elements`` of a linear's GEMM operand (gather_recipe): the
        hidden states' width and dtype without a recipe; with one, the quantized data and the block scales that
        travel beside it in the same message, labelled with the recipe's element dtype (fp8, fp4)
        (TransformerEngine v2.9 distributed.py: _all_gather_fp8 sends the fp8 data alone, the per-tensor scale
        "identical across ranks", and transposes after the gather; _all_gather_fp8_blockwise, _all_gather_mxfp8
        and _all_gather_nvfp4 gather each usage the quantizer asks for, data then scales). ``grad_output``: a
        row-parallel linear's grad output, quantized where the flavour does (Flavour.quantized_grad_output_gather)
        for dgrad and wgrad at once (linear.py l. 567-569: rowwise and columnwise usage), which block recipes gather
        both copies of; per-tensor ones one. ``width``: elements a token (the shard's last dimension; 0: not
        checked), with which a block recipe that cannot quantize the sequence-parallel shard gathers it in bf16
        (Recipe.gathers_unquantized; a grad output is not quantized before its gather, an input is)."""
        recipe = self.gather_recipe
        if recipe is None or (grad_output and not self.flavour.quantized_grad_output_gather):
            return elements * self.hidden_bytes, self.hidden_dtype
        if width and recipe.gathers_unquantized(
            elements // width // self.par.tp, width, quantized_input=not grad_output
        ):
            return elements * self.hidden_bytes, self.hidden_dtype
        directions = 2 if grad_output and recipe.activation_block else 1
        scales = Fraction(recipe.scale_bytes, recipe.activation_block) if recipe.activation_block else 0
        return math.ceil(elements * directions * (Fraction(recipe.element_bytes) + scales)), recipe.gemm_dtype

    @cached_property
    def dispatch_bytes(self) -> int:
        """Bytes of a dispatched element: ``workload.moe_dispatch_dtype`` (DeepSeek-style fp8 dispatch), else the
        hidden states' (hidden_dtype)."""
        given = self.work.moe_dispatch_dtype
        return DTYPE_BYTES[given] if given else self.hidden_bytes

    # ---- layers per pipeline rank ------------------------------------------------------------------
    @cached_property
    def chunks(self) -> tuple:
        """Per pipeline rank, its model chunks (parallel.pipeline_chunks: layers, embedding, loss). When
        training, the MTP modules' transformer blocks (layers num_layers, num_layers + 1, ...) join the chunk
        that holds them (``m`` in the layout; by default the last, with the loss: Megatron-Core gpt_model.py
        runs the MTP block on the post-process stage); inference runs the main model (no speculation). A
        layout validation would refuse (a context built without validate_parallel) keeps the floor split it
        always had: num_layers // (pp·v) layers per chunk."""
        mtp = self.model.mtp_layers
        try:
            chunks = pipeline_chunks(self.par, self.model.num_layers, mtp)
        except SpecError:
            p, v = self.par.pp, max(1, self.par.chunks_per_rank)
            per = self.model.num_layers // (p * v)
            chunks = tuple(
                tuple(
                    Chunk(
                        k,
                        rank_of(self.par, k),
                        tuple(range(k * per, (k + 1) * per)),
                        k == 0,
                        k == p * v - 1,
                        mtp * (k == p * v - 1),
                    )
                    for k in sorted(k for k in range(p * v) if rank_of(self.par, k) == r)
                )
                for r in range(p)
            )
        if not mtp or not self.training:
            return chunks
        blocks = tuple(range(self.model.num_layers, self.model.num_layers + mtp))
        return tuple(tuple(replace(c, layers=c.layers + blocks) if c.mtp else c for c in r) for r in chunks)

    @cached_property
    def chunk_mtp(self) -> tuple[tuple[int, ...], ...]:
        """Per pipeline rank, per chunk, how many of its last layers are MTP blocks (training; 0 otherwise):
        what recompute's plans read of the MTP (multi_token_prediction.py checkpoints a module itself)."""
        n = self.model.mtp_layers if self.training else 0
        return tuple(tuple(n if c.mtp else 0 for c in chunks) for chunks in self.chunks)

    @cached_property
    def stage_layers(self) -> list[list[int]]:
        """Global layer indices each pipeline rank holds, over all its chunks (contiguous blocks without
        virtual stages; chunks s, s + p, s + 2p, ... interleaved; the V's two for ZBV and DualPipeV; DualPipe's stages
        r and pp - 1 - r, each a copy's), the MTP blocks with their chunk."""
        return [[i for c in chunks for i in c.layers] for chunks in self.chunks]

    @cached_property
    def chunk_kinds(self) -> tuple[tuple[tuple[bool, ...], ...], ...]:
        """Per pipeline rank, per chunk, whether each of its layers is MoE, in order: what recompute's plans,
        the activations' and the chunk shares' value keys read of the layers (never their global indices)."""
        return tuple(tuple(tuple(map(self.model.is_moe_layer, c.layers)) for c in chunks) for chunks in self.chunks)

    @cached_property
    def stage_roles(self) -> tuple[tuple[int, int, bool, bool, bool, bool], ...]:
        """Per pipeline rank: its dense and MoE layers, whether it holds the loss, the MTP modules, the embedding
        and the decoder's final norm (memory.holds_final_norm): what the stage-pass key reads of the split
        (compute.stage_pass_key), once per context. They read the model, whether it trains and the split alone."""
        from .memory import holds_final_norm  # memory imports this module

        return tuple(
            (
                len(self.stage_layers[s]) - self._moe_layers[s],
                self._moe_layers[s],
                self.is_last(s),
                self.holds_mtp(s),
                self.is_first(s),
                any(holds_final_norm(self, c) for c in self.chunks[s]),
            )
            for s in range(len(self.chunks))
        )

    def moe_layers(self, stage: int) -> int:
        return self._moe_layers[stage]

    @cached_property
    def _moe_layers(self) -> tuple[int, ...]:
        # asked for per stage by several rules, the step time and the memory model
        return tuple(sum(self.model.is_moe_layer(i) for i in layers) for layers in self.stage_layers)

    def dense_layers(self, stage: int) -> int:
        return len(self.stage_layers[stage]) - self.moe_layers(stage)

    def is_first(self, stage: int) -> bool:
        """Whether the rank holds the embedding (rank 0 in every layout)."""
        return any(c.embedding for c in self.chunks[stage])

    def is_last(self, stage: int) -> bool:
        """Whether the rank holds the loss: the last rank, or rank 0 in a V (ZBV, DualPipeV); ranks 0 and pp - 1 under
        DualPipe (each holds a copy's last stage)."""
        return any(c.loss for c in self.chunks[stage])

    def end_copies(self, stage: int) -> int:
        """How many copies of the model enter or leave the pipeline on the rank (a chunk with the embedding or the
        loss; pipeline.StageMap.copy_of): each of its passes runs one micro-batch of each such copy at an end. 1 on
        1F1B's ranks 0 and pp - 1 and on a V's rank 0 (a micro-batch enters and leaves there), 2 on DualPipe's ranks 0
        and pp - 1 (one direction's micro-batches enter, the other's leave), 0 elsewhere (review r13a #5)."""
        where = self.par.schedule.stage_map
        ends = {where.copy_of(c.index, self.par.pp) for c in self.chunks[stage] if c.embedding or c.loss}
        return len(ends)

    def holds_mtp(self, stage: int) -> bool:
        """Whether the rank holds the MTP modules: the chunk with ``m`` in the layout, by default the last
        (Megatron-LM d98e8a6 multi_token_prediction.py mtp_on_this_rank: with a layout, the rank whose chunk
        counts LayerType.mtp; without one, the last pipeline stage)."""
        return any(c.mtp for c in self.chunks[stage])

    def mtp_embedding_copy(self, stage: int) -> bool:
        """Whether the rank builds a copy of the word embedding for its MTP modules: gpt_model.py builds the
        embedding on a chunk that is ``pre_process or mtp_process``, so an MTP chunk without the embedding
        (every one but pp 1's single chunk) holds its own copy (language_module.py
        setup_embeddings_and_output_layer: "a copy of embedding layer in the mtp process stage")."""
        return any(c.mtp and not c.embedding for c in self.chunks[stage])


class ValueKey(tuple):
    """A value key (a plain tuple of the values a memoised function reads) that keeps its hash: equal to, and
    hashing as, the tuple of its items, so a memo looks it up as it would the tuple, but hashed once, not at
    every look-up (a layer's key holds the model, the workload and ~35 more items: ~6 us a hash)."""

    def __hash__(self) -> int:
        found = self.__dict__.get("_hash")
        if found is None:
            found = self.__dict__["_hash"] = tuple.__hash__(self)
        return found

    def __reduce__(self):  # pickled as its items: a hash is not carried to another process (its string seeds)
        return (ValueKey, (tuple(self),))


_KEYS: dict = {}  # a key's value -> its one ValueKey
KEYS_KEPT = 1 << 14  # distinct keys kept before the table is cleared


def interned_key(key: tuple) -> ValueKey:
    """The one ValueKey of ``key``'s value, so that the contexts sharing a key share the object: a memo's look-up
    then finds its entry by identity, without comparing the items (WorkloadSpec's generated __eq__ walks ~60
    fields: ~6 us). Bounded: cleared past KEYS_KEPT keys; a key made before a clear still equals (and hashes as)
    one made after, so a memo entry is found either way, only by comparing its items."""
    found = _KEYS.get(key)
    if found is None:
        if len(_KEYS) >= KEYS_KEPT:
            _KEYS.clear()
        found = _KEYS[key] = ValueKey(key)
    return found


def device_sms(cluster) -> int:
    """The SMs of a ClusterSpec's GPU (GPUSpec.sms), 0 where unknown: the fact Context.device_sms carries."""
    return cluster.gpu.sms if cluster.gpu else 0
