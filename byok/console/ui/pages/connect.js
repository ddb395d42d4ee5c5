// Connect Cursor: the exact set-up for this machine, from the address this page was opened on.
import { api } from "../app.js";
import { h, replace } from "../dom.js";

function copyable(text, id) {
  const pre = h("pre", { id }, text);
  const button = h("button", { type: "button", onclick: async () => { await navigator.clipboard.writeText(text); button.textContent = "Copied"; } }, "Copy");
  return [pre, button];
}

export async function render(main) {
  const s = await api("GET", "/setup");
  replace(
    main,
    h("h2", {}, "Connect Cursor"),
    h("p", {}, `byok answers on ${s.backend_url}. Cursor sees ${s.models.length ? s.models.join(", ") : "no byok model yet: add one under Providers & models"}.`),
    h("h3", {}, "1. Backend URL (no system change)"),
    h("p", {}, "Quit Cursor completely, then start it with byok as its backend:"),
    copyable(s.cursor_command, "cursor-command"),
    h("details", {}, h("summary", {}, "Details for this system"), h("pre", {}, s.cursor_command_text)),
    h("h3", {}, "2. HTTPS proxy with byok's local CA (Cursor started normally)"),
    s.proxy.enabled
      ? h("p", { class: "ok" }, `The proxy is on: ${s.proxy.url}.`)
      : h("p", { class: "hint" }, "The proxy is off: start byok with `byok serve --proxy` (or [proxy] enabled = true), then:"),
    h("p", {}, "Trust byok's CA certificate (run these yourself; byok changes nothing on your system):"),
    copyable(s.proxy.trust_commands.join("\n"), "trust-commands"),
    h("p", {}, `Then add to Cursor's settings.json (${s.settings_path}) and restart Cursor:`),
    copyable(s.proxy.settings_json, "proxy-settings"),
    h("p", { class: "hint" }, `CA certificate: ${s.proxy.ca_cert}. Full guide: docs/cursor-setup.md.`),
  );
  return null;
}
