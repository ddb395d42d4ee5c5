// The call log: provider calls, newest first, filtered; new ones arrive live; one call's detail.
import { api, liveCalls } from "../app.js";
import { h, msText, num, pct, replace, when } from "../dom.js";

export async function render(main, params) {
  if (params[0]) return detail(main, params[0]);
  const filters = { model: "", provider: "", status: "", since: "" };
  const body = h("tbody", {});
  const state = h("span", { class: "badge", id: "live-state" }, "connecting");
  const matches = (c) =>
    (!filters.model || [c.model_id, c.model, c.alias_id].includes(filters.model)) &&
    (!filters.provider || c.provider_id === filters.provider) &&
    (!filters.status || c.status === filters.status);

  async function load() {
    const { since, ...rest } = filters;
    const query = new URLSearchParams(Object.entries(rest).filter(([, v]) => v));
    if (since) query.set("since_ms", String(Date.now() - Number(since) * 3_600_000));
    query.set("limit", "200");
    const { calls } = await api("GET", `/calls?${query}`);
    replace(body, calls.map((c) => row(c, false)));
  }

  const input = (name, placeholder) =>
    h("input", { name, placeholder, onchange: (e) => { filters[name] = e.target.value.trim(); load(); } });
  const status = h(
    "select",
    { name: "status", onchange: (e) => { filters.status = e.target.value; load(); } },
    ["", "ok", "error", "canceled"].map((s) => h("option", { value: s }, s || "any status")),
  );
  const since = h(
    "select",
    { name: "since", onchange: (e) => { filters.since = e.target.value; load(); } },
    [["", "any time"], ["1", "last hour"], ["24", "last day"], ["168", "last week"]].map(([v, t]) => h("option", { value: v }, t)),
  );
  replace(
    main,
    h("h2", {}, "Calls ", state),
    h("form", { class: "inline", onsubmit: (e) => e.preventDefault() }, since, input("model", "model"), input("provider", "provider"), status),
    h("table", { id: "calls" }, h("thead", {}, h("tr", {}, HEADERS.map((x) => h("th", {}, x)))), body),
  );
  await load();
  return liveCalls(
    (call) => {
      if (matches(call)) body.prepend(row(call, true));
    },
    (s) => replace(state, s),
  );
}

const HEADERS = ["time", "model", "provider", "status", "TTFB", "TTFT", "duration", "input", "output", "cache hit", "retries"];

function row(c, fresh) {
  const usage = c.usage || {};
  return h(
    "tr",
    { class: fresh ? "clickable fresh" : "clickable", dataset: { call: c.id }, onclick: () => { location.hash = `#/calls/${c.id}`; } },
    h("td", {}, when(c.started_at_ms)),
    h("td", {}, c.model_id || c.model, c.alias_id ? h("div", { class: "muted" }, `via ${c.alias_id}`) : ""),
    h("td", {}, c.provider_id),
    h("td", {}, h("span", { class: `badge ${c.status}` }, c.status)),
    h("td", { class: "num" }, msText(c.ttfb_ms)),
    h("td", { class: "num" }, msText(c.ttft_ms)),
    h("td", { class: "num" }, msText(c.duration_ms)),
    h("td", { class: "num usage-input" }, num(usage.input)),
    h("td", { class: "num usage-output" }, num(usage.output)),
    h("td", { class: "num" }, pct(c.cache_hit_share)),
    h("td", { class: "num" }, num(c.retries)),
  );
}

async function detail(main, id) {
  const c = await api("GET", `/calls/${encodeURIComponent(id)}`);
  const usage = c.usage || {};
  const fields = [
    ["call", c.id],
    ["started", when(c.started_at_ms)],
    ["request id", c.request_id],
    ["conversation", h("a", { href: `#/conversations/${encodeURIComponent(c.conversation_id)}` }, c.conversation_id)],
    ["model (byok id)", c.model_id || "–"],
    ["alias Cursor picked", c.alias_id || "–"],
    ["provider", c.provider_id],
    ["upstream model", c.model],
    ["status", h("span", { class: `badge ${c.status}` }, c.status)],
    ["error", c.error ? h("span", { class: "error" }, `${c.error} (${c.error_kind || "?"})`) : "–"],
    ["HTTP status", c.http_status ?? "–"],
    ["queued", msText(c.queue_ms)],
    ["time to first byte", msText(c.ttfb_ms)],
    ["time to first token", msText(c.ttft_ms)],
    ["duration", msText(c.duration_ms)],
    ["attempts (retries)", `${num(c.attempts)} (${num(c.retries)})`],
    ["input tokens", num(usage.input)],
    ["cache read / write", `${num(usage.cache_read)} / ${num(usage.cache_write)}`],
    ["output tokens (reasoning)", `${num(usage.output)} (${num(usage.reasoning)})`],
    ["cache-hit share", pct(c.cache_hit_share)],
    ["extends the previous request", c.prefix_extends === null ? "first call (not compared)" : c.prefix_extends ? "yes" : `no (${num(c.common_prefix_messages)} messages in common)`],
    ["events / bytes", `${num(c.event_count)} / ${num(c.byte_count)}`],
    ["request SHA-256", c.request_sha256],
  ];
  const bodies = h("div", { id: "bodies" });
  if (!c.bodies_logged) {
    replace(bodies, h("p", { class: "hint" }, "Request and response bodies are shown with detailed logging on ([logging] detailed = true)."));
  } else {
    for (const part of ["request", "response"]) {
      const has = part === "request" ? c.has_request_body : c.has_response_body;
      if (!has) continue;
      const pre = h("pre", {}, "…");
      bodies.append(h("h3", {}, `${part} body (redacted)`), pre);
      api("GET", `/calls/${c.id}/${part}`).then((text) => replace(pre, typeof text === "string" ? text : JSON.stringify(text, null, 2)), (e) => replace(pre, e.message));
    }
  }
  replace(
    main,
    h("p", {}, h("a", { href: "#/calls" }, "← all calls")),
    h("h2", {}, `Call ${c.id}`),
    h("dl", { class: "fields", id: "call-detail" }, fields.map(([k, v]) => [h("dt", {}, k), h("dd", {}, v)])),
    bodies,
  );
  return null;
}

