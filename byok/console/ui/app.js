// The console's shell: the token, the API client, and a router over location.hash.
import { h, replace } from "./dom.js";

const TOKEN_KEY = "byok.console.token";
// Relative to the page (/byok/), so a path prefix in front of it (LAN mode's credential) stays.
const API = new URL("api", document.baseURI).pathname;
const main = document.getElementById("main");
let cleanup = null;

export class ApiError extends Error {
  constructor(status, field, message) {
    super(field ? `${field}: ${message}` : message);
    this.status = status;
    this.field = field;
  }
}

export function token() {
  return localStorage.getItem(TOKEN_KEY) || "";
}

// The token arrives once in the URL's fragment (never sent to the server); it is kept in this
// browser's storage and the fragment is cleared.
function takeTokenFromUrl() {
  const found = location.hash.match(/[#&]token=([^&]+)/);
  if (found) {
    localStorage.setItem(TOKEN_KEY, decodeURIComponent(found[1]));
    history.replaceState(null, "", `${location.pathname}#/providers`);
  }
}

export async function api(method, path, body) {
  const headers = { authorization: `Bearer ${token()}` };
  const init = { method, headers };
  if (body !== undefined) {
    headers["content-type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const response = await fetch(`${API}${path}`, init);
  const text = await response.text();
  let data = text;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    // a body (a call's request or response) is shown as text
  }
  if (!response.ok) {
    const error = (data && data.error) || { field: "", message: text };
    if (response.status === 401) showLogin(error.message);
    throw new ApiError(response.status, error.field, error.message);
  }
  return data;
}

// The live stream: fetch() rather than EventSource, which cannot send the token header.
export function liveCalls(onCall, onState) {
  const controller = new AbortController();
  (async () => {
    while (!controller.signal.aborted) {
      try {
        const response = await fetch(`${API}/calls/live`, {
          headers: { authorization: `Bearer ${token()}` },
          signal: controller.signal,
        });
        if (!response.ok) throw new Error(`HTTP ${response.status}`);
        onState("live");
        const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
        let buffer = "";
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buffer += value;
          let end;
          while ((end = buffer.indexOf("\n\n")) >= 0) {
            const event = buffer.slice(0, end);
            buffer = buffer.slice(end + 2);
            const data = event.split("\n").find((line) => line.startsWith("data: "));
            if (event.includes("event: call") && data) onCall(JSON.parse(data.slice(6)));
          }
        }
      } catch (e) {
        if (controller.signal.aborted) return;
        onState(`reconnecting (${e.message})`);
      }
      await new Promise((resolve) => setTimeout(resolve, 2000));
    }
  })();
  return () => controller.abort();
}

export function errorBox(e) {
  return h("p", { class: "error", role: "alert" }, e.message || String(e));
}

function showLogin(reason) {
  if (cleanup) cleanup();
  cleanup = null;
  const input = h("input", { type: "password", name: "token", autocomplete: "off", size: 50, id: "token" });
  const form = h(
    "form",
    {
      class: "card",
      onsubmit: (event) => {
        event.preventDefault();
        localStorage.setItem(TOKEN_KEY, input.value.trim());
        route();
      },
    },
    h("h2", {}, "Console token"),
    h("p", {}, reason || "Enter the console token."),
    h(
      "p",
      { class: "hint" },
      "byok printed it once, with the console's address, when it first started. ",
      "`byok console-token` makes a new one.",
    ),
    h("label", { for: "token" }, "Token "),
    input,
    " ",
    h("button", { type: "submit" }, "Use it"),
  );
  replace(main, form);
}

const PAGES = {
  providers: () => import("./pages/providers.js"),
  aliases: () => import("./pages/aliases.js"),
  calls: () => import("./pages/calls.js"),
  usage: () => import("./pages/usage.js"),
  conversations: () => import("./pages/conversations.js"),
  connect: () => import("./pages/connect.js"),
};

async function route() {
  takeTokenFromUrl();
  if (cleanup) cleanup();
  cleanup = null;
  if (!token()) {
    showLogin();
    return;
  }
  document.getElementById("logout").hidden = false;
  const [name, ...rest] = location.hash.replace(/^#\/?/, "").split("/");
  const page = PAGES[name] ? name : "providers";
  for (const link of document.querySelectorAll("#nav a")) {
    link.classList.toggle("active", link.getAttribute("href") === `#/${page}`);
  }
  replace(main, h("p", {}, "Loading…"));
  try {
    const module = await PAGES[page]();
    cleanup = (await module.render(main, rest.map(decodeURIComponent))) || null;
  } catch (e) {
    if (!(e instanceof ApiError && e.status === 401)) replace(main, errorBox(e));
  }
}

document.getElementById("logout").addEventListener("click", () => {
  localStorage.removeItem(TOKEN_KEY);
  route();
});
window.addEventListener("hashchange", route);
route();
