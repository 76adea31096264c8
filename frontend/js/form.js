// The configuration form <-> a POST /v1/plan request, scenarios, and 422 messages marked on their inputs.
import { ApiError, call } from "./api.js";
import { $, bareLabel, el, options } from "./dom.js";
import { showActiveCalibration } from "./calibrate.js";
import { buildControls, CONTROL_FIELDS, fillControls, readControls } from "./controls.js";
import { buildModelFields, fillModelFields, MODEL_FIELDS, modelSource, readModelFields } from "./model.js";
import { budgetParts, plainLimits } from "./refusals.js";
import { state } from "./state.js";

export const SCENARIOS = [
  { id: "llama70b-h100", label: "Llama-3 70B on 64 DGX H100 nodes, TP8 PP4 DP16, ZeRO-1",
    request: { model: { preset: "llama3-70b" }, workload: { kind: "training", micro_batch_size: 1, global_batch_size: 1024 },
      parallel: { tp: 8, pp: 4, dp: 16, zero_stage: 1, sequence_parallel: true }, cluster: { preset: "dgx-h100", num_nodes: 64 } } },
  // 405B interleaved as Meta ran it peaks at 88.7 GB of 85.5 here without recompute (MFU 45.5%); full recompute
  // fits in 25.3 GB at 34.6%. Recomputing the MLP alone (Megatron --recompute-modules mlp, the selective
  // granularity) peaks at 46.8 GB, MFU 37.4% against the paper's 38-43% (Dubey et al. 2024 §3.3). The paper
  // does not say what it recomputed: this is a light recompute that fits, not a published setting.
  { id: "llama405b-16k", label: "Llama-3 405B on 2,048 DGX H100 nodes, TP8 PP16 DP128, interleaved as Meta ran it, ZeRO-1, MLP recomputed",
    request: { model: { preset: "llama3-405b" }, workload: { kind: "training", micro_batch_size: 1, global_batch_size: 2048, activation_recompute: "selective", recompute_modules: ["mlp"] },
      parallel: { tp: 8, pp: 16, dp: 128, zero_stage: 1, sequence_parallel: true, pipeline_schedule: "interleaved", pipeline_layout: "E|(t|)*126,L" },
      cluster: { preset: "dgx-h100", num_nodes: 2048 } } },
  // every scenario fits in memory as shipped (tests/frontend/test_page.py::test_every_scenario_fits).
  // DeepSeek-V3: TP2 with SP, PP16, EP64 as Megatron-Bridge's DeepSeek-V3 recipe (TP2 EP64): peak 66.4 GB of 85.5;
  // the paper's TP1 PP16 EP64 needs 126 GB here (BF16 activations; no FP8 or partial recompute modelled)
  { id: "dsv3", label: "DeepSeek-V3 on 256 DGX H100 nodes, TP2 PP16 EP64, ZeRO-1",
    request: { model: { preset: "deepseek-v3" }, workload: { kind: "training", micro_batch_size: 1, global_batch_size: 15360 },
      parallel: { tp: 2, pp: 16, dp: 64, ep: 64, zero_stage: 1, sequence_parallel: true, first_stage_layers: 3, last_stage_layers: 2 },
      cluster: { preset: "dgx-h100", num_nodes: 256 } } },
  // Mixtral on 64 GB NPUs: TP2 with SP inside a board halves the dense part and the activations, peak 56.6 GB of 64
  // (TP1 EP8 DP32: 94.4)
  { id: "mixtral-npu", label: "Mixtral 8x7B on four 8-NPU full-mesh boards, TP2 EP8, ZeRO-1",
    request: { model: { preset: "mixtral-8x7b" }, workload: { kind: "training", micro_batch_size: 1, global_batch_size: 256 },
      parallel: { tp: 2, pp: 1, dp: 16, ep: 8, zero_stage: 1, sequence_parallel: true }, cluster: { preset: "npu-mesh-8", num_nodes: 4 } } },
  // FSDP2: one sequence per GPU per micro-batch as torchtitan's llama3_8b.toml (local_batch_size 1), peak 54.2 GB of
  // 85.9 (micro-batch 2: 95.0)
  { id: "fsdp-a100", label: "Llama-3 8B with FSDP2 on 2 DGX A100 nodes (PyTorch), micro-batch 1",
    request: { model: { preset: "llama3-8b" }, workload: { kind: "training", micro_batch_size: 1, global_batch_size: 64 },
      parallel: { tp: 1, pp: 1, dp: 16, zero_stage: 3, framework: "torch" }, cluster: { preset: "dgx-a100", num_nodes: 2 } } },
  { id: "decode", label: "Llama-3 70B decode, TP8, 64 sequences on one DGX H100",
    request: { model: { preset: "llama3-70b" }, workload: { kind: "inference", phase: "decode", batch_size: 64, context_length: 8192 },
      parallel: { tp: 8, pp: 1, dp: 1 }, cluster: { preset: "dgx-h100", num_nodes: 1 } } },
  { id: "gpt3-a100", label: "GPT-3 175B on 128 DGX A100 nodes, TP8 PP8 DP16",
    request: { model: { preset: "gpt3-175b" }, workload: { kind: "training", micro_batch_size: 1, global_batch_size: 1536 },
      parallel: { tp: 8, pp: 8, dp: 16, zero_stage: 1, sequence_parallel: true }, cluster: { preset: "dgx-a100", num_nodes: 128 } } },
];

// request field -> form control, so 422 messages mark the right input
export const FIELDS = {
  "model.preset": "model-preset", "model.hf_config": "hf-config", "model.seq_length": "seq-length", "workload.seq_length": "seq-length",
  "workload.kind": "kind", "workload.micro_batch_size": "micro-batch", "workload.global_batch_size": "global-batch",
  "workload.activation_recompute": "recompute", "workload.phase": "phase", "workload.batch_size": "batch-size",
  "workload.context_length": "context-length", "parallel.tp": "tp", "parallel.pp": "pp", "parallel.dp": "dp",
  "parallel.cp": "cp", "parallel.ep": "ep", "parallel.zero_stage": "zero", "parallel.sequence_parallel": "sp",
  "parallel.pipeline_schedule": "schedule", "parallel.virtual_pipeline_stages": "vpp", "parallel.framework": "framework",
  "parallel.first_stage_layers": "first-layers", "parallel.last_stage_layers": "last-layers", "parallel": "tp",
  "parallel.pipeline_layout": "pipeline-layout",
  "cluster.preset": "cluster-preset", "cluster.num_nodes": "nodes", "cluster.intra.bandwidth_GBps": "intra-bw",
  "cluster.nics_per_node": "nics", "cluster.nic_bandwidth_GBps": "nic-bw", "cluster.network.oversubscription": "oversub",
  "cluster.network.rail_optimized": "rail",
  "cluster.devices_per_node": "dpn", "options.algorithm": "algorithm", "cluster.calibration": "calib-clear", ...CONTROL_FIELDS,
  ...MODEL_FIELDS,
};
const LABELS = { tp: "TP", pp: "PP", dp: "DP", cp: "CP", ep: "EP", nodes: "Nodes", dpn: "Devices per node", "cluster-preset": "Cluster preset" };

const num = (id) => { const v = $(id).value.trim(); return v === "" ? undefined : Number(v); };
const put = (obj, key, value) => { if (value !== undefined && value !== "" && !Number.isNaN(value)) obj[key] = value; };

export class FormError extends Error {
  constructor(field, msg) { super(msg); this.field = field; }
}

export function readForm() {
  const model = {}, source = modelSource();
  if (source === "hf") {
    model.hf_config = readConfigJson($("hf-config").value);
  } else if (source === "preset") model.preset = $("model-preset").value;
  put(model, "seq_length", num("seq-length"));
  readModelFields(model, FormError);
  const workload = { kind: $("kind").value };
  if (workload.kind === "training") {
    put(workload, "micro_batch_size", num("micro-batch")); put(workload, "global_batch_size", num("global-batch"));
    workload.activation_recompute = $("recompute").value;
  } else {
    workload.phase = $("phase").value; put(workload, "batch_size", num("batch-size")); put(workload, "context_length", num("context-length"));
  }
  const parallel = { zero_stage: Number($("zero").value), sequence_parallel: $("sp").checked,
    pipeline_schedule: $("schedule").value, framework: $("framework").value };
  for (const [key, id] of [["tp", "tp"], ["pp", "pp"], ["dp", "dp"], ["cp", "cp"], ["ep", "ep"], ["virtual_pipeline_stages", "vpp"],
    ["first_stage_layers", "first-layers"], ["last_stage_layers", "last-layers"]]) put(parallel, key, num(id));
  if ($("pipeline-layout").value.trim()) parallel.pipeline_layout = $("pipeline-layout").value.trim();
  const cluster = { preset: $("cluster-preset").value };
  put(cluster, "num_nodes", num("nodes"));
  put(cluster, "devices_per_node", num("dpn"));
  const base = state.presets.clusters[cluster.preset];
  if (num("intra-bw") !== undefined) cluster.intra = { bandwidth_GBps: num("intra-bw") };
  put(cluster, "nics_per_node", num("nics")); put(cluster, "nic_bandwidth_GBps", num("nic-bw"));
  const network = {};
  put(network, "oversubscription", num("oversub"));
  if (base && base.network && base.network.rail_optimized !== $("rail").checked) network.rail_optimized = $("rail").checked;
  if (Object.keys(network).length) cluster.network = network;
  if (state.calibration) cluster.calibration = state.calibration;
  // 24 links: enough to colour a node's GPU links and NICs in the topology view
  return readControls({ model, workload, parallel, cluster, options: { algorithm: $("algorithm").value, links_per_call: 24 } }, FormError);
}

// A pasted config.json (round 15): a file saved with a byte-order mark (U+FEFF, as Windows editors write it) was "not
// valid JSON: Unexpected token '\ufeff'", the mark invisible in the box; a number JSON.parse takes past float64
// (1e400) became Infinity and was sent as null, so "hidden_size": 1e400 read "required field is missing (or null)"
// and a value the server ignores was dropped unsaid. The mark is skipped; a number out of range is refused by name.
function readConfigJson(text) {
  let config;
  try { config = JSON.parse(text.replace(/^\ufeff/, "") || "{}"); } catch (e) { throw new FormError("model.hf_config", `config.json is not valid JSON: ${e.message}`); }
  const bad = [];
  const walk = (v, path) => {
    if (typeof v === "number" && !Number.isFinite(v)) bad.push(path);
    else if (v && typeof v === "object") for (const [k, x] of Object.entries(v)) walk(x, path ? `${path}.${k}` : k);
  };
  walk(config, "");
  if (bad.length) throw new FormError("model.hf_config", `config.json's ${bad.join(", ")} ${bad.length > 1 ? "are numbers" : "is a number"} too large in magnitude for a 64-bit float: not a value a config can mean`);
  return config;
}

const str = (v, d = "") => (v === undefined || v === null ? d : String(v));

// Megatron's layer names of a list-of-lists layout as its string's characters: a copy of planner/parallel.py
// LAYER_CHARS, the one home of the syntax (parse_layout reads it, format_layout writes it; the page cannot import it;
// megatron/core/transformer/pipeline_parallel_layer_layout.py): [["embedding"], ["decoder", "loss"]] is "E|tL" (each
// name was glued whole: "embedding|decoderloss"); a name it does not know stays as given, for the server's 422
const LAYER_CHAR = { embedding: "E", decoder: "t", mtp: "m", loss: "L" };
function layoutText(layout) {
  if (typeof layout === "string") return layout;
  if (!Array.isArray(layout)) return "";
  const char = (x) => LAYER_CHAR[String(x).trim().toLowerCase()] || String(x).trim();
  return layout.map((st) => (Array.isArray(st) ? st.map(char).join("") : "")).join("|");
}

// the constants a request is priced with (its cluster.calibration), or null: what a link or a loaded result carries
export function calibrationOf(req) {
  const c = req && typeof req === "object" && req.cluster && typeof req.cluster === "object" ? req.cluster : {};
  return c.calibration && typeof c.calibration === "object" ? c.calibration : null;
}

export function fillForm(req) {
  lastProduct = "dp";  // the edits before it are not this form's
  const obj = (v) => (v && typeof v === "object" ? v : {});
  const m = obj(req.model), w = obj(req.workload), p = obj(req.parallel), c = obj(req.cluster);
  // a model block with neither a preset nor a config.json is the fields alone (an empty one keeps the preset)
  const source = m.hf_config ? "hf" : m.preset || !Object.keys(m).some((k) => k !== "seq_length") ? "preset" : "fields";
  for (const s of ["preset", "hf", "fields"]) $(`model-source-${s}`).checked = s === source;
  if (m.preset) setSelect("model-preset", m.preset);
  $("hf-config").value = m.hf_config ? JSON.stringify(m.hf_config, null, 1) : "";
  fillModelFields(m);
  $("seq-length").value = str(w.seq_length ?? m.seq_length);
  $("kind").value = w.kind === "inference" ? "inference" : "training";
  $("micro-batch").value = str(w.micro_batch_size, "1"); $("global-batch").value = str(w.global_batch_size, "1024");
  setSelect("recompute", w.activation_recompute || "none"); setSelect("phase", w.phase || "prefill");
  $("batch-size").value = str(w.batch_size, "64"); $("context-length").value = str(w.context_length);
  for (const [key, id, dflt] of [["tp", "tp", "1"], ["pp", "pp", "1"], ["dp", "dp", ""], ["cp", "cp", "1"], ["ep", "ep", "1"],
    ["virtual_pipeline_stages", "vpp", "1"], ["first_stage_layers", "first-layers", ""], ["last_stage_layers", "last-layers", ""]]) $(id).value = str(p[key], dflt);
  $("pipeline-layout").value = layoutText(p.pipeline_layout);
  setSelect("zero", String(p.zero_stage ?? 0)); $("sp").checked = !!p.sequence_parallel;
  setSelect("schedule", p.pipeline_schedule || "1f1b"); setSelect("framework", p.framework || "megatron");
  if (c.preset) setSelect("cluster-preset", c.preset);
  $("nodes").value = str(c.num_nodes, "1"); $("dpn").value = str(c.devices_per_node);
  $("cluster-switch-note").textContent = ""; lastCluster = $("cluster-preset").value; rounded = null;
  $("intra-bw").value = str(obj(c.intra).bandwidth_GBps); $("nics").value = str(c.nics_per_node); $("nic-bw").value = str(c.nic_bandwidth_GBps);
  $("oversub").value = str(obj(c.network).oversubscription);
  // no input shows the constants (the calibration card says them), but a link or a result loaded here keeps them
  state.calibration = calibrationOf(req);
  showActiveCalibration(state.calibration);
  const base = state.presets.clusters[$("cluster-preset").value];
  $("rail").checked = obj(c.network).rail_optimized ?? (base && base.network ? base.network.rail_optimized : true);
  setSelect("algorithm", obj(req.options).algorithm || "auto");
  // a GPU given by name alone ("gpu": "h200-sxm-141gb") is the GPU control's value
  fillControls(typeof c.gpu === "string" ? { ...req, cluster: { ...c, gpu: { preset: c.gpu } } } : req);
  syncVisibility();
}

// a value the select does not offer (say, a preset name from a pasted link) is added as an option, as text,
// so the server names it in its 422 instead of the page silently picking another
function setSelect(id, value) {
  const select = $(id), v = String(value);
  if (![...select.options].some((o) => o.value === v)) select.append(el("option", { value: v }, v));
  select.value = v;
}

// devices per node as the plan will use them: the override, else the preset's
export const devicesPerNode = (preset = $("cluster-preset").value) => num("dpn") || (state.presets.clusters[preset] || {}).devices_per_node || 1;

// a cluster switch keeps the device count where it can (64 DGX nodes are 512 GPUs, 7 GB200 NVL72 racks 504), and
// says so; the old count came from the preset switched away from, or, while the nodes box still holds what a
// rounding switch put there, the count before it: 512 DGX GPUs -> 7 NVL72 racks (504) -> back to DGX kept 504 (63
// nodes), and the layout that ran on 512 was refused (round 13)
let lastCluster = null, rounded = null;  // rounded: {devices asked, nodes shown} after a switch that rounded
export function switchCluster() {
  const next = $("cluster-preset").value, before = lastCluster;
  lastCluster = next;
  if (!before || before === next || num("dpn")) return;
  const old = (state.presets.clusters[before] || {}).devices_per_node || 1, per = devicesPerNode(next);
  const devices = rounded && rounded.nodes === num("nodes") ? rounded.devices : (num("nodes") || 1) * old;
  const nodes = Math.max(1, Math.round(devices / per));
  rounded = nodes * per === devices ? null : { devices, nodes };
  $("nodes").value = String(nodes);
  $("cluster-switch-note").textContent = nodes * per === devices
    ? `Kept ${devices.toLocaleString("en-US")} devices: ${nodes.toLocaleString("en-US")} node${nodes > 1 ? "s" : ""} of ${per}.`
    : `${devices.toLocaleString("en-US")} devices are not a whole number of ${per}-device nodes: ${nodes.toLocaleString("en-US")} node${nodes > 1 ? "s" : ""} give ${(nodes * per).toLocaleString("en-US")}.`;
}

export function syncVisibility() {
  const source = modelSource(), values = { "model-source": source, kind: $("kind").value };
  for (const node of document.querySelectorAll("[data-when]")) {
    const [key, value] = node.dataset.when.split("=");
    node.hidden = values[key] !== value;
  }
  const model = state.presets.models[$("model-preset").value];
  $("model-facts").textContent = model && source === "preset"
    ? `${model.num_layers} layers, hidden ${model.hidden_size}, ${model.num_attention_heads} heads / ${model.num_kv_heads || model.num_attention_heads} KV, `
      + `${(model.params_total / 1e9).toFixed(1)}B parameters${model.moe ? ` (${(model.params_active / 1e9).toFixed(1)}B active)` : ""}`
    : source === "hf" ? readFacts("config.json") : source === "fields" ? readFacts("the fields") : "";
  const cluster = state.presets.clusters[$("cluster-preset").value], per = devicesPerNode(), nodes = num("nodes") || 1;
  $("cluster-facts").textContent = cluster ? `${per} device${per > 1 ? "s" : ""} per node${cluster.device ? ` (${cluster.device})` : ""} × `
    + `${nodes.toLocaleString("en-US")} node${nodes > 1 ? "s" : ""} = ${(per * nodes).toLocaleString("en-US")} devices` : "";
}

// what the server read from the pasted config.json or the fields alone (the plan's model.* assumptions,
// planner/assumptions.py)
// The facts are the last plan's, so they stand only for the model on show: after a refused config.json they gave the
// last planned one's layers and experts (Kimi K2's 61 and 384 under GLM-4.5's text) beside the refused one's
// max_position_embeddings (round 14)
function readFacts(what) {
  const plan = state.plan, rows = plan && plan.assumptions, planned = state.planned;
  let shown = null;
  try { shown = readForm().model; } catch { /* a config.json that does not parse: the error box says so */ }
  if (!rows || !planned || planned.model.preset) return "Read when planned: layers, width and parameters appear here.";
  if (JSON.stringify(shown) !== JSON.stringify(planned.model)) {
    return state.stale === "invalid" ? `Not read: nothing was planned with ${what === "config.json" ? "this config.json" : "these fields"} (the message above says why).`
      : "Read when planned: layers, width and parameters appear here.";
  }
  const v = Object.fromEntries(rows.filter((a) => a.field.startsWith("model.")).map((a) => [a.field.slice(6), a.value]));
  const n = (x) => Number(x).toLocaleString("en-US");
  return `Read from ${what}: ${n(v.num_layers)} layers, hidden ${n(v.hidden_size)}, ${n(v.num_attention_heads)} heads / ${n(v.num_kv_heads)} KV, `
    + `FFN ${n(v.ffn_hidden_size)}, vocabulary ${n(v.vocab_size)}${v["moe.num_experts"] ? `, ${n(v["moe.num_experts"])} experts (top ${n(v["moe.top_k"])})` : ""}, `
    + `${(plan.params_total / 1e9).toFixed(2)}B parameters, ${n(v.seq_length)} tokens a sequence${positions(v.seq_length)}.`;
}

// a long-context config.json planned at fewer tokens than it advertises (planner/presets.py from_hf_config caps
// max_position_embeddings): the facts said nothing of the sequence, and Assumptions named config.json as the source
// of its 8,192 where the file says 131,072 (round 13)
function positions(seq) {
  const planned = state.planned, hf = planned.model.hf_config || {}, text = hf.text_config || hf;
  const max = Number(text.max_position_embeddings);
  return max > Number(seq) && !planned.model.seq_length && !(planned.workload || {}).seq_length
    ? ` (its max_position_embeddings is ${max.toLocaleString("en-US")}: set Sequence length to plan more)` : "";
}

export function fillPresets() {
  buildControls();
  options($("scenario"), [["", "— pick a scenario —"], ...SCENARIOS.map((s) => [s.id, s.label])]);
  options($("model-preset"), Object.entries(state.presets.models).map(([k, m]) => [k, m.name || k]));
  buildModelFields();
  options($("cluster-preset"), Object.entries(state.presets.clusters).map(([k, c]) => [k, k, c.description]));
  const algs = [...new Set(state.catalogue.map((c) => c.algorithm))].sort();
  options($("algorithm"), [["auto", "auto (fastest the library would pick)"], ...algs.map((a) => [a, a])]);
}

// ---- errors: at the top of the results (first screen at every width), each naming and marking its input ----
export function clearErrors() {
  $("form-errors").replaceChildren();
  $("form-errors").hidden = true;
  for (const node of document.querySelectorAll("[aria-invalid]")) node.removeAttribute("aria-invalid");
}

// the control of the product's either side changed last: "tp*cp*pp*dp = 8*2*4*16 = 1024 but the cluster has 512
// devices" (loc `parallel`) marked TP and said "Go to TP" after a change of CP (round 13); a factor, or the cluster's
// devices (Nodes, devices per node, the preset), so a change of Nodes marks Nodes, not the factor typed before it
// (review r13b #3). None since the form was filled (a scenario, a link, Back): DP, the box the first fix button sets
const PRODUCT = ["tp", "cp", "pp", "dp", "nodes", "dpn", "cluster-preset"];
let lastProduct = "dp";
export function noteEdit(target) { if (target && PRODUCT.includes(target.id)) lastProduct = target.id; }

// a 422 item as the page says it: the field's name, the message, the inputs it marks and the fixes it offers
function errorItem(d) {
  const path = (d.loc || []).filter((x) => x !== "body").join(".");
  const budget = overBudget(String(d.msg ?? ""), state.request);
  if (budget) return { name: "work budget", ...budget };
  const control = path === "parallel" ? lastProduct
    : FIELDS[path] || FIELDS[path.split(".").slice(0, 2).join(".")] || FIELDS[path.split(".")[0]];
  const input = control && $(control);
  // a blank box is left out of the request, so the rule names the default planned in its place ("global_batch_size 1
  // is not divisible by ...", "the cluster has 8 devices" for a Nodes box emptied): said (round 15). Not for a box
  // whose blank has its own meaning, said in its label's hint: DP "(blank: rest)" is planned as the devices left, not a
  // default (review r15d #4: "dp omitted, but ... (DP is blank: the default was planned)")
  const blank = input && input.tagName === "INPUT" && input.type !== "checkbox" && input.value.trim() === "" && !blankMeans(input)
    ? ` (${labelOf(input)} is blank: the default was planned)` : "";
  return { name: path || "request", msg: plainLimits(String(d.msg ?? "")) + blank, inputs: input ? [input] : [], fixes: suggestions(path, state.request) };
}

// a label's text without its hint ("DP (blank: rest)" is DP), and whether the hint gives the blank box a meaning
const labelOf = (input) => LABELS[input.id] || (input.labels && input.labels[0] ? bareLabel(input.labels[0]) : input.id);
const blankMeans = (input) => [...(input.labels || [])].some((l) => /\(blank: /.test(l.textContent));

// "Go to" a control under More settings: its folded groups are opened first (round 15: the button scrolled to a
// control inside a closed <details>, which showed nothing)
function goTo(input) {
  for (let d = input.closest("details"); d; d = d.parentElement && d.parentElement.closest("details")) d.open = true;
  input.scrollIntoView({ block: "center" }); input.focus();
}

export function showErrors(detail) {
  const items = detail.map((d) => {
    const { name, msg, inputs, fixes, lead = " Nearest valid: ", probe } = errorItem(d);
    for (const input of inputs) input.setAttribute("aria-invalid", "true");
    // each marked control its own "Go to" (review r15d #3: Contention marked beside Candidates, and only the first had one)
    const go = inputs.map((input) => el("button", { type: "button", className: "link", onclick: () => goTo(input) }, `Go to ${labelOf(input)}`));
    const buttons = fixes.map(([label, sets]) => el("button", { type: "button", className: "link fix",
      onclick: () => { for (const [id, value] of sets) $(id).value = String(value); $(sets[0][0]).dispatchEvent(new Event("input", { bubbles: true })); } }, label));
    const offer = buttons.length ? el("span", { className: "fixes", hidden: Boolean(probe) }, lead, buttons) : null;
    if (probe && offer) checkFix(probe, offer);
    return el("li", {}, el("strong", {}, name), ": ", msg, " ", ...go.flatMap((b) => [b, " "]), offer);
  });
  $("form-errors").replaceChildren(el("h2", {}, "This configuration cannot be planned"), el("ul", {}, items));
  $("form-errors").hidden = false;
}

// The service's work budget (app/limits.py refuse, loc ["body"]): "estimated work 19,088,108,752 units is over this
// service's budget of 134,217,728 (COMMPLAN_MAX_WORK); the largest part: dp.grad_norm (allreduce on 1 groups of 16384
// ranks, schedules), ... (docs/hardening.md ...: fewer ranks per group, contention 'neighbourhood' or candidates
// 'library' cost less)" read "request: ..." with nothing marked and the operator's setting named (round 15: Candidates
// "every algorithm" on Llama-3 405B's 16,384 GPUs). In words, the costly settings the request has marked, and their
// cheaper values (blank: the default) offered as fixes; with none of them set, fewer nodes.
const COSTLY = [["candidates", "all", "f-candidates", "Candidates: what the library picks from"],
  ["contention", "full", "f-contention", "Contention: neighbourhood"]];
function overBudget(msg, request) {
  const b = budgetParts(msg);
  if (!b) return null;
  const costly = COSTLY.filter(([key, value]) => request && request.options && request.options[key] === value);
  const inputs = costly.length ? costly.map(([, , id]) => $(id)) : [$("nodes")];
  // both set: one fix that resets both (review r15d #3: "Candidates ... or Contention: neighbourhood costs less" with a
  // button each, and Contention alone was refused again at 1,113,561,344 units of 1,116,827,070; the candidates are
  // the estimate's factor, planner/estimate.py price_estimate)
  const labels = costly.map(([, , , label]) => label);
  const cheaper = costly.length ? `${labels.join(" and ")} cost${costly.length > 1 ? "" : "s"} less.` : "Fewer ranks per group (fewer nodes) cost less.";
  const fixes = costly.length ? [[labels.join(" and "), costly.map(([, , id]) => [id, ""])]] : [];
  const probe = costly.length ? { ...request, options: Object.fromEntries(Object.entries(request.options).filter(([k]) => !costly.some(([key]) => key === k))) } : null;
  return { msg: `pricing this plan is an estimated ${b.units} units of work, over the ${b.budget} this server allows a request; `
    + `the largest part: ${b.part}. ${cheaper}`, inputs, fixes, lead: " Plan with: ", probe };
}

// a work-budget fix is offered once the API plans the request it makes, or refuses it for anything but the budget
// (review r15d #3: "Contention: neighbourhood" offered, and refused again at 1,113,561,344 units); still over: said,
// with the estimate the API answers, and no button
function checkFix(request, offer) {
  call("/v1/plan?summary=true", request).then(() => { offer.hidden = false; }, (err) => {
    const b = err instanceof ApiError && budgetParts(err.detail[0] && err.detail[0].msg);
    if (!b) { offer.hidden = err instanceof ApiError ? false : offer.hidden; return; }
    offer.replaceWith(` With that reset it is still ${b.units} units: fewer ranks per group (fewer nodes) cost less.`);
  });
}

// ---- divisibility errors offer the nearest valid values: [label, [[input id, value], ...]], from the request sent ----
const nearest = (x, ok, lo = 1, hi = 1 << 20) => {
  const out = [];
  for (let d = 1; d <= 4096 && out.length < 2; d++) {
    for (const v of [x - d, x + d]) if (v >= lo && v <= hi && ok(v) && !out.includes(v)) out.push(v);
  }
  return out.sort((a, b) => a - b).slice(0, 2);
};

export function suggestions(path, request) {
  if (!request || !request.parallel || !request.workload) return [];
  const p = request.parallel, w = request.workload, devices = (request.cluster.num_nodes || 1) * devicesPerNode();
  const tp = p.tp || 1, pp = p.pp || 1, cp = p.cp || 1, inner = tp * pp * cp;
  const dp = p.dp || (devices % inner === 0 ? devices / inner : null);
  if (path === "workload.global_batch_size" && dp) {
    const unit = (w.micro_batch_size || 1) * dp, gbs = w.global_batch_size || 1;
    return nearest(gbs, (v) => v % unit === 0, unit).map((v) => [`global batch ${v.toLocaleString("en-US")}`, [["global-batch", v]]]);
  }
  if (path === "workload.micro_batch_size" && dp) {
    return nearest(w.micro_batch_size || 1, (v) => (w.global_batch_size || 1) % (v * dp) === 0).map((v) => [`micro-batch ${v}`, [["micro-batch", v]]]);
  }
  // a fix that changes DP keeps the global batch a multiple of micro-batch x DP, or moves it to the nearest one with
  // it (round 14: "4 nodes, DP 9" on a GB200 form led to "global_batch_size 1024 is not divisible by ... 1*9 = 9")
  const mbs = w.micro_batch_size || 1, gbs = w.global_batch_size || 1;
  const batched = ([label, sets], d) => {
    if (w.kind !== "training" || gbs % (mbs * d) === 0) return [label, sets];
    const g = nearest(gbs, (v) => v % (mbs * d) === 0, mbs * d).sort((a, b) => Math.abs(a - gbs) - Math.abs(b - gbs))[0];
    return g ? [`${label}, global batch ${g.toLocaleString("en-US")}`, [...sets, ["global-batch", g]]] : [label, sets];
  };
  if (path === "parallel" && p.dp) {  // tp*cp*pp*dp is not the cluster's device count
    const out = [];
    if (devices % inner === 0) out.push(batched([`DP ${devices / inner}`, [["dp", devices / inner]]], devices / inner));
    const per = devicesPerNode(), want = inner * p.dp;
    if (want % per === 0) out.push([`${want / per} nodes`, [["nodes", want / per]]]);
    if (!out.length) {  // neither alone: node counts whose devices divide into tp*cp*pp, with the DP they give
      out.push(...nearest(request.cluster.num_nodes || 1, (n) => (n * per) % inner === 0)
        .map((n) => batched([`${n} nodes, DP ${(n * per) / inner}`, [["nodes", n], ["dp", (n * per) / inner]]], (n * per) / inner)));
    }
    return out;
  }
  if (path === "parallel.dp") {  // dp omitted and the devices do not divide into tp*cp*pp
    const out = nearest(pp, (v) => devices % (tp * cp * v) === 0).map((v) => batched([`PP ${v}`, [["pp", v]]], devices / (tp * cp * v)));
    const per = devicesPerNode();
    out.push(...nearest(request.cluster.num_nodes || 1, (n) => (n * per) % inner === 0)
      .map((n) => batched([`${n} nodes`, [["nodes", n]]], (n * per) / inner)));
    return out;
  }
  return [];
}
