// The headline cards: step time, MFU, tokens/s and exposed communication when the plan has a step block
// (CONTRACT v1.1), then the communication figures, labelled so nobody reads them as a step time.
import { $, el } from "./dom.js";
import { fmtBytes, fmtCount, fmtPct, fmtTime, fmtWarnGB, PAR_COLORS, timeIter } from "./format.js";

const card = (label, value, hint, extra, id) => el("div", { className: "card metric-card", "data-card": id },
  el("div", { className: "metric-label" }, label), el("div", { className: "metric" }, value), hint ? el("div", { className: "hint" }, hint) : null, extra);

// a call name breaks after its dots and underscores, never mid-word ("pp.activatio n_grad" at 390 px)
const breakable = (name) => String(name).split(/(?<=[._])/).flatMap((part, i) => (i ? [el("wbr"), part] : [part]));

// what a plan the step cards cannot stand for is, in words (round 14): Llama-3.1 405B on one DGX H100 read "Step time
// 1.40 h, MFU 55.2%, Tokens / s 1.66 K" in full colour for 982 GB a device of 85.5, the reason in a warning above; the
// Serve card has said so since round 13 (serve.js verdict)
function verdict(plan, kind) {
  const m = plan.memory;
  if (!plan.step || !m || m.fits !== false) return "";
  const stages = m.per_stage || [], over = stages.filter((s) => s.peak_bytes > m.capacity_bytes);
  const worst = over.reduce((a, s) => (s.peak_bytes > a.peak_bytes ? s : a), over[0] || null);
  // the memory warning's words and unit (planner/memory.py MemoryReport.warnings: "stage 0 needs 1048.5 GB per rank >
  // 85.5 GB capacity"), which the warnings list below repeats in full with the largest part
  const why = worst ? `stage ${worst.stage} needs ${fmtWarnGB(worst.peak_bytes)} per rank > ${fmtWarnGB(m.capacity_bytes)} capacity`
    + `${over.length > 1 ? ` (${over.length} of ${stages.length} stages over)` : ""}`
    : "a stage does not fit in device memory";
  return `Does not fit: ${why}. The ${kind === "inference" ? "latency" : "step time"}, MFU and tokens/s below are what it would do if it fit, not a run: see Memory per device.`;
}

export function renderSummary(plan, onBusiest, kind) {
  const t = plan.totals, stage = t.per_stage[t.busiest_stage] || { bytes_sent: 0, message_bytes: 0 };
  const cards = [];
  const step = plan.step, words = verdict(plan, kind);
  $("plan-verdict").textContent = words;
  $("plan-verdict").hidden = !words;
  $("summary").classList.toggle("unrunnable", !!words);  // the step's cards greyed (style.css)
  if (step) {
    const inference = kind === "inference";
    cards.push(card(inference ? "Latency" : "Step time", fmtTime(step.time_s),
      `compute ${fmtTime(step.compute_s)} · bubble ${fmtTime(step.bubble_s)}`, null, "step"));
    // the peak is the GPUs' dense peak in the dtype the GEMMs run in (planner/step.py _mfu): an FP8 recipe's fp8
    // peak is twice bf16's, so a faster FP8 step reads a lower MFU (round 12: 42.1% -> 24.9% with no word why)
    cards.push(card("MFU", fmtPct(step.mfu), "model FLOPs / the GPUs' dense peak in the GEMMs' dtype (fp8 under an FP8 recipe)", null, "mfu"));
    cards.push(card("Tokens / s", fmtCount(step.tokens_per_s), "whole job", null, "tokens"));
    // critical stage: its calls not hidden behind compute, plus the pipeline sends it waits for in the fill and
    // drain (planner/step.py). Those sends belong to other stages, so this can exceed the next card's figure.
    cards.push(card("Exposed communication", fmtTime(step.exposed_comm_s),
      t.per_stage.length > 1 ? `stage ${step.critical_stage}: not hidden behind compute, with the pipeline fill and drain sends it waits for`
        : "not hidden behind compute", null, "exposed"));
  }
  const shares = Object.entries(t.by_parallelism).filter(([, v]) => v.time_s > 0).sort((a, b) => b[1].time_s - a[1].time_s);
  const bar = el("div", { className: "bar", "aria-hidden": "true" }, shares.map(([k, v]) =>
    el("span", { style: { width: `${(100 * v.time_s / (t.time_s || 1)).toFixed(2)}%`, background: PAR_COLORS[k] || "#999" } })));
  const legend = shares.filter(([, v]) => v.time_s >= 0.005 * t.time_s).map(([k, v]) => `${k} ${(100 * v.time_s / (t.time_s || 1)).toFixed(0)}%`).join(" · ");
  // named for what it sums (one stage's own calls, totals.time_s), so it never reads as a bound on the exposed
  // figure: on Llama-3 70B TP8 PP4 that was 5.55 s exposed against 5.53 s "if serialised"
  cards.push(card(`Stage ${t.busiest_stage} calls if serialised`, fmtTime(t.time_s),
    `its own calls back to back, no overlap: not a step time${t.per_stage.length > 1 ? ", nor other stages' sends it waits for" : ""}`, null, "comm"));
  cards.push(card("Sent per rank per iteration", fmtBytes(stage.bytes_sent), `${fmtBytes(stage.message_bytes)} of messages`, null, "sent"));
  cards.push(card("Share by parallelism", legend || "–", null, bar, "share"));
  const top = [...onBusiest].sort((a, b) => timeIter(b) - timeIter(a))[0];
  if (top) cards.push(card("Largest cost", breakable(top.name), `${fmtTime(timeIter(top))} per iteration; busiest link ${top.placement.bottleneck_link || "–"}`, null, "top"));
  $("summary").replaceChildren(...cards);
  const warnings = [...(plan.warnings || []), ...(plan.memory && plan.memory.fits === false && !words ? ["The plan does not fit in device memory: see Memory per device."] : [])];
  $("warnings").replaceChildren(...warnings.map((w) => el("li", {}, String(w))));
  $("warnings").hidden = !warnings.length;
}
