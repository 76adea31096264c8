// "Serve it": POST /v1/serve for this form's model and cluster with a serving deployment (engine, traffic,
// pools), its cards, pools and KV transfer; "Find a deployment": POST /v1/serve/search under a TTFT/TPOT SLA,
// its ranked table and the Pareto front of tokens/s per GPU against tokens/s per user; a click loads one.
import { postJson, search } from "./api.js";
import { $, bareLabel, el, options as fillOptions } from "./dom.js";
import { axisCount, axisTime, esc, fmtBytes, fmtCount, fmtInt, fmtTime } from "./format.js";
import { chart, narrow } from "./charts.js";
import { budgetParts, plainLimits } from "./refusals.js";
import { saveUrl, state } from "./state.js";
import { clearExplorer } from "./explorer.js";
import { drawTopology } from "./topology.js";

const num = (id) => { const v = $(id).value.trim(); return v === "" ? null : Number(v); };
// pp: a search result with a pipelined pool ("decode 3× TP8 PP16") loaded without it, so the card planned 40 GPUs
// for the listed 400, at 111 tokens/s per GPU for the listed 10.9 (round 13)
const POOL_FIELDS = ["workers", "tp", "pp", "dp", "ep"];

// published deployments to start from (their sources: docs/serving.md)
// dsv3-pd: the LMSYS run (lmsys.org/blog/2025-05-05-large-scale-ep; its launch commands, sglang issue #6017, pass
// --enable-two-batch-overlap): two-batch overlap on as run. Its 32 redundant experts are left out: 256 + 32 = 288
// expert slots do not divide over this decode pool's EP64 (the run's decode was EP72), a 422 on redundant_experts
export const SERVE_SCENARIOS = [
  { id: "dsv3-pd", label: "DeepSeek-V3 on 96 H100: SGLang prefill DP32 + decode DP64, DeepEP, two-batch overlap (LMSYS 2025)",
    request: { model: { preset: "deepseek-v3" }, nodes: 12, engine: "sglang",
      traffic: { input_tokens: 2000, output_tokens: 100, concurrency: 2048 },
      options: { weight_dtype: "fp8", two_batch_overlap: true },
      deployment: { pools: [
        { role: "prefill", workers: 1, tp: 1, dp: 32, ep: 32, attention_dp: true, ep_dispatch: "deepep" },
        { role: "decode", workers: 1, tp: 1, dp: 64, ep: 64, attention_dp: true, ep_dispatch: "deepep" }] } } },
  { id: "llama70b-vllm", label: "Llama-3 70B on 16 H100: vLLM, two TP8 workers",
    request: { model: { preset: "llama3-70b" }, nodes: 2, engine: "vllm",
      traffic: { input_tokens: 1000, output_tokens: 200, concurrency: 64 }, options: { weight_dtype: "bf16" },
      deployment: { pools: [{ role: "both", workers: 2, tp: 8 }] } } },
];

// the checkpoint formats /v1/serve takes (app/schemas/serve.py ServeOptionsIn.weight_dtype), each with what it needs
// in its tooltip (the server's 422 names the rule where the GPU, the model or the engine lacks it: docs/serving.md)
export const WEIGHT_FORMATS = [
  ["bf16", "bf16"],
  ["fp8", "fp8"],
  ["nvfp4", "nvfp4", "NVFP4 checkpoint: every linear weight 0.5625 B (E2M1 + one E4M3 scale per 16), fp4 GEMMs; Blackwell (fp4 tensor cores) only"],
  ["mxfp4", "mxfp4", "MXFP4 experts (GPT-OSS): the MoE experts at 0.53125 B a weight (E2M1 + one E8M0 scale per 32), dequantized to bf16 math; the rest bf16; vLLM and SGLang, MoE models, compute capability 8.0+"],
];

export function fillServeModels(presets) {
  fillOptions($("serve-weights"), WEIGHT_FORMATS, $("serve-weights").value || "bf16");
  fillOptions($("serve-model"), [["", "the form's model"], ...Object.entries(presets).map(([k, m]) => [k, m.name || k])]);
  fillOptions($("serve-scenario"), [["", "— pick one —"], ...SERVE_SCENARIOS.map((s) => [s.id, s.label])]);
}

function loadScenario() {
  const s = SERVE_SCENARIOS.find((x) => x.id === $("serve-scenario").value);
  if (!s) return;
  const r = s.request;
  $("serve-model").value = r.model.preset;
  $("serve-nodes").value = r.nodes;
  $("serve-isl").value = r.traffic.input_tokens; $("serve-osl").value = r.traffic.output_tokens;
  $("serve-load").value = "concurrency"; $("serve-concurrency").value = r.traffic.concurrency;
  fillServeOptions(r.options); keepOptions();
  loadDeployment({ engine: r.engine, deployment: r.deployment });
}

// a pool's fields, written once for the three pools (serve-a: both roles, serve-p: prefill, serve-d: decode)
const DISPATCHES = [["", "engine default"], ["alltoall", "all-to-all"], ["deepep", "DeepEP"], ["deepep_ll", "DeepEP low-latency"],
  ["agrs", "all-gather + reduce-scatter (vLLM)"], ["dp_gather", "DP-attention gather (SGLang)"], ["agrs_quant", "post-quant all-gather (TensorRT-LLM)"]];
const POOL_LABELS = { workers: "Workers", tp: "TP", pp: "PP", dp: 'DP <span class="hint">(attention)</span>', ep: "EP" };
// what each pool control does, said on hover (round 11: the pool's fields had none; "DP (attention)" beside an
// "Attention-DP" box read as one setting twice)
const POOL_TITLES = {
  workers: "engine instances of this layout, each serving its own requests",
  tp: "tensor parallel GPUs of one worker (with DP and EP: the attention's TP)",
  pp: "pipeline stages of one worker (vLLM --pipeline-parallel-size, SGLang --pp-size, TensorRT-LLM --pp_size); GPUs per worker = TP x PP x DP",
  dp: "attention ranks of one worker (app/schemas/serve.py PoolIn.dp); GPUs per worker = TP x PP x DP",
  ep: "expert parallel GPUs the MoE experts spread over (MoE models)",
  adp: "data-parallel attention: each attention rank holds its own requests' tokens and KV cache, gathered before the experts (SGLang --enable-dp-attention, TensorRT-LLM enable_attention_dp; docs/serving.md)",
  dispatch: "how tokens reach their experts; engine default: vLLM all-gather + reduce-scatter, SGLang DP-attention gather, TensorRT-LLM all-to-all",
};

function poolFields(prefix) {
  const numbers = POOL_FIELDS.map((f) => `<div class="field"><label for="${prefix}-${f}">${POOL_LABELS[f]}</label><input id="${prefix}-${f}" type="number" min="1" value="${f === "tp" ? 8 : 1}" title="${POOL_TITLES[f]}"></div>`);
  const options = DISPATCHES.map(([v, label]) => `<option value="${v}">${label}</option>`).join("");
  return numbers.join("") + `<div class="field check"><label><input id="${prefix}-adp" type="checkbox" title="${POOL_TITLES.adp}"> Attention-DP</label></div>`
    + `<div class="field"><label for="${prefix}-dispatch">Token dispatch</label><select id="${prefix}-dispatch" title="${POOL_TITLES.dispatch}">${options}</select></div>`;
}

export function initServe() {
  for (const box of document.querySelectorAll("[data-pool]")) box.innerHTML = poolFields(box.dataset.pool);
  // the options are kept in the URL (state.serveOptions, #s= "o") as they change; an answer on show is replanned
  for (const id of OPTION_IDS) $(id).addEventListener("change", () => { keepOptions(); if (!$("serve-results").hidden) runServe(); });
  $("serve-scenario").addEventListener("change", loadScenario);
  $("serve-mode").addEventListener("change", syncMode);
  $("serve-run").addEventListener("click", runServe);
  $("serve-search-run").addEventListener("click", runServeSearch);
  $("serve-draw").addEventListener("click", drawTransfer);
  $("serve-calib-run").addEventListener("click", runServeCalibrate);
  $("serve-calib-use").addEventListener("click", () => useScales(state.serveCalibration && state.serveCalibration.constants));
  $("serve-calib-clear").addEventListener("click", () => useScales(null));
  // the card's own inputs go to the URL as they change (the calibration text does not: it is not a setting)
  $("serve-card").addEventListener("change", (e) => { if (e.target.id !== "serve-calib-text") keepCard(); });
  syncMode();
}

// The card's model, nodes, engine, traffic, pools and SLA, and whether a deployment is on show: kept in the URL ("v"),
// so a reload, a shared link or Back brings the card back and plans it again. Round 12: a reload kept the options
// alone, and the card came back empty (the form's model, aggregated TP8, 2,000 / 200 tokens at 64 concurrent).
function serveCard() {
  return { model: $("serve-model").value, nodes: num("serve-nodes"), engine: $("serve-engine").value, traffic: traffic(),
    deployment: { pools: cardPools() }, sla: { ttft_ms: num("serve-sla-ttft"), tpot_ms: num("serve-sla-tpot") },
    planned: !$("serve-results").hidden || Boolean(state.serveCard && state.serveCard.planned),
    drawn: Boolean(state.serveCard && state.serveCard.drawn) };
}
// planned stays on once asked for (round 15): a serving scenario picked plans at once (runServe: planned), then its
// change event reached the card's own listener before the answer, while the results were still hidden, and wrote
// planned: false. The link and a reload brought the card back without its TTFT, TPOT or KV transfer.
function keepCard(planned) { state.serveCard = { ...serveCard(), ...(planned ? { planned } : {}) }; saveUrl(); }

// the card from a URL's "o" and "v" (state.js loadUrl: objects, else null); a value of the wrong type keeps the box's
const objectOr = (v) => (v && typeof v === "object" && !Array.isArray(v) ? v : {});
const numberText = (v, fallback) => (typeof v === "number" && Number.isFinite(v) ? String(v) : fallback);
// the KV transfer drawn when the card was saved (v.drawn): drawn again once its deployment is planned (round 15: a link
// to the drawn transfer opened on the ledger's first call)
let redraw = false;
export function restoreServe(o, v) {
  state.serveOptions = o; state.serveCard = v;
  redraw = Boolean(v && v.drawn);
  if (o) fillServeOptions(o);
  if (!v) return;
  $("serve-model").value = typeof v.model === "string" ? v.model : "";
  if ($("serve-model").selectedIndex < 0) $("serve-model").value = "";
  $("serve-nodes").value = numberText(v.nodes, "");
  const t = objectOr(v.traffic), sla = objectOr(v.sla);
  $("serve-isl").value = numberText(t.input_tokens, $("serve-isl").value);
  $("serve-osl").value = numberText(t.output_tokens, $("serve-osl").value);
  $("serve-sla-ttft").value = numberText(sla.ttft_ms, ""); $("serve-sla-tpot").value = numberText(sla.tpot_ms, "");
  const given = objectOr(v.deployment).pools;
  const list = Array.isArray(given) ? given.filter((p) => p && typeof p === "object" && !Array.isArray(p)).slice(0, 2) : [];
  if (list.length) fillDeployment({ engine: typeof v.engine === "string" ? v.engine : "vllm", traffic: t, deployment: { pools: list } });
}
// after the plan a restored card needs (the model and cluster are the form's unless the card names them)
export function replanServe() { if (state.serveCard && state.serveCard.planned) runServe(); }

function syncMode() {
  const disagg = $("serve-mode").value === "disaggregated";
  $("serve-agg").hidden = disagg;
  $("serve-disagg").hidden = !disagg;
}

function pool(prefix, role) {
  const p = { role };
  for (const f of POOL_FIELDS) { const v = num(`${prefix}-${f}`); if (v !== null) p[f] = v; }
  p.attention_dp = $(`${prefix}-adp`).checked;
  const d = $(`${prefix}-dispatch`).value;
  if (d) p.ep_dispatch = d;
  return p;
}

function traffic() {
  const t = { input_tokens: num("serve-isl"), output_tokens: num("serve-osl") };
  if ($("serve-load").value === "rate") t.request_rate = num("serve-concurrency"); else t.concurrency = num("serve-concurrency");
  return t;
}

// the serving options the card sets (app/schemas/serve.py ServeOptionsIn); a blank one is the engine's default
// (two_batch_overlap off and redundant_experts 0 in vLLM, SGLang and TensorRT-LLM: planner/serving/engines.py)
// MTP, CUDA graphs and chunked prefill (round 13): options the API takes that the card had no control for, so
// DeepSeek-V3 could not be served with its multi-token prediction from the page
const OPTION_IDS = ["serve-weights", "serve-kv", "serve-tbo", "serve-redundant", "serve-mtp-draft", "serve-mtp-acceptance", "serve-mtp-tokens", "serve-cuda-graphs", "serve-chunked"];
const ON_OFF_OPTIONS = [["serve-cuda-graphs", "cuda_graphs"], ["serve-chunked", "chunked_prefill"]];
// the step-time factors fitted to the user's benchmark runs (POST /v1/serve/calibrate), or null: the planner's own
let scales = null;
function options(calibrated = true) {
  const o = { weight_dtype: $("serve-weights").value };
  if ($("serve-kv").value) o.kv_dtype = $("serve-kv").value;
  if ($("serve-tbo").value) o.two_batch_overlap = $("serve-tbo").value === "true";
  if (num("serve-redundant") !== null) o.redundant_experts = num("serve-redundant");
  // a draft count alone is sent without its acceptance: the server names the missing field (options.mtp.acceptance);
  // the rate and the mean tokens a step are two boxes, one field each (one box read as both priced 1.0 as one token
  // a step, review r13b #1): both filled are sent, and the server says to give one
  const mtp = [["serve-mtp-draft", "draft_tokens"], ["serve-mtp-acceptance", "acceptance"], ["serve-mtp-tokens", "tokens_per_step"]];
  if (mtp.some(([id]) => num(id) !== null)) {
    o.mtp = {};
    for (const [id, key] of mtp) if (num(id) !== null) o.mtp[key] = num(id);
  }
  for (const [id, key] of ON_OFF_OPTIONS) if ($(id).value) o[key] = $(id).value === "true";
  if (calibrated && scales) Object.assign(o, scales);
  return o;
}

function keepOptions() { state.serveOptions = options(); saveUrl(); }

// the card's options from a request's (a scenario's, or the URL's); a field left out is the default
export function fillServeOptions(o) {
  $("serve-weights").value = WEIGHT_FORMATS.some(([v]) => v === o.weight_dtype) ? o.weight_dtype : "bf16";
  $("serve-kv").value = ["bf16", "fp8"].includes(o.kv_dtype) ? o.kv_dtype : "";
  $("serve-tbo").value = typeof o.two_batch_overlap === "boolean" ? String(o.two_batch_overlap) : "";
  $("serve-redundant").value = Number.isInteger(o.redundant_experts) ? String(o.redundant_experts) : "";
  const mtp = o.mtp && typeof o.mtp === "object" ? o.mtp : {};
  $("serve-mtp-draft").value = Number.isFinite(mtp.draft_tokens) ? String(mtp.draft_tokens) : "";
  $("serve-mtp-acceptance").value = Number.isFinite(mtp.acceptance) ? String(mtp.acceptance) : "";
  $("serve-mtp-tokens").value = Number.isFinite(mtp.tokens_per_step) ? String(mtp.tokens_per_step) : "";
  for (const [id, key] of ON_OFF_OPTIONS) $(id).value = typeof o[key] === "boolean" ? String(o[key]) : "";
  const fitted = typeof o.prefill_time_scale === "number" && typeof o.decode_time_scale === "number";
  scales = fitted ? { prefill_time_scale: o.prefill_time_scale, decode_time_scale: o.decode_time_scale } : null;
  showScales();
}

function showScales() {
  $("serve-calib-active").textContent = scales
    ? `Planning with your fitted factors: prefill × ${scales.prefill_time_scale.toFixed(3)}, decode × ${scales.decode_time_scale.toFixed(3)}.` : "";
  $("serve-calib-clear").hidden = !scales;
}

function useScales(constants) {
  scales = constants ? { prefill_time_scale: constants.prefill_time_scale, decode_time_scale: constants.decode_time_scale } : null;
  showScales(); keepOptions();
  if (state.request) runServe();
}

// one run per "Serving Benchmark Result" block (vLLM and SGLang both print that header); no header: the text as one
// run, which the server answers with a 422 naming the line it could not read
export function benchRuns(text) {
  const starts = [...text.matchAll(/^=+\s*Serving Benchmark Result\s*=+\s*$/gm)].map((m) => m.index);
  if (!starts.length) return text.trim() ? [{ text }] : [];
  return starts.map((start, i) => ({ text: text.slice(start, starts[i + 1] ?? text.length) }));
}

async function runServeCalibrate() {
  if (!state.request) return;
  const runs = benchRuns($("serve-calib-text").value);
  if (!runs.length) { $("serve-calib-status").textContent = "Paste the output of a vllm bench serve or sglang.bench_serving run first."; return; }
  const { traffic: _unused, ...deployment } = serveBody();
  // the fit starts from the planner's own times: the factors are not compounded with earlier ones
  const body = { ...deployment, options: options(false), runs: runs.slice(0, 16) };
  $("serve-calib-status").textContent = `Fitting to ${runs.length} run${runs.length > 1 ? "s" : ""}…`;
  $("serve-calib-run").disabled = true;
  try {
    const result = await postJson("/v1/serve/calibrate", body);
    state.serveCalibration = result;
    const c = result.constants;
    $("serve-calib-status").textContent = `Prefill × ${c.prefill_time_scale.toFixed(3)}, decode × ${c.decode_time_scale.toFixed(3)}: `
      + `median |error| of TTFT and TPOT ${absPct(result.median_error_before)} before, ${absPct(result.median_error_after)} after.`
      + (result.warnings || []).map((w) => ` Warning: ${w}.`).join("");
    renderServeCalibration(result);
  } catch (err) {
    $("serve-calib-status").textContent = `Cannot fit: ${errorText(err)}`;
    $("serve-calib-results").hidden = true;
    $("serve-calib-use").hidden = true;
  } finally {
    $("serve-calib-run").disabled = false;
  }
}

// a signed error to 0.1%, rounded before its sign is read (round 14: a fit's -4e-9 read "71.5 ms (-0.0%)" beside
// "+0.0%"); a median of |errors| unsigned ("median |error| +50.2%" gave an absolute value a sign)
const pct = (e) => {
  if (e === null || e === undefined) return "–";
  const v = Number((100 * e).toFixed(1)) + 0;  // + 0: -0 is 0
  return `${v >= 0 ? "+" : ""}${v.toFixed(1)}%`;
};
const absPct = (e) => (e === null || e === undefined ? "–" : `${(100 * Math.abs(e)).toFixed(1)}%`);
const timed = (v, e) => (v === null || v === undefined ? "unbounded" : e === undefined ? fmtTime(v) : `${fmtTime(v)} (${pct(e)})`);

// a traffic block's load: its concurrency, else its request rate, else its requests sent at once
const loadText = (t) => (t.concurrency !== null && t.concurrency !== undefined ? `${fmtInt(t.concurrency)} concurrent`
  : t.request_rate !== null && t.request_rate !== undefined ? `${fmtCount(t.request_rate)} req/s` : `${fmtInt(t.requests)} at once`);

function renderServeCalibration(result) {
  const rows = result.rows.map((r, i) => {
    const t = r.traffic;
    const load = loadText(t);
    return el("tr", {},
      el("td", {}, `${i + 1} (${r.tool})`), el("td", { className: "num" }, `${fmtInt(t.input_tokens)} / ${fmtInt(t.output_tokens)}`),
      el("td", { className: "num" }, load),
      el("td", { className: "num" }, timed(r.measured.ttft_s)),
      el("td", { className: "num" }, timed(r.before.ttft_s, r.before.errors.ttft_s)),
      el("td", { className: "num" }, timed(r.after.ttft_s, r.after.errors.ttft_s)),
      el("td", { className: "num" }, timed(r.measured.tpot_s)),
      el("td", { className: "num" }, timed(r.before.tpot_s, r.before.errors.tpot_s)),
      el("td", { className: "num" }, timed(r.after.tpot_s, r.after.errors.tpot_s)));
  });
  $("serve-calib-table").querySelector("tbody").replaceChildren(...rows);
  $("serve-calib-results").hidden = false;
  $("serve-calib-use").hidden = false;
}

// the model and cluster served: the card's own choices, else the form's
function modelAndCluster() {
  const r = state.request;
  const model = $("serve-model").value ? { preset: $("serve-model").value } : r.model;
  const nodes = num("serve-nodes");
  const cluster = nodes === null ? r.cluster : { ...r.cluster, num_nodes: nodes };
  return { model, cluster };
}

const cardPools = () => ($("serve-mode").value === "disaggregated" ? [pool("serve-p", "prefill"), pool("serve-d", "decode")] : [pool("serve-a", "both")]);

export function serveBody() {
  return { ...modelAndCluster(), engine: $("serve-engine").value, traffic: traffic(), deployment: { pools: cardPools() }, options: options() };
}

// a 422 on this card: the field as the card labels it, and a bound on a field in seconds said in seconds (the SLA
// boxes take ms: "sla.tpot_s: Input should be less than or equal to 60" read as 60 ms; the bound and the value got)
// The options and each pool's fields too, marked on their input (round 11: "options.fp8_recipe: fp8 weights ... use
// bf16 weights" named a field the card has no control for, and a pool's "deployment.pools.0.ep" was a path alone)
const SERVE_FIELDS = { "sla.ttft_s": "serve-sla-ttft", "sla.tpot_s": "serve-sla-tpot", "traffic.input_tokens": "serve-isl",
  "traffic.output_tokens": "serve-osl", "traffic.concurrency": "serve-concurrency", "traffic.request_rate": "serve-concurrency",
  // neither given (the box blank): "traffic: give exactly one of concurrency and request_rate; got neither" marked
  // nothing (round 15)
  traffic: "serve-concurrency",
  // the search's candidates over the service's limit ("cluster: 2,610 deployments to plan, above the limit of 2,000
  // (COMMPLAN_MAX_SERVE_CANDIDATES); narrow engines or modes, or a smaller cluster": 2,048 nodes) marked nothing and
  // named the operator's setting; the card searches every engine and mode, so the Nodes box is the one to change
  cluster: "serve-nodes",
  "options.weight_dtype": "serve-weights", "options.fp8_recipe": "serve-weights", "options.kv_dtype": "serve-kv",
  "options.two_batch_overlap": "serve-tbo", "options.redundant_experts": "serve-redundant", engine: "serve-engine",
  "options.mtp": "serve-mtp-draft", "options.mtp.draft_tokens": "serve-mtp-draft", "options.mtp.acceptance": "serve-mtp-acceptance",
  "options.mtp.tokens_per_step": "serve-mtp-tokens",
  "options.cuda_graphs": "serve-cuda-graphs", "options.chunked_prefill": "serve-chunked",
  "model.preset": "serve-model", "cluster.num_nodes": "serve-nodes",
  // the pools' GPUs against the cluster's, the one refusal of the pools as a whole the card can send: "deployment.pools:
  // the pools use 1x32 + 1x64 = 96 GPUs; the cluster has 32" named a path and marked nothing (round 13)
  "deployment.pools": "serve-nodes" };
const POOL_INPUTS = { workers: "workers", tp: "tp", pp: "pp", dp: "dp", ep: "ep", attention_dp: "adp", ep_dispatch: "dispatch" };
const unmark = () => { for (const node of $("serve-card").querySelectorAll("[aria-invalid]")) node.removeAttribute("aria-invalid"); };
// a pool as a whole ("deployment.pools.0: a worker's tp*pp*dp = 1*1*32 = 32 GPUs must fill whole nodes of 72 or divide
// one", DeepSeek-V3's pools on a GB200 form) is its TP box, the first factor of the product, named by its pool's legend
// alone (round 14: the path alone, nothing marked)
function inputOf(path) {
  const pool = /^deployment\.pools\.(\d)(?:\.(\w+))?$/.exec(path);
  if (!pool) return SERVE_FIELDS[path] && $(SERVE_FIELDS[path]);
  const prefix = $("serve-mode").value === "disaggregated" ? ["serve-p", "serve-d"][Number(pool[1])] : "serve-a";
  const field = pool[2] === undefined ? "tp" : POOL_INPUTS[pool[2]];
  return prefix && field ? $(`${prefix}-${field}`) : null;
}
function errorText(err, pools = true) {
  unmark();
  const d = err.detail && err.detail[0];
  if (!d || !d.loc) return err.message;
  const path = d.loc.slice(1).join("."), input = inputOf(path);
  if (input) input.setAttribute("aria-invalid", "true");
  const legend = input && input.closest("fieldset") ? `${input.closest("fieldset").querySelector("legend").textContent.trim()} ` : "";
  // the label without its hint (review r15d #7: "Nodes (blank: the form's) (cluster): 2,610 deployments ...")
  const label = input && input.labels.length ? bareLabel(input.labels[0]) : "";
  const whole = /^deployment\.pools\.\d$/.test(path) && legend;
  const name = whole ? `${legend.trim()} (${path})` : label ? `${legend}${label} (${path})` : path;
  // a blank box is sent as null: "Input should be a valid integer, got null" named a JSON word for an empty box (round 15)
  const budget = budgetParts(d.msg);
  const said = budget ? `pricing this deployment is an estimated ${budget.units} units of work, over the ${budget.budget} this `
      + `server allows a request; the largest part: ${budget.part}. Fewer GPUs a pool cost less.`
    : plainLimits(d.msg.replace(/ \(COMMPLAN_MAX_SERVE_CANDIDATES\)/, " this server plans in one search")
      .replace("narrow engines or modes, or a smaller cluster", "the card searches every engine and mode: fewer nodes narrow it"));
  const msg = input && input.value.trim() === "" ? said.replace(/, got null$/, ", and the box is blank") : said;
  return `${name}: ${path.endsWith("_s") ? msg.replace(/(\d[\d.,]*\d|\d)(?=, got |$)/g, "$1 s") : msg}${pools ? blankPools() : ""}`;
}

// a pool's number box left blank is left out of the request, and the server plans 1 (app/schemas/serve.py PoolIn's
// defaults): "ep 32 on a worker of tp*dp = 1*1 = 1 ranks" for an emptied DP read as a value never typed (review r15d
// #5). Each blank box of the pools sent is marked and said.
function blankPools() {
  const prefixes = $("serve-mode").value === "disaggregated" ? ["serve-p", "serve-d"] : ["serve-a"];
  const blank = prefixes.flatMap((prefix) => POOL_FIELDS.map((f) => $(`${prefix}-${f}`)).filter((box) => box.value.trim() === ""));
  for (const box of blank) box.setAttribute("aria-invalid", "true");
  return blank.map((box) => ` (${box.closest("fieldset").querySelector("legend").textContent.trim()} ${bareLabel(box.labels[0])} is blank: 1 was planned)`).join("");
}

let serveSeq = 0;  // only the latest request's answer is shown
async function runServe() {
  if (!state.request) return;
  const seq = ++serveSeq;
  keepCard(true);
  $("serve-status").textContent = "Planning the deployment…";
  unmark();
  // disabled until its answer (review r15d #9: only the search's and the calibration's buttons were)
  $("serve-run").disabled = true;
  try {
    const body = serveBody();
    const answer = await postJson("/v1/serve", body);
    if (seq !== serveSeq) return;
    state.serve = answer;
    $("serve-status").textContent = "";
    renderServe(state.serve, body.traffic);
    // a drawn transfer is drawn again from the new answer, or given up where it has none (review r15d #1: the
    // detail kept 141 MB and 3.47 ms after an 8,000-token replan of 562 MB and 12.3 ms, and the DeepSeek transfer
    // over a vLLM deployment that has none, its link still saying drawn)
    if (redraw || (state.serveCard && state.serveCard.drawn)) { redraw = false; await (answer.kv_transfer ? drawTransfer() : undraw()); }
  } catch (err) {
    if (seq !== serveSeq) return;
    $("serve-status").textContent = `Cannot plan this deployment: ${errorText(err)}`;
    $("serve-results").hidden = true;
    if (state.serveCard && state.serveCard.drawn) undraw();
  } finally {
    if (seq === serveSeq) $("serve-run").disabled = false;
  }
}

// the detail back on the ledger's selected call (else its first): its row's click selects it and saves the link
function undraw() {
  state.serveCard = { ...state.serveCard, drawn: false };
  const rows = [...$("ledger").tBodies[0].rows], sel = state.selected;
  const row = rows.find((r) => sel && r.dataset.name === sel.name && Number(r.dataset.stage) === sel.stage) || rows[0];
  if (row) row.click(); else saveUrl();
}

const metric = (label, value, hint, id) => el("div", { className: "card metric-card", "data-card": id },
  el("div", { className: "metric-label" }, label), el("div", { className: "metric" }, value), hint ? el("div", { className: "hint" }, hint) : null);

// a pool's tokens/s, which ones named: the column showed a prefill pool's input tokens/s beside a decode pool's
// output ones unnamed ("223 K" over "11.1 K"), read as the prefill pool making 20x the output (round 10)
const poolTokens = (p) => (p.output_tokens_per_s ? `${fmtCount(p.output_tokens_per_s)} output` : `${fmtCount(p.input_tokens_per_s)} input`);

// a request's KV and what its transfer moves: wire_bytes (kvrep10) exceeds the KV where a pool's tp passes the KV
// heads and the engine fills every copy (docs/serving.md "KV heads replicated past TP"); the card said the KV alone
// (round 11). app/cli.py _kv_moved writes the same words. 1.001: the shares are ceil-divided (deployment.py
// _kv_transfer), so a transfer without copies may read a few bytes over the KV.
const kvMoved = (k) => `${fmtBytes(k.bytes_per_request)} per request, ${fmtBytes(k.wire_bytes)} on the wire from ${k.senders} rank${k.senders > 1 ? "s" : ""}`
  + (k.wire_bytes > k.bytes_per_request * 1.001 ? " (replicated KV heads: every copy filled)" : "");

// what a deployment the cards cannot stand for is, in words (round 13): one that does not fit showed 250 tokens/s per
// GPU and "2.00 K output tokens/s on 8 GPUs" for DeepSeek-V3's 670 GB per GPU. A saturated request rate (mend13c:
// the answer's `saturated`) is answered with what the deployment serves, its capacity, and TTFT unbounded: the
// verdict says the asked rate is more than that (the asked rate is the form's, `asked`)
function verdict(d, asked) {
  const hbm = d.cluster && d.cluster.gpu ? d.cluster.gpu.hbm_bytes : null;
  const short = d.pools.filter((p) => !p.fits).map((p) => `the ${p.role === "both" ? "" : `${p.role} `}pool `
    + (hbm && p.memory_peak_bytes > hbm ? `needs ${fmtBytes(p.memory_peak_bytes)} per GPU, over the ${fmtBytes(hbm)} a GPU holds`
      : "leaves no room for one request's KV cache"));
  const said = [];
  if (!d.fits) said.push(`Does not fit: ${short.join("; ") || "a pool does not fit in memory"}. The figures below are what it would do if it fit, not a deployment that runs.`);
  if (d.saturated) {
    const rate = asked && asked.request_rate ? `${fmtCount(asked.request_rate)} requests/s is` : "the rate asked is";
    said.push(`Saturated: ${rate} more than it serves, ${fmtCount(d.request_rate)} requests/s (bound by ${d.bottleneck}), so the queue and TTFT grow without bound; the tokens/s below are what it serves.`);
  }
  return said.join(" ");
}

export function renderServe(d, traffic) {
  const t = d.throughput, kv = d.kv_cache, words = verdict(d, traffic);
  $("serve-verdict").textContent = words;
  $("serve-verdict").hidden = !words;
  // greyed where the figures are not a deployment that runs; a saturated one's are what it serves (mend13c)
  $("serve-cards").classList.toggle("unrunnable", !d.fits);
  const cards = [
    metric("TTFT", d.ttft_s === null ? "unbounded" : fmtTime(d.ttft_s), d.ttft_s === null ? "the queue grows without bound" : "prefill + queue + KV transfer", "ttft"),
    metric("TPOT", fmtTime(d.tpot_s), `${fmtCount(t.tokens_per_s_per_user)} tokens/s per user`, "tpot"),
    metric("Tokens/s per GPU", fmtCount(t.output_tokens_per_s_per_gpu), `${fmtCount(t.output_tokens_per_s)} output tokens/s `
      + `on ${fmtInt(d.gpus)} GPUs${d.fits ? "" : " (does not fit)"}${d.saturated ? " (saturated: what it serves)" : ""}`, "per-gpu"),
    // whose: a disaggregated deployment's KV cache is its decode workers' (round 13: "per worker" beside a prefill pool)
    metric("KV cache", `${fmtCount(kv.capacity_tokens)} tokens`, `${fmtBytes(kv.bytes_per_token)} per token; ${fmtInt(kv.max_concurrency)} requests per `
      + `${d.pools.length > 1 ? "decode " : ""}worker`, "kv"),
    metric("Bound by", d.bottleneck, `${fmtCount(d.request_rate)} requests/s`, "bound"),
  ];
  if (d.kv_transfer) {
    const k = d.kv_transfer;
    cards.push(metric("KV transfer", fmtTime(k.time_s), `${kvMoved(k)}; busiest link ${k.bottleneck}`, "kv-transfer"));
  }
  $("serve-cards").replaceChildren(...cards);
  const rows = d.pools.map((p) => el("tr", {},
    el("td", {}, p.role), el("td", { className: "num" }, fmtInt(p.gpus)), el("td", { className: "num col-wide" }, fmtInt(p.batch)),
    el("td", { className: "num" }, fmtTime(p.step_s)), el("td", { className: "num" }, poolTokens(p)),
    el("td", {}, p.fits ? "fits" : "does not fit"),
    el("td", { className: "col-wide", title: p.calls.map((c) => `${c.name} ${fmtBytes(c.message_bytes)} × ${c.calls_per_iteration}: ${fmtTime(c.time_s)}`).join("\n") },
      `${p.calls.length}: ${fmtTime(p.calls.reduce((s, c) => s + c.time_s * c.calls_per_iteration, 0))} if serialised`)));
  $("serve-pools").querySelector("tbody").replaceChildren(...rows);
  const links = d.kv_transfer ? d.kv_transfer.links.map((l) => el("li", {}, `${l.label}: ${fmtBytes(l.bytes)}, ${Math.round(100 * l.utilisation)}% busy`)) : [];
  $("serve-links").replaceChildren(...links);
  $("serve-links").hidden = !links.length;
  $("serve-links-title").hidden = !links.length;
  $("serve-draw").hidden = !d.kv_transfer;
  $("serve-warnings").replaceChildren(...(d.warnings || []).map((w) => el("li", {}, String(w))));
  $("serve-warnings").hidden = !(d.warnings || []).length;
  $("serve-results").hidden = false;
}

// the topology view: the first prefill worker's GPUs and the decode worker it feeds (the answer's
// kv_transfer.devices, highlighted), the links coloured by the KV transfer's own utilisation (kv_transfer.links)
async function drawTransfer() {
  const d = state.serve;
  if (!d || !d.kv_transfer) return;
  const k = d.kv_transfer, [pre, dec] = d.pools;
  await drawTopology({ num_groups: 1, drawn: "The transfer", placement: { group_devices: k.devices, links: k.links } }, d.cluster);
  const lead = `The KV transfer: GPUs ${k.devices[0]}-${k.devices[pre.gpus / pre.workers - 1]} are the first prefill worker, `
    + `${k.devices[pre.gpus / pre.workers]}-${k.devices[k.devices.length - 1]} the decode worker it feeds `
    + `(${fmtInt(dec.workers)} decode worker${dec.workers > 1 ? "s" : ""} in all); links coloured by the transfer. `;
  $("topology-note").textContent = lead + $("topology-note").textContent;
  // the card's title, sentence and explorer say the transfer too: they kept the ledger's selected training call
  // ("Selected call: tp.attn.qkv", its curves) above the transfer's drawing (round 10)
  for (const row of $("ledger").tBodies[0].rows) row.setAttribute("aria-selected", "false");
  $("detail-title").textContent = "Serving: the KV transfer";
  $("detail-text").textContent = `KV cache: ${kvMoved(k)} of the first prefill worker to the decode worker it feeds, `
    + `${fmtTime(k.time_s)} a request; the busiest link is ${k.bottleneck}. `
    + "Select a ledger row to come back to the training plan's calls.";
  clearExplorer("The explorer prices a ledger call's collective algorithms; the KV transfer is point-to-point sends of "
    + "the transfer engine (Mooncake, NIXL), priced on the graph above (docs/serving.md). Select a ledger row to explore one.");
  $("detail").scrollIntoView({ block: "nearest" });
  state.serveCard = { ...serveCard(), drawn: true }; saveUrl();
}

async function runServeSearch() {
  if (!state.request) return;
  const sla = {};
  if (num("serve-sla-ttft") !== null) sla.ttft_s = num("serve-sla-ttft") / 1e3;
  if (num("serve-sla-tpot") !== null) sla.tpot_s = num("serve-sla-tpot") / 1e3;
  const body = { ...modelAndCluster(), traffic: traffic(), sla, options: options(), top_k: 10 };
  $("serve-search-status").textContent = "Searching deployments…";
  unmark();
  $("serve-search-run").disabled = true;
  state.serveSearchProgress = null;
  try {
    // streamed: a progress line at most every 0.25 s (done of total, plans that fit, those meeting the SLA, the
    // best so far), then the result
    const result = await search(body, showServeProgress, undefined, "/v1/serve/search?stream=true");
    state.serveSearch = result;
    renderServeSearch(result, sla, body.traffic, body.cluster);
  } catch (err) {
    $("serve-search-status").textContent = `Search failed: ${errorText(err, false)}`;
  } finally {
    $("serve-search-run").disabled = false;
  }
}

function showServeProgress(p) {
  state.serveSearchProgress = p;
  const best = p.best ? `; best so far ${engineName(p.best.engine)} ${p.best.mode} ${p.best.deployment}, `
    + `${fmtCount(p.best.output_tokens_per_s_per_gpu)} tokens/s per GPU` : "";
  $("serve-search-status").textContent = `Searching deployments: ${fmtInt(p.done)} of ${fmtInt(p.total)}, `
    + `${fmtInt(p.evaluated)} plans fit, ${fmtInt(p.feasible)} meet the SLA${best}…`;
}

// as planner/words.py pool_name writes it (the CLI, the search's sentences): "both 8× TP1" when no size is above 1
const poolName = (p) => `${p.role} ${p.workers}× ` + (["tp", "pp", "dp", "ep"].filter((k) => (p[k] || 1) > 1).map((k) => `${k.toUpperCase()}${p[k]}`).join(" ") || "TP1")
  + (p.attention_dp ? " attention-DP" : "");

// the server's `why` as a sentence of its own: the winner's line follows "Best:", the reason nothing met the SLA
// ("no deployment meets ...") starts with a capital; either ends with a full stop
const sentence = (text) => text.charAt(0).toUpperCase() + text.slice(1) + (/[.!?]$/.test(text) ? "" : ".");

// an SLA's bounds in words, as typed (round numbers, as axis ticks are): "TTFT at most 5 s, TPOT at most 1 ms"
const slaText = (sla) => [["TTFT", sla.ttft_s], ["TPOT", sla.tpot_s]].filter(([, v]) => v !== undefined)
  .map(([k, v]) => `${k} at most ${axisTime(v)}`).join(", ") || "no bound";

// an engine as people write it ("vLLM", "TensorRT-LLM"), read off the Engine select's own labels (index.html): the
// search's rows, front, chart and progress wrote the id a request takes ("vllm", "trtllm") beside the server's
// sentences, which name "vLLM"
const engineName = (id) => [...$("serve-engine").options].find((o) => o.value === id)?.textContent || id;

const loadable = (request) => ({ tabIndex: 0, onclick: () => loadDeployment(request),
  onkeydown: (e) => { if (e.key === "Enter") loadDeployment(request); } });

// the deployments the search did not plan and why, as the CLI's "not planned:" line (app/cli.py): the page said
// nothing, so the card's two-batch overlap refusing every TensorRT-LLM deployment (256 of 768) left an engine out
// of a search "across engines" unsaid (round 13)
const notPlanned = (rejected) => {
  const why = Object.entries(rejected || {}).sort((a, b) => b[1] - a[1]);
  return why.length ? ` Not planned (deployments): ${why.map(([reason, n]) => `${reason} (${fmtInt(n)})`).join("; ")}.` : "";
};

// the GPUs the search's deployments use (round 13: nothing said the Nodes box sets the size searched; mend13c: the
// search tries whole-node sizes from one node up, so the answer's deployment_gpus gives the fewest and the most)
function searchedGpus(cluster, sizes) {
  const per = cluster.devices_per_node || (state.presets.clusters[cluster.preset] || {}).devices_per_node || 1;
  const nodes = cluster.num_nodes || 1;
  const range = sizes && sizes.fewest < sizes.most ? `${fmtInt(sizes.fewest)} to ${fmtInt(sizes.most)} GPUs` : `${fmtInt(nodes * per)} GPUs`;
  return `${range} of the cluster's ${fmtInt(nodes * per)} (${fmtInt(nodes)} node${nodes > 1 ? "s" : ""}; the Nodes box sets them)`;
}

function renderServeSearch(result, sla, traffic, cluster) {
  const met = result.results.length > 0;
  $("serve-search-status").textContent = `${fmtInt(result.candidates)} deployments tried, each using `
    + `${searchedGpus(cluster, result.deployment_gpus)}, each at up to 3 loads; `
    + `${fmtInt(result.evaluated)} of those plans fit. ${met ? `Best: ${result.why}.` : sentence(result.why)}${notPlanned(result.rejected)}`
    // what the list left out to stay within its limit (mend15: the expert-TP twins, sizes below the cluster)
    + (result.warnings || []).map((w) => ` Warning: ${w}.`).join("");
  const rows = result.results.map((c, i) => el("tr", loadable(c.request),
    el("td", { className: "num" }, String(i + 1)), el("td", { className: "col-wide" }, `${engineName(c.engine)} ${c.mode}`),
    // under 600 px the engine column folds into the pools' (round 15: at 390 px TTFT and TPOT sat 400 px to the right)
    el("td", {}, el("span", { className: "narrow-only" }, `${engineName(c.engine)} ${c.mode}`),
      `${c.request.deployment.pools.map(poolName).join(" + ")} (${fmtInt(c.answer.gpus)} GPUs)`),
    el("td", { className: "num" }, fmtCount(c.answer.throughput.output_tokens_per_s_per_gpu)),
    el("td", { className: "num col-wide" }, fmtCount(c.answer.throughput.tokens_per_s_per_user)),
    el("td", { className: "num" }, c.answer.ttft_s === null ? "unbounded" : fmtTime(c.answer.ttft_s)),
    el("td", { className: "num" }, fmtTime(c.answer.tpot_s))));
  $("serve-search-table").querySelector("tbody").replaceChildren(...rows);
  // nothing met the SLA: no empty table, but the reason in plain words, and the front's points below with their loads
  $("serve-search-table-wrap").hidden = !met;
  $("serve-search-none").hidden = met;
  $("serve-search-none").textContent = met ? "" : `No deployment meets the SLA (${slaText(sla)})`
    + ` at ${loadText(traffic)}. `
    + (result.pareto.some((p) => p.meets_sla) ? "The Pareto front's points marked \u201cmeets the SLA\u201d do at a lower load: select one to load it."
      : "No point of the Pareto front meets it, at any load tried: relax the SLA or give the model more GPUs.");
  $("serve-search-front").replaceChildren(...result.pareto.map((p) => el("li", loadable(p.request),
    `${engineName(p.engine)} ${p.mode}: ${p.request.deployment.pools.map(poolName).join(" + ")}${p.gpus ? ` (${fmtInt(p.gpus)} GPUs)` : ""}; `
    + `${fmtCount(p.output_tokens_per_s_per_gpu)} tokens/s per GPU, ${fmtCount(p.tokens_per_s_per_user)} per user, `
    + `TTFT ${p.ttft_s === null ? "unbounded" : fmtTime(p.ttft_s)}, TPOT ${fmtTime(p.tpot_s)} at ${loadText(p.request.traffic)}: `,
    el("strong", { className: p.meets_sla ? "meets" : "misses" }, p.meets_sla ? "meets the SLA" : "misses the SLA"))));
  $("serve-search-results").hidden = false;
  const pts = result.pareto.map((p) => ({ value: [p.tokens_per_s_per_user, p.output_tokens_per_s_per_gpu, p],
    itemStyle: { color: p.meets_sla ? "#1e8449" : "#c0392b" } }));
  chart("serve-pareto").setOption({
    animation: false,
    tooltip: { trigger: "item", formatter: (q) => esc(`${engineName(q.data.value[2].engine)} ${q.data.value[2].mode}: ${q.data.value[2].request.deployment.pools.map(poolName).join(" + ")}; `
      + `${fmtCount(q.data.value[1])} tokens/s per GPU, ${fmtCount(q.data.value[0])} per user at ${loadText(q.data.value[2].request.traffic)}`
      + (q.data.value[2].meets_sla ? "; meets the SLA" : "")) },
    grid: { left: narrow() ? 50 : 70, right: 16, top: 24, bottom: 44 },
    xAxis: { type: "value", name: "tokens/s per user", nameLocation: "middle", nameGap: 28, axisLabel: { formatter: axisCount } },
    yAxis: { type: "value", name: "tokens/s per GPU", axisLabel: { formatter: axisCount } },
    series: [{ type: "line", step: false, symbolSize: 9, data: pts, lineStyle: { color: "#c0392b" }, itemStyle: { color: "#c0392b" } }],
  }, true);
  chart("serve-pareto").off("click");
  chart("serve-pareto").on("click", (q) => loadDeployment(q.data.value[2].request));
}

function setPool(prefix, p) {
  for (const f of POOL_FIELDS) $(`${prefix}-${f}`).value = p[f] ?? 1;
  $(`${prefix}-adp`).checked = !!p.attention_dp;
  $(`${prefix}-dispatch`).value = p.ep_dispatch || "";
}

export function loadDeployment(request) {
  fillDeployment(request);
  runServe();
}

function fillDeployment(request) {
  $("serve-engine").value = request.engine;
  // at the load it was planned at: a front point "at 512 concurrent: meets the SLA" was loaded at the form's 2,048
  // and planned a TTFT of 12.2 s, not its 1.03 s (round 10)
  const t = request.traffic || {};
  if (t.concurrency !== null && t.concurrency !== undefined) { $("serve-load").value = "concurrency"; $("serve-concurrency").value = t.concurrency; }
  else if (t.request_rate !== null && t.request_rate !== undefined) { $("serve-load").value = "rate"; $("serve-concurrency").value = t.request_rate; }
  const pools = request.deployment.pools;
  $("serve-mode").value = pools.length > 1 ? "disaggregated" : "aggregated";
  if (pools.length > 1) { setPool("serve-p", pools[0]); setPool("serve-d", pools[1]); } else setPool("serve-a", pools[0]);
  syncMode();
}

