"""What a serving request says: the traffic, the pools of a deployment, and the engine options (CONTRACT v1.2)."""

from __future__ import annotations

from dataclasses import dataclass

from .._errors import SpecError, got
from ..workload import DTYPE_BYTES, WEIGHT_FORMAT_BYTES, weight_bytes

ROLES = ("both", "prefill", "decode")
MAX_TOKENS = 1 << 21  # longest input or output a request may ask for (2M tokens)
REQUEST_RATES = (1e-6, 1e6)  # requests/s an open-loop load may ask for: one a million seconds to a million a second


@dataclass(frozen=True)
class Traffic:
    input_tokens: int
    output_tokens: int
    concurrency: int | None = None  # requests in the system at once (closed loop)
    request_rate: float | None = None  # requests per second (open loop)


@dataclass(frozen=True)
class Pool:
    role: str = "both"
    workers: int = 1
    tp: int = 1
    pp: int = 1
    dp: int = 1
    ep: int = 1
    attention_dp: bool = False
    ep_dispatch: str | None = None  # None: the engine's default
    max_batch_tokens: int | None = None  # None: the engine's default

    @property
    def worker_gpus(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def gpus(self) -> int:
        return self.workers * self.worker_gpus


@dataclass(frozen=True)
class MTP:
    """Multi-token prediction / speculative decoding: ``draft_tokens`` per step and exactly one of
    ``acceptance``, the rate at which one draft token is accepted, in [0, 1] (1: every draft kept; the DeepSeek-V3
    report §5.4.3 gives 85-90 % for its second token), and ``mean_tokens``, the mean tokens a step emits, in
    [1, 1 + draft_tokens] (vLLM's and SGLang's "mean acceptance length"; the API's ``options.mtp.tokens_per_step``).
    One field read as both, a rate below 1 and tokens from 1 up, priced 1.0 as one token a step: TPOT 26.1 ms at
    0.999 and 54.0 ms at 1.0 (review r13b #1)."""

    draft_tokens: int
    acceptance: float | None = None
    mean_tokens: float | None = None

    @property
    def tokens_per_step(self) -> float:
        if self.mean_tokens is not None:
            return self.mean_tokens
        # draft i is kept only if drafts 1..i all are: 1 + p + p^2 + ... + p^n (Leviathan et al. 2023, §3.1)
        return sum(self.acceptance**i for i in range(self.draft_tokens + 1))


@dataclass(frozen=True)
class ServeOptions:
    # bf16 | fp16 | fp8 | nvfp4 (a block-scaled checkpoint, 0.5625 B a weight, its GEMMs nvfp4: workload.py
    # WEIGHT_FORMAT_BYTES; Blackwell only: deployment.plan_serving) | mxfp4 (the MoE experts at 0.53125 B a weight,
    # their GEMMs weight-only with bf16 math; vLLM and SGLang, sm80+)
    weight_dtype: str = "bf16"
    kv_dtype: str | None = None  # None: = weight dtype for 2-byte weights, bf16 for fp8 and nvfp4 weights
    mtp: MTP | None = None
    cuda_graphs: bool = True
    chunked_prefill: bool = True
    transfer_overhead_s: float = 0.0005  # per KV transfer (transfer-engine set-up); an assumption, see docs
    # the GEMMs of fp8 weights (planner/recipes.py): DeepSeek-V3's checkpoints and the engines' DeepGEMM /
    # CUTLASS kernels scale 128x128 blocks (DeepSeek-V3 report §3.3); per-tensor checkpoints: "tensorwise"
    fp8_recipe: str = "blockwise"
    # two micro-batches per step, the EP exchange of one behind the other's compute (SGLang
    # --enable-two-batch-overlap, vLLM --enable-dbo; both off by default): deployment._two_batch
    two_batch_overlap: bool = False
    # EPLB's redundant experts: physical expert slots beyond the model's experts, spread over the EP ranks (vLLM
    # --eplb-config num_redundant_experts, SGLang --ep-num-redundant-experts, TensorRT-LLM num_slots - experts)
    redundant_experts: int = 0
    # factors on the planner's prefill-pass and decode-step times, fitted from the user's own benchmark runs
    # (planner/serving/calibrate.py; POST /v1/serve/calibrate); 1: the planner's model as it is
    prefill_time_scale: float = 1.0
    decode_time_scale: float = 1.0

    @property
    def kv(self) -> str:
        if self.kv_dtype is not None:
            return self.kv_dtype
        return self.weight_dtype if weight_bytes(self.weight_dtype) == 2 else "bf16"


def validate_serving(traffic: Traffic, pools: tuple[Pool, ...], options: ServeOptions) -> None:
    validate_traffic(traffic)
    validate_pools(pools)
    validate_options(options)


def validate_traffic(traffic: Traffic) -> None:
    for name in ("input_tokens", "output_tokens"):
        value = getattr(traffic, name)
        if not 1 <= value <= MAX_TOKENS:
            raise SpecError(f"traffic.{name}", f"must be between 1 and {MAX_TOKENS:,}, got {value}")
    if (traffic.concurrency is None) == (traffic.request_rate is None):
        raise SpecError(
            "traffic",
            f"give exactly one of concurrency and request_rate; got concurrency {traffic.concurrency}, request_rate "
            f"{got(traffic.request_rate)}"
            if traffic.concurrency is not None
            else "give exactly one of concurrency and request_rate; got neither",
        )
    if traffic.concurrency is not None and traffic.concurrency < 1:
        raise SpecError("traffic.concurrency", f"must be >= 1, got {traffic.concurrency}")
    low, high = REQUEST_RATES
    if traffic.request_rate is not None and not low <= traffic.request_rate <= high:
        rates = f"[{got(low)}, {high:,.0f}]"
        raise SpecError("traffic.request_rate", f"must be in {rates} requests/s, got {got(traffic.request_rate)}")


def validate_pools(pools: tuple[Pool, ...]) -> None:
    if not pools:
        raise SpecError("deployment.pools", "needs at least one pool, got 0")
    roles = [p.role for p in pools]
    for i, pool in enumerate(pools):
        if pool.role not in ROLES:
            raise SpecError(f"deployment.pools.{i}.role", f"must be one of {', '.join(ROLES)}, got {pool.role!r}")
        for name in ("workers", "tp", "pp", "dp", "ep"):
            if getattr(pool, name) < 1:
                raise SpecError(f"deployment.pools.{i}.{name}", f"must be >= 1, got {getattr(pool, name)}")
    if "both" in roles and len(pools) > 1:
        raise SpecError("deployment.pools", f"an aggregated deployment is one pool of role 'both'; got roles {roles}")
    if "both" not in roles and sorted(roles) != ["decode", "prefill"]:
        raise SpecError(
            "deployment.pools", f"a disaggregated deployment is one 'prefill' and one 'decode' pool; got roles {roles}"
        )


def _validate_mtp(mtp: MTP) -> None:
    if not 1 <= mtp.draft_tokens <= 16:
        raise SpecError("options.mtp.draft_tokens", f"must be between 1 and 16, got {mtp.draft_tokens}")
    most = 1 + mtp.draft_tokens
    if (mtp.acceptance is None) == (mtp.mean_tokens is None):
        got = (
            "neither"
            if mtp.acceptance is None
            else f"acceptance {mtp.acceptance} and tokens_per_step {mtp.mean_tokens}"
        )
        raise SpecError(
            "options.mtp.acceptance",
            f"give exactly one of acceptance (a per-draft-token rate in [0, 1]) and tokens_per_step (the mean tokens "
            f"a step emits, in [1, 1 + draft_tokens = {most}]); got {got}",
        )
    if mtp.acceptance is not None and not 0 <= mtp.acceptance <= 1:
        raise SpecError(
            "options.mtp.acceptance",
            f"is a per-draft-token rate in [0, 1] (1: every draft accepted), got {mtp.acceptance}"
            + (
                f"; a mean of {mtp.acceptance} tokens a step is options.mtp.tokens_per_step"
                if mtp.acceptance <= most
                else ""
            ),
        )
    if mtp.mean_tokens is not None and not 1 <= mtp.mean_tokens <= most:
        raise SpecError(
            "options.mtp.tokens_per_step",
            f"the mean tokens a step emits must be in [1, 1 + draft_tokens = {most}], got {mtp.mean_tokens}",
        )


def validate_options(options: ServeOptions) -> None:
    for name, known in (("weight_dtype", (*DTYPE_BYTES, *WEIGHT_FORMAT_BYTES)), ("kv_dtype", tuple(DTYPE_BYTES))):
        value = getattr(options, name)
        if value is not None and value not in known:
            raise SpecError(f"options.{name}", f"unknown dtype {value!r}; known: {', '.join(known)}")
    if options.mtp is not None:
        _validate_mtp(options.mtp)
    if options.fp8_recipe not in ("tensorwise", "blockwise", "delayed", "mxfp8"):
        raise SpecError(
            "options.fp8_recipe", f"must be tensorwise, blockwise, delayed or mxfp8, got {options.fp8_recipe!r}"
        )
    if not 0 <= options.redundant_experts <= 4096:
        raise SpecError("options.redundant_experts", f"must be between 0 and 4,096, got {options.redundant_experts}")
    for name in ("prefill_time_scale", "decode_time_scale"):
        if not 0.05 <= getattr(options, name) <= 20:
            raise SpecError(f"options.{name}", f"must be in [0.05, 20], got {getattr(options, name)}")
    if not 0 <= options.transfer_overhead_s <= 1:
        raise SpecError("options.transfer_overhead_s", f"must be in [0, 1] s, got {options.transfer_overhead_s}")


__all__ = ["MTP", "Pool", "ServeOptions", "Traffic", "validate_options", "validate_serving", "validate_traffic"]
