from __future__ import annotations

import pytest

from byok.config import PROVIDER_KINDS
from byok.model.request import ModelRequest, ModelSettings, UserTurn
from byok.providers import (
    anthropic_request,
    anthropic_stream,
    openai_chat_request,
    openai_chat_stream,
    openai_responses_request,
    openai_responses_stream,
)
from byok.providers.adapters import ADAPTERS, adapter_for
from byok.providers.http_errors import exceeds_context, http_error
from byok.providers.runner import Endpoint


def test_every_configurable_kind_has_an_adapter() -> None:
    assert set(ADAPTERS) == set(PROVIDER_KINDS)
    for kind, adapter in ADAPTERS.items():
        assert adapter.kind == kind
    with pytest.raises(ValueError, match="unknown provider kind 'gemini'"):
        adapter_for("gemini")


@pytest.mark.parametrize(
    ("kind", "module", "parser"),
    [
        ("openai_chat", openai_chat_request, openai_chat_stream.ChatStreamParser),
        ("openai_responses", openai_responses_request, openai_responses_stream.ResponsesStreamParser),
        ("anthropic", anthropic_request, anthropic_stream.AnthropicStreamParser),
    ],
)
def test_adapter_wiring(kind: str, module: object, parser: type) -> None:
    adapter = adapter_for(kind)
    req = ModelRequest("s", (), (UserTurn("hi"),), ModelSettings("m"))
    assert adapter.build_request(req) == module.build_request(req)  # type: ignore[attr-defined]
    first, second = adapter.new_parser(), adapter.new_parser()
    assert isinstance(first, parser) and first is not second  # a fresh parser per attempt


def test_openai_endpoints_use_bearer_auth() -> None:
    chat = adapter_for("openai_chat").endpoint("https://api.openai.com/v1/", "sk-1")
    assert chat == Endpoint("https://api.openai.com/v1/chat/completions", (("authorization", "Bearer sk-1"),))
    responses = adapter_for("openai_responses").endpoint("https://openrouter.ai/api/v1", "sk-2")
    assert responses == Endpoint(
        "https://openrouter.ai/api/v1/responses", (("authorization", "Bearer sk-2"),)
    )
    # A local server without a key gets no authorization header at all.
    assert adapter_for("openai_chat").endpoint("http://127.0.0.1:8080/v1", None).headers == ()
    assert adapter_for("openai_responses").endpoint("http://localhost/v1", "").headers == ()


def test_anthropic_endpoint() -> None:
    a = adapter_for("anthropic")
    expected = Endpoint(
        "https://api.anthropic.com/v1/messages",
        (("x-api-key", "sk-ant"), ("anthropic-version", "2023-06-01")),
    )
    assert a.endpoint("https://api.anthropic.com", "sk-ant") == expected
    assert a.endpoint("https://api.anthropic.com/", "sk-ant") == expected
    # A base that already names the version is not doubled.
    assert a.endpoint("https://api.anthropic.com/v1", "sk-ant") == expected
    assert a.endpoint("https://gw.example/anthropic", None) == Endpoint(
        "https://gw.example/anthropic/v1/messages", (("anthropic-version", "2023-06-01"),)
    )


def test_a_providers_own_headers_follow_the_auth_headers_and_replace_one_of_the_same_name() -> None:
    anthropic = adapter_for("anthropic").endpoint(
        "https://api.anthropic.com", "sk", (("anthropic-version", "2099-01-01"), ("anthropic-beta", "b"))
    )
    assert anthropic.headers == (
        ("x-api-key", "sk"),
        ("anthropic-version", "2099-01-01"),
        ("anthropic-beta", "b"),
    )
    chat = adapter_for("openai_chat").endpoint("https://h/v1", None, (("api-key", "azure"),))
    assert chat.headers == (("api-key", "azure"),)


@pytest.mark.parametrize(
    ("status", "body", "overflow"),
    [
        # OpenAI Chat (and DeepSeek, vLLM, which copy its wording)
        (
            400,
            b'{"error": {"message": "This model\'s maximum context length is 128000 tokens. However, '
            b'your messages resulted in 130001 tokens.", "code": "context_length_exceeded"}}',
            True,
        ),
        # the Responses API
        (
            400,
            b'{"error": {"message": "Your input exceeds the context window of this model. Please adjust '
            b'your input and try again.", "code": "context_length_exceeded"}}',
            True,
        ),
        # Anthropic
        (
            400,
            b'{"type": "error", "error": {"type": "invalid_request_error", '
            b'"message": "prompt is too long: 210000 tokens > 200000 maximum"}}',
            True,
        ),
        (400, b'{"error": {"message": "Invalid value for tool_choice"}}', False),
        (429, b'{"error": {"message": "Rate limit reached"}}', False),
    ],
)
def test_a_request_over_the_context_window_is_recognised(status: int, body: bytes, overflow: bool) -> None:
    assert exceeds_context(http_error(status, body, None)) is overflow
