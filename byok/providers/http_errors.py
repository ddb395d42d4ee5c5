"""Provider failures reported over HTTP, shared by every adapter.

Most OpenAI-compatible gateways and Anthropic put ``{"error": {"message": ...}}`` in an error
body; some use a bare string or a top-level ``message``. Only the message is kept: the rest of
an error body is the provider's business, and it may be large.
"""

from __future__ import annotations

import json
import math
from typing import Any

from byok.model.events import ProviderError

# 408 Request Timeout, 425 Too Early and 429 Too Many Requests are the 4xx a retry may fix.
RETRYABLE_4XX = frozenset({408, 425, 429})


def http_error(status: int, body: bytes, retry_after: str | None) -> ProviderError:
    """A non-2xx response as a ProviderError with the provider's own message."""
    message: str | None = None
    try:
        obj = json.loads(body)
    except ValueError:
        obj = None
    if isinstance(obj, list) and obj:
        obj = obj[0]  # some gateways wrap the error in a list
    if isinstance(obj, dict):
        message = error_message(obj)
    if message is None:
        message = body.decode("utf-8", "replace").strip()[:500] or "(empty body)"
    return ProviderError(
        f"HTTP {status}: {message}",
        status=status,
        retryable=retryable_status(status),
        retry_after_s=retry_after_seconds(retry_after),
    )


def error_message(obj: dict[str, Any]) -> str | None:
    err = obj.get("error")
    if isinstance(err, dict) and isinstance(err.get("message"), str):
        return err["message"]
    if isinstance(err, str):
        return err
    message = obj.get("message")
    return message if isinstance(message, str) else None


def retryable_status(status: int | None) -> bool:
    return status is not None and (status in RETRYABLE_4XX or 500 <= status <= 599)


def retry_after_seconds(value: str | None) -> float | None:
    # Only delta-seconds: the HTTP-date form needs a clock, which a sans-IO parser has not.
    if value is None:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


# Fields byok adds by default, per provider kind, and the provider option that leaves each out.
_OPTIONAL_FIELDS = {
    "anthropic": (("cache_control", "prompt_cache"), ("eager_input_streaming", "eager_input_streaming")),
    "openai_chat": (("prompt_cache_key", "prompt_cache_key"),),
    "openai_responses": (("prompt_cache_key", "prompt_cache_key"),),
}


def refused_option_hint(provider_id: str, kind: str, e: ProviderError) -> str:
    """For a compatible server that refuses a field added by default (its 400's message names
    the field): which provider option turns it off; else ""."""
    if e.status != 400:
        return ""
    named = [option for field, option in _OPTIONAL_FIELDS.get(kind, ()) if field in e.message]
    if not named:
        return ""
    settings = " and ".join(f"{option} = false" for option in named)
    return f" (if this server does not support it, set {settings} on provider {provider_id!r})"


def setup_hint(provider_id: str, model_id: str, url: str, e: ProviderError) -> str:
    """For the statuses a wrong setup gives: the key refused (401), or nothing at that URL or no
    such model there (404, both ways): what to check; else ""."""
    if e.status == 401:
        return f" (provider {provider_id!r} refused the key: check its api_key or api_key_env)"
    if e.status == 404:
        where = url.split("?", 1)[0]  # a query string may hold a key
        return (
            f" (provider {provider_id!r}, POST {where}: check its base_url, and the upstream_model"
            f" of model {model_id!r})"
        )
    return ""


# How providers word a request longer than the model's context window: OpenAI Chat and the
# servers that copy it (DeepSeek, vLLM), the Responses API, Anthropic.
_CONTEXT_OVERFLOW = (
    "maximum context length",
    "context_length_exceeded",
    "context window",
    "prompt is too long",
)


def exceeds_context(e: ProviderError) -> bool:
    """Whether ``e`` says the request did not fit the model's context window."""
    text = e.message.lower()
    return any(marker in text for marker in _CONTEXT_OVERFLOW)
