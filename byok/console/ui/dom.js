// Building the page from data without innerHTML: every value goes in as text.

export function h(tag, attrs = {}, ...children) {
  const svg = tag.startsWith("svg:");
  const el = svg
    ? document.createElementNS("http://www.w3.org/2000/svg", tag.slice(4))
    : document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else if (key === "dataset") Object.assign(el.dataset, value);
    else if (key === "value" && !svg) el.value = value;
    else if (key === "checked" && !svg) el.checked = Boolean(value);
    else el.setAttribute(key, value === true ? "" : String(value));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

export function replace(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

export function table(headers, rows, attrs = {}) {
  return h("table", attrs, h("thead", {}, h("tr", {}, headers.map((x) => h("th", {}, x)))), h("tbody", {}, rows));
}

export function when(ms) {
  if (ms === null || ms === undefined) return "";
  return new Date(ms).toLocaleString();
}

export function num(n) {
  return n === null || n === undefined ? "–" : Number(n).toLocaleString();
}

export function pct(share) {
  return share === null || share === undefined ? "–" : `${(share * 100).toFixed(1)}%`;
}

export function msText(ms) {
  return ms === null || ms === undefined ? "–" : `${num(ms)} ms`;
}
