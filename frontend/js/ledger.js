// The ledger: key columns that fit at 1280 px (the rest live in the selected-call panel, or on demand),
// sorting, filtering, and the export buttons (the server's /v1/plan/export/{format}).
import { call } from "./api.js";
import { $, download, el, options } from "./dom.js";
import { fmtBytes, fmtInt, fmtStages, fmtTime, PAR_COLORS, timeIter } from "./format.js";
import { state } from "./state.js";

// key: the columns shown by default; extra: shown with "All columns"; narrow: hidden under 600 px
export const COLUMNS = [
  { key: "name", label: "Call", key_: true },
  { key: "parallelism", label: "Par.", narrowHide: true },
  { key: "op", label: "Op" },
  { key: "phase", label: "Phase", extra: true },
  { key: "stages", label: "Stages", fmt: (_, c) => fmtStages(c.stages), value: (c) => c.stages[0], narrowHide: true },
  { key: "group", label: "Group", value: (c) => c.group_size, fmt: (_, c) => `${c.group_size} × ${c.num_groups}`, narrowHide: true },
  { key: "message_bytes", label: "Message", num: true, fmt: fmtBytes },
  { key: "calls_per_iteration", label: "× / iter", num: true, fmt: fmtInt, narrowHide: true },
  { key: "algorithm", label: "Algorithm", extra: true },
  { key: "bytes_sent_per_rank", label: "Sent / call", num: true, fmt: fmtBytes, extra: true },
  { key: "time_s", label: "Time / call", num: true, fmt: fmtTime, narrowHide: true },
  { key: "time_iter", label: "Time / iter", num: true, value: timeIter, fmt: (_, c) => fmtTime(timeIter(c)) },
  { key: "bottleneck", label: "Busiest link", value: (c) => c.placement.bottleneck_link, extra: true },
];
const cellValue = (col, c) => (col.value ? col.value(c) : c[col.key]);
const colClass = (col) => [col.num ? "num" : "", col.extra ? "col-extra" : "", col.narrowHide ? "col-wide" : ""].join(" ").trim();

export function renderFilters(plan) {
  const select = $("filter-par"), chosen = select.value;
  const pars = [...new Set(plan.calls.map((c) => c.parallelism))];
  options(select, [["", "all"], ...pars.map((p) => [p, p])], chosen);
}

export function visibleCalls() {
  const text = $("filter-text").value.trim().toLowerCase(), par = $("filter-par").value;
  const col = COLUMNS.find((c) => c.key === state.sort.key) || COLUMNS[0];
  return state.plan.calls
    .filter((c) => (!par || c.parallelism === par) && (!text || [c.name, c.op, c.phase, c.algorithm, c.placement.bottleneck_link].join(" ").toLowerCase().includes(text)))
    .sort((a, b) => {
      const x = cellValue(col, a), y = cellValue(col, b);
      return (x < y ? -1 : x > y ? 1 : 0) * state.sort.dir;
    });
}

export function renderTable() {
  if (!state.plan) return;
  const head = $("ledger").tHead.rows[0];
  head.replaceChildren(...COLUMNS.map((col) => {
    const sorted = state.sort.key === col.key ? (state.sort.dir > 0 ? "ascending" : "descending") : "none";
    return el("th", { scope: "col", className: colClass(col), "aria-sort": sorted },
      el("button", { type: "button", "data-sort": col.key }, col.label + (sorted === "none" ? "" : sorted === "ascending" ? " ▲" : " ▼")));
  }));
  const sel = state.selected, calls = visibleCalls();
  const named = new Map();
  for (const c of calls) named.set(c.name, (named.get(c.name) || 0) + 1);
  // one tab stop for the whole ledger (the selected row, else the first), the arrows, Home and End move in it
  // (main.js): every row was a tab stop, 35 Tabs between the form and the search for a keyboard user (round 13)
  const chosen = (c) => !!sel && sel.name === c.name && c.stages.includes(sel.stage);
  const stop = Math.max(0, calls.findIndex(chosen));
  $("ledger").tBodies[0].replaceChildren(...calls.map((c, i) => el("tr", {
    tabIndex: i === stop ? 0 : -1, "data-name": c.name, "data-stage": c.stages[0],
    "aria-selected": String(chosen(c)),
  }, COLUMNS.map((col) => {
    const v = cellValue(col, c);
    // under 600 px the Stages column is hidden: a name on several rows says its stages, or a call priced apart per
    // stage set (dp.grads of stage 3, of stage 0, of stages 1,2) reads as identical rows
    const stagesNote = col.key === "name" && named.get(c.name) > 1 ? el("span", { className: "narrow-only stage-note" }, `stage${c.stages.length > 1 ? "s" : ""} ${fmtStages(c.stages)}`) : null;
    const cell = el("td", { className: colClass(col) }, col.fmt ? col.fmt(v, c) : String(v ?? ""), stagesNote);
    if (col.key === "parallelism") cell.style.color = PAR_COLORS[c.parallelism] || "";
    if (col.key === "name") cell.title = c.name;
    return cell;
  }))));
}

export function sortBy(key) {
  state.sort = { key, dir: state.sort.key === key ? -state.sort.dir : (COLUMNS.find((c) => c.key === key).num ? -1 : 1) };
  renderTable();
}

// ---- exports --------------------------------------------------------------------------------------------
const EXPORTS = { json: "commplan-plan.json", csv: "commplan-plan.csv", "nccl-tests": "commplan-nccl-tests.sh", trace: "commplan-trace.json" };
// one rank of one stage: the busiest stage's (docs/exports.md)
const PER_STAGE = { simai: ["workload.txt", "SimAI workload"], aicb: ["workload.csv", "AICB workload"] };

export async function exportPlan(format) {
  if (!state.request) return;
  const note = $("export-note");
  note.textContent = `Preparing ${format}…`;
  try {
    const stage = state.plan && state.plan.totals ? state.plan.totals.busiest_stage : 0;
    const perStage = PER_STAGE[format];
    const query = perStage ? `?stage=${encodeURIComponent(stage)}` : "";
    const response = await call(`/v1/plan/export/${format}${query}`, state.request);
    const omitted = response.headers.get("x-commplan-omitted");
    download(perStage ? `commplan-${format}-stage${stage}-${perStage[0]}` : EXPORTS[format], await response.blob());
    note.textContent = perStage ? `${perStage[1]} of one rank of stage ${stage}.${omitted ? ` Not expressible in that format: ${omitted}.` : ""}` : format === "trace" ? "Open it in ui.perfetto.dev or chrome://tracing." : "";
  } catch (err) {
    note.textContent = `Export failed: ${err.message}`;
  }
}
