"""Call-record helpers: prefix meter, cache-hit share, redaction, error kinds."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from byok.config import ConfigError, LoggingConfig
from byok.config_load import load_config
from byok.loop.model_call import ModelProtocolError
from byok.model.events import ProviderError
from byok.model.usage import Usage
from byok.providers import anthropic_stream, openai_chat_stream, openai_responses_stream
from byok.providers.http_errors import http_error
from byok.providers.rendering import split_body
from byok.providers.runner import _transport_error
from byok.run.call_meter import cache_hit_share, compare_prefix, error_kind, message_hashes
from byok.run.redaction import REDACTED, redact_body


def body(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def h(obj: Any) -> bytes:
    """The meter's hash of one element as ``body`` serializes it."""
    return hashlib.sha256(json.dumps(obj, separators=(",", ":")).encode()).digest()


SYS = {"role": "system", "content": "be brief"}
U1 = {"role": "user", "content": "hi"}
A1 = {"role": "assistant", "content": "hello"}
U2 = {"role": "user", "content": "more"}


# -- prefix meter ----------------------------------------------------------------------------------


def test_first_call_of_a_conversation_is_null() -> None:
    assert compare_prefix(None, [h(SYS), h(U1)]) == (None, None)
    assert compare_prefix([h(SYS)], None) == (None, None)


def test_appended_messages_extend_the_previous_call() -> None:
    first = message_hashes(body({"model": "m", "messages": [SYS, U1]}))
    second = message_hashes(body({"model": "m", "stream": True, "messages": [SYS, U1, A1, U2]}))
    assert compare_prefix(first, second) == (True, 2)


def test_identical_messages_extend_with_everything_in_common() -> None:
    same = message_hashes(body({"messages": [SYS, U1]}))
    assert compare_prefix(same, same) == (True, 2)


def test_a_changed_message_breaks_the_prefix_and_counts_what_is_shared() -> None:
    first = message_hashes(body({"messages": [SYS, U1, A1]}))
    edited = message_hashes(body({"messages": [SYS, {"role": "user", "content": "hi!"}, A1, U2]}))
    assert compare_prefix(first, edited) == (False, 1)
    changed_system = message_hashes(body({"messages": [{"role": "system", "content": "x"}, U1, A1]}))
    assert compare_prefix(first, changed_system) == (False, 0)


def test_a_shorter_history_does_not_extend() -> None:
    longer = message_hashes(body({"messages": [SYS, U1, A1, U2]}))
    shorter = message_hashes(body({"messages": [SYS, U1]}))
    assert compare_prefix(longer, shorter) == (False, 2)


def test_messages_compare_as_serialized_bytes_per_element() -> None:
    # Each element is hashed as its JSON text exactly as sent: whitespace between elements
    # does not matter, key order or spacing inside one does (DESIGN invariant 1).
    a = message_hashes(b'{"messages":[{"role":"user","content":"hi"}]}')
    spaced = message_hashes(b' { "model" : "m" , "messages" : [ {"role":"user","content":"hi"} ] } ')
    assert a == spaced == (h(U1),)
    reordered = message_hashes(b'{"messages":[{"content":"hi","role":"user"}]}')
    assert reordered != a
    assert message_hashes(b'{"messages":[{"role": "user","content":"hi"}]}') != a


def test_compared_elements_per_provider_kind() -> None:
    def elements(obj: dict[str, Any]) -> list[Any] | None:
        found = split_body(json.dumps(obj).encode())
        assert found is not None
        return None if found.elements is None else [json.loads(e) for e in found.elements]

    assert elements({"model": "m", "messages": [SYS, U1]}) == [SYS, U1]
    # Anthropic: the system prompt sits beside messages and is compared as element 0.
    assert elements({"system": "be brief", "messages": [U1]}) == ["be brief", U1]
    # Responses: instructions (the system prompt) as element 0, then the input items.
    item = {"type": "message", "role": "user", "content": "hi"}
    assert elements({"instructions": "be brief", "input": [item]}) == ["be brief", item]
    assert elements({"input": [item]}) == [item]
    assert elements({"model": "m"}) is None
    assert message_hashes(None) is None
    assert message_hashes(b"not json") is None


def test_a_changed_anthropic_system_prompt_breaks_the_prefix() -> None:
    first = message_hashes(body({"system": "one", "messages": [U1]}))
    second = message_hashes(body({"system": "two", "messages": [U1, A1, U2]}))
    assert compare_prefix(first, second) == (False, 0)


# -- cache-hit share -------------------------------------------------------------------------------


def test_cache_hit_share_divides_by_input_which_already_includes_cache() -> None:
    # Anthropic-style: input = 20 fresh + 70 read + 10 written = 100.
    assert cache_hit_share(Usage(100, 5, cache_read_tokens=70, cache_write_tokens=10)) == pytest.approx(0.7)
    assert cache_hit_share(Usage(100, 5, cache_read_tokens=0)) == 0.0
    assert cache_hit_share(Usage(100, 5, cache_write_tokens=100)) == 0.0


def test_cache_hit_share_is_null_without_cache_counts() -> None:
    assert cache_hit_share(None) is None
    assert cache_hit_share(Usage(100, 5)) is None
    assert cache_hit_share(Usage(0, 0, cache_read_tokens=0)) is None


# -- redaction -------------------------------------------------------------------------------------


def test_redaction_replaces_secret_string_values_at_any_depth() -> None:
    raw = body(
        {
            "model": "m",
            "api_key": "sk-1",
            "metadata": {"Authorization": "Bearer sk-2", "X-Api-Key": "sk-3", "openai_api_key": "sk-4"},
            "messages": [{"role": "user", "content": "api_key"}],
            "list": [{"apiKey": "sk-5"}, {"proxy-authorization": "Basic x"}],
        }
    )
    out = redact_body(raw)
    assert out is not None
    text = out.decode()
    for secret in ("sk-1", "sk-2", "sk-3", "sk-4", "sk-5", "Basic x"):
        assert secret not in text
    obj = json.loads(out)
    assert obj["api_key"] == REDACTED and obj["metadata"]["X-Api-Key"] == REDACTED
    assert obj["list"] == [{"apiKey": REDACTED}, {"proxy-authorization": REDACTED}]
    # Only values under secret-looking keys change; a value that merely says "api_key" stays.
    assert obj["messages"] == [{"role": "user", "content": "api_key"}]
    assert obj["model"] == "m"


def test_redaction_keeps_clean_bodies_byte_for_byte() -> None:
    raw = b'{"model": "m",  "messages": [{"role":"user","content":"caf\\u00e9"}], "max_tokens": 5}'
    assert redact_body(raw) is raw
    # Non-string values under a secret key are not credentials we could leak as text.
    numeric = b'{"authorization": null, "api_key": 3}'
    assert redact_body(numeric) is numeric


def test_redaction_refuses_what_it_cannot_parse() -> None:
    assert redact_body(b"\x00not json") is None


# -- error kinds -----------------------------------------------------------------------------------


def chat_stream_error(obj: dict[str, Any]) -> ProviderError:
    with pytest.raises(ProviderError) as info:
        openai_chat_stream.ChatStreamParser().feed(b"data: " + body(obj) + b"\n\n")
    return info.value


def test_http_statuses_map_to_kinds() -> None:
    assert error_kind(http_error(429, b'{"error":{"message":"slow"}}', "1"), 429) == "rate_limited"
    assert error_kind(http_error(400, b"bad", None), 400) == "http_4xx"
    assert error_kind(http_error(401, b"no", None), 401) == "http_4xx"
    assert error_kind(http_error(503, b"down", None), 503) == "http_5xx"
    assert error_kind(http_error(302, b"moved", None), 302) == "http_3xx"
    # Without the response status at hand, the error's own status is used.
    assert error_kind(http_error(500, b"down", None)) == "http_5xx"


def raised_from(cause: httpx.RequestError) -> ProviderError:
    # As stream_call raises it: chained to the httpx error.
    try:
        raise _transport_error(cause) from cause
    except ProviderError as e:
        return e


def test_transport_failures_are_connection_errors() -> None:
    request = httpx.Request("POST", "http://127.0.0.1:9/v1/chat/completions")
    assert error_kind(raised_from(httpx.ConnectError("refused", request=request))) == "connection"
    assert error_kind(raised_from(httpx.ReadTimeout("slow", request=request)), 200) == "connection"


def test_in_stream_errors() -> None:
    assert error_kind(chat_stream_error({"error": {"message": "overloaded"}}), 200) == "stream_error"
    limited = chat_stream_error({"error": {"message": "slow down", "code": 429}})
    assert error_kind(limited, 200) == "rate_limited"

    parser = anthropic_stream.AnthropicStreamParser()
    event = b'event: error\ndata: {"type":"error","error":{"type":"api_error","message":"boom"}}\n\n'
    with pytest.raises(ProviderError) as info:
        parser.feed(event)
    assert error_kind(info.value, 200) == "stream_error"

    parser2 = openai_responses_stream.ResponsesStreamParser()
    failed = {"type": "response.failed", "response": {"error": {"code": "server_error", "message": "x"}}}
    with pytest.raises(ProviderError) as info:
        parser2.feed(f"event: response.failed\ndata: {json.dumps(failed)}\n\n".encode())
    assert error_kind(info.value, 200) == "stream_error"


def test_broken_streams_are_protocol_errors() -> None:
    with pytest.raises(ProviderError) as info:
        openai_chat_stream.ChatStreamParser().feed(b"data: {not json\n\n")
    assert error_kind(info.value, 200) == "protocol"
    parser = openai_chat_stream.ChatStreamParser()
    parser.feed(b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n')
    with pytest.raises(ProviderError) as info:
        parser.end()
    assert error_kind(info.value, 200) == "protocol"  # truncated
    assert error_kind(ModelProtocolError("tool call ended twice"), 200) == "protocol"


def test_cancel_internal_and_success() -> None:
    assert error_kind(None, 200) is None
    assert error_kind(trio.Cancelled._create()) == "canceled"
    assert error_kind(RuntimeError("bug"), 200) == "internal"


# -- [logging] config ------------------------------------------------------------------------------


def test_logging_section_is_optional_and_strict(tmp_path: Path) -> None:
    path = tmp_path / "byok.toml"
    path.write_text("")
    assert load_config(path).logging == LoggingConfig(detailed=False)
    path.write_text("[logging]\ndetailed = true\n")
    assert load_config(path).logging.detailed is True
    path.write_text("[logging]\ndetailled = true\n")
    unknown = r"logging\.detailled: unknown key \(allowed: detailed, record_runs\)"
    with pytest.raises(ConfigError, match=unknown):
        load_config(path)
    path.write_text("[logging]\nrecord_runs = true\n")
    assert load_config(path).logging == LoggingConfig(detailed=False, record_runs=True)
    path.write_text('[logging]\ndetailed = "yes"\n')
    with pytest.raises(ConfigError, match=r"logging\.detailed: expected boolean, got string"):
        load_config(path)
