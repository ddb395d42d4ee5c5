// Providers and models: the config file's (read-only) and the console's; add a provider, list
// its models (discovery), make one a model Cursor sees, test a provider with a one-token call.
import { api, errorBox } from "../app.js";
import { h, num, replace, table } from "../dom.js";

const KINDS = ["openai_chat", "openai_responses", "anthropic"];
const EFFORTS = ["", "low", "medium", "high"];

export async function render(main) {
  const [{ providers }, models] = await Promise.all([api("GET", "/providers"), api("GET", "/models")]);
  const status = h("p", { class: "status", role: "status" });
  const discovered = h("div", { id: "discovered" });
  const tested = h("div", { id: "tested" });
  const reload = () => render(main);

  async function act(work, done) {
    replace(status, "…");
    try {
      const result = await work();
      replace(status);
      if (done) done(result);
    } catch (e) {
      replace(status, errorBox(e));
    }
  }

  const providerRows = providers.map((p) =>
    h(
      "tr",
      { dataset: { provider: p.id } },
      h("td", {}, p.id),
      h("td", {}, p.kind),
      h("td", {}, p.base_url),
      h("td", {}, p.key || (p.key_env ? `$${p.key_env}` : "none"), p.key_unreadable ? h("span", { class: "error" }, " (unreadable: enter it again)") : ""),
      h("td", {}, p.source === "config" ? h("span", { class: "badge" }, "config file") : h("span", { class: "badge" }, "console")),
      h("td", {}, p.enabled ? "yes" : "no"),
      h(
        "td",
        {},
        h("button", { type: "button", class: "discover", onclick: () => act(() => api("POST", `/providers/${p.id}/discover`), (r) => showDiscovered(p, r)) }, "Discover models"),
        " ",
        h("button", { type: "button", class: "test", onclick: () => testProvider(p) }, "Test"),
        p.read_only
          ? ""
          : [
              " ",
              h("button", { type: "button", onclick: () => act(() => api("PATCH", `/providers/${p.id}`, { enabled: !p.enabled }), reload) }, p.enabled ? "Disable" : "Enable"),
              " ",
              h("button", { type: "button", class: "danger", onclick: () => confirm(`Delete provider ${p.id}?`) && act(() => api("DELETE", `/providers/${p.id}`), reload) }, "Delete"),
            ],
      ),
    ),
  );

  function showDiscovered(provider, result) {
    const known = new Set(models.models.filter((m) => m.provider === provider.id).map((m) => m.upstream_model));
    const rows = result.models.map((m) =>
      h(
        "tr",
        { dataset: { model: m.id } },
        h("td", {}, m.id),
        h("td", { class: "num" }, num(m.context_window)),
        h(
          "td",
          {},
          known.has(m.id)
            ? h("span", { class: "badge ok" }, "in Cursor")
            : h("button", { type: "button", class: "enable", onclick: () => act(() => api("POST", "/models", modelFrom(provider, m)), reload) }, "Use in Cursor"),
        ),
      ),
    );
    replace(discovered, h("h3", {}, `${provider.id}: ${result.models.length} model(s)`), table(["upstream model", "context", ""], rows));
  }

  function testProvider(provider) {
    const guess = models.models.find((m) => m.provider === provider.id);
    const model = h("input", { name: "model", value: guess ? guess.upstream_model : "", placeholder: "upstream model" });
    const out = h("span", { class: "result" });
    const run = () =>
      act(
        () => api("POST", `/providers/${provider.id}/test`, { model: model.value }),
        (r) =>
          replace(
            out,
            r.ok
              ? h("span", { class: "ok" }, `reachable · TTFT ${r.ttft_ms} ms · ${r.tokens_per_s ?? "–"} tokens/s · "${r.text}"`)
              : h("span", { class: "error" }, r.error),
          ),
      );
    replace(tested, h("div", { class: "card" }, h("strong", {}, `Test ${provider.id} `), model, " ", h("button", { type: "button", onclick: run }, "Call"), " ", out));
  }

  const modelRows = models.models.map((m) => modelRow(m, act, reload));
  replace(
    main,
    h("h2", {}, "Providers"),
    table(["id", "kind", "base URL", "key", "from", "enabled", ""], providerRows, { id: "providers" }),
    status,
    tested,
    discovered,
    addProviderForm(act, reload),
    h("h2", {}, "Models"),
    h("p", { class: "hint" }, "Cursor's picker shows, in order: ", models.picker.join(", ") || "nothing yet"),
    table(["id Cursor sees", "provider", "upstream model", "context", "thinking / effort", "vision", "enabled", "order", ""], modelRows, { id: "models" }),
    addModelForm(providers, act, reload),
  );
}

function modelFrom(provider, discovered) {
  const id = discovered.id.replace(/[^A-Za-z0-9._:-]/g, "-").replace(/^[^A-Za-z0-9]+/, "").slice(0, 100);
  return {
    id,
    provider: provider.id,
    upstream_model: discovered.id,
    context_tokens: discovered.context_window || 128000,
    display_name: discovered.display_name || null,
  };
}

function modelRow(m, act, reload) {
  const patch = (body) => act(() => api("PATCH", `/models/${m.id}`, body), reload);
  const editable = !m.read_only;
  return h(
    "tr",
    { dataset: { model: m.id } },
    h("td", {}, m.id, m.display_name ? h("div", { class: "muted" }, m.display_name) : ""),
    h("td", {}, m.provider),
    h("td", {}, m.upstream_model),
    h("td", { class: "num" }, num(m.context_tokens)),
    h(
      "td",
      {},
      editable
        ? h("select", { name: "effort", onchange: (e) => patch({ effort: e.target.value || null }) }, EFFORTS.map((x) => h("option", { value: x, selected: (m.effort || "") === x }, x || (m.thinking ? "thinking" : "—"))))
        : m.thinking ? "thinking" : "—",
    ),
    h("td", {}, editable ? h("input", { type: "checkbox", checked: m.vision, onchange: (e) => patch({ vision: e.target.checked }) }) : "—"),
    h("td", {}, editable ? h("input", { type: "checkbox", name: "enabled", checked: m.enabled, onchange: (e) => patch({ enabled: e.target.checked }) }) : m.enabled ? "yes" : "no"),
    h("td", {}, editable ? h("input", { type: "number", min: 0, size: 3, value: m.position, onchange: (e) => patch({ position: Number(e.target.value) }) }) : "file"),
    h(
      "td",
      {},
      m.read_only ? h("span", { class: "badge" }, "config file") : "",
      m.shadowed ? h("span", { class: "error" }, " (the config file's id wins)") : "",
      editable ? h("button", { type: "button", class: "danger", onclick: () => confirm(`Delete model ${m.id}?`) && act(() => api("DELETE", `/models/${m.id}`), reload) }, "Delete") : "",
    ),
  );
}

function field(label, input) {
  return h("label", {}, label, input);
}

function addProviderForm(act, reload) {
  const id = h("input", { name: "id", required: true, placeholder: "my-openai" });
  const kind = h("select", { name: "kind" }, KINDS.map((k) => h("option", { value: k }, k)));
  const url = h("input", { name: "base_url", required: true, size: 34, placeholder: "https://api.openai.com/v1" });
  const key = h("input", { name: "api_key", type: "password", autocomplete: "off", placeholder: "kept encrypted; shown as its last 4" });
  return h(
    "form",
    {
      class: "inline card",
      id: "add-provider",
      onsubmit: (e) => {
        e.preventDefault();
        const body = { id: id.value, kind: kind.value, base_url: url.value };
        if (key.value) body.api_key = key.value;
        act(() => api("POST", "/providers", body), reload);
      },
    },
    h("strong", {}, "Add a provider"),
    field("id", id),
    field("kind", kind),
    field("base URL", url),
    field("API key", key),
    h("button", { type: "submit", class: "primary" }, "Add"),
  );
}

function addModelForm(providers, act, reload) {
  const id = h("input", { name: "id", required: true, placeholder: "id Cursor sees" });
  const provider = h("select", { name: "provider" }, providers.map((p) => h("option", { value: p.id }, p.id)));
  const upstream = h("input", { name: "upstream_model", required: true, placeholder: "upstream model" });
  const context = h("input", { name: "context_tokens", type: "number", min: 1, value: 128000 });
  return h(
    "form",
    {
      class: "inline card",
      id: "add-model",
      onsubmit: (e) => {
        e.preventDefault();
        const body = { id: id.value, provider: provider.value, upstream_model: upstream.value, context_tokens: Number(context.value) };
        act(() => api("POST", "/models", body), reload);
      },
    },
    h("strong", {}, "Add a model"),
    field("id", id),
    field("provider", provider),
    field("upstream model", upstream),
    field("context window", context),
    h("button", { type: "submit", class: "primary" }, "Add"),
  );
}
