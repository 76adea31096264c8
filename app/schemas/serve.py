"""POST /v1/serve: a serving deployment (CONTRACT v1.2). Request blocks reuse /v1/plan's model and cluster."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from planner.serving.launch import EXPORTS

from .base import Strict, optional_positive, with_example
from .cluster import ClusterIn
from .plan import CallOut, ModelIn, Out

Degree = Field(default=1, ge=1, le=1 << 12)
Tokens = Field(ge=1, le=1 << 21, description="tokens per request")


class TrafficIn(Strict):
    input_tokens: int = Tokens
    output_tokens: int = Tokens
    concurrency: int | None = Field(default=None, ge=1, le=1 << 22, description="requests in the system at once")
    request_rate: float | None = Field(
        default=None, ge=1e-6, le=1e6, description="requests per second (open loop), from one a million seconds"
    )


class PoolIn(Strict):
    role: Literal["both", "prefill", "decode"] = "both"
    workers: int = Field(default=1, ge=1, le=1 << 14, description="engine instances of this layout")
    tp: int = Degree
    pp: int = Degree
    dp: int = Field(default=1, ge=1, le=1 << 12, description="attention ranks of one worker")
    ep: int = Degree
    attention_dp: bool = False
    ep_dispatch: Literal["alltoall", "allgather", "deepep", "deepep_ll", "agrs", "dp_gather", "agrs_quant"] | None = (
        Field(
            default=None,
            description="null: the engine's default (vLLM agrs, SGLang dp_gather, TensorRT-LLM alltoall; none of them "
            "exchanges tokens when dp is 1); deepep: normal kernels, and low-latency ones for decode where the engine "
            "switches (SGLang --deepep-mode auto); agrs: vLLM's all-gather of hidden states and router logits + "
            "reduce-scatter; dp_gather: SGLang's DP-attention gather (MAX_LEN all-gather or SUM_LEN all-reduce); "
            "agrs_quant: TensorRT-LLM's post-quant all-gather + reduce-scatter",
        )
    )
    max_batch_tokens: int | None = Field(default=None, ge=1, le=1 << 20, description="null: the engine's default")


class DeploymentIn(Strict):
    pools: list[PoolIn] = Field(min_length=1, max_length=2)


class MTPIn(Strict):
    draft_tokens: int = Field(ge=1, le=16)
    # exactly one of the two (planner/serving/spec.py MTP; a 422 at options.mtp.acceptance otherwise); acceptance's
    # bound is tokens_per_step's so that a mean sent as a rate is told its field, not "less than or equal to 1"
    acceptance: float | None = Field(
        default=None,
        ge=0,
        le=17,
        description="a per-draft-token acceptance rate in [0, 1] (1: every draft accepted); above 1 a 422 naming "
        "tokens_per_step (until round 13 a value of 1 or more was read as the mean tokens a step emits)",
    )
    tokens_per_step: float | None = Field(
        default=None, ge=1, le=17, description="the mean tokens a step emits, in [1, 1 + draft_tokens]"
    )


class ServeOptionsIn(Strict):
    weight_dtype: Literal["bf16", "fp16", "fp8", "nvfp4", "mxfp4"] = Field(
        default="bf16",
        description="the checkpoint's weights; nvfp4 (Blackwell: fp4 tensor cores): 0.5625 B per linear weight "
        "(E2M1 + one E4M3 scale per 16), the GEMMs in nvfp4, embedding and norms in bf16; mxfp4 (GPT-OSS; vLLM and "
        "SGLang, compute capability >= 8.0, MoE models): the routed experts at 0.53125 B per weight (E2M1 + one "
        "E8M0 scale per 32), their GEMMs with the weights dequantized to bf16 math, the rest of the model in bf16",
    )
    kv_dtype: Literal["bf16", "fp16", "fp8"] | None = None
    mtp: MTPIn | None = None
    cuda_graphs: bool = True
    chunked_prefill: bool = True
    transfer_overhead_s: float = Field(
        default=0.0005, ge=0, le=1, description="per KV transfer (transfer-engine set-up), an assumption"
    )
    fp8_recipe: Literal["tensorwise", "blockwise", "delayed", "mxfp8"] = Field(
        default="blockwise", description="the scaling of fp8 weights' GEMMs (DeepSeek-V3: 128x128 blocks)"
    )
    two_batch_overlap: bool = Field(
        default=False,
        description="two micro-batches per step, the EP exchange of one behind the other's compute (SGLang "
        "--enable-two-batch-overlap, vLLM --enable-dbo); TensorRT-LLM: a 422",
    )
    prefill_time_scale: float = Field(
        default=1.0, ge=0.05, le=20, description="factor on the prefill pass's time (POST /v1/serve/calibrate fits it)"
    )
    decode_time_scale: float = Field(
        default=1.0, ge=0.05, le=20, description="factor on the decode step's time (POST /v1/serve/calibrate fits it)"
    )
    redundant_experts: int = Field(
        default=0,
        ge=0,
        le=4096,
        description="EPLB's redundant expert slots beyond the model's experts, spread over the EP ranks (vLLM "
        "--eplb-config num_redundant_experts, SGLang --ep-num-redundant-experts, TensorRT-LLM num_slots)",
    )


# POST /v1/serve/export?format=: the registry's formats (planner/serving/launch.py EXPORTS: the engine's launch
# script, or a Dynamo DynamoGraphDeployment; CONTRACT v1.2)
ServeExportFormat = Literal[tuple(EXPORTS)]  # type: ignore[valid-type]


class DeploymentBlocks(Strict):
    """What /v1/serve and /v1/serve/calibrate share: the model, the cluster, the engine, its pools and options."""

    model: ModelIn
    cluster: ClusterIn
    engine: Literal["vllm", "sglang", "trtllm"] = "vllm"
    deployment: DeploymentIn
    options: ServeOptionsIn = Field(default_factory=ServeOptionsIn)


class ServeRequest(DeploymentBlocks):
    traffic: TrafficIn

    model_config = with_example(
        {
            "model": {"preset": "llama3-70b"},
            "cluster": {"preset": "dgx-h100", "num_nodes": 2},
            "engine": "vllm",
            "traffic": {"input_tokens": 1000, "output_tokens": 200, "concurrency": 64},
            "deployment": {"pools": [{"role": "both", "workers": 2, "tp": 8}]},
        }
    )


class ThroughputOut(Out):
    input_tokens_per_s: float
    output_tokens_per_s: float
    output_tokens_per_s_per_gpu: float
    tokens_per_s_per_user: float


class KVCacheOut(Out):
    bytes_per_token: int = Field(description="one token of one request, every layer, as the model stores it")
    capacity_tokens: int = Field(description="tokens of KV one worker of the decode (or aggregated) pool holds")
    max_concurrency: int = Field(description="requests of input + output tokens one such worker holds")
    dtype: str = Field(description="the KV cache's dtype as planned: options.kv_dtype, or the default below")
    dtype_default: str = Field(
        description="where options.kv_dtype was not given: the dtype planned and what the engine uses then, with its "
        "source (TensorRT-LLM: KvCacheConfig.dtype 'auto' follows the checkpoint's kv_cache_quant_algo, else the "
        "model's dtype; the planner has no checkpoint, so it plans the 16-bit cache); empty where kv_dtype was given "
        "or the engine states no rule"
    )


class KVTransferOut(Out):
    bytes_per_request: int
    senders: int = Field(description="ranks of a prefill worker that each send their part")
    time_s: float
    bottleneck: str
    links: list[dict]
    devices: list[int] = Field(
        description="the GPUs of the first prefill worker and of the decode worker it feeds: POST /v1/topology "
        "with them and `links` draws the transfer"
    )
    wire_bytes: int = Field(
        description="bytes the transfer moves per request, every rank pair: bytes_per_request in equal shares, more "
        "where a pool's tp passes the KV heads and the engine fills each replicated copy"
    )


class PoolOut(Out):
    role: str
    gpus: int
    workers: int
    batch: int = Field(description="sequences per worker in a decode step; prompts per worker in a prefill pass")
    step_s: float = Field(description="the decode step (prefill pool: the prefill pass)")
    prefill_s: float
    input_tokens_per_s: float
    output_tokens_per_s: float
    fits: bool
    memory_peak_bytes: int
    calls: list[CallOut] = Field(description="one step's calls (decode; prefill for a prefill pool)")
    prefill_calls: list[CallOut]


class ServeOut(Out):
    gpus: int
    ttft_s: float | None = Field(description="null when the queue grows without bound")
    tpot_s: float
    fits: bool
    request_rate: float
    bottleneck: str = Field(
        description="what limits request_rate: prefill | decode (a pool, or the worker's time and KV cache), or "
        "concurrency (a closed loop whose load is below what the pools serve: more requests would serve more)"
    )
    saturated: bool = Field(
        description="the asked request_rate is more than the deployment serves: request_rate and the throughput are "
        "what it serves (its capacity, the resource named by bottleneck), ttft_s null (the queue grows without bound); "
        "false at a concurrency (a closed loop's queue is bounded)"
    )
    throughput: ThroughputOut
    kv_cache: KVCacheOut
    pools: list[PoolOut]
    kv_transfer: KVTransferOut | None
    warnings: list[str]
    cluster: dict = Field(description="the cluster as a request block, as /v1/plan answers it")


class SLAIn(Strict):
    ttft_s: float | None = optional_positive(3600, "time to first token at most")
    tpot_s: float | None = optional_positive(60, "time per output token at most")


class ServeSearchRequest(Strict):
    model: ModelIn
    cluster: ClusterIn = Field(description="the GPU budget: deployments use at most its devices")
    traffic: TrafficIn
    engines: list[Literal["vllm", "sglang", "trtllm"]] = Field(
        default_factory=lambda: ["vllm", "sglang", "trtllm"], min_length=1, max_length=3
    )
    modes: list[Literal["aggregated", "disaggregated"]] = Field(
        default_factory=lambda: ["aggregated", "disaggregated"], min_length=1, max_length=2
    )
    sla: SLAIn = Field(default_factory=SLAIn)
    options: ServeOptionsIn = Field(default_factory=ServeOptionsIn)
    top_k: int = Field(default=10, ge=1, le=100)

    model_config = with_example(
        {
            "model": {"preset": "deepseek-v3"},
            "cluster": {"preset": "dgx-h100", "num_nodes": 12},
            "traffic": {"input_tokens": 2000, "output_tokens": 200, "concurrency": 256},
            "sla": {"ttft_s": 5.0, "tpot_s": 0.05},
            "options": {"weight_dtype": "fp8"},
        }
    )


class ServeCandidateOut(Out):
    engine: str
    mode: str
    request: dict = Field(description="the POST /v1/serve body of this deployment, to post as it is")
    meets_sla: bool
    answer: ServeOut


class ParetoPointOut(Out):
    engine: str
    mode: str
    request: dict
    output_tokens_per_s_per_gpu: float
    tokens_per_s_per_user: float
    ttft_s: float | None
    tpot_s: float
    meets_sla: bool = Field(description="at its own load (request.traffic): the search's SLA.met, as for results")
    gpus: int = Field(description="the GPUs the deployment uses (its pools' workers x GPUs per worker)")


class DeploymentGpusOut(Out):
    fewest: int
    most: int


class LeftOutOut(Out):
    expert_tp_twins: int = Field(description="deployments not tried over every size listed (the whole cluster and "
                                 "the smaller sizes): the MoE workers at ep 1 beside the same worker at "
                                 "ep = tp")  # fmt: skip
    sizes_gpus: list[int] = Field(description="deployment sizes (GPUs) below the cluster not tried")


class ServeSearchOut(Out):
    results: list[ServeCandidateOut] = Field(description="meet the SLA and fit, best tokens/s per GPU first")
    pareto: list[ParetoPointOut] = Field(description="tokens/s per GPU against tokens/s per user, every load tried")
    evaluated: int
    candidates: int
    deployment_gpus: DeploymentGpusOut = Field(
        description="the fewest and the most GPUs a deployment searched uses: whole-node sizes from one node up to "
        "the cluster, smallest first within COMMPLAN_MAX_SERVE_CANDIDATES"
    )
    rejected: dict[str, int]
    why: str
    left_out: LeftOutOut = Field(
        description="what the list left out to stay within COMMPLAN_MAX_SERVE_CANDIDATES (mend15): deployments of the "
        "expert-TP twins on the whole cluster, and the GPU sizes below it not searched"
    )
    warnings: list[str] = Field(description="each thing left out, with how many and why (empty: nothing left out)")


class BenchRunIn(Strict):
    free_text = frozenset({"text"})  # the benchmark's output itself: lines, as it printed them
    text: str = Field(
        min_length=1,
        max_length=200_000,
        description="the output of one `vllm bench serve` or `python -m sglang.bench_serving` run, as printed (its "
        "'Serving Benchmark Result' block: requests, tokens, mean TTFT and TPOT, output tokens/s)",
    )


class ServeCalibrateRequest(DeploymentBlocks):
    runs: list[BenchRunIn] = Field(min_length=1, max_length=16, description="benchmark runs of this deployment")


class ServeCalibrateOut(Out):
    constants: dict[str, float] = Field(description="prefill_time_scale and decode_time_scale")
    options: dict = Field(description="the request's options with the constants: post them to /v1/serve")
    rows: list[dict] = Field(description="per run: its traffic, what it measured, the planner before and after")
    median_error_before: float = Field(description="median |error| of TTFT and TPOT over the runs, before")
    median_error_after: float
    warnings: list[str] = Field(
        default_factory=list, description="a constant held at a bound of its range (0.05 to 20), with what it means"
    )
