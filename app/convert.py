"""Request blocks -> planner and cluster specs: presets first, then the fields the request sets."""

from __future__ import annotations

from dataclasses import fields, replace

from pydantic import ValidationError

from collectives.topology import ClusterSpec, cluster_preset, validate_cluster
from collectives.topology.fit import Constants, apply_constants
from collectives.topology.gpu import DTYPES, GPUSpec, gpu_preset, with_power_limit
from collectives.topology.spec import spec_block
from planner import MODEL_PRESETS, ModelSpec, Options, Overlap, ParallelSpec, SpecError, WorkloadSpec, from_hf_config
from planner.kernels import kernel_constants
from planner.model import MLASpec, MoESpec
from planner.parallel import DDPConfig, zero_config_from_dict
from planner.presets import PARALLEL_PRESETS, WORKLOAD_PRESETS

from .errors import relocated, stated, untagged
from .schemas.cluster import ClusterIn
from .schemas.plan import ModelIn, OptionsIn, ParallelIn, PlanRequest, WorkloadIn
from .settings import Settings

MODEL_REQUIRED = ("num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size", "vocab_size", "seq_length")


def _set(block, skip=("preset", "hf_config")) -> dict:
    """The fields a request block actually sets (so that an explicit null can clear a preset's value)."""
    return {k: getattr(block, k) for k in block.model_fields_set if k not in skip}


# model fields an explicit null sets to None (clearing a preset's value) rather than leaving the preset's
NULLABLE = (
    "moe", "mla", "num_kv_heads", "head_dim", "sliding_window", "full_attention_interval", "rope_scaling", "glu_clamp",
    "attention_dropout", "hidden_dropout",
)  # fmt: skip


def model_spec(block: ModelIn) -> ModelSpec:
    if block.preset is not None and block.hf_config is not None:
        # Two complete models: which one was meant cannot be guessed, and planning one would silently drop the other.
        raise SpecError("model.hf_config", f"give either preset {block.preset!r} or hf_config, not both")
    if block.preset is not None:
        if block.preset not in MODEL_PRESETS:
            raise SpecError("model.preset", f"unknown model preset {block.preset!r}; known: {', '.join(MODEL_PRESETS)}")
        base = MODEL_PRESETS[block.preset]
    elif block.hf_config is not None:
        base = from_hf_config(block.hf_config, block.seq_length)
    else:
        missing = [f for f in MODEL_REQUIRED if getattr(block, f) is None]
        if missing:
            raise SpecError(
                f"model.{missing[0]}",
                f"required when neither preset nor hf_config is given (missing: {', '.join(missing)})",
            )
        base = ModelSpec(**{f: getattr(block, f) for f in MODEL_REQUIRED}, name="custom")
    changes = _set(block)
    if "moe" in changes:
        moe = block.moe.model_dump() if block.moe else None
        changes["moe"] = MoESpec(**moe | {"mlp_only_layers": tuple(moe["mlp_only_layers"])}) if moe else None
    if "mla" in changes:
        changes["mla"] = MLASpec(**block.mla.model_dump()) if block.mla else None
    if changes.get("notes") is not None:
        changes["notes"] = tuple(changes["notes"])
    derived = {k: changes.pop(k) for k in DERIVED_COUNTS if k in changes}
    return _counted_as_given(
        replace(base, **{k: v for k, v in changes.items() if v is not None or k in NULLABLE}), derived
    )


def _counted_as_given(spec: ModelSpec, derived: dict) -> ModelSpec:
    """``spec``, once each derived count a request gave (a preset read back) equals what its fields count."""
    for key, given in derived.items():
        counted = DERIVED_COUNTS[key](spec)
        if given is not None and given != counted:
            raise SpecError(
                f"model.{key}",
                f"{key} is derived from the model's fields, not an input: these fields give {counted:,}, not "
                f"{given:,} (drop it, or change the fields it counts)",
            )
    return spec


# what GET /v1/presets/models adds to a spec's fields: derived counts, checked when a preset is posted back
DERIVED_COUNTS = {"params_total": ModelSpec.total_params, "params_active": ModelSpec.active_params}


# The fields that describe one kind of workload only: given for the other kind they were dropped without a word
# (a training request's batch_size 64 planned a global batch of 1, the default).
ONLY_FOR = {
    "training": (
        "micro_batch_size",
        "global_batch_size",
        "activation_recompute",
        "recompute_method",
        "recompute_num_layers",
        "recompute_modules",
        "selective_ac_option",
        "cpu_offloading_num_layers",
        "activation_func_fp8_input_store",
        "fused_grouped_mlp",
        "cuda_graph_scope",
        "scale_swizzle",
        "userbuffers_proj_fprop",
        "userbuffers_fc2_fprop",
        "loss_parallel",
        "optimizer_implementation",
        "document_lengths",
        "fp8_dot_product_attention",
        "fp8_dpa_backward",
        "document_packing",
    ),
    "inference": ("phase", "batch_size", "context_length", "kv_dtype"),
}


def workload_spec(block: WorkloadIn) -> WorkloadSpec:
    base = _preset(WORKLOAD_PRESETS, block.preset, "workload")
    given = {k: v for k, v in _set(block).items() if v is not None}
    kind = given.get("kind", base.get("kind", "training"))
    for other, names in ONLY_FOR.items():
        stray = [name for name in names if name in given] if other != kind else []
        if stray:
            verb, article = "describes" if len(stray) == 1 else "describe", "an" if other == "inference" else "a"
            raise SpecError(
                f"workload.{stray[0]}",
                f"{', '.join(stray)} {verb} {article} {other} workload, but kind is {kind!r}; "
                f"the {kind} fields are {', '.join(ONLY_FOR[kind])}",
            )
    for listed in ("recompute_modules", "document_lengths", "cuda_graph_scope"):  # hashable: the spec is a cache key
        if given.get(listed) is not None:
            given[listed] = tuple(given[listed])
    return WorkloadSpec(**(base | given))


def parallel_spec(block: ParallelIn, num_devices: int) -> ParallelSpec:
    values = _preset(PARALLEL_PRESETS, block.preset, "parallel") | {
        k: v for k, v in _set(block).items() if v is not None
    }
    if values.get("dp") is None:
        per_replica = values.get("tp", 1) * values.get("cp", 1) * values.get("pp", 1)
        if num_devices % per_replica:
            raise SpecError(
                "parallel.dp",
                f"dp omitted, but the cluster's {num_devices} devices do not divide into "
                f"tp*cp*pp = {values.get('tp', 1)}*{values.get('cp', 1)}*{values.get('pp', 1)} = {per_replica}",
            )
        values["dp"] = num_devices // per_replica
    if "zero_config" in values:
        values["zero_config"] = zero_config_from_dict(values["zero_config"])
    if isinstance(values.get("pipeline_layout"), list):  # hashable, as the spec is a cache key
        values["pipeline_layout"] = tuple(tuple(stage) for stage in values["pipeline_layout"])
    if values.get("pipeline_split_points") is not None:
        values["pipeline_split_points"] = tuple(values["pipeline_split_points"])
    if "ddp" in values:
        values["ddp"] = DDPConfig(**values["ddp"].model_dump())
    return ParallelSpec(**values)


def _preset(table: dict, name: str | None, block: str) -> dict:
    if name is None:
        return {}
    if name not in table:
        raise SpecError(f"{block}.preset", f"unknown {block} preset {name!r}; known: {', '.join(table)}")
    return dict(table[name])


def cluster_spec(block: ClusterIn, settings: Settings) -> ClusterSpec:
    if block.preset is not None:
        with relocated("cluster.preset"):
            base = cluster_preset(block.preset, block.num_nodes)
    else:
        for required in ("num_nodes", "devices_per_node"):
            if getattr(block, required) is None:
                raise SpecError(f"cluster.{required}", "required when no preset is given")
        base = ClusterSpec(block.name or "custom", block.num_nodes, block.devices_per_node)
    skip = ("preset", "intra", "network", "gpu", "calibration", "nccl_env")
    spec = replace(base, **{k: v for k, v in _set(block, skip).items() if v is not None})
    if block.gpu is not None:
        gpu = _gpu(block.gpu, spec.gpu)
        spec = replace(spec, gpu=gpu, device=gpu.name)
    spec = _nested_blocks(spec, block)
    devices = spec.num_nodes * spec.devices_per_node
    if devices > settings.max_devices:
        raise SpecError(
            "cluster.num_nodes",
            f"num_nodes x devices_per_node = {spec.num_nodes} x {spec.devices_per_node} = "
            f"{devices} devices; this service prices at most {settings.max_devices} (COMMPLAN_MAX_DEVICES)",
        )
    with relocated("cluster."):
        validate_cluster(spec)
        if block.calibration is not None:  # fitted constants (POST /v1/calibrate), through fit.py's one adapter
            nccl = block.calibration.model_dump(exclude_none=True, exclude={"kernels"})
            spec = apply_constants(Constants.from_dict(nccl), spec)
    if block.calibration is not None and block.calibration.kernels is not None:
        spec = with_kernel_constants(spec, block.calibration.kernels.model_dump(exclude_none=True))
    return spec


def with_kernel_constants(spec: ClusterSpec, values: dict) -> ClusterSpec:
    """The cluster with its GPU carrying the compute constants a profiler trace fitted (planner/kernels.py)."""
    field = "cluster.calibration.kernels"
    if spec.gpu is None:
        raise SpecError(field, "the cluster has no GPU spec for the kernel constants to apply to (give cluster.gpu)")
    return replace(spec, gpu=replace(spec.gpu, kernel_constants=kernel_constants(values, field)))


def _nested_blocks(spec: ClusterSpec, block: ClusterIn) -> ClusterSpec:
    """The cluster's nested blocks given in the request (intra, nccl_env, network) over the spec's own."""
    for name in ("intra", "nccl_env", "network"):
        given = getattr(block, name)
        if given is not None:
            values = _present(given)
            if "dims" in values:
                values["dims"] = tuple(values["dims"])
            spec = replace(spec, **{name: replace(getattr(spec, name), **values)})
    return spec


def cluster_block(spec: ClusterSpec) -> dict:
    """A request cluster block (ClusterIn) that rebuilds ``spec``: collectives.topology.spec.spec_block."""
    return spec_block(spec)


def _gpu(block, current: GPUSpec | None = None) -> GPUSpec:
    """A GPU by name (GPUS), by its fields, or a named one (``preset``, or the cluster preset's when only
    ``power_limit_w`` is given) with the given fields over it; then the power limit, checked against its range."""
    if isinstance(block, str):
        with relocated("cluster.gpu"):
            return gpu_preset(block)
    for dtype in block.peak_tflops:
        if dtype not in DTYPES:
            raise SpecError("cluster.gpu.peak_tflops", f"unknown dtype {dtype!r}; known: {', '.join(DTYPES)}")
    given = _present(block)
    limit = given.pop("power_limit_w", None)
    variability = given.pop("variability", None)
    name = given.pop("preset", None)
    if name is not None:
        with relocated("cluster.gpu.preset"):
            base = gpu_preset(name)
    elif current is not None and not given:
        base = current  # {"power_limit_w": W} and/or {"variability": x} alone: the preset cluster's GPU
    else:
        base = GPUSpec(
            block.name,
            dict(block.peak_tflops),
            block.hbm_bytes,
            block.hbm_GBps,
            block.sm,
            block.nvlink_links,
            "given in the request",
        )
        given = {k: v for k, v in given.items() if k in ("sms", "tdp_w", "min_power_w")}
    if given:
        base = replace(base, **given)
    if variability is not None:  # bounds: the schema's (VARIABILITY_RANGE)
        base = replace(base, variability=variability)
    with relocated():  # its field is cluster.gpu.power_limit_w
        return with_power_limit(base, limit)


def _present(block) -> dict:
    return {k: v for k, v in block.model_dump(exclude_unset=True).items() if v is not None}


def options(block: OptionsIn) -> Options:
    device_map = tuple(block.device_map) if block.device_map is not None else None
    return Options(
        algorithm=block.algorithm,
        candidates=block.candidates,
        contention=block.contention,
        device_map=device_map,
        links_per_call=block.links_per_call,
        pricing=block.pricing,
        nccl_algo=block.nccl_algo,
        nccl_proto=block.nccl_proto,
        overlap=Overlap(**block.overlap.model_dump()),
        timeline=block.timeline,
    )


def plan_inputs(request: PlanRequest, settings: Settings):
    """(model, workload, parallel, cluster, options) for planner.build_plan."""
    cluster = cluster_spec(request.cluster, settings)
    return (
        model_spec(request.model),
        workload_spec(request.workload),
        parallel_spec(request.parallel, cluster.num_devices),
        cluster,
        options(request.options),
    )


def spec_dict(spec) -> dict:
    """A (nested) spec dataclass as JSON-ready data."""
    out = {}
    for f in fields(spec):
        value = getattr(spec, f.name)
        if hasattr(value, "__dataclass_fields__"):
            value = spec_dict(value)
        elif isinstance(value, tuple):
            value = list(value)
        out[f.name] = value
    return out


def serve_options(block):
    """A serve request's options block as planner.serving.ServeOptions."""
    from planner.serving import MTP, ServeOptions

    opts = block.model_dump()
    mtp = opts["mtp"]
    opts["mtp"] = MTP(mtp["draft_tokens"], mtp["acceptance"], mtp["tokens_per_step"]) if mtp else None
    return ServeOptions(**opts)


def serve_inputs(body, settings: Settings):
    """plan_serving's inputs for a POST /v1/serve body, after the work of every step it will plan is estimated
    from the same workers it plans (planner.serving.worker_inputs) and found within the budget."""
    from planner.estimate import Estimate, estimate
    from planner.serving import Pool, Traffic, engine, worker_inputs

    from .limits import check_router, refuse

    cluster = cluster_spec(body.cluster, settings)
    model = model_spec(body.model)
    traffic = Traffic(**body.traffic.model_dump())
    pools = tuple(Pool(**p.model_dump()) for p in body.deployment.pools)
    options_ = serve_options(body.options)
    traits = engine(body.engine)
    check_router(cluster, settings.max_router_pairs)  # the KV transfer is priced on the whole cluster
    total = Estimate()
    for role, work, par, sub, plans in worker_inputs(model, cluster, traits, traffic, pools, options_):
        est = estimate(model, work, par, sub, Options(timeline=False))
        total.add(est.units * plans, f"{plans} steps of the {role} pool ({est.biggest})")
    refuse(total, settings.max_work, "deployment")
    return model, cluster, traits, traffic, pools, options_


def serve_calibrate_inputs(body, settings: Settings) -> tuple[tuple, list]:
    """calibrate_serving's inputs for a POST /v1/serve/calibrate body: each run parsed (a 422 at
    ``runs.N.text`` naming what its block lacks) and its traffic planned through serve_inputs, the cost guard
    included; returns (model, cluster, traits, pools, options) and the runs."""
    from planner.serving.calibrate import parse_bench

    from .schemas.serve import ServeRequest

    runs = [parse_bench(run.text, f"runs.{i}.text") for i, run in enumerate(body.runs)]
    blocks = body.model_dump(include={"model", "cluster", "engine", "deployment", "options"}, exclude_unset=True)
    inputs = None
    for i, run in enumerate(runs):
        traffic = {k: v for k, v in vars(run.traffic).items() if v is not None}
        try:
            request = ServeRequest.model_validate(blocks | {"traffic": traffic})
        except ValidationError as err:  # the run's traffic is over what /v1/serve takes
            first = untagged(err.errors(include_url=False))[0]
            raise SpecError(f"runs.{i}.text", f"{'.'.join(map(str, first['loc']))}: {stated(first)}") from None
        model, cluster, traits, _, pools, options_ = serve_inputs(request, settings)
        inputs = (model, cluster, traits, pools, options_)
    return inputs, runs


def serve_search_inputs(body, settings: Settings) -> tuple[dict, dict, int]:
    """search_serving's keyword arguments for a POST /v1/serve/search body, with the deployments it will plan
    counted (once) and within COMMPLAN_MAX_SERVE_CANDIDATES: over it, a 422 before any is planned. Also the
    request's model, cluster and options (each result's /v1/serve body starts from them) and the count."""
    from planner.serving import Traffic, validate_traffic
    from planner.serving.search import SLA, candidates

    cluster = cluster_spec(body.cluster, settings)
    model = model_spec(body.model)
    traffic = Traffic(**body.traffic.model_dump())
    engines, modes = tuple(dict.fromkeys(body.engines)), tuple(dict.fromkeys(body.modes))
    validate_traffic(traffic)
    sla = SLA(**body.sla.model_dump())
    options = serve_options(body.options)
    deployments = candidates(model, cluster, traffic, engines, modes, sla, settings.max_serve_candidates, options)
    if len(deployments) > settings.max_serve_candidates:
        raise SpecError(
            "cluster",
            f"{len(deployments):,} deployments to plan, above the limit of {settings.max_serve_candidates:,} "
            f"(COMMPLAN_MAX_SERVE_CANDIDATES); narrow engines or modes, or a smaller cluster",
        )
    args = {
        "model": model, "cluster": cluster, "traffic": traffic, "engines": engines, "modes": modes,
        "sla": sla, "options": options, "top_k": body.top_k,
        "deployments": deployments,
    }  # fmt: skip
    base = body.model_dump(include={"model", "cluster", "options"}, exclude_unset=True)
    return args, base, len(deployments)


__all__ = [
    "cluster_spec",
    "model_spec",
    "options",
    "parallel_spec",
    "plan_inputs",
    "serve_calibrate_inputs",
    "serve_inputs",
    "serve_options",
    "serve_search_inputs",
    "spec_dict",
    "workload_spec",
]
