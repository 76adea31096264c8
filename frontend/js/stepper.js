// Watch an algorithm run: the executable schedule (POST /v1/collectives/schedule), step by step.
import { postJson } from "./api.js";
import { $, el, options } from "./dom.js";
import { fmtBytes, fmtRanks } from "./format.js";
import { state } from "./state.js";

const view = { steps: null, index: 0, timer: null };

export function fillStepOps() {
  options($("step-op"), [...new Set(state.catalogue.map((c) => c.op))].sort().map((o) => [o, o]), "allreduce");
  fillStepAlgorithms();
  $("step-alg").value = "ring";
}

export function fillStepAlgorithms() {
  const op = $("step-op").value, current = $("step-alg").value;
  options($("step-alg"), state.catalogue.filter((c) => c.op === op).map((c) => [c.algorithm, c.algorithm]), current);
}

export function presetSteps(call) {
  if (!state.catalogue.some((c) => c.op === call.op && c.algorithm === call.algorithm)) return;
  $("step-op").value = call.op; fillStepAlgorithms(); $("step-alg").value = call.algorithm;
  const n = Math.max(2, Math.min(call.group_size, 8));
  $("step-n").value = n; $("step-count").value = call.op === "sendrecv" ? 4 : 2 * n;
  if (!view.timer) loadSteps();
}

export async function loadSteps() {
  stopPlay();
  const body = { op: $("step-op").value, algorithm: $("step-alg").value, num_ranks: Number($("step-n").value), count: Number($("step-count").value) };
  if (body.op === "sendrecv") body.num_ranks = 2;
  if (body.algorithm === "hierarchical") body.local_size = body.num_ranks % 2 === 0 ? 2 : 1;
  try {
    view.steps = await postJson("/v1/collectives/schedule", body);
  } catch (err) {
    $("step-grid").textContent = err.message; view.steps = null; $("step-label").textContent = "–";
    return;
  }
  view.index = 0;
  renderStep();
}

function renderStep() {
  const data = view.steps; if (!data) return;
  const idx = view.index, frames = [data.initial, ...data.steps.map((s) => s.holds)], holds = frames[idx];
  const transfers = idx > 0 ? data.steps[idx - 1].transfers : [];
  const received = new Set(transfers.filter((t) => t.src !== t.dst).map((t) => `${t.dst}:${t.dst_slot}`));
  const n = data.num_ranks, slots = data.slot_bytes.length;
  const head = el("tr", {}, el("th", { scope: "col" }, "holder"),
    Array.from({ length: slots }, (_, s) => el("th", { scope: "col" }, `slot ${s}`, el("br"), el("span", { className: "hint" }, fmtBytes(data.slot_bytes[s])))));
  const rows = holds.map((row, h) => el("tr", {}, el("th", { scope: "row" }, h < n ? `rank ${h}` : "switch"), row.map((cell, s) => {
    const full = cell.length / n, tone = Math.round(255 - 120 * full);
    return el("td", { className: received.has(`${h}:${s}`) ? "recv" : "", style: { background: `rgb(${tone},${Math.round(235 - 60 * full)},255)` } }, fmtRanks(cell));
  })));
  $("step-grid").replaceChildren(el("table", {}, el("caption", { className: "visually-hidden" }, "Buffer slots per rank"), el("thead", {}, head), el("tbody", {}, rows)));
  $("step-label").textContent = idx === 0 ? `start (0 / ${data.steps.length})` : `step ${idx} / ${data.steps.length}`;
  const name = (h) => (h < n ? `r${h}` : "switch");
  $("step-transfers").replaceChildren(...transfers.filter((t) => t.src !== t.dst).slice(0, 64).map((t) =>
    el("li", {}, `${name(t.src)} → ${name(t.dst)}: slot ${t.src_slot}${t.dst_slot !== t.src_slot ? `→${t.dst_slot}` : ""}, ${fmtBytes(t.bytes)}${t.reduce ? ", reduce" : ""}`)));
}

export function step(delta) {
  if (!view.steps) return;
  view.index = Math.max(0, Math.min(view.steps.steps.length, view.index + delta));
  renderStep();
}
export function stopPlay() { clearInterval(view.timer); view.timer = null; $("step-play").textContent = "Play"; }
export function togglePlay() {
  if (view.timer) return stopPlay();
  if (!view.steps) return;
  if (view.index >= view.steps.steps.length) view.index = 0;
  $("step-play").textContent = "Pause";
  view.timer = setInterval(() => { if (view.index >= view.steps.steps.length) return stopPlay(); step(1); }, 700);
}
