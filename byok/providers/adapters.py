"""The provider kinds the run layer can call: request builder, parser and endpoint per kind."""

from __future__ import annotations

from collections.abc import Callable

import attrs

from byok.model.request import ModelRequest, RenderedRequest
from byok.providers import anthropic, openai_chat, openai_responses
from byok.providers.runner import Endpoint, StreamParser

ANTHROPIC_VERSION = "2023-06-01"


@attrs.frozen
class Adapter:
    kind: str  # "openai_chat" | "openai_responses" | "anthropic"
    # The body and the prefix meter's elements from one render; build_request is its body.
    render: Callable[[ModelRequest], RenderedRequest]
    new_parser: Callable[[], StreamParser]
    path: str  # appended to the configured base URL
    auth: Callable[[str | None], tuple[tuple[str, str], ...]]

    def endpoint(self, base_url: str, api_key: str | None) -> Endpoint:
        base = base_url.rstrip("/")
        path = self.path
        # Anthropic's documented base URL has no version segment, OpenAI's has one; accept a
        # base that already ends in the segment our path starts with.
        if path.startswith("/v1/") and base.endswith("/v1"):
            path = path[len("/v1") :]
        return Endpoint(base + path, self.auth(api_key))

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
        Adapter("openai_chat", openai_chat.render_request, openai_chat.ChatStreamParser,
                "/chat/completions", _bearer),
        Adapter("openai_responses", openai_responses.render_request, openai_responses.ResponsesStreamParser,
                "/responses", _bearer),
        Adapter("anthropic", anthropic.render_request, anthropic.AnthropicStreamParser,
                "/v1/messages", _anthropic_auth),
    )
}  # fmt: skip


def adapter_for(kind: str) -> Adapter:
    try:
        return ADAPTERS[kind]
    except KeyError:
        raise ValueError(f"unknown provider kind {kind!r} (expected one of: {', '.join(ADAPTERS)})") from None
