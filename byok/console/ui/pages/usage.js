// Usage per day: tokens by kind and the cache-hit share over time (hand-drawn SVG), and the
// table per day x model x provider.
import { api } from "../app.js";
import { h, num, pct, replace, table } from "../dom.js";

const DAY_MS = 86_400_000;

export async function render(main) {
  const days = h("select", { name: "days" }, [7, 30, 90].map((d) => h("option", { value: d, selected: d === 30 }, `last ${d} days`)));
  const out = h("div", {});
  const load = async () => {
    const span = Number(days.value);
    const offset = -new Date().getTimezoneOffset();
    const since = Date.now() - span * DAY_MS;
    const { usage } = await api("GET", `/usage?since_ms=${since}&tz_offset_min=${offset}`);
    replace(out, ...view(usage, span));
  };
  days.addEventListener("change", load);
  replace(main, h("h2", {}, "Usage ", days), out);
  await load();
}

function dayList(span) {
  const out = [];
  for (let i = span - 1; i >= 0; i--) {
    const d = new Date(Date.now() - i * DAY_MS);
    out.push(`${d.getFullYear()}-${String(d.getMonth() + 1).padStart(2, "0")}-${String(d.getDate()).padStart(2, "0")}`);
  }
  return out;
}

function view(rows, span) {
  const days = dayList(span);
  const perDay = new Map(days.map((d) => [d, { input: 0, cached: 0, output: 0, calls: 0, errors: 0 }]));
  for (const r of rows) {
    const d = perDay.get(r.day);
    if (!d) continue;
    d.cached += r.usage.cache_read;
    d.input += r.usage.input - r.usage.cache_read;
    d.output += r.usage.output;
    d.calls += r.calls;
    d.errors += r.errors;
  }
  const totals = [...perDay.values()];
  const sum = (k) => totals.reduce((a, d) => a + d[k], 0);
  return [
    h("p", {}, `${num(sum("calls"))} calls, ${num(sum("errors"))} errors, ${num(sum("input") + sum("cached"))} input tokens (${pct(sum("cached") / Math.max(1, sum("input") + sum("cached")))} from cache), ${num(sum("output"))} output tokens`),
    h("h3", {}, "Tokens per day"),
    h("div", { class: "legend" }, h("span", {}, h("i", { class: "swatch s-cached" }), "input read from cache"), h("span", {}, h("i", { class: "swatch s-input" }), "input not cached"), h("span", {}, h("i", { class: "swatch s-output" }), "output")),
    barChart(days, totals),
    h("h3", {}, "Cache-hit share per day"),
    lineChart(days, totals.map((d) => (d.input + d.cached ? d.cached / (d.input + d.cached) : null))),
    h("h3", {}, "Per day, model and provider"),
    table(
      ["day", "model", "provider", "calls", "errors", "input", "cache read", "cache write", "output", "reasoning", "cache hit"],
      rows.slice().reverse().map((r) =>
        h("tr", {}, h("td", {}, r.day), h("td", {}, r.model), h("td", {}, r.provider), ...[r.calls, r.errors, r.usage.input, r.usage.cache_read, r.usage.cache_write, r.usage.output, r.usage.reasoning].map((n) => h("td", { class: "num" }, num(n))), h("td", { class: "num" }, pct(r.cache_hit_share))),
      ),
      { id: "usage" },
    ),
  ];
}

const W = 900, H = 220, PAD = 40;

function axes(days, max, format) {
  const out = [];
  for (const f of [0, 0.5, 1]) {
    const y = H - PAD - f * (H - 2 * PAD);
    out.push(h("svg:line", { x1: PAD, x2: W - 10, y1: y, y2: y, stroke: "#e4e7ec" }), h("svg:text", { x: 2, y: y + 4 }, format(max * f)));
  }
  const step = Math.ceil(days.length / 10);
  days.forEach((d, i) => {
    if (i % step === 0) out.push(h("svg:text", { x: PAD + (i + 0.5) * ((W - PAD - 10) / days.length) - 14, y: H - 18 }, d.slice(5)));
  });
  return out;
}

function barChart(days, totals) {
  const max = Math.max(1, ...totals.map((d) => d.input + d.cached + d.output));
  const slot = (W - PAD - 10) / days.length;
  const scale = (v) => (v / max) * (H - 2 * PAD);
  const bars = totals.flatMap((d, i) => {
    let y = H - PAD;
    return [["cached", "#2a62d9"], ["input", "#9db4e8"], ["output", "#f0a44b"]].map(([k, color]) => {
      const height = scale(d[k]);
      y -= height;
      return h("svg:rect", { x: PAD + i * slot + slot * 0.15, y, width: slot * 0.7, height, fill: color }, h("svg:title", {}, `${days[i]}: ${num(d[k])} ${k}`));
    });
  });
  return h("svg:svg", { class: "chart", viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": "tokens per day" }, axes(days, max, (v) => num(Math.round(v))), bars);
}

function lineChart(days, shares) {
  const slot = (W - PAD - 10) / days.length;
  const points = shares.map((s, i) => (s === null ? null : [PAD + (i + 0.5) * slot, H - PAD - s * (H - 2 * PAD)]));
  const path = points.filter(Boolean).map(([x, y], i) => `${i ? "L" : "M"}${x.toFixed(1)},${y.toFixed(1)}`).join(" ");
  const dots = points.map((p, i) => p && h("svg:circle", { cx: p[0], cy: p[1], r: 3, fill: "#067647" }, h("svg:title", {}, `${days[i]}: ${pct(shares[i])}`)));
  return h("svg:svg", { class: "chart", viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": "cache-hit share per day" }, axes(days, 1, (v) => pct(v)), path ? h("svg:path", { d: path, fill: "none", stroke: "#067647", "stroke-width": 2 }) : "", dots);
}
