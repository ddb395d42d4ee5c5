"""The requests byok refuses before routing: the ones a web page could send.

A page open in the user's browser can reach a loopback port. Without a CORS preflight it can
send only "simple" requests: GET, HEAD or POST, with no content type or ``text/plain``,
``application/x-www-form-urlencoded`` or ``multipart/form-data`` (a ``Blob`` or ``ArrayBuffer``
body goes without one). Anything else is preflighted with an OPTIONS, which byok refuses, and
no response of byok's carries an ``Access-Control-*`` header, so the browser never sends the
real request and never lets a page read an answer.

Cursor's client (Node, not a browser page) speaks Connect: agent RPCs in
``application/connect+proto`` (RunSSE, RunPoll, the HTTP/2 Run) and ``application/proto`` (BidiAppend),
its other calls in those or Connect's JSON forms, GETs with no body at all. So a request is
refused when it carries a web ``Origin`` (``http(s)://...`` or ``null``, what a sandboxed frame
or a ``file:`` page sends; every browser sends one on a cross-origin POST), when it is an
OPTIONS, or when its content type is not one of those. The app's own pages, when they come,
will be served elsewhere.
"""

from __future__ import annotations

import logging
from typing import Any, Final

import attrs

from byok.http.asgi import Scope, Send, respond
from byok.http.connect_envelope import ConnectCode, ConnectError, unary_error_body

log = logging.getLogger("byok.http")

# The App's agent routes (app.py): what Cursor's client sends to them, raw or enveloped proto.
AGENT_ROUTES: Final = frozenset(
    {
        "/agent.v1.AgentService/RunSSE",
        "/agent.v1.AgentService/RunPoll",
        "/agent.v1.AgentService/Run",
        "/aiserver.v1.BidiService/BidiAppend",
    }
)
AGENT_MEDIA_TYPES: Final = frozenset({"application/connect+proto", "application/proto"})
# Every other route is relayed (or answered like upstream would): Connect's four forms.
CONNECT_MEDIA_TYPES: Final = AGENT_MEDIA_TYPES | {"application/connect+json", "application/json"}


@attrs.frozen
class Refusal:
    status: int
    code: ConnectCode
    reason: str


def refusal(scope: Scope) -> Refusal | None:
    """Why byok will not serve this HTTP request, or None."""
    headers: list[tuple[bytes, bytes]] = scope.get("headers") or []
    for name, value in headers:
        if name.lower() == b"origin" and _web_origin(value):
            shown = value.decode("latin-1")
            return Refusal(403, "permission_denied", f"requests from web origin {shown!r} are refused")
    method = scope.get("method", "")
    if method == "OPTIONS":
        return Refusal(405, "unimplemented", "OPTIONS is refused: byok grants no CORS access")
    types = [value for name, value in headers if name.lower() == b"content-type"]
    agent = scope.get("path") in AGENT_ROUTES
    allowed = AGENT_MEDIA_TYPES if agent else CONNECT_MEDIA_TYPES
    for value in types:
        if _media_type(value) not in allowed:
            return Refusal(415, "invalid_argument", f"content type {value.decode('latin-1')!r} is refused")
    if not types and (agent or not _bodiless(scope, headers)):
        return Refusal(415, "invalid_argument", "a request with a body needs a Connect content type")
    return None


async def refuse(scope: Scope, send: Send, refused: Refusal) -> None:
    log.warning("refused %s %s: %s", scope.get("method"), scope.get("path"), refused.reason)
    body = unary_error_body(ConnectError(refused.code, refused.reason))
    await respond(send, refused.status, body, "application/json")


def without_cors(send: Send) -> Send:
    """``send`` with any ``Access-Control-*`` header dropped (upstream's, on a relayed answer)."""

    async def sending(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            headers = message.get("headers") or ()
            kept = [(k, v) for k, v in headers if not k.lower().startswith(b"access-control-")]
            if len(kept) != len(headers):
                message = {**message, "headers": kept}
        await send(message)

    return sending


def _web_origin(value: bytes) -> bool:
    # What a browser serializes: "scheme://host[:port]", or "null" for an opaque origin. Cursor's
    # own windows are vscode-file:// (and its Node side sends no Origin).
    origin = value.strip().lower()
    return origin == b"null" or origin.startswith((b"http://", b"https://"))


def _media_type(value: bytes) -> str:
    return value.split(b";", 1)[0].strip().lower().decode("latin-1")


def _bodiless(scope: Scope, headers: list[tuple[bytes, bytes]]) -> bool:
    """Whether the request says it has no body: no transfer-encoding, a content-length of 0 or
    none. Over HTTP/2 a body needs neither, so there only GET and HEAD are taken at their word."""
    length: bytes | None = None
    for name, value in headers:
        key = name.lower()
        if key == b"transfer-encoding":
            return False
        if key == b"content-length":
            length = value.strip()
    if length is not None:
        return length.isdigit() and int(length) == 0
    return scope.get("http_version") != "2" or scope.get("method") in ("GET", "HEAD")
