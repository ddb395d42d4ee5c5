"""LAN mode: byok on an address other people can reach, safely (docs/lan.md).

A listener on a non-loopback address needs both of:

- **TLS**, so the credential and the agent's traffic (code, prompts, Cursor's session token on
  relayed calls) cross the network encrypted: a certificate of the user's (``[server] tls_cert``
  and ``tls_key``) or one byok's local CA issues for ``[server] tls_names``;
- **a credential** that Cursor can send on every request (``[server] auth_token_env``), compared
  in constant time. Cursor lets a user set two things that carry one:
  - backend-URL mode (``--test-backend-url=URL``): the URL's path. Connect clients build each
    call's URL as the base URL plus ``/<service>/<method>``, so ``https://host:port/<token>``
    puts the token first in every call's path. byok checks it there and strips it, so routing,
    logs and relayed calls never see it. (The URL's user part cannot serve: the
    ``Authorization`` header is Cursor's own session token, relayed upstream.)
  - proxy mode (``http.proxy``): proxy credentials, ``https://byok:<token>@host:port``, sent as
    ``Proxy-Authorization: Basic`` on every CONNECT (VS Code's ``http.proxyAuthorization`` sets
    the header's value directly). byok checks each tunnel's CONNECT before anything in it is
    served; the requests inside ride that authenticated tunnel.

With either configured, byok applies it to every listener it opens, loopback ones included: on a
shared machine other users reach loopback too. Anything else on a non-loopback address refuses
to start (``refusal``), with one line naming what is missing.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import logging
import re
import ssl
from typing import Any

from byok.config import Config, ConfigError
from byok.http.asgi import Receive, Scope, Send, respond
from byok.http.ca import LocalCA
from byok.http.connect_envelope import ConnectError, unary_error_body
from byok.http.serve import ASGIApp, is_loopback

log = logging.getLogger("byok.http")

MIN_TOKEN_CHARS = 32
# Characters a URL path carries unescaped (RFC 3986 unreserved): the token goes in one as is.
_TOKEN = re.compile(r"[A-Za-z0-9._~-]+")
_ALPN = ("h2", "http/1.1")


class LanError(Exception):
    """The LAN settings cannot be used; the message is one line saying what to fix."""


class Credential:
    """The token every request must carry, checked in constant time."""

    def __init__(self, token: str) -> None:
        self._digest = _digest(token.encode())

    def matches(self, candidate: bytes) -> bool:
        # Digests of equal length: the comparison tells nothing, not even the token's length.
        return hmac.compare_digest(_digest(candidate), self._digest)

    def strip_path(self, scope: Scope) -> Scope | None:
        """``scope`` with the token taken off the front of its path (``/<token>/rest`` ->
        ``/rest``), or None when the path does not start with the token."""
        raw: bytes = scope.get("raw_path") or scope.get("path", "").encode("latin-1")
        segment, slash, rest = raw[1:].partition(b"/") if raw.startswith(b"/") else (b"", b"", b"")
        if not self.matches(segment):
            return None
        raw_rest = slash + rest if slash else b"/"
        path: str = scope.get("path", "")
        path_rest = path[1 + len(segment) :] or "/"
        return {**scope, "raw_path": raw_rest, "path": path_rest}

    def proxy_ok(self, value: bytes | None) -> bool:
        """Whether a ``Proxy-Authorization`` value carries the token: ``Basic`` with it as the
        password (any user name), or ``Bearer <token>``."""
        if not value:
            return False
        scheme, _, param = value.strip().partition(b" ")
        param = param.strip()
        if scheme.lower() == b"basic":
            try:
                decoded = base64.b64decode(param, validate=True)
            except (binascii.Error, ValueError):
                return False
            _user, colon, password = decoded.partition(b":")
            return bool(colon) and self.matches(password)
        if scheme.lower() == b"bearer":
            return self.matches(param)
        return False


def _digest(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def guard(app: ASGIApp, credential: Credential) -> ASGIApp:
    """``app`` serving only requests whose path starts with the token (stripped before ``app``
    sees the request); any other is answered 401 ``unauthenticated``."""

    async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        inner = credential.strip_path(scope)
        if inner is None:
            log.warning("refused %s from %s: no credential", scope.get("method"), _peer(scope))
            err = ConnectError(
                "unauthenticated",
                "this byok needs its credential: the backend URL ends with the token (docs/lan.md)",
            )
            await respond(send, 401, unary_error_body(err), "application/json")
            return
        await app(inner, receive, send)

    return guarded


def _peer(scope: Scope) -> str:
    client: Any = scope.get("client")
    return f"{client[0]}:{client[1]}" if client else "?"


def credential(config: Config) -> Credential | None:
    """The configured credential, checked; None when none is configured. Raises LanError."""
    server = config.server
    if not server.has_auth_token:
        return None
    try:
        token = server.auth_token()
    except ConfigError as e:
        raise LanError(str(e)) from None
    assert token is not None
    where = server.auth_token_env or "[server] auth_token"
    if len(token) < MIN_TOKEN_CHARS:
        raise LanError(
            f"the credential in {where} is {len(token)} characters; use {MIN_TOKEN_CHARS} or more "
            "(openssl rand -hex 32)"
        )
    if not _TOKEN.fullmatch(token):
        raise LanError(
            f"the credential in {where} may hold only letters, digits and . _ ~ - (it goes in a URL)"
        )
    return Credential(token)


def listener_tls(config: Config, *, alpn: tuple[str, ...] = _ALPN) -> ssl.SSLContext | None:
    """A listener's TLS context: the user's certificate, or a leaf from byok's CA for
    ``tls_names``; None when neither is configured. Raises LanError."""
    server = config.server
    if server.tls_cert is not None and server.tls_key is not None:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.set_alpn_protocols(list(alpn))
        try:
            ctx.load_cert_chain(server.tls_cert, server.tls_key)
        except (OSError, ssl.SSLError) as e:
            reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            raise LanError(
                f"cannot load [server] tls_cert {server.tls_cert} / tls_key {server.tls_key}: {reason}"
            ) from None
        return ctx
    if server.tls_names:
        try:
            ca = LocalCA.load_or_create(server.data_dir)
        except (OSError, ValueError) as e:
            raise LanError(f"cannot load or create byok's CA in {server.data_dir}: {e}") from None
        return ca.listener_context(server.tls_names, alpn=alpn)
    return None


def refusal(config: Config) -> str | None:
    """Why byok must not start with these listen addresses, in one line; None when it may."""
    binds = [(config.server.host, "")] + ([(config.proxy.host, " (proxy)")] if config.proxy.enabled else [])
    for host, what in binds:
        if is_loopback(host):
            continue
        missing = []
        if not config.server.tls:
            missing.append("TLS ([server] tls_cert and tls_key, or tls_names)")
        if not config.server.has_auth_token:
            missing.append("a credential ([server] auth_token_env)")
        if missing:
            return (
                f"refusing to listen on {host!r}{what}: anyone who can reach it could run agents on your "
                f"keys; a non-loopback address needs {' and '.join(missing)} (see docs/lan.md), or use a "
                "loopback address (127.0.0.1, ::1 or localhost)"
            )
    return None
