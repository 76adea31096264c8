"""Parallel layout: degrees, schedule, ZeRO stage and framework flavour, checked against model, workload and
cluster (in the manner of torchtitan's ParallelDims: every message prints the numbers that do not fit)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, fields
from functools import lru_cache

from collectives._hashing import frozen_hash

from . import flavours
from ._errors import SpecError, got, one_of, shown
from .documents import pack_moments
from .flavours import Flavour
from .model import ModelSpec
from .pipeline import SCHEDULE_TRAITS, ScheduleTraits
from .recipes import check_act_fp8_store, check_param_gather, check_recipe_framework
from .workload import DISPATCH_FORMATS, USERBUFFERS_FIELDS, WorkloadSpec, check_recompute_modules

SCHEDULES = tuple(SCHEDULE_TRAITS)  # 1f1b, interleaved, gpipe, zb-h1, zbv, dualpipe, dualpipev (planner/pipeline.py)
# the built-in training flavours the search enumerates (planner/flavours/, Flavour.searched), in registration order
FRAMEWORKS = tuple(n for n in flavours.names() if flavours.flavour(n).searched)
CP_COMM = ("p2p", "all_gather", "a2a")
# Megatron-Core --moe-token-dispatcher-type: alltoall (MoEAlltoAllTokenDispatcher), allgather
# (MoEAllGatherTokenDispatcher), flex with --moe-enable-deepep (MoEFlexTokenDispatcher: "deepep"), flex with
# --moe-flex-dispatcher-backend hybridep (NVIDIA's HybridEP, DeepEP's hybrid-ep branch: "hybridep", rules/deepep.py);
# deepep_ll: DeepEP's low-latency kernels for decoding (rules/expert.py); the serving engines' own exchanges with
# data-parallel attention, inference only (rules/engine_gather.py): agrs (vLLM), dp_gather (SGLang), agrs_quant
# (TensorRT-LLM), replicated (tensor-parallel attention: no MoE collective)
EP_DISPATCH = (
    "alltoall",
    "allgather",
    "deepep",
    "deepep_ll",
    "agrs",
    "dp_gather",
    "agrs_quant",
    "replicated",
    "hybridep",
)
INFERENCE_DISPATCH = ("deepep_ll", "agrs", "dp_gather", "agrs_quant", "replicated")
# the dispatchers whose rows a post-quant (workload.DISPATCH_FORMATS) dispatch may carry: DeepEP's normal and
# low-latency kernels, as TensorRT-LLM runs them (communication/deep_ep.py, deep_ep_low_latency.py)
POST_QUANT_DISPATCHES = ("deepep", "deepep_ll")
DEFAULT_ORDER = "tp-cp-ep-dp-pp"


@dataclass(frozen=True)
class ZeroConfig:
    """DeepSpeed's ``zero_optimization`` knobs that shape its traffic, by DeepSpeed's own names, in elements,
    with DeepSpeed's defaults (deepspeed/runtime/zero/config.py, DeepSpeed 0.19.6 commit edaa722:
    reduce_bucket_size / allgather_bucket_size 5e8, stage3_prefetch_bucket_size 5e7,
    stage3_param_persistence_threshold 1e5, stage3_max_reuse_distance 1e9, stage3_max_live_parameters 1e9,
    sub_group_size 1e9)."""

    reduce_bucket_size: int = 500_000_000
    allgather_bucket_size: int = 500_000_000
    stage3_prefetch_bucket_size: int = 50_000_000
    stage3_param_persistence_threshold: int = 100_000
    stage3_max_reuse_distance: int = 1_000_000_000
    stage3_max_live_parameters: int = 1_000_000_000
    sub_group_size: int = 1_000_000_000
    # ZeRO++ (Wang et al. 2023; DeepSpeed 0.19.8 runtime/zero/config.py:324-340, ZeRO-3 only): hpZ keeps a
    # secondary partition over groups of this many consecutive ranks for the re-gathers (1: off)
    zero_hpz_partition_size: int = 1
    zero_quantized_weights: bool = False  # qwZ: parameter all-gathers in int8 with fp32 block scales
    zero_quantized_gradients: bool = False  # qgZ: gradient reduce-scatter as int4 all-to-alls across nodes
    # when calls are issued, not which: overlap_comm None is DeepSpeed's dynamic default (True at ZeRO-3 only,
    # config.py overlap_comm_valid); contiguous_gradients (default True) copies gradients into one buffer
    overlap_comm: bool | None = None
    contiguous_gradients: bool = True


ZERO_BOOLS = ("zero_quantized_weights", "zero_quantized_gradients", "overlap_comm", "contiguous_gradients")
# DeepSpeed 0.19.8 DeepSpeedZeroConfig's other keys (runtime/zero/config.py, with their stage3_ aliases): real
# keys the plan does not model are refused as such, not as unknown
DEEPSPEED_UNMODELLED = frozenset(
    [
        "stage",
        "reduce_scatter",
        "use_multi_rank_bucket_allreduce",
        "allgather_partitions",
        "compute_grad_norm",
        "load_from_fp32_weights",
        "elastic_checkpoint",
        "offload_param",
        "offload_optimizer",
        "zenflow",
        "cpu_offload_param",
        "cpu_offload_use_pin_memory",
        "cpu_offload",
        "prefetch_bucket_size",
        "param_persistence_threshold",
        "model_persistence_threshold",
        "max_live_parameters",
        "max_reuse_distance",
        "gather_16bit_weights_on_model_save",
        "module_granularity_threshold",
        "use_all_reduce_for_fetch_params",
        "allgather_sequential",
        "stage3_gather_fp16_weights_on_model_save",
        "ignore_unused_parameters",
        "legacy_stage1",
        "round_robin_gradients",
        "parameter_alignment",
        "zero_quantized_nontrainable_weights",
        "memory_efficient_linear",
        "pipeline_loading_checkpoint",
        "override_module_apply",
        "log_trace_cache_warnings",
        "enable_sanity_checks",
        "save_muon_momentum_buffer_in_memory",
        "leaf_module",
        "stage3_model_persistence_threshold",
        "stage3_gather_16bit_weights_on_model_save",
        "stage3_module_granularity_threshold",
        "stage3_use_all_reduce_for_fetch_params",
        "stage3_allgather_sequential",
    ]
)


@dataclass(frozen=True)
class DDPConfig:
    """torch DistributedDataParallel's switches that change its calls, by PyTorch's own names, with its defaults
    (torch 2.13 torch/nn/parallel/distributed.py DistributedDataParallel.__init__). The torch flavour at ZeRO-0
    only (rules/data.py reads them):

    - ``find_unused_parameters``: the buckets are never rebuilt (reducer.cpp should_rebuild_buckets:
      ``(static_graph_ || !find_unused_parameters_) && !has_rebuilt_bucket_``), so the initial layout stays, and
      every step all-reduces the int32 used-parameter map (one int per parameter tensor) once the last bucket
      is ready (reducer.cpp mark_variable_ready -> all_reduce_local_used_map).
    - ``static_graph``: the buckets are rebuilt one step later than plain DDP (the first iteration delays its
      reduction, the second records the gradient order), and no used-parameter map after the first step.
    - ``gradient_as_bucket_view``: gradients alias the buckets; the calls and their bytes do not change.
    - ``bucket_cap_mb``: the bucket cap; None is DDP's 25 MiB with a 1 MiB first bucket
      (dist._DEFAULT_FIRST_BUCKET_BYTES, distributed.py _BucketCapacityConfig), a given value caps every bucket.
    """

    find_unused_parameters: bool = False
    static_graph: bool = False
    gradient_as_bucket_view: bool = False
    bucket_cap_mb: float | None = None

    @property
    def given(self) -> bool:
        return self != DDPConfig()


def zero_config_from_dict(values: dict | None) -> ZeroConfig:
    """A ZeroConfig from a request's ``parallel.zero_config``; an unknown key or a bad value is a SpecError."""
    if not values:
        return ZeroConfig()
    known = {f.name for f in fields(ZeroConfig)}
    for key, value in values.items():
        if key in DEEPSPEED_UNMODELLED:
            raise SpecError(
                f"parallel.zero_config.{key}",
                f"DeepSpeed's zero_optimization key {key!r} is not modelled here; modelled: {', '.join(sorted(known))}",
            )
        if key not in known:
            raise SpecError(
                f"parallel.zero_config.{key}",
                f"DeepSpeed has no zero_optimization key {key!r}; known: {', '.join(sorted(known))}",
            )
        if key in ZERO_BOOLS:
            if not (isinstance(value, bool) or (value is None and key == "overlap_comm")):
                raise SpecError(f"parallel.zero_config.{key}", f"must be true or false, got {got(value)}")
            continue
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
            or value != int(value)
            or value < 0
        ):
            raise SpecError(f"parallel.zero_config.{key}", f"must be a whole number of elements >= 0, got {got(value)}")
    return ZeroConfig(**{k: v if k in ZERO_BOOLS else int(v) for k, v in values.items()})


@dataclass(frozen=True)
class ParallelSpec:
    __hash__ = frozen_hash  # computed once (collectives/_hashing.py): the planner's memos key on the spec

    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    ep: int = 1
    expert_tp: int | None = None  # as given; None: the flavour's default, read as ``etp``
    zero_stage: int = 0
    sequence_parallel: bool = False
    virtual_pipeline_stages: int = 1  # model chunks per pipeline rank (Megatron's virtual pipeline size)
    pipeline_schedule: str = "1f1b"
    hybrid_shard_size: int | None = None  # ZeRO-3 inside groups of this many DP ranks, replicas across them
    dp_bucket_bytes: int | None = None  # None: the framework default (see rules/data.py)
    order: str = DEFAULT_ORDER
    framework: str = flavours.DEFAULT  # a registered flavour's name (planner/flavours/)
    cp_comm: str = "p2p"  # p2p (ring attention) | all_gather | a2a (Ulysses)
    # torch context_parallel's set_rotate_method: allgather | alltoall (a flavour with Flavour.cp_rotate_methods;
    # None: its default, allgather); rules/context_parallel.py
    cp_rotate_method: str | None = None
    # torch context_parallel's _cp_options.enable_load_balance (None: its default, on; kernels.causal_keys)
    cp_load_balance: bool | None = None
    # Megatron --decoder-first/last-pipeline-num-layers: uneven stages, the rest split evenly in between
    first_stage_layers: int | None = None
    last_stage_layers: int | None = None
    zero_config: ZeroConfig = field(default_factory=ZeroConfig)  # DeepSpeed flavour only
    # alltoall | allgather | deepep (node-limited, RDMA then NVLink: DeepSeek-V3 §3.2). Megatron's CLI default
    # is allgather; every published EP recipe sets alltoall (or flex), which stays this planner's default
    # deepep_ll: DeepEP's low-latency kernels for decoding, one direct send per token and expert (rules/expert.py)
    ep_dispatch: str = "alltoall"
    # ---- pipeline layout (issue 21; parse and rules in the pipeline-layout block below) ----
    # Megatron --pipeline-model-parallel-layout: "E|(t|)*126,L" or a list of pp*v lists of E/t/m/L
    pipeline_layout: str | tuple[tuple[str, ...], ...] | None = None
    # Megatron --account-for-embedding/loss-in-pipeline-split: the embedding / the loss count as one layer
    account_for_embedding_in_pipeline_split: bool = False
    account_for_loss_in_pipeline_split: bool = False
    # torch.distributed.pipelining / torchtitan pipeline_parallel_split_points: the first layer of stages 1..
    pipeline_split_points: tuple[int, ...] | None = None
    # ---- framework switches by the framework's own names (planner/flavours/: which flavour reads them) ----
    ddp: DDPConfig = field(default_factory=DDPConfig)  # torch DistributedDataParallel, ZeRO-0
    # tp past num_kv_heads replicates KV heads: a serving engine's trait (EngineTraits.kv_head_replication, which
    # planner/serving sets on its workers' layouts); None: the framework's (Flavour.kv_head_replication). Not an
    # HTTP field of /v1/plan (app/schemas ParallelIn)
    kv_head_replication: bool | None = None

    @property
    def flavour(self) -> Flavour:
        """The framework's traits object; an unregistered name is a SpecError on parallel.framework."""
        return flavours.flavour(self.framework)

    @property
    def etp(self) -> int:
        """Expert TP as the framework runs it: ``expert_tp`` when given, else the flavour's default
        (Megatron: tp; torch, DeepSpeed: 1). Resolved on every read, so ``dataclasses.replace`` of the
        framework changes it."""
        return self.expert_tp if self.expert_tp is not None else self.flavour.expert_tp(self)

    @property
    def replicates_kv_heads(self) -> bool:
        """Whether tp may pass num_kv_heads, each head copied on tp / num_kv_heads ranks (kv_heads_rule)."""
        return self.flavour.kv_head_replication if self.kv_head_replication is None else self.kv_head_replication

    @property
    def world_size(self) -> int:
        return self.tp * self.cp * self.pp * self.dp

    @property
    def expert_dp(self) -> int:
        """Megatron re-partitions tp x cp x dp into expert_tp x ep x expert_dp (parallel_state.py)."""
        return self.tp * self.cp * self.dp // (self.etp * self.ep)

    @property
    def sp(self) -> bool:
        """Sequence parallelism only changes anything with tp > 1 (Megatron turns it off at tp = 1)."""
        return self.sequence_parallel and self.tp > 1

    @property
    def schedule(self) -> ScheduleTraits:
        """The pipeline schedule's traits (planner/pipeline.py); 1F1B's for a name validation will reject."""
        return SCHEDULE_TRAITS.get(self.pipeline_schedule) or SCHEDULE_TRAITS["1f1b"]

    @property
    def chunks_per_rank(self) -> int:
        """Model chunks per pipeline rank: v of the interleaved schedule or of an explicit layout / split,
        2 for the V schedules (ZBV, DualPipeV) and DualPipe (its two stages, one a direction), else 1."""
        return virtual_stages(self) // self.pp if self.pp >= 1 else 1


def validate_parallel(par: ParallelSpec, model: ModelSpec, work: WorkloadSpec, num_devices: int) -> None:
    _degrees(par)
    _choices(par)
    if par.world_size != num_devices:
        raise SpecError(
            "parallel",
            f"tp*cp*pp*dp = {par.tp}*{par.cp}*{par.pp}*{par.dp} = {par.world_size} but the cluster has "
            f"{num_devices} devices",
        )
    _fits_model(par, model)
    _fits_moe(par, model, work)
    _fits_workload(par, model, work)


def _degrees(par: ParallelSpec) -> None:
    for name in ("tp", "pp", "dp", "cp", "ep", "expert_tp", "virtual_pipeline_stages"):
        if getattr(par, name) is not None and getattr(par, name) < 1:
            raise SpecError(f"parallel.{name}", f"must be >= 1, got {getattr(par, name)}")
    if par.zero_stage not in (0, 1, 2, 3):
        raise SpecError("parallel.zero_stage", f"must be 0, 1, 2 or 3, got {par.zero_stage}")
    if par.dp_bucket_bytes is not None and par.dp_bucket_bytes < 1:
        raise SpecError("parallel.dp_bucket_bytes", f"must be >= 1, got {par.dp_bucket_bytes}")


def _choices(par: ParallelSpec) -> None:
    one_of("parallel.pipeline_schedule", par.pipeline_schedule, SCHEDULE_TRAITS)  # at call time: every registered one
    if par.flavour.kind != "training":
        raise SpecError(
            "parallel.framework",
            f"{par.framework!r} is a serving engine, not a training framework; training frameworks: "
            f"{', '.join(flavours.names())}",
        )
    framework_pipeline_rule(par)
    _ddp(par)
    _zero_plus_plus(par)
    one_of("parallel.cp_comm", par.cp_comm, CP_COMM)
    _cp_rotate(par)
    one_of("parallel.ep_dispatch", par.ep_dispatch, EP_DISPATCH)
    dims = par.order.split("-")
    if sorted(dims) != sorted(DEFAULT_ORDER.split("-")):
        raise SpecError("parallel.order", f"must name tp, cp, ep, dp and pp once each, got {par.order!r}")
    _interleaving(par)
    _schedule_fits_pp(par)
    _hybrid_shard(par)


def framework_pipeline_rule(par: ParallelSpec) -> None:
    """What a framework runs beside pipeline parallelism (pp > 1): its pipeline schedules
    (Flavour.pipeline_schedules) and its highest ZeRO stage (Flavour.pp_max_zero_stage; DeepSpeed's sources in
    planner/flavours/deepspeed.py). It reads only pp, the schedule, the ZeRO stage and the framework's two traits:
    the search applies it to whole variants before it walks them (planner/search/space.py ``Space.pipeline_rule``),
    validate_parallel to one layout."""
    runs = par.flavour.pipeline_schedules
    if par.pp > 1 and runs is not None and par.pipeline_schedule not in runs:
        raise SpecError(
            "parallel.pipeline_schedule",
            f"framework {par.framework!r} runs only the {', '.join(sorted(runs))} pipeline schedule(s), "
            f"got {par.pipeline_schedule!r} at pp {par.pp}",
        )
    top = par.flavour.pp_max_zero_stage
    if par.pp > 1 and top is not None and par.zero_stage > top:
        raise SpecError(
            "parallel.zero_stage",
            f"framework {par.framework!r} runs ZeRO stages up to {top} beside pipeline parallelism, got zero_stage "
            f"{par.zero_stage} at pp {par.pp}",
        )


def _cp_rotate(par: ParallelSpec) -> None:
    """PyTorch's rotate method (cp_rotate_method) under a flavour that runs torch's context_parallel; TE's
    cp_comm_type (cp_comm) under the others."""
    methods = par.flavour.cp_rotate_methods
    if par.cp_rotate_method is not None:
        if not methods:
            raise SpecError(
                "parallel.cp_rotate_method",
                f"is torch context_parallel's set_rotate_method; framework {par.framework!r} takes cp_comm "
                f"({', '.join(CP_COMM)})",
            )
        one_of("parallel.cp_rotate_method", par.cp_rotate_method, methods)
    if par.cp_load_balance is not None and not methods:
        raise SpecError(
            "parallel.cp_load_balance",
            f"is torch context_parallel's _cp_options.enable_load_balance; framework {par.framework!r} shards the "
            "sequence in 2 x cp chunks, balanced (TransformerEngine's context parallelism)",
        )
    if methods and par.cp_comm != "p2p":
        raise SpecError(
            "parallel.cp_comm",
            f"{par.cp_comm!r} is TransformerEngine's cp_comm_type; framework {par.framework!r} runs torch's "
            f"context_parallel ring attention: choose its rotation with cp_rotate_method ({', '.join(methods)})",
        )


def _hybrid_shard(par: ParallelSpec) -> None:
    if par.hybrid_shard_size is not None:
        if par.zero_stage != 3:
            raise SpecError(
                "parallel.hybrid_shard_size", f"hybrid sharding is a ZeRO-3 option, zero_stage is {par.zero_stage}"
            )
        if par.hybrid_shard_size < 1 or par.dp % par.hybrid_shard_size:
            raise SpecError(
                "parallel.hybrid_shard_size", f"hybrid_shard_size {par.hybrid_shard_size} must divide dp {par.dp}"
            )


def _interleaving(par: ParallelSpec) -> None:
    """The interleaved schedule's chunks per rank, from the virtual stages or an explicit layout."""
    if par.pipeline_layout is not None:
        _parsed(par.pipeline_layout)  # a malformed layout names itself before what it implies
    explicit = par.pipeline_layout is not None or par.pipeline_split_points is not None
    v = par.chunks_per_rank if explicit else par.virtual_pipeline_stages
    if par.schedule.interleaved and (v < 2 or par.pp < 2):
        raise SpecError(
            "parallel.virtual_pipeline_stages",
            f"the interleaved schedule needs pp >= 2 and virtual_pipeline_stages >= 2, got pp {par.pp}, "
            f"virtual_pipeline_stages {v}",
        )


def _schedule_fits_pp(par: ParallelSpec) -> None:
    """What the zero-bubble and DualPipe schedules need of the pipeline (sources in planner/pipeline.py)."""
    sched, p, traits = par.pipeline_schedule, par.pp, par.schedule
    if p < traits.min_pp:
        raise SpecError(
            "parallel.pipeline_schedule", f"{sched} is a pipeline schedule: it needs pp >= {traits.min_pp}, got pp {p}"
        )
    if traits.even_pp and p % 2:
        raise SpecError("parallel.pp", f"{traits.label} needs an even pp ({traits.even_pp}), got pp {p}")
    if traits.v_shape and par.virtual_pipeline_stages not in (1, 2):
        raise SpecError(
            "parallel.virtual_pipeline_stages",
            f"{sched} runs exactly 2 chunks per rank, got virtual_pipeline_stages {par.virtual_pipeline_stages}",
        )
    if par.pipeline_split_points is not None and not (traits.interleaved or traits.v_shape):
        n = len(par.pipeline_split_points) + 1
        if n != p:
            raise SpecError(
                "parallel.pipeline_split_points",
                f"{n} stages over pp {p}: one stage per rank with {sched}; use interleaved for {n // p} per rank",
            )


def _ddp(par: ParallelSpec) -> None:
    if not par.ddp.given:
        return
    if not (par.flavour.ddp_switches and par.zero_stage == 0):
        raise SpecError(
            "parallel.ddp",
            f"DistributedDataParallel switches need framework torch at zero_stage 0 (DDP), got framework "
            f"{par.framework!r}, zero_stage {par.zero_stage}",
        )
    cap = par.ddp.bucket_cap_mb
    if cap is not None:
        if not (math.isfinite(cap) and 0 < cap <= 1 << 20):
            raise SpecError("parallel.ddp.bucket_cap_mb", f"must be > 0 and <= 1,048,576 MiB, got {got(cap)}")
        if par.dp_bucket_bytes is not None:
            raise SpecError(
                "parallel.ddp.bucket_cap_mb",
                f"give bucket_cap_mb or dp_bucket_bytes, not both (got {cap} MiB and {par.dp_bucket_bytes} bytes)",
            )


def _zero_plus_plus(par: ParallelSpec) -> None:
    """ZeRO++ is a DeepSpeed ZeRO-3 feature (stage3.py takes zero_hpz_partition_size, the quantized weights and
    gradients; stage_1_and_2.py does not)."""
    zc = par.zero_config
    used = [
        k
        for k, on in (
            ("zero_hpz_partition_size", zc.zero_hpz_partition_size > 1),
            ("zero_quantized_weights", zc.zero_quantized_weights),
            ("zero_quantized_gradients", zc.zero_quantized_gradients),
        )
        if on
    ]
    if not used:
        return
    if not par.flavour.zero_plus_plus or par.zero_stage != 3:
        raise SpecError(
            f"parallel.zero_config.{used[0]}",
            f"ZeRO++ is DeepSpeed ZeRO-3 (stage3.py); framework is {par.framework!r}, zero_stage {par.zero_stage}",
        )
    hpz, shards = zc.zero_hpz_partition_size, par.dp * par.cp
    if hpz > 1 and shards % hpz:
        raise SpecError(
            "parallel.zero_config.zero_hpz_partition_size",
            f"zero_hpz_partition_size {hpz} must divide the data-parallel group dp*cp = {shards} "
            "(groups._create_zero_param_parallel_group: _ensure_divisibility)",
        )


def _fits_model(par: ParallelSpec, m: ModelSpec) -> None:
    t = par.tp
    if m.num_attention_heads % t:
        raise SpecError("parallel.tp", f"num_attention_heads {m.num_attention_heads} is not divisible by tp {t}")
    broken = None if m.mla else kv_heads_rule(m.kv_heads, t, par.replicates_kv_heads)
    if broken:
        raise SpecError("parallel.tp", broken)
    if m.ffn_hidden_size % t:
        raise SpecError("parallel.tp", f"ffn_hidden_size {m.ffn_hidden_size} is not divisible by tp {t}")
    _ulysses(par, m)
    pipeline_chunks(par, m.num_layers, getattr(m, "mtp_layers", 0))  # raises naming the layout's numbers


def kv_heads_rule(kv_heads: int, tp: int, replication: bool) -> str | None:
    """The rule a layout's KV heads break over ``tp`` ranks, or None. Without replication (the training
    frameworks: Flavour.kv_head_replication) tp must divide num_kv_heads. With it (the serving engines), tp may also
    be a multiple of num_kv_heads, each head then held by tp / num_kv_heads ranks: vLLM and SGLang
    QKVParallelLinear ``num_kv_head_replicas = divide(tp_size, total_num_kv_heads)`` once tp_size >= the heads
    (vllm/model_executor/layers/linear.py at 0036d38de46c, python/sglang/srt/layers/linear.py at 0079fcc18b3e;
    divide asserts the remainder is 0), TensorRT-LLM duplicate_kv_weight ``assert tensor_parallel_size %
    num_kv_heads == 0`` (tensorrt_llm/_torch/models/modeling_utils.py at cb4c622cf5bb)."""
    if kv_heads % tp == 0 or (replication and tp % kv_heads == 0):
        return None
    if not replication:
        return f"num_kv_heads {kv_heads} is not divisible by tp {tp}"
    return (
        f"tp {tp} neither divides num_kv_heads {kv_heads} nor is a multiple of it: the serving engines split the KV "
        f"heads over the tp ranks or replicate each on tp / num_kv_heads of them, a whole number (vLLM, SGLang "
        f"QKVParallelLinear divide(tp_size, total_num_kv_heads); TensorRT-LLM duplicate_kv_weight)"
    )


def _ulysses(par: ParallelSpec, m: ModelSpec) -> None:
    """Ulysses all-to-all moves whole heads: TransformerEngine asserts the heads of one TP rank divide
    by cp, for q and for k/v (transformer_engine/pytorch/attention.py AttnFuncWithCPAndQKVOA2A:
    "The number of attention heads needs to be divisible by CP size!")."""
    if par.cp_comm != "a2a" or par.cp == 1:
        return
    kv = m.num_attention_heads if m.mla else m.kv_heads
    for name, heads in (("num_attention_heads", m.num_attention_heads), ("num_kv_heads", kv)):
        if (heads // par.tp) % par.cp:
            raise SpecError(
                "parallel.cp",
                f"{name} {heads} / tp {par.tp} = {heads // par.tp} is not divisible by cp {par.cp} (Ulysses)",
            )


def stage_layer_counts(par: ParallelSpec, num_layers: int) -> list[int]:
    """Decoder layers per pipeline rank (all its chunks), from ``pipeline_chunks``."""
    return [sum(len(c.layers) for c in chunks) for chunks in pipeline_chunks(par, num_layers)]


def _uneven_counts(par: ParallelSpec, num_layers: int) -> list[int]:
    """Megatron --decoder-first/last-pipeline-num-layers: the given ends, the rest split evenly in between."""
    if par.pp < 2:
        raise SpecError("parallel.first_stage_layers", f"uneven stages need pp >= 2, got pp {par.pp}")
    first, last = par.first_stage_layers, par.last_stage_layers
    given = [x for x in (first, last) if x is not None]
    if any(x < 1 for x in given):
        raise SpecError("parallel.first_stage_layers", f"first/last stage layers must be >= 1, got {given}")
    middle = par.pp - len(given)
    rest = num_layers - sum(given)
    if (middle == 0 and rest != 0) or (middle and (rest < middle or rest % middle)):
        raise SpecError(
            "parallel.first_stage_layers",
            f"num_layers {num_layers} - first/last {'+'.join(map(str, given))} = {rest} layers do not split "
            f"evenly over the {middle} other stages",
        )
    counts = [rest // middle if middle else 0] * par.pp
    if first is not None:
        counts[0] = first
    if last is not None:
        counts[-1] = last
    return counts


def _fits_moe(par: ParallelSpec, m: ModelSpec, work: WorkloadSpec) -> None:
    if m.moe is None:
        # expert_tp equal to tp is what Megatron's default resolves to, harmless on a dense model
        if par.ep > 1 or par.etp not in (1, par.tp):
            raise SpecError("parallel.ep", f"ep {par.ep} / expert_tp {par.etp} need an MoE model (model.moe is null)")
        return
    if m.moe.num_experts % par.ep:
        raise SpecError("parallel.ep", f"num_experts {m.moe.num_experts} is not divisible by ep {par.ep}")
    dense = par.tp * par.cp * par.dp
    if dense % (par.etp * par.ep):
        raise SpecError(
            "parallel.ep",
            f"expert_tp*ep = {par.etp}*{par.ep} = {par.etp * par.ep} does not divide "
            f"tp*cp*dp = {par.tp}*{par.cp}*{par.dp} = {dense}"
            + (
                ""
                if par.expert_tp is not None
                else " (expert_tp defaults to tp, as Megatron's --expert-tensor-parallel-size;"
                " set expert_tp to 1 for experts without TP)"
            ),
        )
    if m.moe.expert_ffn_hidden_size % par.etp:
        raise SpecError(
            "parallel.expert_tp",
            f"expert_ffn_hidden_size {m.moe.expert_ffn_hidden_size} is not divisible by expert_tp {par.etp}",
        )
    # a training rule (megatron/training/arguments.py); serving engines run TP + EP with all-reduces
    if par.tp > 1 and par.ep > 1 and not par.sequence_parallel and par.flavour.moe_tp_ep_needs_sp and work.training:
        raise SpecError(
            "parallel.sequence_parallel",
            f"{par.flavour.display} requires sequence_parallel with MoE, tp > 1 and ep > 1; got tp {par.tp}, "
            f"ep {par.ep}, sequence_parallel false",
        )


def check_graph_scope(w: WorkloadSpec, par: ParallelSpec) -> None:
    """workload.cuda_graph_scope's framework rule: each scope must be one the flavour runs (Flavour.te_graph_scopes:
    Megatron-Core's TE graphs of an MoE layer). Here, with the layout's rules, so that the search prunes the
    frameworks that refuse it (search/space.py Space.check) and /v1/plan refuses the same layouts."""
    runs = par.flavour.te_graph_scopes
    missing = [s for s in w.cuda_graph_scope if s not in runs]
    if missing:
        has = ", ".join(runs) if runs else "none"
        raise SpecError(
            "workload.cuda_graph_scope",
            f"{missing[0]} is a TransformerEngine CUDA graph scope of Megatron-Core; framework {par.framework!r} runs "
            f"{has}",
        )


def _fits_workload(par: ParallelSpec, m: ModelSpec, w: WorkloadSpec) -> None:
    if par.ep_dispatch in INFERENCE_DISPATCH and w.training:
        raise SpecError(
            "parallel.ep_dispatch",
            f"{par.ep_dispatch} is a serving engine's MoE exchange (deepep_ll: DeepEP's low-latency kernels), "
            "inference only; training uses alltoall, allgather, deepep or hybridep",
        )
    if par.ep_dispatch == "hybridep" and w.moe_dispatch_dtype == "fp8":
        raise SpecError(
            "workload.moe_dispatch_dtype",
            "the HybridEP dispatcher does not support fp8 dispatch (Megatron-LM d98e8a6 "
            "megatron/core/transformer/moe/fused_a2a.py init_hybrid_ep_buffer: assert not fp8_dispatch); got "
            "moe_dispatch_dtype 'fp8' with ep_dispatch 'hybridep'",
        )
    if w.moe_dispatch_dtype in DISPATCH_FORMATS and par.ep_dispatch not in POST_QUANT_DISPATCHES:
        raise SpecError(
            "workload.moe_dispatch_dtype",
            f"a {w.moe_dispatch_dtype} dispatch runs on DeepEP's kernels ({', '.join(POST_QUANT_DISPATCHES)}: "
            f"TensorRT-LLM's post-quant dispatch); got ep_dispatch {par.ep_dispatch!r}",
        )
    _sequence_fits(par, m, w)
    check_graph_scope(w, par)
    # the recipe's framework rules: here, so that the search's screen (search/space.py Space.check) and /v1/plan
    # refuse the same layouts (a torchao recipe under Megatron, FSDP2's float8 all-gather without fully_shard)
    check_recipe_framework(w, par)
    check_param_gather(w, par)
    check_act_fp8_store(w, par, m)
    if w.norm_kernel == "ops" and m.norm != "rmsnorm":
        # kernels.RMSNORM_OPS is torchtitan's RMSNorm op chain (models/norms.py); an eager LayerNorm is one native
        # kernel each way (F.layer_norm), priced as the fused norm: no chain to price
        raise SpecError(
            "workload.norm_kernel",
            f"'ops' is torchtitan's eager RMSNorm op chain; model.norm is {m.norm!r}, whose eager F.layer_norm is "
            "one kernel each way: use norm_kernel 'fused' (or null)",
        )
    if w.training:
        _training_fits(par, m, w)
    elif w.batch_size % par.dp:
        raise SpecError("workload.batch_size", f"batch_size {w.batch_size} is not divisible by dp {par.dp} (replicas)")


def _sequence_fits(par: ParallelSpec, m: ModelSpec, w: WorkloadSpec) -> None:
    """CP's load-balanced halves and SP's split of the sequence (prefill and training; decode has no CP)."""
    seq = (w.seq_length or m.seq_length) if w.training or w.context_length is None else w.context_length
    if w.training or w.phase == "prefill":
        if par.cp > 1 and par.cp_load_balance is False and seq % par.cp:
            # torch context_parallel without load balancing: contiguous s/cp shards
            raise SpecError("parallel.cp", f"sequence {seq} is not divisible by cp = {par.cp} (cp_load_balance off)")
        if par.cp > 1 and par.cp_load_balance is not False and seq % (2 * par.cp):
            raise SpecError(
                "parallel.cp", f"sequence {seq} is not divisible by 2*cp = {2 * par.cp} (load-balanced ring attention)"
            )
        if w.training and w.document_lengths is not None:
            _documents_fit(par, w, seq)
        if par.sp and (seq // par.cp) % par.tp:
            raise SpecError(
                "parallel.sequence_parallel",
                f"sequence {seq} / cp {par.cp} = {seq // par.cp} is not divisible by tp {par.tp}",
            )
    elif par.cp > 1:
        raise SpecError("parallel.cp", f"context parallelism is not modelled for decode; use cp 1, got cp {par.cp}")


def _documents_fit(par: ParallelSpec, w: WorkloadSpec, seq: int) -> None:
    """Packed documents fill the sequence (Megatron's THD batches: cu_seqlens over the packed sequence); with context
    parallelism TransformerEngine splits each document into 2·cp chunks (context_parallel.py get_cu_seqlens_on_cp_rank:
    the padded length // 2 per half, thd_get_partitioned_indices), so each is a multiple of 2·cp (Megatron pads
    them so: gpt_dataset.py "divisible by ... context parallel size * 2"); torch's context_parallel, which shards the
    whole sequence, is not modelled with documents."""
    field, lengths = "workload.document_lengths", w.document_lengths
    if w.document_packing == "dp_balanced":  # the corpus, packed next-fit: each fits a sequence (documents.py)
        pack_moments(w.document_histogram, seq)
    elif sum(lengths) != seq:
        raise SpecError(field, f"the {len(lengths)} documents hold {sum(lengths)} tokens but the sequence is {seq}")
    if par.cp > 1 and par.flavour.cp_rotate_methods:
        # torch's context_parallel shards the whole sequence (head-tail chunks r and 2cp-1-r, or contiguous without
        # load balancing), so a rank's work depends on where the documents fall: not modelled
        raise SpecError(
            field,
            f"packed documents with framework {par.framework!r} and cp {par.cp} are not modelled: its context_parallel "
            "shards the whole sequence, not each document as TransformerEngine's THD split does",
        )
    if par.cp > 1:
        odd = [n for n in lengths if n % (2 * par.cp)]
        if odd:
            raise SpecError(
                field,
                f"{len(odd)} documents (first {odd[0]}) are not multiples of 2*cp = {2 * par.cp}: TransformerEngine "
                "splits each packed document into 2*cp chunks under context parallelism",
            )


def _training_fits(par: ParallelSpec, m: ModelSpec, w: WorkloadSpec) -> None:
    """A training workload's options against the framework and the pipeline, then its batch."""
    check_recompute_modules(w, m)
    if w.cpu_offloading_num_layers and par.pp > 1:
        raise SpecError(
            "workload.cpu_offloading_num_layers",
            f"Currently there is no support for Pipeline parallelism with CPU offloading (Megatron "
            f"transformer_config.py); pp is {par.pp}",
        )
    _framework_switches(par, w)
    per_step = w.micro_batch_size * par.dp
    if w.global_batch_size % per_step:
        raise SpecError(
            "workload.global_batch_size",
            f"global_batch_size {w.global_batch_size} is not divisible by micro_batch_size*dp = "
            f"{w.micro_batch_size}*{par.dp} = {per_step}",
        )
    m_batches = w.global_batch_size // per_step
    bad = par.schedule.microbatch_rule(par.pipeline_schedule, m_batches, par.pp)
    if bad:
        raise SpecError("workload.global_batch_size", bad)


# ---- pipeline layout (issue 21) -----------------------------------------------------------------------
# Which layers, embedding and loss each model chunk (virtual stage) of each pipeline rank holds. Four ways
# to say it, one representation: the virtual stages in model order, each a tuple of Megatron's layer
# characters (megatron/core/transformer/pipeline_parallel_layer_layout.py parse_str_to_list: E embedding,
# t decoder layer, m MTP layer, L loss), virtual stage k on rank k % pp as chunk k // pp (the interleaved
# assignment), or folded into a V for ZBV and DualPipeV (rank k for k < pp, else 2·pp - 1 - k), or for DualPipe two
# copies of a pp-stage split folded the same way (copy 1's stage j on rank pp - 1 - j): pipeline.StageMap.

V_SCHEDULES = tuple(n for n, t in SCHEDULE_TRAITS.items() if t.v_shape)  # 2 chunks per rank in a V (the search)
LAYER_CHARS = {"E": "embedding", "t": "decoder", "m": "mtp", "L": "loss"}
LAYOUT_MAX_STAGES = 4096  # virtual stages in a layout: far above any run (Llama 3 405B: 128)
LAYOUT_MAX_CHARS = 1 << 16  # an unrolled layout's characters, checked after each unrolling pass


@dataclass(frozen=True)
class Chunk:
    """One model chunk of a pipeline rank: its place in the model (virtual stage ``index``) and contents."""

    index: int
    rank: int
    layers: tuple[int, ...]  # global decoder-layer indices
    embedding: bool = False
    loss: bool = False
    mtp: int = 0


def _framework_switches(par: ParallelSpec, w: WorkloadSpec) -> None:
    """A workload switch that only some frameworks have (a flavour trait says which), refused on the others; the
    reason is written only for a refusal (the search checks every layout)."""
    fl = par.flavour
    refusals = (  # (refused, field, why), checked in this order
        (w.selective_ac_option is not None and not fl.torchtitan_selective_ac, "workload.selective_ac_option",
         "is torchtitan's (framework torch), framework is {name}; Megatron: recompute_modules"),
        (w.loss_parallel is not None and not fl.loss_parallel_switch, "workload.loss_parallel",
         "is torchtitan's training.disable_loss_parallel switch (framework torch), framework is {name}, whose "
         "loss is {always} vocab-parallel"),
        (w.optimizer_implementation is not None and not fl.torch_optimizer, "workload.optimizer_implementation",
         "is torch.optim.AdamW's (framework torch); framework {name} runs its own fused Adam"),
        *((getattr(w, name) is not None and not fl.userbuffers, f"workload.{name}",
           "is TransformerEngine's userbuffers' method under Megatron-Core --tp-comm-overlap (framework megatron); "
           "framework {name} runs no userbuffers") for name in USERBUFFERS_FIELDS),
        (w.norm_kernel == "ops" and fl.fused_kernels, "workload.norm_kernel",
         "'ops' is an eager framework's RMSNorm op chain (framework torch or deepspeed); framework {name} runs "
         "its norm fused (TransformerEngine)"),
    )  # fmt: skip
    for refused, where, why in refusals:
        if refused:
            always = "always" if fl.vocab_parallel_loss else "never"
            raise SpecError(where, why.format(name=repr(par.framework), always=always))


def parse_layout(layout: str | tuple | list) -> tuple[tuple[str, ...], ...]:
    """Megatron's --pipeline-model-parallel-layout: the string ("Et*3|(tt|)*29,m|L", commas cosmetic,
    (...)*n and x*n unrolled) or a list of lists of layer names or characters; SpecError when malformed."""
    field_ = "parallel.pipeline_layout"
    if isinstance(layout, str):
        text = layout.replace(",", "").replace(" ", "")
        for pattern in (r"\(([^()]+)\)\*(\d+)", r"(.)\*(\d+)"):
            text = re.sub(pattern, lambda g: _unroll(g.group(1), int(g.group(2))), text)
            if len(text) > LAYOUT_MAX_CHARS:
                raise SpecError(field_, f"unrolls to more than {LAYOUT_MAX_CHARS} layers")
        if any(c in text for c in "()*"):
            raise SpecError(field_, f"cannot read {layout!r}: nested or unmatched '(...)*n'")
        stages = [tuple(stage) for stage in text.split("|")]
    else:
        names = {v: k for k, v in LAYER_CHARS.items()}
        stages = [tuple(names.get(str(x).strip().lower(), str(x).strip()) for x in stage) for stage in layout]
    if len(stages) > LAYOUT_MAX_STAGES:
        raise SpecError(field_, f"{len(stages)} virtual stages, more than {LAYOUT_MAX_STAGES}")
    for i, stage in enumerate(stages):
        bad = [c for c in stage if c not in LAYER_CHARS]
        if bad:
            raise SpecError(
                field_, f"virtual stage {i} has {bad[0]!r}; known: E (embedding), t (decoder), m (mtp), L (loss)"
            )
    return tuple(stages)


def format_layout(chunks) -> str:
    """Chunks in model order as a --pipeline-model-parallel-layout string, the inverse of :func:`parse_layout`
    (``parse_layout(format_layout(chunks))`` gives each chunk's characters back): a chunk is its LAYER_CHARS in
    Megatron's order (embedding, decoder layers, MTP, loss), n > 1 alike as "x*n"; a run of three or more alike
    chunks is "(x|)*n": Llama 3 405B's "E|(t|)*125t|L"."""
    char = {name: c for c, name in LAYER_CHARS.items()}
    names = []
    for c in chunks:
        counts = (("embedding", int(c.embedding)), ("decoder", len(c.layers)), ("mtp", c.mtp), ("loss", int(c.loss)))
        names.append("".join(char[k] if n == 1 else f"{char[k]}*{n}" if n else "" for k, n in counts))
    runs: list[list] = []
    for name in names:
        if runs and runs[-1][0] == name:
            runs[-1][1] += 1
        else:
            runs.append([name, 1])
    return "|".join("|".join([name] * n) if n <= 2 else f"({name}|)*{n - 1}{name}" for name, n in runs)


def _unroll(text: str, n: int) -> str:
    if len(text) * n > LAYOUT_MAX_CHARS:
        raise SpecError("parallel.pipeline_layout", f"{text!r}*{n} unrolls to more than {LAYOUT_MAX_CHARS} layers")
    return text * n


def virtual_stages(par: ParallelSpec) -> int:
    """Model chunks over all pipeline ranks (pp·v); a malformed layout counts as pp (validation names it)."""
    copies = par.schedule.stage_map.copies  # a layout or split names one copy's stages (DualPipe holds two)
    if par.pipeline_layout is not None:
        try:
            return copies * len(_parsed(par.pipeline_layout))
        except SpecError:
            return par.pp
    if par.pipeline_split_points is not None:
        return copies * (len(par.pipeline_split_points) + 1)
    if par.schedule.v_shape:
        return 2 * par.pp
    return par.pp * (par.virtual_pipeline_stages if par.schedule.interleaved else 1)


@lru_cache(maxsize=256)
def _parsed(layout) -> tuple[tuple[str, ...], ...]:
    return parse_layout(layout)


def rank_of(par: ParallelSpec, k: int) -> int:
    """The pipeline rank of virtual stage k: interleaved k % pp; V-shaped k, then back down from pp - 1 (DualPipe's
    second copy of the model too): the schedule's ``StageMap.rank``."""
    return par.schedule.stage_map.rank(k, par.pp)


def pipeline_chunks(par: ParallelSpec, num_layers: int, mtp_layers: int = 0) -> tuple[tuple[Chunk, ...], ...]:
    """Per pipeline rank, its chunks in execution order (chunk c of rank r is virtual stage c·pp + r, or the
    V's); raises SpecError when the layout does not cover the layers exactly. Memoised on what it reads of the
    layout (``_split_key``): layouts differing in tp, cp, dp, ZeRO or the framework share it."""
    key = (_split_key(par), num_layers, mtp_layers)
    found = _CHUNKS.get(key)
    if found is None:
        if len(_CHUNKS) >= CHUNKS_KEPT:
            _CHUNKS.clear()
        found = _CHUNKS[key] = _pipeline_chunks(par, num_layers, mtp_layers)
    return found


_CHUNKS: dict = {}
CHUNKS_KEPT = 4096  # layouts' pipeline splits kept (value keys), cleared past it


def _split_key(par: ParallelSpec) -> tuple:
    """The fields of a layout that its pipeline split reads (_stage_tokens, rank_of)."""
    return (
        par.pp,
        par.virtual_pipeline_stages,
        par.pipeline_schedule,
        par.pipeline_layout,
        par.pipeline_split_points,
        par.first_stage_layers,
        par.last_stage_layers,
        par.account_for_embedding_in_pipeline_split,
        par.account_for_loss_in_pipeline_split,
    )


def _pipeline_chunks(par: ParallelSpec, num_layers: int, mtp_layers: int) -> tuple[tuple[Chunk, ...], ...]:
    stages = _stage_tokens(par, num_layers, mtp_layers)
    per_rank: list[list[Chunk]] = [[] for _ in range(par.pp)]
    layer = 0
    per_copy = len(stages) // par.schedule.stage_map.copies  # DualPipe's second copy holds the same layers again
    for k, tokens in enumerate(stages):
        if k % per_copy == 0:
            layer = 0
        count = tokens.count("t")
        chunk = Chunk(
            k, rank_of(par, k), tuple(range(layer, layer + count)), "E" in tokens, "L" in tokens, tokens.count("m")
        )
        layer += count
        per_rank[chunk.rank].append(chunk)
    return tuple(tuple(chunks) for chunks in per_rank)


def _stage_tokens(par: ParallelSpec, num_layers: int, mtp: int) -> tuple[tuple[str, ...], ...]:
    """Every virtual stage's characters, copy by copy (``StageMap.copies``: DualPipe's model twice)."""
    return _copy_tokens(par, num_layers, mtp) * par.schedule.stage_map.copies


def _copy_stages(par: ParallelSpec) -> int:
    """The stages one copy of the model is split into: all virtual stages, DualPipe's pp (two copies)."""
    return virtual_stages(par) // par.schedule.stage_map.copies


def _copy_tokens(par: ParallelSpec, num_layers: int, mtp: int) -> tuple[tuple[str, ...], ...]:
    if par.pipeline_layout is not None:
        stages = _parsed(par.pipeline_layout)
        _check_layout(par, stages, num_layers, mtp)
        return stages
    if par.pipeline_split_points is not None:
        per = _split_point_counts(par, num_layers)
    elif par.first_stage_layers is not None or par.last_stage_layers is not None:
        per = _uneven_chunk_counts(par, num_layers)
    else:
        per = _even_chunk_counts(par, num_layers)
    stages = [("t",) * c for c in per]
    stages[0] = ("E", *stages[0])
    stages[-1] = (*stages[-1], *("m",) * mtp, "L")
    return tuple(stages)


def _split_point_counts(par: ParallelSpec, num_layers: int) -> list[int]:
    """Decoder layers per virtual stage from torch's pipeline_split_points."""
    p, points = par.pp, list(par.pipeline_split_points)
    bounds = [0, *points, num_layers]
    if any(b >= a for a, b in zip(bounds[1:], bounds, strict=False)) or (
        points and (points[0] < 1 or points[-1] >= num_layers)
    ):
        raise SpecError(
            "parallel.pipeline_split_points",
            f"split points {points} must rise strictly inside 1..{num_layers - 1} (num_layers {num_layers})",
        )
    n = len(bounds) - 1
    want = 2 * p // par.schedule.stage_map.copies  # a V's 2·pp; DualPipe's pp, each held twice
    if par.schedule.v_shape and n != want:
        held = "holds pp stages twice" if want == p else "runs 2 stages per rank"
        raise SpecError(
            "parallel.pipeline_split_points",
            f"{par.pipeline_schedule} {held}: {want} stages, got {n} from {len(points)} points",
        )
    if n % p:
        raise SpecError(
            "parallel.pipeline_split_points",
            f"{len(points)} split points give {n} stages, not a multiple of pp {p}",
        )
    return [bounds[i + 1] - bounds[i] for i in range(n)]


def _uneven_chunk_counts(par: ParallelSpec, num_layers: int) -> list[int]:
    """Decoder layers per virtual stage with Megatron's first/last_stage_layers: each rank's share split evenly
    over its chunks (DualPipe's copy: one stage a rank)."""
    p, n = par.pp, _copy_stages(par)
    v = n // p
    if par.account_for_embedding_in_pipeline_split or par.account_for_loss_in_pipeline_split:
        raise SpecError(
            "parallel.account_for_embedding_in_pipeline_split",
            "not modelled together with first_stage_layers / last_stage_layers: give pipeline_layout instead; got "
            f"first_stage_layers {shown(par.first_stage_layers)}, last_stage_layers {shown(par.last_stage_layers)}",
        )
    counts = _uneven_counts(par, num_layers)
    for r, c in enumerate(counts):
        if c % v:
            where = "first" if r == 0 else "last" if r == p - 1 else "each middle"
            raise SpecError(
                "parallel.first_stage_layers"
                if r == 0
                else "parallel.last_stage_layers"
                if r == p - 1
                else "parallel.pp",
                f"number of layers at the {where} stage: {c} must be divisible by the {v} chunks per rank "
                "(Megatron get_transformer_layer_offset splits each stage evenly over its virtual stages); "
                "give pipeline_layout for chunks of other sizes",
            )
    return [counts[rank_of(par, k)] // v for k in range(n)]


def _even_chunk_counts(par: ParallelSpec, num_layers: int) -> list[int]:
    """Decoder layers per virtual stage of an even split (of one copy), the embedding and loss counted as layers when
    asked."""
    p, n = par.pp, _copy_stages(par)
    v = n // p
    emb, loss = par.account_for_embedding_in_pipeline_split, par.account_for_loss_in_pipeline_split
    slots = num_layers + emb + loss
    if slots % n:
        what = f"num_layers {num_layers}" + (
            f" + {emb + loss} (embedding/loss counted as layers)" if emb or loss else ""
        )
        split = f"pp*virtual_pipeline_stages = {p}*{v} = {n}" if v > 1 else f"pp {p}"
        raise SpecError(
            "parallel.pp",
            f"{what} is not divisible by {split}; set first_stage_layers / last_stage_layers "
            "(Megatron --decoder-first/last-pipeline-num-layers), account_for_embedding/loss_in_pipeline_split "
            "or pipeline_layout to split unevenly",
        )
    per = [slots // n] * n
    per[0] -= emb
    per[-1] -= loss
    return per


def _check_layout(par: ParallelSpec, stages, num_layers: int, mtp: int) -> None:
    f, p, n = "parallel.pipeline_layout", par.pp, len(stages)
    if n % p:
        raise SpecError(f, f"{n} virtual stages do not divide over pp {p} (Megatron: len(layout) % pp == 0)")
    traits = par.schedule
    copies = traits.stage_map.copies
    v = n * copies // p  # DualPipe's layout names one copy's pp stages, each rank holding two
    if traits.v_shape and v != 2 and copies > 1:
        raise SpecError(
            f,
            f"{par.pipeline_schedule} holds the model twice in pp stages, rank r running stage r one way and pp - 1 - "
            f"r the other (deepseek-ai/DualPipe examples/example_dualpipe.py): the layout names one copy's {p} "
            f"stages, got {n} (a V of {2 * p} chunks is dualpipev's)",
        )
    if traits.v_shape and v != 2:
        raise SpecError(f, f"{par.pipeline_schedule} runs 2 chunks per rank; the layout has {n} = {p}*{v}")
    if not traits.v_shape and v > 1 and not traits.interleaved:
        raise SpecError(
            f, f"{n} virtual stages over pp {p} are {v} chunks per rank: set pipeline_schedule to interleaved"
        )
    if par.virtual_pipeline_stages not in (1, v):
        raise SpecError(
            "parallel.virtual_pipeline_stages",
            f"virtual_pipeline_stages {par.virtual_pipeline_stages} but the layout has {v} chunks per rank ({n}/{p})",
        )
    _check_layout_tokens(stages, num_layers, mtp)
    _check_layout_mtp(par, stages)
    for name in ("first_stage_layers", "last_stage_layers", "pipeline_split_points"):
        if getattr(par, name) is not None:
            raise SpecError(
                f"parallel.{name}", f"give either pipeline_layout or this, not both; got {shown(getattr(par, name))}"
            )


def _check_layout_tokens(stages, num_layers: int, mtp: int) -> None:
    """An explicit layout holds the model: one embedding first, one loss last, every decoder layer, then the MTP
    layers."""
    f = "parallel.pipeline_layout"
    flat = [c for stage in stages for c in stage]
    counts = {c: flat.count(c) for c in LAYER_CHARS}
    if counts["E"] != 1 or counts["L"] != 1 or flat[0] != "E" or flat[-1] != "L":
        raise SpecError(
            f,
            f"the embedding (E) must come first and the loss (L) last, once each; got {counts['E']} E, "
            f"{counts['L']} L, first {flat[0] if flat else None!r}, last {flat[-1] if flat else None!r}",
        )
    if counts["t"] != num_layers:
        raise SpecError(f, f"the layout's chunks hold {counts['t']} decoder layers (t) but the model has {num_layers}")
    if counts["m"] != mtp:
        raise SpecError(f, f"the layout holds {counts['m']} MTP layers (m) but the model has {mtp}")
    if "m" in flat and "t" in flat[flat.index("m") :]:
        first_m, last_t = flat.index("m"), len(flat) - 1 - flat[::-1].index("t")
        raise SpecError(
            f,
            f"decoder layers must come before the MTP layers (pipeline_parallel_layer_layout.py); got the first m at "
            f"position {first_m} and the last t at {last_t} (of {len(flat)}, counting E and L)",
        )


def _check_layout_mtp(par: ParallelSpec, stages) -> None:
    """Megatron-LM d98e8a6 pipeline_parallel_layer_layout.py validate_layer_layout: all MTP layers in one
    virtual stage ("All of the MTP layers must be in the same one virtual pipeline stage"), the last one of its
    rank ("Currently we restrict that the MTP should be always in the last virtual pipeline stage of that
    rank")."""
    holding = [k for k, stage in enumerate(stages) if "m" in stage]
    if not holding:
        return
    f = "parallel.pipeline_layout"
    if len(holding) > 1:
        raise SpecError(f, f"the MTP layers (m) are in virtual stages {holding}: Megatron needs them in one")
    k = holding[0]
    rank = rank_of(par, k)
    last = max(j for j in range(len(stages)) if rank_of(par, j) == rank)
    if not par.schedule.v_shape and k != last:
        raise SpecError(
            f,
            f"the MTP layers (m) are in virtual stage {k}, chunk {k // par.pp} of rank {rank}, but Megatron needs "
            f"them in the rank's last chunk (virtual stage {last})",
        )
