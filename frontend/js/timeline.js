// The step timeline (plan.step.timeline, CONTRACT v1.1; the same events the Perfetto export writes): one lane per
// stage and stream, a Gantt bar per event, grey lanes where a stream is idle, zoom by wheel, the slider or to one
// micro-batch. Issue 25 item 5, all from the plan answer, no second model:
// - a block the server aggregated (the steady state of many micro-batches, planner/pipeline.py MAX_EVENTS) is
//   drawn per micro-batch: the pipeline's own layout (forward at t + i x period, its backward right after, the
//   per-micro-batch pass times read off the same stage's warm-up and cool-down blocks); its exposed
//   communication, drawn at the block's end by the server, goes to the end of each micro-batch's pass;
// - a "pp" lane per stage: where its compute stream waits on the pipeline (fill, drain and the sends), the
//   gaps of its compute lane before its last backward; the tooltip lists the stage's pipeline sends;
// - per-iteration communication (DP gradient reduction, parameter gather) split into the part under the
//   stage's compute (overlapped, light) and the part the step waits for (exposed, solid);
// - per-pass communication (tp, cp, ep, ZeRO-3's dp, offload's pcie): the part the pass waits for (exposed, solid,
//   at the pass's end) and the part behind its compute (overlapped, light, from the pass's start), both from the
//   server (`overlapped` events); the note gives, on the busiest stage, each parallelism's calls serialised
//   against what is drawn exposed and overlapped;
// - recompute (stream "recompute", part of a backward's compute): a narrow bar inside the backward it belongs to;
// - ZB-H1, ZBV, DualPipe and DualPipeV: the server lays out each op of the schedule's own order where the step's
//   pricing runs it (one block a micro-batch), DualPipe's with its direction, named on hover.
// Hundreds of micro-batches: events closer than 1/1500 of the step on one lane are drawn as one block.
/* global echarts */
import { $, el } from "./dom.js";
import { axisTime, esc, fmtInt, fmtTime, timeIter } from "./format.js";
import { chart, narrow } from "./charts.js";

// tp was #5b8fd0, a blue 3.8 apart (CIE76 ΔE) from the forward pass's #4f8fd6: a new user could not tell exposed
// tp traffic from forward compute (round 10); the pink is at least 14 from every other colour drawn
// (tests/frontend/test_page.py test_timeline_colours_apart)
const STREAM_COLORS = { compute: "#2f6fb0", tp: "#d63384", cp: "#8e44ad", ep: "#c0392b", pp: "#d68910", dp: "#1e8449", edp: "#16a085", comm: "#1e8449", pcie: "#7f8c8d" };
const RECOMPUTE = "#e67e22";
// a stream's colour mixed with white: the light shade of its overlapped (hidden) part
const lighten = (hex, k = 0.6) => `#${[1, 3, 5].map((i) => Math.round(parseInt(hex.slice(i, i + 2), 16) * (1 - k) + 255 * k).toString(16).padStart(2, "0")).join("")}`;
const MAX_BLOCKS = 4000;
const MAX_EXPANDED = 20000;  // beyond, aggregated blocks stay aggregated

function colorOf(ev) {
  const name = String(ev.name || "").toLowerCase();
  if (name.includes("bubble") || ev.stream === "bubble") return "#c5ced8";
  if (ev.stream === "recompute") return RECOMPUTE;
  if (ev.wait) return "#f3d19c";
  if (ev.stream === "compute") return /^(b|bwd|backward)/.test(name) ? "#174a7e" : /^(w|wgrad)/.test(name) ? "#6c8fb5" : "#4f8fd6";
  const base = STREAM_COLORS[ev.stream] || STREAM_COLORS[String(ev.stream).split(/[._-]/)[0]] || "#7f8c8d";
  return ev.overlapped ? lighten(base) : base;
}

// the legend: what each colour drawn means, in the order of the lanes (a new user read the blues as one thing);
// a compute colour lists the passes drawn in it ("forward / optimizer")
const nameOf = (b) => (b.wait ? "pipeline wait" : b.stream === "recompute" ? "recompute" : colorOf(b) === "#c5ced8" ? "bubble"
  : b.stream === "compute" ? (/^(w|wgrad)/i.test(String(b.name)) ? "weight gradients" : String(b.name))
  : `${b.stream} ${b.overlapped ? "overlapped" : "exposed"}`);
function legendOf(blocks) {
  const seen = new Map([["#e9eef4", new Set(["idle"])]]);
  for (const b of blocks) { const c = colorOf(b); if (!seen.has(c)) seen.set(c, new Set()); seen.get(c).add(nameOf(b)); }
  return [...seen].map(([c, names]) => [c, [...names].join(" / ")]);
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
// DualPipe's blocks carry their micro-batch's direction (0 enters at stage 0, 1 at the last stage; dualpipe13b)
function mbLabel(d) {
  if (d.microbatch === null || d.microbatch === undefined || d.microbatch < 0) return "";
  const way = d.direction === null || d.direction === undefined ? "" : `, direction ${d.direction}`;
  return d.microbatches > 1 ? ` (micro-batches ${d.microbatch}–${d.microbatch + d.microbatches - 1}${way})` : ` (micro-batch ${d.microbatch}${way})`;
}

// ---- aggregated blocks drawn per micro-batch -------------------------------------------------------------------
const isPass = (e) => e.stream !== "compute" && e.microbatches > 0;
export function expand(events) {
  const aggregated = events.filter((e) => e.stream === "compute" && e.microbatches > 1);
  if (!aggregated.length) return { events, expanded: 0 };
  const extra = aggregated.reduce((n, e) => n + e.microbatches * (e.name === "1f1b" ? 2 : 1), 0);
  if (events.length + 2 * extra > MAX_EXPANDED) return { events, expanded: 0 };
  const key = (e) => `${e.stage}|${e.microbatch}|${e.microbatches}`;
  const perMb = (stage, name) => {  // one micro-batch's pass on this stage, from its warm-up / cool-down block
    const b = events.find((e) => e.stage === stage && e.stream === "compute" && e.name === name && e.microbatches > 0);
    return b ? (b.end_s - b.start_s) / b.microbatches : null;
  };
  const comm = new Map();  // the exposed communication the server drew at an aggregated block's end
  for (const e of events) if (isPass(e) && e.microbatches > 1) { if (!comm.has(key(e))) comm.set(key(e), []); comm.get(key(e)).push(e); }
  const out = events.filter((e) => !(e.microbatches > 1 && (e.stream === "compute" || comm.has(key(e)))));
  for (const block of aggregated) {
    const n = block.microbatches, span = block.end_s - block.start_s, mine = comm.get(key(block)) || [];
    const passes = [];  // [name, micro-batch, start, end]
    if (block.name === "1f1b") {
      const per = span / n, f = perMb(block.stage, "forward"), b = perMb(block.stage, "backward");
      const [fd, bd] = f !== null && b !== null && f + b <= per * 1.000001 ? [f, b] : [per / 3, (2 * per) / 3];
      for (let i = 0; i < n; i++) {
        const t = block.start_s + i * per;
        passes.push(["forward", block.microbatch + i, t, t + fd], ["backward", i, t + fd, t + fd + bd]);
      }
    } else {
      for (let i = 0; i < n; i++) passes.push([block.name, block.microbatch + i, block.start_s + (i * span) / n, block.start_s + ((i + 1) * span) / n]);
    }
    for (const [name, mb, start, end] of passes) {
      out.push({ ...block, name, microbatch: mb, microbatches: 1, start_s: start, end_s: end, split: true });
      const one = (c, a, b) => out.push({ ...c, microbatch: mb, microbatches: 1, start_s: a, end_s: b, split: true });
      let t = end;  // this pass's share of the exposed communication, at its end as the server draws it
      for (const c of mine) {
        if (c.overlapped || c.stream === "recompute" || c.name.split(" ").pop() !== name) continue;
        const dur = (c.end_s - c.start_s) / n;
        one(c, t - dur, t);
        t -= dur;
      }
      // the recompute (of a backward) and the hidden communication, from the pass's start as the server draws
      // them, never past where its exposed part begins
      const cursor = new Map();
      for (const c of mine) {
        const dur = (c.end_s - c.start_s) / n;
        if (c.stream === "recompute") { if (name === "backward") one(c, start, Math.min(t, start + dur)); continue; }
        if (!c.overlapped || c.name.split(" ").pop() !== name) continue;
        const a = cursor.get(c.stream) ?? start, b = Math.min(t, a + dur);
        cursor.set(c.stream, b);
        if (b > a) one(c, a, b);
      }
    }
  }
  return { events: out, expanded: aggregated.length };
}

// ---- the pipeline waits, and overlapped vs exposed per-iteration communication --------------------------------------
// blocks closer than `eps` touch: passes laid at t + i x period end a rounding error (1e-16 to 1e-12 s) before the next
// starts, and each such gap was drawn as a "pipeline wait" (round 14: Llama-3.1 405B at TP8 PP1 on one node drew 476
// of them, a whole pp lane and its legend, on a plan with no pipeline)
const union = (list, eps = 0) => {
  const out = [];
  for (const [a, b] of list.sort((x, y) => x[0] - y[0])) {
    if (out.length && a <= out[out.length - 1][1] + eps) out[out.length - 1][1] = Math.max(out[out.length - 1][1], b);
    else out.push([a, b]);
  }
  return out;
};
// a billionth of the step: far below a pixel at any zoom the slider reaches, far above float64's rounding of a sum
const TOUCH = 1e-9;

export function derive(events) {
  const out = [], stages = [...new Set(events.map((e) => e.stage))];
  const hasPp = events.some((e) => e.stream === "pp");
  const eps = TOUCH * events.reduce((m, e) => Math.max(m, e.end_s), 0);
  for (const s of stages) {
    const busy = union(events.filter((e) => e.stage === s && e.stream === "compute" && e.name !== "optimizer").map((e) => [e.start_s, e.end_s]), eps);
    if (!busy.length) continue;
    if (!hasPp) {  // gaps before the last backward: fill, drain-side waits and sends
      let t = 0;
      for (const [a, b] of busy) { if (a - t > eps) out.push({ stage: s, stream: "pp", name: "pipeline wait", microbatch: -1, microbatches: 0, start_s: t, end_s: a, wait: true }); t = b; }
    }
    for (const e of events.filter((x) => x.stage === s && x.stream !== "compute" && x.microbatches === 0)) {
      const pieces = [];
      let t = e.start_s;
      for (const [a, b] of busy) {
        if (b <= t || a >= e.end_s) continue;
        if (a > t) pieces.push([t, a, false]);
        pieces.push([Math.max(a, t), Math.min(b, e.end_s), true]);
        t = Math.min(b, e.end_s);
      }
      if (t < e.end_s) pieces.push([t, e.end_s, false]);
      e.replaced = pieces.some(([, , o]) => o);
      if (e.replaced) for (const [a, b, o] of pieces) out.push({ ...e, name: `${e.name} (${o ? "overlapped" : "exposed"})`, start_s: a, end_s: b, overlapped: o });
    }
  }
  return [...events.filter((e) => !e.replaced), ...out];
}

// on the busiest stage: each parallelism's calls serialised against what the timeline draws exposed and overlapped
function hiddenNote(plan, events) {
  const stage = plan.totals.busiest_stage, by = plan.totals.by_parallelism || {};
  const parts = ["tp", "cp", "ep"].filter((k) => by[k] && by[k].time_s > 0).map((k) => {
    // an inference pass is one forward block with its calls inside (planner/step.py _inference): the note said
    // "tp 6.50 ms of calls: 0 s exposed, 0 s overlapped, 6.50 ms once per iteration (outside the passes)" beside
    // the card's 6.50 ms exposed (round 14, the 70B decode scenario)
    if (!events.some((e) => e.stage === stage && e.stream === k)) return `${k} ${fmtTime(by[k].time_s)} of calls, inside the compute blocks (not drawn apart)`;
    const mine = events.filter((e) => e.stage === stage && e.stream === k && e.microbatches > 0);
    const sum = (list) => list.reduce((t, e) => t + e.end_s - e.start_s, 0);
    const exposed = sum(mine.filter((e) => !e.overlapped)), hidden = sum(mine.filter((e) => e.overlapped));
    const rest = by[k].time_s - exposed - hidden;
    return `${k} ${fmtTime(by[k].time_s)} of calls: ${fmtTime(exposed)} exposed, ${fmtTime(hidden)} overlapped`
      + (rest > 1e-6 * by[k].time_s ? `, ${fmtTime(rest)} once per iteration (outside the passes)` : "");
  });
  if (by.pp && by.pp.time_s > 0) parts.push(`pp sends ${fmtTime(by.pp.time_s)}, inside the pipeline waits`);
  return parts.length ? `Stage ${stage}: ${parts.join("; ")}. ` : "";
}

// one micro-batch's recompute on the busiest stage: its blocks add up to micro-batches x that (planner/step.py)
function recomputeOf(plan, events) {
  const mine = events.filter((e) => e.stream === "recompute" && e.stage === plan.totals.busiest_stage);
  return mine.reduce((t, e) => t + e.end_s - e.start_s, 0) / Math.max(1, plan.num_microbatches);
}

function ppCalls(plan, stage) {
  return (plan.calls || []).filter((c) => c.parallelism === "pp" && c.stages.includes(stage))
    .map((c) => `${c.name} ${fmtTime(c.time_s)} × ${fmtInt(c.calls_per_iteration)} = ${fmtTime(timeIter(c))}`);
}

// zoom the chart to one micro-batch: the span of its blocks over every stage
export function zoomToMicrobatch(k) {
  const events = state_events;
  const mine = events.filter((e) => e.microbatch === k && e.microbatches === 1);
  const c = chart("timeline");
  // micro-batch k's blocks stand out; the others are faded (the whole step: none faded)
  const faded = (list) => list.map((d) => ({ ...d, itemStyle: { ...d.itemStyle, opacity: !mine.length || d.microbatch === k ? 1 : 0.3 } }));
  c.setOption({ series: [{}, { data: faded(state_data[0]) }, { data: faded(state_data[1]) }] });
  if (!mine.length) { c.dispatchAction({ type: "dataZoom", start: 0, end: 100 }); return false; }
  const lo = Math.min(...mine.map((e) => e.start_s)), hi = Math.max(...mine.map((e) => e.end_s));
  c.dispatchAction({ type: "dataZoom", startValue: lo, endValue: hi });
  return [lo, hi];
}
let state_events = [], state_data = [[], []];
// the micro-batch numbers the chart draws (and zoomToMicrobatch finds): 0 to this - 1. Under interleaved, V and
// DualPipe schedules planner/pipeline.py timeline numbers a rank's chunk passes, 0 to m·v - 1, not m's micro-batches
// (the zoom note said "numbered 0 to 15" beside a zoom to 20 that worked: review r13b #2)
export const drawnMicrobatches = () => Math.max(-1, ...state_events.filter((e) => e.microbatches === 1).map((e) => e.microbatch)) + 1;

export function renderTimeline(plan) {
  const section = $("timeline-card"), step = plan && plan.step;
  const raw = step && Array.isArray(step.timeline) ? step.timeline : [];
  section.hidden = !raw.length;
  if (!raw.length) return;
  const { events: perMb, expanded } = expand(raw);
  const events = derive(perMb.map((e) => ({ ...e })));
  state_events = events;
  $("timeline-mb").max = String(Math.max(0, drawnMicrobatches() - 1));
  const streams = [...new Set(events.map((e) => String(e.stream)))].filter((s) => s !== "recompute")
    .sort((a, b) => (a === "compute" ? -1 : b === "compute" ? 1 : a.localeCompare(b)));
  const stages = [...new Set(events.map((e) => e.stage))].sort((a, b) => a - b);
  const lanes = [];
  for (const s of stages) for (const st of streams) if (events.some((e) => e.stage === s && String(e.stream) === st)) lanes.push(`${s}|${st}`);
  const laneIndex = new Map(lanes.map((k, i) => [k, i]));
  const laneOf = (b) => laneIndex.get(`${b.stage}|${b.stream === "recompute" ? "compute" : b.stream}`);
  // a pass's communication says which part it is; DP's per-iteration pieces already do (derive)
  const label = (b) => (b.microbatches > 0 && b.stream !== "compute" && b.stream !== "recompute" ? `${b.name} (${b.overlapped ? "overlapped" : "exposed"})` : String(b.name));
  const end = Math.max(step.time_s || 0, ...events.map((e) => e.end_s));
  const { blocks, merged } = aggregate(events, end);
  const sends = new Map();  // a stage's pipeline sends, written once: every wait block of the stage lists them
  const sendsOf = (stage) => { if (!sends.has(stage)) sends.set(stage, ppCalls(plan, stage)); return sends.get(stage); };
  const item = (b) => ({
    value: [laneOf(b), b.start_s, b.end_s, b.count],
    name: label(b), itemStyle: { color: colorOf(b) }, microbatch: b.microbatch, microbatches: b.microbatches, direction: b.direction,
    split: !!b.split, sends: b.wait ? sendsOf(b.stage) : null,
  });
  const data = blocks.filter((b) => b.stream !== "recompute").map(item);
  const redo = blocks.filter((b) => b.stream === "recompute").map(item);
  state_data = [data, redo];
  // at least 14 px a lane, past the 720 px the chart keeps for up to 26 lanes: 79 lanes (DeepSeek-V3, 16 stages) had
  // 8 px each under 11 px labels, "stage 0 · dp" printed over "stage 0 · pp" (round 11)
  const height = Math.min(Math.max(720, lanes.length * 14 + 90), Math.max(180, lanes.length * (narrow() ? 18 : 24) + 90));
  $("timeline").style.height = `${height}px`;
  const bars = (share) => (params, api) => {
    const lane = api.value(0), start = api.coord([api.value(1), lane]), stop = api.coord([api.value(2), lane]);
    const h = api.size([0, 1])[1] * share;
    const shape = echarts.graphic.clipRectByRect({ x: start[0], y: start[1] - h / 2, width: Math.max(1, stop[0] - start[0]), height: h },
      { x: params.coordSys.x, y: params.coordSys.y, width: params.coordSys.width, height: params.coordSys.height });
    return shape && { type: "rect", shape, style: api.style() };
  };
  const renderItem = bars(0.7);
  const idle = lanes.map((_, i) => ({ value: [i, 0, end, 0], name: "idle", itemStyle: { color: "#e9eef4" } }));
  // the step's end (the axis's max, or the zoomed window's) is labelled too ("18.8 s"); the round tick just
  // before it ("18 s") crowded it, so a tick closer to it than the two labels' half-widths plus a gap is blank
  // (ECharts' hideOverlap only hides labels that overlap; it kept "18 s 18.8 s")
  const apartFromTheEnd = (v) => {
    const axis = chart("timeline").getModel()?.getComponent("xAxis", 0)?.axis;
    if (!axis) return axisTime(v);
    const hi = axis.scale.getExtent()[1];
    const apart = Math.abs(axis.dataToCoord(hi) - axis.dataToCoord(v));
    const need = (axisTime(v).length + axisTime(hi).length) * (narrow() ? 3 : 3.5) + 12;  // px: ~6-7 px a character
    return v < hi && apart < need ? "" : axisTime(v);
  };
  chart("timeline").setOption({
    animation: false,
    tooltip: { formatter: (p) => esc(p.name === "idle" ? "idle" : `${p.name}${mbLabel(p.data)}`
      + `${p.value[3] > 1 ? `, ${p.value[3]} events` : ""}: ${fmtTime(p.value[1])} → ${fmtTime(p.value[2])} (${fmtTime(p.value[2] - p.value[1])})`
      + (p.data.split ? "; one micro-batch of a block the server aggregated" : "")
      + (p.data.sends && p.data.sends.length ? `; this stage's pipeline sends: ${p.data.sends.join(", ")}` : "")) },
    grid: { left: narrow() ? 76 : 110, right: 16, top: 10, bottom: 60 },
    dataZoom: [{ type: "inside", xAxisIndex: 0, filterMode: "weakFilter" }, { type: "slider", xAxisIndex: 0, height: 18, bottom: 8, filterMode: "weakFilter", labelFormatter: axisTime }],
    xAxis: { type: "value", min: 0, max: end, axisLabel: { formatter: apartFromTheEnd, hideOverlap: true } },
    yAxis: { type: "category", inverse: true, data: lanes.map((k) => { const [s, st] = k.split("|"); return narrow() ? `s${s} ${st}` : `stage ${s} · ${st}`; }),
      axisLabel: { fontSize: narrow() ? 9 : 11 } },
    // progressive: 0: every block drawn in one pass. Past ECharts' progressiveThreshold (3,000 items) a custom series
    // drew in chunks and stopped after the first: DeepSeek-V3's 25,578 blocks showed two of 79 lanes (round 11)
    series: [
      { type: "custom", name: "idle", renderItem, encode: { x: [1, 2], y: 0 }, data: idle, silent: true, z: 1, progressive: 0 },
      { type: "custom", name: "events", renderItem, encode: { x: [1, 2], y: 0 }, data, z: 2, progressive: 0 },
      // recompute: a narrow bar inside the backward it is part of (same lane, drawn over it)
      { type: "custom", name: "recompute", renderItem: bars(0.3), encode: { x: [1, 2], y: 0 }, data: redo, z: 3, progressive: 0 },
    ],
  }, true);
  chart("timeline").resize();
  $("timeline-legend").replaceChildren(...legendOf(blocks).map(([color, name]) =>
    el("li", {}, el("span", { className: "swatch", style: { background: color }, "aria-hidden": "true" }), name)));
  const plural = (n, word) => `${fmtInt(n)} ${word}${n === 1 ? "" : "s"}`;
  $("timeline-note").textContent = `${plural(events.length, "event")} on ${plural(lanes.length, "lane")} over ${fmtTime(end)}. `
    + (expanded ? `${expanded} aggregated block${expanded > 1 ? "s" : ""} drawn per micro-batch. ` : "")
    + (events.some((e) => e.direction !== undefined && e.direction !== null)
      ? `DualPipe: micro-batches of direction 0 enter at stage 0, those of direction 1 at stage ${stages[stages.length - 1]} at the same time; the blocks are its own order as the step prices it (hover names the direction). ` : "")
    + `Grey: the stream is idle (the pipeline bubble: ${fmtTime(step.bubble_s)} on the critical stage). `
    + (events.some((e) => e.wait) ? "Orange (pp lanes): the compute stream waits on the pipeline (fill, drain, sends). " : "")
    + (events.some((e) => e.overlapped) ? "Light shades: communication under compute (overlapped); solid: what the step waits for (exposed). " : "")
    + (events.some((e) => ["tp", "cp", "ep"].includes(e.stream)) ? "Per pass, tp, cp and ep are drawn exposed at its end and overlapped from its start (where inside the pass is schematic). " : "")
    + (redo.length ? `Orange bars inside backwards: recompute, the forward re-run (${fmtTime(recomputeOf(plan, events))} per micro-batch on stage ${plan.totals.busiest_stage}). ` : "")
    + hiddenNote(plan, events)
    + (merged ? `Events closer than ${fmtTime(end / 1500)} on a lane are drawn as one block (${fmtInt(blocks.length)} blocks); hover shows how many. ` : "")
    + "Scroll or drag the slider to zoom.";
}
