"""A deployment as its engine's own launch commands: one command line per worker (per node where a worker
spans nodes), each engine's flags by the names its CLI takes. Returned as argument lists; ``render`` writes
them as a POSIX shell script with every argument quoted (shlex.quote), so no string a request carries can run
as a command.

Flag names and where they come from:
- vLLM 0.14 (`vllm serve --help`, docs.vllm.ai serving/expert_parallel_deployment): --tensor-parallel-size,
  --pipeline-parallel-size, --data-parallel-size, --enable-expert-parallel, --all2all-backend
  (deepep_high_throughput | deepep_low_latency), --max-num-batched-tokens, --gpu-memory-utilization,
  --kv-cache-dtype, --enforce-eager, --speculative-config, --kv-transfer-config (NixlConnector), --enable-dbo,
  --enable-eplb with --eplb-config num_redundant_experts.
- SGLang 0.5 (python/sglang/srt/server_args.py): --model-path, --tp-size (the worker's GPUs with DP attention),
  --dp-size, --enable-dp-attention, --ep-size, --pp-size, --moe-a2a-backend deepep, --deepep-mode
  (auto | normal | low_latency), --chunked-prefill-size, --mem-fraction-static, --kv-cache-dtype,
  --disable-cuda-graph, --disaggregation-mode, --speculative-algorithm / --speculative-num-steps,
  --nnodes / --node-rank / --dist-init-addr, --enable-two-batch-overlap, --enable-eplb, --ep-num-redundant-experts.
- TensorRT-LLM 1.2 (`trtllm-serve --help`, tensorrt_llm/llmapi/llm_args.py): --tp_size, --pp_size, --ep_size,
  --max_num_tokens, --kv_cache_free_gpu_memory_fraction; attention-DP and speculative decoding through
  --extra_llm_api_options (enable_attention_dp, speculative_config, moe_config.load_balancer.num_slots).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .._errors import SpecError
from .spec import Pool, ServeOptions

if TYPE_CHECKING:  # engines.py imports this module for its engines' builders
    from .engines import EngineTraits


@dataclass(frozen=True)
class Command:
    argv: tuple[str, ...]
    files: tuple[tuple[str, str], ...] = ()  # (name, content) written before the command: our own JSON, no input
    # flags a worker over several nodes takes from each node's environment: (flag, variable, suffix)
    per_node: tuple[tuple[str, str, str], ...] = ()
    # flags a node of such a worker adds when the variable is set and not empty there: (flag, variable); the flag
    # is this module's constant, never the variable's value (rendered as ${VARIABLE:+flag})
    per_node_switches: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Launch:
    role: str
    worker: int
    nodes: int  # nodes the worker spans
    command: Command


def launch_commands(
    model_path: str,
    traits: EngineTraits,
    pools: tuple[Pool, ...],
    options: ServeOptions,
    devices_per_node: int,
    num_experts: int = 0,
) -> list[Launch]:
    """``num_experts``: the model's routed experts (TensorRT-LLM counts EPLB slots, not redundant experts).
    Each pool's command is the engine's own ``traits.launch`` builder (engines.py): an engine without one is
    a SpecError on ``engine``, not a guess at its flags."""
    if traits.launch is None:
        raise SpecError("engine", f"engine {traits.name!r} ({traits.label}) has no launch command builder")
    out = []
    for pool in pools:
        command = traits.launch(model_path, traits, pool, options, len(pools) > 1, devices_per_node, num_experts)
        nodes = max(1, -(-pool.worker_gpus // devices_per_node))
        for w in range(pool.workers):
            out.append(Launch(pool.role, w, nodes, command))
    return out


# what an engine's ``launch`` trait is: (model path, traits, pool, options, disaggregated, GPUs per node,
# routed experts) -> the pool's command
CommandBuilder = Callable[[str, "EngineTraits", Pool, ServeOptions, bool, int, int], Command]


@dataclass(frozen=True)
class _OptionFlags:
    """An engine's flags for the request's options: fp8 KV cache, no CUDA graphs, MTP drafts (of the draft
    tokens), two-batch overlap, EPLB's redundant experts (of their number)."""

    kv_fp8: tuple[str, ...]
    eager: str
    mtp: Callable[[int], list[str]]
    two_batch_overlap: str
    redundant_experts: Callable[[int], list[str]]


# vllm serve: docs.vllm.ai engine arguments; sglang.launch_server: SGLang server arguments
_VLLM_FLAGS = _OptionFlags(
    ("--kv-cache-dtype", "fp8"),
    "--enforce-eager",
    lambda k: ["--speculative-config", json.dumps({"method": "mtp", "num_speculative_tokens": k})],
    "--enable-dbo",
    lambda r: ["--enable-eplb", "--eplb-config", json.dumps({"num_redundant_experts": r})],
)
_SGLANG_FLAGS = _OptionFlags(
    ("--kv-cache-dtype", "fp8_e4m3"),
    "--disable-cuda-graph",
    lambda k: ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", str(k)],
    "--enable-two-batch-overlap",
    lambda r: ["--enable-eplb", "--ep-num-redundant-experts", str(r)],
)


def _options_argv(options: ServeOptions, flags: _OptionFlags) -> list[str]:
    """The engine's flags (``flags``) for the request's options."""
    argv = list(flags.kv_fp8) if options.kv_dtype == "fp8" else []
    if not options.cuda_graphs:
        argv.append(flags.eager)
    if options.mtp:
        argv += flags.mtp(options.mtp.draft_tokens)
    if options.two_batch_overlap:
        argv.append(flags.two_batch_overlap)
    if options.redundant_experts:
        argv += flags.redundant_experts(options.redundant_experts)
    return argv


def vllm_command(
    model: str, traits: EngineTraits, pool: Pool, options: ServeOptions, disagg: bool, per_node: int, num_experts: int
) -> Command:
    argv = ["vllm", "serve", model, "--tensor-parallel-size", str(pool.tp), "--pipeline-parallel-size", str(pool.pp)]
    if pool.dp > 1:
        argv += ["--data-parallel-size", str(pool.dp)]
    if pool.ep > 1:
        argv.append("--enable-expert-parallel")
        backend = {
            "agrs": "allgather_reducescatter",
            "deepep": "deepep_high_throughput",
            "deepep_ll": "deepep_low_latency",
        }.get(pool.ep_dispatch or "")
        if backend:
            argv += ["--all2all-backend", backend]
    argv += ["--max-num-batched-tokens", str(pool.max_batch_tokens or traits.max_batch_tokens)]
    argv += ["--gpu-memory-utilization", str(traits.memory_fraction)]
    argv += _options_argv(options, _VLLM_FLAGS)
    if disagg:
        argv += ["--kv-transfer-config", json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_both"})]
    if pool.worker_gpus > per_node:  # multi-node data parallelism: each node runs its share of the DP ranks
        argv += ["--data-parallel-size-local", str(max(1, per_node // (pool.tp * pool.pp)))]
    # docs.vllm.ai serving/data_parallel_deployment: the head node's address, each node's first DP rank, and
    # --headless on every node but the head (it runs the engine cores without an API server)
    flags = (("--data-parallel-address", "MASTER_ADDR", ""), ("--data-parallel-start-rank", "DP_START_RANK", ""))
    return Command(tuple(argv), per_node=flags, per_node_switches=(("--headless", "HEADLESS"),))


def sglang_command(
    model: str, traits: EngineTraits, pool: Pool, options: ServeOptions, disagg: bool, per_node: int, num_experts: int
) -> Command:
    tp = pool.tp * pool.dp if pool.attention_dp else pool.tp
    argv = ["python3", "-m", "sglang.launch_server", "--model-path", model, "--tp-size", str(tp)]
    if pool.attention_dp and pool.dp > 1:
        argv += ["--dp-size", str(pool.dp), "--enable-dp-attention"]
    if pool.pp > 1:
        argv += ["--pp-size", str(pool.pp)]
    if pool.ep > 1:
        argv += ["--ep-size", str(pool.ep)]
        if pool.ep_dispatch in ("deepep", "deepep_ll"):
            mode = "low_latency" if pool.ep_dispatch == "deepep_ll" else "auto"
            argv += ["--moe-a2a-backend", "deepep", "--deepep-mode", mode]
    argv += ["--chunked-prefill-size", str(pool.max_batch_tokens or traits.max_batch_tokens)]
    argv += ["--mem-fraction-static", str(traits.memory_fraction)]
    argv += _options_argv(options, _SGLANG_FLAGS)
    if disagg:
        argv += ["--disaggregation-mode", pool.role]
    if pool.worker_gpus > per_node:  # server_args.py nnodes (default 1): the nodes a worker spans, beside its rank
        argv += ["--nnodes", str(-(-pool.worker_gpus // per_node))]
    return Command(
        tuple(argv), per_node=(("--node-rank", "NODE_RANK", ""), ("--dist-init-addr", "MASTER_ADDR", ":5000"))
    )


def trtllm_command(
    model: str, traits: EngineTraits, pool: Pool, options: ServeOptions, disagg: bool, per_node: int, num_experts: int
) -> Command:
    argv = [
        "trtllm-serve",
        model,
        "--backend",
        "pytorch",
        "--tp_size",
        str(pool.tp * pool.dp),
        "--pp_size",
        str(pool.pp),
    ]
    if pool.ep > 1:
        argv += ["--ep_size", str(pool.ep)]
    argv += ["--max_num_tokens", str(pool.max_batch_tokens or traits.max_batch_tokens)]
    argv += ["--kv_cache_free_gpu_memory_fraction", str(traits.memory_fraction)]
    extra = {}
    if pool.attention_dp:
        extra["enable_attention_dp"] = True
    if options.mtp:
        extra["speculative_config"] = {"decoding_type": "MTP", "num_nextn_predict_layers": options.mtp.draft_tokens}
    if not options.cuda_graphs:
        extra["cuda_graph_config"] = None
    if options.redundant_experts:
        extra["moe_config"] = {"load_balancer": {"num_slots": num_experts + options.redundant_experts}}
    if not extra:
        return Command(tuple(argv))
    name = f"extra-llm-api-{pool.role}.yml"  # JSON is YAML
    return Command((*argv, "--extra_llm_api_options", name), files=((name, json.dumps(extra, indent=2)),))


def launch_script(
    model, cluster, traits: EngineTraits, pools: tuple[Pool, ...], options: ServeOptions, path: str
) -> str:
    """The deployment's launch script (what POST /v1/serve/export and ``commplan serve-plan --format launch``
    return): ``path`` is what the engine loads, the model's name when empty."""
    experts = model.moe.num_experts if model.moe else 0
    launches = launch_commands(path or model.name or "MODEL", traits, pools, options, cluster.devices_per_node, experts)
    return render(launches, traits.label)


def render(launches: list[Launch], engine_label: str) -> str:
    """A POSIX shell script: one line per worker, every argument quoted; a worker over several nodes is
    started on each of them with its node rank (NODE_RANK, MASTER_ADDR from the environment)."""
    lines = [
        "#!/bin/sh",
        f"# {engine_label} launch commands from commplan (POST /v1/serve/export): one line per worker.",
        "# A worker over several nodes runs its line on each of them, with the variables its line names",
        "# (node rank, head address) set there; a variable that switches a flag on (HEADLESS for vLLM's",
        "# non-head nodes) is set on those nodes only. Every argument is quoted.",
        "set -eu",
    ]
    written = set()
    for launch in launches:
        lines.append(f"# {launch.role} worker {launch.worker} ({launch.nodes} node{'s' if launch.nodes > 1 else ''})")
        for name, content in launch.command.files:
            if name not in written:
                written.add(name)
                lines += [f"cat > {shlex.quote(name)} <<'COMMPLAN_EOF'", content, "COMMPLAN_EOF"]
        line = shlex.join(launch.command.argv)
        if launch.nodes > 1:
            line += "".join(f' {flag} "${{{var}}}{suffix}"' for flag, var, suffix in launch.command.per_node)
            line += "".join(f" ${{{var}:+{flag}}}" for flag, var in launch.command.per_node_switches)
        lines.append(line + " &")
    lines.append("wait")
    return "\n".join(lines) + "\n"


__all__ = [
    "Command",
    "CommandBuilder",
    "Launch",
    "launch_commands",
    "launch_script",
    "render",
    "sglang_command",
    "trtllm_command",
    "vllm_command",
]
