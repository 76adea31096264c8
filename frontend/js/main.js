// commplan what-if page: wires the modules. No build step: ES modules; ECharts and Cytoscape.js vendored.
import { ApiError, getJson, postJson, Unreachable } from "./api.js";
import { $, options } from "./dom.js";
import { fmtBw, fmtBytes, fmtCount, fmtInt, fmtPct, fmtStages, fmtTime, timeIter } from "./format.js";
import { renderAssumptions } from "./assumptions.js";
import { countSet, setClusterChoices, setNcclVersions, showResolvedDefaults } from "./controls.js";
import { calibrationOf, clearErrors, FIELDS, fillForm, switchCluster, fillPresets, FormError, noteEdit, readForm, SCENARIOS, showErrors, syncVisibility } from "./form.js";
import { exportPlan, renderFilters, renderTable, sortBy } from "./ledger.js";
import { renderMemory } from "./memory.js";
import { renderParChart } from "./charts.js";
import { applyLayout, initSearch, renderSearch } from "./search.js";
import { initCalibrate, showActiveCalibration } from "./calibrate.js";
import { fillServeModels, initServe, replanServe, restoreServe, serveBody } from "./serve.js";
import { loadUrl, saveUrl, state } from "./state.js";
import { explore } from "./explorer.js";
import { fillStepAlgorithms, fillStepOps, loadSteps, presetSteps, step, stopPlay, togglePlay } from "./stepper.js";
import { renderSummary } from "./summary.js";
import { drawnMicrobatches, renderTimeline, zoomToMicrobatch } from "./timeline.js";
import { drawTopology, prefetchTopology } from "./topology.js";

// ---- honest updates: stale while replanning, stale-and-invalid while the inputs cannot be planned ----------
function setStale(kind) {
  state.stale = kind;
  const results = $("results");
  results.classList.toggle("stale", !!kind && !!state.plan);
  $("stale-badge").classList.toggle("off", !kind || !state.plan);  // keeps its space: no layout shift under the pointer
  $("stale-badge").textContent = kind === "invalid" ? "Stale: these results are for the last valid configuration, not the inputs shown"
    : kind === "offline" ? "Stale: the server could not be reached" : "Stale: replanning…";
}

function banner(text) { $("banner").hidden = !text; $("banner").textContent = text || ""; }

function formChanged() {
  try { return JSON.stringify(readForm()) !== JSON.stringify(state.request); } catch { return true; }
}

let debounce = null;
function schedulePlan(delay = 250) { setStale("pending"); clearTimeout(debounce); debounce = setTimeout(runPlan, delay); }

// restore: the request of a history entry brought back (Back, Forward), planned without a new entry
async function runPlan(restore = false) {
  let request;
  try { request = readForm(); } catch (err) {
    if (!(err instanceof FormError)) throw err;
    clearErrors(); showErrors([{ loc: ["body", ...err.field.split(".")], msg: err.message }]); setStale("invalid");
    $("status").textContent = "Invalid configuration.";
    return;
  }
  // another request than the one on show is a new history entry, so Back undoes the change; the first plan, a
  // restored entry and the same request planned again rewrite the entry on show
  const push = !restore && state.request !== null && JSON.stringify(request) !== JSON.stringify(state.request);
  state.request = request;
  showActiveCalibration(request.cluster.calibration);
  saveUrl(push);
  const seq = ++state.planSeq;
  $("results").setAttribute("aria-busy", "true");
  $("status").textContent = "Planning…";
  let plan;
  try {
    plan = await postJson("/v1/plan", request);
  } catch (err) {
    if (seq !== state.planSeq) return;
    $("results").setAttribute("aria-busy", "false");
    if (err instanceof ApiError && (err.status === 422 || err.status === 413)) {
      clearErrors(); banner(null); showErrors(err.detail); setStale("invalid");
      $("status").textContent = "Invalid configuration: see the message above.";
      syncVisibility();  // the model facts: not the last plan's under a refused config.json
    } else {
      banner(err instanceof Unreachable ? `${err.message} Check that it is running; the page retries when you change a field.` : `The server failed: ${err.message}`);
      setStale("offline");
      $("status").textContent = err instanceof Unreachable ? "Server unreachable." : "Server error.";
    }
    return;
  }
  if (seq !== state.planSeq) return;
  $("results").setAttribute("aria-busy", "false");
  clearErrors(); banner(null);
  state.plan = plan;
  state.planned = request;  // the request the plan on show answers (form.js readFacts)
  setStale(false);
  try { render(); } catch (err) { banner(`The page failed to show this plan: ${err.message}`); throw err; }
}

function render() {
  const plan = state.plan, totals = plan.totals, busiest = totals.busiest_stage;
  const onBusiest = plan.calls.filter((c) => c.stages.includes(busiest));
  $("status").textContent = `${fmtInt(plan.world_size)} devices, ${fmtInt(plan.num_microbatches)} micro-batch${plan.num_microbatches > 1 ? "es" : ""} per iteration, `
    + `${plan.calls.length} kinds of call. Busiest stage: ${busiest}.`;
  renderSummary(plan, onBusiest, state.request && state.request.workload.kind);
  renderAssumptions(plan, state.request);
  syncVisibility();  // the model as the server read it (a pasted config.json)
  showResolvedDefaults(plan.assumptions, plan.cluster);
  renderTimeline(plan);
  renderMemory(plan);
  renderParChart(onBusiest);
  renderFilters(plan);
  renderTable();
  const sel = state.selected;
  const keep = sel && plan.calls.find((c) => c.name === sel.name && c.stages.includes(sel.stage));
  const first = [...onBusiest].sort((a, b) => timeIter(b) - timeIter(a))[0];
  selectCall(keep || first, false);
  prefetchTopology(plan);
  showSeeResult();
}

// One column (style.css: max-width 900px): the results sit below the whole form, where a phone at 390 px showed
// none of them without scrolling past it (user5). The header says what the plan answered, with a jump to it.
const ONE_COLUMN = window.matchMedia("(max-width: 900px)");
function showSeeResult() {
  const plan = state.plan, step = plan && plan.step;
  $("see-result").hidden = !ONE_COLUMN.matches || !plan;
  if (!plan) return;
  const inference = state.request && state.request.workload.kind === "inference";
  // a plan that does not fit said so here too (round 14: "Step time 1.40 h, MFU 55.2%." over 982 GB a device of 85.5)
  const unfit = plan.memory && plan.memory.fits === false ? " Does not fit in memory." : "";
  $("see-result-text").textContent = (step ? `${inference ? "Latency" : "Step time"} ${fmtTime(step.time_s)}, MFU ${fmtPct(step.mfu)}.`
    : `${plan.calls.length} kinds of call.`) + unfit;
}

// ---- selected call: every ledger field, the topology, the explorer and the step view ---------------------------
function selectCall(call, save = true) {
  if (!call) return;
  state.selected = { name: call.name, stage: call.stages[0] };
  if (state.serveCard) state.serveCard.drawn = false;  // the detail shows this call, not the KV transfer (serve.js)
  const rows = [...$("ledger").tBodies[0].rows], on = (row) => row.dataset.name === call.name && Number(row.dataset.stage) === call.stages[0];
  for (const row of rows) row.setAttribute("aria-selected", String(on(row)));
  if (rows.some(on)) for (const row of rows) row.tabIndex = on(row) ? 0 : -1;  // the ledger's one tab stop (ledger.js)
  const p = call.placement, link = (p.links || [])[0];
  $("detail-title").textContent = `Selected call: ${call.name} (stage${call.stages.length > 1 ? "s" : ""} ${fmtStages(call.stages)})`;
  $("detail-text").textContent = `${call.op} of ${fmtBytes(call.message_bytes)} over ${call.group_size} ranks `
    + `(${call.num_groups === 1 ? "one group" : `${fmtInt(call.num_groups)} groups at once`}, ${String(p.span).replace("_", "-")}, ${p.nodes_per_group} node${p.nodes_per_group > 1 ? "s" : ""} per group), `
    + `${fmtInt(call.calls_per_iteration)}× per iteration in the ${call.phase} pass with ${call.algorithm}${call.protocol ? ` (${call.protocol})` : ""}: `
    + `${fmtTime(call.time_s)} per call, ${fmtTime(timeIter(call))} per iteration, ${fmtBytes(call.bytes_sent_per_rank)} sent per rank per call, bus bandwidth ${fmtBw(p.busbw_GBps)}. `
    + (link ? `The busiest link is ${link.label} (${link.kind}, ${fmtBw(link.capacity_GBps)}), busy ${(100 * link.utilisation).toFixed(0)}% of the call. ${boundBy(call, link)}` : "")
    + (call.source ? ` Source: ${call.source}.` : "");
  drawTopology(call, state.plan.cluster);
  explore(call);
  presetSteps(call);
  if (save) saveUrl();
}

// The caption from the price's own terms: the share of the call's time that is latency, i.e. its time less its
// bytes over the busiest link's bandwidth (link.bytes / capacity), not a utilisation threshold (it called a
// 134 MB all-gather at 65% link use "latency dominates")
export function latencyShare(call, link) {
  if (!link || !(call.time_s > 0) || !(link.capacity_GBps > 0)) return null;
  const transfer = link.bytes / (link.capacity_GBps * 1e9);
  return Math.min(1, Math.max(0, (call.time_s - transfer) / call.time_s));
}

function boundBy(call, link) {
  const share = latencyShare(call, link);
  if (share === null) return "";
  const transfer = link.bytes / (link.capacity_GBps * 1e9);
  return `Moving ${fmtBytes(link.bytes)} over it takes ${fmtTime(transfer)} of the ${fmtTime(call.time_s)}, so latency is `
    + `${fmtPct(share)} of the call: ${share >= 0.5 ? "latency dominates" : "bandwidth-bound"}.`;
}

function loadLayout(hit) {
  state.selected = null;
  fillForm(applyLayout(state.request, hit));
  $("scenario").value = "";
  schedulePlan(0);
  $("results").scrollIntoView({ block: "start" });
}

// the scenario the history entry on show was planned from (state.js saveUrl), if it is one of ours
const entryScenario = () => { const id = history.state && history.state.scenario; return SCENARIOS.some((s) => s.id === id) ? id : ""; };

// ---- start ------------------------------------------------------------------------------------------------------
const LOADED_BY_START = ["scenario", "model-preset", "cluster-preset"];  // index.html says "Loading…" in each until then

async function start() {
  // the URL is read first: the constants it carries are said at once, not after the server's lists have come
  const saved = loadUrl();
  showActiveCalibration(calibrationOf(saved && saved.r));
  try {
    const [models, clusters, catalogue, versions, choices] = await Promise.all(["/v1/presets/models", "/v1/presets/clusters", "/v1/collectives/algorithms",
      "/v1/collectives/nccl-versions", "/v1/collectives/cluster-choices"].map(getJson));
    Object.assign(state.presets, { models, clusters }); state.catalogue = catalogue;
    setNcclVersions(versions); setClusterChoices(choices);
  } catch {
    banner(`Cannot reach the commplan server at ${location.origin}.`); $("status").textContent = "Server unreachable.";
    for (const id of LOADED_BY_START) options($(id), [["", "not loaded: the server is unreachable"]]);
    return;
  }
  fillPresets();
  fillServeModels(state.presets.models);
  fillStepOps();
  if (saved) { fillForm(saved.r); state.selected = saved.c; $("scenario").value = entryScenario(); } else { fillForm(SCENARIOS[0].request); $("scenario").value = SCENARIOS[0].id; }
  $("config").setAttribute("aria-busy", "false");

  // stale before the facts are read: a config.json typed after a refused one is "Read when planned", not "Not read"
  $("config").addEventListener("input", (e) => { noteEdit(e.target); $("scenario").value = ""; schedulePlan(); syncVisibility(); countSet(); });
  // a blur after typing fires "change" for a value already planned: replan only when the request differs
  $("cluster-preset").addEventListener("change", switchCluster);
  $("config").addEventListener("change", () => { syncVisibility(); if (formChanged()) schedulePlan(); });
  $("config").addEventListener("submit", (e) => { e.preventDefault(); schedulePlan(0); });
  $("scenario").addEventListener("change", () => {
    const s = SCENARIOS.find((x) => x.id === $("scenario").value);
    if (s) { state.selected = null; fillForm(s.request); schedulePlan(0); }
  });
  $("share").addEventListener("click", async () => {
    saveUrl();
    try { await navigator.clipboard.writeText(location.href); $("share").textContent = "Link copied"; } catch { $("share").textContent = "Link in address bar"; }
    setTimeout(() => { $("share").textContent = "Copy link"; }, 2000);
  });
  $("see-result-go").addEventListener("click", () => $("results").scrollIntoView({ block: "start" }));
  ONE_COLUMN.addEventListener("change", showSeeResult);
  $("filter-text").addEventListener("input", renderTable);
  $("filter-par").addEventListener("change", renderTable);
  $("all-columns").addEventListener("change", () => $("ledger").classList.toggle("all-columns", $("all-columns").checked));
  for (const button of document.querySelectorAll("[data-export]")) button.addEventListener("click", () => exportPlan(button.dataset.export));
  $("ledger").tHead.addEventListener("click", (e) => { const key = e.target.closest("button")?.dataset.sort; if (key) sortBy(key); });
  const pick = (row) => selectCall(state.plan.calls.find((c) => c.name === row.dataset.name && c.stages.includes(Number(row.dataset.stage))));
  $("ledger").tBodies[0].addEventListener("click", (e) => { const row = e.target.closest("tr"); if (row) pick(row); });
  $("ledger").tBodies[0].addEventListener("keydown", (e) => {
    const row = e.target.closest("tr"); if (!row) return;
    if (e.key === "Enter" || e.key === " ") { e.preventDefault(); pick(row); }
    const rows = row.parentElement.rows;
    const to = { ArrowDown: row.nextElementSibling, ArrowUp: row.previousElementSibling, Home: rows[0], End: rows[rows.length - 1] }[e.key];
    if (to) { e.preventDefault(); row.tabIndex = -1; to.tabIndex = 0; to.focus(); }
  });
  $("timeline-zoom").addEventListener("click", () => {
    const k = Number($("timeline-mb").value), span = zoomToMicrobatch(k);
    // the range too: "no micro-batch 64 in this step" left the user guessing 1-64 or 0-63 (round 13); the range the
    // chart draws, a rank's chunk passes where a schedule runs several chunks (review r13b #2)
    const n = drawnMicrobatches(), m = state.plan ? state.plan.num_microbatches : 0;
    const chunks = m > 0 && n > m && n % m === 0 ? `, one a chunk pass: ${fmtInt(m)} micro-batches × ${fmtInt(n / m)} chunks a rank` : "";
    $("timeline-zoom-note").textContent = span ? `micro-batch ${k}: ${fmtTime(span[0])} → ${fmtTime(span[1])} over every stage`
      : `no micro-batch ${$("timeline-mb").value.trim() || "given"} in this step` + (n > 1 ? `: they are numbered 0 to ${fmtInt(n - 1)}${chunks}` : n === 1 ? ": its one is numbered 0" : "");
  });
  $("timeline-all").addEventListener("click", () => { zoomToMicrobatch(-2); $("timeline-zoom-note").textContent = ""; });
  // Enter in a box does what its card's button does (round 14: keyboard only, an SLA typed and Enter ran nothing, nor
  // a micro-batch number, nor the Serve card's traffic); the form plans on its own, a textarea keeps its new line.
  // Delegated: the Serve card's pool boxes are built later (serve.js)
  const enterRuns = [["#timeline-mb", "timeline-zoom"], ["#search-topk, #search-headroom", "search-run"],
    ["#serve-sla-ttft, #serve-sla-tpot", "serve-search-run"], ["#calib-nodes, #calib-ranks", "calib-run"],
    ["#serve-card input", "serve-run"], ["#step-n, #step-count", "step-load"]];
  document.addEventListener("keydown", (e) => {
    if (e.key !== "Enter" || !(e.target instanceof HTMLInputElement) || e.target.type === "checkbox") return;
    const button = (enterRuns.find(([boxes]) => e.target.matches(boxes)) || [])[1];
    if (button && !$(button).disabled) { e.preventDefault(); $(button).click(); }
  });
  $("step-op").addEventListener("change", fillStepAlgorithms);
  $("step-load").addEventListener("click", loadSteps);
  $("step-prev").addEventListener("click", () => { stopPlay(); step(-1); });
  $("step-next").addEventListener("click", () => { stopPlay(); step(1); });
  $("step-play").addEventListener("click", togglePlay);
  initSearch(loadLayout);
  initServe();
  if (saved) restoreServe(saved.o, saved.v);  // after initServe, which writes the pools' fields
  initCalibrate((constants) => { state.calibration = constants; $("scenario").value = ""; schedulePlan(0); });
  await runPlan();
  replanServe();
}

// Back and Forward between entries this page wrote (state.js saveUrl) bring their state back in place: the form, the
// selected call and the Serve card, then their plans
async function restoreEntry() {
  const saved = loadUrl();
  if (!saved) return;
  if (!state.request) { location.reload(); return; }  // before the page's first plan: start() reads the URL
  clearTimeout(debounce);
  fillForm(saved.r); state.selected = saved.c; $("scenario").value = entryScenario();
  syncVisibility(); countSet();
  restoreServe(saved.o, saved.v);
  await runPlan(true);
  replanServe();
}

window.commplan = { state, render, runPlan, renderSearch, serveBody, fmtTime, fmtBytes, fmtCount, fields: FIELDS };  // for the browser tests and the curious
// a shared link opened in a tab already on the page changes only the hash: no load, so the page kept its old plan
// (round 11). Writing its own state fires no hashchange; Back and Forward between its own entries do, after the
// popstate that restored them in place: the entry on show says which (history.state). Any other hashchange is a
// link or an edited address, loaded as a new visit.
window.addEventListener("popstate", (e) => { if (e.state && e.state.commplan) restoreEntry(); });
window.addEventListener("hashchange", () => {
  if (history.state && history.state.commplan) return;
  if (!location.hash || location.hash.startsWith("#s=")) location.reload();
});
start();
