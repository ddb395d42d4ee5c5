// Aliases: one id Cursor sees, tried in order of its targets; the next target only when the
// one before failed before any output reached Cursor.
import { api, errorBox } from "../app.js";
import { h, replace, table } from "../dom.js";

export async function render(main) {
  const [{ aliases }, { models }] = await Promise.all([api("GET", "/aliases"), api("GET", "/models")]);
  const status = h("p", { role: "status" });
  const reload = () => render(main);
  const act = async (work) => {
    try {
      await work();
      reload();
    } catch (e) {
      replace(status, errorBox(e));
    }
  };
  const rows = aliases.map((a) =>
    h(
      "tr",
      { dataset: { alias: a.id } },
      h("td", {}, a.id, a.display_name ? h("div", { class: "muted" }, a.display_name) : ""),
      h("td", {}, a.targets.join(" → ")),
      h("td", { class: "num" }, `${a.first_token_timeout_s} s`),
      h("td", { class: "num" }, `${a.cooldown_s} s`),
      h("td", {}, a.enabled ? (a.served ? "yes" : "no target served") : "no"),
      h(
        "td",
        {},
        h("button", { type: "button", onclick: () => act(() => api("PATCH", `/aliases/${a.id}`, { enabled: !a.enabled })) }, a.enabled ? "Disable" : "Enable"),
        " ",
        h("button", { type: "button", class: "danger", onclick: () => confirm(`Delete alias ${a.id}?`) && act(() => api("DELETE", `/aliases/${a.id}`)) }, "Delete"),
      ),
    ),
  );
  const id = h("input", { name: "id", required: true, placeholder: "fast" });
  const targets = h("input", { name: "targets", required: true, size: 40, placeholder: "model-a, model-b (in order)", list: "model-ids" });
  const timeout = h("input", { name: "first_token_timeout_s", type: "number", min: 1, value: 30 });
  const cooldown = h("input", { name: "cooldown_s", type: "number", min: 1, value: 60 });
  const form = h(
    "form",
    {
      class: "inline card",
      id: "add-alias",
      onsubmit: (e) => {
        e.preventDefault();
        const body = {
          id: id.value,
          targets: targets.value.split(",").map((t) => t.trim()).filter(Boolean),
          first_token_timeout_s: Number(timeout.value),
          cooldown_s: Number(cooldown.value),
        };
        act(() => api("POST", "/aliases", body));
      },
    },
    h("strong", {}, "Add an alias"),
    h("label", {}, "id", id),
    h("label", {}, "targets", targets),
    h("label", {}, "first-token timeout (s)", timeout),
    h("label", {}, "cooldown (s)", cooldown),
    h("button", { type: "submit", class: "primary" }, "Add"),
    h("datalist", { id: "model-ids" }, models.map((m) => h("option", { value: m.id }))),
  );
  replace(
    main,
    h("h2", {}, "Aliases"),
    h(
      "p",
      { class: "hint" },
      "Cursor sees the alias as one model. A run tries its targets in order: it moves to the next only when a target fails ",
      "or sends no first token within the timeout before anything reached Cursor, and skips a target that failed for its cooldown. ",
      "Which target served each call is in the call log.",
    ),
    table(["alias", "targets, in order", "first-token timeout", "cooldown", "enabled", ""], rows, { id: "aliases" }),
    status,
    form,
  );
}
