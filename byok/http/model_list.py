"""Cursor's model-list RPCs: ask upstream, merge byok's models in, answer.

Routes (all Connect unary, POST):

- ``/aiserver.v1.AiService/AvailableModels``: the IDE's model picker;
- ``/aiserver.v1.AiService/GetUsableModels``, ``/agent.v1.AgentService/GetUsableModels`` and
  ``/aiserver.v1.CppService/AvailableModels``: the cursor-agent CLI's lists;
- ``/aiserver.v1.AiService/GetDefaultModelForCli``, ``/agent.v1.AgentService/GetDefaultModelForCli``
  and ``/aiserver.v1.AiService/GetDefaultModel``: the default model.

With ``[models_list] default`` set, the default-model RPCs are answered by byok alone with that
model, and the CLI list's ``default_model`` names it. Otherwise the request is relayed to upstream
buffered (these are small calls) with the forwarder's header rules. What comes back decides the
answer:

- 2xx: the list RPCs are decoded (``application/proto``, ``application/json`` or one Connect
  envelope; gzip ``Content-Encoding`` undone), byok's enabled models merged in
  (``byok.cursor.model_catalog``), and re-encoded in the same content type, uncompressed, with
  upstream's status and end-to-end headers and a fresh Content-Length. The default-model RPCs
  pass through unchanged: upstream's default stays the user's default. A body that cannot be
  decoded also passes through unchanged (logged).
- upstream unreachable, timed out, or 5xx: byok answers alone with 200: its models, and the
  configured default (else its first model) as the default.
- 4xx (e.g. 401 when Cursor's session expired) and anything else: passed through unchanged, so
  Cursor sees the real auth error instead of a list that hides it.
"""

from __future__ import annotations

import json
import logging
import zlib
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import betterproto2
import httpx
import trio

from byok.config import Config, ModelConfig, Placement
from byok.console.catalog import Catalog
from byok.cursor import model_catalog as catalog
from byok.cursor import proto_decode
from byok.http.asgi import BodyTooLarge, ClientGone, Receive, Scope, Send, header, read_body
from byok.http.connect_envelope import (
    ConnectError,
    FrameDecoder,
    encode_frame,
    http_status_for,
    unary_error_body,
)
from byok.http.forwarder import filter_headers, upstream_url
from byok.http.proxy import upstream_for
from byok.pb.agent import v1 as agent
from byok.pb.aiserver import v1 as aiserver

log = logging.getLogger("byok.models")

AVAILABLE_MODELS = "/aiserver.v1.AiService/AvailableModels"
USABLE_MODELS_AI = "/aiserver.v1.AiService/GetUsableModels"
USABLE_MODELS_AGENT = "/agent.v1.AgentService/GetUsableModels"
DEFAULT_FOR_CLI_AI = "/aiserver.v1.AiService/GetDefaultModelForCli"
DEFAULT_FOR_CLI_AGENT = "/agent.v1.AgentService/GetDefaultModelForCli"
DEFAULT_MODEL = "/aiserver.v1.AiService/GetDefaultModel"
CPP_MODELS = "/aiserver.v1.CppService/AvailableModels"

DEFAULT_TIMEOUT_S = 10.0

# (upstream's answer, byok's models, placement[, default=the configured default]) -> merged
ProtoMerge = Callable[..., Any]
JsonMerge = Callable[..., dict[str, Any]]
Local = Callable[[Sequence[ModelConfig], ModelConfig | None], betterproto2.Message]


@attrs.frozen
class _Route:
    message: type[betterproto2.Message]
    local: Local
    merge: ProtoMerge | None = None  # None: upstream's 2xx answer passes through unchanged
    merge_json: JsonMerge | None = None
    # A default-model RPC: byok answers it alone when [models_list] default is set.
    is_default: bool = False
    # The merges take the configured default (a list that names a default).
    merge_default: bool = False


def _list_only(local: Callable[[Sequence[ModelConfig]], betterproto2.Message]) -> Local:
    return lambda models, _default: local(models)


_AVAILABLE = _Route(
    aiserver.AvailableModelsResponse,
    _list_only(catalog.local_available_models),
    catalog.merge_available_models,
    catalog.merge_available_models_json,
)
_USABLE = _Route(
    agent.GetUsableModelsResponse,
    _list_only(catalog.local_usable_models),
    catalog.merge_usable_models,
    catalog.merge_usable_models_json,
)
_CPP = _Route(
    aiserver.AvailableCppModelsResponse,
    catalog.local_cpp_models,
    catalog.merge_cpp_models,
    catalog.merge_cpp_models_json,
    merge_default=True,
)
_DEFAULT_FOR_CLI = _Route(
    agent.GetDefaultModelForCliResponse, catalog.local_default_model_for_cli, is_default=True
)

ROUTES: dict[str, _Route] = {
    AVAILABLE_MODELS: _AVAILABLE,
    USABLE_MODELS_AI: _USABLE,
    USABLE_MODELS_AGENT: _USABLE,
    CPP_MODELS: _CPP,
    DEFAULT_FOR_CLI_AI: _DEFAULT_FOR_CLI,
    DEFAULT_FOR_CLI_AGENT: _DEFAULT_FOR_CLI,
    DEFAULT_MODEL: _Route(aiserver.GetDefaultModelResponse, catalog.local_default_model, is_default=True),
}

_REQUEST_DROP = frozenset({b"expect", b"content-length", b"accept-encoding"})
_RESPONSE_DROP = frozenset({b"date", b"alt-svc", b"content-length", b"content-encoding"})


class _Undecodable(Exception):
    pass


def _media_type(content_type: str | None) -> str:
    return (content_type or "").split(";", 1)[0].strip().lower()


def _decode_content(body: bytes, encoding: str | None, limit: int) -> bytes:
    enc = (encoding or "identity").strip().lower()
    if enc == "identity":
        return body
    if enc in ("gzip", "x-gzip"):
        try:
            d = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
            out = d.decompress(body, limit + 1)
        except zlib.error as e:
            raise _Undecodable(f"bad gzip body: {e}") from None
        if len(out) > limit or d.unconsumed_tail:
            raise _Undecodable(f"decompressed body exceeds {limit} bytes")
        return out
    raise _Undecodable(f"unsupported content-encoding {encoding!r}")


def _merged_body(
    route: _Route,
    media: str,
    raw: bytes,
    models: Sequence[ModelConfig],
    placement: Placement,
    default: ModelConfig | None,
) -> bytes:
    assert route.merge is not None and route.merge_json is not None
    extra = {"default": default} if route.merge_default else {}
    if media == "application/proto":
        return bytes(route.merge(proto_decode.parse(route.message, raw), models, placement, **extra))
    if media == "application/json":
        obj = json.loads(raw or b"{}")
        if not isinstance(obj, dict):
            raise _Undecodable("JSON body is not an object")
        merged = route.merge_json(obj, models, placement, **extra)
        return json.dumps(merged, separators=(",", ":")).encode()
    if media == "application/connect+proto":
        decoder = FrameDecoder()  # caps each (decompressed) message at 64 MiB
        frames = decoder.feed(raw)
        decoder.end()
        out = b""
        for f in frames:
            if f.end_stream:
                out += encode_frame(f.payload, f.flags)
            else:
                merged = route.merge(proto_decode.parse(route.message, f.payload), models, placement, **extra)
                out += encode_frame(bytes(merged))
        return out
    raise _Undecodable(f"content type {media!r}")


class ModelListRoutes:
    """Serves the model-list RPCs; ``handle`` returns False for any other request.

    ``health`` (optional, an ``UpstreamHealth``) lets a known-down upstream be skipped without
    waiting for the connect to fail.
    """

    def __init__(
        self,
        config: Config,
        upstream_client: httpx.AsyncClient,
        upstream: str,
        *,
        health: Any = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        catalog: Catalog | None = None,
    ) -> None:
        self._config = config
        self._catalog = catalog or Catalog(config)
        self._client = upstream_client
        self._base = upstream.rstrip("/")
        self._health = health
        self._timeout_s = timeout_s
        self._limit = config.server.max_body_bytes

    def reconfigure(self, config: Config) -> None:
        self._config = config

    @property
    def models(self) -> tuple[ModelConfig, ...]:
        return self._catalog.enabled_models()

    @staticmethod
    def matches(scope: Scope) -> bool:
        return scope.get("type") == "http" and scope.get("method") == "POST" and scope.get("path") in ROUTES

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> bool:
        if not self.matches(scope):
            return False
        route = ROUTES[scope["path"]]
        try:
            body = await read_body(receive, self._limit)
        except ClientGone:
            return True
        except BodyTooLarge as e:
            err = ConnectError("resource_exhausted", str(e))
            await _send(
                send,
                http_status_for(err.code),
                [(b"content-type", b"application/json")],
                unary_error_body(err),
            )
            return True
        if route.is_default and self._default is not None:
            log.info("%s: answering with [models_list] default %r", scope["path"], self._default.id)
            await self._answer(scope, send, route)
            return True
        if self._health is not None and not await self._health.reachable():
            await self._answer_locally(scope, send, route, "upstream marked unreachable")
            return True
        response = await self._ask_upstream(scope, body)
        if isinstance(response, str):
            await self._answer_locally(scope, send, route, response)
            return True
        status, headers, raw = response
        if status >= 500:
            await self._answer_locally(scope, send, route, f"upstream answered {status}")
            return True
        if not 200 <= status < 300 or route.merge is None:
            log.info("%s: upstream %d passed through", scope["path"], status)
            await _send(send, status, filter_headers(headers, drop=frozenset({b"date", b"alt-svc"})), raw)
            return True
        content_type = _header(headers, b"content-type")
        try:
            plain = _decode_content(raw, _header(headers, b"content-encoding"), self._limit)
            merged = _merged_body(
                route, _media_type(content_type), plain, self.models, self._placement, self._default
            )
        except Exception as e:  # _Undecodable, ProtocolError, bad proto/JSON
            log.warning(
                "%s: cannot merge byok models into upstream's answer (%s); passed through", scope["path"], e
            )
            await _send(send, status, filter_headers(headers, drop=frozenset({b"date", b"alt-svc"})), raw)
            return True
        log.info(
            "%s: upstream %d, %d byok model(s) merged %s",
            scope["path"],
            status,
            len(self.models),
            self._placement,
        )
        await _send(send, status, filter_headers(headers, drop=_RESPONSE_DROP), merged)
        return True

    @property
    def _placement(self) -> Placement:
        return self._config.models_list.placement

    @property
    def _default(self) -> ModelConfig | None:
        chosen = self._config.models_list.default
        return None if chosen is None else self._config.model(chosen)

    async def _ask_upstream(
        self, scope: Scope, body: bytes
    ) -> tuple[int, list[tuple[bytes, bytes]], bytes] | str:
        """(status, raw headers, raw body), or why upstream could not be asked."""
        headers = filter_headers(scope["headers"], drop=_REQUEST_DROP)
        # Only encodings byok can undo: gzip when the client takes it too (a passed-through 4xx
        # must still be readable by the client), else identity.
        accepts_gzip = "gzip" in (header(scope, "accept-encoding") or "").lower()
        headers.append((b"accept-encoding", b"gzip" if accepts_gzip else b"identity"))
        request = httpx.Request(
            "POST", upstream_url(upstream_for(scope, self._base), scope), headers=headers, content=body
        )
        with trio.move_on_after(self._timeout_s):
            try:
                response = await self._client.send(request, stream=True)
            except httpx.TransportError as e:
                return f"upstream unreachable: {type(e).__name__}: {e}"
            try:
                chunks: list[bytes] = []
                size = 0
                async for chunk in response.aiter_raw():
                    size += len(chunk)
                    if size > self._limit:
                        return f"upstream answer exceeds {self._limit} bytes"
                    chunks.append(chunk)
            except httpx.TransportError as e:
                return f"upstream failed mid-answer: {type(e).__name__}: {e}"
            finally:
                with trio.CancelScope(shield=True):
                    await response.aclose()
            return response.status_code, list(response.headers.raw), b"".join(chunks)
        return f"upstream did not answer within {self._timeout_s:g}s"

    async def _answer_locally(self, scope: Scope, send: Send, route: _Route, why: str) -> None:
        log.warning("%s: %s; answering with byok's %d model(s) alone", scope["path"], why, len(self.models))
        await self._answer(scope, send, route)

    async def _answer(self, scope: Scope, send: Send, route: _Route) -> None:
        message = route.local(self.models, self._default)
        if _media_type(header(scope, "content-type")) == "application/json":
            body = json.dumps(message.to_dict(), separators=(",", ":")).encode()
            content_type = b"application/json"
        else:
            body, content_type = bytes(message), b"application/proto"
        await _send(send, 200, [(b"content-type", content_type), (b"connect-protocol-version", b"1")], body)


def _header(headers: list[tuple[bytes, bytes]], name: bytes) -> str | None:
    for k, v in headers:
        if k.lower() == name:
            return v.decode("latin-1")
    return None


async def _send(send: Send, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
    headers = [(k, v) for k, v in headers if k.lower() != b"content-length"]
    headers.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})
