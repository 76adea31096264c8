// Page state and its URL form (#s=base64url(JSON)): the request, the selected call and the Serve card's options.
export const state = {
  presets: { models: {}, clusters: {} }, catalogue: [], plan: null, request: null, selected: null,
  sort: { key: "time_iter", dir: -1 }, planSeq: 0, charts: {}, stale: false, search: null,
  calibration: null,  // fitted constants (POST /v1/calibrate) the plan is priced with: cluster.calibration
  serveOptions: null,  // the Serve card's options once changed (serve.js): kept in the URL as "o"
};

const encode = (obj) => btoa(unescape(encodeURIComponent(JSON.stringify(obj)))).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
const decode = (text) => JSON.parse(decodeURIComponent(escape(atob(text.replace(/-/g, "+").replace(/_/g, "/")))));

export function saveUrl() {
  const saved = { r: state.request, c: state.selected };
  if (state.serveOptions) saved.o = state.serveOptions;
  const hash = `#s=${encode(saved)}`;
  if (location.hash !== hash) history.replaceState(null, "", hash);
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
    return { r: saved.r, c, o };
  } catch { return null; }
}
