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
  A worker over several nodes is one MPI job: TensorRT-LLM's `trtllm-llmapi-launch` wrapper (rank 0 runs the
  server, the others `tensorrt_llm.llmapi.mgmn_worker_node`; it reads SLURM_PROCID or OMPI_COMM_WORLD_RANK) under
  `srun --mpi=pmix` with `-N nodes --ntasks-per-node=GPUs` (examples/llm-api/llm_mgmn_trtllm_serve.sh,
  examples/disaggregated/README.md "Multi-Node Execution", TensorRT-LLM at c3c3d76e28c5) or, outside Slurm,
  `mpirun -np GPUs` over the worker's hostfile (HOSTFILE_PREFILL_0, ...). Disaggregated: each server's extra
  options carry `cache_transceiver_config: {backend: DEFAULT}` (NIXL; DEFAULT | UCX | NIXL) and the context servers
  `disable_overlap_scheduler: true` ("not yet supported in disaggregated context server architectures"), each
  server listens on its own port, and `trtllm-serve disaggregated -c disagg_config.yaml` routes between them
  (`hostname`, `port`, `backend`, `context_servers` / `generation_servers` with `num_instances` and `urls`).
- vLLM disaggregated (docs.vllm.ai features/nixl_connector_usage; vllm tests/v1/kv_connector/nixl_integration/
  toy_proxy_server.py at 030ea52effcb): every server `--kv-transfer-config {"kv_connector": "NixlConnector",
  "kv_role": "kv_both"}` on its own `--port`, and the proxy `toy_proxy_server.py --host --port --prefiller-hosts
  H.. --prefiller-ports P.. --decoder-hosts H.. --decoder-ports P..` (nargs="+", paired in order).
- SGLang disaggregated (docs/advanced_features/pd_disaggregation.md, SGLang at 08edc506b2da): each server
  `--disaggregation-mode prefill|decode --disaggregation-transfer-backend nixl --host 0.0.0.0 --port N`, and the
  router `python -m sglang_router.launch_router --pd-disaggregation --prefill http://H:P --decode http://H:P
  --host 0.0.0.0 --port 8000`.
- Dynamo (ai-dynamo/dynamo at 416ff06e7fea, components/backends/{vllm,sglang}/deploy/disagg*.yaml, runtime
  0.6.1): a DynamoGraphDeployment (apiVersion nvidia.com/v1alpha1) whose services are the Frontend and one worker
  service per pool (componentType worker, subComponentType prefill|decode, replicas = the pool's workers,
  resources.limits.gpu the GPUs per node, multinode.nodeCount where a worker spans nodes), each running
  `python3 -m dynamo.vllm|dynamo.sglang` with the engine's own arguments (``dynamo_manifest``).
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
    # a worker over several nodes runs once as an MPI job, each rank through this wrapper (TensorRT-LLM's
    # trtllm-llmapi-launch), under srun inside a Slurm allocation or mpirun over its hostfile outside one; empty:
    # the worker's line runs on each of its nodes with its ``per_node`` flags instead
    mpi_wrapper: tuple[str, ...] = ()
    # the flag a server's listening port takes (each worker its own: the router's URLs name them); None: none
    port_flag: str | None = None


@dataclass(frozen=True)
class Launch:
    role: str
    worker: int
    nodes: int  # nodes the worker spans
    command: Command
    gpus_per_node: int = 0  # MPI ranks per node of a worker run as one MPI job (Command.mpi_wrapper)
    port: int = 0  # the worker's server port where the command takes one (Command.port_flag)


@dataclass(frozen=True)
class HostRef:
    """One argument of a router's command that names a worker's host: ``prefix${VAR}suffix``, double-quoted, the
    variable checked to be a host name before anything starts; ``prefix`` and ``suffix`` are this module's own
    text (a scheme, a port), never a request's."""

    var: str
    prefix: str = ""
    suffix: str = ""


BASE_PORT = 8000  # the router's port (TensorRT-LLM's disaggregated examples); worker i listens on BASE_PORT + 1 + i


@dataclass(frozen=True)
class Router:
    """What routes requests between the prefill and decode servers of a disaggregated deployment: files written
    first (our own text, no request string in them but the model path argument) and its command."""

    files: tuple[tuple[str, str], ...]  # written with the ``hosts`` variables expanded, after they are checked
    command: tuple[str | HostRef, ...]
    # the variables the router's config reads, one per worker: the host of that worker's first node (default
    # localhost); the script refuses a value that is not a host name before it writes the config
    hosts: tuple[str, ...] = ()


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
        per_node = min(pool.worker_gpus, devices_per_node)
        for w in range(pool.workers):
            port = BASE_PORT + 1 + len(out) if command.port_flag else 0
            out.append(Launch(pool.role, w, nodes, command, per_node, port))
    return out


# what an engine's ``launch`` trait is: (model path, traits, pool, options, disaggregated, GPUs per node,
# routed experts) -> the pool's command
CommandBuilder = Callable[[str, "EngineTraits", Pool, ServeOptions, bool, int, int], Command]
# what an engine's ``disagg_router`` trait is: the workers' launches -> the router between them
RouterBuilder = Callable[[list[Launch]], Router]


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
    port = "--port" if disagg else None  # each server its own: the proxy's --prefiller-ports / --decoder-ports
    return Command(tuple(argv), per_node=flags, per_node_switches=(("--headless", "HEADLESS"),), port_flag=port)


def sglang_command(
    model: str, traits: EngineTraits, pool: Pool, options: ServeOptions, disagg: bool, per_node: int, num_experts: int
) -> Command:
    tp = pool.tp * pool.dp if pool.attention_dp else pool.tp
    argv = ["python3", "-m", "sglang.launch_server", "--model-path", model, "--tp-size", str(tp)]
    if pool.attention_dp and pool.dp > 1:
        argv += ["--dp-size", str(pool.dp), "--enable-dp-attention"]
    elif pool.dp > 1:
        # plain data parallelism, --dp-size N without --enable-dp-attention: N replicas of --tp-size x --pp-size
        # behind the DataParallelController, one node only and dense only (EngineTraits.plain_dp, checked before any
        # command by deployment.check_deployment: pool_rules.check_plain_dp)
        argv += ["--dp-size", str(pool.dp)]
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
    if disagg:  # pd_disaggregation.md: NIXL (the default backend is mooncake); the router reaches each server
        argv += ["--disaggregation-mode", pool.role, "--disaggregation-transfer-backend", "nixl", "--host", "0.0.0.0"]
    if pool.worker_gpus > per_node:  # server_args.py nnodes (default 1): the nodes a worker spans, beside its rank
        argv += ["--nnodes", str(-(-pool.worker_gpus // per_node))]
    return Command(
        tuple(argv),
        per_node=(("--node-rank", "NODE_RANK", ""), ("--dist-init-addr", "MASTER_ADDR", ":5000")),
        port_flag="--port" if disagg else None,
    )


def trtllm_command(
    model: str, traits: EngineTraits, pool: Pool, options: ServeOptions, disagg: bool, per_node: int, num_experts: int
) -> Command:
    # --tp_size tp*dp: attention DP over them (no plain replicas: EngineTraits.plain_dp, pool_rules.check_plain_dp)
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
    wrapper = ("trtllm-llmapi-launch",)  # used only where the worker spans nodes (render)
    extra: dict = {}
    if disagg:  # examples/disaggregated/README.md (TensorRT-LLM c3c3d76e28c5), "Configuration File"
        argv += ["--host", "0.0.0.0"]
        if pool.role == "prefill":
            extra["disable_overlap_scheduler"] = True
        extra["cache_transceiver_config"] = {"backend": "DEFAULT"}
    if pool.attention_dp:
        extra["enable_attention_dp"] = True
    if options.mtp:
        extra["speculative_config"] = {"decoding_type": "MTP", "num_nextn_predict_layers": options.mtp.draft_tokens}
    if not options.cuda_graphs:
        extra["cuda_graph_config"] = None
    if options.redundant_experts:
        extra["moe_config"] = {"load_balancer": {"num_slots": num_experts + options.redundant_experts}}
    port = "--port" if disagg else None
    if not extra:
        return Command(tuple(argv), mpi_wrapper=wrapper, port_flag=port)
    name = f"extra-llm-api-{pool.role}.yml"  # JSON is YAML
    return Command(
        (*argv, "--extra_llm_api_options", name),
        files=((name, json.dumps(extra, indent=2)),),
        mpi_wrapper=wrapper,
        port_flag=port,
    )


def _servers(launches: list[Launch]) -> list[tuple[str, str, int]]:
    """(host variable, role, port) of each server of a disaggregated deployment: the variable names the host of
    the worker's first node (where its rank 0 serves), CTX_HOST_i for prefill worker i, GEN_HOST_i for decode."""
    return [(f"{'CTX' if x.role == 'prefill' else 'GEN'}_HOST_{x.worker}", x.role, x.port) for x in launches]


def trtllm_router(launches: list[Launch]) -> Router:
    """``trtllm-serve disaggregated -c disagg_config.yaml`` (examples/disaggregated/README.md at c3c3d76e28c5):
    the context servers (the prefill pool) and generation servers (the decode pool), each URL the host of the
    worker's first node, where its rank 0 runs the server, and the worker's port."""
    servers = _servers(launches)
    text = [f"hostname: 0.0.0.0\nport: {BASE_PORT}\nbackend: pytorch"]
    for role, key in (("prefill", "context_servers"), ("decode", "generation_servers")):
        urls = [(var, port) for var, r, port in servers if r == role]
        text.append(f"{key}:\n  num_instances: {len(urls)}\n  urls:")
        text += [f'    - "${{{var}}}:{port}"' for var, port in urls]
    return Router(
        (("disagg_config.yaml", "\n".join(text)),),
        ("trtllm-serve", "disaggregated", "-c", "disagg_config.yaml"),
        tuple(var for var, _, _ in servers),
    )


VLLM_PROXY = "toy_proxy_server.py"  # vllm tests/v1/kv_connector/nixl_integration/ (030ea52effcb), beside the script


def vllm_router(launches: list[Launch]) -> Router:
    """vLLM's NixlConnector proxy (toy_proxy_server.py parse_args at 030ea52effcb): it sends each request to a
    prefill server with max_tokens 1, then to a decode server with the returned kv_transfer_params, round robin
    over each list; hosts and ports are paired in order."""
    servers = _servers(launches)
    argv: list[str | HostRef] = ["python3", VLLM_PROXY, "--host", "0.0.0.0", "--port", str(BASE_PORT)]
    for role, name in (("prefill", "prefiller"), ("decode", "decoder")):
        argv += [f"--{name}-hosts", *(HostRef(var) for var, r, _ in servers if r == role)]
        argv += [f"--{name}-ports", *(str(port) for _, r, port in servers if r == role)]
    return Router((), tuple(argv), tuple(var for var, _, _ in servers))


def sglang_router(launches: list[Launch]) -> Router:
    """``python -m sglang_router.launch_router --pd-disaggregation --prefill URL --decode URL`` (SGLang
    docs/advanced_features/pd_disaggregation.md at 08edc506b2da): one --prefill / --decode per server."""
    servers = _servers(launches)
    argv: list[str | HostRef] = ["python3", "-m", "sglang_router.launch_router", "--pd-disaggregation"]
    for var, role, port in servers:
        argv += [f"--{role}", HostRef(var, "http://", f":{port}")]
    argv += ["--host", "0.0.0.0", "--port", str(BASE_PORT)]
    return Router((), tuple(argv), tuple(var for var, _, _ in servers))


def _model_launches(model, cluster, traits: EngineTraits, pools, options: ServeOptions, path: str) -> list[Launch]:
    experts = model.moe.num_experts if model.moe else 0
    return launch_commands(path, traits, pools, options, cluster.devices_per_node, experts)


def launch_script(
    model, cluster, traits: EngineTraits, pools: tuple[Pool, ...], options: ServeOptions, path: str
) -> str:
    """The deployment's launch script (what POST /v1/serve/export and ``commplan serve-plan --format launch``
    return): ``path`` is what the engine loads, the model's name when empty."""
    launches = _model_launches(model, cluster, traits, pools, options, path or model.name or "MODEL")
    router = traits.disagg_router(launches) if traits.disagg_router is not None and len(pools) > 1 else None
    return render(launches, traits.label, router)


@dataclass(frozen=True)
class DynamoWorker:
    """How Dynamo runs one of an engine's workers (the engine's ``dynamo`` trait): ``python3 -m module`` with the
    engine's own arguments, from the deploy manifests of ai-dynamo/dynamo at 416ff06e7fea
    (components/backends/{vllm,sglang}/deploy/disagg.yaml, disagg-multinode.yaml; runtime image 0.6.1)."""

    module: str  # python3 -m dynamo.vllm
    framework: str  # spec.backendFramework
    service: str  # the worker services' stem: VllmPrefillWorker, VllmDecodeWorker (VllmWorker: aggregated)
    image: str
    working_dir: str
    launcher_words: int  # leading words of the engine's own command (with the model) that the module replaces
    model_flag: str | None  # the flag the model path moves to; None: it stays where the engine's command has it
    role_flags: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (role, flags) a pool of that role adds
    flags: tuple[str, ...] = ()  # flags every worker adds
    # flags (each with its value) the Dynamo worker or the operator sets itself: dropped from the engine's command
    drop: tuple[str, ...] = ()


# dynamo.vllm configures its NixlConnector itself (disagg.yaml passes no --kv-transfer-config) and marks the prefill
# worker --is-prefill-worker; the operator places a worker over several nodes (Ray), so no per-node DP flags
VLLM_DYNAMO = DynamoWorker(
    "dynamo.vllm",
    "vllm",
    "Vllm",
    "nvcr.io/nvidia/ai-dynamo/vllm-runtime:0.6.1",
    "/workspace/components/backends/vllm",
    launcher_words=3,
    model_flag="--model",
    role_flags=(("prefill", ("--is-prefill-worker",)),),
    drop=("--kv-transfer-config", "--data-parallel-size-local"),
)
# dynamo.sglang takes SGLang's server arguments: disagg-multinode.yaml passes --model-path, --tp-size,
# --skip-tokenizer-init (the frontend tokenizes), --disaggregation-mode, --disaggregation-transfer-backend nixl,
# --host 0.0.0.0 and no --nnodes / --node-rank (multinode.nodeCount: the operator adds them)
SGLANG_DYNAMO = DynamoWorker(
    "dynamo.sglang",
    "sglang",
    "SGLang",
    "nvcr.io/nvidia/ai-dynamo/sglang-runtime:0.6.1",
    "/workspace/components/backends/sglang",
    launcher_words=3,
    model_flag=None,
    flags=("--skip-tokenizer-init",),
    drop=("--nnodes",),
)


def _dynamo_args(worker: DynamoWorker, argv: tuple[str, ...], model: str, role: str) -> list[str]:
    rest = list(argv[worker.launcher_words :])
    out = [worker.model_flag, model] if worker.model_flag else []
    i = 0
    while i < len(rest):
        if rest[i] in worker.drop:
            i += 2
            continue
        out.append(rest[i])
        i += 1
    return out + list(worker.flags) + [f for r, flags in worker.role_flags if r == role for f in flags]


def dynamo_deployment(
    model, cluster, traits: EngineTraits, pools: tuple[Pool, ...], options: ServeOptions, path: str
) -> dict:
    """The deployment as a DynamoGraphDeployment: the Frontend and one worker service per pool, replicas = the
    pool's workers, each worker's GPUs as the engine places them (tp x pp x dp, ``Pool.worker_gpus``) given as
    GPUs per node (resources.limits.gpu) times multinode.nodeCount where it spans nodes. An engine without a
    ``dynamo`` trait is a SpecError on ``engine``."""
    worker = traits.dynamo
    if worker is None:
        raise SpecError("engine", f"engine {traits.name!r} ({traits.label}) has no Dynamo worker (docs/serving.md)")
    path = path or model.name or "MODEL"
    launches = _model_launches(model, cluster, traits, pools, options, path)
    name = f"{traits.name}-{'disagg' if len(pools) > 1 else 'agg'}"
    services: dict = {
        "Frontend": {
            "dynamoNamespace": name,
            "componentType": "frontend",
            "replicas": 1,
            "extraPodSpec": {"mainContainer": {"image": worker.image}},
        }
    }
    for pool, launch in zip(pools, [x for x in launches if x.worker == 0], strict=True):
        role = "" if pool.role == "both" else pool.role
        service = {"dynamoNamespace": name, "envFromSecret": "hf-token-secret", "componentType": "worker"}
        if role:
            service["subComponentType"] = role
        service["replicas"] = pool.workers
        if launch.nodes > 1:
            service["multinode"] = {"nodeCount": launch.nodes}
        service["resources"] = {"limits": {"gpu": str(launch.gpus_per_node)}}
        service["extraPodSpec"] = {
            "mainContainer": {
                "image": worker.image,
                "workingDir": worker.working_dir,
                "command": ["python3", "-m", worker.module],
                "args": _dynamo_args(worker, launch.command.argv, path, pool.role),
            }
        }
        services[f"{worker.service}{role.capitalize()}Worker"] = service
    return {
        "apiVersion": "nvidia.com/v1alpha1",
        "kind": "DynamoGraphDeployment",
        "metadata": {"name": name},
        "spec": {"backendFramework": worker.framework, "services": services},
    }


def _yaml(value, indent: int = 0) -> list[str]:
    """Block YAML of our own dicts and lists, every scalar written as JSON (a JSON string is a YAML
    double-quoted scalar: quotes, backslashes and non-ASCII escaped), so no string a request carries can end a
    scalar or start a key."""
    pad = " " * indent
    lines = []
    items = value.items() if isinstance(value, dict) else [(None, v) for v in value]
    for key, v in items:
        head = f"{pad}{key}:" if key is not None else f"{pad}-"
        if isinstance(v, dict | list) and v:
            if isinstance(v, dict) and key is None:
                raise TypeError("a dict inside a list is not written here")
            lines.append(head)
            lines += _yaml(v, indent + 2)
        else:
            lines.append(f"{head} {json.dumps(v)}")
    return lines


def dynamo_manifest(
    model, cluster, traits: EngineTraits, pools: tuple[Pool, ...], options: ServeOptions, path: str
) -> str:
    """``dynamo_deployment`` as the YAML ``kubectl apply -f`` takes (POST /v1/serve/export?format=dynamo)."""
    deployment = dynamo_deployment(model, cluster, traits, pools, options, path)
    head = [f"# {traits.label} on Dynamo, from commplan (POST /v1/serve/export?format=dynamo)"]
    return "\n".join(head + _yaml(deployment)) + "\n"


@dataclass(frozen=True)
class ExportFormat:
    """A serving export: its writer (model, cluster, traits, pools, options, model path -> text), the file's media
    type and name suffix (serve-ENGINE<suffix>)."""

    write: Callable[..., str]
    media_type: str
    suffix: str


# The one registry of the serving exports: POST /v1/serve/export?format= (its schema's values), `commplan
# serve-plan --format` (its choices and help) and docs/serving.md read it (tests/app/test_serve.py checks all three).
EXPORTS = {
    "launch": ExportFormat(launch_script, "text/x-shellscript", ".sh"),  # the engines' launch script
    "dynamo": ExportFormat(dynamo_manifest, "application/yaml", "-dynamo.yaml"),  # DynamoGraphDeployment (vLLM, SGLang)
}

_HOST_CHARS = "*[!A-Za-z0-9.-]*"  # a case pattern: anything but a host name's or an IPv4 address's characters


def _worker_line(launch: Launch) -> list[str]:
    command = launch.command
    argv = list(command.argv)
    if launch.port:
        argv += [str(command.port_flag), str(launch.port)]
    if launch.nodes > 1 and command.mpi_wrapper:
        # one MPI job over the worker's nodes: srun inside a Slurm allocation, mpirun over its hostfile outside one
        ranks = launch.nodes * launch.gpus_per_node
        srun = ["srun", "-N", str(launch.nodes), f"--ntasks-per-node={launch.gpus_per_node}", "--mpi=pmix"]
        mpirun = ["mpirun", "-np", str(ranks), "--map-by", f"ppr:{launch.gpus_per_node}:node"]
        wrapped = shlex.join([*command.mpi_wrapper, *argv])
        hostfile = f"HOSTFILE_{launch.role.upper()}_{launch.worker}"
        return [
            'if [ -n "${SLURM_JOB_ID:-}" ]; then',
            f"  {shlex.join(srun)} {wrapped} &",
            "else",
            f'  {shlex.join(mpirun)} --hostfile "${{{hostfile}:?set {hostfile} to the MPI hostfile of this worker}}" '
            f"{wrapped} &",
            "fi",
        ]
    line = shlex.join(argv)
    if launch.nodes > 1:
        line += "".join(f' {flag} "${{{var}}}{suffix}"' for flag, var, suffix in command.per_node)
        line += "".join(f" ${{{var}:+{flag}}}" for flag, var in command.per_node_switches)
    return [line + " &"]


def _router_arg(arg: str | HostRef) -> str:
    if isinstance(arg, HostRef):  # the variable was checked against _HOST_CHARS; prefix and suffix are ours
        return f'"{arg.prefix}${{{arg.var}}}{arg.suffix}"'
    return shlex.quote(arg)


def render(launches: list[Launch], engine_label: str, router: Router | None = None) -> str:
    """A POSIX shell script: one line per worker, every argument quoted; a worker over several nodes is
    started on each of them with its node rank (NODE_RANK, MASTER_ADDR from the environment), or once as an MPI
    job where the engine runs one (TensorRT-LLM); then the router of a disaggregated deployment, if the engine
    has one, with its config's host variables checked first."""
    lines = [
        "#!/bin/sh",
        f"# {engine_label} launch commands from commplan (POST /v1/serve/export): one line per worker.",
        "# A worker over several nodes runs its line on each of them, with the variables its line names",
        "# (node rank, head address) set there; a variable that switches a flag on (HEADLESS for vLLM's",
        "# non-head nodes) is set on those nodes only; a worker run as one MPI job starts under srun inside a",
        "# Slurm allocation, else under mpirun with its hostfile (HOSTFILE_ROLE_i). Every argument is quoted.",
        "set -eu",
    ]
    if router is not None:
        lines.append("# the router's config names each server's host: set CTX_HOST_i / GEN_HOST_i (default localhost)")
        for var in router.hosts:
            lines += [
                f': "${{{var}:=localhost}}"',
                f'case "${{{var}}}" in ""|{_HOST_CHARS}) echo "commplan: {var} is not a host name" >&2; exit 2;; esac',
            ]
    written = set()
    for launch in launches:
        lines.append(f"# {launch.role} worker {launch.worker} ({launch.nodes} node{'s' if launch.nodes > 1 else ''})")
        for name, content in launch.command.files:
            if name not in written:
                written.add(name)
                lines += [f"cat > {shlex.quote(name)} <<'COMMPLAN_EOF'", content, "COMMPLAN_EOF"]
        lines += _worker_line(launch)
    if router is not None:
        lines.append("# the router between the prefill and decode servers")
        for name, content in router.files:  # our own text; the host variables were checked above
            lines += [f"cat > {shlex.quote(name)} <<COMMPLAN_EOF", content, "COMMPLAN_EOF"]
        lines.append(" ".join(_router_arg(x) for x in router.command) + " &")
    lines.append("wait")
    return "\n".join(lines) + "\n"


__all__ = [
    "EXPORTS",
    "SGLANG_DYNAMO",
    "VLLM_DYNAMO",
    "Command",
    "CommandBuilder",
    "DynamoWorker",
    "ExportFormat",
    "HostRef",
    "Launch",
    "Router",
    "RouterBuilder",
    "dynamo_deployment",
    "dynamo_manifest",
    "launch_commands",
    "launch_script",
    "render",
    "sglang_command",
    "sglang_router",
    "trtllm_command",
    "trtllm_router",
    "vllm_command",
    "vllm_router",
]
