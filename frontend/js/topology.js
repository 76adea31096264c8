// The first placed group of the selected call on its nodes, NICs and leaves, links coloured by utilisation.
// Cytoscape draws labels on a canvas: no markup is built from data.
/* global cytoscape */
import { $ } from "./dom.js";
import { utilColor } from "./format.js";
import { state } from "./state.js";

const MAX_NODES = 6;  // a group over more nodes is drawn aggregated: node boxes and rail bundles
const MAX_BOXES = 128;
let focus = null, focusCall = null;  // the node expanded from the aggregate view, for the call it belongs to

function edgeOf(l, D) {
  const i = l.index;
  if (l.family === "dev_up" || l.family === "dev_down") return `dev-${i}`;
  if (l.family === "mesh") { const a = Math.floor(i / D), j = i % D; return `mesh-${Math.min(a, Math.floor(a / D) * D + j)}-${Math.max(a, Math.floor(a / D) * D + j)}`; }
  if (l.family === "host_up" || l.family === "host_down") return `host-${i}`;
  if (l.family === "nic_up" || l.family === "nic_down") return `nic-${i}`;
  if (l.family === "leaf_up" || l.family === "leaf_down") return `leaf-${i}`;
  return null;
}

const STYLE = [
  { selector: "node", style: { label: "data(label)", "font-size": 10, "text-valign": "center", "background-color": "#dfe6ee", "border-width": 1, "border-color": "#8896a5", width: 26, height: 26 } },
  { selector: ":parent", style: { "background-color": "#f4f7fa", "text-valign": "top", "font-size": 12, padding: 10 } },
  { selector: "node.member", style: { "background-color": "#0b5cad", color: "#fff", "border-color": "#062f5a", "border-width": 2 } },
  { selector: "node.switch, node.leaf", style: { shape: "round-rectangle", width: 70, height: 22, "background-color": "#e8e1f5" } },
  { selector: "node.nic", style: { shape: "rectangle", width: 36, height: 16, "background-color": "#fff4d6", "font-size": 8 } },
  { selector: "node.box", style: { shape: "round-rectangle", width: 54, height: 34, "text-wrap": "wrap", "font-size": 9, "background-color": "#cfe0f3", "border-color": "#0b5cad" } },
  { selector: "node.rail", style: { shape: "round-rectangle", width: 84, height: 26, "text-wrap": "wrap", "font-size": 9, "background-color": "#e8e1f5" } },
  { selector: "edge", style: { width: (e) => 1.5 + 6 * e.data("u"), "line-color": (e) => utilColor(e.data("u")), "curve-style": "straight", opacity: 0.95 } },
  { selector: "edge.bundle", style: { opacity: 0.55, width: (e) => 1 + 3 * e.data("u") } },
];

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
  $("topology-note").textContent = note;
}

// nodes as boxes (how many of their devices are in the group), NICs of one index as a rail bundle to its leaf
// (or the node's leaf when not rail-optimised), the bundle coloured by the busiest reported link in it
function drawAggregate(call, cluster, allNodes, members, util) {
  const D = cluster.devices_per_node, K = cluster.nics_per_node;
  const nodes = allNodes.slice(0, MAX_BOXES), els = [];
  const perRow = Math.max(4, Math.min(12, Math.ceil(Math.sqrt(2 * nodes.length))));
  const railOf = (a, k) => (cluster.network.topology !== "fat_tree" ? null : cluster.network.rail_optimized ? `rail ${k}` : `leaf ${Math.floor(a / cluster.network.nodes_per_leaf)}`);
  const bundles = new Map();
  nodes.forEach((a, i) => {
    let count = 0;
    for (let d = a * D; d < (a + 1) * D; d++) if (members.has(d)) count++;
    els.push({ data: { id: `b${a}`, node: a, label: `node ${a}\n${count}/${D}` }, classes: "box", position: { x: (i % perRow) * 66, y: Math.floor(i / perRow) * 48 } });
    for (let k = 0; k < K; k++) {
      const rail = railOf(a, k);
      if (rail === null) continue;
      const u = util.get(`nic-${a * K + k}`) || 0;
      bundles.set(rail, Math.max(bundles.get(rail) || 0, u));
      els.push({ data: { id: `e${a}-${k}`, source: `b${a}`, target: rail, u }, classes: "bundle" });
    }
  });
  const rows = Math.ceil(nodes.length / perRow), width = Math.min(nodes.length, perRow) * 66;
  [...bundles.keys()].forEach((rail, i, all) => {
    const u = bundles.get(rail);
    const span = Math.max(width, all.length * 96);  // rails side by side without overlapping
    els.push({ data: { id: rail, label: `${rail}\n${Math.round(100 * u)}% busy` }, classes: "rail",
      position: { x: (i + 0.5) * span / all.length - 33 - (span - width) / 2, y: rows * 48 + 90 } });
  });
  show(els, `The first group spans ${allNodes.length} nodes${allNodes.length > nodes.length ? ` (the first ${nodes.length} drawn)` : ""}: `
    + `each box is a node with how many of its ${D} devices are in the group; `
    + (bundles.size ? `each ${cluster.network.rail_optimized ? "rail" : "leaf"} gathers its NIC links, coloured by the busiest reported link while the call runs on all ${call.num_groups} groups. ` : "")
    + "Click a node to expand it; click the background to come back.");
}

export function drawTopology(call, cluster) {
  const D = cluster.devices_per_node, K = cluster.nics_per_node, multi = cluster.num_nodes > 1;
  const ranks = call.placement.group_devices || [], members = new Set(ranks);
  const allNodes = [...new Set(ranks.map((r) => Math.floor(r / D)))];
  if (!focusCall || focusCall.call !== call) focus = null;
  focusCall = { call, cluster };
  const util = new Map();
  for (const l of call.placement.links || []) { const id = edgeOf(l, D); if (id) util.set(id, Math.max(util.get(id) || 0, l.utilisation)); }
  if (allNodes.length > MAX_NODES && focus === null) return drawAggregate(call, cluster, allNodes, members, util);
  const nodes = focus !== null ? [focus] : allNodes.slice(0, MAX_NODES);
  const els = [], cols = Math.min(D, 8), leaves = new Map();
  nodes.forEach((a, idx) => {
    const x0 = idx * (cols * 60 + 80);
    els.push({ data: { id: `n${a}`, label: `node ${a}` } });
    const shown = Math.min(D, 16);
    for (let i = 0; i < shown; i++) {
      const dev = a * D + i;
      els.push({ data: { id: `d${dev}`, parent: `n${a}`, label: `${i}` }, classes: members.has(dev) ? "member" : "", position: { x: x0 + (i % cols) * 60, y: Math.floor(i / cols) * 60 } });
    }
    if (cluster.intra.fabric === "switch") {
      els.push({ data: { id: `s${a}`, parent: `n${a}`, label: cluster.intra.link_name === "pcie" ? "PCIe switch" : "NVSwitch" }, classes: "switch", position: { x: x0 + (cols - 1) * 30, y: 130 } });
      for (let i = 0; i < shown; i++) els.push({ data: { id: `dev-${a * D + i}`, source: `d${a * D + i}`, target: `s${a}`, u: util.get(`dev-${a * D + i}`) || 0 } });
    } else if (cluster.intra.fabric === "full_mesh") {
      for (let i = 0; i < shown; i++) for (let j = i + 1; j < shown; j++) els.push({ data: { id: `mesh-${a * D + i}-${a * D + j}`, source: `d${a * D + i}`, target: `d${a * D + j}`, u: util.get(`mesh-${a * D + i}-${a * D + j}`) || 0 } });
    }
    if (!multi) return;
    const nicsShown = Math.min(K, 8);
    for (let k = 0; k < nicsShown; k++) {
      const nic = a * K + k;
      els.push({ data: { id: `c${nic}`, parent: `n${a}`, label: `nic ${k}` }, classes: "nic", position: { x: x0 + k * (cols * 60 / Math.max(nicsShown, 1)), y: 200 } });
      const unit = Math.floor(a / cluster.network.nodes_per_leaf);
      const leaf = cluster.network.topology !== "fat_tree" ? a : cluster.network.rail_optimized ? unit * K + k : unit;
      if (!leaves.has(leaf)) leaves.set(leaf, x0 + k * 60);
      els.push({ data: { id: `nic-${nic}`, source: `c${nic}`, target: `l${leaf}`, u: util.get(`nic-${nic}`) || 0 } });
      for (let i = 0; i < Math.min(D, 16); i++) if (Math.floor(i * K / D) === k) {
        const dev = a * D + i;
        els.push({ data: { id: `host-${dev}`, source: `d${dev}`, target: `c${nic}`, u: util.get(`host-${dev}`) || 0 }, classes: "host" });
      }
    }
  });
  if (multi && cluster.network.topology === "fat_tree") {
    let i = 0;
    for (const [leaf] of leaves) {
      els.push({ data: { id: `l${leaf}`, label: `leaf ${leaf}` }, classes: "leaf", position: { x: i * 70, y: 320 } });
      els.push({ data: { id: `leaf-${leaf}`, source: `l${leaf}`, target: "spine", u: util.get(`leaf-${leaf}`) || 0 } });
      i++;
    }
    els.push({ data: { id: "spine", label: "spines" }, classes: "leaf", position: { x: Math.max(0, (i - 1) * 35), y: 420 } });
  } else if (multi) {
    let i = 0;
    for (const [leaf] of leaves) els.push({ data: { id: `l${leaf}`, label: `router ${leaf}` }, classes: "leaf", position: { x: i++ * 90, y: 320 } });
  }
  show(els, `${focus !== null ? `Node ${focus}, one of the ${allNodes.length} nodes the first group spans (click the background for all of them). ` : ""}`
    + `Edge colour: utilisation while the call runs on all ${call.num_groups} groups (green < 50%, orange < 90%, red ≥ 90%).`);
}
