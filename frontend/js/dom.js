// DOM helpers. Every string reaches the page as a text node or a property, never as markup (issue 13 point 5).
export const $ = (id) => document.getElementById(id);

// el("td", {className: "num", title: t}, "text", childNode) -> element; attributes starting with "data-" or
// "aria-" go through setAttribute, everything else is a property; strings become text nodes.
export function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("data-") || key.startsWith("aria-") || key === "role" || key === "scope") node.setAttribute(key, String(value));
    else if (key === "style") Object.assign(node.style, value);
    else if (key.startsWith("on") && typeof value === "function") node.addEventListener(key.slice(2), value);
    else node[key] = value;
  }
  append(node, children);
  return node;
}

function append(node, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

// a label's text without its hint span: "DP (blank: rest)" is DP, the Serve card's "Nodes (blank: the form's)" Nodes
export const bareLabel = (label) => [...label.childNodes].filter((n) => !(n.classList && n.classList.contains("hint")))
  .map((n) => n.textContent).join("").trim();

export const setText = (id, text) => { $(id).textContent = text; };

export function options(select, items, chosen) {
  // items: [[value, label, title?]]
  select.replaceChildren(...items.map(([value, label, title]) => el("option", { value, title }, label)));
  if (chosen !== undefined && items.some(([v]) => v === chosen)) select.value = chosen;
}

export function download(name, blob) {
  const link = el("a", { href: URL.createObjectURL(blob), download: name });
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(link.href), 0);
}
