"""The provider kinds the run layer can call: request builder, parser and endpoint per kind."""

from __future__ import annotations

from collections.abc import Callable, Hashable

import attrs

from byok.model.request import ModelRequest, RenderedRequest
from byok.providers import (
    anthropic_request,
    anthropic_stream,
    openai_chat_request,
    openai_chat_stream,
    openai_responses_request,
    openai_responses_stream,
)
from byok.providers.kinds import ANTHROPIC, OPENAI_CHAT, OPENAI_RESPONSES
from byok.providers.runner import Endpoint, StreamParser
from byok.providers.secrets import provider_secrets

ANTHROPIC_VERSION = "2023-06-01"


@attrs.frozen
class Adapter:
    kind: str  # "openai_chat" | "openai_responses" | "anthropic"
    # The body and the prefix meter's elements from one render; build_request is its body.
    render: Callable[[ModelRequest], RenderedRequest]
    new_parser: Callable[[], StreamParser]
    path: str  # appended to the configured base URL
    auth: Callable[[str | None], tuple[tuple[str, str], ...]]
    # The history's element texts and the key they are kept under (a stored render's:
    # RenderedPrefix), and that key alone.
    prefix_texts: Callable[[ModelRequest], tuple[Hashable, list[bytes]]]
    prefix_key: Callable[[ModelRequest], Hashable]

    def endpoint(
        self, base_url: str, api_key: str | None, headers: tuple[tuple[str, str], ...] = ()
    ) -> Endpoint:
        """``headers``: the provider's own (config), sent after the auth headers; one of the
        same name replaces byok's (a newer ``anthropic-version``)."""
        base = base_url.rstrip("/")
        path = self.path
        # Anthropic's documented base URL has no version segment, OpenAI's has one; accept a
        # base that already ends in the segment our path starts with.
        if path.startswith("/v1/") and base.endswith("/v1"):
            path = path[len("/v1") :]
        own = {name.lower() for name, _ in headers}
        auth = tuple((name, value) for name, value in self.auth(api_key) if name not in own)
        return Endpoint(base + path, (*auth, *headers), provider_secrets(api_key, headers))

    def build_request(self, req: ModelRequest) -> bytes:
        return self.render(req).body


def _bearer(api_key: str | None) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {api_key}"),) if api_key else ()


def _anthropic_auth(api_key: str | None) -> tuple[tuple[str, str], ...]:
    key = (("x-api-key", api_key),) if api_key else ()
    return (*key, ("anthropic-version", ANTHROPIC_VERSION))


ADAPTERS: dict[str, Adapter] = {
    a.kind: a
    for a in (
        Adapter(OPENAI_CHAT, openai_chat_request.render_request, openai_chat_stream.ChatStreamParser,
                "/chat/completions", _bearer, openai_chat_request.prefix_texts,
                openai_chat_request.prefix_key),
        Adapter(OPENAI_RESPONSES, openai_responses_request.render_request,
                openai_responses_stream.ResponsesStreamParser, "/responses", _bearer,
                openai_responses_request.prefix_texts, openai_responses_request.prefix_key),
        Adapter(ANTHROPIC, anthropic_request.render_request, anthropic_stream.AnthropicStreamParser,
                "/v1/messages", _anthropic_auth, anthropic_request.prefix_texts,
                anthropic_request.prefix_key),
    )
}  # fmt: skip


def adapter_for(kind: str) -> Adapter:
    try:
        return ADAPTERS[kind]
    except KeyError:
        raise ValueError(f"unknown provider kind {kind!r} (expected one of: {', '.join(ADAPTERS)})") from None
