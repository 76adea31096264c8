"""A serving deployment on a cluster: each pool's prefill and decode steps planned by the training planner's
own inference path (the same ledger, placement, NCCL prices, kernels and memory), then the KV cache, the
batching model and, when disaggregated, the KV transfer priced on the cluster graph.

The queueing model (docs/serving.md states it in full):

- decode: a worker holds ``b`` sequences; one step emits ``b · tokens_per_step`` tokens (MTP) and takes
  ``t_d(b)``, the planner's decode step at batch b and the mean context ISL + OSL/2;
- prefill: a worker prefills ``n = max(1, max_batch_tokens // ISL)`` prompts per attention rank in one pass of
  ``t_p`` (the planner's prefill step); a request's share of prefill time is ``t_p / (n · dp)``;
- aggregated (chunked prefill, continuous batching): prefill work steals ``u = R_w · t_p / (n · dp)`` of the
  worker's time, so the time between tokens is ``t_d(b) / (1 - u)``;
- disaggregated: the prefill pool serves at most ``R_p = workers · n · dp / t_p`` requests/s and the decode pool
  ``R_d = workers · b · tokens_per_step / (OSL · t_d(b))``; the system runs at the smaller (rate matching);
- one queueing model for both modes: at a request rate (open loop) TTFT = the prefill pass + the wait for it in
  an M/D/1 queue, ``ρ · t_p / (2 (1 - ρ))`` (Pollaczek-Khinchine with deterministic service) + the KV transfer
  when disaggregated (past ρ = 1, or past what the KV cache holds, the queue grows without bound: the plan is
  ``saturated``, TTFT None, and it serves its capacity, the closed loop's bound with the KV cache full:
  ``_aggregated_capacity``, ``_disaggregated_capacity``); at a concurrency
  (closed loop) the asymptotic bounds of mean-value analysis with Little's law exact (``_closed_loop``), TTFT =
  C / R - OSL · TPOT.
"""

from __future__ import annotations

import math
from collections import namedtuple
from dataclasses import dataclass, field, replace
from functools import lru_cache

import numpy as np

# numpy 2's np.unique imports numpy.ma on its first call (_unique1d: np.ma.is_masked): 70-90 ms of CPU that the first
# /v1/serve of a process paid inside its answer (bench/serving_speed.py); paid here, at import
import numpy.ma

from collectives import Op
from collectives.topology import ClusterSpec, cluster_for, price_call

from .._errors import SpecError
from ..context import Context, device_sms
from ..engine_kernels import EngineKernels
from ..memory import kv_cache_bytes
from ..model import ModelSpec
from ..parallel import ParallelSpec, validate_parallel
from ..plan import Options, Plan, PricedCall, build_plan, cluster_summary, price_calls
from ..recipes import check_recipe_gpu
from ..rules.engine_gather import GATHER_DISPATCHES
from ..rules.engine_step import dp_sync
from ..words import human_bytes, human_number, human_percent, human_seconds
from ..workload import (
    DISPATCH_FORMATS,
    DTYPE_BYTES,
    EXPERT_WEIGHT_FORMATS,
    WEIGHT_FORMAT_BYTES,
    WEIGHT_FORMAT_RECIPE,
    WorkloadSpec,
    weight_bytes,
)
from .engines import (
    FP8_FMHA_WEIGHTS,
    MXFP4_MIN_SM,
    EngineTraits,
)
from .fused_allreduce import AllReducePolicy, engine_allreduce_step
from .overlap import overlapped_step
from .pool_rules import check_pool_rules
from .spec import Pool, ServeOptions, Traffic, validate_serving


@dataclass(frozen=True)
class KVCache:
    bytes_per_token: int  # one token of one request, every layer, as the model stores it (no TP replicas)
    capacity_tokens: int  # tokens one worker of the decode (or aggregated) pool can hold
    max_concurrency: int  # requests of ISL + OSL tokens one such worker can hold
    dtype: str = ""  # the cache's dtype as planned (ServeOptions.kv)
    # where the request named no kv_dtype: what the engine uses then (EngineTraits.kv_default_rule) and the dtype
    # planned; "" where the request named one or the engine states no rule
    dtype_default: str = ""


@dataclass(frozen=True)
class KVTransfer:
    bytes_per_request: int
    senders: int  # ranks of a prefill worker that each send their part of a request's KV
    time_s: float
    bottleneck: str
    links: list = field(default_factory=list)
    # the GPUs of the first prefill worker and of the decode worker it sends to (what the page draws the
    # transfer's links among: POST /v1/topology with these devices and ``links``)
    devices: list = field(default_factory=list)
    # bytes the transfer moves for one request, every pair and stage: bytes_per_request rounded up to equal shares,
    # more where a side replicates KV heads past its tp (each decode copy is filled; _transfer_pairs)
    wire_bytes: int = 0


@dataclass
class PoolResult:
    pool: Pool
    role: str
    gpus: int
    batch: int  # sequences per worker in a decode step; prompts per worker in a prefill pass
    step_s: float  # the decode step (prefill pool: the prefill pass)
    prefill_s: float  # one prefill pass of the pool's prefill batch
    input_tokens_per_s: float
    output_tokens_per_s: float
    fits: bool
    calls: list[PricedCall]
    prefill_calls: list[PricedCall]
    memory_peak_bytes: int


@dataclass
class ServePlan:
    gpus: int
    ttft_s: float | None
    tpot_s: float
    fits: bool
    input_tokens_per_s: float
    output_tokens_per_s: float
    output_tokens_per_s_per_gpu: float
    tokens_per_s_per_user: float
    request_rate: float
    kv_cache: KVCache
    pools: list[PoolResult]
    kv_transfer: KVTransfer | None
    bottleneck: str
    # the asked request rate is more than the deployment serves: request_rate and the throughput are what it serves
    # (its capacity, _aggregated_capacity / _disaggregated_capacity), ttft_s None (the queue grows without bound)
    saturated: bool = False
    warnings: list[str] = field(default_factory=list)
    cluster: dict = field(default_factory=dict)  # the whole cluster as a request block (/v1/plan's cluster block)


@dataclass(frozen=True)
class _Worker:
    """One worker of a pool as the planner sees it: its parallel layout on a cluster of its own size."""

    par: ParallelSpec
    cluster: ClusterSpec
    batch_tokens: int
    decode_par: ParallelSpec  # the layout of a decode step (DeepEP switches to its low-latency kernels there)
    overlap: tuple | None = None  # the engine's two-batch overlap strategies (prefill, decode): overlap.py
    dp_sync: tuple[int, str] = (0, "")  # the engine's per-step DP all-reduce: int32 rows per rank, source
    allreduce: AllReducePolicy | None = None  # the engine's own TP all-reduce kernels (fused_allreduce.py)
    fp8_fmha: bool = False  # the engine can run its context attention in FP8 (EngineTraits.fp8_context_attention)
    bf16_dispatches: tuple[str, ...] = ()  # EngineTraits.bf16_dispatches
    kernels: EngineKernels | None = None  # EngineTraits.kernels: what the engine's own kernels fuse (engine_kernels.py)
    post_quant_dispatches: tuple[str, ...] = ()  # EngineTraits.post_quant_dispatches

    def bf16_dispatch(self, par: ParallelSpec) -> bool:
        """Whether ``par``'s dispatcher moves bf16 rows of an fp8 checkpoint (EngineTraits.bf16_dispatches)."""
        return par.ep_dispatch in self.bf16_dispatches

    def post_quant(self, par: ParallelSpec) -> bool:
        """Whether ``par``'s dispatcher moves a block-format checkpoint's rows in that format
        (EngineTraits.post_quant_dispatches, workload.DISPATCH_FORMATS)."""
        return par.ep_dispatch in self.post_quant_dispatches


def plan_serving(
    model: ModelSpec,
    cluster: ClusterSpec,
    traits: EngineTraits,
    traffic: Traffic,
    pools: tuple[Pool, ...],
    options: ServeOptions | None = None,
) -> ServePlan:
    """The deployment planned, after its rules (check_deployment: microseconds against a plan's ~0.1 s)."""
    options = options or ServeOptions()
    check_deployment(model, cluster, traits, traffic, pools, options)
    model = served_model(model, options)
    workers = [_worker(model, cluster, traits, pool, i) for i, pool in enumerate(pools)]
    tps = options.mtp.tokens_per_step if options.mtp else 1.0
    warnings: list[str] = []
    if len(pools) == 1:
        result = _aggregated(model, cluster, traits, traffic, pools[0], workers[0], options, tps, warnings)
    else:
        order = {p.role: i for i, p in enumerate(pools)}
        pre, dec = order["prefill"], order["decode"]
        result = _disaggregated(
            model, cluster, traits, traffic, (pools[pre], pools[dec]), (workers[pre], workers[dec]), options, tps,
            warnings, offsets=(sum(p.gpus for p in pools[:pre]), sum(p.gpus for p in pools[:dec])),
        )  # fmt: skip
    result.cluster = cluster_summary(cluster_for(cluster))
    if options.kv_dtype is None and traits.kv_default_rule:
        result.kv_cache = replace(result.kv_cache, dtype_default=f"{options.kv} planned; {traits.kv_default_rule}")
    return result


def check_deployment(model, cluster, traits, traffic, pools, options) -> None:
    """Every rule a deployment must meet before it is planned or estimated, each a 422 naming its field: the
    traffic, pools and options (spec.validate_serving), a GPU spec, the weight format on that GPU
    (check_weight_format), the pools within the cluster, the engine's options."""
    validate_serving(traffic, pools, options)
    if cluster.gpu is None:
        raise SpecError("cluster.gpu", f"cluster {cluster.name!r} has no GPU spec: serving needs compute and memory")
    check_weight_format(options.weight_dtype, cluster.gpu, model, options.fp8_recipe)
    used = sum(p.gpus for p in pools)
    if used > cluster.num_devices:
        raise SpecError(
            "deployment.pools",
            f"the pools use {' + '.join(f'{p.workers}x{p.worker_gpus}' for p in pools)} = {used} GPUs; the cluster "
            f"has {cluster.num_devices}",
        )
    _check_engine_options(model, traits, pools, options)
    check_pool_rules(model, traits, pools, cluster.devices_per_node, options.weight_dtype, DISPATCH_FORMATS)
    _check_kv_transfer(model, traits, pools)


def check_fp8_kv(traits: EngineTraits, options) -> None:
    """An engine whose FP8 KV cache needs its FP8 context attention (EngineTraits.fp8_context_attention: TensorRT-LLM)
    refuses one beside unquantized linears: a 422 on options.kv_dtype naming the rule."""
    if traits.fp8_context_attention and options.kv == "fp8" and options.weight_dtype not in FP8_FMHA_WEIGHTS:
        raise SpecError(
            "options.kv_dtype",
            f"{traits.label} runs an fp8 KV cache only beside quantized linears ({', '.join(FP8_FMHA_WEIGHTS)} "
            f"weights), got {options.weight_dtype} weights: {traits.fp8_context_attention}",
        )


def _check_kv_transfer(model: ModelSpec, traits: EngineTraits, pools: tuple[Pool, ...]) -> None:
    """The engine's KV connector's rule on replicated KV heads (EngineTraits.kv_transfer_replicated_rule): where
    either pool's tp passes the model's KV heads, the prefill pool must replicate them and the decode pool's tp be
    at least the prefill's."""
    rule = traits.kv_transfer_replicated_rule
    roles = {p.role: (i, p.tp) for i, p in enumerate(pools)}
    if rule is None or model.mla or "prefill" not in roles or "decode" not in roles:
        return
    (i, p_tp), (_, d_tp) = roles["prefill"], roles["decode"]
    k = model.kv_heads
    if max(p_tp, d_tp) > k and not k < p_tp <= d_tp:
        raise SpecError(
            f"deployment.pools.{i}.tp",
            f"{rule}: prefill tp {p_tp} and decode tp {d_tp} over {k} KV heads",  # the rule first: search's key
        )


def check_engine_weight_format(traits: EngineTraits, options) -> None:
    """A block-scaled checkpoint format (workload.WEIGHT_FORMAT_BYTES) the planner does not price for the engine
    (EngineTraits.weight_formats): a 422 on options.weight_dtype with the engine's note. One rule for /v1/serve and
    the SLA search (search._checked_request: where every engine asked refuses)."""
    if options.weight_dtype in WEIGHT_FORMAT_BYTES and options.weight_dtype not in traits.weight_formats:
        raise SpecError(
            "options.weight_dtype",
            f"{options.weight_dtype} weights are not priced for {traits.label} (its formats here: "
            f"{', '.join(traits.weight_formats)}); {traits.weight_formats_note}",
        )


ENGINE_OPTION_RULES = (check_fp8_kv, check_engine_weight_format)  # (traits, options) rules of a request's engine


def _check_engine_options(model: ModelSpec, traits: EngineTraits, pools: tuple[Pool, ...], options) -> None:
    for rule in ENGINE_OPTION_RULES:
        rule(traits, options)
    if options.two_batch_overlap and traits.two_batch_overlap_flag is None:
        raise SpecError(
            "options.two_batch_overlap",
            f"{traits.label} has no two-batch overlap switch this planner models (SGLang --enable-two-batch-overlap, "
            f"vLLM --enable-dbo); got two_batch_overlap true with engine {traits.name!r}",
        )
    if options.two_batch_overlap and model.moe is None:
        # both engines overlap one half's expert all-to-all with the other half's compute: SGLang's operations
        # strategies split only MoE layers (two_batch_overlap.py), vLLM's DBO only the modular MoE kernel
        raise SpecError(
            "options.two_batch_overlap",
            "two-batch overlap hides the MoE layers' expert exchange (SGLang two_batch_overlap.py, vLLM DBO); "
            f"model {model.name!r} is dense (no moe block)",
        )
    r = options.redundant_experts
    if not r:
        return
    if model.moe is None:
        raise SpecError("options.redundant_experts", f"{r} redundant experts need an MoE model; this one is dense")
    slots = model.moe.num_experts + r
    for i, pool in enumerate(pools):
        if not traits.experts.takes_redundant(pool.ep):
            raise SpecError(
                "options.redundant_experts",
                f"{r} redundant experts (EPLB) on pool {i} without expert parallelism (ep {pool.ep}): "
                f"{traits.experts.redundant_needs_ep}; set the pool's ep to tp*dp = {pool.tp * pool.dp} or leave "
                "redundant_experts out",
            )
        if pool.ep > 1 and slots % pool.ep:
            raise SpecError(
                "options.redundant_experts",
                f"{model.moe.num_experts} experts + {r} redundant = {slots} expert slots do not divide over "
                f"pool {i}'s ep {pool.ep}",
            )


def served_model(model: ModelSpec, options: ServeOptions) -> ModelSpec:
    """The model as an engine loads it for serving: EPLB's redundant expert slots added (with_redundant_experts), and
    its MTP modules (ModelSpec.mtp_layers) only with speculative decoding (options.mtp). Without it the engines skip
    them: vLLM DeepseekV2ForCausalLM.load_weights "continue  # skip spec decode layers for main model"
    (vllm/model_executor/models/deepseek_v2.py at b863fe5bf4e1, get_spec_layer_idx_from_weight_name: layers from
    num_hidden_layers on); SGLang loads the NextN layer only into the draft model, DeepseekV2ForCausalLM.load_weights
    with is_nextn=True (python/sglang/srt/models/deepseek_v2.py at 3e4a39ee7330, from models/deepseek_nextn.py, the
    EAGLE/NextN speculative worker), the main model building num_hidden_layers only. Review r14d #8: DeepSeek-V3 fp8
    at TP8 held 86,247,862,272 parameters a GPU against the hand count's 84,780,342,272 (+1.47 GB)."""
    if options.mtp is None and model.mtp_layers:
        model = replace(model, mtp_layers=0)
    return with_redundant_experts(model, options.redundant_experts)


def with_redundant_experts(model: ModelSpec, redundant: int) -> ModelSpec:
    """EPLB's physical experts: the model's experts plus ``redundant`` replicas of the busiest, as slots spread
    evenly over the EP ranks (vllm/distributed/eplb, n_physical_experts = n_logical + n_redundant; SGLang
    --ep-num-redundant-experts; TensorRT-LLM MoeLoadBalancer num_slots). Each slot holds one expert's weights and
    takes its share of the tokens: planned as a model with that many experts (the replicas split their expert's
    load, which under the planner's uniform routing is what every slot gets; the router's logits stay E wide
    in the engines, here they are E + R wide, R/E of a tiny GEMM)."""
    if not redundant or model.moe is None:
        return model
    return replace(model, moe=replace(model.moe, num_experts=model.moe.num_experts + redundant))


# ---- one worker ------------------------------------------------------------------------------------------


@lru_cache(maxsize=1024)  # value keys (frozen specs): the SLA search plans a layout at three loads and in many splits
def _worker(model: ModelSpec, cluster: ClusterSpec, traits: EngineTraits, pool: Pool, i: int) -> _Worker:
    where = f"deployment.pools.{i}"
    dispatch = pool.ep_dispatch or traits.ep_dispatch
    if dispatch not in traits.ep_dispatches:
        raise SpecError(
            f"{where}.ep_dispatch",
            f"{traits.label} runs {', '.join(traits.ep_dispatches)}; got {dispatch!r}",
        )
    if pool.attention_dp and not traits.attention_dp:
        raise SpecError(f"{where}.attention_dp", f"{traits.label} has no data-parallel attention")
    if pool.ep > 1 and model.moe is None:
        raise SpecError(f"{where}.ep", f"ep {pool.ep} needs an MoE model; {model.name or 'this model'} is dense")
    n = pool.worker_gpus
    per_node = cluster.devices_per_node
    if n % per_node == 0:
        sub = replace(cluster, num_nodes=n // per_node)
    elif per_node % n == 0:  # a worker inside one node: the node's fabric, its share of the NICs
        nics = max(1, cluster.nics_per_node * n // per_node)
        sub = replace(cluster, num_nodes=1, devices_per_node=n, nics_per_node=nics)
    else:
        raise SpecError(
            f"{where}",
            f"a worker's tp*pp*dp = {pool.tp}*{pool.pp}*{pool.dp} = {n} GPUs must fill whole nodes of {per_node} "
            f"or divide one",
        )
    etp = _expert_tp(model, traits, pool, where)
    dispatch = _moe_dispatch(traits, pool, dispatch, etp, where)
    par = ParallelSpec(tp=pool.tp, pp=pool.pp, dp=pool.dp, ep=pool.ep, expert_tp=etp, ep_dispatch=dispatch,
                       kv_head_replication=traits.kv_head_replication)  # fmt: skip
    try:  # the layout's own rules (heads by tp, experts by ep, layers by pp), named at the pool's fields
        validate_parallel(par, model, WorkloadSpec(kind="inference", batch_size=pool.dp), n)
    except SpecError as err:
        raise _at_pool(err, traits, pool, where) from None
    decode = par
    if dispatch == "deepep" and traits.deepep_low_latency_decode:
        decode = replace(par, ep_dispatch="deepep_ll")
    return _Worker(par, sub, pool.max_batch_tokens or traits.max_batch_tokens, decode, traits.two_batch_overlap,
                   (traits.dp_sync_rows, traits.dp_sync_source), traits.tp_allreduce,
                   traits.fp8_context_attention is not None, traits.bf16_dispatches, traits.kernels,
                   traits.post_quant_dispatches)  # fmt: skip


def _expert_tp(model: ModelSpec, traits: EngineTraits, pool: Pool, where: str) -> int:
    """The expert TP the engine gives the pool's MoE layers (EngineTraits.experts: tp x dp / ep), 1 on a dense
    model; a 422 at the pool's ep where the engine cannot split its experts so."""
    if model.moe is None or model.moe.num_experts % pool.ep:
        return 1  # experts that do not divide over ep: validate_parallel names that rule
    traits.experts.check(pool.tp, pool.dp, pool.ep, where)
    return traits.experts.expert_tp(pool.tp, pool.dp, pool.ep)


def _moe_dispatch(traits: EngineTraits, pool: Pool, dispatch: str, etp: int, where: str) -> str:
    """The MoE exchange the engine runs for the pool: none with tensor-parallel attention (dp 1), the engine's gather
    where experts split over TP meet attention DP (EngineTraits.experts.dispatch), else the one asked or its
    default."""
    if pool.dp == 1 and pool.ep * etp > 1:
        # tensor-parallel attention: every EP rank holds every token, so no engine issues a MoE collective (the TP
        # all-reduce sums the experts' output): vLLM all2all kernels need dp > 1, TensorRT-LLM's
        # communication_factory returns None without attention DP, SGLang gathers only with DP attention
        return "replicated"
    if etp == 1 or dispatch in GATHER_DISPATCHES:
        return dispatch
    if pool.ep_dispatch:
        raise SpecError(
            f"{where}.ep_dispatch",
            f"{dispatch!r} moves tokens to whole experts; ep {pool.ep} splits each expert over {etp} ranks "
            f"({traits.experts.source}): set ep to tp*dp = {pool.tp * pool.dp}, or leave ep_dispatch out",
        )
    return traits.experts.dispatch


def _at_pool(err: SpecError, traits: EngineTraits, pool: Pool, where: str) -> SpecError:
    """A layout rule's 422 named at the pool's field; the expert TP's at its ep (the engine derives it from tp, dp
    and ep: EngineTraits.experts)."""
    name = err.field.removeprefix("parallel").lstrip(".")
    rule = err.rule
    if name == "expert_tp":
        name, rule = "ep", f"{rule} (tp*dp / ep = {pool.tp}*{pool.dp} / {pool.ep}: {traits.experts.source})"
    return SpecError(f"{where}.{name}" if name else where, rule)


def worker_inputs(model, cluster, traits, traffic, pools, options) -> list[tuple]:
    """(role, workload, parallel, cluster, plans) of every pool's worker as plan_serving plans it: what the
    cost guard estimates before any work is done (``plans`` bounds how many steps the pool plans), after
    check_deployment."""
    check_deployment(model, cluster, traits, traffic, pools, options)
    model = served_model(model, options)
    context = traffic.input_tokens + traffic.output_tokens // 2
    # with two-batch overlap each step plans the whole batch and up to two halves (deployment._overlapped); at a rate,
    # a saturated deployment plans its decode step at the KV cache's batch and the batch its prefill pool feeds
    # (_aggregated_capacity, _disaggregated_capacity)
    steps = 3 if traffic.concurrency is not None else 2 + DECODE_ITERATIONS + SATURATED_STEPS
    plans = steps * (3 if options.two_batch_overlap else 1)
    out = []
    for i, pool in enumerate(pools):
        w = _worker(model, cluster, traits, pool, i)
        work = _work(options, "decode", w.par.dp, context, bf16_dispatch=w.bf16_dispatch(w.par), kernels=w.kernels,
                     post_quant=w.post_quant(w.par))  # fmt: skip
        out.append((pool.role, work, w.par, w.cluster, plans))
    return out


DECODE_ITERATIONS = 12  # Little's-law iterations for a decode batch at a request rate (_decode_batch)
SATURATED_STEPS = 2  # decode steps a saturated deployment adds: at the full KV cache, at the fed batch


def _work(options: ServeOptions, phase: str, batch: int, context: int, fp8_fmha: bool = False,
          bf16_dispatch: bool = False, kernels: EngineKernels | None = None,
          post_quant: bool = False) -> WorkloadSpec:  # fmt: skip
    """A step's workload; ``fp8_fmha``: the engine runs an FP8 context FMHA (EngineTraits.fp8_context_attention),
    which it does for a prefill pass with quantized linears (engines.FP8_FMHA_WEIGHTS: the quantized o_proj's output
    scale takes the op's FP8 path, whatever the KV cache); ``bf16_dispatch``: the pool's dispatcher moves bf16 rows
    of fp8 weights (_Worker.bf16_dispatch); ``kernels``: what the engine's own kernels fuse (EngineTraits.kernels);
    ``post_quant``: the dispatcher moves a block-format checkpoint's rows in that format (_Worker.post_quant)."""
    return WorkloadSpec(
        kind="inference",
        phase=phase,
        batch_size=batch,
        context_length=context,
        param_dtype=options.weight_dtype,
        activation_dtype="bf16" if weight_bytes(options.weight_dtype) < 2 else options.weight_dtype,
        kv_dtype=options.kv,
        moe_dispatch_dtype=_dispatch_dtype(options.weight_dtype, bf16_dispatch, post_quant),
        # the engines capture decode steps in CUDA graphs by default (vLLM, SGLang, TensorRT-LLM): no host dispatch
        # per kernel (planner/kernels.py cpu_op_s); prefill runs eager in all three
        cuda_graphs=options.cuda_graphs and phase == "decode",
        fp8_recipe=_gemm_recipe(options),
        fp8_context_attention=fp8_fmha and phase == "prefill" and options.weight_dtype in FP8_FMHA_WEIGHTS,
        engine_kernels=kernels,
    )


def _dispatch_dtype(weights: str, bf16_dispatch: bool, post_quant: bool) -> str | None:
    """The MoE dispatch's dtype for a checkpoint of ``weights``: fp8 weights' fp8 rows unless the dispatcher moves
    bf16 (_Worker.bf16_dispatch); a block format's own rows where the engine post-quant dispatches it
    (_Worker.post_quant: TensorRT-LLM's NVFP4 on DeepEP); else None, the activations' dtype."""
    if weights == "fp8":
        return None if bf16_dispatch else "fp8"
    return weights if post_quant and weights in DISPATCH_FORMATS else None


def check_weight_format(dtype: str, gpu, model: ModelSpec | None = None, fp8_recipe: str | None = None) -> None:
    """A block-scaled weight format runs its GEMMs on the tensor cores that have it: the recipe's compute capability
    (nvfp4: 10.0, Blackwell; recipes.py RECIPES, TransformerEngine _compute_nvfp4_support). A weight-only format
    (no recipe: MXFP4) needs the engines' own minimum (MXFP4_MIN_SM) and, storing only the MoE experts so, a model
    with experts. fp8 weights run their GEMMs under options.fp8_recipe (_gemm_recipe), checked here at that field:
    the plan's own check named workload.fp8_recipe, a field no serving request has (hostile10: fp8 weights on an
    A100, blockwise by default, sm 9.0)."""
    if dtype == "fp8":
        check_recipe_gpu(fp8_recipe, gpu, "options.fp8_recipe", f"fp8 weights under fp8_recipe {fp8_recipe!r} need",
                         ": use bf16 weights, or a recipe the GPU has")  # fmt: skip
    if dtype not in WEIGHT_FORMAT_BYTES:
        return
    recipe = WEIGHT_FORMAT_RECIPE[dtype]
    if recipe is None:
        if gpu.sm < MXFP4_MIN_SM:
            raise SpecError(
                "options.weight_dtype",
                f"{dtype} weights need compute capability >= {MXFP4_MIN_SM / 10:.1f} (vLLM's and SGLang's "
                f"Mxfp4Config.get_min_capability); GPU {gpu.name!r} is sm{gpu.sm}: use bf16",
            )
        if model is not None and model.moe is None and dtype in EXPERT_WEIGHT_FORMATS:
            raise SpecError(
                "options.weight_dtype",
                f"{dtype} stores only the MoE experts' weights (vLLM / SGLang Mxfp4Config: linear layers stay "
                f"unquantized); model {model.name!r} has no experts: use bf16, fp8 or nvfp4",
            )
        return
    # the recipe's own rule (the GPU's compute capability against the recipe's), where training checks it
    check_recipe_gpu(recipe, gpu, "options.weight_dtype", f"{dtype} weights need", ": use fp8 or bf16")


def _gemm_recipe(options: ServeOptions) -> str | None:
    """The low-precision recipe the linear layers' GEMMs run as (planner/kernels.py gemm_dtype reads its
    kernel_dtype): fp8 weights' options.fp8_recipe; a block-scaled format's recipe of the same name (nvfp4 weights:
    nvfp4 x nvfp4 GEMMs, the activations quantized per 16 as TensorRT-LLM's W4A4 NVFP4 linears run them); None: the
    GEMMs in the activation dtype."""
    if options.weight_dtype == "fp8":
        return options.fp8_recipe
    return WEIGHT_FORMAT_RECIPE.get(options.weight_dtype)


@lru_cache(maxsize=512)  # value keys (frozen specs); the SLA search plans a layout's steps once per split
def _step(model: ModelSpec, w: _Worker, options: ServeOptions, phase: str, batch: int, context: int) -> Plan:
    """One prefill pass or decode step of a worker: ``batch`` sequences over its attention ranks, with the
    engine's own per-step calls (rules/engine_step.py) listed, priced like the plan's and on the critical path."""
    par = w.decode_par if phase == "decode" else w.par
    work = _work(options, phase, batch, context, w.fp8_fmha, w.bf16_dispatch(par), w.kernels, w.post_quant(par))
    plan = build_plan(model, work, par, w.cluster, Options(timeline=False))
    if w.allreduce is not None:
        plan = engine_allreduce_step(plan, w.allreduce, _context(model, options, phase, batch, context, par, w),
                                     w.cluster)  # fmt: skip
    sync = dp_sync(par, *w.dp_sync)
    if sync is None or plan.step is None:
        return plan
    rows = price_calls([sync], par, w.cluster)
    return replace(plan, calls=plan.calls + rows, step=_on_critical_path(plan.step, rows))


def _on_critical_path(step, rows: list[PricedCall]):
    """The step with calls that block its start (the host waits for their answer) as exposed communication of
    their parallelism. Every stage's ranks issue them at the step's start, at once, so the step waits once: on
    the first stage that issues them (the stages then run one after another, step._inference)."""
    stages = list(step.stages)
    added = 0.0
    for pc in rows:
        t = pc.price.time_s * pc.call.calls_per_iteration
        s = min(pc.call.stages)
        st = stages[s]
        key = (pc.call.parallelism, "forward")
        exposed = {**st.exposed_by_stream, key: st.exposed_by_stream.get(key, 0.0) + t}
        stages[s] = replace(st, fwd_comm_s=st.fwd_comm_s + t, exposed_by_stream=exposed)
        added += t
    time_s = step.time_s + added
    keep = step.time_s / time_s
    return replace(step, time_s=time_s, exposed_comm_s=step.exposed_comm_s + added, stages=stages,
                   mfu=step.mfu * keep, tokens_per_s=step.tokens_per_s * keep)  # fmt: skip


def _overlapped(model: ModelSpec, w: _Worker, options: ServeOptions, phase: str, batch: int, context: int) -> Plan:
    """A step as the engine runs it: one pass, or with ``options.two_batch_overlap`` two micro-batches of half the
    tokens each, the MoE layers' stages interleaved as the engine's operations strategy orders them and the EP
    exchange of one half behind the other's compute (planner/serving/overlap.py: SGLang two_batch_overlap.py and
    operations_strategy.py; vLLM dual batch overlap), where the engine splits the step at all (its thresholds:
    ``OverlapStrategy.splits``). The MoE layers' exchanges are the halves', one each; memory is the whole batch's
    (both halves are in flight). A decode step of one sequence per rank is not split (a half would be empty)."""
    whole = _step(model, w, options, phase, batch, context)
    per_rank = batch // w.par.dp
    scale = options.prefill_time_scale if phase == "prefill" else options.decode_time_scale
    if not options.two_batch_overlap or whole.step is None or w.overlap is None:
        return _calibrated(whole, scale)
    par = w.decode_par if phase == "decode" else w.par
    strategy = w.overlap[phase == "decode"]
    tokens = per_rank * (context if phase == "prefill" else 1)
    if not strategy.splits(tokens, par.ep_dispatch) or (phase == "decode" and per_rank < 2):
        return _calibrated(whole, scale)
    hi, lo = -(-per_rank // 2), per_rank // 2
    # equal halves; else the larger and the smaller at 1/2 each; a single prompt: two chunks of half its tokens
    sizes = ((hi, 1.0),) if hi == lo else ((hi, 0.5), (lo, 0.5)) if lo else ((hi, 0.5),)
    halves = tuple((_step(model, w, options, phase, n * w.par.dp, context),
                    _context(model, options, phase, n * w.par.dp, context, par, w), weight)
                   for n, weight in sizes)  # fmt: skip
    step = overlapped_step(
        whole, halves, _context(model, options, phase, batch, context, par, w), w.cluster.gpu, strategy,
        par.ep_dispatch,
    )  # fmt: skip
    return _calibrated(step, scale)


def _context(model, options, phase, batch, context, par, w) -> Context:
    work = _work(options, phase, batch, context, w.fp8_fmha, w.bf16_dispatch(par), w.kernels, w.post_quant(par))
    return Context(model, work, par, w.cluster.devices_per_node, device_sms(w.cluster))


def _calibrated(plan: Plan, scale: float) -> Plan:
    """The step with its time multiplied by the user's calibrated factor (options.*_time_scale; 1: unchanged)."""
    if scale == 1.0 or plan.step is None:
        return plan
    step = plan.step
    return replace(plan, step=replace(step, time_s=step.time_s * scale, tokens_per_s=step.tokens_per_s / scale))


def _prefill(model: ModelSpec, w: _Worker, options: ServeOptions, isl: int, waiting: int | None = None
             ) -> tuple[Plan, int]:  # fmt: skip
    """The prefill pass of as many prompts per attention rank as the batch-token budget takes (at least one;
    a longer prompt is prefilled in chunks whose attention adds up to the whole prompt's), and no more than the
    ``waiting`` prompts a worker can have at once (a concurrency of C over W workers: ceil(C / W)); one prompt
    on a worker is a pass of one prompt per attention rank, since the ranks step together."""
    per_rank = max(1, w.batch_tokens // isl)
    if waiting is not None:
        per_rank = min(per_rank, max(1, math.ceil(waiting / w.par.dp)))
    batch = per_rank * w.par.dp
    return _overlapped(model, w, options, "prefill", batch, isl), batch


def _decode(model: ModelSpec, w: _Worker, options: ServeOptions, batch: int, context: int, draft: int) -> Plan:
    """A decode step of ``batch`` sequences (rounded up to whole attention ranks); with ``draft`` speculative
    tokens each sequence verifies 1 + draft tokens, priced as that many sequences' GEMMs and calls."""
    per_rank = max(1, math.ceil(batch / w.par.dp))
    return _overlapped(model, w, options, "decode", per_rank * w.par.dp * (1 + draft), context)


# ---- memory --------------------------------------------------------------------------------------------


def kv_capacity(
    model: ModelSpec,
    w: _Worker,
    plan: Plan,
    largest: Plan,
    counted: tuple[str, int, int],
    request_tokens: int,
    options: ServeOptions,
    traits: EngineTraits,
) -> int:
    """Tokens of KV one worker holds: per attention rank, what the engine's memory share leaves after the
    weights (``plan``, a decode step), the activations of ``largest`` (the largest pass the worker runs, without
    the KV it counted itself: ``counted`` = its phase, batch and context) and the larger of the two passes'
    buffers, over the KV one request of ``request_tokens``
    keeps, per token. Both KV amounts are the planner's memory rule (memory.kv_cache_bytes: a sliding-window
    layer keeps only its window when decoding). Pipeline stages share a request, so the tightest stage decides;
    attention ranks each hold their own."""
    gpu = w.cluster.gpu
    # the engine's share of the whole GPU (vLLM, SGLang), or of what the weights and the largest pass leave free,
    # all of it for KV (TensorRT-LLM: engines.py memory_fraction_of_free)
    share = 1.0 if traits.memory_fraction_of_free else traits.memory_fraction
    kv_share = traits.memory_fraction if traits.memory_fraction_of_free else 1.0
    budget = gpu.hbm_bytes * share
    par = w.decode_par
    counted_par = w.par if counted[0] == "prefill" else par
    own = Context(model, _work(options, *counted, bf16_dispatch=w.bf16_dispatch(counted_par)), counted_par,
                  w.cluster.devices_per_node, device_sms(w.cluster))  # fmt: skip
    one = Context(model, _work(options, "decode", par.dp, request_tokens, bf16_dispatch=w.bf16_dispatch(par)), par,
                  w.cluster.devices_per_node, device_sms(w.cluster))  # fmt: skip
    tokens = math.inf
    for st, big in zip(plan.memory.per_stage, largest.memory.per_stage, strict=True):
        per_token = kv_cache_bytes(one, st.stage) / request_tokens
        activations = max(0, big.activations_bytes - kv_cache_bytes(own, st.stage))
        free = (budget - st.params_bytes - activations - max(st.buffers_bytes, big.buffers_bytes)) * kv_share
        tokens = min(tokens, free / per_token if per_token else math.inf)
    return max(0, int(tokens)) * w.par.dp if math.isfinite(tokens) else 0


# ---- the two modes -------------------------------------------------------------------------------------


def _aggregated(model, cluster, traits, traffic, pool, w, options, tps, warnings) -> ServePlan:
    isl, osl = traffic.input_tokens, traffic.output_tokens
    prefill, n_pre = _prefill(model, w, options, isl, _waiting(traffic, pool.workers))
    t_p = prefill.step.time_s
    probe = _decode(model, w, options, 1, isl + osl // 2, 0)
    capacity = kv_capacity(model, w, probe, prefill, ("prefill", n_pre, isl), isl + osl, options, traits)
    max_conc = capacity // (isl + osl)
    batch, decode, over = _decode_batch(model, w, options, traffic, pool.workers, max_conc, t_p, tps, warnings)
    t_d = decode.step.time_s * _mtp_overhead(model, options)
    ttft = None
    saturated = False
    share = t_p / n_pre  # worker time per request's prefill
    if traffic.request_rate is not None:
        rate = traffic.request_rate / pool.workers
        if rate * share >= 1 or over:
            # saturated: the worker serves its capacity, not the asked rate (_aggregated_capacity), and the queue grows
            saturated = True
            served, batch, decode, t_d = _aggregated_capacity(model, w, options, traffic, max_conc, t_p, share, tps)
            why = (f"prefill alone needs {human_percent(rate * share)} of each worker's time" if rate * share >= 1
                   else f"each worker's KV cache holds {max_conc:,} requests")  # fmt: skip
            _saturated(warnings, traffic.request_rate, served * pool.workers, why)
            rate = min(rate, served)
        u = rate * share
        tpot = t_d / (1 - u) / tps
        if not saturated:
            ttft = t_p + _wait(u, t_p) + t_d / 2
        bottleneck = "prefill" if u > 0.5 else "decode"
    else:
        # closed loop (the disaggregated one's model, _closed_loop): the worker holds N = min(C / W, b) requests,
        # each in its prefill pass (and the half decode step it joins) or decoding at TPOT(R), stretched by the
        # prefill's share of the worker, u = R share; the others wait in the engine's queue
        per_worker = traffic.concurrency / pool.workers
        held = min(per_worker, batch)
        rate = _closed_loop(held, t_p + t_d / 2, osl * t_d / tps, share, math.inf)
        tpot = t_d / (1 - rate * share) / tps
        ttft = max(t_p + t_d / 2, per_worker / rate - osl * tpot)  # the queue's wait, (C / W - N) / R, included
        # below the KV cache's batch every request is held: more of them would serve more (the load binds)
        bottleneck = "prefill" if rate * share > 0.5 else "concurrency" if per_worker < max_conc else "decode"
    total_rate = rate * pool.workers
    fits = prefill.memory.fits and decode.memory.fits and max_conc >= 1
    result = PoolResult(
        pool, "both", pool.gpus, batch, t_d, t_p, total_rate * isl, total_rate * osl, fits,
        decode.calls, prefill.calls, max(prefill.memory.peak_bytes, decode.memory.peak_bytes),
    )  # fmt: skip
    return _result(
        model, traffic, options, [result], None, ttft, tpot, total_rate, capacity, max_conc, bottleneck, warnings,
        saturated,
    )  # fmt: skip


def _disaggregated(model, cluster, traits, traffic, pools, workers, options, tps, warnings, offsets) -> ServePlan:
    isl, osl = traffic.input_tokens, traffic.output_tokens
    (p_pool, d_pool), (p_w, d_w) = pools, workers
    prefill, n_pre = _prefill(model, p_w, options, isl, _waiting(traffic, p_pool.workers))
    t_p = prefill.step.time_s
    r_p = p_pool.workers * n_pre / t_p  # requests/s the prefill pool can serve
    probe = _decode(model, d_w, options, 1, isl + osl // 2, 0)
    counted = ("decode", d_w.par.dp, isl + osl // 2)
    capacity = kv_capacity(model, d_w, probe, probe, counted, isl + osl, options, traits)
    max_conc = capacity // (isl + osl)
    batch, decode, over = _decode_batch(model, d_w, options, traffic, d_pool.workers, max_conc, t_p, tps, warnings)
    t_d = decode.step.time_s * _mtp_overhead(model, options)
    r_d = d_pool.workers * batch * tps / (osl * t_d)
    transfer = kv_transfer(
        model, cluster, p_pool, p_w, d_pool, d_w, options, isl, offsets, traits.kv_transfer_sends_replicas
    )
    bottleneck = "prefill" if r_p < r_d else "decode"
    saturated = False
    if traffic.request_rate is not None:
        rate = traffic.request_rate
        if rate > r_d:
            served = f"the decode pool serves at most {human_number(r_d)} requests/s"
            warnings.append(f"{served} at batch {batch:,}; asked {human_number(rate)}")
        if rate >= r_p:
            warnings.append(
                f"saturated: the prefill pool serves at most {human_number(r_p)} requests/s ({p_pool.workers:,} "
                f"worker{'s' if p_pool.workers > 1 else ''} x {n_pre:,} prompts per {human_seconds(t_p)}); TTFT "
                "grows without bound"
            )
        if over or rate > r_d or rate >= r_p:
            saturated = True
            served, batch, decode, t_d, bottleneck = _disaggregated_capacity(
                model, d_w, options, traffic, d_pool.workers, max_conc, r_p, t_p + transfer.time_s, tps
            )
            _saturated(warnings, rate, served, f"bound by the {bottleneck} pool")
            rate = min(rate, served)
    else:
        rate = min(r_p, r_d)
        if r_p < r_d:  # prefill-bound: the decode pool holds only what the prefill pool feeds it (Little's law)
            batch, decode, t_d = _fed_decode(model, d_w, options, traffic, rate, d_pool.workers, batch, t_d, tps)
    rho = rate / r_p
    tpot = t_d / tps
    if traffic.concurrency is not None:
        # closed loop (_closed_loop): unqueued, a request takes one prefill pass, its move and its decode (the
        # decode pool's step is its own: no prefill share); at capacity R is the pools'. TTFT = C / R - OSL TPOT
        # grows with C, never falls.
        pools_rate = rate
        rate = _closed_loop(traffic.concurrency, t_p + transfer.time_s, osl * tpot, 0.0, pools_rate)
        ttft = max(t_p + transfer.time_s, traffic.concurrency / rate - osl * tpot)
        if rate < pools_rate:
            bottleneck = "concurrency"  # the load, not a pool, limits the rate
    else:  # an open loop: the M/D/1 wait for the prefill pass; saturated, the queue grows without bound
        ttft = None if saturated else t_p + _wait(rho, t_p) + transfer.time_s
    results = [
        PoolResult(
            p_pool, "prefill", p_pool.gpus, n_pre, t_p, t_p, rate * isl, 0.0, prefill.memory.fits,
            prefill.calls, prefill.calls, prefill.memory.peak_bytes,
        ),
        PoolResult(
            d_pool, "decode", d_pool.gpus, batch, t_d, 0.0, 0.0, rate * osl, decode.memory.fits and max_conc >= 1,
            decode.calls, [], decode.memory.peak_bytes,
        ),
    ]  # fmt: skip
    return _result(
        model, traffic, options, results, transfer, ttft, tpot, rate, capacity, max_conc, bottleneck, warnings,
        saturated,
    )  # fmt: skip


def _result(model, traffic, options, pools, transfer, ttft, tpot, rate, capacity, max_conc, bottleneck, warnings,
            saturated=False):  # fmt: skip
    gpus = sum(p.gpus for p in pools)
    out_rate = rate * traffic.output_tokens
    kv = KVCache(model.num_layers * model.kv_token_bytes(1, DTYPE_BYTES[options.kv]), capacity, max_conc, options.kv)
    fits = all(p.fits for p in pools)
    for p in pools:
        if not p.fits:
            warnings.append(
                f"the {'' if p.role == 'both' else p.role + ' '}pool does not fit: {human_bytes(p.memory_peak_bytes)} "
                "peak per GPU, or no room for one "
                f"request's {traffic.input_tokens + traffic.output_tokens:,} tokens of KV cache"
            )
    return ServePlan(
        gpus=gpus,
        ttft_s=ttft,
        tpot_s=tpot,
        fits=fits,
        input_tokens_per_s=rate * traffic.input_tokens,
        output_tokens_per_s=out_rate,
        output_tokens_per_s_per_gpu=out_rate / gpus,
        tokens_per_s_per_user=1 / tpot if tpot else 0.0,
        request_rate=rate,
        kv_cache=kv,
        pools=pools,
        kv_transfer=transfer,
        bottleneck=bottleneck,
        saturated=saturated,
        warnings=warnings,
    )


def _decode_batch(model, w, options, traffic, workers, max_conc, t_p, tps, warnings) -> tuple[int, Plan, bool]:
    """Sequences a worker holds in its decode batch, that decode step, and whether the asked load needs more than
    the KV cache holds. At a concurrency: the requests spread over the workers, at most what the KV cache holds
    (the rest wait in the engine's queue; never over: a closed loop's queue is bounded). At a request rate:
    Little's law, b = R_w (TTFT + OSL TPOT(b)), iterated from b = 1 (TTFT taken as one prefill pass); it
    converges because TPOT(b) grows more slowly than b; over the KV cache the worker is saturated."""
    isl, osl = traffic.input_tokens, traffic.output_tokens
    draft = options.mtp.draft_tokens if options.mtp else 0
    cap = max(1, max_conc)
    step = {}

    def decode(b: int) -> Plan:
        if b not in step:
            step[b] = _decode(model, w, options, b, isl + osl // 2, draft)
        return step[b]

    if traffic.concurrency is not None:
        want = math.ceil(traffic.concurrency / workers)
        if max_conc and want > max_conc:
            warnings.append(
                f"concurrency {traffic.concurrency:,} is {want:,} requests per worker, but its KV cache holds "
                f"{max_conc:,}: the rest wait in the queue"
            )
        b = min(want, cap)
        return b, decode(b), False
    rate = traffic.request_rate / workers
    b = 1
    for _ in range(DECODE_ITERATIONS):
        tpot = decode(b).step.time_s * _mtp_overhead(model, options) / tps
        new = min(cap, max(1, math.ceil(rate * (t_p + osl * tpot))))
        if new == b:
            break
        b = new
    over = rate * (t_p + osl * decode(b).step.time_s / tps) > cap
    if over:
        warnings.append(
            f"{human_number(traffic.request_rate)} requests/s need more sequences per worker than its KV cache "
            f"holds ({max_conc:,}): the decode pool is saturated"
        )
    return b, decode(b), over


def _aggregated_capacity(model, w, options, traffic, max_conc, t_p, share, tps) -> tuple[float, int, Plan, float]:
    """What one saturated aggregated worker serves: the queue in front of it never empties, so it holds all its KV
    cache takes (b = max_conc) and serves the closed loop's rate at that population, _closed_loop's mean-value
    bound (one home with the concurrency path), R < 1 / share. (requests/s per worker, batch, decode step, t_d)."""
    osl = traffic.output_tokens
    cap = max(1, max_conc)
    decode, t_d = _decode_at(model, w, options, traffic, cap)
    return _closed_loop(cap, t_p + t_d / 2, osl * t_d / tps, share, math.inf), cap, decode, t_d


def _disaggregated_capacity(model, w, options, traffic, workers, max_conc, r_p, unqueued_s, tps
                            ) -> tuple[float, int, Plan, float, str]:  # fmt: skip
    """What a saturated disaggregated deployment serves: the decode pool with every worker's KV cache full
    (max_conc requests each, held from the prefill through the transfer to the last token, as _decode_batch's
    Little's law holds them) and the prefill pool at r_p, the mean-value bounds of _closed_loop over that population:
    R = min(r_p, the decode pool's W b tokens_per_step / (OSL t_d(b)), W b / (t_p + transfer + OSL TPOT)). Where the
    prefill pool binds, the decode pool holds only what it is fed (_fed_decode). (requests/s, decode batch, decode
    step, t_d, the pool that binds)."""
    osl = traffic.output_tokens
    cap = max(1, max_conc)
    decode, t_d = _decode_at(model, w, options, traffic, cap)
    r_d = workers * cap * tps / (osl * t_d)
    rate = _closed_loop(workers * cap, unqueued_s, osl * t_d / tps, 0.0, min(r_p, r_d))
    if rate < r_p:
        return rate, cap, decode, t_d, "decode"
    return rate, *_fed_decode(model, w, options, traffic, rate, workers, cap, t_d, tps), "prefill"


def _fed_decode(model, w, options, traffic, rate, workers, batch, t_d, tps) -> tuple[int, Plan, float]:
    """A decode pool behind a prefill pool that binds holds only what it is fed: Little's law on the decode side,
    b = R OSL TPOT / workers (at most ``batch``), and that step. (batch, decode step, t_d)."""
    batch = min(batch, max(1, math.ceil(rate * traffic.output_tokens * t_d / tps / workers)))
    return batch, *_decode_at(model, w, options, traffic, batch)


def _decode_at(model, w, options, traffic, batch: int) -> tuple[Plan, float]:
    """A worker's decode step at ``batch`` sequences, mid-output (the traffic's ISL + OSL / 2 of context), and its
    time with the MTP drafts' overhead, t_d: what the saturated and fed decode pools run."""
    isl, osl = traffic.input_tokens, traffic.output_tokens
    decode = _decode(model, w, options, batch, isl + osl // 2, options.mtp.draft_tokens if options.mtp else 0)
    return decode, decode.step.time_s * _mtp_overhead(model, options)


def _saturated(warnings: list[str], asked: float, served: float, why: str) -> None:
    warnings.append(
        f"saturated: {human_number(asked)} requests/s are more than the deployment serves, {human_number(served)} "
        f"requests/s ({why}); the queue and TTFT grow without bound, and request_rate and the throughput are the "
        "served rate"
    )


def _waiting(traffic: Traffic, workers: int) -> int | None:
    """Prompts one worker can have waiting at once: a concurrency's share (ceil(C / W)); None at a request rate
    (its batches are as full as the budget)."""
    return None if traffic.concurrency is None else math.ceil(traffic.concurrency / workers)


def _closed_loop(population: float, unqueued_s: float, decode_s: float, share: float, capacity: float) -> float:
    """Requests/s of a closed loop of ``population`` requests, aggregated and disaggregated alike: the asymptotic
    bounds of mean-value analysis (Lazowska et al. 1984, "Quantitative System Performance" ch. 5), R = min(the
    resources' ``capacity``, the R at which Little's law holds over the population with no queueing,
    N = R (unqueued_s + decode_s / (1 - R share))). ``unqueued_s``: a request's time to its first token unqueued
    (its prefill pass, its KV move or the decode step it joins); ``decode_s``: its OSL tokens at the bare decode
    step; ``share``: the worker time one request's prefill takes from decoding (aggregated; 0 for a decode pool),
    which stretches TPOT to t_d / (1 - R share) and keeps R below 1 / share. The root of
    a·s·R² - (a + k + N·s)·R + N = 0 below 1 / s, in the form that is exact at s = 0 (R = N / (a + k))."""
    a, k, n = unqueued_s, decode_s, population
    b = a + k + n * share
    return min(capacity, 2 * n / (b + math.sqrt(max(0.0, b * b - 4 * a * share * n))))


def _wait(rho: float, service_s: float) -> float:
    """Mean wait in an M/D/1 queue (Pollaczek-Khinchine with deterministic service)."""
    return rho * service_s / (2 * (1 - rho)) if rho < 1 else math.inf


def _mtp_overhead(model: ModelSpec, options: ServeOptions) -> float:
    """Each draft token runs the MTP module, about one transformer layer (DeepSeek-V3 report §2.2): the step
    grows by draft / num_layers."""
    if options.mtp is None:
        return 1.0
    return 1 + options.mtp.draft_tokens / model.num_layers


# ---- the KV transfer -----------------------------------------------------------------------------------


def kv_transfer(model, cluster, p_pool, p_w, d_pool, d_w, options, isl, offsets,
                sends_replicas: bool = False) -> KVTransfer:  # fmt: skip
    """A request's KV from a prefill worker to a decode worker (``_kv_transfer``), keyed by what it depends on: the
    layouts, the KV dtype, the per-transfer overhead and whether every copy of a replicated head is sent
    (EngineTraits.kv_transfer_sends_replicas), not the load, so the SLA search prices each split once for its three
    loads and for the engines that send alike. The answer is shared: read it, never change it."""
    p, d = p_w.par, d_w.par
    # the engine's choice only matters where the prefill replicates heads and the decode TP is the smaller: keyed so
    sends_replicas = sends_replicas and not model.mla and p.tp > max(d.tp, model.kv_heads)
    return _kv_transfer(model, cluster, p_pool.workers, p_pool.worker_gpus, (p.tp, p.pp, p.dp), d_pool.workers,
                        d_pool.worker_gpus, (d.tp, d.pp, d.dp), options.kv, options.transfer_overhead_s, isl,
                        tuple(offsets), sends_replicas)  # fmt: skip


_Grid = namedtuple("_Grid", "tp pp dp")


@lru_cache(maxsize=512)  # value keys (frozen specs and numbers)
def _kv_transfer(model, cluster, p_workers, p_gpus, p_grid, d_workers, d_gpus, d_grid, kv, overhead_s, isl,
                 offsets, sends_replicas=False) -> KVTransfer:  # fmt: skip
    """A request's KV moves from the prefill worker's ranks to the decode worker's ranks that will hold it
    (``_transfer_pairs``), all prefill workers sending at once, priced on the whole cluster's graph.

    ``bytes_per_request`` is the request's KV as the model stores it; ``wire_bytes`` what the pairs move, more
    where a side replicates KV heads (every decode copy is filled). A request lives on one attention-DP rank;
    prefill worker w's requests go to decode worker w mod workers and to its attention rank w mod dp, so
    concurrent transfers spread as the engines' round-robin spreads them."""
    p_par, d_par = _Grid(*p_grid), _Grid(*d_grid)
    kv_x = DTYPE_BYTES[kv]
    whole = model.num_layers * model.kv_token_bytes(1, kv_x) * isl
    ranks, share = _transfer_pairs(model, p_par.tp, d_par.tp, sends_replicas)
    message = -(-whole * share[0] // (p_par.pp * share[1]))
    pairs = []
    for wk in range(p_workers):
        src0 = offsets[0] + wk * p_gpus + (wk % p_par.dp) * p_par.tp  # tp fastest, then dp, then pp
        dst_worker = wk % d_workers
        dst0 = offsets[1] + dst_worker * d_gpus + (wk % d_par.dp) * d_par.tp
        for s in range(p_par.pp):
            d_stage = s * d_par.pp // p_par.pp
            for i, j in ranks:
                pairs.append((src0 + s * p_par.tp * p_par.dp + i, dst0 + d_stage * d_par.tp * d_par.dp + j))
    senders = p_par.pp * len({i for i, _ in ranks})
    wire = message * len(ranks) * p_par.pp
    whole_cluster = cluster_for(cluster)
    price = price_call(Op.SENDRECV, message, np.array(pairs, dtype=np.int64), whole_cluster, "auto", top_links=3)
    busiest = price.links[0] if price.links else None
    label = _describe(whole_cluster, busiest) if busiest else "none (same device)"
    first = pairs[0][1] - (pairs[0][1] - offsets[1]) % d_gpus  # the decode worker prefill worker 0 feeds
    devices = [*range(offsets[0], offsets[0] + p_gpus), *range(first, first + d_gpus)]
    return KVTransfer(whole, senders, price.time_s + overhead_s, label, list(price.links), devices, wire)


def _transfer_pairs(model: ModelSpec, p_tp: int, d_tp: int, sends_replicas: bool
                    ) -> tuple[list[tuple[int, int]], tuple[int, int]]:  # fmt: skip
    """One pipeline stage's transfer as (prefill TP rank, decode TP rank) pairs, and each pair's share of the
    stage's KV as (heads, of heads). MLA: one pair, the whole latent (every TP rank holds it; TensorRT-LLM's
    mlaCacheFormatter sends one copy). Otherwise each pair carries the KV heads a rank of the larger TP holds,
    ``kv_heads_per_rank(max(p_tp, d_tp))``:

    - decode TP >= prefill TP: each decode rank gets its heads, copies included, from prefill rank
      ``i * p_tp // d_tp`` (vLLM NixlConnector: decode rank tp_rank reads remote rank tp_rank // tp_ratio; SGLang
      _resolve_rank_mapping target_tp_rank likewise; TensorRT-LLM targetIRanks);
    - decode TP < prefill TP: each prefill rank sends its heads to decode rank ``j * d_tp // p_tp``; where the prefill
      replicates them, every copy (``sends_replicas``: SGLang) or one per head (TensorRT-LLM's needSendCache, ranks
      with tp rank % dup factor == 0).

    Without replication either way this is ``max(p_tp, d_tp)`` pairs of an equal share (cacheFormatter.cpp
    splitKVCacheDispatch), the whole KV once."""
    if model.mla:
        return [(0, 0)], (1, 1)
    k = model.kv_heads
    if d_tp >= p_tp:
        ranks = [(i * p_tp // d_tp, i) for i in range(d_tp)]
    else:
        step = 1 if sends_replicas else max(1, p_tp // k)
        ranks = [(j, j * d_tp // p_tp) for j in range(0, p_tp, step)]
    return ranks, (model.kv_heads_per_rank(max(p_tp, d_tp)), k)


def _describe(cluster, link: dict) -> str:
    described = cluster.describe_link(link["id"])
    return described.get("label") or described.get("kind") or str(link["id"])


__all__ = [
    "KVCache",
    "KVTransfer",
    "PoolResult",
    "ServePlan",
    "check_deployment",
    "kv_capacity",
    "kv_transfer",
    "plan_serving",
    "worker_inputs",
]
