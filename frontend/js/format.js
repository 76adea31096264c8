// Human units (issue 14 point 4): 3 significant digits, decimal prefixes (1 GB = 1e9 B, as GB/s), never
// scientific notation. The CLI (app/cli.py human_bytes/human_seconds) follows the same rules.
const BYTE_UNITS = [["PB", 1e15], ["TB", 1e12], ["GB", 1e9], ["MB", 1e6], ["KB", 1e3]];
const TIME_UNITS = [["s", 1], ["ms", 1e-3], ["µs", 1e-6], ["ns", 1e-9]];
const COUNT_UNITS = [["T", 1e12], ["B", 1e9], ["M", 1e6], ["K", 1e3]];

// n (default 3) significant digits as a plain decimal: 1530 -> "1530", 0.01234 -> "0.0123", 0.9996 -> "1.00"
export function sig3(x, n = 3) {
  const r = Number(Number(x).toPrecision(n));
  if (r === 0 || !Number.isFinite(r)) return r === 0 ? "0" : String(r);
  return r.toFixed(Math.max(0, n - 1 - Math.floor(Math.log10(Math.abs(r)))));
}

// the largest unit in which the rounded value is at least 1 (999.6 ms -> "1.00 s")
function human(x, units, floor, n = 3) {
  for (const [unit, scale] of units) if (Math.abs(Number((x / scale).toPrecision(n))) >= 1) return `${sig3(x / scale, n)} ${unit}`;
  return floor(x);
}

export const fmtBytes = (n) => (n === null || n === undefined || Number.isNaN(n) ? "–"
  : Math.abs(n) < 999.5 ? `${Math.round(n)} B` : human(n, BYTE_UNITS));
// below the resolution shown (1 ns, 1 B/s, 0.01%) a value is "< 1 ns" (positive) or "0 s": no "0.00000178 ns"
// of floating-point noise. app/cli.py human_seconds/human_bytes/human_rate/human_percent write the same strings
// (tests/frontend/test_page.py::test_one_formatter_page_and_cli).
const tiny = (x, unit, zero) => (x > 0 ? `< 1 ${unit}` : zero);
// from 1,000 s on, minutes, hours, days or years: a saturated prefill pass read "24500 s", a TTFT "3140000000 s"
// (round 11); app/cli.py human_seconds (planner/words.py LONG_UNITS) the same
const LONG_UNITS = [["years", 365.25 * 86400], ["days", 86400], ["h", 3600], ["min", 60]];
export const fmtTime = (s) => (s === null || s === undefined || Number.isNaN(s) ? "–" : s === 0 ? "0 s"
  : Math.abs(s) < 0.9995e-9 ? tiny(s, "ns", "0 s") : Math.abs(s) >= 999.5 ? human(s, LONG_UNITS, (v) => `${sig3(v / 60)} min`)
    : human(s, TIME_UNITS, (v) => `${sig3(v / 1e-9)} ns`));
export const fmtCount = (n) => (n === null || n === undefined ? "–" : Math.abs(n) < 999.5 ? sig3(n)
  : human(n, COUNT_UNITS));
// one formatter for every integer: toLocaleString built a new one per call (the timeline's tooltips made thousands)
const INT = new Intl.NumberFormat("en-US");
export const fmtInt = (n) => (n === null || n === undefined ? "–" : INT.format(Math.round(n)));
export const fmtPct = (x) => (x === null || x === undefined ? "–" : x === 0 ? "0%"
  : Math.abs(100 * x) < 0.009995 ? (x > 0 ? "< 0.01%" : "0%") : `${sig3(100 * x)}%`);
// a difference of two fractions (MFU A vs B) in percentage points: "0.309 pp", never "-0.309%"
export const fmtPoints = (x) => fmtPct(x).replace("%", " pp");
// GB/s down to B/s (a 0.000186 GB/s bus bandwidth is 186 KB/s)
const RATE_UNITS = [["TB/s", 1e12], ["GB/s", 1e9], ["MB/s", 1e6], ["KB/s", 1e3], ["B/s", 1]];
export const fmtBw = (gbps) => (gbps === null || gbps === undefined || Number.isNaN(gbps) ? "–" : gbps === 0 ? "0 GB/s"
  : Math.abs(gbps) < 0.9995e-9 ? tiny(gbps, "B/s", "0 GB/s") : human(gbps * 1e9, RATE_UNITS));
// memory capacity: decimal GB as everywhere, with the binary GiB beside it (an "80 GB" H100 holds 79.6 GiB)
// a memory warning's GB, as the API writes it (planner/memory.py MemoryReport.warnings: "{bytes / 1e9:.1f} GB"), so
// the page's verdict and the warning below it read one number in one unit (review r14c, 5: "1.05 TB per device" over
// "1048.5 GB per rank")
export const fmtWarnGB = (n) => `${(n / 1e9).toFixed(1)} GB`;
export const fmtCapacity = (n) => `${fmtBytes(n)} (${sig3(n / 2 ** 30)} GiB)`;

// axis ticks: "0" for zero, else the same units (ECharts passes plain numbers) without the trailing zeros of
// 3 significant digits: ticks are round numbers ("1 KB", "10 ms", "1.5 s", not "1.00 KB", "10.0 ms", "1.50 s")
const bare = (text) => text.replace(/(\.\d*?)0+(?=\D|$)/, "$1").replace(/\.(?=\D|$)/, "");
// an axis keeps seconds past 1,000 s (fmtTime's minutes there would mix "800 s" and "16.7 min" on one axis)
export const axisTime = (v) => (v === 0 ? "0" : bare(Math.abs(v) >= 999.5 ? human(v, TIME_UNITS, fmtTime) : fmtTime(v)));
export const axisBytes = (v) => (v === 0 ? "0" : bare(fmtBytes(v)));
export const axisCount = (v) => (v === 0 ? "0" : bare(fmtCount(v)));  // "5", "90", "1.5K": not "5.00", "90.0", "1.50K"

// ticks over a narrow range (8.140 s .. 8.150 s) need more than 3 digits to differ: enough digits to
// resolve a tenth of the range, never fewer than 3
export function fineAxisTime(values) {
  const lo = Math.min(...values), hi = Math.max(...values), span = hi - lo;
  const n = span > 0 && hi > 0 ? Math.min(8, Math.max(3, Math.ceil(Math.log10(hi / (span / 10))))) : 3;
  return (v) => (v === 0 ? "0" : human(v, TIME_UNITS, (x) => `${sig3(x / 1e-9, n)} ns`, n));
}

export const fmtStages = (st) => (st.length > 2 && st[st.length - 1] - st[0] === st.length - 1 ? `${st[0]}–${st[st.length - 1]}` : st.join(","));
export function fmtRanks(ranks) {
  const out = [];
  let i = 0;
  while (i < ranks.length) {
    let j = i;
    while (j + 1 < ranks.length && ranks[j + 1] === ranks[j] + 1) j++;
    out.push(j > i + 1 ? `${ranks[i]}–${ranks[j]}` : ranks.slice(i, j + 1).join(","));
    i = j + 1;
  }
  return out.join(",") || "·";
}

export const PAR_COLORS = { tp: "#2f6fb0", cp: "#8e44ad", ep: "#c0392b", pp: "#d68910", dp: "#1e8449", edp: "#16a085", embedding: "#7f8c8d" };
export const utilColor = (u) => (u >= 0.9 ? "#c0392b" : u >= 0.5 ? "#e67e22" : u > 0 ? "#27ae60" : "#c5ced8");
export const timeIter = (c) => c.time_s * c.calls_per_iteration;

// ECharts writes tooltip text as HTML: every string that reaches a tooltip goes through esc()
const ESC = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };
export const esc = (text) => String(text ?? "").replace(/[&<>"']/g, (c) => ESC[c]);

// an axis-trigger tooltip: the category, then "series: value" per series, all escaped
export const axisTooltip = (fmt) => (params) => {
  const list = Array.isArray(params) ? params : [params];
  const head = list.length ? esc(list[0].axisValueLabel ?? list[0].name) : "";
  return [head, ...list.filter((p) => p.value !== 0 && p.value != null).map((p) => `${p.marker || ""}${esc(p.seriesName)}: ${esc(fmt(Array.isArray(p.value) ? p.value[1] : p.value))}`)].join("<br>");
};
