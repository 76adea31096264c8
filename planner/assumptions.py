"""The settings a plan was made under, as the planner resolved them, each with where its value comes from: the
page's Assumptions panel lists them (issue 25), and a caller can see which defaults a plan rests on without
knowing the frameworks' defaults.

One row per request field that changes the plan and applies to it (the CP rows only with cp > 1, the MoE rows
only with an MoE model, ...). The value is the resolved one (what the planner priced), whether the request gave
it or not; the source names who decides it when the request is silent: the framework flavour's version
(planner/flavours/), the schema's documented default, or this project's own choice. Nothing here is a second
model: every value is read from what the plan itself resolved (Context, Overlap.resolved, the kernel choice).
"""

from __future__ import annotations

from dataclasses import dataclass

from collectives.topology.gpu import GPU_VARIABILITY
from collectives.topology.spec import ClusterSpec

from .context import Context
from .kernels import (
    apex_norm,
    attention_kernel,
    cross_entropy_fusion,
    grad_accumulation_fusion,
    norm_ops,
    vocab_parallel_loss,
)
from .parallel import DEFAULT_ORDER, format_layout, pipeline_chunks
from .pipeline import Schedule
from .pipeline_jitter import method, order_method
from .spread import pace


@dataclass(frozen=True)
class Assumption:
    field: str  # the request field, as a dotted path (options.overlap.tp_comm_overlap)
    value: str  # as resolved for this plan
    source: str  # who decides it when the request leaves it out


COMMPLAN = "commplan default"
SCHEMA_SOURCES = {  # the framework switch each overlap flag is (app/schemas/plan.py OverlapIn)
    "overlap_grad_reduce": "Megatron --overlap-grad-reduce; DDP/FSDP2 hooks; DeepSpeed overlap_comm",
    "overlap_param_gather": "Megatron --overlap-param-gather; FSDP2 prefetch; DeepSpeed overlap_comm",
    "fsdp_prefetch": "FSDP2 / DeepSpeed ZeRO-3 prefetch (on)",
    "cp_ring_overlap": "ring attention: the KV exchange runs behind the attention of the chunk held (on)",
    "tp_comm_overlap": "Megatron --tp-comm-overlap (off)",
    "overlap_p2p": "Megatron --overlap-p2p-communication (interleaved schedule only)",
    "overlap_moe_expert_parallel_comm": "Megatron --overlap-moe-expert-parallel-comm (off); DualPipe provides it",
    "moe_shared_expert_overlap": "Megatron --moe-shared-expert-overlap (off)",
}


def _onoff(flag: bool) -> str:
    return "on" if flag else "off"


def plan_assumptions(ctx: Context, overlap, cluster: ClusterSpec, options) -> list[Assumption]:
    """The rows for one plan. ``overlap``: the request's Overlap (None fields are the framework's defaults);
    ``options``: the plan's Options (pricing and NCCL pins)."""
    fl, par, work = ctx.flavour, ctx.par, ctx.work
    by = f"{fl.display or fl.name} default ({fl.version})" if fl.version else f"{fl.name} default"
    rows = _model_rows(ctx)
    add = rows.append
    add(Assumption("parallel.framework", fl.name, f"{COMMPLAN}: Megatron-Core; traits read from {fl.version}"))
    add(Assumption("workload.param_dtype", work.param_dtype, f"{COMMPLAN}: bf16 mixed precision"))
    add(Assumption("workload.activation_dtype", work.activation_dtype, f"{COMMPLAN}: bf16 mixed precision"))
    if work.training:
        rows += _training_rows(ctx, by)
    if cluster.gpu is not None:
        kernel = attention_kernel(ctx, cluster.gpu)
        add(Assumption("workload.attention_kernel", kernel, _attention_source(ctx, by)))
        add(_variability_row(ctx, cluster.gpu.variability))
    add(Assumption("workload.cuda_graphs", _onoff(bool(work.cuda_graphs)), by + ": no CUDA graphs"))
    add(Assumption("workload.torch_compile", _onoff(bool(work.torch_compile)), by + ": eager"))
    if work.training:
        rows += _kernel_switch_rows(ctx, by)
    norm = "ops" if norm_ops(ctx) else "apex" if apex_norm(ctx) else "fused"
    if not fl.fused_kernels:
        add(Assumption("workload.norm_kernel", norm, f"{by}: fused (F.rms_norm)"))
    elif fl.persist_layer_norm_sizes is not None:
        what = f"{by}: apex's persistent LayerNorm where the hidden size is one of persist_ln_hidden_sizes, else apex"
        add(Assumption("workload.norm_kernel", norm, what))
    elif norm == "apex":
        add(Assumption("workload.norm_kernel", norm, f"{by}: fused"))
    add(Assumption("parallel.zero_stage", str(par.zero_stage), f"{COMMPLAN}: 0 (no optimizer sharding)"))
    add(Assumption("parallel.order", par.order, f"{COMMPLAN}: Megatron's {DEFAULT_ORDER}, fastest-varying first"))
    rows += _layout_rows(ctx, by)
    rows += _split_and_data_rows(ctx)
    resolved = overlap.resolved(ctx)
    for name, source in SCHEMA_SOURCES.items():
        if _applies(name, ctx):
            add(Assumption(f"options.overlap.{name}", _onoff(getattr(resolved, name)), f"{by}; {source}"))
    rows += _userbuffers_rows(ctx, resolved.tp_comm_overlap, by)
    add(Assumption("cluster.nccl_version", cluster.nccl_version, f"{COMMPLAN}: the newest NCCL tuning model"))
    add(Assumption("options.pricing", options.pricing, "auto: NCCL's cost model on NVIDIA clusters, else the schedule"))
    add(Assumption("options.nccl_algo", options.nccl_algo, "NCCL_ALGO unset: NCCL picks per call"))
    add(Assumption("options.nccl_proto", options.nccl_proto, "NCCL_PROTO unset: NCCL picks per call"))
    return rows


def _variability_row(ctx: Context, sigma: float) -> Assumption:
    """cluster.gpu.variability as the step prices it (planner/spread.py): the sigma and the slowest-of-N pace."""
    n = ctx.par.world_size
    value = f"{sigma:.2%} sigma; the slowest of {n:,} GPUs: +{pace(sigma, n) - 1:.2%} compute-bound time"
    what = (
        f"{COMMPLAN}: {GPU_VARIABILITY:.2%} = Sinha et al. SC'22 (arXiv v3)'s 8% average spread over V100 and MI60 "
        "fleets, read by this project as 4·IQR / median, / (4 x 1.349); the slowest part runs at clock / pace, so "
        "memory-bound kernels do not slow; 0 turns it off"
    )
    return Assumption("cluster.gpu.variability", value, what)


def _userbuffers_rows(ctx: Context, overlapped: bool, by: str) -> list[Assumption]:
    """Under TE's userbuffers (tp_comm_overlap, Flavour.userbuffers, SP, training), the method of each forward
    reduce-scatter GEMM (workload.userbuffers_proj_fprop / userbuffers_fc2_fprop: the run's ub config)."""
    if not (overlapped and ctx.flavour.userbuffers and ctx.par.sp and ctx.training):
        return []
    what = f"{by}: pipeline (TE initialize_ub's default; a run's ub config may set ring_exchange)"
    work = ctx.work
    return [
        Assumption("workload.userbuffers_proj_fprop", work.userbuffers_proj_fprop or "pipeline", what),
        Assumption("workload.userbuffers_fc2_fprop", work.userbuffers_fc2_fprop or "pipeline", what),
    ]


def _kernel_switch_rows(ctx: Context, by: str) -> list[Assumption]:
    """A training plan's kernel switches as the framework resolves them (fusions, the loss, the optimizer)."""
    fl, par, work = ctx.flavour, ctx.par, ctx.work
    rows: list[Assumption] = []
    add = rows.append
    fused = _onoff(grad_accumulation_fusion(ctx))
    add(Assumption("workload.grad_accumulation_fusion", fused, f"{by}: {_onoff(fl.grad_accumulation_fusion)}"))
    loss = _onoff(cross_entropy_fusion(ctx))
    add(Assumption("workload.cross_entropy_fusion", loss, f"{by}: {_onoff(fl.fused_cross_entropy)}"))
    if fl.loss_parallel_switch and par.tp > 1:
        lp = _onoff(vocab_parallel_loss(ctx))
        what = f"{by}: {_onoff(fl.vocab_parallel_loss)} (torchtitan: on unless --training.disable_loss_parallel)"
        add(Assumption("workload.loss_parallel", lp, what))
    if fl.torch_optimizer:
        impl = work.optimizer_implementation or "fused"
        what = f"{by}: fused (torchtitan optimizer.implementation; foreach before 2025), then clip_grad_norm_"
        add(Assumption("workload.optimizer_implementation", impl, what))
    if ctx.model.moe is not None and fl.te_fp8_recipes:
        grouped = _onoff(work.fused_grouped_mlp)
        add(Assumption("workload.fused_grouped_mlp", grouped, f"{by}: off (TEGroupedMLP, a GEMM per local expert)"))
    if ctx.model.moe is not None and fl.te_graph_scopes:  # the frameworks that run them (Flavour.te_graph_scopes)
        scope = ", ".join(work.cuda_graph_scope) or "none"
        add(Assumption("workload.cuda_graph_scope", scope, f"{by}: none (no TE graphs of the router or preprocess)"))
    recipe = work.recipe
    if fl.te_fp8_recipes and recipe is not None and recipe.gemm_swizzle_launches:
        what = f"{by}: quantize (TE 2.18's quantizers write GEMM-ready scales; gemm: TE 2.9 swizzles at each GEMM)"
        add(Assumption("workload.scale_swizzle", work.scale_swizzle, what))
    return rows


def _layout_rows(ctx: Context, by: str) -> list[Assumption]:
    """The pipeline schedule, the CP method and the expert layout, where the plan has them."""
    fl, par = ctx.flavour, ctx.par
    rows: list[Assumption] = []
    add = rows.append
    if par.pp > 1:
        source = f"{COMMPLAN}: 1f1b (Megatron's default)"
        sched = Schedule(par.pipeline_schedule, par.pp, ctx.micro_batches, par.chunks_per_rank)
        bubble = order_method(sched)
        if bubble and ctx.work.training:  # how the step's bubble is found (vsched12)
            source += f"; the bubble: {bubble} (planner/pipeline.py bubble_s)"
        caveat = sched.traits.layout_caveat
        if caveat:  # what the stages' layout leaves out of the schedule's own (review r12a #3)
            source += f"; {caveat}"
        add(Assumption("parallel.pipeline_schedule", par.pipeline_schedule, source))
        add(
            Assumption(
                "parallel.virtual_pipeline_stages",
                # the chunks a rank runs (round 12: ZBV, DualPipe(V) and a layout's read "1" where they run 2)
                str(par.chunks_per_rank),
                "Megatron: 1 (no interleaving); ZBV, DualPipe and DualPipeV: 2; a layout or split: its chunks",
            )
        )
    if par.cp > 1 and fl.cp_rotate_methods:
        method = par.cp_rotate_method or fl.cp_rotate_methods[0]
        add(Assumption("parallel.cp_rotate_method", method, f"{by}: context_parallel rotate_method allgather"))
        balance = _onoff(par.cp_load_balance is not False)
        add(Assumption("parallel.cp_load_balance", balance, f"{by}: _cp_options.enable_load_balance (on)"))
    elif par.cp > 1:
        add(Assumption("parallel.cp_comm", par.cp_comm, "Megatron --cp-comm-type (p2p: ring attention)"))
    if ctx.model.moe is not None:
        add(Assumption("parallel.ep_dispatch", par.ep_dispatch, f"{COMMPLAN}: alltoall, as published recipes set it"))
        rows += _dispatch_rate_rows(ctx)
        add(Assumption("parallel.expert_tp", str(par.etp), by + (" (= tp)" if fl.expert_tp_default_is_tp else " (1)")))
    return rows


def _dispatch_rate_rows(ctx: Context) -> list[Assumption]:
    """The fitted rate of the dispatcher's kernels (rules/deepep.py ACHIEVED), where one is fitted: where it was fitted
    and that it is carried to this plan's GPU unverified."""
    from .rules.deepep import ACHIEVED, ACHIEVED_NOTE

    achieved = ACHIEVED.get(ctx.par.ep_dispatch, 1.0)
    if achieved == 1.0:
        return []
    where = f"{ACHIEVED_NOTE}; carried to every GPU unverified"
    return [Assumption("parallel.ep_dispatch (rate)", f"{achieved} of NCCL's all-to-all rate", f"{COMMPLAN}: {where}")]


def _split_and_data_rows(ctx: Context) -> list[Assumption]:
    """The pipeline split as the planner resolved it, in Megatron's --pipeline-model-parallel-layout syntax
    (whatever gave it: an even split, first/last stage layers, embedding/loss counted as layers, torch's split
    points or a layout), the layers offloaded to the host, and the packed documents (issue 21)."""
    par, work = ctx.par, ctx.work
    rows: list[Assumption] = []
    if par.pp > 1:
        chunks = [c for rank in pipeline_chunks(par, ctx.model.num_layers, ctx.model.mtp_layers) for c in rank]
        chunks.sort(key=lambda c: c.index)
        # one copy of the model: DualPipe holds two (pipeline.StageMap), and its layout names one copy's pp stages
        layout = format_layout(chunks[: len(chunks) // par.schedule.stage_map.copies])
        rows.append(Assumption("parallel.pipeline_layout", layout, _split_source(par)))
    if work.training and work.activation_recompute == "none" and par.pp == 1:
        offload = "Megatron --cpu-offloading-num-layers (0: none)"
        rows.append(Assumption("workload.cpu_offloading_num_layers", str(work.cpu_offloading_num_layers), offload))
    if work.training and work.document_lengths:
        lengths = work.document_lengths
        shown = ", ".join(map(str, lengths[:8])) + (f", ... ({len(lengths)} in all)" if len(lengths) > 8 else "")
        rows.append(Assumption("workload.document_lengths", shown, f"{COMMPLAN}: one document a sequence"))
        what = "none: every sequence packs document_lengths (Megatron's packing scheduler off)"
        if work.document_packing == "dp_balanced":  # how the wait for the slowest packed micro-batch is found
            sched = Schedule(par.pipeline_schedule, par.pp, ctx.micro_batches, par.chunks_per_rank)
            what += f"; the wait for the slowest packed micro-batch: {method(sched)} (planner/pipeline_jitter.py)"
        rows.append(Assumption("workload.document_packing", work.document_packing or "none", what))
    return rows


def _split_source(par) -> str:
    """What split the layers over the virtual stages, the first of these the request sets (parallel.py
    _stage_tokens reads them in this order)."""
    given = (
        (par.pipeline_split_points is not None, "torch pipeline_split_points (torch.distributed.pipelining)"),
        (par.first_stage_layers is not None or par.last_stage_layers is not None,
         "Megatron --decoder-first/last-pipeline-num-layers, each rank's layers split evenly over its chunks"),
        (par.account_for_embedding_in_pipeline_split or par.account_for_loss_in_pipeline_split,
         "Megatron --account-for-embedding/loss-in-pipeline-split: an even split, embedding/loss counted as layers"),
    )  # fmt: skip
    found = next((what for hit, what in given if hit), None)
    return found or "Megatron: num_layers / (pp·v) layers a virtual stage (get_transformer_layer_offset)"


def _model_rows(ctx: Context) -> list[Assumption]:
    """The model as the planner read it (a preset, the request's fields or a config.json): what the page shows
    to confirm an import was understood."""
    m = ctx.model
    source = m.source or m.name or "the request's model block (fields or config.json)"
    shape = [
        ("num_layers", m.num_layers),
        ("hidden_size", m.hidden_size),
        ("num_attention_heads", m.num_attention_heads),
        ("num_kv_heads", m.num_kv_heads or m.num_attention_heads),
        ("ffn_hidden_size", m.ffn_hidden_size),
        ("vocab_size", m.vocab_size),
        ("seq_length", m.seq_length),
    ]
    if m.moe is not None:
        shape += [("moe.num_experts", m.moe.num_experts), ("moe.top_k", m.moe.top_k)]
        shape += [("moe.expert_ffn_hidden_size", m.moe.expert_ffn_hidden_size)]
        shape += [("moe.num_shared_experts", m.moe.num_shared_experts)] if m.moe.num_shared_experts else []
    if m.mla is not None:
        shape += [("mla.kv_lora_rank", m.mla.kv_lora_rank), ("mla.q_lora_rank", m.mla.q_lora_rank)]
    if m.sliding_window:
        every = m.full_attention_interval or "none (every layer slides)"
        shape += [("sliding_window", m.sliding_window), ("full_attention_interval", every)]
    if m.mtp_layers:
        shape.append(("mtp_layers", m.mtp_layers))
    switches = [(name, "on") for name in ("qk_norm", "attention_sinks") if getattr(m, name)]
    return [Assumption(f"model.{name}", str(value), source) for name, value in shape + switches]


def _training_rows(ctx: Context, by: str) -> list[Assumption]:
    work = ctx.work
    rows = [
        Assumption("workload.grad_reduce_dtype", ctx.grad_dtype, by),
        Assumption("workload.fp8_recipe", work.fp8_recipe or "none", f"{COMMPLAN}: GEMMs in the activation dtype"),
    ]
    if work.fp8_recipe and ctx.flavour.torchao_float8:
        gather = "torchao enable_fsdp_float8_all_gather (off)"
        rows.append(Assumption("workload.fp8_param_gather", _onoff(work.fp8_param_gather), gather))
        if work.fp8_param_gather:
            scale = "torchtitan float8.precompute_float8_dynamic_scale_for_fsdp (off)"
            rows.append(Assumption("workload.fp8_precompute_scale", _onoff(work.fp8_precompute_scale), scale))
    elif work.fp8_recipe:
        rows.append(
            Assumption("workload.fp8_param_gather", _onoff(work.fp8_param_gather), "Megatron --fp8-param-gather (off)")
        )
        dpa = "Megatron --fp8-dot-product-attention (off)"
        rows.append(Assumption("workload.fp8_dot_product_attention", _onoff(work.fp8_dot_product_attention), dpa))
        if work.fp8_dot_product_attention:
            bwd = "TransformerEngine NVTE_FP8_DPA_BWD (1: the backward in fp8 too)"
            rows.append(Assumption("workload.fp8_dpa_backward", _onoff(work.fp8_dpa_backward), bwd))
    rows += _dropout_rows(ctx)
    granularity = work.activation_recompute
    rows.append(Assumption("workload.activation_recompute", granularity, "Megatron --recompute-granularity (none)"))
    if granularity == "full":
        method, layers = work.recompute_method or "uniform", str(work.recompute_num_layers or 1)
        rows.append(Assumption("workload.recompute_method", method, "Megatron --recompute-method (uniform)"))
        rows.append(Assumption("workload.recompute_num_layers", layers, "Megatron --recompute-num-layers (1)"))
    if granularity == "selective" and work.selective_ac_option is not None:  # torchtitan's, not Megatron's modules
        what = "torchtitan activation_checkpoint selective_ac_option (op: per-op SAC; N: every N-th block)"
        rows.append(Assumption("workload.selective_ac_option", work.selective_ac_option, what))
    elif granularity == "selective":
        modules = ", ".join(work.recompute_modules or ("core_attn",))
        rows.append(Assumption("workload.recompute_modules", modules, "Megatron --recompute-modules (core_attn)"))
    return rows


INFERRED_DROPOUT_SOURCE = (
    "inferred: Megatron-LM's --attention-dropout / --hidden-dropout defaults (0.1) for a GPT-style model (linear "
    "biases or learned positions), 0 otherwise"
)


def _dropout_rows(ctx: Context) -> list[Assumption]:
    """The dropout probabilities the plan trained with (ModelSpec.dropout_probs): the model's where it sets them
    (a preset's recipe, the request, a config.json), else the inferred rule."""
    m = ctx.model
    given = "the model (a preset's recipe: planner/presets.py PRESET_DROPOUT; the request; or config.json)"
    return [
        Assumption(f"model.{name}", f"{p:g}", INFERRED_DROPOUT_SOURCE if set_to is None else given)
        for name, p, set_to in zip(
            ("attention_dropout", "hidden_dropout"),
            m.dropout_probs(),
            (m.attention_dropout, m.hidden_dropout),
            strict=True,
        )
    ]


def _attention_source(ctx: Context, by: str) -> str:
    if ctx.work.attention_kernel != "flash":
        return "as requested"
    if ctx.model.attention_sinks and ctx.flavour.sink_attention_kernels:
        return by + ": the framework's fused attention for this GPU generation that runs learned sinks"
    return by + ": the framework's fused attention for this GPU generation"


def _applies(name: str, ctx: Context) -> bool:
    """Whether an overlap switch can change this plan: its parallelism is present."""
    par = ctx.par
    needs = {
        "overlap_grad_reduce": ctx.work.training and par.dp * par.cp > 1,
        "overlap_param_gather": ctx.work.training and par.dp * par.cp > 1 and par.zero_stage >= 1,
        "fsdp_prefetch": ctx.work.training and par.zero_stage == 3,
        "cp_ring_overlap": par.cp > 1,
        "tp_comm_overlap": par.tp > 1,
        "overlap_p2p": par.pp > 1,
        "overlap_moe_expert_parallel_comm": ctx.model.moe is not None and par.ep > 1,
        "moe_shared_expert_overlap": ctx.model.moe is not None and par.ep > 1,
    }
    return needs[name]
