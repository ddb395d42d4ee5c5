"""An HTTP/2 ``agent.v1.AgentService/Run`` that is not byok's, relayed to upstream full duplex.

The client's frames go up as they come (those read to decide, first, byte for byte) while
upstream's answer comes down: a Run's client answers what the server streams (tool results, KV
ACKs), so neither side may wait for the other to finish. Status, headers and body pass through
unchanged (hop-by-hop headers dropped). Upstream unreachable: a 200 whose end-stream carries
``unavailable``, as a Connect stream reports errors; upstream breaking off mid-stream: the
client's stream is reset, as it would be by upstream itself.
"""

from __future__ import annotations

import logging
import ssl
import time

import trio

from byok.http.asgi import Receive, Scope, Send
from byok.http.connect_envelope import ConnectError, end_stream_error
from byok.http.forwarder import BadTarget, filter_headers, upstream_url
from byok.http.h2_call import H2Call, H2Error, h2_call
from byok.http.proxy import upstream_for

log = logging.getLogger("byok.forward")

_REQUEST_DROP = frozenset({b"expect", b"content-length"})
_RESPONSE_DROP = frozenset({b"date", b"alt-svc"})


async def relay_bidi(
    scope: Scope,
    head: bytes,
    more: bool,
    receive: Receive,
    send: Send,
    *,
    upstream: str,
    ssl_context: ssl.SSLContext | None = None,
) -> None:
    """Relay the call whose body so far is ``head`` (``more``: the body goes on) to ``upstream``
    (or the proxied host). Nothing has been sent to the client yet."""
    started = time.monotonic()
    try:
        url = upstream_url(upstream_for(scope, upstream), scope)
    except BadTarget as e:  # App refuses these before routing
        await _end(send, ConnectError("invalid_argument", str(e)))
        return
    headers = filter_headers(scope["headers"], drop=_REQUEST_DROP)
    status = 0
    complete = False
    try:
        async with h2_call(url, headers, ssl_context=ssl_context) as call:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_pump_up, call, head, more, receive, nursery.cancel_scope)
                status, got = await call.response()
                await send(
                    {
                        "type": "http.response.start",
                        "status": status,
                        "headers": filter_headers(got, drop=_RESPONSE_DROP),
                    }
                )
                async for chunk in call.body():
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                complete = True
                nursery.cancel_scope.cancel()
            if not complete:
                log.info("relay Run %s: the client left", scope["path"])
                return
            # Outside the nursery: completing the response makes hypercorn report the client gone.
            await send({"type": "http.response.body", "body": b"", "more_body": False})
    except (OSError, trio.TooSlowError, H2Error) as e:
        why = str(e) or type(e).__name__
        if status:
            # Returning without the last body message makes the server reset the client's stream.
            log.warning("relay Run %s: upstream failed mid-stream: %s", scope["path"], why)
            return
        log.warning("relay Run %s -> unreachable (%s)", scope["path"], why)
        await _end(send, ConnectError("unavailable", f"upstream unreachable: {why}"))
        return
    log.info("relay Run %s -> %d in %.0f ms", scope["path"], status, (time.monotonic() - started) * 1000)


async def _pump_up(call: H2Call, head: bytes, more: bool, receive: Receive, scope: trio.CancelScope) -> None:
    """The client's body to upstream as it comes; the client leaving ends the relay."""
    try:
        if head:
            await call.send(head)
        while more:
            event = await receive()
            if event["type"] == "http.disconnect":
                scope.cancel()
                return
            if body := event.get("body", b""):
                await call.send(body)
            more = bool(event.get("more_body", False))
        await call.end()
    except H2Error:
        return  # the response side reports it
    while (await receive())["type"] != "http.disconnect":
        pass
    scope.cancel()


async def _end(send: Send, err: ConnectError) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"application/connect+proto"), (b"connect-protocol-version", b"1")],
        }
    )
    await send({"type": "http.response.body", "body": end_stream_error(err), "more_body": False})
