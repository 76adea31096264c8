// The first placed group of the selected call on the cluster, links coloured by utilisation. The server hands
// the subgraph (POST /v1/topology: vertices, and edges carrying the link ids placement.links reports); this
// module only lays it out and colours each edge by the busiest of its links. Cytoscape draws labels on a
// canvas: no markup is built from data.
/* global cytoscape */
import { postJson } from "./api.js";
import { $ } from "./dom.js";
import { fmtInt, utilColor } from "./format.js";
import { state } from "./state.js";

const CACHE = 32;  // subgraphs kept, per cluster + devices: reselecting a call or a node draws at once
const PREFETCH = 16;  // device sets of a new plan fetched ahead, one at a time, so a click draws from the cache
const subgraphs = new Map();
let focus = null, focusCall = null, drawSeq = 0;  // the node expanded from the aggregate view, for its call

const MIN_LABEL_PX = 9;
const STYLE = [
  { selector: "node", style: { label: "data(label)", "font-size": 10, "text-valign": "center", "background-color": "#dfe6ee", "border-width": 1, "border-color": "#8896a5", width: 26, height: 26 } },
  { selector: ":parent", style: { "background-color": "#f4f7fa", "text-valign": "top", "font-size": 12, padding: 10 } },
  { selector: "node.member", style: { "background-color": "#0b5cad", color: "#fff", "border-color": "#062f5a", "border-width": 2 } },
  { selector: "node.switch, node.leaf, node.spine, node.router", style: { shape: "round-rectangle", width: 70, height: 22, "background-color": "#e8e1f5" } },
  { selector: "node.nic", style: { shape: "rectangle", width: 36, height: 16, "background-color": "#fff4d6", "font-size": 8 } },
  { selector: "node.box", style: { shape: "round-rectangle", width: 54, height: 34, "text-wrap": "wrap", "font-size": 9, "background-color": "#cfe0f3", "border-color": "#0b5cad" } },
  { selector: "node.rail", style: { shape: "round-rectangle", width: 84, height: 26, "text-wrap": "wrap", "font-size": 9, "background-color": "#e8e1f5" } },
  // one edge per directed link: bezier keeps a link and its reverse apart, each in its own colour
  { selector: "edge", style: { width: (e) => 1.5 + 6 * e.data("u"), "line-color": (e) => utilColor(e.data("u")), "curve-style": "bezier", "control-point-step-size": 6, opacity: 0.95 } },
  { selector: "edge.bundle", style: { opacity: 0.55, width: (e) => 1 + 3 * e.data("u"), "curve-style": "straight" } },
];

// POST /v1/topology once per cluster + devices; the colours come from the call, so one answer serves every call
// placed on the same devices. An answer already here is handed back as is (not a promise): drawn at once.
function subgraph(cluster, devices) {
  const key = JSON.stringify([cluster, devices]);
  if (!subgraphs.has(key)) {
    const answer = postJson("/v1/topology", { cluster, devices });
    answer.then((view) => { if (subgraphs.get(key) === answer) subgraphs.set(key, view); }, () => subgraphs.delete(key));
    subgraphs.set(key, answer);  // a failure is not remembered
    if (subgraphs.size > CACHE) subgraphs.delete(subgraphs.keys().next().value);
  }
  return subgraphs.get(key);
}

// after a plan is drawn: the subgraphs of its calls' groups, one request at a time, stopping at a newer plan
export async function prefetchTopology(plan) {
  const seen = new Set();
  for (const call of plan.calls) {
    const devices = call.placement.group_devices || [], key = JSON.stringify(devices);
    if (seen.has(key) || !devices.length) continue;
    if (seen.size >= PREFETCH || state.plan !== plan) return;
    seen.add(key);
    try { await subgraph(plan.cluster, devices); } catch { return; }  // the selected call's draw reports errors
  }
}

function graph() {
  if (!state.cy) {
    state.cy = cytoscape({ container: $("topology"), boxSelectionEnabled: false });
    // aggregate view: a click on a node box expands that node; a click on the background goes back
    state.cy.on("tap", "node.box", (e) => { focus = e.target.data("node"); drawTopology(focusCall.call, focusCall.cluster); });
    state.cy.on("tap", (e) => { if (e.target === state.cy && focus !== null) { focus = null; drawTopology(focusCall.call, focusCall.cluster); } });
  }
  return state.cy;
}

function show(els, note) {
  const cy = graph();
  cy.elements().remove();
  cy.add(els);
  cy.style(STYLE);
  cy.resize();
  cy.layout({ name: "preset", fit: true, padding: 20 }).run();
  cy.fit(undefined, 20);
  // labels at least MIN_LABEL_PX on screen whatever the fit's zoom (NIC and leaf labels were about 6 px)
  const least = MIN_LABEL_PX / (cy.zoom() || 1);
  cy.style(STYLE.map((r) => (r.style["font-size"] ? { ...r, style: { ...r.style, "font-size": Math.max(r.style["font-size"], least) } } : r)));
  $("topology-note").textContent = note;
}

// each edge coloured by the busiest of its links among those the plan reports for the call
function colours(call) {
  const util = new Map();
  for (const l of call.placement.links || []) util.set(l.id, Math.max(util.get(l.id) || 0, l.utilisation));
  return (edge) => Math.max(0, ...edge.links.map((id) => util.get(id) || 0));
}

// "on all 64 groups", "on its one group" (a KV transfer, or a call over the whole world, was "on all 1 groups")
const onGroups = (n) => (n === 1 ? "on its one group" : `on all ${fmtInt(n)} groups`);

// what is drawn, as the notes name it: a ledger call's first group, or what the caller names (call.drawn: the
// serving KV transfer, which read "The first group spans 12 nodes")
const whoOf = (call) => call.drawn || "The first group";

const edgeEl = (e, u) => ({ data: { id: e.id, source: e.source, target: e.target, u, label: e.label }, classes: e.links.length > 1 ? "bundle" : "" });

// node boxes in rows; rails (or the unit's leaf) in a row beneath, labelled with their busiest link
function drawAggregate(call, cluster, view, busy) {
  const D = cluster.devices_per_node;
  const boxes = view.vertices.filter((v) => v.kind === "node_box"), rails = view.vertices.filter((v) => v.kind === "rail");
  const perRow = Math.max(4, Math.min(12, Math.ceil(Math.sqrt(2 * boxes.length))));
  const rows = Math.ceil(boxes.length / perRow), width = Math.min(boxes.length, perRow) * 66;
  // a rail none of whose links the plan reports (placement.links: the call's busiest, 24 on the page) is not known
  // to be idle: it read "0% busy" while the other groups' traffic kept it as busy as rail 0 (round 10)
  const reported = new Set((call.placement.links || []).map((l) => l.id)), railSeen = new Set();
  const railBusy = new Map(), els = [];
  boxes.forEach((v, i) => els.push({ data: { id: v.id, node: v.node, label: `${v.label}\n${v.members}/${D}` }, classes: "box", position: { x: (i % perRow) * 66, y: Math.floor(i / perRow) * 48 } }));
  for (const e of view.edges) {
    const u = busy(e);
    railBusy.set(e.target, Math.max(railBusy.get(e.target) || 0, u));
    if (e.links.some((id) => reported.has(id))) railSeen.add(e.target);
    els.push(edgeEl(e, u));
  }
  const span = Math.max(width, rails.length * 96);  // rails side by side without overlapping
  rails.forEach((v, i) => {
    const u = railBusy.get(v.id) || 0;
    const said = railSeen.has(v.id) ? `${Math.round(100 * u)}% busy` : "not reported";
    els.push({ data: { id: v.id, label: `${v.label}\n${said}` }, classes: "rail", position: { x: (i + 0.5) * span / rails.length - 33 - (span - width) / 2, y: rows * 48 + 90 } });
  });
  show(els, `${whoOf(call)} spans ${view.nodes} nodes${view.nodes > boxes.length ? ` (the first ${boxes.length} drawn)` : ""}: `
    + `each box is a node with how many of its ${D} devices are in it; `
    + (rails.length ? `each ${cluster.network.rail_optimized ? "rail" : "leaf"} gathers its NIC links, coloured by the busiest reported link while the call runs ${onGroups(call.num_groups)}`
      + (rails.some((v) => !railSeen.has(v.id)) ? ` ("not reported": none of its links is among the ${fmtInt(reported.size)} busiest the plan reports). ` : ". ")
      : view.edges.length ? `edges are the router links between them, coloured while the call runs ${onGroups(call.num_groups)}. ` : "")
    + "Click a node to expand it; click the background to come back.");
}

// nodes side by side (GPUs in rows of up to 8, the switch and the NICs beneath), the network below them
function drawDetailed(call, view, busy, spanned) {
  const inNode = new Map(view.nodes_drawn.map((a) => [a, { gpu: [], switch: [], nic: [] }]));
  const network = { row: [], spine: [] };
  for (const v of view.vertices) {
    if (v.kind === "node") continue;
    if (v.node !== null && inNode.has(v.node)) inNode.get(v.node)[v.kind].push(v);
    else (v.kind === "spine" ? network.spine : network.row).push(v);
  }
  const most = Math.max(1, ...[...inNode.values()].map((n) => n.gpu.length));
  const cols = Math.min(most, 8), rows = Math.ceil(most / cols), width = cols * 60;
  const els = [], at = (v, x, y) => els.push({ data: { id: v.id, label: v.label, ...(v.parent ? { parent: v.parent } : {}) }, classes: `${v.kind}${v.member ? " member" : ""}`, position: { x, y } });
  view.nodes_drawn.forEach((a, idx) => {
    const x0 = idx * (width + 80), n = inNode.get(a);
    els.push({ data: { id: `n${a}`, label: `node ${a}` } });
    n.gpu.forEach((v, i) => at(v, x0 + (i % cols) * 60, Math.floor(i / cols) * 60));
    n.switch.forEach((v) => at(v, x0 + (cols - 1) * 30, rows * 60 + 10));
    n.nic.forEach((v, k) => at(v, x0 + k * (width / Math.max(n.nic.length, 1)), rows * 60 + 80));
  });
  network.row.forEach((v, i) => at(v, i * 90, rows * 60 + 200));
  network.spine.forEach((v) => at(v, Math.max(0, (network.row.length - 1) * 45), rows * 60 + 300));
  for (const e of view.edges) els.push(edgeEl(e, busy(e)));
  show(els, `${focus !== null ? `Node ${focus}, one of the ${spanned} nodes ${whoOf(call).toLowerCase()} spans (click the background for all of them). ` : ""}`
    + `${view.truncated ? "Some GPUs or router links are left out to keep the drawing readable. " : ""}`
    + `Edge colour: utilisation while the call runs ${onGroups(call.num_groups)} (green < 50%, orange < 90%, red ≥ 90%); a link and its reverse are drawn apart.`);
}

export async function drawTopology(call, cluster) {
  const seq = ++drawSeq, D = cluster.devices_per_node;
  // the heading says what is highlighted: it said "first group highlighted" over the serving KV transfer (round 11)
  $("topology-hint").textContent = `(${call.drawn ? `${call.drawn.toLowerCase()}'s devices` : "first group"} highlighted; links coloured by utilisation)`;
  const group = call.placement.group_devices || [];
  if (!focusCall || focusCall.call !== call) focus = null;
  focusCall = { call, cluster };
  const devices = focus === null ? group : group.filter((d) => Math.floor(d / D) === focus);
  let view = subgraph(cluster, devices);
  try {
    if (view instanceof Promise) view = await view;
  } catch (err) {
    if (seq === drawSeq) { graph().elements().remove(); $("topology-note").textContent = `The topology could not be drawn: ${err.message}`; }
    return;
  }
  if (seq !== drawSeq) return;  // a later selection is being drawn
  const spanned = new Set(group.map((d) => Math.floor(d / D))).size;
  if (view.aggregated) drawAggregate(call, cluster, view, colours(call));
  else drawDetailed(call, view, colours(call), spanned);
}
