// The step timeline (plan.step.timeline, CONTRACT v1.1): one lane per stage and stream, a Gantt bar per event,
// grey lanes where a stream is idle (the pipeline bubble on the compute lanes), zoom by wheel or the slider.
// Hundreds of micro-batches: events closer than 1/1500 of the step on one lane are drawn as one block.
/* global echarts */
import { $ } from "./dom.js";
import { axisTime, esc, fmtTime } from "./format.js";
import { chart, narrow } from "./charts.js";

const STREAM_COLORS = { compute: "#2f6fb0", tp: "#5b8fd0", cp: "#8e44ad", ep: "#c0392b", pp: "#d68910", dp: "#1e8449", edp: "#16a085", comm: "#1e8449" };
const MAX_BLOCKS = 4000;

function colorOf(ev) {
  const name = String(ev.name || "").toLowerCase();
  if (name.includes("bubble") || ev.stream === "bubble") return "#c5ced8";
  if (ev.stream === "compute") return /^(b|bwd|backward)/.test(name) ? "#174a7e" : /^(w|wgrad)/.test(name) ? "#6c8fb5" : "#4f8fd6";
  return STREAM_COLORS[ev.stream] || STREAM_COLORS[String(ev.stream).split(/[._-]/)[0]] || "#7f8c8d";
}

// merge near-adjacent events of one lane into blocks while there are too many to draw one by one
export function aggregate(events, span) {
  if (events.length <= MAX_BLOCKS) return { blocks: events.map((e) => ({ ...e, count: 1 })), merged: false };
  const gap = span / 1500, byLane = new Map(), blocks = [];
  for (const e of events) { const k = `${e.stage}|${e.stream}`; if (!byLane.has(k)) byLane.set(k, []); byLane.get(k).push(e); }
  for (const list of byLane.values()) {
    list.sort((a, b) => a.start_s - b.start_s);
    let cur = null;
    for (const e of list) {
      if (cur && e.start_s - cur.end_s <= gap && colorOf(e) === colorOf(cur)) { cur.end_s = Math.max(cur.end_s, e.end_s); cur.count++; }
      else { if (cur) blocks.push(cur); cur = { ...e, count: 1 }; }
    }
    if (cur) blocks.push(cur);
  }
  return { blocks, merged: true };
}

// the server may aggregate a run of micro-batches into one event ("microbatches": how many, CONTRACT v1.1)
function mbLabel(d) {
  if (d.microbatch === null || d.microbatch === undefined) return "";
  return d.microbatches > 1 ? ` (micro-batches ${d.microbatch}–${d.microbatch + d.microbatches - 1})` : ` (micro-batch ${d.microbatch})`;
}

export function renderTimeline(plan) {
  const section = $("timeline-card"), step = plan && plan.step;
  const events = step && Array.isArray(step.timeline) ? step.timeline : [];
  section.hidden = !events.length;
  if (!events.length) return;
  const streams = [...new Set(events.map((e) => String(e.stream)))].sort((a, b) => (a === "compute" ? -1 : b === "compute" ? 1 : a.localeCompare(b)));
  const stages = [...new Set(events.map((e) => e.stage))].sort((a, b) => a - b);
  const lanes = [];
  for (const s of stages) for (const st of streams) if (events.some((e) => e.stage === s && String(e.stream) === st)) lanes.push(`${s}|${st}`);
  const laneIndex = new Map(lanes.map((k, i) => [k, i]));
  const end = Math.max(step.time_s || 0, ...events.map((e) => e.end_s));
  const { blocks, merged } = aggregate(events, end);
  const data = blocks.map((b) => ({
    value: [laneIndex.get(`${b.stage}|${b.stream}`), b.start_s, b.end_s, b.count],
    name: String(b.name), itemStyle: { color: colorOf(b) }, microbatch: b.microbatch, microbatches: b.microbatches,
  }));
  const height = Math.min(720, Math.max(180, lanes.length * (narrow() ? 18 : 24) + 90));
  $("timeline").style.height = `${height}px`;
  const renderItem = (params, api) => {
    const lane = api.value(0), start = api.coord([api.value(1), lane]), stop = api.coord([api.value(2), lane]);
    const h = api.size([0, 1])[1] * 0.7;
    const shape = echarts.graphic.clipRectByRect({ x: start[0], y: start[1] - h / 2, width: Math.max(1, stop[0] - start[0]), height: h },
      { x: params.coordSys.x, y: params.coordSys.y, width: params.coordSys.width, height: params.coordSys.height });
    return shape && { type: "rect", shape, style: api.style() };
  };
  const idle = lanes.map((_, i) => ({ value: [i, 0, end, 0], name: "idle", itemStyle: { color: "#e9eef4" } }));
  chart("timeline").setOption({
    animation: false,
    tooltip: { formatter: (p) => esc(p.name === "idle" ? "idle" : `${p.name}${mbLabel(p.data)}`
      + `${p.value[3] > 1 ? `, ${p.value[3]} events` : ""}: ${fmtTime(p.value[1])} → ${fmtTime(p.value[2])} (${fmtTime(p.value[2] - p.value[1])})`) },
    grid: { left: narrow() ? 76 : 110, right: 16, top: 10, bottom: 60 },
    dataZoom: [{ type: "inside", xAxisIndex: 0, filterMode: "weakFilter" }, { type: "slider", xAxisIndex: 0, height: 18, bottom: 8, filterMode: "weakFilter", labelFormatter: axisTime }],
    xAxis: { type: "value", min: 0, max: end, axisLabel: { formatter: axisTime, hideOverlap: true } },
    yAxis: { type: "category", inverse: true, data: lanes.map((k) => { const [s, st] = k.split("|"); return narrow() ? `s${s} ${st}` : `stage ${s} · ${st}`; }),
      axisLabel: { fontSize: narrow() ? 9 : 11 } },
    series: [
      { type: "custom", name: "idle", renderItem, encode: { x: [1, 2], y: 0 }, data: idle, silent: true, z: 1 },
      { type: "custom", name: "events", renderItem, encode: { x: [1, 2], y: 0 }, data, z: 2 },
    ],
  }, true);
  chart("timeline").resize();
  $("timeline-note").textContent = `${events.length} events on ${lanes.length} lanes over ${fmtTime(end)}. `
    + `Grey: the stream is idle (on compute lanes, the pipeline bubble: ${fmtTime(step.bubble_s)}). `
    + (merged ? `Events closer than ${fmtTime(end / 1500)} on a lane are drawn as one block (${blocks.length} blocks); hover shows how many. ` : "")
    + "Scroll or drag the slider to zoom.";
}
