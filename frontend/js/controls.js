// Every request field a user sets beyond the basic form (issue 25 item 3, issue 21 item 7), grouped, each with
// the framework's default shown. One table drives the inputs, the request, the form filled from a request or a
// URL, and the 422 marks: a new field is one row here (names as in app/schemas/plan.py).
//
// An empty choice is "the default": the field is left out of the request, and its label says what the plan
// resolved it to (the plan's `assumptions`, planner/assumptions.py) or, before a plan, the default the schema
// documents.
import { $, el } from "./dom.js";
import { fmtBw, fmtTime } from "./format.js";

const DTYPES = ["fp32", "bf16", "fp16", "fp8"];
// the server's own lists, filled before the controls are built: the versions cluster.nccl_version takes (GET
// /v1/collectives/nccl-versions, the library's table) and what cluster.network.kind and cluster.cpu_vendor take
// (GET /v1/collectives/cluster-choices, collectives/topology/spec.py NETWORK_KINDS and CPU_VENDORS)
const NCCL_VERSIONS = [], NETWORK_KINDS = [], CPU_VENDORS = [];
const refill = (list, values) => list.splice(0, list.length, ...values);
export function setNcclVersions(answer) { refill(NCCL_VERSIONS, answer.versions); }
export function setClusterChoices(answer) { refill(NETWORK_KINDS, answer.network_kinds); refill(CPU_VENDORS, answer.cpu_vendors); }
// shared with the model's fields (model.js) and the Assumptions panel (assumptions.js)
export const ON_OFF = [["true", "on"], ["false", "off"]];
// an on/off select's value as the request's boolean; a value from a link that is neither is sent as it is, so the
// server names it in its 422 (it was sent as false: "qk_norm": "rms" planned without QK-norm)
export const onOff = (text) => (text === "true" ? true : text === "false" ? false : text);
// [group, [path, label, kind, choices or placeholder, default text, when]]; kind: select | int | float | text |
// list | modules. `when` hides a control unless the form's kind matches (data-when, form.js syncVisibility).
// The cluster's fields (beyond the form's preset, nodes and override box) default to the preset's: after a plan
// each names the value the plan's own cluster block holds.
export const GROUPS = [
  ["Precision and FP8", [
    ["workload.param_dtype", "Parameters", "select", DTYPES, "bf16"],
    ["workload.activation_dtype", "Activations", "select", DTYPES, "bf16"],
    ["workload.grad_reduce_dtype", "Gradient reduction", "select", ["fp32", "bf16", "fp16"], "Megatron fp32, others the parameters'", "kind=training"],
    ["workload.moe_dispatch_dtype", "MoE dispatch", "select", DTYPES, "the activations'"],
    ["workload.kv_dtype", "KV cache", "select", DTYPES, "the activations'", "kind=inference"],
    ["workload.fp8_recipe", "FP8 / FP4 recipe", "select", ["delayed", "tensorwise", "blockwise", "mxfp8", "nvfp4", ["rowwise", "rowwise (torchao)"]], "none", "kind=training"],
    ["workload.fp8_param_gather", "FP8 parameter all-gather", "select", ON_OFF, "off", "kind=training"],
    ["workload.fp8_dot_product_attention", "FP8 attention (Megatron)", "select", ON_OFF, "off", "kind=training"],
    ["workload.fp8_dpa_backward", "FP8 attention backward (NVTE_FP8_DPA_BWD)", "select", ON_OFF, "on", "kind=training"],
    ["workload.fp8_precompute_scale", "FP8 scales precomputed (torch FSDP2)", "select", ON_OFF, "off", "kind=training"],
    ["workload.activation_func_fp8_input_store", "SwiGLU input saved in fp8", "select", ON_OFF, "off (Megatron)", "kind=training"],
  ]],
  ["Overlap", [
    ["options.overlap.tp_comm_overlap", "TP comm overlap", "select", ON_OFF, "off (Megatron)"],
    ["options.overlap.overlap_grad_reduce", "Overlap grad reduce", "select", ON_OFF, "off (Megatron)", "kind=training"],
    ["options.overlap.overlap_param_gather", "Overlap param gather", "select", ON_OFF, "off (Megatron)", "kind=training"],
    ["options.overlap.overlap_p2p", "Overlap PP sends", "select", ON_OFF, "interleaved only (Megatron)"],
    ["options.overlap.fsdp_prefetch", "FSDP / ZeRO-3 prefetch", "select", ON_OFF, "on", "kind=training"],
    ["options.overlap.cp_ring_overlap", "CP ring overlap", "select", ON_OFF, "on"],
    ["options.overlap.overlap_moe_expert_parallel_comm", "EP all-to-all overlap", "select", ON_OFF, "off (DualPipe: on)", "kind=training"],
    ["options.overlap.moe_shared_expert_overlap", "Shared-expert overlap", "select", ON_OFF, "off"],
  ]],
  ["MoE dispatch and CP", [
    ["parallel.ep_dispatch", "Token dispatcher", "select", [["alltoall", "all-to-all"], ["allgather", "all-gather"], ["deepep", "DeepEP"], ["hybridep", "HybridEP"], ["deepep_ll", "DeepEP low-latency"]], "all-to-all"],
    ["parallel.expert_tp", "Expert TP", "int", null, "TP (Megatron), 1 (others)"],
    ["parallel.cp_comm", "CP communication", "select", [["p2p", "p2p (ring attention)"], ["all_gather", "all-gather"], ["a2a", "all-to-all (Ulysses)"]], "p2p"],
    ["parallel.cp_rotate_method", "CP K/V rotation (torch)", "select", [["allgather", "all-gather"], ["alltoall", "all-to-all (sends)"]], "all-gather"],
    ["parallel.cp_load_balance", "CP load balancing (torch)", "select", ON_OFF, "on"],
  ]],
  ["Pipeline split", [
    ["parallel.pipeline_split_points", "Split points (torch)", "list", "e.g. 8,16,24", "even split"],
    ["parallel.account_for_embedding_in_pipeline_split", "Embedding counts as a layer", "select", ON_OFF, "off"],
    ["parallel.account_for_loss_in_pipeline_split", "Loss counts as a layer", "select", ON_OFF, "off"],
  ]],
  ["Recompute", [
    ["workload.recompute_method", "Method (full)", "select", ["uniform", "block"], "uniform", "kind=training"],
    ["workload.recompute_num_layers", "Layers (full)", "int", null, "1", "kind=training"],
    ["workload.recompute_modules", "Modules (selective)", "modules", ["core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts"], "core_attn", "kind=training"],
    ["workload.cpu_offloading_num_layers", "CPU-offloaded layers", "int", null, "0", "kind=training"],
    ["workload.selective_ac_option", "torch selective AC", "text", "op or N", "none", "kind=training"],
  ]],
  ["Kernels", [
    ["workload.attention_kernel", "Attention kernel", "select", ["flash", "flash2", "flash3", "cudnn", "unfused"], "the framework's fused kernel"],
    ["workload.cuda_graphs", "CUDA graphs", "select", ON_OFF, "off"],
    ["workload.cuda_graph_scope", "TE graphs of an MoE layer (Megatron)", "modules", ["moe_router", "moe_preprocess"], "none", "kind=training"],
    ["workload.torch_compile", "torch.compile", "select", ON_OFF, "off"],
    ["workload.grad_accumulation_fusion", "Grad-accumulation fusion", "select", ON_OFF, "the framework's (Megatron: on)", "kind=training"],
    ["workload.cross_entropy_fusion", "Cross-entropy fusion", "select", ON_OFF, "the framework's (Megatron: off)", "kind=training"],
    ["workload.loss_parallel", "Loss parallel (torch)", "select", ON_OFF, "off (torchtitan: on with TP)", "kind=training"],
    ["workload.norm_kernel", "Norm kernel", "select", [["fused", "fused"], ["ops", "op chain (eager torch)"], ["apex", "apex non-persistent LayerNorm (Megatron-LM 2021)"]], "fused"],
    ["workload.optimizer_implementation", "AdamW (torch)", "select", ["fused", "foreach"], "fused", "kind=training"],
    ["workload.fused_grouped_mlp", "Fused grouped MLP (MXFP8 MoE)", "select", ON_OFF, "off (per-expert GEMMs)", "kind=training"],
    ["workload.scale_swizzle", "MXFP8/NVFP4 scale swizzle", "select", [["quantize", "in the quantizer (TE 2.18)"], ["gemm", "at each GEMM (TE 2.9)"]], "quantize", "kind=training"],
    ["workload.userbuffers_proj_fprop", "TP overlap: proj forward", "select", [["pipeline", "pipeline (TE default)"], ["ring_exchange", "ring exchange"]], "pipeline", "kind=training"],
    ["workload.userbuffers_fc2_fprop", "TP overlap: fc2 forward", "select", [["pipeline", "pipeline (TE default)"], ["ring_exchange", "ring exchange"]], "pipeline", "kind=training"],
    ["workload.attention_mask_in_dataloader", "Mask from the loader", "select", ON_OFF, "on (Megatron)", "kind=training"],
    ["workload.document_lengths", "Packed documents (lengths)", "list", "e.g. 4096,2048,2048", "one a sequence", "kind=training"],
    ["workload.document_packing", "Document packing", "select", [["dp_balanced", "dp_balanced (Megatron scheduler)"]], "every sequence alike", "kind=training"],
  ]],
  ["Data parallel", [
    ["parallel.hybrid_shard_size", "Hybrid shard size", "int", null, "none"],
    ["parallel.dp_bucket_bytes", "DP bucket bytes", "int", null, "the framework's"],
    ["parallel.order", "Rank order", "text", "tp-cp-ep-dp-pp", "tp-cp-ep-dp-pp"],
  ]],
  ["NCCL and pricing", [
    ["cluster.nccl_version", "NCCL version", "select", NCCL_VERSIONS, "2.30"],
    ["options.nccl_algo", "NCCL_ALGO pin", "text", "e.g. Ring or ^NVLS", "auto"],
    ["options.nccl_proto", "NCCL_PROTO pin", "text", "e.g. Simple", "auto"],
    ["options.pricing", "Pricing", "select", [["library", "library (NCCL's model)"], ["schedule", "schedule (step by step)"]], "auto"],
    ["options.candidates", "Candidates", "select", [["library", "what the library picks from"], ["all", "every algorithm"]], "library"],
    ["options.contention", "Contention", "select", [["neighbourhood", "neighbourhood"], ["full", "every group"]], "neighbourhood"],
    ["cluster.nccl_env.NCCL_MIN_NCHANNELS", "NCCL_MIN_NCHANNELS", "int", null, "NCCL's"],
    ["cluster.nccl_env.NCCL_MAX_NCHANNELS", "NCCL_MAX_NCHANNELS", "int", null, "NCCL's"],
    ["cluster.nccl_env.NCCL_NVLS_ENABLE", "NCCL_NVLS_ENABLE", "select", [["0", "0 (off)"], ["1", "1 (on)"], ["2", "2 (auto)"]], "2 (auto)"],
    ["cluster.nccl_env.NCCL_COLLNET_ENABLE", "NCCL_COLLNET_ENABLE", "select", [["0", "0 (off)"], ["1", "1 (SHARP)"]], "0"],
  ]],
  ["Cluster: GPU", [
    ["cluster.gpu.preset", "GPU", "text", "e.g. h200-sxm-141gb", "the preset's"],
    ["cluster.gpu.power_limit_w", "Power limit (W)", "float", null, "the TDP"],
    ["cluster.gpu.variability", "GPU-to-GPU spread (sigma, 0 = off)", "float", null, "0.0148 (Sinha et al. SC'22)"],
    ["cluster.gpu.name", "Name (custom GPU)", "text", "custom", "the GPU's"],
    ["cluster.gpu.peak_tflops.bf16", "bf16 dense TFLOP/s", "float", null, "the GPU's"],
    ["cluster.gpu.peak_tflops.fp8", "fp8 dense TFLOP/s", "float", null, "the GPU's"],
    ["cluster.gpu.hbm_bytes", "HBM bytes", "int", null, "the GPU's"],
    ["cluster.gpu.hbm_GBps", "HBM GB/s", "float", null, "the GPU's"],
    ["cluster.gpu.sm", "Compute capability × 10", "int", null, "the GPU's"],
    ["cluster.gpu.sms", "SMs", "int", null, "the GPU's"],
    ["cluster.gpu.nvlink_links", "NVLink links", "int", null, "the GPU's"],
    ["cluster.gpu.tdp_w", "TDP (W)", "float", null, "the GPU's"],
    ["cluster.gpu.min_power_w", "Lowest power limit (W)", "float", null, "the GPU's"],
  ]],
  ["Cluster: links and network", [
    ["cluster.name", "Cluster name", "text", "e.g. my-cluster", "the preset's"],
    ["cluster.intra.fabric", "Intra-node fabric", "text", "switch, full_mesh, ring", "the preset's"],
    ["cluster.intra.latency_s", "Intra-node latency (s)", "float", null, "the preset's"],
    ["cluster.intra.in_network_reduction", "NVLink SHARP (NVLS)", "select", ON_OFF, "the preset's"],
    ["cluster.intra.link_name", "Intra-node link name", "text", "e.g. nvlink", "the preset's"],
    ["cluster.nic_latency_s", "NIC latency (s)", "float", null, "the preset's"],
    ["cluster.pcie_bandwidth_GBps", "PCIe GB/s (host link)", "float", null, "the preset's"],
    ["cluster.cpu_vendor", "CPU vendor", "select", CPU_VENDORS, "the preset's"],
    ["cluster.network.topology", "Network", "text", "fat_tree, torus, dragonfly, hypercube", "the preset's"],
    ["cluster.network.kind", "Network kind", "select", NETWORK_KINDS, "the preset's"],
    ["cluster.network.nodes_per_leaf", "Nodes per leaf", "int", null, "the preset's"],
    ["cluster.network.num_spines", "Spines", "int", null, "the preset's"],
    ["cluster.network.link_bandwidth_GBps", "Switch link GB/s", "float", null, "the preset's"],
    ["cluster.network.switch_latency_s", "Switch latency (s)", "float", null, "the preset's"],
    ["cluster.network.in_network_reduction", "SHARP in the switches", "select", ON_OFF, "the preset's"],
    ["cluster.network.dims", "Torus dimensions", "list", "e.g. 4,4,4", "the preset's"],
    ["cluster.network.group_size", "Dragonfly group size", "int", null, "the preset's"],
  ]],
];
export const CONTROLS = GROUPS.flatMap(([, rows]) => rows.map(([path, label, kind, choices, dflt, when]) => ({ path, label, kind, choices, dflt, when, id: idOf(path) })));

function idOf(path) { return `f-${path.split(".").slice(1).join("-").replace(/_/g, "-")}`; }
const pairs = (choices) => choices.map((c) => (Array.isArray(c) ? c : [c, c]));

// the controls, into #more-settings (index.html)
export function buildControls() {
  $("more-settings").replaceChildren(...GROUPS.map(([title, rows]) => el("details", { className: "group" },
    el("summary", {}, title, " ", el("span", { className: "set-count", "data-group": title })),
    el("div", { className: "grid2" }, rows.map(([path]) => control(CONTROLS.find((c) => c.path === path)))))));
}

function control(c) {
  const label = el("label", { htmlFor: c.id }, c.label);
  let input;
  if (c.kind === "select") {
    input = el("select", { id: c.id }, el("option", { value: "" }, `default (${c.dflt})`), pairs(c.choices).map(([v, t]) => el("option", { value: v }, t)));
  } else if (c.kind === "modules") {
    input = el("select", { id: c.id, multiple: true, size: 4, title: "Ctrl/Cmd-click to pick several; none: the default" },
      c.choices.map((m) => el("option", { value: m }, m)));
  } else {
    const number = c.kind === "int" || c.kind === "float";
    input = el("input", { id: c.id, type: number ? "number" : "text", min: number ? "0" : undefined, step: c.kind === "float" ? "any" : undefined,
      inputMode: c.kind === "int" ? "numeric" : c.kind === "float" ? "decimal" : undefined, maxLength: c.kind === "text" ? 64 : undefined,
      placeholder: number ? `default: ${c.dflt}` : `${c.choices} (default: ${c.dflt})` });
  }
  return el("div", { className: c.kind === "modules" ? "field span2" : "field", "data-when": c.when }, label, input);
}

export const get = (obj, path) => path.split(".").reduce((o, k) => (o && typeof o === "object" ? o[k] : undefined), obj);
function set(obj, path, value) {
  const keys = path.split("."), last = keys.pop();
  let o = obj;
  for (const k of keys) { if (!o[k] || typeof o[k] !== "object") o[k] = {}; o = o[k]; }
  o[last] = value;
}

// the request's fields from the controls; a hidden control (another workload kind) adds nothing
export function readControls(request, FormError) {
  for (const c of CONTROLS) {
    const input = $(c.id);
    if (input.closest("[hidden]")) continue;
    let value;
    if (c.kind === "modules") { const picked = [...input.selectedOptions].map((o) => o.value); value = picked.length ? picked : undefined; }
    else if (input.value.trim() === "") value = undefined;
    else if (c.kind === "int" || c.kind === "float" || c.path.startsWith("cluster.nccl_env.")) value = Number(input.value);
    else if (c.kind === "list") value = layerList(input.value, c.path, c.label, FormError);
    else if (c.choices === ON_OFF) value = onOff(input.value);
    else value = input.value.trim();
    if (value !== undefined) set(request, c.path, value);
  }
  return request;
}

export function fillControls(request) {
  for (const c of CONTROLS) {
    const input = $(c.id), v = get(request, c.path);
    if (c.kind === "modules") { pickModules(input, v); continue; }
    fillInput(input, v);
  }
  countSet();
}

// a module list's choices from a request: a module the list does not offer (a link may name one) is added, as text,
// and picked, so the server names it in its 422 (it was dropped, and the default modules were planned instead)
function pickModules(input, v) {
  const want = Array.isArray(v) ? v.map(String) : [];
  for (const m of want) if (![...input.options].some((o) => o.value === m)) input.append(el("option", { value: m }, m));
  for (const o of input.options) o.selected = want.includes(o.value);
}

// a list field's text as whole layer numbers, or a FormError naming the field
export function layerList(text, path, label, FormError) {
  const parts = text.split(/[\s,]+/).filter(Boolean).map(Number);
  if (parts.some((x) => !Number.isInteger(x))) throw new FormError(path, `${label}: whole layer numbers separated by commas, got "${text}"`);
  return parts;
}

// a request's value into its input: a list as "a,b", none as blank; a select given a value it does not list
// gains that option (a link or a search hit may name one)
export function fillInput(input, v) {
  const text = v === undefined || v === null ? "" : Array.isArray(v) ? v.join(",") : String(v);
  if (input.tagName === "SELECT" && text && ![...input.options].some((o) => o.value === text)) input.append(el("option", { value: text }, text));
  input.value = text;
}

// a group's "(n set)" badge
export function showSetCount(badge, n) { if (badge) badge.textContent = n ? `(${n} set)` : ""; }

// per group, how many of its fields the request sets (the summary says so when the group is closed)
export function countSet() {
  for (const [title, rows] of GROUPS) {
    const n = rows.filter(([path]) => { const i = $(idOf(path)); return i.multiple ? i.selectedOptions.length > 0 : i.value.trim() !== ""; }).length;
    showSetCount(document.querySelector(`[data-group="${title}"]`), n);
  }
}

// a cluster field's value in the plan's own cluster block (the cluster as resolved), in the page's units
function clusterValue(cluster, path) {
  const v = cluster && path.startsWith("cluster.") ? get(cluster, path.slice(8)) : undefined;
  if (v === undefined || v === null || (typeof v === "object" && !Array.isArray(v))) return undefined;
  if (typeof v === "boolean") return v ? "on" : "off";
  if (Array.isArray(v)) return v.length ? v.join(",") : "none";
  if (typeof v === "number" && path.endsWith("_s")) return fmtTime(v);
  if (typeof v === "number" && path.endsWith("GBps")) return fmtBw(v);
  return typeof v === "number" ? v.toLocaleString("en-US", { maximumFractionDigits: 3 }) : String(v);
}

// after a plan: each default choice names the value the plan resolved (assumptions; for the cluster, its block
// in the answer), not the schema's text
export function showResolvedDefaults(assumptions, cluster) {
  const byField = Object.fromEntries((assumptions || []).map((a) => [a.field, a]));
  for (const c of CONTROLS) {
    const value = clusterValue(cluster, c.path);
    const a = byField[c.path] || (value !== undefined ? { value, source: "the cluster as planned (its preset's unless set)" } : null);
    const input = $(c.id);
    const shown = a ? (c.choices === ON_OFF ? a.value : labelOf(c, a.value)) : c.dflt;
    if (c.kind === "select") input.options[0].textContent = `default (${shown})`;
    else if (c.kind !== "modules") input.placeholder = c.kind === "int" || c.kind === "float" ? `default: ${shown}` : `${c.choices} (default: ${shown})`;
    input.title = a ? `default: ${a.value}, ${a.source}` : `default: ${c.dflt}`;
  }
  // the layout box (the form's own) shows the split the plan resolved, in its own syntax, when left blank
  const split = byField["parallel.pipeline_layout"];
  $("pipeline-layout").placeholder = split ? `planned: ${split.value}` : "E|(t|)*126,L";
}

function labelOf(c, value) {
  const hit = c.kind === "select" ? pairs(c.choices).find(([v]) => v === value) : null;
  return hit ? hit[1] : value;
}

// request path -> control id, for the 422 marks (form.js FIELDS)
export const CONTROL_FIELDS = Object.fromEntries(CONTROLS.map((c) => [c.path, c.id]));
