"""Parallel layout: degrees, schedule, ZeRO stage and framework flavour, checked against model, workload and
cluster (in the manner of torchtitan's ParallelDims: every message prints the numbers that do not fit)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

from ._errors import SpecError
from .model import ModelSpec
from .workload import WorkloadSpec

SCHEDULES = ("1f1b", "interleaved", "gpipe")
FRAMEWORKS = ("megatron", "torch", "deepspeed")
CP_COMM = ("p2p", "all_gather", "a2a")
# Megatron-Core --moe-token-dispatcher-type: alltoall (MoEAlltoAllTokenDispatcher), allgather
# (MoEAllGatherTokenDispatcher), flex with --moe-enable-deepep (MoEFlexTokenDispatcher: "deepep")
EP_DISPATCH = ("alltoall", "allgather", "deepep")
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


def zero_config_from_dict(values: dict | None) -> ZeroConfig:
    """A ZeroConfig from a request's ``parallel.zero_config``; an unknown key or a bad value is a SpecError."""
    if not values:
        return ZeroConfig()
    known = {f.name for f in fields(ZeroConfig)}
    for key, value in values.items():
        if key not in known:
            raise SpecError(
                f"parallel.zero_config.{key}",
                f"DeepSpeed has no zero_optimization key {key!r}; known: {', '.join(sorted(known))}",
            )
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
            or value != int(value)
            or value < 0
        ):
            raise SpecError(f"parallel.zero_config.{key}", f"must be a whole number of elements >= 0, got {value!r}")
    return ZeroConfig(**{k: int(v) for k, v in values.items()})


# Expert TP when not given, by framework: Megatron sets --expert-tensor-parallel-size to the TP size
# (Megatron-LM d98e8a6 megatron/training/arguments.py:587: "if args.expert_tensor_parallel_size is None:
# args.expert_tensor_parallel_size = args.tensor_model_parallel_size");
# torchtitan's expert_tensor_parallel_degree and DeepSpeed-MoE default to 1.
EXPERT_TP_DEFAULT_IS_TP = {"megatron": True, "torch": False, "deepspeed": False}


@dataclass(frozen=True)
class ParallelSpec:
    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    ep: int = 1
    expert_tp: int | None = None  # None: the framework's default (Megatron: = tp; torch, DeepSpeed: 1)
    zero_stage: int = 0
    sequence_parallel: bool = False
    virtual_pipeline_stages: int = 1  # model chunks per pipeline rank (Megatron's virtual pipeline size)
    pipeline_schedule: str = "1f1b"
    hybrid_shard_size: int | None = None  # ZeRO-3 inside groups of this many DP ranks, replicas across them
    dp_bucket_bytes: int | None = None  # None: the framework default (see rules/data.py)
    order: str = DEFAULT_ORDER
    framework: str = "megatron"
    cp_comm: str = "p2p"  # p2p (ring attention) | all_gather | a2a (Ulysses)
    # Megatron --decoder-first/last-pipeline-num-layers: uneven stages, the rest split evenly in between
    first_stage_layers: int | None = None
    last_stage_layers: int | None = None
    zero_config: ZeroConfig = field(default_factory=ZeroConfig)  # DeepSpeed flavour only
    # alltoall | allgather | deepep (node-limited, RDMA then NVLink: DeepSeek-V3 §3.2). Megatron's CLI default
    # is allgather; every published EP recipe sets alltoall (or flex), which stays this planner's default
    ep_dispatch: str = "alltoall"

    def __post_init__(self) -> None:
        object.__setattr__(self, "expert_tp_given", self.expert_tp is not None)
        if self.expert_tp is None:
            default_is_tp = EXPERT_TP_DEFAULT_IS_TP.get(self.framework, False)
            object.__setattr__(self, "expert_tp", self.tp if default_is_tp else 1)

    @property
    def world_size(self) -> int:
        return self.tp * self.cp * self.pp * self.dp

    @property
    def expert_dp(self) -> int:
        """Megatron re-partitions tp x cp x dp into expert_tp x ep x expert_dp (parallel_state.py)."""
        return self.tp * self.cp * self.dp // (self.expert_tp * self.ep)

    @property
    def sp(self) -> bool:
        """Sequence parallelism only changes anything with tp > 1 (Megatron turns it off at tp = 1)."""
        return self.sequence_parallel and self.tp > 1

    @property
    def chunks_per_rank(self) -> int:
        return self.virtual_pipeline_stages if self.pipeline_schedule == "interleaved" else 1


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
    _fits_moe(par, model)
    _fits_workload(par, model, work)


def _degrees(par: ParallelSpec) -> None:
    for name in ("tp", "pp", "dp", "cp", "ep", "expert_tp", "virtual_pipeline_stages"):
        if getattr(par, name) < 1:
            raise SpecError(f"parallel.{name}", f"must be >= 1, got {getattr(par, name)}")
    if par.zero_stage not in (0, 1, 2, 3):
        raise SpecError("parallel.zero_stage", f"must be 0, 1, 2 or 3, got {par.zero_stage}")
    if par.dp_bucket_bytes is not None and par.dp_bucket_bytes < 1:
        raise SpecError("parallel.dp_bucket_bytes", f"must be >= 1, got {par.dp_bucket_bytes}")


def _choices(par: ParallelSpec) -> None:
    if par.pipeline_schedule not in SCHEDULES:
        raise SpecError(
            "parallel.pipeline_schedule", f"must be one of {', '.join(SCHEDULES)}, got {par.pipeline_schedule!r}"
        )
    if par.framework not in FRAMEWORKS:
        raise SpecError("parallel.framework", f"must be one of {', '.join(FRAMEWORKS)}, got {par.framework!r}")
    if par.cp_comm not in CP_COMM:
        raise SpecError("parallel.cp_comm", f"must be one of {', '.join(CP_COMM)}, got {par.cp_comm!r}")
    if par.ep_dispatch not in EP_DISPATCH:
        raise SpecError("parallel.ep_dispatch", f"must be one of {', '.join(EP_DISPATCH)}, got {par.ep_dispatch!r}")
    dims = par.order.split("-")
    if sorted(dims) != sorted(DEFAULT_ORDER.split("-")):
        raise SpecError("parallel.order", f"must name tp, cp, ep, dp and pp once each, got {par.order!r}")
    if par.pipeline_schedule == "interleaved" and (par.virtual_pipeline_stages < 2 or par.pp < 2):
        raise SpecError(
            "parallel.virtual_pipeline_stages",
            f"the interleaved schedule needs pp >= 2 and virtual_pipeline_stages >= 2, got pp {par.pp}, "
            f"virtual_pipeline_stages {par.virtual_pipeline_stages}",
        )
    if par.hybrid_shard_size is not None:
        if par.zero_stage != 3:
            raise SpecError(
                "parallel.hybrid_shard_size", f"hybrid sharding is a ZeRO-3 option, zero_stage is {par.zero_stage}"
            )
        if par.hybrid_shard_size < 1 or par.dp % par.hybrid_shard_size:
            raise SpecError(
                "parallel.hybrid_shard_size", f"hybrid_shard_size {par.hybrid_shard_size} must divide dp {par.dp}"
            )


def _fits_model(par: ParallelSpec, m: ModelSpec) -> None:
    t = par.tp
    if m.num_attention_heads % t:
        raise SpecError("parallel.tp", f"num_attention_heads {m.num_attention_heads} is not divisible by tp {t}")
    if m.mla is None and m.kv_heads % t:
        raise SpecError("parallel.tp", f"num_kv_heads {m.kv_heads} is not divisible by tp {t}")
    if m.ffn_hidden_size % t:
        raise SpecError("parallel.tp", f"ffn_hidden_size {m.ffn_hidden_size} is not divisible by tp {t}")
    _ulysses(par, m)
    if par.first_stage_layers is not None or par.last_stage_layers is not None:
        _uneven_stages(par, m)
        return
    layer_split = par.pp * par.chunks_per_rank
    if m.num_layers % layer_split:
        what = (
            f"pp*virtual_pipeline_stages = {par.pp}*{par.chunks_per_rank} = {layer_split}"
            if par.chunks_per_rank > 1
            else f"pp {par.pp}"
        )
        raise SpecError(
            "parallel.pp",
            f"num_layers {m.num_layers} is not divisible by {what}; set first_stage_layers / last_stage_layers "
            "(Megatron --decoder-first/last-pipeline-num-layers) to split unevenly",
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
    """Layers per pipeline rank: even, or Megatron's uneven split with given first/last counts."""
    p = par.pp
    if par.first_stage_layers is None and par.last_stage_layers is None:
        return [num_layers // p] * p
    first = par.first_stage_layers if par.first_stage_layers is not None else None
    last = par.last_stage_layers if par.last_stage_layers is not None else None
    middle_stages = p - (first is not None) - (last is not None)
    rest = num_layers - (first or 0) - (last or 0)
    per = rest // middle_stages if middle_stages else 0
    counts = [per] * p
    if first is not None:
        counts[0] = first
    if last is not None:
        counts[-1] = last
    return counts


def _uneven_stages(par: ParallelSpec, m: ModelSpec) -> None:
    if par.chunks_per_rank > 1:
        raise SpecError("parallel.first_stage_layers", "uneven stages are not modelled with the interleaved schedule")
    if par.pp < 2:
        raise SpecError("parallel.first_stage_layers", f"uneven stages need pp >= 2, got pp {par.pp}")
    given = [x for x in (par.first_stage_layers, par.last_stage_layers) if x is not None]
    if any(x < 1 for x in given):
        raise SpecError("parallel.first_stage_layers", f"first/last stage layers must be >= 1, got {given}")
    middle = par.pp - len(given)
    rest = m.num_layers - sum(given)
    if (middle == 0 and rest != 0) or (middle and (rest < middle or rest % middle)):
        raise SpecError(
            "parallel.first_stage_layers",
            f"num_layers {m.num_layers} - first/last {'+'.join(map(str, given))} = {rest} layers do not split "
            f"evenly over the {middle} other stages",
        )


def _fits_moe(par: ParallelSpec, m: ModelSpec) -> None:
    if m.moe is None:
        # expert_tp equal to tp is what Megatron's default resolves to, harmless on a dense model
        if par.ep > 1 or par.expert_tp not in (1, par.tp):
            raise SpecError(
                "parallel.ep", f"ep {par.ep} / expert_tp {par.expert_tp} need an MoE model (model.moe is null)"
            )
        return
    if m.moe.num_experts % par.ep:
        raise SpecError("parallel.ep", f"num_experts {m.moe.num_experts} is not divisible by ep {par.ep}")
    dense = par.tp * par.cp * par.dp
    if dense % (par.expert_tp * par.ep):
        raise SpecError(
            "parallel.ep",
            f"expert_tp*ep = {par.expert_tp}*{par.ep} = {par.expert_tp * par.ep} does not divide "
            f"tp*cp*dp = {par.tp}*{par.cp}*{par.dp} = {dense}"
            + (
                ""
                if par.expert_tp_given
                else " (expert_tp defaults to tp, as Megatron's --expert-tensor-parallel-size;"
                " set expert_tp to 1 for experts without TP)"
            ),
        )
    if m.moe.expert_ffn_hidden_size % par.expert_tp:
        raise SpecError(
            "parallel.expert_tp",
            f"expert_ffn_hidden_size {m.moe.expert_ffn_hidden_size} is not divisible by expert_tp {par.expert_tp}",
        )
    if par.tp > 1 and par.ep > 1 and not par.sequence_parallel and par.framework == "megatron":
        raise SpecError("parallel.sequence_parallel", "Megatron requires sequence_parallel with MoE, tp > 1 and ep > 1")


def _fits_workload(par: ParallelSpec, m: ModelSpec, w: WorkloadSpec) -> None:
    seq = (w.seq_length or m.seq_length) if w.training or w.context_length is None else w.context_length
    if w.training or w.phase == "prefill":
        if par.cp > 1 and seq % (2 * par.cp):
            raise SpecError(
                "parallel.cp", f"sequence {seq} is not divisible by 2*cp = {2 * par.cp} (load-balanced ring attention)"
            )
        if par.sp and (seq // par.cp) % par.tp:
            raise SpecError(
                "parallel.sequence_parallel",
                f"sequence {seq} / cp {par.cp} = {seq // par.cp} is not divisible by tp {par.tp}",
            )
    elif par.cp > 1:
        raise SpecError("parallel.cp", "context parallelism is not modelled for decode; use cp 1")
    if w.training:
        per_step = w.micro_batch_size * par.dp
        if w.global_batch_size % per_step:
            raise SpecError(
                "workload.global_batch_size",
                f"global_batch_size {w.global_batch_size} is not divisible by micro_batch_size*dp = "
                f"{w.micro_batch_size}*{par.dp} = {per_step}",
            )
        m_batches = w.global_batch_size // per_step
        if par.pipeline_schedule == "interleaved" and m_batches % par.pp:
            raise SpecError(
                "workload.global_batch_size",
                f"the interleaved schedule needs micro-batches {m_batches} divisible by pp {par.pp}",
            )
    elif w.batch_size % par.dp:
        raise SpecError("workload.batch_size", f"batch_size {w.batch_size} is not divisible by dp {par.dp} (replicas)")
