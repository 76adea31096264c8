"""Serving engines as traits: what each engine does by default that changes a serving step's calls, memory
or batching. The serving planner reads these, never an engine's name (DESIGN.md, "variation is data").

Every default names the engine file it comes from; versions are those of the serving research note
(docs/serving.md): vLLM 0.14, SGLang 0.5, TensorRT-LLM 1.2.
"""

from __future__ import annotations

from dataclasses import dataclass

from .._errors import SpecError
from ..engine_kernels import (
    SGLANG_EP_SCATTER,
    SGLANG_FUSED_QKV_A,
    SGLANG_MASKED,
    TRTLLM_FUSED_QKV_A,
    VLLM_EP_SCATTER,
    VLLM_FUSED_QKV_A,
    VLLM_MASKED,
    EngineKernels,
)
from ..rules.engine_step import DP_SYNC_ROWS, TRTLLM_AR_FUSION, VLLM_DP_SYNC
from .fused_allreduce import (
    VLLM_CUSTOM_AR_MAX_WITH_SYMM,
    VLLM_MULTIMEM_WORLD_SIZES,
    VLLM_SYMM_MEM_MAX,
    AllReducePolicy,
    CustomAllReduce,
    FusedAllReduce,
)
from .launch import (
    SGLANG_DYNAMO,
    VLLM_DYNAMO,
    CommandBuilder,
    DynamoWorker,
    RouterBuilder,
    sglang_command,
    sglang_router,
    trtllm_command,
    trtllm_router,
    vllm_command,
    vllm_router,
)
from .overlap import SGLANG_DECODE, SGLANG_PREFILL, VLLM_DBO, VLLM_DBO_PREFILL, OverlapStrategy
from .pool_rules import NO_PLAIN_DP, PlainDP


@dataclass(frozen=True)
class ExpertSplit:
    """How an engine lays a MoE layer's experts over one pipeline stage of a worker, its tp x dp ranks (attention
    data-parallel ranks included: each engine's MoE group spans them): ``ep`` ranks each hold E / ep whole experts
    and every expert is split over the remaining tp x dp / ep ranks, its expert tensor parallelism (the expert FFN
    width ffn / etp a rank, the experts' partial outputs summed after). The three engines agree on that product;
    vLLM's expert parallelism is all of the ranks or none (``ep_all_or_none``)."""

    source: str
    # True: EP is every tp x dp rank or none (vLLM --enable-expert-parallel); False: any ep dividing tp x dp
    ep_all_or_none: bool
    # the MoE exchange the engine runs with attention DP (dp > 1) where the experts are split over TP (etp > 1) and
    # the pool names no dispatcher: its all-to-all kernels move tokens to whole experts only (engine_gather.py)
    dispatch: str
    # the engine's rule that EPLB's redundant experts (options.redundant_experts) need expert parallelism (a pool's
    # ep > 1), its source; None: the engine states no such rule at the commit cited
    redundant_needs_ep: str | None = None

    def takes_redundant(self, ep: int) -> bool:
        """Whether a worker with ``ep``-way expert parallelism may carry redundant experts (``redundant_needs_ep``)."""
        return self.redundant_needs_ep is None or ep > 1

    def expert_tp(self, tp: int, dp: int, ep: int) -> int:
        """The expert TP of a worker of ``tp`` x ``dp`` ranks with ``ep``-way expert parallelism (ep divides them:
        ``check``)."""
        return tp * dp // ep

    def check(self, tp: int, dp: int, ep: int, where: str) -> None:
        """A 422 at ``where``.ep where the engine cannot split its experts so."""
        ranks = tp * dp
        if ranks % ep or (self.ep_all_or_none and ep not in (1, ranks)):
            rule = f"ep 1 or {ranks}" if self.ep_all_or_none else f"an ep that divides {ranks}"
            raise SpecError(
                f"{where}.ep",
                f"ep {ep} on a worker of tp*dp = {tp}*{dp} = {ranks} ranks: the experts take {rule} ({self.source})",
            )


# vLLM FusedMoEParallelConfig.make (vllm/model_executor/layers/fused_moe/config.py at 002d6073aa03): tp is flattened
# over dp (flatten_tp_across_dp_and_pcp, tp_size = dp x tp); without enable_expert_parallel the experts are sharded
# over all of it (FusedMoEConfig.__post_init__ intermediate_size_per_partition = intermediate_size // tp_size; the
# docs' "the expert layers will by default form a (DP x TP) sized tensor parallel group"), with it ep_size = tp_size
# and tp_size = 1. Without EP no all-to-all kernel runs (use_all2all_kernels needs use_ep): dp > 1 dispatches by
# the naive all_gatherv / reduce_scatterv (moe_runner.py do_naive_dispatch_combine)
VLLM_EXPERTS = ExpertSplit(
    "vLLM FusedMoEParallelConfig.make, fused_moe/config.py at 002d6073aa03: --enable-expert-parallel makes "
    "EP = tp x dp, else every expert is split over tp x dp",
    ep_all_or_none=True,
    dispatch="agrs",
    # ParallelConfig._validate_parallel_config (vllm/config/parallel.py at 00193b82b0e2): with enable_eplb, "if not
    # self.enable_expert_parallel: raise ValueError('enable_expert_parallel must be True to use EPLB.')", then "EPLB
    # requires tensor, prefill-context, or data parallelism" where TP x PCP x DP <= 1; so EP over tp x dp > 1 ranks
    redundant_needs_ep="vLLM ParallelConfig._validate_parallel_config (vllm/config/parallel.py at 00193b82b0e2): "
    "'enable_expert_parallel must be True to use EPLB.', and EP needs tp x dp > 1",
)
# SGLang initialize_model_parallel (python/sglang/srt/distributed/parallel_state.py at 0005973a84f7): moe_tp_size
# = tp_size // moe_ep_size // moe_dp_size (runtime_context.py derive_parallel_widths; moe_dp_size 1 by default),
# tp_size the server's --tp-size, which holds the DP-attention ranks (--dp-size divides it); without DeepEP its DP
# attention gathers before the experts (dp_attention.py)
SGLANG_EXPERTS = ExpertSplit(
    "SGLang parallel_state.py initialize_model_parallel at 0005973a84f7: moe_tp_size = tp_size // ep_size",
    ep_all_or_none=False,
    dispatch="dp_gather",
)
# TensorRT-LLM Mapping.__init__ (tensorrt_llm/mapping.py at 05ebebb2c1d3): neither moe size given, moe_tp_size =
# tp_size and moe_ep_size = 1; only moe_ep_size (trtllm-serve --ep_size), moe_tp_size = tp_size // moe_ep_size; and
# moe_tp x moe_ep must be tp_size (attention DP inside it). communication_factory.py (03c36d6222ad) forces the
# post-quant all-gather + reduce-scatter when MoE TP > 1
TRTLLM_EXPERTS = ExpertSplit(
    "TensorRT-LLM mapping.py Mapping.__init__ at 05ebebb2c1d3: moe_tp_size = tp_size // moe_ep_size",
    ep_all_or_none=False,
    dispatch="agrs_quant",
)


DEFAULT_KERNELS = EngineKernels()  # the planner's default layer: nothing fused beyond it


@dataclass(frozen=True)
class EngineTraits:
    name: str
    label: str
    # the token dispatcher a pool uses when it names none (the planner's parallel.ep_dispatch values)
    ep_dispatch: str
    ep_dispatches: tuple[str, ...]  # the dispatchers this engine can run
    max_batch_tokens: int  # tokens one prefill step takes by default (the chunk of chunked prefill)
    memory_fraction: float  # share of the GPU's memory the engine takes for weights, activations and KV
    page_tokens: int  # tokens per KV-cache block
    attention_dp: bool  # whether attention can run data-parallel inside a worker
    sources: tuple[str, ...]
    # how the MoE experts split over a worker's ranks: expert parallelism and expert TP from its tp, dp and ep
    experts: ExpertSplit
    # DeepEP's mode switch: with "deepep", decode steps run the low-latency kernels (deepep_ll) and prefill the
    # normal ones; False: the mode asked for runs in both phases
    deepep_low_latency_decode: bool = False
    # the flag that runs two micro-batches per step with the EP exchange of one behind the other's compute; None:
    # the engine has none this planner models (options.two_batch_overlap is a 422 there)
    two_batch_overlap_flag: str | None = None
    # how that overlap stages a MoE layer, (prefill, decode): planner/serving/overlap.py
    two_batch_overlap: tuple[OverlapStrategy, OverlapStrategy] | None = None
    # the flag that adds EPLB's redundant experts (options.redundant_experts)
    redundant_experts_flag: str | None = None
    # a per-step all-reduce of this many int32 values per data-parallel rank over the DP group before each step,
    # on the critical path (rules/engine_step.py dp_sync), and its source; 0: none
    dp_sync_rows: int = 0
    dp_sync_source: str = ""
    # the engine's own TP all-reduce: which kernel it runs for which all-reduce (its custom one-shot / two-shot,
    # symmetric memory, or NCCL) and the layer kernels a fused one absorbs (fused_allreduce.py); None: NCCL's
    tp_allreduce: AllReducePolicy | None = None
    # True: ``memory_fraction`` is the share of the memory left free after the weights and a profiling step's
    # peak that goes to the KV cache (TensorRT-LLM); False: the share of the whole GPU the engine may fill with
    # weights, activations and KV together (vLLM gpu_memory_utilization, SGLang mem_fraction_static)
    memory_fraction_of_free: bool = False
    # the engine's launch command for one pool, by the flag names its CLI takes (launch.py); None: the engine has
    # no launch builder and POST /v1/serve/export is a 422 on ``engine``
    launch: CommandBuilder | None = None
    # block-scaled checkpoint formats (workload.WEIGHT_FORMAT_BYTES) this planner prices for the engine; another is
    # a 422 at options.weight_dtype with ``weight_formats_note``
    weight_formats: tuple[str, ...] = ("nvfp4",)
    weight_formats_note: str = ""
    # the router a disaggregated deployment's launch script starts between its prefill and decode servers
    # (launch.py); None: the script starts none
    disagg_router: RouterBuilder | None = None
    # how Dynamo runs the engine's workers (launch.py DynamoWorker); None: POST /v1/serve/export?format=dynamo is a
    # 422 on ``engine``
    dynamo: DynamoWorker | None = None
    # tp past the model's KV heads replicates each head on tp / num_kv_heads ranks, tp a multiple of the heads
    # (parallel.kv_heads_rule); False: tp must divide the KV heads, as the training frameworks' (Flavour)
    kv_head_replication: bool = False
    # the disaggregated KV transfer from a prefill worker whose heads are replicated into a decode worker of smaller
    # TP (deployment._transfer_pairs): True, every prefill rank holding a copy of a head sends it (the copies land on
    # the same decode bytes); False: one copy per head leaves the prefill worker
    kv_transfer_sends_replicas: bool = False
    # the engine's KV connector moves replicated heads (either side's tp past the KV heads) only between a prefill
    # worker that replicates them and a decode worker of at least its TP; the string is its source, a 422 otherwise
    # (deployment._check_kv_transfer). None: any pair of layouts
    kv_transfer_replicated_rule: str | None = None
    # the engine runs its context (prefill) attention as an FP8 FMHA when the linears are quantized (deployment._work:
    # fp8 or nvfp4 weights, whatever the KV cache) and refuses an FP8 KV cache beside bf16 linears (deployment.
    # _check_engine_options); the string is its source. None: bf16 context attention, any KV cache
    fp8_context_attention: str | None = None
    # the dispatchers that move bf16 rows of an fp8 (block-scaled) checkpoint, the experts quantizing every received
    # copy (planner/kernels.py cast_input_elements casts the routed copies); any other quantizes once per token
    # before (or inside) the exchange and moves fp8 rows (workload.moe_dispatch_dtype "fp8"; SGLang, vLLM: kernels.py
    # QUANTIZED_BEFORE_DISPATCH)
    bf16_dispatches: tuple[str, ...] = ()
    # the engine's rule for the KV cache's dtype where the request names none, said in the response (ServePlan.
    # kv_cache.dtype_default); the planner has no checkpoint, so it plans ServeOptions.kv (the 16-bit cache) and the
    # rule says when to name options.kv_dtype. "": no rule stated (ServeOptions.kv)
    kv_default_rule: str = ""
    # what the engine's own kernels fuse or move in another dtype than the planner's default layer (planner/
    # engine_kernels.py: MLA's fused down projection, ep_scatter's fp8 rows, the masked experts' activation quantize)
    kernels: EngineKernels = DEFAULT_KERNELS
    # the dispatchers that move a block-format checkpoint's rows in that format, quantized by the sender
    # (workload.DISPATCH_FORMATS: NVFP4; kernels.POST_QUANT_SENDER); any other moves the activations' dtype
    post_quant_dispatches: tuple[str, ...] = ()
    # a post-quant dispatch's rule on the hidden size: (the multiple it must be, the source); (1, ""): none
    # (pool_rules.check_post_quant_rows)
    post_quant_hidden_multiple: tuple[int, str] = (1, "")
    # how the engine runs a pool's dp without attention DP (pool_rules.PlainDP, check_plain_dp): by default none
    plain_dp: PlainDP = NO_PLAIN_DP
    # the engine creates no MoE exchange without attention DP, the string its source: a dispatcher asked for there is
    # a 422 at the pool's ep_dispatch (pool_rules.check_moe_exchange); None: the asked one is planned as the others
    moe_exchange_needs_attention_dp: str | None = None


# vLLM NixlConnectorWorker._validate_remote_agent_handshake (vllm/distributed/kv_transfer/kv_connector/v1/
# nixl_connector.py at 002a1057e9ae): assert not (tp_ratio < 0 and is_kv_replicated(remote)), "Num kv_heads >
# tp_size and P TP > D TP case, not supported"; with the decode TP the larger and the prefill's heads not replicated
# the remote block must be tp_ratio local blocks ("Remote P worker KV layer cache must be of shape [2, N,
# local_kv_heads*tp_ratio, ...]"), which a replicated decode rank's one head is not. Each decode rank pulls its own
# heads (make_prepped_xfer "READ") from prefill rank tp_rank // tp_ratio, so the decode side's copies are each filled
VLLM_NIXL_REPLICATED = (
    "vLLM's NixlConnector moves replicated KV heads only from a prefill worker that replicates them too into a decode "
    "worker of at least its TP (nixl_connector.py _validate_remote_agent_handshake: 'Num kv_heads > tp_size and P TP "
    "> D TP case, not supported'; the remote block must hold tp_ratio local blocks)"
)


# TensorRT-LLM's PyTorch attention backend: the op takes its FP8 path on ``is_fp8_out || is_fp4_out ||
# (hasFp8KvCache() && use_paged_context_fmha)`` (cpp/tensorrt_llm/thop/attentionOp.cpp, as aiconfigurator's
# collector/trtllm/collect_attn.py quotes it at 1.3.0rc20), and the Attention module passes an output scale
# (is_fp8_out / is_fp4_out) whenever o_proj is quantized, fp8_qdq, nvfp4 or fp8 block-scaled (_torch/modules/
# attention.py has_quant_scale, _use_quantize_output): fp8 and nvfp4 weights take the FP8 FMHA whatever the KV cache
# (review r14a, 4). With an FP8 KV cache and paged context FMHA (on whenever KV block reuse or chunked prefill is,
# KvCacheConfig.enable_block_reuse defaulting True) and bf16 linears the backend raises ("When FP8 KV cache is being
# used, paged context FMHA cannot be used without FP8 attention", _torch/attention_backend/trtllm.py
# TrtllmAttention.forward; aiconfigurator's collector skips that case on SM90, collect_attn.py l.168-174: "attention
# output scale should be provided", common/attentionOp.cpp:681): a 422 here
TRTLLM_FP8_CONTEXT_FMHA = (
    "TensorRT-LLM _torch/attention_backend/trtllm.py TrtllmAttention.forward ('When FP8 KV cache is being used, "
    "paged context FMHA cannot be used without FP8 attention') and thop/attentionOp.cpp (is_fp8_out || is_fp4_out: "
    "the FP8 path whenever o_proj is quantized, _torch/modules/attention.py _use_quantize_output)"
)
# TensorRT-LLM's engine (the LLM API, trtllm-serve) takes the KV cache's dtype from KvCacheConfig.dtype, default
# "auto" (tensorrt_llm/llmapi/llm_args.py, NVIDIA/TensorRT-LLM b51992a331532b80cb943098d3b1891762feb5f5: "Use 'auto'
# to follow checkpoint metadata, otherwise force the specified dtype", the LLM API reference); with "auto",
# _torch/pyexecutor/model_loader.py validate_and_set_kv_cache_quant returns at once ("Using checkpoint KV
# quantization"): the checkpoint's kv_cache_quant_algo (hf_quant_config.json, QuantConfig) decides, and a checkpoint
# without one keeps the model's dtype. docs/source/performance/perf-benchmarking.md: NVIDIA's FP8 checkpoints
# (nvidia/Llama-3.1-*-Instruct-FP8, "kv_cache_quant_algo": null) "default to no KV cache quantization (full FP16
# cache)"; only trtllm-bench then picks FP8 (its _KV_CACHE_MAP, bench/benchmark/utils/general.py, reached only
# where the YAML names no dtype and the checkpoint no kv_cache_quant_algo). The planner has no checkpoint: it plans
# the 16-bit cache whatever the weights (an MLA cache too), and the request names kv_dtype "fp8" for a checkpoint
# that declares an FP8 KV cache, or for a trtllm-bench run of one that declares none (review r14c, 1)
TRTLLM_KV_DEFAULT_RULE = (
    "TensorRT-LLM's KvCacheConfig.dtype 'auto' follows the checkpoint's kv_cache_quant_algo (hf_quant_config.json), "
    "else the model's dtype (tensorrt_llm/llmapi/llm_args.py; _torch/pyexecutor/model_loader.py "
    "validate_and_set_kv_cache_quant); with no checkpoint the planner plans the 16-bit cache: name options.kv_dtype "
    "'fp8' for a checkpoint whose kv_cache_quant_algo is FP8 (trtllm-bench also picks fp8 for FP8 and NVFP4 "
    "checkpoints that name none, docs/source/performance/perf-benchmarking.md)"
)


# the weight formats whose linears TensorRT-LLM's check above counts as quantized (fp8_qdq / fp8 block-wise, nvfp4)
FP8_FMHA_WEIGHTS = ("fp8", "nvfp4")

ENGINES: dict[str, EngineTraits] = {}

# MXFP4 (GPT-OSS's MoE experts): Mxfp4Config.get_min_capability 80 in vLLM (vllm/model_executor/layers/quantization/
# mxfp4.py at 007d50058a06; Marlin's dequantizing kernels below Hopper) and SGLang
# (python/sglang/srt/layers/quantization/mxfp4.py)
MXFP4_MIN_SM = 80


def register(traits: EngineTraits) -> EngineTraits:
    ENGINES[traits.name] = traits
    return traits


VLLM = register(
    EngineTraits(
        "vllm",
        "vLLM",
        # --all2all-backend allgather_reducescatter, vLLM's default: all_gatherv of the hidden states and the router
        # logits over the DP group before the experts, reduce_scatterv after (rules/engine_gather.py "agrs")
        ep_dispatch="agrs",
        ep_dispatches=("agrs", "alltoall", "deepep", "deepep_ll"),
        # vllm/engine/arg_utils.py: default max_num_batched_tokens 8192 for the OpenAI API server (chunked
        # prefill on); vllm/config/cache.py: gpu_memory_utilization 0.9, block_size 16
        max_batch_tokens=8192,
        memory_fraction=0.9,
        page_tokens=16,
        attention_dp=True,
        sources=("vllm/engine/arg_utils.py", "vllm/config/cache.py", "docs.vllm.ai expert_parallel_deployment"),
        experts=VLLM_EXPERTS,
        # vllm/config/parallel.py: enable_dbo (dual batch overlap, off), EPLBConfig.num_redundant_experts (0)
        two_batch_overlap_flag="--enable-dbo",
        two_batch_overlap=(VLLM_DBO_PREFILL, VLLM_DBO),
        redundant_experts_flag="--eplb-config",
        dp_sync_rows=DP_SYNC_ROWS,
        dp_sync_source=VLLM_DP_SYNC,
        # --disable-custom-all-reduce False; VLLM_ALLREDUCE_USE_SYMM_MEM 1 (vllm/envs.py)
        tp_allreduce=CustomAllReduce(
            "vllm 00d618aab604 vllm/distributed/device_communicators/custom_all_reduce.py CustomAllreduce "
            "(csrc/custom_all_reduce.cuh cross_device_reduce_1stage / 2stage)",
            "vllm",
            custom_max_with_symm=VLLM_CUSTOM_AR_MAX_WITH_SYMM,
            symm_mem_max=VLLM_SYMM_MEM_MAX,
            multimem_world_sizes=VLLM_MULTIMEM_WORLD_SIZES,
            symm_source="vllm 00859a52088e vllm/distributed/device_communicators/symm_mem.py SymmMemCommunicator "
            "(torch symm_mem multimem_all_reduce_ / two_shot_all_reduce_)",
        ),
        launch=vllm_command,  # `vllm serve` (vLLM 0.14)
        disagg_router=vllm_router,  # vLLM's NixlConnector proxy, toy_proxy_server.py
        dynamo=VLLM_DYNAMO,  # python3 -m dynamo.vllm
        # quantization/mxfp4.py Mxfp4MoEMethod (experts only; the weights dequantized to bf16 math by default)
        weight_formats=("nvfp4", "mxfp4"),
        # QKVParallelLinear: num_kv_heads 1, num_kv_head_replicas = divide(tp_size, total_num_kv_heads) once tp_size
        # >= the heads (model_executor/layers/linear.py at 0036d38de46c); ModelConfig.get_num_kv_heads
        # max(1, total // tp) sizes the KV cache (config/model.py at 18ec66292536)
        kv_head_replication=True,
        kv_transfer_replicated_rule=VLLM_NIXL_REPLICATED,
        kernels=EngineKernels(VLLM_FUSED_QKV_A, VLLM_EP_SCATTER, VLLM_MASKED),
        # --data-parallel-size N without EP on attention: N engine cores, each a whole replica, on any nodes
        # (docs.vllm.ai serving/data_parallel_deployment: --data-parallel-size-local, --data-parallel-start-rank,
        # --headless); an MoE model's experts still span every DP rank (vllm/config/parallel.py: the EP group is
        # tp x dp with --enable-expert-parallel; FusedMoE's dp_size), as the plan splits them
        plain_dp=PlainDP(True, "vLLM --data-parallel-size, docs.vllm.ai serving/data_parallel_deployment"),
    )
)
SGLANG = register(
    EngineTraits(
        "sglang",
        "SGLang",
        # without --moe-a2a-backend, DP attention gathers every rank's tokens before the MoE (MAX_LEN all-gather or
        # SUM_LEN all-reduce, as dp_attention.py chooses) and scatters after (rules/engine_gather.py "dp_gather")
        ep_dispatch="dp_gather",
        ep_dispatches=("dp_gather", "alltoall", "deepep", "deepep_ll"),
        # python/sglang/srt/server_args.py: chunked_prefill_size 8192 on 80-96 GB GPUs; mem_fraction_static
        # about 0.88 there (it is derived from the GPU's memory and TP size); page_size 1
        max_batch_tokens=8192,
        memory_fraction=0.88,
        page_tokens=1,
        attention_dp=True,
        sources=("python/sglang/srt/server_args.py", "python/sglang/srt/layers/dp_attention.py"),
        experts=SGLANG_EXPERTS,
        # --deepep-mode auto (the default): low_latency for decode batches, normal for prefill
        # (python/sglang/srt/layers/moe/utils.py DeepEPMode.resolve)
        deepep_low_latency_decode=True,
        # python/sglang/srt/server_args.py: enable_two_batch_overlap False, ep_num_redundant_experts 0
        two_batch_overlap_flag="--enable-two-batch-overlap",
        two_batch_overlap=(SGLANG_PREFILL, SGLANG_DECODE),
        redundant_experts_flag="--ep-num-redundant-experts",
        # --disable-custom-all-reduce False; --enable-torch-symm-mem, --enable-mscclpp False (server_args.py)
        tp_allreduce=CustomAllReduce(
            "sglang 004e6561cb8a python/sglang/srt/distributed/device_communicators/custom_all_reduce.py "
            "CustomAllreduce (sgl-kernel/csrc/allreduce/custom_all_reduce.cuh 1stage / 2stage)",
            "sglang",
        ),
        launch=sglang_command,  # python3 -m sglang.launch_server (SGLang 0.5)
        disagg_router=sglang_router,  # python3 -m sglang_router.launch_router --pd-disaggregation
        dynamo=SGLANG_DYNAMO,  # python3 -m dynamo.sglang
        # python/sglang/srt/layers/quantization/mxfp4.py Mxfp4Config (FusedMoE only; linears UnquantizedLinearMethod)
        weight_formats=("nvfp4", "mxfp4"),
        # QKVParallelLinear as vLLM's, a K/V shard loaded from head tp_rank // num_kv_head_replicas
        # (python/sglang/srt/layers/linear.py at 0079fcc18b3e)
        kv_head_replication=True,
        # a decode rank of smaller TP waits for every prefill rank of its span, MLA excepted
        # (disaggregation/common/conn.py _resolve_rank_mapping: required_prefill_response_num = span), and each sends
        # its heads, copies too (mooncake/conn.py send_kvcache_slice at 0005973a84f7: "GQA replication: how many
        # prefill ranks share the same KV head", unique_head_idx = rank // src_replication, the same decode offset)
        kv_transfer_sends_replicas=True,
        kernels=EngineKernels(SGLANG_FUSED_QKV_A, SGLANG_EP_SCATTER, SGLANG_MASKED),
        # --dp-size N without --enable-dp-attention: N tensor-parallel groups of --tp-size x --pp-size GPUs behind
        # the DataParallelController (managers/data_parallel_controller.py at 000a3db1c0c4, launch_dp_schedulers:
        # base_gpu_id += tp_size * pp_size * gpu_id_step per DP rank), one node only, each replica holding every
        # expert over its own --tp-size ranks
        plain_dp=PlainDP(
            True,
            "SGLang 0.5 server_args.py check_server_args: 'multi-node data parallel is not supported unless dp "
            "attention!' (dp_size > 1 and nnodes != 1)",
            one_node=True,
            moe=False,
            moe_source="SGLang parallel_state.py: moe_tp_size = tp_size // ep_size",
        ),
    )
)
TRTLLM = register(
    EngineTraits(
        "trtllm",
        "TensorRT-LLM",
        # communication_factory.py (03c36d6222ad): NVLink one-/two-sided all-to-all first, NCCL-EP, DeepEP, then the
        # post-quant all-gather + reduce-scatter ("agrs_quant"), forced when MoE TP > 1 or experts % EP != 0
        ep_dispatch="alltoall",
        ep_dispatches=("alltoall", "agrs_quant", "deepep", "deepep_ll"),
        # tensorrt_llm/llmapi/llm_args.py: max_num_tokens 8192; KvCacheConfig free_gpu_memory_fraction 0.9 of
        # the memory left after weights; tokens_per_block 32. _torch/pyexecutor/_util.py KvCacheCreator
        # _cal_max_memory: available_kv_mem = (total_gpu_memory - peak_memory + allocated_bytes) * fraction, the
        # peak of a profiling run at max_num_tokens (weights + activations), the estimation's own KV added back
        max_batch_tokens=8192,
        memory_fraction=0.9,
        page_tokens=32,
        attention_dp=True,
        sources=("tensorrt_llm/llmapi/llm_args.py", "_torch/modules/fused_moe/communication/communication_factory.py"),
        experts=TRTLLM_EXPERTS,
        # communication_factory.py: DeepEPLowLatency for generation when DeepEP is selected
        deepep_low_latency_decode=True,
        # _torch/modules/fused_moe/moe_load_balancer.py: num_slots = experts + redundant (extra_llm_api_options)
        redundant_experts_flag="moe_config.load_balancer.num_slots",
        tp_allreduce=FusedAllReduce(TRTLLM_AR_FUSION),
        memory_fraction_of_free=True,
        launch=trtllm_command,  # trtllm-serve --backend pytorch (TensorRT-LLM 1.2)
        disagg_router=trtllm_router,  # trtllm-serve disaggregated -c disagg_config.yaml
        weight_formats_note="TensorRT-LLM's own MXFP4 MoE path (GPT-OSS) is not modelled here: use vllm or sglang",
        # _torch/modules/attention.py Attention (c6d3bb2aae30): num_key_value_heads = ceil(kv / tp) per rank, K and V
        # copied per rank by duplicate_kv_weight (_torch/models/modeling_utils.py at cb4c622cf5bb: tp % kv == 0). Its
        # cache transceiver sends one copy: CacheFormatter::needSendCache lets only the ranks with tp rank %
        # mDupHeadFactor == 0 send (cpp/tensorrt_llm/batch_manager/cacheFormatter.cpp; targetIRanks' dup factor)
        kv_head_replication=True,
        fp8_context_attention=TRTLLM_FP8_CONTEXT_FMHA,
        kv_default_rule=TRTLLM_KV_DEFAULT_RULE,
        # _torch/modules/fused_moe/communication/deep_ep.py (0d2123af) supports_post_quant_dispatch: "DeepEP supports
        # post-quant dispatch only for nvfp4"; else "Pre-quant dispatch (unquantized data)",
        # deep_ep_buffer.dispatch(hidden_states, ...) in bf16, the fp8 block-scale MoE quantizing the received rows
        # (fused_moe_wide_ep.py 01303b38: use_deepseek_fp8_block_scale, no quantize before the dispatch). Its
        # low-latency path the same (dsv3s15): communication/deep_ep_low_latency.py (f72b25a65f89)
        # supports_post_quant_dispatch is fp8_qdq, nvfp4 or w4afp8 only, else "Pre-quant dispatch (unquantized data)"
        # through deep_ep_utils.py (95ca1eaeaf08) VariableLengthLowLatencyBuffer.low_latency_dispatch, which calls
        # DeepEP's ``low_latency_dispatch(..., use_fp8=False)``: bf16 rows of a block-fp8 checkpoint
        bf16_dispatches=("deepep", "deepep_ll"),
        # an NVFP4 checkpoint's rows go as NVFP4 on both DeepEP kernels (deep_ep.py at c12e67bb66fe
        # supports_post_quant_dispatch: "only for nvfp4"; deep_ep_low_latency.py at f72b25a65f89: nvfp4, fp8_qdq or
        # w4afp8, the nvfp4 rows into low_latency_dispatch_fp4)
        post_quant_dispatches=("deepep", "deepep_ll"),
        # its bf16 DeepEP rows are quantized by its own fused MoE (no ep_scatter, no masked activation read here)
        kernels=EngineKernels(fused_mla_down_proj=TRTLLM_FUSED_QKV_A),
        # deep_ep_low_latency.py at f72b25a65f89, before low_latency_dispatch_fp4: assert hidden_size % 32 == 0,
        # "HiddenSize should be divisible by 32 in nvfp4 postquant alltoall" (review r15a #5)
        post_quant_hidden_multiple=(
            32,
            "TensorRT-LLM deep_ep_low_latency.py at f72b25a65f89: 'HiddenSize should be divisible by 32 in nvfp4 "
            "postquant alltoall'",
        ),
        # trtllm-serve's parallelism flags (tensorrt_llm/commands/serve.py, "Parallelism Configuration"): --tp_size,
        # --pp_size, --ep_size, --cluster_size, --gpus_per_node; no data-parallel size: its data parallelism is
        # attention DP (enable_attention_dp) over the tp_size ranks
        plain_dp=PlainDP(
            False,
            "trtllm-serve's parallelism flags: --tp_size, --pp_size, --ep_size, --cluster_size; data parallelism "
            "only as attention DP, enable_attention_dp",
        ),
        # communication_factory.py CommunicationFactory.create_strategy (03c36d6222ad): "if (not
        # mapping.enable_attention_dp) or mapping.dp_size == 1: return None", no MoE communication (review r15a #6)
        moe_exchange_needs_attention_dp=(
            "TensorRT-LLM communication_factory.py create_strategy: 'if (not mapping.enable_attention_dp) or "
            "mapping.dp_size == 1: return None'"
        ),
    )
)


def engine(name: str) -> EngineTraits:
    traits = ENGINES.get(name)
    if traits is None:
        raise SpecError("engine", f"unknown engine {name!r}; known: {', '.join(ENGINES)}")
    return traits


__all__ = [
    "ENGINES",
    "FP8_FMHA_WEIGHTS",
    "MXFP4_MIN_SM",
    "TRTLLM_FP8_CONTEXT_FMHA",
    "TRTLLM_KV_DEFAULT_RULE",
    "VLLM_NIXL_REPLICATED",
    "EngineTraits",
    "ExpertSplit",
    "engine",
    "register",
]
