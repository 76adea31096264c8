// Memory per rank of each stage (plan.memory, CONTRACT v1.1) as stacked bars against the device capacity;
// a stage over capacity is drawn with a red outline and named in the note.
import { $ } from "./dom.js";
import { axisBytes, axisTooltip, fmtBytes, fmtCapacity } from "./format.js";
import { chart, narrow } from "./charts.js";

export const PARTS = [
  ["params_bytes", "weights", "#2f6fb0"], ["grads_bytes", "gradients", "#5dade2"], ["optimizer_bytes", "optimizer", "#d68910"],
  ["activations_bytes", "activations", "#1e8449"], ["buffers_bytes", "buffers", "#7f8c8d"],
];

export function renderMemory(plan) {
  const memory = plan && plan.memory, section = $("memory-card");
  const stages = memory && Array.isArray(memory.per_stage) ? memory.per_stage : [];
  section.hidden = !stages.length;
  if (!stages.length) return;
  const cap = memory.capacity_bytes;
  const over = stages.filter((s) => s.peak_bytes > cap);
  const series = PARTS.map(([key, name, color]) => ({
    name, type: "bar", stack: "mem", itemStyle: { color }, barMaxWidth: 48,
    data: stages.map((s) => ({ value: s[key] || 0, itemStyle: s.peak_bytes > cap ? { borderColor: "#c0392b", borderWidth: 2 } : {} })),
  }));
  series.push({
    // the series' own colour is the legend's: without it the legend drew the palette's blue diamond beside dark marks
    name: "peak", type: "scatter", symbol: "diamond", symbolSize: 11, itemStyle: { color: "#15202b" },
    data: stages.map((s) => ({ value: s.peak_bytes, itemStyle: { color: s.peak_bytes > cap ? "#c0392b" : "#15202b" } })),
    markLine: { symbol: "none", silent: true, lineStyle: { color: "#c0392b", type: "dashed", width: 2 },
      label: { formatter: `capacity ${fmtBytes(cap)}`, position: "insideEndTop", color: "#a11d1d" }, data: [{ yAxis: cap }] },
  });
  const top = Math.max(cap, ...stages.map((s) => s.peak_bytes)) * 1.08;
  chart("memory").setOption({
    animation: false, legend: { type: "scroll", top: 0 },
    tooltip: { trigger: "axis", formatter: axisTooltip(fmtBytes) },
    grid: { left: narrow() ? 58 : 72, right: 16, top: 40, bottom: 30 },
    xAxis: { type: "category", data: stages.map((s) => `stage ${s.stage}`),
      axisLabel: { color: (_, i) => (stages[i] && stages[i].peak_bytes > cap ? "#c0392b" : "#333"), hideOverlap: true } },
    yAxis: { type: "value", max: top, axisLabel: { formatter: axisBytes, showMaxLabel: false }, splitNumber: narrow() ? 3 : 5 },
    series,
  }, true);
  chart("memory").resize();
  const peak = Math.max(...stages.map((s) => s.peak_bytes));
  const note = $("memory-note");
  note.classList.toggle("bad", over.length > 0);
  note.textContent = over.length
    ? `Does not fit: ${over.map((s) => `stage ${s.stage} peaks at ${fmtBytes(s.peak_bytes)}`).join(", ")} of ${fmtCapacity(cap)} per device.`
    : `Fits: the largest peak is ${fmtBytes(peak)} of ${fmtCapacity(cap)} per device (${Math.round(100 * peak / cap)}%).`;
}
