"""The daemon's outgoing HTTP clients: one for provider calls, one for the requests relayed to
Cursor's backend. Both keep idle connections longer than httpx's 5 s and probe them with TCP
keepalive, as neither has a read timeout."""

from __future__ import annotations

import socket

import httpx

# How long an idle connection to a provider is kept for the next request (httpx's default is
# 5 s). A user reads and types for longer than that between turns, and a new connection to a
# remote API costs a TCP and a TLS handshake before the request is even sent. Cloudflare, in
# front of the big APIs, keeps an idle client connection 400 s. One the server closes first is
# dropped by the pool when next checked out (its socket reads EOF); a request that races the
# close fails before any output and is retried (providers/retry.py).
KEEPALIVE_S = 300.0
# Relayed requests are not retried, so upstream connections are let go before the common 60 s
# idle timeout of load balancers, where a request could meet the server's close.
UPSTREAM_KEEPALIVE_S = 55.0


def pool_limits(keepalive_s: float) -> httpx.Limits:
    """httpx's default pool bounds, with a longer keep-alive."""
    return httpx.Limits(max_connections=100, max_keepalive_connections=20, keepalive_expiry=keepalive_s)


# TCP keepalive probes on every outgoing connection: idle this long, then a probe every interval,
# dead after this many unanswered. There is no read timeout (a model may think for minutes without
# sending a byte), so a connection that died silently (the laptop slept, the network changed, a
# NAT forgot it) would otherwise leave its run waiting for ever. The peer's kernel answers probes
# however long the model thinks; a dead one fails the read in ~1.5 minutes, before any output
# (retried) or after (the run ends with the error).
KEEPALIVE_IDLE_S = 30
KEEPALIVE_INTERVAL_S = 10
KEEPALIVE_PROBES = 6


def keepalive_options() -> list[tuple[int, int, int]]:
    """The socket options for the probes, as far as the platform names them (Linux, macOS)."""
    options = [(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)]
    for names, value in (
        (("TCP_KEEPIDLE", "TCP_KEEPALIVE"), KEEPALIVE_IDLE_S),  # macOS calls it TCP_KEEPALIVE
        (("TCP_KEEPINTVL",), KEEPALIVE_INTERVAL_S),
        (("TCP_KEEPCNT",), KEEPALIVE_PROBES),
    ):
        option = next((getattr(socket, n) for n in names if hasattr(socket, n)), None)
        if option is not None:
            options.append((socket.IPPROTO_TCP, option, value))
    return options


def _transport(keepalive_s: float) -> httpx.AsyncHTTPTransport:
    return httpx.AsyncHTTPTransport(limits=pool_limits(keepalive_s), socket_options=keepalive_options())


def provider_client() -> httpx.AsyncClient:
    # Read timeout off: a model may think for minutes between chunks; cancel scopes bound the call,
    # and TCP keepalive finds a connection that died.
    return httpx.AsyncClient(
        timeout=httpx.Timeout(connect=15, read=None, write=60, pool=None),
        transport=_transport(KEEPALIVE_S),
        limits=pool_limits(KEEPALIVE_S),  # for proxy transports (HTTPS_PROXY)
    )


def upstream_client() -> httpx.AsyncClient:
    return httpx.AsyncClient(
        http2=False,
        timeout=httpx.Timeout(connect=10, read=None, write=None, pool=None),
        follow_redirects=False,
        transport=_transport(UPSTREAM_KEEPALIVE_S),
        limits=pool_limits(UPSTREAM_KEEPALIVE_S),
    )
