// "Find a layout": POST /v1/search (NDJSON progress) for this model, workload and cluster; the results as a
// table and a step-time vs memory scatter with its Pareto front; a click loads a layout into the form; two
// ticked results (or one and the current plan) compared side by side.
import { postJson, search } from "./api.js";
import { $, el } from "./dom.js";
import { axisBytes, esc, fineAxisTime, fmtBytes, fmtCount, fmtInt, fmtPct, fmtPoints, fmtTime, timeIter } from "./format.js";
import { chart, narrow } from "./charts.js";
import { plainLimits } from "./refusals.js";
import { state } from "./state.js";

let controller = null, onLoad = () => {}, searchedHeadroom = null;
const ticked = new Set();

export function initSearch(loadLayout) {
  onLoad = loadLayout;
  $("search-run").addEventListener("click", runSearch);
  $("search-stop").addEventListener("click", () => controller && controller.abort());
  $("compare-run").addEventListener("click", runCompare);
}

export const peakOf = (hit) => Math.max(0, ...((hit.memory && hit.memory.per_stage) || []).map((s) => s.peak_bytes));
// every dimension the search varies that tells two results apart: sequence parallelism, expert TP, a pipeline
// schedule other than the one the virtual stages imply (1f1b, or interleaved with v > 1), and the opt-in ones
// (uneven first/last stages, a pipeline layout, the EP dispatcher) included
export const layoutName = (p) => ["tp", "pp", "dp", "cp", "ep"].filter((k) => k === "tp" || k === "pp" || k === "dp" || (p[k] || 1) > 1)
  .map((k) => `${k.toUpperCase()}${p[k] ?? 1}`).join(" ") + ((p.expert_tp || 1) > 1 ? ` ETP${p.expert_tp}` : "")
  + (p.zero_stage ? ` ZeRO-${p.zero_stage}` : "") + (p.virtual_pipeline_stages > 1 ? ` v${p.virtual_pipeline_stages}` : "")
  + (p.pp > 1 && p.pipeline_schedule && !["1f1b", "interleaved"].includes(p.pipeline_schedule) ? ` ${p.pipeline_schedule}` : "")
  + (p.first_stage_layers ? ` first ${p.first_stage_layers}` : "") + (p.last_stage_layers ? ` last ${p.last_stage_layers}` : "")
  + (p.pipeline_layout ? ` layout ${p.pipeline_layout}` : "") + (p.ep_dispatch ? ` ${p.ep_dispatch}` : "")
  + (p.sequence_parallel ? " SP" : "") + (p.framework && p.framework !== "megatron" ? ` (${p.framework})` : "");

// the workload fields a result sets (app/schemas/search.py SearchResultOut): the search varies them, so the form's
// are not sent, and a loaded result gives each its own value (a field it leaves null is left out)
const SEARCHED = ["micro_batch_size", "activation_recompute", "recompute_method", "recompute_num_layers", "recompute_modules",
  "selective_ac_option", "cpu_offloading_num_layers"];

export function applyLayout(request, hit) {
  const workload = { ...request.workload };
  for (const k of SEARCHED) { if (hit[k] === null || hit[k] === undefined) delete workload[k]; else workload[k] = hit[k]; }
  return { ...request, parallel: { ...hit.parallel }, workload };
}

// the form's whole training workload less the searched fields: its precision, FP8 recipe, kernels, documents and
// dropout price every layout as they price the plan. Round 12: only the global batch and the sequence were sent, so
// under an FP8 recipe the search ranked bf16 layouts (14.6 s at best) and its best, TP2 PP8 CP2 v10, opened as a
// 12.8 s plan; the best under FP8 is TP4 PP4 v20 at 12.2 s.
function searchBody() {
  const r = state.request;
  const workload = { ...r.workload, kind: "training" };
  for (const k of SEARCHED) delete workload[k];
  const constraints = {};
  // sent as set, 0 included: the server's default is 5% (app/schemas/search.py DEFAULT_HEADROOM)
  const headroom = $("search-headroom").value.trim() === "" ? 5 : Number($("search-headroom").value);
  constraints.memory_headroom = headroom / 100;
  if ($("search-framework").checked) constraints.framework = r.parallel.framework || "megatron";
  for (const k of ["tp", "pp"]) if ($(`search-keep-${k}`).checked) constraints[k] = r.parallel[k] || 1;
  return { model: r.model, workload, cluster: r.cluster, constraints, top_k: Number($("search-topk").value) || 20 };
}

// a refusal on this card's own controls names and marks them (round 11: "Keep the framework" with Megatron-LM 2021-22,
// a flavour the search does not propose, read as a bare message); others are the plan's, said by the server's words
const SEARCH_FIELDS = { "constraints.framework": "search-framework", "constraints.memory_headroom": "search-headroom", top_k: "search-topk",
  "constraints.tp": "search-keep-tp", "constraints.pp": "search-keep-pp" };
function refusal(err) {
  const d = err.detail && err.detail[0], path = d && d.loc ? d.loc.slice(1).join(".") : "", input = SEARCH_FIELDS[path] && $(SEARCH_FIELDS[path]);
  // a space over the service's limit names constraints the card sets two of (round 12: DeepSeek-V3 on 2,048 GPUs,
  // 10,131,372 layouts, named tp and pp, which the card had no control for)
  if (path === "constraints" && d.msg.includes("to narrow it")) {
    const boxes = ["tp", "pp"].map((k) => $(`search-keep-${k}`)).filter((box) => !box.checked);
    for (const box of boxes) box.setAttribute("aria-invalid", "true");
    const p = state.request.parallel;
    return `${plainLimits(d.msg)}. Here: ${boxes.length ? `tick ${boxes.map((box) => box.labels[0].textContent.trim()).join(" or ")} (the form's TP ${p.tp || 1}, PP ${p.pp || 1})`
      : "the form's TP and PP are kept already; narrow cp or micro_batch_size over HTTP or the CLI (docs/search.md)"}.`;
  }
  // the operator's settings and long numbers in words, as on the form and the Serve card (review r15d #6)
  if (!input) return plainLimits(err.message);
  input.setAttribute("aria-invalid", "true");
  // the box is a percent, the field a fraction (the server's "less than 1, got 1.0" read beside "100": r11b)
  const msg = path === "constraints.memory_headroom"
    ? `must be at least 0% and under 100% of the device's memory, got ${input.value}%` : plainLimits(d.msg);
  return `${input.labels[0].textContent.trim()} (${path}): ${msg}`;
}

async function runSearch() {
  if (!state.request) return;
  if (state.request.workload.kind !== "training") { $("search-status").textContent = "The search ranks training layouts: switch the workload to training."; return; }
  controller = new AbortController();
  $("search-run").disabled = true; $("search-stop").hidden = false; $("search-progress").hidden = false;
  setProgress(0, 1); $("search-status").textContent = "Searching…";
  for (const node of $("search-card").querySelectorAll("[aria-invalid]")) node.removeAttribute("aria-invalid");
  try {
    const body = searchBody();
    searchedHeadroom = 100 * (body.constraints.memory_headroom || 0);
    const result = await search(body, (p) => {
      setProgress(p.done, p.total);
      $("search-status").textContent = `${fmtInt(p.done)} of ${fmtInt(p.total)} layouts, ${fmtInt(p.evaluated ?? p.done)} evaluated, ${fmtInt(p.feasible)} fit`
        + (p.best ? `; best so far ${layoutName(p.best.parallel)}, ${fmtTime(p.best.step_time_s)}` : "");
    }, controller.signal);
    state.search = result; ticked.clear();
    setProgress(1, 1);
    renderSearch();
  } catch (err) {
    $("search-status").textContent = err.name === "AbortError" ? "Search stopped." : `Search failed: ${refusal(err)}`;
  } finally {
    $("search-run").disabled = false; $("search-stop").hidden = true; controller = null;
  }
}

function setProgress(done, total) {
  const frac = total ? Math.min(1, done / total) : 0;
  $("search-bar").style.width = `${(100 * frac).toFixed(1)}%`;
  $("search-progress").setAttribute("aria-valuenow", String(Math.round(100 * frac)));
}

// POST /v1/search takes no options block (app/schemas/search.py SearchRequest): it prices every layout with the
// default overlap and NCCL settings, while a loaded layout keeps the form's. Said, with the fields, where the form
// sets any (round 12: a row's step time and the plan it opened differed without a word). The page's own
// links_per_call and the algorithm left on auto are no setting.
function unsearched(options) {
  const set = [];
  const walk = (o, path) => { for (const [k, v] of Object.entries(o || {})) {
    if (v && typeof v === "object" && !Array.isArray(v)) walk(v, `${path}${k}.`);
    else if (!(path === "" && (k === "links_per_call" || (k === "algorithm" && v === "auto")))) set.push(`options.${path}${k}`);
  } };
  walk(options, "");
  return set.length ? ` The search prices every layout with the default options, not this plan's ${set.join(", ")}: `
    + "a loaded layout keeps them, so its step time may differ from its row's." : "";
}

// the layouts no other result beats in both step time and memory
export function paretoFront(hits) {
  const pts = hits.map((h, i) => ({ i, x: peakOf(h), y: h.step.time_s })).sort((a, b) => a.x - b.x || a.y - b.y);
  const front = [];
  let best = Infinity;
  for (const p of pts) if (p.y < best) { front.push(p); best = p.y; }
  return front;
}

// nothing fits: where memory ruled out every layout sized, one of them and what would help (round 14: Llama-3.1 405B
// on one DGX H100 ended "8,820 need more memory than the device has less 5% headroom. No layout fits.")
function noFit(result) {
  const over = (result.pruned || {}).memory || 0, example = (result.pruned_examples || {}).memory;
  if (!over || over < result.evaluated - (result.bounded_before_memory || 0)) return "No layout fits.";
  return `No layout fits: every layout sized needs more memory than a device holds${example ? `, e.g. "${example}"` : ""}; `
    + "more nodes, a GPU with more memory or a lower memory headroom would let some fit.";
}

export function renderSearch() {
  const result = state.search;
  if (!result) return;
  const hits = result.results || [];
  $("search-status").textContent = searchSummary(result) + (hits.length ? " Click a row or a point to load the layout." : ` ${noFit(result)}`)
    + unsearched(state.request && state.request.options);
  $("search-results").hidden = !hits.length;
  if (!hits.length) return;
  const front = paretoFront(hits), onFront = new Set(front.map((p) => p.i));
  $("search-table").tBodies[0].replaceChildren(...hits.map((h, i) => el("tr", { tabIndex: 0, "data-index": i, "aria-selected": "false", onclick: (e) => { if (!e.target.closest("input")) onLoad(h); },
    onkeydown: (e) => { if (e.key === "Enter") onLoad(h); } },
    el("td", { className: "num" }, String(i + 1)),
    el("td", {}, layoutName(h.parallel), onFront.has(i) ? el("span", { className: "tag", title: "on the Pareto front" }, "front") : null),
    el("td", { className: "num col-wide" }, String(h.micro_batch_size)),
    el("td", { className: "col-wide" }, String(h.activation_recompute)),
    el("td", { className: "num" }, fmtTime(h.step.time_s)),
    el("td", { className: "num col-wide" }, fmtPct(h.step.mfu)),
    el("td", { className: "num" }, fmtBytes(peakOf(h))),
    el("td", {}, el("input", { type: "checkbox", "aria-label": `compare layout ${i + 1}`, checked: ticked.has(i),
      onchange: (e) => { if (e.target.checked) ticked.add(i); else ticked.delete(i); $("compare-run").disabled = ticked.size < 1 || ticked.size > 2; } })),
  )));
  $("compare-run").disabled = ticked.size < 1 || ticked.size > 2;
  const c = chart("search-chart");
  c.setOption({
    animation: false, legend: { top: 0 },
    tooltip: { formatter: (p) => esc(p.seriesName === "Pareto front" ? "Pareto front" : `#${p.dataIndex + 1} ${layoutName(hits[p.dataIndex].parallel)}: ${fineAxisTime(hits.map((h) => h.step.time_s))(p.value[1])}, ${fmtBytes(p.value[0])}`) },
    grid: { left: narrow() ? 58 : 72, right: 32, top: 36, bottom: 44 },  // right: room for half the last memory label
    xAxis: { type: "value", name: "peak memory per device", nameLocation: "middle", nameGap: 26, scale: true, splitNumber: narrow() ? 3 : 5,
      axisLabel: { formatter: axisBytes, hideOverlap: true } },
    yAxis: { type: "value", scale: true, axisLabel: { formatter: fineAxisTime(hits.map((h) => h.step.time_s)) } },
    series: [
      { name: "layouts", type: "scatter", symbolSize: 10, itemStyle: { color: "#2f6fb0" }, data: hits.map((h, i) => ({ value: [peakOf(h), h.step.time_s], itemStyle: { color: onFront.has(i) ? "#c0392b" : "#2f6fb0" } })) },
      { name: "Pareto front", type: "line", step: "end", symbol: "none", itemStyle: { color: "#c0392b" }, lineStyle: { color: "#c0392b", type: "dashed" }, data: front.map((p) => [p.x, p.y]) },
    ],
  }, true);
  c.resize();
  c.off("click");
  c.on("click", (p) => { if (p.seriesName === "layouts") onLoad(hits[p.dataIndex]); });
}

// ---- compare ------------------------------------------------------------------------------------------------
async function runCompare() {
  const hits = [...ticked].sort((a, b) => a - b).map((i) => state.search.results[i]);
  const base = state.request;
  const sides = hits.length === 2 ? hits.map((h, k) => ({ label: `#${[...ticked].sort((a, b) => a - b)[k] + 1} ${layoutName(h.parallel)}`, request: applyLayout(base, h) }))
    : [{ label: `current: ${layoutName(base.parallel)}`, request: base }, { label: `#${[...ticked][0] + 1} ${layoutName(hits[0].parallel)}`, request: applyLayout(base, hits[0]) }];
  $("compare").hidden = false;
  $("compare-body").replaceChildren(el("p", { className: "hint" }, "Planning both layouts…"));
  let plans;
  try {
    plans = await Promise.all(sides.map((s) => postJson("/v1/plan", s.request)));
  } catch (err) {
    $("compare-body").replaceChildren(el("p", { className: "bad" }, `Compare failed: ${err.message}`));
    return;
  }
  renderCompare(sides.map((s) => s.label), plans);
}

const metric = (p, f) => { try { return f(p); } catch { return null; } };
// [label, value, format, format of the difference (MFU: percentage points, not a percentage), higher is better]
const METRICS = [
  ["Step time", (p) => p.step.time_s, fmtTime, fmtTime, false],
  ["MFU", (p) => p.step.mfu, fmtPct, fmtPoints, true],
  ["Tokens / s", (p) => p.step.tokens_per_s, fmtCount, fmtCount, true],
  ["Exposed communication", (p) => p.step.exposed_comm_s, fmtTime, fmtTime, false],
  ["Peak memory per device", (p) => Math.max(...p.memory.per_stage.map((s) => s.peak_bytes)), fmtBytes, fmtBytes, false],
  ["Busiest stage's calls if serialised", (p) => p.totals.time_s, fmtTime, fmtTime, false],
];

function worstByName(plan) {
  const out = new Map();
  for (const c of plan.calls) out.set(c.name, Math.max(out.get(c.name) || 0, timeIter(c)));
  return out;
}

export function renderCompare(labels, plans) {
  const head = el("tr", {}, el("th", { scope: "col" }, ""), el("th", { scope: "col", className: "num" }, "A"), el("th", { scope: "col", className: "num" }, "B"),
    el("th", { scope: "col", className: "num" }, "B − A"));
  const rows = METRICS.map(([name, f, fmt, dfmt, higher]) => {
    const [a, b] = plans.map((p) => metric(p, f));
    if (a === null && b === null) return null;
    const d = a !== null && b !== null ? b - a : null;
    const good = d === null || d === 0 ? "" : (d > 0) === higher ? "better" : "worse";
    return el("tr", {}, el("th", { scope: "row" }, name), el("td", { className: "num" }, fmt(a)), el("td", { className: "num" }, fmt(b)),
      el("td", { className: `num ${good}` }, d === null ? "–" : `${d > 0 ? "+" : d < 0 ? "−" : ""}${dfmt(Math.abs(d))}`));
  });
  // a call one plan has not costs it nothing: cp.attn.kv, absent from TP8 PP4 and 21.2 ms a step in TP2 PP8 CP2, is
  // +21.2 ms (it read "–", though the rows are ranked by that same difference; round 13)
  const callDiff = (a, b) => { const d = (b ?? 0) - (a ?? 0);
    return `${d >= 0 ? "+" : "−"}${fmtTime(Math.abs(d))}${a === undefined ? " (new)" : b === undefined ? " (gone)" : ""}`; };
  const [wa, wb] = plans.map(worstByName);
  const names = [...new Set([...wa.keys(), ...wb.keys()])]
    .map((n) => ({ n, a: wa.get(n), b: wb.get(n) }))
    .filter(({ a, b }) => a !== b)  // unchanged calls are not differences (it listed "+0 s" rows)
    .sort((x, y) => Math.abs((y.b || 0) - (y.a || 0)) - Math.abs((x.b || 0) - (x.a || 0))).slice(0, 15);
  const diff = names.map(({ n, a, b }) => el("tr", {}, el("td", {}, n), el("td", { className: "num" }, a === undefined ? "absent" : fmtTime(a)),
    el("td", { className: "num" }, b === undefined ? "absent" : fmtTime(b)),
    el("td", { className: "num" }, callDiff(a, b))));
  $("compare-body").replaceChildren(
    el("p", { className: "compare-legend" }, el("strong", {}, "A"), ` = ${labels[0]} · `, el("strong", {}, "B"), ` = ${labels[1]}`),
    el("div", { className: "table-wrap" }, el("table", { className: "compare-table" }, el("thead", {}, head), el("tbody", {}, rows.filter(Boolean)))),
    el("h3", {}, "Ledger differences ", el("span", { className: "hint" }, "(time per iteration on the worst stage, largest changes first)")),
    el("div", { className: "table-wrap" }, el("table", { className: "compare-table" },
      el("thead", {}, el("tr", {}, el("th", { scope: "col" }, "Call"), ["A", "B", "B − A"].map((l) => el("th", { scope: "col", className: "num" }, l)))),
      el("tbody", {}, diff))),
  );
}

// ---- the counts in words, agreeing with each other and with the progress bar ----------------------------------
// space_size = evaluated + layouts a rule dropped before timing; feasible = evaluated - those over memory - those
// bounded before their memory was computed (bounded_before_memory)
// (SearchOut, app/schemas/search.py). A pruning reason is the request field whose rule failed; its words come
// with the answer (pruned_reasons: app/schemas/search.py REASON_WORDS, which the CLI prints too).
const reasonWords = (result, key) => (result.pruned_reasons || {})[key] || String(key);

export function searchSummary(result) {
  const pruned = result.pruned || {}, examples = result.pruned_examples || {};
  const rules = Object.entries(pruned).filter(([k]) => k !== "memory").sort((a, b) => b[1] - a[1]);
  const ruled = rules.reduce((n, [, v]) => n + v, 0);
  const over = pruned.memory || 0;
  const space = result.space_size ?? result.evaluated + ruled;
  const headroom = searchedHeadroom ?? (Number($("search-headroom").value) || 0);  // the one searched with
  let text = `${fmtInt(space)} layouts in ${fmtTime(result.elapsed_s)}: ${fmtInt(result.evaluated)} evaluated (memory and step time)`;
  if (ruled) {
    text += `, ${fmtInt(ruled)} ruled out before timing (${rules.map(([k, v]) => `${fmtInt(v)} by the ${reasonWords(result, k)}`
      + (examples[k] ? `, e.g. "${examples[k]}"` : "")).join("; ")})`;
  }
  text += Object.entries(result.pruned_up_front || {}).map(([k, v]) => `; ${fmtInt(v)} more refused up front, not in the ${fmtInt(space)}, by the ${reasonWords(result, k)}` + ((result.pruned_up_front_examples || {})[k] ? `, e.g. "${result.pruned_up_front_examples[k]}"` : "")).join("");
  text += `. Of the ${result.bounded_before_memory ? "evaluated whose memory was sized" : "evaluated"}, ${fmtInt(result.feasible)} fit and ${fmtInt(over)} need more memory than the device has`
    + `${headroom > 0 ? ` less ${Number(headroom.toPrecision(3))}% headroom` : ""}.`;
  if (result.bounded_before_memory) text += ` ${fmtInt(result.bounded_before_memory)} more were not sized: their layers' compute alone was already slower than the results kept.`;
  if (result.bounded) text += ` ${fmtInt(result.bounded)} of those that fit were not timed in full: their compute alone was already slower than the results kept.`;
  return text;
}
