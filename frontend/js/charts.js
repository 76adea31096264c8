// ECharts instances (one per container, resized with the window) and the by-parallelism chart.
/* global echarts */
import { $ } from "./dom.js";
import { axisTime, axisTooltip, fmtTime, PAR_COLORS, timeIter } from "./format.js";
import { state } from "./state.js";

export function chart(id) {
  if (!state.charts[id]) {
    state.charts[id] = echarts.init($(id), null, { renderer: "canvas" });
    window.addEventListener("resize", () => state.charts[id].resize());
  }
  return state.charts[id];
}

// narrow screens: fewer, shorter labels
export const narrow = () => window.innerWidth < 600;

export function renderParChart(onBusiest) {
  const pars = [...new Set(onBusiest.map((c) => c.parallelism))];
  const ops = [...new Set(onBusiest.map((c) => c.op))];
  const series = ops.map((op) => ({
    name: op, type: "bar", stack: "time",
    data: pars.map((p) => onBusiest.filter((c) => c.parallelism === p && c.op === op).reduce((s, c) => s + timeIter(c), 0)),
  }));
  chart("chart").setOption({
    animation: false, tooltip: { trigger: "axis", formatter: axisTooltip(fmtTime) }, legend: { type: "scroll", top: 0 },
    grid: { left: narrow() ? 58 : 72, right: 16, top: 40, bottom: 30 },
    xAxis: { type: "category", data: pars, axisLabel: { color: (v) => PAR_COLORS[v] || "#333" } },
    yAxis: { type: "value", axisLabel: { formatter: axisTime }, splitNumber: narrow() ? 3 : 5 },
    series,
  }, true);
}
