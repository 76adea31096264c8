// The model's own fields, each editable over the preset or the pasted config.json (issue 21 item 7): the request
// sends a field only when it is typed in, so a blank field is the base model's value, shown as the placeholder.
// Names as in app/schemas/plan.py ModelIn; moe.* and mla.* are whole blocks there (MoEIn, MLAIn: a block given
// replaces the base model's), so an edited block is sent whole, the base model's values filling what is not
// typed; a block a request brings (a link, a scenario) is read back as it came (wholeBlocks). Over a config.json or
// the fields alone the page does not know the base's blocks: an edited block then needs its required fields typed
// (the server's 422 names the missing one).
// A field whose null means something (the rows with a fifth entry: app/convert.py NULLABLE, or a field inside a
// block, which is sent whole) has a "none" box: ticked, the request sends null, clearing the preset's value (GPT-OSS
// without its sliding window or YaRN). The MoE and MLA blocks have one each: the model without experts or MLA.
import { fillInput, get, layerList, ON_OFF, onOff, showSetCount } from "./controls.js";
import { $, el } from "./dom.js";
import { state } from "./state.js";

// [path under model, label, kind (int | float | bool | list | a list of choices), title, what a null stands for]
export const MODEL_ROWS = [
  ["num_layers", "Layers", "int", "decoder layers (HF num_hidden_layers)"],
  ["hidden_size", "Hidden size", "int", "model width h"],
  ["num_attention_heads", "Attention heads", "int", "query heads"],
  ["num_kv_heads", "KV heads", "int", "key/value heads (GQA)", "= heads"],
  ["head_dim", "Head dim", "int", "per head", "hidden / heads"],
  ["ffn_hidden_size", "FFN hidden size", "int", "dense MLP width"],
  ["vocab_size", "Vocabulary", "int", "tokens (padded to 128 x TP as Megatron does)"],
  ["sliding_window", "Sliding window", "int", "keys each query attends in sliding layers (GPT-OSS 128)", "full attention"],
  ["full_attention_interval", "Full attention every", "int", "layers k, 2k, ... attend fully (GPT-OSS 2)", "every layer slides"],
  ["mtp_layers", "MTP layers", "int", "multi-token-prediction modules (DeepSeek-V3 1)"],
  ["gated_mlp", "Gated MLP (SwiGLU)", "bool", "three MLP matrices instead of two"],
  ["glu_clamp", "GLU clamp", "float", "the gated MLP's clamp limit (GPT-OSS swiglu_limit 7; Megatron clamps in kernels of its own)", "none"],
  ["attention_dropout", "Attention dropout", "float", "training dropout probability on the attention probabilities (Megatron --attention-dropout; 0 draws nothing)", "GPT-style 0.1, else 0"],
  ["hidden_dropout", "Hidden dropout", "float", "training dropout probability on each block's output and the embedding (Megatron --hidden-dropout; 0 launches nothing)", "GPT-style 0.1, else 0"],
  ["norm", "Norm", ["rmsnorm", "layernorm"], "the layers' norm"],
  ["qk_norm", "QK-norm", "bool", "RMSNorm on queries and keys per head (Qwen3)"],
  ["attention_sinks", "Attention sinks", "bool", "one learned sink logit per head (GPT-OSS)"],
  ["tied_embeddings", "Tied embeddings", "bool", "the output layer shares the embedding"],
  ["linear_bias", "Linear biases", "bool", "every linear has a bias (GPT)"],
  ["qkv_bias", "QKV bias", "bool", "the QKV projection alone has one (Qwen2)"],
  ["learned_position_embeddings", "Learned positions", "bool", "a position embedding table (GPT) instead of RoPE"],
  ["rope_scaling", "RoPE scaling", ["default", "linear", "dynamic", "yarn", "longrope", "llama3"], "Hugging Face rope_type (GPT-OSS yarn: Megatron runs it unfused)", "plain RoPE"],
  ["moe.num_experts", "Experts", "int", "routed experts"],
  ["moe.top_k", "Top-k", "int", "experts per token"],
  ["moe.expert_ffn_hidden_size", "Expert FFN size", "int", "each routed expert's width"],
  ["moe.num_shared_experts", "Shared experts", "int", "experts every token runs"],
  ["moe.shared_expert_ffn_hidden_size", "Shared expert FFN size", "int", "their total width", "shared x expert FFN"],
  ["moe.first_dense_layers", "First dense layers", "int", "leading layers with a dense MLP (DeepSeek-V3 3)"],
  ["moe.layer_freq", "MoE every", "int", "every k-th layer is MoE"],
  ["moe.mlp_only_layers", "Dense-MLP layers", "list", "0-based layers that keep a dense MLP (Qwen3 mlp_only_layers)"],
  ["moe.capacity_factor", "Capacity factor", "float", "tokens per expert capped at this x the even share", "dropless"],
  ["moe.load_balancing", "Load balancing", ["aux_loss", "seq_aux_loss", "none"], "the router's balancing loss"],
  ["moe.expert_bias", "Expert bias", "bool", "aux-loss-free balancing (DeepSeek-V3)"],
  ["moe.node_limit", "Node limit", "int", "max nodes a token is sent to (DeepSeek-V3 4)", "none"],
  ["mla.q_lora_rank", "MLA q LoRA rank", "int", "query compression (0: none)"],
  ["mla.kv_lora_rank", "MLA kv LoRA rank", "int", "the latent KV width"],
  ["mla.qk_nope_head_dim", "MLA qk nope dim", "int", "per head, without RoPE"],
  ["mla.qk_rope_head_dim", "MLA qk rope dim", "int", "per head, decoupled RoPE"],
  ["mla.v_head_dim", "MLA v head dim", "int", "per head"],
];
const BLOCKS = ["moe", "mla"];
// [block, label, title] of each block's "none" box: model.moe / model.mla null
const BLOCK_NONE = { moe: ["No MoE", "send moe: null, a dense model (the preset's experts dropped)"],
  mla: ["No MLA", "send mla: null, standard attention (the preset's latent attention dropped)"] };
const idOf = (path) => `m-${path.replace(/[._]/g, "-")}`;
const noneOf = (path) => $(`${idOf(path)}-none`);  // null for a row without a "none" box
const nullable = (row) => row[4] !== undefined;
// request field -> input, for the 422 marks (form.js FIELDS); a whole block's error marks its first field
export const MODEL_FIELDS = Object.fromEntries([
  ...MODEL_ROWS.map(([path]) => [`model.${path}`, idOf(path)]),
  ...BLOCKS.map((b) => [`model.${b}`, idOf(MODEL_ROWS.find(([p]) => p.startsWith(`${b}.`))[0])]),
]);

// where the model comes from: a preset, a pasted config.json, or the fields alone (no preset: the fields typed are the
// whole model block, the schema's defaults for the rest, as a request body's model block without a preset)
export const modelSource = () => ($("model-source-hf").checked ? "hf" : $("model-source-fields").checked ? "fields" : "preset");
// the model the fields edit: the preset's as GET /v1/presets/models gives it; null over a config.json or alone
const base = () => (modelSource() !== "preset" ? null : state.presets.models[$("model-preset").value] || null);

// the inputs, under the model's facts (index.html's Model fieldset), once the presets are known
export function buildModelFields() {
  if ($("model-fields")) return;
  const field = (row) => {
    const [path, label, kind, title, none] = row;
    const id = idOf(path), choices = kind === "bool" ? ON_OFF : Array.isArray(kind) ? kind.map((c) => [c, c]) : null;
    const input = choices
      ? el("select", { id, title }, el("option", { value: "" }, "default"), choices.map(([v, t]) => el("option", { value: v }, t)))
      : kind === "list" ? el("input", { id, type: "text", maxLength: 4096, title })
        : el("input", { id, type: "number", min: "0", step: kind === "float" ? "any" : "1", inputMode: kind === "float" ? "decimal" : "numeric", title });
    const out = [el("div", { className: "field" }, el("label", { htmlFor: id }, label), !nullable(row) ? input
      : el("div", { className: "with-none" }, input, el("label", { className: "check none-choice", title: `send null: ${none}` },
        el("input", { type: "checkbox", id: `${id}-none` }), "none")))];
    const block = path.split(".")[0];
    if (BLOCK_NONE[block] && MODEL_ROWS.find(([p]) => p.startsWith(`${block}.`))[0] === path) {  // the block's box first
      const [text, hint] = BLOCK_NONE[block];
      out.unshift(el("div", { className: "field check" },
        el("label", { title: hint }, el("input", { type: "checkbox", id: `m-${block}-none` }), text)));
    }
    return out;
  };
  $("model-facts").after(el("details", { id: "model-fields", className: "group" },
    el("summary", {}, "Model fields ", el("span", { className: "set-count", id: "model-fields-count" })),
    el("p", { className: "hint" }, "Blank: the preset's (or config.json's) value, shown greyed. A field typed here overrides it."),
    el("div", { className: "grid2" }, MODEL_ROWS.flatMap(field))));
  $("model-fields").addEventListener("input", countModelFields);
  $("model-fields").addEventListener("change", (e) => { if (e.target.id.endsWith("-none")) { syncNone(); countModelFields(); } });
  // another preset is another base: the edits made over the last one go
  $("model-preset").addEventListener("change", () => { clearModelFields(); showModelDefaults(); });
  for (const id of ["model-source-preset", "model-source-hf", "model-source-fields"]) $(id).addEventListener("change", showModelDefaults);
  $("model-source-fields").addEventListener("change", startFromPreset);
  showModelDefaults();
}

// "Fields only" with nothing typed starts from the preset on show, its fields filled in and open, to edit: it sent an
// empty model, a 422 naming six missing fields, the fields folded away (round 13)
function startFromPreset() {
  const m = state.presets.models[$("model-preset").value];
  if (!m || setFields() > 0) return;
  fillModelFields(m);
  if ($("seq-length").value.trim() === "") $("seq-length").value = String(m.seq_length);
  $("model-fields").closest("details").open = true;
}

// The blocks a request put in the form whole (a link, a scenario, a search hit): read back as they came, the fields
// they leave out the schema's defaults as the API takes them, not the preset's (a link's DeepSeek-V3 moe block
// without expert_bias planned the preset's expert bias on the page). A block typed over a preset merges with its.
const wholeBlocks = new Set();

function clearModelFields() {
  wholeBlocks.clear();
  for (const [path] of MODEL_ROWS) { $(idOf(path)).value = ""; if (noneOf(path)) noneOf(path).checked = false; }
  for (const b of BLOCKS) $(`m-${b}-none`).checked = false;
  syncNone(); countModelFields();
}

// a ticked "none" disables its input (and a block's, the block's inputs): null is sent, not what they hold
function syncNone() {
  const dropped = new Set(BLOCKS.filter((b) => $(`m-${b}-none`).checked));
  for (const [path] of MODEL_ROWS) {
    const box = noneOf(path), gone = dropped.has(path.split(".")[0]);
    if (box) box.disabled = gone;
    $(idOf(path)).disabled = gone || !!(box && box.checked);
  }
}

// the fields the request sets: typed, or ticked "none"
const setFields = () => MODEL_ROWS.filter(([path]) => $(idOf(path)).value.trim() !== "" || (noneOf(path) && noneOf(path).checked)).length
  + BLOCKS.filter((b) => $(`m-${b}-none`).checked).length;

// each blank field shows the value it stands for
export function showModelDefaults() {
  const m = base();
  for (const [path, , kind, , none = "none"] of MODEL_ROWS) {
    const input = $(idOf(path)), v = m ? get(m, path) : undefined;
    const shown = wholeBlocks.has(path.split(".")[0]) ? "the schema's default" : m === null ? (modelSource() === "hf" ? "config.json's" : "the schema's default") : v === undefined || v === null || (Array.isArray(v) && !v.length) ? none
      : kind === "bool" ? (v ? "on" : "off") : Array.isArray(v) ? v.join(",") : String(v);
    if (input.tagName === "SELECT") input.options[0].textContent = `default (${shown})`;
    else input.placeholder = shown;
  }
  countModelFields();
}

export function countModelFields() {
  showSetCount($("model-fields-count"), setFields());
}

// the typed fields into the request's model block
export function readModelFields(model, FormError) {
  const blocks = {};
  const dropped = BLOCKS.filter((b) => $(`m-${b}-none`).checked);
  for (const [path, label, kind] of MODEL_ROWS) {
    const [head, key] = path.split(".");
    if (dropped.includes(head)) continue;
    const text = $(idOf(path)).value.trim(), none = noneOf(path) && noneOf(path).checked;
    if (text === "" && !none) continue;
    const value = none ? null : kind === "bool" ? onOff(text) : Array.isArray(kind) ? text : kind === "list" ? layerList(text, `model.${path}`, label, FormError) : Number(text);
    if (!none && kind === "int" && !Number.isInteger(value)) throw new FormError(`model.${path}`, `${label}: a whole number, got "${text}"`);
    if (!none && kind === "float" && !Number.isFinite(value)) throw new FormError(`model.${path}`, `${label}: a number, got "${text}"`);
    if (key === undefined) model[head] = value;
    else (blocks[head] ||= {})[key] = value;
  }
  const m = base();
  for (const [name, edits] of Object.entries(blocks)) model[name] = { ...((!wholeBlocks.has(name) && m && m[name]) || {}), ...edits };
  for (const b of dropped) model[b] = null;
  return model;
}

// a request's model fields into the inputs (a link, a scenario, a search hit)
export function fillModelFields(m) {
  wholeBlocks.clear();
  for (const b of BLOCKS) {
    $(`m-${b}-none`).checked = m[b] === null;  // an explicit null, not an absent block
    if (m[b] && typeof m[b] === "object") wholeBlocks.add(b);
  }
  for (const [path] of MODEL_ROWS) {
    const v = get(m, path), box = noneOf(path);
    if (box) box.checked = v === null;  // get() gives undefined under a null block
    fillInput($(idOf(path)), v);
  }
  syncNone();
  showModelDefaults();
}
