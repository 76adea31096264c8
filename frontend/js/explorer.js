// Time against message size for every algorithm on the selected call's groups (POST /v1/plan/explore).
// The chart is cleared the moment another call is selected and carries the name of the call it shows, and an
// answer that arrives after a newer selection is dropped: a chart never sits under another call's title.
import { postJson } from "./api.js";
import { $ } from "./dom.js";
import { axisBytes, axisTime, esc, fmtBytes, fmtInt, fmtTime } from "./format.js";
import { chart, narrow } from "./charts.js";
import { state } from "./state.js";

let seq = 0;

// the explorer emptied, with a note, while the detail card shows something that is not a ledger call (the serving
// KV transfer): it kept the training call's curves under the transfer's topology (round 10); a pending answer is
// dropped as after a newer selection
export function clearExplorer(note) {
  ++seq;
  chart("explorer").clear();
  $("explorer").dataset.call = "";
  $("explorer-title").textContent = "Algorithm explorer";
  $("explorer-hint").hidden = true;  // no call's groups to plot (the KV transfer drawn): the note says why
  // and no empty plot: a blank 320 px stood above the note, beside the drawn transfer (round 13)
  $("explorer").hidden = true;
  $("explorer-note").textContent = note;
}

export async function explore(call) {
  const mine = ++seq;
  const label = `${call.name} (stage ${call.stages[0]})`;
  if ($("explorer").hidden) { $("explorer").hidden = false; chart("explorer").resize(); }
  chart("explorer").clear();
  $("explorer").dataset.call = "";
  $("explorer-title").textContent = `Algorithm explorer: ${label}`;
  $("explorer-hint").hidden = false;
  $("explorer-note").textContent = `Pricing every algorithm for ${call.name}…`;
  let body;
  try {
    body = await postJson("/v1/plan/explore", { request: state.request, call: call.name, stage: call.stages[0] });
  } catch (err) {
    if (mine === seq) $("explorer-note").textContent = tooBig(err, call) || err.message;
    return;
  }
  if (mine !== seq) return;
  // who priced each curve (SeriesOut.pricer): NCCL's cost model, solid; a textbook schedule priced step by step
  // on the graph, dashed. The legend says which, so "direct" below NCCL's pick is not read as what NCCL runs.
  const shown = (s) => `${s.algorithm} · ${s.pricer === "library" ? "NCCL model" : "schedule"}`;
  const series = body.series.filter((s) => s.time_s.some((t) => t !== null)).map((s) => ({
    name: shown(s), type: "line", showSymbol: false, lineStyle: { type: s.pricer === "library" ? "solid" : "dashed" },
    data: body.sizes.map((size, i) => [size, s.time_s[i]]).filter(([, t]) => t !== null),
  }));
  const byName = Object.fromEntries(body.series.map((s) => [s.algorithm, s]));
  const byShown = Object.fromEntries(body.series.map((s) => [shown(s), s]));
  series.push({
    name: "auto", type: "scatter", symbolSize: 9, itemStyle: { color: "#111" },
    data: body.sizes.map((size, i) => ({ value: [size, byName[body.auto[i]]?.time_s[i]], name: body.auto[i] })).filter((d) => d.value[1] != null),
  });
  if (series.length > 1) series[0].markLine = { symbol: "none", label: { formatter: "this call" }, lineStyle: { type: "dashed", color: "#444" }, data: [{ xAxis: body.message_bytes }] };
  chart("explorer").setOption({
    animation: false, legend: { type: "scroll", top: 0 },
    tooltip: { trigger: "item", formatter: (p) => esc(`${p.seriesName === "auto" ? `auto → ${p.name}` : p.seriesName}: ${fmtBytes(p.value[0])}, ${fmtTime(p.value[1])}`
      + (byShown[p.seriesName]?.note ? ` (${byShown[p.seriesName].note})` : "")) },
    grid: { left: narrow() ? 58 : 70, right: 32, top: 50, bottom: 40 },  // right: room for half the last size label ("10.0 GB")
    xAxis: { type: "log", name: "message", nameLocation: "middle", nameGap: 24, axisLabel: { formatter: axisBytes, hideOverlap: true } },
    yAxis: { type: "log", axisLabel: { formatter: axisTime } },
    series,
  }, true);
  $("explorer").dataset.call = label;
  // A note also rides on drawn curves (how NCCL's model priced them: those go in the tooltip); only a curve
  // without a price at any size is missing from the chart.
  const skipped = body.series.filter((s) => s.time_s.every((t) => t === null)).map((s) => (s.note ? `${s.algorithm} (${s.note})` : s.algorithm));
  const cross = body.auto.map((a, i) => (i && a !== body.auto[i - 1] ? `${body.auto[i - 1]} → ${a} near ${fmtBytes(body.sizes[i])}` : null)).filter(Boolean);
  const priced = body.groups_priced === body.num_groups
    ? `${body.num_groups === 1 ? "its one group" : `all ${fmtInt(body.num_groups)} groups`} priced together`
    : `${body.groups_priced} of its ${body.num_groups} groups priced together (the others alike by the cluster's symmetry)`;
  const library = body.series.some((s) => s.pricer === "library");
  const pricers = library
    ? "Solid: NCCL's cost model (what NCCL would run; auto picks among these). Dashed: textbook schedules priced step by step on the graph, for comparison. "
    : "Every curve is a textbook schedule priced step by step on the graph; auto is what the library would pick. ";
  $("explorer-note").textContent = `${body.group_size} ranks, ${priced}. ${pricers}`
    + (cross.length ? `Auto switches ${cross.join("; ")}. ` : `Auto picks ${body.auto[0]} at every size. `) + (skipped.length ? `Not shown: ${skipped.join("; ")}.` : "");
}

// a call too large to price every algorithm step by step (the service's work budget, docs/hardening.md): said in
// words, not as the server's budget variable
function tooBig(err, call) {
  if (!(err && err.status === 422 && /budget/.test(err.message))) return "";
  const groups = call.num_groups === 1 ? "one group" : `${fmtInt(call.num_groups)} groups`;
  return `Not explored: pricing every algorithm step by step on ${groups} of ${fmtInt(call.group_size)} ranks is more work than this `
    + "server allows per request. The plan's own price for it is above.";
}
