// Conversations: their turns (runs), revisions (edits branch), usage and cache-hit share.
import { api } from "../app.js";
import { h, msText, num, pct, replace, table, when } from "../dom.js";

export async function render(main, params) {
  if (params[0]) return detail(main, params[0]);
  const { conversations } = await api("GET", "/conversations?limit=200");
  const rows = conversations.map((c) =>
    h(
      "tr",
      { class: "clickable", onclick: () => { location.hash = `#/conversations/${encodeURIComponent(c.conversation_id)}`; } },
      h("td", {}, when(c.updated_at_ms)),
      h("td", {}, c.conversation_id),
      h("td", {}, c.last_model || "–"),
      h("td", { class: "num" }, num(c.turns)),
      h("td", { class: "num" }, num(c.revisions)),
      h("td", { class: "num" }, num(c.calls)),
      h("td", { class: "num" }, num(c.usage.input)),
      h("td", { class: "num" }, num(c.usage.output)),
      h("td", { class: "num" }, pct(c.cache_hit_share)),
    ),
  );
  replace(
    main,
    h("h2", {}, "Conversations"),
    table(["last change", "conversation", "model", "turns", "revisions", "calls", "input", "output", "cache hit"], rows, { id: "conversations" }),
  );
  return null;
}

async function detail(main, id) {
  const c = await api("GET", `/conversations/${encodeURIComponent(id)}`);
  const turns = c.turns.map((t) =>
    h(
      "tr",
      {},
      h("td", {}, when(t.started_at_ms)),
      h("td", {}, t.request_id),
      h("td", {}, t.model_id),
      h("td", {}, h("span", { class: `badge ${t.status === "success" ? "ok" : t.status}` }, t.status), t.error ? h("div", { class: "error" }, t.error) : ""),
      h("td", { class: "num" }, msText(t.ended_at_ms && t.ended_at_ms - t.started_at_ms)),
      h("td", { class: "num" }, num(t.calls)),
      h("td", { class: "num" }, num(t.usage && t.usage.input)),
      h("td", { class: "num" }, num(t.usage && t.usage.output)),
      h("td", { class: "num" }, pct(t.cache_hit_share)),
    ),
  );
  const revisions = c.revisions.map((r) =>
    h("tr", {}, h("td", {}, r.id), h("td", {}, r.parent_id ?? "–"), h("td", { class: "num" }, num(r.message_count)), h("td", {}, when(r.created_at_ms)), h("td", {}, r.id === c.head_revision ? "head" : "")),
  );
  replace(
    main,
    h("p", {}, h("a", { href: "#/conversations" }, "← all conversations")),
    h("h2", {}, `Conversation ${c.conversation_id}`),
    h("p", {}, `${num(c.calls)} calls · ${num(c.usage.input)} input tokens (${pct(c.cache_hit_share)} from cache) · ${num(c.usage.output)} output tokens`),
    h("h3", {}, "Turns"),
    table(["started", "request", "model", "outcome", "duration", "calls", "input", "output", "cache hit"], turns),
    h("h3", {}, "Revisions"),
    h("p", { class: "hint" }, "Each commit makes a revision; an edited message branches from the revision before it."),
    table(["revision", "parent", "messages", "made", ""], revisions),
  );
  return null;
}
