// Time against message size for every algorithm on the selected call's groups (POST /v1/plan/explore).
// The chart is cleared the moment another call is selected and carries the name of the call it shows, and an
// answer that arrives after a newer selection is dropped: a chart never sits under another call's title.
import { postJson } from "./api.js";
import { $ } from "./dom.js";
import { axisBytes, axisTime, esc, fmtBytes, fmtTime } from "./format.js";
import { chart, narrow } from "./charts.js";
import { state } from "./state.js";

let seq = 0;

export async function explore(call) {
  const mine = ++seq;
  const label = `${call.name} (stage ${call.stages[0]})`;
  chart("explorer").clear();
  $("explorer").dataset.call = "";
  $("explorer-title").textContent = `Algorithm explorer: ${label}`;
  $("explorer-note").textContent = `Pricing every algorithm for ${call.name}…`;
  let body;
  try {
    body = await postJson("/v1/plan/explore", { request: state.request, call: call.name, stage: call.stages[0] });
  } catch (err) {
    if (mine === seq) $("explorer-note").textContent = err.message;
    return;
  }
  if (mine !== seq) return;
  const series = body.series.filter((s) => s.time_s.some((t) => t !== null)).map((s) => ({
    name: s.algorithm, type: "line", showSymbol: false,
    data: body.sizes.map((size, i) => [size, s.time_s[i]]).filter(([, t]) => t !== null),
  }));
  const byName = Object.fromEntries(body.series.map((s) => [s.algorithm, s]));
  series.push({
    name: "auto", type: "scatter", symbolSize: 9, itemStyle: { color: "#111" },
    data: body.sizes.map((size, i) => ({ value: [size, byName[body.auto[i]]?.time_s[i]], name: body.auto[i] })).filter((d) => d.value[1] != null),
  });
  if (series.length > 1) series[0].markLine = { symbol: "none", label: { formatter: "this call" }, lineStyle: { type: "dashed", color: "#444" }, data: [{ xAxis: body.message_bytes }] };
  chart("explorer").setOption({
    animation: false, legend: { type: "scroll", top: 0 },
    tooltip: { trigger: "item", formatter: (p) => esc(`${p.seriesName === "auto" ? `auto → ${p.name}` : p.seriesName}: ${fmtBytes(p.value[0])}, ${fmtTime(p.value[1])}`
      + (byName[p.seriesName]?.note ? ` (${byName[p.seriesName].note})` : "")) },
    grid: { left: narrow() ? 58 : 70, right: 20, top: 50, bottom: 40 },
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
    ? `${body.num_groups === 1 ? "its one group" : `all ${body.num_groups} groups`} priced together`
    : `${body.groups_priced} of its ${body.num_groups} groups priced together (the others alike by the cluster's symmetry)`;
  $("explorer-note").textContent = `${body.group_size} ranks, ${priced}. `
    + (cross.length ? `Auto switches ${cross.join("; ")}. ` : `Auto picks ${body.auto[0]} at every size. `) + (skipped.length ? `Not shown: ${skipped.join("; ")}.` : "");
}
