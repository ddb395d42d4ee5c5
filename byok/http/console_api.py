"""The control API under ``/byok/api/``: providers, models and aliases (the config file's shown
read-only), discovery and a test call per provider, provider calls and their live stream,
conversations, usage per day, the Cursor set-up for this machine, and the OpenAPI document.

The routes live in console_entries_api.py and console_calls_api.py (registered in
console_routes.py); this module checks who is calling (console_http.py), dispatches, writes the
answer, and streams the live calls. Every refusal is an ``ApiError`` naming the field.
"""

from __future__ import annotations

import json
import logging
import platform
from typing import Any, Final
from urllib.parse import parse_qs

import httpx
import trio

from byok import cursor_setup
from byok.config import Config
from byok.console.entries import FieldError
from byok.console.token import TokenCheck
from byok.http import console_calls_api, console_entries_api
from byok.http import console_http as ch
from byok.http.asgi import ClientGone, Receive, Scope, Send, header
from byok.http.console_openapi import openapi_document
from byok.http.console_routes import ROUTES, ApiRequest, Handler, route
from byok.run.call_feed import CallFeed, FeedClosed, TooManySubscribers
from byok.run.console_state import ConsoleState
from byok.store import AsyncStore, StoreError

log = logging.getLogger("byok.console")

HEARTBEAT_S: Final = 15.0
# The route modules register themselves on import.
_REGISTERED = (console_entries_api, console_calls_api)


class ControlApi:
    def __init__(
        self,
        *,
        config: Config,
        state: ConsoleState,
        store: AsyncStore,
        tokens: TokenCheck,
        feed: CallFeed,
        http: httpx.AsyncClient,
    ) -> None:
        self.config = config
        self.state = state
        self.store = store
        self.tokens = tokens
        self.feed = feed
        self.http = http
        self._live_open = 0
        self._live_done = trio.Event()

    async def end_live(self, timeout_s: float) -> None:
        """At shutdown: end the live streams and wait (at most ``timeout_s``) until their last
        bytes are written, before the server stops."""
        self.feed.close()
        with trio.move_on_after(timeout_s):
            while self._live_open:
                await self._live_done.wait()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            server = self.config.server
            refused = ch.refusal(scope, ch.host_names(server.host, server.tls_names))
            if refused is not None:
                raise refused
            if not scope["path"].startswith(ch.API_PREFIX):
                await ch.serve_page(scope, send)
                return
            ch.check_token(scope, self.tokens)
            path = scope["path"][len(ch.API_PREFIX) - 1 :]
            method = scope["method"]
            if path == "/calls/live" and method == "GET":
                await self._live(receive, send)
                return
            handler, params = self._match(method, path)
            body = await ch.read_json(scope, receive)
            query = {k: v[-1] for k, v in parse_qs(scope.get("query_string", b"").decode("latin-1")).items()}
            status, answer = await handler(self, ApiRequest(method, params, query, body, scope))
        except ch.ApiError as e:
            await ch.send_error(send, e)
            return
        except FieldError as e:
            await ch.send_error(send, ch.field_error(e))
            return
        except StoreError as e:  # the machine's (disk full, read-only), said as it is
            await ch.send_error(send, ch.ApiError(503, "", f"byok's database failed: {e}"))
            return
        except ClientGone:
            raise
        except Exception as e:  # a bug: one JSON answer, the traceback in the log
            log.exception("console: %s %s failed", scope.get("method"), scope.get("path"))
            await ch.send_error(send, ch.ApiError(500, "", f"internal error: {type(e).__name__}"))
            return
        if isinstance(answer, bytes):
            await ch.send_bytes(send, status, answer, "text/plain; charset=utf-8")
        else:
            await ch.send_json(send, status, answer)

    def _match(self, method: str, path: str) -> tuple[Handler, dict[str, str]]:
        allowed = []
        for r in ROUTES:
            found = r.regex.match(path)
            if found:
                if r.method == method:
                    return r.handler, found.groupdict()
                allowed.append(r.method)
        if allowed:
            raise ch.ApiError(405, "method", f"{method} is not allowed here (allowed: {', '.join(allowed)})")
        raise ch.ApiError(404, "path", f"no API route {path!r} (see /byok/api/openapi.json)")

    async def _live(self, receive: Receive, send: Send) -> None:
        """Each call as it is recorded, as server-sent events (``event: call``), with a comment
        line every HEARTBEAT_S so proxies and the page know the stream is alive."""
        try:
            subscription = self.feed.subscribe()
            channel = subscription.__enter__()
        except TooManySubscribers as e:
            raise ch.ApiError(429, "", str(e)) from None
        except FeedClosed:
            raise ch.ApiError(503, "", "byok is shutting down") from None
        ended = False
        self._live_open += 1
        try:
            await ch.start_stream(send, "text/event-stream")
            await send({"type": "http.response.body", "body": b": live\n\n", "more_body": True})
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_until_gone, receive, nursery.cancel_scope)
                while True:
                    with trio.move_on_after(HEARTBEAT_S):
                        try:
                            item = await channel.receive()
                        except trio.EndOfChannel:  # shutdown: the stream ends, the page reconnects
                            nursery.cancel_scope.cancel()
                            ended = True
                            break
                        data = f"event: call\ndata: {json.dumps(item, separators=(',', ':'))}\n\n"
                        await send({"type": "http.response.body", "body": data.encode(), "more_body": True})
                        continue
                    await send({"type": "http.response.body", "body": b": heartbeat\n\n", "more_body": True})
            if ended:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        except (ClientGone, OSError):
            pass
        finally:
            subscription.__exit__(None, None, None)
            self._live_open -= 1
            self._live_done.set()
            self._live_done = trio.Event()


async def _until_gone(receive: Receive, scope: trio.CancelScope) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    scope.cancel()


# --- set-up, the document ------------------------------------------------------------------


@route("GET", "/setup")
async def setup(api: ControlApi, req: ApiRequest) -> tuple[int, Any]:
    """How to point Cursor at this daemon, from the address the browser reached it on."""
    url = f"{req.scope.get('scheme') or 'http'}://{header(req.scope, 'host')}"
    system = platform.system()
    proxy = api.config.proxy
    proxy_url = cursor_setup.local_url(proxy.host, proxy.port)
    cert = api.config.server.data_dir / "ca" / "byok-ca.pem"
    return 200, {
        "backend_url": url,
        "system": system,
        "cursor_command": cursor_setup.cursor_command(url, system),
        "cursor_command_text": cursor_setup.cursor_command_text(url, system),
        "settings_path": cursor_setup.SETTINGS_PATHS.get(system, cursor_setup.SETTINGS_PATHS["Linux"]),
        "proxy": {
            "enabled": proxy.enabled,
            "url": proxy_url,
            "settings_json": cursor_setup.cursor_proxy_settings(proxy_url),
            "ca_cert": str(cert),
            "trust_commands": cursor_setup.trust_commands(cert, system),
        },
        "models": [m.id for m in api.state.catalog.enabled_models()],
        "detailed_logging": api.config.logging.detailed,
    }


@route("GET", "/openapi.json")
async def openapi(api: ControlApi, req: ApiRequest) -> tuple[int, Any]:
    return 200, openapi_document()
