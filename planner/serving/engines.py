"""Serving engines as traits: what each engine does by default that changes a serving step's calls, memory
or batching. The serving planner reads these, never an engine's name (DESIGN.md, "variation is data").

Every default names the engine file it comes from; versions are those of the serving research note
(docs/serving.md): vLLM 0.14, SGLang 0.5, TensorRT-LLM 1.2.
"""

from __future__ import annotations

from dataclasses import dataclass

from .._errors import SpecError


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
    # DeepEP's mode switch: with "deepep", decode steps run the low-latency kernels (deepep_ll) and prefill the
    # normal ones; False: the mode asked for runs in both phases
    deepep_low_latency_decode: bool = False


ENGINES: dict[str, EngineTraits] = {}


def register(traits: EngineTraits) -> EngineTraits:
    ENGINES[traits.name] = traits
    return traits


VLLM = register(
    EngineTraits(
        "vllm",
        "vLLM",
        # --all2all-backend allgather_reducescatter, vLLM's default (vllm/distributed/device_communicators/
        # all2all.py AgRsAll2AllManager): all-gather the tokens before the experts, reduce-scatter after, as the
        # planner's all-gather dispatcher does (it does not add the router logits vLLM gathers too: E values per
        # token beside h, 3.6% more for DeepSeek-V3)
        ep_dispatch="allgather",
        ep_dispatches=("allgather", "alltoall", "deepep", "deepep_ll"),
        # vllm/engine/arg_utils.py: default max_num_batched_tokens 8192 for the OpenAI API server (chunked
        # prefill on); vllm/config/cache.py: gpu_memory_utilization 0.9, block_size 16
        max_batch_tokens=8192,
        memory_fraction=0.9,
        page_tokens=16,
        attention_dp=True,
        sources=("vllm/engine/arg_utils.py", "vllm/config/cache.py", "docs.vllm.ai expert_parallel_deployment"),
    )
)
SGLANG = register(
    EngineTraits(
        "sglang",
        "SGLang",
        # without --moe-a2a-backend, DP attention gathers every rank's tokens before the MoE and scatters after
        # (python/sglang/srt/layers/dp_attention.py): priced as the all-gather dispatcher
        ep_dispatch="allgather",
        ep_dispatches=("allgather", "alltoall", "deepep", "deepep_ll"),
        # python/sglang/srt/server_args.py: chunked_prefill_size 8192 on 80-96 GB GPUs; mem_fraction_static
        # about 0.88 there (it is derived from the GPU's memory and TP size); page_size 1
        max_batch_tokens=8192,
        memory_fraction=0.88,
        page_tokens=1,
        attention_dp=True,
        sources=("python/sglang/srt/server_args.py", "python/sglang/srt/layers/dp_attention.py"),
        # --deepep-mode auto (the default): low_latency for decode batches, normal for prefill
        # (python/sglang/srt/layers/moe/utils.py DeepEPMode.resolve)
        deepep_low_latency_decode=True,
    )
)
TRTLLM = register(
    EngineTraits(
        "trtllm",
        "TensorRT-LLM",
        ep_dispatch="alltoall",
        ep_dispatches=("allgather", "alltoall", "deepep", "deepep_ll"),
        # tensorrt_llm/llmapi/llm_args.py: max_num_tokens 8192; KvCacheConfig free_gpu_memory_fraction 0.9 of
        # the memory left after weights; tokens_per_block 32
        max_batch_tokens=8192,
        memory_fraction=0.9,
        page_tokens=32,
        attention_dp=True,
        sources=("tensorrt_llm/llmapi/llm_args.py", "_torch/modules/fused_moe/communication/communication_factory.py"),
        # communication_factory.py: DeepEPLowLatency for generation when DeepEP is selected
        deepep_low_latency_decode=True,
    )
)


def engine(name: str) -> EngineTraits:
    traits = ENGINES.get(name)
    if traits is None:
        raise SpecError("engine", f"unknown engine {name!r}; known: {', '.join(ENGINES)}")
    return traits


__all__ = ["ENGINES", "EngineTraits", "engine", "register"]
