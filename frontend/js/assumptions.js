// The Assumptions panel: every setting the plan was made under (plan.assumptions, planner/assumptions.py), its
// value as the planner resolved it, whether this request set it or left it to the default, and the default's
// source. The request path is the field's name, so "set" is read off the request the page sent.
import { get } from "./controls.js";
import { $, el } from "./dom.js";

export function renderAssumptions(plan, request) {
  const rows = (plan && plan.assumptions) || [];
  $("assumptions-card").hidden = !rows.length;
  if (!rows.length) return;
  const given = (a) => get(request, a.field) !== undefined && get(request, a.field) !== null;
  // a model field the request leaves out comes from what it names: the preset or the pasted config.json
  const model = request.model || {}, from = model.hf_config ? "config.json" : model.preset ? "preset" : "default";
  const origin = (a) => (given(a) ? "set" : !a.field.startsWith("model.") ? "default" : from);
  const defaults = rows.filter((a) => origin(a) === "default").length;
  $("assumptions-note").textContent = `${rows.length} settings, ${defaults} of them defaults this request left out; the model's from ${model.hf_config ? "its config.json" : model.preset ? "its preset" : "its fields and the schema's defaults"}.`;
  $("assumptions-table").tBodies[0].replaceChildren(...rows.map((a) => el("tr", { className: given(a) ? "given" : "" },
    el("td", {}, el("code", {}, a.field)),
    el("td", {}, /^\d{4,}$/.test(a.value) ? Number(a.value).toLocaleString("en-US") : a.value),  // exact counts: 128,256
    el("td", {}, origin(a)),
    el("td", { className: "col-wide" }, given(a) ? "this request" : a.source))));
}
