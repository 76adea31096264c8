/* commplan what-if page. No build step: plain script, ECharts and Cytoscape.js vendored under /static/vendor. */
"use strict";

(() => {
  const $ = (id) => document.getElementById(id);
  const api = (path, body) =>
    fetch(path, body === undefined ? {} : { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });

  const SCENARIOS = [
    { id: "llama70b-h100", label: "Llama-3 70B on 64 DGX H100 nodes, TP8 PP4 DP16, ZeRO-1",
      request: { model: { preset: "llama3-70b" }, workload: { kind: "training", micro_batch_size: 1, global_batch_size: 1024 },
        parallel: { tp: 8, pp: 4, dp: 16, zero_stage: 1, sequence_parallel: true }, cluster: { preset: "dgx-h100", num_nodes: 64 } } },
    { id: "llama405b-16k", label: "Llama-3 405B on 2,048 DGX H100 nodes, TP8 PP16 DP128, ZeRO-1",
      request: { model: { preset: "llama3-405b" }, workload: { kind: "training", micro_batch_size: 1, global_batch_size: 2048 },
        parallel: { tp: 8, pp: 16, dp: 128, zero_stage: 1, sequence_parallel: true, first_stage_layers: 7, last_stage_layers: 7 },
        cluster: { preset: "dgx-h100", num_nodes: 2048 } } },
    { id: "dsv3", label: "DeepSeek-V3 on 256 DGX H100 nodes, PP16 EP64, ZeRO-1",
      request: { model: { preset: "deepseek-v3" }, workload: { kind: "training", micro_batch_size: 1, global_batch_size: 15360 },
        parallel: { tp: 1, pp: 16, dp: 128, ep: 64, zero_stage: 1, first_stage_layers: 3, last_stage_layers: 2 },
        cluster: { preset: "dgx-h100", num_nodes: 256 } } },
    { id: "mixtral-npu", label: "Mixtral 8x7B on four 8-NPU full-mesh boards, EP8, ZeRO-1",
      request: { model: { preset: "mixtral-8x7b" }, workload: { kind: "training", micro_batch_size: 1, global_batch_size: 256 },
        parallel: { tp: 1, pp: 1, dp: 32, ep: 8, zero_stage: 1 }, cluster: { preset: "npu-mesh-8", num_nodes: 4 } } },
    { id: "fsdp-a100", label: "Llama-3 8B with FSDP2 on 2 DGX A100 nodes (PyTorch)",
      request: { model: { preset: "llama3-8b" }, workload: { kind: "training", micro_batch_size: 2, global_batch_size: 64 },
        parallel: { tp: 1, pp: 1, dp: 16, zero_stage: 3, framework: "torch" }, cluster: { preset: "dgx-a100", num_nodes: 2 } } },
    { id: "decode", label: "Llama-3 70B decode, TP8, 64 sequences on one DGX H100",
      request: { model: { preset: "llama3-70b" }, workload: { kind: "inference", phase: "decode", batch_size: 64, context_length: 8192 },
        parallel: { tp: 8, pp: 1, dp: 1 }, cluster: { preset: "dgx-h100", num_nodes: 1 } } },
    { id: "gpt3-a100", label: "GPT-3 175B on 128 DGX A100 nodes, TP8 PP8 DP16",
      request: { model: { preset: "gpt3-175b" }, workload: { kind: "training", micro_batch_size: 1, global_batch_size: 1536 },
        parallel: { tp: 8, pp: 8, dp: 16, zero_stage: 1, sequence_parallel: true }, cluster: { preset: "dgx-a100", num_nodes: 128 } } },
  ];

  // request field -> form control, so 422 messages mark the right input
  const FIELDS = {
    "model.preset": "model-preset", "model.hf_config": "hf-config", "model.seq_length": "seq-length",
    "workload.kind": "kind", "workload.micro_batch_size": "micro-batch", "workload.global_batch_size": "global-batch",
    "workload.activation_recompute": "recompute", "workload.phase": "phase", "workload.batch_size": "batch-size",
    "workload.context_length": "context-length", "parallel.tp": "tp", "parallel.pp": "pp", "parallel.dp": "dp",
    "parallel.cp": "cp", "parallel.ep": "ep", "parallel.zero_stage": "zero", "parallel.sequence_parallel": "sp",
    "parallel.pipeline_schedule": "schedule", "parallel.virtual_pipeline_stages": "vpp", "parallel.framework": "framework",
    "parallel.first_stage_layers": "first-layers", "parallel.last_stage_layers": "last-layers", "parallel": "tp",
    "cluster.preset": "cluster-preset", "cluster.num_nodes": "nodes", "cluster.intra.bandwidth_GBps": "intra-bw",
    "cluster.nics_per_node": "nics", "cluster.nic_bandwidth_GBps": "nic-bw", "cluster.network.oversubscription": "oversub",
    "options.algorithm": "algorithm",
  };
  const PAR_COLORS = { tp: "#2f6fb0", cp: "#8e44ad", ep: "#c0392b", pp: "#d68910", dp: "#1e8449", edp: "#16a085", embedding: "#7f8c8d" };

  const state = { presets: { models: {}, clusters: {} }, catalogue: [], plan: null, request: null, selected: null,
    sort: { key: "time_iter", dir: -1 }, steps: null, stepIndex: 0, timer: null, planSeq: 0, charts: {} };

  // ---- formatting ------------------------------------------------------------------------------------
  const fmtBytes = (n) => {
    if (n === null || n === undefined) return "–";
    for (const [unit, scale] of [["TB", 1e12], ["GB", 1e9], ["MB", 1e6], ["kB", 1e3]]) if (n >= scale) return `${(n / scale).toPrecision(3)} ${unit}`;
    return `${n} B`;
  };
  const fmtTime = (s) => {
    if (s === null || s === undefined) return "–";
    if (s >= 1) return `${s.toPrecision(3)} s`;
    if (s >= 1e-3) return `${(s * 1e3).toPrecision(3)} ms`;
    return `${(s * 1e6).toPrecision(3)} µs`;
  };
  const fmtStages = (st) => (st.length > 2 && st[st.length - 1] - st[0] === st.length - 1 ? `${st[0]}–${st[st.length - 1]}` : st.join(","));
  const fmtRanks = (ranks) => {
    const out = []; let i = 0;
    while (i < ranks.length) {
      let j = i; while (j + 1 < ranks.length && ranks[j + 1] === ranks[j] + 1) j++;
      out.push(j > i + 1 ? `${ranks[i]}–${ranks[j]}` : ranks.slice(i, j + 1).join(","));
      i = j + 1;
    }
    return out.join(",") || "·";
  };
  const utilColor = (u) => (u >= 0.9 ? "#c0392b" : u >= 0.5 ? "#e67e22" : u > 0 ? "#27ae60" : "#c5ced8");

  // ---- form <-> request --------------------------------------------------------------------------------
  const num = (id) => { const v = $(id).value.trim(); return v === "" ? undefined : Number(v); };
  const put = (obj, key, value) => { if (value !== undefined && value !== "" && !Number.isNaN(value)) obj[key] = value; };

  function readForm() {
    const model = {};
    if ($("model-source-hf").checked) {
      try { model.hf_config = JSON.parse($("hf-config").value || "{}"); } catch (e) { throw { field: "model.hf_config", msg: `config.json is not valid JSON: ${e.message}` }; }
    } else model.preset = $("model-preset").value;
    put(model, "seq_length", num("seq-length"));
    const workload = { kind: $("kind").value };
    if (workload.kind === "training") {
      put(workload, "micro_batch_size", num("micro-batch")); put(workload, "global_batch_size", num("global-batch"));
      workload.activation_recompute = $("recompute").value;
    } else {
      workload.phase = $("phase").value; put(workload, "batch_size", num("batch-size")); put(workload, "context_length", num("context-length"));
    }
    const parallel = { zero_stage: Number($("zero").value), sequence_parallel: $("sp").checked,
      pipeline_schedule: $("schedule").value, framework: $("framework").value };
    for (const [key, id] of [["tp", "tp"], ["pp", "pp"], ["dp", "dp"], ["cp", "cp"], ["ep", "ep"], ["virtual_pipeline_stages", "vpp"],
      ["first_stage_layers", "first-layers"], ["last_stage_layers", "last-layers"]]) put(parallel, key, num(id));
    const cluster = { preset: $("cluster-preset").value };
    put(cluster, "num_nodes", num("nodes"));
    const base = state.presets.clusters[cluster.preset];
    if (num("intra-bw") !== undefined) cluster.intra = { bandwidth_GBps: num("intra-bw") };
    put(cluster, "nics_per_node", num("nics")); put(cluster, "nic_bandwidth_GBps", num("nic-bw"));
    const network = {};
    put(network, "oversubscription", num("oversub"));
    if (base && base.network.rail_optimized !== $("rail").checked) network.rail_optimized = $("rail").checked;
    if (Object.keys(network).length) cluster.network = network;
    // 24 links: enough to colour a node's GPU links and NICs in the topology view
    return { model, workload, parallel, cluster, options: { algorithm: $("algorithm").value, links_per_call: 24 } };
  }

  function fillForm(req) {
    const m = req.model || {}, w = req.workload || {}, p = req.parallel || {}, c = req.cluster || {};
    $("model-source-hf").checked = !!m.hf_config; $("model-source-preset").checked = !m.hf_config;
    if (m.preset) $("model-preset").value = m.preset;
    $("hf-config").value = m.hf_config ? JSON.stringify(m.hf_config, null, 1) : "";
    $("seq-length").value = m.seq_length ?? "";
    $("kind").value = w.kind || "training";
    $("micro-batch").value = w.micro_batch_size ?? 1; $("global-batch").value = w.global_batch_size ?? 1024;
    $("recompute").value = w.activation_recompute || "none"; $("phase").value = w.phase || "prefill";
    $("batch-size").value = w.batch_size ?? 64; $("context-length").value = w.context_length ?? "";
    for (const [key, id, dflt] of [["tp", "tp", 1], ["pp", "pp", 1], ["dp", "dp", ""], ["cp", "cp", 1], ["ep", "ep", 1],
      ["virtual_pipeline_stages", "vpp", 1], ["first_stage_layers", "first-layers", ""], ["last_stage_layers", "last-layers", ""]]) $(id).value = p[key] ?? dflt;
    $("zero").value = String(p.zero_stage ?? 0); $("sp").checked = !!p.sequence_parallel;
    $("schedule").value = p.pipeline_schedule || "1f1b"; $("framework").value = p.framework || "megatron";
    if (c.preset) $("cluster-preset").value = c.preset;
    $("nodes").value = c.num_nodes ?? 1;
    $("intra-bw").value = c.intra?.bandwidth_GBps ?? ""; $("nics").value = c.nics_per_node ?? ""; $("nic-bw").value = c.nic_bandwidth_GBps ?? "";
    $("oversub").value = c.network?.oversubscription ?? "";
    const base = state.presets.clusters[$("cluster-preset").value];
    $("rail").checked = c.network?.rail_optimized ?? (base ? base.network.rail_optimized : true);
    $("algorithm").value = req.options?.algorithm || "auto";
    syncVisibility();
  }

  function syncVisibility() {
    const values = { "model-source": $("model-source-hf").checked ? "hf" : "preset", kind: $("kind").value };
    for (const el of document.querySelectorAll("[data-when]")) {
      const [key, value] = el.dataset.when.split("=");
      el.hidden = values[key] !== value;
    }
    const model = state.presets.models[$("model-preset").value];
    $("model-facts").textContent = model && !$("model-source-hf").checked
      ? `${model.num_layers} layers, hidden ${model.hidden_size}, ${model.num_attention_heads} heads / ${model.num_kv_heads || model.num_attention_heads} KV, `
        + `${(model.params_total / 1e9).toFixed(1)}B parameters${model.moe ? ` (${(model.params_active / 1e9).toFixed(1)}B active)` : ""}`
      : "";
  }

  // ---- URL state -----------------------------------------------------------------------------------------
  const encode = (obj) => btoa(unescape(encodeURIComponent(JSON.stringify(obj)))).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
  const decode = (text) => JSON.parse(decodeURIComponent(escape(atob(text.replace(/-/g, "+").replace(/_/g, "/")))));
  function saveUrl() {
    const hash = `#s=${encode({ r: state.request, c: state.selected })}`;
    if (location.hash !== hash) history.replaceState(null, "", hash);
  }
  function loadUrl() {
    const match = location.hash.match(/^#s=(.+)$/);
    if (!match) return null;
    try { return decode(match[1]); } catch { return null; }
  }

  // ---- planning ------------------------------------------------------------------------------------------
  let debounce = null;
  function schedulePlan(delay = 250) { clearTimeout(debounce); debounce = setTimeout(runPlan, delay); }

  async function runPlan() {
    clearErrors();
    let request;
    try { request = readForm(); } catch (err) { showErrors([{ loc: ["body", ...err.field.split(".")], msg: err.msg }]); return; }
    state.request = request;
    saveUrl();
    const seq = ++state.planSeq;
    $("results").setAttribute("aria-busy", "true");
    $("status").textContent = "Planning…";
    let response;
    try {
      response = await api("/v1/plan", request);
    } catch {
      if (seq !== state.planSeq) return;
      banner(`Cannot reach the commplan server at ${location.origin}. Check that it is running; the page retries when you change a field.`);
      $("status").textContent = "Server unreachable.";
      $("results").setAttribute("aria-busy", "false");
      return;
    }
    if (seq !== state.planSeq) return;
    $("results").setAttribute("aria-busy", "false");
    banner(null);
    if (response.status === 422 || response.status === 413) {
      const body = await response.json();
      showErrors(body.detail || []);
      $("status").textContent = "Invalid configuration: see the message under the form.";
      return;
    }
    if (!response.ok) { banner(`The server answered ${response.status}: ${await response.text()}`); return; }
    state.plan = await response.json();
    try {
      render();
    } catch (err) {
      banner(`The page failed to show this plan: ${err.message}`);
      throw err;
    }
  }

  function banner(text) { $("banner").hidden = !text; $("banner").textContent = text || ""; }

  function clearErrors() {
    $("form-errors").innerHTML = "";
    for (const el of document.querySelectorAll("[aria-invalid]")) el.removeAttribute("aria-invalid");
  }

  function showErrors(detail) {
    const list = document.createElement("ul");
    for (const d of detail) {
      const path = (d.loc || []).filter((x) => x !== "body").join(".");
      const item = document.createElement("li");
      item.textContent = `${path ? path + ": " : ""}${d.msg}`;
      list.appendChild(item);
      const control = FIELDS[path] || FIELDS[path.split(".").slice(0, 2).join(".")];
      if (control && $(control)) $(control).setAttribute("aria-invalid", "true");
    }
    $("form-errors").replaceChildren(list);
  }

  // ---- results -------------------------------------------------------------------------------------------
  const timeIter = (c) => c.time_s * c.calls_per_iteration;

  function render() {
    const plan = state.plan, totals = plan.totals, busiest = totals.busiest_stage;
    const onBusiest = plan.calls.filter((c) => c.stages.includes(busiest));
    $("status").textContent = `${plan.world_size} devices, ${plan.num_microbatches} micro-batch${plan.num_microbatches > 1 ? "es" : ""} per iteration, `
      + `${plan.calls.length} kinds of call. Busiest stage: ${busiest}.`;
    renderSummary(plan, onBusiest);
    renderChart(onBusiest);
    renderFilters(plan);
    renderTable();
    const keep = state.selected && plan.calls.find((c) => c.name === state.selected.name && c.stages.includes(state.selected.stage));
    const first = [...onBusiest].sort((a, b) => timeIter(b) - timeIter(a))[0];
    selectCall(keep || first, false);
  }

  function renderSummary(plan, onBusiest) {
    const t = plan.totals, stage = t.per_stage[t.busiest_stage];
    const shares = Object.entries(t.by_parallelism).filter(([, v]) => v.time_s > 0).sort((a, b) => b[1].time_s - a[1].time_s);
    const top = [...onBusiest].sort((a, b) => timeIter(b) - timeIter(a))[0];
    const card = (label, value, extra = "") => `<div class="card"><div class="metric-label">${label}</div><div class="metric">${value}</div>${extra}</div>`;
    const bar = `<div class="bar" aria-hidden="true">${shares.map(([k, v]) =>
      `<span style="width:${(100 * v.time_s / (t.time_s || 1)).toFixed(2)}%;background:${PAR_COLORS[k] || "#999"}"></span>`).join("")}</div>`;
    const legend = shares.filter(([, v]) => v.time_s >= 0.005 * t.time_s)
      .map(([k, v]) => `${k} ${(100 * v.time_s / (t.time_s || 1)).toFixed(0)}%`).join(" · ");
    $("summary").innerHTML =
      card("Communication per iteration", fmtTime(t.time_s), `<div class="hint">stage ${t.busiest_stage}, calls serialised</div>`)
      + card("Sent per rank per iteration", fmtBytes(stage.bytes_sent), `<div class="hint">${fmtBytes(stage.message_bytes)} of messages</div>`)
      + card("Share by parallelism", legend || "–", bar)
      + (top ? card("Largest cost", top.name, `<div class="hint">${fmtTime(timeIter(top))} per iteration; busiest link ${top.placement.bottleneck_link || "–"}</div>`) : "");
  }

  function chart(id) {
    if (!state.charts[id]) {
      state.charts[id] = echarts.init($(id), null, { renderer: "canvas" });
      window.addEventListener("resize", () => state.charts[id].resize());
    }
    return state.charts[id];
  }

  function renderChart(onBusiest) {
    const pars = [...new Set(onBusiest.map((c) => c.parallelism))];
    const ops = [...new Set(onBusiest.map((c) => c.op))];
    const series = ops.map((op) => ({
      name: op, type: "bar", stack: "time",
      data: pars.map((p) => onBusiest.filter((c) => c.parallelism === p && c.op === op).reduce((s, c) => s + timeIter(c), 0)),
    }));
    chart("chart").setOption({
      animation: false, tooltip: { trigger: "axis", valueFormatter: fmtTime }, legend: { type: "scroll", top: 0 },
      grid: { left: 70, right: 20, top: 40, bottom: 30 },
      xAxis: { type: "category", data: pars }, yAxis: { type: "value", name: "s", axisLabel: { formatter: (v) => fmtTime(v) } },
      series,
    }, true);
  }

  const COLUMNS = [
    { key: "name", label: "Call" }, { key: "parallelism", label: "Par." }, { key: "op", label: "Op" }, { key: "phase", label: "Phase" },
    { key: "stages", label: "Stages", fmt: (_, c) => fmtStages(c.stages), value: (c) => c.stages[0] },
    { key: "group", label: "Group", value: (c) => c.group_size, fmt: (_, c) => `${c.group_size} × ${c.num_groups}` },
    { key: "message_bytes", label: "Message", num: true, fmt: fmtBytes },
    { key: "calls_per_iteration", label: "× / iter", num: true },
    { key: "algorithm", label: "Algorithm" },
    { key: "bytes_sent_per_rank", label: "Sent / call", num: true, fmt: fmtBytes },
    { key: "time_s", label: "Time / call", num: true, fmt: fmtTime },
    { key: "time_iter", label: "Time / iter", num: true, value: timeIter, fmt: (_, c) => fmtTime(timeIter(c)) },
    { key: "bottleneck", label: "Busiest link", value: (c) => c.placement.bottleneck_link },
  ];
  const cellValue = (col, c) => (col.value ? col.value(c) : c[col.key]);

  function renderFilters(plan) {
    const select = $("filter-par"), chosen = select.value;
    const pars = [...new Set(plan.calls.map((c) => c.parallelism))];
    select.innerHTML = `<option value="">all</option>` + pars.map((p) => `<option>${p}</option>`).join("");
    if (pars.includes(chosen)) select.value = chosen;
  }

  function visibleCalls() {
    const text = $("filter-text").value.trim().toLowerCase(), par = $("filter-par").value;
    const col = COLUMNS.find((c) => c.key === state.sort.key) || COLUMNS[0];
    return state.plan.calls
      .filter((c) => (!par || c.parallelism === par) && (!text || [c.name, c.op, c.phase, c.algorithm, c.placement.bottleneck_link].join(" ").toLowerCase().includes(text)))
      .sort((a, b) => {
        const x = cellValue(col, a), y = cellValue(col, b);
        return (x < y ? -1 : x > y ? 1 : 0) * state.sort.dir;
      });
  }

  function renderTable() {
    const head = $("ledger").tHead.rows[0];
    head.innerHTML = COLUMNS.map((col) => {
      const sorted = state.sort.key === col.key ? (state.sort.dir > 0 ? "ascending" : "descending") : "none";
      return `<th scope="col" class="${col.num ? "num" : ""}" aria-sort="${sorted}"><button type="button" data-sort="${col.key}">${col.label}${sorted === "none" ? "" : sorted === "ascending" ? " ▲" : " ▼"}</button></th>`;
    }).join("");
    const body = $("ledger").tBodies[0];
    body.replaceChildren(...visibleCalls().map((c) => {
      const row = document.createElement("tr");
      row.tabIndex = 0;
      row.dataset.name = c.name; row.dataset.stage = c.stages[0];
      row.setAttribute("aria-selected", String(!!state.selected && state.selected.name === c.name && c.stages.includes(state.selected.stage)));
      row.innerHTML = COLUMNS.map((col) => {
        const v = cellValue(col, c);
        return `<td class="${col.num ? "num" : ""}">${col.fmt ? col.fmt(v, c) : v}</td>`;
      }).join("");
      return row;
    }));
  }

  function downloadCsv() {
    const rows = [COLUMNS.map((c) => c.label)].concat(visibleCalls().map((c) => COLUMNS.map((col) => {
      const v = cellValue(col, c);
      return Array.isArray(v) ? v.join(" ") : v;
    })));
    const csv = rows.map((r) => r.map((x) => `"${String(x).replace(/"/g, '""')}"`).join(",")).join("\n");
    const link = document.createElement("a");
    link.href = URL.createObjectURL(new Blob([csv], { type: "text/csv" }));
    link.download = "commplan-ledger.csv";
    link.click();
    URL.revokeObjectURL(link.href);
  }

  // ---- selected call: explanation, topology, explorer ---------------------------------------------------------
  function selectCall(call, save = true) {
    if (!call) return;
    state.selected = { name: call.name, stage: call.stages[0] };
    for (const row of $("ledger").tBodies[0].rows) row.setAttribute("aria-selected", String(row.dataset.name === call.name && Number(row.dataset.stage) === call.stages[0]));
    const p = call.placement, link = p.links[0];
    $("detail-title").textContent = `Selected call: ${call.name} (stage${call.stages.length > 1 ? "s" : ""} ${fmtStages(call.stages)})`;
    $("detail-text").textContent = `${call.op} of ${fmtBytes(call.message_bytes)} over ${call.group_size} ranks `
      + `(${call.num_groups} groups at once, ${p.span.replace("_", "-")}, ${p.nodes_per_group} node${p.nodes_per_group > 1 ? "s" : ""} per group), `
      + `${call.calls_per_iteration}× per iteration with ${call.algorithm}: ${fmtTime(call.time_s)} per call, bus bandwidth ${p.busbw_GBps.toFixed(1)} GB/s. `
      + (link ? `The busiest link is ${link.label} (${link.kind}, ${link.capacity_GBps} GB/s), busy ${(100 * link.utilisation).toFixed(0)}% of the call` : "")
      + (link && link.utilisation > 0.8 ? ": the call is bandwidth-bound there." : link ? ": latency dominates." : ".")
      + ` Source: ${call.source}.`;
    drawTopology(call, state.plan.cluster);
    explore(call);
    presetSteps(call);
    if (save) saveUrl();
  }

  function drawTopology(call, cluster) {
    const D = cluster.devices_per_node, K = cluster.nics_per_node, multi = cluster.num_nodes > 1;
    const ranks = call.placement.group_devices, members = new Set(ranks);
    const allNodes = [...new Set(ranks.map((r) => Math.floor(r / D)))];
    const nodes = allNodes.slice(0, 6);
    const util = new Map();
    const edgeOf = (l) => {
      const i = l.index;
      if (l.family === "dev_up" || l.family === "dev_down") return `dev-${i}`;
      if (l.family === "mesh") { const a = Math.floor(i / D), j = i % D; return `mesh-${Math.min(a, Math.floor(a / D) * D + j)}-${Math.max(a, Math.floor(a / D) * D + j)}`; }
      if (l.family === "host_up" || l.family === "host_down") return `host-${i}`;
      if (l.family === "nic_up" || l.family === "nic_down") return `nic-${i}`;
      if (l.family === "leaf_up" || l.family === "leaf_down") return `leaf-${i}`;
      return null;
    };
    for (const l of call.placement.links) { const id = edgeOf(l); if (id) util.set(id, Math.max(util.get(id) || 0, l.utilisation)); }
    const els = [], cols = Math.min(D, 8), leaves = new Map();
    nodes.forEach((a, idx) => {
      const x0 = idx * (cols * 60 + 80);
      els.push({ data: { id: `n${a}`, label: `node ${a}` } });
      const shown = Math.min(D, 16);
      for (let i = 0; i < shown; i++) {
        const dev = a * D + i;
        els.push({ data: { id: `d${dev}`, parent: `n${a}`, label: `${i}` }, classes: members.has(dev) ? "member" : "", position: { x: x0 + (i % cols) * 60, y: Math.floor(i / cols) * 60 } });
      }
      if (cluster.intra_fabric === "switch") {
        els.push({ data: { id: `s${a}`, parent: `n${a}`, label: cluster.intra_link === "pcie" ? "PCIe switch" : "NVSwitch" }, classes: "switch", position: { x: x0 + (cols - 1) * 30, y: 130 } });
        for (let i = 0; i < shown; i++) els.push({ data: { id: `dev-${a * D + i}`, source: `d${a * D + i}`, target: `s${a}`, u: util.get(`dev-${a * D + i}`) || 0 } });
      } else if (cluster.intra_fabric === "full_mesh") {
        for (let i = 0; i < shown; i++) for (let j = i + 1; j < shown; j++) els.push({ data: { id: `mesh-${a * D + i}-${a * D + j}`, source: `d${a * D + i}`, target: `d${a * D + j}`, u: util.get(`mesh-${a * D + i}-${a * D + j}`) || 0 } });
      }
      if (!multi) return;
      const nicsShown = Math.min(K, 8);
      for (let k = 0; k < nicsShown; k++) {
        const nic = a * K + k;
        els.push({ data: { id: `c${nic}`, parent: `n${a}`, label: `nic ${k}` }, classes: "nic", position: { x: x0 + k * (cols * 60 / Math.max(nicsShown, 1)), y: 200 } });
        const unit = Math.floor(a / cluster.nodes_per_leaf);
        const leaf = cluster.network !== "fat_tree" ? a : cluster.rail_optimized ? unit * K + k : unit;
        if (!leaves.has(leaf)) leaves.set(leaf, x0 + k * 60);
        els.push({ data: { id: `nic-${nic}`, source: `c${nic}`, target: `l${leaf}`, u: util.get(`nic-${nic}`) || 0 } });
        for (let i = 0; i < Math.min(D, 16); i++) if (Math.floor(i * K / D) === k) {
          const dev = a * D + i;
          els.push({ data: { id: `host-${dev}`, source: `d${dev}`, target: `c${nic}`, u: util.get(`host-${dev}`) || 0 }, classes: "host" });
        }
      }
    });
    if (multi && cluster.network === "fat_tree") {
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
    const cy = state.cy || (state.cy = cytoscape({ container: $("topology"), boxSelectionEnabled: false }));
    cy.elements().remove();
    cy.add(els);
    cy.style([
      { selector: "node", style: { label: "data(label)", "font-size": 10, "text-valign": "center", "background-color": "#dfe6ee", "border-width": 1, "border-color": "#8896a5", width: 26, height: 26 } },
      { selector: ":parent", style: { "background-color": "#f4f7fa", "text-valign": "top", "font-size": 12, padding: 10 } },
      { selector: "node.member", style: { "background-color": "#0b5cad", color: "#fff", "border-color": "#062f5a", "border-width": 2 } },
      { selector: "node.switch, node.leaf", style: { shape: "round-rectangle", width: 70, height: 22, "background-color": "#e8e1f5" } },
      { selector: "node.nic", style: { shape: "rectangle", width: 36, height: 16, "background-color": "#fff4d6", "font-size": 8 } },
      { selector: "edge", style: { width: (e) => 1.5 + 6 * e.data("u"), "line-color": (e) => utilColor(e.data("u")), "curve-style": "straight", opacity: 0.95 } },
    ]);
    cy.layout({ name: "preset", fit: true, padding: 20 }).run();
    cy.fit(undefined, 20);
    $("topology-note").textContent = `${allNodes.length > nodes.length ? `Showing ${nodes.length} of the ${allNodes.length} nodes the first group spans. ` : ""}`
      + `Edge colour: utilisation while the call runs on all ${call.num_groups} groups (green < 50%, orange < 90%, red ≥ 90%).`;
  }

  async function explore(call) {
    $("explorer-note").textContent = "Pricing every algorithm…";
    const seq = state.planSeq;
    let body;
    try {
      const r = await api("/v1/plan/explore", { request: state.request, call: call.name, stage: call.stages[0] });
      body = await r.json();
      if (!r.ok) { $("explorer-note").textContent = (body.detail || []).map((d) => d.msg).join("; "); return; }
    } catch { $("explorer-note").textContent = "Server unreachable."; return; }
    if (seq !== state.planSeq) return;
    const series = body.series.filter((s) => s.time_s.some((t) => t !== null)).map((s) => ({
      name: s.algorithm, type: "line", showSymbol: false,
      data: body.sizes.map((size, i) => [size, s.time_s[i]]).filter(([, t]) => t !== null),
    }));
    const byName = Object.fromEntries(body.series.map((s) => [s.algorithm, s]));
    series.push({
      name: "auto", type: "scatter", symbolSize: 9, itemStyle: { color: "#111" },
      data: body.sizes.map((size, i) => ({ value: [size, byName[body.auto[i]]?.time_s[i]], name: body.auto[i] })).filter((d) => d.value[1] != null),
    });
    series[0].markLine = { symbol: "none", label: { formatter: "this call" }, lineStyle: { type: "dashed", color: "#444" }, data: [{ xAxis: body.message_bytes }] };
    chart("explorer").setOption({
      animation: false, legend: { type: "scroll", top: 0 },
      tooltip: { trigger: "item", formatter: (p) => `${p.seriesName === "auto" ? `auto → ${p.name}` : p.seriesName}<br>${fmtBytes(p.value[0])}: ${fmtTime(p.value[1])}` },
      grid: { left: 70, right: 20, top: 50, bottom: 40 },
      xAxis: { type: "log", name: "message", axisLabel: { formatter: fmtBytes } },
      yAxis: { type: "log", name: "time", axisLabel: { formatter: fmtTime } },
      series,
    }, true);
    const skipped = body.series.filter((s) => s.note).map((s) => `${s.algorithm}: ${s.note}`);
    const cross = body.auto.map((a, i) => (i && a !== body.auto[i - 1] ? `${body.auto[i - 1]} → ${a} near ${fmtBytes(body.sizes[i])}` : null)).filter(Boolean);
    $("explorer-note").textContent = `${body.group_size} ranks, ${body.groups_priced} group${body.groups_priced > 1 ? "s" : ""} priced together. `
      + (cross.length ? `Auto switches ${cross.join("; ")}. ` : `Auto picks ${body.auto[0]} at every size. `) + (skipped.length ? `Not shown: ${skipped.join("; ")}.` : "");
  }

  // ---- step view ----------------------------------------------------------------------------------------------
  function fillStepAlgorithms() {
    const op = $("step-op").value, current = $("step-alg").value;
    const algs = state.catalogue.filter((c) => c.op === op).map((c) => c.algorithm);
    $("step-alg").innerHTML = algs.map((a) => `<option>${a}</option>`).join("");
    if (algs.includes(current)) $("step-alg").value = current;
  }

  function presetSteps(call) {
    if (!state.catalogue.some((c) => c.op === call.op && c.algorithm === call.algorithm)) return;
    $("step-op").value = call.op; fillStepAlgorithms(); $("step-alg").value = call.algorithm;
    const n = Math.max(2, Math.min(call.group_size, 8));
    $("step-n").value = n; $("step-count").value = call.op === "sendrecv" ? 4 : 2 * n;
    if (!state.timer) loadSteps();
  }

  async function loadSteps() {
    stopPlay();
    const body = { op: $("step-op").value, algorithm: $("step-alg").value, num_ranks: Number($("step-n").value), count: Number($("step-count").value) };
    if (body.op === "sendrecv") body.num_ranks = 2;
    if (body.algorithm === "hierarchical") body.local_size = body.num_ranks % 2 === 0 ? 2 : 1;
    const r = await api("/v1/collectives/schedule", body);
    const data = await r.json();
    if (!r.ok) { $("step-grid").textContent = (data.detail || []).map((d) => d.msg).join("; "); state.steps = null; $("step-label").textContent = "–"; return; }
    state.steps = data; state.stepIndex = 0;
    renderStep();
  }

  function renderStep() {
    const data = state.steps; if (!data) return;
    const idx = state.stepIndex, frames = [data.initial, ...data.steps.map((s) => s.holds)], holds = frames[idx];
    const transfers = idx > 0 ? data.steps[idx - 1].transfers : [];
    const received = new Set(transfers.filter((t) => t.src !== t.dst).map((t) => `${t.dst}:${t.dst_slot}`));
    const n = data.num_ranks, slots = data.slot_bytes.length;
    const rows = holds.map((row, h) => `<tr><th scope="row">${h < n ? `rank ${h}` : "switch"}</th>${row.map((cell, s) => {
      const full = cell.length / n, tone = Math.round(255 - 120 * full);
      return `<td class="${received.has(`${h}:${s}`) ? "recv" : ""}" style="background:rgb(${tone},${Math.round(235 - 60 * full)},255)">${fmtRanks(cell)}</td>`;
    }).join("")}</tr>`).join("");
    $("step-grid").innerHTML = `<table><caption class="visually-hidden">Buffer slots per rank</caption><thead><tr><th scope="col">holder</th>${
      Array.from({ length: slots }, (_, s) => `<th scope="col">slot ${s}<br><span class="hint">${fmtBytes(data.slot_bytes[s])}</span></th>`).join("")}</tr></thead><tbody>${rows}</tbody></table>`;
    $("step-label").textContent = idx === 0 ? `start (0 / ${data.steps.length})` : `step ${idx} / ${data.steps.length}`;
    const name = (h) => (h < n ? `r${h}` : "switch");
    $("step-transfers").innerHTML = transfers.filter((t) => t.src !== t.dst).slice(0, 64).map((t) =>
      `<li>${name(t.src)} → ${name(t.dst)}: slot ${t.src_slot}${t.dst_slot !== t.src_slot ? `→${t.dst_slot}` : ""}, ${fmtBytes(t.bytes)}${t.reduce ? ", reduce" : ""}</li>`).join("");
  }

  function step(delta) {
    if (!state.steps) return;
    state.stepIndex = Math.max(0, Math.min(state.steps.steps.length, state.stepIndex + delta));
    renderStep();
  }
  function stopPlay() { clearInterval(state.timer); state.timer = null; $("step-play").textContent = "Play"; }
  function togglePlay() {
    if (state.timer) return stopPlay();
    if (!state.steps) return;
    if (state.stepIndex >= state.steps.steps.length) state.stepIndex = 0;
    $("step-play").textContent = "Pause";
    state.timer = setInterval(() => { if (state.stepIndex >= state.steps.steps.length) return stopPlay(); step(1); }, 700);
  }

  // ---- start ----------------------------------------------------------------------------------------------------
  async function start() {
    try {
      const [models, clusters, catalogue] = await Promise.all(["/v1/presets/models", "/v1/presets/clusters", "/v1/collectives/algorithms"].map((p) => api(p).then((r) => r.json())));
      Object.assign(state.presets, { models, clusters }); state.catalogue = catalogue;
    } catch {
      banner(`Cannot reach the commplan server at ${location.origin}.`); $("status").textContent = "Server unreachable."; return;
    }
    $("scenario").innerHTML = `<option value="">— pick a scenario —</option>` + SCENARIOS.map((s) => `<option value="${s.id}">${s.label}</option>`).join("");
    $("model-preset").innerHTML = Object.entries(state.presets.models).map(([k, m]) => `<option value="${k}">${m.name || k}</option>`).join("");
    $("cluster-preset").innerHTML = Object.entries(state.presets.clusters).map(([k, c]) => `<option value="${k}" title="${c.description}">${k}</option>`).join("");
    const algs = [...new Set(state.catalogue.map((c) => c.algorithm))].sort();
    $("algorithm").innerHTML += algs.map((a) => `<option value="${a}">${a}</option>`).join("");
    $("step-op").innerHTML = [...new Set(state.catalogue.map((c) => c.op))].sort().map((o) => `<option>${o}</option>`).join("");
    $("step-op").value = "allreduce"; fillStepAlgorithms(); $("step-alg").value = "ring";

    const saved = loadUrl();
    if (saved && saved.r) { fillForm(saved.r); state.selected = saved.c || null; } else { fillForm(SCENARIOS[0].request); $("scenario").value = SCENARIOS[0].id; }

    $("config").addEventListener("input", () => { $("scenario").value = ""; syncVisibility(); schedulePlan(); });
    $("config").addEventListener("change", () => { syncVisibility(); schedulePlan(); });
    $("config").addEventListener("submit", (e) => { e.preventDefault(); schedulePlan(0); });
    $("scenario").addEventListener("change", () => {
      const s = SCENARIOS.find((x) => x.id === $("scenario").value);
      if (s) { state.selected = null; fillForm(s.request); schedulePlan(0); }
    });
    $("share").addEventListener("click", async () => {
      saveUrl();
      try { await navigator.clipboard.writeText(location.href); $("share").textContent = "Link copied"; } catch { $("share").textContent = "Link in address bar"; }
      setTimeout(() => { $("share").textContent = "Copy link"; }, 2000);
    });
    $("filter-text").addEventListener("input", renderTable);
    $("filter-par").addEventListener("change", renderTable);
    $("download").addEventListener("click", downloadCsv);
    $("ledger").tHead.addEventListener("click", (e) => {
      const key = e.target.closest("button")?.dataset.sort; if (!key) return;
      state.sort = { key, dir: state.sort.key === key ? -state.sort.dir : (COLUMNS.find((c) => c.key === key).num ? -1 : 1) };
      renderTable();
    });
    const pick = (row) => { const call = state.plan.calls.find((c) => c.name === row.dataset.name && c.stages.includes(Number(row.dataset.stage))); selectCall(call); };
    $("ledger").tBodies[0].addEventListener("click", (e) => { const row = e.target.closest("tr"); if (row) pick(row); });
    $("ledger").tBodies[0].addEventListener("keydown", (e) => {
      const row = e.target.closest("tr"); if (!row) return;
      if (e.key === "Enter" || e.key === " ") { e.preventDefault(); pick(row); }
      if (e.key === "ArrowDown") { e.preventDefault(); row.nextElementSibling?.focus(); }
      if (e.key === "ArrowUp") { e.preventDefault(); row.previousElementSibling?.focus(); }
    });
    $("step-op").addEventListener("change", fillStepAlgorithms);
    $("step-load").addEventListener("click", loadSteps);
    $("step-prev").addEventListener("click", () => { stopPlay(); step(-1); });
    $("step-next").addEventListener("click", () => { stopPlay(); step(1); });
    $("step-play").addEventListener("click", togglePlay);
    await runPlan();
  }

  window.commplan = { state, render, runPlan };  // for the browser tests and the curious
  document.addEventListener("DOMContentLoaded", start);
})();
