// "Calibrate from nccl-tests": the user's own nccl-tests output (files or pasted) or a torch.profiler trace ->
// POST /v1/calibrate on the form's cluster -> every measured row before and after, the fitted constants, and a
// button that plans with them (the answer's cluster.calibration: the NCCL groups and, from a trace, the compute
// constants as `kernels`). The constants ride in the request (cluster.calibration), so the URL keeps them.
import { ApiError, postJson } from "./api.js";
import { $, el } from "./dom.js";
import { fmtBw, fmtBytes, fmtInt, fmtPct, fmtTime, sig3 } from "./format.js";
import { state } from "./state.js";

let onUse = () => {}, fitted = null, seq = 0;

export function initCalibrate(useConstants) {
  onUse = useConstants;
  $("calib-run").addEventListener("click", runCalibrate);
  $("calib-use").addEventListener("click", () => fitted && onUse(fitted.cluster.calibration || null));
  $("calib-clear").addEventListener("click", () => onUse(null));
}

// nccl-tests prints bus bandwidth in GB/s with two decimals; rows of a few bytes are far below 1 GB/s
const fmtBusBw = (gbps) => (gbps >= 1 ? `${sig3(gbps)} GB/s` : gbps >= 1e-3 ? `${sig3(gbps * 1e3)} MB/s` : `${sig3(gbps * 1e6)} KB/s`);
const error = (priced, measured) => (measured > 0 ? priced / measured - 1 : null);
const signedPct = (x) => (x === null ? "–" : `${x > 0 ? "+" : ""}${fmtPct(x)}`);

// "efficiency.nic 0.986, network_latency_s.ib 929 ns, kernels.hbm 0.675": seconds as every time on the page
// (fmtTime: "1.23 ns", not "0.00123 µs"), the rest as plain factors
const leaves = (prefix, v) => (v !== null && typeof v === "object"
  ? Object.entries(v).flatMap(([k, x]) => leaves(prefix ? `${prefix}.${k}` : k, x)) : [[prefix, v]]);
export function describeConstants(constants) {
  return leaves("", constants || {}).map(([name, v]) =>
    `${name} ${name.split(".").some((p) => p.endsWith("_s")) ? fmtTime(v) : sig3(v)}`).join(", ") || "none (the defaults fit best)";
}

async function readLogs() {
  const logs = [];
  for (const file of $("calib-files").files) logs.push({ text: await file.text(), name: file.name });
  if ($("calib-text").value.trim()) logs.push({ text: $("calib-text").value, name: "pasted log" });
  const nodes = $("calib-nodes").value.trim(), ranks = $("calib-ranks").value.trim(), op = $("calib-op").value;
  if (nodes !== "") for (const log of logs) log.nodes = Number(nodes);
  if (ranks !== "") for (const log of logs) log.ranks = Number(ranks);
  if (op !== "") for (const log of logs) log.op = op;  // a table pasted without its banner (docs/calibration.md)
  return logs;
}

// a torch.profiler trace: its text, or a .json.gz file as base64 (the request's own form for it: docs/CONTRACT.md)
async function readTrace() {
  const file = $("calib-trace").files[0];
  if (!file) return null;
  if (!file.name.endsWith(".gz")) return file.text();
  const bytes = new Uint8Array(await file.arrayBuffer());
  let binary = "";
  for (let i = 0; i < bytes.length; i += 0x8000) binary += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(binary);
}

// "gemm 398 kernels/step 13.8 ms (18%)..., fitted gemm_ceiling ..., median |error| gemm 25% -> 26%"
function describeTrace(t) {
  const kinds = t.kernels.map((k) => `${k.kind} ${sig3(k.per_step)}/step ${fmtTime(k.seconds_per_step)} (${fmtPct(k.share)})`);
  const errors = Object.keys(t.median_error_before).map((g) => `${g} ${fmtPct(t.median_error_before[g])} → ${fmtPct(t.median_error_after[g])}`);
  // "allreduce 8.20 MB ×2: 1/step at 3.94 ms (2.08 GB/s bus)": the size and group where the trace records them
  const calls = t.collectives.map((c) => `${c.op}${c.message_bytes === null ? "" : ` ${fmtBytes(c.message_bytes)}`}`
    + `${c.group_size ? ` ×${c.group_size}` : ""}: ${sig3(c.trace_calls_per_step)}/step`
    + `${c.trace_s_per_call ? ` at ${fmtTime(c.trace_s_per_call)}` : ""}${c.trace_busbw_GBps ? ` (${fmtBw(c.trace_busbw_GBps)} bus)` : ""}`
    + (c.plan_calls_per_iteration ? `, plan ${c.plan_calls_per_iteration} at ${fmtTime(c.plan_s_per_call)}` : ""));
  const constants = Object.entries(t.constants).flatMap(([name, v]) => (typeof v === "object"
    ? Object.entries(v).map(([dtype, c]) => `${name}.${dtype} ${sig3(c)}`) : [`${name} ${name.endsWith("_s") ? fmtTime(v) : sig3(v)}`]));
  const steps = `${t.steps} steps${t.steps_from === "repeats" ? " (its kernels repeat so often)" : t.steps_from === "none" ? " (assumed)" : ""}`;
  const missing = (t.unclassified || []).map((u) => `${u.name.slice(0, 60)} ×${fmtInt(u.count)}`);
  const h = t.host;  // the host's time per launch where the GPU waited for it (planner/trace_fit.py host_launch)
  const host = h ? ` Host: ${fmtInt(h.host_bound)} of ${fmtInt(h.launches)} launches found the GPU idle, ${fmtInt(h.gaps)} gaps read`
    + (h.host_launch_s === null ? " (too few: host_launch_s not fitted)." : `, median ${fmtTime(h.host_launch_s)} a launch.`) : "";
  return `Trace (${t.device || "GPU not recorded"}, ${steps}): ${kinds.join(", ")}. Fitted compute constants: `
    + `${constants.join(", ") || "none"}; median |kernel error| ${errors.join(", ") || "–"}. Collectives: ${calls.join("; ") || "none"}.`
    + host
    + (missing.length ? ` Kernels of no class: ${missing.join(", ")}.` : "")
    + (t.warnings.length ? ` Warnings: ${t.warnings.join("; ")}.` : "");
}

// "logs.1: ..." (a warning) -> "all_gather.txt: ..."
const named = (text, logs) => text.replace(/^logs\.(\d+)/, (m, i) => (logs[Number(i)] ? logs[Number(i)].name : m));

// a 422 names logs.<i>.<field>: say which file that is
function explain(err, logs) {
  if (!(err instanceof ApiError)) return err.message;
  return err.detail.map((d) => {
    const loc = (d.loc || []).filter((x) => x !== "body");
    const where = loc[0] === "logs" && logs[Number(loc[1])] ? `${logs[Number(loc[1])].name}${loc.length > 2 ? ` (${loc.slice(2).join(".")})` : ""}` : loc.join(".") || "request";
    return `${where}: ${d.msg}`;
  }).join("; ");
}

async function runCalibrate() {
  const mine = ++seq;
  const logs = await readLogs();
  const trace = await readTrace();
  if (!logs.length && trace === null) { $("calib-status").textContent = "Choose nccl-tests output files, paste one, or choose a profiler trace."; return; }
  if (!state.request) return;
  $("calib-run").disabled = true;
  const what = [logs.length ? `${fmtInt(logs.length)} log${logs.length === 1 ? "" : "s"}` : "", trace === null ? "" : "a trace"].filter(Boolean).join(" and ");
  $("calib-status").textContent = `Fitting to ${what} on ${state.request.cluster.preset}…`;
  const cluster = { ...state.request.cluster };
  delete cluster.calibration;  // fit from the defaults, not from an earlier fit
  try {
    const body = await postJson("/v1/calibrate", trace === null ? { cluster, logs } : { cluster, logs, trace });
    if (mine !== seq) return;
    fitted = body;
    renderFit(body, logs);
  } catch (err) {
    if (mine !== seq) return;
    // the last fit's trace summary goes too (round 15: a truncated trace refused "not JSON ... a truncated file?" under
    // the previous trace's whole analysis, its constants and warnings, as if read from this file)
    fitted = null; $("calib-results").hidden = true; $("calib-trace-summary").hidden = true;
    $("calib-status").textContent = `Calibration failed: ${explain(err, logs)}`;
  } finally {
    if (mine === seq) $("calib-run").disabled = false;
  }
}

// the runs found, alike ones once with their count (round 15: 50 logs of one test, 1,000 rows, listed 100 runs, "allreduce
// on 2 nodes × 8 (16 rows, NVIDIA H100 80GB HBM3); allgather ..." over 40 lines of the card)
function runsSaid(runs) {
  const alike = new Map();
  for (const r of runs) {
    const key = `${r.op} on ${r.nodes} node${r.nodes > 1 ? "s" : ""} × ${r.ranks / r.nodes}|${r.devices.join(", ")}`;
    const seen = alike.get(key) || { runs: 0, rows: 0 };
    alike.set(key, { runs: seen.runs + 1, rows: seen.rows + r.rows });
  }
  return [...alike].map(([key, { runs: n, rows }]) => {
    const [what, devices] = key.split("|");
    return `${what} (${n > 1 ? `${fmtInt(n)} runs, ` : ""}${fmtInt(rows)} row${rows > 1 ? "s" : ""}${devices ? `, ${devices}` : ""})`;
  });
}

function renderFit(body, logs) {
  $("calib-trace-summary").hidden = !body.trace;
  $("calib-trace-summary").textContent = body.trace ? describeTrace(body.trace) : "";
  const constants = body.cluster.calibration || {};
  $("calib-use").disabled = !Object.keys(constants).length;
  $("calib-table").hidden = !body.rows.length;
  if (!body.rows.length) {  // a trace alone: its summary, and the button when it fitted compute constants
    $("calib-status").textContent = "";
    $("calib-warnings").hidden = true;
    $("calib-results").hidden = !Object.keys(constants).length;
    return;
  }
  const runs = runsSaid(body.runs);
  $("calib-status").textContent = `Median |error| of the bus bandwidth over ${fmtInt(body.rows.length)} rows: ${fmtPct(body.median_error_before)} with the defaults, `
    + `${fmtPct(body.median_error_after)} fitted. Fitted: ${describeConstants(body.constants)}. Runs: ${runs.join("; ")}.`;
  $("calib-table").tBodies[0].replaceChildren(...body.rows.map((r) => el("tr", {},
    el("td", { title: `${logs[r.log] ? logs[r.log].name : r.log}, line ${r.line}` }, `${logs[r.log] ? logs[r.log].name : r.log}:${r.line}`),
    el("td", { className: "col-wide" }, r.op),
    el("td", { className: "num col-wide" }, `${r.nodes} × ${r.ranks / r.nodes}`),
    el("td", { className: "num" }, fmtBytes(r.size_bytes)),
    el("td", { className: "num" }, fmtBusBw(r.measured_busbw_GBps)),
    el("td", { className: "num col-wide" }, fmtBusBw(r.before_GBps)),
    el("td", { className: "num col-wide" }, signedPct(error(r.before_GBps, r.measured_busbw_GBps))),
    el("td", { className: "num" }, fmtBusBw(r.after_GBps)),
    el("td", { className: "num" }, signedPct(error(r.after_GBps, r.measured_busbw_GBps))),
    el("td", { className: "col-wide" }, r.fitted ? "yes" : "no"),
  )));
  const warnings = body.warnings || [];
  $("calib-warnings").replaceChildren(...warnings.map((w) => el("li", {}, named(w, logs))));
  $("calib-warnings").hidden = !warnings.length;
  $("calib-results").hidden = false;
}

// what the current plan is priced with: the card says it whatever set it (this view, a pasted link)
export function showActiveCalibration(calibration) {
  const active = calibration && Object.keys(calibration).length;
  $("calib-active").textContent = active ? `The plan is priced with calibrated constants: ${describeConstants(calibration)}.`
    : "The plan is priced with the default constants.";
  $("calib-clear").hidden = !active;
}
