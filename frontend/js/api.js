// The HTTP API (CONTRACT.md): JSON in, JSON out; 422 bodies are FastAPI's {"detail": [{loc, msg, type}]}.
export class ApiError extends Error {
  constructor(status, detail) {
    super(Array.isArray(detail) ? detail.map((d) => d.msg).join("; ") : String(detail));
    this.status = status; this.detail = Array.isArray(detail) ? detail : [{ loc: [], msg: String(detail) }];
  }
}
export class Unreachable extends Error {}

export async function call(path, body, { signal, accept } = {}) {
  const init = body === undefined ? { signal } : {
    method: "POST", signal, body: JSON.stringify(body),
    headers: { "content-type": "application/json", ...(accept ? { accept } : {}) },
  };
  let response;
  try { response = await fetch(path, init); } catch (err) {
    if (err.name === "AbortError") throw err;
    throw new Unreachable(`Cannot reach the commplan server at ${location.origin}.`);
  }
  if (!response.ok) {
    let detail;
    try { detail = (await response.json()).detail; } catch { detail = `the server answered ${response.status}`; }
    throw new ApiError(response.status, detail ?? `the server answered ${response.status}`);
  }
  return response;
}

export const getJson = async (path) => (await call(path)).json();
export const postJson = async (path, body, opts) => (await call(path, body, opts)).json();

// POST /v1/search?stream=true (or another streamed search, `path`: /v1/serve/search?stream=true): NDJSON lines
// {"type": "progress"|"result"|"error", ...}; onProgress(line) per progress line; resolves to the result. A server
// that answers plain JSON is accepted too.
export async function search(body, onProgress, signal, path = "/v1/search?stream=true") {
  const response = await call(path, body, { signal, accept: "application/x-ndjson" });
  if (!(response.headers.get("content-type") || "").includes("ndjson")) return response.json();
  const reader = response.body.getReader(), decoder = new TextDecoder();
  let buffer = "", result = null;
  const handle = (line) => {
    if (!line.trim()) return;
    const msg = JSON.parse(line);
    if (msg.type === "progress") onProgress(msg);
    else if (msg.type === "error") throw new ApiError(msg.status || 422, msg.detail || "search failed");
    else result = msg;
  };
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    const lines = buffer.split("\n");
    buffer = lines.pop();
    lines.forEach(handle);
  }
  handle(buffer);
  if (!result) throw new ApiError(500, "the search stream ended without a result");
  return result;
}
