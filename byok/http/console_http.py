"""The console's HTTP face: its pages at ``/byok/`` and the control API at ``/byok/api/``, with
rules of their own (the Cursor routes' are in request_guard.py).

- **Who may call**: the API wants the console token in ``Authorization: Bearer``. A header,
  never a cookie: a browser attaches nothing by itself, so another site's page cannot make a
  request count (no CSRF), and the token lives in the console page's own storage.
- **From where**: the ``Host`` must be a loopback name or the configured host (a DNS-rebinding
  page arrives with its own name), an ``Origin`` must be that same origin, ``Sec-Fetch-Site``
  must be same-origin; OPTIONS is refused and no answer carries an ``Access-Control-*`` header,
  so CORS stays closed. A body must be ``application/json`` (which a cross-site form cannot
  send without a preflight) and at most ``MAX_API_BODY`` bytes.
- **What the pages may do**: a Content-Security-Policy allows only the console's own scripts,
  styles and connections; no framing, no caching.
"""

from __future__ import annotations

import json
import logging
from importlib import resources
from typing import Any, Final
from urllib.parse import urlsplit

from byok.console.entries import FieldError
from byok.console.token import TokenCheck
from byok.http.asgi import BodyTooLarge, Receive, Scope, Send, header, read_body

log = logging.getLogger("byok.console")

PREFIX: Final = "/byok"
API_PREFIX: Final = "/byok/api/"
MAX_API_BODY: Final = 1 * 2**20
LOOPBACK_NAMES: Final = frozenset({"127.0.0.1", "localhost", "::1"})
_CSP: Final = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
_SECURITY_HEADERS: Final = (
    (b"cache-control", b"no-store"),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"cross-origin-resource-policy", b"same-origin"),
    (b"content-security-policy", _CSP.encode()),
)
_TYPES: Final = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}


class ApiError(Exception):
    """An answer other than 2xx: its status, the field it is about ("" for none), the reason."""

    def __init__(self, status: int, field: str, message: str) -> None:
        super().__init__(message)
        self.status, self.field, self.message = status, field, message


def is_console_path(path: str) -> bool:
    """The console's page, its files and the API (``/byok/healthz`` and ``/byok/status`` are
    the daemon's own)."""
    return path in (PREFIX, PREFIX + "/") or path.startswith((PREFIX + "/ui/", API_PREFIX))


async def send_json(
    send: Send, status: int, obj: object, extra: tuple[tuple[bytes, bytes], ...] = ()
) -> None:
    body = json.dumps(obj, separators=(",", ":")).encode()
    await send_bytes(send, status, body, "application/json", extra)


async def send_error(send: Send, e: ApiError) -> None:
    extra = ((b"www-authenticate", b"Bearer"),) if e.status == 401 else ()
    await send_json(send, e.status, {"error": {"field": e.field, "message": e.message}}, extra)


async def send_bytes(
    send: Send, status: int, body: bytes, content_type: str, extra: tuple[tuple[bytes, bytes], ...] = ()
) -> None:
    headers = [
        (b"content-type", content_type.encode()),
        (b"content-length", str(len(body)).encode()),
        *_SECURITY_HEADERS,
        *extra,
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def start_stream(send: Send, content_type: str) -> None:
    headers = [(b"content-type", content_type.encode()), *_SECURITY_HEADERS]
    await send({"type": "http.response.start", "status": 200, "headers": headers})


def host_names(host: str, tls_names: tuple[str, ...] = ()) -> frozenset[str]:
    """The names the console answers to: loopback's, the configured host, LAN mode's TLS names."""
    return LOOPBACK_NAMES | {n.strip("[]").lower() for n in (host, *tls_names)}


def refusal(scope: Scope, names: frozenset[str]) -> ApiError | None:
    """Why a console request is refused before routing (see the module's rules), or None."""
    host = header(scope, "host") or ""
    name = urlsplit(f"//{host}").hostname or ""
    if name not in names:
        return ApiError(403, "host", f"the console answers on this machine's loopback names, not {host!r}")
    origin = header(scope, "origin")
    own = f"{scope.get('scheme') or 'http'}://{host}".lower()
    if origin is not None and origin.rstrip("/").lower() != own:
        return ApiError(403, "origin", f"requests from origin {origin!r} are refused (CORS is closed)")
    site = header(scope, "sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        return ApiError(403, "sec-fetch-site", f"cross-site requests are refused ({site})")
    if scope.get("method") == "OPTIONS":
        return ApiError(405, "method", "OPTIONS is refused: the console grants no CORS access")
    return None


def bearer(scope: Scope) -> str:
    value = header(scope, "authorization") or ""
    scheme, _, token = value.partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def check_token(scope: Scope, tokens: TokenCheck) -> None:
    presented = bearer(scope)
    if not presented:
        raise ApiError(401, "authorization", "the console token is missing (Authorization: Bearer <token>)")
    if not tokens.accepts(presented):
        raise ApiError(
            401, "authorization", "the console token is wrong (`byok console-token` makes a new one)"
        )


async def read_json(scope: Scope, receive: Receive) -> Any:
    """The request's JSON body (None when it has none)."""
    try:
        raw = await read_body(receive, MAX_API_BODY)
    except BodyTooLarge:
        raise ApiError(413, "body", f"the request body exceeds {MAX_API_BODY} bytes") from None
    if not raw:
        return None
    media = (header(scope, "content-type") or "").split(";", 1)[0].strip().lower()
    if media != "application/json":
        raise ApiError(415, "content-type", "a request body must be application/json")
    try:
        return json.loads(raw)
    except ValueError as e:
        raise ApiError(400, "body", f"the body is not valid JSON: {e}") from None


def field_error(e: FieldError) -> ApiError:
    return ApiError(e.status, e.field, e.problem)


# --- the pages ------------------------------------------------------------------------------


def _ui() -> Any:
    return resources.files("byok.console").joinpath("ui")


async def serve_page(scope: Scope, send: Send) -> None:
    """``/byok/`` is the console's one HTML page; ``/byok/ui/...`` its scripts and styles."""
    path = scope["path"]
    if scope.get("method") not in ("GET", "HEAD"):
        await send_error(send, ApiError(405, "method", "the console's pages are read with GET"))
        return
    if path == PREFIX:
        # Relative, so a path prefix this app does not see (LAN mode's credential) is kept.
        await send_bytes(send, 308, b"", "text/plain", ((b"location", b"byok/"),))
        return
    if path == PREFIX + "/":
        name = "index.html"
    elif path.startswith(PREFIX + "/ui/"):
        name = path[len(PREFIX + "/ui/") :]
    else:
        await send_error(send, ApiError(404, "path", f"no console page {path!r}"))
        return
    parts = name.split("/")
    suffix = "." + name.rsplit(".", 1)[-1] if "." in name else ""
    if any(p in ("", ".", "..") or p.startswith(".") for p in parts) or suffix not in _TYPES:
        await send_error(send, ApiError(404, "path", f"no console file {name!r}"))
        return
    node = _ui()
    for part in parts:
        node = node.joinpath(part)
    try:
        body = node.read_bytes()
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        await send_error(send, ApiError(404, "path", f"no console file {name!r}"))
        return
    await send_bytes(send, 200, body, _TYPES[suffix])
