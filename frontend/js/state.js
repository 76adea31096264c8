// Page state and its URL form (#s=base64url(JSON)): the request, the selected call, the Serve card's options and its
// own inputs.
export const state = {
  presets: { models: {}, clusters: {} }, catalogue: [], plan: null, request: null, planned: null, selected: null,
  sort: { key: "time_iter", dir: -1 }, planSeq: 0, charts: {}, stale: false, search: null,
  calibration: null,  // fitted constants (POST /v1/calibrate) the plan is priced with: cluster.calibration
  serveOptions: null,  // the Serve card's options once changed (serve.js): kept in the URL as "o"
  serveCard: null,  // the Serve card's model, nodes, engine, traffic, pools and SLA once set (serve.js): "v"
};

const encode = (obj) => btoa(unescape(encodeURIComponent(JSON.stringify(obj)))).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
const decode = (text) => JSON.parse(decodeURIComponent(escape(atob(text.replace(/-/g, "+").replace(/_/g, "/")))));

// push: a new history entry, so Back returns to the state before (a plan of another request); else the entry on
// show is rewritten (a selected call, the Serve card). Every round to 11 replaced the entry, so Back after a session
// of changes left the page (round 12). The entries this page writes carry {commplan: 1}: main.js restores them in
// place on popstate; an entry a link made carries none and is loaded as a new visit.
export function saveUrl(push = false) {
  const saved = { r: state.request, c: state.selected };
  if (state.serveOptions) saved.o = state.serveOptions;
  if (state.serveCard) saved.v = state.serveCard;
  const hash = `#s=${encode(saved)}`;
  // the scenario on show goes with the entry (not the link: a link is its request), so Back to a scenario's plan
  // names it again; the select read "— pick a scenario —" over the scenario's own form (round 13)
  const entry = { commplan: 1, scenario: (document.getElementById("scenario") || {}).value || "" };
  if (location.hash === hash && history.state && history.state.commplan && history.state.scenario === entry.scenario) return;
  if (push && location.hash !== hash) history.pushState(entry, "", hash);
  else history.replaceState(entry, "", hash);
}

// what the URL holds, or null; only plain JSON objects are accepted (anything else is ignored)
export function loadUrl() {
  const match = location.hash.match(/^#s=(.+)$/);
  if (!match) return null;
  try {
    const saved = decode(match[1]);
    if (!saved || typeof saved !== "object" || typeof saved.r !== "object") return null;
    const c = saved.c && typeof saved.c.name === "string" && Number.isInteger(saved.c.stage) ? saved.c : null;
    const o = saved.o && typeof saved.o === "object" && !Array.isArray(saved.o) ? saved.o : null;
    const v = saved.v && typeof saved.v === "object" && !Array.isArray(saved.v) ? saved.v : null;
    return { r: saved.r, c, o, v };
  } catch { return null; }
}
